"""Every value is checked where it is read first, and a key written twice is an error (issue #60; docs/errors.md).

A guard list with a typo passed `switches`, a recipe's `env:` and `train --dry-run` and failed when the trainer was
built, after the model had loaded; `switches` showed a refused value as if in effect; an `env:` entry with no name or
a list value was accepted; a dry run whose dataset did not exist exited 0; a recipe with a key written twice kept the
second without a word. Each through the real CLI (tests/cli_harness.py).
"""
import glob
import os

import pytest
from cli_harness import CPU_TINY, TINY_VL, assert_clean, launch_folder, run_cli, strict_json

from swift_vora import yaml_reader
from swift_vora.backends.launch import build_launch
from swift_vora.backends.planning import plan_recipe
from swift_vora.backends.recipe import load_recipe

TINY = ['train', CPU_TINY, f'model.path={TINY_VL}']


# ---- the guard list -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize('value, said', [
    ('maybe', "unknown guard 'maybe'"),
    ('nnoe', "unknown guard 'nnoe' (did you mean none?)"),
    ('all,-fingerprnt', "unknown guard '-fingerprnt' (did you mean -fingerprint?)"),
    ('-all', "unknown guard '-all'"),
])
@pytest.mark.parametrize('argv', [['parse', '--text', '[[1, 2]]'],
                                  ['plan', '--model', TINY_VL, '--hardware', 'h200x1', '--json'],
                                  [*TINY, '--dry-run', '--json']], ids=['parse', 'plan', 'train'])
def test_a_guard_list_typo_stops_every_command_before_it_runs(workspace, monkeypatch, value, said, argv):
    monkeypatch.setenv('SWIFT_VORA_GUARDS', value)
    rc, out, err = run_cli(*argv)
    assert_clean(rc, out, err, argv)
    assert rc == 2 and f'SWIFT_VORA_GUARDS={value!r}: {said}' in err, err


def test_a_guard_list_in_a_recipe_is_refused_when_the_recipe_is_read(workspace):
    for key in ('env', 'guards.env'):
        rc, out, err = run_cli(*TINY, f'{key}.SWIFT_VORA_GUARDS=all,-memroy', '--dry-run', '--json')
        assert rc == 2 and f"key '{key}.SWIFT_VORA_GUARDS'" in err and "unknown guard '-memroy'" in err, err
        assert strict_json(out)['exit_code'] == 2
    rc, _, err = run_cli(*TINY, 'env.SWIFT_VORA_GUARDS=all,-memory', 'data.dataset=a.jsonl', '--dry-run')
    assert rc == 0, err  # a list it knows


def test_the_launch_checks_every_switch_its_process_will_read(workspace):
    """The launch's environment on top of this one: a value the training process would refuse after loading the
    model stops `build_launch` (the plugin reads the same table)."""
    recipe = load_recipe(CPU_TINY, [f'model.path={TINY_VL}'])
    with pytest.raises(ValueError, match=r"not launched: SWIFT_VORA_GUARDS='memory,-fingerprnt': unknown guard"):
        build_launch(plan_recipe(recipe), recipe, {'SWIFT_VORA_GUARDS': 'memory,-fingerprnt'})
    assert build_launch(plan_recipe(recipe), recipe, {'SWIFT_VORA_GUARDS': 'memory'}).argv


# ---- switches -----------------------------------------------------------------------------------------------------
def test_switches_marks_a_refused_value_as_not_in_effect(monkeypatch):
    monkeypatch.setenv('SWIFT_VORA_FPS', 'inf')
    monkeypatch.setenv('SWIFT_VORA_GUARDS', 'maybe')
    rc, out, _ = run_cli('switches')
    assert rc == 1
    assert out.startswith('INVALID (2): every other swift-vora command')
    line = next(x for x in out.splitlines() if x.startswith('! SWIFT_VORA_FPS = '))
    assert "'inf'  INVALID, not in effect" in line
    rc, out, _ = run_cli('switches', '--json')
    rows = {r['name']: r for r in strict_json(out)}
    assert rc == 1 and rows['SWIFT_VORA_FPS']['value'] is None and rows['SWIFT_VORA_FPS']['given'] == 'inf'
    assert rows['SWIFT_VORA_FPS']['status'] == 'invalid' and rows['SWIFT_VORA_GUARDS']['status'] == 'invalid'


