"""Destroy a gloo process group before the interpreter tears down, so a rank that leaves early exits cleanly.

ms-swift never calls `torch.distributed.destroy_process_group()`. With gloo, a rank that reaches interpreter
finalization while its group is still alive can die in C++ (`terminate called without an active exception`,
SIGABRT): gloo's worker threads still hold work objects whose tensors need the GIL that finalization is taking
away (pytorch/pytorch#190489; the atexit fix proposed upstream, #179291, was abandoned). A rank leaves early
whenever rank 0 still has work after training -- the verify_adapter guard reloads the adapter in a fresh
process there -- and torchrun then reports the whole run failed although it trained and saved.

`register()` installs one atexit handler that destroys the default group while the interpreter is still whole.
Only gloo groups: destroying is a local act for gloo, but NCCL's shutdown aborts communicators the peers may
still use, and NCCL has not shown this crash.
"""
from __future__ import annotations

import atexit

_installed = False


def destroy_gloo_group() -> bool:
    """Destroy the default process group if one is initialized on gloo alone; True when it did."""
    try:
        import torch.distributed as dist
    except ImportError:
        return False
    if not (dist.is_available() and dist.is_initialized()):
        return False
    if 'nccl' in str(dist.get_backend()).lower():
        return False
    dist.destroy_process_group()
    return True


def register() -> None:
    """Install the exit handler once per process."""
    global _installed
    if not _installed:
        atexit.register(destroy_gloo_group)
        _installed = True
