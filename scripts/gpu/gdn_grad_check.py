"""Gated DeltaNet kernels under Megatron on the GPU: the flash-linear-attention that swift-vora binds for
`megatron sft` (unsloth_zoo's vendored fla 0.5.1, swift_vora/backends/megatron_fla.py) against megatron-core's
PyTorch reference (`torch_chunk_gated_delta_rule`), output and the gradients of q, k, v, g, beta, called the way
mcore-bridge's GatedDeltaNet calls them, at the Qwen3.5/3.6-MoE 35B-A3B shape (32 value heads, head dim 128).

    python scripts/gpu/gdn_grad_check.py [--seq 8192] [--fp32] [--out gdn-grad-check.json]

The check: the kernel in bf16 (what training runs) against the reference in fp32 (tolerance 5e-2) -- must run and
pass. `--fp32` adds the kernel in fp32 against fp32 (tolerance 1e-2; recorded as not run if the kernel refuses fp32
inputs): a diagnostic that cost 306 s on a fresh H200 (2026-12-02, the bf16 check 143 s), so it is not run before
every Megatron benchmark. Exit 0 when they pass, 1 otherwise, 2 when the vendored fla is not installed (unsloth_zoo
missing). Prints and writes the relative errors, the seconds of the kernel and of the reference, the GPU, Triton and
which kernel ran. The kernels compile and autotune into swift-vora's kernel cache (backends/kernel_cache.py), which
the `megatron sft` processes after it read (swift_registry.register_megatron_callbacks).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--seq', type=int, default=8192, help='tokens (a 64-frame sample is ~8.6k)')
    parser.add_argument('--heads', type=int, default=32, help='value heads of the 35B-A3B Gated DeltaNet')
    parser.add_argument('--head-dim', type=int, default=128)
    parser.add_argument('--fp32', action='store_true', help='also check the kernel in fp32 (a diagnostic, ~5 min)')
    parser.add_argument('--out', default=os.path.join(os.environ.get('OUT', '.'), 'gdn-grad-check.json'))
    args = parser.parse_args(argv)
    from swift_vora.backends import kernel_cache
    kernel_cache.use_in_this_process()  # before Triton compiles anything
    import torch
    import triton

    from swift_vora.backends import megatron_fla as mf
    path = mf.vendored_fla_dir()
    if path is None:
        print('gdn_grad_check: unsloth_zoo (its vendored fla) is not installed', file=sys.stderr)
        return 2
    mf.register_vendored(path)
    from fla.modules.l2norm import l2norm
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    from megatron.core.ssm.gated_delta_net import torch_chunk_gated_delta_rule
    shape = dict(seq=args.seq, heads=args.heads, head_dim=args.head_dim, device='cuda')
    result = {'gpu': torch.cuda.get_device_name(), 'capability': list(torch.cuda.get_device_capability()),
              'torch': torch.__version__, 'triton': triton.__version__, 'kernel': chunk_gated_delta_rule.__module__,
              'vendored_dir': path,
              'hopper_fix': getattr(sys.modules.get('fla.ops.common.chunk_o'), mf.HOPPER_FIX_MARK, None) is not None,
              'checks': {}}
    checks = [('bf16', torch.bfloat16, 0.05)] + ([('fp32', torch.float32, 0.01)] if args.fp32 else [])
    for name, dtype, tolerance in checks:
        t0 = time.time()
        try:
            check = mf.gradient_check(chunk_gated_delta_rule, l2norm, torch_chunk_gated_delta_rule, dtype=dtype,
                                      reference_dtype=torch.float32, tolerance=tolerance, **shape)
        except RuntimeError as e:  # a dtype the kernel does not take is recorded, not a wrong gradient
            check = {'ok': None, 'error': f'{type(e).__name__}: {str(e)[:500]}'}
        check['seconds'] = round(time.time() - t0, 1)
        result['checks'][name] = check
        print(f'{name}: ok={check["ok"]} {json.dumps(check.get("rel_error") or check.get("error"))} '
              f'({check["seconds"]} s)', flush=True)
    # bf16 (what training runs) must have run and passed; fp32 must pass if it ran
    result['ok'] = (result['checks']['bf16']['ok'] is True
                    and result['checks'].get('fp32', {}).get('ok') is not False)
    result['kernel_cache'] = kernel_cache.cache_root()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, 'w') as f:
        json.dump(result, f, indent=2)
        f.write('\n')
    print(f'gdn_grad_check: {"OK" if result["ok"] else "FAILED"} -> {args.out}')
    return 0 if result['ok'] else 1


if __name__ == '__main__':
    sys.exit(main())
