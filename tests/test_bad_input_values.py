"""Every value is validated where it enters, and user input is never an "internal error" (issue #33, item 5).

Where values enter: annotation and prediction lines (one invalid line each, with line and field), config.json,
recipe keys and overrides, `swift_args` / `extra_args`, `SWIFT_VORA_*` switches, flags. Each bad value stops with
the exit code of its kind (1: a line of an input file; 2: a flag, key or switch), and the message names it.
"""
import json
import subprocess
import sys

import pytest
from cli_harness import CPU_TINY, REPO, TINY_VL, assert_clean, run_cli
from cli_harness import strict_json as _strict_json

HUGE_INT = '9' * 5000  # past Python's int_max_str_digits (4300): json.loads raised for the whole file
BIG_INT = '9' * 400  # an int Python reads, but float() cannot convert (OverflowError)


def _line(duration: str, ident: str = 'a') -> str:
    return '{"id": "%s", "video": "v.mp4", "duration": %s, "windows": [[1, 2]]}' % (ident, duration)


# ---- numbers in annotation and prediction lines --------------------------------------------------------------
@pytest.mark.parametrize('command', ['check', 'build', 'convert', 'eval'])
def test_absurd_numbers_are_one_invalid_line_each(workspace, command):
    lines = [_line(HUGE_INT, 'huge'), _line('1e400', 'inf'), _line(BIG_INT, 'big'), _line('-' + HUGE_INT, 'neg'),
             _line('30', 'fine')]
    (workspace / 'n.jsonl').write_text('\n'.join(lines) + '\n')
    argv = {'check': ['data', 'check', 'n.jsonl', '--no-probe', '--json'],
            'build': ['data', 'build', 'n.jsonl', 'o.jsonl', '--no-probe', '--json'],
            'convert': ['data', 'convert-qvhighlights', 'n.jsonl', 'o.jsonl', '--json'],
            'eval': ['eval', '--annotations', 'n.jsonl', '--predictions', 'p.jsonl', '--json']}[command]
    rc, out, err = run_cli(*argv)
    assert_clean(rc, out, err, argv)
    report = _strict_json(out)
    if command == 'eval':  # invalid ground truth stops the evaluation, listing every bad line
        assert rc == 1 and [p['line'] for p in report['invalid_annotation_lines']] == [1, 2, 3, 4]
        assert "n.jsonl:1: field 'duration'" in err and '(5000 digits)' in err and 'n.jsonl:2' in err
        return
    bad = report['invalid'] if command == 'check' else report['rejected']
    assert [b['line'] for b in bad] == [1, 2, 3, 4], bad
    assert all(b['field'] == 'duration' for b in bad)
    assert '999999999999...(5000 digits)' in bad[0]['reason'] and '1e400' in bad[1]['reason']
    assert (report.get('valid') or report.get('converted')) == 1


def test_a_huge_clip_id_names_its_field(workspace):
    row = ('{"qid": 1, "vid": "x", "duration": 150, "relevant_windows": [[0, 10]], "relevant_clip_ids": [%s], '
           '"saliency_scores": [[1, 2, 3]]}' % BIG_INT)
    (workspace / 'qb.jsonl').write_text(row + '\n')
    rc, out, err = run_cli('eval', '--annotations', 'qb.jsonl', '--predictions', 'p.jsonl', '--json')
    assert rc == 1 and "qb.jsonl:1: field 'relevant_clip_ids'[0]" in err


def test_huge_numbers_in_predictions_are_invalid_lines(workspace):
    (workspace / 'pb.jsonl').write_text('{"qid": 1, "pred_relevant_windows": [[0, %s]]}\n' % HUGE_INT
                                        + '{"qid": 1, "clip_start": 1e400, "pred_saliency_scores": [1]}\n')
    rc, out, err = run_cli('eval', '--annotations', 'q.jsonl', '--predictions', 'pb.jsonl', '--json')
    m = _strict_json(out)
    assert rc == 1 and m['invalid_prediction_lines'] == 2
    assert "pb.jsonl:1: field 'pred_relevant_windows'[0]" in err and "pb.jsonl:2: field 'clip_start'" in err


def test_a_line_too_long_to_read_is_one_invalid_line(workspace, monkeypatch):
    from swift_vora import jsonl
    monkeypatch.setattr(jsonl, 'MAX_LINE_BYTES', 1000)  # the real limit is 16 MiB; the rule is the same
    (workspace / 'long.jsonl').write_text(_line('30', 'long')[:-1] + ', "pad": "' + 'x' * 5000 + '"}\n'
                                          + _line('30', 'ok') + '\n')
    rc, out, _ = run_cli('data', 'check', 'long.jsonl', '--no-probe', '--json')
    report = _strict_json(out)
    assert rc == 1 and report['valid'] == 1 and report['invalid'][0]['line'] == 1
    assert 'longer than 1000 bytes' in report['invalid'][0]['reason']


def test_parse_reads_an_endless_stdin_line_in_bounded_memory(tmp_path):
    """A line longer than any answer is a `too_long` failure, read past in chunks, and the next line still parses."""
    feed = tmp_path / 'in.txt'
    with open(feed, 'w') as f:
        f.write('"' + 'a' * 13_000_000 + '"\n"[[1, 2]]"\n')
    with open(feed, 'rb') as stdin:
        proc = subprocess.run([sys.executable, '-m', 'swift_vora', 'parse'], stdin=stdin, capture_output=True,
                              env={'PYTHONPATH': str(REPO), 'PATH': '/usr/bin:/bin'}, timeout=120)
    assert proc.returncode == 0 and proc.stdout.decode().splitlines() == ['[]', '[[1.0, 2.0]]']
    assert 'too_long: 1' in proc.stderr.decode()


# ---- config.json -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize('key, value, message', [
    ('num_hidden_layers', '0', 'must be at least 1'),
    ('num_hidden_layers', '1e400', 'must be a non-negative integer'),
    ('vocab_size', HUGE_INT, '(5000 digits)'),
    ('hidden_size', '1' + '0' * 20, 'up to 1e+12'),
])
def test_config_numbers_name_the_key(tmp_path, key, value, message):
    config = json.loads(open(TINY_VL).read())
    config['text_config'][key] = '__VALUE__'
    (tmp_path / 'config.json').write_text(json.dumps(config).replace('"__VALUE__"', value))
    rc, out, err = run_cli('plan', '--model', tmp_path, '--hardware', 'h200x1', '--json')
    assert_clean(rc, out, err, ['--json'])
    assert rc in (1, 2) and f"'text_config.{key}'" in err and message in err, err


def test_cpu_tiny_recipe_still_plans(workspace):
    """The control: the valid inputs of this module's tests are accepted."""
    rc, out, err = run_cli('train', CPU_TINY, f'model.path={TINY_VL}', '--dry-run', '--json')
    assert rc == 0, err
