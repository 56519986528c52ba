"""The coalesced distributed optimizer (swift_vora/backends/megatron_coalesced_optimizer.py) on the GPU with the real
parts, without Megatron-SWIFT: megatron-core's DistributedDataParallel and `get_megatron_optimizer` (a ChainedOptimizer
of DistributedOptimizers over Transformer Engine's FusedAdam, precision-aware: master weights as bf16 + 16-bit
remainders, fp32 moments) on the MoE LoRA tensor layout of the 35B-A3B cut to 8 layers -- per layer 256 experts x
(fc1 A [16, 2048], fc1 B [1024, 16], fc2 A [16, 512], fc2 B [2048, 16]), expert-parallel like mcore-bridge's, and 8
dense LoRA tensors a layer: 8,256 tensors. Two copies from one seed, one coalesced; the same backward (a loss over
every tensor, through megatron-core's gradient hooks into the fp32 main gradients) for `--steps` steps.

Checks: the bf16 weights of the two copies equal bit for bit after every step, the gradient norms equal; the runs the
coalesced copy steps over. Also the median `optimizer.step()` time of each (synchronised before and after: the host's
walk over the tensors plus the update), a measure of where the time goes, not a benchmark of training.

    python scripts/gpu/coalesced_optimizer_check.py [--steps 12] [--layers 8] [--out DIR]

One process, world size 1 (NCCL). Writes coalesced-optimizer-check-<date>.json into --out (default $OUT, else the
current folder); exit 1 when a check fails.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # standalone_import, also under runpy
from standalone_import import backend_module  # noqa: E402

EXPERTS, HIDDEN, EXPERT_WIDTH, RANK = 256, 2048, 512, 16
EXPERT_SHAPES = ((RANK, HIDDEN), (2 * EXPERT_WIDTH, RANK), (RANK, EXPERT_WIDTH), (HIDDEN, RANK))
DENSE_SHAPES = ((RANK, HIDDEN), (4096, RANK), (RANK, 4096), (HIDDEN, RANK)) * 2  # attention / shared-expert LoRA


def load_module():
    return backend_module('megatron_coalesced_optimizer')


def build_model(layers: int, seed: int, device: str = 'cuda'):
    import torch
    gen = torch.Generator().manual_seed(seed)

    class LoraTensors(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.tensors = torch.nn.ParameterList()
            for _ in range(layers):
                for _ in range(EXPERTS):
                    for shape in EXPERT_SHAPES:
                        p = torch.nn.Parameter((torch.randn(shape, generator=gen) * 0.02).to(torch.bfloat16))
                        p.allreduce = False  # an expert tensor, as megatron-core marks them
                        self.tensors.append(p)
                for shape in DENSE_SHAPES:
                    self.tensors.append(torch.nn.Parameter((torch.randn(shape, generator=gen) * 0.02)
                                                           .to(torch.bfloat16)))

        def forward(self, scales):
            # every tensor's gradient its own (scale x weight), as a backward leaves one per LoRA tensor
            return sum((p.float().square().sum() * s) for p, s in zip(self.tensors, scales))

    return LoraTensors().to(device)


def make(layers: int, seed: int):
    import torch
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.transformer.transformer_config import TransformerConfig
    config = TransformerConfig(num_layers=1, hidden_size=64, num_attention_heads=4, bf16=True,
                               params_dtype=torch.bfloat16)
    ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True, use_distributed_optimizer=True,
                                               overlap_grad_reduce=False)
    model = DistributedDataParallel(config, ddp_config, build_model(layers, seed))
    opt_config = OptimizerConfig(optimizer='adam', lr=1e-3, weight_decay=0.1, bf16=True, clip_grad=1.0,
                                 use_distributed_optimizer=True, use_precision_aware_optimizer=True,
                                 main_grads_dtype=torch.float32, main_params_dtype=torch.float32,
                                 exp_avg_dtype=torch.float32, exp_avg_sq_dtype=torch.float32)
    return model, get_megatron_optimizer(opt_config, [model])


def step(model, optimizer, scales):
    import torch
    model.zero_grad_buffer()
    optimizer.zero_grad()
    model(scales).backward()
    model.finish_grad_sync()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    ok, grad_norm, _ = optimizer.step()
    torch.cuda.synchronize()
    return ok, float(grad_norm), time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--steps', type=int, default=12)
    parser.add_argument('--layers', type=int, default=8)
    parser.add_argument('--out', default=os.environ.get('OUT') or '.')
    args = parser.parse_args()

    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    os.environ.setdefault('MASTER_ADDR', '127.0.0.1')
    os.environ.setdefault('MASTER_PORT', '29517')
    torch.cuda.set_device(0)
    dist.init_process_group('nccl', rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    mco = load_module()

    per_tensor, coalesced = make(args.layers, seed=0), make(args.layers, seed=0)
    trainer = types.SimpleNamespace(args=types.SimpleNamespace(no_save_optim=True), optimizer=coalesced[1])
    before, after = mco.coalesce_trainer(trainer)
    params = [list(m.module.parameters()) for m, _ in (per_tensor, coalesced)]
    initial = [p.detach().clone() for p in params[0]]
    result = {'date': datetime.date.today().isoformat(), 'gpu': torch.cuda.get_device_name(0),
              'torch': torch.__version__, 'layers': args.layers, 'tensors': len(params[0]),
              'coalesced': {'tensors_before': before, 'runs': after}, 'steps': [], 'failures': []}
    if not after:
        result['failures'].append('nothing was coalesced')
    gen = torch.Generator().manual_seed(1)
    for k in range(1, args.steps + 1):
        scales = (torch.rand(len(params[0]), generator=gen) + 0.5).tolist()
        a = step(*per_tensor, scales)
        b = step(*coalesced, scales)
        same = all(torch.equal(x, y) for x, y in zip(*params))
        result['steps'].append({'step': k, 'ok': [a[0], b[0]], 'grad_norm': [a[1], b[1]],
                                'optimizer_step_s': [round(a[2], 6), round(b[2], 6)], 'weights_equal': same})
        if not same:
            diff = max((x.float() - y.float()).abs().max().item() for x, y in zip(*params))
            result['failures'].append(f'step {k}: the weights differ (max {diff:.3g})')
        if a[1] != b[1]:
            result['failures'].append(f'step {k}: grad norms {a[1]!r} and {b[1]!r}')
    moved = any(not torch.equal(p, q) for p, q in zip(params[0], initial))
    if not moved:
        result['failures'].append('the weights did not move')
    measured = result['steps'][2:]  # the first steps initialise the optimizer's state
    result['median_optimizer_step_s'] = {
        'per_tensor': statistics.median(s['optimizer_step_s'][0] for s in measured),
        'coalesced': statistics.median(s['optimizer_step_s'][1] for s in measured)}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    path = Path(args.out) / f'coalesced-optimizer-check-{result["date"]}.json'
    path.write_text(json.dumps(result, indent=1) + '\n')
    print(json.dumps({k: result[k] for k in ('gpu', 'tensors', 'coalesced', 'median_optimizer_step_s', 'failures')}))
    dist.destroy_process_group()
    return 1 if result['failures'] else 0


if __name__ == '__main__':
    sys.exit(main())
