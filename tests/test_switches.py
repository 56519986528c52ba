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
