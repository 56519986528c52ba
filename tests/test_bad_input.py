"""Bad input never loses data, never hangs, never prints a traceback (issue #19; docs/errors.md).

The CLI is driven in-process through `swift_vora.cli.main`, the function the `swift-vora` console script
calls, with the classes of bad input a careless user produces: outputs that alias inputs or are not
regular files, non-finite or absurd numbers, ground truth `data check` rejects, malformed files, paths
that do not exist. Each run must end with a contract exit code (0-4), one-line messages and untouched
inputs; with `--json`, stdout is one strict JSON document. The harness is tests/cli_harness.py.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_harness import CONTRACT_CODES, CPU_TINY, REPO, TINY_VL, assert_clean, digest, run_cli, write_inputs
from cli_harness import strict_json as _strict_json
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swift_vora.errors import OutputPathError
from swift_vora.outputs import atomic_text_writer, check_output_dir, check_output_file


# ---- data loss ------------------------------------------------------------------------------------------
def _aliases(root: Path, target: Path):
    link = root / 'link.jsonl'
    if not link.exists():
        link.symlink_to(target)
    hard = root / 'hard.jsonl'
    if not hard.exists():
        os.link(target, hard)
    return [target.name, f'./{target.name}', str(target), str(root / '.' / target.name), str(link), str(hard)]


@pytest.mark.parametrize('command', [['data', 'build', '--no-probe'], ['data', 'convert-qvhighlights']])
def test_an_output_never_overwrites_its_input(workspace, command):
    ann = workspace / 'a.jsonl'
    before = digest([ann])
    for spelling in _aliases(workspace, ann):
        argv = [*command[:2], str(ann), spelling, *command[2:]]
        rc, out, err = run_cli(*argv)
        assert rc == 2 and 'is the input' in err, (spelling, err)
        assert digest([ann]) == before


def test_data_build_never_replaces_a_video_a_device_a_symlink_or_a_directory(workspace):
    ann = workspace / 'a.jsonl'
    (workspace / 'elsewhere.jsonl').write_text('keep me\n')
    (workspace / 'out-link.jsonl').symlink_to(workspace / 'elsewhere.jsonl')
    protected = [workspace / 'v.mp4', workspace / 'elsewhere.jsonl', ann]
    before = digest(protected)
    for target in ['v.mp4', os.devnull, 'out-link.jsonl', str(workspace)]:
        rc, _, err = run_cli('data', 'build', ann, target, '--no-probe')
        assert rc == 2, (target, err)
    assert digest(protected) == before
    assert os.path.islink(workspace / 'out-link.jsonl')
    assert not [p for p in os.listdir(workspace) if p.endswith('.tmp')]


def test_eval_never_writes_predictions_over_the_annotations(workspace):
    ann = workspace / 'a.jsonl'
    before = digest([ann])
    model = workspace / 'model'
    model.mkdir()
    (model / 'config.json').write_text('{}')  # the alias check comes before anything is loaded
    rc, out, err = run_cli('eval', '--annotations', ann, '--predictions', './a.jsonl', '--model', model, '--json')
    assert rc == 2 and 'is the input' in err and _strict_json(out)['exit_code'] == 2
    rc, _, err = run_cli('eval', '--annotations', ann, '--predictions', 'p.jsonl', '--out-dir', 'a.jsonl')
    assert rc == 2 and 'is the input' in err
    rc, _, err = run_cli('eval', '--annotations', ann, '--predictions', 'p.jsonl', '--out-dir', 'v.mp4')
    assert rc == 2 and 'not a directory' in err
    assert digest([ann]) == before


def test_output_helper_rules(tmp_path):
    src = tmp_path / 'in.jsonl'
    src.write_text('x\n')
    with pytest.raises(OutputPathError, match='is the input'):
        check_output_file(str(tmp_path / 'sub' / '..' / 'in.jsonl'), [str(src)])
    with pytest.raises(OutputPathError, match='not a regular file'):
        check_output_file(os.devnull)
    with pytest.raises(OutputPathError, match='not a directory'):
        check_output_file(str(src / 'below-a-file.jsonl'))
    with pytest.raises(OutputPathError, match='not a directory'):
        check_output_dir(str(src))
    # atomic: a failure while writing leaves the old content and no temporary file
    out = tmp_path / 'out.jsonl'
    out.write_text('old\n')
    with pytest.raises(RuntimeError):
        with atomic_text_writer(str(out)) as handle:
            handle.write('half')
            raise RuntimeError('disk full')
    assert out.read_text() == 'old\n' and sorted(os.listdir(tmp_path)) == ['in.jsonl', 'out.jsonl']


# ---- hangs and unbounded memory ---------------------------------------------------------------------------
@pytest.mark.parametrize('flag, value', [('--window', 'nan'), ('--stride', 'nan'), ('--window', '1e-9'),
                                         ('--stride', '1e-9'), ('--window', 'inf'), ('--min-event', 'nan'),
                                         ('--min-window', '-1')])
def test_data_build_numbers_are_finite_and_in_range(workspace, flag, value):
    rc, _, err = run_cli('data', 'build', 'a.jsonl', 'o.jsonl', '--no-probe', flag, value)
    assert rc == 2 and f'argument {flag}' in err
    assert not (workspace / 'o.jsonl').exists()


def test_a_declared_duration_does_not_size_arrays(workspace):
    huge = {'qid': 7, 'vid': 'x', 'duration': 1e9, 'relevant_windows': [[0, 2]], 'relevant_clip_ids': [0],
            'saliency_scores': [[1, 2, 3]]}
    (workspace / 'huge.jsonl').write_text(json.dumps(huge) + '\n')
    (workspace / 'hp.jsonl').write_text(json.dumps({'qid': 7, 'pred_relevant_windows': [[0, 2, 1]],
                                                    'pred_saliency_scores': [1, 2]}) + '\n')
    rc, out, err = run_cli('eval', '--annotations', 'huge.jsonl', '--predictions', 'hp.jsonl', '--json')
    assert rc == 1 and "huge.jsonl:1: field 'duration'" in err
    # a prediction placed a billion seconds into a 150 s video is an invalid line, not a giant array
    (workspace / 'far.jsonl').write_text(json.dumps({'qid': 1, 'pred_saliency_scores': [1], 'clip_start': 1e9,
                                                     'pred_relevant_windows': [[0, 1]]}) + '\n')
    rc, out, err = run_cli('eval', '--annotations', 'q.jsonl', '--predictions', 'far.jsonl', '--json')
    assert rc == 1 and _strict_json(out)['invalid_prediction_lines'] == 1


# ---- wrong results, silently ------------------------------------------------------------------------------
@pytest.mark.parametrize('windows, message', [([[10, 5]], 'start 10.0 >= end 5.0'), ([[-1, 5]], 'negative'),
                                              ([[0, 'x']], 'not a number')])
def test_eval_rejects_ground_truth_that_data_check_rejects(workspace, windows, message):
    (workspace / 'gt.jsonl').write_text(json.dumps({'id': 'a', 'windows': windows, 'duration': 30}) + '\n')
    rc, _, err = run_cli('eval', '--annotations', 'gt.jsonl', '--predictions', 'p.jsonl')
    assert rc == 1 and "gt.jsonl:1: field 'windows'[0]" in err and message in err


def test_a_parse_failure_is_never_a_correct_empty_answer(workspace):
    (workspace / 'empty.jsonl').write_text(''.join(json.dumps({'id': k, 'windows': [], 'duration': 30}) + '\n'
                                                   for k in 'ab'))
    (workspace / 'junk.jsonl').write_text(''.join(json.dumps({'id': k, 'response': 'no idea'}) + '\n'
                                                  for k in 'ab'))
    rc, out, _ = run_cli('eval', '--annotations', 'empty.jsonl', '--predictions', 'junk.jsonl', '--json')
    m = _strict_json(out)
    assert rc == 0 and m['parse_failures'] == 2
    assert m['kept-precision'] == m['kept-recall'] == m['kept-IoU'] == m['mIoU'] == 0.0
    # one correct empty answer and one failure: half
    (workspace / 'half.jsonl').write_text(json.dumps({'id': 'a', 'response': '[]'}) + '\n'
                                          + json.dumps({'id': 'b', 'response': 'no idea'}) + '\n')
    m = _strict_json(run_cli('eval', '--annotations', 'empty.jsonl', '--predictions', 'half.jsonl', '--json')[1])
    assert m['kept-precision'] == m['kept-recall'] == 50.0


@pytest.mark.parametrize('value', ['nan', '0', '-5', 'inf'])
def test_parse_duration_is_finite_and_positive(value):
    rc, out, err = run_cli('parse', '--duration', value, '--text', '[[1, 2]]')
    assert rc == 2 and 'argument --duration' in err and out == ''


def test_plan_and_train_agree_on_megatron_full_training(tmp_path):
    rc, out, _ = run_cli('plan', '--model', TINY_VL, '--hardware', 'h200x1', '--tuner', 'full',
                         '--backend', 'megatron_ep_lora', '--json')
    plan = _strict_json(out)
    assert rc == 4 and plan['verdict'] == 'refused' and plan['command'] == []
    rc_train, out, _ = run_cli('train', CPU_TINY, f'model.path={TINY_VL}', 'train.tuner=full',
                               'train.backend=megatron_ep_lora', 'hardware=h200x1', 'gpus=null', 'gpu_mem_gib=null',
                               '--dry-run', '--json')
    assert rc_train == rc and _strict_json(out)['plan']['verdict'] == 'refused'


# ---- tracebacks -------------------------------------------------------------------------------------------
@pytest.mark.parametrize('content', [bytes(range(256)) * 4, b'a: ' + b'[' * 20000 + b']' * 20000 + b'\n',
                                     b'{{{{{{{{', b'- a\n- b\n'])
def test_recipes_that_are_not_recipes(tmp_path, content):
    recipe = tmp_path / 'r.yaml'
    recipe.write_bytes(content)
    rc, out, err = run_cli('train', recipe, '--dry-run', '--json')
    assert rc == 2 and str(recipe) in err
    assert _strict_json(out)['exit_code'] == 2


@pytest.mark.parametrize('override', ['video.fps=.inf', 'video.fps=.nan', 'video.fps=-1', 'train.lora_rank=0',
                                      'data.window=1e-9', 'train.lr=.nan', 'video.max_frames=1000000000000',
                                      'video.fps=' + '[' * 5000])
def test_recipe_values_are_finite_and_in_range(override):
    rc, _, err = run_cli('train', CPU_TINY, f'model.path={TINY_VL}', override, '--dry-run')
    assert rc == 2 and ('video.' in err or 'train.' in err or 'data.' in err), err


@pytest.mark.parametrize('fields', [{'relevant_clip_ids': [0, 1], 'saliency_scores': [[1, 2]]},
                                    {'relevant_clip_ids': [999], 'saliency_scores': [[1, 2, 3]]},
                                    {'relevant_clip_ids': 'x', 'saliency_scores': [[1, 2, 3]]},
                                    {'relevant_clip_ids': [0], 'saliency_scores': 5},
                                    {'relevant_clip_ids': [True], 'saliency_scores': [[1, 2, 3]]}])
def test_malformed_saliency_fields_name_the_line_and_field(workspace, fields):
    row = {'qid': 1, 'vid': 'x', 'duration': 150, 'relevant_windows': [[0, 10]], **fields}
    (workspace / 'bad.jsonl').write_text(json.dumps(row) + '\n')
    (workspace / 'sp.jsonl').write_text(json.dumps({'qid': 1, 'pred_relevant_windows': [[0, 2]],
                                                    'pred_saliency_scores': [1, 2, 3]}) + '\n')
    rc, _, err = run_cli('eval', '--annotations', 'bad.jsonl', '--predictions', 'sp.jsonl')
    assert rc == 1 and 'bad.jsonl:1: field ' in err and ('relevant_clip_ids' in err or 'saliency_scores' in err)
    # the data tools apply the same rule (eval and data never disagree on a line)
    rc, out, _ = run_cli('data', 'convert-qvhighlights', 'bad.jsonl', 'o.jsonl', '--json')
    reason = _strict_json(out)['rejected'][0]['reason']
    assert rc == 1 and ('relevant_clip_ids' in reason or 'saliency_scores' in reason)


def test_merge_target_that_cannot_be_written_is_one_line(tmp_path):
    from swift_vora.backends.merge import MergeError, merge
    blocker = tmp_path / 'file'
    blocker.write_text('x')
    with pytest.raises(MergeError, match='not a directory') as err:
        merge(str(tmp_path), str(blocker / 'merged'))
    assert err.value.exit_code == 2


@pytest.mark.parametrize('argv, stdin', [
    (['parse'], ''.join('"[[1, 2]]"\n' for _ in range(50000))),
    (['data', 'check', 'many.jsonl', '--no-probe'], None),
    (['plan', '--model', TINY_VL, '--hardware', 'h200x1'], None),
    (['doctor', '--no-torch'], None),
])
def test_a_closed_pipe_ends_quietly(tmp_path, argv, stdin):
    (tmp_path / 'v.mp4').write_bytes(b'x')
    (tmp_path / 'many.jsonl').write_text(''.join(
        json.dumps({'id': str(i), 'video': 'v.mp4', 'duration': 5, 'windows': [[1, 9]]}) + '\n' for i in range(3000)))
    feed = tmp_path / 'stdin.txt'
    feed.write_text(stdin or '')
    env = {**os.environ, 'PYTHONPATH': str(REPO)}
    with open(feed, 'rb') as stdin_file:
        proc = subprocess.Popen([sys.executable, '-m', 'swift_vora', *argv], cwd=tmp_path, env=env, stdin=stdin_file,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        proc.stdout.read(1)  # `| head -c 1`: read a little, then hang up
        proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) in CONTRACT_CODES
    assert 'Traceback' not in err and 'BrokenPipeError' not in err


# ---- pre-flight -------------------------------------------------------------------------------------------
def test_train_checks_the_dataset_before_launching(workspace):
    rc, out, err = run_cli('train', CPU_TINY, f'model.path={TINY_VL}', 'data.dataset=missing/train.jsonl', '--json')
    assert rc == 2 and 'missing/train.jsonl: no such file' in err and _strict_json(out)['exit_code'] == 2
    (workspace / 'bad.jsonl').write_text(json.dumps({'id': 'a', 'video': 'gone.mp4', 'windows': [[0, 1]]}) + '\n')
    rc, _, err = run_cli('train', CPU_TINY, f'model.path={TINY_VL}', f'data.dataset={workspace / "bad.jsonl"}')
    assert rc == 1 and "bad.jsonl:1: field 'video'" in err and 'not launched' in err
    assert not (workspace / 'output').exists()


@pytest.mark.parametrize('flag', ['--model', '--adapters'])
def test_eval_with_a_missing_model_creates_nothing(workspace, flag):
    before = sorted(os.listdir(workspace))
    rc, _, err = run_cli('eval', '--annotations', 'a.jsonl', flag, str(workspace / 'typo' / 'ckpt'))
    assert rc == 2 and 'not a directory' in err
    (workspace / 'empty-dir').mkdir()  # a directory that is no model or checkpoint either
    rc, _, err = run_cli('eval', '--annotations', 'a.jsonl', flag, 'empty-dir')
    assert rc == 2 and 'config.json in it' in err
    assert sorted(os.listdir(workspace)) == sorted(before + ['empty-dir'])


# ---- machine-readable output ------------------------------------------------------------------------------
@pytest.mark.parametrize('argv', [
    ['data', 'check', 'absent.jsonl', '--json'],
    ['data', 'build', 'a.jsonl', 'a.jsonl', '--no-probe', '--json'],
    ['data', 'build', 'a.jsonl', 'o.jsonl', '--window', 'nan', '--json'],
    ['eval', '--annotations', 'a.jsonl', '--json'],
    ['plan', '--model', 'absent/config.json', '--json'],
    ['plan', '--model', TINY_VL, '--gpus', '0', '--json'],
    ['verify-adapter', 'absent', '--json'],
    ['no-such-command', '--json'],
])
def test_json_errors_are_one_object(workspace, argv):
    rc, out, err = run_cli(*argv)
    payload = _strict_json(out)
    assert rc == payload['exit_code'] and rc in (1, 2) and payload['error'] and payload['error'] in err


# ---- the property: any bad value, any command ----------------------------------------------------------------
BAD_TEXT = st.sampled_from(['nan', 'NaN', 'inf', '-inf', '1e309', '-1e309', '0', '-0', '-1', '1e-9', '1e9', '1e300',
                            '', ' ', 'x', '0x10', '1_000', '--json', '2', '0.5', '60', '\x00', 'é', '[]', '{}'])
BAD_NUMBER_TEXT = st.one_of(BAD_TEXT, st.floats(allow_nan=True, allow_infinity=True).map(repr),
                            st.integers(-10 ** 20, 10 ** 20).map(str))
FLAG_COMMANDS = [
    ['data', 'build', 'a.jsonl', 'o.jsonl', '--no-probe', '--json', '--window'],
    ['data', 'build', 'a.jsonl', 'o.jsonl', '--no-probe', '--json', '--stride'],
    ['data', 'build', 'a.jsonl', 'o.jsonl', '--no-probe', '--json', '--min-event'],
    ['data', 'build', 'a.jsonl', 'o.jsonl', '--no-probe', '--json', '--min-window'],
    ['parse', '--text', '[[1, 2]]', '--duration'],
    ['eval', '--annotations', 'a.jsonl', '--predictions', 'p.jsonl', '--json', '--max-plots'],
    ['eval', '--annotations', 'q.jsonl', '--predictions', 'p.jsonl', '--json', '--max-new-tokens'],
    ['plan', '--model', TINY_VL, '--hardware', 'h200x1', '--json', '--fps'],
    ['plan', '--model', TINY_VL, '--hardware', 'h200x1', '--json', '--max-frames'],
    ['plan', '--model', TINY_VL, '--hardware', 'h200x1', '--json', '--lora-rank'],
    ['plan', '--model', TINY_VL, '--hardware', 'h200x1', '--json', '--micro-batch'],
    ['plan', '--model', TINY_VL, '--gpu-mem-gib', '80', '--json', '--gpus'],
    ['plan', '--model', TINY_VL, '--gpus', '2', '--json', '--gpu-mem-gib'],
    ['plan', '--model', TINY_VL, '--hardware', 'h200x1', '--json', '--host-ram-gib'],
    ['plan', '--model', TINY_VL, '--hardware', 'h200x1', '--json', '--clip-seconds'],
]
RECIPE_KEYS = ['video.fps', 'video.max_frames', 'video.pair_tokens', 'data.window', 'data.stride', 'train.lora_rank',
               'train.micro_batch', 'train.lr', 'gpus', 'gpu_mem_gib', 'host_ram_gib', 'nodes', 'megatron.ep']
ANNOTATION_FIELDS = ['duration', 'start', 'end', 'id', 'windows']
PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _inputs(root: Path):
    return [p for p in root.iterdir() if p.is_file() and p.name != 'o.jsonl']


@PROPERTY
@given(command=st.sampled_from(FLAG_COMMANDS), value=BAD_NUMBER_TEXT)
def test_property_any_flag_value(workspace, command, value):
    write_inputs(workspace)
    before = digest(_inputs(workspace))
    argv = [*command, value]
    assert_clean(*run_cli(*argv), argv)
    assert digest(_inputs(workspace)) == before


@PROPERTY
@given(key=st.sampled_from(RECIPE_KEYS), value=BAD_TEXT)
def test_property_any_recipe_value(workspace, key, value):
    write_inputs(workspace)
    before = digest(_inputs(workspace))
    argv = ['train', CPU_TINY, f'model.path={TINY_VL}', f'{key}={value}', '--dry-run', '--json']
    assert_clean(*run_cli(*argv), argv)
    assert digest(_inputs(workspace)) == before


JSON_VALUES = st.one_of(st.none(), st.booleans(), st.floats(allow_nan=True, allow_infinity=True),
                        st.integers(-10 ** 30, 10 ** 30), st.text(max_size=8),
                        st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=3))


@PROPERTY
@given(field=st.sampled_from(ANNOTATION_FIELDS), value=JSON_VALUES, qvh=st.booleans(),
       command=st.sampled_from(['check', 'build', 'convert', 'eval']))
def test_property_any_annotation_field(workspace, field, value, qvh, command):
    write_inputs(workspace)
    row = {'id': 'a', 'video': 'v.mp4', 'duration': 30, 'windows': [[1, 9]]}
    if field in ('start', 'end'):
        row['windows'] = [[value, 9] if field == 'start' else [1, value]]
    else:
        row[field] = value
    if qvh:
        row = {'qid': row['id'], 'vid': 'v', 'duration': row['duration'], 'relevant_windows': row['windows'],
               'relevant_clip_ids': [0], 'saliency_scores': [[1, 2, value if field == 'id' else 3]]}
    (workspace / 'bad.jsonl').write_text(json.dumps(row) + '\n')  # NaN/Infinity tokens on purpose
    before = digest(_inputs(workspace))
    argv = {'check': ['data', 'check', 'bad.jsonl', '--no-probe', '--json'],
            'build': ['data', 'build', 'bad.jsonl', 'o.jsonl', '--no-probe', '--json'],
            'convert': ['data', 'convert-qvhighlights', 'bad.jsonl', 'o.jsonl', '--json'],
            'eval': ['eval', '--annotations', 'bad.jsonl', '--predictions', 'p.jsonl', '--json']}[command]
    assert_clean(*run_cli(*argv), argv)
    assert digest(_inputs(workspace)) == before


@PROPERTY
@given(out=st.sampled_from(['a.jsonl', './a.jsonl', 'p.jsonl', 'v.mp4', '.', '..', os.devnull, '/', 'q.jsonl',
                            'a.jsonl/x', 'new/o.jsonl', '']),
       command=st.sampled_from(['build', 'convert']))
def test_property_any_output_path(workspace, out, command):
    write_inputs(workspace)
    before = digest([workspace / name for name in (('a.jsonl', 'v.mp4') if command == 'build' else ('q.jsonl',))])
    argv = (['data', 'build', 'a.jsonl', out, '--no-probe', '--json'] if command == 'build'
            else ['data', 'convert-qvhighlights', 'q.jsonl', out, '--json'])
    rc, stdout, err = run_cli(*argv)
    assert_clean(rc, stdout, err, argv)
    after = digest([p for p in before])
    assert after == before, (argv, err)
