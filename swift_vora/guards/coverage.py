"""Guard `coverage`: every rank gets batches, no sample is silently left out, and every sample is seen.

Before training (`on_init_end`) it replays ms-swift's own train sampler (`swift.dataloader.BatchSamplerShard`,
the one `DataLoaderMixin.get_train_dataloader` builds) for every rank, with the run's world size, batch size,
`dataloader_drop_last`, shuffle, seed and `group_by_length` lengths, cut to the number of batches the trainer
will draw (`len(sampler)`). That sampler floors the dataset to a multiple of the world size, so the last
`n mod world_size` samples are never trained -- the *same* samples every epoch, with no message.

- A rank that would get no batch stops the run (1 sample on 2 GPUs trains `global_step 0/1, train_loss 0`),
  unless `SWIFT_VORA_REPLICATE_TINY=1` (smoke tests) replicates the dataset until every rank has a batch.
- Samples that would never be trained are handled by `SWIFT_VORA_TAIL`:
  `pad` (default): repeat that many samples (chosen with the data seed, logged by id) so that every sample is
  trained once per epoch; the repeats cost at most world_size - 1 extra samples per epoch.
  `drop`: train as ms-swift would, with a warning that gives the number and the ids.
  `stop`: refuse to train.
  Default `pad` because ms-swift's tail is not random: the same samples are excluded in every epoch, so `drop`
  means they are never trained at all, while `pad` gives a few samples one extra pass.
- During training every batch's source indices and sample ids are recorded (see common.py: the tag is set
  where the row is actually encoded, so a row that ms-swift swapped for a random one after an encode error is
  not counted). At each epoch end each rank appends one line to `coverage.rank{R}.jsonl` and rank 0 logs a
  summary line and appends to `coverage_summary.jsonl` the samples never seen.
- An epoch is complete when every rank consumed the batches its sampler planned (`len(sampler)`, replayed
  above; counted at the training step). Only then are unseen samples "NEVER SEEN" (a warning: encode errors,
  tail dropping). When training stops first (`max_steps`, a callback's `should_training_stop`, ...) -- which
  `control.should_training_stop` alone cannot tell, since a budget that ends with the epoch sets it too -- the
  unseen samples were just not reached: logged at INFO with the reason, `epoch_complete: false`.
- With `--packing` the sampler draws packed rows of several samples (ms-swift's `PackingDataset`): the replay and the
  tail handling work on rows (`pad` repeats whole rows, by reordering the dataset's `packed_idx`), while what is
  seen and never seen is still counted per sample, each row's samples tagged where the row is built.
"""
from __future__ import annotations

import os
import random
from typing import Any, Dict, List, Optional, Sequence, Tuple

from swift.callbacks import TrainerCallback

from .common import (
    GuardError,
    all_gather_objects,
    append_jsonl,
    get_tap,
    logger,
    output_dir,
    rank,
    world_size,
    write_json,
)

NAME = 'coverage'
TAIL_ENV = 'SWIFT_VORA_TAIL'
REPLICATE_ENV = 'SWIFT_VORA_REPLICATE_TINY'
TAIL_POLICIES = ('pad', 'drop', 'stop')


def _sampler_class():
    from swift.dataloader import BatchSamplerShard

    class ReplayedSampler(BatchSamplerShard):
        """ms-swift's sampler with the rank and world size given instead of read from torch.distributed."""

        def __init__(self, *args, replay_rank: int, replay_world_size: int, **kwargs):
            self._replay_rank, self._replay_world_size = replay_rank, replay_world_size
            super().__init__(*args, **kwargs)

        @property
        def rank(self):
            return self._replay_rank

        @property
        def world_size(self):
            return self._replay_world_size

    return ReplayedSampler


