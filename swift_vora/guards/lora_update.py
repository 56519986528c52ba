"""Guard `lora_update`: every LoRA adapter tensor is actually trained.

PEFT initialises `lora_B` to zero, so on the first optimizer step `lora_A` gets a zero gradient (expected) and
only `lora_B` moves; from the second step on, `lora_A` moves too. A tensor that never moves means a frozen
adapter: `requires_grad=False` (e.g. a module wrongly marked as a ZeRO-3 leaf, or a freeze pattern that
matched the adapter), a module whose output never reaches the loss, or gradients lost on the way.

Criterion (cheap, works under ZeRO-3): for every adapter tensor keep three float64 numbers of the data this
rank holds -- sum, L1 norm and squared L2 norm (under ZeRO-3: of its partition `ds_tensor`, so nothing is
gathered) -- computed on the device, stacked, and compared after the step. Any element that changes by at
least one unit in the last place changes at least one of these for all practical sizes (float64 accumulation
error is far below a float32/bfloat16 ulp), while the memory is 3 numbers per tensor, not a copy. Ranks
combine their per-tensor "changed" flags with one all-reduce (max), so a tensor counts as updated if any
partition changed. Weight decay cannot fake an update of `lora_B`: it starts at zero, and decay keeps zero at
zero; `lora_A` only gets a gradient through a non-zero `lora_B`.

Steps count only when they really updated: the learning rate was > 0 (warm-up can start at 0) and the step
was not skipped (fp16 overflow). After the first counted step the `lora_B` count is logged; after
`SWIFT_VORA_LORA_CHECK_STEPS` counted steps (default 2) every adapter tensor must have changed since the
start, or the run stops with the names.

MoE experts are judged by their layer, not one by one: an expert that no token was routed to in the counted steps
has a legitimately unchanged adapter (and an expert whose first tokens came on the last counted step has moved only
its `lora_B`), so where the experts' adapters are separate tensors (Megatron's grouped `...lora_A.default.weight17`,
HF `mlp.experts.17.*`) an unchanged one is counted as "not reached" as long as another expert of the same layer,
projection and kind changed; the run stops only when none of them did (a frozen grouped adapter). This is the same
granularity as a fused 3-D expert tensor (Unsloth's `experts.gate_up_proj`), which changes when any expert does.
On a random model with synthetic video, routing collapses onto a few experts in the deeper layers: the 8-layer
35B-A3B run under Megatron left 1,880 of 8,192 expert tensors unchanged after 2 steps (2026-12-02). The result goes
to `lora_update.json` and the log ("n of m adapter tensors updated", and how many experts were not reached).
"""
from __future__ import annotations

import os
import re
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from swift.callbacks import TrainerCallback

from .. import switches
from .common import GuardError, all_reduce_max, logger, output_dir, rank, unwrap_model, write_json

NAME = 'lora_update'
CHECK_STEPS_ENV = 'SWIFT_VORA_LORA_CHECK_STEPS'
ADAPTER_MARKERS = ('lora_A', 'lora_B', 'lora_embedding_A', 'lora_embedding_B')


def adapter_kind(name: str) -> Optional[str]:
    for marker in ADAPTER_MARKERS:
        if f'.{marker}.' in name or name.endswith(f'.{marker}') or f'.{marker}_' in name:
            return 'B' if marker.endswith('B') else 'A'
    return None


def is_expert_tensor(name: str) -> bool:
    """A MoE expert's adapter (HF `mlp.experts.*`, Megatron's grouped `mlp.experts.linear_fc1.lora_A...`)."""
    return '.experts.' in name or name.endswith('.experts') or '.experts_' in name


# One expert's adapter among its layer's: Megatron's TE grouped `...experts.linear_fc1.lora_A.default.weight17`
# and HF's per-expert modules `...mlp.experts.17.gate_proj.lora_A.default.weight`.
_GROUPED_EXPERT = re.compile(r'(\.experts\..*\.weight)\d+$')
_EXPERT_MODULE = re.compile(r'(\.experts\.)\d+(\.)')
_EXPERT_RANK = re.compile(r'(^|/)ep\d+/')


