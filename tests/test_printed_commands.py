"""Every command swift-vora prints can be pasted into a shell: `bash -n` parses it, and the shell's words are the
argv that runs (shlex). A rendezvous value each node fills in (`MASTER_ADDR=${MASTER_ADDR:?...}`) stays an expansion
the shell makes -- in single quotes it would set the literal text."""
import json
import os
import re
import shlex
import subprocess

import pytest

from swift_vora.cli import main

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPES = os.path.join(REPO, 'recipes')
CONFIGS = os.path.join(REPO, 'tests', 'fixtures', 'configs')
MOE = os.path.join(CONFIGS, 'qwen3_5_moe_35b_a3b.json')
DENSE = os.path.join(CONFIGS, 'qwen3_vl_2b.json')


def parses(line: str) -> None:
    done = subprocess.run(['bash', '-n', '-c', line], capture_output=True, text=True, check=False)
    assert done.returncode == 0, (line, done.stderr)


def blocks(text: str, heading: str):
    """The indented lines under each `heading` line of a plan's text."""
    lines = text.split('\n')
    return [lines[i + 1].strip() for i, line in enumerate(lines) if line.startswith(heading) and i + 1 < len(lines)]


PLANS = [
    ['--model', MOE, '--hardware', 'h200x8', '--nodes', '2'],  # two nodes: the rendezvous expansions
    ['--model', MOE, '--hardware', 'h200x1'],
    ['--model', DENSE, '--hardware', '3060x4'],
    ['--model', DENSE, '--hardware', '3090x3', '--tuner', 'full', '--as-given'],  # does not fit: an alternative
]


@pytest.mark.parametrize('argv', PLANS, ids=['two-nodes', 'moe', 'dense', 'alternative'])
def test_plan_prints_commands_a_shell_runs_as_planned(capsys, argv):
    main(['plan', *argv, '--json'])
    plan = json.loads(capsys.readouterr().out)
    main(['plan', *argv])
    text = capsys.readouterr().out
    printed = blocks(text, 'command')
    assert printed or not plan['command']
    for line in printed:
        parses(line)
        assert shlex.split(line) == plan['command']
    for line in blocks(text, 'alternative command'):
        parses(line)
        assert shlex.split(line) == plan['alternative']['command']
    if '--nodes' in argv:
        assert 'MASTER_ADDR="${MASTER_ADDR:?' in printed[0] and "'MASTER_ADDR=" not in printed[0]


@pytest.mark.parametrize('name, overrides', [('3060x4', []), ('h200x1', []), ('h200x8', []), ('3060x4', ['nodes=2']),
                                             ('h200x8', ['nodes=2', 'megatron.global_batch=32'])])
def test_train_dry_run_prints_the_launch_a_shell_runs(capsys, name, overrides):
    main(['train', os.path.join(RECIPES, f'{name}.yaml'), *overrides, '--dry-run', '--json'])
    launch = json.loads(capsys.readouterr().out)['launch']
    main(['train', os.path.join(RECIPES, f'{name}.yaml'), *overrides, '--dry-run'])
    text = capsys.readouterr().out
    block = text.split('launch (exact command)\n', 1)[1].split('\n\n', 1)[0]
    block = block.split('\nnote: ', 1)[0]
    parses(block)
    words = shlex.split(block.replace('\\\n', ' '))
    assert words == [f'{k}={v}' for k, v in sorted(launch['env'].items())] + launch['argv']


def test_the_overrides_train_suggests_paste_as_they_are(capsys, tmp_path):
    """`train` on a recipe that does not fit prints what fits on its hardware as one command line, the recipe's
    path quoted (here with a space in it)."""
    recipe = tmp_path / 'my recipe.yaml'
    recipe.write_text(open(os.path.join(RECIPES, '3060x4.yaml'), encoding='utf-8').read())
    code = main(['train', str(recipe), f'model.path={DENSE}', 'train.tuner_type=full', 'deepspeed.offload=none',
                 '--dry-run'])
    err = capsys.readouterr().err
    assert code == 3
    line = next(x.split('as recipe overrides: ', 1)[1] for x in err.split('\n') if 'as recipe overrides: ' in x)
    parses(line)
    words = shlex.split(line)
    assert words[:3] == ['swift-vora', 'train', str(recipe)] and len(words) > 3
    assert all('=' in w for w in words[3:])


def test_recipe_headers_print_commands_a_shell_parses():
    for fname in sorted(os.listdir(RECIPES)):
        with open(os.path.join(RECIPES, fname), encoding='utf-8') as f:
            header = [line[1:].strip() for line in f if line.startswith('#')]
        for line in header:
            if re.match(r'^(swift-vora |huggingface-cli |NODE_RANK=|\.venv/bin/python |then: swift-vora )', line):
                parses(line[len('then: '):] if line.startswith('then: ') else line)
