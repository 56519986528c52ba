"""Bytes per position x vocab that Megatron's cross-entropy implementations hold (the planner's
LOGITS_BYTES_MEGATRON, swift_vora/plan/constants.py).

    python benchmarks/megatron_ce_memory.py                  # on a GPU: measured peak per implementation
    python benchmarks/megatron_ce_memory.py --device cpu     # no GPU: the vocab-sized buffers inductor allocates

On CUDA it runs the loss Megatron-SWIFT runs (megatron.core's fused_vocab_parallel_cross_entropy = 'native',
Transformer Engine's parallel_cross_entropy = 'te', vocab_parallel_cross_entropy = unfused) on bf16 logits that
require grad, forward + backward, and reports (max_memory_allocated - allocated before) / (positions x vocab) --
the logits themselves included, as the planner counts them. Two sequence lengths run in turn, as a padding-free
run's samples do (the second compiles the dynamic-shape kernels). On the CPU it prints, for each torch.compile'd
helper of the native loss, the buffers of [positions, vocab] size its inductor output code allocates.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile


class _OneRank:
    """A tensor-parallel group of one (the all-reduces become no-ops)."""

    def rank(self):
        return 0

    def size(self):
        return 1


def _loss(impl: str):
    import torch.distributed as dist
    if not dist.is_initialized():
        dist.all_reduce = lambda *a, **k: None  # TP 1: nothing to reduce
    if impl == 'native':
        from megatron.core.fusions.fused_cross_entropy import fused_vocab_parallel_cross_entropy
        return lambda logits, target: fused_vocab_parallel_cross_entropy(logits, target, _OneRank())
    if impl == 'te':
        from transformer_engine.pytorch.cross_entropy import parallel_cross_entropy
        return lambda logits, target: parallel_cross_entropy(logits, target, 0.0, False, None)
    from megatron.core.tensor_parallel import cross_entropy
    cross_entropy.get_tensor_model_parallel_group = lambda: None
    cross_entropy.get_tensor_model_parallel_rank = lambda: 0
    cross_entropy.get_tensor_model_parallel_world_size = lambda: 1
    return lambda logits, target: cross_entropy.vocab_parallel_cross_entropy(logits, target)


def measure(impl: str, lengths, vocab: int) -> dict:
    import torch
    loss_fn = _loss(impl)
    out = {}
    for s in lengths:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        logits = torch.randn(s, 1, vocab, device='cuda', dtype=torch.bfloat16, requires_grad=True)
        target = torch.randint(0, vocab, (s, 1), device='cuda')
        loss_fn(logits, target).sum().backward()
        torch.cuda.synchronize()
        out[s] = {'bytes_per_position_vocab': (torch.cuda.max_memory_allocated() - before) / (s * vocab),
                  'reserved_gib': torch.cuda.memory_reserved() / 2 ** 30}
        del logits, target
    return out


def cpu_buffers(positions: int = 257, vocab: int = 4099) -> dict:
    """Vocab-sized allocations in the inductor output code of the native loss's compiled helpers (CPU)."""
    import torch
    code_dir = tempfile.mkdtemp(prefix='ce_inductor_')
    os.environ['TORCHINDUCTOR_CACHE_DIR'] = code_dir
    loss_fn = _loss('native')
    for s in (positions, positions + 3):  # the second length: the dynamic-shape recompile
        logits = torch.randn(s, 1, vocab, dtype=torch.bfloat16, requires_grad=True)
        loss_fn(logits, torch.randint(0, vocab, (s, 1))).sum().backward()
    found = {}
    for root, _, files in os.walk(code_dir):
        for name in files:
            if not name.endswith('.py'):
                continue
            text = open(os.path.join(root, name)).read()
            kernel = re.findall(r'cpp_fused_\w+', text)
            sizes = re.findall(r'empty_strided_cpu\(\(([^)]*)\), \([^)]*\), torch\.(\w+)\)', text)
            big = [(shape, dtype) for shape, dtype in sizes if str(vocab) in shape]
            if big:
                found[kernel[0] if kernel else name] = big
    return found


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--device', choices=('cuda', 'cpu'), default='cuda')
    ap.add_argument('--vocab', type=int, default=151936)
    ap.add_argument('--lengths', type=int, nargs='+', default=[2118, 2143])
    ap.add_argument('--impls', nargs='+', default=['native', 'te', 'unfused'])
    args = ap.parse_args(argv)
    if args.device == 'cpu':
        print(json.dumps(cpu_buffers(), indent=1))
        return 0
    results = {}
    for impl in args.impls:
        try:
            results[impl] = measure(impl, args.lengths, args.vocab)
        except ImportError as e:  # TE absent: report it, measure the others
            results[impl] = {'error': f'{type(e).__name__}: {e}'}
    print(json.dumps(results, indent=1))
    return 0


if __name__ == '__main__':
    sys.exit(main())
