"""Every value is validated where it enters, and user input is never an "internal error" (issue #33, item 5).

Where values enter: annotation and prediction lines (one invalid line each, with line and field), config.json,
recipe keys and overrides, `swift_args` / `extra_args`, `SWIFT_VORA_*` switches, flags. Each bad value stops with
the exit code of its kind (1: a line of an input file; 2: a flag, key or switch), and the message names it.
"""
import json
import os
import subprocess
import sys

import pytest
from cli_harness import CPU_TINY, REPO, TINY_VL, assert_clean, run_cli
from cli_harness import strict_json as _strict_json
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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
    rc, out, err = run_cli('train', CPU_TINY, f'model.path={TINY_VL}', 'data.dataset=a.jsonl', '--dry-run', '--json')
    assert rc == 0, err


# ---- SWIFT_VORA_* switches: checked when any command starts, exit 2 naming the variable ----------------------------
@pytest.mark.parametrize('name, value, said', [
    ('SWIFT_VORA_FPS', 'inf', 'expected a finite number'),
    ('SWIFT_VORA_FPS', 'nan', 'expected a finite number'),
    ('SWIFT_VORA_FPS', '1e400', 'expected a finite number'),
    ('SWIFT_VORA_FPS', '0', 'expected > 0'),
    ('SWIFT_VORA_PAIR_TOKENS', '0', 'expected >= 1'),  # planned "fits" with 1 token per frame pair
    ('SWIFT_VORA_MAX_FRAMES', HUGE_INT, '...(5000 characters)'),
    ('SWIFT_VORA_MIN_PAIR_TOKENS', '-3', 'expected >= 1'),
    ('SWIFT_VORA_WINDOW', 'inf', 'expected a finite number'),
    ('SWIFT_VORA_STRIDE', '0.01', 'expected >= 0.1'),
    ('SWIFT_VORA_MIN_EVENT', '-1', 'expected >= 0'),
    ('SWIFT_VORA_VERIFY_TIMEOUT', 'inf', 'expected a finite number'),
    ('SWIFT_VORA_LOG_FIRST', '-1', 'expected >= 0'),
    ('SWIFT_VORA_TRACEBACK', 'maybe', 'expected one of'),
])
@pytest.mark.parametrize('argv', [['plan', '--model', TINY_VL, '--hardware', 'h200x1', '--json'],
                                  ['data', 'check', 'a.jsonl', '--no-probe', '--json']], ids=['plan', 'data-check'])
def test_a_switch_value_is_checked_where_it_enters(workspace, monkeypatch, name, value, said, argv):
    monkeypatch.setenv(name, value)
    rc, out, err = run_cli(*argv)
    assert_clean(rc, out, err, argv)
    assert rc == 2 and f'{name}=' in err and said in err, err
    assert len(err) < 400  # a 5000-digit value is shortened, not echoed
    assert _strict_json(out)['exit_code'] == 2


def test_switches_lists_a_refused_value_as_json(monkeypatch):
    monkeypatch.setenv('SWIFT_VORA_FPS', 'inf')
    rc, out, _ = run_cli('switches', '--json')
    rows = {row['name']: row for row in _strict_json(out)}  # no Infinity in the output
    assert rc == 1 and 'expected a finite number' in rows['SWIFT_VORA_FPS']['error']


def test_switch_bounds_are_the_recipe_ranges():
    """The video budget and the windows are checked alike whether they come from a switch or a recipe key."""
    from swift_vora import switches
    from swift_vora.backends.recipe import RANGES
    for switch in switches.table().values():
        if switch.recipe in RANGES and switch.recipe != 'data.window':  # data.window: 0 (whole video) or >= 1
            assert switch.bounds == RANGES[switch.recipe], switch.name
    assert switches.switch('SWIFT_VORA_WINDOW').bounds[:2] == (1, RANGES['data.window'][1])


