"""Regional `torch.compile` of the LLM's decoder layers: fewer, fused kernels and one autograd node per layer.

After `lora_autocast` and Liger, a GPU profile of a 2B Qwen3-VL LoRA step showed the GPU idle half the time
(docs/runs/benchmarks-log.md): the host could not launch the ~100 small kernels per decoder layer and pass (PEFT's
dropout, A, B, scale and add for 7 LoRA layers, RMSNorm, RoPE, SiLU-mul) as fast as the GPU ran them. Compiling each
decoder layer with inductor fuses the elementwise work around the matmuls into a few Triton kernels and replaces the
per-op Python dispatch and autograd bookkeeping with one compiled forward and one compiled backward.

This is PyTorch's "regional compilation" recipe (https://pytorch.org/tutorials/recipes/regional_compilation.html):
`nn.Module.compile()` on every layer of the repeated block, in place, so parameter names and PEFT's adapter saving
are unchanged. The layers share one compiled graph per grad mode and shape class (dynamo inlines the module and lifts
its parameters), so 28 layers compile once, not 28 times. The first steps pay the compile
(docs/runs/benchmarks-log.md says how long). PEFT's LoRA dropout is fused by inductor with its own RNG.

Where gradient checkpointing runs (`SWIFT_VORA_COMPILE_CHECKPOINT`):
- `eager` (default): transformers' (reentrant) checkpoint around each compiled
  layer. Every layer's backward goes through Python first (CheckpointFunction: RNG state fork, input detach, a
  guarded call of the compiled training graph, a nested autograd.backward); the diagnostic trace of this path shows
  the GPU waiting between those calls.
- `graph`: the layer's forward wrapped in `torch.utils.checkpoint.checkpoint`, which dynamo traces as an
  activation-checkpoint region: the forward saves only the layer's inputs and the recompute runs inside the compiled
  backward -- one compiled forward and one compiled backward per layer, as torchtitan does it. Correct with torch
  2.14 (CPU tests below), but torch 2.11's inductor partitioner rejects the graph (docs/runs/benchmarks-log.md), so
  it is opt-in.
Dropout stays exact either way. Inside the graph, AOTAutograd replays the forward's RNG state in the recompute (under
`aot_eager` training is bit-identical to eager reentrant checkpointing with the same seed; with inductor the gradient
is the derivative of the loss that was computed). Around it, the checkpointed forward (no-grad graph) and its
recompute (training graph) draw the same masks from the RNG state `torch.utils.checkpoint` restores.
tests/test_compile_layers.py checks both on CPU, and the around-the-layer masks on CUDA too (marked gpu).

The vision tower's blocks are compiled too (`SWIFT_VORA_COMPILE_VISION=0` leaves them eager). In a step trace most
of the frozen vision tower's GPU time was outside its matmuls and attention (docs/runs/benchmarks-log.md): autocast
runs its LayerNorms and its rotary embedding in float32, as dozens of small kernels per block with the GPU
waiting on their launches. A vision block's whole work (norms, qkv, rotary embedding, the batched attention of
swift_vora/speed/vit_attention.py, projection, MLP, residuals) is one compiled function shared by all blocks; the
frame-group sizes enter as ints read once per vision forward, so the graph has no host sync. Under a frozen tower
it is an inference graph (nothing there needs autograd). docs/runs/benchmarks-log.md measures it.

`SWIFT_VORA_COMPILE=layers` turns it on (recipe key `train.compile: layers`); it is off by default because on a CPU
or a tiny model the compile costs more than it saves. Not applied under DeepSpeed (ZeRO-3 gathers parameters in
module hooks, which a compiled region would have to trace; DeepSpeed has its own `engine.compile()`).
`SWIFT_VORA_COMPILE_BACKEND` picks the torch.compile backend (default inductor; `aot_eager` in the CPU tests), and
`SWIFT_VORA_COMPILE_MODE` inductor's mode: `reduce-overhead` replays each compiled layer as a CUDA graph (one launch
instead of its kernels: the host-bound step's lever), `max-autotune*` benchmarks GEMM configurations first. A mode
with another backend is ignored, with a warning (torch would hand it to that backend as an unknown argument).
"""
from __future__ import annotations

