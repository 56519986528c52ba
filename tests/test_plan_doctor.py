"""`swift-vora doctor` against fake cgroup trees (v2 limit, v2 "max", v1, none) and a fake /proc/meminfo."""
import json

import pytest

from swift_vora.cli import main
from swift_vora.plan import probe
from swift_vora.plan.hardware import resolve

GiB = 1024 ** 3


@pytest.fixture(autouse=True)
def _no_torch(monkeypatch, tmp_path):
    # keep doctor fast and deterministic here: no torch import, no nvidia-smi, a fixed /proc/meminfo
    monkeypatch.setenv('SWIFT_VORA_PROBE_TORCH', '0')
    monkeypatch.setattr(probe.shutil, 'which', lambda name: None)
    meminfo = tmp_path / 'meminfo'
    meminfo.write_text(f'MemTotal:       {64 * 1024 * 1024} kB\nMemFree:        1000 kB\n'
                       f'MemAvailable:   {60 * 1024 * 1024} kB\n')
    monkeypatch.setenv('SWIFT_VORA_MEMINFO', str(meminfo))
    # the fake roots below know nothing of this process's own cgroup path
    monkeypatch.setattr(probe, '_own_cgroup_paths', lambda *a, **k: {})


def v2_root(tmp_path, limit, events='oom 0\noom_kill 0\n'):
    root = tmp_path / 'cg2'
    root.mkdir()
    (root / 'cgroup.controllers').write_text('cpu memory\n')
    (root / 'memory.max').write_text(f'{limit}\n')
    (root / 'memory.current').write_text(f'{3 * GiB}\n')
    (root / 'memory.events').write_text(events)
    (root / 'cpu.max').write_text('200000 100000\n')
    return root


def v1_root(tmp_path, limit):
    root = tmp_path / 'cg1'
    (root / 'memory').mkdir(parents=True)
    (root / 'memory' / 'memory.limit_in_bytes').write_text(f'{limit}\n')
    (root / 'memory' / 'memory.usage_in_bytes').write_text(f'{GiB}\n')
    (root / 'memory' / 'memory.max_usage_in_bytes').write_text(f'{2 * GiB}\n')
    (root / 'memory' / 'memory.oom_control').write_text('oom_kill_disable 0\nunder_oom 0\noom_kill 2\n')
    (root / 'cpu').mkdir()
    (root / 'cpu' / 'cpu.cfs_quota_us').write_text('-1\n')
    (root / 'cpu' / 'cpu.cfs_period_us').write_text('100000\n')
    return root


def doctor_json(capsys, root):
    rc = main(['doctor', '--json', '--cgroup-root', str(root)])
    assert rc == 0
    return json.loads(capsys.readouterr().out)


def test_v2_limit(tmp_path, capsys):
    root = v2_root(tmp_path, 16 * GiB, events='low 0\nhigh 0\nmax 5\noom 3\noom_kill 2\n')
    r = doctor_json(capsys, root)
    m = r['memory']
    assert m['cgroup_version'] == 'v2' and m['limit_bytes'] == 16 * GiB and m['status'] == 'limited'
    assert m['usage_bytes'] == 3 * GiB and m['oom_kill'] == 2 and m['oom'] == 3
    assert r['host_limit_gib'] == 16.0
    # far below /proc/meminfo's 64 GiB -> warning; past OOM kills -> warning
    assert any('far below' in w for w in r['warnings'])
    assert any('OOM kill' in w for w in r['warnings'])
    assert r['cpus']['cgroup_quota'] == 2.0 and r['cpus']['count'] <= 2


def test_v2_max_means_no_limit(tmp_path, capsys):
    r = doctor_json(capsys, v2_root(tmp_path, 'max'))
    assert r['memory']['cgroup_version'] == 'v2' and r['memory']['status'] == 'unlimited'
    assert r['memory']['limit_bytes'] is None
    assert r['host_limit_gib'] == 64.0 and 'meminfo' in r['host_limit_source']
    assert not any('far below' in w for w in r['warnings'])


