"""A SWIFT_VORA_* variable nothing reads is warned about with the closest known name, by `swift-vora` and by the
plugin inside `swift sft`; every name the code, scripts and documentation spell out is a known one."""
import os
import re
import subprocess
import sys

from swift_vora.env_names import known_names, unknown_name_warnings, unknown_names

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPELT_OUT = re.compile(r'SWIFT_VORA_[A-Z0-9_]*[A-Z0-9]')


def test_every_name_spelt_out_in_the_project_is_known():
    known = set(known_names())
    missing = {}
    for folder in ('swift_vora', 'scripts', 'benchmarks', 'docs', 'tests'):
        for root, _, files in os.walk(os.path.join(REPO, folder)):
            for name in files:
                if not name.endswith(('.py', '.sh', '.md')) or name in ('test_env_names.py', 'env_names.py'):
                    continue
                path = os.path.join(root, name)
                with open(path, encoding='utf-8', errors='replace') as f:
                    for found in SPELT_OUT.findall(f.read()):
                        if found not in known and found != 'SWIFT_VORA_GUARD':  # the prefix of GUARD_<NAME>
                            missing.setdefault(found, os.path.relpath(path, REPO))
    assert not missing, f'read but not in swift_vora/env_names.py: {missing}'


def test_unknown_names_get_the_closest_known_one():
    env = {'SWIFT_VORA_MAX_FRAME': '16', 'SWIFT_VORA_FPS': '2', 'SWIFT_VORA_GUARD_VERIFY_ADAPTR': '0',
           'SWIFT_VORA_QQQQ': '1', 'PATH': '/bin'}
    assert unknown_names(env) == [('SWIFT_VORA_GUARD_VERIFY_ADAPTR', 'SWIFT_VORA_GUARD_VERIFY_ADAPTER'),
                                  ('SWIFT_VORA_MAX_FRAME', 'SWIFT_VORA_MAX_FRAMES'), ('SWIFT_VORA_QQQQ', None)]
    assert unknown_name_warnings({'SWIFT_VORA_FPS': '2', 'SWIFT_VORA_WINDOW': '8'}) == []


def test_swift_vora_warns_on_stderr_and_still_runs(tmp_path):
    env = {**os.environ, 'SWIFT_VORA_MAX_FRAME': '16', 'PYTHONPATH': REPO}
    proc = subprocess.run([sys.executable, '-m', 'swift_vora', 'parse', '--text', '[[1, 2]]'], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == '[[1.0, 2.0]]'
    assert 'SWIFT_VORA_MAX_FRAME is set but swift-vora does not read it (did you mean SWIFT_VORA_MAX_FRAMES?)' \
        in proc.stderr
