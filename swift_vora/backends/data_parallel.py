"""The Unsloth runner on N GPUs: N replicas of the one-GPU run, one process each, the LoRA gradients all-reduced by
torch's DistributedDataParallel.

How it starts -- the convention of `swift sft` (swift/cli/main.py): `swift-vora train` runs
`python -m swift_vora.backends.unsloth_runner CONFIG.json` with `NPROC_PER_NODE` (on several nodes also `NNODES`,
`NODE_RANK`, `MASTER_ADDR`, `MASTER_PORT`) in its environment. The runner, not yet a worker of a launcher, replaces
itself with `python -m torch.distributed.run <those flags, read by ms-swift's own get_torchrun_args> -m
swift_vora.backends.unsloth_runner CONFIG.json`. Started by torchrun (or any launcher that sets RANK and WORLD_SIZE),
each process is one replica:

- it joins the default process group -- NCCL on GPUs, bound to its GPU (`LOCAL_RANK`), gloo on the CPU -- and, on
  GPUs, a gloo group beside it for the runner's own exchanges of host values (each step's loss and counts, the
  coverage, the adapter digests): they need no GPU and must not queue behind the GPU's work;
- it loads the frozen 16-bit base on its own GPU (with several processes the runner passes
  `device_map={'': 'cuda:LOCAL_RANK'}`, what Unsloth itself picks then, unsloth/models/loader_utils.py
  `prepare_device_map`);
- the model is wrapped in DDP over the trainable LoRA tensors only: the frozen weights and every buffer are left out
  of DDP (`_set_params_and_buffers_to_ignore_for_model`, as Unsloth leaves out its rotary buffers and FP8 weights):
  every rank loads the same checkpoint, and DDP's start-up broadcast would otherwise copy the whole base from rank 0;
  buffers are never broadcast either. Gradients are views into DDP's buckets (no second copy of the adapter's
  gradients), and there is no search for unused parameters each step: every LoRA tensor takes part in every forward
  (the lora_update guard checks that each one moved). With several processes Unsloth checkpoints non-reentrantly
  (loader_utils `vlm_gradient_checkpointing_reentrant`, its answer to DDP's "marked ready twice"); with one it keeps
  its reentrant checkpointing, where each LoRA tensor still gets its gradient once per backward. Neither needs
  `static_graph`;
- the micro-batches before the last of a step run under `no_sync()`: one all-reduce per optimizer step.

One process under torchrun (`--nproc_per_node 1`) is the one-GPU run: it joins its group of one (the launcher's
contract) but is not wrapped in DDP and exchanges nothing -- there is no peer, and DDP would still bucket, reduce and
divide every LoRA gradient each step (measured 4-7 % of the median step on the 8-layer 35B-A3B cut; accelerate does
not wrap a single process either).

Failure, bounded: a rank that raises leaves non-zero, with its rank in its last line and its traceback in torchrun's
summary (`record`); torchrun then stops every other worker of its node (SIGTERM, then SIGKILL) and exits non-zero,
naming the first failed rank. Workers on other nodes stop when their collective fails: at once where the transport
sees the peer go, at the latest after `SWIFT_VORA_DIST_TIMEOUT` seconds (the process group's timeout: NCCL's
watchdog aborts the communicator and ends the process; a gloo collective raises).
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import sys
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Dict, List, Mapping, Optional

TIMEOUT_ENV = 'SWIFT_VORA_DIST_TIMEOUT'
# What makes the runner start torchrun: the variables `swift sft` reads (swift/cli/main.py use_torchrun).
RELAUNCH_ENV = ('NPROC_PER_NODE', 'NNODES')


def is_worker(environ: Optional[Mapping[str, str]] = None) -> bool:
    """This process was started by torchrun (or a launcher like it): env:// rendezvous variables are set."""
    environ = os.environ if environ is None else environ
    return 'RANK' in environ and 'WORLD_SIZE' in environ


def relaunch_wanted(environ: Optional[Mapping[str, str]] = None) -> bool:
    environ = os.environ if environ is None else environ
    return not is_worker(environ) and any(environ.get(k) for k in RELAUNCH_ENV)


def torchrun_argv(module: str, args: List[str]) -> Optional[List[str]]:
    """`python -m torch.distributed.run ... -m module args` when this process should start the workers (NPROC_PER_NODE
    or NNODES set, not a worker yet), else None. The flags are ms-swift's reading of the environment."""
    if not relaunch_wanted():
        return None
    from swift.cli.main import get_torchrun_args
    return [sys.executable, '-m', 'torch.distributed.run', *(get_torchrun_args() or []), '-m', module, *args]


