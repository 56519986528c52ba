"""parse_answer: every format video LLMs write, the repairs and their counts, junk, fuzzing, speed."""
import json
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swift_vora import answer_parser
from swift_vora.answer_parser import ParseResult, parse_answer
from swift_vora.intervals import clip, format_answer, merge


def windows(text, duration=None):
    res = parse_answer(text, duration)
    assert res.ok, (text, res)
    return [list(w) for w in res.windows]


# ---- formats ------------------------------------------------------------------------------------
@pytest.mark.parametrize('text, expected', [
    ('[[12.0, 20.5], [30.0, 35.5]]', [[12.0, 20.5], [30.0, 35.5]]),          # canonical
    ('[]', []),                                                               # nothing to keep
    ('  [[1.5, 4.0]]\n', [[1.5, 4.0]]),
    ('```json\n[[1.5, 4.0], [7.0, 9.5]]\n```', [[1.5, 4.0], [7.0, 9.5]]),     # fenced
    ('Sure! Here are the moments:\n```\n[[1.5, 4.0]]\n```\nHope this helps.', [[1.5, 4.0]]),
    ('The relevant moments are [[5.0, 8.0], [20.0, 24.5]].', [[5.0, 8.0], [20.0, 24.5]]),  # after prose
    ('I first thought [1] but the answer is [[5, 8]]', [[5.0, 8.0]]),          # citation-like [1] ignored
    ('[{"start": 12, "end": 20.5}, {"start": 30, "end": 31}]', [[12.0, 20.5], [30.0, 31.0]]),  # objects
    ('[{"start_time": 1.0, "end_time": 2.0}]', [[1.0, 2.0]]),
    ('{"begin": 3, "end": 4}', [[3.0, 4.0]]),
    ('{"windows": [[1, 2], [5, 6]]}', [[1.0, 2.0], [5.0, 6.0]]),              # containers
    ('{"answer": [[1, 2]]}', [[1.0, 2.0]]),
    ('{"relevant_windows": [[1, 2, 0.9]]}', [[1.0, 2.0]]),
    ('{"timestamps": [{"timestamp": "12.0 - 20.5"}]}', [[12.0, 20.5]]),
    ('12.0 - 20.5 seconds', [[12.0, 20.5]]),                                 # prose ranges
    ('The event is at 12.0-20.5s.', [[12.0, 20.5]]),
    ('12.0 \u2013 20.5 s', [[12.0, 20.5]]),                                  # en dash
    ('from 12s to 20s', [[12.0, 20.0]]),
    ('It happens from 12 s to 20 s and again from 40.5s to 44s.', [[12.0, 20.0], [40.5, 44.0]]),
    ('between 12 and 20 seconds', [[12.0, 20.0]]),
    ('1.5 - 2 minutes', [[90.0, 120.0]]),
    ('00:12 - 00:20.5', [[12.0, 20.5]]),                                     # mm:ss(.ff)
    ('from 1:05 to 1:10.25', [[65.0, 70.25]]),
    ('01:02:03 to 01:02:10', [[3723.0, 3730.0]]),                            # hh:mm:ss
    ('[["00:12", "00:20"], ["01:00", "01:05.5"]]', [[12.0, 20.0], [60.0, 65.5]]),
    ('[[00:12, 00:20]]', [[12.0, 20.0]]),                                    # timecodes inside brackets
    ("[(12.0, 20.5), (30, 35)]", [[12.0, 20.5], [30.0, 35.0]]),               # python tuples
    ("[{'start': 1, 'end': 2},]", [[1.0, 2.0]]),                             # single quotes, trailing comma
    ('[[1, 2] [3, 4]]', [[1.0, 2.0], [3.0, 4.0]]),                           # missing comma
    ('[12s, 20s]', [[12.0, 20.0]]),
    ('[12.0, 20.5]', [[12.0, 20.5]]),                                         # one bare pair
    ('[12.0 - 20.5]', [[12.0, 20.5]]),
    ('(12.0, 20.5) and (30.0, 31.0)', [[12.0, 20.5], [30.0, 31.0]]),
    ('"[[1.0, 2.0]]"', [[1.0, 2.0]]),                                         # JSON-quoted answer
    ('[[[1, 2], [3, 4]]]', [[1.0, 2.0], [3.0, 4.0]]),                         # one extra nesting level
])
def test_formats(text, expected):
    assert windows(text) == expected


def test_think_then_answer_tag():
    text = '<think>The clip shows [1] a dog... maybe [[0, 5]]?</think>\n<answer>[[12.0, 20.5]]</answer>'
    res = parse_answer(text)
    assert res.ok and res.windows == [(12.0, 20.5)]
    assert 'answer_tag' in res.flags and 'think' in res.flags


def test_text_after_think_block():
    res = parse_answer('<think>\nlet me look at 3.0 - 4.0 again\n</think>\n\n[[7.0, 9.0]]')
    assert res.ok and res.windows == [(7.0, 9.0)] and 'think' in res.flags


