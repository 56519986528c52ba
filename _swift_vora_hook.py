"""Lets ms-swift >= 4.6 load the *installed* swift_vora package from `--custom_register_path swift_vora`.

Why this exists: ms-swift 4.6.0 `swift.utils.utils.import_external_file` loads every plugin entry with
`importlib.util.spec_from_file_location`, which accepts `.py` files only; a package directory such as
`swift_vora` raises `ImportError: Cannot import external file`. Checkpoints also record the path as typed,
so `swift infer --adapters CKPT` from another directory cannot find `swift_vora` again.

The `.pth` file installed next to this module imports it at interpreter start. It only installs an
import hook; ms-swift is not imported here. When ms-swift's own `swift.utils.utils` module finishes
loading, the hook wraps `import_external_file` so that an entry naming a package directory, or a module
name that does not exist as a path (the recorded `swift_vora` seen from another directory), is imported by
module name. Every other entry goes to ms-swift's original function unchanged. Standard library only.
"""
import importlib
import importlib.util
import os
import sys

_TARGET = 'swift.utils.utils'
# As in swift_vora/patches.py (the plugin_loader patch): the one marker of swift-vora's replacements, and the
# parameters this wrapper was written for. The hook runs before swift-vora can be imported, so it checks them
# itself; tests/test_plugin_hook.py keeps both equal to the inventory's.
MARKER = '_swift_vora_patch'
PARAMS = ('file_path', )


def _module_name_for(entry, resolved):
    """Module name to import for a plugin entry, or None to leave the entry to ms-swift."""
    if os.path.isdir(resolved) and os.path.isfile(os.path.join(resolved, '__init__.py')):
        return os.path.basename(resolved.rstrip(os.sep))
    if os.path.exists(resolved) or entry.endswith('.py') or os.sep in entry:
        return None
    if not all(part.isidentifier() for part in entry.split('.')):
        return None
    return entry if importlib.util.find_spec(entry) is not None else None


def _wrap(module):
    original = module.import_external_file
    if getattr(original, MARKER, None):
        return
    import inspect
    params = tuple(inspect.signature(original).parameters)
    if params != PARAMS:  # the inventory's policy for plugin_loader: skip, with one warning
        sys.stderr.write(f'swift-vora: plugin_loader is not applied: ms-swift\'s import_external_file takes {params}, '
                         f'the wrapper was written for {PARAMS}; give --custom_register_path a .py file\n')
        return

    def import_external_file(file_path):
        resolved = os.path.abspath(os.path.expanduser(file_path))
        name = _module_name_for(file_path, resolved)
        if name is None:
            return original(file_path)
        if os.path.isdir(resolved):
            # Same precedence as ms-swift gives a plugin file: the directory that holds it comes first.
            sys.path.insert(0, os.path.dirname(resolved.rstrip(os.sep)))
        records = getattr(module, '_external_files', None)
        if isinstance(records, list) and file_path not in records:
            records.append(file_path)  # replayed in DataLoader workers by ms-swift
        return importlib.import_module(name)

    setattr(import_external_file, MARKER, ('plugin_loader', original))
    module.import_external_file = import_external_file


class _SwiftPluginPathFinder:
    """Meta-path finder that only watches `swift.utils.utils` and delegates the real import."""

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name != _TARGET:
            return None
        for finder in sys.meta_path:
            if finder is cls or not hasattr(finder, 'find_spec'):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        exec_module = getattr(loader, 'exec_module', None)
        if exec_module is None:
            return spec

        def exec_and_wrap(module):
            exec_module(module)
            if hasattr(module, 'import_external_file'):
                _wrap(module)

        loader.exec_module = exec_and_wrap
        return spec


def install():
    if _TARGET in sys.modules:
        _wrap(sys.modules[_TARGET])
    elif not any(f is _SwiftPluginPathFinder for f in sys.meta_path):
        sys.meta_path.insert(0, _SwiftPluginPathFinder)


install()