def replay_sampler(total: int, world: int, batch_size: int, *, drop_last: bool = False, shuffle: bool = True,
                   data_seed: Optional[int] = None, group_by_length: bool = False,
                   lengths: Optional[Sequence] = None, epoch: int = 0) -> List[List[List[int]]]:
    """For each rank, the batches (lists of dataset positions) the trainer will draw in `epoch`."""
    cls = _sampler_class()
    per_rank = []
    for r in range(world):
        sampler = cls(total, batch_size, shuffle, drop_last, data_seed, group_by_length=group_by_length,
                      lengths=lengths, replay_rank=r, replay_world_size=world)
        sampler.set_epoch(epoch)
        n_batches = len(sampler)
        batches = []
        for batch in sampler:
            if len(batches) == n_batches:
                break
            batches.append(list(batch))
        per_rank.append(batches)
    return per_rank


def plan_coverage(n: int, world: int, batch_size: int, *, tail: str = 'pad', replicate: bool = False,
                  seed: Optional[int] = None, **sampler_kwargs) -> Dict[str, Any]:
    """Decide the sample order for the run.

    Returns a dict with `order` (source index per dataset position; None when unchanged), `padded`
    (source indices repeated), `dropped` (source indices never trained), `batches_per_rank`,
    `empty_ranks` (before replication) and `error` (a message when the run must stop).
    """
    if tail not in TAIL_POLICIES:
        raise GuardError(NAME, f'{TAIL_ENV}={tail!r}: expected one of {", ".join(TAIL_POLICIES)}')
    sampler_kwargs = dict(sampler_kwargs)
    sampler_kwargs.setdefault('data_seed', seed)
    lengths = sampler_kwargs.pop('lengths', None)

    def replay_order(order_: List[int]):
        lengths_ = [lengths[o] for o in order_] if lengths is not None else None
        return replay_sampler(len(order_), world, batch_size, lengths=lengths_, **sampler_kwargs)

    plan: Dict[str, Any] = {'samples': n, 'world_size': world, 'batch_size': batch_size, 'tail_policy': tail,
                            'order': None, 'padded': [], 'dropped': [], 'replicated': False, 'error': None}
    replay = replay_order(list(range(n)))
    plan['empty_ranks'] = [r for r, batches in enumerate(replay) if not batches]
    order = list(range(n))
    drop_last = bool(sampler_kwargs.get('drop_last'))
    multiple = world * batch_size if drop_last else world
    if plan['empty_ranks']:
        if not replicate:
            plan['error'] = (
                f'rank(s) {plan["empty_ranks"]} would get no batch: {n} sample(s) over {world} ranks with '
                f'per-device batch size {batch_size}{" and dataloader_drop_last" if drop_last else ""}. '
                f'ms-swift floors the dataset to a multiple of the world size, so this run would train '
                f'{sum(len(b) for b in replay[0])} step(s) per epoch and could report train_loss 0. Use more data or '
                f'fewer processes; for a smoke test set {REPLICATE_ENV}=1 to replicate the dataset.')
            plan['batches_per_rank'] = [len(b) for b in replay]
            return plan
        while len(order) < multiple:  # replicate whole copies until every rank has a batch
            order.extend(range(n))
        plan['replicated'] = True
    covered = {p for batches in replay_order(order)
               for batch in batches for p in batch}
    missing_positions = [p for p in range(len(order)) if p not in covered]
    never = sorted({order[p] for p in missing_positions} - {order[p] for p in covered})
    plan['would_never_train'] = never  # what ms-swift alone would leave out, before the tail policy
    if missing_positions and tail == 'stop':
        plan['dropped'] = never
        plan['error'] = (f'{len(missing_positions)} of {len(order)} samples would never be trained '
                         f'(ms-swift floors the dataset to a multiple of {multiple}); {TAIL_ENV}=stop. '
                         f'Set {TAIL_ENV}=pad or drop, or '
                         'change the dataset size.')
    elif missing_positions and tail == 'drop':
        plan['dropped'] = never
    elif missing_positions:  # pad: repeat randomly chosen samples so that every position is covered
        k = (-len(order)) % multiple
        rng = random.Random(0 if seed is None else seed)
        pool = list(range(n))
        extra = rng.sample(pool, k) if k <= len(pool) else [rng.choice(pool) for _ in range(k)]
        order = order + extra
        plan['padded'] = extra
        replay_padded = replay_order(order)
        covered = {p for batches in replay_padded for batch in batches for p in batch}
        left = [p for p in range(len(order)) if p not in covered]
        if left:  # should not happen with ms-swift 4.6's sampler; say so rather than pretend
            plan['error'] = f'padding to {len(order)} samples still leaves positions {left[:10]} untrained'
    if plan['replicated'] or plan['padded']:
        plan['order'] = order
    final = replay_order(order)
    plan['batches_per_rank'] = [len(b) for b in final]
    plan['samples_per_rank'] = [sum(len(b) for b in batches) for batches in final]
    return plan


