"""The speed levers: changes that make a training step faster without changing what is trained.

Each lever is one module here with one switch; `LEVERS` is the one table of them (name, switch, where it is
applied; `Lever.default` reads the switch's default from swift_vora/switches.py, the table of every switch).
Where they take effect:
- trainer callbacks, registered as `vora_<name>` and appended by the plugin's wrap of ms-swift's callback list
  (swift_vora/swift_registry.py, next to the guards);
- a patch installed when the plugin is imported (swift_vora/swift_registry.py);
- per encoded sample, in the `video_ora` template's DataLoader workers, through `speed/encode.py`.
Each module's docstring says what it changes and why the result is the same; docs/runs/benchmarks-log.md says what each
one measured. Importing this package imports neither torch nor ms-swift (the modules do).
"""
from __future__ import annotations

import importlib
from typing import Callable, List, NamedTuple, Optional


class Lever(NamedTuple):
    name: str  # the module swift_vora/speed/<name>.py
    switch: str  # the environment variable that turns it on, off or sets it (swift_vora/switches.py)
    applied: str  # where it takes effect
    callback: Optional[str] = None  # the TrainerCallback class the plugin appends as `vora_<name>` when it is on

    @property
    def module(self):
        return importlib.import_module(f'{__name__}.{self.name}')

    @property
    def default(self):
        """What an unset switch means, from the one table of switches (with its help text)."""
        from ..switches import switch
        entry = switch(self.switch)
        return f'{entry.default!r}: {entry.help}'

    def enabled(self, environ=None) -> bool:
        """Callback levers: whether the switch turns the lever on (a bad value raises naming the variable)."""
        return self.module.enabled(environ)


# Callback levers are appended in this order, after the guards.
LEVERS = (
    Lever('lora_autocast', 'SWIFT_VORA_LORA_AUTOCAST_INPUTS',
          'callback at train begin: PEFT\'s input cast switched off on LoRA layers under autocast',
          'LoraAutocastInputs'),
    # before host_overhead and compile_layers: the modules are swapped before anything looks at them (the layers are
    # compiled with their FP8 linears in them)
    Lever('fp8_frozen', 'SWIFT_VORA_FP8',
          'callback at train begin: the decoder\'s frozen base linears compute in FP8, weights held in FP8',
          'Fp8FrozenBase'),
    Lever('host_overhead', 'SWIFT_VORA_HOST_OVERHEAD',
          'callback at train begin: FLOPs count, DeepStack merge, train(), token accuracy', 'HostOverhead'),
    # before compile_layers and selective_checkpoint: both act on the layers that are still checkpointed
    Lever('partial_checkpoint', 'SWIFT_VORA_CHECKPOINT_LAYERS',
          'callback at train begin: gradient checkpointing kept on the first N decoder layers only',
          'PartialCheckpoint'),
    Lever('compile_layers', 'SWIFT_VORA_COMPILE',
          'callback at train begin: decoder layers and vision blocks compiled in place (not under DeepSpeed)',
          'CompileDecoderLayers'),
    # after compile_layers: it leaves the layers that were compiled as they are
    Lever('selective_checkpoint', 'SWIFT_VORA_SELECTIVE_CHECKPOINT',
          'callback at train begin: checkpointed decoder layers save matmul / attention outputs, recompute the rest',
          'SelectiveCheckpoint'),
    Lever('vit_attention', 'SWIFT_VORA_VIT_ATTENTION',
          'patch at plugin import: the Qwen3-VL / Qwen3.5 vision attention forward'),
    Lever('patch_embed', 'SWIFT_VORA_PATCH_EMBED',
          'patch at plugin import: the Qwen-VL vision patch embedding\'s Conv3d computed as one GEMM'),
    Lever('packed_attention', 'SWIFT_VORA_PACKED_ATTENTION',
          'registered at plugin import: the `vora_varlen` attention (--padding_free / --packing without flash-attn)'),
    Lever('shape_bucket', 'SWIFT_VORA_PAD_MULTIPLE',
          'template, per training encode: pad tokens appended to a multiple of N'),
    Lever('pixel_dtype', 'SWIFT_VORA_PIXEL_DTYPE',
          'template, per encode: pixels cast to the model\'s bf16/fp16; callback at train begin checks the tower',
          'PixelDtypeCheck'),
    Lever('video_decode', 'SWIFT_VORA_DECODE_THREADS',
          'template, before decoding: decord.VideoReader limited to N threads per reader'),
    Lever('moe_lora_scale', 'SWIFT_VORA_MOE_LORA_SCALE',
          'Unsloth runner, after the model is loaded: each expert LoRA\'s scaling on the rank-r intermediate in '
          'unsloth_zoo\'s grouped-GEMM MoE forward'),
)
BY_NAME = {lever.name: lever for lever in LEVERS}


def callback_levers():
    """The levers that come into training as callbacks, in the order they are appended."""
    return [lever for lever in LEVERS if lever.callback]


def callback_class(lever: Lever) -> Callable:
    return getattr(lever.module, lever.callback)


def replace_forwards(prefix: str, make_forward: Callable) -> List[str]:
    """Give every importable class of the inventoried `Class.forward` patches named `prefix*` (swift_vora/patches.py)
    the forward `make_forward(cls)`, where the installed upstream is one the inventory knows (else the patch's
    policy: skip with one warning); idempotent. Returns the names of the classes that have it. A transformers
    without one of the models is skipped."""
    from .. import patches
    names = []
    for name, module_name, class_name in patches.forward_patches(prefix):
        try:
            cls = getattr(importlib.import_module(module_name), class_name, None)
        except ImportError:
            continue
        if cls is None:
            continue
        if patches.patched_by(cls.forward) != name:
            if not patches.applicable(name):
                continue
            cls.forward = patches.mark(make_forward(cls), name, cls.forward)
        names.append(class_name)
    return names
