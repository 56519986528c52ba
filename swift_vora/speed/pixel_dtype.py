"""Pixels leave the DataLoader workers in the model's dtype (bf16/fp16), not the processor's float32.

Qwen3-VL's processor returns float32 patches: a 64-frame clip at the h200x1 budget is 23,040 patches x 1,536 values,
141 MB per sample that a DataLoader worker writes to shared memory, the pin-memory thread copies into pinned
memory and accelerate copies to the GPU (all four micro-batches of a step at once, so they also sit in GPU memory
together). The model's first act is to cast them to the vision tower's
dtype -- ms-swift's Qwen3-VL forward (`_forward_qwen3_vl_or_qwen3_omni`: `pixel_values_mixed.type(self.visual.dtype)`)
and transformers' `get_image_features` (`pixel_values.type(self.visual.dtype)`) alike -- so the same cast made in the
worker hands the tower bit-identical values at half the bytes (tests/test_pixel_dtype.py).

That holds only while the vision tower's dtype is the one cast to (the model's `torch_dtype`, which ms-swift loads
every module in). The `vora_pixel_dtype` callback checks it when training begins and stops with the remedy if a
tower runs in another dtype. `SWIFT_VORA_PIXEL_DTYPE=float32` keeps the processor's float32; a float32 model is never
cast.
"""
from __future__ import annotations

import logging

from swift.callbacks import TrainerCallback

from .. import switches

ENV = 'SWIFT_VORA_PIXEL_DTYPE'
KEYS = ('pixel_values', 'pixel_values_videos')
logger = logging.getLogger('swift')


def mode(environ=None) -> str:
    return switches.read(ENV, environ)


def enabled(environ=None) -> bool:
    """Whether pixels are cast to the model's dtype (and the `vora_pixel_dtype` check appended)."""
    return mode(environ) == 'model'


def target_dtype(torch_dtype, environ=None):
    """The dtype encodes cast their pixels to: the model's half-precision dtype, or None (keep float32)."""
    import torch
    if mode(environ) != 'model' or torch_dtype not in (torch.bfloat16, torch.float16):
        return None
    return torch_dtype


def cast_pixels(encoded, dtype) -> None:
    """Cast an encode's float pixel tensors to `dtype` in place (nothing if `dtype` is None)."""
    import torch
    if dtype is None:
        return
    for key in KEYS:
        value = encoded.get(key)
        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != dtype:
            encoded[key] = value.to(dtype)


def vision_tower_dtype(model):
    """The parameter dtype of the model's vision tower (the first `*VisionModel` / `*VisionTransformer`), or None."""
    for module in model.modules():
        if type(module).__name__.endswith(('VisionModel', 'VisionTransformer')):
            parameter = next(module.parameters(), None)
            return parameter.dtype if parameter is not None else None
    return None


class PixelDtypeCheck(TrainerCallback):
    """Stops before the first step if the template casts pixels to a dtype the vision tower does not run in."""

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        template = getattr(self.trainer, 'template', None)
        model = model if model is not None else self.trainer.model
        cast_to = getattr(template, 'vora_pixel_dtype', None)
        tower = vision_tower_dtype(model)
        if cast_to is None or tower is None:
            return
        if tower != cast_to:
            raise ValueError(f'swift-vora: the video_ora template hands pixels over in {cast_to} (the model\'s '
                             f'torch_dtype) but the vision tower runs in {tower}, which would see rounded pixels; '
                             f'set {ENV}=float32 to keep the processor\'s float32 pixels')
        logger.info(f'swift-vora pixel dtype: pixels leave the DataLoader workers in {cast_to}, the vision '
                    f'tower\'s dtype ({ENV}=float32 keeps float32)')
