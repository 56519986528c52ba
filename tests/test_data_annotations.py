"""Annotation validation: every bad line is reported with file, line and field; nothing vanishes uncounted."""
import json

import pytest

from swift_vora.data.annotations import (
    WINDOW_TOLERANCE,
    AnnotationError,
    load_annotations,
    validate_line,
    validate_record,
)

# The good video every line points at: 125 frames at 10 fps = 12.5 s.
DURATION = 12.5
GOOD = {'id': 'good', 'video': 'v.mp4', 'duration': DURATION, 'windows': [[1, 2]]}


@pytest.fixture
def video_dir(tmp_path, make_video):
    make_video('v.mp4', frames=125, fps=10.0)
    (tmp_path / 'empty.mp4').write_bytes(b'')
    (tmp_path / 'junk.mp4').write_bytes(b'garbage, not a video ' * 40)
    return tmp_path


def write_lines(directory, lines, name='ann.jsonl'):
    """Write raw strings as-is and anything else as JSON, one per line; return the path as a string."""
    path = directory / name
    path.write_text(''.join((line if isinstance(line, str) else json.dumps(line)) + '\n' for line in lines),
                    encoding='utf-8')
    return str(path)


def bad(**fields):
    return {'id': 'x', 'video': 'v.mp4', 'duration': DURATION, 'windows': [[1, 2]], **fields}


def without(key):
    record = bad()
    del record[key]
    return record


# (line 2 of the file, expected field in the message (None = the whole line), expected phrase)
BAD_LINES = [
    ('{"id": "x", "video": ', None, 'not valid JSON'),
    ('[1, 2]', None, 'expected a JSON object, got a list'),
    ('"just a string"', None, 'expected a JSON object, got a string'),
    (without('video'), "'video'", 'missing'),
    (without('windows'), "'windows'", 'missing'),
    (without('id'), "'id'", 'missing'),
    (bad(id=['a']), "'id'", 'expected a string'),
    (bad(id='good'), "'id'", "duplicate id 'good' (first used on line 1)"),
    (bad(video='nope.mp4'), "'video'", 'file not found'),
    (bad(video='empty.mp4'), "'video'", 'file is empty (0 bytes)'),
    (bad(video='junk.mp4'), "'video'", 'cannot be decoded'),
    (bad(video=7), "'video'", 'expected a path string'),
    (bad(duration=0), "'duration'", 'must be > 0, got 0.0'),
    (bad(duration=-3), "'duration'", 'must be > 0, got -3.0'),
    (bad(duration='12.5'), "'duration'", 'not a number: "12.5"'),
    (bad(duration=True), "'duration'", 'not a number: true'),
    (bad(windows=[[0, 1], [12.0, 10.0]]), "'windows'[1]", 'start 12.0 >= end 10.0'),
    (bad(windows=[[3, 3]]), "'windows'[0]", 'start 3.0 >= end 3.0'),
    (bad(windows=[[-1, 2]]), "'windows'[0]", 'start -1.0 is negative'),
    (bad(windows=[[10, 13]]), "'windows'[0]", f'end 13.0 is past the duration 12.5 (tolerance {WINDOW_TOLERANCE:g} s)'),
    (bad(windows=[[12.5, 12.5005]]), "'windows'[0]", 'start 12.5 is at or past the duration 12.5'),
    (bad(windows=[[0, 'ten']]), "'windows'[0]", 'end is not a number: "ten"'),
    (bad(windows=[[None, 3]]), "'windows'[0]", 'start is not a number: null'),
    (bad(windows=[[1, 2, 3]]), "'windows'[0]", 'expected a [start, end] pair, got [1, 2, 3]'),
    (bad(windows=[[1, 2], 5]), "'windows'[1]", 'expected a [start, end] pair, got 5'),
    (bad(windows='0-5'), "'windows'", 'expected a list of [start, end] pairs, got a string'),
    ('{"id": "x", "video": "v.mp4", "windows": [[0, NaN]]}', "'windows'[0]", 'end is not a finite number'),
    (bad(query=5), "'query'", 'expected a string, got a number'),
    ({'qid': 9, 'vid': 'v', 'duration': DURATION, 'relevant_windows': [[4, 2]]}, "'relevant_windows'[0]",
     'start 4.0 >= end 2.0'),
    ({'qid': 9, 'duration': DURATION, 'relevant_windows': [[0, 2]]}, "'vid'", 'missing'),
]