def test_unclosed_answer_tag_reads_to_end():
    res = parse_answer('<answer>[[1, 2]]')
    assert res.ok and res.windows == [(1.0, 2.0)] and 'unclosed_answer' in res.flags


def test_score_triples_keep_scores():
    res = parse_answer('[[0, 10, 0.9], [30, 40, 0.2], [5, 12, 0.5]]')
    assert res.ok and res.windows == [(0.0, 12.0), (30.0, 40.0)]
    assert res.scores == [0.9, 0.2] and 'scores' in res.flags and res.merged == 1


def test_objects_with_score_key():
    res = parse_answer('[{"start": 1, "end": 2, "confidence": 0.7}]')
    assert res.windows == [(1.0, 2.0)] and res.scores == [0.7]


def test_roundtrip_with_the_writer():
    pairs = [(0.0, 1.5), (3.25, 9.0), (100.0, 149.9)]
    assert parse_answer(format_answer(pairs)).windows == [(0.0, 1.5), (3.2, 9.0), (100.0, 149.9)]


# ---- repairs ------------------------------------------------------------------------------------
def test_reversed_pairs_are_swapped_and_counted():
    res = parse_answer('[[20, 10], [40, 30]]')
    assert res.windows == [(10.0, 20.0), (30.0, 40.0)] and res.swapped == 2


def test_values_clamped_to_duration_and_counted():
    res = parse_answer('[[-3, 5], [50, 75], [90, 100]]', duration=60)
    assert res.windows == [(0.0, 5.0), (50.0, 60.0)]
    assert res.clamped == 3 and res.dropped_zero == 1  # [90, 100] lies past the end


def test_no_duration_still_clamps_below_zero():
    res = parse_answer('[[-3, 5]]')
    assert res.windows == [(0.0, 5.0)] and res.clamped == 1


def test_zero_length_dropped_and_counted():
    res = parse_answer('[[5, 5], [6, 8]]')
    assert res.windows == [(6.0, 8.0)] and res.dropped_zero == 1


def test_duplicates_removed_and_counted():
    res = parse_answer('[[1, 2], [1, 2], [1, 2], [4, 5]]')
    assert res.windows == [(1.0, 2.0), (4.0, 5.0)] and res.deduplicated == 2 and res.merged == 0


def test_overlaps_merged_and_counted():
    res = parse_answer('[[1, 5], [4, 8], [8, 9], [20, 21]]')
    assert res.windows == [(1.0, 9.0), (20.0, 21.0)] and res.merged == 2


def test_invalid_entries_dropped_and_counted():
    res = parse_answer('[[1, 2], [3], ["a", "b"], [NaN, 4], [5, 6]]')
    assert res.ok and res.windows == [(1.0, 2.0), (5.0, 6.0)] and res.dropped_invalid == 3


def test_repairs_property_and_to_dict():
    res = parse_answer('[[2, 1], [1, 2]]')
    assert res.repairs == {'swapped': 1, 'clamped': 0, 'dropped_zero': 0, 'dropped_invalid': 0,
                           'deduplicated': 1, 'merged': 0}
    d = res.to_dict()
    assert d['windows'] == [[1.0, 2.0]] and d['ok'] is True and json.dumps(d)


def test_unsorted_answer_comes_back_sorted():
    assert windows('[[30, 40], [1, 2]]') == [[1.0, 2.0], [30.0, 40.0]]


# ---- junk gives [] plus a failure name, never an exception ----------------------------------------
@pytest.mark.parametrize('text, failure', [
    ('', 'empty'),
    ('   \n', 'empty'),
    (None, 'empty'),
    ('<argmax>11</argmax>' * 300, 'repetition'),                 # tag soup loop
    ('[[1.0, 2.0], ' * 400, 'repetition'),                       # window loop (also never closed)
    ('the the the the ' * 200, 'repetition'),
    ('[[1.0, 2.0], [3.0, 4', 'truncated'),                       # truncated JSON
    ('[{"start": 1, "end": 2}, {"start": 3, "en', 'truncated'),
    ('Here: [[1, 2]] and then [[3,', 'truncated'),               # cut while writing a second value
    ('<think>I need to watch the clip again, the dog', 'unclosed_think'),
    ('<answer></answer>', 'empty'),
    ('There are no relevant moments.', 'no_intervals'),
    ('<argmax>11</argmax><argmax>11</argmax><argmax>12', 'no_intervals'),
    ('The answer is 12.', 'no_intervals'),
    ('[1] [2] [3]', 'no_intervals'),
    ('[[1, 2, 3, 4]]', 'malformed'),
    ('[["a", "b"]]', 'malformed'),
    ('x' * (answer_parser.MAX_TEXT_CHARS + 1), 'too_long'),
    ('[' + '[1, 2], ' * 10_000 + ']', 'too_long'),               # answer region over MAX_ANSWER_CHARS
])
def test_junk(text, failure):
    res = parse_answer(text)
    assert isinstance(res, ParseResult)
    assert not res.ok and res.windows == [] and res.failure == failure, res
    assert failure in answer_parser.FAILURES


