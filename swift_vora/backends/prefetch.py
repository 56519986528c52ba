"""Encode the next samples while the GPU trains on this one: several encode threads, one collating thread, bounded.

The Unsloth runner trains in a plain loop without a DataLoader (no forked workers next to CUDA and Unsloth's
compiled modules). Decoding 64 frames and running the processor takes a good part of a second per sample; done
inline, the GPU waits for it every micro-batch. decord, numpy and torch release the GIL in their native work, so
threads overlap it. One encode thread was not enough: on the H200 at 0.87 s per 4-sample step it made ~2 samples/s
and the loop waited on data 32 % of the time. So `OrderedEncoder` encodes on several threads
(`unsloth.encode_threads`), each encode on a template no other encode is using (the template keeps per-sample state
-- frame caps, budget reports -- on the instance), and hands the samples back in the order the rows were drawn: the
run sees the same samples and the same rejections with 1 thread or 8. `EncodePrefetcher` collates them into
micro-batches on its one thread.

What it reports: `wait_s`, the time the training loop spent blocked on the queue (the data-wait share of a
benchmark), and per batch the encode time, the rejected samples and the token counts.
"""
from __future__ import annotations

import collections
import functools
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple, Type

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
    # where this rank's order drew the trained samples and the rejected ones (rank_samples.Position): the coverage
    positions: List[Any] = field(default_factory=list)
    rejected_positions: List[Any] = field(default_factory=list)
    # the vision tower's preamble for this batch's videos (speed/vision_preamble.py), when that switch is on
    vision: Dict[str, Any] = field(default_factory=dict)


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


@dataclass
class Encoded:
    """One drawn row and what its encode gave: the sample, or the rejection (an exception of a `rejected` type)."""
    row: Any
    sample: Any = None
    rejection: Optional[BaseException] = None


class OrderedEncoder:
    """Encodes the rows `next_row()` draws on one thread per callable of `encodes`; `next()` hands them back in the
    order drawn.

    Rows are drawn only inside `next()` (one consumer thread: the seeded order is never shared), at most `ahead` in
    flight, so which sample comes n-th depends on the rows alone, not on the thread count or on which encode finished
    first. Each callable runs one encode at a time: a worker takes a free one, encodes, puts it back. An exception of
    a `rejected` type comes back as `Encoded.rejection` (a rejection is decided by the row); any other is raised by
    `next()` when its row's turn comes. With one callable the encode runs inline in `next()`, as before: no pool."""

    def __init__(self, encodes: Sequence[Callable[[Any], Any]], next_row: Callable[[], Any],
                 ahead: Optional[int] = None, rejected: Tuple[Type[BaseException], ...] = ()):
        if not encodes:
            raise ValueError('OrderedEncoder needs at least one encode callable')
        self.threads = len(encodes)
        self.ahead = ahead or 2 * self.threads
        if self.ahead < 1:
            raise ValueError(f'ahead {self.ahead}: at least 1')
        self.next_row = next_row
        self.rejected = tuple(rejected)
        self.free: 'queue.SimpleQueue[Callable[[Any], Any]]' = queue.SimpleQueue()
        for encode in encodes:
            self.free.put(encode)
        self.pool = ThreadPoolExecutor(self.threads, 'swift-vora-encode') if self.threads > 1 else None
        self.pending: Deque[Tuple[Any, Any]] = collections.deque()  # (row, Future), in drawn order
        self.current: Any = None  # the Future next() waits on
        self.lock = threading.Lock()  # close() may come from another thread than next()
        self.closed = False

    def _encode(self, row: Any) -> Any:
        encode = self.free.get()  # never waits long: as many workers as callables
        try:
            return encode(row)
        finally:
            self.free.put(encode)

    def next(self) -> Encoded:
        with self.lock:
            if self.closed:
                raise RuntimeError('OrderedEncoder is closed')
            while self.pool is not None and len(self.pending) < self.ahead:
                row = self.next_row()
                self.pending.append((row, self.pool.submit(self._encode, row)))
            row, future = self.pending.popleft() if self.pending else (self.next_row(), None)
            self.current = future
        if future is None:  # one callable: encoded right here, on the caller's thread
            return self._settle(row, functools.partial(self._encode, row))
        return self._settle(row, future.result)  # outside the lock: close() can cancel meanwhile

    def _settle(self, row: Any, result: Callable[[], Any]) -> Encoded:
        try:
            return Encoded(row, sample=result())
        except self.rejected as rejection:
            return Encoded(row, rejection=rejection)

    def close(self, timeout: Optional[float] = 5.0) -> None:
        """Cancel the encodes not started and wait up to `timeout` s for the running ones (each holds a template the
        caller may release next). A `next()` blocked on a cancelled encode raises CancelledError."""
        with self.lock:
            self.closed = True
            futures = [future for _, future in self.pending] + ([self.current] if self.current else [])
            self.pending.clear()
        if self.pool is not None:
            running = [future for future in futures if not future.cancel()]  # wait() never counts these as done
            self.pool.shutdown(wait=False, cancel_futures=True)
            wait(running, timeout)


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
