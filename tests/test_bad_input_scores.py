"""A score never leaves its range (issue #33, item 5; docs/eval.md, "Windows that cannot be scored").

QVHighlights predictions with a reversed window scored kept-precision 160 % and MR-mAP 100: the official IoU
formula divides by a union that may be 0 on such a window, and the NaN passed the threshold test. `eval` refuses a
reversed `pred_relevant_windows` entry as an invalid prediction line (exit 1, file, line and field named; its query
scores 0); a zero-length one is scored IoU 0 in its place, as the official evaluator scores it, and counted
(tests/test_eval_zero_length.py compares with the official formulas); the metric functions themselves give either
IoU 0 for any other caller.
"""
import json
import math

import pytest
from cli_harness import run_cli
from cli_harness import strict_json as _strict_json
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swift_vora.eval import metrics as M

QVH = {'qid': 1, 'vid': 'x', 'duration': 150, 'relevant_windows': [[0, 10]], 'relevant_clip_ids': [0, 1],
       'saliency_scores': [[1, 2, 3], [0, 1, 2]]}
PERCENT_KEYS = (*M.MR_KEYS, 'MR-full-R1@0.3', 'mIoU', *M.HL_KEYS, 'kept-precision', 'kept-recall', 'kept-F1',
                'kept-IoU', 'mean-F1')


def _percent_values(metrics: dict):
    return {k: metrics[k] for k in PERCENT_KEYS if k in metrics}


def _assert_in_range(values: dict, context):
    for key, value in values.items():
        assert value is None or 0.0 <= value <= 100.0, (key, value, context)


@pytest.mark.parametrize('window', [[10, 0, 1], [10, 0], [3, 2.5]])
def test_a_reversed_predicted_window_is_an_invalid_line(workspace, window):
    (workspace / 'q.jsonl').write_text(json.dumps(QVH) + '\n')
    (workspace / 'rev.jsonl').write_text(json.dumps({'qid': 1, 'pred_relevant_windows': [[0, 10, 0.5], window]})
                                         + '\n')
    rc, out, err = run_cli('eval', '--annotations', 'q.jsonl', '--predictions', 'rev.jsonl', '--json')
    m = _strict_json(out)
    assert rc == 1
    assert "rev.jsonl:1: field 'pred_relevant_windows'[1]: start" in err and 'a reversed window' in err
    assert m['invalid_prediction_lines'] == 1 and m['problems']['invalid_lines'][0]['line'] == 1
    # the line is not scored: its query has no prediction and scores 0, never 100
    assert m['MR-full-mAP'] == 0.0 and m['kept-precision'] == 0.0 and m['kept-IoU'] == 0.0
    _assert_in_range(_percent_values(m), window)


@pytest.mark.parametrize('window', [[5, 5, 1], [3, 3], [150, 150, 1]])
def test_a_zero_length_predicted_window_scores_iou_0_in_place(workspace, window):
    """As the official evaluator: the line's other windows keep their places and scores; the point overlaps
    nothing (counted as `zero_length_windows`), so the correct window after it still matches but ranks second."""
    (workspace / 'q.jsonl').write_text(json.dumps(QVH) + '\n')
    (workspace / 'z.jsonl').write_text(json.dumps({'qid': 1, 'pred_relevant_windows': [window, [0, 10, 0.5]]})
                                       + '\n')
    rc, out, err = run_cli('eval', '--annotations', 'q.jsonl', '--predictions', 'z.jsonl', '--json')
    m = _strict_json(out)
    assert rc == 0, err
    assert m['invalid_prediction_lines'] == 0 and m['zero_length_windows'] == 1
    assert m['problems']['zero_length_windows'] == [{'line': 1, 'id': '1', 'index': 0}]
    assert "z.jsonl:1: field 'pred_relevant_windows'[0]" in err and 'IoU 0' in err
    assert m['MR-full-R1@0.5'] == 0.0  # R1 reads the first window: the point
    assert m['MR-full-mAP'] == 50.0  # ranked first (score 1, or list order unscored): a false positive, then the hit
    _assert_in_range(_percent_values(m), window)


def test_the_issue_example_no_longer_scores_above_100(workspace):
    """The reported case: a single reversed window gave MR-mAP 100 and kept-IoU 100 at exit 0."""
    (workspace / 'q.jsonl').write_text(json.dumps(QVH) + '\n')
    (workspace / 'rev.jsonl').write_text(json.dumps({'qid': 1, 'pred_relevant_windows': [[10, 0, 1]]}) + '\n')
    rc, out, _ = run_cli('eval', '--annotations', 'q.jsonl', '--predictions', 'rev.jsonl', '--json')
    m = _strict_json(out)
    assert rc == 1 and m['MR-full-mAP'] == 0.0 and m['kept-IoU'] == 0.0


