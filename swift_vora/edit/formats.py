"""The timeline in the formats editors open, each written by OpenTimelineIO's own adapter.

| `--to` | adapter (package) | file | opens in |
| --- | --- | --- | --- |
| `otio` | `otio_json` (opentimelineio) | `.otio` | OpenTimelineIO tools, DaVinci Resolve 18.5+, otioview |
| `fcp_xml` | `fcp_xml` (otio-fcp-adapter) | `.xml` | Final Cut Pro 7 XML (xmeml 4): Premiere Pro, DaVinci Resolve |
| `edl` | `cmx_3600` (otio-cmx3600-adapter) | `.edl` | CMX 3600 EDL: every NLE; one video track, cuts only |

What a format cannot hold is refused with the video that needs it, never written approximately: an EDL and Final
Cut Pro XML write SMPTE timecode, which exists at 23.976, 24, 25, 29.97, 30, 47.95, 48, 50, 59.94 and 60 fps, and
hold one frame rate for all videos of a timeline (`--per-video` writes one timeline per video); an EDL numbers its
events with three digits (at most 999 clips). At 29.97 and 59.94 the adapters write the same frames in different
timecode modes: the EDL in drop-frame (`01:00:03;18`, with its `FCM: DROP FRAME` line), the XML in non-drop-frame
(`<displayformat>NDF</displayformat>`, each timecode with its `<frame>` number). The `.otio` timeline holds any rate,
mixed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Sequence

from .timeline import VideoCut

MAX_EDL_EVENTS = 999  # CMX 3600's event number is three digits


@dataclass(frozen=True)
class Format:
    adapter: str
    suffix: str
    title: str


FORMATS: Dict[str, Format] = {
    'otio': Format('otio_json', '.otio', 'OpenTimelineIO'),
    'fcp_xml': Format('fcp_xml', '.xml', 'Final Cut Pro 7 XML'),
    'edl': Format('cmx_3600', '.edl', 'CMX 3600 EDL'),
}
# other spellings users write for the same formats (`--to fcpxml` reads as the FCP XML above: Final Cut Pro 7's
# xmeml, which Premiere Pro and DaVinci Resolve import; not Final Cut Pro X's own .fcpxml)
SPELLINGS: Dict[str, str] = {'fcpxml': 'fcp_xml', 'fcp7': 'fcp_xml', 'xml': 'fcp_xml', 'cmx_3600': 'edl',
                             'cmx3600': 'edl', 'otio_json': 'otio'}


def format_name(text: str) -> str:
    """The format `text` names (a name of FORMATS, or one of its SPELLINGS, any case); unknown text as it is."""
    key = text.strip().lower()
    return SPELLINGS.get(key, key)


def problem(name: str, cuts: Sequence[VideoCut]) -> Optional[str]:
    """Why the timeline of `cuts` cannot be written as `name` (naming the video and its line), or None."""
    import opentimelineio as otio
    if name == 'otio' or not cuts:
        return None
    first = cuts[0]
    for cut in cuts[1:]:
        if abs(cut.rate - first.rate) > 1e-9:
            return (f'{FORMATS[name].title} holds one frame rate per timeline: {first.id} (line {first.line}) is '
                    f'{first.rate:g} fps, {cut.id} (line {cut.line}) {cut.rate:g} fps; write one timeline per video '
                    '(--per-video), or --to otio')
    clips = sum(len(cut.frames) for cut in cuts)
    if name == 'edl' and clips > MAX_EDL_EVENTS:
        return (f'a CMX 3600 EDL numbers its events 001-{MAX_EDL_EVENTS}; this timeline has {clips} clips: write one '
                'timeline per video (--per-video), raise --merge-gap or --min-clip, or --to otio / fcp_xml')
    for cut in cuts:
        if not otio.opentime.RationalTime.is_valid_timecode_rate(cut.rate):
            return (f'{FORMATS[name].title} counts frames in SMPTE timecode (23.976, 24, 25, 29.97, 30, 47.95, 48, '
                    f'50, 59.94 or 60 fps); {cut.id} (line {cut.line}, {cut.media.path}) is {cut.rate:g} fps: write '
                    '--to otio, which keeps its own rate')
    return None


def write(timeline, name: str) -> str:
    """The text of `timeline` in format `name`, written by its OpenTimelineIO adapter (on a copy: the EDL writer
    edits the timeline it is given)."""
    import opentimelineio as otio
    fmt = FORMATS[name]
    copy = timeline.deepcopy()
    if name == 'edl':
        rate = copy.global_start_time.rate
        return _with_frame_code_mode(otio.adapters.write_to_string(copy, fmt.adapter, rate=rate))
    return otio.adapters.write_to_string(copy, fmt.adapter)


def _with_frame_code_mode(edl: str) -> str:
    """The EDL with its `FCM:` line after the title, which the adapter leaves out: editors read the timecode mode
    from it (drop-frame where the timecodes have `;`, the adapter's choice at 29.97 and 59.94)."""
    lines = edl.split('\n')
    events = [line for line in lines[1:] if line[:3].isdigit()]
    mode = 'DROP FRAME' if any(';' in line for line in events) else 'NON-DROP FRAME'
    at = 1 if lines and lines[0].startswith('TITLE:') else 0
    return '\n'.join(lines[:at] + [f'FCM: {mode}'] + lines[at:])