class CoverageGuard(TrainerCallback):
    """See the module docstring."""

    def __init__(self, args, trainer):
        super().__init__(args, trainer)
        self.plan: Optional[Dict[str, Any]] = None
        self.n_source = 0
        self.epoch = -1
        self.seen: List[Tuple[Any, Any]] = []
        self.batches = 0  # micro-batches this rank trained in the current epoch
        self.step_at_epoch_begin = 0
        self.enabled = True

    # before training -------------------------------------------------------------------------------------
    def on_init_end(self, args, state, control, **kwargs):
        trainer = self.trainer
        tap = get_tap(trainer)
        tap.add(self)
        dataset = trainer.train_dataset
        if dataset is None or not hasattr(dataset, '__len__'):
            logger.warning('swift-vora coverage: the train dataset has no length (streaming); coverage is not checked.')
            self.enabled = False
            return
        if getattr(trainer.template, 'sequence_parallel_size', 1) > 1:
            logger.warning('swift-vora coverage: sequence parallel uses another sampler; coverage is not checked.')
            self.enabled = False
            return
        tp = 1
        if isinstance(getattr(args, 'deepspeed', None), dict) and 'tensor_parallel' in args.deepspeed:
            tp = int(args.deepspeed['tensor_parallel'].get('autotp_size', 1) or 1)
        world = max(1, world_size() // tp)
        n_rows = len(dataset)  # what the sampler draws: samples, or packed rows of several (`--packing`)
        self.n_source = len(tap.packed.dataset) if tap.packed is not None else n_rows
        group_by_length = bool(getattr(args, 'group_by_length', False))
        lengths = dataset['lengths'] if group_by_length else None
        from .. import switches
        tail, replicate = switches.read(TAIL_ENV), switches.read(REPLICATE_ENV)
        plan = plan_coverage(n_rows, world, trainer._train_batch_size, tail=tail, replicate=replicate,
                             seed=args.data_seed, drop_last=bool(args.dataloader_drop_last),
                             shuffle=bool(getattr(args, 'train_dataloader_shuffle', True)),
                             group_by_length=group_by_length, lengths=lengths)
        self.plan = plan
        if rank() == 0:
            write_json(os.path.join(output_dir(trainer), 'coverage_plan.json'),
                       {k: v for k, v in plan.items() if k != 'order'})
        if plan['error']:
            raise GuardError(NAME, plan['error'])
        ids = self._row_ids
        if plan['replicated']:
            logger.warning(f'swift-vora coverage: {REPLICATE_ENV}=1: replicated {self.n_source} sample(s) to '
                           f'{len(plan["order"]) - len(plan["padded"])} so that all {world} ranks get a batch '
                           '(smoke test only).')
        if plan['padded']:
            logger.warning(f'swift-vora coverage: ms-swift would never train {len(plan["would_never_train"])} tail '
                           f'sample(s) of {self.n_source} on {world} ranks ({ids(plan["would_never_train"])}); '
                           f'{TAIL_ENV}=pad repeats {len(plan["padded"])} sample(s) per epoch so that all are '
                           f'trained: {ids(plan["padded"])}.')
        if plan['dropped']:
            logger.warning(f'swift-vora coverage: {len(plan["dropped"])} of {self.n_source} samples will NEVER be '
                           f'trained (ms-swift floors the dataset to a multiple of the world size {world}; '
                           f'{TAIL_ENV}=drop): {ids(plan["dropped"])}.')
        if plan['order'] is not None and tap.packed is not None:  # pad / replicate whole packed rows
            packed_idx, packed_length = list(tap.packed.packed_idx), list(tap.packed.packed_length)
            tap.packed.packed_idx = [packed_idx[i] for i in plan['order']]
            tap.packed.packed_length = [packed_length[i] for i in plan['order']]
        elif plan['order'] is not None:
            if tap.indexed is None:
                raise GuardError(NAME, f'cannot pad/replicate a {type(dataset).__name__}: {tap.tracking_note}. '
                                       f'Set {TAIL_ENV}=drop or use a dataset size that is a multiple of {world}.')
            tap.indexed.order = list(plan['order'])
        rows = f' in {n_rows} packed rows' if tap.packed is not None else ''
        logger.info(f'swift-vora coverage: {self.n_source} samples{rows}, {world} ranks, batch size '
                    f'{trainer._train_batch_size}: batches per rank {plan["batches_per_rank"]}, '
                    f'{"packed rows" if tap.packed is not None else "samples"} per rank '
                    f'{plan["samples_per_rank"]}; repeated {len(plan["padded"])}, never trained '
                    f'{len(plan["dropped"])}.')
        if tap.tracking_note:
            logger.warning(f'swift-vora coverage: {tap.tracking_note}.')

    def _row_ids(self, indices: Sequence[int], limit: int = 20) -> str:
        """Sampler units named: samples, or with `--packing` the packed rows and the samples each holds."""
        tap = getattr(self.trainer, '_swift_vora_tap', None)
        if tap is None or tap.packed is None:
            return self._ids(indices, limit)
        rows = [f'row {i} (samples {tap.packed.packed_idx[i]})' for i in list(indices)[:limit]]
        more = f' and {len(indices) - limit} more' if len(indices) > limit else ''
        return ', '.join(rows) + more

    def _ids(self, indices: Sequence[int], limit: int = 20) -> str:
        tap = getattr(self.trainer, '_swift_vora_tap', None)
        names = []
        source = None if tap is None else (tap.indexed if tap.indexed is not None else
                                           tap.packed.dataset if tap.packed is not None else None)
        for i in list(indices)[:limit]:
            name = i
            if source is not None:
                try:
                    from .common import _sample_id
                    name = _sample_id(source.source_row(i), i)
                except Exception:  # noqa: BLE001 -- naming is best effort; the index is still given
                    pass
            names.append(f'{i} ({name})' if name != i else str(i))
        more = f' and {len(indices) - limit} more' if len(indices) > limit else ''
        return ', '.join(names) + more

    # during training --------------------------------------------------------------------------------------
    def on_epoch_begin(self, args, state, control, **kwargs):
        self.epoch += 1
        self.seen = []
        self.batches = 0
        self.step_at_epoch_begin = getattr(state, 'global_step', 0) or 0

    def on_batch(self, meta, inputs) -> None:
        self.batches += 1
        if meta and meta.get('indices'):
            self.seen.extend(zip(meta['indices'], meta['sample_ids']))

    def _planned_batches(self, r: int) -> Optional[int]:
        planned = (self.plan or {}).get('batches_per_rank') or []
        if not planned:
            return None
        return planned[r] if r < len(planned) else max(planned)  # ms-swift gives every rank the same count

    @staticmethod
    def _stop_reason(args, state, control) -> str:
        """Why the epoch ended before its planned batches, from what the trainer knows."""
        step = getattr(state, 'global_step', 0) or 0
        if (getattr(args, 'max_steps', -1) or -1) > 0 and step >= args.max_steps:
            return 'max_steps'
        if (getattr(state, 'max_steps', 0) or 0) > 0 and step >= state.max_steps:
            return 'step_budget'  # a fractional num_train_epochs: HF's own max_steps
        if getattr(control, 'should_training_stop', False):
            return 'training_stopped'  # a callback, e.g. early stopping
        if getattr(control, 'should_epoch_stop', False):
            return 'epoch_stopped'
        return 'dataloader_short'  # fewer batches than planned, e.g. resumed mid-epoch (skipped batches unseen)

    def on_epoch_end(self, args, state, control, **kwargs):
        if not self.enabled:
            return
        r = rank()
        indices = [i for i, _ in self.seen]
        planned = self._planned_batches(r)
        row = {'epoch': self.epoch, 'rank': r, 'batches_consumed_samples': len(self.seen), 'indices': indices,
               'sample_ids': [s for _, s in self.seen], 'global_step': state.global_step,
               'batches_consumed': self.batches, 'batches_planned': planned}
        append_jsonl(os.path.join(output_dir(self.trainer), f'coverage.rank{r}.jsonl'), row)
        gathered = all_gather_objects({'indices': indices, 'batches': self.batches, 'planned': planned})
        if r != 0:
            return
        per_rank = [len(x['indices']) for x in gathered]
        consumed = [x['batches'] for x in gathered]
        planned_per_rank = [x['planned'] for x in gathered]
        complete = all(p is None or c >= p for c, p in zip(consumed, planned_per_rank))
        reason = None if complete else self._stop_reason(args, state, control)
        seen = {i for x in gathered for i in x['indices'] if i is not None}
        unseen = [i for i in range(self.n_source) if i not in seen]
        never, not_reached = (unseen, []) if complete else ([], unseen)
        tracked = any(x['indices'] for x in gathered)
        summary = {'epoch': self.epoch, 'samples': self.n_source, 'seen': len(seen), 'never_seen': never,
                   'never_seen_ids': self._ids(never, limit=200) if never else '', 'consumed_per_rank': per_rank,
                   'tracked': tracked, 'max_steps': getattr(args, 'max_steps', -1), 'epoch_complete': complete,
                   'reason': reason, 'not_reached': not_reached,
                   'not_reached_ids': self._ids(not_reached, limit=200) if not_reached else '',
                   'batches_consumed_per_rank': consumed, 'batches_planned_per_rank': planned_per_rank,
                   'global_step': state.global_step}
        append_jsonl(os.path.join(output_dir(self.trainer), 'coverage_summary.jsonl'), summary)
        if not tracked:
            logger.warning(f'swift-vora coverage: epoch {self.epoch}: sample ids were not tracked '
                           f'({getattr(self.trainer, "_swift_vora_tap").tracking_note}).')
        elif not complete:
            steps = (state.global_step or 0) - self.step_at_epoch_begin
            logger.info(f'swift-vora coverage: epoch {self.epoch}: training stopped at step {steps} of the epoch '
                        f'({reason}) after {len(seen)} of {self.n_source} samples; {len(not_reached)} not reached'
                        f'{": " + self._ids(not_reached) if not_reached else ""} (batches per rank {consumed} of '
                        f'{planned_per_rank} planned; unseen samples of an unfinished epoch are not checked).')
        elif never:
            logger.warning(f'swift-vora coverage: epoch {self.epoch}: {len(seen)} of {self.n_source} samples trained; '
                           f'NEVER SEEN: {len(never)}: {self._ids(never)} (the epoch finished, so encode errors '
                           'swapped them for other samples, or tail dropping).')
        else:
            logger.info(f'swift-vora coverage: epoch {self.epoch}: {len(seen)} of {self.n_source} samples trained '
                        f'(consumed per rank {per_rank}); never seen: none.')
