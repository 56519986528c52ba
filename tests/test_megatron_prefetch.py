"""`megatron sft`'s training DataLoader read across epoch ends (swift_vora/backends/megatron_prefetch.py), on the CPU
with Megatron-SWIFT's own code: its batch sampler (swift/megatron/trainers/batch_sampler.py, loaded from the
installed ms-swift by path) and its trainer's `_prepare_dataloader`, `_create_dataloader` and `cyclic_iter` (the
methods' source taken from the installed swift/megatron/trainers/base.py, whose module needs transformer_engine to
import), around a stand-in trainer with DataLoader workers.

What a user relies on: the same micro-batches in the same order over epochs as Megatron-SWIFT gives (resumed
mid-epoch and on a data-parallel rank too), training ends after the same number of epochs, and the workers are
already encoding the next epoch when the current one's last micro-batch is taken -- which upstream's loader cannot."""
import ast
import importlib.util
import os
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from swift_vora import patches, switches
from swift_vora.backends import megatron_prefetch
from swift_vora.backends.megatron_prefetch import AcrossEpochs, EpochsOfOneIterator, MegatronEpochPrefetch

SWIFT_MEGATRON = Path(importlib.util.find_spec('swift').submodule_search_locations[0], 'megatron')


def _load_batch_sampler():
    spec = importlib.util.spec_from_file_location('vora_upstream_batch_sampler',
                                                  SWIFT_MEGATRON / 'trainers' / 'batch_sampler.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _trainer_methods(names, namespace):
    """BaseMegatronTrainer's methods `names`, compiled from the installed base.py's source into `namespace`."""
    source = (SWIFT_MEGATRON / 'trainers' / 'base.py').read_text()
    tree = ast.parse(source)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == 'BaseMegatronTrainer')
    found = {}
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name in names:
            exec(compile(textwrap.dedent(ast.get_source_segment(source, node)), str(SWIFT_MEGATRON / 'trainers' /
                                                                                   'base.py'), 'exec'), namespace)
            found[node.name] = namespace[node.name]
    assert set(found) == set(names), f'base.py lacks {set(names) - set(found)}'
    return found


BATCH_SAMPLER = _load_batch_sampler()


def _upstream_trainer_class(dp_rank=0, dp_size=1):
    mpu = SimpleNamespace(get_data_parallel_rank=lambda: dp_rank, get_data_parallel_world_size=lambda: dp_size)

    def no_streaming(*args, **kwargs):
        raise AssertionError('not a streaming dataset')

    namespace = {'torch': torch, 'mpu': mpu, 'logger': SimpleNamespace(info=lambda *a, **k: None),
                 'MegatronPretrainingRandomSampler': BATCH_SAMPLER.MegatronPretrainingRandomSampler,
                 'MegatronPretrainingSampler': BATCH_SAMPLER.MegatronPretrainingSampler,
                 'build_streaming_dataloader': no_streaming}
    methods = _trainer_methods(('cyclic_iter', '_prepare_dataloader', '_create_dataloader'), namespace)
    return type('StandInMegatronTrainer', (), methods)


class Samples(torch.utils.data.Dataset):
    """Sample i is i; each fetch is appended to `log` (one line per sample, from whichever worker fetched it)."""

    def __init__(self, n, log=None):
        self.n, self.log = n, log

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.log:
            with open(self.log, 'a') as f:
                f.write(f'{i}\n')
        return i


def collate(items):
    return list(items)


def make_trainer(n=8, workers=2, consumed=0, dp_rank=0, dp_size=1, epochs=None, log=None):
    trainer = _upstream_trainer_class(dp_rank, dp_size)()
    trainer.args = SimpleNamespace(streaming=False, rlhf_type=None, micro_batch_size=2, data_sharding=False,
                                   train_dataloader_shuffle=True, group_by_length=False, data_seed=42,
                                   dataloader_num_workers=workers, dataloader_pin_memory=False,
                                   dataloader_persistent_workers=True, dataloader_prefetch_factor=2,
                                   num_train_epochs=epochs, train_iters=None)
    trainer.state = SimpleNamespace(consumed_train_samples=consumed, iteration=0)
    trainer.unwrapped_models = [torch.nn.Linear(1, 1).train()]
    trainer.data_collator = collate
    trainer.dataset = Samples(n, log)
    return trainer


def batches(trainer, count):
    """The first `count` micro-batches `cyclic_iter` hands the training loop (one step per micro-batch here)."""
    loader, _ = trainer._prepare_dataloader(trainer.dataset)
    iterator = iter(trainer.cyclic_iter(loader))
    out = []
    for _ in range(count):
        out.append(next(iterator))
        trainer.state.iteration += 1
    return out, loader


@pytest.fixture(autouse=True)
def known_upstream(monkeypatch):
    """The target's module needs transformer_engine to import, so `patches.applicable` cannot resolve it here:
    tests/test_patched_upstream.py checks its parameters and the names it uses in the installed source file."""
    monkeypatch.setattr(patches, 'applicable', lambda name: name == megatron_prefetch.PATCH)


def wrapped(trainer):
    assert megatron_prefetch.wrap_trainer(trainer)
    return trainer


