"""The Unsloth runner's kernel caches: one documented folder that outlives the run, the user's own settings kept, and
a first-step report that tells a warm cache from a cold one."""
import os

import pytest

from swift_vora import switches
from swift_vora.backends import kernel_cache as kc


def test_caches_go_under_one_folder_that_outlives_the_run():
    env = {}
    got = kc.cache_env(env)
    root = kc.cache_root(env)  # ~/.cache/swift_vora (expanduser reads this process's HOME)
    assert root == os.path.join(os.path.expanduser('~'), '.cache', 'swift_vora')
    assert got['TRITON_CACHE_DIR'] == os.path.join(root, 'triton')
    assert got['TORCHINDUCTOR_CACHE_DIR'] == os.path.join(root, 'inductor')
    assert got['UNSLOTH_COMPILE_LOCATION'] == os.path.join(root, 'unsloth_compiled')
    assert got['TRITON_CACHE_AUTOTUNING'] == '1' and got['FLA_CACHE_RESULTS'] == '1'


def test_xdg_and_the_switch_move_the_root(tmp_path):
    assert kc.cache_root({'XDG_CACHE_HOME': str(tmp_path)}) == os.path.join(str(tmp_path), 'swift_vora')
    mine = str(tmp_path / 'volume')
    env = {'XDG_CACHE_HOME': str(tmp_path), 'SWIFT_VORA_CACHE_DIR': mine}
    assert kc.cache_root(env) == mine
    assert kc.cache_env(env)['TRITON_CACHE_DIR'] == os.path.join(mine, 'triton')


def test_what_the_user_set_is_left_alone(tmp_path):
    env = {'TRITON_CACHE_DIR': '/their/triton', 'FLA_CACHE_RESULTS': '0', 'XDG_CACHE_HOME': str(tmp_path)}
    got = kc.cache_env(env)
    assert 'TRITON_CACHE_DIR' not in got and 'FLA_CACHE_RESULTS' not in got
    assert kc.cache_dirs(env)['TRITON_CACHE_DIR'] == '/their/triton'


def test_the_cache_switch_is_in_the_table():
    s = switches.switch('SWIFT_VORA_CACHE_DIR')
    assert s.kind == 'path' and s.where == 'backends/kernel_cache.py'


def test_first_step_report_tells_warm_from_cold(tmp_path):
    env = {'SWIFT_VORA_CACHE_DIR': str(tmp_path)}
    before = kc.snapshot(env)
    assert before == {'TRITON_CACHE_DIR': 0, 'TORCHINDUCTOR_CACHE_DIR': 0, 'UNSLOTH_COMPILE_LOCATION': 0}
    kernel = tmp_path / 'triton' / 'abc123'
    kernel.mkdir(parents=True)
    (kernel / 'chunk_fwd_kernel_o.cubin').write_bytes(b'x')
    (kernel / 'chunk_fwd_kernel_o.autotune.json').write_text('{}')
    cold = kc.first_step_report(212.4, before, kc.snapshot(env), env)
    assert cold['warm'] is False and cold['cache_entries_written']['TRITON_CACHE_DIR'] == 2
    assert cold['first_step_s'] == 212.4
    assert 'cold cache: wrote 2 triton entries' in kc.describe(cold)
    again = kc.snapshot(env)
    warm = kc.first_step_report(9.1, again, kc.snapshot(env), env)
    assert warm['warm'] is True and 'warm cache' in kc.describe(warm)
    assert str(tmp_path) in kc.describe(warm)


def test_counting_stops_at_its_limit(tmp_path):
    for i in range(5):
        (tmp_path / f'f{i}').write_text('x')
    assert kc.count_entries(str(tmp_path)) == 5
    assert kc.count_entries(str(tmp_path), limit=3) == 3
    assert kc.count_entries(str(tmp_path / 'missing')) == 0