@pytest.mark.parametrize('row, field', [
    ({'qid': 1, 'pred_relevant_windows': [[0, 1, float('nan')]]}, "'pred_relevant_windows'[0]"),
    ({'qid': 1, 'pred_relevant_windows': [[0, 1, 2, 3]]}, "'pred_relevant_windows'[0]"),
    ({'qid': 1, 'pred_relevant_windows': [[0, 1]], 'clip_start': float('inf')}, "'clip_start'"),
    ({'qid': 1, 'pred_relevant_windows': [[0, 1]], 'video_end': 'x'}, "'video_end'"),
    ({'qid': 1, 'pred_saliency_scores': [1, float('inf')]}, "'pred_saliency_scores'"),
])
def test_every_invalid_prediction_field_is_named(workspace, row, field):
    (workspace / 'q.jsonl').write_text(json.dumps(QVH) + '\n')
    (workspace / 'bad.jsonl').write_text(json.dumps(row) + '\n')  # NaN / Infinity tokens on purpose
    rc, _, err = run_cli('eval', '--annotations', 'q.jsonl', '--predictions', 'bad.jsonl')
    assert rc == 1 and f'bad.jsonl:1: field {field}' in err, err


def test_the_repaired_model_text_still_scores(workspace):
    """Raw model text is repaired, not refused: a reversed pair in `response` is swapped (and counted)."""
    (workspace / 'q.jsonl').write_text(json.dumps(QVH) + '\n')
    (workspace / 'r.jsonl').write_text(json.dumps({'qid': 1, 'response': '[[10, 0]]'}) + '\n')
    rc, out, _ = run_cli('eval', '--annotations', 'q.jsonl', '--predictions', 'r.jsonl', '--json')
    m = _strict_json(out)
    assert rc == 0 and m['repairs']['swapped'] == 1 and m['MR-full-mAP'] == 100.0


# ---- the property: any windows, any metric ---------------------------------------------------------------------
TIME = st.floats(min_value=-50, max_value=200, allow_nan=False, allow_infinity=False)
WINDOW = st.tuples(TIME, TIME, st.floats(min_value=-5, max_value=5, allow_nan=False))
GT_WINDOW = st.tuples(st.floats(0, 140), st.floats(0.1, 10)).map(lambda w: (w[0], min(150.0, w[0] + w[1])))
PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@PROPERTY
@given(gt=st.lists(st.lists(GT_WINDOW, max_size=4), min_size=1, max_size=4),
       pred=st.lists(st.lists(WINDOW, max_size=6), min_size=1, max_size=4),
       saliency=st.lists(st.floats(-3, 3), max_size=90))
def test_property_every_metric_stays_in_its_range(gt, pred, saliency):
    """Whatever windows reach the metric functions (reversed, zero-length, negative, past the end, unscored
    duplicates), every percentage is in [0, 100] or None, never NaN."""
    rows = [{'qid': i, 'duration': 150, 'relevant_windows': [list(w) for w in ws], 'relevant_clip_ids': [0],
             'saliency_scores': [[1, 2, 3]]} for i, ws in enumerate(gt)]
    windows = {str(i): list(pred[i % len(pred)]) for i in range(len(gt))}
    out = M.qvhighlights_metrics(rows, windows, {str(i): saliency for i in range(len(gt))})
    keep = M.keep_metrics({str(i): ws for i, ws in enumerate(gt)},
                          {k: [w[:2] for w in v] for k, v in windows.items()}, unanswered=['0'])
    values = {**_percent_values(out), **_percent_values(keep)}
    for key, value in values.items():
        assert value is None or (math.isfinite(value) and 0.0 <= value <= 100.0), (key, value, gt, pred)
    for per in keep['per_video'].values():
        for key in ('precision', 'recall', 'f1', 'iou'):
            assert 0.0 <= per[key] <= 1.0, (key, per)
    for i, ws in enumerate(gt):
        assert 0.0 <= M.top1_iou(ws, windows[str(i)]) <= 1.0


@PROPERTY
@given(windows=st.lists(st.lists(st.one_of(TIME, st.just(float('nan')), st.just(float('inf'))), min_size=0,
                                 max_size=4), max_size=4))
def test_property_eval_scores_any_prediction_line_in_range(workspace, windows):
    """The command end to end: any `pred_relevant_windows` is scored within [0, 100] or refused as invalid (a
    reversed window or a non-finite number; a zero-length window is scored)."""
    (workspace / 'q.jsonl').write_text(json.dumps(QVH) + '\n')
    (workspace / 'any.jsonl').write_text(json.dumps({'qid': 1, 'pred_relevant_windows': windows}) + '\n')
    rc, out, err = run_cli('eval', '--annotations', 'q.jsonl', '--predictions', 'any.jsonl', '--json')
    m = _strict_json(out)
    assert rc in (0, 1), err
    assert (rc == 1) == (m['invalid_prediction_lines'] == 1)
    _assert_in_range(_percent_values(m), windows)
