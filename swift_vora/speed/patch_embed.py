"""The Qwen-VL vision patch embedding as one GEMM instead of a Conv3d that cuDNN runs on a slow generic kernel.

Every Qwen2-VL .. Qwen3.5 vision tower embeds its patches with `nn.Conv3d(kernel_size=stride=[t, p, p])` applied to
inputs of exactly that size: one output position per patch, so the convolution is a matrix product of the
flattened patches with the flattened weight. cuDNN does not see that: on the H200 (torch 2.11, bf16) it picked
`implicit_convolveNd_sgemm` and spent 20 ms of a 983 ms step on a product worth 0.6 ms at the GEMM rate of the same
step (run 15, docs/runs/benchmarks-log.md). Upstream: huggingface/transformers#45750; transformers' opt-in
`fusion_config` (#45041) swaps in an `nn.Linear` with a converted, renamed weight -- which would change the names
PEFT, DeepSpeed and `merge_for_vllm.sh` see. Here the module tree and the weights stay as they are: the patch
embedding's forward still calls its `proj`, and that Conv3d instance becomes a `PatchGemmConv3d`, an nn.Conv3d
whose forward computes the same sum as `F.linear` on the flattened input and weight (tests/test_patch_embed.py
compares outputs and gradients).
Called through `proj(...)`, every module hook still runs, so ZeRO-3 gathers the weight as before.

A Conv3d of another kind (a PEFT LoRA wrapper, padding, dilation, groups, a stride other than its kernel) or an
input that is not exactly one patch keeps torch's convolution. `SWIFT_VORA_PATCH_EMBED=conv` keeps transformers'
path altogether.
"""
from __future__ import annotations

from typing import List

from .. import patches, switches

ENV = 'SWIFT_VORA_PATCH_EMBED'
# (module, class) of the patch embeddings whose forward calls `self.proj` (a stride == kernel Conv3d): Qwen2-VL,
# Qwen2.5-VL, Qwen3-VL, Qwen3-VL-MoE, Qwen3.5, Qwen3.5-MoE, as swift_vora/patches.py inventories them.
CLASSES = patches.forward_targets('patch_embed_qwen')
CONV_PATCH = 'patch_embed_conv_forward'  # the per-instance Conv3d forward (swift_vora/patches.py)


def enabled(environ=None) -> bool:
    """`gemm` (default) patches; `conv` keeps transformers' Conv3d; anything else is an error."""
    return switches.read(ENV, environ) == 'gemm'


def is_patch_conv(conv) -> bool:
    """A plain Conv3d whose windows never overlap or pad: one output position per kernel-sized input."""
    import torch.nn as nn
    return (type(conv) is nn.Conv3d and tuple(conv.stride) == tuple(conv.kernel_size)
            and tuple(conv.padding) == (0, 0, 0) and tuple(conv.dilation) == (1, 1, 1) and conv.groups == 1)


def conv_as_gemm(conv, x):
    """Conv3d.forward for `is_patch_conv` modules: an input of exactly one patch per row is one `F.linear`."""
    import torch.nn.functional as F
    if x.dim() != 5 or tuple(x.shape[2:]) != tuple(conv.kernel_size):
        return conv._conv_forward(x, conv.weight, conv.bias)
    weight = conv.weight
    out = F.linear(x.reshape(x.shape[0], -1), weight.reshape(weight.shape[0], -1), conv.bias)
    return out.view(x.shape[0], weight.shape[0], 1, 1, 1)


_gemm_class = None


def gemm_conv_class():
    """`PatchGemmConv3d`: an nn.Conv3d whose forward is `conv_as_gemm` (made once, torch imported on first use).
    An instance changes class, not attributes: it pickles, copies and passes `isinstance(m, nn.Conv3d)` as before."""
    global _gemm_class
    if _gemm_class is None:
        import torch.nn as nn

        class PatchGemmConv3d(nn.Conv3d):
            forward = conv_as_gemm

        PatchGemmConv3d.__module__, PatchGemmConv3d.__qualname__ = __name__, 'PatchGemmConv3d'
        _gemm_class = PatchGemmConv3d
    return _gemm_class


def use_gemm(conv) -> bool:
    """Give one eligible Conv3d instance the GEMM forward (idempotent); False where it keeps torch's."""
    cls = gemm_conv_class()
    if type(conv) is cls:
        return True
    if not is_patch_conv(conv) or not patches.applicable(CONV_PATCH):
        return False
    conv.__class__ = cls
    patches.applied(CONV_PATCH)
    return True


def __getattr__(name):  # pickle (dumping, and loading in a fresh process) looks the class up here
    if name == 'PatchGemmConv3d':
        return gemm_conv_class()
    raise AttributeError(name)


def _make_forward(original):
    def forward(self, hidden_states):
        use_gemm(self.proj)
        return original(self, hidden_states)
    forward.__doc__ = original.__doc__
    return forward


def is_patched(embed_class) -> bool:
    return patches.patched_by(embed_class.forward) is not None


def patch_patch_embeddings() -> List[str]:
    """Wrap the forward of every importable class of CLASSES (idempotent); returns the wrapped class names."""
    if not enabled():
        return []
    from . import replace_forwards
    return replace_forwards('patch_embed_qwen', lambda cls: _make_forward(cls.forward))
