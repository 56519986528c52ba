"""A line at least every few seconds while a user waits: what is running, for how long, and how far it got.

`wait_with_heartbeat(proc, label, status)` waits for a child process and prints `label: 40 s elapsed, <status()>`
every `interval` seconds (default 10) until it ends; `status` reads the child's own progress (e.g. the training
step from ms-swift's logging.jsonl) and may return None when there is nothing new to say.
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Callable, Optional

HEARTBEAT_SECONDS = 10.0


def elapsed(seconds: float) -> str:
    seconds = int(round(seconds))
    return f'{seconds // 60}m{seconds % 60:02d}s' if seconds >= 60 else f'{seconds} s'


def wait_with_heartbeat(proc, label: str, status: Optional[Callable[[], Optional[str]]] = None,
                        interval: float = HEARTBEAT_SECONDS, stream=None, poll: float = 0.5) -> int:
    """Wait for `proc` (a Popen); every `interval` seconds print where it is. Returns its exit code."""
    stream = stream or sys.stderr
    start = next_line = time.monotonic()
    next_line += interval
    while True:
        code = proc.poll()
        if code is not None:
            return code
        now = time.monotonic()
        if now >= next_line:
            said = status() if status else None
            print(f'{label}: {elapsed(now - start)} elapsed' + (f', {said}' if said else ''), file=stream, flush=True)
            next_line = now + interval
        time.sleep(poll)


def swift_training_status(output_dir: str) -> Callable[[], Optional[str]]:
    """`status` for a `swift sft` run writing under `output_dir`: its last logged step and loss (logging.jsonl), or
    that the model and data are still being loaded."""
    def status() -> Optional[str]:
        import glob
        logs = sorted(glob.glob(os.path.join(output_dir, '**', 'logging.jsonl'), recursive=True), key=os.path.getmtime)
        if not logs:
            return 'loading the model and the clips'
        last = None
        with open(logs[-1], encoding='utf-8', errors='replace') as f:
            for line in f:
                if '"global_step/max_steps"' in line:
                    last = line
        if last is None:
            return 'first step (compiling, encoding the first clips)'
        try:
            row = json.loads(last)
        except ValueError:
            return None
        loss = row.get('loss')
        return f'step {row.get("global_step/max_steps")}' + (f', loss {loss:.3f}' if isinstance(loss, float) else '')
    return status