def expert_group(name: str) -> Optional[str]:
    """The name shared by every expert's copy of this adapter tensor (the expert index replaced by `*`, the expert
    rank's `epN/` qualifier of guards/megatron.py dropped), or None for a tensor that is not one expert's among
    several (attention, dense MLP, a fused 3-D expert tensor)."""
    name = _EXPERT_RANK.sub(r'\1', name)
    grouped = _GROUPED_EXPERT.sub(r'\1*', name)
    if grouped != name:
        return grouped
    per_module = _EXPERT_MODULE.sub(r'\1*\2', name, count=1)
    return per_module if per_module != name else None


def split_unchanged(names: List[str], changed: List[bool]) -> Tuple[List[str], List[str]]:
    """(stale, not_reached): the unchanged tensors that stop the run, and the unchanged per-expert tensors whose
    layer has another expert's copy that changed (an expert no token reached in the counted steps)."""
    moved_groups = {g for n, c in zip(names, changed) if c for g in [expert_group(n)] if g is not None}
    stale, not_reached = [], []
    for name, c in zip(names, changed):
        if not c:
            (not_reached if expert_group(name) in moved_groups else stale).append(name)
    return stale, not_reached


def count_by_kind(kinds: List[str], changed: List[bool]) -> Dict[str, Tuple[int, int]]:
    """(changed, total) of the lora_A and of the lora_B tensors."""
    out = {}
    for kind in ('A', 'B'):
        idx = [i for i, k in enumerate(kinds) if k == kind]
        out[kind] = (sum(1 for i in idx if changed[i]), len(idx))
    return out


def not_checked_note(counted: int, check_steps: int) -> str:
    """`lora_update.json`'s note when training ends before the check."""
    return f'training ended after {counted} counted optimizer step(s), fewer than {check_steps}: not checked'


def update_summary(names: List[str], kinds: List[str], changed: List[bool]) -> Dict[str, Any]:
    """The `lora_update.json` counts every backend reports: all adapter tensors, the expert ones apart, by kind,
    and the names that did not change."""
    expert = [i for i, n in enumerate(names) if is_expert_tensor(n)]
    by_kind = {k: {'updated': u, 'total': t} for k, (u, t) in count_by_kind(kinds, changed).items()}
    return {'tensors': len(names), 'updated': sum(changed), 'expert_tensors': len(expert),
            'expert_updated': sum(1 for i in expert if changed[i]), 'by_kind': by_kind,
            **unchanged_summary(names, changed)}


def unchanged_summary(names: List[str], changed: List[bool]) -> Dict[str, Any]:
    """`lora_update.json`'s unchanged tensors: `not_updated` (those that stop the run), `experts_not_reached` and
    `experts_not_reached_by_layer` (per grouped adapter, `...experts.linear_fc1.lora_A.default.weight*`: n)."""
    stale, not_reached = split_unchanged(names, changed)
    by_layer: Dict[str, int] = {}
    for name in not_reached:
        group = expert_group(name)
        by_layer[group] = by_layer.get(group, 0) + 1
    return {'not_updated': stale, 'experts_not_reached': len(not_reached),
            'experts_not_reached_by_layer': dict(sorted(by_layer.items()))}


def not_reached_note(count: int) -> str:
    return (f'; {count} expert adapter tensor(s) unchanged where another expert of the same layer changed (no token '
            'routed to that expert in the counted steps)') if count else ''


def never_changed_error(message: str, stale: List[str], remedy: str, frozen=()) -> 'GuardError':
    """The guard's failure: what was counted, the first 20 tensors that never changed (those with
    requires_grad=False marked), and where to look."""
    details = ', '.join(f'{n}{" (requires_grad=False)" if n in frozen else ""}' for n in stale[:20])
    more = f' and {len(stale) - 20} more' if len(stale) > 20 else ''
    return GuardError(NAME, f'{message}. Never changed: {details}{more}. A frozen adapter trains nothing: {remedy}, '
                            f'or, if no token reached any expert of a layer in these steps, raise {CHECK_STEPS_ENV}.')