@pytest.mark.parametrize('consumed,dp_rank,dp_size', [(0, 0, 1), (4, 0, 1), (0, 1, 2)],
                         ids=['from the start', 'resumed mid-epoch', 'rank 1 of 2'])
def test_the_same_micro_batches_in_the_same_order_over_epochs(consumed, dp_rank, dp_size):
    upstream, _ = batches(make_trainer(consumed=consumed, dp_rank=dp_rank, dp_size=dp_size), 11)
    ours, loader = batches(wrapped(make_trainer(consumed=consumed, dp_rank=dp_rank, dp_size=dp_size)), 11)
    assert ours == upstream
    assert isinstance(loader, EpochsOfOneIterator) and loader.epochs_started >= 3
    if not consumed and dp_size == 1:  # an epoch is a permutation of the samples, another one each epoch
        epochs = [sorted(i for batch in ours[e * 4:(e + 1) * 4] for i in batch) for e in range(2)]
        assert epochs[0] == epochs[1] == list(range(8))
        assert ours[:4] != ours[4:8]


def test_training_ends_after_the_same_number_of_epochs():
    """`--num_train_epochs 2`: cyclic_iter sets train_iters when the second epoch has been handed out -- at the same
    micro-batch with the loader read across epochs as with upstream's."""
    def when_train_iters_set(trainer):
        loader, _ = trainer._prepare_dataloader(trainer.dataset)
        iterator = iter(trainer.cyclic_iter(loader))
        for taken in range(1, 12):
            next(iterator)
            trainer.state.iteration += 1
            if trainer.args.train_iters is not None:
                return taken, trainer.args.train_iters
        return None

    upstream = when_train_iters_set(make_trainer(epochs=2))
    assert upstream is not None and upstream == when_train_iters_set(wrapped(make_trainer(epochs=2)))


def _fetched(log):
    return [int(line) for line in Path(log).read_text().split()] if os.path.exists(log) else []


def test_workers_encode_the_next_epoch_before_it_starts(tmp_path):
    """The last micro-batch of epoch 1 taken: the workers go on with epoch 2's first ones (polled for, up to 60 s)
    and the first micro-batch of epoch 2 is one of those. Upstream's loader has fetched nothing beyond epoch 1 at
    that point: its sampler's iteration ended with the epoch."""
    log = str(tmp_path / 'upstream.log')
    upstream = make_trainer(log=log)
    loader, _ = upstream._prepare_dataloader(upstream.dataset)
    iterator = iter(upstream.cyclic_iter(loader))
    epoch1 = [next(iterator) for _ in range(4)]
    assert sorted(_fetched(log)) == list(range(8))  # epoch 1 only, however long one waits
    epoch2_first = next(iterator)

    log = str(tmp_path / 'ours.log')
    ours = wrapped(make_trainer(log=log))
    loader, _ = ours._prepare_dataloader(ours.dataset)
    iterator = iter(ours.cyclic_iter(loader))
    assert [next(iterator) for _ in range(4)] == epoch1
    deadline = time.monotonic() + 60
    while not set(epoch2_first) <= set(_fetched(log)[8:]) and time.monotonic() < deadline:
        time.sleep(0.05)
    # the next step's micro-batch was fetched before it was asked for
    assert set(epoch2_first) <= set(_fetched(log)[8:]), 'the next epoch\'s first micro-batch was not fetched ahead'
    assert next(iterator) == epoch2_first


def test_left_as_they_are_a_loader_without_workers_and_other_samplers():
    trainer = wrapped(make_trainer(workers=0))
    loader, _ = trainer._prepare_dataloader(trainer.dataset)
    assert isinstance(loader, torch.utils.data.DataLoader)  # nothing would run ahead: upstream's loader
    sequential = torch.utils.data.DataLoader(Samples(4), batch_size=2, num_workers=1)
    assert megatron_prefetch.across_epochs(make_trainer(), sequential) is sequential


def test_the_callback_wraps_the_trainer_once_before_its_data_iterator_is_built():
    trainer = make_trainer()
    callback = MegatronEpochPrefetch(trainer)
    callback.on_train_begin()
    first = trainer._prepare_dataloader
    assert patches.patched_by(first) == 'megatron_epoch_prefetch'
    callback.on_train_begin()  # a second begin does not wrap the wrapper
    assert trainer._prepare_dataloader is first
    assert not megatron_prefetch.wrap_trainer(trainer)


def test_an_unknown_ms_swift_leaves_upstreams_loader(monkeypatch):
    monkeypatch.setattr(patches, 'applicable', lambda name: False)
    trainer = make_trainer()
    MegatronEpochPrefetch(trainer).on_train_begin()
    assert patches.patched_by(trainer._prepare_dataloader) is None


def test_an_epoch_without_a_micro_batch_ends_instead_of_spinning():
    class Empty:
        def __iter__(self):
            return iter(())

        def __len__(self):
            return 0

    assert list(AcrossEpochs(Empty())) == []


def test_the_launch_names_the_callback_unless_switched_off():
    assert megatron_prefetch.wanted({})
    assert not megatron_prefetch.wanted({megatron_prefetch.ENV: 'off'})
    with pytest.raises(switches.SwitchError, match='SWIFT_VORA_MEGATRON_PREFETCH'):
        megatron_prefetch.wanted({megatron_prefetch.ENV: 'epoch'})
