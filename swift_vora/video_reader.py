"""Which library decodes the training videos: decord where it installs, else torchcodec, else PyAV.

decord has no wheel for aarch64 (GH200 machines) or recent macOS, so swift-vora cannot require it everywhere.
qwen_vl_utils (the template's `fetch_video`) picks its reader once per process from `FORCE_QWENVL_VIDEO_READER`,
else torchcodec, else decord, else torchvision; but torchvision >= 0.24 no longer has `io.read_video`, so on a
machine without decord or torchcodec its last resort fails. PyAV (`av`, already a dependency of qwen_vl_utils,
wheels for aarch64) is registered here as one more qwen_vl_utils reader, `pyav`, with decord's exact semantics:
the clip's frame range and frame count come from qwen_vl_utils' own `calculate_video_frame_range` and
`smart_nframes`, the indices are the same `linspace` over the source frames, and a frame's index is its
position in the stream (presentation time x average frame rate), which is decord's index for constant-frame-rate
video. So the sampled frames and their timestamps (index / fps, what the model is shown) do not depend on the
reader; tests/test_video_reader.py checks it against decord.

`prepare_video_reader()` runs in the process that decodes (the template): a reader named in
`FORCE_QWENVL_VIDEO_READER` is kept (`decord`, `torchcodec`, `pyav`, `torchvision`); otherwise decord if it
imports, else torchcodec, else `pyav`; the template then hands the name to swift_vora/speed/encode.py, which
gives decord its one-thread-per-reader limit (swift_vora/speed/video_decode.py).
"""
from __future__ import annotations

import importlib.util
import os
from typing import Any, Dict, List, Optional, Tuple

FORCE_ENV = 'FORCE_QWENVL_VIDEO_READER'  # qwen_vl_utils' own switch
PYAV = 'pyav'
PATCH = 'qwen_vl_video_reader'  # swift_vora/patches.py: qwen_vl_utils' reader globals


def available(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a module set to None in sys.modules (how tests hide one)
        return False


def default_reader() -> str:
    for name, module in (('decord', 'decord'), ('torchcodec', 'torchcodec')):
        if available(module):
            return name
    return PYAV


def prepare_video_reader(environ=None) -> str:
    """Register the PyAV reader with qwen_vl_utils and choose the reader for this process; returns its name (where
    qwen_vl_utils is not the code swift_vora/patches.py knows, its own choice, untouched)."""
    from qwen_vl_utils import vision_process

    from . import patches
    if not patches.applicable(PATCH):
        return vision_process.get_video_reader_backend()
    environ = os.environ if environ is None else environ
    vision_process.VIDEO_READER_BACKENDS.setdefault(PYAV, read_video_pyav)
    patches.applied(PATCH)
    forced = environ.get(FORCE_ENV) or None
    reader = forced or default_reader()
    if forced is not None and forced not in vision_process.VIDEO_READER_BACKENDS:
        raise ValueError(f'{FORCE_ENV}={forced!r}: qwen_vl_utils knows '
                         f'{", ".join(sorted(vision_process.VIDEO_READER_BACKENDS))}')
    if vision_process.FORCE_QWENVL_VIDEO_READER != reader:  # qwen_vl_utils read the variable at import time
        vision_process.FORCE_QWENVL_VIDEO_READER = reader
        vision_process.get_video_reader_backend.cache_clear()
    return reader  # decord's one-thread-per-reader limit: swift_vora/speed/encode.py before_decode(reader)


def video_header(path: str, reader: Optional[str] = None) -> Tuple[float, int, int, int]:
    """(average fps, frame count, height, width) of a video, read with decord when it imports, else PyAV."""
    if (reader or ('decord' if available('decord') else PYAV)) == 'decord':
        import decord
        video = decord.VideoReader(path, num_threads=1)
        height, width = video[0].shape[:2]
        return float(video.get_avg_fps()), len(video), int(height), int(width)
    import av
    with av.open(path) as container:
        stream = container.streams.video[0]
        fps = _average_fps(stream)
        return fps, _frame_count(container, stream, fps), int(stream.codec_context.height), \
            int(stream.codec_context.width)


def _average_fps(stream) -> float:
    rate = stream.average_rate or stream.guessed_rate or stream.base_rate
    if not rate:
        raise ValueError('the video stream has no frame rate; use decord or torchcodec')
    return float(rate)


def _frame_count(container, stream, fps: float) -> int:
    """Frames in the stream: the container's count, else the packets counted (what decord indexes)."""
    if stream.frames:
        return int(stream.frames)
    count = sum(1 for packet in container.demux(stream) if packet.size)
    container.seek(0)
    return count


def _decode_at(container, stream, fps: float, indices: List[int]):
    """RGB frames at the given stream positions (sorted, repeats allowed), seeking to the first one."""
    import numpy as np
    wanted = sorted(set(indices))
    time_base = float(stream.time_base)
    origin = stream.start_time or 0
    first_pts = origin + int(wanted[0] / fps / time_base)
    container.seek(max(origin, first_pts), stream=stream, backward=True, any_frame=False)
    found: Dict[int, Any] = {}
    for frame in container.decode(stream):
        if frame.pts is None:
            raise ValueError(f'{container.name}: a frame without a timestamp; use decord or torchcodec '
                             f'({FORCE_ENV}=decord)')
        position = int(round((frame.pts - origin) * time_base * fps))
        if position in wanted and position not in found:
            found[position] = frame.to_ndarray(format='rgb24')
        if position >= wanted[-1]:
            break
    missing = [i for i in wanted if i not in found]
    if missing:
        raise ValueError(f'{container.name}: frames {missing[:5]} could not be decoded')
    return np.stack([found[i] for i in indices])


def read_video_pyav(ele: Dict[str, Any]):
    """qwen_vl_utils reader contract (as `_read_video_decord`): (TCHW uint8 tensor, metadata, sample fps)."""
    import av
    import torch
    from qwen_vl_utils.vision_process import calculate_video_frame_range, smart_nframes
    path = ele['video']
    if path.startswith('file://'):
        path = path[len('file://'):]
    with av.open(path) as container:
        stream = container.streams.video[0]
        video_fps = _average_fps(stream)
        total_frames = _frame_count(container, stream, video_fps)
        start_frame, end_frame, total_frames = calculate_video_frame_range(ele, total_frames, video_fps)
        nframes = smart_nframes(ele, total_frames=total_frames, video_fps=video_fps)
        idx = torch.linspace(start_frame, end_frame, nframes).round().long().tolist()
        frames = _decode_at(container, stream, video_fps, idx)
    video = torch.from_numpy(frames).permute(0, 3, 1, 2)
    sample_fps = nframes / max(total_frames, 1e-6) * video_fps
    metadata = dict(fps=video_fps, frames_indices=idx, total_num_frames=total_frames, video_backend=PYAV)
    return video, metadata, sample_fps
