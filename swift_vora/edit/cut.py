"""Cut a prediction file: every line and video checked, the timelines built, every file written together.

Nothing is written until every line of the file has been read and every video opened: a line that is not a
prediction line, a video that is missing or is not one, a duration longer than the file, windows that are
reversed or run past the duration, or a format that cannot hold a video's frame rate stops the cut with the line
named, and no file is written. Then the timelines (and the render) are written to temporary files and renamed into
place together when all of them succeeded (outputs.staged()).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

from ..errors import InvalidInput, UsageError
from .timeline import CutRules, VideoCut

# A line's duration may exceed the decoded file by this much (container noise), as an annotation's may.
DURATION_SLACK_S = 1.0


@dataclass
class CutResult:
    predictions: str
    rules: CutRules
    cuts: List[VideoCut] = field(default_factory=list)  # every video, in the file's order
    files: List[str] = field(default_factory=list)
    render: Optional[object] = None  # render.RenderResult


def cut(predictions: str, formats: Sequence[str] = ('otio',), output_dir: Optional[str] = None,
        name: str = 'highlights', per_video: bool = False, render_to: Optional[str] = None,
        rules: Optional[CutRules] = None, before_commit: Optional[Callable[[CutResult], None]] = None) -> CutResult:
    """Cut `predictions` (prediction lines) into timelines of `formats` under `output_dir` (default: cut/ beside
    it) named `name` (or one per video), and render them to `render_to`. `before_commit(result)` runs when every
    file is written but none renamed into place yet (the CLI prints there: a stdout that fails leaves no file).
    Raises UsageError for paths, InvalidInput for lines that cannot be cut (naming each)."""
    from ..outputs import check_input_file, check_output_dir, check_output_file, staged
    from .formats import FORMATS, format_name, problem, write
    from .timeline import build_timeline
    rules = rules or CutRules()
    formats = list(dict.fromkeys(format_name(f) for f in formats))
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        raise UsageError(f'--to {unknown[0]}: not a format ({", ".join(sorted(FORMATS))})')
    check_input_file(predictions, what='PREDICTIONS')
    output_dir = output_dir if output_dir is not None else os.path.join(
        os.path.dirname(os.path.abspath(predictions)), 'cut')
    check_output_dir(output_dir, [predictions], what='--output_dir')
    if render_to is not None:
        from .render import container_format
        try:
            container_format(render_to)
        except ValueError as exc:
            raise UsageError(f'--render {exc}') from None
        check_output_file(render_to, [predictions], what='--render')
    if not name.strip() or '/' in name or os.sep in name or name in ('.', '..'):
        raise UsageError(f'--name {name!r}: a file name (no folder)')
    if any(ch < ' ' or ch == '\x7f' for ch in name):  # a newline would also end the EDL's TITLE line
        raise UsageError(f'--name {name!r}: a file name without control characters (newlines, tabs)')

    result = CutResult(predictions=predictions, rules=rules, cuts=read_cuts(predictions, rules))
    kept = [c for c in result.cuts if c.frames]
    if not kept:
        raise InvalidInput(f'nothing to cut: no window of {predictions} is kept (after --pad {rules.pad:g}, '
                           f'--merge-gap {rules.merge_gap:g}, --min-clip {rules.min_clip:g}); nothing written')
    groups = [(file_name(c.id), [c]) for c in kept] if per_video else [(name, kept)]
    clashes = sorted({n for n, _ in groups if sum(1 for m, _ in groups if m == n) > 1})
    if clashes:
        raise InvalidInput(f'--per-video: ids that make the same file name ({", ".join(clashes[:5])}); nothing '
                           'written')
    for fmt in formats:
        for _, group in groups:
            reason = problem(fmt, group)
            if reason:
                raise InvalidInput(f'--to {fmt}: {reason}; nothing written')

    with staged() as stage:
        for file_base, group in groups:
            timeline = build_timeline(group[0].id if per_video else file_base, group, os.path.abspath(predictions))
            for fmt in formats:
                target = os.path.join(output_dir, file_base + FORMATS[fmt].suffix)
                stage.write_text(target, write(timeline, fmt), [predictions], what=f'--to {fmt}')
                result.files.append(target)
        if render_to is not None:
            from .render import RenderError, render
            tmp = stage.temp_path(render_to, [predictions] + [c.media.path for c in result.cuts], what='--render')
            try:
                result.render = render(kept, render_to, write_to=tmp)
            except RenderError as exc:
                raise InvalidInput(f'--render: {exc}; nothing written') from None
        if before_commit is not None:
            before_commit(result)
    return result


def read_cuts(predictions: str, rules: CutRules) -> List[VideoCut]:
    """Every line's cut (the rules applied, on the frames of its video); InvalidInput naming every line that
    cannot be cut."""
    from ..predict.lines import describe_problems, read_lines, video_path
    from .media import MediaError, read_media
    from .timeline import cut_video
    rows, problems = read_lines(predictions)
    cuts: List[VideoCut] = []
    for line, row in rows:
        key = str(row['id'])
        path = video_path(row, predictions)
        try:
            media = read_media(path)
        except MediaError as exc:
            problems.append({'line': line, 'id': key, 'reason': f"field 'video': {path}: {exc.reason}"})
            continue
        if row['duration'] > media.duration + DURATION_SLACK_S:
            problems.append({'line': line, 'id': key, 'reason': (
                f"field 'duration': {row['duration']:g} s is longer than the video ({media.duration:.3f} s, "
                f'{media.frames} frames at {float(media.rate):g} fps): the line is not about this file')})
            continue
        cuts.append(cut_video(key, line, row['windows'], row['duration'], media, rules))
    if problems:
        problems.sort(key=lambda p: p['line'])
        raise InvalidInput(f'{len(problems)} line(s) of {predictions} cannot be cut; nothing written:\n'
                           + describe_problems(predictions, problems))
    if not rows:
        raise InvalidInput(f'{predictions}: no prediction lines; nothing written')
    return cuts


def file_name(video_id: str) -> str:
    """A file name for a video's timeline: its id with `/` as `__` and anything but letters, digits, `.`, `_`, `-`
    as `_`."""
    return re.sub(r'[^A-Za-z0-9._-]', '_', video_id.replace('/', '__')).lstrip('.') or 'video'


def summary(result: CutResult) -> Dict[str, object]:
    """What was cut and written, JSON-ready (`swift-vora cut --json`)."""
    rendered = result.render
    return {
        'videos': [{'id': c.id, 'line': c.line, 'video': c.media.path, 'fps': round(c.rate, 6),
                    'clips': len(c.frames), 'kept_seconds': round(c.kept_seconds, 3),
                    'kept_frames': sum(b - a for a, b in c.frames), 'joined': c.joined,
                    'dropped_short': c.dropped_short, 'notes': list(c.notes)} for c in result.cuts],
        'files': list(result.files),
        'render': None if rendered is None else {
            'file': rendered.path, 'frames': rendered.frames, 'seconds': round(rendered.seconds, 3),
            'fps': float(rendered.rate), 'width': rendered.width, 'height': rendered.height,
            'audio': rendered.sample_rate is not None},
        'rules': {'pad': result.rules.pad, 'merge_gap': result.rules.merge_gap, 'min_clip': result.rules.min_clip},
    }