def test_v1_limit_and_huge_number(tmp_path, capsys):
    r = doctor_json(capsys, v1_root(tmp_path, 8 * GiB))
    m = r['memory']
    assert m['cgroup_version'] == 'v1' and m['limit_bytes'] == 8 * GiB and m['oom_kill'] == 2
    assert m['peak_bytes'] == 2 * GiB
    assert any('far below' in w for w in r['warnings'])
    # v1's "unlimited" is PAGE_COUNTER_MAX * PAGE_SIZE
    r = doctor_json(capsys, v1_root(tmp_path / 'b', 9223372036854771712))
    assert r['memory']['status'] == 'unlimited' and r['host_limit_gib'] == 64.0


def test_no_cgroup_files(tmp_path, capsys):
    empty = tmp_path / 'empty'
    empty.mkdir()
    r = doctor_json(capsys, empty)
    assert r['memory']['cgroup_version'] is None and r['memory']['status'] == 'none found'
    assert r['host_limit_gib'] == 64.0
    assert any('no cgroup memory limit' in w for w in r['warnings'])


def test_json_keys(tmp_path, capsys):
    r = doctor_json(capsys, v2_root(tmp_path, 16 * GiB))
    for k in ('gpus', 'gpu_probe', 'memory', 'host', 'host_limit_gib', 'cpus', 'python', 'packages', 'warnings'):
        assert k in r
    assert r['gpus'] == [] and r['gpu_probe'] == 'none'
    assert r['host']['mem_total_gib'] == 64.0
    assert r['python']['executable'] and r['python']['version']
    for pkg in ('torch', 'transformers', 'peft', 'ms-swift', 'deepspeed', 'megatron-core', 'unsloth', 'decord'):
        assert pkg in r['packages']
    assert r['packages']['transformers']  # installed in the test venv


def test_text_output(tmp_path, capsys):
    rc = main(['doctor', '--cgroup-root', str(v2_root(tmp_path, 16 * GiB))])
    out = capsys.readouterr().out
    assert rc == 0
    for s in ('GPUs (none)', 'container memory limit: 16.00 GiB', 'host RAM (/proc/meminfo): 64.00 GiB', 'CPUs:',
              'python:', 'warnings:'):
        assert s in out


def test_env_root_and_local_hardware(tmp_path, monkeypatch):
    monkeypatch.setenv('SWIFT_VORA_CGROUP_ROOT', str(v2_root(tmp_path, 16 * GiB)))
    assert probe.probe_memory()['limit_bytes'] == 16 * GiB
    hw = resolve('local')  # no GPU here: the plan says so instead of crashing
    assert hw.num_gpus == 0 and hw.host_ram_gib == 16.0 and hw.source == 'probed'


def test_nvidia_smi_fallback(monkeypatch):
    class R:
        stdout = '0, NVIDIA H200, 143771, 143000\n1, NVIDIA H200, 143771, 100000\n'

    monkeypatch.setattr(probe.shutil, 'which', lambda name: '/usr/bin/nvidia-smi')
    monkeypatch.setattr(probe.subprocess, 'run', lambda *a, **k: R())
    g = probe.probe_gpus(use_torch=False)
    assert g['source'] == 'nvidia-smi' and len(g['gpus']) == 2
    assert g['gpus'][0]['total_gib'] == pytest.approx(140.4, abs=0.1)


def test_doctor_says_what_it_probes_on_stderr_and_keeps_json_on_stdout(tmp_path):
    import os
    import subprocess
    import sys
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, 'PYTHONPATH': repo}
    env.pop('SWIFT_VORA_PROBE_TORCH', None)
    proc = subprocess.run([sys.executable, '-m', 'swift_vora', 'doctor', '--json'], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert 'swift-vora doctor: importing torch to probe the GPUs' in proc.stderr
    assert json.loads(proc.stdout)['gpu_probe'] in ('torch', 'nvidia-smi', 'none')
