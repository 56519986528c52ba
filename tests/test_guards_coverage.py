"""Guard `coverage`: ms-swift's sampler drops tail samples / starves ranks; the guard pads, warns or stops, and
reports samples never seen (also the ones ms-swift silently swapped after an encode error)."""
import json
import os
import types

import pytest
import swift  # noqa: F401  (a test dependency: pyproject [test])
import torch


def _ms_swift_batches(monkeypatch, n, world, batch_size=1, **kwargs):
    """What ms-swift's own BatchSamplerShard yields on each rank (torch.distributed faked per rank)."""
    import torch.distributed as dist
    from swift.dataloader import BatchSamplerShard
    out = []
    for r in range(world):
        monkeypatch.setattr(dist, 'is_initialized', lambda: True)
        monkeypatch.setattr(dist, 'get_rank', lambda r=r: r)
        monkeypatch.setattr(dist, 'get_world_size', lambda: world)
        sampler = BatchSamplerShard(n, batch_size, kwargs.get('shuffle', True), kwargs.get('drop_last', False), 42)
        out.append([list(b) for b in sampler][:len(sampler)])
    monkeypatch.undo()
    return out


def test_ms_swift_sampler_drops_the_same_tail_and_starves_ranks(monkeypatch):
    # Reproduce: 3 samples on 2 ranks -> one sample is never yielded, whatever the epoch's shuffle.
    per_rank = _ms_swift_batches(monkeypatch, 3, 2)
    seen = {i for batches in per_rank for b in batches for i in b}
    assert seen == {0, 1} and 2 not in seen
    # 1 sample on 2 ranks -> no rank gets a batch at all (the `global_step 0/1, train_loss 0` run).
    assert _ms_swift_batches(monkeypatch, 1, 2) == [[], []]

    # The guard's replay of that sampler agrees, and its plan catches both.
    from swift_vora.guards.coverage import plan_coverage, replay_sampler
    assert replay_sampler(3, 2, 1, data_seed=42) == _ms_swift_batches(monkeypatch, 3, 2)
    pad = plan_coverage(3, 2, 1, tail='pad', seed=42)
    assert pad['would_never_train'] == [2] and len(pad['padded']) == 1 and pad['order'][:3] == [0, 1, 2]
    covered = {pad['order'][p] for batches in replay_sampler(4, 2, 1, data_seed=42) for b in batches for p in b}
    assert covered == {0, 1, 2} and pad['error'] is None
    drop = plan_coverage(3, 2, 1, tail='drop', seed=42)
    assert drop['dropped'] == [2] and drop['order'] is None and drop['error'] is None
    stop = plan_coverage(3, 2, 1, tail='stop', seed=42)
    assert stop['error'] and '1 of 3 samples would never be trained' in stop['error']
    empty = plan_coverage(1, 2, 1, tail='pad')
    assert empty['empty_ranks'] == [1] or empty['empty_ranks'] == [0, 1]
    assert 'would get no batch' in empty['error'] and 'SWIFT_VORA_REPLICATE_TINY=1' in empty['error']
    smoke = plan_coverage(1, 2, 1, tail='pad', replicate=True)
    assert smoke['error'] is None and smoke['replicated'] and smoke['samples_per_rank'] == [1, 1]


@pytest.mark.parametrize('n,world,bs,drop_last,shuffle', [(7, 4, 1, False, True), (10, 3, 2, False, False),
                                                          (10, 3, 2, True, True), (9, 8, 1, False, True),
                                                          (16, 4, 3, True, False)])
def test_pad_covers_every_sample(n, world, bs, drop_last, shuffle):
    from swift_vora.guards.coverage import plan_coverage, replay_sampler
    plan = plan_coverage(n, world, bs, tail='pad', seed=0, drop_last=drop_last, shuffle=shuffle)
    assert plan['error'] is None
    order = plan['order'] or list(range(n))
    batches = replay_sampler(len(order), world, bs, drop_last=drop_last, shuffle=shuffle, data_seed=0)
    assert {order[p] for rank in batches for b in rank for p in b} == set(range(n))
    assert len(plan['padded']) < world * bs  # the repeats stay below one global batch
    assert len({len(rank) for rank in batches}) == 1  # every rank runs the same number of steps


