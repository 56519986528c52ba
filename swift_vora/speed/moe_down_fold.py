"""The routed experts' down-projection LoRA folded into their base grouped GEMM along the reduction axis (opt-in,
`SWIFT_VORA_MOE_DOWN_LORA=fold`; measured at full depth, #30 call p: 0.951x its twin -- it loses, see below).

unsloth_zoo's `forward_native_grouped_mm` runs each MoE layer's down projection as three products and an addition
over the routed rows: the base `inter @ W_down`, the LoRA's `inter @ A` (rank r) and `(inter A) @ B`, then
`mm2_out + lora_delta * scaling`. At full depth and micro-batch 4 the routed rows are 249,536 x 2,048 (1 GB in
bf16): call n's profile (#30) shows the addition at 70 x 0.7 ms and the B product, which writes that 1 GB delta
only for the addition to read it, at 70 x 0.43 ms (the forward and the recompute), and its input-gradient product
again in the backward. Folded, the base GEMM does the LoRA's work along its reduction axis:

    [inter | s (inter A)] @ [W_down ; B] = inter W_down + s (inter A) B        (K = 512 + r instead of 512)

one grouped GEMM writes the output once; its backward is one grouped GEMM too (`grad @ [W_down ; B]^T`, split
into the gradients of `inter` and of `s (inter A)`) plus B's weight gradient -- never W_down's, which is frozen.
The concatenations cost a 0.5 GB weight copy and a 0.25 GB input copy per call, below the 1 GB delta's write and
the addition's 3 GB of traffic -- by that count; on the H200 the 528-deep grouped GEMM and its column-major backward
cost more than both (call p: 132 ms a step slower, every call folded). The sum is accumulated in fp32 inside one
GEMM instead of two bf16 roundings and a bf16 addition: the same product, rounded once (so close to upstream's
result, not bit-equal to it).

Installed as statements of the same function rewritten (speed/moe_lora_scale.py holds the one rewriter of that
function and its source pin; with `SWIFT_VORA_MOE_LORA_SCALE=rank` both rewrites apply, the scaling then already
on the rank-r intermediate): the base call returns a `Deferred` product when this call can fold (a LoRA on the
down projection, a plain frozen bf16/fp16/fp32 stack -- not a quantized one upstream dequantizes --, strides the GEMM
accepts); the B product then returns a `Pending` one; the addition runs the folded GEMM. Anything else runs
upstream's statements unchanged. `counts()` says how many calls folded and why others did not (`moe_lora_scale.
down_fold` in the runner's result). The rewritten function reaches these helpers through one global it is given,
`swift_vora_down_fold` (this module). Upstream: the same fold would fit unsloth_zoo's forward as it is.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Dict, NamedTuple, Optional, Tuple

from .. import switches

ENV = 'SWIFT_VORA_MOE_DOWN_LORA'
PATCH = 'moe_down_lora_fold'
GLOBAL = 'swift_vora_down_fold'  # the name the rewritten function calls these helpers by

# upstream's statements (unsloth_zoo 2026.10.9, pinned in swift_vora/patches.py) and what they become
BASE_CALL = ('            mm2_out = _base_grouped_mm(\n'
             '                inter, offsets, _down_provider, _recompute, selective_plan if _recompute else None,\n'
             '            )')
BASE_FOLDABLE = ('            mm2_out = swift_vora_down_fold.base(\n'
                 '                inter, offsets, _down_provider, _recompute, selective_plan if _recompute else None,\n'
                 '                _down_src, down_lora, _base_grouped_mm,\n'
                 '            )')
B_PRODUCT = 'lora_delta = _grouped_mm_with_backward_fix(lora_out, second_weight, offsets)'
B_PENDING = ('lora_delta = swift_vora_down_fold.lora_delta(mm2_out, lora_out, second_weight, offsets, '
             '_grouped_mm_with_backward_fix)')
ADD = 'mm2_out = mm2_out + lora_delta * scaling'
ADD_FOLDED = 'mm2_out = swift_vora_down_fold.add(mm2_out, lora_delta, scaling)'
ADD_RANK_SCALED = 'mm2_out = mm2_out + lora_delta\n'  # the addition once moe_lora_scale's rewrite has run
ADD_RANK_SCALED_FOLDED = 'mm2_out = swift_vora_down_fold.add(mm2_out, lora_delta, None)\n'

COUNTS: Dict[str, int] = {}


def wanted(environ=None) -> bool:
    return switches.read(ENV, environ) == 'fold'


def rewrites(rank_scaled: bool) -> Tuple[Tuple[str, str, int], ...]:
    """(statement, what it becomes, how many times the function holds it), applied after moe_lora_scale's own
    rewrites where `rank_scaled` (its addition no longer multiplies by the scaling)."""
    add = (ADD_RANK_SCALED, ADD_RANK_SCALED_FOLDED, 1) if rank_scaled else (ADD, ADD_FOLDED, 1)
    return ((BASE_CALL, BASE_FOLDABLE, 1), (B_PRODUCT, B_PENDING, 1), add)


def counts() -> Dict[str, int]:
    """Calls of the down projection since the process started: 'folded', and each reason a call was not."""
    return dict(COUNTS)


def _count(key: str) -> None:
    COUNTS[key] = COUNTS.get(key, 0) + 1


class Deferred(NamedTuple):
    """The base product not computed yet: the folded GEMM computes it with the LoRA's."""
    inter: Any
    offsets: Any
    weight: Any  # [E, K, N]: the frozen stack as the grouped GEMM takes it (a transposed view of [E, N, K])
    # upstream's provider where it chose to take the stack again in the backward instead of keeping it (its
    # `recompute`): the fold keeps that choice, whatever the provider returns; None: the stack is kept
    provider: Optional[Callable[[], Any]] = None