@pytest.mark.parametrize('line, field, phrase', BAD_LINES, ids=[f'{i}-{c[2][:30]}' for i, c in enumerate(BAD_LINES)])
def test_bad_line_is_reported_with_file_line_and_field(video_dir, line, field, phrase):
    path = write_lines(video_dir, [GOOD, line, GOOD | {'id': 'after'}])
    report = load_annotations(path)
    assert report.total == 3 and report.valid == 2 and len(report.invalid) == 1
    invalid = report.invalid[0]
    assert invalid.line == 2
    prefix = f'{path}:2: ' + (f'field {field}: ' if field else '')
    assert invalid.reason.startswith(prefix), invalid.reason
    assert phrase in invalid.reason, invalid.reason
    assert [row.id for row in report.rows] == ['good', 'after']
    # strict mode stops at the same line with the same message
    with pytest.raises(AnnotationError) as err:
        load_annotations(path, strict=True)
    assert isinstance(err.value, ValueError)
    assert err.value.invalid.line == 2 and str(err.value) == invalid.reason


def test_message_names_the_spec_example_exactly(video_dir):
    path = write_lines(video_dir, [bad(id=str(i)) for i in range(6)]
                       + [bad(id='w', windows=[[0, 1], [12.0, 10.0]])])
    report = load_annotations(path)
    assert report.invalid[0].reason == f"{path}:7: field 'windows'[1]: start 12.0 >= end 10.0"
    assert report.invalid[0].id == 'w' and report.invalid[0].field == 'windows'


def test_not_utf8_line_is_reported(video_dir):
    path = video_dir / 'ann.jsonl'
    path.write_bytes(json.dumps(GOOD).encode() + b'\n{"id": "\xff\xfe"}\n')
    report = load_annotations(str(path))
    assert report.valid == 1
    assert report.invalid[0].reason == f'{path}:2: not valid UTF-8 text'


def test_duration_unknown_without_probing(video_dir):
    path = write_lines(video_dir, [{'id': 'a', 'video': 'v.mp4', 'windows': []}])
    report = load_annotations(path, probe=False)
    assert report.invalid[0].reason.startswith(f"{path}:1: field 'duration': absent and not probed")


def test_duration_is_probed_when_absent(video_dir):
    path = write_lines(video_dir, [{'id': 'a', 'video': 'v.mp4', 'windows': [[0, 12.5]]}])
    (row,) = load_annotations(path).rows
    assert abs(row.duration - DURATION) <= 0.1
    assert row.video == str(video_dir / 'v.mp4')


def test_no_probe_still_checks_that_files_exist_and_are_not_empty(video_dir):
    path = write_lines(video_dir, [bad(id='a', video='nope.mp4'), bad(id='b', video='empty.mp4'),
                                   bad(id='c', video='junk.mp4')])
    report = load_annotations(path, probe=False)
    assert [i.line for i in report.invalid] == [1, 2]
    assert 'file not found' in report.invalid[0].reason and '0 bytes' in report.invalid[1].reason
    assert [r.id for r in report.rows] == ['c']  # undecodable is only found by probing


def test_window_end_within_tolerance_is_clamped(video_dir):
    path = write_lines(video_dir, [bad(windows=[[10, DURATION + WINDOW_TOLERANCE / 2]])])
    (row,) = load_annotations(path).rows
    assert row.windows == [(10.0, DURATION)]


def test_overlaps_are_merged_and_counted_not_rejected(video_dir):
    path = write_lines(video_dir, [bad(id='a', windows=[[5, 8], [1, 3], [2, 4], [4, 4.5]]), GOOD])
    report = load_annotations(path)
    assert report.valid == 2 and not report.invalid
    row = report.rows[0]
    assert row.windows == [(1.0, 4.5), (5.0, 8.0)]
    assert row.merged_overlaps == 2
    assert len(report.merged) == 1 and report.merged[0].line == 1 and report.merged[0].count == 2
    assert report.to_json()['merged_overlaps'][0]['after'] == [[1.0, 4.5], [5.0, 8.0]]
    assert 'merged 2 overlapping or touching windows on 1 line' in report.summary()


def test_blank_lines_are_skipped_counted_and_do_not_shift_line_numbers(video_dir):
    path = write_lines(video_dir, ['', GOOD, '   ', bad(windows=[[3, 1]]), ''])
    report = load_annotations(path)
    assert report.blank_lines == 3 and report.total == 2
    assert report.invalid[0].line == 4 and report.invalid[0].reason.startswith(f'{path}:4:')


def test_report_json_has_the_contract_shape(video_dir):
    path = write_lines(video_dir, [GOOD, '{oops', bad(id='z', windows=[[2, 1]])])
    payload = json.loads(json.dumps(load_annotations(path).to_json()))
    assert payload['rows'] == 3 and payload['valid'] == 1
    assert [(i['line'], i['id']) for i in payload['invalid']] == [(2, None), (3, 'z')]
    assert all(isinstance(i['reason'], str) and f'{path}:{i["line"]}:' in i['reason'] for i in payload['invalid'])


