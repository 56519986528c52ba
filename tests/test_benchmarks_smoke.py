"""The benchmarks' CPU smoke modes (slow: real `swift sft` / `swift infer` processes) and their pure helpers.

The GPU runs (`bash scripts/gpu/run_all.sh throughput|learnability`) cannot run here; these tests make sure
the scripts themselves work end to end before device time is spent on them.
"""
import json
import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, 'benchmarks'))


def _run_smoke(script, tmp_path, *extra):
    work, out = tmp_path / 'work', tmp_path / 'out'
    cmd = [sys.executable, os.path.join('benchmarks', script), '--smoke', '--work', str(work), '--out', str(out),
           *extra]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-4000:] + '\n' + proc.stderr[-4000:]
    name = script.split('.')[0]
    found = sorted(out.glob(f'{name}-*.json'))
    assert found, f'no {name}-*.json in {out}: {os.listdir(out)}'
    return json.loads(found[-1].read_text())


@pytest.mark.slow
def test_throughput_smoke(tmp_path):
    res = _run_smoke('throughput.py', tmp_path, '--torch-profile', 'vora', '--sync-debug', 'vora')
    for key in ('gpu', 'command', 'baseline_samples_per_s', 'swift_vora_samples_per_s', 'baseline_peak_gib',
                'swift_vora_peak_gib', 'mfu', 'flops_formula', 'variants'):
        assert key in res, key
    assert res['smoke'] is True and res['errors'] == {}
    assert res['baseline_samples_per_s'] > 0 and res['swift_vora_samples_per_s'] > 0
    # Same work per sample on both paths, read from the encode logs.
    assert res['token_checks']['vora']['video_tokens_equal'] is True
    assert res['token_checks']['vora']['total_tokens_rel_diff'] <= 0.01
    vora = res['variants']['vora']
    assert vora['vora_encode_log']['frames'] == [8]
    assert set(res['mfu']) == {'baseline', 'vora'}
    assert '--custom_register_path swift_vora' in res['swift_vora_command']
    assert '--template video_ora' in res['swift_vora_command']
    # The diagnostic steps ran after the measured ones (not counted) and left their reports.
    assert vora['steps'] == 2 and '--max_steps 4' in vora['command']
    assert vora['torch_profile']['gpu_idle'] == {'error': 'no GPU events in the trace'}  # CPU: no kernels
    assert vora['syncs']['syncs'] == 0 and 'note' in vora['syncs']
    assert vora['gc_s_measured'] >= 0


@pytest.mark.slow
def test_learnability_smoke(tmp_path):
    res = _run_smoke('learnability.py', tmp_path)
    for key in ('command', 'r1_at_0_5', 'shuffled_r1_at_0_5', 'chance_r1_at_0_5', 'runs'):
        assert key in res, key
    assert res['pass'] is None  # nothing asserted in smoke mode
    for name in ('normal', 'shuffled'):
        run = res['runs'][name]
        assert 'error' not in run, run
        assert run['score']['clips'] == 4  # 2 test videos x 2 windows of 8 s
        assert '--custom_register_path swift_vora' in run['train_command']
        assert '--dataset' in run['train_command'] and 'swift infer' in run['infer_command']
    assert res['encode_log']['frames'] == [16] and res['encode_log']['video_tokens'] == [96]


@pytest.mark.slow
def test_learnability_smoke_trains_lora_on_an_fp8_base_next_to_bf16(tmp_path):
    """The FP8 lever end to end under real `swift sft` (casts emulated on the CPU): the plugin's callback converts
    the decoder's frozen linears at train begin, the LoRA run trains and infers, and the losses are compared."""
    pytest.importorskip('torchao', reason='torchao is the FP8 library (pip install -e .[test] brings it)')
    res = _run_smoke('learnability.py', tmp_path, '--tuner', 'lora', '--runs', 'normal,normal_fp8')
    for name in ('normal', 'normal_fp8'):
        assert 'error' not in res['runs'][name], res['runs'][name]
        assert res['runs'][name]['score']['clips'] == 4 and '--adapters' in res['runs'][name]['infer_command']
    report = json.loads((tmp_path / 'work' / 'normal_fp8' / 'output' / 'fp8.json').read_text())
    assert report['converted'] > 0 and report['emulated'] is True
    assert 0 < report['weight_bytes_after'] < report['weight_bytes_before']  # the tiny model's are < 1 MiB
    assert not (tmp_path / 'work' / 'normal' / 'output' / 'fp8.json').exists()  # the bf16 twin stays bf16
    fp8 = res['fp8']
    assert fp8['logged_steps_compared'] >= 1 and fp8['loss_max_rel_diff_vs_bf16'] < 0.05