# ---- recipe values: swift_args, extra_args, env, deepspeed -----------------------------------------------------
@pytest.mark.parametrize('override, key', [
    ('swift_args.neftune_noise_alpha=.nan', 'swift_args.neftune_noise_alpha'),
    ('swift_args.neftune_noise_alpha=inf', 'swift_args.neftune_noise_alpha'),
    ('swift_args.neftune_noise_alpha=1e400', 'swift_args.neftune_noise_alpha'),
    ('swift_args={a: [1, .inf]}', 'swift_args.a[1]'),
    ('extra_args=[--neftune_noise_alpha, .inf]', 'extra_args[1]'),
    ('extra_args=[--neftune_noise_alpha, nan]', 'extra_args[1]'),
    ('env.SOME_FLAG=.nan', 'env.SOME_FLAG'),
    ('deepspeed.zero_optimization={reduce_bucket_size: .inf}', 'deepspeed.zero_optimization.reduce_bucket_size'),
    (f'video.max_frames={HUGE_INT}', 'video.max_frames'),
    (f'train.lora_rank={BIG_INT}', 'train.lora_rank'),
    ('video.fps=1e400', 'video.fps'),
])
def test_a_recipe_value_is_finite_or_named(override, key):
    argv = ['train', CPU_TINY, f'model.path={TINY_VL}', override, '--dry-run', '--json']
    rc, out, err = run_cli(*argv)
    assert_clean(rc, out, err, argv)
    assert rc == 2 and f"key '{key}'" in err, err
    assert len(err) < 600


def _bomb(section: str, depth: int = 10) -> str:
    """A recipe whose `section` holds 9**depth values through nine aliases of nine aliases ("billion laughs")."""
    lines = [f'model:\n  path: {TINY_VL}\ndata:\n  dataset: a.jsonl\n']
    if section == 'deepspeed':
        lines.append('train:\n  backend: deepspeed_zero3\ndeepspeed:\n  zero_optimization:\n')
        indent = '    '
    else:
        lines.append(f'{section}:\n')
        indent = '  '
    lines.append(f'{indent}a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n')
    for i in range(1, depth):
        lines.append(f'{indent}a{i}: &a{i} [' + ', '.join([f'*a{i - 1}'] * 9) + ']\n')
    return ''.join(lines)


@pytest.mark.parametrize('section, key', [('swift_args', 'swift_args.a5'), ('env', 'env.a5'),
                                          ('deepspeed', 'deepspeed.zero_optimization.a5')])
def test_yaml_aliases_cannot_exhaust_memory(tmp_path, section, key):
    """Run in a process limited to 4 GiB of address space: expanding the aliases would need hundreds."""
    (tmp_path / 'bomb.yaml').write_text(_bomb(section))
    code = ('import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30)); '
            'from swift_vora.cli import main; sys.exit(main(sys.argv[1:]))')
    proc = subprocess.run([sys.executable, '-c', code, 'train', 'bomb.yaml', '--dry-run'], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, env={'PYTHONPATH': str(REPO),
                                                                           'PATH': '/usr/bin:/bin'})
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"key '{key}' stands for more than 100,000 values" in proc.stderr


def test_a_self_referencing_alias_and_an_oversized_recipe_are_usage_errors(tmp_path):
    (tmp_path / 'self.yaml').write_text(f'model:\n  path: {TINY_VL}\ndata:\n  dataset: a.jsonl\n'
                                        'swift_args: &s\n  x: *s\n')
    rc, _, err = run_cli('train', tmp_path / 'self.yaml', '--dry-run')
    assert rc == 2 and "key 'swift_args.x' contains itself" in err
    (tmp_path / 'big.yaml').write_text(f'model:\n  path: {TINY_VL}\n' + '#' * (2 << 20) + '\n')
    rc, _, err = run_cli('train', tmp_path / 'big.yaml', '--dry-run')
    assert rc == 2 and 'larger than 1,048,576 characters' in err


# ---- probes: a device or a FIFO given as the meminfo or cgroup file ---------------------------------------------
@pytest.mark.parametrize('kind', ['/dev/zero', '/dev/urandom', 'fifo', 'huge'])
def test_probe_files_are_read_with_a_size_cap(tmp_path, monkeypatch, kind):
    if kind == 'fifo':
        target = tmp_path / 'fifo'
        os.mkfifo(target)  # open() would wait for a writer forever
    elif kind == 'huge':
        target = tmp_path / 'meminfo'
        target.write_text('MemTotal: ' + '9' * 5000 + ' kB\n' + 'x' * (2 << 20))
    else:
        target = kind
    cgroup = tmp_path / 'cg'
    cgroup.mkdir()
    (cgroup / 'cgroup.controllers').write_text('memory\n')
    (cgroup / 'memory.max').symlink_to(target)
    monkeypatch.setenv('SWIFT_VORA_MEMINFO', str(target))
    monkeypatch.setenv('SWIFT_VORA_CGROUP_ROOT', str(cgroup))
    monkeypatch.setenv('SWIFT_VORA_PROBE_TORCH', '0')
    rc, out, err = run_cli('doctor', '--no-torch', '--json')  # the harness fails a run of more than 30 s
    report = _strict_json(out)
    assert rc == 0, err
    assert report['host']['mem_total_bytes'] is None
    assert any(f'{target}: no MemTotal read' in w for w in report['warnings'])


