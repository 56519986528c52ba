"""The routing weights' gradient of unsloth_zoo's MoE gate-gradient identity as one fused fp32 reduction (opt-in,
`SWIFT_VORA_MOE_GATE_GRAD=fused`; measured once, with the gather: #30 call r, 1.019x their twin).

unsloth_zoo derives each routed row's gate gradient without the expert output (`_MoEGateGradIdentity.backward`):
`dgate = (inter.to(torch.float32) * grad_inter.to(torch.float32)).sum(dim=-1)` over the routed rows x expert
intermediate, then a division by the sign-floored gate. In eager mode the statement writes both operands again in
fp32, then their fp32 product, then reduces it: at full depth and micro-batch 4 call n's profile (#30) shows the two
casts alone as 80 copies of [249,536 x 512] (29.6 ms of a 2.505 s step), the product and the sum beside them (~20 ms
more by their traffic). With `fused` the same statement computes the same fp32 products and fp32 sum as one kernel
(inductor, `torch.compile` of the two-line reduction with a dynamic row count; eager off CUDA) that reads the two
bf16 tensors once. Only the summation order can differ (ulps of fp32, before the gradient's cast to the gate's bf16).

The patch rewrites that one statement of the method's source with moe_lora_scale's rewriter, after checking the
source is the one the inventory pins (swift_vora/patches.py, `moe_gate_grad_fused`), and sets it on the
class in every loaded copy of unsloth_zoo's MoE module (its own and the compile-cache copy unsloth_zoo calls from).
The rest of the backward -- the gate's floor, the division, the input gradient passed through -- is upstream's.
Upstream: the statement could be `torch.linalg.vecdot` on fp32 views or a fused kernel in unsloth_zoo itself.
"""
from __future__ import annotations

from typing import Any, Dict

from .. import patches, switches
from . import moe_lora_scale

ENV = 'SWIFT_VORA_MOE_GATE_GRAD'
PATCH = 'moe_gate_grad_fused'
CLASS = '_MoEGateGradIdentity'
STATEMENT = 'dgate = (inter.to(torch.float32) * grad_inter.to(torch.float32)).sum(dim=-1)'
FUSED = 'dgate = swift_vora_gate_grad.dot(inter, grad_inter)'
REWRITES = ((STATEMENT, FUSED, 1), )
GLOBAL = 'swift_vora_gate_grad'  # the name the rewritten method calls this module by
MODULES = moe_lora_scale.MODULES

_compiled = None  # the fused reduction, compiled at its first call on a GPU


def wanted(environ=None) -> bool:
    return switches.read(ENV, environ) == 'fused'


def _dot(a, b):
    import torch
    return (a.to(torch.float32) * b.to(torch.float32)).sum(dim=-1)


def dot(a, b, compiled: bool = None):
    """Each row's dot product of `a` and `b` with fp32 products and an fp32 sum: one inductor kernel on CUDA (or
    where `compiled` asks), upstream's eager statement elsewhere."""
    global _compiled
    if compiled if compiled is not None else a.is_cuda:
        if _compiled is None:
            import torch
            _compiled = torch.compile(_dot, dynamic=True, fullgraph=True)
        return _compiled(a, b)
    return _dot(a, b)


RewriteMismatch = moe_lora_scale.RewriteMismatch


def rewrite(source: str) -> str:
    return moe_lora_scale.rewrite(source, REWRITES, f'{CLASS}.backward')


def _patched(module: Any) -> Any:
    """The rewritten backward of `module`'s `_MoEGateGradIdentity`, compiled against the module's globals."""
    import sys
    original = getattr(module, CLASS).backward  # the function (a once_differentiable wrapper) behind the staticmethod
    setattr(module, GLOBAL, sys.modules[__name__])  # what the rewritten statement calls
    defined = moe_lora_scale.compile_rewritten(module, original, PATCH, REWRITES, f'{CLASS}.backward')
    return patches.mark(defined['backward'].__func__, PATCH, original)


def install(environ=None) -> Dict[str, Any]:
    """With the switch on: the rewritten backward set on the class of every loaded copy of unsloth_zoo's MoE module.
    Returns what the runner records (`moe_gate_grad` in its result): the setting, the modules patched, or why none."""
    setting = switches.read(ENV, environ)
    state: Dict[str, Any] = {'setting': setting, 'patched': []}
    if setting != 'fused':
        return state
    import sys
    loaded = [sys.modules[m] for m in MODULES if m in sys.modules and hasattr(sys.modules[m], CLASS)]
    if not loaded:
        state['skipped'] = f'{moe_lora_scale.LOADED_WHAT} is not loaded'
        return state
    if not patches.applicable(PATCH):
        state['skipped'] = patches.check(PATCH)
        return state
    for module in loaded:
        cls = getattr(module, CLASS)
        if patches.patched_by(cls.backward) != PATCH:
            cls.backward = staticmethod(_patched(module))
        state['patched'].append(module.__name__)
    return state
