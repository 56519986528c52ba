"""MoE LoRA with Unsloth's split LoRA, through our own small runner (swift_vora.backends.unsloth_runner): on one GPU,
or on N GPUs as N replicas of it, one process each under torchrun, DDP over the LoRA tensors (data_parallel.py).

Decision (ms-swift 4.6.0 read at swift/model/register.py `load_by_unsloth`, swift/pipelines/train/tuner.py):
`swift sft --tuner_backend unsloth` does reach Unsloth's loader (FastVisionModel for multimodal model types)
and `get_peft_model`, and the split MoE LoRA is decided inside Unsloth (unsloth_zoo's temporary patches of
Qwen3VLMoeTextExperts / Qwen3_5Moe experts + get_peft_model's MoE detection, which turns the MLP leaf names into
`target_parameters` on the fused expert tensors). We still run Unsloth from our own runner because:

1. Unsloth must be imported before transformers for all of its patches; `swift sft` imports transformers (and
   trl) at start-up and Unsloth only inside `load_by_unsloth`.
2. With `--target_modules all-linear` swift hands Unsloth a multimodal regex that misses the 3-D expert tensors
   (the notes record all-linear breaking on multimodal models); our runner passes explicit leaf names.
3. We need to assert, on the live model, that the router (`mlp.gate`, `shared_expert_gate`) has no LoRA and is
   frozen, that the experts do have LoRA, and that nothing is 4-bit. swift's path offers no hook between
   get_peft_model and training.
4. The runner keeps data loading in the main process (no forked workers: no DataLoader deadlocks with
   Unsloth's compiled modules and CUDA), and needs no TRL at all.

Versions: unsloth 2026.10.9 requires trl >=0.18.2,!=0.19.0,<=1.15.0 and transformers <=5.17.0; ms-swift 4.6
requires trl >=0.15,<1.0. trl 0.29.1 (this venv's) satisfies both, so one environment can hold ms-swift (for
the template and dataset) and Unsloth. The GPU machine ran Unsloth with trl 1.15; our runner imports no trl.

This module imports neither torch nor unsloth at import time: argument and target construction are unit-tested
on CPU; the loader is exercised by scripts/gpu/unsloth_smoke.sh on the GPU.
"""
from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Mapping, Optional

from ..plan.backend import Backend
from ..plan.model_spec import ModelSpec
from .base import Launch, Launcher, LaunchUsageError, PlanView
from .common import (
    EngineArgumentError,
    common_env,
    engine_argument_parser,
    parse_engine_argv,
    swift_argv,
    swift_optimizer_defaults,
)
from .packing import refuse_unsloth_packing
from .recipe import Recipe, learning_rate

# Language-model projections that get LoRA. MLP leaf names reach the experts: Unsloth (and PEFT with
# `target_parameters`) map gate_proj/up_proj -> mlp.experts.gate_up_proj and down_proj -> mlp.experts.down_proj.
ATTENTION_TARGETS = ['q_proj', 'k_proj', 'v_proj', 'o_proj']
LINEAR_ATTENTION_TARGETS = ['in_proj_qkv', 'in_proj_z', 'out_proj']  # Qwen3.5 Gated DeltaNet (a/b gates excluded)
MLP_TARGETS = ['gate_proj', 'up_proj', 'down_proj']
EXPERT_PARAMETERS = ['mlp.experts.gate_up_proj', 'mlp.experts.down_proj']
# Router modules: never targeted, never trainable. Qwen3-MoE / Qwen3-VL-MoE / Qwen3.5-MoE route with `mlp.gate`
# (a TopKRouter holding a (num_experts, hidden) weight); Qwen3.5-MoE also gates its shared expert with
# `mlp.shared_expert_gate` (Linear(hidden, 1)).
ROUTER_LEAVES = ('gate', 'shared_expert_gate', 'router')
ROUTER_PATTERN = re.compile(r'(^|\.)(gate|shared_expert_gate|router)(\.|$)')
UNSLOTH_MODEL_TYPES = ('qwen3_vl_moe', 'qwen3_5_moe', 'qwen3_moe', 'qwen3_vl', 'qwen3_5')
RUN_CONFIG_NAME = 'unsloth_run.json'
MARKER_FILE = 'swift_vora_adapter.json'  # written next to every adapter the runner saves (merge.py reads it)


class RouterTargeted(AssertionError):
    """A router/gate module got LoRA or stayed trainable."""