# ---- fast checks of the pure parts -------------------------------------------------------------------------------

def test_fp8_variants_are_the_bf16_twins_plus_the_switch_and_their_losses_compared():
    from throughput import FP8_TWIN_QUALIFIERS, compare_fp8, fp8_twin, variant_specs
    specs = variant_specs(smoke=False, workers_baseline=2, workers_vora=4)
    fp8_names = [n for n in specs if fp8_twin(n)]
    assert {'vora_gc_compile_fp8', 'vora_gc_compile_fp8_exact'} <= set(fp8_names)
    for name in fp8_names:
        twin = specs[fp8_twin(name)]
        setting = next((v for q, v in FP8_TWIN_QUALIFIERS.items() if name.endswith(q)), {})
        assert specs[name]['env'] == {**twin['env'], 'SWIFT_VORA_FP8': 'frozen_base', **setting}, name
        assert {k: v for k, v in specs[name].items() if k != 'env'} == {k: v for k, v in twin.items() if k != 'env'}
    assert fp8_twin('vora_gc_compile_fp8_exact') == 'vora_gc_compile' and fp8_twin('vora_gc') is None
    results = {'vora_gc': {'losses': [2.0, 1.5], 'samples_per_s': 3.6517},
               'vora_gc_fp8': {'losses': [2.02, 1.47], 'samples_per_s': 2.9786},
               'vora_compile_mb4_fp8': {'losses': [2.0]}, 'vora_gc_fp8_exact': {'losses': [2.0, 1.53]}}
    compare_fp8(results)
    assert results['vora_gc_fp8']['fp8'] is True and results['vora_gc_fp8']['loss_max_rel_diff_vs_bf16'] == 0.02
    assert results['vora_gc_fp8']['samples_per_s_vs_bf16'] == 0.8157  # run fp8-b's two rates
    assert results['vora_gc_fp8_exact']['samples_per_s_vs_bf16'] is None  # it has no rate (did not finish)
    assert results['vora_gc_fp8_exact']['loss_max_rel_diff_vs_bf16'] == 0.02
    assert 'loss_max_rel_diff_vs_bf16' not in results['vora_compile_mb4_fp8']  # its twin did not run
    assert 'fp8' not in results['vora_gc']


def test_flops_formula_matches_the_note():
    """gpu-machine.md: a dense forward+backward of the 2B baseline sample is about 6e13 FLOP."""
    from throughput import flops_per_sample
    parts = flops_per_sample('2b', tokens=6106, video_tokens=5760, supervised=12, grid=[32, 20, 36])
    assert 4.5e13 < parts['total'] < 8e13
    assert parts['llm_matmul'] == 4 * 1409286144 * 6106


def _variant(rate, peak, mfu=None, batch_size=1):
    return {'samples_per_s': rate, 'peak_reserved_gib': peak, 'mfu': mfu, 'batch_size': batch_size,
            'command': f'swift sft ... {rate}'}


def test_headline_takes_the_strongest_plain_variant_within_the_default_memory():
    """The issue's numbers: ours against plain swift tuned by a knowledgeable user, at no more memory than plain
    swift's default; and the fastest of each side at any memory, larger micro-batches allowed."""
    from throughput import apply_headline
    variants = {
        'baseline': _variant(1.66, 7.17),
        'baseline_strong': _variant(1.76, 6.79),
        'baseline_strong_liger': _variant(1.88, 6.66),
        'baseline_strong_liger_nogc_mb4': _variant(2.60, 30.0, batch_size=4),  # faster, but over the budget
        'vora_gc_compile': _variant(3.78, 6.18, mfu=0.33),
        'vora_gc': _variant(2.0, 7.0),
        'vora_compile_mb4': _variant(5.0, 25.0, mfu=0.44, batch_size=4),
        'cal_f128': _variant(9.0, 1.0),  # calibration, not a speed variant
        'vora_gc_sac': {'samples_per_s': None, 'peak_reserved_gib': None},  # failed: no rate
    }
    res = apply_headline({'variants': variants})
    assert res['swift_vora_variant'] == 'vora_gc_compile' and res['swift_vora_mfu'] == 0.33
    assert res['speedup'] == round(3.78 / 1.66, 3)  # the existing key: against the default command
    assert res['baseline_variant'] == 'baseline_strong_liger'
    assert res['baseline_variant_samples_per_s'] == 1.88 and res['baseline_variant_peak_gib'] == 6.66
    assert res['speedup_vs_strongest'] == round(3.78 / 1.88, 3)
    any_memory = res['any_memory']
    assert any_memory['ours']['variant'] == 'vora_compile_mb4' and any_memory['ours']['batch_size'] == 4
    assert any_memory['baseline']['variant'] == 'baseline_strong_liger_nogc_mb4'
    assert any_memory['speedup'] == round(5.0 / 2.60, 3) and any_memory['mfu'] == 0.44
    assert res['fastest_any_memory']['variant'] == 'vora_compile_mb4'
    for key in ('baseline_samples_per_s', 'swift_vora_samples_per_s', 'baseline_peak_gib', 'swift_vora_peak_gib',
                'swift_vora_command', 'headline_rule'):
        assert key in res, key


