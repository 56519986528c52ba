"""Megatron-SWIFT expert-parallel LoRA: the generated `megatron sft` argv, parsed with Megatron-SWIFT's own
argument class (MegatronSftArguments through HfArgumentParser, as `megatron sft` does). Nothing runs: megatron
needs transformer_engine and GPUs."""
import json
import os
import subprocess
import sys

import pytest
from cli_harness import launch_folder
from megatron_args import H200X8_AS_MEGATRON_LORA

from swift_vora.backends import LaunchUsageError
from swift_vora.backends.launch import build_launch
from swift_vora.backends.megatron import megatron_sft_args, parallel_sizes
from swift_vora.backends.planning import plan_recipe
from swift_vora.backends.recipe import load_recipe

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(REPO, 'tests', 'fixtures', 'configs')
MOE_35B = os.path.join(CONFIGS, 'qwen3_5_moe_35b_a3b.json')
MOE_30B_VL = os.path.join(CONFIGS, 'qwen3_vl_moe_30b_a3b.json')
H200X8 = os.path.join(REPO, 'recipes', 'h200x8.yaml')
MEGATRON_LORA = H200X8_AS_MEGATRON_LORA  # the h200x8 recipe trains Unsloth replicas: Megatron's LoRA by name


def launch_for(*overrides, model=MOE_35B, environ=None):
    recipe = load_recipe(H200X8, [f'model.path={model}', *MEGATRON_LORA, *overrides])
    plan = plan_recipe(recipe)
    assert plan.verdict == 'fits', plan.reasons
    return build_launch(plan, recipe, environ=environ or {})


def flag(argv, name):
    return argv[argv.index(name) + 1]


def test_expert_parallel_lora_arguments():
    launch = launch_for()
    argv = launch.argv
    assert os.path.basename(argv[0]) == 'megatron' and argv[1] == 'sft'
    assert flag(argv, '--tuner_type') == 'lora' and flag(argv, '--target_modules') == 'all-linear'
    assert flag(argv, '--expert_model_parallel_size') == '8' and flag(argv, '--tensor_model_parallel_size') == '1'
    assert flag(argv, '--moe_grouped_gemm') == 'true' and flag(argv, '--moe_permute_fusion') == 'true'
    assert flag(argv, '--recompute_granularity') == 'full' and flag(argv, '--recompute_method') == 'uniform'
    assert flag(argv, '--merge_lora') == 'true' and flag(argv, '--save_safetensors') == 'true'
    assert flag(argv, '--custom_register_path') == 'swift_vora' and flag(argv, '--template') == 'video_ora'
    assert 'all-router' not in argv and '--deepspeed' not in argv
    assert launch.env['NPROC_PER_NODE'] == '8' and launch.env['CUDA_DEVICE_MAX_CONNECTIONS'] == '1'


def test_two_nodes_keep_ep8_and_double_data_parallel():
    launch = launch_for('nodes=2', 'megatron.global_batch=32',
                        environ={'NODE_RANK': '0', 'MASTER_ADDR': 'node0', 'MASTER_PORT': '29500'})
    assert (launch.env['NNODES'], launch.env['NODE_RANK'], launch.env['MASTER_ADDR']) == ('2', '0', 'node0')
    assert flag(launch.argv, '--expert_model_parallel_size') == '8'


def test_model_type_must_match_the_config():
    with pytest.raises(LaunchUsageError, match='model.type=qwen3_vl_moe'):
        launch_for(model=MOE_30B_VL)
    assert flag(launch_for('model.type=null', model=MOE_30B_VL).argv, '--model_type') == 'qwen3_vl_moe'


def test_parallel_sizes_are_checked():
    recipe = load_recipe(H200X8, [f'model.path={MOE_35B}', *MEGATRON_LORA, 'megatron.ep=3'])
    with pytest.raises(LaunchUsageError):
        parallel_sizes(plan_view_stub(8), recipe)
    recipe = load_recipe(H200X8, [f'model.path={MOE_35B}', *MEGATRON_LORA, 'megatron.global_batch=12'])
    with pytest.raises(LaunchUsageError):
        megatron_sft_args(plan_view_stub(8), recipe)
    recipe = load_recipe(H200X8, [f'model.path={MOE_35B}', *MEGATRON_LORA,
                                  'train.target_modules=[all-linear, all-router]'])
    with pytest.raises(LaunchUsageError):
        megatron_sft_args(plan_view_stub(8), recipe)


