"""The video token budget of one clip, and where it comes from.

A budget is applied per sample, to the real frames: the template computes the frame count and the
resized frame size from it and hands them to qwen_vl_utils explicitly, so nothing depends on
qwen_vl_utils' process-wide globals (which ms-swift fills from `VIDEO_MAX_TOKEN_NUM` etc. once per
process). Sources, later ones win: the defaults below, `SWIFT_VORA_*` environment variables (set by
`swift-vora train` from the recipe, or by a swift YAML `ENV:` block), then the per-sample
`chat_template_kwargs` that the `video_ora` dataset writes into every row.

Qwen3-VL counts tokens per *pair* of frames (temporal patch 2): a pair of H x W frames costs
(H / 32) * (W / 32) tokens with patch 16 and spatial merge 2.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Dict, Mapping, Optional

from . import switches

FRAME_FACTOR = 2  # frames per temporal patch
ENV_PREFIX = 'SWIFT_VORA_'


_DEFAULT = switches.BUDGET_DEFAULTS  # the defaults are the switch table's (SWIFT_VORA_FPS, ...)


@dataclass(frozen=True)
class VideoBudget:
    fps: float = _DEFAULT['fps']  # frames sampled per second of clip; higher = finer timing, more tokens
    min_frames: int = _DEFAULT['min_frames']  # never fewer frames than this (rounded up to a multiple of 2)
    max_frames: int = _DEFAULT['max_frames']  # frame cap per clip; the first knob to turn down when memory is short
    pair_tokens: int = _DEFAULT['pair_tokens']  # max tokens per frame pair (resolution); higher = sharper, more tokens
    min_pair_tokens: int = _DEFAULT['min_pair_tokens']  # lower bound on the resolution of a frame pair
    max_video_tokens: Optional[int] = _DEFAULT['max_video_tokens']  # cap on one clip's video tokens; frames cut to fit

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None) -> 'VideoBudget':
        return cls(**{f.name: switches.read(ENV_PREFIX + f.name.upper(), environ) for f in fields(cls)})

    def updated(self, overrides: Optional[Mapping[str, Any]]) -> 'VideoBudget':
        """A copy with the budget keys found in `overrides` (e.g. a row's chat_template_kwargs)."""
        if not overrides:
            return self
        known = {f.name for f in fields(self)}
        values = {k: _convert(k, v) for k, v in overrides.items() if k in known and v is not None}
        return replace(self, **values) if values else self

    def to_env(self) -> Dict[str, str]:
        return {ENV_PREFIX + k.upper(): str(v) for k, v in asdict(self).items() if v is not None}

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    def frames_for(self, clip_seconds: float) -> int:
        """Frames sampled from a clip of this length (multiple of 2, within [min_frames, max_frames])."""
        lo = _ceil2(self.min_frames)
        hi = max(lo, _floor2(self.max_frames))
        wanted = _floor2(clip_seconds * self.fps)
        frames = min(max(wanted, lo), hi)
        if self.max_video_tokens is not None:
            frames = min(frames, max(FRAME_FACTOR, _floor2(self.max_video_tokens // max(1, self.pair_tokens) * 2)))
        return frames


def _convert(name: str, raw: Any) -> Any:
    if name == 'fps':
        return float(raw)
    if name == 'max_video_tokens' and str(raw).lower() in ('', 'none', '0'):
        return None
    return int(raw)


def _ceil2(x: float) -> int:
    return max(FRAME_FACTOR, int(math.ceil(x / FRAME_FACTOR)) * FRAME_FACTOR)


def _floor2(x: float) -> int:
    return max(FRAME_FACTOR, int(math.floor(x / FRAME_FACTOR)) * FRAME_FACTOR)
