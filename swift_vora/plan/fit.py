"""A request on some hardware: the memory model's setup for it, whether an estimate fits, and how the reasons
write the sizes."""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Optional, Tuple

from . import constants as C
from .backend import Backend
from .hardware import Hardware
from .memory import MEGATRON_BACKENDS, MemoryEstimate, TrainSetup, estimate
from .model_spec import ModelSpec
from .request import CHECKPOINT_LAYERS_AUTO, PlanRequest
from .video_budget import VideoTokens


def gib(x: float) -> str:
    return f'{x / C.GiB:.1f} GiB'


def gb(x: float) -> str:
    return f'{x / C.GB:.0f} GB'


def gb_and_gib(x: float) -> str:
    return f'{x / C.GB:,.0f} GB ({x / C.GiB:,.1f} GiB)'


def param_count(n: float) -> str:
    return f'{n / 1e9:.2f} B' if n >= 1e9 else f'{n / 1e6:.1f} M'


def samples_per_row(req: PlanRequest, tokens: VideoTokens) -> float:
    """Samples in one packed row: with dataset packing a row holds up to `pack_length` tokens, so the row is
    planned at that length (pack_length / tokens per sample samples, at least one); unpacked, one."""
    if not req.pack_length:
        return 1.0
    return max(1.0, req.pack_length / max(1, tokens.total_tokens))


def train_setup(req: PlanRequest, hw: Hardware, backend: Backend, ep: int, tp: int, tokens: VideoTokens) -> TrainSetup:
    return TrainSetup(backend=backend, tuner=req.tuner, gpus_per_node=hw.num_gpus, nodes=hw.nodes,
                      offload=req.offload, quant=req.quant, tp=tp, ep=ep, micro_batch=req.micro_batch,
                      samples_per_row=samples_per_row(req, tokens),
                      lora_rank=req.lora_rank, lora_targets=req.lora_targets,
                      # Megatron recomputes by megatron.recompute: only 'full' is a layer checkpoint
                      gradient_checkpointing=req.gradient_checkpointing and (backend not in MEGATRON_BACKENDS or
                                                                             req.recompute == 'full'),
                      vision_mode=req.vision_mode,
                      # 'auto' not yet decided (estimate_for decides it) is planned as every layer checkpointed
                      checkpoint_layers=(req.checkpoint_layers if req.gradient_checkpointing and
                                         req.checkpoint_layers != CHECKPOINT_LAYERS_AUTO else None),
                      checkpoint_offload=req.checkpoints == 'host',
                      # swift-vora compiles the layers under swift sft without DeepSpeed only (compile_layers.py)
                      compiled_layers=req.compile == 'layers' and backend == Backend.DDP,
                      fp8=req.fp8 == 'frozen_base',
                      cross_entropy=req.cross_entropy, recompute=req.recompute,
                      zero3_max_live_params=(C.ZERO3_MAX_LIVE_PARAMS_SMALL_GPU
                                             if hw.gpu_mem_gib <= C.ZERO3_SMALL_GPU_GIB else C.ZERO3_MAX_LIVE_PARAMS))


def plan_estimate(spec: ModelSpec, tokens: VideoTokens, setup: TrainSetup) -> MemoryEstimate:
    """memory.estimate for `setup` (every backend, megatron_ep_full included, has terms of its own)."""
    return estimate(spec, tokens, setup)


def fits(est: MemoryEstimate, hw: Hardware, margin: float = C.FIT_MARGIN) -> Tuple[bool, bool]:
    """(fits the GPU, fits the host): `margin` is the fraction of the GPU left free (the search keeps
    C.SEARCH_MARGIN for the settings it chooses)."""
    gpu_ok = est.gpu_peak <= hw.gpu_mem_gib * C.GiB * (1 - margin)
    host_ok = hw.host_ram_gib is None or est.host_peak <= hw.host_ram_gib * C.GiB
    return gpu_ok, host_ok


