"""Regional `torch.compile` of the LLM's decoder layers: fewer, fused kernels and one autograd node per layer.

After `lora_autocast` and Liger, the H200 profile of a 2B Qwen3-VL LoRA step showed the GPU idle half the time
(docs/benchmarks.md): the host could not launch the ~100 small kernels per decoder layer and pass (PEFT's dropout,
A, B, scale and add for 7 LoRA layers, RMSNorm, RoPE, SiLU-mul) as fast as the GPU ran them. Compiling each decoder
layer with inductor fuses the elementwise work around the matmuls into a few Triton kernels and replaces the
per-op Python dispatch and autograd bookkeeping with one compiled forward and one compiled backward.

This is PyTorch's "regional compilation" recipe (https://pytorch.org/tutorials/recipes/regional_compilation.html):
`nn.Module.compile()` on every layer of the repeated block, in place, so parameter names, PEFT's adapter saving and
transformers' gradient checkpointing (which calls the layer inside `torch.utils.checkpoint`) are unchanged. The
layers share one compiled graph per grad mode and shape class (dynamo inlines the module and lifts its parameters),
so 28 layers compile once, not 28 times. The first steps pay the compile (about a minute on the H200 host).
PEFT's LoRA dropout is fused by inductor with its own RNG; gradient checkpointing stays exact because the
checkpointed forward (no-grad graph) and its recompute (training graph) draw the same masks from the RNG state that
`torch.utils.checkpoint` restores (tests/test_compile_layers.py checks this on CPU and, marked gpu, on CUDA).

`SWIFT_VORA_COMPILE=layers` turns it on (recipe key `train.compile: layers`); it is off by default because on a CPU
or a tiny model the compile costs more than it saves. Not applied under DeepSpeed (ZeRO-3 gathers parameters in
module hooks, which a compiled region would have to trace; DeepSpeed has its own `engine.compile()`).
`SWIFT_VORA_COMPILE_BACKEND` picks the torch.compile backend (default inductor; `aot_eager` in the CPU tests).
"""
from __future__ import annotations

import logging
import os
from typing import List

from swift.callbacks import TrainerCallback

ENV = 'SWIFT_VORA_COMPILE'
BACKEND_ENV = 'SWIFT_VORA_COMPILE_BACKEND'
MODES = ('off', 'layers')
logger = logging.getLogger('swift')


def mode(environ=None) -> str:
    environ = os.environ if environ is None else environ
    value = environ.get(ENV, 'off').strip().lower() or 'off'
    if value in ('0', 'false', 'no', 'none'):
        value = 'off'
    if value not in MODES:
        raise ValueError(f'{ENV}={value!r}: expected one of {", ".join(MODES)}')
    return value


def decoder_layers(model) -> List:
    """The repeated decoder layers of the language model: the longest ModuleList of one `*DecoderLayer` class.

    Vision blocks (`*VisionBlock`) are not matched: the frozen vision tower runs without autograd and its attention
    reads per-video split sizes on the host (swift_vora/vit_attention.py), which would break a compiled graph.
    """
    import torch
    best: List = []
    for module in model.modules():
        if not isinstance(module, torch.nn.ModuleList) or len(module) < 2:
            continue
        classes = {type(child) for child in module}
        if len(classes) == 1 and next(iter(classes)).__name__.endswith('DecoderLayer') and len(module) > len(best):
            best = list(module)
    return best


def compile_decoder_layers(model, backend: str = 'inductor') -> int:
    """`layer.compile()` on every decoder layer (in place); returns how many layers."""
    layers = decoder_layers(model)
    for layer in layers:
        layer.compile(backend=backend)
    return len(layers)


def compile_counters() -> dict:
    """What dynamo did so far: graphs compiled and graph breaks (by reason) -- logged after step 1."""
    from torch._dynamo.utils import counters
    breaks = dict(counters['graph_break'])
    return {'unique_graphs': counters['stats'].get('unique_graphs', 0),
            'graph_breaks': sum(breaks.values()), 'graph_break_reasons': {k[:160]: v for k, v in breaks.items()}}


class CompileDecoderLayers(TrainerCallback):
    """Compiles the decoder layers when training begins; logs dynamo's counters after the first optimizer step."""

    compiled = 0  # how many layers this callback compiled

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.compiled = 0
        model = model if model is not None else getattr(self.trainer, 'model', None)
        if model is None or mode() == 'off':
            return
        if getattr(args, 'deepspeed', None):
            logger.warning(f'swift-vora compile: {ENV}=layers is not applied under DeepSpeed (its parameter hooks '
                           'would be traced into the compiled layers); training runs uncompiled')
            return
        backend = os.environ.get(BACKEND_ENV, 'inductor').strip() or 'inductor'
        self.compiled = compile_decoder_layers(model, backend=backend)
        if not self.compiled:
            logger.warning(f'swift-vora compile: {ENV}=layers but no repeated *DecoderLayer list was found in '
                           f'{type(model).__name__}; training runs uncompiled')
            return
        logger.info(f'swift-vora compile: {self.compiled} decoder layers compiled with torch.compile '
                    f'(backend={backend}); the first steps include the compile time')

    def on_step_end(self, args, state, control, **kwargs):
        if self.compiled and state.global_step == 1:
            logger.info(f'swift-vora compile: after step 1: {compile_counters()}')