# Elements per float64 pass: a reduction to float64 casts its whole input first, so a 0.5 B-element embedding would
# take 4 GiB at once (Megatron full SFT checks every weight); chunks keep it to 0.5 GiB
CHECKSUM_CHUNK = 2 ** 26


def checksum(data):
    """float64 (sum, L1, L2^2) of a tensor, a chunk at a time (the same chunks every time: comparable)."""
    import torch
    flat = data.reshape(-1)
    total = torch.zeros(3, dtype=torch.float64, device=data.device)
    for start in range(0, flat.numel(), CHECKSUM_CHUNK):
        part = flat[start:start + CHECKSUM_CHUNK]
        total += torch.stack([part.sum(dtype=torch.float64),
                              torch.linalg.vector_norm(part, ord=1, dtype=torch.float64),
                              torch.linalg.vector_norm(part, ord=2, dtype=torch.float64) ** 2])
    return total


def local_data(param):
    """What this rank holds of a parameter: its ZeRO-3 partition when partitioned, else the tensor."""
    ds_tensor = getattr(param, 'ds_tensor', None)
    return ds_tensor if ds_tensor is not None else param.data


class AdapterTracker:
    """Float64 checksums of every LoRA tensor (local partition under ZeRO-3), of `model` or of the given
    (name, parameter) pairs (Megatron's model chunks). `kind_of` picks the tensors and names their kind (default:
    the LoRA factors, 'A' / 'B'; Megatron full SFT tracks every weight by its part of the model)."""

    def __init__(self, model=None, named_parameters: Optional[Iterable[Tuple[str, Any]]] = None,
                 kind_of: Callable[[str], Optional[str]] = adapter_kind):
        self.names: List[str] = []
        self.kinds: List[str] = []
        self.params = []
        pairs = model.named_parameters() if named_parameters is None else named_parameters
        for name, param in pairs:
            kind = kind_of(name)
            if kind is not None:
                self.names.append(name)
                self.kinds.append(kind)
                self.params.append(param)
        self.baseline = None

    def __len__(self) -> int:
        return len(self.params)

    def frozen(self) -> List[str]:
        return [n for n, p in zip(self.names, self.params) if not p.requires_grad]

    def checksums(self):
        import torch
        rows = []
        device = None
        for param in self.params:
            data = local_data(param).detach()
            device = device or data.device
            if data.numel() == 0:
                rows.append(torch.zeros(3, dtype=torch.float64, device=device))
                continue
            rows.append(checksum(data).to(device))
        if not rows:
            return torch.zeros(0, 3, dtype=torch.float64)
        return torch.stack(rows)

    def snapshot(self) -> None:
        self.baseline = self.checksums()

    def _changed_flags(self):
        now = self.checksums()
        return (now != self.baseline).any(dim=1).to(now.dtype)

    def changed_since_baseline(self) -> List[bool]:
        """Per tensor: did any rank's partition change since `snapshot()`? One all-reduce, one host copy. Every
        rank must hold the same tensors (data parallel, ZeRO)."""
        if not self.params:
            return []
        return [bool(f) for f in all_reduce_max(self._changed_flags()).cpu().tolist()]

    def changed_here(self) -> List[bool]:
        """Per tensor: did this rank's copy change since `snapshot()`? No collective (ranks that hold different
        tensors -- Megatron's pipeline stages and expert ranks -- combine by name instead)."""
        if not self.params:
            return []
        return [bool(f) for f in self._changed_flags().cpu().tolist()]

    def counts(self, changed: List[bool]) -> Dict[str, Tuple[int, int]]:
        return count_by_kind(self.kinds, changed)


def step_was_applied(trainer) -> bool:
    engine = getattr(trainer, 'model_wrapped', None)
    if getattr(trainer, 'is_deepspeed_enabled', False) and hasattr(engine, 'was_step_applied'):
        try:
            return bool(engine.was_step_applied())
        except Exception:  # noqa: BLE001
            return True
    accelerator = getattr(trainer, 'accelerator', None)
    return not bool(getattr(accelerator, 'optimizer_step_was_skipped', False))


