"""Megatron's gradient-accumulation fusion and apex, checked on the machine that trains.

megatron-core fuses the weight-gradient GEMM with the addition into the fp32 main gradient
(`gradient_accumulation_fusion`): Transformer Engine's layers do it themselves, megatron-core's own linear layers (the
output layer among them) through apex's CUDA extension `fused_weight_gradient_mlp_cuda`. ms-swift 4.6 keeps the
fusion on only where `import apex` succeeds (swift/megatron/arguments/megatron_args.py: "apex is not installed, so
gradient accumulation fusion is disabled"), and megatron-core refuses to build a ColumnParallelLinear with the fusion
on when the extension is missing (megatron/core/tensor_parallel/layers.py). Three cases:

- apex with the extension: the fusion runs; nothing to say;
- no apex: ms-swift turns the fusion off for every layer, and megatron-core's DDP then adds each trainable tensor's
  gradient to its main gradient with a kernel of its own, every micro-batch. With LoRA on 256 experts that is
  thousands of small kernels a step (a profiled step of the 8-layer 35B-A3B cut on one H100: 16,514 of them, and
  0.54 s of a 7.1 s step the GPU idle, waiting for the host to launch them). The launch says so and how apex is
  built (Megatron-SWIFT's environment setup);
- apex without the extension (a Python-only install): ms-swift would leave the fusion on and megatron-core stop
  while building the model; the launch passes `--gradient_accumulation_fusion false` and says why.

`find_spec` looks the packages up without importing them (apex's __init__ imports torch and its own modules).
A recipe whose extra_args set `--gradient_accumulation_fusion` is left as it is.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

EXTENSION = 'fused_weight_gradient_mlp_cuda'
FLAG = '--gradient_accumulation_fusion'
BUILD = ('pip install -v --no-build-isolation --config-settings "--build-option=--cpp_ext" --config-settings '
         '"--build-option=--cuda_ext" git+https://github.com/NVIDIA/apex')


@dataclass(frozen=True)
class FusionCheck:
    args: List[str]  # what the launch adds to `megatron sft`
    note: Optional[str]  # what the launch tells the user, None when the fusion runs


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a broken parent package, or a module with __spec__ None
        return False


def check(extra_args: Sequence[str], installed: Optional[Callable[[str], bool]] = None) -> FusionCheck:
    installed = installed or _installed
    if any(a == FLAG or a.startswith(FLAG + '=') for a in extra_args):
        return FusionCheck([], None)
    apex, extension = installed('apex'), installed(EXTENSION)
    if apex and extension:
        return FusionCheck([], None)
    if apex:
        return FusionCheck([FLAG, 'false'], (
            f'apex is installed without its CUDA extension {EXTENSION}: megatron-core would stop building the model '
            f'with gradient accumulation fusion on, so the launch passes {FLAG} false (every trainable tensor\'s '
            f'gradient then added by a kernel of its own: slower with many LoRA tensors). Rebuild apex with '
            f'--cuda_ext to keep the fusion: {BUILD}'))
    return FusionCheck([], (
        f'apex is not installed here: Megatron-SWIFT turns gradient accumulation fusion off, and every trainable '
        f'tensor\'s gradient is added to its fp32 main gradient by a kernel of its own each micro-batch (a MoE\'s '
        f'experts are a tensor each: thousands of small kernels a step, the GPU waiting on the host; LoRA on the '
        f'35B-A3B MoE cut to 8 layers trained 1.28x the tokens/s with the fusion, one H100). '
        f'Megatron-SWIFT\'s environment setup builds apex on the GPU machine: {BUILD}'))