class Pending(NamedTuple):
    lora_out: Any  # [T, r]: inter @ A (already times the scaling under moe_lora_scale's rank rewrite)
    second_weight: Any  # [E, r, N]: B, in the GEMM's dtype, rank padded as upstream pads it
    grouped_mm: Callable[..., Any]  # upstream's `_grouped_mm_with_backward_fix`: its kernel choice and checks


def base(inter, offsets, weight_provider: Callable[[], Any], recompute, plan, source, down_lora,
         base_grouped_mm: Callable[..., Any]):
    """Upstream's `_base_grouped_mm(...)`, or a `Deferred` product where this call can fold. `recompute` is
    upstream's choice to rebuild the stack in the backward instead of keeping it: for a plain frozen stack both are
    the parameter itself (the fold keeps no more than upstream's recompute path does: nothing of the input), for a
    compressed one (bitsandbytes 4-bit, MXFP4) it is a dequantization, and the call keeps upstream's path."""
    if down_lora is None:
        _count('no_down_lora')
        return base_grouped_mm(inter, offsets, weight_provider, recompute, plan)
    why = 'selective_dequant' if plan is not None else _not_a_plain_stack(source)
    if why:
        _count(why)
        return base_grouped_mm(inter, offsets, weight_provider, recompute, plan)
    weight = weight_provider()
    why = _unfoldable(inter, weight, down_lora)
    if why:
        _count(why)
        return base_grouped_mm(inter, offsets, lambda: weight, recompute, plan)
    return Deferred(inter, offsets, weight, weight_provider if recompute else None)


def _not_a_plain_stack(source) -> Optional[str]:
    """Why the expert stack is not a plain frozen tensor (None: it is), read as upstream reads it (PEFT's wrappers
    hold it as `base_layer`)."""
    import torch
    while hasattr(source, 'base_layer'):
        source = source.base_layer
    if type(source) not in (torch.nn.Parameter, torch.Tensor):  # bitsandbytes' Params4bit, MXFP4 stacks, ...
        return 'base_quantized'
    if source.requires_grad:  # the experts themselves trained: their weight gradient is upstream's to compute
        return 'base_trained'
    return None