def _fake_trainer(dataset, output_dir, world=1):
    """Just what the tap and the coverage guard read from an ms-swift trainer."""
    args = types.SimpleNamespace(output_dir=str(output_dir), data_seed=42, dataloader_drop_last=False,
                                 train_dataloader_shuffle=False, group_by_length=False, deepspeed=None, device=None,
                                 max_steps=-1)
    trainer = types.SimpleNamespace(args=args, train_dataset=dataset, template=types.SimpleNamespace(
        sequence_parallel_size=1), _train_batch_size=1, state=types.SimpleNamespace(global_step=0),
        model=None, accelerator=None)
    trainer.data_collator = lambda samples: {'labels': torch.tensor([[s['label'] for s in samples]]),
                                             'input_ids': torch.tensor([[1, 2, 3]])}
    trainer.training_step = lambda model, inputs, *a, **k: torch.tensor(0.0)
    return trainer


def test_swapped_sample_is_reported_never_seen(tmp_path, monkeypatch):
    """ms-swift's LazyLLMDataset replaces a row whose encoding raises with a random other row (strict=False),
    logging only a traceback. The coverage guard's tag follows the row actually encoded."""
    from datasets import Dataset
    from swift.dataset import LazyLLMDataset

    rows = Dataset.from_list([{'text': f'row{i}', 'chat_template_kwargs': {'sample_id': f's{i}'}} for i in range(4)])

    def encode(row, return_length=False):
        if row['text'] == 'row1':
            raise ValueError('broken video')
        return {'label': 5, 'text': row['text']}

    # Reproduce: asking for sample 1 silently returns another sample.
    lazy = LazyLLMDataset(rows, encode, random_state=0)
    assert lazy[1]['text'] != 'row1'

    from swift_vora.guards.common import get_tap
    from swift_vora.guards.coverage import CoverageGuard
    monkeypatch.setenv('SWIFT_VORA_TAIL', 'pad')
    lazy = LazyLLMDataset(rows, encode, random_state=0)
    trainer = _fake_trainer(lazy, tmp_path)
    guard = CoverageGuard(trainer.args, trainer)
    guard.on_init_end(trainer.args, trainer.state, None)
    guard.on_epoch_begin(trainer.args, trainer.state, None)
    for i in range(len(lazy)):  # what the dataloader + training loop do, one sample per batch
        batch = trainer.data_collator([lazy[i]])
        trainer.training_step(None, batch)
    guard.on_epoch_end(trainer.args, trainer.state, None)
    summary = [json.loads(line) for line in open(tmp_path / 'coverage_summary.jsonl')]
    assert summary[-1]['never_seen'] == [1] and 's1' in summary[-1]['never_seen_ids']
    per_rank = [json.loads(line) for line in open(tmp_path / 'coverage.rank0.jsonl')]
    assert len(per_rank[0]['indices']) == 4 and 1 not in per_rank[0]['indices']
    assert get_tap(trainer).indexed is lazy.dataset


