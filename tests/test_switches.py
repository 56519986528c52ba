"""Every SWIFT_VORA_* switch in one table, read one way (swift_vora/switches.py): typos and bad values are errors
that name the variable, the table's defaults are what the modules use, and `swift-vora switches` prints them."""
import json
import re
import subprocess
from pathlib import Path

import pytest

from swift_vora import switches
from swift_vora.budget import VideoBudget
from swift_vora.data.windowing import WindowConfig
from swift_vora.switches import SwitchError, parse, read

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize('name, raw', [
    ('SWIFT_VORA_HOST_OVERHEAD', 'flase'),  # was read as "on"
    ('SWIFT_VORA_LORA_AUTOCAST_INPUTS', 'of'),
    ('SWIFT_VORA_MEMORY_FIRST', 'three'),  # was warned about and replaced by the default
    ('SWIFT_VORA_LORA_CHECK_STEPS', '-1'),
    ('SWIFT_VORA_REPLICATE_TINY', 'yes please'),  # was read as "off"
    ('SWIFT_VORA_PROBE_TORCH', 'falsey'),
    ('SWIFT_VORA_ZERO3_LOAD', 'sometimes'),  # was read as "always"
    ('SWIFT_VORA_FPS', 'two'),
    ('SWIFT_VORA_WINDOW', '-5'),
    ('SWIFT_VORA_VERIFY_TIMEOUT', 'soon'),
])
def test_bad_values_are_errors_naming_the_variable(name, raw):
    with pytest.raises(SwitchError, match=re.escape(f'{name}={raw!r}')):
        read(name, {name: raw})


def test_flags_and_choices_read_one_way():
    assert parse('SWIFT_VORA_HOST_OVERHEAD', 'Off') is False and parse('SWIFT_VORA_HOST_OVERHEAD', ' YES ') is True
    assert parse('SWIFT_VORA_HOST_OVERHEAD', '') is True  # empty = unset = the default
    assert parse('SWIFT_VORA_ZERO3_LOAD', '0') == 'never' and parse('SWIFT_VORA_ZERO3_LOAD', 'no') == 'never'
    assert parse('SWIFT_VORA_COMPILE', 'none') == 'off' and parse('SWIFT_VORA_COMPILE', 'LAYERS') == 'layers'
    assert parse('SWIFT_VORA_WINDOW', 'none') is None and parse('SWIFT_VORA_WINDOW', '32') == 32.0
    assert parse('SWIFT_VORA_MAX_VIDEO_TOKENS', '0') is None
    assert read('SWIFT_VORA_GUARD_MEMORY', {}) is None  # unset: as SWIFT_VORA_GUARDS says


def test_defaults_are_the_ones_the_code_uses():
    assert VideoBudget.from_env({}) == VideoBudget()
    from swift_vora.dataset import window_config_from_env
    assert window_config_from_env({}) == WindowConfig()
    table = switches.table()
    assert table['SWIFT_VORA_DECODE_THREADS'].default == 1 and table['SWIFT_VORA_TAIL'].default == 'pad'
    assert table['SWIFT_VORA_MEMORY_EVERY'].default == 50 and table['SWIFT_VORA_COMPILE'].default == 'off'


def test_every_switch_the_code_names_is_in_the_table():
    named = set()
    for path in list((ROOT / 'swift_vora').rglob('*.py')) + [ROOT / 'benchmarks' / 'throughput.py']:
        named |= set(re.findall(r"SWIFT_VORA_[A-Z0-9_]*[A-Z0-9]", path.read_text()))
    named -= {'SWIFT_VORA_GUARD', 'SWIFT_VORA_TINY_MODEL'}  # a prefix in prose; a file name, not a variable
    assert named <= set(switches.table()), sorted(named - set(switches.table()))


def test_unknown_names_are_refused_with_the_closest_switch():
    with pytest.raises(SwitchError, match='SWIFT_VORA_HOST_OVERHEED: not a swift-vora switch .did you mean '
                       'SWIFT_VORA_HOST_OVERHEAD'):
        switches.check_environment({'SWIFT_VORA_HOST_OVERHEED': '0'})
    switches.check_environment({'SWIFT_VORA_HOST_OVERHEAD': '0', 'OTHER': 'x'})


def test_recipe_column():
    assert switches.recipe_env_error('SWIFT_VORA_TAIL', 'stop') is None
    assert 'video.max_frames' in switches.recipe_env_error('SWIFT_VORA_MAX_FRAMES', 8)
    assert 'not a training switch' in switches.recipe_env_error('SWIFT_VORA_MEMINFO', '/x')