def test_headline_without_a_plain_variant_within_budget_or_without_ours():
    from throughput import apply_headline
    # A plain variant above the default's memory is never the headline's baseline; the default itself always fits.
    res = apply_headline({'variants': {'baseline': _variant(1.66, 7.17), 'baseline_strong': _variant(1.9, 7.5),
                                       'vora': _variant(3.0, 9.0)}})
    assert res['baseline_variant'] == 'baseline' and res['swift_vora_variant'] is None
    assert res['speedup'] is None and res['speedup_vs_strongest'] is None
    assert res['any_memory']['speedup'] == round(3.0 / 1.9, 3)
    # A CPU smoke measures no peak: every variant is within the (unknown) budget.
    res = apply_headline({'variants': {'baseline': _variant(0.5, None), 'baseline_strong_mb4': _variant(0.7, None),
                                       'vora_gc_sac': _variant(0.6, None)}})
    assert res['baseline_variant'] == 'baseline_strong_mb4' and res['speedup_vs_strongest'] == round(0.6 / 0.7, 3)
    res = apply_headline({'variants': {}})
    assert res['baseline_variant'] is None and res['any_memory'] == {'ours': None, 'baseline': None, 'speedup': None,
                                                                     'mfu': None}


def test_micro_batch_variants_keep_the_samples_per_step():
    from throughput import MICRO_BATCH, MICRO_BATCH_LARGE, micro_steps, samples_per_step, variant_specs
    assert micro_steps(4, 4) == 1 and samples_per_step(4, 4) == 4  # the GPU run: 4 samples per step either way
    assert micro_steps(1, 4) == 1 and samples_per_step(1, 4) == 4  # the smoke: one micro-batch of 4
    assert micro_steps(8, 1) == 8
    specs = variant_specs(False, 4, 12)
    for name, spec in specs.items():
        size = re.search(r'_mb(\d+)', name)  # the name says the micro-batch: ..._mb4, ..._mb4_conv, ..._mb6
        expected = int(size.group(1)) if size else 1
        assert expected in (1, MICRO_BATCH, MICRO_BATCH_LARGE), name
        assert spec.get('batch_size', 1) == expected, name
    assert micro_steps(4, MICRO_BATCH_LARGE) == 1  # micro-batch 6: one micro-batch of 6 samples per step
    strong = specs['baseline_strong']
    assert strong['plugins'] == [] and strong['dataset'] == 'rows'  # plain swift: no plugin, no swift-vora data
    for flag in ('--vit_gradient_checkpointing', '--dataloader_persistent_workers'):
        assert flag in strong['flags']
    assert strong['flags'][strong['flags'].index('--dataloader_num_workers') + 1] == '12'
    assert strong['env']['PYTORCH_CUDA_ALLOC_CONF'] == 'expandable_segments:True'
    assert '--use_liger_kernel' in specs['baseline_strong_liger']['flags']
    assert specs['vora_gc_sac']['env']['SWIFT_VORA_SELECTIVE_CHECKPOINT'] == 'attention'
    assert specs['vora_gc_sac_matmul']['env']['SWIFT_VORA_SELECTIVE_CHECKPOINT'] == 'matmul'
    # plain swift cannot pack without flash-attn (see variant_specs); ours packs through vora_varlen
    packed = {name for name, s in specs.items() if '--padding_free' in s['flags']}
    assert packed == {'vora_gc_compile_packed_mb4', 'vora_compile_packed_mb4'}
    for name in packed:
        flags = specs[name]['flags']
        assert flags[flags.index('--attn_impl') + 1] == 'vora_varlen' and specs[name]['plugins'] == ['swift_vora']


def test_parallel_gives_each_side_by_side_variant_its_own_gpu(monkeypatch):
    from throughput import parallel_gpus
    monkeypatch.delenv('CUDA_VISIBLE_DEVICES', raising=False)
    assert parallel_gpus(1, smoke=True) == [None]  # the default: one at a time, on the default device
    assert parallel_gpus(2, smoke=True) == ['0', '1']
    monkeypatch.setenv('CUDA_VISIBLE_DEVICES', '3,5,6')  # mapped through what this process was given
    assert parallel_gpus(2, smoke=True) == ['3', '5']
    with pytest.raises(SystemExit, match='--parallel 0'):
        parallel_gpus(0, smoke=True)


