"""Unsloth's fused MoE router under the runner: reached on the loaded model, and counted (opt-in upstream,
`UNSLOTH_MOE_FUSED_ROUTER=1`). On the GPU machine (#30 calls p and r, transformers 5.17) the record showed it never
engaged: 0 fused calls, the model's `Qwen3_5MoeTopKRouter` unfused.

transformers' Qwen3.5-MoE router (`Qwen3_5MoeTopKRouter.forward`) runs an fp32 softmax over the 256 experts,
`torch.topk`, a renormalisation and a cast as separate kernels, each with its backward. At full depth and
micro-batch 4 the H200 profile of #30 call n shows `torch.topk` alone at 30 ms of a 2.505 s step (70 calls over
[31,192 x 256]: the forward and the recompute). unsloth_zoo ships the same routing as one Triton kernel forward and
one backward (`temporary_patches/moe_router_triton.py`: "ties pick the lower index, the same set as CUDA
torch.topk"), off unless `UNSLOTH_MOE_FUSED_ROUTER=1` when unsloth is imported: then it replaces the forward of
the transformers router classes whose source reads exactly as it expects. Classes Unsloth's compiler re-creates in
its cache modules are out of that import-time patch's reach; its loader hook `enable_fused_router(model)` reaches
them, and unsloth_zoo calls it from its ModuleList MoE path only, where the Qwen3.5-MoE's fused expert tensors do
not go.

Why it never engaged on the GPU (calls p, r), found on the CPU by running unsloth_zoo 2026.10.9's compiler on this
transformers: Unsloth's compiler does re-create the router class (a compiled `Qwen3_5MoeTopKRouter_forward` and a
class whose forward is one call of it), and its generated module imports `__name__` from the modeling module, so
the class claims `transformers.models.qwen3_5_moe.modeling_qwen3_5_moe` as its module. unsloth_zoo's reader
(`_router_form`) looks the one-line forward's copy up through `sys.modules[cls.__module__]` -- the real modeling
module, which has no such copy -- and leaves the router unfused. With the switch on, `install` first gives
`_router_form` one more lookup (`compiled_copy`, inventory patch `moe_router_compiled_copy`): where upstream's
reading found nothing, the copy the one-line forward calls, from that forward's own module globals, read against
unsloth_zoo's own router forms; everything else -- the forms, the fused forward it builds, the fallback to the
class's forward -- is unsloth_zoo's. Upstream: `_router_form` could read `fwd.__globals__` instead of `sys.modules`.

With Unsloth's switch on, `install(model)` runs that hook on the loaded model and reports which router classes
route fused (`moe_router` in the runner's result); `fused_calls()` reads unsloth_zoo's own count of fused routing
calls, which the runner adds after training -- 0 means the lever did nothing (a router whose source unsloth_zoo does
not recognise keeps its own forward; its routing off CUDA is the eager one). Nothing is patched here: the switch is
Unsloth's (set it in a recipe's `env:`), read the way unsloth_zoo reads it.
"""
from __future__ import annotations

import functools
import importlib
import inspect
import os
from typing import Any, Dict, Mapping, Optional

from .. import patches

ENV = 'UNSLOTH_MOE_FUSED_ROUTER'
MODULE = 'unsloth_zoo.temporary_patches.moe_router_triton'
PATCH = 'moe_router_compiled_copy'


def wanted(environ: Optional[Mapping[str, str]] = None) -> bool:
    """unsloth_zoo's own reading of its switch: exactly '1' turns it on."""
    environ = os.environ if environ is None else environ
    return environ.get(ENV, '0') == '1'


