"""How often a gloo rank that finishes before its peer aborts at exit, with and without swift-vora's handler.

The failure (pytorch/pytorch#190489): a process whose gloo group is still connected to a working peer at
interpreter finalization can die in C++ (`terminate called without an active exception`, SIGABRT).
swift_vora/process_group_exit.py installs an atexit handler: ranks that finished training wait for each other
(`monitored_barrier`), then destroy the group. Each launch here starts two gloo ranks (FileStore, CPU),
all-reduces once, lets rank 1 exit while rank 0 lingers `--linger` seconds, and records both exit codes;
`--launches N` launches per setting:

- `freed_*`: nothing but torch holds the group, so destroying it at exit frees it (joins gloo's threads);
- `held_*`: the program keeps a reference to the group, as something inside `swift sft` does (its gloo threads
  were still running after `destroy_process_group()` there), so destroying alone frees nothing;
- `*_no_handler`: plain torch; `held_destroy_only`: the handler without the train-end mark (destroy alone, the
  first version of the fix, which CI showed insufficient inside `swift sft`); `*_handler`: the shipped handler,
  training marked finished as the `TrainEnd` callback does.

    python benchmarks/gloo_exit.py --launches 15

prints one JSON object: per setting, the launches and how many had a rank exit non-zero.
tests/test_process_group_exit.py runs the same launch with the handler.
"""
import argparse
import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

RANK_SCRIPT = textwrap.dedent('''
    import atexit, sys, time
    import torch
    import torch.distributed as dist
    from swift_vora import process_group_exit

    rank, world, store, linger = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
    handler, finished, hold = (flag == '1' for flag in sys.argv[5:8])
    # registered first, so it runs last (atexit is last-in first-out): after the handler's barrier
    atexit.register(lambda: print(f'exit at {time.time():.3f}', flush=True))
    if handler:
        process_group_exit.register()
    original = dist.destroy_process_group

    def spy(*args, **kwargs):  # the handler looks the function up at exit, so this shows it ran
        print(f'rank {rank}: destroyed', flush=True)
        return original(*args, **kwargs)

    dist.destroy_process_group = spy
    dist.init_process_group('gloo', init_method=f'file://{store}', rank=rank, world_size=world)
    if hold:
        HELD = dist.distributed_c10d._get_default_group()  # a module global: alive until finalization
    t = torch.ones(1)
    dist.all_reduce(t)
    print(f'rank {rank}: sum {t.item():.0f}', flush=True)
    if finished:
        process_group_exit.mark_finished()  # what the TrainEnd callback does at train end
    if rank == 0:
        time.sleep(linger)  # rank 0 still busy (the verify_adapter reload) while rank 1 exits
''')

# name: (handler installed, training marked finished, group held)
SETTINGS = {
    'freed_no_handler': (False, False, False),
    'freed_handler': (True, True, False),
    'held_no_handler': (False, False, True),
    'held_destroy_only': (True, False, True),
    'held_handler': (True, True, True),
}


def launch(work: Path, world: int, linger: float = 1.5, handler: bool = True, finished: bool = True,
           hold: bool = True):
    """One launch of `world` ranks in `work` (a fresh folder); [(exit code, stdout, stderr)] per rank."""
    script = work / 'rank.py'
    script.write_text(RANK_SCRIPT)
    argv = [str(work / 'store'), str(linger), *('1' if flag else '0' for flag in (handler, finished, hold))]
    procs = [subprocess.Popen([sys.executable, str(script), str(r), str(world), *argv], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(world)]
    return [(p.wait(timeout=120), p.stdout.read(), p.stderr.read()) for p in procs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--launches', type=int, default=15)
    parser.add_argument('--linger', type=float, default=3.0, help='seconds rank 0 stays after rank 1 exits')
    args = parser.parse_args()
    result = {'command': f'python benchmarks/gloo_exit.py --launches {args.launches} --linger {args.linger}'}
    for name, (handler, finished, hold) in SETTINGS.items():
        failed = 0
        for _ in range(args.launches):
            with tempfile.TemporaryDirectory() as work:
                runs = launch(Path(work), 2, args.linger, handler, finished, hold)
                failed += any(rc != 0 for rc, _, _ in runs)
        result[name] = {'launches': args.launches, 'a_rank_failed': failed}
    print(json.dumps(result))


if __name__ == '__main__':
    main()
