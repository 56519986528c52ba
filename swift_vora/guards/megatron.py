"""The guards that run under `megatron sft`: Megatron-SWIFT callbacks around the same checks and report files.

Megatron-SWIFT (swift/megatron/trainers/base.py) builds `megatron_callbacks_map[name](trainer)` for each name in
`--callbacks` and calls `on_train_begin`, `on_step_begin`, `on_step_end` (after `state.iteration += 1`),
`on_log`, `on_save` and `on_train_end` without arguments beyond `logs` / `output_dir`. The classes here only read
`trainer.args.output_dir`, `trainer.state.iteration`, `trainer.unwrapped_models` (the model chunks),
`trainer.optimizer` and `trainer.opt_param_scheduler`; they do not import megatron, so they are tested on CPU
with a stand-in trainer. The events a guard does not handle are its base's no-ops
(backends/megatron_callback.py); swift_vora/swift_registry.py mixes Megatron-SWIFT's `MegatronCallback` in, for
events a later ms-swift adds, when it registers them inside a `megatron sft` process.

- fingerprint: `fingerprint.json` when the trainer is built (guards/fingerprint.py's record).
- memory: on CUDA, `memory_phases.rank{R}.jsonl` rows (guards/memory.py's measurement) when the trainer is built,
  at train begin/end, and at step begin/end of the first `SWIFT_VORA_MEMORY_FIRST` steps and every
  `SWIFT_VORA_MEMORY_EVERY`. Without CUDA it records nothing. With the phases, the first step's time and whether the
  kernel caches were warm (backends/kernel_cache.py `FirstStepClock`): one log line and, on rank 0,
  `first_step.json` -- as the Unsloth runner says it (call g's Megatron first steps: 211, 110 and 32 s as the caches
  warmed, and nothing said which).
- lora_update: float64 checksums of every trainable LoRA tensor of every model chunk at train begin; after
  `SWIFT_VORA_LORA_CHECK_STEPS` steps that updated (learning rate > 0 -- Megatron's warm-up starts at 0 -- and
  the scheduler advanced, i.e. the step was not skipped) every one must have changed -- an expert's, unless no
  token reached it while another expert of its layer moved (guards/lora_update.py) -- or the run stops naming
  them. Ranks hold different tensors (pipeline stages, expert ranks), so they combine per-tensor flags by name
  with one object all-gather, the name qualified by the pipeline stage and, for expert tensors, the expert rank;
  a tensor counts as updated if any rank's copy changed (tensor-parallel shards; with a distributed optimizer
  each rank updates its own shard first).
  Under full SFT (`--tuner_type full`, megatron_ep_full) the same guard checks the weights instead (`mode: full` in
  lora_update.json): float64 checksums of every trainable and every frozen parameter at train begin; after the
  counted steps, per part of the model (WEIGHT_PARTS: vision tower, router, experts, shared expert, attention and
  Gated DeltaNet, embedding, LM head, the rest) how many trainable tensors changed. The run stops when a frozen
  tensor changed (the vision tower under --freeze_vit, the router under megatron.freeze_router) or when no trainable
  tensor of a part changed at all; a single unchanged tensor is listed (`unchanged`), not failed -- the weights are
  bf16 copies of the optimizer's fp32 master, and an update below half a bf16 step leaves one as it was.
"""
from __future__ import annotations

import collections
import os
from typing import Any, Deque, Dict, List, Optional, Tuple

from .. import switches
from ..backends.kernel_cache import FirstStepClock, describe
from ..backends.megatron_callback import MegatronTrainerCallback
from .common import GuardError, all_gather_objects, append_jsonl, logger, now, rank, world_size, write_json
from .fingerprint import build_fingerprint
from .lora_update import (
    CHECK_STEPS_ENV,
    NAME,
    AdapterTracker,
    adapter_kind,
    is_expert_tensor,
    never_changed_error,
    not_checked_note,
    not_reached_note,
    split_unchanged,
    update_summary,
)
from .memory import EVERY_ENV, FIRST_ENV, is_recorded_step, measure


