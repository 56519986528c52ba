"""A rank that finishes before its peers leaves its gloo group cleanly (pytorch/pytorch#190489).

The guards' DDP run lost a whole CI run to it: rank 1 finished training while rank 0 was still verifying the
adapter, died in gloo's teardown (SIGABRT), and torchrun reported the trained, saved run as failed.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'benchmarks'))
from gloo_exit import launch  # noqa: E402 -- the launcher benchmarks/gloo_exit.py counts failures with


def _launch(tmp_path, world):
    return launch(tmp_path, world, linger=1.5, handler=True)


def test_single_rank_group_destroyed_at_exit(tmp_path):
    [(rc, out, err)] = _launch(tmp_path, 1)
    assert rc == 0, err[-2000:]
    assert 'rank 0: sum 1' in out and 'rank 0: destroyed' in out


def test_rank_that_leaves_early_exits_cleanly(tmp_path):
    # Without the handler about one launch in seven aborted (benchmarks/gloo_exit.py); four launches catch it often.
    for attempt in range(4):
        work = tmp_path / f'launch{attempt}'
        work.mkdir()
        for rank, (rc, out, err) in enumerate(_launch(work, 2)):
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
