"""Every recipe plans (config.json only), says what the planner says in its header, and dry-runs to a runnable
command; cpu-tiny really trains through `swift-vora train`."""
import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest
from cli_harness import launch_folder

from swift_vora.backends.planning import plan_recipe
from swift_vora.backends.recipe import load_recipe

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPES = os.path.join(REPO, 'recipes')
_spec = importlib.util.spec_from_file_location('recipe_headers', os.path.join(REPO, 'scripts', 'recipe_headers.py'))
headers_script = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(headers_script)
CONFIGS = os.path.join(REPO, 'tests', 'fixtures', 'configs')
# recipe -> config.json standing in for the recipe's model (the backend is the one the recipe writes: the planner's
# search chose it, scripts/recipe_headers.py checks that)
EXPECTED = {
    '3060x4': os.path.join(CONFIGS, 'qwen3_vl_2b.json'),
    '3090x3': 'qwen3_vl_8b',
    'h200x1': os.path.join(CONFIGS, 'qwen3_5_moe_35b_a3b.json'),
    'h200x8': os.path.join(CONFIGS, 'qwen3_5_moe_35b_a3b.json'),
    'h200x8-full': os.path.join(CONFIGS, 'qwen3_5_moe_35b_a3b.json'),
    'cpu-tiny': 'tiny',
}
LAUNCHERS = {'ddp': 'swift sft', 'deepspeed_zero2': 'swift sft', 'deepspeed_zero3': 'swift sft',
             'megatron_ep_lora': 'megatron sft', 'megatron_ep_full': 'megatron sft',
             'unsloth_split_lora': '-m swift_vora.backends.unsloth_runner'}
MEMORY_KNOBS = ('max_frames', 'pair_tokens', 'micro_batch', 'per_device_train_batch_size', 'gradient_checkpointing',
                'lora_rank', 'max_length', 'window', 'offload', 'recompute', 'cross_entropy_fusion_impl')


@pytest.fixture(scope='module')
def qwen3_vl_8b(tmp_path_factory):
    """Qwen3-VL-8B's shape (the 3090x3 recipe's model): text hidden 4096, 36 layers, 32 heads, 8 KV, head_dim 128,
    FFN 12288, untied; vision depth 27, hidden 1152, FFN 4304, out 4096, deepstack [8, 16, 24]."""
    from transformers import Qwen3VLConfig
    config = Qwen3VLConfig(
        text_config=dict(vocab_size=151936, hidden_size=4096, num_hidden_layers=36, num_attention_heads=32,
                         num_key_value_heads=8, head_dim=128, intermediate_size=12288),
        vision_config=dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, out_hidden_size=4096,
                           deepstack_visual_indexes=[8, 16, 24]), tie_word_embeddings=False)
    config.architectures = ['Qwen3VLForConditionalGeneration']
    path = tmp_path_factory.mktemp('qwen3_vl_8b') / 'config.json'
    path.write_text(json.dumps(config.to_dict()))
    return str(path)


@pytest.fixture
def model_for(qwen3_vl_8b, tiny_model_dir):
    def get(name):
        model = EXPECTED[name]
        return {'qwen3_vl_8b': qwen3_vl_8b, 'tiny': tiny_model_dir}.get(model, model)
    return get


def header(name):
    lines = []
    with open(os.path.join(RECIPES, f'{name}.yaml')) as f:
        for line in f:
            if not line.startswith('#'):
                break
            lines.append(line[1:].strip())
    return '\n'.join(lines)


def test_the_recipe_set():
    assert sorted(f[:-5] for f in os.listdir(RECIPES) if f.endswith('.yaml')) == sorted(EXPECTED)


@pytest.mark.parametrize('name', sorted(EXPECTED))
def test_every_recipe_plans_to_its_backend_and_fits(name, model_for):
    recipe = load_recipe(os.path.join(RECIPES, f'{name}.yaml'), [f'model.path={model_for(name)}'])
    plan = plan_recipe(recipe)
    assert plan.verdict == 'fits', plan.reasons
    assert plan.backend == recipe['train.backend']
    assert plan.gpu_peak_gib <= plan.gpu_capacity_gib


@pytest.mark.parametrize('name', sorted(EXPECTED))
def test_header_says_hardware_model_command_prediction_and_first_knob(name):
    text = header(name)
    assert text.splitlines()[0].startswith(f'{name}:'), 'first line: what the recipe is for'
    for part in ('Hardware:', 'Model:', 'Command:', f'swift-vora train recipes/{name}.yaml', 'Plan (', 'Speed:',
                 'Settings:', 'When it does not fit'):
        assert part in text, f'{name}.yaml header lacks {part!r}'
    # in a user's words: no session, call or issue of ours
    for pattern in (r'\bcalls? [a-z]\b', r'#\d', r'\bissue\b', r'\bsession\b', r'\bseed case\b'):
        assert not re.search(pattern, text), f'{name}.yaml header: {re.search(pattern, text).group(0)!r}'


