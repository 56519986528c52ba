"""When the Unsloth runner records a finished step: after each, or one step late (swift_vora/backends/step_ends.py)."""
import pytest

from swift_vora.backends.step_ends import ENV, StepEnds, lagged_requested


class Device:
    """A stand-in for the GPU: what was synchronised and which losses were read back, in order; each mark carries
    the device time at which its step ended (`gpu_s`)."""

    def __init__(self):
        self.events = []

    def sync(self):
        self.events.append('sync')

    def marker(self, loss):
        self.events.append(f'mark {loss}')
        device = self

        class Mark:
            gpu_s = loss  # a step of loss L ends at device time L s (the tests use 1.0, 2.0, ...)

            def wait(self):
                device.events.append(f'read {loss}')
                return float(loss)

            def seconds_until(self, later):
                return later.gpu_s - self.gpu_s
        return Mark()


def test_each_synchronises_after_every_step_and_records_it_at_once():
    dev = Device()
    ends = StepEnds(False, dev.sync, dev.marker)
    done = ends.end(1, 2.5, {'lr': 0.1}, hold=True)  # hold means nothing without lagging
    assert [(d.step, d.loss, d.info) for d in done] == [(1, 2.5, {'lr': 0.1})]
    assert dev.events == ['sync'] and ends.held == 0


def test_lagged_records_a_held_step_once_the_next_is_launched_and_flushes_on_a_synchronised_step():
    dev = Device()
    ends = StepEnds(True, dev.sync, dev.marker)
    assert [d.step for d in ends.end(1, 1.0, {}, hold=False)] == [1]  # the first step: synchronised
    assert ends.end(2, 2.0, {'n': 2}, hold=True) == []  # in flight: nothing known yet, no sync
    assert dev.events == ['mark 1.0', 'sync', 'read 1.0', 'mark 2.0']
    done = ends.end(3, 3.0, {'n': 3}, hold=True)  # step 3 launched: step 2's loss is read, step 3 stays
    assert [(d.step, d.loss, d.info) for d in done] == [(2, 2.0, {'n': 2})]
    assert dev.events[-2:] == ['mark 3.0', 'read 2.0'] and 'sync' not in dev.events[3:]
    done = ends.end(4, 4.0, {'n': 4}, hold=False)  # a save / the last step: everything, in order, after a sync
    assert [d.step for d in done] == [3, 4] and dev.events[-3:] == ['sync', 'read 3.0', 'read 4.0']
    assert ends.held == 2 and ends.pending == []
    # drained together, timed back from the sync by the device time between their ends: 1 s apart, not 0
    assert done[1].at - done[0].at == pytest.approx(1.0)


def test_a_host_bound_step_is_timed_by_the_gpu_not_by_when_the_host_read_it():
    """Call l of #30: launching step N+1 took most of a step, so the host read step N just before N+1 ended. Timed
    by the host's clock the last pair read 2.5 s + 0.09 s and the first measured step carried the missing one."""
    dev, host = Device(), {'t': 0.0}
    ends = StepEnds(True, dev.sync, dev.marker, clock=lambda: host['t'])
    period = 2.5  # the GPU ends step n at n x 2.5 s (the Device's marks carry their loss as their end time)
    host['t'] = 1 * period
    ends.end(1, 1 * period, {}, hold=False)  # synchronised: host clock = GPU end
    recorded = []
    for n in range(2, 6):
        host['t'] = (n * period) - 0.09  # step n launched; the host reads step n-1 only now
        recorded += ends.end(n, n * period, {}, hold=True)
    host['t'] = 6 * period
    recorded += ends.end(6, 6 * period, {}, hold=False)  # the last step: synchronised, drains 5 and 6
    steps = [d.step for d in recorded]
    assert steps == [2, 3, 4, 5, 6]
    times = [1 * period] + [d.at for d in recorded]
    assert [round(b - a, 6) for a, b in zip(times, times[1:])] == [period] * 5


@pytest.mark.parametrize('raw,expected', [(None, False), ('each', False), ('lagged', True)])
def test_the_switch(raw, expected):
    assert lagged_requested({} if raw is None else {ENV: raw}) is expected


def test_a_bad_value_names_the_switch():
    with pytest.raises(Exception, match=ENV):
        lagged_requested({ENV: 'sometimes'})


@pytest.mark.gpu
def test_on_the_gpu_a_host_bound_loop_records_the_gpu_step_period():
    """The CUDA path (pinned copy + timing event) in the call l shape: the GPU is paced by the host's launches (six
    10 ms kernels a step, each enqueued after 11 ms of host work), so the host reads step N-1 about 10 ms before step
    N ends. Every recorded interval is the step period; the host's read times (the old clock) gave one interval of
    nearly two periods at the start of the window and one of ~10 ms at its end."""
    import time

    import torch

    if not torch.cuda.is_available():
        pytest.skip('needs a CUDA GPU (run on the GPU machine: bash scripts/gpu/run_all.sh e2e -k step_ends)')
    from swift_vora.backends.step_ends import cuda_marker

    def gpu_ms(cycles):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    gpu_ms(1000)  # load the kernel
    cycles = int(1_000_000 * 10.0 / gpu_ms(1_000_000))  # ~10 ms of GPU time
    ends = StepEnds(True, torch.cuda.synchronize, cuda_marker(torch))
    loss = torch.zeros((), device='cuda')
    recorded = []
    steps = 8
    for n in range(1, steps + 1):
        for _ in range(6):  # the step's launches: host work, then a kernel the GPU runs at once
            time.sleep(0.011)
            torch.cuda._sleep(cycles)
        loss = loss + 1
        recorded += ends.end(n, loss, {}, hold=1 < n < steps)
    assert [d.step for d in recorded] == list(range(1, steps + 1))
    assert [d.loss for d in recorded] == [float(n) for n in range(1, steps + 1)]
    intervals = [b.at - a.at for a, b in zip(recorded, recorded[1:])]
    period = sorted(intervals)[len(intervals) // 2]
    assert 0.06 < period < 0.1, intervals
    assert all(abs(i - period) < 0.2 * period for i in intervals), intervals