@dataclass
class UnslothRunConfig:
    """Everything the runner needs, resolved from the recipe; written as JSON by `swift-vora train`."""
    model_path: str
    model_type: str
    dataset: List[str]
    output_dir: str
    video_root: Optional[str] = None
    strict: bool = False
    max_length: Optional[int] = None
    lora_rank: int = 8
    lora_alpha: float = 32
    lora_dropout: float = 0.0  # Unsloth's fast LoRA kernels need dropout 0
    target_modules: List[str] = field(default_factory=list)
    target_parameters: List[str] = field(default_factory=list)  # used by the PEFT stand-in; Unsloth derives its own
    lr: float = 1e-4
    warmup_ratio: float = 0.05
    # the recipe's swift_args the runner takes (RUNNER_SWIFT_ARGS, parsed by swift sft's parser); the optimizer
    # settings it does not name are ms-swift's defaults (unsloth_runner.optimizer_and_schedule)
    swift_args: Dict[str, Any] = field(default_factory=dict)
    epochs: float = 1
    max_steps: Optional[int] = None
    micro_batch: int = 1
    grad_accum: int = 16
    gradient_checkpointing: Any = True  # True: checkpoints on the GPU | 'unsloth': offloaded to host RAM | False
    dtype: str = 'bfloat16'
    seed: int = 42
    logging_steps: int = 5
    save_steps: int = 100
    save_merged: bool = False
    autocast: bool = True  # forward under torch.autocast(dtype) when dtype is 16-bit (unsloth_runner.forward_autocast)
    prefetch: int = 2  # micro-batches encoded ahead on a background thread (backends/prefetch.py)
    encode_threads: int = 4  # threads encoding samples, one template each (prefetch.OrderedEncoder)
    loader: str = 'unsloth'  # 'unsloth' (GPU) | 'peft' (CPU stand-in used by the tests)
    is_moe: bool = True
    num_gpus: int = 1  # the replicas the plan counted per node (NPROC_PER_NODE); one step trains
    nodes: int = 1  # num_gpus x nodes x micro_batch x grad_accum samples

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + '\n'

    @classmethod
    def from_json(cls, text: str) -> 'UnslothRunConfig':
        data = json.loads(text)
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f'unknown keys in the Unsloth run config: {", ".join(unknown)}')
        return cls(**data)


def lora_targets(model: ModelSpec, requested: Any = 'all-linear') -> Dict[str, List[str]]:
    """LoRA targets for Unsloth / PEFT from the model's description (config.json as the planner read it): explicit
    leaf names (never 'all-linear', which misses the experts on multimodal models), the fused expert parameters for
    MoE, and never a router.

    `requested` is the recipe's train.target_modules: 'all-linear' (attention + linear attention + MLP/experts),
    'attention' (attention only), or an explicit list of leaf names (routers are rejected)."""
    hybrid = model.num_linear_attention_layers > 0  # Qwen3.5 / Qwen3-Next: Gated DeltaNet layers
    moe = model.is_moe
    if requested in ('all-linear', None):
        modules = ATTENTION_TARGETS + (LINEAR_ATTENTION_TARGETS if hybrid else []) + MLP_TARGETS
    elif requested == 'attention':
        modules = ATTENTION_TARGETS + (LINEAR_ATTENTION_TARGETS if hybrid else [])
    else:
        modules = [requested] if isinstance(requested, str) else list(requested)
        bad = [m for m in modules if m in ROUTER_LEAVES or ROUTER_PATTERN.search(m)]
        if bad:
            raise LaunchUsageError(f'train.target_modules {bad}: router/gate modules are never trained '
                                   '(routing must stay as pre-trained; LoRA on it changes which experts run)')
        if any(m == 'all-linear' for m in modules):
            raise LaunchUsageError('train.target_modules: all-linear cannot be combined with other names')
    parameters = []
    if moe and any(m in MLP_TARGETS for m in modules):
        parameters = [p for p in EXPERT_PARAMETERS if p.endswith('gate_up_proj') and {'gate_proj', 'up_proj'} & set(
            modules) or p.endswith('down_proj') and 'down_proj' in modules]
    return {'target_modules': modules, 'target_parameters': parameters}


