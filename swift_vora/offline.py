"""Running ms-swift as a child process without a network: the environment and the command to start it.

Every launcher of this package (train, demo, eval's inference, merge) uses these, so "offline" means the
same thing everywhere: no hub look-ups, local files only (nothing downloads weights or data at run time).
"""
import os
import sys
from typing import List

OFFLINE_ENV = {
    'HF_HUB_OFFLINE': '1',
    'TRANSFORMERS_OFFLINE': '1',
    'HF_DATASETS_OFFLINE': '1',
    'MODELSCOPE_OFFLINE': '1',
    'USE_HF': '1',
}


def swift_argv() -> List[str]:
    """`swift` from this interpreter's environment (the venv's console script), else its module."""
    swift = os.path.join(os.path.dirname(sys.executable), 'swift')
    return [swift] if os.path.exists(swift) else [sys.executable, '-m', 'swift.cli.main']
