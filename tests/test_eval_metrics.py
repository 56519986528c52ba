"""Metrics on hand-computed cases: the official evaluator's rules users rely on, and kept seconds."""
import numpy as np
import pytest

from swift_vora.eval import metrics as M
from swift_vora.eval.evaluate import _place_saliency


# ---- moment retrieval ---------------------------------------------------------------------------
def test_ap_perfect_and_ranked_false_positive():
    assert np.allclose(M.detection_ap([[0, 10]], [[0, 10, 1.0]]), 1.0)
    # a higher-scored miss ranks first: precision 0 then 1/2 at recall 1 -> AP 0.5 at every threshold
    assert np.allclose(M.detection_ap([[0, 10]], [[0, 10, 0.5], [20, 30, 0.9]]), 0.5)


def test_ap_duplicate_detection_is_a_false_positive():
    ap = M.detection_ap([[0, 10], [50, 60]], [[0, 10, 0.9], [0, 10, 0.8], [50, 60, 0.7]])
    # TP, FP, TP -> precision 1, 1/2, 2/3 at recall 1/2, 1/2, 1 -> interpolated 0.5*1 + 0.5*(2/3)
    assert np.allclose(ap, 0.5 + 0.5 * 2 / 3)


def test_ap_iou_thresholds():
    ap = M.detection_ap([[0, 10]], [[0, 8, 1.0]])  # IoU 0.8
    assert list(ap) == [1.0] * 7 + [0.0] * 3  # 0.5 .. 0.8 hit, 0.85 .. 0.95 miss
    assert M.IOU_THRESHOLDS == (0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)


def test_only_first_ten_windows_in_given_order_count():
    gt = {'q': [[100, 110]]}
    wrong = [[0, 2, 0.1]] * 10
    good = [[100, 110, 1.0]]
    assert M.moment_retrieval(gt, {'q': good + wrong})['full']['MR-mAP']['average'] == 100.0
    assert M.moment_retrieval(gt, {'q': wrong + good})['full']['MR-mAP']['average'] == 0.0  # 11th is cut


def test_r1_uses_the_first_window_and_the_best_overlapping_gt():
    gt = {'q': [[0, 10], [20, 30]]}
    mr = M.moment_retrieval(gt, {'q': [[21, 30, 0.1], [0, 10, 0.9]]})  # first in list, not best scored
    assert mr['full']['MR-R1']['0.7'] == 100.0 and mr['full']['MR-R1']['0.95'] == 0.0
    assert mr['full']['mIoU'] == 90.0
    assert M.moment_retrieval(gt, {'q': [[40, 50, 1.0], [0, 10, 0.5]]})['full']['MR-R1']['0.5'] == 0.0


def test_length_buckets_keep_only_windows_in_range():
    gt = {'a': [[0, 10], [20, 50]], 'b': [[0, 150]], 'c': [[5, 35]]}
    pred = {'a': [[0, 10, 1.0]], 'b': [[0, 150, 1.0]], 'c': [[5, 35, 1.0]]}
    mr = M.moment_retrieval(gt, pred)
    assert mr['short']['queries'] == 1 and mr['short']['MR-mAP']['average'] == 100.0   # length 10 is short
    assert mr['middle']['queries'] == 2  # a ([20, 50] has length 30: middle) and c (30)
    assert mr['middle']['MR-mAP']['average'] == 50.0  # a's prediction hits only the short window
    assert mr['long']['queries'] == 1 and mr['long']['MR-mAP']['average'] == 100.0    # length 150 is long
    assert mr['full']['queries'] == 3


def test_empty_bucket_is_none():
    mr = M.moment_retrieval({'a': [[0, 4]]}, {'a': [[0, 4, 1.0]]})
    assert mr['long']['MR-mAP']['average'] is None and mr['long']['queries'] == 0


def test_missing_or_empty_prediction_scores_zero():
    gt = {'a': [[0, 10]], 'b': [[0, 10]], 'c': [[0, 10]]}
    mr = M.moment_retrieval(gt, {'a': [[0, 10, 1.0]], 'b': []})
    assert mr['full']['MR-R1']['0.5'] == pytest.approx(33.33)
    assert mr['full']['MR-mAP']['average'] == pytest.approx(33.33)


