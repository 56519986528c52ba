"""Predict: unlabelled videos through a checkpoint, exactly as `swift-vora eval --adapters` runs a labelled file.

The videos become an annotation file without answers (`id`, `video`, `duration`, `query`, `windows: []`, next to
the output as `OUT.videos.jsonl`), which eval's inference path hands to `swift infer` (swift_vora/eval/
inference.py): the same video_ora dataset, so the checkpoint's windows, budget and prompt (its
swift_vora_budget.json) cut and encode every clip as in training, and the same engine (vLLM where installed, else
transformers). Each result row is a clip; a video's line (swift_vora/predict/lines.py) is made, by eval's rule, as
soon as all of its clips are answered.

Writing: the output file is rewritten whole (a temporary file renamed over it, outputs.staged()) each time videos
complete, at most every COMMIT_SECONDS and once at the end, so it only ever holds whole lines of whole videos;
a run that stops half-way (a crash, ^C, a failed `swift infer`) keeps the videos it finished, and the same command
run again skips every video already in the output (`--overwrite`: predict them again, the file starts afresh).
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from ..errors import InvalidInput, UsageError
from . import lines as L
from .videos import Unreadable, Video, find_videos, probe_videos

COMMIT_SECONDS = 10.0  # the output is rewritten at most this often while videos complete (and at the end)
LABEL = 'swift-vora predict'


@dataclass
class PredictReport:
    output: str
    videos: int = 0  # named by the inputs
    skipped: List[str] = field(default_factory=list)  # ids already in the output
    predicted: List[Dict[str, Any]] = field(default_factory=list)  # the lines written by this run
    unreadable: List[Unreadable] = field(default_factory=list)
    unanswered: List[str] = field(default_factory=list)  # ids swift infer returned no (complete) answer for
    query: Optional[str] = None

    @property
    def clips(self) -> int:
        return sum(len(line['clips']) for line in self.predicted)

    @property
    def parse_failures(self) -> int:
        return sum(line['parse_failures'] for line in self.predicted)

    def failure_kinds(self) -> Dict[str, int]:
        kinds: Dict[str, int] = {}
        for line in self.predicted:
            for clip in line['clips']:
                if clip['failure']:
                    kinds[clip['failure']] = kinds.get(clip['failure'], 0) + 1
        return kinds

    def to_json(self) -> Dict[str, Any]:
        return {'output': self.output, 'videos': self.videos, 'predicted': len(self.predicted),
                'skipped': len(self.skipped), 'clips': self.clips, 'parse_failures': self.parse_failures,
                'parse_failure_kinds': self.failure_kinds(),
                'kept_seconds': round(sum(line['kept_seconds'] for line in self.predicted), 3),
                'unreadable': [{'video': u.path, 'reason': u.reason} for u in self.unreadable],
                'unanswered': list(self.unanswered), 'query': self.query}


def resolve_query(query: Optional[str], model: Optional[str], adapters: Optional[str]) -> str:
    """The query the prompts hold: `--query`, else the checkpoint's training query (swift_vora_budget.json's
    `prompt`), else the default one. A checkpoint trained on several queries needs `--query`."""
    from .. import trained_budget
    from ..prompt import effective_query
    if query is not None:
        if not query.strip():
            raise UsageError('--query: empty text')
        return effective_query(query)
    path = trained_budget.find(adapters, model)
    trained, distinct = trained_budget.trained_query(path) if path else (None, 0)
    if distinct > 1:
        raise UsageError(f'the checkpoint was trained on {distinct} different queries (the most common: '
                         f'{trained!r}; {path}); say which moments to keep with --query TEXT')
    return effective_query(trained)


class _Output:
    """The output file: the lines kept from before, then this run's, rewritten whole on each commit."""

    def __init__(self, path: str, kept_text: str, inputs: List[str]):
        self.path, self.kept_text, self.inputs = path, kept_text, inputs
        self.new: List[Dict[str, Any]] = []
        self.committed = 0
        self.last_commit = 0.0

    def add(self, line: Dict[str, Any]) -> None:
        self.new.append(line)

    def commit(self, force: bool = False) -> None:
        if len(self.new) == self.committed or (not force and time.monotonic() - self.last_commit < COMMIT_SECONDS):
            return
        from ..outputs import staged
        text = self.kept_text + ''.join(json.dumps(line, ensure_ascii=False, allow_nan=False) + '\n'
                                        for line in self.new)
        with staged() as stage:
            stage.write_text(self.path, text, self.inputs, what='--output')
        self.committed, self.last_commit = len(self.new), time.monotonic()


def _existing(output: str, videos: List[Video], overwrite: bool):
    """(text of the lines to keep, ids done) from an earlier output. A line that cannot be read, or one whose id
    names another file than this run's video of that id, stops the run before anything is done (exit 1)."""
    if overwrite or not os.path.exists(output):
        return '', set()
    rows, problems = L.read_lines(output)
    if problems:
        raise InvalidInput(f'{output} holds {len(problems)} line(s) that are not prediction lines; fix or move the '
                           'file, or give --overwrite to start it afresh:\n' + L.describe_problems(output, problems))
    by_id = {video.id: video for video in videos}
    for number, row in rows:
        video = by_id.get(str(row['id']))
        if video is not None and L.video_path(row, output) != os.path.normpath(video.path):
            raise InvalidInput(f"{output}:{number}: field 'video': id {video.id!r} is {row['video']} there but "
                               f'{video.path} in this run; use another --output, or --overwrite')
    text = ''.join(json.dumps(row, ensure_ascii=False) + '\n' for _, row in rows)
    return text, {str(row['id']) for _, row in rows}


