"""The demo's scoring: held-out clips that all contain events, and a shuffled-answer control that scores the same
answers against other clips' truths (an answer that ignores the video scores alike on both)."""
import json
import random

from swift_vora.demo import derange_windows, r1_at, score_against_control
from swift_vora.synthetic import random_intervals


def test_min_events_puts_an_event_in_every_clip():
    rng = random.Random(2)
    assert all(random_intervals(8.0, rng, max_events=2, min_events=1) for _ in range(200))
    # without min_events the draw is the one it always was (the tests' and benchmarks' data do not change)
    assert random_intervals(16.0, random.Random(5)) == random_intervals(16.0, random.Random(5), min_events=0)


def test_derangement_moves_every_answer_to_another_clip():
    rows = [{'id': f'v{i}', 'windows': [[i, i + 1]]} for i in range(6)]
    shuffled = derange_windows(rows, seed=3)
    assert [r['id'] for r in shuffled] == [r['id'] for r in rows]
    assert all(s['windows'] != r['windows'] for s, r in zip(shuffled, rows))
    assert sorted(map(str, (s['windows'] for s in shuffled))) == sorted(map(str, (r['windows'] for r in rows)))


def write(path, rows):
    path.write_text(''.join(json.dumps(r) + '\n' for r in rows))
    return str(path)


def test_answers_from_the_frames_beat_the_control_and_constant_answers_do_not(tmp_path):
    anns = [{'id': f'v{i}', 'duration': 8.0, 'windows': [[float(i % 6), float(i % 6) + 2]]} for i in range(8)]
    ann_path = write(tmp_path / 'a.jsonl', anns)
    seeing = write(tmp_path / 'seeing.jsonl', [{'id': a['id'], 'response': json.dumps(a['windows'])} for a in anns])
    real, control = score_against_control(ann_path, seeing, str(tmp_path / 'control.jsonl'))
    assert r1_at(real) == 1.0 and r1_at(control) < 0.5
    constant = write(tmp_path / 'constant.jsonl', [{'id': a['id'], 'response': '[[0.0, 2.0]]'} for a in anns])
    real, control = score_against_control(ann_path, constant, str(tmp_path / 'control2.jsonl'))
    assert r1_at(real) == r1_at(control)
