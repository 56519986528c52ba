from swift_vora import intervals as iv


def test_merge_reports_how_many_overlaps_were_merged():
    merged, n = iv.merge([(5, 8), (0, 2), (1, 3), (7, 9)])
    assert merged == [(0.0, 3.0), (5.0, 9.0)] and n == 2


def test_window_events_clip_then_rebase_and_drop_slivers():
    events = [(2, 5), (9, 14), (19.8, 25)]
    assert iv.window_events(events, 10, 20) == [(0.0, 4.0), (9.8, 10.0)]
    assert iv.window_events(events, 10, 20, min_length=0.5) == [(0.0, 4.0)]
    assert iv.window_events(events, 30, 40) == []


def test_answer_text_is_one_decimal_sorted_and_empty_list_when_none():
    assert iv.format_answer([(7.04, 9.46), (1.25, 4)]) == '[[1.2, 4.0], [7.0, 9.5]]'
    assert iv.format_answer([]) == '[]'
    assert iv.format_answer([(1.01, 1.04)]) == '[]'  # empty after rounding


def test_iou_and_overlap():
    assert iv.iou((0, 10), (5, 15)) == 5 / 15
    assert iv.iou((0, 1), (2, 3)) == 0.0
    assert iv.overlap_seconds([(0, 10)], [(5, 15), (-3, 1)]) == 6.0