def _unfoldable(inter, weight, down_lora) -> Optional[str]:
    import torch
    if not hasattr(torch, '_grouped_mm'):
        return 'no_grouped_mm'
    if weight.requires_grad:
        return 'base_trained'
    if inter.dim() != 2 or weight.dim() != 3 or inter.dtype != weight.dtype or \
            inter.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return 'shapes_or_dtypes'
    if (inter.shape[-1] * inter.element_size()) % 16:  # the grouped GEMM's 16-byte strides (upstream's too)
        return 'unaligned'
    return None


def lora_delta(mm2_out, lora_out, second_weight, offsets, grouped_mm: Callable[..., Any]):
    """Upstream's B product, or a `Pending` one when the base product was deferred."""
    if isinstance(mm2_out, Deferred):
        return Pending(lora_out, second_weight, grouped_mm)
    return grouped_mm(lora_out, second_weight, offsets)


def add(mm2_out, delta, scaling: Optional[float]):
    """Upstream's addition (`scaling` None: moe_lora_scale already scaled the intermediate), or the folded GEMM."""
    if isinstance(mm2_out, Deferred):
        lora_out = delta.lora_out if scaling is None else delta.lora_out * scaling
        inter, offsets = mm2_out.inter, mm2_out.offsets
        if ((inter.shape[-1] + lora_out.shape[-1]) * inter.element_size()) % 16:  # the rank as upstream padded it
            _count('unaligned_rank')
            return delta.grouped_mm(inter, mm2_out.weight, offsets) + delta.grouped_mm(
                lora_out, delta.second_weight, offsets)
        _count('folded')
        return _folded_autograd_function().apply(inter, lora_out, mm2_out.weight, delta.second_weight, offsets,
                                                 delta.grouped_mm, mm2_out.provider)
    return mm2_out + delta if scaling is None else mm2_out + delta * scaling


def _stack(weight, second_weight):
    import torch
    return torch.cat([weight, second_weight.to(weight.dtype)], dim=1)  # [E, K + r, N]


@functools.lru_cache(maxsize=None)
def _folded_autograd_function():
    """The autograd function, built at first use (importing this module does not import torch)."""
    import torch

    class FoldedDownLora(torch.autograd.Function):
        """[inter | lora] @ [W ; B] per expert group; gradients for inter, lora and B (W is frozen). The two products
        over the stack go through upstream's grouped-GEMM helper (its kernel choice, its check that a transposed
        view is safe on this device); B's weight gradient is torch's, as autograd computes it for upstream's B
        product."""

        @staticmethod
        def forward(ctx, inter, lora, weight, second_weight, offsets, grouped_mm, provider):
            ctx.k, ctx.grouped_mm, ctx.provider = inter.shape[-1], grouped_mm, provider
            # the stack is kept for the backward only where upstream would keep it
            ctx.save_for_backward(lora, weight if provider is None else None, second_weight, offsets)
            rows = torch.cat([inter, lora.to(inter.dtype)], dim=-1)  # [T, K + r]
            return grouped_mm(rows, _stack(weight, second_weight), offsets)

        @staticmethod
        def backward(ctx, grad):
            lora, weight, second_weight, offsets = ctx.saved_tensors
            if weight is None:
                weight = ctx.provider()
            grad = grad.contiguous()
            both = ctx.grouped_mm(grad, _stack(weight, second_weight).transpose(-2, -1), offsets)  # [T, K + r]
            grad_second = None
            if ctx.needs_input_grad[3]:  # B's weight gradient, per expert: lora[g]^T @ grad[g]
                grad_second = torch._grouped_mm(lora.to(grad.dtype).t(), grad, offs=offsets)
            return both[:, :ctx.k], both[:, ctx.k:], None, grad_second, None, None, None

    return FoldedDownLora
