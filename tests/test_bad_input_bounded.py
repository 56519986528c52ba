"""Bounded and handled (issue #60; docs/errors.md): config counts bounded before arithmetic, a closed or full stdout
on every command that writes, a cgroup file that holds garbage, and the smaller slips -- each through the real CLI
(tests/cli_harness.py), with the exit codes and the file:line:field messages docs/errors.md promises."""
import json
import os
import re
import subprocess

import pytest
from cli_harness import (
    CLASSES,
    CPU_TINY,
    REPO,
    TINY_VL,
    assert_clean,
    run_cli,
    run_cli_closed_stdout,
    run_process,
    strict_json,
)
from test_bad_input_stdout import COMMANDS

CONFIGS = os.path.join(REPO, 'tests', 'fixtures', 'configs')


# ---- config.json: counts enumerated one by one are bounded before any arithmetic ---------------------------------
@pytest.mark.parametrize('key, value', [('num_hidden_layers', 1e12), ('num_hidden_layers', 10 ** 6),
                                        ('num_hidden_layers', 1001)])
def test_a_layer_count_past_any_model_is_refused_by_its_key(tmp_path, key, value):
    config = json.loads(open(TINY_VL).read())
    config['text_config'][key] = value
    config['text_config'].pop('layer_types', None)
    (tmp_path / 'config.json').write_text(json.dumps(config))
    argv = ['plan', '--model', tmp_path, '--hardware', 'h200x1', '--json']
    rc, out, err = run_cli(*argv)  # the harness fails a run of more than 30 s: the planner never starts counting
    assert_clean(rc, out, err, argv)
    assert rc in (1, 2) and "'text_config.num_hidden_layers' must be a non-negative integer up to 1000" in err, err


def test_a_vision_depth_past_any_model_is_refused(tmp_path):
    config = json.loads(open(TINY_VL).read())
    config['vision_config']['depth'] = 10 ** 9
    (tmp_path / 'config.json').write_text(json.dumps(config))
    rc, _, err = run_cli('plan', '--model', tmp_path, '--hardware', 'h200x1')
    assert rc in (1, 2) and "'vision_config.depth' must be a non-negative integer up to 1000" in err, err


# ---- stdout closed, stdout cut short ------------------------------------------------------------------------------
@pytest.mark.parametrize('argv', COMMANDS, ids=lambda argv: ' '.join(argv[:3]))
def test_every_command_started_with_stdout_closed_fails_in_one_line(workspace, argv):
    (workspace / 'qp.jsonl').write_text(json.dumps({'qid': 1, 'pred_relevant_windows': [[0, 10, 1]]}) + '\n')
    before = sorted(os.listdir(workspace))
    rc, err = run_cli_closed_stdout(*argv)
    assert 'Traceback' not in err and 'internal error' not in err, err
    said = [line for line in err.splitlines() if ': stdout: ' in line]
    assert rc == 2 and len(said) == 1 and said[0].endswith('stdout: closed (the command was started with stdout '
                                                            'closed); the output printed there is lost'), err
    assert sorted(os.listdir(workspace)) == before  # no output written, no temporary file left


def test_plan_with_its_stdout_descriptor_closed(tmp_path):
    """The issue's case as a shell runs it (`plan ... >&-`): descriptor 1 closed, no traceback, exit 2."""
    proc = run_process('plan', '--model', TINY_VL, '--hardware', 'h200x1', cwd=tmp_path, close_stdout=True)
    assert proc.returncode == 2 and 'Traceback' not in proc.stderr, proc.stderr
    assert 'swift-vora plan: stdout: closed' in proc.stderr


@pytest.mark.parametrize('argv', [['recipes', 'show', 'h200x1'], ['switches', '--all'],
                                  ['eval', '--annotations', 'q.jsonl', '--predictions', 'qp.jsonl', '--json']],
                         ids=lambda argv: ' '.join(argv[:2]))