class MegatronGuard(MegatronTrainerCallback):
    """A guard inside `megatron sft`: where it writes and the iteration it is at."""

    def output_dir(self) -> str:
        return getattr(self.trainer.args, 'output_dir', None) or '.'

    def iteration(self) -> int:
        return int(self.trainer.state.iteration)


class MegatronFingerprintGuard(MegatronGuard):
    """`fingerprint.json` once the trainer is built (Megatron-SWIFT builds the callbacks at the end of __init__)."""

    def __init__(self, trainer):
        super().__init__(trainer)
        args = trainer.args
        fp = build_fingerprint({'world_size': world_size(), 'output_dir': self.output_dir(),
                                'trainer': type(trainer).__name__, 'tuner_type': getattr(args, 'tuner_type', None),
                                'parallel': {key: getattr(args, key, None) for key in (
                                    'tensor_model_parallel_size', 'pipeline_model_parallel_size',
                                    'expert_model_parallel_size', 'context_parallel_size')}})
        git = fp['swift_vora']['git']
        logger.info(f'swift-vora fingerprint: python {fp["python"]["version"]}; ms-swift {fp["packages"]["ms-swift"]}, '
                    f'megatron-core {fp["packages"]["megatron-core"]}, transformer-engine '
                    f'{fp["packages"]["transformer-engine"]}; swift_vora commit {(git.get("commit") or "none")[:12]}'
                    f'{" DIRTY" if git.get("dirty") else ""}; recipe {fp["recipe"]["path"]}.')
        if rank() == 0:
            path = os.path.join(self.output_dir(), 'fingerprint.json')
            write_json(path, fp)
            logger.info(f'swift-vora fingerprint: written to {path}')


class MegatronMemoryGuard(MegatronGuard):
    """Allocator counters by phase, on CUDA only (reading them does not synchronise the device)."""

    def __init__(self, trainer):
        super().__init__(trainer)
        import torch
        self.active = torch.cuda.is_available()
        self.first = switches.read(FIRST_ENV)
        self.every = switches.read(EVERY_ENV)
        self.recording = False
        self.last: Deque[Dict[str, Any]] = collections.deque(maxlen=8)
        self.path = os.path.join(self.output_dir(), f'memory_phases.rank{rank()}.jsonl')
        self.clock = FirstStepClock()
        self.record('model_loaded')

    def record(self, phase: str) -> Optional[Dict[str, Any]]:
        if not self.active:
            return None
        row = {'time': now(), 'rank': rank(), 'phase': phase, 'global_step': self.iteration(), **measure()}
        self.last.append(row)
        append_jsonl(self.path, row)
        return row

    def on_train_begin(self):
        self.clock.train_begin()
        self.record('train_begin')

    def on_step_begin(self):
        self.clock.step_begin()
        self.recording = is_recorded_step(self.iteration(), self.first, self.every)
        if self.recording:
            self.record('step_begin')

    def on_step_end(self):
        import torch
        # the step's queued kernels are in its time (a process that never used the device has none)
        first = self.clock.step_end(torch.cuda.synchronize if self.active and torch.cuda.is_initialized() else None)
        if first is not None:
            logger.info(f'swift-vora: {describe(first)}')
            if rank() == 0:
                write_json(os.path.join(self.output_dir(), 'first_step.json'), first)
        if self.recording:
            self.record('step_end')

    def on_train_end(self):
        self.record('train_end')


def _parallel_ranks() -> Tuple[int, int, int, int]:
    """(pipeline rank, pipeline size, expert rank, expert size) from megatron-core, (0, 1, 0, 1) outside it."""
    try:
        from megatron.core import parallel_state as mpu
    except ImportError:
        return 0, 1, 0, 1
    if not mpu.model_parallel_is_initialized():
        return 0, 1, 0, 1
    return (mpu.get_pipeline_model_parallel_rank(), mpu.get_pipeline_model_parallel_world_size(),
            mpu.get_expert_model_parallel_rank(), mpu.get_expert_model_parallel_world_size())


