"""When the Unsloth runner learns that an optimizer step has finished on the GPU: after each step, or one step late.

`each` (the default) synchronises the device after every step and reads the loss then: the step times are GPU times,
but the next step's host work -- the loss's read-back, logging, the next batch's hand-over, the vision tower's
preamble -- starts on an empty GPU queue. Call k (docs/runs/h200-moe-full/README.md) measured 95-148 ms a step of GPU
idle at full depth, all of it around the step boundary. `lagged` (SWIFT_VORA_STEP_SYNC=lagged, CUDA only) keeps one
step in flight: the loss is copied to pinned host memory behind the step's kernels with an event after it, and
step N is recorded (logged, checked for a finite loss) once step N+1 has been launched and N's event has fired.
Steps whose state is read -- the first (its time is the first-step report), the last, every save, the profiled
one -- are synchronised as before. Every step's time is its end on the GPU: a synchronised step's is the host's
clock then; a held step's is the last synchronisation's plus the GPU time between their events, and steps drained
together by a synchronisation are timed back from it the same way. The host's clock when it reads a held step is not
its end: it reads step N only after launching N+1, and where launching takes most of a step (call l of #30, full
depth, host-bound) that read lands just before N+1 ends, so call l's last pair read as 2.5 s + 0.09 s and its first
measured step absorbed the missing one (benchmarks/results/moe-h200-full-l-partial.json, fixed after it).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from .. import switches

ENV = 'SWIFT_VORA_STEP_SYNC'


def lagged_requested(environ=None) -> bool:
    return switches.read(ENV, environ) == 'lagged'


@dataclass
class StepEnd:
    step: int
    loss: float
    info: Dict[str, Any] = field(default_factory=dict)
    at: float = 0.0  # the step's end on the GPU, on the host's clock (time.time())


class StepEnds:
    """`end(step, loss, info, hold)` after each optimizer step returns the steps now known finished, in order.

    `loss`: a float (each) or a device scalar (lagged). `hold`: the step may stay in flight (lagged only).
    `sync()` waits for the device; `marker(loss)` enqueues the loss's copy to the host and returns a mark:
    `mark.wait()` waits for it and gives the float, `mark.seconds_until(later)` the device time between two marks."""

    def __init__(self, lagged: bool, sync: Callable[[], None], marker: Callable[[Any], Any],
                 clock: Callable[[], float] = time.time):
        self.lagged, self.sync, self.marker, self.clock = lagged, sync, marker, clock
        self.pending: List[Tuple[int, Any, Dict[str, Any]]] = []
        self.held = 0
        self.anchor: Optional[Tuple[float, Any]] = None  # (host clock, mark) at the newest synchronisation

    def _gpu_end(self, mark) -> float:
        """A held step's end: the last synchronisation's time plus the GPU time from its event to this one."""
        if self.anchor is None:  # the runner synchronises its first step; a caller that does not gets the host clock
            return self.clock()
        at, anchor_mark = self.anchor
        return at + anchor_mark.seconds_until(mark)

    def end(self, step: int, loss, info: Dict[str, Any], hold: bool) -> List[StepEnd]:
        if not self.lagged:
            self.sync()
            return [StepEnd(step, float(loss), info, self.clock())]
        self.pending.append((step, self.marker(loss), info))
        if hold:
            self.held += 1
            done = []
            while len(self.pending) > 1:
                step_done, mark, step_info = self.pending.pop(0)
                loss_done = mark.wait()
                done.append(StepEnd(step_done, loss_done, step_info, self._gpu_end(mark)))
            return done
        self.sync()
        now, newest = self.clock(), self.pending[-1][1]
        self.anchor = (now, newest)
        done = [StepEnd(s, mark.wait(), i, now - mark.seconds_until(newest)) for s, mark, i in self.pending]
        self.pending = []
        return done


class _CudaMark:
    def __init__(self, torch, loss):
        self.host = torch.empty((), dtype=loss.dtype, pin_memory=True)
        self.host.copy_(loss, non_blocking=True)
        self.event = torch.cuda.Event(enable_timing=True)
        self.event.record()

    def wait(self) -> float:
        self.event.synchronize()
        return float(self.host)

    def seconds_until(self, later: '_CudaMark') -> float:
        return 0.0 if later is self else self.event.elapsed_time(later.event) / 1000.0


def cuda_marker(torch) -> Callable[[Any], _CudaMark]:
    """The loss copied into pinned host memory behind the step's kernels, and a timing event recorded after it."""
    return lambda loss: _CudaMark(torch, loss)