def plan_view_stub(world):
    from swift_vora.backends.base import PlanView
    return PlanView(backend='megatron_ep_lora', verdict='fits', reasons=[], num_gpus=world, nodes=1, ep=8, tp=1,
                    offload='none', micro_batch=1, is_moe=True, model_type='qwen3_5_moe', gpu_peak_gib=None,
                    host_peak_gib=None)


@pytest.fixture(scope='module')
def megatron_parser_available():
    import importlib.util
    for name in ('megatron', 'mcore_bridge'):  # found, not imported: mcore_bridge imports transformer_engine
        # a test dependency (pyproject [test]): missing it is a broken install, not a reason to skip
        assert importlib.util.find_spec(name) is not None, f'{name} is not installed (pip install -e .[test])'


def test_generated_argv_parses_with_megatron_swift_arguments(megatron_parser_available):
    """Every flag of the dry-run command is an argument of MegatronSftArguments, with the intended value."""
    from megatron_args import validate_argv
    argvs = [launch_for().argv[2:], launch_for('megatron.tp=2', 'megatron.recompute=selective').argv[2:],
             launch_for('model.type=qwen3_vl_moe', model=MOE_30B_VL).argv[2:],
             launch_for('model.type=qwen3_vl_moe', 'train.packing=micro_batch', model=MOE_30B_VL).argv[2:],
             launch_for('model.type=qwen3_vl_moe', 'train.packing=dataset', model=MOE_30B_VL).argv[2:],
             launch_for('megatron.cross_entropy_fusion_impl=native', 'megatron.precision_aware_optimizer=false'
                        ).argv[2:]]
    results = validate_argv(argvs)
    values = results[0]['values']
    assert values['expert_model_parallel_size'] == 8 and values['tuner_type'] == 'lora'
    assert values['target_modules'] == ['all-linear'] and values['moe_grouped_gemm'] is True
    assert values['moe_permute_fusion'] is True and values['recompute_granularity'] == 'full'
    assert values['recompute_method'] == 'uniform' and values['merge_lora'] is True
    assert values['custom_register_path'] == ['swift_vora'] and values['template'] == 'video_ora'
    assert values['model_type'] == 'qwen3_5_moe' and values['freeze_vit'] is True
    assert results[1]['values']['tensor_model_parallel_size'] == 2
    assert results[1]['values']['sequence_parallel'] is True
    assert results[1]['values']['recompute_granularity'] == 'selective'
    assert results[2]['values']['model_type'] == 'qwen3_vl_moe'
    # train.packing spelt out: Megatron-SWIFT is padding-free unless told (the recipe says off: padded rows, as
    # ms-swift's Qwen3.5-MoE example; an attention-only MoE packs anywhere)
    assert values['padding_free'] is False and results[3]['values']['padding_free'] is True
    assert results[4]['values']['packing'] is True
    # the loss the plan counts is the one Megatron-SWIFT is told to use (the recipe ships TE's)
    assert values['cross_entropy_loss_fusion'] is True and values['cross_entropy_fusion_impl'] == 'te'
    assert results[5]['values']['cross_entropy_fusion_impl'] == 'native'
    # the precision-aware optimizer the recipe ships, and Megatron-SWIFT's default where it is turned off
    assert values['use_precision_aware_optimizer'] is True
    assert results[5]['values'].get('use_precision_aware_optimizer', False) is False
    # the check is real: a flag Megatron-SWIFT does not have is reported
    with pytest.raises(ValueError, match='no_such_flag'):
        validate_argv([['--model', 'x', '--no_such_flag', '1']])