def install(model: Any, environ: Optional[Mapping[str, str]] = None) -> Dict[str, Any]:
    """With the switch on: unsloth_zoo's loader hook on `model`; returns what the runner records -- the setting, the
    router classes patched now, the model's router classes and those of them that still route as before, or why none."""
    environ = os.environ if environ is None else environ
    state: Dict[str, Any] = {'setting': environ.get(ENV, '0')}
    if not wanted(environ):
        return state
    try:
        router = importlib.import_module(MODULE)
    except ImportError as error:  # an unsloth_zoo without the fused router: say so, train as before
        state['not_installed'] = f'{MODULE}: {error}'
        return state
    if callable(getattr(router, '_router_form', None)):  # the reader the hook asks (a stand-in may have none)
        state['compiled_copy_lookup'] = install_lookup(router)
    state['patched_now'] = list(router.enable_fused_router(model))
    routers = {type(m) for m in model.modules() if type(m).__name__.endswith(('TopKRouter', 'TopkRouter'))}
    state['router_classes'] = sorted(f'{cls.__module__}.{cls.__name__}' for cls in routers)
    # unsloth_zoo marks each forward it replaced: a class whose forward is unmarked routes as before
    unfused = [cls for cls in routers if not getattr(cls.__dict__.get('forward'), '_unsloth_fused_router', False)]
    state['unfused'] = sorted(f'{cls.__module__}.{cls.__name__}' for cls in unfused)
    if unfused:  # calls p and r: unfused, and nothing said why -- the record now says what unsloth_zoo read
        state['why_unfused'] = {f'{cls.__module__}.{cls.__name__}': why_unfused(router, cls)
                                for cls in sorted(unfused, key=lambda c: c.__name__)}
    return state


def compiled_copy(router: Any, cls: type) -> Optional[Any]:
    """The routing copy Unsloth's compiler generated for `cls` (`{Class}_forward`), reached through the one-line
    forward's own module globals; None where the class's forward is not that one line (or is already fused)."""
    forward = cls.__dict__.get('forward')
    if forward is None or getattr(forward, '_unsloth_fused_router', False):
        return None
    name = f'{cls.__name__}_forward'
    if router._body_lines(forward) != (f'return {name}(self, hidden_states=hidden_states)',):
        return None
    return inspect.unwrap(forward).__globals__.get(name)


def _form_through_globals(router: Any, original: Any):
    """unsloth_zoo's `_router_form`, and where it finds no form, the same reading of the compiled copy."""
    @functools.wraps(original)
    def _router_form(cls):
        form = original(cls)
        if form is not None:
            return form
        copy = compiled_copy(router, cls)
        if copy is None:
            return None
        body = router._body_lines(copy)
        for name, (lines, topk_lines) in router._ROUTER_FORMS.items():  # as upstream matches them
            if body != lines:
                continue
            if topk_lines is not None:
                selector = cls.__dict__.get('get_topk_indices')
                if selector is None or router._body_lines(selector) != topk_lines:
                    return None
            return name
        return None

    return patches.mark(_router_form, PATCH, original)


def install_lookup(router: Any) -> str:
    """The compiled-copy lookup in unsloth_zoo's reader (idempotent); what happened, for the record."""
    if patches.patched_by(router._router_form) == PATCH:
        return 'installed'
    if not patches.applicable(PATCH):
        return f'not applied: {patches.check(PATCH)}'
    router._router_form = _form_through_globals(router, router._router_form)
    return 'installed'


def why_unfused(router: Any, cls: type) -> Dict[str, Any]:
    """What unsloth_zoo saw in `cls`: the forward it read (its module, name, file and line: the class's own, or one
    that replaced it), the first lines of the body it compared against its known router forms, and its verdict.
    Read through unsloth_zoo's own reader where it has one, so the record shows exactly what it compared."""
    import inspect
    forward = cls.__dict__.get('forward')
    seen: Dict[str, Any] = {'forward': None if forward is None else
                            f"{getattr(forward, '__module__', '?')}.{getattr(forward, '__qualname__', '?')}"}
    code = getattr(inspect.unwrap(forward), '__code__', None) if forward is not None else None
    if code is not None:
        seen['defined_at'] = f'{code.co_filename}:{code.co_firstlineno}'
    for name in ('_body_lines', '_router_form'):
        if not callable(getattr(router, name, None)):
            seen[name] = 'not in this unsloth_zoo'
    if callable(getattr(router, '_body_lines', None)) and forward is not None:
        body = router._body_lines(forward)
        seen['body'] = None if body is None else list(body[:4])  # None: its inspect.getsource failed
    if callable(getattr(router, '_router_form', None)):
        seen['form'] = router._router_form(cls)
    return seen


def fused_calls() -> Optional[int]:
    """unsloth_zoo's count of fused routing calls in this process (None where its module is not loaded)."""
    import sys
    router = sys.modules.get(MODULE)
    calls = getattr(router, 'ROUTER_CALLS', None) if router is not None else None
    return calls.get('fused') if isinstance(calls, dict) else None
