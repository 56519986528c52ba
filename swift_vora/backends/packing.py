"""What `train.packing` (off | micro_batch | dataset) becomes on each backend, or why a backend refuses it.

A recipe key that a backend silently ignores is a configuration that cannot work as written, so each backend
either applies it or stops before anything loads:

- `swift sft` (ddp, ZeRO-2/3): `--padding_free true` (each micro-batch one row) or `--packing true` (rows filled
  from the whole dataset up to data.max_length), with an attention that keeps the samples apart (sdpa launches as
  `vora_varlen`, swift_vora/speed/packed_attention.py). Models with linear-attention layers (Qwen3.5's Gated
  DeltaNet) read the sample boundaries there only through flash-linear-attention's kernels; ms-swift stops at the
  first packed step without them (swift/model/models/qwen.py), so the launch refuses first, with the numbers.
- `megatron sft`: Megatron-SWIFT is padding-free unless told otherwise, so each value is spelt out
  (`--padding_free false|true`, `--packing true`). mcore-bridge's Gated DeltaNet (1.6.5,
  mcore_bridge/model/modules/gated_delta_net.py) takes packed rows through flash-linear-attention only and asserts
  at the first step otherwise ("Packed sequences are not supported when fla is not available"): refused first, as
  for `swift sft`.
- the Unsloth split-LoRA runner feeds padded micro-batches and has no packing: anything but `off` is refused.
"""
from __future__ import annotations

import importlib.util
from typing import List

from .base import LaunchRefused, LaunchUsageError, PlanView
from .recipe import PACKING_ATTENTION, Recipe

SWIFT_SFT_FLAGS = {'micro_batch': '--padding_free', 'dataset': '--packing'}
MEGATRON_FLAGS = {'off': ['--padding_free', 'false'], 'micro_batch': ['--padding_free', 'true'],
                  'dataset': ['--packing', 'true']}


def linear_attention_kernels_installed() -> bool:
    """flash-linear-attention (`fla`), whose varlen kernels ms-swift uses for packed Gated DeltaNet layers."""
    return importlib.util.find_spec('fla') is not None


def _refuse_linear_attention_without_kernels(recipe: Recipe, view: PlanView, who: str) -> None:
    packing = recipe['train.packing']
    if packing != 'off' and view.linear_attention_layers and not linear_attention_kernels_installed():
        raise LaunchRefused([
            f'train.packing={packing}: {view.linear_attention_layers} of the model\'s {view.num_layers} decoder '
            f'layers are linear attention (Gated DeltaNet), whose convolution and recurrence keep packed samples '
            f'apart only through flash-linear-attention\'s varlen kernels; the package (`fla`) is not installed '
            f'here, and {who} would stop at the first packed step, after loading the model. Alternatives: '
            f'train.packing=off, or install flash-linear-attention on this machine'])


def swift_sft_packing_args(recipe: Recipe, view: PlanView) -> List[str]:
    """`--attn_impl` and the packing switch for `swift sft`; LaunchRefused when the model cannot pack here."""
    attn, packing = recipe['train.attn_impl'], recipe['train.packing']
    if packing == 'off':
        return ['--attn_impl', attn] if attn else []
    _refuse_linear_attention_without_kernels(recipe, view, 'ms-swift')
    return ['--attn_impl', PACKING_ATTENTION[attn], SWIFT_SFT_FLAGS[packing], 'true']


def megatron_packing_args(recipe: Recipe, view: PlanView) -> List[str]:
    """`megatron sft`'s packing flags, every value spelt out; LaunchRefused when the model cannot pack here."""
    _refuse_linear_attention_without_kernels(recipe, view, "mcore-bridge's Gated DeltaNet")
    return list(MEGATRON_FLAGS[recipe['train.packing']])


def refuse_unsloth_packing(recipe: Recipe) -> None:
    if recipe['train.packing'] != 'off':
        raise LaunchUsageError(f'{recipe.path}: train.packing={recipe["train.packing"]}: the Unsloth split-LoRA '
                               'runner trains padded micro-batches and cannot pack; set train.packing=off, or plan '
                               'a swift sft backend (train.backend=ddp|deepspeed_zero2|deepspeed_zero3)')
