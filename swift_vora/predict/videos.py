"""The videos a `predict` run is given: files and folders -> (id, path), each probed before the model loads.

Ids: a file named on the command line is its name without the extension (`match_07.mp4` -> `match_07`); a file
found in a folder is its path inside that folder without the extension (`day1/cam_a.mov` -> `day1/cam_a`), so
ids stay the same when a folder is predicted again (resuming) and match annotation ids written the same way. Two
videos that would share an id are a usage error naming both.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ..errors import UsageError

# What a folder search takes for a video (case-insensitive); a file named directly is probed whatever its name.
VIDEO_SUFFIXES = ('.mp4', '.m4v', '.mov', '.mkv', '.webm', '.avi', '.mpg', '.mpeg', '.ts', '.mts', '.m2ts',
                  '.mxf', '.wmv', '.flv', '.3gp')


@dataclass
class Video:
    id: str
    path: str  # absolute
    duration: float = 0.0  # seconds, from the probe


@dataclass
class Unreadable:
    path: str
    reason: str


def find_videos(inputs: Sequence[str]) -> List[Video]:
    """Every video named by `inputs` (files, or folders searched recursively; hidden files skipped), in the order
    given (a folder's files sorted). Raises UsageError for a path that does not exist, a folder without videos, or
    two videos with one id."""
    found: List[Video] = []
    first: Dict[str, str] = {}
    seen_paths = set()
    for given in inputs:
        path = os.path.abspath(os.path.expanduser(given))
        if os.path.isdir(path):
            listed = list(_folder_videos(path))
            if not listed:
                raise UsageError(f'{given}: no video files in this folder (searched recursively for '
                                 f'{", ".join(VIDEO_SUFFIXES)})')
        elif os.path.exists(path):
            listed = [(os.path.splitext(os.path.basename(path))[0], path)]
        else:
            raise UsageError(f'{given}: no such file or folder')
        for video_id, video_path in listed:
            if video_path in seen_paths:  # the same file named twice (a file and its folder): once is enough
                continue
            if video_id in first:
                raise UsageError(f'two videos would have the id {video_id!r}: {first[video_id]} and {video_path} '
                                 '(ids name the prediction lines; predict them in separate runs with separate '
                                 '--output files, or rename one)')
            first[video_id] = video_path
            seen_paths.add(video_path)
            found.append(Video(id=video_id, path=video_path))
    return found


def _folder_videos(folder: str):
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith('.'))
        for name in sorted(files):
            if name.startswith('.') or not name.lower().endswith(VIDEO_SUFFIXES):
                continue
            path = os.path.join(root, name)
            relative = os.path.splitext(os.path.relpath(path, folder))[0]
            yield relative.replace(os.sep, '/'), path


def probe_videos(videos: Sequence[Video], say: Optional[Callable[[str], None]] = None
                 ) -> Tuple[List[Video], List[Unreadable]]:
    """(the videos that decode, with their duration; the others with the reason), as the dataset loader will
    probe them (swift_vora/data/probe.py: the first frame decoded, the duration from the stream). `say` gets a
    progress line at least every HEARTBEAT_SECONDS (a long folder takes a while)."""
    from ..data.probe import VideoProbeError, probe_video
    from ..progress import HEARTBEAT_SECONDS
    readable, unreadable = [], []
    last = time.monotonic()
    for i, video in enumerate(videos):
        if say is not None and time.monotonic() - last >= HEARTBEAT_SECONDS:
            say(f'probed {i}/{len(videos)} videos')
            last = time.monotonic()
        try:
            video.duration = probe_video(video.path).duration
        except VideoProbeError as exc:
            unreadable.append(Unreadable(video.path, exc.reason))
            continue
        readable.append(video)
    return readable, unreadable