import logging
from typing import List

from swift.callbacks import TrainerCallback

from .. import patches, switches

ENV = 'SWIFT_VORA_COMPILE'
BACKEND_ENV = 'SWIFT_VORA_COMPILE_BACKEND'
MODE_ENV = 'SWIFT_VORA_COMPILE_MODE'
CHECKPOINT_ENV = 'SWIFT_VORA_COMPILE_CHECKPOINT'
VISION_ENV = 'SWIFT_VORA_COMPILE_VISION'
MODES = switches.switch(ENV).choices  # off | layers, from the switch table
CHECKPOINT_PLACES = ('graph', 'eager')
logger = logging.getLogger('swift')


def mode(environ=None) -> str:
    return switches.read(ENV, environ)


def enabled(environ=None) -> bool:
    """Whether `SWIFT_VORA_COMPILE` asks for compiled layers (the callback is appended only then)."""
    return mode(environ) != 'off'


def checkpoint_place(environ=None) -> str:
    """Where a compiled layer's gradient checkpointing runs: `graph` (inside the compiled region) or `eager`."""
    return switches.read(CHECKPOINT_ENV, environ)


def _repeated_blocks(model, suffix: str) -> List:
    """The longest ModuleList of one class whose name ends with `suffix`."""
    import torch
    best: List = []
    for module in model.modules():
        if not isinstance(module, torch.nn.ModuleList) or len(module) < 2:
            continue
        classes = {type(child) for child in module}
        if len(classes) == 1 and next(iter(classes)).__name__.endswith(suffix) and len(module) > len(best):
            best = list(module)
    return best


def compile_vision(environ=None) -> bool:
    """With `SWIFT_VORA_COMPILE=layers`, the vision blocks are compiled too unless this says 0/false/no/off."""
    return switches.read(VISION_ENV, environ)


def decoder_layers(model) -> List:
    """The repeated decoder layers of the language model: the longest ModuleList of one `*DecoderLayer` class.
    Vision blocks are compiled separately (`compile_vision_blocks`)."""
    return _repeated_blocks(model, 'DecoderLayer')


def vision_blocks(model, blocks=None) -> List:
    """The vision tower's repeated blocks (`*VisionBlock`; `blocks`: those the caller found already), if their
    attention class carries swift-vora's batched forward (swift_vora/speed/vit_attention.py); [] otherwise --
    transformers' own attention reads the frame-group sizes from the device in every block, which a compiled graph
    cannot do."""
    from . import vit_attention
    blocks = _repeated_blocks(model, 'VisionBlock') if blocks is None else blocks
    attn = getattr(blocks[0], 'attn', None) if blocks else None
    return blocks if attn is not None and vit_attention.is_patched(type(attn)) else []


def checkpointed_forward(self, *args, **kwargs):
    """A decoder layer's forward inside `torch.utils.checkpoint` when training with grad (traced by dynamo as an
    activation-checkpoint region of the compiled graph); the plain forward otherwise (eval, no_grad)."""
    import functools

    import torch
    forward = functools.partial(type(self).forward, self)
    if self.training and torch.is_grad_enabled():
        return torch.utils.checkpoint.checkpoint(forward, *args, use_reentrant=False, **kwargs)
    return forward(*args, **kwargs)


