"""From predicted windows to the clips an editor keeps, and the OpenTimelineIO timeline of them.

The rules, in this order, on each video's windows (seconds):

1. `pad`: each window grows by this much on both sides (clamped to the video), so a cut does not start on the
   first frame of the action (default 0.5 s);
2. `merge_gap`: windows whose gap is at most this long become one clip (a jump cut of a few frames reads as a
   glitch; default 1.0 s); padding that makes windows overlap joins them too;
3. `min_clip`: a clip shorter than this is dropped, and counted (default 1.0 s; 0 keeps every clip);
4. every clip is cut on the nearest frame of the video's own rate (a time halfway between two frames goes to the
   later one): in = round(start x rate), out = round(end x rate), frames [in, out).

The timeline: one video track `V1` with the kept clips back to back in the order of the prediction lines (and of
time within a video), and an audio track `A1` with the same clips where any video has sound (a gap of the same
length for a video without). Each clip names its file (`ExternalReference`, a file URL, its available range
starting at the file's timecode), carries its reel name for EDLs (`cmx_3600.reel`, unique per file) and its origin
under `swift_vora` (id, the window in seconds before snapping, the prediction line).
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from .media import MediaInfo

Range = Tuple[float, float]


@dataclass
class CutRules:
    pad: float = 0.5
    merge_gap: float = 1.0
    min_clip: float = 1.0


@dataclass
class VideoCut:
    """One video's kept clips: frame ranges [in, out) at `rate` (the rate its timecode is written at)."""
    id: str
    line: int
    media: MediaInfo
    seconds: List[Range]  # after the rules, before snapping to frames
    frames: List[Tuple[int, int]]
    joined: int = 0  # windows joined into another clip (overlapping after padding, or a gap <= merge_gap)
    dropped_short: int = 0  # clips shorter than min_clip
    notes: List[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return timecode_rate(self.media.rate)

    @property
    def kept_seconds(self) -> float:
        return sum(b - a for a, b in self.frames) / self.rate


def kept_ranges(windows: Sequence[Sequence[float]], duration: float, rules: CutRules) -> Tuple[List[Range], int, int]:
    """(clips in seconds, windows joined, clips dropped as too short) by rules 1-3 of the module docstring."""
    padded = sorted((max(0.0, float(s) - rules.pad), min(float(duration), float(e) + rules.pad)) for s, e in windows)
    clips: List[Range] = []
    joined = 0
    for start, end in padded:
        if clips and start - clips[-1][1] <= rules.merge_gap:
            clips[-1] = (clips[-1][0], max(clips[-1][1], end))
            joined += 1
        else:
            clips.append((start, end))
    kept = [(s, e) for s, e in clips if e - s >= rules.min_clip and e > s]
    return kept, joined, len(clips) - len(kept)


def to_frames(ranges: Sequence[Range], rate: float, frames: int) -> List[Tuple[int, int]]:
    """Each range cut on the nearest frames (rule 4), within the file's frames; ranges that snapping made touch
    are one clip, and a range shorter than half a frame keeps none."""
    out: List[Tuple[int, int]] = []
    for start, end in ranges:
        first = min(frames, max(0, _nearest(start * rate)))
        last = min(frames, max(0, _nearest(end * rate)))
        if last <= first:
            continue
        if out and first <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], last))
        else:
            out.append((first, last))
    return out


def _nearest(value: float) -> int:
    return int(math.floor(value + 0.5 + 1e-9))  # halves go up; 1e-9 absorbs float noise such as 2.4999999999


def timecode_rate(rate) -> float:
    """The rate a video's frames are counted at in the timelines: its own; an NTSC rate a file states in decimals
    (29.97, 2997/100) is read as the exact NTSC fraction that SMPTE timecode uses (30000/1001: 0.1 frame apart
    after an hour)."""
    import opentimelineio as otio
    value = float(rate)
    RT = otio.opentime.RationalTime
    if RT.is_valid_timecode_rate(value):
        return value
    nearest = RT.nearest_valid_timecode_rate(value)
    return nearest if nearest and abs(nearest - value) <= 1e-4 * value else value


def cut_video(video_id: str, line: int, windows: Sequence[Sequence[float]], duration: float, media: MediaInfo,
              rules: CutRules) -> VideoCut:
    seconds, joined, dropped = kept_ranges(windows, min(float(duration), media.duration), rules)
    cut = VideoCut(id=video_id, line=line, media=media, seconds=seconds, frames=[], joined=joined,
                   dropped_short=dropped)
    cut.frames = to_frames(seconds, cut.rate, media.frames)
    if media.average_rate is not None:
        cut.notes.append(f'a variable frame rate ({float(media.average_rate):.2f} fps on average): cut at its '
                         f'nominal {float(media.rate):g} fps, as editing programs conform it')
    return cut


