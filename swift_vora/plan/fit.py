"""A request on some hardware: the memory model's setup for it, whether an estimate fits, and how the reasons
write the sizes."""
from __future__ import annotations

from dataclasses import replace
from typing import Optional, Tuple

from . import constants as C
from .backend import Backend
from .hardware import Hardware
from .memory import MemoryEstimate, TrainSetup, estimate
from .model_spec import ModelSpec
from .request import PlanRequest
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
                      gradient_checkpointing=req.gradient_checkpointing, vision_mode=req.vision_mode,
                      checkpoint_layers=req.checkpoint_layers if req.gradient_checkpointing else None,
                      checkpoint_offload=req.checkpoints == 'host',
                      # swift-vora compiles the layers under swift sft without DeepSpeed only (compile_layers.py)
                      compiled_layers=req.compile == 'layers' and backend == Backend.DDP,
                      fp8=req.fp8 == 'frozen_base',
                      cross_entropy=req.cross_entropy,
                      zero3_max_live_params=(C.ZERO3_MAX_LIVE_PARAMS_SMALL_GPU
                                             if hw.gpu_mem_gib <= C.ZERO3_SMALL_GPU_GIB else C.ZERO3_MAX_LIVE_PARAMS))


def fits(est: MemoryEstimate, hw: Hardware) -> Tuple[bool, bool]:
    gpu_ok = est.gpu_peak <= hw.gpu_mem_gib * C.GiB * (1 - C.FIT_MARGIN)
    host_ok = hw.host_ram_gib is None or est.host_peak <= hw.host_ram_gib * C.GiB
    return gpu_ok, host_ok


def estimate_for(spec: ModelSpec, tokens: VideoTokens, req: PlanRequest, hw: Hardware, backend: Backend, ep: int,
                 tp: int) -> Tuple[MemoryEstimate, PlanRequest]:
    """The estimate and the request it was made for, with `checkpoints=auto` decided: Unsloth keeps its layer
    checkpoints on the GPU when that fits (the faster path, measured: docs/benchmarks.md) and offloads them to
    pinned host RAM only when the GPU-resident plan does not fit and the offloaded one does."""
    if backend != Backend.UNSLOTH_SPLIT_LORA or req.checkpoints != 'auto' or not req.gradient_checkpointing:
        return estimate(spec, tokens, train_setup(req, hw, backend, ep, tp, tokens)), req
    on_gpu = replace(req, checkpoints='gpu')
    est = estimate(spec, tokens, train_setup(on_gpu, hw, backend, ep, tp, tokens))
    if all(fits(est, hw)):
        return est, on_gpu
    on_host = replace(req, checkpoints='host')
    est_host = estimate(spec, tokens, train_setup(on_host, hw, backend, ep, tp, tokens))
    return (est_host, on_host) if all(fits(est_host, hw)) else (est, on_gpu)


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
    alt = estimate(spec, tokens, train_setup(other, hw, backend, 1, 1, tokens))
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