def test_dry_run_prints_the_megatron_command(megatron_parser_available, tmp_path):
    proc = subprocess.run([sys.executable, '-m', 'swift_vora', 'train', H200X8, f'model.path={MOE_35B}', *MEGATRON_LORA,
                           '--dry-run', '--json', '--trust-recipe-hardware'], cwd=launch_folder(tmp_path),
                          capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    assert d['plan']['backend'] == 'megatron_ep_lora' and d['launch']['argv'][1] == 'sft'
    assert 'megatron sft' in d['launch']['shell'] and '--expert_model_parallel_size 8' in d['launch']['shell']


GUARD_CALLBACKS = ['vora_fingerprint', 'vora_memory', 'vora_lora_update']


def callbacks_of(argv):
    if '--callbacks' not in argv:
        return []
    start = argv.index('--callbacks') + 1
    end = next((i for i in range(start, len(argv)) if argv[i].startswith('--')), len(argv))
    return argv[start:end]


def guard_callbacks_of(argv):
    """The callbacks of `argv` but the data loader's `vora_epoch_prefetch` (named unless switched off) and the
    optimizer's `vora_coalesced_optimizer` (named where switched on, as recipes/h200x8.yaml does); their own tests
    below."""
    return [c for c in callbacks_of(argv) if c not in (PREFETCH, COALESCED)]


PREFETCH = 'vora_epoch_prefetch'
COALESCED = 'vora_coalesced_optimizer'


def test_guards_that_run_under_megatron_are_named_in_callbacks():
    launch = launch_for()
    assert callbacks_of(launch.argv) == [*GUARD_CALLBACKS, PREFETCH, COALESCED]
    assert any('coverage, supervision' in note and 'do not run under megatron sft' in note for note in launch.notes)
    # the selection the training process will see: the caller's environment, then the recipe's guards.env
    assert guard_callbacks_of(launch_for(environ={'SWIFT_VORA_GUARDS': 'none'}).argv) == []
    assert guard_callbacks_of(launch_for(environ={'SWIFT_VORA_GUARD_MEMORY': '0'}).argv) == ['vora_fingerprint',
                                                                                      'vora_lora_update']
    assert guard_callbacks_of(launch_for('guards.env={SWIFT_VORA_GUARDS: "all,-lora_update"}').argv) == [
        'vora_fingerprint', 'vora_memory']
    assert guard_callbacks_of(launch_for('guards.env={SWIFT_VORA_GUARDS: coverage}').argv) == []


def test_recipe_callbacks_may_name_megatron_guards_only():
    launch = launch_for('guards.callbacks=[tensorboard, vora_memory]', environ={'SWIFT_VORA_GUARDS': 'none'})
    assert callbacks_of(launch.argv) == [PREFETCH, COALESCED, 'tensorboard', 'vora_memory']
    assert guard_callbacks_of(launch_for('guards.callbacks=[vora_memory]').argv) == GUARD_CALLBACKS  # not twice
    with pytest.raises(LaunchUsageError, match='vora_coverage cannot run under megatron sft .*the guards that run '
                                               'there: vora_fingerprint, vora_memory, vora_lora_update'):
        launch_for('guards.callbacks=[vora_coverage]')
    with pytest.raises(LaunchUsageError, match='unknown guard'):
        launch_for(environ={'SWIFT_VORA_GUARDS': 'coverag'})


def test_guard_callbacks_resolve_in_megatron_swift(megatron_parser_available):
    """`--callbacks vora_*` parses, and after the plugin import the names are in megatron_callbacks_map (what the
    Megatron trainer looks them up in); a guard that does not run under Megatron is reported."""
    from megatron_args import validate_argv
    results = validate_argv([launch_for('guards.callbacks=[tensorboard]').argv[2:]])
    assert results[0]['values']['callbacks'] == [*GUARD_CALLBACKS, PREFETCH, COALESCED, 'tensorboard']
    assert results[0]['unknown_callbacks'] == []
    with pytest.raises(ValueError, match=r"megatron_callbacks_map has no \['vora_coverage'\]"):
        validate_argv([['--model', 'x', '--custom_register_path', 'swift_vora', '--callbacks', 'vora_coverage']])


def test_cross_entropy_implementation_reaches_megatron_sft_and_the_plan():
    """megatron.cross_entropy_fusion_impl is passed to megatron sft (the fusion on) and planned with: TE's fused
    cross entropy keeps only the bf16 logits, so the same recipe plans less GPU memory."""
    recipe = load_recipe(H200X8, [f'model.path={MOE_35B}', *MEGATRON_LORA, 'megatron.cross_entropy_fusion_impl=native'])
    native = plan_recipe(recipe)
    te_recipe = load_recipe(H200X8, [f'model.path={MOE_35B}', *MEGATRON_LORA, 'megatron.cross_entropy_fusion_impl=te'])
    te = plan_recipe(te_recipe)
    assert te.gpu_peak_gib < native.gpu_peak_gib - 1
    for plan, recipe, impl in ((native, recipe, 'native'), (te, te_recipe, 'te')):
        argv = build_launch(plan, recipe, environ={}).argv
        assert flag(argv, '--cross_entropy_fusion_impl') == impl
        assert flag(argv, '--cross_entropy_loss_fusion') == 'true'


def test_the_precision_aware_optimizer_is_a_recipe_key_not_set_twice():
    from swift_vora.backends.recipe import RecipeError
    for value, wanted in (('true', 'true'), ('false', None)):
        recipe = load_recipe(H200X8, [f'model.path={MOE_35B}', *MEGATRON_LORA,
                                      f'megatron.precision_aware_optimizer={value}'])
        argv = build_launch(plan_recipe(recipe), recipe, environ={}).argv
        assert (flag(argv, '--use_precision_aware_optimizer') if wanted else
                '--use_precision_aware_optimizer' in argv) == (wanted or False)
    with pytest.raises(RecipeError, match='megatron.precision_aware_optimizer'):
        load_recipe(H200X8, [f'model.path={MOE_35B}', *MEGATRON_LORA,
                             'swift_args={use_precision_aware_optimizer: true}'])


def test_cross_entropy_implementation_is_checked_and_not_set_twice():
    from swift_vora.backends.recipe import RecipeError
    with pytest.raises(RecipeError, match='cross_entropy_fusion_impl'):
        load_recipe(H200X8, [f'model.path={MOE_35B}', *MEGATRON_LORA, 'megatron.cross_entropy_fusion_impl=liger'])
    with pytest.raises(RecipeError, match='megatron.cross_entropy_fusion_impl'):
        load_recipe(H200X8, [f'model.path={MOE_35B}', *MEGATRON_LORA, 'swift_args={cross_entropy_fusion_impl: te}'])


# ---- full SFT (megatron_ep_full, recipes/h200x8-full.yaml) and the step profile's callback ---------------------------
H200X8_FULL = os.path.join(REPO, 'recipes', 'h200x8-full.yaml')


def full_launch_for(*overrides, environ=None):
    recipe = load_recipe(H200X8_FULL, [f'model.path={MOE_35B}', *overrides])
    plan = plan_recipe(recipe)
    assert plan.verdict == 'fits', plan.reasons
    return build_launch(plan, recipe, environ=environ or {})


def test_full_sft_arguments():
    launch = full_launch_for()
    argv = launch.argv
    assert flag(argv, '--tuner_type') == 'full' and flag(argv, '--use_distributed_optimizer') == 'true'
    assert flag(argv, '--expert_model_parallel_size') == '8' and flag(argv, '--freeze_vit') == 'true'
    assert flag(argv, '--save_safetensors') == 'true' and flag(argv, '--no_save_optim') == 'true'
    assert '--merge_lora' not in argv and '--lora_rank' not in argv and '--target_modules' not in argv
    assert '--freeze_parameters_regex' not in argv  # the router trains with the rest by default
    assert any(n.startswith('HF weights (full SFT') and n.endswith('checkpoint-N') for n in launch.notes)
    router = full_launch_for('megatron.freeze_router=true').argv
    assert flag(router, '--freeze_parameters_regex') == r'\.mlp\.router\.'


def test_full_sft_keeps_the_vision_tower_frozen_and_the_tuners_apart():
    with pytest.raises(LaunchUsageError, match='freeze_vit=false'):
        full_launch_for('train.freeze_vit=false')
    lora_on_full = plan_recipe(load_recipe(H200X8_FULL, [f'model.path={MOE_35B}', 'train.tuner=lora']))
    assert lora_on_full.verdict == 'refused' and lora_on_full.rule == 'megatron-full-only'
    full_on_lora = plan_recipe(load_recipe(H200X8, [f'model.path={MOE_35B}', *MEGATRON_LORA, 'train.tuner=full']))
    assert full_on_lora.verdict == 'refused' and full_on_lora.rule == 'megatron-lora-only'
    assert 'megatron_ep_full' in full_on_lora.reasons[-1]


def test_the_step_profile_callback_is_named_when_the_switch_is_set():
    assert 'vora_step_profile' not in callbacks_of(launch_for().argv)
    assert guard_callbacks_of(launch_for(environ={'SWIFT_VORA_PROFILE_STEP': '13'}).argv)[-1] == 'vora_step_profile'
    assert 'vora_step_profile' in callbacks_of(full_launch_for(environ={'SWIFT_VORA_PROFILE_STEP': '0'}).argv)


def test_the_epoch_prefetch_callback_is_named_unless_switched_off():
    """The DataLoader read across epoch ends (backends/megatron_prefetch.py) for LoRA and full SFT alike; the switch
    as the training process will see it, from the caller's environment or the recipe's env."""
    assert PREFETCH in callbacks_of(launch_for().argv) and PREFETCH in callbacks_of(full_launch_for().argv)
    assert PREFETCH not in callbacks_of(launch_for(environ={'SWIFT_VORA_MEGATRON_PREFETCH': 'off'}).argv)
    assert PREFETCH not in callbacks_of(launch_for('env={SWIFT_VORA_MEGATRON_PREFETCH: "off"}').argv)


def test_the_coalesced_optimizer_callback_is_named_only_where_switched_on():
    """The optimizer over coalesced gradient-buffer runs (backends/megatron_coalesced_optimizer.py): off by default,
    named from the caller's environment or the recipe's env (recipes/h200x8.yaml ships it on); the launch saves no
    optimizer state, which it needs."""
    argv = launch_for().argv
    assert COALESCED in callbacks_of(argv) and argv[argv.index('--no_save_optim') + 1] == 'true'
    per_tensor = 'env={SWIFT_VORA_MEGATRON_OPTIMIZER: per_tensor}'
    assert COALESCED not in callbacks_of(launch_for(per_tensor).argv)
    # the recipe's env is what the training process gets, over the caller's environment
    launch = launch_for(per_tensor, environ={'SWIFT_VORA_MEGATRON_OPTIMIZER': 'coalesced'})
    assert COALESCED not in callbacks_of(launch.argv) and launch.env['SWIFT_VORA_MEGATRON_OPTIMIZER'] == 'per_tensor'
    assert COALESCED not in callbacks_of(full_launch_for().argv)  # recipes/h200x8-full.yaml does not set it


def test_full_sft_argv_parses_with_megatron_swift_arguments(megatron_parser_available):
    """ms-swift's own parser takes every flag of the full-SFT launch, and `vora_step_profile` resolves in
    megatron_callbacks_map once the plugin is imported (as --custom_register_path does)."""
    from megatron_args import validate_argv
    results = validate_argv([full_launch_for('megatron.freeze_router=true',
                                             environ={'SWIFT_VORA_PROFILE_STEP': '13'}).argv[2:]])
    values = results[0]['values']
    assert values['tuner_type'] == 'full' and values['use_distributed_optimizer'] is True
    assert values['freeze_parameters_regex'] == r'\.mlp\.router\.' and values['freeze_vit'] is True
    assert values['expert_model_parallel_size'] == 8 and 'vora_step_profile' in values['callbacks']
    assert PREFETCH in values['callbacks']
    assert results[0]['unknown_callbacks'] == []
