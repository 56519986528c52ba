"""Recipes speak ms-swift: its argument names work as keys, any other `swift sft` argument passes through
`swift_args` checked by ms-swift's own parser before launch, and `train.quantization: 4bit` is QLoRA."""
import json
import os
import re

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


def run_config(launch):
    (text, ) = launch.files.values()
    return json.loads(text)


def test_the_unsloth_runner_takes_swift_sfts_optimizer_arguments_and_refuses_the_others():
    """A recipe's optimizer arguments mean the same on the Unsloth runner as on swift sft (read by ms-swift's own
    parser, the schedule built by transformers before launch); an argument only swift sft has stops the launch with
    the list of those the runner takes."""
    moe = dict(model=MOE_35B, hardware='h200x1')
    given = {'weight_decay': 0, 'adam_beta2': 0.999, 'max_grad_norm': 0.5, 'lr_scheduler_type': 'cosine_with_min_lr',
             'lr_scheduler_kwargs': {'min_lr': 1e-6}}
    r = recipe(swift_args=given, **moe)
    launch = build_launch(plan_recipe(r), r)
    assert launch.backend == 'unsloth_split_lora'
    assert run_config(launch)['swift_args'] == {**given, 'weight_decay': 0.0}  # as swift sft's parser types it
    r = recipe(['swift_args.warmup_steps=10', 'train.warmup_ratio=0'], **moe)
    assert run_config(build_launch(plan_recipe(r), r))['swift_args'] == {'warmup_steps': 10.0}
    for bad, message in (({'neftune_noise_alpha': 5}, 'neftune_noise_alpha is a swift sft / megatron sft argument '
                          'the unsloth_split_lora runner does not take; it takes weight_decay, adam_beta1'),
                         ({'weight_decay': 'none'}, 'invalid float value'),
                         ({'lr_scheduler_type': 'cosin'}, "'cosin' is not a transformers schedule; one of linear, "),
                         ({'lr_scheduler_type': 'cosine_with_min_lr'}, 'One of min_lr or min_lr_rate'),
                         ({'lr_scheduler_type': 'reduce_lr_on_plateau'}, 'steps on an evaluation metric'),
                         ({'lr_scheduler_kwargs': '{min_lr'}, 'not a JSON object')):
        r = recipe(swift_args=bad, **moe)
        with pytest.raises(LaunchUsageError, match=re.escape(message)):
            build_launch(plan_recipe(r), r)


def test_warmup_steps_with_the_recipes_warmup_ratio_stops_at_the_recipe():
    """ms-swift refuses a warm-up given both ways when the launched process parses its arguments; the recipe check
    says so first, with the key to change."""
    for model, hardware in ((DENSE_2B, '3060x4'), (MOE_35B, 'h200x1')):
        with pytest.raises(RecipeError, match=r"swift_args.warmup_steps and 'train.warmup_ratio' \(0.05\) both set "
                           'the warm-up and ms-swift takes one: set train.warmup_ratio=0'):
            recipe(swift_args={'warmup_steps': 100}, model=model, hardware=hardware)
    r = recipe(['train.warmup_ratio=0'], swift_args={'warmup_steps': 100})
    assert flag(build_launch(plan_recipe(r), r).argv, '--warmup_steps') == '100'


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
