"""Shipped recipes: found by name from any directory, listed and copied out by `swift-vora recipes`, carried in
the wheel; `key=value` overrides are accepted after the flags too."""
import json
import os
import subprocess
import sys

import tomllib
from cli_harness import launch_folder

from swift_vora.recipe_catalog import recipes_dir, resolve_recipe, shipped_recipes

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MOE_35B = os.path.join(REPO, 'tests', 'fixtures', 'configs', 'qwen3_5_moe_35b_a3b.json')
CONTRACT_RECIPES = ('3060x4', '3090x3', 'h200x1', 'h200x8')


def swift_vora(*args, cwd):
    env = {**os.environ, 'PYTHONPATH': os.pathsep.join([REPO, os.environ.get('PYTHONPATH', '')])}
    proc = subprocess.run([sys.executable, '-m', 'swift_vora', *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env=env)
    return proc.returncode, proc.stdout, proc.stderr


def test_the_contract_recipes_are_shipped_and_resolve_by_name_or_documented_path(tmp_path, monkeypatch):
    assert set(CONTRACT_RECIPES) <= set(shipped_recipes())
    monkeypatch.chdir(tmp_path)  # outside the checkout: `recipes/3060x4.yaml` does not exist here
    for name in CONTRACT_RECIPES:
        expected = shipped_recipes()[name]
        assert resolve_recipe(name) == resolve_recipe(f'{name}.yaml') == resolve_recipe(f'recipes/{name}.yaml') \
            == expected
    (tmp_path / 'h200x1.yaml').write_text('model: {path: x}\n')
    assert resolve_recipe('h200x1.yaml') == 'h200x1.yaml'  # a file the user has wins over the shipped one


def test_the_wheel_carries_the_recipes_where_the_catalog_looks():
    with open(os.path.join(REPO, 'pyproject.toml'), 'rb') as f:
        force = tomllib.load(f)['tool']['hatch']['build']['targets']['wheel']['force-include']
    assert force.get('recipes') == 'swift_vora/recipes'
    import swift_vora
    package = os.path.dirname(os.path.abspath(swift_vora.__file__))
    # installed from the wheel: inside the package; from a checkout (editable): the repository's recipes/
    assert recipes_dir() in (os.path.join(package, 'recipes'), os.path.join(os.path.dirname(package), 'recipes'))


def test_recipes_lists_shows_and_copies_without_overwriting(tmp_path):
    rc, out, err = swift_vora('recipes', cwd=tmp_path)
    assert rc == 0, err
    for name in CONTRACT_RECIPES:
        assert any(line.startswith(name) for line in out.splitlines()), out
    rc, out, _ = swift_vora('recipes', 'ls', '--json', cwd=tmp_path)
    listed = json.loads(out)
    assert listed['h200x1']['hardware'].startswith('1 x H200') and os.path.isfile(listed['h200x1']['path'])
    rc, out, _ = swift_vora('recipes', 'show', 'h200x1', cwd=tmp_path)
    assert rc == 0 and out == open(shipped_recipes()['h200x1']).read()
    rc, out, err = swift_vora('recipes', 'cp', '3060x4', cwd=tmp_path)
    assert rc == 0, err
    assert (tmp_path / '3060x4.yaml').read_text() == open(shipped_recipes()['3060x4']).read()
    (tmp_path / '3060x4.yaml').write_text('# mine\n')
    rc, _, err = swift_vora('recipes', 'cp', '3060x4', cwd=tmp_path)
    assert rc == 2 and 'not overwritten' in err and (tmp_path / '3060x4.yaml').read_text() == '# mine\n'
    rc, _, err = swift_vora('recipes', 'cp', 'h200x9', 'x.yaml', cwd=tmp_path)
    assert rc == 2 and 'h200x1' in err and not (tmp_path / 'x.yaml').exists()


def test_train_takes_a_shipped_name_from_any_directory_with_overrides_after_the_flags(tmp_path):
    rc, out, err = swift_vora('train', 'h200x1', '--dry-run', '--json', '--trust-recipe-hardware',
                              f'model.path={MOE_35B}', 'video.max_frames=4', cwd=launch_folder(tmp_path))
    assert rc == 0, err
    launch = json.loads(out)['launch']
    assert launch['env']['SWIFT_VORA_MAX_FRAMES'] == '4'
    assert launch['env']['SWIFT_VORA_RECIPE'] == shipped_recipes()['h200x1']
    rc, _, err = swift_vora('train', 'h200x1', '--dry-run', '--no-such-flag', cwd=tmp_path)
    assert rc == 2 and '--no-such-flag' in err
    rc, _, err = swift_vora('train', 'no-such-recipe', '--dry-run', cwd=tmp_path)
    assert rc == 2 and 'no-such-recipe' in err and 'h200x1' in err
