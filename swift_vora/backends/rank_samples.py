"""Which samples each replica of the Unsloth runner trains, and the count of what was trained (the `coverage` guard).

The order is torch's own `DistributedSampler` over the rows, one per rank: each epoch a new shuffle of every row
(`set_epoch`; the same permutation on every rank), rank r taking positions r, r + W, r + 2W, ... of it. One process
is the same sampler with one replica, so a run on W ranks trains, step by step, the samples one process trains over
the same global batch (W x micro-batch x gradient accumulation). The order is endless: a step that needs more samples
than an epoch has left takes the next epoch's first ones.

The rows rarely divide by W. `SWIFT_VORA_TAIL` decides, as for `swift sft` (swift_vora/guards/coverage.py):
`pad` (default): the sampler's own padding -- each epoch repeats the first `-n mod W` samples of its shuffle, so
every sample is trained every epoch; `drop`: the sampler's `drop_last` -- each epoch leaves its last `n mod W`
samples out (other ones each epoch, since the shuffle changes), counted and named; `stop`: refuse. A rank that
would get no sample at all (fewer samples than ranks) stops the run, unless `SWIFT_VORA_REPLICATE_TINY=1`.

Counted per rank, as the loop consumes each sample (not when it is encoded ahead): trained, or rejected by the
template. Files (the names the `swift sft` guard writes): `coverage_plan.json` (rank 0, before training),
`coverage.rank{R}.jsonl` (one line per epoch each rank finished, and one for the epoch it stopped in), and
`coverage_summary.jsonl` (rank 0, at the end: per epoch, samples trained, repeated, dropped, rejected, never seen --
for an epoch every rank finished -- or not reached, for the one training stopped in).
"""
from __future__ import annotations

import collections
import math
import os
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence

TAIL_POLICIES = ('pad', 'drop', 'stop')


class Position(NamedTuple):
    """One draw of a rank's order: the epoch and the row."""
    epoch: int
    index: int


def sampler(n: int, world: int, rank: int, seed: int, drop_last: bool):
    """torch's DistributedSampler over `n` rows for `rank` of `world` (no process group needed: both are given)."""
    from torch.utils.data import DistributedSampler
    return DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True, seed=seed, drop_last=drop_last)


def epoch_indices(n: int, world: int, seed: int, drop_last: bool, epoch: int) -> List[List[int]]:
    """Every rank's rows in `epoch`, in its order."""
    out = []
    for r in range(world):
        s = sampler(n, world, r, seed, drop_last)
        s.set_epoch(epoch)
        out.append(list(s))
    return out


class RankOrder:
    """This rank's endless order: epoch e is what DistributedSampler gives this rank after `set_epoch(e)`."""

    def __init__(self, n: int, world: int = 1, rank: int = 0, seed: int = 0, drop_last: bool = False):
        self.sampler = sampler(n, world, rank, seed, drop_last)
        if self.sampler.num_samples < 1:
            raise ValueError(f'{n} rows over {world} ranks with drop_last: rank {rank} would get none')
        self.epoch = -1
        self.pending: 'collections.deque[int]' = collections.deque()

    @property
    def per_epoch(self) -> int:
        return self.sampler.num_samples

    def next(self) -> Position:
        if not self.pending:
            self.epoch += 1
            self.sampler.set_epoch(self.epoch)
            self.pending.extend(self.sampler)
        return Position(self.epoch, self.pending.popleft())