# ---- plan and the template agree on the frames ---------------------------------------------------------------------

@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fps=st.sampled_from(['0.5', '1', '2', '4']), min_frames=st.integers(1, 300),
       max_frames=st.integers(1, 300), window=st.sampled_from(['8', '30', '60', '120']))
def test_plan_counts_the_frames_the_template_samples(fps, min_frames, max_frames, window):
    from swift_vora.budget import VideoBudget
    argv = ['plan', '--model', TINY_VL, '--hardware', 'h200x1', '--json', '--fps', fps, '--window', window,
            '--min-frames', str(min_frames), '--max-frames', str(max_frames)]
    rc, out, err = run_cli(*argv)
    if min_frames > max_frames:  # the template would sample past the cap: refused with the reason
        assert rc == 2 and '--min-frames' in err and 'above --max-frames' in err
        return
    template = VideoBudget(fps=float(fps), min_frames=min_frames, max_frames=max_frames).frames_for(float(window))
    assert _strict_json(out)['tokens']['frames'] == template, (argv, err)


def test_the_issue_example_plans_200_frames():
    rc, out, _ = run_cli('plan', '--model', TINY_VL, '--hardware', 'h200x1', '--min-frames', '200',
                         '--max-frames', '256', '--json')
    assert rc == 0 and _strict_json(out)['tokens']['frames'] == 200
    rc, out, err = run_cli('train', CPU_TINY, f'model.path={TINY_VL}', 'video.min_frames=300', 'video.max_frames=256',
                           '--dry-run')
    assert rc == 2 and "key 'video.min_frames' (300) is above 'video.max_frames' (256)" in err


# ---- strings that are not text -------------------------------------------------------------------------------------
def test_a_lone_surrogate_is_one_invalid_line_not_a_crash_later(workspace):
    """`"\\ud800"` is valid JSON but not text: it failed when printed (data build) or drawn (eval --output_dir)."""
    (workspace / 'sur.jsonl').write_text('{"id": "a\\ud800", "video": "v.mp4", "duration": 30, "windows": [[1, 9]]}\n'
                                         '{"id": "b", "video": "v.mp4", "duration": 30, "windows": [[1, 9]], '
                                         '"query": "\\ud83d\\ude00 a pair is one character"}\n')
    rc, out, err = run_cli('data', 'build', 'sur.jsonl', 'o.jsonl', '--no-probe', '--json')
    report = _strict_json(out)
    assert rc == 0 and report['valid'] == 1 and report['rejected'][0]['line'] == 1
    assert 'lone UTF-16 surrogate' in report['rejected'][0]['reason']
    (workspace / 'ps.jsonl').write_text('{"id": "b", "response": "[[1, 9]] \\udc00"}\n')
    (workspace / 'as.jsonl').write_text('{"id": "b", "duration": 30, "windows": [[1, 9]]}\n')
    rc, out, err = run_cli('eval', '--annotations', 'as.jsonl', '--predictions', 'ps.jsonl', '--output_dir', 'rep')
    assert rc == 1 and 'ps.jsonl:1: not JSON: a string holds a lone UTF-16 surrogate' in err, err


def test_a_recipe_string_that_is_not_text_is_named():
    rc, _, err = run_cli('train', CPU_TINY, f'model.path={TINY_VL}', 'env.NOTE="\\ud800"', '--dry-run')
    assert rc == 2 and "key 'env.NOTE' holds a lone UTF-16 surrogate" in err


def test_a_read_error_names_the_file(workspace, monkeypatch):
    import errno

    from swift_vora import jsonl
    real = jsonl.read_stream

    def failing(handle, *args):
        yield from list(real(handle, *args))[:1]
        raise OSError(errno.EIO, os.strerror(errno.EIO))  # a disk that fails half-way, as the kernel says it

    monkeypatch.setattr(jsonl, 'read_stream', failing)
    rc, _, err = run_cli('data', 'check', 'a.jsonl', '--no-probe')
    assert rc == 2 and err.strip() == f'swift-vora data check: a.jsonl: {os.strerror(errno.EIO)}', err