def current_lr(trainer) -> float:
    try:
        return float(trainer._get_learning_rate())
    except Exception:  # noqa: BLE001 -- fall back to the optimizer's groups
        groups = getattr(getattr(trainer, 'optimizer', None), 'param_groups', None) or [{}]
        return max(float(g.get('lr', 0.0) or 0.0) for g in groups)


class LoraUpdateGuard(TrainerCallback):

    def __init__(self, args, trainer):
        super().__init__(args, trainer)
        self.tracker: Optional[AdapterTracker] = None
        self.effective_steps = 0
        self.check_steps = max(1, switches.read(CHECK_STEPS_ENV))
        self.report: Dict[str, Any] = {}
        self.done = False

    def on_train_begin(self, args, state, control, **kwargs):
        self.tracker = AdapterTracker(unwrap_model(self.trainer))
        if not len(self.tracker):
            logger.info('swift-vora lora_update: no LoRA adapter tensors in the model; nothing to check.')
            self.done = True
            return
        self.tracker.snapshot()
        frozen = self.tracker.frozen()
        self.report = {'tensors': len(self.tracker), 'check_after_steps': self.check_steps,
                       'requires_grad_false': frozen, 'steps': []}
        if frozen:
            logger.warning(f'swift-vora lora_update: {len(frozen)} adapter tensor(s) have requires_grad=False and will '
                           f'not train: {frozen[:10]}')

    def on_optimizer_step(self, args, state, control, **kwargs):
        if self.done or self.tracker is None:
            return
        lr = current_lr(self.trainer)
        applied = step_was_applied(self.trainer)
        if lr <= 0 or not applied:
            self.report['steps'].append({'global_step': state.global_step + 1, 'lr': lr, 'applied': applied,
                                         'counted': False})
            return
        self.effective_steps += 1
        if self.effective_steps not in (1, self.check_steps):
            return
        changed = self.tracker.changed_since_baseline()
        counts = self.tracker.counts(changed)
        n_changed = sum(changed)
        m = len(changed)
        self.report['steps'].append({'global_step': state.global_step + 1, 'lr': lr, 'counted': True,
                                     'effective_step': self.effective_steps, 'updated': n_changed, 'of': m,
                                     'lora_A': counts['A'], 'lora_B': counts['B']})
        if self.effective_steps == 1:
            logger.info(f'swift-vora lora_update: after the first optimizer step {counts["B"][0]} of {counts["B"][1]} '
                        f'lora_B tensors changed ({counts["A"][0]} of {counts["A"][1]} lora_A: '
                        'their gradient is zero on this step, weight decay alone may move them).')
        if self.effective_steps < self.check_steps:
            return
        self.done = True
        unchanged = unchanged_summary(self.tracker.names, changed)
        stale = unchanged['not_updated']
        self.report.update({'updated': n_changed, 'of': m, **unchanged,
                            'criterion': 'float64 sum/L1/L2^2 of each local partition, changed on any rank'})
        self._write()
        message = (f'{n_changed} of {m} adapter tensors updated after {self.check_steps} optimizer steps '
                   f'(lora_A {counts["A"][0]}/{counts["A"][1]}, lora_B {counts["B"][0]}/{counts["B"][1]})'
                   f'{not_reached_note(unchanged["experts_not_reached"])}')
        if stale:
            raise never_changed_error(message, stale, 'check freeze settings / ZeRO-3 leaf modules',
                                      frozen=set(self.report.get('requires_grad_false') or []))
        logger.info(f'swift-vora lora_update: {message}.')

    def on_train_end(self, args, state, control, **kwargs):
        if self.tracker is not None and len(self.tracker) and not self.done:
            self.report['note'] = not_checked_note(self.effective_steps, self.check_steps)
            logger.warning(f'swift-vora lora_update: {self.report["note"]}.')
            self._write()

    def _write(self) -> None:
        if rank() == 0:
            write_json(os.path.join(output_dir(self.trainer), 'lora_update.json'), self.report)