def test_tail_policy_stop_raises(tmp_path, monkeypatch):
    from datasets import Dataset
    from swift.dataset import LazyLLMDataset

    from swift_vora.guards.common import GuardError
    from swift_vora.guards.coverage import CoverageGuard
    rows = Dataset.from_list([{'text': f'row{i}'} for i in range(3)])
    lazy = LazyLLMDataset(rows, lambda row, return_length=False: {'label': 1}, random_state=0)
    trainer = _fake_trainer(lazy, tmp_path)
    monkeypatch.setattr('swift_vora.guards.coverage.world_size', lambda: 2)
    monkeypatch.setenv('SWIFT_VORA_TAIL', 'stop')
    with pytest.raises(GuardError, match='would never be trained'):
        CoverageGuard(trainer.args, trainer).on_init_end(trainer.args, trainer.state, None)
    monkeypatch.setenv('SWIFT_VORA_TAIL', 'pad')
    CoverageGuard(trainer.args, trainer).on_init_end(trainer.args, trainer.state, None)
    assert len(lazy) == 4 and sorted(lazy.dataset.order[:3]) == [0, 1, 2]
    assert json.load(open(tmp_path / 'coverage_plan.json'))['would_never_train'] == [2]


ONE_SAMPLE_ARGS = ('--max_steps', '1')


@pytest.mark.slow
def test_two_ranks_one_sample_trains_nothing(tiny_model_dir, guard_sft, tmp_path):
    """Reproduce (guards off): ms-swift trains zero steps and reports success. (Epoch-based, transformers 5.17
    instead fails with a misleading "args.max_steps must be set to a positive value if dataloader does not have
    a length"; with a step budget, as recipes use, the run "succeeds".)"""
    rows = guard_sft.text_rows(tmp_path / 'one.jsonl', 1)
    off = guard_sft(tiny_model_dir, rows, tmp_path / 'off', nproc=2, extra=ONE_SAMPLE_ARGS,
                    env={'SWIFT_VORA_GUARDS': 'none'})
    assert off['rc'] == 0, off['log'][-3000:]
    assert "'global_step/max_steps': '0/1'" in off['log'] and "'train_loss': '0'" in off['log']


@pytest.mark.slow
def test_two_ranks_one_sample_guard_stops(tiny_model_dir, guard_sft, tmp_path):
    """Guard on, same run: it stops before training, with the reason and the way out."""
    rows = guard_sft.text_rows(tmp_path / 'one.jsonl', 1)
    on = guard_sft(tiny_model_dir, rows, tmp_path / 'on', nproc=2, extra=ONE_SAMPLE_ARGS,
                   env={'SWIFT_VORA_GUARDS': 'coverage'})
    assert on['rc'] != 0
    assert '[swift-vora guard coverage]' in on['log'] and 'would get no batch' in on['log']
    assert 'SWIFT_VORA_REPLICATE_TINY=1' in on['log']


@pytest.mark.slow
def test_two_ranks_three_samples_pad_and_record(guards_ddp_run):
    """2 processes, 3 samples: ms-swift alone trains 2; the guard pads to 4 and every sample is seen."""
    run = guards_ddp_run
    assert run['rc'] == 0, run['log'][-4000:]
    plan = json.load(open(os.path.join(run['run_dir'], 'coverage_plan.json')))
    assert plan['world_size'] == 2 and plan['would_never_train'] == [2] and len(plan['padded']) == 1
    assert plan['samples_per_rank'] == [2, 2]
    consumed = {}
    for r in (0, 1):
        lines = [json.loads(x) for x in open(os.path.join(run['run_dir'], f'coverage.rank{r}.jsonl'))]
        assert lines[0]['rank'] == r and len(lines[0]['indices']) == 2
        consumed[r] = lines[0]['sample_ids']
    assert set(consumed[0]) | set(consumed[1]) == {'t0', 't1', 't2'}
    summary = [json.loads(x) for x in open(os.path.join(run['run_dir'], 'coverage_summary.jsonl'))]
    assert summary[-1]['never_seen'] == [] and summary[-1]['consumed_per_rank'] == [2, 2]
    assert 'swift-vora coverage: epoch 0: 3 of 3 samples trained' in run['log']