def test_a_stdout_cut_short_by_a_full_file_is_never_exit_0(tmp_path, argv):
    """A file-size limit (what a full disk does to a regular file: the write is cut short, the next one fails): the
    interpreter's own stdout took the short write silently, and `recipes show NAME > file` exited 0 with half a
    recipe."""
    (tmp_path / 'q.jsonl').write_text(json.dumps({'qid': 1, 'vid': 'x', 'duration': 150,
                                                  'relevant_windows': [[0, 10]]}) + '\n')
    (tmp_path / 'qp.jsonl').write_text(''.join(json.dumps({'qid': 1, 'pred_relevant_windows': [[0, 10, 1]]}) + '\n'
                                               for _ in range(1)))
    with open(tmp_path / 'out.txt', 'w') as out:
        proc = run_process(*argv, cwd=tmp_path, stdout=out, file_size_limit=2048)
    assert proc.returncode == 2, proc.stderr
    assert re.search(r': stdout: File too large; the output printed there is incomplete$', proc.stderr.strip()), \
        proc.stderr
    assert os.path.getsize(tmp_path / 'out.txt') <= 2048


# ---- probes: a cgroup file that holds garbage ---------------------------------------------------------------------
@pytest.mark.parametrize('text', ['garbage', '-5', '12 GiB', ''])
def test_a_cgroup_limit_that_cannot_be_read_is_unreadable_not_unlimited(tmp_path, text):
    (tmp_path / 'memory.max').write_text(text)
    rc, out, err = run_cli('doctor', '--no-torch', '--cgroup-root', tmp_path, '--json')
    memory = strict_json(out)['memory']
    assert rc == 0 and memory['status'] == 'unreadable' and memory['limit_bytes'] is None
    assert memory['unreadable'] == [{'file': str(tmp_path / 'memory.max'), 'text': text}]
    assert any('memory.max: unreadable' in w and 'not "no limit"' in w for w in strict_json(out)['warnings'])
    rc, out, _ = run_cli('doctor', '--no-torch', '--cgroup-root', tmp_path)
    assert 'container memory limit: unreadable (cgroup v2' in out
    (tmp_path / 'memory.max').write_text('max\n')
    rc, out, _ = run_cli('doctor', '--no-torch', '--cgroup-root', tmp_path, '--json')
    assert strict_json(out)['memory']['status'] == 'unlimited'


# ---- the smaller slips --------------------------------------------------------------------------------------------
@pytest.mark.parametrize('duration', ['1e-300', '0.05', '5e-324'])
def test_a_clip_too_short_for_two_frames_is_an_invalid_line(workspace, duration):
    (workspace / 'a.jsonl').write_text(f'{{"id": "a", "video": "v.mp4", "duration": {duration}, "windows": []}}\n')
    rc, out, err = run_cli('data', 'build', 'a.jsonl', 'o.jsonl', '--no-probe')
    assert rc == 1 and "a.jsonl:1: field 'duration'" in out and 'shorter than 0.1 s' in out, out + err
    assert not (workspace / 'o.jsonl').exists()  # no sample with no frame


def test_plan_window_out_of_range_is_a_usage_error():
    rc, out, err = run_cli('plan', '--model', TINY_VL, '--hardware', 'h200x1', '--window', '0.5', '--json')
    assert rc == 2 and 'argument --window/--clip-seconds: 0.5 must be >= 1' in err
    assert strict_json(out)['exit_code'] == 2


QVH = {'qid': 1, 'vid': 'x', 'duration': 150, 'relevant_windows': [[0, 10]]}


@pytest.mark.parametrize('row, field', [
    ('{"qid": NaN, "pred_relevant_windows": [[0, 10, 1]]}', "field 'qid': nan is not an id"),
    ('{"qid": Infinity, "pred_relevant_windows": [[0, 10, 1]]}', "field 'qid': inf is not an id"),
    ('{"qid": 1.5e999, "pred_relevant_windows": [[0, 10, 1]]}', "field 'qid': 1.5e999 is not an id"),
    ('{"id": [1], "pred_relevant_windows": [[0, 10, 1]]}', "field 'id': expected a string or an integer id"),
])
def test_a_prediction_id_that_is_no_id_is_an_invalid_line_with_its_number(workspace, row, field):
    (workspace / 'q.jsonl').write_text(json.dumps(QVH) + '\n')
    (workspace / 'p.jsonl').write_text(json.dumps({'qid': 1, 'pred_relevant_windows': [[0, 10, 1]]}) + '\n' + row
                                       + '\n')
    rc, out, err = run_cli('eval', '--annotations', 'q.jsonl', '--predictions', 'p.jsonl', '--json')
    assert rc == 1 and f'p.jsonl:2: {field}' in err, err
    assert strict_json(out)['problems']['invalid_lines'][0]['line'] == 2


