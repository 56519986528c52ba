"""The grouped-GEMM expert LoRA (swift_vora/backends/megatron_expert_lora.py) on the GPU, without Megatron: each
factor shape of the 35B-A3B MoE's expert LoRA (256 experts, hidden 2048, expert width 512, rank 16) on the routed rows
of one micro-batch of 2 x 7,788 tokens at top-8, against the per-expert products mcore-bridge's reference computes
(one F.linear per expert, as NpuGroupedLoraLinear._fallback_forward), both in bf16, with an fp32 per-expert oracle:
outputs, input gradients and the fp32 main gradients. Also the median of 20 forward + backward passes of each, a
check of where the time goes, not a benchmark of training.

    python scripts/gpu/expert_lora_check.py [--device cuda] [--rows N] [--out DIR]

Imports only torch and that module (the swift_vora package's __init__ is not run: no ms-swift needed). Writes
expert-lora-check-<date>.json into --out (default $OUT, else the current folder); exit 1 when a check fails.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # standalone_import, also under runpy
from standalone_import import backend_module  # noqa: E402

EXPERTS, HIDDEN, EXPERT_WIDTH, RANK = 256, 2048, 512, 16
# (name, in, out): lora_A / lora_B of the gated fc1 (2 x 512 out) and of fc2
FACTORS = (('fc1.lora_A', HIDDEN, RANK), ('fc1.lora_B', RANK, 2 * EXPERT_WIDTH),
           ('fc2.lora_A', EXPERT_WIDTH, RANK), ('fc2.lora_B', RANK, HIDDEN))


def load_module():
    return backend_module('megatron_expert_lora')


def splits(rows: int, experts: int, generator) -> list:
    """Rows per expert as a router hands them out: uneven, a few experts with none."""
    weights = torch.rand(experts, generator=generator) ** 3
    weights[torch.randperm(experts, generator=generator)[:experts // 16]] = 0
    counts = torch.distributions.Multinomial(rows, probs=weights / weights.sum()).sample().long()
    return counts.tolist()


def per_expert(x, weights, m_splits):
    out, start = [], 0
    for w, m in zip(weights, m_splits):
        out.append(torch.nn.functional.linear(x[start:start + m], w))
        start += m
    return torch.cat(out)


def timed(fn, device, repeat=20):
    times = []
    for _ in range(repeat + 3):
        if device.type == 'cuda':
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.type == 'cuda':
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[3:])


def check_factor(mel, name, fan_in, fan_out, rows, device, generator, time_it):
    dtype = torch.bfloat16
    m_splits = splits(rows, EXPERTS, generator)
    x = torch.randn(rows, fan_in, generator=generator).to(device, dtype)
    g = torch.randn(rows, fan_out, generator=generator).to(device, dtype)
    weights = [torch.nn.Parameter((torch.randn(fan_out, fan_in, generator=generator) / fan_in ** 0.5).to(device, dtype))
               for _ in range(EXPERTS)]
    for w in weights:
        w.main_grad = torch.zeros(w.shape, dtype=torch.float32, device=device)
        w.grad_added_to_main_grad = False
    xg = x.clone().requires_grad_(True)
    out = mel.grouped_lora_mm(xg, m_splits, weights)
    out.backward(g)
    # the oracle: the same products per expert in fp32
    x32, g32 = x.float(), g.float()
    want_out = per_expert(x32, [w.detach().float() for w in weights], m_splits)
    want_dx, want_dw, start = torch.zeros_like(x32), [], 0
    for w, m in zip(weights, m_splits):
        want_dx[start:start + m] = g32[start:start + m] @ w.detach().float()
        want_dw.append(g32[start:start + m].t() @ x32[start:start + m])
        start += m
    # bf16 per-expert products (the reference's own rounding) against the same oracle: the error bf16 allows
    ref_out = per_expert(x, [w.detach() for w in weights], m_splits).float()

    def rel(a, b):
        return float((a - b).norm() / b.norm().clamp_min(1e-30))

    dw_err = rel(torch.stack([w.main_grad for w in weights]), torch.stack(want_dw))
    result = {'factor': name, 'in': fan_in, 'out': fan_out, 'rows': rows,
              'experts_without_rows': sum(1 for m in m_splits if m == 0),
              'out_rel_err': rel(out.detach().float(), want_out), 'reference_out_rel_err': rel(ref_out, want_out),
              'dx_rel_err': rel(xg.grad.float(), want_dx), 'main_grad_rel_err': dw_err,
              'grad_added_to_main_grad': all(w.grad_added_to_main_grad for w in weights),
              'empty_experts_main_grad_zero': all(not w.main_grad.any() for w, m in zip(weights, m_splits) if m == 0)}
    result['ok'] = (result['out_rel_err'] < 2e-2 and result['dx_rel_err'] < 2e-2 and dw_err < 2e-2
                    and result['grad_added_to_main_grad'] and result['empty_experts_main_grad_zero'])
    if time_it:
        for w in weights:
            w.main_grad.zero_()

        def grouped():
            xi = x.detach().requires_grad_(True)
            mel.grouped_lora_mm(xi, m_splits, weights).backward(g)

        def loop():
            xi = x.detach().requires_grad_(True)
            per_expert(xi, weights, m_splits).backward(g)

        result['median_s'] = {'grouped_mm': timed(grouped, device), 'per_expert': timed(loop, device)}
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    ap.add_argument('--rows', type=int, default=2 * 7788 * 8)
    ap.add_argument('--out', default=os.environ.get('OUT') or '.')
    ap.add_argument('--no-timing', action='store_true')
    args = ap.parse_args(argv)
    mel = load_module()
    device = torch.device(args.device)
    generator = torch.Generator().manual_seed(0)
    results = [check_factor(mel, name, i, o, args.rows, device, generator, not args.no_timing)
               for name, i, o in FACTORS]
    report = {'date': datetime.date.today().isoformat(), 'torch': torch.__version__,
              'device': torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu',
              'experts': EXPERTS, 'factors': results, 'ok': all(r['ok'] for r in results)}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f'expert-lora-check-{report["date"]}.json')
    with open(path, 'w') as f:
        json.dump(report, f, indent=2)
    for r in results:
        timing = r.get('median_s')
        print(f'{r["factor"]}: out {r["out_rel_err"]:.2e} (bf16 reference {r["reference_out_rel_err"]:.2e}), '
              f'dx {r["dx_rel_err"]:.2e}, main_grad {r["main_grad_rel_err"]:.2e}, ok={r["ok"]}'
              + (f'; fwd+bwd median {1e3 * timing["grouped_mm"]:.2f} ms grouped, '
                 f'{1e3 * timing["per_expert"]:.2f} ms per expert' if timing else ''))
    print(f'{path}: ok={report["ok"]}')
    return 0 if report['ok'] else 1


if __name__ == '__main__':
    sys.exit(main())
