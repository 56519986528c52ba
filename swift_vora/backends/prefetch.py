"""Encode the next samples while the GPU trains on this one: one background thread, a bounded queue.

The Unsloth runner trains in a plain loop without a DataLoader (no forked workers next to CUDA and Unsloth's
compiled modules). Decoding 64 frames and running the processor takes a good part of a second per sample; done
inline, the GPU waits for it every micro-batch. One thread is enough to hide it whenever a training step takes
longer than an encode: decord, numpy and torch release the GIL in their native work. One thread, not several,
because the template keeps per-sample state (budget reports, frame caps) on the instance.

What it reports: `wait_s`, the time the training loop spent blocked on the queue (the data-wait share of a
benchmark), and per batch the encode time, the rejected samples and the token counts.
"""
from __future__ import annotations

import queue
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

_DONE = object()


@dataclass
class Batch:
    """One collated micro-batch and what it took to make it."""
    inputs: Dict[str, Any]
    samples: int
    tokens: int
    supervised_per_sample: List[int]
    rejected: int
    encode_s: float
    rejections: List[str] = field(default_factory=list)
    names: List[str] = field(default_factory=list)


def pin_tensors(inputs: Dict[str, Any]) -> Dict[str, Any]:
    """The batch's CPU tensors in page-locked memory, on the producer thread, when a CUDA device will receive them.

    A copy from pageable memory goes through a staging buffer at a fraction of the bus speed and blocks the
    training thread: on the H200 a 64-frame sample's inputs took ~12 ms per sample that way (the step profile's
    `Memcpy HtoD (Pageable -> Device)`). Pinned here, off the critical path, the training thread's copy is a direct
    DMA it can issue with `non_blocking=True`; torch's pinned-memory cache keeps each block until its copy is done.
    """
    import torch
    if not torch.cuda.is_available():
        return inputs
    return {k: v.pin_memory() if isinstance(v, torch.Tensor) and v.device.type == 'cpu' else v
            for k, v in inputs.items()}


class SampleOrder:
    """An endless shuffled order over `n` rows: a new permutation each epoch, from one seeded generator."""

    def __init__(self, n: int, seed: int):
        self.n = n
        self.rng = random.Random(seed)
        self.pending: List[int] = []

    def next(self) -> int:
        if not self.pending:
            self.pending = self.rng.sample(range(self.n), self.n)
        return self.pending.pop()


class EncodePrefetcher:
    """Iterates micro-batches encoded by `make_batch()` on a background thread, at most `depth` ahead.

    `make_batch` raises to stop training (e.g. every sample rejected): the error is re-raised in the training
    thread at the next `next()`, so nothing fails silently in the background."""

    def __init__(self, make_batch: Callable[[], Batch], depth: int = 2, first: Optional[Batch] = None):
        if depth < 1:
            raise ValueError(f'prefetch depth {depth}: at least 1')
        self.make_batch = make_batch
        self.queue: 'queue.Queue[Any]' = queue.Queue(maxsize=depth + 1)
        if first is not None:  # made by the caller, on its own thread: whatever the first encode sets up lazily
            self.queue.put(first)
        self.stop = threading.Event()
        self.wait_s = 0.0
        self.thread = threading.Thread(target=self._run, name='swift-vora-encode', daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                item: Any = self.make_batch()
            except BaseException as error:  # noqa: BLE001 -- handed to the training thread, re-raised there
                item = error
            while not self.stop.is_set():
                try:
                    self.queue.put(item, timeout=0.2)
                    break
                except queue.Full:
                    continue
            if isinstance(item, BaseException):
                return

    def next(self) -> Batch:
        t0 = time.perf_counter()
        item = self.queue.get()
        self.wait_s += time.perf_counter() - t0
        if isinstance(item, BaseException):
            self.close()
            raise item
        return item

    def close(self, timeout: Optional[float] = 5.0) -> None:
        self.stop.set()
        try:  # unblock a producer waiting on a full queue
            while True:
                self.queue.get_nowait()
        except queue.Empty:
            pass
        self.thread.join(timeout)