def test_every_line_is_accounted_for(video_dir):
    lines = [GOOD, '', '{', bad(id='b'), bad(id='c', video='nope.mp4'), bad(id='d', windows=[[1, 3], [2, 4]])]
    report = load_annotations(write_lines(video_dir, lines))
    assert report.total + report.blank_lines == len(lines)
    assert report.valid + len(report.invalid) == report.total == 5


def test_video_paths_resolve_against_video_root_else_the_file_directory(tmp_path, make_video):
    make_video('videos/v.mp4')
    ann_dir = tmp_path / 'ann'
    ann_dir.mkdir()
    path = write_lines(ann_dir, [bad(duration=3.5, windows=[])])
    assert 'file not found' in load_annotations(path).invalid[0].reason  # ann/v.mp4 does not exist
    (row,) = load_annotations(path, video_root=str(tmp_path / 'videos')).rows
    assert row.video == str(tmp_path / 'videos' / 'v.mp4')
    path = write_lines(ann_dir, [bad(video='../videos/v.mp4', duration=3.5, windows=[])], name='rel.jsonl')
    assert load_annotations(path).rows[0].video == str(tmp_path / 'videos' / 'v.mp4')


def test_qvhighlights_lines_are_read_directly(video_dir):
    line = {'qid': 2579, 'query': 'a girl cooks', 'duration': 12, 'vid': 'v', 'relevant_windows': [[2, 6]],
            'relevant_clip_ids': [1, 2], 'saliency_scores': [[1, 1, 1], [2, 2, 2]]}
    (row,) = load_annotations(write_lines(video_dir, [line]), probe=False).rows
    assert (row.id, row.query, row.duration, row.windows) == ('2579', 'a girl cooks', 12.0, [(2.0, 6.0)])
    assert row.video == str(video_dir / 'v.mp4')


def test_empty_windows_list_is_a_valid_negative_video(video_dir):
    (row,) = load_annotations(write_lines(video_dir, [bad(windows=[])])).rows
    assert row.windows == []


def test_validate_line_and_record(video_dir):
    ann = validate_line(json.dumps(GOOD), line=3, source='x.jsonl', base_dir=str(video_dir))
    assert ann.line == 3 and ann.video == str(video_dir / 'v.mp4')
    with pytest.raises(AnnotationError, match=r"^x\.jsonl:3: field 'windows'\[0\]: start 2\.0 >= end 1\.0$"):
        validate_line(json.dumps(bad(windows=[[2, 1]])), line=3, source='x.jsonl', base_dir=str(video_dir))
    # A Hugging Face dataset fills absent columns with None: that means "absent", not "invalid".
    record = {'id': 'r', 'video': 'v.mp4', 'duration': None, 'query': None, 'windows': [[0, 1]],
              'qid': None, 'vid': None, 'relevant_windows': None}
    ann = validate_record(record, base_dir=str(video_dir))
    assert ann.query is None and abs(ann.duration - DURATION) <= 0.1


def test_declared_duration_longer_than_the_file_is_rejected(video_dir):
    # Clips past the real end would carry labels for frames that do not exist (issue #19): invalid, not a warning.
    report = load_annotations(write_lines(video_dir, [bad(duration=30, windows=[[20, 30]])]))
    assert report.valid == 0 and len(report.invalid) == 1
    reason = report.invalid[0].reason
    assert ":1: field 'duration': 30.0 s is longer than the decoded video" in reason


def test_declared_duration_well_short_of_the_file_is_a_warning_naming_what_is_left_out(video_dir):
    report = load_annotations(write_lines(video_dir, [bad(id='a', duration=DURATION - 3, windows=[[0, 1]]),
                                                      bad(id='b', duration=DURATION - 0.5, windows=[[0, 1]])]))
    assert report.valid == 2  # trained on as declared; the second is within the container's noise
    assert len(report.warnings) == 1 and report.warnings[0].endswith(
        ':1: duration 9.5 s is shorter than the decoded video (12.50 s): only its first 9.5 s are cut into clips and '
        'trained (omit "duration" to use the decoded one)')


def test_absurd_declared_duration_is_rejected_without_probing(tmp_path):
    # A duration sizes windows and saliency arrays: 1e9 s must be refused, not allocated.
    (tmp_path / 'v.mp4').write_bytes(b'x')
    path = tmp_path / 'a.jsonl'
    path.write_text(json.dumps({'id': 'a', 'video': 'v.mp4', 'duration': 1e9, 'windows': [[0, 1]]}) + '\n')
    report = load_annotations(str(path), probe=False)
    assert report.valid == 0 and "field 'duration': 1000000000.0 s is longer than" in report.invalid[0].reason


def test_missing_annotation_file_raises_oserror(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_annotations(str(tmp_path / 'absent.jsonl'))
