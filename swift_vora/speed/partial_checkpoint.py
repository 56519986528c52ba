"""Gradient checkpointing of the first N decoder layers only (`SWIFT_VORA_CHECKPOINT_LAYERS`, recipe
`train.checkpoint_layers`): the others keep their activations, so the backward recomputes N layers, not all.

Whole-layer checkpointing trades one extra forward of every layer for memory; where the plan leaves memory free
(the 35B-A3B under Unsloth at micro-batch 4 keeps ~40 GiB of an H200 unused; FP8 frozen weights free 1.4 GiB at the
2B shape) part of that forward can be bought back. transformers decides per layer: `GradientCheckpointingLayer`
checkpoints a layer when its `gradient_checkpointing` attribute is set (`gradient_checkpointing_enable` sets it on
every layer), and Unsloth's checkpointing goes through the same call. This lever clears the attribute on the decoder
layers from index N on, at train begin -- before `compile_layers` and `selective_checkpoint`, which act on the layers
that are still checkpointed. What is computed is unchanged: a layer that is not checkpointed runs its forward once,
as without checkpointing (tests/test_partial_checkpoint.py compares losses and gradients).

Which layers: all saved activations are alive together when the backward starts, so the peak does not depend on
which layers keep theirs; the first N are checkpointed (as Megatron's `--recompute_method block` does). N at or above
the number of layers changes nothing; N = 0 is no checkpointing of the decoder (the vision tower keeps its own).
The planner counts the kept layers' activations (plan/memory.py) and says what N fits.
"""
from __future__ import annotations

import json
import logging
import os
from typing import Any, Dict, List, Optional, Tuple

from swift.callbacks import TrainerCallback

from .. import switches

ENV = 'SWIFT_VORA_CHECKPOINT_LAYERS'
REPORT = 'partial_checkpoint.json'
logger = logging.getLogger('swift')


def layers_to_checkpoint(environ=None) -> Optional[int]:
    """N from the switch; None: every layer transformers checkpoints stays checkpointed."""
    return switches.read(ENV, environ)


def enabled(environ=None) -> bool:
    return layers_to_checkpoint(environ) is not None


def checkpoint_first(layers: List, n: int) -> Dict[str, Any]:
    """Keep gradient checkpointing on layers[:n] only. Returns the counts (`checkpointed_before` 0: the model was
    not checkpointing its decoder, nothing changed)."""
    before = [i for i, layer in enumerate(layers) if getattr(layer, 'gradient_checkpointing', False)]
    for i in before:
        if i >= n:
            layers[i].gradient_checkpointing = False
    after = [i for i, layer in enumerate(layers) if getattr(layer, 'gradient_checkpointing', False)]
    return {'layers': len(layers), 'asked': n, 'checkpointed_before': len(before), 'checkpointed': len(after),
            'not_checkpointed': len(layers) - len(after)}


class ForwardCounter:
    """Counts each decoder layer's forward calls over the first optimizer step, apart those made inside the backward
    (autograd running a graph task): a checkpointed layer's recompute, reentrant or not. What the run did, not what was
    asked. A recompute inside a compiled graph (`SWIFT_VORA_COMPILE_CHECKPOINT=graph`) does not call the module
    again and is not seen."""

    def __init__(self, layers: List):
        self.forward = [0] * len(layers)
        self.in_backward = [0] * len(layers)
        self.handles = [layer.register_forward_pre_hook(self._hook(i)) for i, layer in enumerate(layers)]

    def _hook(self, index: int):
        import torch

        def count(module, args):
            if torch._C._current_graph_task_id() != -1:  # called by the autograd engine: a recompute
                self.in_backward[index] += 1
            else:
                self.forward[index] += 1
        return count

    def close(self) -> Dict[str, Any]:
        for handle in self.handles:
            handle.remove()
        self.handles = []
        return {'forward_calls': self.forward, 'recompute_calls': self.in_backward,
                'recomputed_layers': sum(1 for c in self.in_backward if c)}


def apply(model, n: int, count: bool = True) -> Tuple[Dict[str, Any], Optional[ForwardCounter]]:
    """Checkpointing kept on the model's first n decoder layers: (what was done, the counter of the first step's
    recomputes -- None when `count` is false)."""
    from .compile_layers import decoder_layers
    layers = decoder_layers(model)
    return checkpoint_first(layers, n), ForwardCounter(layers) if count else None


def describe_recomputes(done: Dict[str, Any]) -> str:
    return (f'swift-vora partial checkpoint: in the first optimizer step {done["recomputed_layers"]} decoder '
            f'layers ran their forward again in the backward ({done["checkpointed"]} checkpointed)')


def describe(done: Dict[str, Any]) -> str:
    if not done['checkpointed_before']:
        return (f'swift-vora partial checkpoint: {ENV}={done["asked"]} but no decoder layer is checkpointed '
                '(gradient checkpointing is off); nothing changed')
    return (f'swift-vora partial checkpoint: {done["checkpointed"]} of {done["layers"]} decoder layers checkpointed '
            f'(the first {done["checkpointed"]}); {done["not_checkpointed"]} keep their activations')


class PartialCheckpoint(TrainerCallback):
    """At train begin, before the layers are compiled or given a selective policy; after the first step, how many
    layers were recomputed (`partial_checkpoint.json` in the output directory)."""

    done: Optional[Dict[str, Any]] = None
    counter: Optional[ForwardCounter] = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        model = model if model is not None else getattr(self.trainer, 'model', None)
        n = layers_to_checkpoint()
        if model is None or n is None:
            return
        from . import compile_layers
        # hooks inside compiled layers would be traced and, removed after step 1, force a recompile
        compiled = compile_layers.enabled() and not getattr(args, 'deepspeed', None)
        self.done, self.counter = apply(model, n, count=not compiled)
        (logger.info if self.done['checkpointed_before'] else logger.warning)(describe(self.done))
        if compiled:
            self.done['recomputed_layers'] = 'not counted: the decoder layers are compiled'
            self._write(args, state)

    def on_step_end(self, args, state, control, **kwargs):
        if self.counter is None:
            return
        self.done.update(self.counter.close())
        self.counter = None
        logger.info(describe_recomputes(self.done))
        self._write(args, state)

    def _write(self, args, state) -> None:
        if state.is_world_process_zero and getattr(args, 'output_dir', None):
            os.makedirs(args.output_dir, exist_ok=True)
            with open(os.path.join(args.output_dir, REPORT), 'w') as f:
                json.dump(self.done, f, indent=2)