def test_switches_lists_user_settings_and_the_rest_with_all(monkeypatch):
    monkeypatch.delenv('SWIFT_VORA_BENCH_DIR', raising=False)
    rc, out, _ = run_cli('switches', '--json')
    shown = {r['name'] for r in strict_json(out)}
    rc_all, out_all, _ = run_cli('switches', '--all', '--json')
    every = {r['name']: r for r in strict_json(out_all)}
    assert rc == rc_all == 0
    assert 'SWIFT_VORA_MAX_FRAMES' in shown and 'SWIFT_VORA_GUARDS' in shown
    assert {'SWIFT_VORA_BENCH_DIR', 'SWIFT_VORA_TE_WORK', 'SWIFT_VORA_RECIPE'} <= set(every) - shown
    assert all(every[n]['group'] == 'tool' for n in set(every) - shown)
    _, text, _ = run_cli('switches')
    assert text.rstrip().endswith(f'{len(every) - len(shown)} benchmark, set-up and probe switches not shown: '
                                  'swift-vora switches --all')
    monkeypatch.setenv('SWIFT_VORA_BENCH_DIR', '/tmp/bench')  # set here: shown without --all
    _, out, _ = run_cli('switches', '--json')
    assert 'SWIFT_VORA_BENCH_DIR' in {r['name'] for r in strict_json(out)}


# ---- recipe env entries -------------------------------------------------------------------------------------------
@pytest.mark.parametrize('override, said', [
    ('env={"": 1}', "key 'env': environment name '' is not a variable name"),
    ('env={"A B": 1}', "key 'env': environment name 'A B' is not a variable name"),
    ('env={"1A": 1}', "key 'env': environment name '1A' is not a variable name"),
    ('env.A=[1, 2]', "key 'env.A': A=[1, 2]: an environment value is one string, number or true/false, not a list"),
    ('guards.env.B={x: 1}', "key 'guards.env.B': B={'x': 1}: an environment value is one string"),
    ('env.C="a\\0b"', "key 'env.C': C: the value holds a NUL byte"),
    ('env.NNODES=2', "key 'env.NNODES': NNODES: set by swift-vora train from the recipe"),
])
def test_a_recipe_env_entry_that_no_environment_can_hold_is_refused(workspace, override, said):
    argv = [*TINY, override, '--dry-run', '--json']
    rc, out, err = run_cli(*argv)
    assert_clean(rc, out, err, argv)
    assert rc == 2 and said in err, err


# ---- a dry run exits as the launch would ------------------------------------------------------------------------
def test_a_dry_run_with_a_missing_dataset_exits_as_the_launch_would(workspace):
    rc, out, err = run_cli(*TINY, 'data.dataset=missing.jsonl', '--dry-run', '--json')
    done = strict_json(out)
    assert rc == 2 and done['exit_code'] == 2 and done['plan']['verdict'] == 'fits'  # the plan is still shown
    assert done['not_launched'] == [f'{CPU_TINY}: data.dataset: missing.jsonl: no such file']
    assert 'a launch would stop here (exit 2)' in err
    rc, _, err = run_cli(*TINY, 'data.dataset=missing.jsonl')  # the launch: the same code, the same words
    assert rc == 2 and 'not launched: ' in err and 'missing.jsonl: no such file' in err
    (workspace / 'bad.jsonl').write_text('{"id": "a"}\n')
    rc, out, _ = run_cli(*TINY, 'data.dataset=bad.jsonl', '--dry-run', '--json')
    assert rc == 1 and strict_json(out)['exit_code'] == 1  # every checked line invalid: exit 1, as the launch
    rc, out, err = run_cli(*TINY, 'data.dataset=a.jsonl', '--dry-run', '--json')
    assert rc == 0 and 'not_launched' not in strict_json(out), err


