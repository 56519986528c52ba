"""The speed levers: changes that make a training step faster without changing what is trained.

Each lever is one module here with one switch; `LEVERS` is the one table of them (name, switch, default, where it
is applied). Where they take effect:
- trainer callbacks, registered as `vora_<name>` and appended by the plugin's wrap of ms-swift's callback list
  (swift_vora/swift_registry.py, next to the guards);
- a patch installed when the plugin is imported (swift_vora/swift_registry.py);
- per encoded sample, in the `video_ora` template's DataLoader workers, through `speed/encode.py`.
Each module's docstring says what it changes and why the result is the same; docs/benchmarks.md says what each
one measured. Importing this package imports neither torch nor ms-swift (the modules do).
"""
from __future__ import annotations

import importlib
from typing import Callable, NamedTuple, Optional


class Lever(NamedTuple):
    name: str  # the module swift_vora/speed/<name>.py
    switch: str  # the environment variable that turns it on, off or sets it
    default: str  # what an unset switch means
    applied: str  # where it takes effect
    callback: Optional[str] = None  # the TrainerCallback class the plugin appends as `vora_<name>` when it is on

    @property
    def module(self):
        return importlib.import_module(f'{__name__}.{self.name}')

    def enabled(self, environ=None) -> bool:
        """Whether the switch turns the lever on (each module's `enabled`; a bad value raises naming the variable)."""
        return self.module.enabled(environ)


# Callback levers are appended in this order, after the guards.
LEVERS = (
    Lever('lora_autocast', 'SWIFT_VORA_LORA_AUTOCAST_INPUTS', 'on (0 = PEFT\'s fp32 copy of each LoRA input)',
          'callback at train begin: PEFT\'s input cast switched off on LoRA layers under autocast',
          'LoraAutocastInputs'),
    Lever('host_overhead', 'SWIFT_VORA_HOST_OVERHEAD', 'on (0 = leave all four fixes out)',
          'callback at train begin: FLOPs count, DeepStack merge, train(), token accuracy', 'HostOverhead'),
    Lever('compile_layers', 'SWIFT_VORA_COMPILE', 'off (layers = compile; recipe train.compile)',
          'callback at train begin: decoder layers and vision blocks torch.compile\'d in place (not under DeepSpeed)',
          'CompileDecoderLayers'),
    Lever('vit_attention', 'SWIFT_VORA_VIT_ATTENTION', 'batched (transformers = their forward)',
          'patch at plugin import: the Qwen3-VL / Qwen3.5 vision attention forward'),
    Lever('shape_bucket', 'SWIFT_VORA_PAD_MULTIPLE', '64 with SWIFT_VORA_COMPILE=layers, else 0 (off)',
          'template, per training encode: pad tokens appended to a multiple of N'),
    Lever('pixel_dtype', 'SWIFT_VORA_PIXEL_DTYPE', 'model (float32 = the processor\'s float32)',
          'template, per encode: pixels cast to the model\'s bf16/fp16; callback at train begin checks the tower',
          'PixelDtypeCheck'),
    Lever('video_decode', 'SWIFT_VORA_DECODE_THREADS', '1 (0 = decord\'s default)',
          'template, before decoding: decord.VideoReader limited to N threads per reader'),
)
BY_NAME = {lever.name: lever for lever in LEVERS}


def callback_levers():
    """The levers that come into training as callbacks, in the order they are appended."""
    return [lever for lever in LEVERS if lever.callback]


def callback_class(lever: Lever) -> Callable:
    return getattr(lever.module, lever.callback)
