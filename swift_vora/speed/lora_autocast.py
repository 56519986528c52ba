"""LoRA inputs stay in the autocast dtype: PEFT's fp32 copy of every LoRA input is skipped under bf16 autocast.

PEFT keeps LoRA adapters in fp32 next to a bf16 base model (`autocast_adapter_dtype=True`) and, in every
`lora.Linear.forward`, casts the layer input to the adapter dtype first (`_cast_input_dtype`), so the dropout
runs in fp32 and autocast then casts the dropout output back to bf16 for the matmul. On a 2B Qwen3-VL with LoRA
on all linear layers and a video sample, those casts and the fp32 dropout were a large share of the GPU kernel
time of a training step (docs/runs/benchmarks-log.md, torch profile). Under autocast the matmul sees
bf16 either way, and a bf16 dropout computes the same scaled values as fp32 dropout followed by a bf16 cast, so
skipping the cast keeps the arithmetic of the LoRA matmuls (the adapters and their optimizer states stay fp32).

This uses PEFT's own switch (`layer.cast_input_dtype_enabled`, what `peft.helpers.disable_input_dtype_casting`
sets). It is applied only to LoRA layers whose adapter dtype differs from the base weight dtype, and only while
autocast is really on: a forward pre-hook (on the module that holds the repeated layers) checks
`torch.is_autocast_enabled` at the first forward and puts PEFT's cast back if it is not (e.g. `--bf16 false`).
`SWIFT_VORA_LORA_AUTOCAST_INPUTS=0` keeps PEFT's behaviour.
"""
from __future__ import annotations

import logging
from typing import List

from swift.callbacks import TrainerCallback

from .. import patches, switches

ENV = 'SWIFT_VORA_LORA_AUTOCAST_INPUTS'
PATCH = 'lora_input_cast'  # swift_vora/patches.py: PEFT's own flag, read by Linear._cast_input_dtype
logger = logging.getLogger('swift')


def enabled(environ=None) -> bool:
    return switches.read(ENV, environ)


def upcasting_lora_layers(model) -> List:
    """PEFT LoRA layers whose adapters are in another dtype than the base weight (the layers PEFT casts for)."""
    from peft.tuners.lora import LoraLayer
    layers = []
    for module in model.modules():
        if not isinstance(module, LoraLayer) or not hasattr(module, 'lora_A'):
            continue
        base = getattr(module.get_base_layer(), 'weight', None)
        adapters = [a.weight for a in module.lora_A.values() if hasattr(a, 'weight')]
        if base is not None and adapters and any(w.dtype != base.dtype for w in adapters):
            layers.append(module)
    return layers


def hook_site(model, first_layer):
    """Where the one-shot autocast check hooks in: the module holding the repeated blocks (e.g. the language model
    around `layers.0.self_attn.q_proj`), so that the check runs inside the forward's autocast but outside a layer
    that swift_vora/speed/compile_layers.py may compile (a hook that removes itself breaks a compiled graph); the first
    LoRA layer itself when it is not inside a ModuleList."""
    import torch
    name = next(n for n, m in model.named_modules() if m is first_layer)
    parts = name.split('.') if name else []
    for i in range(1, len(parts)):
        if isinstance(model.get_submodule('.'.join(parts[:i])), torch.nn.ModuleList):
            return model.get_submodule('.'.join(parts[:i - 1]))
    return first_layer


def keep_lora_inputs_in_autocast_dtype(model) -> int:
    """Switch PEFT's input cast off on the upcasting LoRA layers while autocast is on; returns how many layers."""
    import torch
    layers = upcasting_lora_layers(model)
    if not layers or not patches.applicable(PATCH):
        return 0
    for layer in layers:
        layer.cast_input_dtype_enabled = False
    patches.applied(PATCH)

    site = hook_site(model, layers[0])
    device_type = next(site.parameters()).device.type

    def check_autocast(module, args):
        handle.remove()
        if not torch.is_autocast_enabled(device_type):
            for layer in layers:
                layer.cast_input_dtype_enabled = True
            # e.g. DeepSpeed's bf16 engine, which runs without autocast: nothing to skip there
            logger.info('swift-vora lora_autocast: autocast is off at the first forward (DeepSpeed, or --bf16 '
                        f'false); PEFT casts the LoRA inputs to the adapter dtype again on {len(layers)} layers')

    handle = site.register_forward_pre_hook(check_autocast)
    return len(layers)


class LoraAutocastInputs(TrainerCallback):
    """Applies `keep_lora_inputs_in_autocast_dtype` to the model when training begins."""

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        model = model if model is not None else getattr(self.trainer, 'model', None)
        if model is None or not enabled():
            return
        n = keep_lora_inputs_in_autocast_dtype(model)
        if n:
            logger.info(f'swift-vora lora_autocast: {n} LoRA layers take their input in the autocast dtype '
                        f'(no fp32 copy, no fp32 dropout; adapters stay fp32; {ENV}=0 to turn off)')
