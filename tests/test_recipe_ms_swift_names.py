"""Recipes speak ms-swift: its argument names work as keys, any other `swift sft` argument passes through
`swift_args` checked by ms-swift's own parser before launch, and `train.quantization: 4bit` is QLoRA."""
import os

import pytest

from swift_vora.backends.launch import LaunchUsageError, build_launch
from swift_vora.backends.planning import plan_recipe
from swift_vora.backends.recipe import ALIASES, SCHEMA, RecipeError, recipe_from_dict

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DENSE_2B = os.path.join(REPO, 'tests', 'fixtures', 'configs', 'qwen3_vl_2b.json')
MOE_35B = os.path.join(REPO, 'tests', 'fixtures', 'configs', 'qwen3_5_moe_35b_a3b.json')


def recipe(overrides=(), model=DENSE_2B, hardware='3060x4', **sections):
    return recipe_from_dict({'hardware': hardware, 'model': {'path': model}, 'data': {'dataset': 'd.jsonl'},
                             **sections}, overrides)


def flag(argv, name):
    return argv[argv.index(name) + 1]


def test_ms_swift_names_are_keys_in_files_and_overrides():
    assert all(target in SCHEMA for target in ALIASES.values())
    r = recipe(train={'learning_rate': 3e-4, 'per_device_train_batch_size': 1, 'gradient_accumulation_steps': 4,
                      'num_train_epochs': 2, 'tuner_type': 'lora', 'lora_rank': 16})
    argv = build_launch(plan_recipe(r), r).argv
    assert flag(argv, '--learning_rate') == '0.0003' and flag(argv, '--gradient_accumulation_steps') == '4'
    assert flag(argv, '--num_train_epochs') == '2' and flag(argv, '--lora_rank') == '16'
    r = recipe(['train.learning_rate=1e-4', 'train.per_device_train_batch_size=2'])
    assert r['train.lr'] == 1e-4 and r['train.learning_rate'] == 1e-4 and r['train.micro_batch'] == 2
    with pytest.raises(RecipeError, match="'train.lr' and 'train.learning_rate' are the same setting"):
        recipe(train={'lr': 1e-4, 'learning_rate': 2e-4})
    with pytest.raises(RecipeError, match="did you mean 'train.learning_rate'"):
        recipe(['train.learnin_rate=1e-4'])


def test_swift_args_pass_through_checked_by_ms_swift_parser():
    r = recipe(swift_args={'neftune_noise_alpha': 5, 'lr_scheduler_type': 'linear', 'use_rslora': True})
    argv = build_launch(plan_recipe(r), r).argv
    assert flag(argv, '--neftune_noise_alpha') == '5' and flag(argv, '--use_rslora') == 'true'
    r = recipe(['swift_args.save_total_limit=2'])
    assert flag(build_launch(plan_recipe(r), r).argv, '--save_total_limit') == '2'
    for bad, message in (({'neftune_noise_alph': 5}, 'swift sft has no argument --neftune_noise_alph'),
                         ({'warmup_steps': 'soon'}, 'invalid float value')):
        r = recipe(swift_args=bad)
        with pytest.raises(LaunchUsageError, match=message):
            build_launch(plan_recipe(r), r)
    with pytest.raises(RecipeError, match="swift_args.learning_rate: set 'train.learning_rate' instead"):
        recipe(swift_args={'learning_rate': 1e-4})
    r = recipe(swift_args={'neftune_noise_alpha': 5}, model=MOE_35B, hardware='h200x1')
    with pytest.raises(LaunchUsageError, match='swift_args'):  # the Unsloth runner is not swift sft
        build_launch(plan_recipe(r), r)


# the settings the planner would otherwise search, as the recipe's own: memory compared at one setting
AS_ASKED = ['train.micro_batch=1', 'train.checkpoint_layers=null', 'deepspeed.offload=none', 'video.max_frames=64']


def test_quantization_4bit_plans_and_launches_qlora():
    r = recipe(['train.quantization=4bit', *AS_ASKED])
    plan = plan_recipe(r)
    assert plan.quant == '4bit' and plan.verdict == 'fits'
    argv = build_launch(plan, r).argv
    assert flag(argv, '--quant_method') == 'bnb' and flag(argv, '--quant_bits') == '4'
    assert flag(argv, '--bnb_4bit_quant_type') == 'nf4'
    # the planner prices the 4-bit base: less GPU memory than the same recipe in bf16
    assert plan.gpu_peak_gib < plan_recipe(recipe(AS_ASKED)).gpu_peak_gib
    with pytest.raises(RecipeError, match="'train.quantization' must be one of none, 4bit"):
        recipe(['train.quantization=8bit'])


@pytest.mark.parametrize('gpu_mem_gib, host_ram_gib', [(6, 64), (6, 12), (4, 12)])
def test_the_suggested_overrides_fit(gpu_mem_gib, host_ram_gib):
    from swift_vora.cli.train import fits_with_overrides
    base = ['hardware=null', 'gpus=1', f'gpu_mem_gib={gpu_mem_gib}', f'host_ram_gib={host_ram_gib}',
            'train.backend=ddp', 'video.max_frames=64']  # the budget set: what fits instead is an alternative
    plan = plan_recipe(recipe(base))
    assert plan.verdict == 'does_not_fit'
    suggested = fits_with_overrides(plan, recipe(base))
    if not suggested:  # only more GPUs would do: nothing is suggested for this hardware
        assert all(a['num_gpus'] > 1 or a['nodes'] > 1 for a in plan.alternatives)
        return
    assert plan_recipe(recipe(base + suggested)).verdict == 'fits', suggested