@dataclass
class Replicas:
    """This process's place among the replicas and how it talks to the others. `distributed` False: one process, no
    process group, every method the identity."""
    rank: int = 0
    local_rank: int = 0
    world: int = 1
    distributed: bool = False
    device: Any = None  # torch.device of this replica
    timeout_s: float = 1800.0
    cpu_group: Any = None  # gloo group for host values (None: the default group, gloo on the CPU)
    ddp: Any = field(default=None, repr=False)

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def alone(self) -> bool:
        """No peer to exchange with: one process, with or without a launcher."""
        return self.world == 1

    @property
    def backend(self) -> Optional[str]:
        if not self.distributed:
            return None
        import torch.distributed as dist
        return str(dist.get_backend())

    @classmethod
    def start(cls, timeout_s: float, environ: Optional[Mapping[str, str]] = None) -> 'Replicas':
        """Join the replicas when started by a launcher (NCCL on GPUs, gloo on the CPU); else one process."""
        import torch
        environ = os.environ if environ is None else environ
        cuda = torch.cuda.is_available()
        if not is_worker(environ):
            return cls(device=torch.device('cuda' if cuda else 'cpu'), timeout_s=timeout_s)
        import torch.distributed as dist
        rank, world = int(environ['RANK']), int(environ['WORLD_SIZE'])
        local_rank = int(environ.get('LOCAL_RANK', rank))
        timeout = timedelta(seconds=timeout_s)
        if cuda:
            torch.cuda.set_device(local_rank)  # before anything allocates: each rank on its own GPU
            device = torch.device('cuda', local_rank)
            dist.init_process_group('nccl', timeout=timeout, device_id=device)
            cpu_group = dist.new_group(backend='gloo', timeout=timeout)
        else:
            device = torch.device('cpu')
            dist.init_process_group('gloo', timeout=timeout)
            cpu_group = None  # the default group is gloo already
        return cls(rank=rank, local_rank=local_rank, world=world, distributed=True, device=device,
                   timeout_s=timeout_s, cpu_group=cpu_group)

    # ---- the model -----------------------------------------------------------------------------------------------
    def wrap(self, model):
        """The module the loop calls: `model` in DDP over its trainable tensors (module docstring), or `model` where
        this process is alone."""
        if self.alone:
            return model
        from torch.nn.parallel import DistributedDataParallel as DDP
        ignored = list(getattr(model, '_ddp_params_and_buffers_to_ignore', None) or [])
        ignored += [n for n, p in model.named_parameters() if not p.requires_grad]
        ignored += [n for n, _ in model.named_buffers()]
        DDP._set_params_and_buffers_to_ignore_for_model(model, sorted(set(ignored)))
        self.ddp = DDP(model, device_ids=[self.device.index] if self.device.type == 'cuda' else None,
                       broadcast_buffers=False, gradient_as_bucket_view=True, find_unused_parameters=False)
        return self.ddp

    def accumulating(self, last_micro: bool):
        """No all-reduce on the micro-batches before the step's last (DDP's `no_sync`)."""
        if self.ddp is None or last_micro:
            return contextlib.nullcontext()
        return self.ddp.no_sync()

    # ---- host values ---------------------------------------------------------------------------------------------
    def sum(self, values: List[float]) -> List[float]:
        """Element-wise sum over the replicas (float64, on the gloo group)."""
        if self.alone:
            return list(values)
        import torch
        import torch.distributed as dist
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t, group=self.cpu_group)
        return t.tolist()

    def gather(self, obj: Any) -> List[Any]:
        """Every replica's `obj`, in rank order (on the gloo group)."""
        if self.alone:
            return [obj]
        import torch.distributed as dist
        out: List[Any] = [None] * self.world
        dist.all_gather_object(out, obj, group=self.cpu_group)
        return out

    def leave(self) -> None:
        """After training, on every rank: wait until all have arrived (a rank that does not is named within the
        timeout), then destroy the groups -- no gloo rank exits while a peer is still connected to it
        (swift_vora/process_group_exit.py). Afterwards only rank 0 goes on (the adapter reload), alone."""
        if not self.distributed:
            return
        import torch.distributed as dist
        self.ddp = None  # DDP's reducer holds the group: released before it is destroyed
        dist.monitored_barrier(group=self.cpu_group, timeout=timedelta(seconds=self.timeout_s), wait_all_ranks=True)
        dist.destroy_process_group()
        self.distributed, self.cpu_group = False, None


def adapter_digest(state: Mapping[str, Any]) -> str:
    """sha256 of an adapter's tensors (names, dtypes, shapes, bytes; names sorted): PEFT's state dict of a live
    model (`get_peft_model_state_dict`), or the same tensors read back from the saved adapter_model.safetensors."""
    import torch
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().contiguous()
        h.update(f'{name}|{t.dtype}|{tuple(t.shape)}|'.encode())
        h.update(t.reshape(-1).view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()


def replicas_agree(digests: List[str]) -> Dict[str, Any]:
    """The adapter digest of every rank: one value, or the ranks that differ from rank 0's."""
    differ = [r for r, d in enumerate(digests) if d != digests[0]]
    return {'adapter_sha256': digests, 'identical': not differ, 'differ_from_rank0': differ}
