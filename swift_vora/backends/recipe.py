"""Recipes: one YAML file that says what to train, on what, with which memory knobs.

A recipe is read with `yaml.safe_load` (through swift_vora/yaml_reader.py: a key written twice is an error naming
its line) and checked against `SCHEMA` below: an unknown key (a typo) or a value of the wrong type stops with an
error that names the file and the dotted key. Every key has a default except `model.path` and `data.dataset`.

Overrides (`swift-vora train RECIPE.yaml key=value ...`): `key` is a dotted path into the recipe
(`video.max_frames=16`, `model.path=/models/x`, `train.backend=deepspeed_zero3`, `megatron.ep=4`); `value`
is parsed as a YAML scalar or flow collection (`true`, `16`, `1e-4`, `null`, `[q_proj, v_proj]`,
`{A: 1}`), so types are the same as in the file. Overrides are applied in order, after the file, and are
checked like the file. A dict-valued key (`env`, `guards.env`, `deepspeed.zero_optimization`, `swift_args`) can
be set whole (`env={A: 1}`) or per entry (`env.A=1`).

ms-swift's own argument names are accepted wherever the schema has a shorter name for the same setting
(`ALIASES`: `train.learning_rate` is `train.lr`, `train.per_device_train_batch_size` is `train.micro_batch`, ...),
in the file and in overrides; setting both names of one key is an error. Any other `swift sft` / `megatron sft`
argument goes in `swift_args` (checked against the engine's own argument parser before launch,
swift_vora.backends.launch.check_engine_args).
"""
from __future__ import annotations

import copy
import math
import os
import re
import reprlib
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .. import switches
from ..jsonl import is_text
from ..plan.backend import AUTO, Backend

REQUIRED = object()
ANY_DICT = 'dict'  # free-form mapping (entries not checked)