def plan_tail(n: int, world: int, seed: int, tail: str = 'pad', replicate: bool = False) -> Dict[str, Any]:
    """How `n` rows spread over `world` ranks: `drop_last` for the sampler, the samples per rank per epoch, the rows
    epoch 0 repeats (pad) or leaves out (drop), and `error` when the run must stop."""
    if tail not in TAIL_POLICIES:
        raise ValueError(f'SWIFT_VORA_TAIL={tail!r}: expected one of {", ".join(TAIL_POLICIES)}')
    drop_last = tail == 'drop'
    plan: Dict[str, Any] = {'samples': n, 'world_size': world, 'tail_policy': tail, 'drop_last': drop_last,
                            'remainder': n % world, 'error': None}
    if n < world and not replicate:
        plan['error'] = (f'{n} sample(s) over {world} ranks: rank(s) {list(range(n, world))} would have no sample of '
                         f'their own. Use more data or fewer processes; for a smoke test set '
                         f'SWIFT_VORA_REPLICATE_TINY=1 (the sampler then repeats samples until every rank has one).')
        return plan
    if n % world and tail == 'stop':
        plan['error'] = (f'{n} samples do not divide over {world} ranks: {n % world} would be left out or '
                         f'{world - n % world} repeated each epoch; SWIFT_VORA_TAIL=stop. Set SWIFT_VORA_TAIL=pad or '
                         f'drop, or change the dataset size.')
        return plan
    if n < world:  # replicate: the sampler's padding repeats the rows (drop_last would leave every rank empty)
        plan['drop_last'] = drop_last = False
        plan['replicated'] = True
    counts = epoch_counts(n, world, seed, drop_last, 0)
    plan['samples_per_rank'] = sampler(n, world, 0, seed, drop_last).num_samples
    plan['repeated_epoch0'] = counts['repeated']
    plan['dropped_epoch0'] = counts['dropped']
    return plan


def epoch_counts(n: int, world: int, seed: int, drop_last: bool, epoch: int) -> Dict[str, List[int]]:
    """Rows `epoch` gives two ranks or more (`repeated`, once per extra time) and rows it gives none (`dropped`)."""
    seen = collections.Counter(i for rows in epoch_indices(n, world, seed, drop_last, epoch) for i in rows)
    return {'repeated': sorted(i for i, c in seen.items() for _ in range(c - 1)),
            'dropped': [i for i in range(n) if i not in seen]}


def steps_for(per_rank_epoch: int, epochs: float, samples_per_step: int, max_steps: Optional[int]) -> int:
    """Optimizer steps: `max_steps`, else enough for `epochs` of this rank's share (the same on every rank)."""
    return max_steps or max(1, math.ceil(per_rank_epoch * epochs / samples_per_step))


class Coverage:
    """What this rank consumed, per epoch; the files above. `names(i)` names row i (its sample id)."""

    def __init__(self, n: int, world: int, rank: int, seed: int, drop_last: bool, per_epoch: int, output_dir: str,
                 names: Callable[[int], str], write: bool = True):
        self.n, self.world, self.rank, self.seed, self.drop_last = n, world, rank, seed, drop_last
        self.per_epoch, self.output_dir, self.names, self.write = per_epoch, output_dir, names, write
        self.epochs: Dict[int, Dict[str, List[int]]] = {}

    def _epoch(self, epoch: int) -> Dict[str, List[int]]:
        return self.epochs.setdefault(epoch, {'trained': [], 'rejected': []})

    def consumed(self, trained: Sequence[Position], rejected: Sequence[Position] = ()) -> None:
        """One micro-batch taken by the loop: its trained samples and the ones the template rejected before it."""
        for kind, positions in (('trained', trained), ('rejected', rejected)):
            for p in positions:
                row = self._epoch(p.epoch)
                row[kind].append(p.index)
                if len(row['trained']) + len(row['rejected']) == self.per_epoch:
                    self._write_rank_row(p.epoch)

    def _rank_row(self, epoch: int) -> Dict[str, Any]:
        row = self._epoch(epoch)
        consumed = len(row['trained']) + len(row['rejected'])
        return {'epoch': epoch, 'rank': self.rank, 'planned': self.per_epoch, 'consumed': consumed,
                'complete': consumed >= self.per_epoch, 'indices': row['trained'],
                'sample_ids': [self.names(i) for i in row['trained']], 'rejected': row['rejected']}

    def _write_rank_row(self, epoch: int) -> None:
        if self.write:
            from ..guards.common import append_jsonl
            append_jsonl(os.path.join(self.output_dir, f'coverage.rank{self.rank}.jsonl'), self._rank_row(epoch))

    def finish(self, gather: Callable[[Any], List[Any]], reason: str) -> Optional[List[Dict[str, Any]]]:
        """At the end, on every rank (one gather): the epoch it stopped in is written, rank 0 writes and returns the
        summary, one row per epoch (None on the other ranks). `reason`: why training stopped (max_steps, the step
        budget)."""
        last = max(self.epochs) if self.epochs else None
        if last is not None and not self._rank_row(last)['complete']:
            self._write_rank_row(last)
        ranks = gather({e: self._rank_row(e) for e in self.epochs})
        if self.rank != 0:
            return None
        summary = [self._summary(e, [r.get(e) for r in ranks], reason) for e in sorted({e for r in ranks for e in r})]
        if self.write:
            from ..guards.common import append_jsonl
            for row in summary:
                append_jsonl(os.path.join(self.output_dir, 'coverage_summary.jsonl'), row)
        return summary

    def _summary(self, epoch: int, ranks: List[Optional[Dict[str, Any]]], reason: str) -> Dict[str, Any]:
        consumed = [r['consumed'] if r else 0 for r in ranks]
        complete = all(c >= self.per_epoch for c in consumed)
        trained = {i for r in ranks if r for i in r['indices']}
        rejected = sorted({i for r in ranks if r for i in r['rejected']} - trained)
        counts = epoch_counts(self.n, self.world, self.seed, self.drop_last, epoch)
        unseen = [i for i in range(self.n) if i not in trained]
        row = {'epoch': epoch, 'samples': self.n, 'trained': len(trained), 'epoch_complete': complete,
               'reason': None if complete else reason, 'consumed_per_rank': consumed,
               'planned_per_rank': [self.per_epoch] * self.world,
               'repeated': counts['repeated'], 'repeated_ids': self._ids(counts['repeated']),
               'dropped': counts['dropped'], 'dropped_ids': self._ids(counts['dropped']),
               'rejected': rejected, 'rejected_ids': self._ids(rejected),
               'never_seen': unseen if complete else [], 'not_reached': [] if complete else unseen}
        row['never_seen_ids'] = self._ids(row['never_seen'])
        return row

    def _ids(self, indices: Sequence[int], limit: int = 200) -> List[str]:
        return [self.names(i) for i in list(indices)[:limit]]


