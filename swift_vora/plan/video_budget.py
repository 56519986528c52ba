"""How many tokens one video sample costs, computed the way Qwen3-VL / Qwen3.5 preprocessing does.

Frame count (qwen_vl_utils 0.0.14 `smart_nframes`, the fps path):
    nframes = clip_seconds * fps, clamped to [ceil2(min_frames), floor2(max_frames)], capped by the source
    frame count (clip_seconds * source_fps) when known, then floored to a multiple of FRAME_FACTOR = 2.
Tokens: the vision tower merges `temporal_patch_size` (= 2) frames and `spatial_merge_size`^2 (= 4) patches into
one LLM token, so a video costs (nframes / 2) groups x tokens per frame pair. `VIDEO_MAX_TOKEN_NUM` caps the
tokens **per frame pair** (qwen_vl_utils: VIDEO_FRAME_MAX_PIXELS = VIDEO_MAX_TOKEN_NUM * (patch*merge)^2), and
`frame_pair_tokens()` reproduces `smart_resize` to get that number from a resolution.
Qwen3-VL writes a text timestamp `<t seconds>` before every group; those tokens (and the vision start/end
markers) are counted with `timestamp_tokens_per_group` (an assumption, see constants.TIMESTAMP_TOKENS_PER_GROUP).

Pure Python; no torch.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Dict, Optional

from . import constants as C

FRAME_FACTOR = 2  # qwen_vl_utils.vision_process.FRAME_FACTOR
FPS_MIN_FRAMES = 4  # qwen_vl_utils default
FPS_MAX_FRAMES = 768  # qwen_vl_utils default
DEFAULT_FPS = 2.0  # qwen_vl_utils FPS
VIDEO_MIN_TOKEN_NUM = 128  # qwen_vl_utils default (per frame pair)
VIDEO_MAX_TOKEN_NUM = 768  # qwen_vl_utils default (per frame pair)
MAX_RATIO = 200


def _round_by(x: float, f: int) -> int:
    return round(x / f) * f


def _ceil_by(x: float, f: int) -> int:
    return math.ceil(x / f) * f


def _floor_by(x: float, f: int) -> int:
    return math.floor(x / f) * f


def smart_nframes(clip_seconds: float, fps: float = DEFAULT_FPS, max_frames: int = FPS_MAX_FRAMES,
                  min_frames: int = FPS_MIN_FRAMES, source_fps: Optional[float] = None) -> int:
    """Frames the `video_ora` template samples from a clip: swift_vora.budget's rule (the one the template
    applies), capped by the source's frame count when known."""
    from ..budget import VideoBudget
    if clip_seconds <= 0:
        raise ValueError('clip_seconds must be positive')
    n = VideoBudget(fps=fps, min_frames=min_frames, max_frames=max_frames).frames_for(clip_seconds)
    if source_fps:
        n = min(n, _floor_by(int(clip_seconds * source_fps), FRAME_FACTOR))
    if n < FRAME_FACTOR:
        raise ValueError(f'clip too short: {n} frames after rounding to a multiple of {FRAME_FACTOR}')
    return int(n)


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int):
    """qwen_vl_utils `smart_resize`: dimensions divisible by `factor`, pixel count in [min_pixels, max_pixels]."""
    if max(height, width) / min(height, width) > MAX_RATIO:
        raise ValueError(f'aspect ratio above {MAX_RATIO}')
    h = max(factor, _round_by(height, factor))
    w = max(factor, _round_by(width, factor))
    if h * w > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h = _floor_by(height / beta, factor)
        w = _floor_by(width / beta, factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = _ceil_by(height * beta, factor)
        w = _ceil_by(width * beta, factor)
    return h, w


def frame_pair_tokens(width: int, height: int, max_token_num: int = VIDEO_MAX_TOKEN_NUM,
                      min_token_num: int = VIDEO_MIN_TOKEN_NUM, patch_size: int = 16, merge_size: int = 2) -> int:
    """LLM tokens for one frame pair of a `width`x`height` video (VIDEO_MAX/MIN_TOKEN_NUM are per frame pair).

    e.g. 640x360 with VIDEO_MAX_TOKEN_NUM=196 -> resized 576x320 -> 180 tokens (the measured baseline)."""
    factor = patch_size * merge_size
    min_pixels = min_token_num * factor * factor
    max_pixels = max(max_token_num * factor * factor, int(min_pixels * 1.05))
    h, w = smart_resize(height, width, factor, min_pixels, max_pixels)
    return (h // factor) * (w // factor)


@dataclass
class VideoTokens:
    clip_seconds: float
    fps: float
    frames: int
    groups: int  # frame pairs (temporal patches)
    tokens_per_group: int
    vision_tokens: int  # LLM tokens from the video (after the 2x2 merge)
    patches: int  # vision-tower sequence length (before the merge): vision_tokens * merge^2
    timestamp_tokens: int  # text timestamps + vision start/end markers
    text_tokens: int  # prompt + answer
    supervised_tokens: int  # answer tokens (the only positions with labels)
    total_tokens: int
    source: str = 'predicted'

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


def video_tokens(clip_seconds: float, fps: float = DEFAULT_FPS, max_frames: int = FPS_MAX_FRAMES,
                 frame_tokens: Optional[int] = None, *, width: Optional[int] = None, height: Optional[int] = None,
                 max_token_num: int = VIDEO_MAX_TOKEN_NUM, min_token_num: int = VIDEO_MIN_TOKEN_NUM,
                 min_frames: int = FPS_MIN_FRAMES, source_fps: Optional[float] = None, patch_size: int = 16,
                 merge_size: int = 2, temporal_patch_size: int = 2,
                 timestamp_tokens_per_group: int = C.TIMESTAMP_TOKENS_PER_GROUP,
                 text_tokens: int = C.DEFAULT_PROMPT_TOKENS + C.DEFAULT_ANSWER_TOKENS,
                 supervised_tokens: int = C.DEFAULT_ANSWER_TOKENS) -> VideoTokens:
    """Tokens of one video sample. `frame_tokens` = LLM tokens per frame pair (e.g. VIDEO_MAX_TOKEN_NUM when the
    source is large enough to hit the cap); if omitted it is computed from width/height, else the cap is used."""
    frames = smart_nframes(clip_seconds, fps, max_frames, min_frames, source_fps)
    groups = frames // temporal_patch_size
    if frame_tokens is None:
        if width and height:
            frame_tokens = frame_pair_tokens(width, height, max_token_num, min_token_num, patch_size, merge_size)
        else:
            frame_tokens = max_token_num
    vision = groups * int(frame_tokens)
    ts = groups * timestamp_tokens_per_group
    total = vision + ts + text_tokens
    return VideoTokens(clip_seconds=clip_seconds, fps=fps, frames=frames, groups=groups,
                       tokens_per_group=int(frame_tokens), vision_tokens=vision, patches=vision * merge_size ** 2,
                       timestamp_tokens=ts, text_tokens=text_tokens, supervised_tokens=supervised_tokens,
                       total_tokens=total)


def text_only_tokens(seq_len: int, supervised_tokens: int = C.DEFAULT_ANSWER_TOKENS) -> VideoTokens:
    """A sample given by its total length only (no vision tokens)."""
    return VideoTokens(clip_seconds=0.0, fps=0.0, frames=0, groups=0, tokens_per_group=0, vision_tokens=0, patches=0,
                       timestamp_tokens=0, text_tokens=seq_len, supervised_tokens=min(supervised_tokens, seq_len),
                       total_tokens=seq_len)


def budget_sample(budget, clip_seconds: float):
    """(frames, tokens per frame pair) that the `video_ora` template gives a clip of `clip_seconds` under `budget`
    (swift_vora.budget.VideoBudget): the frame rule, and the per-pair cap that max_video_tokens implies."""
    frames = budget.frames_for(clip_seconds)
    pair_tokens = budget.pair_tokens
    if budget.max_video_tokens is not None:
        pair_tokens = min(pair_tokens, budget.max_video_tokens // max(1, frames // FRAME_FACTOR))
    return frames, max(int(pair_tokens), 1)
