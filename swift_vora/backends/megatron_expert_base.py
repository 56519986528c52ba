"""`megatron sft`, MoE LoRA: the frozen experts under an expert LoRA as one `torch._grouped_mm` per product.

Why: under LoRA the experts' own weights are frozen, and Transformer Engine still computes each of their grouped
linears (fc1, fc2: forward, recompute, input gradient) through its grouped GEMM, whose host side walks every expert
in Python and C++ (a list of 256 inputs and weights, a pointer check, an event and a stream wait per GEMM: 55,854
`cudaPointerGetAttributes` and 17,371 `cudaEventRecord` in one profiled step of the 35B-A3B cut to 8 layers, where
the host was idle behind the expert GEMMs' backward for 0.64 s of a 7.8 s step and the GPU busy a fifth of it --
docs/runs/h100-megatron-fusion-2026-12-06/). With the weights stacked once into one [experts, out, in] tensor, each
product is one `torch._grouped_mm` (the kernel the Unsloth path runs) and the host does nothing per expert.

What this module does, in the `megatron sft` process only and only when `SWIFT_VORA_MEGATRON_EXPERT_BASE=grouped_mm`
(the default `te` leaves TE's computation as it is): mcore-bridge's `LoraParallelLinear.update_layer` is wrapped
(patches.py `megatron_expert_base_grouped_mm`); after it has built an expert layer's LoRA, the layer's base -- a
megatron-core `TEGroupedLinear` (or its column / row parallel subclass) -- becomes an instance of a subclass of its own
class whose `forward` is one grouped GEMM where it can be. Nothing else of the layer changes: the same parameters
(`weight{i}`), names, checkpoint and export. At its first forward the weights are stacked and each `weight{i}` becomes
a view of its row of the stack (the memory is not doubled after that forward; one layer's expert weights are copied
once while it stacks); a weight whose storage was replaced since (a merge, a load) makes it stack again.

Only where it applies, decided at every call: the weights frozen (a trainable base -- full SFT, unfrozen experts --
runs TE's forward, whose weight gradients this module does not compute), no bias, no FP8 / FP4, no CPU offloading,
no tensor parallelism inside TE (megatron-core leaves TE's 'column' / 'row' mode on an expert layer at EP 1, TP 1,
where TE shards nothing: only a TE tensor-parallel size above 1 counts), and, decided
once per layer, bf16 weights on a GPU of compute capability 9.0 or later (or any float on the CPU) with every
dimension a multiple of 8. Elsewhere TE's forward runs, as upstream.
The numbers: bf16 products accumulated in fp32 by the grouped kernel, as TE's GEMMs; the input gradient one grouped
GEMM against the same stack.
"""
from __future__ import annotations

import functools
import logging
from typing import Any, List, Optional

from .. import switches
from .megatron_expert_lora import LORA_MODULE, grouped_mm_reason, offsets_of, wrap_update_layer

ENV = 'SWIFT_VORA_MEGATRON_EXPERT_BASE'
PATCH = 'megatron_expert_base_grouped_mm'
STACK = '_vora_expert_stack'  # the module attribute holding the stacked weights (not a buffer: not saved)
WHY = '_vora_expert_stack_why'  # why this layer stays TE's, decided once (None: it does not)
logger = logging.getLogger('swift')
_said = {'stacked': False}  # the first stacked layer is said once per process (train.log: the path ran)


def wanted(environ=None) -> bool:
    return switches.read(ENV, environ) == 'grouped_mm'


@functools.lru_cache(maxsize=None)  # the Function class, made once (torch is imported where it is first used)
def _frozen_grouped_mm():
    import torch

    class FrozenGroupedMM(torch.autograd.Function):
        """y[rows of expert e] = x[rows of e] @ W_e^T for every expert at once, W = stack [E, out, in] (frozen)."""

        @staticmethod
        def forward(ctx, x, offsets, stack):
            ctx.save_for_backward(offsets, stack)
            return torch._grouped_mm(x, stack.transpose(1, 2), offs=offsets)

        @staticmethod
        def backward(ctx, grad_out):
            offsets, stack = ctx.saved_tensors
            grad_x = torch._grouped_mm(grad_out.contiguous(), stack, offs=offsets) if ctx.needs_input_grad[0] else None
            return grad_x, None, None

    return FrozenGroupedMM


def _weights(layer) -> List[Any]:
    return [getattr(layer, f'weight{i}') for i in range(layer.num_gemms)]