def predict(inputs: List[str], output: str, model: Optional[str] = None, adapters: Optional[str] = None,
            query: Optional[str] = None, overwrite: bool = False, backend: Optional[str] = None,
            max_new_tokens: Optional[int] = None, model_type: Optional[str] = None,
            environ: Optional[Dict[str, str]] = None, stream=None) -> PredictReport:
    """Predict every video of `inputs` not yet in `output` (see the module docstring). Raises UsageError /
    InvalidInput before the model loads for inputs that cannot be used; InferenceError (after keeping the videos
    answered) when `swift infer` fails."""
    from ..data.windowing import window_bounds, window_config_from_env
    from ..eval.inference import prepare, results_to_predictions, swift_infer
    from ..outputs import check_output_file, staged
    stream = stream or sys.stderr
    videos = find_videos(inputs)
    output = os.path.abspath(check_output_file(output, [v.path for v in videos], what='--output'))
    report = PredictReport(output=output, videos=len(videos))
    kept_text, done = _existing(output, videos, overwrite)
    report.skipped = [v.id for v in videos if v.id in done]
    todo = [v for v in videos if v.id not in done]
    if report.skipped:
        print(f'{LABEL}: {len(report.skipped)} of {len(videos)} video(s) already in {output}, skipped '
              '(--overwrite to predict them again)', file=stream, flush=True)
    if not todo:
        return report
    readable, report.unreadable = probe_videos(todo, say=lambda text: print(f'{LABEL}: {text}', file=stream,
                                                                             flush=True))
    for bad in report.unreadable:
        print(f'{LABEL}: {bad.path}: {bad.reason}; not predicted', file=stream, flush=True)
    if not readable:
        return report
    report.query = resolve_query(query, model, adapters)
    environ, max_new_tokens = prepare(model, adapters, max_new_tokens, environ, label=LABEL)
    config = window_config_from_env(environ)
    expected = {v.id: len(window_bounds(v.duration, config)) for v in readable}
    checkpoint = os.path.abspath(adapters or model)
    work = {name: check_output_file(f'{output}.{name}', [v.path for v in videos], what=f'--output {name}')
            for name in ('videos.jsonl', 'swift_infer.jsonl', 'infer.log')}
    with staged() as stage:  # the unlabelled annotation file swift infer reads: one line per video, no answers
        stage.write_text(work['videos.jsonl'], ''.join(
            json.dumps({'id': v.id, 'video': v.path, 'duration': v.duration, 'query': report.query, 'windows': []},
                       ensure_ascii=False) + '\n' for v in readable), what='the videos to predict')
    print(f'{LABEL}: {len(readable)} video(s), {sum(expected.values())} clip(s) of the checkpoint\'s windows '
          f'(window {config.window or "whole video"} s, stride {config.effective_stride or "-"} s); query '
          f'{report.query!r}', file=stream, flush=True)
    out = _Output(output, kept_text, [v.path for v in videos])
    pending = {v.id: v for v in readable}

    def collect(rows: List[Dict[str, Any]]) -> None:
        by_video: Dict[str, List[Dict[str, Any]]] = {}
        for clip in results_to_predictions(rows):
            by_video.setdefault(str(clip['id']), []).append(clip)
        for video_id, clips in by_video.items():
            video = pending.get(video_id)
            if video is not None and len(clips) >= expected[video_id]:
                line = L.make_line(video.id, video.path, video.duration, clips, report.query, checkpoint)
                out.add(line)
                report.predicted.append(line)
                del pending[video_id]

    def on_progress(_clips_done: int) -> Optional[str]:
        from ..eval.inference import read_results
        collect(read_results(work['swift_infer.jsonl']))
        out.commit()
        return f'{len(readable) - len(pending)}/{len(readable)} videos done'

    try:
        rows = swift_infer(work['videos.jsonl'], work['swift_infer.jsonl'], work['infer.log'], environ,
                           max_new_tokens, model=model, adapters=adapters, backend=backend, model_type=model_type,
                           label=LABEL, on_progress=on_progress, total=sum(expected.values()))
    except BaseException:  # whatever stopped it, the videos answered completely are kept
        from ..eval.inference import read_results
        collect(read_results(work['swift_infer.jsonl']))
        out.commit(force=True)
        report.unanswered = sorted(pending)
        raise
    collect(rows)
    out.commit(force=True)
    report.unanswered = sorted(pending)
    return report


def summary(report: PredictReport, say: Callable[[str], None]) -> None:
    """What a run did, for stderr: videos predicted, skipped, unreadable, clips, parse failures by kind."""
    kinds = report.failure_kinds()
    text = (f'{LABEL}: {len(report.predicted)} video(s) predicted ({report.clips} clips, '
            f'{sum(line["kept_seconds"] for line in report.predicted):.1f} s kept, {report.parse_failures} '
            f'parse failure(s){" (" + ", ".join(f"{k}: {v}" for k, v in kinds.items()) + ")" if kinds else ""})')
    if report.skipped:
        text += f', {len(report.skipped)} already there'
    if report.unreadable:
        text += f', {len(report.unreadable)} unreadable'
    say(text + f'; {report.output}')
    for line in report.predicted:
        failed = [c for c in line['clips'] if c['failure']]
        if failed:
            where = ', '.join(f"{c['start']:g}-{c['end']:g} s ({c['failure']})" for c in failed[:5])
            say(f"  {line['id']}: {len(failed)} of {len(line['clips'])} clips did not parse: {where}"
                + (' ...' if len(failed) > 5 else '') + ' (their responses are in the line\'s clips)')
    if report.unanswered:
        say(f'{LABEL}: swift infer returned no answer for {len(report.unanswered)} video(s) '
            f'({", ".join(report.unanswered[:5])}); run the same command again to predict them')
