"""Gloo ranks that finished training leave together, so none dies in gloo's teardown while a peer still works.

ms-swift never calls `torch.distributed.destroy_process_group()`. With gloo, a rank that reaches interpreter
finalization while a peer is still connected can die in C++ (`terminate called without an active exception`,
SIGABRT; pytorch/pytorch#190489, the atexit fix proposed upstream, #179291, was abandoned). A rank finishes early
whenever rank 0 still has work after training -- the verify_adapter guard reloads the adapter in a fresh process
there -- and torchrun then reports the whole run failed although it trained and saved.

Destroying the group at exit is not enough inside `swift sft`: something there keeps the group's C++ object alive
after `destroy_process_group()` (its worker threads were still running at exit, measured), so the teardown race
stays. What does close it is leaving together (benchmarks/gloo_exit.py, the `held_*` settings). So the atexit
handler installed by `register()`:

1. if this process finished training (`mark_finished()`, called at train end by `TrainEnd`), waits at a
   `monitored_barrier` until every rank has reached its exit too (bounded by `EXIT_BARRIER_TIMEOUT`; a rank that
   failed is reported by name, and torchrun reports the failure itself);
2. destroys the group, which frees it wherever nothing else holds it.

A rank that did not finish training (an exception, an interrupt) does not wait: its peers may be inside a
collective that a barrier would falsely match. Only gloo groups: NCCL's shutdown aborts communicators the peers
may still use, and NCCL has not shown this crash.
"""
from __future__ import annotations

import atexit
import functools
import logging
from datetime import timedelta

logger = logging.getLogger('swift_vora')

# Long enough for rank 0's post-training guards (the adapter reload) on a CPU run; a rank that never arrives is named.
EXIT_BARRIER_TIMEOUT = timedelta(minutes=30)

_installed = False
_finished = False


def mark_finished() -> None:
    """This process finished training: at exit it waits for its peers instead of leaving alone."""
    global _finished
    _finished = True


def _gloo_group():
    """torch.distributed when a default group is initialized on gloo alone, else None."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    if not (dist.is_available() and dist.is_initialized()):
        return None
    if 'nccl' in str(dist.get_backend()).lower():
        return None
    return dist


def _leave_together(dist, timeout: timedelta = EXIT_BARRIER_TIMEOUT) -> bool:
    """Wait until every rank of the gloo group (`dist`, from _gloo_group) reaches this point; True when they did."""
    if dist.get_world_size() < 2:
        return False
    try:
        dist.monitored_barrier(timeout=timeout)
    except RuntimeError as exc:  # c10d's DistBackendError is one; the message names the ranks that did not arrive
        logger.warning(f'swift-vora: rank {dist.get_rank()} left without its peers: {exc}')
        return False
    return True


def destroy_gloo_group() -> bool:
    """At exit: leave together if training finished, then destroy a gloo default group; True when it destroyed."""
    dist = _gloo_group()
    if dist is None:
        return False
    if _finished:
        _leave_together(dist)
    dist.destroy_process_group()
    return True


def register() -> None:
    """Install the exit handler once per process."""
    global _installed
    if not _installed:
        atexit.register(destroy_gloo_group)
        _installed = True


@functools.lru_cache(maxsize=None)
def _train_end_class():
    from transformers import TrainerCallback  # imported here: the benchmark's ranks use this module without it

    class TrainEnd(TrainerCallback):
        """Calls `mark_finished()` when training ends on this rank."""

        def on_train_end(self, args, state, control, **kwargs):
            mark_finished()

    return TrainEnd


def train_end_callback():
    """A transformers `TrainerCallback` (`TrainEnd`) that calls `mark_finished()` at train end."""
    return _train_end_class()()