def estimate_for(spec: ModelSpec, tokens: VideoTokens, req: PlanRequest, hw: Hardware, backend: Backend, ep: int,
                 tp: int, margin: float = C.FIT_MARGIN) -> Tuple[MemoryEstimate, PlanRequest]:
    """The estimate and the request it was made for, with `checkpoints=auto` and `checkpoint_layers=auto`
    decided (the checkpoints' place first, with every layer checkpointed; then how many layers), each so that the
    plan fits with `margin` of the GPU left free."""
    est, req = _checkpoints_decided(spec, tokens, req, hw, backend, ep, tp, margin)
    if req.checkpoint_layers == CHECKPOINT_LAYERS_AUTO:
        return _fewest_checkpointed_layers(spec, tokens, req, hw, backend, ep, tp, est, margin)
    return est, req


# Where the first N layers can be checkpointed and the rest keep their activations: swift sft (speed/
# partial_checkpoint.py, ddp and DeepSpeed) and the Unsloth runner; Megatron recomputes by its own flags.
PARTIAL_CHECKPOINT_BACKENDS = (Backend.DDP, Backend.DEEPSPEED_ZERO2, Backend.DEEPSPEED_ZERO3,
                               Backend.UNSLOTH_SPLIT_LORA)


def _fewest_checkpointed_layers(spec: ModelSpec, tokens: VideoTokens, req: PlanRequest, hw: Hardware,
                                backend: Backend, ep: int, tp: int, every_layer: MemoryEstimate,
                                margin: float = C.FIT_MARGIN) -> Tuple[MemoryEstimate, PlanRequest]:
    """`checkpoint_layers=auto`: the fewest checkpointed layers (the first ones) whose plan fits -- each layer
    not checkpointed is one the backward does not recompute, paid for in memory. Every layer when no fewer fits,
    when every layer does not fit either, with the checkpoints offloaded to host RAM (the offload is there because
    the GPU is short), or where the backend has no partial checkpointing."""
    every = replace(req, checkpoint_layers=None)
    if not req.gradient_checkpointing or _every_layer_kept(req, backend) or not all(fits(every_layer, hw, margin)):
        return every_layer, every
    best, best_k = every_layer, None
    for k in range(spec.num_layers - 1, -1, -1):  # memory grows as k falls: stop at the first that does not fit
        fewer = replace(req, checkpoint_layers=k)
        est = plan_estimate(spec, tokens, train_setup(fewer, hw, backend, ep, tp, tokens))
        if not all(fits(est, hw, margin)):
            break
        best, best_k = est, k
    return best, replace(req, checkpoint_layers=best_k)


def _every_layer_kept(req: PlanRequest, backend: Backend) -> Optional[str]:
    """Why `checkpoint_layers=auto` does not look for fewer layers here, or None where it does."""
    if backend not in PARTIAL_CHECKPOINT_BACKENDS:
        return f'{backend} recomputes by its own settings'
    if req.checkpoints == 'host':
        return 'the layer checkpoints go to host RAM because the GPU is short'
    return None


def _checkpoints_decided(spec: ModelSpec, tokens: VideoTokens, req: PlanRequest, hw: Hardware, backend: Backend,
                         ep: int, tp: int, margin: float = C.FIT_MARGIN) -> Tuple[MemoryEstimate, PlanRequest]:
    """`checkpoints=auto` decided: Unsloth keeps its layer checkpoints on the GPU when that fits (the faster path,
    measured: docs/runs/benchmarks-log.md) and offloads them to pinned host RAM only when the GPU-resident plan does
    not fit and the offloaded one does."""
    if backend != Backend.UNSLOTH_SPLIT_LORA or req.checkpoints != 'auto' or not req.gradient_checkpointing:
        return plan_estimate(spec, tokens, train_setup(req, hw, backend, ep, tp, tokens)), req
    on_gpu = replace(req, checkpoints='gpu')
    est = plan_estimate(spec, tokens, train_setup(on_gpu, hw, backend, ep, tp, tokens))
    if all(fits(est, hw, margin)):
        return est, on_gpu
    on_host = replace(req, checkpoints='host')
    est_host = plan_estimate(spec, tokens, train_setup(on_host, hw, backend, ep, tp, tokens))
    return (est_host, on_host) if all(fits(est_host, hw, margin)) else (est, on_gpu)


