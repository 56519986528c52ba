"""QVHighlights annotations (Lei et al., 2021): recognise their lines and map them onto our format.

A QVHighlights line is one *query* on one 150 s clip:
`{"qid": 2579, "query": "...", "duration": 150, "vid": "NUsG9BgSes0_210.0_360.0",
  "relevant_windows": [[82, 150]], "relevant_clip_ids": [...], "saliency_scores": [...]}`.
It maps to `{"id": "2579", "video": "NUsG9BgSes0_210.0_360.0.mp4", "duration": 150, "query": "...",
"windows": [[82, 150]]}`; the video file is `<video root>/<vid>.mp4`, the layout of the released clips.

`annotations.load_annotations` reads such lines directly (it calls `is_qvhighlights` and `to_vora`),
and reports problems under the field names the user wrote (`relevant_windows`, `vid`, `qid`).
`swift_vora/data/convert.py` writes a whole file in our format, accounting for every input line.
"""
from __future__ import annotations

import json
import math
from typing import Any, Dict, Optional, Tuple

# Keys that only a QVHighlights line has; any of them (and neither `video` nor `windows`) marks one.
QVH_KEYS = ('qid', 'vid', 'relevant_windows')
# Our field -> the QVHighlights key it comes from, so that messages name the key in the user's file.
FIELD_NAMES = {'id': 'qid', 'video': 'vid', 'duration': 'duration', 'query': 'query', 'windows': 'relevant_windows'}
VIDEO_EXTENSION = '.mp4'
CLIP_SECONDS = 2.0  # `relevant_clip_ids` index the 2-second clips of the video


def is_qvhighlights(record: Dict[str, Any]) -> bool:
    """True for a QVHighlights line: it carries `qid`/`vid`/`relevant_windows` and none of our keys.

    Keys whose value is None count as absent, because a Hugging Face dataset built from mixed JSONL
    fills every missing column with None.
    """
    if record.get('video') is not None or record.get('windows') is not None:
        return False
    return any(record.get(key) is not None for key in QVH_KEYS)


def video_name(vid: str) -> str:
    """File name of a QVHighlights clip, relative to the video root."""
    return vid + VIDEO_EXTENSION


def to_vora(record: Dict[str, Any]) -> Dict[str, Any]:
    """Map a QVHighlights line to our fields without judging them (validation reports problems).

    Missing keys stay None, a non-string `vid` is passed through unchanged, so that the validator can
    say what is wrong under the QVHighlights key name (see `FIELD_NAMES`).
    """
    vid = record.get('vid')
    qid = record.get('qid')
    return {
        'id': str(qid) if isinstance(qid, int) and not isinstance(qid, bool) else qid,
        'video': video_name(vid) if isinstance(vid, str) and vid.strip() else vid,
        'duration': record.get('duration'),
        'query': record.get('query'),
        'windows': record.get('relevant_windows'),
    }


def saliency_problem(record: Dict[str, Any], duration: float) -> Optional[Tuple[str, str, Optional[int]]]:
    """(field, message, index) for malformed highlight fields, else None. `relevant_clip_ids` are distinct ints,
    each a 2-s clip inside the video; `saliency_scores` holds one triple of finite annotator scores per id.
    Both absent means no highlight annotation. Shared by `data check` and `eval`, which index arrays by them."""
    ids, scores = record.get('relevant_clip_ids'), record.get('saliency_scores')
    if ids is None and scores is None:
        return None
    n_clips = max(int(duration / CLIP_SECONDS), 1)
    if not isinstance(ids, list):
        return 'relevant_clip_ids', 'expected a list of clip indices (saliency_scores is given)', None
    for i, clip in enumerate(ids):
        if isinstance(clip, bool) or not isinstance(clip, int) or not 0 <= clip < n_clips:
            return ('relevant_clip_ids', f'expected a clip index in [0, {n_clips}) for a {duration:g} s video, got '
                    f'{_short(clip)}', i)
    if len(set(ids)) != len(ids):
        return 'relevant_clip_ids', 'a clip index appears twice', None
    if not isinstance(scores, list) or len(scores) != len(ids):
        return ('saliency_scores', f'expected one [a, b, c] score triple per relevant_clip_ids entry ({len(ids)}), '
                f'got {_short(scores)}', None)
    for i, triple in enumerate(scores):
        if not (isinstance(triple, list) and len(triple) == 3 and all(
                isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in triple)):
            return 'saliency_scores', f'expected three finite annotator scores, got {_short(triple)}', i
    return None


def _short(value: Any, limit: int = 40) -> str:
    try:  # a float as repr: an oversized number shows as written (swift_vora.jsonl.Oversized), not as Infinity
        text = repr(value) if isinstance(value, float) else json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + '...'
