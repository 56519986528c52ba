"""`megatron sft`: the distributed optimizer steps over a few contiguous runs of the gradient buffer instead of one
tensor per parameter.

Why: mcore-bridge keeps a `weight{i}` per expert and LoRA factor, so MoE LoRA on the 35B-A3B shape cut to 8 layers
hands megatron-core's distributed optimizer 8,256 trainable tensors. Every step it walks them in Python more than
once -- the gradient views it hands the optimizer (`_copy_model_grads_to_main_grads`), the zeroing, the norm -- and
Transformer Engine's FusedAdam walks them again to build its multi-tensor lists (state lookups, type checks and the
master-weight bookkeeping per tensor). In a profiled step on one H100 (micro-batch 4,
docs/runs/h100-megatron-glora-2026-12-06/) `FusedAdam.step` alone held the host 650 ms of a 2.8 s step, with the GPU
idle behind it: the update itself is 486 kernels.

What it does, when the launch names the callback `vora_coalesced_optimizer` (SWIFT_VORA_MEGATRON_OPTIMIZER=coalesced):
at `on_train_begin` -- optimizer built, checkpoint loaded, no step taken -- each of the trainer's distributed optimizers
(each one of a `ChainedOptimizer`) gets, per parameter group, one tensor per run of consecutive parameters in a
bucket of a gradient buffer (this rank's shard of it, with several data-parallel ranks): the view of the buffer's
bf16 parameters over the run (what the optimizer updates in place) with the view of its fp32 gradients
(`decoupled_grad`, what the precision-aware optimizer reads). The optimizer's
`param_groups` hold these views instead of the per-parameter shards (same groups, same hyper-parameters, state still
empty), and the instance's `_copy_model_grads_to_main_grads` hands each run its gradient view. The gradient norm (for
clipping) is still summed over upstream's per-tensor gradient views, listed once in upstream's order and with its
filters: a multi-tensor norm over the runs adds the same squares in another order, one fp32 rounding apart, and
clipping turns that into another update (on an H100, scripts/gpu/coalesced_optimizer_check.py: the weights equal bit
for bit for nine steps of twelve, then the norm one bit apart at step 10).

Measured there (one H100, megatron-core's DDP and TE's FusedAdam on the 8,256-tensor layout, two runs): the
optimizer step 9.4 ms against 411 ms per tensor (median of 10 steps, synchronised).

Why the numbers are the same: Adam(W) is elementwise -- each element's moments, bias correction (one step count per
group) and weight decay depend on that element alone -- so one update over a run is the per-tensor updates of its
members. Between two members a run also covers the buffer's alignment padding: its gradient stays zero (the buffer is
zeroed every step and nothing writes there), so its moments stay zero and the gradient norm is unchanged; its
parameter values, which nothing reads, only decay. A run holds only parameters of one group with the same tensor-
parallel and sharing attributes (what the gradient norm filters by), copied onto the view; any other parameter of the
buffer between them ends the run.

Only where it applies, else the optimizer is left as megatron-core built it and the log says why: megatron-core's
`DistributedOptimizer` (not Megatron-FSDP, not the CPU-offloading hybrid), the precision-aware optimizer on bf16
parameters (`--use_precision_aware_optimizer`: the parameters are the views the optimizer updates; otherwise each
has an fp32 main copy of its own), no fp32 trainable parameter, no `--log_num_zeros_in_grad` (it would count the
padding), an empty optimizer state (a resumed optimizer keeps its per-tensor state), and `--no_save_optim true`
(what swift-vora's launch passes): megatron-core saves and loads
the optimizer's state per parameter, so the coalesced instance refuses `state_dict`, `sharded_state_dict` and the
parameter-state save/load with an error naming this switch, rather than writing a state that does not load.
Every member's storage is checked to lie where its run says before anything is replaced.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, List, Optional, Tuple

from .. import patches, switches
from .megatron_callback import MegatronTrainerCallback

ENV = 'SWIFT_VORA_MEGATRON_OPTIMIZER'
PATCH = 'megatron_coalesced_optimizer'
NORM_PATCH = 'megatron_coalesced_optimizer_norm'
CALLBACK = 'vora_coalesced_optimizer'  # its name in Megatron-SWIFT's megatron_callbacks_map (swift_registry.py)
# the attributes megatron-core's gradient norm and checkpointing read off an optimizer tensor: a run holds tensors
# that agree on all of them, and its view carries them
SHARED_ATTRS = ('tensor_model_parallel', 'partition_dim', 'partition_stride', 'shared', 'allreduce')
# what megatron-core would save or load per parameter: refused on a coalesced instance
STATE_METHODS = ('state_dict', 'sharded_state_dict', 'load_state_dict', 'save_parameter_state',
                 'load_parameter_state', 'get_parameter_state_dp_zero', 'load_parameter_state_from_dp_zero')
logger = logging.getLogger('swift')


def wanted(environ=None) -> bool:
    return switches.read(ENV, environ) == 'coalesced'


@dataclass
class Run:
    """Consecutive parameters of one group in one bucket of a gradient buffer, as one view of the parameters and one
    of the gradients (elements [start, end) of the buffer)."""
    gbuf_index: int
    bucket_index: int
    start: int
    end: int
    params: List[Any] = field(default_factory=list)
    shard: Any = None  # the bf16 parameter view the optimizer updates
    grad: Any = None  # the fp32 gradient view it reads as `decoupled_grad`


@dataclass
class Coalesced:
    """What one distributed optimizer became: per parameter group, its runs."""
    groups: List[List[Run]]

    @property
    def tensors_before(self) -> int:
        return sum(len(run.params) for runs in self.groups for run in runs)

    @property
    def tensors_after(self) -> int:
        return sum(len(runs) for runs in self.groups)


def attrs_of(tensor) -> Tuple[Any, ...]:
    return tuple(getattr(tensor, name, None) for name in SHARED_ATTRS)


def _world_range(opt, param):
    gbuf_index, dtype, bucket_index = opt.model_param_gbuf_map[param]
    entry = opt.gbuf_ranges[gbuf_index][dtype][bucket_index]['param_map'][param]
    return gbuf_index, dtype, bucket_index, entry['gbuf_world'], entry['param']


def why_not(opt) -> Optional[str]:
    """Why the distributed optimizer `opt` stays per tensor (None: it can be coalesced)."""
    if getattr(opt, 'is_stub_optimizer', False):
        return 'a stub optimizer (no trainable parameters on this rank)'
    if getattr(getattr(opt, 'ddp_config', None), 'use_megatron_fsdp', False):
        return 'Megatron-FSDP keeps its own buffers'
    for name in ('model_float16_groups', 'shard_float16_groups', 'model_fp32_groups', 'gbuf_ranges',
                 'model_param_gbuf_map', 'buffers'):
        if not hasattr(opt, name):
            return f'not a megatron-core DistributedOptimizer ({name} missing)'
    if not getattr(opt.config, 'use_precision_aware_optimizer_no_fp8_or_ds_fp8', False):
        return 'needs --use_precision_aware_optimizer (without it each parameter has an fp32 main copy of its own)'
    if getattr(opt.config, 'log_num_zeros_in_grad', False):
        return ('--log_num_zeros_in_grad counts zeros over the stepped tensors, and a run\'s also holds the '
                'buffer\'s alignment padding')
    if type(opt.optimizer).__name__ == 'HybridDeviceOptimizer':
        return 'the CPU-offloading optimizer keeps its own copies'
    if any(group for group in opt.model_fp32_groups):
        return 'fp32 trainable parameters'
    if any(len(state) for state in opt.optimizer.state.values()):
        return 'the optimizer already holds state (a resumed run keeps it per tensor)'
    return None


def runs_of(opt) -> List[List[Run]]:
    """Per parameter group of `opt`, its runs: members in their buffer's order; a run ends at a parameter of
    another group, at the end of a bucket (with several data-parallel ranks this rank's shards of two buckets are not
    adjacent: other ranks' shards lie between) or at other attributes."""
    placed = []  # (buffer, start, end, bucket, group, param) for every trainable tensor this rank updates
    for g, params in enumerate(opt.model_float16_groups):
        for p in params:
            gbuf_index, _, bucket_index, world, _ = _world_range(opt, p)
            placed.append((gbuf_index, world.start, world.end, bucket_index, g, p))
    placed.sort(key=lambda item: item[:2])
    groups: List[List[Run]] = [[] for _ in opt.model_float16_groups]
    previous = None  # the run the tensor just before in buffer order belongs to
    for gbuf_index, start, end, bucket_index, g, p in placed:
        runs = groups[g]
        if (previous is not None and runs and previous is runs[-1] and previous.gbuf_index == gbuf_index
                and previous.bucket_index == bucket_index and attrs_of(p) == attrs_of(previous.params[0])):
            previous.end = end
            previous.params.append(p)
        else:
            runs.append(Run(gbuf_index, bucket_index, start, end, [p]))
        previous = runs[-1]
    return groups


def _views(opt, run: Run) -> None:
    """The run's parameter and gradient views of its buffer, each member checked to lie inside them where its range
    says (ValueError otherwise)."""
    buffer = opt.buffers[run.gbuf_index]
    param_data, grad_data = getattr(buffer, 'param_data', None), getattr(buffer, 'grad_data', None)
    if param_data is None or grad_data is None:
        raise ValueError('a gradient buffer without its parameter buffer')
    shard = param_data.view(-1)[run.start:run.end]
    grad = grad_data.view(-1)[run.start:run.end]
    for p in run.params:
        _, _, _, world, local = _world_range(opt, p)
        member = p.detach().view(-1)[local.start:local.end]
        member_grad = p.main_grad.view(-1)[local.start:local.end]
        offset = world.start - run.start
        if (member.dtype != shard.dtype or member.data_ptr() != shard.data_ptr() + offset * shard.element_size()
                or member_grad.data_ptr() != grad.data_ptr() + offset * grad.element_size()):
            raise ValueError('a parameter that does not lie in its gradient buffer where its range says')
    for name, value in zip(SHARED_ATTRS, attrs_of(run.params[0])):
        if value is not None:
            setattr(shard, name, value)
    run.shard, run.grad = shard, grad


def grads_for_norm(opt) -> List[Any]:
    """The gradient views megatron-core's `get_main_grads_for_grad_norm` lists for `opt` per tensor, in its order
    (its groups, each group's tensors as built) and with its filters (not shared, not a tensor-parallel duplicate).
    The gradient norm is summed from this list rather than from the runs: a multi-tensor norm over the runs adds the
    same squares in another order, and under gradient clipping one fp32 rounding of the norm apart changes the
    update (seen on an H100: scripts/gpu/coalesced_optimizer_check.py, one step of twelve)."""
    from megatron.core import tensor_parallel
    from megatron.core.transformer.module import param_is_not_shared
    tp_group = getattr(opt, 'tp_group', None)
    grads = []
    for params in opt.model_float16_groups:
        for p in params:
            if param_is_not_shared(p) and tensor_parallel.param_is_not_tensor_parallel_duplicate(p, tp_group):
                _, _, _, _, local = _world_range(opt, p)
                grads.append(p.main_grad.view(-1)[local.start:local.end])
    return grads


def _refuse_state(name: str):
    def refused(*args, **kwargs):
        raise RuntimeError(f'swift-vora: the optimizer steps over coalesced runs ({ENV}=coalesced), whose state '
                           f'megatron-core cannot save or load per parameter ({name}); train with --no_save_optim '
                           f'true, or set {ENV}=per_tensor')
    return refused


def coalesce(opt) -> Optional[Coalesced]:
    """Coalesce the distributed optimizer `opt` in place; None (and `opt` as it was) where it does not apply."""
    if not (patches.applicable(PATCH) and patches.applicable(NORM_PATCH)):  # a megatron-core the inventory does
        return None  # not know: warned once, left as it is
    why = why_not(opt)
    if why is not None:
        logger.info(f'swift-vora: the optimizer stays per tensor ({why}; {ENV})')
        return None
    groups = runs_of(opt)
    try:
        for runs in groups:
            for run in runs:
                _views(opt, run)
    except ValueError as e:
        logger.warning(f'swift-vora: the optimizer stays per tensor ({e}; {ENV})')
        return None
    coalesced = Coalesced(groups)
    for group, runs in zip(opt.optimizer.param_groups, groups):
        group['params'] = [run.shard for run in runs]
    opt.shard_float16_groups = [[run.shard for run in runs] for runs in groups]

    norm_grads = grads_for_norm(opt)

    def main_grads_for_grad_norm():  # upstream's per-tensor list, made once: the norm summed in upstream's order
        return list(norm_grads)

    opt.get_main_grads_for_grad_norm = patches.mark(main_grads_for_grad_norm, NORM_PATCH,
                                                    opt.get_main_grads_for_grad_norm)

    def copy_model_grads_to_main_grads():  # the instance's: each run's gradient view, as upstream's per tensor
        for runs in coalesced.groups:
            for run in runs:
                run.shard.decoupled_grad = run.grad

    opt._copy_model_grads_to_main_grads = patches.mark(copy_model_grads_to_main_grads, PATCH,
                                                       opt._copy_model_grads_to_main_grads)
    for name in STATE_METHODS:
        if hasattr(opt, name):
            setattr(opt, name, _refuse_state(name))
    opt.swift_vora_coalesced = coalesced
    return coalesced


def distributed_optimizers(optimizer) -> List[Any]:
    """The optimizers inside Megatron-SWIFT's optimizer: a ChainedOptimizer's each, or the optimizer itself."""
    return list(getattr(optimizer, 'chained_optimizers', None) or [optimizer])


def coalesce_trainer(trainer) -> Tuple[int, int]:
    """Coalesce each of the trainer's optimizers that can be; (tensors before, after) over those coalesced."""
    args = getattr(trainer, 'args', None)
    if args is not None and not getattr(args, 'no_save_optim', False):
        logger.info(f'swift-vora: the optimizer stays per tensor (its state is saved: --no_save_optim false; {ENV})')
        return 0, 0
    before = after = 0
    for opt in distributed_optimizers(trainer.optimizer):
        done = coalesce(opt)
        if done is not None:
            before += done.tensors_before
            after += done.tensors_after
    if before:
        logger.info(f'swift-vora: the optimizer steps over {after} coalesced runs of the gradient buffers instead of '
                    f'{before} tensors ({ENV}=coalesced)')
    return before, after


class MegatronCoalescedOptimizer(MegatronTrainerCallback):
    """The `vora_coalesced_optimizer` callback (Megatron-SWIFT's callback events; the others are the base's
    no-ops)."""

    def on_train_begin(self):
        coalesce_trainer(self.trainer)