def test_a_switch_the_recipe_decides_set_in_the_shell_stops_the_launch_where_it_would_apply(workspace, monkeypatch):
    monkeypatch.setenv('SWIFT_VORA_STRIDE', '2')  # the plan cuts clips without overlap; the child would overlap them
    rc, out, err = run_cli(*TINY, 'data.dataset=a.jsonl', 'data.stride=null', '--dry-run', '--json')
    assert rc == 2 and strict_json(out)['not_launched'] == [
        "SWIFT_VORA_STRIDE='2' is set in this shell, but the recipe key data.stride decides it (this launch leaves "
        'it at its default) and the launched process would inherit it: unset it, or set data.stride in the '
        'recipe'], err
    rc, out, err = run_cli(*TINY, 'data.dataset=a.jsonl', 'data.stride=2', '--dry-run', '--json')
    assert rc == 0, err  # the recipe sets it: the launch's value replaces the shell's
    monkeypatch.setenv('SWIFT_VORA_STRIDE', '')  # blank is unset
    monkeypatch.setenv('SWIFT_VORA_LOG_FIRST', '5')  # a switch of the recipe's env: the shell may set it
    assert run_cli(*TINY, 'data.dataset=a.jsonl', 'data.stride=null', '--dry-run', '--json')[0] == 0


def test_a_model_folder_without_weights_stops_the_launch_and_its_dry_run(workspace):
    import shutil
    folder = workspace / 'model'
    folder.mkdir()
    shutil.copy(TINY_VL, folder / 'config.json')
    rc, out, err = run_cli('train', CPU_TINY, f'model.path={folder}', 'data.dataset=a.jsonl', '--dry-run', '--json')
    assert rc == 2 and strict_json(out)['not_launched'] == [
        f"{CPU_TINY}: model.path '{folder}' holds config.json but no weights (*.safetensors, *.bin): the launch would "
        'stop when it loads the model; download the weights there, or point model.path at the folder that has them']
    (folder / 'model.safetensors').write_bytes(b'')
    rc, out, err = run_cli('train', CPU_TINY, f'model.path={folder}', 'data.dataset=a.jsonl', '--dry-run', '--json')
    assert rc == 0, err


def test_a_recipes_max_length_below_its_sample_is_planned_as_the_template_cuts_the_sample(workspace):
    rc, out, err = run_cli(*TINY, 'data.dataset=a.jsonl', '--dry-run', '--json')
    full = strict_json(out)['plan']['tokens']
    rc, out, err = run_cli(*TINY, 'data.dataset=a.jsonl', f'data.max_length={full["total_tokens"] - 1}', '--dry-run',
                           '--json')
    cut = strict_json(out)['plan']['tokens']
    assert rc == 0 and cut['total_tokens'] < full['total_tokens'] and cut['frames'] < full['frames'], err
    rc, out, err = run_cli(*TINY, 'data.dataset=a.jsonl', 'data.max_length=10', '--dry-run')
    assert rc == 2 and 'max_length 10 holds no sample' in err


# ---- a key written twice ------------------------------------------------------------------------------------------
@pytest.mark.parametrize('text, said', [
    ('hardware: 3060x4\nmodel: {path: M}\ndata: {dataset: a.jsonl}\nhardware: h200x1\n',
     "r.yaml:4: key 'hardware' written twice (first on line 1)"),
    ('model: {path: M}\nvideo:\n  max_frames: 8\ndata: {dataset: a.jsonl}\nvideo:\n  fps: 1\n',
     "r.yaml:5: key 'video' written twice (first on line 2)"),
    ('model: {path: M}\ndata: {dataset: a.jsonl}\nvideo:\n  max_frames: 8\n  fps: 1\n  max_frames: 16\n',
     "r.yaml:6: key 'video.max_frames' written twice (first on line 4)"),
    ('model: {path: M}\ndata: {dataset: a.jsonl}\nenv:\n  A: 1\n  B: 2\n  A: 3\n',
     "r.yaml:6: key 'env.A' written twice (first on line 4)"),
    ('model: {path: M}\ndata: {dataset: a.jsonl}\nswift_args: {a: 1, b: 2, a: 3}\n',
     "r.yaml:3: key 'swift_args.a' written twice (first on line 3)"),
])
def test_a_key_written_twice_names_the_file_the_line_and_the_key(workspace, text, said):
    (workspace / 'r.yaml').write_text(text.replace('M', TINY_VL))
    rc, out, err = run_cli('train', 'r.yaml', '--dry-run', '--json')
    assert_clean(rc, out, err, ['--json'])
    assert rc == 2 and said in err and 'YAML would keep only the second' in err, err