def test_profile_summary(tmp_path):
    from throughput import summarize_profile
    raw = tmp_path / 'raw.txt'
    raw.write_text('thread (1): MainThread;train (trainer.py:10);backward (torch/autograd/graph.py:5) 30\n'
                   'thread (1): MainThread;train (trainer.py:10);forward (torch/utils/checkpoint.py:9) 10\n'
                   'thread (2): pin;_pin_memory_loop (torch/utils/data/_utils/pin_memory.py:3) 10\n')
    summary = summarize_profile(str(raw))
    assert summary['samples'] == 50
    assert summary['buckets']['autograd_backward'] == 0.6
    assert summary['buckets']['checkpoint_recompute_or_backward'] == 0.2
    assert summary['buckets']['pin_memory_thread'] == 0.2
    assert summary['top_inclusive'][0] == ['train (trainer.py)', 0.8]


def test_learnability_scoring(tmp_path):
    import learnability as L
    assert L.first_hit([[1.0, 3.0]], [[1.0, 3.0], [5.0, 6.0]])
    assert not L.first_hit([[5.0, 7.0], [1.0, 3.0]], [[1.0, 3.0]])  # only the first window counts
    assert not L.first_hit([], [[1.0, 3.0]])
    result = tmp_path / 'r.jsonl'
    rows = [{'labels': '[[1.0, 3.0]]', 'response': '[[1.0, 3.0]]'},
            {'labels': '[[4.0, 8.0]]', 'response': '[[0.0, 1.0]]'},
            {'labels': '[]', 'response': '[]'},
            {'labels': '[[2.0, 4.0]]', 'response': 'junk'}]
    result.write_text(''.join(json.dumps(r) + '\n' for r in rows))
    s = L.score(str(result), 8.0)
    assert s['clips'] == 4 and s['clips_with_events'] == 3 and s['clips_empty'] == 1
    assert s['r1_at_0_5'] == round(1 / 3, 4) and s['empty_accuracy'] == 1.0 and s['r1_at_0_5_all'] == 0.5


def test_learnability_data_and_chance():
    import random

    import learnability as L
    rng = random.Random(0)
    for _ in range(200):
        events = L.random_events(16, rng)
        assert 1 <= len(events) <= 3
        assert all(0 <= s < e <= 16 and (e - s) in (2, 3, 4) and s == int(s) for s, e in events)
        assert all(b[0] - a[1] >= 1 for a, b in zip(events, events[1:]))
    rows = [{'id': str(i), 'windows': [[i, i + 2]]} for i in range(10)]
    shuffled = L.derange(rows, 1)
    assert all(r['windows'] != s['windows'] for r, s in zip(rows, shuffled))
    assert sorted(map(str, (r['windows'] for r in rows))) == sorted(map(str, (s['windows'] for s in shuffled)))
    levels = L.chance_levels([[[1.0, 3.0]], [[1.0, 3.0]], []], [[[1.0, 3.0]], [[5.0, 7.0]], []])
    assert levels['majority_answer'] == [[1.0, 3.0]]
    assert levels['majority_r1_at_0_5'] == 0.5 and levels['chance_r1_at_0_5'] == round(1 / 3, 4)


_STEPS_THEN_HANG = '''
import json, sys, time
with open(sys.argv[1], "w") as f:
    for step in range(1, int(sys.argv[2]) + 1):
        f.write(json.dumps({"event": "step", "step": step}) + "\\n")
        f.flush()
time.sleep(120)  # still saving / shutting down when its timeout comes
'''


@pytest.mark.parametrize('logged, counts', [(4, True), (3, False)])
def test_a_variant_killed_at_its_timeout_counts_only_when_every_measured_step_was_logged(tmp_path, logged, counts):
    """A variant that logged its measured steps and was killed while saving is measured, marked, not 'failed';
    one killed before its last measured step still fails (no partial measurement passes as a result)."""
    import throughput as tp
    progress = tmp_path / 'progress.jsonl'
    proc = tp.run_logged([sys.executable, '-c', _STEPS_THEN_HANG, str(progress), str(logged)],
                         str(tmp_path / 'sft.log'), dict(os.environ), timeout=3)
    measured = lambda: tp.progress_steps(str(tmp_path)) >= 4  # noqa: E731 -- the benchmark's own check, steps=4
    if counts:
        assert tp.wait_logged(proc, 'swift sft (v)', str(tmp_path / 'sft.log'), measured=measured) == 'timeout'
    else:
        with pytest.raises(SystemExit, match='exit timeout'):
            tp.wait_logged(proc, 'swift sft (v)', str(tmp_path / 'sft.log'), measured=measured)
    assert proc.poll() is not None  # killed either way: nothing left running