# dotted key -> (accepted types, default). Types: python types or ANY_DICT. The comments are the documentation
# of every key; docs/backends.md repeats them with examples.
SCHEMA: Dict[str, Tuple[tuple, Any]] = {
    # --- where ---------------------------------------------------------------------------------------------
    'hardware': ((str, type(None)), None),  # planner profile: 3060x4 | 3090x3 | h200x1 | h200x8 | local
    'gpus': ((int, type(None)), None),  # GPUs per node (instead of `hardware`)
    'gpu_mem_gib': ((int, float, type(None)), None),  # memory of one GPU, GiB (with `gpus`)
    'host_ram_gib': ((int, float, type(None)), None),  # host RAM per node, GiB (overrides the profile's)
    'nodes': ((int, ), 1),  # nodes; >1 launches through torchrun rendezvous (NNODES/NODE_RANK/MASTER_ADDR)
    # `train` compares the planned hardware with this machine's (doctor's probe) and refuses a launch that cannot run
    # here (fewer GPUs, less memory, no bf16); false: trust the recipe (a CPU run planned against a stand-in GPU)
    'hardware_check': ((bool, ), True),
    # --- what ----------------------------------------------------------------------------------------------
    'model.path': ((str, ), REQUIRED),  # local model directory (download it yourself; nothing is fetched)
    'model.type': ((str, type(None)), None),  # ms-swift --model_type; default: config.json's model_type
    'data.dataset': ((str, list), REQUIRED),  # annotation JSONL (windowed by the video_ora dataset) or rows
    'data.video_root': ((str, type(None)), None),  # directory relative video paths are resolved against
    'data.window': ((int, float, type(None)), None),  # clip length in seconds (None: the dataset's default)
    'data.stride': ((int, float, type(None)), None),  # clip stride in seconds
    'data.min_event': ((int, float, type(None)), None),  # drop event slivers shorter than this at clip edges
    'data.max_length': ((int, type(None)), None),  # token cap per sample; the template drops frames to fit
    'data.strict': ((bool, ), False),  # stop at the first invalid annotation line
    # --- video budget (swift_vora.budget.VideoBudget; exported as SWIFT_VORA_* env) -------------------------
    'video.fps': ((int, float), 2.0),  # frames per second of clip; higher = finer timing, more tokens
    'video.min_frames': ((int, ), 4),  # never fewer frames per clip
    'video.max_frames': ((int, ), 64),  # frame cap per clip: the first knob to turn down when it does not fit
    'video.pair_tokens': ((int, ), 256),  # tokens per frame pair (resolution): the second knob
    'video.min_pair_tokens': ((int, ), 16),  # lowest resolution a frame pair may be shrunk to
    'video.max_video_tokens': ((int, type(None)), None),  # hard cap on one clip's video tokens
    # --- training ------------------------------------------------------------------------------------------
    'train.backend': ((str, ), 'auto'),  # auto | ddp | deepspeed_zero2 | deepspeed_zero3 | megatron_ep_lora |
    #                                      megatron_ep_full | unsloth_split_lora (auto: the planner chooses)
    'train.tuner': ((str, ), 'lora'),  # lora | full | selective (full training of attention + shared experts)
    # none | 4bit: 4bit = QLoRA (bitsandbytes NF4 base, double quantization; dense models, tuner lora), what the
    # planner may suggest when bf16 weights do not fit (`swift-vora plan --quant 4bit`)
    'train.quantization': ((str, ), 'none'),
    'train.lora_rank': ((int, ), 8),  # LoRA rank; memory and trainable parameters grow linearly with it
    'train.lora_alpha': ((int, float), 32),  # LoRA scaling numerator
    'train.lora_dropout': ((int, float), 0.05),
    'train.target_modules': ((str, list), 'all-linear'),  # LoRA targets (swift/Megatron syntax)
    'train.micro_batch': ((int, ), 1),  # samples per GPU per step; activations scale with it
    'train.grad_accum': ((int, type(None)), None),  # gradient accumulation (None: a total batch of 16)
    'train.epochs': ((int, float), 1),
    'train.max_steps': ((int, type(None)), None),  # stop after this many optimizer steps
    # None: ms-swift's own default for the tuner -- 1e-4 for LoRA, 1e-5 where whole weights train (full,
    # selective); `learning_rate(recipe)` resolves it for every backend
    'train.lr': ((int, float, type(None)), None),
    'train.warmup_ratio': ((int, float), 0.05),
    'train.save_steps': ((int, ), 100),
    'train.logging_steps': ((int, ), 5),
    'train.gradient_checkpointing': ((bool, ), True),  # recompute activations: much less memory, ~30 % slower
    # With gradient checkpointing: checkpoint only the first N decoder layers, the others keep their activations
    # (swift_vora/speed/partial_checkpoint.py; swift sft and Unsloth). None: all. The plan says which N fit; 'auto':
    # the plan picks the fewest that fit (plan/fit.py), every layer where none fewer does.
    'train.checkpoint_layers': ((int, str, type(None)), None),
    'train.freeze_vit': ((bool, ), True),  # keep the vision tower frozen (LoRA on the language model only)
    'train.dtype': ((str, ), 'bfloat16'),  # bfloat16 | float16 | float32 (float32: CPU only)
    'train.attn_impl': ((str, type(None)), 'sdpa'),  # sdpa | flash_attn | eager (flash_attn: install it)
    # Liger's Triton kernels (RMSNorm, RoPE, fused linear cross entropy; swift sft --use_liger_kernel true), faster
    # at no more memory on swift-vora's LoRA path without train.compile (docs/benchmarks.md). GPU + the
    # liger-kernel package (pip install liger-kernel) needed.
    'train.liger_kernel': ((bool, ), False),
    # Regional torch.compile of the LLM decoder layers and the vision blocks (swift_vora/speed/compile_layers.py):
    # off | layers. With it, training sequences are padded at their end to a multiple of 64 tokens
    # (swift_vora/speed/shape_bucket.py). The fastest dense LoRA path measured, at less memory than plain swift sft
    # (docs/benchmarks.md); the first step pays the compile. Not applied under DeepSpeed; measured slower with
    # liger_kernel.
    'train.compile': ((str, ), 'off'),
    # FP8 GEMMs for the frozen base linears of the decoder, their weights held in FP8 (swift_vora/speed/fp8_frozen.py,
    # torchao): off | frozen_base. LoRA on the ddp or deepspeed_zero2 backend, GPUs with FP8 tensor cores (compute
    # capability 8.9+: 4090, L40S, H100, H200, 5090); the plan refuses it elsewhere with the reason.
    'train.fp8': ((str, ), 'off'),
    # Pack samples into rows instead of padding them (swift_vora/speed/packed_attention.py): off | micro_batch
    # (swift sft --padding_free: each micro-batch is one row) | dataset (--packing: rows filled up to max_length
    # from the whole dataset). Attention stays within each sample; with train.attn_impl sdpa it runs as
    # `vora_varlen` (torch's varlen flash kernel, no flash-attn package needed). It pays where sample lengths differ:
    # on equal-length clips the H200 ran a packed micro-batch of 4 slower than the padded one (docs/benchmarks.md,
    # runs 14b-c), so it stays off by default.
    'train.packing': ((str, ), 'off'),
    'train.dataloader_workers': ((int, ), 2),  # decode workers per GPU; each holds decoded frames in RAM
    'train.output_dir': ((str, ), 'output/swift-vora'),
    'train.add_version': ((bool, ), True),  # swift appends v<N>-<time> to output_dir (never overwrites)
    'train.seed': ((int, ), 42),
    # --- DeepSpeed (dense models; swift sft --deepspeed <generated json>) -------------------------------------
    'deepspeed.offload': ((str, type(None)), None),  # none | cpu (None: what the planner decided)
    'deepspeed.zero_optimization': (ANY_DICT, {}),  # entries merged over the generated zero_optimization
    # --- Megatron (MoE on several GPUs; megatron sft) --------------------------------------------------------
    'megatron.ep': ((int, type(None)), None),  # expert parallel size (None: the planner's)
    'megatron.tp': ((int, type(None)), None),  # tensor parallel size (None: the planner's)
    'megatron.pp': ((int, ), 1),  # pipeline parallel size
    'megatron.global_batch': ((int, ), 16),  # samples per optimizer step over all GPUs
    'megatron.recompute': ((str, ), 'full'),  # full | selective | none: full saves the most memory
    'megatron.recompute_num_layers': ((int, ), 1),  # layers per recompute chunk (uniform method)
    'megatron.moe_grouped_gemm': ((bool, ), True),  # one grouped GEMM for all local experts
    'megatron.moe_permute_fusion': ((bool, ), True),  # fused token permutation (needs TE >= 2.1)
    # native: Megatron's fused vocab-parallel CE (ms-swift's default; 10 bytes per position x vocab) | te: TE's fused
    # CE (2 bytes per position x vocab; swift_vora/plan/constants.py)
    'megatron.cross_entropy_fusion_impl': ((str, ), 'native'),
    # megatron-core's precision-aware optimizer (--use_precision_aware_optimizer): Transformer Engine's FusedAdam keeps
    # the master weights and writes the bf16 weights in its multi-tensor kernels, instead of one copy kernel per
    # trainable tensor. Full SFT: the master as bf16 + a 16-bit remainder, 2 bytes a parameter less than the plan counts
    'megatron.precision_aware_optimizer': ((bool, ), False),
    'megatron.attention_backend': ((str, ), 'fused'),  # TE cuDNN attention; flash needs flash-attn (none: torch 2.11)
    'megatron.merge_lora': ((bool, ), True),  # save checkpoint-N-merged (HF safetensors, LoRA merged)
    # megatron_ep_full: keep the MoE router's weights as they are (--freeze_parameters_regex over the TopKRouter
    # weights); false trains them with the rest of the language model. LoRA never trains the router.
    'megatron.freeze_router': ((bool, ), False),
    # --- Unsloth (MoE on one GPU; python -m swift_vora.backends.unsloth_runner) -----------------------------
    # auto: layer checkpoints on the GPU when the plan fits so, else offloaded | true: on the GPU | 'unsloth': offloaded
    # to pinned host RAM | false: no checkpointing
    'unsloth.gradient_checkpointing': ((str, bool), 'auto'),
    'unsloth.save_merged': ((bool, ), False),  # also write merged 16-bit weights (save_pretrained_merged)
    # the forward under autocast in train.dtype, as HF Trainer runs a 16-bit model (false: LoRA GEMMs in fp32)
    'unsloth.autocast': ((bool, ), True),
    # threads decoding + encoding samples, one template each (one was too slow for a short MoE step on the H200)
    'unsloth.encode_threads': ((int, ), 4),
    # --- guards, environment, escape hatch ----------------------------------------------------------------
    'guards.callbacks': ((list, ), []),  # names registered in swift's callbacks_map, passed as --callbacks
    'guards.env': (ANY_DICT, {}),  # environment for the guards (strings)
    'env': (ANY_DICT, {}),  # extra environment for the launched process (not overriding SWIFT_VORA_* set here)
    'extra_args': ((list, ), []),  # appended verbatim to the launcher's argv (checked: no backend switches)
    # any `swift sft` / `megatron sft` argument the keys above do not model, by its ms-swift name:
    # {neftune_noise_alpha: 5, lr_scheduler_type: cosine} -> --neftune_noise_alpha 5 --lr_scheduler_type cosine;
    # checked against the engine's own argument parser (ms-swift's HfArgumentParser) before launch; the Unsloth
    # runner takes the optimizer's (backends/unsloth.py RUNNER_SWIFT_ARGS) and refuses the others
    'swift_args': (ANY_DICT, {}),
}