def test_packed_rows_are_tagged_per_sample():
    """A packed row is a list of encoded samples: each carries its own index through the collator, and ms-swift's
    collator never sees the tag."""
    import torch

    from swift_vora.guards.common import META_KEY, SAMPLE_KEY, MetaCollator, PackedMembers, is_packing_dataset
    members = PackedMembers([{'input_ids': [i, i + 1], 'chat_template_kwargs': {'sample_id': f's{i}'}}
                             for i in range(3)])
    seen_by_swift = []

    def collate(rows):
        seen_by_swift.extend(m for row in rows for m in row)
        return {'input_ids': torch.tensor([[1, 2, 3, 4, 5, 6]])}

    batch = MetaCollator(collate)([[members[0], members[2]], [members[1]]])
    assert batch[META_KEY]['indices'] == [0, 2, 1] and batch[META_KEY]['sample_ids'] == ['s0', 's2', 's1']
    assert all(SAMPLE_KEY not in m for m in seen_by_swift)
    assert is_packing_dataset(types.SimpleNamespace(packed_idx=[[0, 2], [1]], dataset=members))
    assert not is_packing_dataset(types.SimpleNamespace(dataset=members))


@pytest.mark.slow
def test_two_ranks_packed_rows_pad_and_count_every_sample(tiny_model_dir, guard_sft, tmp_path):
    """`--packing true` on 2 processes: 5 samples of ~46 tokens packed two per row (max_length 100) make 3 rows;
    ms-swift's sampler would never train the third row's sample(s). The guard pads whole rows (the dataset's
    `packed_idx`) and counts coverage per sample, not per row: all 5 trained."""
    rows = guard_sft.text_rows(tmp_path / 'rows.jsonl', 5)
    run = guard_sft(tiny_model_dir, rows, tmp_path / 'out', nproc=2,
                    extra=('--packing', 'true', '--attn_impl', 'vora_varlen', '--max_length', '100'))
    assert run['rc'] == 0, run['log'][-4000:]
    assert 'swift-vora coverage: 5 samples in 3 packed rows, 2 ranks' in run['log']
    plan = json.load(open(os.path.join(run['run_dir'], 'coverage_plan.json')))
    assert len(plan['would_never_train']) == 1 and len(plan['padded']) == 1 and plan['samples_per_rank'] == [2, 2]
    summary = [json.loads(x) for x in open(os.path.join(run['run_dir'], 'coverage_summary.jsonl'))]
    assert summary[-1]['samples'] == 5 and summary[-1]['never_seen'] == [] and summary[-1]['tracked']
    assert 'swift-vora coverage: epoch 0: 5 of 5 samples trained' in run['log']


class _Log:
    """Records what the coverage guard logs, by level."""

    def __init__(self):
        self.lines = []

    def info(self, msg, *a, **k):
        self.lines.append(('INFO', msg))

    def warning(self, msg, *a, **k):
        self.lines.append(('WARNING', msg))


def _train_epoch(guard, trainer, lazy, *, batches, grad_accum, max_steps=-1):
    """HF's `_run_epoch` as the guard sees it: `batches` micro-batches of one sample, an optimizer step every
    `grad_accum` of them, and `control.should_training_stop` once `max_steps` is reached (DefaultFlowCallback)."""
    control = types.SimpleNamespace(should_training_stop=False, should_epoch_stop=False)
    trainer.args.max_steps = max_steps
    guard.on_epoch_begin(trainer.args, trainer.state, control)
    for step in range(batches):
        trainer.training_step(None, trainer.data_collator([lazy[step]]))
        if (step + 1) % grad_accum == 0 or step + 1 == batches:
            trainer.state.global_step += 1
            if 0 < max_steps <= trainer.state.global_step:
                control.should_training_stop = True
                break
    guard.on_epoch_end(trainer.args, trainer.state, control)