def test_triton_activity_counts_through_tritons_own_listeners():
    knobs = pytest.importorskip('triton.knobs', reason='Triton is installed with torch on Linux x86-64')
    earlier = []
    knobs.autotuning.listener = lambda **kw: earlier.append(kw)
    try:
        activity = kc.TritonActivity.install()
        assert activity.available
        # what Triton calls (triton/runtime/autotuner.py, triton/compiler/compiler.py), with its keyword arguments
        knobs.autotuning.listener(fn=None, key=(64, ), best_config=None, configs_timings={}, duration=3.5,
                                  cache_hit=False)
        knobs.autotuning.listener(fn=None, key=(64, ), best_config=None, configs_timings={}, duration=None,
                                  cache_hit=True)
        knobs.compilation.listener(src=None, metadata={}, metadata_group={}, times=None, cache_hit=False)
        knobs.compilation.listener(src=None, metadata={}, metadata_group={}, times=None, cache_hit=True)
        knobs.compilation.listener(src=None, metadata={}, metadata_group={}, times=None, cache_hit=True)
        assert activity.summary() == {'available': True, 'kernels_compiled': 1, 'kernels_from_cache': 2,
                                      'autotuned': 1, 'autotune_s': 3.5, 'autotune_from_cache': 1}
        assert len(earlier) == 2  # a listener installed before ours still hears every event
        activity.remove()
        assert knobs.compilation.listener is None and knobs.autotuning.listener is not None
    finally:
        knobs.autotuning.listener = None


def test_the_report_names_the_folders_a_user_moved(tmp_path):
    env = {'SWIFT_VORA_CACHE_DIR': str(tmp_path), 'TORCHINDUCTOR_CACHE_DIR': '/elsewhere/inductor'}
    report = kc.first_step_report(3.0, kc.snapshot(env), kc.snapshot(env), env)
    line = kc.describe(report, env)
    assert 'inductor /elsewhere/inductor' in line and f'triton {tmp_path}/triton' in line


def test_a_folder_an_import_drops_is_put_back(monkeypatch, tmp_path):
    """unsloth_zoo's patching pops TORCHINDUCTOR_CACHE_DIR at import: the runner's inductor entries must still land
    in the cache folder (a mounted volume, or what `swift-vora kernel-cache export` reads), not in /tmp."""
    monkeypatch.setenv('TORCHINDUCTOR_CACHE_DIR', str(tmp_path / 'inductor'))
    monkeypatch.setenv('TRITON_CACHE_DIR', str(tmp_path / 'triton'))
    monkeypatch.delenv('UNSLOTH_COMPILE_LOCATION', raising=False)
    with kc.kept_through_imports():
        os.environ.pop('TORCHINDUCTOR_CACHE_DIR')  # what `import unsloth` does
        os.environ['UNSLOTH_COMPILE_LOCATION'] = 'set by the import'  # a variable we had not set stays theirs
    assert os.environ['TORCHINDUCTOR_CACHE_DIR'] == str(tmp_path / 'inductor')
    assert os.environ['TRITON_CACHE_DIR'] == str(tmp_path / 'triton')
    assert os.environ['UNSLOTH_COMPILE_LOCATION'] == 'set by the import'
    # not monkeypatch.delenv: its undo would put this value back for every later test in the session (unsloth_zoo's
    # compiler then wrote its generated modules into a folder of that name in the working directory)
    os.environ.pop('UNSLOTH_COMPILE_LOCATION')


def test_torch_default_for_inductor_is_not_taken_for_a_user_choice(tmp_path):
    # `import torch._dynamo` (transformers and peft do it) writes /tmp/torchinductor_<user> into the environment:
    # #30 call j's runner then kept inductor there, outside the documented cache folder.
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    assert kc.torch_default_inductor_dir() == default_cache_dir()
    env = {'TORCHINDUCTOR_CACHE_DIR': default_cache_dir(), 'SWIFT_VORA_CACHE_DIR': str(tmp_path)}
    assert kc.cache_env(env)['TORCHINDUCTOR_CACHE_DIR'] == str(tmp_path / 'inductor')
    assert kc.cache_dirs(env)['TORCHINDUCTOR_CACHE_DIR'] == str(tmp_path / 'inductor')
    theirs = {'TORCHINDUCTOR_CACHE_DIR': str(tmp_path / 'their-inductor')}
    assert 'TORCHINDUCTOR_CACHE_DIR' not in kc.cache_env(theirs)


def test_inductor_writes_under_our_folder_after_torch_dynamo_was_imported(tmp_path):
    import subprocess
    import sys
    code = ('import os, torch._dynamo\n'
            'from swift_vora.backends import kernel_cache\n'
            'kernel_cache.use_in_this_process()\n'
            'from torch._inductor.runtime.cache_dir_utils import cache_dir\n'
            'print(cache_dir())\n')
    env = {k: v for k, v in os.environ.items() if k not in kc.CACHE_FOLDERS}
    env['SWIFT_VORA_CACHE_DIR'] = str(tmp_path)
    out = subprocess.run([sys.executable, '-c', code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(tmp_path / 'inductor')