# ms-swift's argument name (as `swift sft --help` spells it) -> the schema key for the same setting. Both work in
# a recipe and in overrides; docs/backends.md lists them.
ALIASES: Dict[str, str] = {
    'model.model': 'model.path',
    'model.model_type': 'model.type',
    'train.tuner_type': 'train.tuner',
    'train.learning_rate': 'train.lr',
    'train.per_device_train_batch_size': 'train.micro_batch',
    'train.gradient_accumulation_steps': 'train.grad_accum',
    'train.num_train_epochs': 'train.epochs',
    'train.torch_dtype': 'train.dtype',
    'train.use_liger_kernel': 'train.liger_kernel',
    'train.dataloader_num_workers': 'train.dataloader_workers',
    'megatron.expert_model_parallel_size': 'megatron.ep',
    'megatron.tensor_model_parallel_size': 'megatron.tp',
    'megatron.pipeline_model_parallel_size': 'megatron.pp',
    'megatron.global_batch_size': 'megatron.global_batch',
    'megatron.recompute_granularity': 'megatron.recompute',
}
# train.attn_impl -> the attention packed rows run with (sdpa cannot see the sample boundaries of a packed row)
PACKING_ATTENTION = {'sdpa': 'vora_varlen', None: 'vora_varlen', 'vora_varlen': 'vora_varlen',
                     'flash_attn': 'flash_attn', 'flash_attention_2': 'flash_attention_2'}
