"""Selective activation checkpointing of the LLM's decoder layers: keep the matmul (or attention) outputs, recompute
only the cheap pointwise work.

ms-swift checkpoints every decoder layer whole (transformers' `gradient_checkpointing_enable`, reentrant on one
process): the backward reruns each layer's entire forward -- its matmuls and attention included -- to rebuild the
activations. PyTorch's selective activation checkpointing (`torch.utils.checkpoint.create_selective_checkpoint_contexts`
as the `context_fn` of a non-reentrant `torch.utils.checkpoint.checkpoint`) lets a policy decide per operator: the
outputs it marks MUST_SAVE are cached in the forward and handed back in the recompute instead of being computed
again; everything else (RMSNorm, RoPE, SiLU-mul, residual adds, LoRA dropout and scale) is recomputed as before.
The recompute therefore costs the pointwise kernels, not the FLOPs, and the memory it costs is the saved outputs.

`SWIFT_VORA_SELECTIVE_CHECKPOINT`:
- `off` (default): transformers' whole-layer checkpointing, unchanged.
- `attention`: save the fused attention kernels' outputs (the quadratic part of the recompute; one hidden-size
  tensor per layer plus its log-sum-exp), recompute the rest.
- `matmul`: save the attention outputs and every matmul output (the projections, the MLP, LoRA's A and B), recompute
  only the pointwise ops: little recompute, memory close to no checkpointing's.

Why the result is the same: a saved output is the tensor the forward computed, and the recompute reruns the other
ops with the RNG state `torch.utils.checkpoint` restores (the same LoRA dropout masks), so the loss and the gradients
are those of whole-layer checkpointing (tests/test_selective_checkpoint.py checks them on a tiny Qwen3-VL).

How it is applied: at train begin, every decoder layer that transformers checkpoints gets a checkpoint function that
calls torch's own `checkpoint` (not ms-swift's wrapper, which forces `use_reentrant=True` on one process; selective
checkpointing needs the non-reentrant implementation) with the policy's contexts. Layers compiled by
`SWIFT_VORA_COMPILE=layers` are left as they are: that combination is not tested, and under torch.compile a policy
belongs inside the compiled graph (where `SWIFT_VORA_COMPILE_CHECKPOINT=graph` puts the checkpoint), not around it.
Nor is it applied under DeepSpeed, whose ZeRO-3 hooks gather parameters inside the checkpointed region.
`stats()` counts what the policy decided, so a run's log shows that it was engaged.
"""
from __future__ import annotations

import functools
import logging
from typing import Callable, Dict, FrozenSet

from swift.callbacks import TrainerCallback

from .. import patches, switches

ENV = 'SWIFT_VORA_SELECTIVE_CHECKPOINT'
PATCH = 'selective_checkpoint_func'  # swift_vora/patches.py: the layer's own `_gradient_checkpointing_func`
MODES = ('off', 'attention', 'matmul')
logger = logging.getLogger('swift')

# aten operators by what they are; names missing from a torch build are skipped (attention kernels differ by device).
ATTENTION_OPS = ('_scaled_dot_product_efficient_attention', '_scaled_dot_product_flash_attention',
                 '_scaled_dot_product_cudnn_attention', '_scaled_dot_product_flash_attention_for_cpu',
                 '_efficient_attention_forward', '_flash_attention_forward')
MATMUL_OPS = ('mm', 'addmm', 'bmm', 'baddbmm')

_STATS: Dict[str, int] = {'layers': 0, 'policy_calls': 0, 'saved': 0, 'recomputed': 0}


def mode(environ=None) -> str:
    return switches.read(ENV, environ)


def enabled(environ=None) -> bool:
    """Whether `SWIFT_VORA_SELECTIVE_CHECKPOINT` asks for a policy (the callback is appended only then)."""
    return mode(environ) != 'off'


