"""The benchmarks' CPU smoke modes (slow: real `swift sft` / `swift infer` processes) and their pure helpers.

The GPU runs (`bash scripts/gpu/run_all.sh throughput|learnability`) cannot run here; these tests make sure
the scripts themselves work end to end before device time is spent on them.
"""
import json
import os
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


# ---- fast checks of the pure parts -------------------------------------------------------------------------------

def test_flops_formula_matches_the_note():
    """gpu-machine.md: a dense forward+backward of the 2B baseline sample is about 6e13 FLOP."""
    from throughput import flops_per_sample
    parts = flops_per_sample('2b', tokens=6106, video_tokens=5760, supervised=12, grid=[32, 20, 36])
    assert 4.5e13 < parts['total'] < 8e13
    assert parts['llm_matmul'] == 4 * 1409286144 * 6106


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