def checkpoint_layers_sentence(spec: ModelSpec, tokens: VideoTokens, req: PlanRequest, asked: Any, hw: Hardware,
                               backend: Backend, ep: int, tp: int, est: MemoryEstimate) -> Optional[str]:
    """What `checkpoint_layers=auto` decided (`req` is the decided request), with the every-layer peak beside it."""
    if asked != CHECKPOINT_LAYERS_AUTO or not req.gradient_checkpointing:
        return None
    n = spec.num_layers
    k = req.checkpoint_layers
    if k is None:
        why = _every_layer_kept(req, backend) or 'no fewer fit'
        return f'train.checkpoint_layers=auto: every one of the {n} decoder layers checkpointed ({why}).'
    every = plan_estimate(spec, tokens, train_setup(replace(req, checkpoint_layers=None), hw, backend, ep, tp, tokens))
    which = (f'no decoder layer checkpointed, all {n} keep their activations' if k == 0 else
             f'the first {k} of {n} decoder layers checkpointed, the last {n - k} keep their activations')
    return (f'train.checkpoint_layers=auto: {which} -- the fewest the plan fits ({gib(est.gpu_peak)} on the GPU; '
            f'with every layer checkpointed {gib(every.gpu_peak)}). A layer not checkpointed is a forward the '
            'backward does not recompute; train.checkpoint_layers=N sets the number.')


def checkpoints_of(est: MemoryEstimate) -> Optional[str]:
    """Where an Unsloth plan keeps its layer checkpoints ('gpu' | 'host'); None for other backends."""
    s = est.setup
    if s.backend != Backend.UNSLOTH_SPLIT_LORA or not s.gradient_checkpointing:
        return None
    return 'host' if s.checkpoint_offload else 'gpu'


def checkpoint_sentence(spec: ModelSpec, tokens: VideoTokens, req: PlanRequest, asked: str, hw: Hardware,
                        backend: Backend, est: MemoryEstimate) -> Optional[str]:
    """Where Unsloth keeps the layer checkpoints and why (the other choice's peak for comparison)."""
    where = checkpoints_of(est)
    if where is None:
        return None
    other = replace(req, checkpoints='host' if where == 'gpu' else 'gpu')
    alt = plan_estimate(spec, tokens, train_setup(other, hw, backend, 1, 1, tokens))
    if where == 'gpu':
        why = 'the plan has room for them' if asked == 'auto' else 'as requested'
        effect = (f'would lower the GPU peak to {gib(alt.gpu_peak)}' if alt.gpu_peak < est.gpu_peak else
                  f'would not lower the GPU peak ({gib(alt.gpu_peak)}: the checkpoints are freed before the LoRA '
                  'gradients peak)')
        return (f'Layer checkpoints stay on the GPU ({why}): Unsloth\'s offload to pinned host RAM {effect} and cost '
                f'speed (on the GPU {C.UNSLOTH_GPU_CHECKPOINT_SPEEDUP}x faster, measured on an H200 at the 35B-A3B '
                'shape); unsloth.gradient_checkpointing=unsloth forces it.')
    why = f'on the GPU they would need {gib(alt.gpu_peak)}, more than fits' if asked == 'auto' else 'as requested'
    return (f'Layer checkpoints offloaded to pinned host RAM (Unsloth\'s offloaded checkpointing; {why}): '
            f'{gib(est.host.get("offloaded layer checkpoints (Unsloth, pinned)", 0.0))} of host memory.')