# ms-swift argument name -> the recipe key that sets it (a `swift_args` entry may not set these twice)
MODELLED_ARGS: Dict[str, str] = {
    **{k.split('.', 1)[1]: k for k in SCHEMA if k.split('.')[0] in ('model', 'data', 'train')
       and k.split('.', 1)[1] in ('lora_rank', 'lora_alpha', 'lora_dropout', 'target_modules', 'max_steps',
                                  'warmup_ratio', 'save_steps', 'logging_steps', 'gradient_checkpointing',
                                  'freeze_vit', 'attn_impl', 'output_dir', 'add_version', 'seed', 'max_length',
                                  'dataset', 'strict')},
    'padding_free': 'train.packing', 'packing': 'train.packing',
    # the plan's logits term depends on the loss (megatron sft gets both, the fusion always on)
    'cross_entropy_fusion_impl': 'megatron.cross_entropy_fusion_impl',
    'cross_entropy_loss_fusion': 'megatron.cross_entropy_fusion_impl',
    'use_precision_aware_optimizer': 'megatron.precision_aware_optimizer',
    **{k.split('.', 1)[1]: k for k in ALIASES},
    'quant_method': 'train.quantization', 'quant_bits': 'train.quantization', 'deepspeed': 'train.backend',
    'template': 'the video_ora template (always)', 'custom_register_path': 'the plugin (always)',
}
# dotted key -> (lowest, highest, lowest allowed itself). Every number in a recipe is finite, and these are in
# range: a NaN passes every comparison, and a frame rate of .inf or a rank of 10**9 sizes the plan and the
# launch with absurd numbers instead of stopping here.
RANGES: Dict[str, Tuple[float, float, bool]] = {
    'gpus': (1, 4096, True), 'gpu_mem_gib': (0, 1e5, False), 'host_ram_gib': (0, 1e6, False),
    'nodes': (1, 4096, True),
    'data.window': (0, 7 * 24 * 3600, True), 'data.stride': (0.1, 7 * 24 * 3600, True),
    'data.min_event': (0, 3600, True), 'data.max_length': (1, 10_000_000, True),
    'video.fps': (0, 240, False), 'video.min_frames': (1, 100_000, True), 'video.max_frames': (1, 100_000, True),
    'video.pair_tokens': (1, 1_000_000, True), 'video.min_pair_tokens': (1, 1_000_000, True),
    'video.max_video_tokens': (1, 100_000_000, True),
    'train.lora_rank': (1, 65536, True), 'train.lora_alpha': (0, 1e6, False), 'train.lora_dropout': (0, 1, True),
    'train.micro_batch': (1, 1_000_000, True), 'train.grad_accum': (1, 1_000_000, True),
    'train.epochs': (0, 1e6, False), 'train.max_steps': (1, 1e12, True), 'train.lr': (0, 10, False),
    'train.warmup_ratio': (0, 1, True), 'train.save_steps': (1, 1e12, True), 'train.logging_steps': (1, 1e12, True),
    'train.dataloader_workers': (0, 1024, True), 'train.seed': (0, 2 ** 32 - 1, True),
    'train.checkpoint_layers': (0, 100_000, True),
    'megatron.ep': (1, 4096, True), 'megatron.tp': (1, 4096, True), 'megatron.pp': (1, 4096, True),
    'megatron.global_batch': (1, 1e9, True), 'megatron.recompute_num_layers': (1, 100_000, True),
    'unsloth.encode_threads': (1, 256, True),
}
SECTIONS = sorted({k.split('.')[0] for k in SCHEMA if '.' in k})
FREE_DICTS = tuple(k for k, (t, _) in SCHEMA.items() if t == ANY_DICT)


# ms-swift's learning-rate defaults (SftArguments / MegatronArguments: 1e-5 for --tuner_type full, else 1e-4); the
# planner's 'selective' tuner runs as --tuner_type full, so it takes full's
DEFAULT_LR = {'lora': 1e-4, 'full': 1e-5, 'selective': 1e-5}


def learning_rate(recipe: 'Recipe') -> float:
    """The recipe's train.lr, or ms-swift's default for its tuner where it sets none."""
    lr = recipe['train.lr']
    return float(lr) if lr is not None else DEFAULT_LR[recipe['train.tuner']]


def _positive_number(value: Any) -> bool:
    """A number above zero, or text that reads as one (swift_args may hold either)."""
    if isinstance(value, bool):
        return False
    try:
        return float(value) > 0
    except (TypeError, ValueError):
        return False


class RecipeError(ValueError):
    """A recipe or an override that cannot be used; the message names the file and the key."""


