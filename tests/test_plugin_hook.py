"""The .pth hook that lets ms-swift 4.6 import `--custom_register_path swift_vora` (a package directory)."""
import importlib
import subprocess
import sys
import types

import _swift_vora_hook as hook


def _fake_swift_utils(calls):
    module = types.ModuleType('fake_swift_utils')
    module._external_files = []

    def import_external_file(file_path):  # ms-swift 4.6's signature
        calls.append(file_path)
        return 'original'

    module.import_external_file = import_external_file
    return module


def test_package_directory_is_imported_by_name(tmp_path, monkeypatch):
    pkg = tmp_path / 'my_plugin_pkg'
    pkg.mkdir()
    (pkg / '__init__.py').write_text('REGISTERED = True\n')
    calls = []
    module = _fake_swift_utils(calls)
    hook._wrap(module)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, 'path', list(sys.path))
    imported = module.import_external_file('my_plugin_pkg')
    assert imported.REGISTERED is True
    assert calls == []  # ms-swift's file loader was not asked (it would raise for a directory)
    assert module._external_files == ['my_plugin_pkg']  # replayed in dataloader workers
    sys.modules.pop('my_plugin_pkg', None)


def test_installed_module_name_works_from_another_directory(tmp_path, monkeypatch):
    calls = []
    module = _fake_swift_utils(calls)
    hook._wrap(module)
    monkeypatch.chdir(tmp_path)  # no ./swift_vora here: the recorded entry is resolved as a module name
    assert module.import_external_file('swift_vora') is importlib.import_module('swift_vora')
    assert calls == []


def test_plain_files_and_unknown_names_go_to_ms_swift(tmp_path, monkeypatch):
    calls = []
    module = _fake_swift_utils(calls)
    hook._wrap(module)
    monkeypatch.chdir(tmp_path)
    plugin = tmp_path / 'plugin.py'
    plugin.write_text('')
    assert module.import_external_file(str(plugin)) == 'original'
    assert module.import_external_file('no_such_module_anywhere') == 'original'
    assert calls == [str(plugin), 'no_such_module_anywhere']


def test_wrapping_twice_keeps_one_layer():
    module = _fake_swift_utils([])
    hook._wrap(module)
    first = module.import_external_file
    hook._wrap(module)
    assert module.import_external_file is first


def test_hook_is_active_in_a_fresh_interpreter_and_patches_ms_swift():
    """The installed .pth runs the hook at start-up; ms-swift's own function comes out wrapped."""
    code = ('import sys; assert "swift" not in sys.modules; '
            'from swift.utils import import_external_file as f; print(getattr(f, "_swift_vora_patch", (None, ))[0])')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True, cwd='/')
    assert out.stdout.strip().splitlines()[-1] == 'plugin_loader'


def test_the_hook_marks_and_checks_as_the_inventory_says():
    from swift_vora import patches
    assert hook.MARKER == patches.MARKER and hook.PARAMS == patches.BY_NAME['plugin_loader'].params
    module = _fake_swift_utils([])
    hook._wrap(module)
    assert patches.patched_by(module.import_external_file) == 'plugin_loader'


def test_an_unknown_loader_is_left_to_ms_swift_with_one_warning(capfd):
    module = types.ModuleType('fake_swift_utils')

    def import_external_file(path, strict=True):  # a signature the wrapper was not written for
        return 'original'

    module.import_external_file = import_external_file
    hook._wrap(module)
    assert module.import_external_file is import_external_file
    assert 'plugin_loader is not applied' in capfd.readouterr().err

