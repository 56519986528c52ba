"""What the speed levers do to each sample the `video_ora` template decodes and encodes (in the DataLoader workers).

The template calls these four functions and nothing else of the levers, so what a lever changes in an encode is
written here once: decord's thread count before a video is decoded (video_decode.py), the dtype pixels are handed
over in (pixel_dtype.py) and the pad tokens appended to a training encode (shape_bucket.py).
"""
from __future__ import annotations

from typing import Any, Dict, Optional

from . import pixel_dtype, shape_bucket
from .video_decode import limit_decord_threads


def before_decode(reader: str) -> None:
    """One ffmpeg thread per reader in each DataLoader worker (video_decode.py), when `reader` (the name
    swift_vora/video_reader.py chose) is decord; the other readers need nothing (decord may not even import)."""
    if reader == 'decord':
        limit_decord_threads()


def pixel_target(torch_dtype):
    """The dtype encodes hand pixels over in: the model's bf16/fp16, or None to keep float32 (pixel_dtype.py)."""
    return pixel_dtype.target_dtype(torch_dtype)


def tail_padding(length: int, max_length: Optional[int], training: bool) -> int:
    """Pad tokens a training encode of `length` tokens gets at its end (shape_bucket.py); 0 outside training."""
    return shape_bucket.padding_for(length, shape_bucket.pad_multiple(), max_length) if training else 0


def finish(encoded: Dict[str, Any], padding: int, pad_token_id: int, pixels_to) -> None:
    """Append the tail padding and cast the pixels, in place, after the encode has been counted and reported."""
    shape_bucket.pad_tail(encoded, padding, pad_token_id)
    pixel_dtype.cast_pixels(encoded, pixels_to)