@dataclass
class Recipe:
    path: str  # the file it came from ('<overrides>' when built in code)
    values: Dict[str, Any]  # dotted key -> value, every SCHEMA key present
    overrides: List[str] = field(default_factory=list)
    # the keys the file or an override set (the others hold SCHEMA's defaults): what the planner keeps as the user
    # set it, where it would otherwise search (swift_vora/backends/planning.py)
    given: frozenset = frozenset()

    def __getitem__(self, key: str) -> Any:
        return self.values[ALIASES.get(key, key)]

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(ALIASES.get(key, key), default)

    def section(self, name: str) -> Dict[str, Any]:
        prefix = name + '.'
        return {k[len(prefix):]: v for k, v in self.values.items() if k.startswith(prefix)}

    def with_overrides(self, overrides: Sequence[str]) -> 'Recipe':
        """This recipe with more `key=value` overrides applied and checked, as `swift-vora train RECIPE ...` would
        read it (RecipeError when they do not make a recipe)."""
        values = copy.deepcopy(self.values)
        set_now = {}
        apply_overrides(set_now, overrides)
        apply_overrides(values, overrides)
        _check(values, f'{self.path} (with overrides)')
        return Recipe(path=self.path, values=values, overrides=[*self.overrides, *overrides],
                      given=self.given | frozenset(set_now))


def _flatten(doc: Dict[str, Any], where: str) -> Dict[str, Any]:
    flat: Dict[str, Any] = {}
    spelled: Dict[str, str] = {}  # schema key -> the name the file used (an ms-swift alias or the key)

    def walk(node: Dict[str, Any], prefix: str) -> None:
        for key, value in node.items():
            if not isinstance(key, str):
                raise RecipeError(f'{where}: key {key!r} under {prefix or "the top level"!r} is not a string')
            written = f'{prefix}.{key}' if prefix else key
            dotted = ALIASES.get(written, written)
            if dotted in SCHEMA:
                if dotted in flat:
                    raise RecipeError(f'{where}: {spelled[dotted]!r} and {written!r} are the same setting; keep one')
                flat[dotted], spelled[dotted] = value, written
            elif isinstance(value, dict) and dotted in SECTIONS:
                walk(value, dotted)
            elif dotted in SECTIONS:
                raise RecipeError(f'{where}: key {dotted!r} must be a mapping of settings, got {_show(value)}')
            else:
                raise RecipeError(f'{where}: unknown key {written!r}{_suggest(written)}')

    walk(doc, '')
    return flat


def _suggest(key: str) -> str:
    import difflib
    close = difflib.get_close_matches(key, [*SCHEMA, *ALIASES], n=1)
    return f' (did you mean {close[0]!r}?)' if close else ''


# Keys with a fixed set of values.
CHOICES = {
    'train.backend': (AUTO, *Backend),
    'train.tuner': ('lora', 'full', 'selective'),
    'train.quantization': ('none', '4bit'),
    'train.dtype': ('bfloat16', 'float16', 'float32'),
    'train.compile': switches.switch('SWIFT_VORA_COMPILE').choices,
    'train.fp8': switches.switch('SWIFT_VORA_FP8').choices,
    'train.packing': ('off', 'micro_batch', 'dataset'),
    'deepspeed.offload': (None, 'none', 'cpu'),
    'megatron.recompute': ('full', 'selective', 'none'),
    'megatron.cross_entropy_fusion_impl': ('native', 'te'),  # ms-swift 4.6 MegatronArguments' Literal
}
# Keys with an 'off' choice: PyYAML's safe_load (YAML 1.1) turns `packing: off` and `train.packing=off` into False
# before the recipe sees them.
OFF_KEYS = tuple(key for key, allowed in CHOICES.items() if 'off' in allowed)


# A recipe holds about a hundred values. YAML aliases let a few lines stand for billions of them ("billion laughs":
# nine aliases of nine aliases ...), which cost nothing to load but exhaust memory when the launch turns them into
# argv, JSON or environment strings; so the values a recipe stands for, aliases expanded, are counted first.
MAX_RECIPE_VALUES = 100_000
MAX_RECIPE_CHARS = 1024 * 1024  # a recipe file is a few kilobytes
# Keys whose values go into the launched command or its files as text: a string that reads as a non-finite number
# (`nan`, `inf`, `1e400`) would reach ms-swift's float arguments as one.
NUMERIC_TEXT_KEYS = ('swift_args', 'extra_args')


def _check_size(values: Dict[str, Any], where: str) -> None:
    """RecipeError naming the key whose value expands (YAML aliases followed) past MAX_RECIPE_VALUES, or refers to
    itself. Linear in the nodes as loaded: the size of a shared node is computed once."""
    sizes: Dict[int, int] = {}
    open_nodes = set()

    def size(node: Any, path: str) -> int:
        if not isinstance(node, (dict, list)):
            return 1
        known = sizes.get(id(node))
        if known is not None:
            return known
        if id(node) in open_nodes:
            raise RecipeError(f'{where}: key {path!r} contains itself (a YAML alias inside its own anchor)')
        open_nodes.add(id(node))
        items = node.items() if isinstance(node, dict) else enumerate(node)
        total = 1
        for k, v in items:
            total += size(v, f'{path}.{k}' if isinstance(node, dict) else f'{path}[{k}]')
            if total > MAX_RECIPE_VALUES:
                raise RecipeError(f'{where}: key {path!r} stands for more than {MAX_RECIPE_VALUES:,} values once its '
                                  'YAML aliases are expanded; a recipe is not that large (write the values out)')
        open_nodes.discard(id(node))
        sizes[id(node)] = total
        return total

    total = 0
    for key, value in values.items():
        total += size(value, key)
        if total > MAX_RECIPE_VALUES:
            raise RecipeError(f'{where}: the recipe stands for more than {MAX_RECIPE_VALUES:,} values once its YAML '
                              f'aliases are expanded (at key {key!r})')