def qualified_names(chunks: List[List[str]], ranks: Tuple[int, int, int, int]) -> List[str]:
    """One global name per tensor: names repeat across pipeline stages, model chunks and expert ranks (each has
    its own `decoder.layers.0`, `experts...weight0`), so those are prefixed when there is more than one."""
    pp_rank, pp_size, ep_rank, ep_size = ranks
    out = []
    for index, names in enumerate(chunks):
        for name in names:
            prefix = f'pp{pp_rank}/' if pp_size > 1 else ''
            prefix += f'chunk{index}/' if len(chunks) > 1 else ''
            prefix += f'ep{ep_rank}/' if ep_size > 1 and is_expert_tensor(name) else ''
            out.append(prefix + name)
    return out


def current_lr(trainer) -> float:
    """The learning rate of the coming step (Megatron's scheduler set it after the previous update)."""
    reported = getattr(trainer, '_get_reported_learning_rate', None)
    if callable(reported):
        lr = reported()
        if lr is not None:
            return float(lr)
    groups = getattr(getattr(trainer, 'optimizer', None), 'param_groups', None) or [{}]
    return max(float(g.get('lr', 0.0) or 0.0) for g in groups)


def scheduler_steps(trainer) -> Optional[int]:
    """Megatron's scheduler advances only after a successful update (a skipped step leaves it)."""
    steps = getattr(getattr(trainer, 'opt_param_scheduler', None), 'num_steps', None)
    return None if steps is None else int(steps)


# Full SFT: the part of the model a megatron-core / mcore-bridge parameter belongs to, first match wins
# (`visual.visual.blocks.0...`, `language_model.decoder.layers.3.mlp.router.weight`,
# `...mlp.experts.linear_fc1.weight17`, `...mlp.shared_experts.linear_fc2.weight`, `...self_attention.linear_qkv.weight`
# -- Gated DeltaNet layers too --, `language_model.embedding.word_embeddings.weight`,
# `language_model.output_layer.weight`); the rest: norms and others.
WEIGHT_PARTS = (('vision_tower', ('visual.', )), ('router', ('.mlp.router.', )), ('experts', ('.experts.', )),
                ('shared_expert', ('.shared_experts.', )), ('attention', ('.self_attention.', )),
                ('embedding', ('embedding.', )), ('output_layer', ('output_layer.', )))


def weight_part(name: str) -> str:
    for part, keys in WEIGHT_PARTS:
        if any(key in name for key in keys):
            return part
    return 'other'


def full_update_summary(names: List[str], changed: List[bool], frozen_names: List[str],
                        frozen_changed: List[bool]) -> Dict[str, Any]:
    """lora_update.json's counts under full SFT: per part, the trainable tensors that changed and the frozen ones
    that did (must be none); `failures`, what stops the run (a frozen tensor changed, or a part none of whose
    trainable tensors changed); `unchanged`, single trainable tensors that did not change (listed, not failed)."""
    parts: Dict[str, Dict[str, int]] = {}

    def part(name: str) -> Dict[str, int]:
        return parts.setdefault(weight_part(name), {'trainable': 0, 'updated': 0, 'frozen': 0, 'frozen_changed': 0})

    for name, c in zip(names, changed):
        row = part(name)
        row['trainable'] += 1
        row['updated'] += int(c)
    for name, c in zip(frozen_names, frozen_changed):
        row = part(name)
        row['frozen'] += 1
        row['frozen_changed'] += int(c)
    unchanged, not_reached = split_unchanged(names, changed)
    moved = [n for n, c in zip(frozen_names, frozen_changed) if c]
    failures = []
    if moved:
        failures.append(f'{len(moved)} frozen tensor(s) changed: {", ".join(moved[:5])}'
                        + (f' and {len(moved) - 5} more' if len(moved) > 5 else ''))
    failures += [f'no trainable {name} tensor changed (of {row["trainable"]})' for name, row in sorted(parts.items())
                 if row['trainable'] and not row['updated']]
    expert = [i for i, n in enumerate(names) if is_expert_tensor(n)]
    return {'mode': 'full', 'tensors': len(names), 'updated': sum(1 for c in changed if c),
            'expert_tensors': len(expert), 'expert_updated': sum(1 for i in expert if changed[i]),
            'parts': dict(sorted(parts.items())), 'unchanged': unchanged, 'experts_not_reached': len(not_reached),
            'frozen_tensors': len(frozen_names), 'frozen_changed': moved, 'failures': failures}


