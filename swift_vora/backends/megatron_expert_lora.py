"""`megatron sft`, MoE LoRA: each expert LoRA factor as one `torch._grouped_mm` instead of one GEMM per expert.

Why: mcore-bridge 1.6.5 puts the LoRA of a grouped expert layer in two Transformer Engine grouped linears
(`TEGroupedLinear` / `TERowParallelGroupedLinear` / `TEColumnParallelGroupedLinear`, tuners/lora.py), and TE issues
one cuBLAS GEMM per expert for each: a rank-16 factor's `K = 16` is no CUTLASS group, and the weight gradient's `K`
is each expert's token count. With 256 experts that is about 1,500 small GEMMs per factor and micro-batch (forward,
recompute, input and weight gradients), and the host launching them is the limit: in a profiled step of the 35B-A3B
shape cut to 8 layers (LoRA, micro-batch 2, one H100) `_GroupedLinearBackward` alone held the host 1.06 s of a 7.8 s
step, and the GPU was busy a fifth of it (docs/runs/h100-megatron-fusion-2026-12-06/). The Unsloth path computes the
same factors with `torch._grouped_mm`: one kernel per product for all experts.

What this module does, in the `megatron sft` process only and only when `SWIFT_VORA_MEGATRON_EXPERT_LORA=grouped_mm`
(the default `te` leaves mcore-bridge's factors as they are): mcore-bridge's `LoraParallelLinear.update_layer` is
wrapped (patches.py `megatron_expert_lora_grouped_mm`). After it has built and initialised an expert layer's two
factors, each is replaced by a `GroupedMMLoraFactor`: mcore-bridge's own generic grouped LoRA module
(tuners/npu_lora.py `NpuGroupedLoraLinear` -- one `weight{i}` per local expert, the expert flags, the sharded
checkpoint, and the type each of mcore-bridge's `isinstance` checks, its merge and the bridge's export already take)
with a forward of one grouped GEMM; the initialised weights and their Megatron attributes are copied over.
Backward (`GroupedLoraMM`): the input gradient one grouped GEMM, the weights' gradients one grouped GEMM over the
experts' token ranges. Where Megatron's DDP gave the weights a fp32 `main_grad`, those gradients are added to it with
one multi-tensor add and the weights marked `grad_added_to_main_grad` -- what TE does with gradient-accumulation
fusion, in place of a kernel per expert; elsewhere they are the weights' `.grad` as autograd's.

Only where it applies: an expert layer (mcore-bridge refuses LoRA under expert tensor parallelism, so each factor
holds whole experts), no LoRA bias, weights on a CPU or on a CUDA GPU of compute capability 9.0 or later in bf16
(where `torch._grouped_mm` runs), every dimension a multiple of 8 (its 16-byte strides). Any other factor stays TE's.
The numbers: bf16 products accumulated in fp32 by the grouped kernel, as TE's GEMMs; the weight gradient rounded to
bf16 before it reaches the fp32 main gradient (as Megatron without gradient-accumulation fusion does), where TE's
fused path accumulates in fp32. Checked on an H100 without Megatron (scripts/gpu/expert_lora_check.py: every factor
shape of the 35B-A3B, outputs and gradients within bf16 rounding of an fp32 oracle). In training (the 35B-A3B cut to
8 layers, micro-batch 4, one H100, benchmark variant `mg_mb4_te_ce_gmm_pao_glora`): 1.11x the tokens/s of the same
settings without it (measured in another call on the same GPU kind), the losses within 1.12 % step by step; the merged
export of a model trained with it has not run yet.
"""
from __future__ import annotations

import functools
import inspect
import itertools
import logging
from typing import Any, Dict, Optional, Sequence, Tuple

from .. import patches, switches

ENV = 'SWIFT_VORA_MEGATRON_EXPERT_LORA'
PATCH = 'megatron_expert_lora_grouped_mm'
LORA_MODULE = 'mcore_bridge.tuners.lora'
FACTOR_BASE = 'mcore_bridge.tuners.npu_lora'
# NpuGroupedLoraLinear's constructor, as this module calls it (checked before the first replacement)
FACTOR_PARAMS = ('self', 'num_gemms', 'input_size', 'output_size', 'config', 'bias', 'is_expert')
ALIGN = 8  # torch._grouped_mm: 16-byte strides, 8 bf16 elements
logger = logging.getLogger('swift')
_warned = {'kept': False, 'replaced': False}  # a factor left as TE's, and the first replaced: said once per process


def wanted(environ=None) -> bool:
    return switches.read(ENV, environ) == 'grouped_mm'


_last_offsets: Dict[str, Any] = {}  # the one list of row counts seen last, its values and its offsets


