"""The training guards for the Unsloth runner's plain loop (no HF Trainer, so no callbacks).

The same checks and report files as the `swift sft` guards (swift_vora/guards/), driven by the loop; with several
replicas (data_parallel.py) each rank checks its own, and the files are per rank where the values are:
- `fingerprint.json` (rank 0): versions, git state, plugin hashes, the recipe and its sha256, the environment;
- `supervision.rank{R}.json`: supervised tokens per micro-batch of that rank; a batch with none stops the run;
- `lora_update.json` (written by rank 0, checked on every rank): every LoRA tensor -- the expert tensors counted
  apart -- changed after the first `SWIFT_VORA_LORA_CHECK_STEPS` steps that really updated (learning rate > 0), or
  the run stops with the names;
- `memory_phases.rank{R}.jsonl`: that rank's GPU memory (or RSS on CPU) at load, per phase of the first steps and
  every `SWIFT_VORA_MEMORY_EVERY` steps; an out-of-memory error is reported with the phase it happened in;
- `verify_adapter.json` (rank 0, once, after the others left): the saved adapter reloaded on the base model in a
  fresh process, tensor by tensor.
The coverage of the samples is rank_samples.py's (the runner's own sampler).
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

from .. import switches
from ..guards.common import GuardError, append_jsonl, logger, write_json
from ..guards.fingerprint import build_fingerprint
from ..guards.lora_update import (
    CHECK_STEPS_ENV,
    AdapterTracker,
    never_changed_error,
    not_checked_note,
    not_reached_note,
    update_summary,
)
from ..guards.memory import EVERY_ENV, FIRST_ENV, is_oom, is_recorded_step, measure
from ..guards.supervision import distribution
from ..guards.verify_adapter import TIMEOUT_ENV as VERIFY_TIMEOUT_ENV
from ..guards.verify_adapter import verify_and_report


class RunnerGuards:
    """One instance per run; every method is cheap except `verify` (a subprocess that reloads the model)."""

    def __init__(self, model, output_dir: str, device=None, rank: int = 0):
        self.output_dir = output_dir
        self.device = device
        self.rank = rank
        self.tracker = AdapterTracker(model)
        self.check_steps = max(1, switches.read(CHECK_STEPS_ENV))
        self.memory_first = switches.read(FIRST_ENV)
        self.memory_every = switches.read(EVERY_ENV)
        self.counted_steps = 0
        self.lora_checked = False
        self.per_batch: List[int] = []
        self.per_sample: List[int] = []
        self.memory_path = os.path.join(output_dir, f'memory_phases.rank{rank}.jsonl')
        self.phase = 'load'

    # ---- start ----------------------------------------------------------------------------------------------
    def start(self, extra: Dict[str, Any]) -> Dict[str, Any]:
        frozen = self.tracker.frozen()
        if frozen:
            raise GuardError('lora_update', f'{len(frozen)} LoRA tensors do not require grad (frozen adapters): '
                                            f'{frozen[:5]}')
        fingerprint = build_fingerprint({'trainer': 'swift_vora.backends.unsloth_runner', **extra})
        if self.rank == 0:
            write_json(os.path.join(self.output_dir, 'fingerprint.json'), fingerprint)
        self.tracker.snapshot()
        self.record('model_loaded')
        return fingerprint

    # ---- memory by phase -------------------------------------------------------------------------------------
    def recording(self, step: int) -> bool:
        return is_recorded_step(step, self.memory_first, self.memory_every)

    def record(self, phase: str, **extra) -> Dict[str, Any]:
        row = {'phase': phase, **measure(self.device), **extra}
        append_jsonl(self.memory_path, row)
        return row

    def enter(self, phase: str, step: int, micro: Optional[int] = None) -> None:
        """Mark the phase the loop is in (for an OOM report), and record memory in the first steps."""
        self.phase = phase
        if self.recording(step):
            self.record(phase, step=step, micro=micro)

    def explain_error(self, error: BaseException, step: int) -> None:
        """Log which phase ran out of memory (the error itself is re-raised by the caller)."""
        if not is_oom(error):
            return
        self.record('oom', step=step, phase_at_error=self.phase)
        logger.error(f'swift-vora memory: OUT OF MEMORY during phase "{self.phase}" at step {step} (memory by phase: '
                     f'{self.memory_path}). Lower video.max_frames, then video.pair_tokens, or data.max_length.')

    # ---- supervision -----------------------------------------------------------------------------------------
    def on_batch(self, supervised_per_sample: List[int], step: int, names: List[str]) -> None:
        total = sum(supervised_per_sample)
        self.per_batch.append(total)
        self.per_sample.extend(supervised_per_sample)
        if total == 0:
            raise GuardError('supervision', f'micro-batch {len(self.per_batch)} (step {step}): no supervised tokens '
                                            f'(all labels are -100) in {names}: the loss would carry no gradient.')

    # ---- LoRA update -----------------------------------------------------------------------------------------
    def after_step(self, step: int, lr: float) -> Optional[Dict[str, Any]]:
        """After an optimizer step: once `check_steps` steps with lr > 0 ran, every adapter tensor must have moved."""
        if lr > 0:
            self.counted_steps += 1
        if self.lora_checked or self.counted_steps < self.check_steps or not len(self.tracker):
            return None
        self.lora_checked = True
        changed = self.tracker.changed_since_baseline()
        names = self.tracker.names
        report = {'steps_counted': self.counted_steps, 'step': step,
                  **update_summary(names, self.tracker.kinds, changed),
                  'source': 'float64 checksums of every LoRA tensor before training and after the counted steps'}
        if self.rank == 0:  # the same report on every rank (the check's all-reduce)
            write_json(os.path.join(self.output_dir, 'lora_update.json'), report)
        message = (f'{report["updated"]} of {report["tensors"]} adapter tensors updated after {self.counted_steps} '
                   f'steps ({report["expert_updated"]} of {report["expert_tensors"]} on the experts)'
                   f'{not_reached_note(report["experts_not_reached"])}')
        if self.rank == 0:
            logger.info(f'swift-vora lora_update: {message}.')
        if report['not_updated']:
            raise never_changed_error(message, report['not_updated'], 'check the freeze settings')
        return report

    def lora_not_checked(self) -> Optional[Dict[str, Any]]:
        """At the end of training, when fewer steps than `check_steps` updated (a short run whose warm-up starts at
        a rate of zero): lora_update.json says the check did not run, as the `swift sft` guard's does, instead of
        leaving no report."""
        if self.lora_checked or not len(self.tracker):
            return None
        report = {'steps_counted': self.counted_steps, 'tensors': len(self.tracker),
                  'check_after_steps': self.check_steps, 'note': not_checked_note(self.counted_steps, self.check_steps)}
        if self.rank == 0:
            write_json(os.path.join(self.output_dir, 'lora_update.json'), report)
            logger.warning(f'swift-vora lora_update: {report["note"]}.')
        return report

    # ---- end -------------------------------------------------------------------------------------------------
    def finish(self) -> Dict[str, Any]:
        report = {'rank': self.rank, 'per_batch': distribution(self.per_batch),
                  'per_sample': distribution(self.per_sample), 'source': 'labels != -100 in the collated batch'}
        write_json(os.path.join(self.output_dir, f'supervision.rank{self.rank}.json'), report)
        self.record('train_end')
        return report

    def verify(self, ckpt: str, base: str) -> Dict[str, Any]:
        """Reload the saved adapter on `base` in a fresh process, compare every tensor (swift-vora verify-adapter)."""
        return verify_and_report(ckpt, base, self.output_dir, switches.read(VERIFY_TIMEOUT_ENV))
