"""The Unsloth runner on several processes (data parallel): torchrun ranks on gloo, the tiny Qwen3.5-MoE through the
runner's PEFT loader -- the same loop as on GPUs, where NCCL and Unsloth's loader take their places.

What a user relies on: N replicas train what one process trains over the same global batch; every rank ends with the
same adapter and only rank 0 writes; samples that do not divide over the ranks are counted, not silently dropped;
a rank that dies ends the run, named, within seconds. Plus the pieces on their own (no process group): the sampler's
spread, the tail policy, the launch on N GPUs, the torchrun command.
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from swift_vora.backends import data_parallel
from swift_vora.backends.rank_samples import Coverage, RankOrder, plan_tail

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPE = os.path.join(REPO, 'recipes', 'h200x1.yaml')
CONFIGS = os.path.join(REPO, 'tests', 'fixtures', 'configs')
STEPS = 3
GLOBAL_BATCH = 6  # 2 ranks x 3 micro-batches = 3 ranks x 2 = one process x 6
# Float tolerance of "equal": the replicas average W ranks' gradients (DDP), one process sums W x accumulation
# micro-batch gradients -- the same terms, summed in another order, float32 throughout (grouped_mm takes no float64).
# The losses agree to 1e-5, relative. The adapter after 3 AdamW steps: AdamW divides each update by the root of the
# gradient's second moment, so where a gradient element is ~0 the last bits of the summation order decide a visible
# part of its update (up to the learning rate). Per tensor: the relative L2 distance within 2e-3, under 1 % of the
# elements off by more than 1e-5, none by more than the learning rate. Measured on 2 / 3 ranks: 1.3e-5 / 5.1e-4
# relative, 2 / 21 of 39,168 elements off by more than 1e-5 (at most 0.1 % / 0.4 % of a tensor), at most 4e-5 / 1.7e-3.
LR = 1e-2
LOSS_RTOL = 1e-5
ADAPTER_REL_L2, ADAPTER_ELEMENT_TOL, ADAPTER_OFF_FRACTION = 2e-3, 1e-5, 0.01


def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def runner_cmd(model, data, out, *overrides):
    return [sys.executable, '-m', 'swift_vora.backends.unsloth_runner', RECIPE, f'model.path={model}',
            f'data.dataset={data}', 'data.window=8', 'data.stride=8', 'video.fps=1', 'video.max_frames=8',
            'video.pair_tokens=16', 'video.min_pair_tokens=4', 'train.micro_batch=1', 'train.dtype=float32',
            f'train.lr={LR:g}', 'train.lora_rank=4', f'train.output_dir={out}', 'unsloth.save_merged=false',
            'unsloth.gradient_checkpointing=false', 'unsloth.encode_threads=1', 'train.logging_steps=1', *overrides,
            '--loader', 'peft']


def runner_env(offline_env, nproc=None, **extra):
    """The environment `swift-vora train` gives the runner: NPROC_PER_NODE makes it start torchrun itself."""
    env = {**offline_env, 'PYTHONPATH': os.pathsep.join(p for p in (REPO, offline_env.get('PYTHONPATH')) if p),
           'SWIFT_VORA_GUARD_VERIFY_ADAPTER': '0', **extra}
    if nproc:
        env.update(NPROC_PER_NODE=str(nproc), MASTER_PORT=str(free_port()))
    return env


def run(model, data, out, offline_env, nproc=None, overrides=(), env=None, timeout=600):
    proc = subprocess.run(runner_cmd(model, data, out, *overrides), cwd=REPO, env=runner_env(offline_env, nproc,
                          **(env or {})), capture_output=True, text=True, timeout=timeout)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    return {'out': out, 'log': log, 'losses': [json.loads(line)['loss'] for line in
                                               (out / 'train_log.jsonl').read_text().splitlines()],
            'result': json.loads((out / 'unsloth_run_result.json').read_text())}


def adapter(out):
    from safetensors.torch import load_file
    return load_file(str(out / f'checkpoint-{STEPS}' / 'adapter_model.safetensors'))


@pytest.fixture(scope='module')
def six_samples(tmp_path_factory):
    from swift_vora.synthetic import make_dataset
    return make_dataset(str(tmp_path_factory.mktemp('dp_six')), 3, duration=16.0)  # 3 videos x 2 windows


@pytest.fixture(scope='module')
def one_process(tiny_qwen3_5_moe_dir, six_samples, tmp_path_factory, offline_env):
    """The reference: one process, no torchrun, the whole global batch as gradient accumulation."""
    return run(tiny_qwen3_5_moe_dir, six_samples, tmp_path_factory.mktemp('dp_ref') / 'out', offline_env,
               overrides=[f'train.max_steps={STEPS}', f'train.grad_accum={GLOBAL_BATCH}'])


@pytest.fixture(scope='module')
def two_ranks(tiny_qwen3_5_moe_dir, six_samples, tmp_path_factory, offline_env):
    """2 gloo ranks, 3 micro-batches each; every guard on, the adapter reload included."""
    return run(tiny_qwen3_5_moe_dir, six_samples, tmp_path_factory.mktemp('dp_two') / 'out', offline_env, nproc=2,
               overrides=[f'train.max_steps={STEPS}', f'train.grad_accum={GLOBAL_BATCH // 2}'],
               env={'SWIFT_VORA_GUARD_VERIFY_ADAPTER': '1'})


@pytest.fixture(scope='module')
def three_ranks(tiny_qwen3_5_moe_dir, six_samples, tmp_path_factory, offline_env):
    return run(tiny_qwen3_5_moe_dir, six_samples, tmp_path_factory.mktemp('dp_three') / 'out', offline_env,
               nproc=3, overrides=[f'train.max_steps={STEPS}', f'train.grad_accum={GLOBAL_BATCH // 3}'])


@pytest.mark.slow
@pytest.mark.parametrize('ranks', ['two_ranks', 'three_ranks'])
def test_replicas_train_what_one_process_trains_over_the_same_global_batch(ranks, one_process, request):
    import torch
    got = request.getfixturevalue(ranks)
    assert len(got['losses']) == len(one_process['losses']) == STEPS
    torch.testing.assert_close(torch.tensor(got['losses']), torch.tensor(one_process['losses']), rtol=LOSS_RTOL,
                               atol=0)
    assert len(set(one_process['losses'])) > 1  # the adapter moved: later steps see other weights
    mine, reference = adapter(got['out']), adapter(one_process['out'])
    assert sorted(mine) == sorted(reference)
    for name, want in reference.items():
        diff = (mine[name] - want).abs()
        assert float(diff.norm()) <= ADAPTER_REL_L2 * float(want.norm()), name
        assert float((diff > ADAPTER_ELEMENT_TOL).float().mean()) < ADAPTER_OFF_FRACTION, name
        assert float(diff.max()) <= LR, name
    expert_b = [k for k in mine if '.experts.' in k and 'lora_B' in k]
    assert expert_b and all(mine[k].abs().sum() > 0 for k in expert_b)  # B starts at 0: the experts trained
    steps = [json.loads(line) for line in (got['out'] / 'train_log.jsonl').read_text().splitlines()]
    assert [s['samples'] for s in steps] == [GLOBAL_BATCH * (i + 1) for i in range(STEPS)]  # summed over ranks


@pytest.mark.slow
def test_one_process_under_torchrun_is_the_one_process_run(tiny_qwen3_5_moe_dir, six_samples, one_process, tmp_path,
                                                           offline_env):
    """`NPROC_PER_NODE=1`: the launcher's process trains exactly what the plain process trains -- no DDP, no
    exchange: the same losses and the same adapter, bit for bit."""
    got = run(tiny_qwen3_5_moe_dir, six_samples, tmp_path / 'out', offline_env, nproc=1,
              overrides=[f'train.max_steps={STEPS}', f'train.grad_accum={GLOBAL_BATCH}'])
    assert 'replica 0 of 1' in got['log'] and 'without DDP' in got['log']
    assert got['result']['wrapped_in_ddp'] is False and one_process['result']['wrapped_in_ddp'] is False
    assert got['losses'] == one_process['losses']
    mine, reference = adapter(got['out']), adapter(one_process['out'])
    assert sorted(mine) == sorted(reference) and all(mine[k].equal(reference[k]) for k in reference)


@pytest.mark.slow
@pytest.mark.parametrize('ranks,world', [('two_ranks', 2), ('three_ranks', 3)])
def test_every_rank_holds_the_saved_adapter_and_only_rank_0_wrote(ranks, world, request):
    from swift_vora.backends.data_parallel import adapter_digest
    got = request.getfixturevalue(ranks)
    out, log = got['out'], got['log']
    dp = got['result']['data_parallel']
    assert got['result']['wrapped_in_ddp'] is True
    assert dp['world_size'] == world and dp['backend'] == 'gloo' and [r['rank'] for r in dp['ranks']] == list(
        range(world))
    # each rank's digest of its live adapter = the digest of what rank 0 saved
    assert dp['identical'] and dp['adapter_sha256'] == [adapter_digest(adapter(out))] * world
    assert [p.name for p in out.iterdir() if p.name.startswith('checkpoint-')] == [f'checkpoint-{STEPS}']
    assert log.count('[swift-vora unsloth] saved adapter') == 1
    assert len((out / 'train_log.jsonl').read_text().splitlines()) == STEPS
    assert not [p for p in out.iterdir() if re.search(r'rank[1-9]', p.name) and not p.name.startswith(
        ('memory_phases.rank', 'supervision.rank', 'coverage.rank'))]
    for r in range(world):  # the per-rank reports: each rank its own memory by phase, supervision, coverage
        phases = [json.loads(line)['phase'] for line in (out / f'memory_phases.rank{r}.jsonl').read_text().splitlines()]
        assert {'model_loaded', 'forward', 'backward', 'optimizer_step', 'train_end'} <= set(phases)
        supervision = json.loads((out / f'supervision.rank{r}.json').read_text())
        assert supervision['rank'] == r and supervision['per_batch']['count'] == STEPS * GLOBAL_BATCH // world
    lora = json.loads((out / 'lora_update.json').read_text())
    assert lora['updated'] == lora['tensors'] > 0 and lora['expert_updated'] == lora['expert_tensors'] > 0
    if ranks == 'two_ranks':  # the adapter reload: once, by rank 0, after the others left
        verify = json.loads((out / 'verify_adapter.json').read_text())
        assert verify['ok'] and log.count('swift-vora verify_adapter:') == 1


@pytest.mark.slow
def test_every_sample_is_trained_once_per_epoch_on_every_rank_count(two_ranks, three_ranks):
    for got, world in ((two_ranks, 2), (three_ranks, 3)):
        summary = [json.loads(line) for line in (got['out'] / 'coverage_summary.jsonl').read_text().splitlines()]
        assert [row['epoch'] for row in summary] == list(range(STEPS))  # one global batch = one epoch here
        for row in summary:
            assert row['epoch_complete'] and row['trained'] == row['samples'] == GLOBAL_BATCH
            assert row['never_seen'] == row['repeated'] == row['dropped'] == []
            assert row['consumed_per_rank'] == [GLOBAL_BATCH // world] * world


@pytest.mark.slow
def test_an_uneven_last_batch_is_counted_not_dropped(tiny_qwen3_5_moe_dir, tmp_path, offline_env):
    """4 samples over 3 ranks: torch's sampler repeats 2 of them each epoch (SWIFT_VORA_TAIL=pad, the default), so
    every sample is trained; the plan names them, and the summary counts them; the step that runs past the epoch
    is counted in the next one, as not reached."""
    from swift_vora.synthetic import make_dataset
    data = make_dataset(str(tmp_path / 'data'), 2, duration=16.0)
    out = tmp_path / 'out'
    got = run(tiny_qwen3_5_moe_dir, data, out, offline_env, nproc=3,
              overrides=['train.max_steps=1', 'train.grad_accum=3', 'train.save_steps=100'])
    plan = json.loads((out / 'coverage_plan.json').read_text())
    assert plan['samples'] == 4 and plan['world_size'] == 3 and plan['samples_per_rank'] == 2
    assert len(plan['repeated_epoch0']) == 2 and plan['dropped_epoch0'] == []
    assert 'SWIFT_VORA_TAIL=pad repeats 2 sample(s) each epoch' in got['log']
    first, second = [json.loads(line) for line in (out / 'coverage_summary.jsonl').read_text().splitlines()]
    assert first['epoch_complete'] and first['trained'] == 4 and first['never_seen'] == []
    assert sorted(first['repeated']) == sorted(plan['repeated_epoch0']) and first['consumed_per_rank'] == [2, 2, 2]
    assert not second['epoch_complete'] and second['reason'] == 'max_steps' and second['consumed_per_rank'] == [1] * 3
    assert second['trained'] + len(second['not_reached']) == 4
    for r in range(3):
        rows = [json.loads(line) for line in (out / f'coverage.rank{r}.jsonl').read_text().splitlines()]
        assert [(row['epoch'], row['consumed'], row['complete']) for row in rows] == [(0, 2, True), (1, 1, False)]
    assert got['result']['last']['samples'] == 9  # 3 ranks x 3 micro-batches, the repeats included
    # the one step is the warm-up's first, at a rate of zero (as in swift sft): the update check says it did not run
    assert json.loads((out / 'lora_update.json').read_text())['steps_counted'] == 0


@pytest.mark.slow
def test_a_killed_rank_ends_the_run_naming_it(tiny_qwen3_5_moe_dir, six_samples, tmp_path, offline_env):
    out = tmp_path / 'out'
    cmd = runner_cmd(tiny_qwen3_5_moe_dir, six_samples, out, 'train.max_steps=10000', 'train.grad_accum=1',
                     'train.save_steps=100000')
    proc = subprocess.Popen(cmd, cwd=REPO, env=runner_env(offline_env, 2), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines, victim, killed_at = [], None, None
    try:
        for line in proc.stdout:
            lines.append(line)
            found = re.search(r'rank 1/2\] replica 1 of 2 .*pid (\d+)', line)
            victim = int(found.group(1)) if found else victim
            if '"step": 2,' in line:  # training: both ranks are inside the loop
                assert victim, ''.join(lines)[-3000:]
                os.kill(victim, signal.SIGKILL)
                killed_at = time.monotonic()
                break
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    log = ''.join(lines) + rest
    assert killed_at is not None, log[-3000:]
    assert proc.returncode != 0 and time.monotonic() - killed_at < 60, log[-3000:]
    # torchrun's summary names the rank that failed first and how
    root = log[log.index('Root Cause'):]
    assert re.search(r'rank\s*:\s*1 \(local_rank: 1\)', root) and 'SIGKILL' in root, log[-3000:]
    assert not [p for p in out.iterdir() if p.name.startswith('checkpoint-')]


# ---- the pieces, without a process group -------------------------------------------------------------------------
@pytest.mark.parametrize('n,world', [(6, 2), (6, 3), (7, 3), (4, 3), (2, 2)])
def test_the_ranks_orders_interleave_into_the_one_process_order(n, world):
    """Step by step, the W ranks together draw the rows one process draws (pad: the remainder's repeats appended
    at the end of each epoch) -- what makes the runs above equal."""
    one = RankOrder(n, seed=5)
    ranks = [RankOrder(n, world, r, seed=5) for r in range(world)]
    per_rank = -(-n // world)
    for epoch in range(3):
        single = [one.next() for _ in range(n)]
        drawn = [[o.next() for _ in range(per_rank)] for o in ranks]
        together = [drawn[r][k] for k in range(per_rank) for r in range(world)]
        assert {p.epoch for p in together} == {epoch}
        assert [p.index for p in together][:n] == [p.index for p in single]
        assert [p.index for p in together][n:] == [p.index for p in single][:per_rank * world - n]  # the repeats


def test_tail_policies_count_the_remainder_or_refuse():
    pad = plan_tail(7, 3, seed=1)
    assert pad['error'] is None and not pad['drop_last'] and pad['samples_per_rank'] == 3
    assert len(pad['repeated_epoch0']) == 2 and pad['dropped_epoch0'] == []
    drop = plan_tail(7, 3, seed=1, tail='drop')
    assert drop['drop_last'] and drop['samples_per_rank'] == 2 and len(drop['dropped_epoch0']) == 1
    assert 'SWIFT_VORA_TAIL=stop' in plan_tail(7, 3, seed=1, tail='stop')['error']
    assert plan_tail(6, 3, seed=1, tail='stop')['error'] is None
    tiny = plan_tail(2, 3, seed=1)
    assert 'rank(s) [2] would have no sample' in tiny['error'] and 'SWIFT_VORA_REPLICATE_TINY' in tiny['error']
    assert plan_tail(2, 3, seed=1, replicate=True)['error'] is None
    with pytest.raises(ValueError, match='SWIFT_VORA_TAIL'):
        plan_tail(4, 2, seed=1, tail='trim')


def test_coverage_names_dropped_and_rejected_samples(tmp_path):
    """3 ranks, 7 samples, SWIFT_VORA_TAIL=drop: each epoch leaves one out, named; a rejected sample is counted."""
    world, n = 3, 7
    orders = [RankOrder(n, world, r, seed=2, drop_last=True) for r in range(world)]
    covs = [Coverage(n, world, r, 2, True, orders[r].per_epoch, str(tmp_path), lambda i: f's{i}')
            for r in range(world)]
    for r, (order, cov) in enumerate(zip(orders, covs)):
        drawn = [order.next() for _ in range(order.per_epoch)]
        if r == 0:  # the template rejected rank 0's first sample
            cov.consumed(drawn[1:], rejected=drawn[:1])
        else:
            cov.consumed(drawn)
    rank_rows = [c._rank_row(0) for c in covs]
    summary = covs[0].finish(lambda mine: [{0: row} for row in rank_rows], 'max_steps')
    (row, ) = summary
    assert row['epoch_complete'] and len(row['dropped']) == 1 and row['dropped_ids'] == [f's{row["dropped"][0]}']
    rejected = rank_rows[0]['rejected']
    assert row['rejected'] == rejected and row['trained'] == n - 2
    assert sorted(row['never_seen']) == sorted(row['dropped'] + rejected)
    assert len((tmp_path / 'coverage.rank0.jsonl').read_text().splitlines()) == 1  # the finished epoch, once


def test_the_runner_starts_torchrun_as_swift_sft_reads_the_environment(monkeypatch):
    for key in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'NPROC_PER_NODE', 'NNODES', 'NODE_RANK', 'MASTER_ADDR',
                'MASTER_PORT'):
        monkeypatch.delenv(key, raising=False)
    assert data_parallel.torchrun_argv('m', ['cfg.json']) is None  # one process
    monkeypatch.setenv('NPROC_PER_NODE', '8')
    monkeypatch.setenv('NNODES', '2')
    monkeypatch.setenv('NODE_RANK', '1')
    monkeypatch.setenv('MASTER_ADDR', '10.0.0.1')
    argv = data_parallel.torchrun_argv('swift_vora.backends.unsloth_runner', ['cfg.json'])
    assert argv[:3] == [sys.executable, '-m', 'torch.distributed.run']
    flags = dict(zip(argv[3:-3:2], argv[4:-3:2]))
    assert flags == {'--nproc_per_node': '8', '--nnodes': '2', '--node_rank': '1', '--master_addr': '10.0.0.1'}
    assert argv[-3:] == ['-m', 'swift_vora.backends.unsloth_runner', 'cfg.json']
    monkeypatch.setenv('RANK', '3')
    monkeypatch.setenv('WORLD_SIZE', '16')
    assert data_parallel.torchrun_argv('m', ['cfg.json']) is None  # a worker already: it trains


def test_a_plan_on_eight_gpus_launches_eight_replicas():
    from swift_vora.backends.launch import build_launch
    from swift_vora.backends.planning import plan_recipe
    from swift_vora.backends.recipe import load_recipe
    from swift_vora.backends.unsloth import RUN_CONFIG_NAME, UnslothRunConfig
    recipe = load_recipe(os.path.join(REPO, 'recipes', 'h200x8.yaml'),
                         [f'model.path={os.path.join(CONFIGS, "qwen3_5_moe_35b_a3b.json")}',
                          'train.backend=unsloth_split_lora', 'train.micro_batch=1', 'train.grad_accum=null',
                          'megatron.ep=1'])
    plan = plan_recipe(recipe)
    assert plan.backend == 'unsloth_split_lora' and plan.verdict != 'refused', plan.reasons
    launch = build_launch(plan, recipe, environ={})
    assert launch.env['NPROC_PER_NODE'] == '8' and launch.argv[1:3] == ['-m', 'swift_vora.backends.unsloth_runner']
    note = next(note for note in launch.notes if 'through torchrun' in note)
    assert 'DDP all-reduces the LoRA gradients' in note
    cfg = UnslothRunConfig.from_json(next(t for p, t in launch.files.items() if p.endswith(RUN_CONFIG_NAME)))
    assert (cfg.num_gpus, cfg.nodes, cfg.grad_accum) == (8, 1, 2)  # a global batch of 16, as swift sft's ddp


def test_one_process_through_torchrun_is_announced_as_the_one_gpu_run():
    """`NPROC_PER_NODE=1 swift-vora train recipes/h200x1.yaml --dry-run`: the note says no DDP, not an all-reduce."""
    from swift_vora.backends.launch import build_launch
    from swift_vora.backends.planning import plan_recipe
    from swift_vora.backends.recipe import load_recipe
    recipe = load_recipe(RECIPE, [f'model.path={os.path.join(CONFIGS, "qwen3_5_moe_35b_a3b.json")}'])
    plan = plan_recipe(recipe)
    assert plan.backend == 'unsloth_split_lora', plan.reasons
    note = next(n for n in build_launch(plan, recipe, environ={'NPROC_PER_NODE': '1'}).notes if 'torchrun' in n)
    assert 'no DDP' in note and 'all-reduces' not in note


def test_the_one_gpu_benchmark_runs_its_twin_under_torchrun_and_compares_the_medians():
    """benchmarks/moe_throughput.py: `vora_unsloth_mb4_torchrun1` is `vora_unsloth_mb4` with NPROC_PER_NODE=1 (the
    runner then starts torchrun), and the result compares the two medians against the 3 % goal."""
    sys.path.insert(0, os.path.join(REPO, 'benchmarks'))
    import moe_throughput as mt
    twin, under = mt.vora_variant('vora_unsloth_mb4'), mt.vora_variant('vora_unsloth_mb4_torchrun1')
    assert under.overrides == twin.overrides and under.env == {**twin.env, 'NPROC_PER_NODE': '1'}
    payload = {'model': {'layers': 8, 'layer_types': ['x'] * 8}, 'variants': {
        'vora_unsloth_mb4': {'tokens_per_s': 10000.0, 'median_step_s': 2.0},
        'vora_unsloth_mb4_torchrun1': {'tokens_per_s': 9800.0, 'median_step_s': 2.04}}}
    mt.headline(payload, {}, {})
    assert payload['torchrun_overhead']['vora_unsloth_mb4_torchrun1'] == {
        'twin': 'vora_unsloth_mb4', 'processes': 1, 'tokens_per_s_ratio': 0.98, 'median_step_s': [2.04, 2.0],
        'goal': 'within 3%', 'goal_met': True}