def _check_finite(values: Dict[str, Any], where: str) -> None:
    """Every number inside the free-form keys (`swift_args`, `extra_args`, `env`, `deepspeed.zero_optimization`, ...)
    is finite, and so is every string of `swift_args`/`extra_args` that reads as a number; every string is text;
    RecipeError naming the entry otherwise (`.nan` there was passed into the command as `nan`)."""
    def walk(node: Any, path: str, free: bool, text_too: bool) -> None:
        if free and isinstance(node, float) and not math.isfinite(node):
            raise RecipeError(f'{where}: key {path!r} must be a finite number, got {_show(node)}')
        if isinstance(node, str):
            if text_too and _reads_as_non_finite(node):
                raise RecipeError(f'{where}: key {path!r} must be a finite number, got {_show(node)}')
            if not is_text(node):  # "\ud800" in YAML: no argv, environment or file can carry it
                raise RecipeError(f'{where}: key {path!r} holds a lone UTF-16 surrogate, which is not text')
        if isinstance(node, dict):
            for k, v in node.items():
                if isinstance(k, str) and not is_text(k):
                    raise RecipeError(f'{where}: a key under {path!r} holds a lone UTF-16 surrogate, which is not '
                                      'text')
                walk(v, f'{path}.{k}', free, text_too)
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f'{path}[{i}]', free, text_too)

    free_keys = (*FREE_DICTS, 'extra_args', 'guards.callbacks')
    for key, value in values.items():
        walk(value, key, key in free_keys, key in NUMERIC_TEXT_KEYS)


def _reads_as_non_finite(text: str) -> bool:
    try:
        return not math.isfinite(float(text.strip()))
    except ValueError:
        return False


def _check(values: Dict[str, Any], where: str) -> None:
    _check_size(values, where)
    _check_finite(values, where)
    for key, (types, default) in SCHEMA.items():
        value = values.get(key, REQUIRED)
        if value is REQUIRED:
            if default is REQUIRED:
                raise RecipeError(f'{where}: missing required key {key!r}')
            values[key] = copy.deepcopy(default)
            continue
        if types == ANY_DICT:
            if value is None:
                values[key] = {}
            elif not isinstance(value, dict):
                raise RecipeError(f'{where}: key {key!r} must be a mapping, got {_show(value)}')
            continue
        if isinstance(value, str) and float in types:  # PyYAML (YAML 1.1) reads 2e-5 as a string
            try:
                value = values[key] = float(value)
            except ValueError:
                pass
        if value is False and key in OFF_KEYS:  # YAML 1.1 reads a bare `off` as false: the user wrote 'off'
            value = values[key] = 'off'
        if isinstance(value, bool) and bool not in types:
            raise RecipeError(f'{where}: key {key!r} must be {_type_names(types)}, got {_show(value)}')
        if not isinstance(value, types):
            raise RecipeError(f'{where}: key {key!r} must be {_type_names(types)}, got {_show(value)}')
    for key, allowed in CHOICES.items():
        if values[key] not in allowed:
            raise RecipeError(f'{where}: key {key!r} must be one of {", ".join(map(str, allowed))}; '
                              f'got {values[key]!r}')
    if values['train.packing'] == 'dataset' and values['data.max_length'] is None:
        raise RecipeError(f'{where}: train.packing=dataset fills rows up to data.max_length tokens, and '
                          f'data.max_length is not set (ms-swift would pack up to the model\'s whole context, hundreds '
                          f'of thousands of tokens per row); set data.max_length, e.g. two or three times the tokens '
                          f'per sample that `swift-vora plan` prints')
    if values['train.packing'] != 'off' and values['train.attn_impl'] not in PACKING_ATTENTION:
        raise RecipeError(f'{where}: train.packing={values["train.packing"]} needs an attention that keeps packed '
                          f'samples apart; train.attn_impl={values["train.attn_impl"]!r} does not (sdpa packs as '
                          f'vora_varlen; flash_attn works too)')
    if isinstance(values['train.checkpoint_layers'], str) and values['train.checkpoint_layers'] != AUTO:
        raise RecipeError(f'{where}: key \'train.checkpoint_layers\' must be a number of layers or auto, got '
                          f'{_show(values["train.checkpoint_layers"])}')
    if values['train.checkpoint_layers'] is not None and not values['train.gradient_checkpointing']:
        raise RecipeError(f'{where}: train.checkpoint_layers={values["train.checkpoint_layers"]} says how many layers '
                          f'to checkpoint, but train.gradient_checkpointing is false (nothing is checkpointed); '
                          f'set gradient_checkpointing true, or drop checkpoint_layers')
    for key, (low, high, low_ok) in RANGES.items():
        value = values[key]
        if value is None or isinstance(value, (bool, str)):  # a string here is checkpoint_layers' auto
            continue
        if not math.isfinite(value):
            raise RecipeError(f'{where}: key {key!r} must be a finite number, got {_show(value)}')
        if value < low or (value == low and not low_ok) or value > high:
            raise RecipeError(f'{where}: key {key!r} must be {">=" if low_ok else ">"} {low:g} and <= {high:g}, '
                              f'got {_show(value)}')
    if values['video.min_frames'] > values['video.max_frames']:
        raise RecipeError(f'{where}: key \'video.min_frames\' ({values["video.min_frames"]}) is above '
                          f'\'video.max_frames\' ({values["video.max_frames"]}): the template would sample '
                          f'{values["video.min_frames"]} frames, past the cap; lower the minimum or raise the cap')
    if values['data.window'] and values['data.window'] < 1:
        raise RecipeError(f'{where}: key \'data.window\' must be 0/null (whole video) or at least 1 s, '
                          f'got {values["data.window"]!r}')
    for name, value in values['swift_args'].items():
        if not isinstance(name, str) or not name or name.startswith('-'):
            raise RecipeError(f'{where}: swift_args: {name!r}: give the ms-swift argument name without dashes '
                              '(neftune_noise_alpha: 5)')
        if value is None:
            raise RecipeError(f'{where}: swift_args.{name} is null; remove it to keep ms-swift\'s default')
        if name in MODELLED_ARGS:
            raise RecipeError(f'{where}: swift_args.{name}: set {MODELLED_ARGS[name]!r} instead (swift-vora train '
                              f'passes it as --{name} and plans with it)')
    if _positive_number(values['swift_args'].get('warmup_steps')) and values['train.warmup_ratio']:
        # ms-swift refuses the pair when the launched process parses its arguments; said here, before launch
        raise RecipeError(f'{where}: swift_args.warmup_steps and \'train.warmup_ratio\' '
                          f'({_show(values["train.warmup_ratio"])}) both set the warm-up and ms-swift takes one: '
                          'set train.warmup_ratio=0 to count it in steps, or drop swift_args.warmup_steps')
    for key in ('guards.env', 'env'):
        for name, value in values[key].items():
            problem = env_entry_problem(name, value)
            if problem:
                dotted = f'{key}.{name}' if isinstance(name, str) and ENV_NAME.fullmatch(name) else key
                raise RecipeError(f'{where}: key {dotted!r}: {problem}')
    for key in ('extra_args', 'guards.callbacks'):
        if not all(isinstance(a, (str, int, float)) and not isinstance(a, bool) for a in values[key]):
            raise RecipeError(f'{where}: key {key!r} must be a list of strings')
        values[key] = [str(a) for a in values[key]]
    if isinstance(values['data.dataset'], list):
        if not values['data.dataset'] or not all(isinstance(d, str) for d in values['data.dataset']):
            raise RecipeError(f'{where}: key \'data.dataset\' must be a path or a non-empty list of paths')