def offsets_of(m_splits, device):
    """Each expert's end row, as torch._grouped_mm takes them (int32 on the input's device). A list of row counts
    (what megatron-core hands TE) is copied from pinned memory without a host sync, and reused for the same list in
    the next call (a layer's two factors get the same one)."""
    import torch
    if isinstance(m_splits, torch.Tensor):
        return torch.cumsum(m_splits.to(device=device), 0, dtype=torch.int32)
    values = [int(m) for m in m_splits]
    last = _last_offsets
    if last.get('list') is m_splits and last.get('values') == values and last['offsets'].device == device:
        return last['offsets']
    ends = torch.tensor(list(itertools.accumulate(values)), dtype=torch.int32)
    if device.type == 'cuda':
        offsets = ends.pin_memory().to(device, non_blocking=True)
    else:
        offsets = ends.to(device)
    _last_offsets.update({'list': m_splits, 'values': values, 'offsets': offsets})
    return offsets


_dummies: Dict[Tuple[Any, ...], Any] = {}


def _dummy_grad(weight):
    """One zero tensor per shape, dtype and device, handed to autograd for a weight whose gradient went into its
    main_grad (as TE's `get_dummy_wgrad`): the accumulation hooks still fire, and Megatron adds nothing. Handed over
    detached, as TE does: autograd then keeps it as the weight's `.grad` -- the cached tensor itself, referenced
    here too, it would copy, one kernel per expert weight (8,192 a step on the 35B-A3B cut to 8 layers). So every such
    `.grad` is this one tensor's memory until Megatron's backward hook sets it to None (after every backward): nothing
    may write into it in place."""
    import torch
    key = (tuple(weight.shape), weight.dtype, weight.device)
    if key not in _dummies:
        _dummies[key] = torch.zeros(key[0], dtype=key[1], device=key[2])
    return _dummies[key].detach()


@functools.lru_cache(maxsize=None)  # the Function class, made once (torch is imported where it is first used)
def _grouped_lora_mm():
    import torch

    class GroupedLoraMM(torch.autograd.Function):
        """y[rows of expert e] = x[rows of e] @ W_e^T for every local expert at once; W_e = weights[e], [out, in]."""

        @staticmethod
        def forward(ctx, x, offsets, *weights):
            stacked = torch.stack(weights)  # [E, out, in]
            ctx.save_for_backward(x, offsets, stacked)
            ctx.weights = weights
            return torch._grouped_mm(x, stacked.transpose(1, 2), offs=offsets)

        @staticmethod
        def backward(ctx, grad_out):
            x, offsets, stacked = ctx.saved_tensors
            grad_out = grad_out.contiguous()
            grad_x = torch._grouped_mm(grad_out, stacked, offs=offsets) if ctx.needs_input_grad[0] else None
            weights = ctx.weights
            if not any(ctx.needs_input_grad[2:]):
                return (grad_x, None, *([None] * len(weights)))
            grad_w = torch._grouped_mm(grad_out.t(), x, offs=offsets)  # [E, out, in]; an empty expert: zeros
            if all(getattr(w, 'main_grad', None) is not None for w in weights):
                main = [w.main_grad for w in weights]
                torch._foreach_add_(main, list(grad_w.to(main[0].dtype).unbind(0)))
                for w in weights:
                    w.grad_added_to_main_grad = True
                return (grad_x, None, *[_dummy_grad(w) for w in weights])
            return (grad_x, None, *grad_w.to(weights[0].dtype).unbind(0))

    return GroupedLoraMM


def grouped_lora_mm(x, m_splits, weights: Sequence[Any]):
    """x [tokens, in] (rows grouped by expert, `m_splits` rows each) through each expert's [out, in] weight."""
    return _grouped_lora_mm().apply(x.contiguous(), offsets_of(m_splits, x.device), *weights)


@functools.lru_cache(maxsize=None)  # one subclass per base class
def factor_class(base):
    """`GroupedMMLoraFactor`: mcore-bridge's generic grouped LoRA module `base` with a forward of one grouped GEMM."""
    class GroupedMMLoraFactor(base):
        """mcore-bridge's grouped LoRA factor (its `weight{i}` per local expert) computed by one torch._grouped_mm
        (swift_vora/backends/megatron_expert_lora.py)."""

        def forward(self, x, m_splits, *args, **kwargs):
            weights = [getattr(self, f'weight{i}') for i in range(self.num_gemms)]
            return grouped_lora_mm(x, m_splits, weights), None

    return GroupedMMLoraFactor


def applies_to(factor) -> Optional[str]:
    """Why `factor` (one of an expert layer's LoRA factors, as mcore-bridge built it) stays as it is; None where it
    can be a grouped-GEMM factor."""
    weights = [getattr(factor, f'weight{i}', None) for i in range(getattr(factor, 'num_gemms', 0))]
    if not weights or any(w is None for w in weights):
        return 'not a grouped factor with weight0..weightN'
    # TE's grouped linear without a bias keeps an empty tensor as each `bias{i}` (transformer_engine/pytorch/module/
    # grouped_linear.py: `setattr(self, f"bias{i}", torch.Tensor()...)`): only a bias with elements is one
    if getattr(factor, 'use_bias', False) or any(
            getattr(getattr(factor, f'bias{i}', None), 'numel', lambda: 0)() for i in range(len(weights))):
        return 'a LoRA bias'
    return grouped_mm_reason(weights[0])


