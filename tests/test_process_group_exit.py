"""A rank that finishes before its peers leaves its gloo group cleanly (pytorch/pytorch#190489).

The guards' DDP run lost two CI runs to it: rank 1 finished training while rank 0 was still verifying the
adapter, died in gloo's teardown (SIGABRT), and torchrun reported the trained, saved run as failed. The second
time the group was destroyed at exit already, but something in `swift sft` holds it (the `held` launches here).
"""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'benchmarks'))
from gloo_exit import launch  # noqa: E402 -- the launcher benchmarks/gloo_exit.py counts failures with


def _launch(tmp_path, world, hold=True):
    return launch(tmp_path, world, linger=1.5, handler=True, finished=True, hold=hold)


def test_single_rank_group_destroyed_at_exit(tmp_path):
    [(rc, out, err)] = _launch(tmp_path, 1)
    assert rc == 0, err[-2000:]
    assert 'rank 0: sum 1' in out and 'rank 0: destroyed' in out


@pytest.mark.parametrize('hold', [True, False], ids=['group_held', 'group_freed'])
def test_rank_that_finishes_early_exits_cleanly(tmp_path, hold):
    # Without the handler about one launch in three aborted (benchmarks/gloo_exit.py); four launches catch it.
    for attempt in range(4):
        work = tmp_path / f'launch{attempt}'
        work.mkdir()
        for rank, (rc, out, err) in enumerate(_launch(work, 2, hold)):
            assert rc == 0, f'launch {attempt}: rank {rank} exited {rc}: {err[-2000:]}'
            assert f'rank {rank}: sum 2' in out and f'rank {rank}: destroyed' in out


def test_nothing_to_destroy_without_a_group():
    from swift_vora.process_group_exit import destroy_gloo_group
    assert destroy_gloo_group() is False


def test_plugin_registration_installs_the_handler():
    import swift_vora
    from swift_vora import process_group_exit
    swift_vora.register()
    assert process_group_exit._installed


def _exit_times(runs):
    """When each rank's interpreter reached its last atexit handler (the rank script prints it)."""
    times = []
    for rc, out, err in runs:
        assert rc == 0, err[-2000:]
        [line] = [line for line in out.splitlines() if line.startswith('exit at ')]
        times.append(float(line.split()[-1]))
    return times


def test_finished_ranks_leave_together_and_unfinished_ones_do_not_wait(tmp_path):
    """After train end rank 1 waits for rank 0 (4 s of post-training work); before it (an exception, an
    interrupt) it leaves at once: its peers may be inside a collective that a barrier would falsely match."""
    (tmp_path / 'finished').mkdir()
    (tmp_path / 'unfinished').mkdir()
    rank0, rank1 = _exit_times(launch(tmp_path / 'finished', 2, linger=4, handler=True, finished=True, hold=True))
    assert abs(rank0 - rank1) < 2
    rank0, rank1 = _exit_times(launch(tmp_path / 'unfinished', 2, linger=4, handler=True, finished=False,
                                      hold=False))
    assert rank0 - rank1 > 3


def test_train_end_callback_marks_the_process_finished(monkeypatch):
    from swift_vora import process_group_exit
    monkeypatch.setattr(process_group_exit, '_finished', False)
    process_group_exit.train_end_callback().on_train_end(None, None, None)
    assert process_group_exit._finished


def test_every_trainer_gets_the_train_end_mark_rlhf_included(monkeypatch):
    """The guards hook SFT trainers only, but any gloo run that finishes must leave together."""
    import types

    import swift_vora
    swift_vora.register()
    from swift.trainers.mixin import SwiftMixin
    monkeypatch.setenv('SWIFT_VORA_GUARDS', 'none')
    rlhf = type('DPOTrainer', (), {'__module__': 'swift.rlhf_trainers.dpo_trainer'})()
    sft = type('Seq2SeqTrainer', (), {'__module__': 'swift.trainers.seq2seq_trainer'})()
    args = types.SimpleNamespace(callbacks=[])
    assert [type(cb).__name__ for cb in SwiftMixin._get_callbacks(rlhf, args)] == ['TrainEnd']
    assert [type(cb).__name__ for cb in SwiftMixin._get_callbacks(sft, args)][-1] == 'TrainEnd'
