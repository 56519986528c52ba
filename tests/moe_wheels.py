"""The unsloth and unsloth_zoo wheels the MoE tests read (never import into the test process): the GPU machine's MoE
set in `.whl/moe` where a checkout has it, else the same pinned versions from PyPI in the git-ignored
`.fetched/wheels`, which `bash scripts/install.sh test` fills (`python tests/moe_wheels.py` does the same), so that
CI, a clean clone, runs every test that reads them.

The pins are the versions swift_vora/patches.py pins its rewrites of unsloth_zoo's source to and
scripts/gpu/fetch_wheels.sh installs on the GPU machine (tests/test_moe_wheels.py keeps the three equal).
"""
import glob
import os
import subprocess
import sys
from typing import List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PINS = {'unsloth': '2026.10.9', 'unsloth_zoo': '2026.10.9'}
GPU_SET = os.path.join(REPO, '.whl', 'moe')  # scripts/gpu/fetch_wheels.sh moe (unsloth slimmed; same versions)
FETCHED = os.path.join(REPO, '.fetched', 'wheels')  # `pip download --no-deps` of the pins
MISSING = ('the pinned unsloth / unsloth_zoo wheels are in neither .whl/moe nor .fetched/wheels: '
           '`bash scripts/install.sh test` (or `python tests/moe_wheels.py`) downloads them')


def wheel(name: str) -> Optional[str]:
    """The pinned wheel of `name` ('unsloth' or 'unsloth_zoo'), or None when neither folder has it."""
    for folder in (GPU_SET, FETCHED):
        found = sorted(glob.glob(os.path.join(folder, f'{name}-{PINS[name]}-*.whl')))
        if found:
            return found[-1]
    return None


def wheels() -> List[str]:
    """[unsloth_zoo, unsloth] wheels, or [] unless both are there (unsloth_zoo refuses to import without unsloth)."""
    found = [wheel(name) for name in ('unsloth_zoo', 'unsloth')]
    return found if all(found) else []


def fetch(dest: str = FETCHED) -> List[str]:
    """Download the pinned wheels that neither folder has into `dest` (no dependencies: the tests unpack them)."""
    wanted = [f'{name}=={version}' for name, version in PINS.items() if wheel(name) is None]
    if wanted:
        os.makedirs(dest, exist_ok=True)
        subprocess.run([sys.executable, '-m', 'pip', 'download', '--no-deps', '--only-binary=:all:', '-q', '-d', dest,
                        *wanted], check=True)
    return [wheel(name) for name in PINS]


if __name__ == '__main__':
    for path in fetch():
        print(path)