# Environment the launch derives from the recipe; `env` / `guards.env` may not set them (SWIFT_VORA_* switches
# without a recipe key of their own may be set there: swift_vora/switches.py).
RESERVED_ENV_PREFIXES = ('SWIFT_VORA_', 'NPROC_PER_NODE', 'NNODES')
RENDEZVOUS = ('NODE_RANK', 'MASTER_ADDR', 'MASTER_PORT')
ENV_NAME = re.compile(r'[A-Za-z_][A-Za-z0-9_]*')  # what a shell, `env` and every launcher accept


def env_entry_problem(name: Any, value: Any) -> Optional[str]:
    """Why `name: value` of a recipe's `env` / `guards.env` cannot be put in the launched process's environment
    (None: it can). Checked where the recipe is read, so that `plan`, `train --dry-run` and the launch refuse it
    alike, before anything loads: a name a shell cannot export, a list or mapping (no environment variable holds
    one), a NUL byte, a variable the launch sets from other keys, or a `SWIFT_VORA_*` switch given a value it
    refuses (the trainer would refuse it after the model had loaded)."""
    if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
        return (f'environment name {_show(name)} is not a variable name (letters, digits and _, not starting with a '
                'digit)')
    where = f'{name}={_show(value)}'
    if isinstance(value, (list, dict)):
        return f'{where}: an environment value is one string, number or true/false, not a {type(value).__name__}'
    if isinstance(value, str) and '\0' in value:
        return f'{name}: the value holds a NUL byte, which no environment variable can carry'
    if name.startswith(switches.PREFIX):  # a switch of the table's `env` column, with a value it accepts
        return switches.recipe_env_error(name, value)
    if name.startswith(RESERVED_ENV_PREFIXES) or name in RENDEZVOUS:
        return f'{name}: set by swift-vora train from the recipe (use the nodes key instead)'
    return None


def _show(value: Any) -> str:
    """A value for an error message: depth and length bounded (a recipe value can be a deep or huge structure)."""
    return reprlib.repr(value)


def _type_names(types: tuple) -> str:
    names = {str: 'a string', int: 'an integer', float: 'a number', bool: 'true/false', list: 'a list',
             type(None): 'null'}
    return ' or '.join(names.get(t, t.__name__) for t in types)


