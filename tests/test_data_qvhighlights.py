"""QVHighlights: the real validation annotations convert with every line accounted for."""
import json
from pathlib import Path

from swift_vora.data.annotations import load_annotations
from swift_vora.data.convert import convert_file
from swift_vora.data.qvhighlights import is_qvhighlights, to_vora

FIXTURE = Path(__file__).parent / 'fixtures' / 'qvhighlights' / 'val.jsonl'
FIXTURE_LINES = 1550  # 1,550 queries; the file has no trailing newline, so `wc -l` says 1549


def test_fixture_is_the_full_validation_split():
    assert len(FIXTURE.read_bytes().decode().splitlines()) == FIXTURE_LINES


def test_convert_val_accounts_for_every_line(tmp_path):
    out = tmp_path / 'val_vora.jsonl'
    report = convert_file(str(FIXTURE), str(out))
    assert report.lines == FIXTURE_LINES
    assert report.converted + len(report.rejected) + report.blank_lines == report.lines
    assert report.converted == FIXTURE_LINES and report.rejected == [] and report.blank_lines == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == report.converted
    assert len({r['id'] for r in rows}) == FIXTURE_LINES
    first = rows[0]
    assert first == {'id': '2579', 'video': 'NUsG9BgSes0_210.0_360.0.mp4', 'duration': 150.0,
                     'query': 'A girl and her mother cooked while talking with each other on facetime.',
                     'windows': [[82.0, 150.0]]}
    last = rows[-1]
    assert last['id'] == '8420' and last['query'].startswith('Footage of two eggs being')
    # Converted rows read back as our format, with the same windows.
    back = load_annotations(str(out), probe=False, check_files=False)
    assert back.valid == FIXTURE_LINES and not back.invalid
    assert back.rows[0].windows == [(82.0, 150.0)]


def test_spot_check_a_multi_window_query(tmp_path):
    source = {json.loads(line)['qid']: json.loads(line) for line in FIXTURE.read_text().splitlines()}
    out = tmp_path / 'out.jsonl'
    convert_file(str(FIXTURE), str(out))
    rows = {r['id']: r for r in map(json.loads, out.read_text().splitlines())}
    multi = next(q for q in source.values() if len(q['relevant_windows']) > 2)
    row = rows[str(multi['qid'])]
    assert row['windows'] == sorted([float(s), float(e)] for s, e in multi['relevant_windows'])
    assert row['duration'] == float(multi['duration']) and row['video'] == multi['vid'] + '.mp4'


def test_video_root_makes_absolute_paths(tmp_path):
    out = tmp_path / 'out.jsonl'
    convert_file(str(FIXTURE), str(out), video_root=str(tmp_path / 'videos'))
    first = json.loads(out.read_text().splitlines()[0])
    assert first['video'] == str(tmp_path / 'videos' / 'NUsG9BgSes0_210.0_360.0.mp4')


def test_bad_qvhighlights_lines_are_rejected_with_reason_and_counted(tmp_path):
    lines = FIXTURE.read_text().splitlines()[:3]
    broken = json.loads(lines[1])
    broken['relevant_windows'] = [[140, 160]]
    path = tmp_path / 'qvh.jsonl'
    path.write_text('\n'.join([lines[0], json.dumps(broken), '', '{"qid": 1}', lines[2]]) + '\n')
    report = convert_file(str(path), str(tmp_path / 'out.jsonl'))
    assert (report.lines, report.converted, len(report.rejected), report.blank_lines) == (5, 2, 2, 1)
    assert report.rejected[0].reason == (f"{path}:2: field 'relevant_windows'[0]: end 160.0 is past the duration "
                                         '150.0 (tolerance 0.001 s)')
    assert report.rejected[1].reason == f"{path}:4: field 'vid': missing"
    assert report.rejected[1].id == '1'
    assert f'{path}:2:' in report.summary()


def test_detection_and_mapping():
    line = {'qid': 7, 'vid': 'abc_0.0_150.0', 'duration': 150, 'query': 'q', 'relevant_windows': [[0, 2]]}
    assert is_qvhighlights(line)
    assert not is_qvhighlights({'id': 'x', 'video': 'v.mp4', 'windows': []})
    assert not is_qvhighlights({'id': 'x', 'video': 'v.mp4', 'windows': [], 'qid': 3})
    assert to_vora(line) == {'id': '7', 'video': 'abc_0.0_150.0.mp4', 'duration': 150, 'query': 'q',
                             'windows': [[0, 2]]}