def call_reason(layer, weights) -> Optional[str]:
    """Why this call of `layer` runs TE's forward (None: it runs one grouped GEMM)."""
    if any(w.requires_grad for w in weights):
        return 'trainable weights'
    if getattr(layer, 'use_bias', False) or getattr(layer, 'te_return_bias', False):
        return 'a bias'
    config = getattr(layer, 'config', None)
    if getattr(config, 'fp8', None) or getattr(config, 'fp4', None):
        return 'FP8 / FP4'
    if getattr(config, 'cpu_offloading', False):
        return 'CPU offloading'
    # megatron-core keeps TE's parallel mode ('column' / 'row') on an expert layer at EP 1 and TP 1, where TE shards
    # and communicates nothing: only a tensor-parallel size above 1 makes TE's grouped linear more than its products
    if getattr(layer, 'tp_size', 1) > 1:
        return f'TE\'s tensor parallelism ({layer.tp_size} ranks, {getattr(layer, "parallel_mode", None)!r})'
    return None


def stacked(layer, weights):
    """The layer's weights as one [E, out, in] tensor whose rows the `weight{i}` are views of; stacked again where a
    weight's storage is no longer its row (replaced by a load or a merge, or moved)."""
    import torch
    stack = layer.__dict__.get(STACK)
    if stack is not None and stack.device == weights[0].device and stack.dtype == weights[0].dtype:
        row = stack[0].numel() * stack.element_size()
        base = stack.data_ptr()
        if all(w.data_ptr() == base + i * row and w.shape == stack.shape[1:] for i, w in enumerate(weights)):
            return stack
    with torch.no_grad():
        stack = torch.stack([w.detach() for w in weights])
        for i, w in enumerate(weights):
            w.data = stack[i]  # the Parameter stays (its attributes, its name); its storage is the stack's row
    object.__setattr__(layer, STACK, stack)
    if not _said['stacked']:
        _said['stacked'] = True
        logger.info(f'swift-vora: frozen experts computed by torch._grouped_mm (the first layer: {tuple(stack.shape)} '
                    f'stacked, {stack.numel() * stack.element_size() / 2**30:.2f} GiB)')
    return stack


@functools.lru_cache(maxsize=None)  # one subclass per TE grouped linear class
def frozen_experts_class(base):
    """`GroupedMMFrozenExperts`: megatron-core's TE grouped linear `base` whose forward, for frozen weights, is one
    torch._grouped_mm."""
    class GroupedMMFrozenExperts(base):
        """megatron-core's TE grouped linear; frozen, its forward is one torch._grouped_mm over the stacked experts
        (swift_vora/backends/megatron_expert_base.py)."""
        _vora_grouped_base = True

        def forward(self, x, m_splits):
            weights = _weights(self)
            if WHY not in self.__dict__:
                object.__setattr__(self, WHY, grouped_mm_reason(weights[0]))
            if self.__dict__[WHY] is not None or call_reason(self, weights) is not None:
                return super().forward(x, m_splits)
            stack = stacked(self, weights)
            x2d = x.reshape(-1, stack.shape[-1])
            out = _frozen_grouped_mm().apply(x2d.contiguous(), offsets_of(m_splits, x.device), stack)
            return out.view(*x.shape[:-1], stack.shape[1]), None

    return GroupedMMFrozenExperts


def use_grouped_base(layer) -> bool:
    """An expert LoraParallelLinear's base made a GroupedMMFrozenExperts; False where it is not an expert layer or is
    already one."""
    if not (getattr(layer, 'is_grouped', False) and getattr(layer, 'is_expert', False)):
        return False
    base = getattr(layer, 'base_layer', None)
    if base is None or not hasattr(base, 'num_gemms') or getattr(type(base), '_vora_grouped_base', False):
        return False
    base.__class__ = frozen_experts_class(type(base))
    return True


def install(lora_cls) -> bool:
    """Wrap `lora_cls.update_layer` (mcore-bridge's LoraParallelLinear) so that each expert layer's base computes by
    one grouped GEMM. False where already installed or not applicable."""
    if not wrap_update_layer(lora_cls, PATCH, lambda layer, name: use_grouped_base(layer)):
        return False
    logger.info(f'swift-vora: frozen expert weights under LoRA as one torch._grouped_mm per product ({ENV}=grouped_mm)')
    return True


def install_from_env() -> bool:
    """In the `megatron sft` process (swift_registry.register_megatron_callbacks), where the switch asks for it."""
    if not wanted():
        return False
    import importlib
    try:
        lora = importlib.import_module(LORA_MODULE)
    except ImportError as e:
        logger.warning(f'swift-vora: {ENV}=grouped_mm needs mcore-bridge\'s LoRA ({e}); the experts stay as they are')
        return False
    return install(lora.LoraParallelLinear)