def test_headers_and_settings_are_what_the_planner_writes():
    """Every recipe's header is scripts/recipe_headers.py's, and the settings the planner searches are the ones it
    writes (the fewest estimated hours that fit on the recipe's hardware): regenerate with --write and review."""
    problems = []
    for path in headers_script.recipe_paths():
        problems += headers_script.regenerate(path)[1]
    assert not problems, '\n'.join(problems) + '\n(python scripts/recipe_headers.py --write)'


@pytest.mark.parametrize('name', sorted(EXPECTED))
def test_header_numbers_are_the_dry_runs(name, capsys, tmp_path):
    """The numbers a header states, parsed back, are what `swift-vora train recipes/NAME.yaml --dry-run` plans on a
    fresh clone: peak, capacity, host, tokens a sample, tokens/s and hours."""
    from swift_vora.cli import main
    text = header(name)
    argv = ['train', os.path.join(RECIPES, f'{name}.yaml'), *headers_script._stand_in(
        os.path.join(RECIPES, f'{name}.yaml'), str(tmp_path)), '--dry-run', '--json', '--trust-recipe-hardware']
    code = main(argv)
    done = json.loads(capsys.readouterr().out)
    # planned on a fresh clone: the exit code is the launch's (the model's weights and the data are not here)
    assert code == 0 or (code == 2 and done.get('not_launched')), (code, done.get('not_launched'))
    plan = done['plan']
    planned = re.search(r'Plan \(swift-vora train --dry-run, predicted\): (.*?); ([\d.]+) GiB per GPU of ([\d.]+), '
                        r'host ([\d.]+) GiB; (\d+) tokens a sample', text.replace('\n', ' '))
    assert planned, f'{name}.yaml: no Plan line'
    assert float(planned.group(2)) == plan['gpu_peak_gib'] and float(planned.group(3)) == plan['gpu_capacity_gib']
    assert float(planned.group(4)) == plan['host_peak_gib']
    assert int(planned.group(5)) == plan['tokens']['total_tokens']
    assert f'micro-batch {plan["micro_batch"]}' in planned.group(1) and planned.group(1).startswith(plan['backend'])
    said = re.search(r'Speed: ([\d,]+) tokens/s, ([\d.,]+) h per 10,000 samples', text.replace('\n', ' '))
    if plan['hardware']['gpu_name'] and plan['est_measured']:
        assert said, f'{name}.yaml: no speed'
        assert float(said.group(1).replace(',', '')) == round(plan['est_tokens_per_s'])
        assert float(said.group(2).replace(',', '')) == pytest.approx(10_000 / plan['est_samples_per_s'] / 3600,
                                                                      abs=0.006)
    else:
        assert said is None


@pytest.mark.parametrize('name', sorted(EXPECTED))
def test_every_memory_knob_carries_a_comment(name):
    with open(os.path.join(RECIPES, f'{name}.yaml')) as f:
        for line in f:
            key = line.split(':', 1)[0].strip()
            if key in MEMORY_KNOBS and not line.lstrip().startswith('#'):
                assert '#' in line, f'{name}.yaml: {line.strip()!r} needs a one-line comment'


