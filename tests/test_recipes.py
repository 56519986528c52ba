"""Every recipe plans (config.json only), says what the planner says in its header, and dry-runs to a runnable
command; cpu-tiny really trains through `swift-vora train`."""
import hashlib
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
CONFIGS = os.path.join(REPO, 'tests', 'fixtures', 'configs')
# recipe -> (config.json standing in for the recipe's model, the backend the planner must pick)
EXPECTED = {
    '3060x4': (os.path.join(CONFIGS, 'qwen3_vl_2b.json'), 'deepspeed_zero3'),
    '3090x3': ('qwen3_vl_8b', 'deepspeed_zero3'),
    'h200x1': (os.path.join(CONFIGS, 'qwen3_5_moe_35b_a3b.json'), 'unsloth_split_lora'),
    'h200x8': (os.path.join(CONFIGS, 'qwen3_5_moe_35b_a3b.json'), 'megatron_ep_lora'),
    'h200x8-full': (os.path.join(CONFIGS, 'qwen3_5_moe_35b_a3b.json'), 'megatron_ep_full'),
    'cpu-tiny': ('tiny', 'ddp'),
}
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
        model = EXPECTED[name][0]
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
    assert plan.backend == EXPECTED[name][1]
    assert plan.gpu_peak_gib <= plan.gpu_capacity_gib


@pytest.mark.parametrize('name', sorted(EXPECTED))
def test_header_says_hardware_model_command_prediction_and_first_knob(name, model_for):
    text = header(name)
    assert text.splitlines()[0].startswith(f'{name}:'), 'first line: what the recipe is for'
    for part in ('Hardware:', 'Model:', 'Command:', f'swift-vora train recipes/{name}.yaml', 'Planner',
                 'When it does not fit:'):
        assert part in text, f'{name}.yaml header lacks {part!r}'
    # the planner's number, pasted: must still be what the planner predicts (update the header when it changes)
    recipe = load_recipe(os.path.join(RECIPES, f'{name}.yaml'), [f'model.path={model_for(name)}'])
    plan = plan_recipe(recipe)
    stated = float(re.search(r'Planner[^:]*:\s*([\d.]+) GiB', text).group(1))
    assert abs(stated - plan.gpu_peak_gib) <= 0.15 * plan.gpu_peak_gib + 0.05, (
        f'{name}.yaml header says {stated} GiB, the planner now predicts {plan.gpu_peak_gib} GiB')


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
    launcher = {'ddp': 'swift sft', 'deepspeed_zero3': 'swift sft', 'megatron_ep_lora': 'megatron sft',
                'megatron_ep_full': 'megatron sft',
                'unsloth_split_lora': '-m swift_vora.backends.unsloth_runner'}[EXPECTED[name][1]]
    assert launcher in out
    if EXPECTED[name][1] == 'deepspeed_zero3':
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