def test_summarize_logs_derives_a_killed_variants_steps_from_its_kept_train_log(tmp_path, capsys):
    """`moe_throughput.py --summarize-logs`: the figures of a variant whose result entry says failed (killed while
    saving) come from its kept train_log.jsonl by the benchmark's own summary, the profiled step left out."""
    import moe_throughput
    out = tmp_path / 'vora_unsloth_mb8' / 'output'
    out.mkdir(parents=True)
    seconds = [200.0]  # the cold first step, then 2 s steps with one slow one, then the (slower) profiled step 13
    for dt in [2.0, 2.0, 2.0, 9.0] + [2.0] * 7 + [30.0]:
        seconds.append(seconds[-1] + dt)
    rows = [{'step': i + 1, 'loss': 1.0, 'samples': 8 * (i + 1), 'tokens': 8000 * (i + 1), 'data_wait_s': 0.0,
             'seconds': t, 'max_memory_allocated_gib': 104.7, 'max_memory_reserved_gib': 109.5}
            for i, t in enumerate(seconds)]
    (out / 'train_log.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in rows))
    assert moe_throughput.main(['--summarize-logs', str(out.parent), '--profile-step', '13']) == 0
    derived = json.loads(capsys.readouterr().out)
    v = derived['variants']['vora_unsloth_mb8']
    assert derived['derived_from_logs'] is True and v['steps'] == 12  # step 13 (profiled) is not counted
    assert len(v['step_s']) == 10 and v['median_step_s'] == 2.0 and v['mean_step_s'] == 2.7
    assert v['tokens_per_s'] == 4000.0 and v['peak_reserved_gib'] == 109.5 and v['micro_batch'] == 8


def test_the_result_carries_dynamos_graph_breaks_from_the_compile_line(tmp_path):
    """The counters compile_layers logs after step 1, read back from sft.log into the variant's result."""
    import throughput as tp

    from swift_vora.speed.compile_layers import COUNTERS_LOG_PREFIX  # the writer's own prefix
    counters = {'unique_graphs': 32, 'graph_breaks': 24, 'graph_break_reasons': {'builtins.__build_class__': 24}}
    log = tmp_path / 'sft.log'
    log.write_text(f'Train: 0%\n[INFO:swift] {COUNTERS_LOG_PREFIX}{counters}\nTrain: 7%\n')
    assert tp.compile_counters_logged(str(log)) == counters
    log.write_text('no compile line\n')
    assert tp.compile_counters_logged(str(log)) is None


def test_throughput_summarize_logs_compares_an_fp8_variant_with_its_twin_from_kept_logs(tmp_path, capsys):
    """`throughput.py --summarize-logs`: the kept logs of a twin killed after training and of its FP8 variant give
    both rates and the largest relative loss difference, by the benchmark's own summary."""
    import throughput as tp
    for name, losses in (('vora_gc', [4.0, 3.0, 2.0]), ('vora_gc_fp8', [4.0, 3.06, 2.0])):
        vdir = tmp_path / name
        (vdir / 'output').mkdir(parents=True)
        rows = [{'event': 'begin', 't': 0.0}] + [
            {'event': 'step', 'step': i, 'samples': 4 * i, 't': 10.0 + i, 'data_wait_s': 0.0, 'max_allocated_gib': 6.0,
             'max_reserved_gib': 6.3} for i in range(1, 4)]
        (vdir / 'progress.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in rows))
        (vdir / 'encode.jsonl').write_text(json.dumps({'tokens': 100, 'video_tokens': 80, 'supervised': 4}) + '\n')
        (vdir / 'output' / 'logging.jsonl').write_text(''.join(json.dumps({'loss': x}) + '\n' for x in losses))
    assert tp.main(['--summarize-logs', str(tmp_path / 'vora_gc'), str(tmp_path / 'vora_gc_fp8'), '--steps', '3',
                    '--warmup-steps', '1']) == 0
    derived = json.loads(capsys.readouterr().out)
    fp8, twin = derived['variants']['vora_gc_fp8'], derived['variants']['vora_gc']
    assert derived['derived_from_logs'] is True and twin['samples_per_s'] == fp8['samples_per_s'] == 4.0
    assert fp8['fp8'] is True and fp8['loss_max_rel_diff_vs_bf16'] == 0.02
