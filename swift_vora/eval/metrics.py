"""Metrics: QVHighlights moment retrieval / highlight detection, and kept-seconds metrics.

QVHighlights numbers follow the official evaluator (`standalone_eval/eval.py` of jayleicn/moment_detr),
re-implemented here (not copied) and checked against it to 0.01 by
`benchmarks/official_eval_compare.py` and `tests/test_eval_official.py`:

- R1@t: the first predicted window is compared with the ground-truth window it overlaps most (first
  such window on ties); hit when IoU >= t. IoU uses the span `max(end) - min(start)` as union, which
  equals the true union whenever the two windows overlap.
- mAP: per query, the first `max_pred_windows` (10) predicted windows in the order given are sorted by
  score (stable), greedily matched to ground-truth windows at each IoU threshold 0.5:0.05:0.95 (a
  window matches the unmatched ground-truth window of highest IoU; ties follow numpy's argsort, as
  upstream), VOC-interpolated AP; averaged over queries, then over thresholds.
- Length buckets short (0, 10], middle (10, 30], long (30, 150] seconds: per query only the
  ground-truth windows whose length falls in the bucket are kept; queries with none are left out;
  predictions are not filtered. 'full' uses every window.
- Highlight mAP / HIT@1 at Fair (>= 2), Good (>= 3), VeryGood (>= 4): per annotator (3), clip labels
  are `score >= min`; AP is the mean interpolated precision at each distinct recall level of the
  scores' ranking (scores tied with each other form one step); predictions shorter than the video are
  padded with 0, longer ones cut; a query where one annotator marked no (all) clip positive scores 0
  (1) for that annotator. HIT@1: the top-scoring clip (first on ties) is positive for at least one
  annotator.

Where we differ, on purpose (upstream cannot evaluate these inputs: it asserts that every query has a
prediction and crashes on an empty window list): a query without a prediction, or whose prediction is
empty (a parse failure), scores 0 for R1 and AP and counts as a miss; a query without saliency scores
scores 0 for HL-mAP and HIT@1. Buckets without a query give `None`. A zero-length or reversed window
(`end <= start`) has IoU 0 with every window and keeps no second, so every score stays in [0, 100]
(upstream divides by a union that may be 0 for a reversed window, and the NaN passed its threshold test: MR-mAP
100 for `[[10, 0]]`). For a zero-length window against ground truth of positive length this is upstream's own
figure, 0, and `swift-vora eval` scores it so; it refuses a reversed window in `pred_relevant_windows` as an invalid
prediction line before scoring (docs/eval.md); the rule here keeps the library functions bounded for any caller.

All percentages are rounded to two decimals, as upstream (`float(f"{100 * v:.2f}")`).
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Mapping, Optional, Sequence

import numpy as np

from ..intervals import length as total_length
from ..intervals import merge, overlap_seconds

IOU_THRESHOLDS = tuple(float(f'{t:.2f}') for t in np.linspace(0.5, 0.95, 10))
R1_THRESHOLDS = (0.3,) + IOU_THRESHOLDS
LENGTH_BUCKETS = {'short': (0, 10), 'middle': (10, 30), 'long': (30, 150), 'full': (0, 150)}
SALIENCY_LEVELS = {'Fair': 2, 'Good': 3, 'VeryGood': 4}
CLIP_SECONDS = 2.0
MAX_PRED_WINDOWS = 10

# The official evaluator's brief key names (docs/contract.md), in its order.
MR_KEYS = ('MR-full-R1@0.5', 'MR-full-R1@0.7', 'MR-full-mAP', 'MR-full-mAP@0.5', 'MR-full-mAP@0.75',
           'MR-short-mAP', 'MR-middle-mAP', 'MR-long-mAP')
HL_KEYS = ('HL-min-Fair-mAP', 'HL-min-Fair-Hit1', 'HL-min-Good-mAP', 'HL-min-Good-Hit1',
           'HL-min-VeryGood-mAP', 'HL-min-VeryGood-Hit1')

Window = Sequence[float]
ScoredWindow = Sequence[float]  # (start, end, score)


def pct(value: Optional[float]) -> Optional[float]:
    """Fraction -> percent with two decimals, the official rounding."""
    return None if value is None else float(f'{100 * value:.2f}')


# ---- moment retrieval ---------------------------------------------------------------------------
def _cross_iou(windows: np.ndarray, gts: np.ndarray) -> np.ndarray:
    """(P, G) IoU of each window with each ground-truth window (true union), upstream's formula.

    A pair without a positive union (a zero-length or reversed window) has IoU 0: upstream's 0/0 is NaN, and a
    NaN fails the `iou < threshold` test that ends the match search, so it matched at every threshold (MR-mAP 100
    for `[[10, 0]]`)."""
    inter = np.clip(np.minimum(windows[:, None, 1], gts[None, :, 1]) - np.maximum(windows[:, None, 0], gts[None, :, 0]),
                    0, None)
    union = (windows[:, 1] - windows[:, 0])[:, None] + (gts[:, 1] - gts[:, 0])[None, :] - inter
    proper = (windows[:, 1] > windows[:, 0])[:, None] & (gts[:, 1] > gts[:, 0])[None, :] & (union > 0)
    with np.errstate(divide='ignore', invalid='ignore'):
        return np.where(proper, inter / np.where(proper, union, 1.0), 0.0)


def detection_ap(gt_windows: Sequence[Window], pred_windows: Sequence[ScoredWindow],
                 thresholds: Sequence[float] = IOU_THRESHOLDS) -> np.ndarray:
    """Average precision of one query's scored windows at each IoU threshold (VOC interpolation).

    Predictions are sorted by score (stable); at each threshold each prediction, best first, takes the
    still-unmatched ground-truth window of highest IoU (numpy argsort order on ties), else is a false
    positive."""
    n_thr = len(thresholds)
    preds = sorted(pred_windows, key=lambda w: -float(w[2]))  # stable, like list.sort upstream
    if not preds or not gt_windows:
        return np.zeros(n_thr)
    gts = np.asarray([[float(w[0]), float(w[1])] for w in gt_windows], dtype=float)
    pw = np.asarray([[float(w[0]), float(w[1])] for w in preds], dtype=float)
    ious_all = _cross_iou(pw, gts)
    orders = ious_all.argsort(axis=1)[:, ::-1].tolist()
    ious_all = ious_all.tolist()
    n_gt, n_pred = len(gts), len(preds)
    tp = [[0.0] * n_pred for _ in range(n_thr)]
    locked = [[False] * n_gt for _ in range(n_thr)]
    for idx in range(n_pred):
        ious, order = ious_all[idx], orders[idx]
        for t, thr in enumerate(thresholds):
            lock = locked[t]
            for j in order:
                if ious[j] < thr:
                    break
                if lock[j]:
                    continue
                tp[t][idx] = 1.0
                lock[j] = True
                break
    tp_a = np.asarray(tp)
    tp_cum = np.cumsum(tp_a, axis=1)
    fp_cum = np.cumsum(1.0 - tp_a, axis=1)
    recall = tp_cum / float(n_gt)
    precision = tp_cum / (tp_cum + fp_cum)
    # VOC interpolation, all thresholds at once: pad, running max from the right, sum over recall steps.
    zeros, ones = np.zeros((n_thr, 1)), np.ones((n_thr, 1))
    mprec = np.maximum.accumulate(np.hstack([zeros, precision, zeros])[:, ::-1], axis=1)[:, ::-1]
    mrec = np.hstack([zeros, recall, ones])
    # recall steps: where recall does not change the difference is 0, so summing every step is the same
    out = np.sum(np.diff(mrec, axis=1) * mprec[:, 1:], axis=1)
    return out


def top1_iou(gt_windows: Sequence[Window], pred_windows: Sequence[ScoredWindow]) -> float:
    """IoU of the first predicted window with the ground-truth window it overlaps most (R1's rule)."""
    if not pred_windows or not gt_windows:
        return 0.0
    s, e = float(pred_windows[0][0]), float(pred_windows[0][1])
    if not e > s:  # a zero-length or reversed window overlaps nothing
        return 0.0
    gts = np.asarray([[float(w[0]), float(w[1])] for w in gt_windows], dtype=float)
    best = gts[int(np.argmax(_cross_iou(np.asarray([[s, e]]), gts)[0]))]
    inter = max(0.0, min(e, best[1]) - max(s, best[0]))
    span = max(e, best[1]) - min(s, best[0])
    return inter / span if span != 0 else 0.0


def _in_bucket(window: Window, lo: float, hi: float) -> bool:
    return lo < float(window[1]) - float(window[0]) <= hi


def moment_retrieval(gt: Mapping[str, Sequence[Window]], pred: Mapping[str, Sequence[ScoredWindow]],
                     max_pred_windows: int = MAX_PRED_WINDOWS) -> Dict[str, dict]:
    """Per bucket: {'MR-mAP': {'0.5': .., ..., 'average': ..}, 'MR-R1': {'0.3': .., '0.5': ..}, 'mIoU',
    'queries'} in percent. `pred[qid]` lists (start, end, score) in the submitted order; a missing or
    empty entry scores 0."""
    out = {}
    for name, (lo, hi) in LENGTH_BUCKETS.items():
        aps, ious = [], []
        for qid, windows in gt.items():
            if name != 'full':
                windows = [w for w in windows if _in_bucket(w, lo, hi)]
                if not windows:
                    continue
            p = list(pred.get(qid) or [])
            aps.append(detection_ap(windows, p[:max_pred_windows] if max_pred_windows else p))
            ious.append(top1_iou(windows, p))
        if not aps:
            out[name] = {'MR-mAP': {**{str(t): None for t in IOU_THRESHOLDS}, 'average': None},
                         'MR-R1': {str(t): None for t in R1_THRESHOLDS}, 'mIoU': None, 'queries': 0}
            continue
        ap_thr = np.asarray(aps).mean(0)
        ious_a = np.asarray(ious)
        mr_map = {str(t): pct(v) for t, v in zip(IOU_THRESHOLDS, ap_thr)}
        mr_map['average'] = pct(np.mean(ap_thr))
        out[name] = {'MR-mAP': mr_map,
                     'MR-R1': {str(t): pct(np.mean(ious_a >= t)) for t in R1_THRESHOLDS},
                     'mIoU': pct(float(np.mean(ious_a))), 'queries': len(aps)}
    return out


# ---- highlight detection ------------------------------------------------------------------------
def saliency_ap(y_true: np.ndarray, y_score: np.ndarray) -> float:
    """Upstream `get_ap(interpolate=True)`: mean interpolated precision at each recall step."""
    return _saliency_aps(np.asarray(y_true, dtype=float)[:, None], np.asarray(y_score, dtype=float))[0]


def _saliency_aps(labels: np.ndarray, y_score: np.ndarray) -> List[float]:
    """`saliency_ap` for each column of `labels` (n, k) against one score vector (sorted once)."""
    n = len(y_score)
    order = np.argsort(y_score, kind='mergesort')[::-1]
    ys = y_score[order]
    cut = np.append(np.flatnonzero(np.diff(ys)), n - 1)  # last index of each distinct score (sklearn's thresholds)
    tps_all = np.cumsum(labels[order], axis=0)[cut]
    out = []
    for c in range(labels.shape[1]):
        positives = tps_all[-1, c]
        if positives == 0 or positives == n:  # one label only: upstream returns 0 or 1
            out.append(0.0 if positives == 0 else 1.0)
            continue
        tps = tps_all[:, c]
        fps = 1 + cut - tps
        precision = np.maximum.accumulate(np.append((tps / (tps + fps))[::-1], 1.0))
        recall = np.append((tps / positives)[::-1], 0.0).astype(np.float32)
        out.append(float(np.mean(precision[np.flatnonzero(np.diff(recall))])))
    return out


def gt_saliency(row: Mapping) -> np.ndarray:
    """(#2-s clips, 3) annotator scores 0-4 for a QVHighlights row; unannotated clips are 0. A video shorter than
    one clip has one, as the annotation check counts them (the official evaluator's array is empty there, and its
    clip 0 fails to index)."""
    n = max(int(float(row['duration']) / CLIP_SECONDS), 1)
    full = np.zeros((n, 3))
    ids = np.asarray(row.get('relevant_clip_ids') or [], dtype=int)
    scores = np.asarray(row.get('saliency_scores') or [], dtype=float).reshape(-1, 3)
    if len(ids):
        full[ids] = scores
    return full


def id_text(value) -> str:
    """The text an id is compared by: `2579`, `2579.0` and `"2579"` are one id (the official evaluator's dict
    lookups treat 2579 and 2579.0 alike), in the annotations as in the predictions."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def highlight_detection(gt_rows: Sequence[Mapping], saliency: Mapping[str, Optional[Sequence[float]]]
                        ) -> Dict[str, dict]:
    """{'HL-min-Fair': {'HL-mAP': .., 'HL-Hit1': ..}, ...} in percent; a query with no scores gets 0."""
    gts = {id_text(r['qid']): gt_saliency(r) for r in gt_rows}
    levels = list(SALIENCY_LEVELS.items())
    ap = np.zeros((len(levels), len(gts), 3))
    hit = np.zeros((len(levels), len(gts), 3))
    for i, (qid, full) in enumerate(gts.items()):
        scores = saliency.get(qid)
        if scores is None or len(scores) == 0 or len(full) == 0:
            continue
        pred = np.asarray(scores, dtype=float)
        top = int(np.argmax(pred))
        if len(pred) > len(full):
            pred = pred[:len(full)]
        elif len(pred) < len(full):
            pred = np.append(pred, np.zeros(len(full) - len(pred)))
        labels = np.hstack([(full >= level).astype(float) for _, level in levels])  # (n, 3 * levels)
        aps = _saliency_aps(labels, pred)
        for li in range(len(levels)):
            ap[li, i] = aps[3 * li:3 * li + 3]
            if top < len(full):
                hit[li, i] = labels[top, 3 * li:3 * li + 3]
    out = {}
    for li, (name, _) in enumerate(levels):
        out[f'HL-min-{name}'] = {'HL-mAP': pct(np.mean(ap[li])) if len(gts) else None,
                                 'HL-Hit1': pct(np.mean(np.max(hit[li], 1))) if len(gts) else None}
    return out


def qvhighlights_metrics(gt_rows: Sequence[Mapping], windows: Mapping[str, Sequence[ScoredWindow]],
                         saliency: Optional[Mapping[str, Optional[Sequence[float]]]] = None) -> dict:
    """Official brief keys (percent) + `MR-full-R1@0.3` + `mIoU` (top-1, percent) + `detail`.

    `gt_rows`: QVHighlights annotation rows (qid, duration, relevant_windows, relevant_clip_ids,
    saliency_scores). `windows[str(qid)]`: (start, end, score) in submitted order. `saliency`: per
    query scores, one per 2-s clip; highlight keys appear only when it is given."""
    gt = {id_text(r['qid']): r['relevant_windows'] for r in gt_rows}
    mr = moment_retrieval(gt, windows)
    out = {
        'MR-full-R1@0.5': mr['full']['MR-R1']['0.5'],
        'MR-full-R1@0.7': mr['full']['MR-R1']['0.7'],
        'MR-full-mAP': mr['full']['MR-mAP']['average'],
        'MR-full-mAP@0.5': mr['full']['MR-mAP']['0.5'],
        'MR-full-mAP@0.75': mr['full']['MR-mAP']['0.75'],
        'MR-short-mAP': mr['short']['MR-mAP']['average'],
        'MR-middle-mAP': mr['middle']['MR-mAP']['average'],
        'MR-long-mAP': mr['long']['MR-mAP']['average'],
        'MR-full-R1@0.3': mr['full']['MR-R1']['0.3'],
        'mIoU': mr['full']['mIoU'],
    }
    detail = dict(mr)
    if saliency is not None:
        hl = highlight_detection(gt_rows, saliency)
        for name, v in hl.items():
            out[f'{name}-mAP'] = v['HL-mAP']
            out[f'{name}-Hit1'] = v['HL-Hit1']
        detail.update(hl)
    out['detail'] = detail
    return out


# ---- kept seconds ("keep these intervals") --------------------------------------------------------
def video_keep_scores(gt: Iterable[Window], pred: Iterable[Window]) -> dict:
    """Seconds and ratios for one video. Conventions when a side is empty: precision of an empty
    prediction, recall of an empty ground truth and IoU/F1 of two empty sets are 1 when both sides are
    empty and 0 otherwise. A zero-length or reversed window keeps no second (it would count negative seconds and
    push precision past 100 %)."""
    g, _ = merge(w for w in ((float(w[0]), float(w[1])) for w in gt) if w[1] > w[0])
    p, _ = merge(w for w in ((float(w[0]), float(w[1])) for w in pred) if w[1] > w[0])
    g_len, p_len = total_length(g), total_length(p)
    inter = overlap_seconds(g, p)
    union = g_len + p_len - inter
    both_empty = g_len == 0 and p_len == 0
    precision = inter / p_len if p_len > 0 else float(both_empty)
    recall = inter / g_len if g_len > 0 else float(both_empty)
    f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0
    iou = inter / union if union > 0 else float(both_empty)
    return {'gt_seconds': g_len, 'pred_seconds': p_len, 'overlap_seconds': inter,
            'precision': precision, 'recall': recall, 'f1': f1, 'iou': iou}


def keep_metrics(gt: Mapping[str, Sequence[Window]], pred: Mapping[str, Sequence[Window]],
                 unanswered: Sequence[str] = ()) -> dict:
    """Kept-seconds metrics over every ground-truth video (a missing prediction keeps nothing).

    `kept-precision`/`kept-recall`/`kept-F1`/`kept-IoU`: seconds pooled over all videos (micro);
    `mIoU`, `mean-F1`: per-video IoU / F1 averaged (macro). Percent, two decimals.
    `unanswered`: videos with no usable answer (missing, or every response a parse failure). They score 0 on the
    per-video ratios even when their ground truth is empty -- "both sides empty scores 1" is for a model that
    answered `[]`, not for one whose answer could not be read."""
    per = {vid: video_keep_scores(windows, pred.get(vid) or []) for vid, windows in gt.items()}
    for vid in set(unanswered) & set(per):
        per[vid].update(precision=0.0, recall=0.0, f1=0.0, iou=0.0)
    g = sum(v['gt_seconds'] for v in per.values())
    p = sum(v['pred_seconds'] for v in per.values())
    inter = sum(v['overlap_seconds'] for v in per.values())
    n = len(per)
    # Nothing to keep and nothing kept is right only for the videos whose answer was read: a parse failure
    # is never a correct empty answer, so the vacuous score is the share of videos that were answered.
    answered = (n - len(set(unanswered) & set(per))) / n if n else 0.0
    precision = inter / p if p > 0 else (answered if g == 0 else 0.0)
    recall = inter / g if g > 0 else (answered if p == 0 else 0.0)
    f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0
    union = g + p - inter
    return {
        'kept-precision': pct(precision), 'kept-recall': pct(recall), 'kept-F1': pct(f1),
        'kept-IoU': pct(inter / union if union > 0 else answered),
        'mIoU': pct(sum(v['iou'] for v in per.values()) / n) if n else None,
        'mean-F1': pct(sum(v['f1'] for v in per.values()) / n) if n else None,
        'gt-seconds': round(g, 3), 'pred-seconds': round(p, 3), 'overlap-seconds': round(inter, 3),
        'per_video': per,
    }
