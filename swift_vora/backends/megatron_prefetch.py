"""`megatron sft`: the DataLoader's workers keep encoding across the end of an epoch.

Megatron-SWIFT 4.6 trains from `cyclic_iter(train_dataloader)` (swift/megatron/trainers/base.py): a `for` over the
DataLoader once per epoch. Each epoch's `iter(dataloader)` is a new DataLoader iterator, and its workers (persistent
or not) start on the next epoch's micro-batches only then -- the sampler's iteration ended with the epoch, so nothing
could be fetched ahead. The first step of every epoch waits for a whole micro-batch to be decoded and encoded: with
64-frame clips 3.2-4.0 s on an H100, where a step takes 3-4 s. On a short epoch that is a large share: 16 samples at
global batch 4 stalled every fourth step (15-17 % of the measured time, the slowest step twice the median;
docs/runs/h100-megatron-fusion-2026-12-06/). On a long one it is one stall per epoch, still paid once per epoch.

What this module does, when the launch names the callback `vora_epoch_prefetch` in `--callbacks` (the default;
SWIFT_VORA_MEGATRON_PREFETCH=off leaves it out): at `on_train_begin` -- which the trainer fires after setting the
model up and before it builds its data iterators -- the trainer instance's `_prepare_dataloader` is wrapped
(patches.py `megatron_epoch_prefetch`). The training DataLoader it returns is built again by the trainer's own
`_create_dataloader` (the same workers, pinning, prefetch factor and collator) over the same batch sampler read epoch
after epoch without end (`AcrossEpochs`), and handed to `cyclic_iter` as `EpochsOfOneIterator`: each `for` over it
yields one epoch's micro-batches from ONE DataLoader iterator, so the workers are encoding the next epoch's first
micro-batches while the current epoch's last ones train.

Upstream's data, in upstream's order: Megatron-SWIFT's `MegatronPretrainingRandomSampler` derives each epoch's
permutation from the samples it has handed out (`consumed_samples`), so reading it again after an epoch -- what
`AcrossEpochs` does -- gives exactly the next epoch `iter(dataloader)` would have. How many micro-batches an epoch
holds is counted on a copy of the sampler, advanced one epoch per `for`, so `cyclic_iter`'s epochs (and the end of
training after `--num_train_epochs`) are upstream's. Left as they are: a DataLoader without workers (nothing runs
ahead of the training loop there), any batch sampler but that one (streaming datasets, the validation loader).
The cost: at the end of training the workers have encoded up to `prefetch_factor x workers` micro-batches that no
step takes.
"""
from __future__ import annotations

import copy
import logging
from typing import Any, Iterator, List, Mapping, Optional

from .. import patches, switches
from .megatron_callback import MegatronTrainerCallback

ENV = 'SWIFT_VORA_MEGATRON_PREFETCH'
CALLBACK = 'vora_epoch_prefetch'  # its name in Megatron-SWIFT's megatron_callbacks_map (swift_registry.py)
PATCH = 'megatron_epoch_prefetch'
# the batch sampler whose epochs follow from its consumed samples (swift/megatron/trainers/batch_sampler.py); by
# name, since its module cannot be imported where transformer_engine is missing
RANDOM_SAMPLER = 'MegatronPretrainingRandomSampler'
logger = logging.getLogger('swift')


def wanted(environ: Mapping[str, str]) -> bool:
    """Whether the launch names the callback, for the training process's environment (a value the switch refuses
    raises SwitchError here, before the launch)."""
    return switches.read(ENV, environ) != 'off'


class AcrossEpochs:
    """A batch sampler: `sampler`'s epochs back to back, without end. Each pass over `sampler` is the epoch it would
    give a new DataLoader iterator (it advances its own consumed samples)."""

    def __init__(self, sampler):
        self.sampler = sampler

    def __len__(self) -> int:  # what DataLoader's len() reports: the sampler's, as before
        return len(self.sampler)

    def __iter__(self) -> Iterator[List[int]]:
        while True:
            given = 0
            for batch in self.sampler:
                given += 1
                yield batch
            if not given:  # an epoch without a micro-batch would spin here for ever; upstream's loader just ends
                return


class EpochsOfOneIterator:
    """What `cyclic_iter` loops over: each `for` yields the next epoch's micro-batches (as many as a copy of the
    sampler counts for it), all from one iterator of `loader` -- a DataLoader over `AcrossEpochs(sampler)`."""

    def __init__(self, loader, sampler):
        self.loader = loader
        self._counter = copy.copy(sampler)  # advanced an epoch per `for`, as the real one is by the workers' fetches
        self._iterator: Optional[Iterator[Any]] = None
        self.epochs_started = 0

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        batches = sum(1 for _ in self._counter)
        if self._iterator is None:
            self._iterator = iter(self.loader)
        self.epochs_started += 1
        for _ in range(batches):
            yield next(self._iterator)


def across_epochs(trainer, loader):
    """`loader` (the training DataLoader upstream built) read across epochs, or `loader` itself where this does not
    apply: no workers, or a batch sampler other than Megatron-SWIFT's random sampler."""
    sampler = getattr(loader, 'batch_sampler', None)
    if getattr(loader, 'num_workers', 0) <= 0 or type(sampler).__name__ != RANDOM_SAMPLER:
        return loader
    return EpochsOfOneIterator(trainer._create_dataloader(loader.dataset, AcrossEpochs(sampler)), sampler)


def wrap_trainer(trainer) -> bool:
    """Wrap `trainer._prepare_dataloader` (the instance's) so that the training DataLoader it returns is read across
    epochs. False where the trainer has no such method, the installed ms-swift is not one the inventory knows, or it
    is wrapped already."""
    prepare = getattr(trainer, '_prepare_dataloader', None)
    if prepare is None or patches.patched_by(prepare) == PATCH or not patches.applicable(PATCH):
        return False

    def prepare_across_epochs(train_dataset, val_dataset=None):
        train_loader, val_loader = prepare(train_dataset, val_dataset)
        wrapped = across_epochs(trainer, train_loader)
        if wrapped is not train_loader:
            logger.info(f'swift-vora: the training DataLoader\'s {train_loader.num_workers} workers keep encoding '
                        f'across the end of each epoch ({PATCH}; {ENV}=off turns it off)')
        return wrapped, val_loader

    trainer._prepare_dataloader = patches.mark(prepare_across_epochs, PATCH, prepare)
    return True


class MegatronEpochPrefetch(MegatronTrainerCallback):
    """The `vora_epoch_prefetch` callback (Megatron-SWIFT's callback events; the others are the base's
    no-ops)."""

    def on_train_begin(self):
        wrap_trainer(self.trainer)