def peft_kwargs(cfg: UnslothRunConfig) -> Dict[str, Any]:
    """Keyword arguments of Unsloth's FastModel.get_peft_model (unsloth 2026.10: models/vision.py)."""
    return {
        'r': cfg.lora_rank,
        'lora_alpha': cfg.lora_alpha,
        'lora_dropout': cfg.lora_dropout,
        'bias': 'none',
        'target_modules': list(cfg.target_modules),
        'finetune_vision_layers': False,  # frozen vision tower, as swift's freeze_vit
        'finetune_language_layers': True,
        'finetune_attention_modules': True,
        'finetune_mlp_modules': True,  # the MLP leaves reach the fused experts (split LoRA)
        'use_gradient_checkpointing': cfg.gradient_checkpointing,
        'random_state': cfg.seed,
    }


def from_pretrained_kwargs(cfg: UnslothRunConfig) -> Dict[str, Any]:
    """Keyword arguments of FastModel.from_pretrained (unsloth 2026.10: models/loader.py): 16-bit weights, never
    4/8-bit for MoE. Offline comes from HF_HUB_OFFLINE=1 in the environment."""
    return {
        'model_name': cfg.model_path,
        'dtype': None if cfg.dtype == 'auto' else cfg.dtype,
        'max_seq_length': cfg.max_length or 8192,
        'load_in_4bit': False,  # bitsandbytes 4-bit of fused expert tensors: no split-LoRA path, refused here
        'load_in_8bit': False,
        'full_finetuning': False,
        'use_gradient_checkpointing': cfg.gradient_checkpointing,
    }


def assert_router_frozen(model: Any) -> Dict[str, int]:
    """Check the live model: no LoRA under a router/gate module, router weights frozen, no LoRA in the vision
    tower. Returns counts {'lora_tensors', 'expert_lora_tensors', 'trainable_params'}; raises RouterTargeted."""
    lora, experts, trainable = 0, 0, 0
    offenders = []
    for name, param in model.named_parameters():
        is_lora = 'lora_' in name
        if param.requires_grad:
            trainable += param.numel()
        if ROUTER_PATTERN.search(_module_path(name)) and (is_lora or param.requires_grad):
            offenders.append(name)
        if is_lora:
            lora += 1
            if '.experts' in name or 'experts.' in name:
                experts += 1
            if '.visual.' in f'.{name}' or name.startswith('visual.'):
                offenders.append(name)
    if offenders:
        raise RouterTargeted(f'router/gate or vision parameters are trainable or carry LoRA: {offenders[:8]}'
                             f'{" ..." if len(offenders) > 8 else ""}')
    return {'lora_tensors': lora, 'expert_lora_tensors': experts, 'trainable_params': trainable}


def _module_path(param_name: str) -> str:
    """`a.b.mlp.gate.weight` -> `a.b.mlp.gate`; strips PEFT's adapter suffixes so a LoRA on the router shows."""
    parts = [p for p in param_name.split('.') if p not in ('weight', 'bias', 'default', 'base_layer')]
    parts = [p for p in parts if not p.startswith('lora_')]
    return '.'.join(parts)


