"""Rows: the exact ms-swift row per clip, and `build_rows` accounting for every input line."""
import json

import pytest

from swift_vora import prompt
from swift_vora.data.annotations import AnnotationError
from swift_vora.data.rows import annotation_rows, build_rows, sample_to_row
from swift_vora.data.windowing import Sample, WindowConfig


def test_sample_to_row_is_the_ms_swift_shape():
    sample = Sample(id='v@10.0-20.0', source_id='v', video='/data/v.mp4', start=10.0, end=20.0, query='a dog',
                    events=[(1.0, 2.5)], dropped_slivers=0)
    row = sample_to_row(sample)
    assert row == {
        'messages': [{'role': 'user', 'content': prompt.build_prompt('a dog', 10.0)},
                     {'role': 'assistant', 'content': '[[1.0, 2.5]]'}],
        'videos': ['/data/v.mp4'],
        'chat_template_kwargs': {'video_start': 10.0, 'video_end': 20.0, 'sample_id': 'v@10.0-20.0',
                                 'source_id': 'v'},
        'vora': {'id': 'v@10.0-20.0', 'source_id': 'v', 'start': 10.0, 'end': 20.0, 'events': [[1.0, 2.5]]},
    }
    assert json.loads(json.dumps(row)) == row
    assert 'Clip length: 10.0 seconds' in row['messages'][0]['content']


def test_clip_without_events_answers_empty_list_and_default_query():
    row = sample_to_row(Sample('v@0.0-5.0', 'v', '/v.mp4', 0.0, 5.0, None, []))
    assert row['messages'][1]['content'] == '[]'
    assert prompt.DEFAULT_QUERY in row['messages'][0]['content']


@pytest.fixture
def dataset(tmp_path, make_video):
    make_video('long.mp4', frames=50, fps=2.0)  # 25 s
    make_video('short.mp4', frames=16, fps=4.0)  # 4 s
    lines = [
        {'id': 'long', 'video': 'long.mp4', 'query': 'a flash', 'windows': [[9.8, 14], [21, 22]]},
        {'id': 'short', 'video': 'short.mp4', 'windows': []},
        {'id': 'broken', 'video': 'long.mp4', 'windows': [[5, 2]]},
        {'id': 'gone', 'video': 'missing.mp4', 'windows': []},
    ]
    path = tmp_path / 'ann.jsonl'
    path.write_text('\n'.join(json.dumps(line) for line in lines) + '\n\n')
    return path


def test_build_rows_writes_one_row_per_clip_and_accounts_for_every_line(dataset, tmp_path):
    out = tmp_path / 'out' / 'rows.jsonl'
    report = build_rows(str(dataset), str(out), WindowConfig(window=10))
    assert (report.rows_in, report.valid, len(report.rejected), report.blank_lines) == (4, 2, 2, 1)
    assert [bad.line for bad in report.rejected] == [3, 4]
    assert "ann.jsonl:3: field 'windows'[0]: start 5.0 >= end 2.0" in report.rejected[0].reason
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == report.samples_out == 4  # long: 0-10, 10-20, 20-25; short: 0-4
    assert [r['vora']['id'] for r in rows] == ['long@0.0-10.0', 'long@10.0-20.0', 'long@20.0-25.0', 'short@0.0-4.0']
    assert [r['messages'][1]['content'] for r in rows] == ['[]', '[[0.0, 4.0]]', '[[1.0, 2.0]]', '[]']
    assert report.slivers_dropped == 1  # [9.8, 10) in the first window
    assert report.empty_answers == 2
    assert rows[2]['chat_template_kwargs'] == {'video_start': 20.0, 'video_end': 25.0,
                                               'sample_id': 'long@20.0-25.0', 'source_id': 'long'}
    summary = report.summary()
    assert 'rows in: 4' in summary and 'rejected: 2' in summary and 'samples out: 4' in summary
    assert json.loads(json.dumps(report.to_json()))['samples_out'] == 4


def test_strict_build_stops_at_the_first_bad_line_and_writes_nothing(dataset, tmp_path):
    out = tmp_path / 'rows.jsonl'
    with pytest.raises(AnnotationError) as err:
        build_rows(str(dataset), str(out), WindowConfig(window=10), strict=True)
    assert err.value.invalid.line == 3
    assert not out.exists()


def test_annotation_rows_fans_one_annotation_out(dataset):
    from swift_vora.data.annotations import load_annotations
    report = load_annotations(str(dataset))
    rows = annotation_rows(report.rows[0], WindowConfig(window=10))
    assert len(rows) == 3 and all(r['videos'] == [str(dataset.parent / 'long.mp4')] for r in rows)
