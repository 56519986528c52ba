"""Windowing: what the model is asked about each clip must match what happens in that clip."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swift_vora import intervals
from swift_vora.data.annotations import Annotation
from swift_vora.data.windowing import MIN_CLIP_SECONDS, Sample, WindowConfig, make_windows, window_bounds


def ann(duration, windows, id='vid', query='a dog'):
    merged, merges = intervals.merge(windows)
    return Annotation(id=id, video='/videos/v.mp4', duration=duration, query=query, windows=merged, line=1,
                      source='ann.jsonl', merged_overlaps=merges)


def spans(samples):
    return [(s.start, s.end) for s in samples]


def test_events_are_rebased_to_the_window_start():
    samples = make_windows(ann(30, [[12, 15], [23.5, 26]]), WindowConfig(window=10))
    assert spans(samples) == [(0, 10), (10, 20), (20, 30)]
    assert samples[1].events == [(2.0, 5.0)]
    assert samples[2].events == [(3.5, 6.0)]
    assert samples[1].answer == '[[2.0, 5.0]]'


def test_events_crossing_window_edges_are_clipped_on_both_sides():
    samples = make_windows(ann(30, [[8, 22]]), WindowConfig(window=10))
    assert [s.events for s in samples] == [[(8.0, 10.0)], [(0.0, 10.0)], [(0.0, 2.0)]]


def test_slivers_shorter_than_min_event_are_dropped_and_counted():
    samples = make_windows(ann(20, [[9.7, 15], [19.8, 20]]), WindowConfig(window=10, min_event=0.5))
    assert samples[0].events == [] and samples[0].dropped_slivers == 1  # 0.3 s of [9.7, 15)
    assert samples[1].events == [(0.0, 5.0)] and samples[1].dropped_slivers == 1  # [19.8, 20) is 0.2 s
    assert samples[0].answer == '[]'
    kept = make_windows(ann(20, [[9.7, 15]]), WindowConfig(window=10, min_event=0))
    assert kept[0].events == [(9.7, 10.0)] and kept[0].dropped_slivers == 0


def test_an_event_the_answers_precision_empties_is_counted_with_the_slivers():
    # [3.26, 3.34] rounds to [3.3, 3.3] in the answer: dropped there, and counted, even with min_event 0
    samples = make_windows(ann(20, [[3.26, 3.34], [5, 8]]), WindowConfig(window=10, min_event=0))
    assert samples[0].events == [(5.0, 8.0)] and samples[0].dropped_slivers == 1
    assert samples[0].answer == '[[5.0, 8.0]]'


def test_windows_without_events_answer_empty_list():
    samples = make_windows(ann(40, [[1, 2]]), WindowConfig(window=10))
    assert [s.answer for s in samples] == ['[[1.0, 2.0]]', '[]', '[]', '[]']
    assert make_windows(ann(5, []), WindowConfig(window=10))[0].answer == '[]'


def test_last_partial_window_long_enough_is_kept_as_is():
    samples = make_windows(ann(25, [[21, 24.9]]), WindowConfig(window=10, min_window=2))
    assert spans(samples) == [(0, 10), (10, 20), (20, 25)]
    assert samples[-1].events == [(1.0, 4.9)] and samples[-1].duration == 5


def test_last_partial_window_too_short_becomes_a_full_window_ending_at_the_duration():
    samples = make_windows(ann(21, [[20.2, 21]]), WindowConfig(window=10, min_window=2))
    assert spans(samples) == [(0, 10), (10, 20), (11, 21)]
    assert samples[-1].events == [(9.2, 10.0)]
    assert samples[-1].id == 'vid@11.0-21.0'


def test_video_shorter_than_one_window_is_one_whole_clip():
    (sample,) = make_windows(ann(7.3, [[1, 2]]), WindowConfig(window=10))
    assert (sample.start, sample.end, sample.duration) == (0.0, 7.3, 7.3)
    assert sample.id == 'vid@0.0-7.3'


@pytest.mark.parametrize('window', [None, 0])
def test_no_window_means_the_whole_video(window):
    (sample,) = make_windows(ann(300, [[100, 200]]), WindowConfig(window=window))
    assert spans([sample]) == [(0, 300)] and sample.events == [(100.0, 200.0)]


def test_stride_gives_overlapping_windows_each_with_its_own_clip_time():
    samples = make_windows(ann(20, [[6, 8]]), WindowConfig(window=10, stride=5))
    assert spans(samples) == [(0, 10), (5, 15), (10, 20)]
    assert [s.events for s in samples] == [[(6.0, 8.0)], [(1.0, 3.0)], []]


def test_sample_fields_ids_and_rounding():
    (first, second) = make_windows(ann(120, [[1.234, 4.56]], id='abc', query='q'), WindowConfig(window=60))
    assert isinstance(first, Sample)
    assert (first.id, first.source_id, first.video, first.query) == ('abc@0.0-60.0', 'abc', '/videos/v.mp4', 'q')
    assert first.events == [(1.2, 4.6)] and first.answer == '[[1.2, 4.6]]'
    assert second.id == 'abc@60.0-120.0'
    assert all(isinstance(v, float) for v in (first.start, first.end))


@pytest.mark.parametrize('kwargs, message', [
    ({'window': -1}, 'window must be >= 0'),
    ({'window': 10, 'stride': 20}, 'gaps between windows'),
    ({'window': 10, 'stride': 0}, 'stride must be > 0'),
    ({'min_event': -0.1}, 'min_event'),
])
def test_bad_window_config_is_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        WindowConfig(**kwargs)


@settings(max_examples=300, deadline=None)
@given(duration=st.floats(0.5, 500), window=st.floats(1, 100), stride_ratio=st.floats(0.1, 1),
       min_window=st.floats(0, 5))
def test_windows_cover_the_video_and_never_pass_its_end(duration, window, stride_ratio, min_window):
    config = WindowConfig(window=window, stride=window * stride_ratio, min_window=min_window)
    bounds = window_bounds(duration, config)
    assert bounds[0][0] == 0 and bounds[-1][1] == duration
    for (s0, e0), (s1, e1) in zip(bounds, bounds[1:]):
        assert s0 < s1 <= e0 + 1e-6  # ordered, no gaps
    for start, end in bounds:
        assert 0 <= start < end <= duration
        assert end - start < window + MIN_CLIP_SECONDS  # a tail under a second joins the last clip
    if duration > window:
        assert all(end - start >= min(max(min_window, MIN_CLIP_SECONDS), window) - 1e-6 for start, end in bounds)
    # each clip is trained once, under an id of its own (ids give a clip's bounds to a tenth of a second)
    samples = make_windows(ann(duration, []), config)
    assert len({sample.id for sample in samples}) == len(samples)


@settings(max_examples=200, deadline=None)
@given(events=st.lists(st.tuples(st.integers(0, 990), st.integers(1, 60)), max_size=6),
       window=st.sampled_from([7, 10, 33]))
def test_every_event_second_lands_in_some_window(events, window):
    windows = [(s / 10, min(s / 10 + d, 100.0)) for s, d in events]
    annotation = ann(100.0, windows)
    samples = make_windows(annotation, WindowConfig(window=window, min_event=0))
    seen = []
    for sample in samples:
        seen += intervals.unbase(sample.events, sample.start)
    # Rounding to 0.1 s can move each edge by at most 0.05 s.
    assert abs(intervals.length(seen) - intervals.length(annotation.windows)) <= 0.1 * len(samples) + 1e-6
    slack = 0.1 * len(samples)
    assert intervals.overlap_seconds(seen, annotation.windows) >= intervals.length(annotation.windows) - slack


def test_a_tail_under_a_second_joins_the_last_clip_instead_of_a_near_copy_of_it():
    config = WindowConfig(window=60)
    assert window_bounds(120.04, config) == [(0.0, 60.0), (60.0, 120.04)]
    assert window_bounds(60.9, config) == [(0.0, 60.9)]
    assert window_bounds(61.0, config) == [(0.0, 60.0), (1.0, 61.0)]  # a second: the shifted clip, as before
    assert [s.id for s in make_windows(ann(60.04, [(59.0, 60.04)]), config)] == ['vid@0.0-60.0']


def test_events_the_answers_rounding_joins_are_counted():
    samples = make_windows(ann(30.0, [(2.39, 3.03), (3.05, 26.68)]), WindowConfig(window=30, min_event=0))
    assert samples[0].events == [(2.4, 26.7)] and samples[0].joined_by_rounding == 1
    assert samples[0].dropped_slivers == 0
