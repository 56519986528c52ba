"""Reference predictions for QVHighlights-format annotations, for checking an evaluation pipeline.

Each set is a list of submission rows (`qid`, `pred_relevant_windows`, `pred_saliency_scores`) in the
official evaluator's format, fully determined by the annotations (and a seed): the figures they give
are pinned against the official evaluator in `tests/fixtures/eval/expected_official.json`
(`benchmarks/official_eval_compare.py` regenerates them).

- `oracle`: the ground-truth windows, scores decreasing in annotation order; saliency = the mean of
  the three annotators' scores (0 outside the annotated clips).
- `shifted_2s`: the ground-truth windows moved 2 s later (not clamped), all scores tied at 1.0;
  constant saliency 1.0 (every clip tied).
- `whole_video`: one window `[0, duration]`; saliency rising with the clip index.
- `random`: 1 to 14 windows on a 0.5-s grid with scores from a small set (ties), in random order;
  saliency of random length (shorter or longer than the video) with ties. `random.Random(seed)`,
  so the rows do not depend on the numpy version.
- `zero_length`: the `random` windows (seed 1) with zero-length windows (`start == end`) put in: one at list
  position `i % (n + 1)` for the i-th query (first, inside, last, and past the 10 windows mAP reads), one at the
  video's end (`[duration, duration]`) on every third query, one on a ground-truth window's start or end on every
  fifth, and on every seventh query the whole list zero-length. The official evaluator scores each IoU 0.
"""
from __future__ import annotations

import random
from typing import Callable, Dict, List, Mapping, Sequence

CLIP_SECONDS = 2.0


def _n_clips(row: Mapping) -> int:
    return int(float(row['duration']) / CLIP_SECONDS)


def _mean_saliency(row: Mapping) -> List[float]:
    scores = [0.0] * _n_clips(row)
    for cid, three in zip(row.get('relevant_clip_ids') or [], row.get('saliency_scores') or []):
        if 0 <= cid < len(scores):
            scores[cid] = sum(three) / len(three)
    return scores


def oracle(gt_rows: Sequence[Mapping]) -> List[dict]:
    return [{'qid': r['qid'],
             'pred_relevant_windows': [[w[0], w[1], round(1.0 - 0.01 * i, 4)]
                                       for i, w in enumerate(r['relevant_windows'])],
             'pred_saliency_scores': _mean_saliency(r)} for r in gt_rows]


def shifted(gt_rows: Sequence[Mapping], seconds: float = 2.0) -> List[dict]:
    return [{'qid': r['qid'],
             'pred_relevant_windows': [[w[0] + seconds, w[1] + seconds, 1.0] for w in r['relevant_windows']],
             'pred_saliency_scores': [1.0] * _n_clips(r)} for r in gt_rows]


def whole_video(gt_rows: Sequence[Mapping]) -> List[dict]:
    return [{'qid': r['qid'], 'pred_relevant_windows': [[0, r['duration'], 1.0]],
             'pred_saliency_scores': [float(i) for i in range(_n_clips(r))]} for r in gt_rows]


def random_predictions(gt_rows: Sequence[Mapping], seed: int = 0) -> List[dict]:
    rnd = random.Random(seed)
    out = []
    for r in gt_rows:
        dur = float(r['duration'])
        windows = []
        for _ in range(rnd.randint(1, 14)):
            if r['relevant_windows'] and rnd.random() < 0.5:  # near a ground-truth window
                gs, ge = r['relevant_windows'][rnd.randrange(len(r['relevant_windows']))]
                s = max(0.0, gs + rnd.choice([-4, -2, -1, -0.5, 0, 0, 0.5, 1, 2]))
                e = min(dur, ge + rnd.choice([-4, -2, -1, -0.5, 0, 0, 0.5, 1, 2]))
                if e <= s:
                    e = s + 2.0
            else:
                s = rnd.randrange(0, int(dur * 2) - 1) / 2
                e = min(dur, s + rnd.randrange(1, 120) / 2)
            windows.append([s, e, rnd.choice([0.1, 0.25, 0.5, 0.5, 0.75, 0.9, 0.9, 1.0])])
        n = _n_clips(r) + rnd.choice([-10, -1, 0, 0, 0, 3])
        saliency = [rnd.choice([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0]) + rnd.choice([0.0, 0.0, 0.125])
                    for _ in range(max(1, n))]
        out.append({'qid': r['qid'], 'pred_relevant_windows': windows, 'pred_saliency_scores': saliency})
    return out


def zero_length(gt_rows: Sequence[Mapping], seed: int = 1) -> List[dict]:
    rows = random_predictions(gt_rows, seed)
    rnd = random.Random(seed)
    for i, (r, gt) in enumerate(zip(rows, gt_rows)):
        windows, dur = r['pred_relevant_windows'], float(gt['duration'])
        if i % 7 == 6:  # nothing but points
            r['pred_relevant_windows'] = [[w[0], w[0], w[2]] for w in windows]
            continue
        t = rnd.randrange(0, int(dur * 2)) / 2
        windows.insert(i % (len(windows) + 1), [t, t, rnd.choice([0.1, 0.5, 0.9, 1.0])])
        if i % 3 == 0:
            windows.insert(rnd.randrange(len(windows) + 1), [dur, dur, rnd.choice([0.25, 0.9, 1.0])])
        if i % 5 == 0 and gt['relevant_windows']:
            edge = rnd.choice(gt['relevant_windows'][rnd.randrange(len(gt['relevant_windows']))])
            windows.insert(rnd.randrange(len(windows) + 1), [edge, edge, rnd.choice([0.5, 1.0])])
    return rows


SETS: Dict[str, Callable[[Sequence[Mapping]], List[dict]]] = {
    'oracle': oracle,
    'shifted_2s': shifted,
    'whole_video': whole_video,
    'random': random_predictions,
    'zero_length': zero_length,
}
