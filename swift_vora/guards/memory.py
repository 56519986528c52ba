"""Guard `memory`: memory by phase, and an out-of-memory error that says where it happened.

Each rank appends to `OUTPUT_DIR/memory_phases.rank{R}.jsonl` one line per phase: `model_loaded`
(trainer built), `train_begin` (after DeepSpeed/optimizer setup), and for recorded steps `batch_arrived`,
`forward` (forward hook on the model), `backward` (the training step returned) and `optimizer_step`.
Recorded steps: the first `SWIFT_VORA_MEMORY_FIRST` optimizer steps (default 3), then every
`SWIFT_VORA_MEMORY_EVERY` steps (default 50; 0 = only the first ones). On CUDA a line carries allocated /
reserved now and their peaks since the start (`source: "cuda.max_memory_allocated"`); the peaks are not
reset, so ms-swift's own `memory(GiB)` log keeps its meaning. Without CUDA it carries the process's host RSS
and its peak (`source: "rss"`). Reading the allocator's counters does not synchronise the device.

On `torch.OutOfMemoryError` in a training step it logs the phase, the batch (sample ids, input shape,
tokens, video frames) and the last measurements, then re-raises the original error.
"""
from __future__ import annotations

import collections
import os
import resource
from typing import Any, Deque, Dict, Optional

from swift.callbacks import TrainerCallback

from .. import switches
from .common import append_jsonl, get_tap, logger, now, output_dir, rank, unwrap_model

NAME = 'memory'
FIRST_ENV = 'SWIFT_VORA_MEMORY_FIRST'
EVERY_ENV = 'SWIFT_VORA_MEMORY_EVERY'
GIB = 1024**3


def _rss_bytes() -> int:
    try:
        with open('/proc/self/statm') as f:
            return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')
    except (OSError, ValueError, IndexError):
        import psutil
        return psutil.Process().memory_info().rss


def measure(device=None) -> Dict[str, Any]:
    import torch
    if torch.cuda.is_available() and (device is None or getattr(device, 'type', 'cuda') == 'cuda'):
        return {'source': 'cuda.max_memory_allocated',
                'allocated_gib': round(torch.cuda.memory_allocated(device) / GIB, 4),
                'reserved_gib': round(torch.cuda.memory_reserved(device) / GIB, 4),
                'peak_allocated_gib': round(torch.cuda.max_memory_allocated(device) / GIB, 4),
                'peak_reserved_gib': round(torch.cuda.max_memory_reserved(device) / GIB, 4)}
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {'source': 'rss', 'rss_gib': round(_rss_bytes() / GIB, 4), 'peak_rss_gib': round(peak_kib / 1024**2, 4)}


def is_recorded_step(step: int, first: int, every: int) -> bool:
    """Steps with memory rows: the first `first` (SWIFT_VORA_MEMORY_FIRST), then every `every`-th (0: none)."""
    return step < first or (every > 0 and step % every == 0)


def is_oom(error: BaseException) -> bool:
    import torch
    oom_type = getattr(torch, 'OutOfMemoryError', None) or getattr(torch.cuda, 'OutOfMemoryError', None)
    if oom_type is not None and isinstance(error, oom_type):
        return True
    return isinstance(error, RuntimeError) and 'out of memory' in str(error).lower()


class MemoryGuard(TrainerCallback):

    def __init__(self, args, trainer):
        super().__init__(args, trainer)
        self.first = switches.read(FIRST_ENV)
        self.every = switches.read(EVERY_ENV)
        self.recording = False
        self.last: Deque[Dict[str, Any]] = collections.deque(maxlen=8)
        self.path: Optional[str] = None
        self.hook = None
        self.step = 0  # optimizer steps done

    def _device(self):
        return getattr(self.trainer.args, 'device', None)

    def record(self, phase: str, **extra) -> Dict[str, Any]:
        row = {'time': now(), 'rank': rank(), 'phase': phase, 'global_step': self.trainer.state.global_step,
               **measure(self._device()), **extra}
        self.last.append(row)
        if self.path is None:
            self.path = os.path.join(output_dir(self.trainer), f'memory_phases.rank{rank()}.jsonl')
        append_jsonl(self.path, row)
        return row

    def _should_record(self, step: int) -> bool:
        return is_recorded_step(step, self.first, self.every)

    # callbacks -------------------------------------------------------------------------------------------
    def on_init_end(self, args, state, control, **kwargs):
        get_tap(self.trainer).add(self)
        self.record('model_loaded')

    def on_train_begin(self, args, state, control, **kwargs):
        self.record('train_begin')
        model = unwrap_model(self.trainer)
        guard = self

        def after_forward(module, inputs, output):
            tap = getattr(guard.trainer, '_swift_vora_tap', None)
            if tap is not None:
                tap.phase = 'backward'
            if guard.recording:
                guard.record('forward', micro_step=tap.micro_step if tap else None)

        self.hook = model.register_forward_hook(after_forward)

    def on_step_begin(self, args, state, control, **kwargs):
        self.recording = self._should_record(state.global_step)

    def on_batch(self, meta, inputs) -> None:
        if self.recording:
            self.record('batch_arrived', micro_step=self.trainer._swift_vora_tap.micro_step,
                        batch=_batch_summary(meta))

    def on_backward_end(self, meta) -> None:
        if self.recording:
            self.record('backward', micro_step=self.trainer._swift_vora_tap.micro_step)

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        tap = getattr(self.trainer, '_swift_vora_tap', None)
        if tap is not None:
            tap.phase = 'optimizer_step'

    def on_optimizer_step(self, args, state, control, **kwargs):
        if self.recording:
            self.record('optimizer_step')

    def on_train_end(self, args, state, control, **kwargs):
        if self.hook is not None:
            self.hook.remove()
            self.hook = None
        self.record('train_end')

    def on_step_error(self, error, phase, meta) -> None:
        if not is_oom(error):
            return
        try:
            current = measure(self._device())
        except Exception as measure_error:  # noqa: BLE001
            current = {'error': repr(measure_error)}
        lines = [f'swift-vora memory: OUT OF MEMORY on rank {rank()} during phase "{phase}" at global step '
                 f'{self.trainer.state.global_step}.',
                 f'  batch: {_batch_summary(meta)}',
                 f'  now: {current}']
        for row in list(self.last)[-5:]:
            lines.append(f'  earlier: {row}')
        lines.append('  (memory by phase: ' + (self.path or 'memory_phases.rank*.jsonl') + '; lower the video budget '
                     '(frames, pair tokens), max_length or the micro-batch, or use ZeRO-3 / offload)')
        logger.error('\n'.join(lines))
        try:
            self.record('oom', phase_at_error=phase, batch=_batch_summary(meta))
        except Exception:  # noqa: BLE001 -- never hide the original error
            pass


def _batch_summary(meta: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    if not meta:
        return {}
    keys = ('sample_ids', 'input_shape', 'tokens', 'supervised', 'video_frames', 'video_patches', 'images')
    return {k: meta[k] for k in keys if k in meta}
