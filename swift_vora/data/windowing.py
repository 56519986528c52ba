"""Cut a validated annotation into fixed-length clips and restate its events in each clip's time.

Why windows: a video model sees a bounded number of frames, so a long video is trained as several
clips. The model only ever sees clip time (0 = the clip's first frame), so each event is clipped to
the window, rebased to its start, stripped of slivers too short to mean anything, and rounded to the
answer precision. All interval arithmetic is `swift_vora.intervals`; this module only decides where
the windows go.

Placement: windows start at 0, stride, 2*stride, ... and end at start + window, while they fit in the
video. The tail that is left is covered by one more window ending exactly at the duration: a partial
window `[next start, duration)` when it is at least `min_window` long, otherwise a full-length window
shifted back to `[duration - window, duration)` (it re-covers part of the previous window instead of
training on a one-second clip). A tail shorter than a second (MIN_CLIP_SECONDS) extends the last window
to the duration instead: neither a clip of a few frames nor a near-copy of the last clip. No window ever
ends past the duration; a video no longer than one window (or than one window and less than a second) is
one clip of the whole video.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Tuple

from .. import intervals, switches
from .annotations import Annotation

# Float slack for "does this window fit": durations are measured, window starts are k * stride.
_EPS = 1e-6
# Shortest clip and stride: below a second a clip holds one or two frames, and a stride near zero cuts a
# video into millions of clips (the window loop then runs for hours while its list grows).
MIN_CLIP_SECONDS = 1.0
MIN_STRIDE_SECONDS = 0.1


@dataclass
class WindowConfig:
    """How videos are cut into clips. All values in seconds."""
    # Clip length; None or 0 trains each video whole. Longer clips cost more video tokens per sample.
    # (The defaults of window, stride and min_event are their switches' in swift_vora/switches.py.)
    window: Optional[float] = switches.WINDOW_DEFAULTS['window']
    # Distance between clip starts; None = `window` (no overlap). Must not exceed `window` (gaps would
    # silently drop every event inside them).
    stride: Optional[float] = switches.WINDOW_DEFAULTS['stride']
    # Event pieces shorter than this after clipping are dropped (and counted): a 0.2 s sliver of an
    # event that mostly lies in the neighbouring clip teaches the model noise. 0 keeps everything.
    min_event: float = switches.WINDOW_DEFAULTS['min_event']
    # A trailing partial clip shorter than this is replaced by a full-length clip ending at the duration.
    min_window: float = 2.0

    def __post_init__(self):
        # NaN passes every `<` check and a NaN or tiny stride never ends the window loop: finite first.
        for name in ('window', 'stride', 'min_event', 'min_window'):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not math.isfinite(value)):
                raise ValueError(f'{name} must be a finite number of seconds, got {value!r}')
        if self.window is not None and self.window < 0:
            raise ValueError(f'window must be >= 0 seconds (0 = whole video), got {self.window}')
        if self.window and self.window < MIN_CLIP_SECONDS:
            raise ValueError(f'window must be at least {MIN_CLIP_SECONDS:g} s (or 0 = whole video), got {self.window}')
        if self.stride is not None:
            if self.stride <= 0:
                raise ValueError(f'stride must be > 0 seconds, got {self.stride}')
            if self.stride < MIN_STRIDE_SECONDS:
                raise ValueError(f'stride must be at least {MIN_STRIDE_SECONDS:g} s, got {self.stride}')
            if self.window and self.stride > self.window:
                raise ValueError(f'stride {self.stride} s is longer than window {self.window} s: '
                                 'the gaps between windows would drop their events')
        if self.min_event < 0:
            raise ValueError(f'min_event must be >= 0 seconds, got {self.min_event}')
        if self.min_window < 0:
            raise ValueError(f'min_window must be >= 0 seconds, got {self.min_window}')

    @property
    def effective_stride(self) -> Optional[float]:
        return self.stride if self.stride else self.window


def window_config_from_env(environ=None) -> WindowConfig:
    """The windows the video_ora dataset cuts (SWIFT_VORA_WINDOW, _STRIDE, _MIN_EVENT of `environ`, default this
    process's environment); the switches' defaults are WindowConfig's."""
    return WindowConfig(**{name: switches.read(f'SWIFT_VORA_{name.upper()}', environ)
                           for name in ('window', 'stride', 'min_event')})


@dataclass
class Sample:
    """One training clip: `[start, end)` of `video` in source seconds, events in clip seconds."""
    id: str
    source_id: str
    video: str
    start: float
    end: float
    query: Optional[str]
    events: List[Tuple[float, float]]
    dropped_slivers: int = 0
    joined_by_rounding: int = 0  # events the answer's 0.1 s rounding made touch, so one answer pair

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def answer(self) -> str:
        """The exact assistant text for this clip, e.g. `[[1.5, 4.0]]` or `[]`."""
        return intervals.format_answer(self.events)


def window_bounds(duration: float, config: Optional[WindowConfig] = None) -> List[Tuple[float, float]]:
    """`[start, end)` of every clip of a video of `duration` seconds (see the module docstring)."""
    config = config or WindowConfig()
    window = config.window
    if not window or duration < window + MIN_CLIP_SECONDS:
        return [(0.0, float(duration))]
    stride = config.effective_stride
    bounds = []
    k = 0
    while True:
        start = float(round(k * stride, 6))
        if start + window > duration + _EPS:
            break
        bounds.append((start, min(start + window, float(duration))))
        k += 1
    if bounds[-1][1] < duration - _EPS:  # an uncovered tail remains
        tail_start = float(round(k * stride, 6))
        if duration - bounds[-1][1] < MIN_CLIP_SECONDS:
            # less than a second left: the last clip runs to the end, rather than a clip of a few frames or a
            # copy of the last one shifted by a few frames (the same clip trained twice, under the same id)
            bounds[-1] = (bounds[-1][0], float(duration))
        elif duration - tail_start >= config.min_window:
            bounds.append((tail_start, float(duration)))
        else:
            bounds.append((float(round(duration - window, 6)), float(duration)))
    return bounds


def make_windows(annotation: Annotation, config: Optional[WindowConfig] = None) -> List[Sample]:
    """Every training clip of one annotation, with its events clipped, rebased, filtered and rounded."""
    config = config or WindowConfig()
    samples = []
    for start, end in window_bounds(annotation.duration, config):
        pieces = intervals.window_events(annotation.windows, start, end)
        kept = intervals.window_events(annotation.windows, start, end, min_length=config.min_event)
        samples.append(Sample(
            id=f'{annotation.id}@{start:.1f}-{end:.1f}',
            source_id=annotation.id,
            video=annotation.video,
            start=start,
            end=end,
            query=annotation.query,
            events=intervals.round_answer(kept),
            # shorter than min_event, or empty at the answer's precision (both counted, never silently lost)
            dropped_slivers=len(pieces) - len(kept) + intervals.rounded_away(kept),
            joined_by_rounding=intervals.rounded_together(kept),
        ))
    return samples
