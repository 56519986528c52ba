"""The `video_ora` dataset in ms-swift: annotation files become windowed training rows.

`swift sft --dataset ANNOTATIONS.jsonl` with the plugin loaded: a file whose lines are Video-ORA (or
QVHighlights) annotations is routed to this dataset instead of ms-swift's generic preprocessor (see
`_route_annotation_files`). The loader validates every line, windows the videos and writes one row per
window with the clip bounds, the sample id and the video budget in `chat_template_kwargs`. Nothing is
dropped silently: the in/out/rejected counts and every rejection reason are logged, and `--strict true`
stops at the first invalid line. (ms-swift itself would delete a row whose preprocessing raises, with a
log line only.)

Window settings come from `SWIFT_VORA_WINDOW`, `SWIFT_VORA_STRIDE`, `SWIFT_VORA_MIN_EVENT` (seconds;
`swift-vora train` sets them from the recipe).
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple

from swift.dataset import DatasetMeta, register_dataset
from swift.dataset.loader import DatasetLoader
from swift.utils import get_logger

from . import jsonl, patches, switches
from .budget import VideoBudget

logger = get_logger()

DATASET_NAME = 'video_ora'
ANNOTATION_SUFFIXES = ('.jsonl', '.json')


def window_config_from_env(environ=None):
    from .data.windowing import window_config_from_env as from_env
    return from_env(environ)


def count_samples(path: str, window_config=None, video_root: Optional[str] = None) -> Optional[int]:
    """How many training samples `path` becomes: its annotations windowed as the video_ora dataset windows them, or
    its rows for a file of ms-swift rows; None when it cannot be read (the dataset loader says why)."""
    from .data.annotations import load_annotations
    from .data.windowing import make_windows
    if not os.path.isfile(path):
        return None
    try:
        if not looks_like_annotations(path):
            with open(path, 'rb') as f:
                return sum(1 for line in f if line.strip())
        config = window_config or window_config_from_env()
        report = load_annotations(path, video_root=video_root or switches.read('SWIFT_VORA_VIDEO_ROOT') or None,
                                  probe=True)
        return sum(len(make_windows(a, config)) for a in report.rows)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def build_swift_rows(path: str, strict: bool = False, video_root: Optional[str] = None,
                     window_config=None, budget: Optional[VideoBudget] = None) -> Tuple[List[Dict], Any, int]:
    """Rows for ms-swift from an annotation file; returns (rows, annotation report, slivers dropped)."""
    from .data.annotations import load_annotations
    from .data.rows import sample_to_row
    from .data.windowing import make_windows
    from .trained_budget import note_answer, note_query

    window_config = window_config or window_config_from_env()
    budget = budget or VideoBudget.from_env()
    video_root = video_root or switches.read('SWIFT_VORA_VIDEO_ROOT') or None
    report = load_annotations(path, video_root=video_root, probe=True, strict=strict)
    rows, slivers = [], 0
    for annotation in report.rows:
        note_query(annotation.query)  # the query the checkpoint's prompts held, for `swift-vora predict`
        for sample in make_windows(annotation, window_config):
            slivers += sample.dropped_slivers
            row = sample_to_row(sample)
            note_answer(sample.answer)  # the longest answer sets the checkpoint's default max_new_tokens
            row.pop('vora', None)
            row['chat_template_kwargs'] = {**row['chat_template_kwargs'], **budget.to_dict()}
            rows.append(row)
    return rows, report, slivers


class VideoOraDatasetLoader(DatasetLoader):
    """Loads an annotation file through swift_vora.data instead of `datasets.load_dataset('json')`."""

    def _load_dataset_path(self, dataset_path: str, dataset_meta: DatasetMeta):
        from datasets import Dataset
        rows, report, slivers = build_swift_rows(dataset_path, strict=self.strict)
        logger.info(f'video_ora: {dataset_path}: {report.total} annotation lines, {len(report.rows)} valid, '
                    f'{len(report.invalid)} rejected; {len(rows)} windowed samples; {slivers} sliver events '
                    'dropped at window edges.')
        for bad in report.invalid:
            logger.warning(f'video_ora: rejected {bad.reason}')
        if not rows:
            raise ValueError(f'video_ora: {dataset_path} produced no training samples '
                             f'({len(report.invalid)} invalid lines; run `swift-vora data check {dataset_path}`).')
        # The rows are the final format: messages, videos, chat_template_kwargs.
        return Dataset.from_list(rows)


def looks_like_annotations(path: str, max_lines: int = 5) -> bool:
    """True when the first JSON lines of `path` are Video-ORA or QVHighlights annotations."""
    if not path.endswith(ANNOTATION_SUFFIXES) or not os.path.isfile(path):
        return False
    seen = 0
    for _, line, _ in jsonl.read_lines(path, errors='replace'):
        if line is None or not line.strip():
            continue
        seen += 1
        try:
            row = jsonl.loads(line)
        except (ValueError, RecursionError):  # not JSON (or nested absurdly deep): look at the next line
            if seen >= max_lines:
                return False
            continue
        if isinstance(row, dict) and 'messages' not in row and (
                {'video', 'windows'} <= row.keys() or {'vid', 'relevant_windows'} <= row.keys()):
            return True
        if seen >= max_lines:
            return False
    return False


VIDEO_ORA_META = DatasetMeta(dataset_name=DATASET_NAME, loader=VideoOraDatasetLoader,
                             help='Video-ORA annotations (JSONL: id, video, duration, query, windows), windowed.')


def _route_annotation_files() -> None:
    """Narrow patch of ms-swift's dataset lookup: annotation files go to `video_ora`.

    ms-swift 4.6 gives any unregistered local file the generic AutoPreprocessor, which cannot read
    annotations; there is no registry hook for "files of this shape". Only files that
    `looks_like_annotations` accepts are rerouted; everything else keeps ms-swift's behaviour.
    """
    from swift.dataset.dataset_syntax import DatasetSyntax
    original = DatasetSyntax.get_dataset_meta
    if patches.patched_by(original) == 'annotation_datasets' or not patches.applicable('annotation_datasets'):
        return

    def get_dataset_meta(self, use_hf):
        if self.dataset_type == 'path' and looks_like_annotations(self.dataset):
            logger.info(f'video_ora: {self.dataset} holds Video-ORA annotations; loading it as `{DATASET_NAME}`.')
            return VIDEO_ORA_META
        return original(self, use_hf)

    DatasetSyntax.get_dataset_meta = patches.mark(get_dataset_meta, 'annotation_datasets', original)


def register_video_ora_dataset() -> None:
    register_dataset(VIDEO_ORA_META, exist_ok=True)
    _route_annotation_files()