def test_an_unknown_id_is_named_with_its_line(workspace):
    (workspace / 'q.jsonl').write_text(json.dumps(QVH) + '\n')
    (workspace / 'p.jsonl').write_text(json.dumps({'qid': 1, 'pred_relevant_windows': [[0, 10, 1]]}) + '\n'
                                       + json.dumps({'qid': 77, 'pred_relevant_windows': [[0, 10, 1]]}) + '\n')
    rc, out, err = run_cli('eval', '--annotations', 'q.jsonl', '--predictions', 'p.jsonl', '--json')
    assert rc == 0 and "(first: p.jsonl:2 id '77')" in err
    assert strict_json(out)['problems']['unknown_lines'] == [{'id': '77', 'line': 2}]


def test_a_huge_integer_annotation_id_is_refused_not_scored_against_nothing(workspace):
    big = '9' * 400  # read as a number too large for a float: shown shortened, so two of them would collide
    (workspace / 'q.jsonl').write_text(json.dumps(QVH).replace('"qid": 1', f'"qid": {big}') + '\n')
    (workspace / 'p.jsonl').write_text(f'{{"qid": {big}, "pred_relevant_windows": [[0, 10, 1]]}}\n')
    rc, out, err = run_cli('eval', '--annotations', 'q.jsonl', '--predictions', 'p.jsonl', '--json')
    assert rc == 1 and 'q.jsonl:1: ' in err and "field 'qid'" in err and 'write a longer one as a string' in err, err
    # as a string it is an id like any other, and scores
    (workspace / 'q.jsonl').write_text(json.dumps({**QVH, 'qid': big}) + '\n')
    (workspace / 'p.jsonl').write_text(json.dumps({'qid': big, 'pred_relevant_windows': [[0, 10, 1]]}) + '\n')
    rc, out, _ = run_cli('eval', '--annotations', 'q.jsonl', '--predictions', 'p.jsonl', '--json')
    assert rc == 0 and strict_json(out)['MR-full-R1@0.5'] == 100.0


@pytest.mark.parametrize('truth, predicted', [(2579, '2579.0'), (2579.0, '2579'), (2579.0, '"2579"')])
def test_integer_and_integral_float_ids_are_one_id(workspace, truth, predicted):
    (workspace / 'q.jsonl').write_text(json.dumps({**QVH, 'qid': truth, 'relevant_clip_ids': [0, 1, 2, 3, 4],
                                                   'saliency_scores': [[4, 4, 4]] * 5}) + '\n')
    (workspace / 'p.jsonl').write_text('{"qid": %s, "pred_relevant_windows": [[0, 10, 1]], '
                                       '"pred_saliency_scores": [1, 1, 1, 1, 1]}\n' % predicted)
    rc, out, _ = run_cli('eval', '--annotations', 'q.jsonl', '--predictions', 'p.jsonl', '--json')
    scores = strict_json(out)
    assert rc == 0 and scores['MR-full-R1@0.5'] == 100.0 and scores['MR-full-mAP'] == 100.0
    assert scores['HL-min-VeryGood-Hit1'] == 100.0  # the annotation's saliency is found under the same id


def test_train_on_a_machine_that_is_not_the_recipes_names_the_missing_dataset_too(tmp_path):
    """The hardware refusal (exit 4) and the dataset that is not there, said at once; the dry run the same."""
    env = {'SWIFT_VORA_PROBE_TORCH': '0', 'PATH': '/usr/bin:/bin'}  # no torch probe, no nvidia-smi: no GPU here
    recipe = os.path.join(REPO, 'recipes', '3060x4.yaml')
    model = os.path.join(CONFIGS, 'qwen3_vl_2b.json')
    for extra in ([], ['--dry-run']):
        proc = run_process('train', recipe, f'model.path={model}', *extra, cwd=tmp_path, env=env,
                           stdout=subprocess.DEVNULL)
        assert proc.returncode == 4, proc.stderr
        assert 'is not this machine' in proc.stderr and 'data.dataset: data/train.jsonl: no such file' in proc.stderr


def test_every_class_has_its_module_and_its_promise_in_docs_errors():
    with open(os.path.join(REPO, 'docs', 'errors.md')) as f:
        errors = f.read()
    for name, module in CLASSES.items():
        assert os.path.isfile(os.path.join(REPO, module)), (name, module)
        assert f'`{module}`' in errors, (name, module)
    assert CPU_TINY  # the harness's recipe exists