def _with_plain_checkpoint(compiled):
    """Run `compiled` with torch's own `torch.utils.checkpoint.checkpoint` in place.

    ms-swift's `_fix_gradient_checkpointing` replaces that function by one that forces its `use_reentrant` choice
    (True on one process) and keeps torch's as `_old_checkpoint`. Compiling the activation-checkpoint region calls
    `checkpoint(..., use_reentrant=False, context_fn=...)` from inside torch (`tag_activation_checkpoint`), which
    the forced reentrant variant rejects. Only the compiled layers' calls (where tracing happens) see torch's own;
    every other checkpoint call keeps ms-swift's."""
    import torch.utils.checkpoint as checkpoint_module

    def call(*args, **kwargs):
        current = checkpoint_module.checkpoint
        original = getattr(checkpoint_module, '_old_checkpoint', None)
        if original is None or current is original:
            return compiled(*args, **kwargs)
        checkpoint_module.checkpoint = original
        try:
            return compiled(*args, **kwargs)
        finally:
            checkpoint_module.checkpoint = current

    return call


def compile_options(backend: str, inductor_mode: str) -> dict:
    """torch.compile's keyword arguments: the backend, and the mode where inductor takes one."""
    if inductor_mode == 'default':
        return {'backend': backend}
    if backend != 'inductor':
        logger.warning(f'swift-vora compile: {MODE_ENV}={inductor_mode} applies to the inductor backend only; '
                       f'ignored with {BACKEND_ENV}={backend}')
        return {'backend': backend}
    return {'backend': backend, 'mode': inductor_mode}


def compile_decoder_layers(model, backend: str = 'inductor', checkpoint: str = 'eager', layers=None,
                           inductor_mode: str = 'default') -> int:
    """`layer.compile()` on every decoder layer (in place; `layers`: `decoder_layers(model)` if the caller has not
    found them already); returns how many layers.

    With `checkpoint='graph'`, layers that transformers checkpoints (`gradient_checkpointing` set by
    `gradient_checkpointing_enable`) are checkpointed inside the compiled region instead: transformers' wrapper is
    switched off for them and `checkpointed_forward` becomes their forward."""
    import types
    layers = decoder_layers(model) if layers is None else layers
    if not layers or not patches.applicable('compiled_decoder_layers'):
        return 0
    options = compile_options(backend, inductor_mode)
    # the checkpoint inside the graph needs torch's own checkpoint back from ms-swift's wrapper; else around it
    graph = checkpoint == 'graph' and patches.applicable('compiled_checkpoint_swap')
    for layer in layers:
        inside = graph and getattr(layer, 'gradient_checkpointing', False)
        if inside:
            layer.gradient_checkpointing = False
            layer.forward = types.MethodType(checkpointed_forward, layer)
        layer.compile(**options)
        patches.applied('compiled_decoder_layers')
        if inside:
            layer._compiled_call_impl = patches.mark(_with_plain_checkpoint(layer._compiled_call_impl),
                                                     'compiled_checkpoint_swap', layer._compiled_call_impl)
    return len(layers)


def compile_vision_blocks(blocks, backend: str = 'inductor', inductor_mode: str = 'default') -> int:
    """Compile the vision blocks: one compiled function for a block's whole work (norms, qkv, rotary embedding, the
    batched attention, projection, MLP, residuals) shared by all blocks, called with the frame-group sizes as ints
    that `vit_attention.split_sizes` reads once per vision forward. The model-level kwargs that transformers hands
    down to every block (`num_items_in_batch`, `use_cache`) are not passed in: sdpa and eager attention ignore them.
    Calls it cannot take (unequal groups, other attention implementations, transformers' output-recording hooks on
    the attention) run transformers' block forward with the patched attention, as without this. Returns how many
    blocks."""
    import types

    import torch

    from . import vit_attention
    if not blocks or not patches.applicable('compiled_vision_block'):
        return 0
    compiled = torch.compile(vit_attention.make_equal_groups_block(type(blocks[0]), type(blocks[0].attn)),
                             **compile_options(backend, inductor_mode))

    def forward(self, hidden_states, cu_seqlens, position_embeddings=None, max_seqlen=None, **kwargs):
        hooked = self.attn._forward_hooks or self.attn._forward_pre_hooks  # output_attentions recording
        groups = None if hooked or position_embeddings is None else vit_attention.batched_groups(self.attn, cu_seqlens)
        if groups is None:
            return type(self).forward(self, hidden_states, cu_seqlens, position_embeddings=position_embeddings,
                                      max_seqlen=max_seqlen, **kwargs)
        return compiled(self, hidden_states, position_embeddings, *groups)

    patches.mark(forward, 'compiled_vision_block', type(blocks[0]).forward)
    for block in blocks:
        block.forward = types.MethodType(forward, block)
    return len(blocks)