@pytest.mark.parametrize('name', sorted(EXPECTED))
def test_dry_run_prints_a_runnable_command(name, model_for, tmp_path):
    """Run where the recipe's data is (cli_harness.launch_folder), trusting its hardware: the exit code is the
    plan's."""
    proc = subprocess.run([sys.executable, '-m', 'swift_vora', 'train', os.path.join(RECIPES, f'{name}.yaml'),
                           f'model.path={model_for(name)}', '--dry-run', '--trust-recipe-hardware'],
                          cwd=launch_folder(tmp_path), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert 'launch (exact command)' in out and 'FITS' in out
    backend = load_recipe(os.path.join(RECIPES, f'{name}.yaml'))['train.backend']
    assert LAUNCHERS[backend] in out
    if backend == 'deepspeed_zero3':
        assert '"stage": 3' in out  # the generated JSON is printed


def test_recipes_name_models_by_local_path():
    for name in EXPECTED:
        recipe = load_recipe(os.path.join(RECIPES, f'{name}.yaml'))
        path = recipe['model.path']
        assert '/' in path and not path.startswith(('http:', 'https:', 'hf://')), path


@pytest.mark.slow
def test_cpu_tiny_trains_through_swift_vora_train(cpu_tiny_run):
    """The real launch path: plan -> swift sft (plugin, video_ora template, annotations -> windows, budget env)."""
    assert cpu_tiny_run['rc'] == 0, cpu_tiny_run['log']
    ckpt = cpu_tiny_run['checkpoint']
    assert ckpt and os.path.isfile(os.path.join(ckpt, 'adapter_model.safetensors'))
    out = cpu_tiny_run['output_dir']
    record = json.load(open(os.path.join(out, 'swift-vora-launch', 'launch.json')))
    assert record['backend'] == 'ddp' and record['plan']['verdict'] == 'fits'
    with open(os.path.join(out, 'encode_log.jsonl')) as f:
        encoded = [json.loads(line) for line in f]
    assert encoded and all(r['frames_from_tensors'] <= 8 for r in encoded)  # the recipe's budget reached the template
    with open(os.path.join(ckpt, 'args.json')) as f:
        args = json.load(f)
    assert args['template'] == 'video_ora' and args['custom_register_path'] == ['swift_vora']
    # the fingerprint guard recorded which recipe ran, its hash and the overrides applied over it
    fingerprint = json.load(open(os.path.join(os.path.dirname(ckpt), 'fingerprint.json')))
    recipe = os.path.join(RECIPES, 'cpu-tiny.yaml')
    assert fingerprint['recipe']['path'] == recipe
    assert fingerprint['recipe']['sha256'] == hashlib.sha256(open(recipe, 'rb').read()).hexdigest()
    assert f'train.output_dir={out}' in fingerprint['recipe']['overrides']


def test_a_bare_off_is_the_choice_off_not_yaml_false(tmp_path):
    """YAML 1.1 (PyYAML's safe_load) reads `packing: off` and the override `train.packing=off` as false; the recipe
    takes the user's word ('off'), for the keys whose choices include it."""
    path = tmp_path / 'r.yaml'
    source = open(os.path.join(REPO, 'recipes', 'cpu-tiny.yaml')).read()
    path.write_text(source.replace('train:\n', 'train:\n  packing: off\n  compile: off\n', 1))
    recipe = load_recipe(str(path))
    assert recipe['train.packing'] == 'off' and recipe['train.compile'] == 'off'
    assert load_recipe(str(path), ['train.packing=off'])['train.packing'] == 'off'
    from swift_vora.backends.recipe import RecipeError
    with pytest.raises(RecipeError, match='train.packing'):  # `on` is true to YAML and no choice here
        load_recipe(str(path), ['train.packing=on'])


OVERRIDE = re.compile(r'^[a-z_]+(?:\.[a-z_0-9]+)+=[^\s]+$')


def suggested_overrides(name):
    """Each run of `key=value` words a recipe's header suggests (a line's consecutive words, punctuation around them
    dropped; a value written `...` is the user's to fill, so such a run is left out)."""
    runs = []
    for line in header(name).splitlines():
        run, to_fill = [], False
        for word in line.split() + ['']:
            if '=...' in word:
                to_fill = True
                continue
            word = word.strip('(),;:').rstrip('.')
            if OVERRIDE.match(word):
                run.append(word)
                continue
            if run and not to_fill:
                runs.append(run)
            run, to_fill = [], False
    return runs


# the model a header's advice is for, where it names another than the recipe's (its words say which)
ADVICE_MODEL = {
    ('h200x1', 'train.backend=ddp train.compile=layers'): ['qwen3_vl_2b.json', 'model.type=qwen3_vl'],  # "dense"
    ('cpu-tiny', 'model.path=output/tiny-qwen3-vl'): [],  # the folder its build command writes: the tiny model
    ('cpu-tiny', 'train.backend=unsloth_split_lora'): ['tiny_qwen3_vl_moe.json', 'model.type=qwen3_vl_moe'],  # moe
}


@pytest.mark.parametrize('name', sorted(EXPECTED))
def test_every_override_a_header_suggests_dry_runs_without_a_usage_error(name, model_for, tmp_path, monkeypatch):
    """What a header tells the user to type is taken by `train`: a usage error there (a key another setting of the
    recipe contradicts) would be advice that cannot be followed."""
    from cli_harness import run_cli
    monkeypatch.chdir(launch_folder(tmp_path))
    runs = suggested_overrides(name)
    assert runs or name == 'h200x8-full'  # the parse finds the advice
    for run in runs:
        context = ADVICE_MODEL.get((name, ' '.join(run)))
        model = [f'model.path={model_for(name)}'] if context is None else (
            [f'model.path={os.path.join(CONFIGS, context[0])}', *context[1:]] if context else [])
        if run == ['model.path=output/tiny-qwen3-vl']:
            run = [f'model.path={model_for(name)}']  # built by the test session's fixture elsewhere
        rc, _, err = run_cli('train', os.path.join(RECIPES, f'{name}.yaml'), *model, *run, '--dry-run',
                             '--trust-recipe-hardware')
        assert rc == 0, (run, err[-2000:])