def test_step_budget_ending_the_epoch_is_not_reported_as_never_seen(tmp_path, monkeypatch):
    """H200 run (docs/runs/h200-zero3-dense-guards.log): 14 samples, `--max_steps 4 --gradient_accumulation_steps
    2` trains 8 samples by design, and the guard warned `NEVER SEEN: 6 ... (encode errors swapped them ...)`.
    The epoch did not end, so those 6 were not reached: INFO, `epoch_complete: false`, `reason: max_steps`."""
    from datasets import Dataset
    from swift.dataset import LazyLLMDataset

    from swift_vora.guards import coverage
    from swift_vora.guards.coverage import CoverageGuard
    rows = Dataset.from_list([{'text': f'row{i}', 'chat_template_kwargs': {'sample_id': f's{i}'}} for i in range(14)])
    lazy = LazyLLMDataset(rows, lambda row, return_length=False: {'label': 5}, random_state=0)
    trainer = _fake_trainer(lazy, tmp_path)
    log = _Log()
    monkeypatch.setattr(coverage, 'logger', log)
    monkeypatch.setenv('SWIFT_VORA_TAIL', 'pad')
    guard = CoverageGuard(trainer.args, trainer)
    guard.on_init_end(trainer.args, trainer.state, None)
    assert guard.plan['batches_per_rank'] == [14]
    _train_epoch(guard, trainer, lazy, batches=14, grad_accum=2, max_steps=4)

    epoch_lines = [(level, m) for level, m in log.lines if 'epoch 0' in m]
    assert len(epoch_lines) == 1, log.lines
    level, message = epoch_lines[0]
    # Before the fix: ('WARNING', 'epoch 0: 8 of 14 samples trained; NEVER SEEN: 6: ... (encode errors ...)').
    assert level == 'INFO' and 'NEVER SEEN' not in message and 'encode error' not in message, message
    assert 'training stopped at step 4 of the epoch (max_steps) after 8 of 14 samples; 6 not reached' in message
    assert 's8' in message  # still named
    summary = [json.loads(line) for line in open(tmp_path / 'coverage_summary.jsonl')][-1]
    assert summary['epoch_complete'] is False and summary['reason'] == 'max_steps'
    assert summary['not_reached'] == list(range(8, 14)) and summary['never_seen'] == []
    assert summary['batches_consumed_per_rank'] == [8] and summary['batches_planned_per_rank'] == [14]
    per_rank = [json.loads(line) for line in open(tmp_path / 'coverage.rank0.jsonl')][-1]
    assert per_rank['batches_consumed'] == 8 and per_rank['batches_planned'] == 14


def test_step_budget_ending_with_the_epoch_still_warns_never_seen(tmp_path, monkeypatch):
    """The criterion is batches consumed vs the sampler's planned batches, not `should_training_stop`: a budget
    that ends exactly with the epoch sets that flag too, and a swapped sample must still be a NEVER SEEN warning."""
    from datasets import Dataset
    from swift.dataset import LazyLLMDataset

    from swift_vora.guards import coverage
    from swift_vora.guards.coverage import CoverageGuard
    rows = Dataset.from_list([{'text': f'row{i}', 'chat_template_kwargs': {'sample_id': f's{i}'}} for i in range(4)])

    def encode(row, return_length=False):
        if row['text'] == 'row1':
            raise ValueError('broken video')
        return {'label': 5}

    lazy = LazyLLMDataset(rows, encode, random_state=0)
    trainer = _fake_trainer(lazy, tmp_path)
    log = _Log()
    monkeypatch.setattr(coverage, 'logger', log)
    guard = CoverageGuard(trainer.args, trainer)
    guard.on_init_end(trainer.args, trainer.state, None)
    _train_epoch(guard, trainer, lazy, batches=4, grad_accum=2, max_steps=2)
    level, message = [(level, m) for level, m in log.lines if 'epoch 0' in m][0]
    assert level == 'WARNING' and 'NEVER SEEN: 1: 1 (s1)' in message and 'encode errors' in message, message
    summary = [json.loads(line) for line in open(tmp_path / 'coverage_summary.jsonl')][-1]
    assert summary['epoch_complete'] is True and summary['reason'] is None and summary['never_seen'] == [1]
    assert summary['not_reached'] == []
