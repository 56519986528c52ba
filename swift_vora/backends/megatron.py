"""MoE on several GPUs: Megatron-SWIFT expert-parallel LoRA (`megatron sft --tuner_type lora`, megatron_ep_lora) and
full SFT (`megatron sft --tuner_type full`, megatron_ep_full).

What the generated command does (ms-swift 4.6.0, swift/megatron/arguments/megatron_args.py):
- `--expert_model_parallel_size EP`: each GPU holds num_experts / EP experts; the dense parts are replicated
  (or split by `--tensor_model_parallel_size`).
- `--target_modules all-linear`: swift/megatron/utils/utils.py `find_all_linears` takes TELinear,
  TELayerNormColumnParallelLinear and **TEGroupedLinear** (the grouped expert layers) inside the language model;
  the router (TopKRouter) is only added by `all-router`, which we never pass. The vision tower stays frozen.
- `--moe_grouped_gemm true` (one grouped GEMM per expert group), `--moe_permute_fusion true` (fused token
  permutation), `--recompute_granularity full --recompute_method uniform --recompute_num_layers 1` (the plan's
  memory model assumes full recompute).
- `--attention_backend fused` (the recipe default): TE's cuDNN fused attention. `flash` needs flash-attn, which has
  no build for torch 2.11; megatron-core then turns TE's fused and unfused backends off (NVTE_FUSED_ATTN=0,
  NVTE_UNFUSED_ATTN=0, language_module.py) and mcore-bridge switches the HF vision tower to flash_attention_2.
- `--callbacks`: Megatron-SWIFT looks names up in its own `megatron_callbacks_map` and has no hook to add default
  ones, so the enabled guards that run under Megatron (`vora_fingerprint`, `vora_memory`, `vora_lora_update`:
  guards/registry.py MEGATRON_GUARDS, selected by SWIFT_VORA_GUARDS / SWIFT_VORA_GUARD_<NAME> as seen by the
  training process) are named there; the plugin registers them in that map inside `megatron sft`. A recipe's
  `guards.callbacks` may add those and Megatron-SWIFT's own names; the other guards hook swift's SFT trainers only.
- LoRA is saved merged into HF safetensors at `OUTPUT/checkpoint-N-merged` (`--merge_lora true`, the default
  with `--save_safetensors true`): that directory is what vLLM loads. Do not merge Megatron MoE LoRA with
  `swift export`.
- Full SFT (megatron_ep_full): `--tuner_type full` trains every weight of the language model; the vision tower and
  its merger stay frozen (swift's `_init_multimodal_full` freezes them under `--freeze_vit true --freeze_aligner
  true`), the router too when `megatron.freeze_router` is set (`--freeze_parameters_regex` over megatron-core's
  TopKRouter weights, `...mlp.router.weight`). `--use_distributed_optimizer true` (ms-swift's default, spelt out:
  the plan shards the fp32 master and Adam states over the data-parallel ranks with it). `--save_safetensors true
  --no_save_optim true`: each checkpoint-N is the converted Hugging Face model (mcore-bridge's `save_weights`,
  experts gathered from every expert rank), loadable in transformers and vLLM; no Megatron checkpoint or optimizer
  state is written (12 bytes per trainable parameter), so a run cannot resume from it.
- `--gradient_accumulation_fusion false` only where apex is installed without its CUDA extension (megatron-core would
  stop building the model); without apex ms-swift turns the fusion off itself and the launch says what that costs
  (backends/megatron_grad_fusion.py).
- `vora_step_profile` (backends/megatron_profile.py) is named in `--callbacks` when the training environment sets
  SWIFT_VORA_PROFILE_STEP: torch.profiler over that optimizer step, and every step's data wait.
- `vora_epoch_prefetch` (backends/megatron_prefetch.py) is named in `--callbacks` unless the training environment
  sets SWIFT_VORA_MEGATRON_PREFETCH=off: the DataLoader's workers encode the next epoch's first micro-batches while
  the current epoch's last ones train, instead of starting on them when the epoch begins.
- `vora_coalesced_optimizer` (backends/megatron_coalesced_optimizer.py) is named in `--callbacks` when the training
  environment sets SWIFT_VORA_MEGATRON_OPTIMIZER=coalesced: the distributed optimizer steps over one view per run of
  consecutive parameters in a gradient buffer instead of one tensor per parameter (the same updates).

The tests parse the generated argv with Megatron-SWIFT's own argument class (tests/megatron_args.py), since
Megatron's transformer_engine cannot be installed without CUDA.
"""
from __future__ import annotations

