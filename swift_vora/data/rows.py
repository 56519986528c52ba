"""Training rows in the shape ms-swift reads, and the `data build` pipeline that writes them.

A row is one clip: the user turn is `prompt.build_prompt` (the same text inference uses), the
assistant turn is the clip's answer, `videos` names the source file and `chat_template_kwargs` carries
`video_start`/`video_end` so the video reader decodes only the clip. The `vora` key keeps the clip's
provenance (source id, bounds, events) for guards and evaluation; ms-swift ignores unknown keys.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Iterator, List, Optional

from .. import prompt
from .annotations import Annotation, Invalid, load_annotations, write_jsonl
from .windowing import Sample, WindowConfig, make_windows


def sample_to_row(sample: Sample) -> Dict[str, Any]:
    """The ms-swift row (messages, videos, chat_template_kwargs) for one clip, plus `vora` provenance."""
    return {
        'messages': [
            {'role': 'user', 'content': prompt.build_prompt(sample.query, sample.duration)},
            {'role': 'assistant', 'content': sample.answer},
        ],
        'videos': [sample.video],
        # sample_id/source_id travel with the row: the template logs them, eval maps answers back by them.
        'chat_template_kwargs': {'video_start': sample.start, 'video_end': sample.end, 'sample_id': sample.id,
                                 'source_id': sample.source_id},
        'vora': {'id': sample.id, 'source_id': sample.source_id, 'start': sample.start, 'end': sample.end,
                 'events': [[s, e] for s, e in sample.events]},
    }


def annotation_rows(annotation: Annotation, config: Optional[WindowConfig] = None) -> List[Dict[str, Any]]:
    """All rows of one annotation (what a dataset preprocessor fans one line out into)."""
    return [sample_to_row(sample) for sample in make_windows(annotation, config)]


@dataclass
class BuildReport:
    """What `build_rows` read, wrote and rejected; `rows_in == valid + len(rejected)`."""
    source: str
    out: str
    config: WindowConfig
    rows_in: int = 0
    valid: int = 0
    blank_lines: int = 0
    rejected: List[Invalid] = field(default_factory=list)
    samples_out: int = 0
    empty_answers: int = 0
    slivers_dropped: int = 0
    joined_by_rounding: int = 0
    overlaps_merged: int = 0
    warnings: List[str] = field(default_factory=list)
    written: bool = True  # False: nothing valid, so OUT was left as it was

    def to_json(self) -> Dict[str, Any]:
        return {'source': self.source, 'out': self.out, 'written': self.written, 'rows_in': self.rows_in,
                'valid': self.valid,
                'rejected': [bad.to_json() for bad in self.rejected], 'samples_out': self.samples_out,
                'empty_answers': self.empty_answers, 'slivers_dropped': self.slivers_dropped,
                'joined_by_rounding': self.joined_by_rounding,
                'overlaps_merged': self.overlaps_merged, 'blank_lines': self.blank_lines,
                'warnings': list(self.warnings), 'config': asdict(self.config)}

    def summary(self) -> str:
        lines = [f'rows in: {self.rows_in} from {self.source}'
                 + (f' ({self.blank_lines} blank line{"" if self.blank_lines == 1 else "s"} skipped)'
                    if self.blank_lines else ''),
                 f'rejected: {len(self.rejected)}']
        lines += [f'  {bad.reason}' for bad in self.rejected]
        lines += [f'samples out: {self.samples_out} ({self.empty_answers} with answer [])',
                  f'event slivers dropped: {self.slivers_dropped} (shorter than {self.config.min_event:g} s '
                  'after clipping to a window, or empty at the answer\'s 0.1 s)',
                  f'overlapping windows merged: {self.overlaps_merged}']
        if self.joined_by_rounding:
            lines.append(f'events joined by the answer\'s 0.1 s rounding: {self.joined_by_rounding} (less than 0.1 s '
                         'apart in a clip: one answer pair)')
        lines += [f'warning: {text}' for text in self.warnings]
        lines.append(f'wrote {self.out}' if self.written else f'nothing written: {self.out} left as it was')
        return '\n'.join(lines)


def build_rows(annotations_path: str, out_path: str, config: Optional[WindowConfig] = None,
               video_root: Optional[str] = None, strict: bool = False, probe: bool = True,
               stage=None) -> BuildReport:
    """Validate an annotation file, window every valid video and write one ms-swift row per clip.

    With `strict`, the first invalid line raises `AnnotationError` and nothing is written; otherwise
    invalid lines are skipped and listed in the report. The output is written atomically; with `stage` (an
    `outputs.Staging`) it is renamed into place only when the caller commits.
    """
    config = config or WindowConfig()
    loaded = load_annotations(annotations_path, video_root=video_root, probe=probe, strict=strict)
    report = BuildReport(source=loaded.source, out=os.fspath(out_path), config=config, rows_in=loaded.total,
                         valid=loaded.valid, blank_lines=loaded.blank_lines, rejected=list(loaded.invalid),
                         overlaps_merged=sum(m.count for m in loaded.merged), warnings=list(loaded.warnings))

    def rows() -> Iterator[Dict[str, Any]]:
        for annotation in loaded.rows:
            for sample in make_windows(annotation, config):
                report.empty_answers += not sample.events
                report.slivers_dropped += sample.dropped_slivers
                report.joined_by_rounding += sample.joined_by_rounding
                yield sample_to_row(sample)

    # The videos are inputs too: `data build a.jsonl clip.mp4` must not replace a video with rows.
    inputs = [annotations_path] + sorted({annotation.video for annotation in loaded.rows})
    report.samples_out = write_jsonl(rows(), out_path, inputs=inputs, stage=stage)
    return report
