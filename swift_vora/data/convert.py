"""`swift-vora data convert-qvhighlights`: a QVHighlights annotation file rewritten in our format, every input line
accounted for.

Reading the lines is `annotations.load_annotations`, which recognises QVHighlights lines itself (qvhighlights.py);
this module only writes what it read.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from .annotations import load_annotations, write_jsonl


@dataclass
class ConvertReport:
    """Every input line is either converted, rejected (with its reason) or a skipped blank line."""
    source: str
    out: str
    lines: int = 0
    converted: int = 0
    blank_lines: int = 0
    rejected: List[Any] = field(default_factory=list)  # annotations.Invalid
    merged_overlaps: int = 0
    written: bool = True  # False: nothing converted, so OUT was left as it was

    def to_json(self) -> Dict[str, Any]:
        return {'source': self.source, 'out': self.out, 'written': self.written, 'lines': self.lines,
                'rows': self.lines - self.blank_lines,
                'converted': self.converted, 'rejected': [bad.to_json() for bad in self.rejected],
                'blank_lines': self.blank_lines, 'merged_overlaps': self.merged_overlaps}

    def summary(self) -> str:
        lines = [f'{self.source}: {self.lines} lines: {self.converted} converted, {len(self.rejected)} rejected, '
                 f'{self.blank_lines} blank skipped']
        if self.merged_overlaps:
            lines.append(f'overlapping windows merged: {self.merged_overlaps}')
        lines += [f'  rejected: {bad.reason}' for bad in self.rejected]
        lines.append(f'wrote {self.converted} rows to {self.out}' if self.written
                     else f'nothing written: {self.out} left as it was')
        return '\n'.join(lines)


def convert_file(in_path: str, out_path: str, video_root: Optional[str] = None, stage=None) -> ConvertReport:
    """Convert a QVHighlights JSONL file to our annotation format.

    The videos are usually not downloaded yet when annotations are converted, so files are neither
    opened nor probed here (`swift-vora data check` does that); everything in the line itself is
    validated (ids, durations, windows within the duration). With `video_root`, `video` is written as
    an absolute path under it; without, as `<vid>.mp4`, to be resolved later by `--video-root` or
    against the converted file's directory. The output is written atomically; with `stage` (an
    `outputs.Staging`) it is renamed into place only when the caller commits.
    """
    report = load_annotations(in_path, video_root=video_root, probe=False, check_files=False)
    base_dir = os.path.dirname(os.path.abspath(os.fspath(in_path)))
    out = ConvertReport(source=os.fspath(in_path), out=os.fspath(out_path), lines=report.total + report.blank_lines,
                        converted=report.valid, blank_lines=report.blank_lines, rejected=list(report.invalid),
                        merged_overlaps=sum(ann.merged_overlaps for ann in report.rows))
    records = []
    for ann in report.rows:
        video = ann.video
        if video_root is None and os.path.commonpath([ann.video, base_dir]) == base_dir:
            video = os.path.relpath(ann.video, base_dir)
        records.append({'id': ann.id, 'video': video, 'duration': ann.duration, 'query': ann.query,
                        'windows': [[s, e] for s, e in ann.windows]})
    write_jsonl(records, out_path, inputs=[in_path], stage=stage)
    return out