import os
from typing import Dict, List, Mapping, Optional

from ..guards.registry import GUARDS, MEGATRON_GUARDS, enabled_guards
from ..plan.backend import AUTO, Backend
from . import megatron_coalesced_optimizer, megatron_fla, megatron_grad_fusion, megatron_prefetch, megatron_profile
from .base import Launch, Launcher, LaunchUsageError, PlanView
from .common import (
    bool_arg,
    common_env,
    console_script,
    engine_argument_parser,
    lora_args,
    swift_common_args,
)
from .packing import megatron_packing_args
from .recipe import Recipe, learning_rate

# swift/megatron/callbacks/mapping.py (ms-swift 4.6.0); a test compares it with the installed mapping.
MEGATRON_CALLBACKS = ('print', 'default_flow', 'swanlab', 'wandb', 'tensorboard')
GUARD_PREFIX = 'vora_'  # swift_vora/swift_registry.py PREFIX
# megatron-core's MoE router weights (MoELayer.router, a TopKRouter: `...decoder.layers.N.mlp.router.weight`), what
# megatron.freeze_router freezes under full SFT (ms-swift's freeze_parameters_regex searches the parameter names)
ROUTER_REGEX = r'\.mlp\.router\.'
# the tuner each Megatron backend trains
TUNER = {Backend.MEGATRON_EP_LORA: 'lora', Backend.MEGATRON_EP_FULL: 'full'}


def _enabled_guards(environ: Mapping[str, str]) -> List[str]:
    """The guards the training process's environment enables (a bad SWIFT_VORA_GUARDS value is a usage error)."""
    try:
        return enabled_guards(dict(environ))
    except ValueError as e:
        raise LaunchUsageError(str(e)) from e


def megatron_guard_callbacks(environ: Mapping[str, str]) -> List[str]:
    """`vora_<name>` of the enabled guards that run under Megatron, for the environment of the training process."""
    return [GUARD_PREFIX + name for name in _enabled_guards(environ) if name in MEGATRON_GUARDS]


def guards_not_run(environ: Mapping[str, str]) -> List[str]:
    """Enabled guards that hook swift's SFT trainers only and so do not run under `megatron sft`."""
    return [name for name in _enabled_guards(environ) if name not in MEGATRON_GUARDS]