def _load_yaml(text: str) -> Any:
    """The recipe's YAML (swift_vora/yaml_reader.py: `safe_load`, a key written twice refused, a number too large for
    a float kept for the range checks to refuse by its key)."""
    from .. import yaml_reader
    return yaml_reader.load(text)


def parse_override(text: str) -> Tuple[str, Any]:
    """`key=value` -> (dotted key, YAML-parsed value)."""
    import yaml

    from ..yaml_reader import duplicate_keys_error
    if '=' not in text:
        raise RecipeError(f'override {_show(text)}: expected key=value (e.g. video.max_frames=16)')
    key, raw = text.split('=', 1)
    key = key.strip()
    if not key:
        raise RecipeError(f'override {_show(text)}: empty key')
    try:
        value = _load_yaml(raw) if raw.strip() else None
    except RecursionError:
        raise RecipeError(f'override {_show(text)}: value nested too deeply') from None
    except duplicate_keys_error() as e:
        raise RecipeError(f'override {_show(text)}: {e.problem}') from None
    except yaml.YAMLError as e:
        raise RecipeError(f'override {_show(text)}: value is not valid YAML ({e.__class__.__name__})') from None
    return key, value


def apply_overrides(values: Dict[str, Any], overrides: Sequence[str]) -> None:
    for text in overrides:
        key, value = parse_override(text)
        key = ALIASES.get(key, key)
        if key in SCHEMA:
            values[key] = value
            continue
        parent = next((d for d in FREE_DICTS if key.startswith(d + '.')), None)
        if parent is not None:
            values[parent] = {**(values.get(parent) or {}), key[len(parent) + 1:]: value}
            continue
        raise RecipeError(f'override {_show(text)}: unknown key {key!r}{_suggest(key)}')


def load_recipe(path: str, overrides: Sequence[str] = ()) -> Recipe:
    import yaml

    from ..yaml_reader import duplicate_keys_error
    if not os.path.isfile(path):
        raise RecipeError(f'{path}: no such recipe file')
    try:
        with open(path, encoding='utf-8') as f:
            text = f.read(MAX_RECIPE_CHARS + 1)
        if len(text) > MAX_RECIPE_CHARS:
            raise RecipeError(f'{path}: larger than {MAX_RECIPE_CHARS:,} characters; a recipe is a few kilobytes')
        doc = _load_yaml(text)
    except UnicodeDecodeError as e:
        raise RecipeError(f'{path}: not a text (UTF-8) file (byte {e.start}); a recipe is YAML') from None
    except RecursionError:
        raise RecipeError(f'{path}: nested too deeply to be a recipe') from None
    except duplicate_keys_error() as e:
        raise RecipeError(f'{path}:{e.line}: {e.problem}') from None
    except yaml.YAMLError as e:
        mark = getattr(e, 'problem_mark', None)
        where = f' (line {mark.line + 1}, column {mark.column + 1})' if mark is not None else ''
        raise RecipeError(f'{path}: not valid YAML{where}: {getattr(e, "problem", None) or e}') from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise RecipeError(f'{path}: a recipe is a mapping of keys, got {type(doc).__name__}')
    try:
        values = _flatten(doc, path)
        apply_overrides(values, overrides)
        given = frozenset(values)
        _check(values, path + (' (with overrides)' if overrides else ''))
    except RecipeError as e:
        raise RecipeError(_at_line(str(e), path, text, overrides)) from None
    return Recipe(path=path, values=values, overrides=list(overrides), given=given)


# the setting a message of _flatten / _check names: `key 'train.lr'`, `swift_args.name`
_NAMED_KEY = re.compile(r"key '([^']+)'|\b(swift_args\.[A-Za-z0-9_.-]+)")


def _at_line(message: str, path: str, text: str, overrides: Sequence[str] = ()) -> str:
    """`path: key 'x' ...` -> `path:LINE: key 'x' ...` where the file writes that key (as written, or by an ms-swift
    name that stands for it); a key an override sets, a message without a key, stay as they are."""
    from ..yaml_reader import key_lines
    prefix = next((p for p in (f'{path}: ', f'{path} (with overrides): ') if message.startswith(p)), None)
    match = _NAMED_KEY.search(message[len(prefix):]) if prefix else None
    if match is None:
        return message
    key = (match.group(1) or match.group(2)).rstrip('.')
    overridden = {ALIASES.get(k, k) for k in (o.split('=', 1)[0].strip() for o in overrides)}
    if ALIASES.get(key, key) in overridden:
        return message
    lines = key_lines(text)
    spellings = [key, *(alias for alias, target in ALIASES.items() if target == key)]
    line = next((lines[k] for k in spellings if k in lines), None)
    return f'{path}:{line}: {message[len(prefix):]}' if line else message


def recipe_from_dict(doc: Dict[str, Any], overrides: Sequence[str] = (), where: str = '<recipe>') -> Recipe:
    values = _flatten(doc, where)
    apply_overrides(values, overrides)
    given = frozenset(values)
    _check(values, where)
    return Recipe(path=where, values=values, overrides=list(overrides), given=given)