@pytest.mark.parametrize('text, overrides, said', [
    ('model: {path: M}\ndata: {dataset: a.jsonl}\ntrain:\n  lr: 1e-4\n  learnin_rate: 3\n', [],
     "r.yaml:5: unknown key 'train.learnin_rate' (did you mean 'train.learning_rate'?)"),
    ('model: {path: M}\ndata: {dataset: a.jsonl}\ntrain:\n  learning_rate: fast\n', [],  # by ms-swift's name
     "r.yaml:4: key 'train.lr' must be an integer or a number or null, got 'fast'"),
    ('model: {path: M}\ndata: {dataset: a.jsonl}\ntrain:\n  learning_rate: fast\n', ['train.seed=1'],
     "r.yaml:4: key 'train.lr' must be an integer or a number or null"),  # the key is the file's, not the override's
    ('model: {path: M}\ndata: {dataset: a.jsonl}\ntrain:\n  learning_rate: 1e-4\n', ['train.lr=fast'],
     "r.yaml (with overrides): key 'train.lr' must be an integer or a number or null, got 'fast'"),
    ('model: {path: M}\ndata: {dataset: a.jsonl}\nswift_args:\n  seed: 1\n', [],
     "r.yaml:4: swift_args.seed: set 'train.seed' instead"),
])
def test_a_recipe_key_that_is_wrong_names_the_file_and_its_line(workspace, text, overrides, said):
    (workspace / 'r.yaml').write_text(text.replace('M', TINY_VL))
    rc, out, err = run_cli('train', 'r.yaml', *overrides, '--dry-run', '--json')
    assert_clean(rc, out, err, ['--json'])
    assert rc == 2 and said in err, err


def test_an_override_with_a_key_twice_and_a_merge_key_that_is_overridden(workspace):
    rc, _, err = run_cli(*TINY, 'env={A: 1, A: 2}', '--dry-run')
    assert rc == 2 and "override 'env={A: 1, A: 2}': key 'A' written twice" in err, err
    # `<<: *base` merges defaults that the mapping's own keys override: what a merge means, not a key written twice
    doc = yaml_reader.load('base: &b {A: "1", B: "2"}\nenv:\n  <<: *b\n  A: "3"\n')
    assert doc['env'] == {'A': '3', 'B': '2'}
    # one key however YAML spells it: 1 and 0x1 are one integer, yes and true one boolean
    for text in ('m: {1: a, 0x1: b}\n', 'm: {yes: a, true: b}\n'):
        with pytest.raises(yaml_reader.duplicate_keys_error(), match="key 'm.(0x1|true)' written twice"):
            yaml_reader.load(text)


def test_every_shipped_recipe_reads_without_a_key_twice():
    for path in glob.glob(os.path.join(os.path.dirname(CPU_TINY), '*.yaml')):
        with open(path) as f:
            yaml_reader.load(f.read())  # raises on a key written twice


def test_the_launch_folder_holds_the_data_the_shipped_recipes_name(tmp_path, monkeypatch):
    """tests/cli_harness.py's launch folder, where tests run `train` on a shipped recipe: its dataset check passes."""
    from swift_vora.cli.train import dataset_problems
    monkeypatch.chdir(launch_folder(tmp_path))
    recipe = load_recipe(os.path.join(os.path.dirname(CPU_TINY), '3060x4.yaml'))
    assert dataset_problems(recipe) == ([], 0)
