"""A SWIFT_VORA_* name that is not a switch is refused with the closest switch's name, by `swift-vora` and by the
plugin inside `swift sft`; every name the code, scripts and documentation spell out is in the switch table."""
import os
import re
import subprocess
import sys

import pytest

from swift_vora import switches
from swift_vora.switches import SwitchError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPELT_OUT = re.compile(r'SWIFT_VORA_[A-Z0-9_]*[A-Z0-9]')
# docs/runs/benchmarks-log.md is the log of past runs: it names switches of levers that were measured and removed.
RUN_LOG = os.path.join('docs', 'runs', 'benchmarks-log.md')
NOT_VARIABLES = {'SWIFT_VORA_GUARD', 'SWIFT_VORA_TINY_MODEL'}  # the prefix of GUARD_<NAME>; a marker file's name


def test_every_name_spelt_out_in_the_project_is_a_switch():
    known = set(switches.table())
    missing = {}
    for folder in ('swift_vora', 'scripts', 'benchmarks', 'docs', 'recipes'):
        for root, _, files in os.walk(os.path.join(REPO, folder)):
            for name in files:
                path = os.path.join(root, name)
                if not name.endswith(('.py', '.sh', '.md', '.yaml')) or os.path.relpath(path, REPO) == RUN_LOG:
                    continue
                with open(path, encoding='utf-8', errors='replace') as f:
                    for found in SPELT_OUT.findall(f.read()):
                        if found not in known and found not in NOT_VARIABLES:
                            missing.setdefault(found, os.path.relpath(path, REPO))
    assert not missing, f'named but not in swift_vora/switches.py: {missing}'


def test_unknown_names_get_the_closest_switch():
    env = {'SWIFT_VORA_MAX_FRAME': '16', 'SWIFT_VORA_FPS': '2', 'SWIFT_VORA_GUARD_VERIFY_ADAPTR': '0',
           'SWIFT_VORA_QQQQ': '1', 'PATH': '/bin'}
    with pytest.raises(SwitchError) as info:
        switches.check_names(env)
    message = str(info.value)
    assert 'SWIFT_VORA_GUARD_VERIFY_ADAPTR: not a swift-vora switch (did you mean ' \
           'SWIFT_VORA_GUARD_VERIFY_ADAPTER?)' in message
    assert 'SWIFT_VORA_MAX_FRAME: not a swift-vora switch (did you mean SWIFT_VORA_MAX_FRAMES?)' in message
    assert 'SWIFT_VORA_QQQQ: not a swift-vora switch;' in message + ';'  # nothing close: no guess
    switches.check_names({'SWIFT_VORA_FPS': '2', 'SWIFT_VORA_WINDOW': '8', 'SWIFT_VORA_RECIPE_OVERRIDES': '[]'})


def _run(tmp_path, *argv, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith('SWIFT_VORA_')}
    env.update(PYTHONPATH=REPO, **extra)
    return subprocess.run([sys.executable, '-m', 'swift_vora', *argv], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)


def test_swift_vora_refuses_an_unknown_name_before_running(tmp_path):
    proc = _run(tmp_path, 'parse', '--text', '[[1, 2]]', SWIFT_VORA_MAX_FRAME='16')
    assert proc.returncode == 2 and proc.stdout == ''
    assert 'SWIFT_VORA_MAX_FRAME: not a swift-vora switch (did you mean SWIFT_VORA_MAX_FRAMES?)' in proc.stderr
    proc = _run(tmp_path, 'parse', '--text', '[[1, 2]]', SWIFT_VORA_MAX_FRAMES='16')
    assert proc.returncode == 0 and proc.stdout.strip() == '[[1.0, 2.0]]', proc.stderr


def test_switches_command_still_runs_with_an_unknown_name(tmp_path):
    proc = _run(tmp_path, 'switches', '--json', SWIFT_VORA_MAX_FRAME='16')
    assert proc.returncode == 1 and '"SWIFT_VORA_MAX_FRAMES"' in proc.stdout, proc.stderr
    assert 'SWIFT_VORA_MAX_FRAME: not a swift-vora switch (did you mean SWIFT_VORA_MAX_FRAMES?)' in proc.stdout