def grouped_mm_reason(w) -> Optional[str]:
    """Why `torch._grouped_mm` cannot take expert weights of `w`'s shape, dtype and device (None: it can): 16-byte
    strides, bf16 on a GPU of compute capability 9.0 or later, any float on the CPU."""
    import torch
    if any(d % ALIGN for d in w.shape):
        return f'its {tuple(w.shape)} weights are not multiples of {ALIGN}'
    if w.device.type == 'cuda':
        if w.dtype != torch.bfloat16:
            return f'{w.dtype} weights on a GPU (torch._grouped_mm takes bf16 there)'
        if torch.cuda.get_device_capability(w.device) < (9, 0):
            return 'a GPU before compute capability 9.0'
    elif w.device.type != 'cpu':
        return f'weights on {w.device.type}'
    return None


def grouped_factor(factor, base, config, is_expert: bool):
    """A GroupedMMLoraFactor holding `factor`'s weights (copied) and their Megatron attributes."""
    import torch
    weights = [getattr(factor, f'weight{i}') for i in range(factor.num_gemms)]
    out_features, in_features = weights[0].shape
    new = factor_class(base)(factor.num_gemms, in_features, out_features, config=config, bias=False,
                             is_expert=is_expert)
    new.to(device=weights[0].device, dtype=weights[0].dtype)
    with torch.no_grad():
        for i, weight in enumerate(weights):
            target = getattr(new, f'weight{i}')
            target.copy_(weight)
            target.requires_grad_(weight.requires_grad)
            for key, value in vars(weight).items():  # allreduce, tensor_model_parallel, ...: what Megatron reads
                setattr(target, key, value)
    return new


def replace_expert_factors(layer, adapter_name: str, base) -> int:
    """An expert LoraParallelLinear's factors of `adapter_name` replaced where they can be; the number replaced."""
    if not (getattr(layer, 'is_grouped', False) and getattr(layer, 'is_expert', False)):
        return 0
    if getattr(layer, 'lora_bias', {}).get(adapter_name, False):
        return 0
    replaced = 0
    for factors in (layer.lora_A, layer.lora_B):
        factor = factors[adapter_name]
        if isinstance(factor, factor_class(base)):
            continue
        why = applies_to(factor)
        if why is not None:
            if not _warned['kept']:
                _warned['kept'] = True
                logger.warning(f'swift-vora: an expert LoRA factor stays Transformer Engine\'s ({why}; {ENV})')
            continue
        factors[adapter_name] = grouped_factor(factor, base, layer.config, layer.is_expert)
        replaced += 1
        if not _warned['replaced']:
            _warned['replaced'] = True
            shape = tuple(getattr(factor, 'weight0').shape)
            logger.info(f'swift-vora: expert LoRA factors computed by torch._grouped_mm (the first: {factor.num_gemms} '
                        f'experts of {shape})')
    return replaced


def check_factor_base(base) -> Optional[str]:
    params = tuple(inspect.signature(base.__init__).parameters)
    if params != FACTOR_PARAMS:
        return f'{base.__module__}.{base.__name__} takes {params}, this module was written for {FACTOR_PARAMS}'
    return None


def wrap_update_layer(lora_cls, patch: str, after) -> bool:
    """mcore-bridge's `LoraParallelLinear.update_layer` wrapped as patch `patch`: `after(layer, adapter_name)` runs once
    upstream has built and initialised the adapter. False where that patch is already there or not applicable (two
    patches may wrap it: this module's and megatron_expert_base's)."""
    update = lora_cls.update_layer
    if patches.in_chain(update, patch) or not patches.applicable(patch):
        return False

    def update_layer(self, adapter_name, r, *, lora_alpha, **kwargs):
        result = update(self, adapter_name, r, lora_alpha=lora_alpha, **kwargs)
        after(self, adapter_name)
        return result

    lora_cls.update_layer = patches.mark(update_layer, patch, update)
    return True


def install(lora_cls, base) -> bool:
    """Wrap `lora_cls.update_layer` (mcore-bridge's LoraParallelLinear) so that each expert layer's factors are
    grouped-GEMM factors on `base` (its NpuGroupedLoraLinear). False where already installed or not applicable."""
    why = check_factor_base(base)
    if why is not None:
        logger.warning(f'swift-vora: {PATCH} not applied: {why}; the expert LoRA stays Transformer Engine\'s')
        return False
    if not wrap_update_layer(lora_cls, PATCH, lambda layer, name: replace_expert_factors(layer, name, base)):
        return False
    logger.info(f'swift-vora: expert LoRA factors as one torch._grouped_mm each ({ENV}=grouped_mm)')
    return True


def install_from_env() -> bool:
    """In the `megatron sft` process (swift_registry.register_megatron_callbacks), where the switch asks for it."""
    if not wanted():
        return False
    import importlib
    try:
        lora = importlib.import_module(LORA_MODULE)
        factor = importlib.import_module(FACTOR_BASE)
    except ImportError as e:
        logger.warning(f'swift-vora: {ENV}=grouped_mm needs mcore-bridge\'s LoRA ({e}); the expert LoRA stays as it is')
        return False
    return install(lora.LoraParallelLinear, factor.NpuGroupedLoraLinear)