def test_unbalanced_tags_flagged():
    res = parse_answer('<argmax>11</argmax><argmax>11')
    assert not res.ok and 'unbalanced_tags' in res.flags


def test_non_string_inputs():
    assert parse_answer(b'[[1, 2]]').windows == [(1.0, 2.0)]
    assert parse_answer([[1, 2]]).windows == [(1.0, 2.0)]  # an already-decoded value
    assert parse_answer(12).ok is False


# ---- fuzzing ------------------------------------------------------------------------------------
JUNK_ALPHABET = '[]{}()0123456789.,:-–"\'\\ \nsSeE<>/thinkanswerfromto~'


def _check_invariants(res, duration=None):
    assert isinstance(res, ParseResult)
    assert not any(f.startswith('internal_error') for f in res.flags), res  # the safety net never fired
    if not res.ok:
        assert res.windows == [] and res.failure in answer_parser.FAILURES
        return
    prev_end = None
    for s, e in res.windows:
        assert 0 <= s < e
        if duration is not None:
            assert e <= duration
        if prev_end is not None:
            assert s > prev_end  # sorted, non-overlapping, not touching (touching ones are merged)
        prev_end = e
    if res.scores is not None:
        assert len(res.scores) == len(res.windows)


FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(st.text(max_size=400))
def test_fuzz_any_text(text):
    _check_invariants(parse_answer(text))


@FUZZ
@given(st.text(alphabet=JUNK_ALPHABET, max_size=600), st.one_of(st.none(), st.floats(0.5, 500)))
def test_fuzz_bracket_soup(text, duration):
    _check_invariants(parse_answer(text, duration), duration)


json_values = st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=True, allow_infinity=True) | st.integers(-10**6, 10**6)
    | st.text(max_size=12),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(
        st.sampled_from(['start', 'end', 'score', 'windows', 'answer', 'x', 'timestamp']), children, max_size=4),
    max_leaves=30)


@FUZZ
@given(json_values,
       st.sampled_from(['{}', 'answer: {}', '```json\n{}\n```', '<answer>{}</answer>', '<think>x</think>{}']))
def test_fuzz_json_shaped(value, wrapper):
    text = wrapper.format(json.dumps(value)) if '{}' in wrapper else json.dumps(value)
    _check_invariants(parse_answer(text))
    _check_invariants(parse_answer(text[:len(text) // 2]))  # truncated anywhere


@FUZZ
@given(st.lists(st.tuples(st.floats(-50, 500, allow_nan=False), st.floats(-50, 500, allow_nan=False)), max_size=20),
       st.floats(1, 400))
def test_fuzz_pairs_match_repair_rules(pairs, duration):
    res = parse_answer(json.dumps([[s, e] for s, e in pairs]), duration)
    _check_invariants(res, duration)
    assert res.ok
    # the answer is exactly the union of the input pairs, each put in order and clamped to [0, duration]
    expected, _ = merge(clip([(min(a, b), max(a, b)) for a, b in pairs], 0.0, duration))
    assert res.windows == expected
    assert res.swapped == sum(1 for a, b in pairs if a > b)
    assert res.dropped_zero == sum(1 for a, b in pairs if not clip([(min(a, b), max(a, b))], 0.0, duration))


# ---- speed --------------------------------------------------------------------------------------
M = answer_parser.MAX_ANSWER_CHARS


@pytest.mark.parametrize('name, text', [
    ('digits', '1' * (M - 8)),
    ('open brackets', '[' * (M - 8)),
    ('deep nesting', '[' * 5000 + ']' * 5000),
    ('unterminated strings', '["' + '\\"' * (M // 2 - 4)),
    ('many citations', '[1] ' * (M // 4 - 2)),
    ('broken objects', "[{'a' 1}] " * (M // 10)),
    ('number dash chains', '1-' * (M // 2 - 2)),
    ('range words', 'from 1 to ' * (M // 10 - 1)),
    ('timecode chains', '1:23:45:' * (M // 8 - 1)),
    ('huge think block', '<think>' + 'a b c ' * 150_000 + '</think>[[1, 2]]'),
    ('max size text', 'word ' * (answer_parser.MAX_TEXT_CHARS // 5)),
])
def test_long_junk_is_fast(monkeypatch, name, text):
    # Loop detection would short-cut most of these; switch it off to time the readers themselves.
    monkeypatch.setattr(answer_parser, 'REPETITION_MAX_RATIO', 0.0)
    t0 = time.perf_counter()
    res = parse_answer(text)
    assert time.perf_counter() - t0 < 2.0, name
    _check_invariants(res)
