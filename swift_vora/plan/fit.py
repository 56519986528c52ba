"""A request on some hardware: the memory model's setup for it, whether an estimate fits, and how the reasons
write the sizes."""
from __future__ import annotations

from typing import Tuple

from . import constants as C
from .backend import Backend
from .hardware import Hardware
from .memory import MemoryEstimate, TrainSetup
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
                      # swift-vora compiles the layers under swift sft without DeepSpeed only (compile_layers.py)
                      compiled_layers=req.compile == 'layers' and backend == Backend.DDP,
                      zero3_max_live_params=(C.ZERO3_MAX_LIVE_PARAMS_SMALL_GPU
                                             if hw.gpu_mem_gib <= C.ZERO3_SMALL_GPU_GIB else C.ZERO3_MAX_LIVE_PARAMS))


def fits(est: MemoryEstimate, hw: Hardware) -> Tuple[bool, bool]:
    gpu_ok = est.gpu_peak <= hw.gpu_mem_gib * C.GiB * (1 - C.FIT_MARGIN)
    host_ok = hw.host_ram_gib is None or est.host_peak <= hw.host_ram_gib * C.GiB
    return gpu_ok, host_ok