def test_switches_command_prints_effective_values_and_fails_on_bad_ones(tmp_path):
    import os
    import sys
    env = {k: v for k, v in os.environ.items() if not k.startswith('SWIFT_VORA_')}
    env.update(PYTHONPATH=str(ROOT), SWIFT_VORA_TAIL='drop')
    run = subprocess.run([sys.executable, '-m', 'swift_vora', 'switches', '--json'], capture_output=True, text=True,
                         env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    rows = {r['name']: r for r in json.loads(run.stdout)}
    assert rows['SWIFT_VORA_TAIL']['value'] == 'drop' and rows['SWIFT_VORA_TAIL']['source'] == 'environment'
    assert rows['SWIFT_VORA_HOST_OVERHEAD']['value'] is True and rows['SWIFT_VORA_FPS']['recipe_key'] == 'video.fps'
    env['SWIFT_VORA_HOST_OVERHEAD'] = 'flase'
    run = subprocess.run([sys.executable, '-m', 'swift_vora', 'switches'], capture_output=True, text=True, env=env,
                         cwd=tmp_path)
    assert run.returncode == 1 and "SWIFT_VORA_HOST_OVERHEAD='flase'" in run.stdout


def _environment_reads(path: Path):
    """(line, name) of every SWIFT_VORA_* variable `path` reads from an environment itself: `os.environ[...]`,
    `os.environ.get(...)`, `os.getenv(...)`, or the same on a mapping named `environ`."""
    import ast
    tree = ast.parse(path.read_text(), str(path))
    constants = {t.id: n.value.value for n in ast.walk(tree) if isinstance(n, ast.Assign)
                 and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str) for t in n.targets
                 if isinstance(t, ast.Name)}

    def text(node):  # the variable's name as far as it is written out (a prefix is enough)
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name):
            return constants.get(node.id, '')
        if isinstance(node, ast.BinOp):
            return text(node.left)
        if isinstance(node, ast.JoinedStr) and node.values:
            return text(node.values[0])
        return ''

    def environment(node):
        name = node.attr if isinstance(node, ast.Attribute) else getattr(node, 'id', '')
        return name == 'environ'

    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and environment(node.value):
            key = node.slice
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args and (
                (node.func.attr == 'get' and environment(node.func.value)) or node.func.attr == 'getenv'):
            key = node.args[0]
        if key is not None and text(key).startswith(switches.PREFIX):
            yield node.lineno, text(key)


def test_every_switch_is_read_through_the_table():
    files = [p for p in list((ROOT / 'swift_vora').rglob('*.py')) + list((ROOT / 'benchmarks').rglob('*.py'))
             + list((ROOT / 'scripts').rglob('*.py')) if p.name != 'switches.py']
    found = [f'{p.relative_to(ROOT)}:{line}: {name}' for p in files for line, name in _environment_reads(p)]
    assert not found, found


def test_the_scan_finds_a_read_around_the_table(tmp_path):
    module = tmp_path / 'm.py'
    module.write_text("import os\nNAME = 'SWIFT_VORA_X'\nos.environ.get(NAME)\nos.getenv('SWIFT_VORA_Y')\n"
                      "def f(environ):\n    return environ[PREFIX + 'Z'], environ.get('HOME')\n"
                      "PREFIX = 'SWIFT_VORA_'\n")
    assert [name for _, name in _environment_reads(module)] == ['SWIFT_VORA_X', 'SWIFT_VORA_Y', 'SWIFT_VORA_']


def test_guards_and_their_switches_are_one_list():
    from swift_vora.guards.registry import GUARDS
    assert tuple(GUARDS) == switches.GUARD_NAMES


def test_the_table_is_a_leaf():
    import ast
    tree = ast.parse((ROOT / 'swift_vora' / 'switches.py').read_text())
    imported = [n.module or '' for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in imported if m.startswith('swift_vora') or m.startswith('.') or m == ''], imported


def test_a_traceback_switched_off_prints_none(monkeypatch, capsys):
    from swift_vora import cli

    def broken(args):
        raise RuntimeError('boom')

    monkeypatch.setattr(cli, 'build_parser', lambda: _parser_with(broken))
    for value, shown in (('0', False), ('1', True), ('', False)):
        monkeypatch.setenv('SWIFT_VORA_TRACEBACK', value)
        assert cli.main(['x']) == 1
        err = capsys.readouterr().err
        assert ('Traceback (most recent call last)' in err) is shown, (value, err)
        assert 'internal error: RuntimeError: boom' in err


def _parser_with(handler):
    import argparse
    parser = argparse.ArgumentParser(prog='swift-vora')
    parser.add_argument('--version', action='store_true')
    sub = parser.add_subparsers(dest='command')
    sub.add_parser('x').set_defaults(handler=handler)
    return parser
