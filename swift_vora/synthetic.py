"""Synthetic videos with known answers: a coloured square is on screen exactly inside the intervals.

Used by the demo, the tests and the learnability benchmark. The answer is visible in the frames, so a
model trained through the whole pipeline can only learn it if frames, timestamps and labels line up.
"""
from __future__ import annotations

import json
import os
import random
from typing import Dict, List, Optional, Sequence, Tuple

QUERY = 'the moments when the red square is on screen'


def write_video(path: str, duration: float, intervals: Sequence[Tuple[float, float]], fps: float = 4.0,
                size: Tuple[int, int] = (128, 96), seed: int = 0) -> str:
    """Write an mp4 (mp4v) of `duration` seconds; a red square is drawn on frames inside `intervals`."""
    import cv2
    import numpy as np

    width, height = size
    writer = cv2.VideoWriter(path, cv2.VideoWriter_fourcc(*'mp4v'), fps, (width, height))
    if not writer.isOpened():
        raise RuntimeError(f'OpenCV could not open a video writer for {path}')
    rng = np.random.default_rng(seed)
    n_frames = int(round(duration * fps))
    side = min(width, height) // 2
    for i in range(n_frames):
        t = (i + 0.5) / fps  # the frame's mid-time decides whether it is "inside"
        frame = np.full((height, width, 3), 40, np.uint8)
        frame += rng.integers(0, 20, size=frame.shape, dtype=np.uint8)  # mild noise, not a blank frame
        if any(s <= t < e for s, e in intervals):
            x0, y0 = (width - side) // 2, (height - side) // 2
            frame[y0:y0 + side, x0:x0 + side] = (0, 0, 230)  # BGR red
        writer.write(frame)
    writer.release()
    return path


def random_intervals(duration: float, rng: random.Random, max_events: int = 2, min_len: float = 2.0,
                     grid: float = 1.0, min_events: int = 0) -> List[Tuple[float, float]]:
    """Between `min_events` and `max_events` non-overlapping intervals on a `grid`-second grid."""
    for _ in range(100):
        events: List[Tuple[float, float]] = []
        for _ in range(rng.randint(min_events, max_events)):
            length = rng.choice([min_len, min_len * 2, min_len * 3])
            if length >= duration:
                continue
            start = round(rng.uniform(0, duration - length) / grid) * grid
            candidate = (start, start + length)
            if all(candidate[1] <= s or candidate[0] >= e for s, e in events):
                events.append(candidate)
        if len(events) >= min_events:
            return sorted(events)
    raise ValueError(f'cannot place {min_events} events of {min_len} s or more in {duration} s')


def make_dataset(out_dir: str, n_videos: int, duration: float = 16.0, fps: float = 4.0,
                 size: Tuple[int, int] = (128, 96), seed: int = 0, max_events: int = 2,
                 durations: Optional[Sequence[float]] = None, min_events: int = 0) -> str:
    """Write `n_videos` synthetic clips and an annotation JSONL (docs/contract.md format); return its path."""
    os.makedirs(out_dir, exist_ok=True)
    rng = random.Random(seed)
    rows: List[Dict] = []
    for i in range(n_videos):
        clip_duration = durations[i % len(durations)] if durations else duration
        intervals = random_intervals(clip_duration, rng, max_events=max_events, min_events=min_events)
        name = f'synthetic_{i:04d}.mp4'
        write_video(os.path.join(out_dir, name), clip_duration, intervals, fps=fps, size=size, seed=seed + i)
        rows.append({'id': f'synthetic_{i:04d}', 'video': name, 'duration': clip_duration, 'query': QUERY,
                     'windows': [list(w) for w in intervals]})
    path = os.path.join(out_dir, 'annotations.jsonl')
    with open(path, 'w') as f:
        for row in rows:
            f.write(json.dumps(row) + '\n')
    return path
