"""`swift-vora parse`: one JSON array per input line, junk prints [] and is counted, never crashes."""
import io
import json
import subprocess
import sys

from swift_vora.cli import main


def run_stdin(monkeypatch, capsys, lines, *argv):
    monkeypatch.setattr(sys, 'stdin', io.StringIO(''.join(line + '\n' for line in lines)))
    rc = main(['parse', *argv])
    out = capsys.readouterr()
    return rc, [json.loads(line) for line in out.out.splitlines()], out.err


def test_one_array_per_line_and_junk_counted(monkeypatch, capsys):
    lines = [json.dumps('[[1.0, 2.0]]'), json.dumps('<think>x</think>from 3s to 5s'),
             json.dumps('<argmax>11</argmax>' * 50), json.dumps('[[1.0, 2.'), json.dumps('[]'),
             'this line is not JSON: 00:10 - 00:12', json.dumps({'response': '[[7, 8]]'})]
    rc, out, err = run_stdin(monkeypatch, capsys, lines)
    assert rc == 0
    assert out == [[[1.0, 2.0]], [[3.0, 5.0]], [], [], [], [[10.0, 12.0]], [[7.0, 8.0]]]
    assert '7 response(s), 5 parsed, 2 failed' in err and 'repetition: 1' in err and 'truncated: 1' in err


def test_strict_exit_code(monkeypatch, capsys):
    assert run_stdin(monkeypatch, capsys, [json.dumps('[[1, 2]]')], '--strict')[0] == 0
    assert run_stdin(monkeypatch, capsys, [json.dumps('nothing')], '--strict')[0] == 1


def test_text_duration_and_details(capsys):
    assert main(['parse', '--text', '[[50, 10], [45, 90]]', '--text', '[[1, 2', '--duration', '60', '--details']) == 0
    first, second = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert first['windows'] == [[10.0, 60.0]] and first['ok'] is True
    assert first['swapped'] == 1 and first['clamped'] == 1 and first['merged'] == 1
    assert second == {**second, 'windows': [], 'ok': False, 'failure': 'truncated'}


def test_subprocess_survives_binary_junk():
    junk = b'"[[1, 2]]"\n\xff\xfe\x00garbage[[\n' + b'[' * 100000 + b'\n"00:01-00:03"\n'
    proc = subprocess.run([sys.executable, '-m', 'swift_vora', 'parse'], input=junk, capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.decode().splitlines() == ['[[1.0, 2.0]]', '[]', '[]', '[[1.0, 3.0]]']
    assert b'4 response(s), 2 parsed, 2 failed' in proc.stderr
