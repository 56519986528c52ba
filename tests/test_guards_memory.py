"""Guard `memory`: per-phase memory records; an out-of-memory error that says where and on what batch."""
import json
import logging
import os
import types

import pytest
import swift  # noqa: F401  (a test dependency: pyproject [test])
import torch


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def _oom_trainer(tmp_path):
    model = torch.nn.Linear(4, 4)

    def training_step(model_, inputs, *args, **kwargs):
        model(torch.randn(1, 4))  # forward hook fires, then the "backward" runs out of memory
        raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 20.00 GiB')

    args = types.SimpleNamespace(output_dir=str(tmp_path), device=torch.device('cpu'))
    trainer = types.SimpleNamespace(args=args, model=model, accelerator=None, train_dataset=None,
                                    state=types.SimpleNamespace(global_step=0), training_step=training_step)
    trainer.data_collator = lambda samples: {'input_ids': torch.ones(1, 900, dtype=torch.long),
                                             'labels': torch.ones(1, 900, dtype=torch.long),
                                             'video_grid_thw': torch.tensor([[16, 12, 20]])}
    return trainer


def test_oom_without_and_with_the_guard(tmp_path):
    from swift.utils import get_logger

    from swift_vora.guards.memory import MemoryGuard
    # Reproduce: the bare error says nothing about the phase or the batch that caused it.
    trainer = _oom_trainer(tmp_path / 'bare')
    with pytest.raises(torch.OutOfMemoryError) as bare:
        trainer.training_step(trainer.model, trainer.data_collator([{}]))
    assert 'phase' not in str(bare.value) and 'frames' not in str(bare.value)

    trainer = _oom_trainer(tmp_path)
    guard = MemoryGuard(trainer.args, trainer)
    handler = _Collect()
    get_logger().addHandler(handler)
    try:
        guard.on_init_end(trainer.args, trainer.state, None)
        guard.on_train_begin(trainer.args, trainer.state, None)
        guard.on_step_begin(trainer.args, trainer.state, None)
        batch = trainer.data_collator([{}])
        with pytest.raises(torch.OutOfMemoryError, match='Tried to allocate 20.00 GiB'):  # the original error
            trainer.training_step(trainer.model, batch)
    finally:
        get_logger().removeHandler(handler)
    report = '\n'.join(handler.lines)
    assert 'OUT OF MEMORY on rank 0 during phase "backward"' in report
    assert "'video_frames': 32" in report and "'tokens': 900" in report and 'earlier:' in report
    rows = [json.loads(line) for line in open(tmp_path / 'memory_phases.rank0.jsonl')]
    assert [r['phase'] for r in rows] == ['model_loaded', 'train_begin', 'batch_arrived', 'forward', 'oom']
    assert all(r['source'] == 'rss' and r['rss_gib'] > 0 for r in rows)


def test_recording_interval(monkeypatch, tmp_path):
    from swift_vora.guards.memory import MemoryGuard
    monkeypatch.setenv('SWIFT_VORA_MEMORY_FIRST', '2')
    monkeypatch.setenv('SWIFT_VORA_MEMORY_EVERY', '5')
    guard = MemoryGuard(types.SimpleNamespace(), types.SimpleNamespace())
    assert [s for s in range(12) if guard._should_record(s)] == [0, 1, 5, 10]
    monkeypatch.setenv('SWIFT_VORA_MEMORY_EVERY', '0')
    guard = MemoryGuard(types.SimpleNamespace(), types.SimpleNamespace())
    assert [s for s in range(12) if guard._should_record(s)] == [0, 1]


@pytest.mark.slow
def test_phases_recorded_per_rank(guards_ddp_run):
    assert guards_ddp_run['rc'] == 0, guards_ddp_run['log'][-3000:]
    for r in (0, 1):
        rows = [json.loads(x) for x in open(os.path.join(guards_ddp_run['run_dir'], f'memory_phases.rank{r}.jsonl'))]
        phases = [row['phase'] for row in rows]
        for phase in ('model_loaded', 'train_begin', 'batch_arrived', 'forward', 'backward', 'optimizer_step',
                      'train_end'):
            assert phase in phases, (r, phases)
        assert {row['source'] for row in rows} == {'rss'} and all(row['rank'] == r for row in rows)
