"""The expert LoRA's scaling applied to the rank-r intermediate instead of the expert output, in Unsloth's grouped-GEMM
MoE forward (opt-in, `SWIFT_VORA_MOE_LORA_SCALE=rank`). Measured once (#30 call j, full depth, micro-batch 4): 1.01x
its twin's median step, 1.4 GiB less reserved, the same losses; a default after a second call and a planner term.

unsloth_zoo's `forward_native_grouped_mm` adds each routed expert's LoRA as `mm_out + lora_delta * scaling`: the
multiplication runs over the whole expert output -- at full depth and micro-batch 4, [249,536 x 2,048] and
[249,536 x 1,024] bf16 tensors, 120 kernels and 86 ms of a 2.73 s step on the H200 (call f's profile,
`torch_profile_shapes.txt`: the forward, its recompute, and the backward's multiplication of the gradient). Scaling
the first GEMM's output (`lora_out`, [249,536 x 16]) instead gives the same product -- (X A s) B = (X A B) s -- at
1/128 of the elements, and the addition's backward then passes the gradient on without a kernel. With LoRA alpha =
2 x rank (scaling 2.0, the recipes' setting) both orders are exact in bf16 (a power of two); with another scaling
they differ by rounding only.

The patch rewrites three statements of that function's source (`REWRITES`), nothing else, after checking the source
is the one the inventory pins (swift_vora/patches.py, `moe_lora_rank_scale`: unsloth_zoo 2026.10.9), and installs
the result in every loaded copy of the module (unsloth_zoo loads a byte-identical copy from its compile cache,
`unsloth_cached_moe_utils`, and calls the function by its global name from there: the Qwen3.5/3.6-MoE experts'
forward is that module's dispatcher). unsloth_zoo's patches of other families import the function by name
(qwen3_vl_moe, gpt_oss, the 4-bit and FP8 expert paths): every loaded `unsloth_zoo` module whose name is bound to
an original gets the rewritten one too (by identity: nothing else is touched). Upstream: the same change would
belong in unsloth_zoo's `forward_native_grouped_mm` (`torch.add(mm_out, lora_delta, alpha=scaling)` saves the
forward's multiplications; scaling the intermediate saves them all).
"""
from __future__ import annotations

import inspect
from typing import Any, Dict, Optional

from .. import patches, switches
from . import moe_down_fold

ENV = 'SWIFT_VORA_MOE_LORA_SCALE'
PATCH = 'moe_lora_rank_scale'
FUNCTION = 'forward_native_grouped_mm'
# the module unsloth_zoo defines it in, and the copy it loads from its compile cache (unsloth_zoo moe_utils.py,
# _load_cached_moe_utils_module)
MODULES = ('unsloth_zoo.temporary_patches.moe_utils', 'unsloth_cached_moe_utils')
LOADED_WHAT = 'unsloth_zoo\'s MoE module (no Unsloth MoE model in this process)'
# (statement as upstream writes it, what it becomes, how many times the function holds it)
REWRITES = (
    ('lora_out = lora_out.contiguous()', 'lora_out = (lora_out * scaling).contiguous()', 2),
    ('mm1_out = mm1_out + lora_delta * scaling', 'mm1_out = mm1_out + lora_delta', 1),
    ('mm2_out = mm2_out + lora_delta * scaling', 'mm2_out = mm2_out + lora_delta', 1),
)


class RewriteMismatch(RuntimeError):
    """The source does not hold a statement the rewrite expects, or holds it another number of times."""


def wanted(environ=None) -> bool:
    return switches.read(ENV, environ) == 'rank'


def rewrite(source: str, rewrites=REWRITES, what: str = FUNCTION) -> str:
    """`source` with every statement of `rewrites` replaced in order; RewriteMismatch when one is not there exactly as
    often. The one statement rewriter of the source-rewriting levers (moe_down_fold's, moe_gate_grad's and
    gdn_qk_heads' statements too)."""
    for old, new, count in rewrites:
        found = source.count(old)
        if found != count:
            raise RewriteMismatch(f'{what}: {old!r} found {found} times, the rewrite expects {count}')
        source = source.replace(old, new)
    return source


def compile_rewritten(module: Any, original: Any, name: str, rewrites, what: str) -> Dict[str, Any]:
    """`original`'s source, checked against patch `name`'s pin, rewritten and compiled against `module`'s globals
    (every name it calls resolves as before) at upstream's line numbers (`patches.compile_at_lines`: tracebacks keep
    them; a method taken out of its class is dedented). Returns the names the compiled source defines."""
    source = inspect.getsource(original)
    if patches.source_hash(source) not in patches.BY_NAME[name].sources.values():
        raise RewriteMismatch(f'{module.__name__}.{what}: not the source {name} was checked against')
    code_of = inspect.unwrap(original).__code__
    return patches.compile_at_lines(rewrite(source, rewrites, what),
                                    f'{code_of.co_filename} ({name}, swift_vora/{patches.BY_NAME[name].where})',
                                    code_of.co_firstlineno, module.__dict__)


def _patched(module: Any, name: str, rewrites) -> Optional[Any]:
    """The rewritten function for `module`'s `forward_native_grouped_mm`, compiled against the module's globals."""
    original = getattr(module, FUNCTION)
    if any(new.count(moe_down_fold.GLOBAL) for _, new, _ in rewrites):
        # the fold's statements call its helpers through one global of the module's own
        setattr(module, moe_down_fold.GLOBAL, moe_down_fold)
    defined = compile_rewritten(module, original, name, rewrites, FUNCTION)
    return patches.mark(defined[FUNCTION], name, original)


def install(environ=None) -> Dict[str, Any]:
    """Install the rewrites the switches ask for -- this module's (SWIFT_VORA_MOE_LORA_SCALE=rank) and the down
    projection's fold (SWIFT_VORA_MOE_DOWN_LORA=fold, speed/moe_down_fold.py), one function for both -- into every
    loaded copy of unsloth_zoo's MoE module. Returns what the runner records (`moe_lora_scale` in its result): the
    setting, the fold's where asked, the modules patched, or why none was."""
    setting = switches.read(ENV, environ)
    state: Dict[str, Any] = {'setting': setting, 'patched': []}
    fold = moe_down_fold.wanted(environ)
    rewrites = REWRITES if setting == 'rank' else ()
    if fold:
        state['down_lora'] = 'fold'
        rewrites = rewrites + moe_down_fold.rewrites(rank_scaled=setting == 'rank')
    if rewrites:
        name = PATCH if setting == 'rank' else moe_down_fold.PATCH
        state.update(patches.install_in_loaded(name, MODULES, FUNCTION, lambda m: _patched(m, name, rewrites),
                                               LOADED_WHAT))
        if fold and name != moe_down_fold.PATCH and state['patched']:
            patches.applied(moe_down_fold.PATCH)  # one replacement carries both rewrites
    return state