def run_config(view: PlanView, recipe: Recipe) -> UnslothRunConfig:
    """The runner's settings. On N GPUs the run is N replicas (data_parallel.py): the default gradient accumulation
    keeps the global batch near 16 samples, as `swift sft` does for ddp."""
    if recipe['train.tuner'] != 'lora':
        raise LaunchUsageError('unsloth_split_lora trains LoRA only (train.tuner=lora)')
    refuse_unsloth_packing(recipe)
    model = view.described_model(recipe['model.path'])
    targets = lora_targets(model, recipe['train.target_modules'])
    datasets = recipe['data.dataset']
    grad_accum = recipe['train.grad_accum'] or max(1, 16 // (view.world * view.micro_batch))
    return UnslothRunConfig(
        model_path=recipe['model.path'], model_type=view.model_type,
        dataset=[datasets] if isinstance(datasets, str) else list(datasets),
        output_dir=recipe['train.output_dir'], video_root=recipe['data.video_root'], strict=recipe['data.strict'],
        max_length=recipe['data.max_length'], lora_rank=recipe['train.lora_rank'],
        lora_alpha=recipe['train.lora_alpha'], lora_dropout=0.0, target_modules=targets['target_modules'],
        target_parameters=targets['target_parameters'], lr=learning_rate(recipe),
        warmup_ratio=recipe['train.warmup_ratio'], swift_args=runner_swift_args(recipe), epochs=recipe['train.epochs'],
        max_steps=recipe['train.max_steps'],
        micro_batch=view.micro_batch, grad_accum=grad_accum,
        gradient_checkpointing=unsloth_gradient_checkpointing(view, recipe), dtype=recipe['train.dtype'],
        seed=recipe['train.seed'], logging_steps=recipe['train.logging_steps'], save_steps=recipe['train.save_steps'],
        save_merged=recipe['unsloth.save_merged'], autocast=recipe['unsloth.autocast'],
        encode_threads=recipe['unsloth.encode_threads'], is_moe=model.is_moe, num_gpus=view.num_gpus,
        nodes=view.nodes)


# The `swift sft` arguments the runner takes from a recipe's swift_args, by ms-swift's names: the optimizer and its
# schedule, which the runner builds as `swift sft` does -- a recipe that sets them trains with the same update on
# either path. The launch refuses the others (they have no meaning here).
RUNNER_SWIFT_ARGS = ('weight_decay', 'adam_beta1', 'adam_beta2', 'adam_epsilon', 'max_grad_norm', 'lr_scheduler_type',
                     'lr_scheduler_kwargs', 'warmup_steps')


# transformers' schedules that step on an evaluation metric (HF Trainer steps them after evaluating)
METRIC_SCHEDULES = ('reduce_lr_on_plateau', 'greedy')


def runner_swift_args(recipe: Recipe) -> Dict[str, Any]:
    """The recipe's swift_args among RUNNER_SWIFT_ARGS, as `swift sft`'s own argument parser reads them (names,
    types), and the schedule they describe built once on a stand-in optimizer, so that a scheduler name or keyword
    transformers does not take stops the launch instead of the run after its model has loaded."""
    given = {name: value for name, value in recipe['swift_args'].items() if name in RUNNER_SWIFT_ARGS}
    if not given:
        return {}
    from swift.arguments import SftArguments
    parser = engine_argument_parser(SftArguments)
    try:
        namespace, _ = parse_engine_argv(parser, swift_argv(given))  # every name is an SftArguments field
    except EngineArgumentError as e:
        raise LaunchUsageError(f'{recipe.path}: swift_args: swift sft rejects the arguments: {e}') from None
    parsed = {name: getattr(namespace, name) for name in given}
    kwargs = parsed.get('lr_scheduler_kwargs')
    if isinstance(kwargs, str):  # ms-swift's parser keeps the JSON text; its TrainingArguments decode it
        try:
            parsed['lr_scheduler_kwargs'] = kwargs = json.loads(kwargs)
        except json.JSONDecodeError as e:
            raise LaunchUsageError(f'{recipe.path}: swift_args.lr_scheduler_kwargs is not a JSON object: {e}') from None
    if kwargs is not None and not isinstance(kwargs, dict):
        raise LaunchUsageError(f'{recipe.path}: swift_args.lr_scheduler_kwargs must be a mapping, got {kwargs!r}')
    check_schedule(recipe, parsed.get('lr_scheduler_type'), kwargs)
    return parsed


def check_schedule(recipe: Recipe, name: Optional[str], kwargs: Optional[Dict[str, Any]]) -> None:
    """transformers' get_scheduler builds the schedule `name` with `kwargs` (None: ms-swift's cosine) on a stand-in
    optimizer; LaunchUsageError naming the schedules it knows when it cannot."""
    if name is None and not kwargs:
        return
    import torch
    from transformers import SchedulerType, get_scheduler
    if name is not None and name not in {s.value for s in SchedulerType}:
        raise LaunchUsageError(f'{recipe.path}: swift_args.lr_scheduler_type={name!r} is not a transformers schedule; '
                               f'one of {", ".join(s.value for s in SchedulerType)}')
    if name in METRIC_SCHEDULES:
        raise LaunchUsageError(f'{recipe.path}: swift_args.lr_scheduler_type={name!r} steps on an evaluation metric; '
                               'the Unsloth runner does not evaluate during training: take a schedule over the steps '
                               '(cosine, linear, cosine_with_min_lr, warmup_stable_decay, ...)')
    if name is None:
        name = swift_optimizer_defaults()['lr_scheduler_type']
    stand_in = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    try:
        get_scheduler(name, stand_in, num_warmup_steps=1, num_training_steps=10, scheduler_specific_kwargs=kwargs)
    except (TypeError, ValueError) as e:
        raise LaunchUsageError(f'{recipe.path}: swift_args: transformers cannot build the {name!r} schedule with '
                               f'lr_scheduler_kwargs {kwargs!r}: {e}') from None


CHECKPOINTING_VALUES = ('auto', True, 'unsloth', False)


def unsloth_gradient_checkpointing(view: PlanView, recipe: Recipe) -> Any:
    """FastModel's `use_gradient_checkpointing` from the recipe's unsloth.gradient_checkpointing: `auto` takes the
    plan's choice (checkpoints on the GPU -> True, offloaded to host RAM -> 'unsloth'); the others pass through."""
    value = recipe['unsloth.gradient_checkpointing']
    if not any(value is v or (isinstance(v, str) and value == v) for v in CHECKPOINTING_VALUES):
        raise LaunchUsageError(f'{recipe.path}: unsloth.gradient_checkpointing is {value!r}; one of auto, true '
                               '(checkpoints on the GPU), unsloth (offloaded to host RAM), false')
    if value != 'auto':
        return value
    return 'unsloth' if view.checkpoints == 'host' else True


# Unsloth compiles each decoder block as one torch.compile region by default. On a Qwen3.5-MoE video sample
# (~7.8k tokens, one H200, torch 2.11) the first forward under that compile did not finish in 270 s, while the same
# run without it trained (docs/runs/benchmarks-log.md, "MoE on one H200"). Off unless the caller's environment sets it.
BLOCK_COMPILE_ENV = 'UNSLOTH_BLOCK_COMPILE'


def unsloth_env(environ: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """Offline, no usage statistics, no tokenizer threads fighting workers, and Unsloth's per-block compile off
    unless `environ` (default: this process's) sets UNSLOTH_BLOCK_COMPILE. The kernel caches are the runner's to
    place, at run time (kernel_cache.py), so that a printed command names no folder of the machine that planned it."""
    environ = os.environ if environ is None else environ
    env = {
        'HF_HUB_OFFLINE': '1',
        'UNSLOTH_DISABLE_STATISTICS': '1',
        'TOKENIZERS_PARALLELISM': 'false',
        'UNSLOTH_RETURN_LOGITS': '0',
    }
    if BLOCK_COMPILE_ENV not in environ:
        env[BLOCK_COMPILE_ENV] = '0'
    return env


def build_unsloth_launch(view: PlanView, recipe: Recipe, environ: Optional[Mapping[str, str]] = None) -> Launch:
    from .deepspeed import launch_dir
    cfg = run_config(view, recipe)
    env = common_env(recipe, view, environ)
    env.update(unsloth_env(os.environ if environ is None else environ))
    path = os.path.join(launch_dir(recipe), RUN_CONFIG_NAME)
    if recipe['extra_args']:
        raise LaunchUsageError(f'{recipe.path}: extra_args are flags of swift/megatron; the Unsloth runner takes '
                               'its settings from the recipe (train.*, unsloth.*)')
    argv = [sys.executable, '-m', 'swift_vora.backends.unsloth_runner', path]
    notes = []
    launched = {**(os.environ if environ is None else environ), **env}
    if any(launched.get(k) for k in ('NPROC_PER_NODE', 'NNODES')):  # data_parallel.RELAUNCH_ENV, as swift sft
        alone = (launched.get('NPROC_PER_NODE') or '1') == '1' and (launched.get('NNODES') or '1') == '1'
        exchange = ('one process: trained as the one-GPU run, no DDP (no peer to all-reduce with)' if alone else
                    'each trains its own samples, DDP all-reduces the LoRA gradients, rank 0 writes')
        notes.append(f'{launched.get("NPROC_PER_NODE") or 1} process(es) per node, one replica each, through '
                     f'torchrun{" on " + launched["NNODES"] + " nodes" if launched.get("NNODES") else ""}: the runner '
                     'starts `python -m torch.distributed.run` itself from NPROC_PER_NODE / NNODES / NODE_RANK / '
                     f'MASTER_ADDR / MASTER_PORT, as `swift sft` does; {exchange}')
    if recipe['guards.callbacks']:
        notes.append('guards.callbacks are swift Trainer callbacks; the Unsloth runner does not run them '
                     '(its own checks: router frozen, experts trained, no 4-bit)')
    return Launch(argv=argv, env=env, files={path: cfg.to_json()}, notes=notes)


class UnslothRunner(Launcher):
    """MoE LoRA with Unsloth's split LoRA through `python -m swift_vora.backends.unsloth_runner`: on one GPU, or on
    N GPUs as N data-parallel replicas (the runner starts torchrun)."""
    backends = (Backend.UNSLOTH_SPLIT_LORA, )
    swift_args_taken = RUNNER_SWIFT_ARGS

    def build(self, view: PlanView, recipe: Recipe, environ: Optional[Mapping[str, str]] = None) -> Launch:
        return build_unsloth_launch(view, recipe, environ)
