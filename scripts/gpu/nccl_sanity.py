"""NCCL sanity on every GPU of this host: an all-reduce whose answer is known, then its bus bandwidth.

    torchrun --nproc_per_node N scripts/gpu/nccl_sanity.py [--mib 256] [--iters 5]

Each rank contributes (rank + 1); the sum must be N(N+1)/2 on every rank, or the script exits 1. Then a
float32 all-reduce of --mib MiB is timed (after one warm-up) and rank 0 prints the algorithm and bus bandwidth
(bus = algo x 2(N-1)/N, NCCL's convention). Multicast/NVLS stays off (NCCL_NVLS_ENABLE=0, set by setup_env.sh).
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument('--mib', type=int, default=256)
    ap.add_argument('--iters', type=int, default=5)
    args = ap.parse_args()
    local = int(os.environ.get('LOCAL_RANK', 0))
    torch.cuda.set_device(local)
    dist.init_process_group('nccl', device_id=torch.device('cuda', local))
    rank, world = dist.get_rank(), dist.get_world_size()
    x = torch.full((1024, ), float(rank + 1), device='cuda')
    dist.all_reduce(x)
    expected = world * (world + 1) / 2
    ok = bool(torch.all(x == expected))
    flags = torch.tensor([0 if ok else 1], device='cuda')
    dist.all_reduce(flags)
    big = torch.ones(args.mib * 2**20 // 4, device='cuda')
    dist.all_reduce(big)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.iters):
        dist.all_reduce(big)
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / args.iters
    if rank == 0:
        algo = args.mib / 1024 / dt
        print(f'nccl_sanity: world {world}, all_reduce of rank+1 = {x[0].item():g} (expected {expected:g}) on '
              f'{world - int(flags.item())} of {world} ranks; {args.mib} MiB float32 all_reduce {dt * 1e3:.2f} ms, '
              f'algo {algo:.1f} GiB/s, bus {algo * 2 * (world - 1) / world:.1f} GiB/s; '
              f'NCCL_NVLS_ENABLE={os.environ.get("NCCL_NVLS_ENABLE")}, '
              f'nccl {".".join(map(str, torch.cuda.nccl.version()))}',
              flush=True)
    dist.destroy_process_group()
    return 0 if int(flags.item()) == 0 else 1


if __name__ == '__main__':
    sys.exit(main())
