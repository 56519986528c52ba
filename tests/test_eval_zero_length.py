"""`eval` equals the official Moment-DETR evaluator where a predicted window has zero length (`start == end`, e.g. a
window clipped at the video's end): IoU 0 in its place in the list, the line's other windows scored as written.

The official figures of such a set are pinned in tests/fixtures/eval/expected_official.json (`zero_length`, run
through the official code by benchmarks/official_eval_compare.py; tests/test_eval_official.py checks them). Here the
official moment-retrieval formulas (standalone_eval/eval.py and utils.py of jayleicn/moment_detr, re-derived below
without the official code) score generated sets with a zero-length window at every list position -- first, inside,
last, past the 10 windows mAP reads -- at the video's end and on ground-truth edges, and `swift-vora eval` must give
the same figures through the command line.
"""
import json
import os
import random

import numpy as np
import pytest
from cli_harness import run_cli, strict_json

HERE = os.path.dirname(__file__)
ANNOTATIONS = os.path.join(HERE, 'fixtures', 'qvhighlights', 'val.jsonl')
THRESHOLDS = [float(f'{t:.2f}') for t in np.linspace(0.5, 0.95, 10)]
BUCKETS = {'short': (0, 10), 'middle': (10, 30), 'long': (30, 150), 'full': (0, 150)}


# ---- the official formulas, re-derived -------------------------------------------------------------------------
def _cross_iou(spans1, spans2):
    """utils.compute_temporal_iou_batch_cross: true union, no guard (0/0 is NaN there)."""
    areas1, areas2 = spans1[:, 1] - spans1[:, 0], spans2[:, 1] - spans2[:, 0]
    left = np.maximum(spans1[:, None, 0], spans2[None, :, 0])
    right = np.minimum(spans1[:, None, 1], spans2[None, :, 1])
    inter = np.clip(right - left, 0, None)
    return inter / (areas1[:, None] + areas2[None, :] - inter)


def _paired_iou(pred, gt):
    """utils.compute_temporal_iou_batch_paired: the span as union, 0 where it is 0."""
    inter = np.maximum(0, np.minimum(pred[:, 1], gt[:, 1]) - np.maximum(pred[:, 0], gt[:, 0]))
    union = np.maximum(pred[:, 1], gt[:, 1]) - np.minimum(pred[:, 0], gt[:, 0])
    return np.divide(inter, union, out=np.zeros_like(inter), where=union != 0)


def _voc_ap(precision, recall):
    mprec = np.hstack([[0], precision, [0]])
    mrec = np.hstack([[0], recall, [1]])
    for i in range(len(mprec) - 1)[::-1]:
        mprec[i] = max(mprec[i], mprec[i + 1])
    idx = np.where(mrec[1::] != mrec[0:-1])[0] + 1
    return np.sum((mrec[idx] - mrec[idx - 1]) * mprec[idx])


def _detection_ap(gts, preds):
    """utils.compute_average_precision_detection for one query: preds (start, end, score), sorted by score
    (stable), each matched to the unmatched ground truth of highest IoU at each threshold."""
    ap = np.zeros(len(THRESHOLDS))
    if not preds:
        return ap
    preds = sorted(preds, key=lambda p: -p[2])
    lock = np.ones((len(THRESHOLDS), len(gts))) * -1
    tp = np.zeros((len(THRESHOLDS), len(preds)))
    fp = np.zeros((len(THRESHOLDS), len(preds)))
    gt_arr = np.array(gts, dtype=float)
    for idx, p in enumerate(preds):
        ious = _cross_iou(np.array([[p[0], p[1]]], dtype=float), gt_arr).reshape(-1)
        order = ious.argsort()[::-1]
        for t, thr in enumerate(THRESHOLDS):
            for j in order:
                if ious[j] < thr:
                    fp[t, idx] = 1
                    break
                if lock[t, j] >= 0:
                    continue
                tp[t, idx] = 1
                lock[t, j] = idx
                break
            if fp[t, idx] == 0 and tp[t, idx] == 0:
                fp[t, idx] = 1
    tp_c, fp_c = np.cumsum(tp, axis=1), np.cumsum(fp, axis=1)
    recall, precision = tp_c / float(len(gts)), tp_c / (tp_c + fp_c)
    for t in range(len(THRESHOLDS)):
        ap[t] = _voc_ap(precision[t], recall[t])
    return ap


def official_moment_retrieval(gt_rows, submission):
    """eval.eval_moment_retrieval: {bucket: {'MR-mAP': {thr: .., 'average': ..}, 'MR-R1': {thr: ..}}}."""
    preds = {d['qid']: d['pred_relevant_windows'] for d in submission}
    out = {}
    for name, (lo, hi) in BUCKETS.items():
        gts = {}
        for d in gt_rows:
            windows = d['relevant_windows'] if name == 'full' else [w for w in d['relevant_windows']
                                                                   if lo < w[1] - w[0] <= hi]
            if windows:
                gts[d['qid']] = windows
        aps = np.array([_detection_ap(gts[q], preds[q][:10]) for q in gts]).mean(0)
        mr_map = {str(t): float(f'{100 * v:.2f}') for t, v in zip(THRESHOLDS, aps)}
        mr_map['average'] = float(f'{100 * np.mean(aps):.2f}')
        firsts, best = [], []
        for q, windows in gts.items():
            first = preds[q][0][:2]
            ious = _cross_iou(np.array([first], dtype=float), np.array(windows, dtype=float))[0]
            firsts.append(first)
            best.append(windows[int(np.argmax(ious))])
        iou = _paired_iou(np.array(firsts, dtype=float), np.array(best, dtype=float))
        out[name] = {'MR-mAP': mr_map, 'MR-R1': {str(t): float(f'{np.mean(iou >= t) * 100:.2f}') for t in THRESHOLDS}}
    return out