def saved_ops(which: str) -> FrozenSet:
    """The aten overloads whose outputs `which` (`attention` or `matmul`) saves."""
    import torch
    names = ATTENTION_OPS + (MATMUL_OPS if which == 'matmul' else ())
    if which not in ('attention', 'matmul'):
        raise ValueError(f'{ENV}: no policy {which!r}; one of {", ".join(MODES[1:])}')
    return frozenset(getattr(torch.ops.aten, name).default for name in names if hasattr(torch.ops.aten, name))


def make_policy(which: str) -> Callable:
    """A selective-checkpoint policy: MUST_SAVE for `saved_ops(which)`, PREFER_RECOMPUTE for every other operator.
    Forward-pass decisions are counted in `stats()`."""
    from torch.utils.checkpoint import CheckpointPolicy
    save = saved_ops(which)

    def policy(ctx, op, *args, **kwargs):
        keep = op in save
        if not ctx.is_recompute:
            _STATS['policy_calls'] += 1
            _STATS['saved' if keep else 'recomputed'] += 1
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def checkpoint_function(which: str) -> Callable:
    """A drop-in for a layer's `_gradient_checkpointing_func`: torch's own non-reentrant checkpoint with the policy's
    contexts. torch's function is looked up at call time: ms-swift keeps it as `torch.utils.checkpoint._old_checkpoint`
    once its trainer has replaced `checkpoint` by its reentrant-forcing wrapper."""
    import torch.utils.checkpoint as checkpoint_module
    context_fn = functools.partial(checkpoint_module.create_selective_checkpoint_contexts, make_policy(which))

    def checkpoint(function, *args, **kwargs):
        kwargs.pop('use_reentrant', None)  # transformers' gradient_checkpointing_kwargs; SAC is non-reentrant only
        kwargs.pop('context_fn', None)
        original = getattr(checkpoint_module, '_old_checkpoint', checkpoint_module.checkpoint)
        return original(function, *args, use_reentrant=False, context_fn=context_fn, **kwargs)

    checkpoint.saves = which  # what the policy keeps: attention | matmul
    return checkpoint


def apply(model, which: str) -> int:
    """Give every checkpointed, uncompiled decoder layer of `model` the selective checkpoint; returns how many."""
    from .compile_layers import decoder_layers
    layers = [layer for layer in decoder_layers(model) if getattr(layer, 'gradient_checkpointing', False)
              and getattr(layer, '_compiled_call_impl', None) is None]
    if not layers or not patches.applicable(PATCH):
        return 0
    function = patches.mark(checkpoint_function(which), PATCH)
    for layer in layers:
        layer._gradient_checkpointing_func = function
    count = len(layers)
    _STATS['layers'] = count
    return count


def stats() -> Dict[str, int]:
    """Layers given the policy and the policy's forward decisions so far (saved / recomputed operator outputs)."""
    return dict(_STATS)


def reset_stats() -> None:
    _STATS.update({key: 0 for key in _STATS})


class SelectiveCheckpoint(TrainerCallback):
    """Applies the policy to the checkpointed decoder layers when training begins; logs `stats()` after step 1."""

    applied = 0

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.applied = 0
        model = model if model is not None else getattr(self.trainer, 'model', None)
        which = mode()
        if model is None or which == 'off':
            return
        if getattr(args, 'deepspeed', None):
            logger.warning(f'swift-vora selective checkpoint: {ENV}={which} is not applied under DeepSpeed; the '
                           'layers keep whole-layer checkpointing')
            return
        reset_stats()
        self.applied = apply(model, which)
        if not self.applied:
            logger.warning(f'swift-vora selective checkpoint: {ENV}={which} but no decoder layer is checkpointed and '
                           'uncompiled (--gradient_checkpointing false, or SWIFT_VORA_COMPILE=layers); nothing changed')
            return
        logger.info(f'swift-vora selective checkpoint: {self.applied} decoder layers save their {which} outputs and '
                    'recompute the rest (torch.utils.checkpoint, non-reentrant)')

    def on_step_end(self, args, state, control, **kwargs):
        if self.applied and state.global_step == 1:
            logger.info(f'swift-vora selective checkpoint: after step 1: {stats()}')