def parallel_sizes(view: PlanView, recipe: Recipe) -> Dict[str, int]:
    ep = int(recipe['megatron.ep'] or view.ep or view.world)
    tp = int(recipe['megatron.tp'] or view.tp or 1)
    pp = int(recipe['megatron.pp'])
    world = view.world
    if world % (tp * pp):
        raise LaunchUsageError(f'megatron: {world} GPUs are not divisible by tp {tp} x pp {pp}')
    if (world // pp) % ep:
        raise LaunchUsageError(f'megatron: expert parallel size {ep} must divide the {world // pp} GPUs of a pipeline '
                               'stage')
    experts = view.described_model(recipe['model.path']).num_experts
    if experts and experts % ep:
        raise LaunchUsageError(f'megatron: {experts} experts cannot be split over expert parallel size {ep}')
    return {'ep': ep, 'tp': tp, 'pp': pp}


def megatron_sft_args(view: PlanView, recipe: Recipe, environ: Optional[Mapping[str, str]] = None,
                      fusion: Optional[megatron_grad_fusion.FusionCheck] = None) -> List[str]:
    """Arguments after `megatron sft` (validated by tests against MegatronSftArguments). `environ`: the
    environment the training process will see (it selects the guards); none means no SWIFT_VORA_GUARDS set.
    `fusion`: the launch's apex check of this machine, made here when not given."""
    full = view.backend == Backend.MEGATRON_EP_FULL
    if recipe['train.dtype'] != 'bfloat16':
        raise LaunchUsageError(f'{view.backend} trains in bfloat16 (train.dtype=bfloat16)')
    if full and not recipe['train.freeze_vit']:
        raise LaunchUsageError(f'{recipe.path}: train.freeze_vit=false: megatron_ep_full trains the language model; '
                               'the plan counts the vision tower frozen (its weights, gradients and optimizer states '
                               'are not in it), so it is not trained here')
    sizes = parallel_sizes(view, recipe)
    targets = recipe['train.target_modules']
    targets = [targets] if isinstance(targets, str) else list(targets)
    if 'all-router' in targets or any('router' in t for t in targets):
        raise LaunchUsageError('train.target_modules: the MoE router is never trained (no all-router)')
    dp = view.world // (sizes['tp'] * sizes['pp'])
    global_batch = recipe['megatron.global_batch']
    step = view.micro_batch * dp
    if global_batch % step:
        below, above = global_batch // step * step, (global_batch // step + 1) * step
        raise LaunchUsageError(f'{recipe.path}: megatron.global_batch {global_batch} must be a multiple of micro_batch '
                               f'{view.micro_batch} x data-parallel size {dp}: give megatron.global_batch={above}'
                               + (f' (or {below})' if below else '') + ' (plan --global-batch N)')
    argv = [*swift_common_args(recipe, view), *lora_args(recipe)]
    argv += ['--expert_model_parallel_size', str(sizes['ep']), '--tensor_model_parallel_size', str(sizes['tp']),
             '--pipeline_model_parallel_size', str(sizes['pp'])]
    if sizes['tp'] > 1:
        argv += ['--sequence_parallel', 'true']
    argv += ['--moe_grouped_gemm', bool_arg(recipe['megatron.moe_grouped_gemm']), '--moe_permute_fusion',
             bool_arg(recipe['megatron.moe_permute_fusion'])]
    if full:  # the plan shards the fp32 master and Adam states over the data-parallel ranks with it
        argv += ['--use_distributed_optimizer', 'true']
        if recipe['megatron.freeze_router']:
            argv += ['--freeze_parameters_regex', ROUTER_REGEX]
    if recipe['megatron.precision_aware_optimizer']:  # TE's FusedAdam writes the bf16 weights: no copy per tensor
        argv += ['--use_precision_aware_optimizer', 'true']
    recompute = recipe['megatron.recompute'] if recipe['train.gradient_checkpointing'] else 'none'
    argv += ['--recompute_granularity', recompute]
    if recompute == 'full':
        argv += ['--recompute_method', 'uniform',
                 '--recompute_num_layers', str(recipe['megatron.recompute_num_layers'])]
    lr = learning_rate(recipe)
    argv += ['--micro_batch_size', str(view.micro_batch), '--global_batch_size', str(global_batch),
             '--freeze_llm', 'false', '--freeze_vit', bool_arg(recipe['train.freeze_vit']), '--freeze_aligner', 'true',
             '--bf16', 'true', '--attention_backend', recipe['megatron.attention_backend'],
             '--cross_entropy_loss_fusion', 'true',
             '--cross_entropy_fusion_impl', recipe['megatron.cross_entropy_fusion_impl'],
             '--lr', f'{lr:g}', '--min_lr', f'{lr / 10:g}',
             '--lr_warmup_fraction', f'{recipe["train.warmup_ratio"]:g}']
    argv += megatron_packing_args(recipe, view)  # Megatron-SWIFT is padding-free unless told: each value spelt out
    if recipe['train.max_steps'] is not None:
        argv += ['--train_iters', str(recipe['train.max_steps'])]
    else:
        argv += ['--num_train_epochs', str(max(1, int(round(recipe['train.epochs']))))]
    argv += ['--save_steps', str(recipe['train.save_steps']), '--logging_steps', str(recipe['train.logging_steps']),
             '--output_dir', recipe['train.output_dir'], '--add_version', bool_arg(recipe['train.add_version']),
             '--no_save_optim', 'true', '--no_save_rng', 'true', '--save_safetensors', 'true']
    if not full:  # full SFT writes the converted Hugging Face model into checkpoint-N itself
        argv += ['--merge_lora', bool_arg(recipe['megatron.merge_lora'])]
    argv += ['--dataloader_num_workers', str(recipe['train.dataloader_workers']), '--seed', str(recipe['train.seed'])]
    guard_names = [GUARD_PREFIX + name for name in MEGATRON_GUARDS]
    unknown = [c for c in recipe['guards.callbacks'] if c not in MEGATRON_CALLBACKS and c not in guard_names]
    if unknown:
        other = [c for c in unknown if c.startswith(GUARD_PREFIX) and c[len(GUARD_PREFIX):] in GUARDS]
        raise LaunchUsageError(f'{recipe.path}: guards.callbacks: {", ".join(unknown)} cannot run under megatron sft '
                               f'(the guards that run there: {", ".join(guard_names)}; Megatron-SWIFT\'s callbacks: '
                               f'{", ".join(MEGATRON_CALLBACKS)}'
                               f'{"; the other guards run with the swift sft backends only" if other else ""})')
    callbacks = megatron_guard_callbacks(environ or {})
    if megatron_profile.wanted(environ or {}):  # SWIFT_VORA_PROFILE_STEP set for the training process
        callbacks.append(megatron_profile.CALLBACK)
    if megatron_prefetch.wanted(environ or {}):  # unless SWIFT_VORA_MEGATRON_PREFETCH=off
        callbacks.append(megatron_prefetch.CALLBACK)
    if megatron_coalesced_optimizer.wanted(environ or {}):  # SWIFT_VORA_MEGATRON_OPTIMIZER=coalesced
        callbacks.append(megatron_coalesced_optimizer.CALLBACK)
    callbacks += [c for c in recipe['guards.callbacks'] if c not in callbacks]
    if callbacks:
        argv += ['--callbacks', *callbacks]
    fusion = fusion or megatron_grad_fusion.check(recipe['extra_args'])
    argv += fusion.args  # apex without its CUDA extension
    return argv + recipe['extra_args']


def build_megatron_launch(view: PlanView, recipe: Recipe, environ: Optional[Mapping[str, str]] = None) -> Launch:
    tuner = TUNER[Backend(view.backend)]
    if recipe['train.tuner'] != tuner:
        raise LaunchUsageError(f'{view.backend} trains {"LoRA" if tuner == "lora" else "every weight"} '
                               f'(train.tuner={tuner})')
    if recipe['train.checkpoint_layers'] not in (None, AUTO):  # auto: the plan checkpointed every layer here
        raise LaunchUsageError(f'{recipe.path}: train.checkpoint_layers applies to swift sft and Unsloth; Megatron '
                               'recomputes by its own settings (megatron.recompute, megatron.recompute_num_layers): '
                               'give train.checkpoint_layers=null')
    env = common_env(recipe, view, environ)
    env['CUDA_DEVICE_MAX_CONNECTIONS'] = '1'  # what swift/cli/_megatron/sft.py sets by default
    source_environ = os.environ if environ is None else environ
    if view.linear_attention_layers and megatron_fla.ENV not in env and megatron_fla.ENV not in source_environ:
        # Gated DeltaNet layers: bind the flash-linear-attention that is correct on this GPU (backends/megatron_fla.py)
        env[megatron_fla.ENV] = 'auto'
    child_environ = {**(os.environ if environ is None else environ), **env}  # what Launch.run gives the child
    fusion = megatron_grad_fusion.check(recipe['extra_args'])  # once: its flag goes in argv, its note in notes
    argv = [console_script('megatron'), 'sft', *megatron_sft_args(view, recipe, child_environ, fusion)]
    saved = (f'HF weights (full SFT, for transformers and vLLM): {recipe["train.output_dir"]}/[vN-.../]checkpoint-N'
             if tuner == 'full' else
             f'merged HF weights for vLLM: {recipe["train.output_dir"]}/[vN-.../]checkpoint-N-merged')
    notes = ['needs megatron-core, mcore-bridge and transformer_engine on the GPU machine (pip install '
             '"swift-vora[megatron]" transformer_engine[pytorch])', saved]
    if env.get(megatron_fla.ENV) == 'auto':
        notes.append(f'{view.linear_attention_layers} Gated DeltaNet layers: {megatron_fla.ENV}=auto binds '
                     'unsloth_zoo\'s vendored flash-linear-attention on a Hopper GPU with Triton < 3.7.1 (fla #640), '
                     'refuses without it (docs/backends.md)')
    skipped = guards_not_run(child_environ)
    if skipped:
        notes.append(f'guards {", ".join(skipped)} hook swift sft trainers only and do not run under megatron sft '
                     f'(run there: {", ".join(MEGATRON_GUARDS)})')
    if fusion.note:
        notes.append(fusion.note)
    return Launch(argv=argv, env=env, notes=notes)


class MegatronSft(Launcher):
    """Expert-parallel MoE LoRA and full SFT on several GPUs: `megatron sft` (Megatron-SWIFT through mcore-bridge)."""
    backends = (Backend.MEGATRON_EP_LORA, Backend.MEGATRON_EP_FULL)
    engine = 'megatron sft'

    def build(self, view: PlanView, recipe: Recipe, environ: Optional[Mapping[str, str]] = None) -> Launch:
        return build_megatron_launch(view, recipe, environ)

    def argument_parser(self):
        from swift.megatron.arguments import MegatronSftArguments
        return engine_argument_parser(MegatronSftArguments)