def describe_plan(plan: Dict[str, Any], names: Callable[[int], str], per_step: int) -> List[str]:
    """The lines rank 0 logs about the plan: the spread, and what the tail policy does to the remainder."""
    n, world = plan['samples'], plan['world_size']
    lines = [f'{n} samples over {world} rank(s): {plan["samples_per_rank"]} per rank per epoch '
             f'(torch DistributedSampler, shuffled each epoch); each optimizer step trains {per_step} samples']
    if plan.get('replicated'):
        lines.append('SWIFT_VORA_REPLICATE_TINY=1: fewer samples than ranks; the sampler repeats them so that '
                     'every rank has one (smoke test only)')
    if plan['repeated_epoch0'] and not plan.get('replicated'):
        ids = ', '.join(names(i) for i in plan['repeated_epoch0'][:20])
        lines.append(f'{n} samples do not divide over {world} ranks: SWIFT_VORA_TAIL=pad repeats '
                     f'{len(plan["repeated_epoch0"])} sample(s) each epoch (other ones each epoch) so that every '
                     f'sample is trained every epoch; epoch 0 repeats: {ids}')
    if plan['dropped_epoch0']:
        ids = ', '.join(names(i) for i in plan['dropped_epoch0'][:20])
        lines.append(f'WARNING: SWIFT_VORA_TAIL=drop: {len(plan["dropped_epoch0"])} of {n} samples are NOT trained '
                     f'each epoch (other ones each epoch); epoch 0 leaves out: {ids}')
    return lines


def describe_summary(row: Dict[str, Any]) -> str:
    """One line per epoch of the summary."""
    head = f'coverage: epoch {row["epoch"]}: {row["trained"]} of {row["samples"]} samples trained'
    extra = []
    if row['repeated']:
        extra.append(f'{len(row["repeated"])} repeated (tail padding)')
    if row['dropped']:
        extra.append(f'{len(row["dropped"])} dropped (SWIFT_VORA_TAIL=drop): {", ".join(row["dropped_ids"][:20])}')
    if row['rejected']:
        extra.append(f'{len(row["rejected"])} rejected by the template: {", ".join(row["rejected_ids"][:20])}')
    if not row['epoch_complete']:
        extra.append(f'training stopped in this epoch ({row["reason"]}): {len(row["not_reached"])} not reached')
    elif row['never_seen']:
        extra.append(f'NEVER SEEN: {len(row["never_seen"])}: {", ".join(row["never_seen_ids"][:20])}')
    else:
        extra.append('never seen: none')
    return head + '; ' + '; '.join(extra) + f' (consumed per rank {row["consumed_per_rank"]})'