# ---- generated predictions ---------------------------------------------------------------------------------------
def _windows(rnd, row):
    dur = float(row['duration'])
    out = []
    for _ in range(rnd.randint(1, 13)):
        if rnd.random() < 0.5:  # near a ground-truth window
            gs, ge = row['relevant_windows'][rnd.randrange(len(row['relevant_windows']))]
            s = max(0.0, gs + rnd.choice([-2, -1, 0, 0, 1]))
            e = min(dur, max(s + 0.5, ge + rnd.choice([-2, 0, 0, 1, 2])))
        else:
            s = rnd.randrange(0, int(dur * 2) - 1) / 2
            e = min(dur, s + rnd.randrange(1, 80) / 2)
        out.append([s, e, rnd.choice([0.1, 0.5, 0.5, 0.9, 1.0])])
    return out


def generated_set(gt_rows, seed: int):
    """Every query gets zero-length windows: one at list position `(i + seed) % (n + 1)` (so over the queries every
    position 0..13 is taken, the first, the last and those past the 10th among them), one at the video's end, and on
    every other query one on a ground-truth window's start or end."""
    rnd = random.Random(seed)
    rows = []
    for i, row in enumerate(gt_rows):
        windows = _windows(rnd, row)
        t = rnd.randrange(0, int(float(row['duration']) * 2)) / 2
        windows.insert((i + seed) % (len(windows) + 1), [t, t, rnd.choice([0.1, 0.5, 1.0])])
        end = float(row['duration'])
        windows.insert(rnd.randrange(len(windows) + 1), [end, end, rnd.choice([0.1, 0.9, 1.0])])
        if i % 2:
            edge = rnd.choice(row['relevant_windows'][rnd.randrange(len(row['relevant_windows']))])
            windows.insert(rnd.randrange(len(windows) + 1), [edge, edge, rnd.choice([0.5, 1.0])])
        rows.append({'qid': row['qid'], 'pred_relevant_windows': windows})
    return rows


@pytest.fixture(scope='module')
def gt_rows():
    with open(ANNOTATIONS) as f:
        return [json.loads(line) for line in f if line.strip()][:240]


@pytest.mark.parametrize('seed', [0, 1, 2])
def test_eval_equals_the_official_formulas_with_zero_length_windows(workspace, gt_rows, seed):
    submission = generated_set(gt_rows, seed)
    positions = {i for r in submission for i, w in enumerate(r['pred_relevant_windows']) if w[0] == w[1]}
    assert set(range(14)) <= positions  # first, inside, and past the 10 windows mAP reads, in some list
    assert any(r['pred_relevant_windows'][-1][0] == r['pred_relevant_windows'][-1][1] for r in submission)  # last
    (workspace / 'gt.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in gt_rows))
    (workspace / 'pred.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in submission))
    rc, out, err = run_cli('eval', '--annotations', 'gt.jsonl', '--predictions', 'pred.jsonl', '--json')
    ours = strict_json(out)
    assert rc == 0, err
    assert ours['invalid_prediction_lines'] == 0
    assert ours['zero_length_windows'] == sum(1 for r in submission for w in r['pred_relevant_windows']
                                              if w[0] == w[1])
    official = official_moment_retrieval(gt_rows, submission)
    diffs = {}
    for bucket, figures in official.items():
        for kind in ('MR-mAP', 'MR-R1'):
            for t, v in figures[kind].items():
                o = ours['detail'][bucket][kind][t]
                if abs(o - v) > 0.01 + 1e-9:
                    diffs[f'{bucket}/{kind}/{t}'] = (v, o)
    assert not diffs, diffs
    assert ours['MR-full-R1@0.5'] == pytest.approx(official['full']['MR-R1']['0.5'], abs=0.01)
    assert ours['MR-full-mAP'] == pytest.approx(official['full']['MR-mAP']['average'], abs=0.01)


def test_the_rederived_formulas_score_a_point_iou_0():
    """The formulas above are the official ones where it matters here: a point inside, at the edge of, or outside a
    ground-truth window has IoU 0 in both IoU functions (no NaN: the ground truth has a length)."""
    gt = np.array([[10.0, 20.0]])
    for t in (10.0, 15.0, 20.0, 150.0):
        assert _cross_iou(np.array([[t, t]]), gt)[0, 0] == 0.0
        assert _paired_iou(np.array([[t, t]]), gt)[0] == 0.0
    assert _detection_ap([[10, 20]], [[15, 15, 1.0], [10, 20, 0.5]])[0] == pytest.approx(0.5)