def reel_names(paths: Sequence[str], length: int = 8) -> Dict[str, str]:
    """A CMX 3600 reel name per file: its name's letters and digits, at most `length` characters (the format's
    limit), made unique across files by a number at the end (`match07`, `match071`). A number never makes the
    name another file of the timeline has by itself (`A001C002_0102` does not become `A001C001` while
    `A001C001_0101` is there): an editor relinks an EDL by reel name and timecode."""
    def own(path: str) -> str:
        return re.sub(r'[^A-Za-z0-9]', '', os.path.splitext(os.path.basename(path))[0])[:length] or 'AX'

    files = list(dict.fromkeys(paths))
    natural = {own(path) for path in files}
    reels: Dict[str, str] = {}
    used = set()
    for path in files:
        base = reel = own(path)
        n = 1
        while reel in used or (reel != base and reel in natural):
            suffix = str(n)
            reel, n = base[:length - len(suffix)] + suffix, n + 1
        used.add(reel)
        reels[path] = reel
    return reels


def start_time(media: MediaInfo, rate: float):
    """(the file's first frame as an OpenTimelineIO time at `rate`, a note when its timecode cannot be used)."""
    import opentimelineio as otio
    zero = otio.opentime.RationalTime(0, rate)
    if not media.start_timecode:
        return zero, None
    try:
        return otio.opentime.from_timecode(media.start_timecode, rate), None
    except ValueError as exc:  # not a timecode, or a rate SMPTE timecode does not have
        return zero, (f'its timecode {media.start_timecode!r} cannot be read at {rate:g} fps ({exc}); source times '
                      'count from its first frame')


def build_timeline(name: str, cuts: Sequence[VideoCut], predictions: Optional[str] = None):
    """The OpenTimelineIO timeline of `cuts` (module docstring)."""
    import opentimelineio as otio
    from opentimelineio import opentime, schema
    rate = cuts[0].rate if cuts else 24.0
    timeline = schema.Timeline(name=name, global_start_time=opentime.RationalTime(0, rate))
    timeline.metadata['swift_vora'] = {'predictions': predictions} if predictions else {}
    video = schema.Track(name='V1', kind=schema.TrackKind.Video)
    timeline.tracks.append(video)
    audio = None
    if any(cut.media.has_audio for cut in cuts):
        audio = schema.Track(name='A1', kind=schema.TrackKind.Audio)
        timeline.tracks.append(audio)
    reels = reel_names([cut.media.path for cut in cuts])
    for cut in cuts:
        first, note = start_time(cut.media, cut.rate)
        if note and note not in cut.notes:
            cut.notes.append(note)
        available = opentime.TimeRange(first, opentime.RationalTime(cut.media.frames, cut.rate))
        url = otio.url_utils.url_from_filepath(os.path.abspath(cut.media.path))
        for (first_frame, last_frame), seconds in zip(cut.frames, _seconds_of(cut)):
            source = opentime.TimeRange(first + opentime.RationalTime(first_frame, cut.rate),
                                        opentime.RationalTime(last_frame - first_frame, cut.rate))
            for track in [t for t in (video, audio) if t is not None]:  # an empty track is falsy
                if track is audio and not cut.media.has_audio:
                    track.append(schema.Gap(source_range=opentime.TimeRange(opentime.RationalTime(0, cut.rate),
                                                                            source.duration)))
                    continue
                track.append(schema.Clip(
                    name=os.path.basename(cut.media.path),
                    media_reference=schema.ExternalReference(target_url=url, available_range=available),
                    source_range=source,
                    metadata={'cmx_3600': {'reel': reels[cut.media.path]},
                              'swift_vora': {'id': cut.id, 'seconds': [round(seconds[0], 3), round(seconds[1], 3)],
                                             'line': cut.line}}))
    return timeline


def _seconds_of(cut: VideoCut) -> List[Range]:
    """The window (seconds, before snapping) each frame range came from: the ranges that overlap it, joined."""
    out = []
    for first, last in cut.frames:
        inside = [(s, e) for s, e in cut.seconds if _nearest(s * cut.rate) < last and _nearest(e * cut.rate) > first]
        out.append((min(s for s, _ in inside), max(e for _, e in inside)) if inside else (first / cut.rate,
                                                                                         last / cut.rate))
    return out