class MegatronLoraUpdateGuard(MegatronGuard):

    def __init__(self, trainer):
        super().__init__(trainer)
        self.check_steps = max(1, switches.read(CHECK_STEPS_ENV))
        self.tracker: Optional[AdapterTracker] = None
        self.names: List[str] = []
        self.counted = 0
        self.step_lr = 0.0
        self.step_scheduler: Optional[int] = None
        self.report: Dict[str, Any] = {}
        self.done = False
        # full SFT: every weight is checked, the frozen ones too (they must not move)
        self.full = getattr(trainer.args, 'tuner_type', 'lora') == 'full'
        self.frozen_tracker: Optional[AdapterTracker] = None
        self.frozen_names: List[str] = []

    def on_train_begin(self):
        chunks = list(self.trainer.unwrapped_models)
        if self.full:
            return self._begin_full(chunks)
        pairs, frozen, per_chunk = [], [], []
        for chunk in chunks:
            names = []
            for name, param in chunk.named_parameters():
                if adapter_kind(name) is None:  # lora_A / lora_B (grouped experts: ...lora_A.default.weight0)
                    continue
                if not param.requires_grad:  # tracked too: a frozen adapter trains nothing, and the check says so
                    frozen.append(name)
                pairs.append((name, param))
                names.append(name)
            per_chunk.append(names)
        self.tracker = AdapterTracker(named_parameters=pairs)
        self.names = qualified_names(per_chunk, _parallel_ranks())
        self.tracker.snapshot()
        self.report = {'tensors_here': len(self.tracker), 'check_after_steps': self.check_steps,
                       'requires_grad_false': frozen, 'start_iteration': self.iteration(), 'steps': []}
        if frozen:
            logger.warning(f'swift-vora lora_update: {len(frozen)} LoRA tensor(s) have requires_grad=False: they '
                           f'will not train, and the check after {self.check_steps} step(s) stops the run: '
                           f'{frozen[:10]}')
        # every rank takes part in the all-gather at the check, even one without adapter tensors
        logger.info(f'swift-vora lora_update: {len(self.tracker)} trainable LoRA tensors on this rank; checked after '
                    f'{self.check_steps} optimizer step(s) that updated.')

    def _begin_full(self, chunks) -> None:
        trainable, frozen, trainable_names, frozen_names = [], [], [], []
        for chunk in chunks:
            t_names, f_names = [], []
            for name, param in chunk.named_parameters():
                (trainable if param.requires_grad else frozen).append((name, param))
                (t_names if param.requires_grad else f_names).append(name)
            trainable_names.append(t_names)
            frozen_names.append(f_names)
        self.tracker = AdapterTracker(named_parameters=trainable, kind_of=weight_part)
        self.frozen_tracker = AdapterTracker(named_parameters=frozen, kind_of=weight_part)
        ranks = _parallel_ranks()
        self.names = qualified_names(trainable_names, ranks)
        self.frozen_names = qualified_names(frozen_names, ranks)
        self.tracker.snapshot()
        self.frozen_tracker.snapshot()
        self.report = {'mode': 'full', 'tensors_here': len(self.tracker), 'frozen_here': len(self.frozen_tracker),
                       'check_after_steps': self.check_steps, 'start_iteration': self.iteration(), 'steps': []}
        logger.info(f'swift-vora lora_update (full SFT): {len(self.tracker)} trainable and {len(self.frozen_tracker)} '
                    f'frozen tensors on this rank; checked after {self.check_steps} optimizer step(s) that updated.')

    def on_step_begin(self):
        if not self.done and self.tracker is not None:
            self.step_lr = current_lr(self.trainer)
            self.step_scheduler = scheduler_steps(self.trainer)

    def on_step_end(self):
        if self.done or self.tracker is None:
            return
        after = scheduler_steps(self.trainer)
        applied = self.step_scheduler is None or after is None or after != self.step_scheduler
        if self.step_lr <= 0 or not applied:
            self.report['steps'].append({'iteration': self.iteration(), 'lr': self.step_lr, 'applied': applied,
                                         'counted': False})
            return
        self.counted += 1
        if self.counted < self.check_steps:
            return
        self.done = True
        self.check()

    def check(self) -> Dict[str, Any]:
        if self.full:
            return self.check_full()
        here = dict(zip(self.names, self.tracker.changed_here()))
        merged: Dict[str, bool] = {}
        for flags in all_gather_objects(here):  # one collective, at the check step only
            for name, changed in flags.items():
                merged[name] = merged.get(name, False) or changed
        names = sorted(merged)
        kinds = [adapter_kind(n) for n in names]
        summary = update_summary(names, kinds, [merged[n] for n in names])
        self.report.update({'iteration': self.iteration(), 'steps_counted': self.counted, **summary,
                            'ranks': world_size(),
                            'criterion': 'float64 sum/L1/L2^2 of each trainable LoRA tensor, changed on any rank'})
        self._write()
        message = (f'{summary["updated"]} of {summary["tensors"]} LoRA tensors updated after {self.counted} optimizer '
                   f'steps ({summary["expert_updated"]} of {summary["expert_tensors"]} on the experts)'
                   f'{not_reached_note(summary["experts_not_reached"])}')
        stale = summary['not_updated']
        if stale:
            frozen = set(self.report.get('requires_grad_false') or [])
            raise never_changed_error(message, stale, 'check the freeze settings',
                                      frozen={n for n in stale if n.rsplit('/', 1)[-1] in frozen})
        logger.info(f'swift-vora lora_update: {message}.')
        return self.report

    def check_full(self) -> Dict[str, Any]:
        here = (dict(zip(self.names, self.tracker.changed_here())),
                dict(zip(self.frozen_names, self.frozen_tracker.changed_here())))
        merged: Dict[str, bool] = {}
        merged_frozen: Dict[str, bool] = {}
        for flags, frozen_flags in all_gather_objects(here):  # one collective, at the check step only
            for into, got in ((merged, flags), (merged_frozen, frozen_flags)):
                for name, changed in got.items():
                    into[name] = into.get(name, False) or changed
        names, frozen = sorted(merged), sorted(merged_frozen)
        summary = full_update_summary(names, [merged[n] for n in names], frozen, [merged_frozen[n] for n in frozen])
        self.report.update({'iteration': self.iteration(), 'steps_counted': self.counted, **summary,
                            'ranks': world_size(),
                            'criterion': 'float64 sum/L1/L2^2 of each parameter (bf16 copy), changed on any rank'})
        self._write()
        parts = ', '.join(f'{p} {r["updated"]}/{r["trainable"]}' for p, r in summary['parts'].items() if r['trainable'])
        message = (f'{summary["updated"]} of {summary["tensors"]} trainable tensors changed after {self.counted} '
                   f'optimizer steps ({parts}); {summary["frozen_tensors"]} frozen, '
                   f'{len(summary["frozen_changed"])} of them changed'
                   f'{not_reached_note(summary["experts_not_reached"])}')
        if summary['failures']:
            raise GuardError(NAME, f'{message}. ' + '; '.join(summary['failures']) + '. Check the freeze settings '
                             '(train.freeze_vit, megatron.freeze_router) and the learning rate')
        if summary['unchanged']:
            logger.warning(f'swift-vora lora_update (full SFT): {len(summary["unchanged"])} trainable tensor(s) '
                           f'unchanged in bf16 (an update below half a bf16 step of every element): '
                           f'{summary["unchanged"][:5]}')
        logger.info(f'swift-vora lora_update (full SFT): {message}.')
        return self.report

    def on_train_end(self):
        if self.tracker is not None and not self.done:
            self.report['note'] = not_checked_note(self.counted, self.check_steps)
            logger.warning(f'swift-vora lora_update: {self.report["note"]}.')
            self._write()

    def _write(self) -> None:
        if rank() == 0:
            write_json(os.path.join(self.output_dir(), 'lora_update.json'), self.report)

