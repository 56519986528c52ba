"""How often a gloo rank that leaves before its peer aborts at exit, with and without swift-vora's handler.

The failure (pytorch/pytorch#190489): a process whose gloo default group is still alive at interpreter
finalization can die in C++ (`terminate called without an active exception`, SIGABRT). swift_vora/
process_group_exit.py destroys the group from an atexit handler first. Each launch here starts two gloo ranks
(FileStore, CPU), all-reduces once, lets rank 1 exit while rank 0 lingers `--linger` seconds, and records both
exit codes; `--launches N` launches per setting.

    python benchmarks/gloo_exit.py --launches 15

prints one JSON object: per setting (`handler`, `no_handler`), the launches and how many had a rank exit non-zero.
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
    import sys, time
    import torch
    import torch.distributed as dist
    from swift_vora import process_group_exit

    rank, world, store, linger, handler = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], float(sys.argv[4]),
                                           sys.argv[5] == '1')
    if handler:
        process_group_exit.register()
    original = dist.destroy_process_group

    def spy(*args, **kwargs):  # the handler looks the function up at exit, so this shows it ran
        print(f'rank {rank}: destroyed', flush=True)
        return original(*args, **kwargs)

    dist.destroy_process_group = spy
    dist.init_process_group('gloo', init_method=f'file://{store}', rank=rank, world_size=world)
    t = torch.ones(1)
    dist.all_reduce(t)
    print(f'rank {rank}: sum {t.item():.0f}', flush=True)
    if rank == 0:
        time.sleep(linger)  # rank 0 still busy (the verify_adapter reload) while rank 1 exits
''')


def launch(work: Path, world: int, linger: float = 1.5, handler: bool = True):
    """One launch of `world` ranks in `work` (a fresh folder); [(exit code, stdout, stderr)] per rank."""
    script = work / 'rank.py'
    script.write_text(RANK_SCRIPT)
    argv = [str(work / 'store'), str(linger), '1' if handler else '0']
    procs = [subprocess.Popen([sys.executable, str(script), str(r), str(world), *argv], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(world)]
    return [(p.wait(timeout=120), p.stdout.read(), p.stderr.read()) for p in procs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--launches', type=int, default=15)
    parser.add_argument('--linger', type=float, default=3.0, help='seconds rank 0 stays after rank 1 exits')
    args = parser.parse_args()
    result = {'command': f'python benchmarks/gloo_exit.py --launches {args.launches} --linger {args.linger}'}
    for name, handler in (('no_handler', False), ('handler', True)):
        failed = 0
        for _ in range(args.launches):
            with tempfile.TemporaryDirectory() as work:
                failed += any(rc != 0 for rc, _, _ in launch(Path(work), 2, args.linger, handler))
        result[name] = {'launches': args.launches, 'a_rank_failed': failed}
    print(json.dumps(result))


if __name__ == '__main__':
    main()
