"""`swift-vora data ...`: exit codes and what the user sees."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from swift_vora.cli import main

FIXTURE = Path(__file__).parent / 'fixtures' / 'qvhighlights' / 'val.jsonl'


@pytest.fixture
def files(tmp_path, make_video):
    make_video('v.mp4', frames=50, fps=2.0)  # 25 s
    good = tmp_path / 'good.jsonl'
    good.write_text(json.dumps({'id': 'a', 'video': 'v.mp4', 'query': 'q', 'windows': [[3, 12]]}) + '\n')
    mixed = tmp_path / 'mixed.jsonl'
    mixed.write_text('\n'.join([
        json.dumps({'id': 'a', 'video': 'v.mp4', 'windows': [[3, 12]]}),
        '{"id": "b", ',
        json.dumps({'id': 'c', 'video': 'v.mp4', 'windows': [[30, 40]]}),
        json.dumps({'id': 'd', 'video': 'none.mp4', 'windows': []}),
    ]) + '\n')
    return tmp_path, good, mixed


def test_check_valid_file_exits_0(files, capsys):
    _, good, _ = files
    assert main(['data', 'check', str(good)]) == 0
    assert '1 rows, 1 valid, 0 invalid' in capsys.readouterr().out


def test_check_lists_every_bad_line_and_exits_1(files, capsys):
    _, _, mixed = files
    assert main(['data', 'check', str(mixed)]) == 1
    out = capsys.readouterr().out
    assert f'{mixed}:2: not valid JSON' in out
    assert f"{mixed}:3: field 'windows'[0]: end 40.0 is past the duration" in out
    assert f"{mixed}:4: field 'video':" in out and 'file not found' in out


def test_check_json_has_the_contract_shape(files, capsys):
    _, _, mixed = files
    assert main(['data', 'check', str(mixed), '--json']) == 1
    payload = json.loads(capsys.readouterr().out)
    assert (payload['rows'], payload['valid']) == (4, 1)
    assert [(i['line'], i['id']) for i in payload['invalid']] == [(2, None), (3, 'c'), (4, 'd')]


def test_check_no_probe_and_video_root(files, capsys, tmp_path):
    root, good, _ = files
    elsewhere = tmp_path / 'elsewhere.jsonl'
    elsewhere.write_text(json.dumps({'id': 'a', 'video': 'v.mp4', 'duration': 25, 'windows': []}) + '\n')
    (tmp_path / 'sub').mkdir()
    moved = tmp_path / 'sub' / 'ann.jsonl'
    moved.write_text(elsewhere.read_text())
    assert main(['data', 'check', str(moved), '--no-probe']) == 1  # sub/v.mp4 does not exist
    assert main(['data', 'check', str(moved), '--no-probe', '--video-root', str(root)]) == 0


def test_build_writes_rows_and_reports(files, capsys):
    root, good, mixed = files
    out = root / 'rows.jsonl'
    assert main(['data', 'build', str(mixed), str(out), '--window', '10']) == 0
    text = capsys.readouterr().out
    assert 'rows in: 4' in text and 'rejected: 3' in text and 'samples out: 3' in text
    assert f'{mixed}:2: not valid JSON' in text
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r['messages'][1]['content'] for r in rows] == ['[[3.0, 10.0]]', '[[0.0, 2.0]]', '[]']


def test_build_json_and_options(files, capsys):
    root, good, _ = files
    out = root / 'rows.jsonl'
    assert main(['data', 'build', str(good), str(out), '--window', '10', '--stride', '5', '--min-event', '0',
                 '--json']) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload['samples_out'] == 4 and payload['config']['stride'] == 5.0
    assert main(['data', 'build', str(good), str(out), '--window', '0']) == 0
    assert len(out.read_text().splitlines()) == 1


def test_build_strict_stops_with_exit_1_and_writes_nothing(files, capsys):
    root, _, mixed = files
    out = root / 'strict.jsonl'
    assert main(['data', 'build', str(mixed), str(out), '--strict']) == 1
    assert f'{mixed}:2: not valid JSON' in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize('text', ['', '\n  \n'], ids=['empty', 'blank_lines'])
def test_an_annotation_file_without_lines_is_no_pass_and_builds_nothing(tmp_path, capsys, text):
    empty = tmp_path / 'empty.jsonl'
    empty.write_text(text)
    assert main(['data', 'check', str(empty)]) == 1
    assert f'{empty} holds no annotation line' in capsys.readouterr().err
    out = tmp_path / 'train.jsonl'
    assert main(['data', 'build', str(empty), str(out)]) == 1
    assert 'holds no annotation line (empty, or blank lines only); nothing written' in capsys.readouterr().err
    assert not out.exists()


def test_usage_errors_exit_2(files, capsys):
    root, good, _ = files
    assert main(['data', 'build', str(good), str(root / 'o.jsonl'), '--window', '10', '--stride', '20']) == 2
    assert 'stride' in capsys.readouterr().err
    assert main(['data', 'check', str(root / 'absent.jsonl')]) == 2
    assert 'absent.jsonl' in capsys.readouterr().err
    assert main(['data', 'build', str(good), str(root / 'o.jsonl'), '--window', '-5']) == 2
    assert main(['data', 'build', str(good), str(root)]) == 2  # the output path is a directory
    assert not list(root.glob('*.tmp'))
    assert main(['data']) == 2
    assert main(['data', 'check']) == 2  # argparse's errors come back as exit 2, not SystemExit


def test_convert_qvhighlights(tmp_path, capsys):
    out = tmp_path / 'val_vora.jsonl'
    assert main(['data', 'convert-qvhighlights', str(FIXTURE), str(out), '--json']) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload['lines'] == 1550 and payload['converted'] == 1550 and payload['rejected'] == []
    assert len(out.read_text().splitlines()) == 1550


def test_data_modules_import_no_heavy_dependencies():
    code = ('import sys, swift_vora.data.cli, swift_vora.data.annotations, swift_vora.data.windowing, '
            'swift_vora.data.rows, swift_vora.data.qvhighlights, swift_vora.data.probe\n'
            'heavy = [m for m in ("decord", "cv2", "torch", "swift") if m in sys.modules]\n'
            'assert not heavy, heavy')
    subprocess.run([sys.executable, '-c', code], check=True, cwd=Path(__file__).parent.parent)