COUNTERS_LOG_PREFIX = 'swift-vora compile: after step 1: '  # benchmarks/throughput.py reads the line back


def compile_counters() -> dict:
    """What dynamo did so far: graphs compiled and graph breaks (by reason) -- logged after step 1."""
    from torch._dynamo.utils import counters
    breaks = dict(counters['graph_break'])
    return {'unique_graphs': counters['stats'].get('unique_graphs', 0),
            'graph_breaks': sum(breaks.values()), 'graph_break_reasons': {k[:160]: v for k, v in breaks.items()}}


class CompileDecoderLayers(TrainerCallback):
    """Compiles the decoder layers (and the vision blocks) when training begins; logs dynamo's counters after the
    first optimizer step."""

    compiled = 0  # how many decoder layers this callback compiled
    compiled_vision = 0  # how many vision blocks

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.compiled = self.compiled_vision = 0
        model = model if model is not None else getattr(self.trainer, 'model', None)
        if model is None or mode() == 'off':
            return
        if getattr(args, 'deepspeed', None):
            logger.warning(f'swift-vora compile: {ENV}=layers is not applied under DeepSpeed (its parameter hooks '
                           'would be traced into the compiled layers); training runs uncompiled')
            return
        backend = switches.read(BACKEND_ENV)
        inductor_mode = compile_options(backend, switches.read(MODE_ENV)).get('mode', 'default')  # warns once
        place = checkpoint_place()
        layers = decoder_layers(model)
        checkpointed = sum(bool(getattr(layer, 'gradient_checkpointing', False)) for layer in layers)
        self.compiled = compile_decoder_layers(model, backend=backend, checkpoint=place, layers=layers,
                                               inductor_mode=inductor_mode)
        if compile_vision():
            found = _repeated_blocks(model, 'VisionBlock')
            blocks = vision_blocks(model, found)
            self.compiled_vision = compile_vision_blocks(blocks, backend=backend, inductor_mode=inductor_mode)
            if found and not blocks:
                logger.info('swift-vora compile: vision blocks left uncompiled (transformers\' vision attention, '
                            'SWIFT_VORA_VIT_ATTENTION=transformers or a model swift-vora does not patch)')
        if not self.compiled:
            if not layers:  # (not compiled for an upstream the inventory does not know: patches.py warned)
                logger.warning(f'swift-vora compile: {ENV}=layers but no repeated *DecoderLayer list was found in '
                               f'{type(model).__name__}; decoder layers run uncompiled')
            if not self.compiled_vision:
                return
        inside = place == 'graph' and patches.check('compiled_checkpoint_swap') is None
        where = (f'; gradient checkpointing of {checkpointed} layers ' + (
            'inside the compiled graph' if inside else "around the compiled layer (transformers')")
            if checkpointed else '')
        vision = f', {self.compiled_vision} vision blocks' if self.compiled_vision else ''
        logger.info(f'swift-vora compile: {self.compiled} decoder layers{vision} compiled with torch.compile '
                    f'(backend={backend}, mode={inductor_mode}){where}; the first steps include the compile time')

    def on_step_end(self, args, state, control, **kwargs):
        if (self.compiled or self.compiled_vision) and state.global_step == 1:
            logger.info(f'{COUNTERS_LOG_PREFIX}{compile_counters()}')
