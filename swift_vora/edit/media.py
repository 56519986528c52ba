"""What an edit needs to know about a video file, read from the file itself with PyAV (FFmpeg's demuxers).

The frame rate is the video stream's own (`average_rate`, an exact fraction: 30000/1001 for NTSC 29.97), so the
cut points of every format land on the file's frames. A phone's variable-rate file that dropped a few frames
averages a rate no timecode has (29.85 for a 30 fps stream): where the stream's nominal rate (`base_rate`, FFmpeg's
r_frame_rate) is a timecode rate within VARIABLE_RATE_TOLERANCE of the average, the file is cut at the nominal
rate, its frames counted as the slots of its duration at that rate, as editing programs conform such footage.
The start timecode is the one the file carries (a QuickTime `tmcd` track, MXF's material package, a `timecode`
tag): cameras record it, and an editor relinks an EDL or an XML by it, so the source in/out points of the timelines
are written in it (OpenTimelineIO's convention: a media reference's available range starts at the file's first
timecode).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from fractions import Fraction
from typing import Optional

# a nominal rate this close to the average is the stream's real rate with a few frames dropped (2 %: 18 of 900)
VARIABLE_RATE_TOLERANCE = 0.02


class MediaError(ValueError):
    """A video file an edit cannot use; `reason` says why (missing, no video stream, no frame rate)."""

    def __init__(self, path: str, reason: str):
        super().__init__(f'{path}: {reason}')
        self.path, self.reason = path, reason


@dataclass
class MediaInfo:
    path: str
    rate: Fraction  # frames per second, as the video stream states it
    frames: int  # frames in the video stream
    start_timecode: Optional[str]  # 'HH:MM:SS:FF' (';' before the frames for drop-frame), None when there is none
    has_audio: bool
    width: int
    height: int
    average_rate: Optional[Fraction] = None  # a variable-rate file's average, when `rate` is its nominal one

    @property
    def duration(self) -> float:
        return self.frames / float(self.rate)


def read_media(path: str) -> MediaInfo:
    """The frame rate, frame count, start timecode and audio of the video at `path`; raises MediaError."""
    import av
    if not os.path.isfile(path):
        raise MediaError(path, 'file not found' if not os.path.exists(path) else 'not a regular file')
    try:
        container = av.open(path)
    except (av.error.FFmpegError, OSError) as exc:
        raise MediaError(path, f'cannot be opened as a video ({exc})') from None
    with container:
        if not container.streams.video:
            raise MediaError(path, 'has no video stream')
        stream = container.streams.video[0]
        rate = stream.average_rate or stream.guessed_rate or stream.base_rate
        if not rate or rate <= 0:
            raise MediaError(path, 'states no frame rate')
        rate = Fraction(rate)
        seconds = (float(stream.duration * stream.time_base) if stream.duration
                   else (container.duration or 0) / 1_000_000)
        average = None
        nominal = Fraction(stream.base_rate) if stream.base_rate else None
        if nominal and nominal != rate and seconds > 0 and _is_timecode_rate(nominal) \
                and not _is_timecode_rate(rate) and abs(rate - nominal) <= VARIABLE_RATE_TOLERANCE * nominal:
            average, rate = rate, nominal
        frames = int(stream.frames or 0) if average is None else 0
        if frames <= 0:  # containers without a frame count (Matroska, WebM), a variable rate: duration x rate
            frames = int(math.floor(seconds * rate + 0.5))
        if frames <= 0:
            raise MediaError(path, 'has no frames')
        return MediaInfo(path=path, rate=rate, frames=frames, start_timecode=_timecode(container, stream),
                         has_audio=bool(container.streams.audio), width=int(stream.codec_context.width),
                         height=int(stream.codec_context.height), average_rate=average)


def _is_timecode_rate(rate: Fraction) -> bool:
    import opentimelineio as otio
    return otio.opentime.RationalTime.is_valid_timecode_rate(float(rate))


def _timecode(container, video_stream) -> Optional[str]:
    for metadata in [video_stream.metadata] + [s.metadata for s in container.streams] + [container.metadata]:
        value = metadata.get('timecode')
        if value:
            return value.strip()
    return None