# ---- highlight detection ------------------------------------------------------------------------
def test_saliency_ap_hand_computed():
    # ranking 1, 0, 1, 0: precision 1 at recall 1/2, 2/3 at recall 1
    assert M.saliency_ap([1, 0, 1, 0], [4, 3, 2, 1]) == pytest.approx((1 + 2 / 3) / 2)
    assert M.saliency_ap([1, 0, 0, 0], [1, 1, 1, 1]) == pytest.approx(0.25)  # all tied: one step
    assert M.saliency_ap([0, 0, 0], [1, 2, 3]) == 0.0
    assert M.saliency_ap([1, 1, 1], [1, 2, 3]) == 1.0


def _row(qid=1, duration=10, clip_ids=(1, 2), scores=((4, 2, 0), (1, 3, 4))):
    return {'qid': qid, 'duration': duration, 'relevant_windows': [[2, 6]],
            'relevant_clip_ids': list(clip_ids), 'saliency_scores': [list(s) for s in scores]}


def test_highlight_levels_hit1_and_padding():
    row = _row()
    hl = M.highlight_detection([row], {'1': [0, 5, 1]})  # top clip 1: annotator scores (4, 2, 0)
    assert hl['HL-min-Fair']['HL-Hit1'] == 100.0 and hl['HL-min-VeryGood']['HL-Hit1'] == 100.0
    hl = M.highlight_detection([row], {'1': [0, 1, 5]})  # top clip 2: (1, 3, 4)
    assert hl['HL-min-Good']['HL-Hit1'] == 100.0
    hl = M.highlight_detection([row], {'1': [0, 0, 0, 0, 0, 9]})  # beyond the annotated clips (5)
    assert hl['HL-min-Fair']['HL-Hit1'] == 0.0
    # too short: padded with 0 -> same as explicit zeros
    assert M.highlight_detection([row], {'1': [0, 5]}) == M.highlight_detection([row], {'1': [0, 5, 0, 0, 0]})
    assert M.highlight_detection([row], {'1': None})['HL-min-Fair'] == {'HL-mAP': 0.0, 'HL-Hit1': 0.0}


def test_qvhighlights_keys():
    out = M.qvhighlights_metrics([_row()], {'1': [[2, 6, 1.0]]}, {'1': [0, 1, 2, 0, 0]})
    for k in M.MR_KEYS + M.HL_KEYS + ('MR-full-R1@0.3', 'mIoU'):
        assert k in out, k
    assert out['MR-full-R1@0.7'] == 100.0 and out['mIoU'] == 100.0
    assert 'HL-min-Fair-mAP' not in M.qvhighlights_metrics([_row()], {'1': [[2, 6, 1.0]]})


def test_saliency_rows_placed_at_clip_offsets():
    assert _place_saliency([(0.0, [1, 2, 3], False)]) == [1.0, 2.0, 3.0]
    assert _place_saliency([(0.0, [1, 2, 3], True), (4.0, [9, 0, 7], True)]) == [1.0, 2.0, 9.0, 0.0, 7.0]


# ---- kept seconds -------------------------------------------------------------------------------
def test_video_keep_scores():
    v = M.video_keep_scores([[0, 10]], [[5, 15]])
    assert v['overlap_seconds'] == 5 and v['precision'] == 0.5 and v['recall'] == 0.5
    assert v['iou'] == pytest.approx(5 / 15) and v['f1'] == 0.5


def test_keep_conventions_for_empty_sides():
    assert M.video_keep_scores([], [])['iou'] == 1.0 and M.video_keep_scores([], [])['f1'] == 1.0
    nothing = M.video_keep_scores([[0, 10]], [])
    assert nothing['precision'] == 0.0 and nothing['recall'] == 0.0 and nothing['iou'] == 0.0
    extra = M.video_keep_scores([], [[0, 10]])
    assert extra['precision'] == 0.0 and extra['iou'] == 0.0


def test_keep_metrics_micro_and_macro():
    gt = {'a': [[0, 10]], 'b': [[0, 30]]}
    pred = {'a': [[0, 10]], 'b': [[0, 10], [5, 15]]}  # overlapping predicted windows count once
    k = M.keep_metrics(gt, pred)
    assert k['kept-precision'] == 100.0
    assert k['kept-recall'] == pytest.approx(100 * 25 / 40)
    assert k['mIoU'] == pytest.approx(100 * (1 + 0.5) / 2)
    assert k['gt-seconds'] == 40 and k['pred-seconds'] == 25
