"""Read a video file's length and shape, and say plainly why a file cannot be read.

Why this exists: a missing, empty or undecodable video is the most common silent failure of video SFT.
ms-swift deletes a row whose preprocessing raises with one log line, and with lazy tokenization a
broken video is swapped for a random other sample at training time. Probing every file before
training turns that into a message that names the file.

The reader is decord (what qwen_vl_utils uses for training, so "decord can read it" is the test that
matters); OpenCV is the fallback when decord is not installed. Both are imported inside functions so
that `swift-vora --help` does not pay for them. Probing decodes the first frame, because a container
can open fine while its codec cannot be decoded.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Optional

BACKENDS = ('decord', 'opencv')


class VideoProbeError(ValueError):
    """A video file that cannot be used: `path` and a human `reason` (missing, empty, undecodable)."""

    def __init__(self, path: str, reason: str):
        super().__init__(f'{path}: {reason}')
        self.path = path
        self.reason = reason


@dataclass
class VideoInfo:
    """What probing learned about a file; `duration` in seconds, measured from the decoded stream."""
    duration: float
    fps: float
    frames: int
    width: int
    height: int
    backend: str = 'decord'


def check_file(path: str) -> None:
    """Raise `VideoProbeError` if `path` is not an existing, non-empty regular file (no decoding)."""
    if not os.path.exists(path):
        raise VideoProbeError(path, 'file not found')
    if not os.path.isfile(path):
        raise VideoProbeError(path, 'not a regular file')
    if os.path.getsize(path) == 0:
        raise VideoProbeError(path, 'file is empty (0 bytes)')


def probe_video(path: str, backend: Optional[str] = None) -> VideoInfo:
    """Open `path`, decode its first frame and return its duration, fps, frame count and size.

    `backend` forces 'decord' or 'opencv'; by default decord is used when importable, else OpenCV.
    Raises `VideoProbeError` naming the path for a missing, empty or undecodable file.
    """
    path = os.fspath(path)
    check_file(path)
    if backend is None:
        backend = 'decord' if _decord_available() else 'opencv'
    if backend == 'decord':
        return _probe_decord(path)
    if backend == 'opencv':
        return _probe_opencv(path)
    raise ValueError(f'unknown video backend {backend!r}; expected one of {BACKENDS}')


def probe_duration(path: str, backend: Optional[str] = None) -> float:
    """Duration of the video at `path` in seconds; raises `VideoProbeError` (see `probe_video`)."""
    return probe_video(path, backend=backend).duration


def _decord_available() -> bool:
    try:
        import decord  # noqa: F401
    except ImportError:
        return False
    return True


def _probe_decord(path: str) -> VideoInfo:
    import decord

    # decord raises its own DECORDError for some failures and RuntimeError for others.
    errors = (RuntimeError, decord.DECORDError, IndexError)
    try:
        reader = decord.VideoReader(path, num_threads=1)
    except errors as exc:
        raise VideoProbeError(path, 'cannot be decoded (decord cannot open it as a video)') from exc
    try:
        frames = len(reader)
        fps = float(reader.get_avg_fps())
        if frames <= 0:
            raise VideoProbeError(path, 'cannot be decoded (decord finds no video frames)')
        first = reader[0].shape  # decode one frame: the codec, not just the container, must work
        height, width = int(first[0]), int(first[1])
        # The end time of the last frame is exact for variable frame rates; frames / fps is not.
        duration = float(reader.get_frame_timestamp(frames - 1)[1])
    except errors as exc:
        raise VideoProbeError(path, f'cannot be decoded (decord: {_first_line(exc)})') from exc
    finally:
        del reader
    if not (math.isfinite(duration) and duration > 0):
        if fps <= 0 or not math.isfinite(fps):
            raise VideoProbeError(path, 'cannot be decoded (decord finds no frame rate or timestamps)')
        duration = frames / fps
    return VideoInfo(duration=duration, fps=fps, frames=frames, width=width, height=height, backend='decord')


def _probe_opencv(path: str) -> VideoInfo:
    import cv2

    capture = cv2.VideoCapture(path)
    try:
        if not capture.isOpened():
            raise VideoProbeError(path, 'cannot be decoded (OpenCV cannot open it as a video)')
        frames = int(capture.get(cv2.CAP_PROP_FRAME_COUNT))
        fps = float(capture.get(cv2.CAP_PROP_FPS))
        ok, frame = capture.read()
        if not ok or frame is None:
            raise VideoProbeError(path, 'cannot be decoded (OpenCV cannot decode its first frame)')
        if frames <= 0 or not (math.isfinite(fps) and fps > 0):
            raise VideoProbeError(path, 'cannot be decoded (OpenCV finds no frame count or frame rate)')
        height, width = int(frame.shape[0]), int(frame.shape[1])
    finally:
        capture.release()
    return VideoInfo(duration=frames / fps, fps=fps, frames=frames, width=width, height=height, backend='opencv')


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
