"""Hardware the planner plans for: generic `<gpu>x<N>` profiles, a profile with another GPU count, and `train`
refusing, before anything starts, a recipe planned for hardware this machine does not have."""
import json
import subprocess
import sys

import pytest
from conftest import REPO_ROOT

from swift_vora.plan import hardware as H


def test_generic_profiles_for_the_counts_a_gpu_class_is_sold_in():
    h = H.profile('h200x2')
    assert (h.num_gpus, h.gpu_mem_gib, h.gpu_name) == (2, H.GPU_GIB['H200'], 'H200')
    assert h.host_ram_gib == pytest.approx(2 * 276 * 1e9 / 2**30) and 'assumed' in h.host_ram_source
    assert H.profile('4090x3').num_gpus == 3 and H.profile('4090x3').gpu_mem_gib == H.GPU_GIB['RTX 4090']
    assert H.profile('h200x8').host_ram_gib == H.PROFILES['h200x8'][2]  # a named profile keeps its own figures
    with pytest.raises(KeyError, match='1, 2, 4, 8 GPUs'):
        H.profile('h200x3')
    with pytest.raises(KeyError, match='<gpu>x<N>'):
        H.profile('tpu-v5x4')


def test_hardware_names_read_in_any_case_and_a_wrong_one_gets_the_closest():
    assert H.resolve('H100x1').name == 'h100x1' and H.resolve('H200X8').num_gpus == 8
    assert H.resolve('H200x2').num_gpus == 2 and H.resolve('LOCAL').source == 'probed'
    for typed, meant in (('h200', 'h200x1'), ('a100x1', 'a100-80x1'), ('a100x1', 'a100-40x1'), ('h2000x1', 'h200x1'),
                         ('3090X9', '3090x')):
        with pytest.raises(KeyError) as err:
            H.resolve(typed)
        assert meant in err.value.args[0], (typed, err.value.args[0])
    assert H.suggest_profiles('h200') == ['h200x1'] and H.suggest_profiles('A100x1') == ['a100-40x1', 'a100-80x1']


def test_hardware_and_gpus_combine():
    h = H.resolve('h200x8', gpus=2)
    assert h.num_gpus == 2 and h.gpu_name == 'H200' and h.name == 'h200x8 with 2 GPUs'
    assert H.resolve('h200x1', gpus=3).num_gpus == 3  # any count, as the user says
    h = H.resolve('3090x3', gpu_mem_gib=22.0)
    assert h.num_gpus == 3 and h.gpu_mem_gib == 22.0
    with pytest.raises(ValueError, match='go together'):
        H.resolve(None, gpus=2)


def test_plan_accepts_hardware_with_gpus():
    out = subprocess.run([sys.executable, '-m', 'swift_vora', 'plan', '--model', 'Qwen/Qwen3-VL-2B-Instruct',
                          '--hardware', 'h200x8', '--gpus', '2', '--json'], capture_output=True, text=True,
                         cwd=REPO_ROOT)
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan['num_gpus'] == 2 and plan['hardware']['gpu_name'] == 'H200'


def test_machine_mismatch_names_what_differs():
    planned = H.profile('3060x4')
    none = H.Hardware(name='local', num_gpus=0, gpu_mem_gib=0.0, host_ram_gib=23.5, source='probed')
    assert H.machine_mismatch(planned, none, needs_bf16=True) == ['4 GPUs per node planned, 0 here']
    small = H.Hardware(name='local', num_gpus=4, gpu_mem_gib=7.8, host_ram_gib=64, gpu_name='RTX 3070',
                       source='probed', bf16=True)
    assert H.machine_mismatch(planned, small, True) == ['11.76 GiB per GPU planned, 7.80 GiB here (RTX 3070)']
    turing = H.Hardware(name='local', num_gpus=4, gpu_mem_gib=23.6, host_ram_gib=64, gpu_name='Quadro RTX 6000',
                        source='probed', bf16=False)
    assert 'no bf16' in H.machine_mismatch(planned, turing, True)[0]
    assert H.machine_mismatch(planned, turing, False) == []  # a float16 / float32 recipe runs there
    same = H.Hardware(name='local', num_gpus=8, gpu_mem_gib=11.70, host_ram_gib=64, gpu_name='RTX 3060',
                      source='probed', bf16=True)
    assert H.machine_mismatch(planned, same, True) == []  # more GPUs, a few MiB less memory: fine
    boxed = H.Hardware(name='local', num_gpus=4, gpu_mem_gib=11.76, host_ram_gib=16.0, gpu_name='RTX 3060',
                       source='probed', bf16=True, host_ram_source='container limit (cgroup v2 memory.max)')
    assert H.machine_mismatch(planned, boxed, True, host_peak_gib=30.63) == [
        'a host peak of 30.63 GiB per node planned, 16.00 GiB here (container limit (cgroup v2 memory.max)): the '
        'kernel would kill the run while it loads']
    assert H.machine_mismatch(planned, boxed, True, host_peak_gib=12.0) == []


@pytest.mark.slow
def test_train_refuses_a_recipe_for_other_hardware_before_anything_starts(tiny_model_dir, tiny_annotations,
                                                                          tmp_path, offline_env):
    """This machine has no GPU: a 4-GPU recipe stops with exit 4 naming both (it started 4 processes that died
    after 35 s); --trust-recipe-hardware lets it through to the next check."""
    import os
    env = {**offline_env, 'CUDA_VISIBLE_DEVICES': ''}  # no GPU, whatever the machine running the tests has
    argv = [sys.executable, '-m', 'swift_vora', 'train', '3060x4', f'model.path={tiny_model_dir}',
            'model.type=qwen3_vl', f'data.dataset={tiny_annotations}', f'train.output_dir={tmp_path / "out"}']
    done = subprocess.run(argv, capture_output=True, text=True, cwd=REPO_ROOT, env=env, timeout=300)
    assert done.returncode == 4, done.stderr[-2000:]
    assert 'hardware 3060x4 (4 x RTX 3060 11.76 GiB' in done.stderr and '4 GPUs per node planned' in done.stderr
    assert 'this machine (no GPU' in done.stderr and '--trust-recipe-hardware' in done.stderr
    assert not os.path.exists(tmp_path / 'out' / 'swift-vora-launch')  # nothing written, nothing started
    dry = subprocess.run(argv + ['--dry-run'], capture_output=True, text=True, cwd=REPO_ROOT, env=env, timeout=300)
    # --dry-run shows the plan for the recipe's hardware and the command, launches nothing, and exits as the launch
    assert dry.returncode == 4 and 'launch (exact command)' in dry.stdout and 'is not this machine' in dry.stderr
    assert not os.path.exists(tmp_path / 'out' / 'swift-vora-launch')
