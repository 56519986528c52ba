"""Import one swift_vora module without running the package's __init__ (which imports ms-swift): the GPU check
scripts run on a machine where only torch (and megatron-core) are set up.

    from standalone_import import backend_module
    mel = backend_module('megatron_expert_lora')
"""
from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def backend_module(name: str):
    """swift_vora.backends.<name>, its parent packages as bare namespaces over the checkout's folders."""
    for package_name in ('swift_vora', 'swift_vora.backends'):
        package = types.ModuleType(package_name)
        package.__path__ = [str(ROOT / Path(*package_name.split('.')))]
        sys.modules.setdefault(package_name, package)
    return importlib.import_module(f'swift_vora.backends.{name}')
