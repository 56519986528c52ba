"""Gated DeltaNet's query and key handed to flash-linear-attention at their own head count (opt-in,
`SWIFT_VORA_GDN_QK_HEADS=grouped`; not yet measured against its twin).

Qwen3.5 / Qwen3.6-MoE's Gated DeltaNet has 16 query/key heads and 32 value heads. transformers' forward repeats the
query and the key to 32 heads (`repeat_interleave(num_v_heads // num_k_heads, dim=2)`) before the chunked
delta-rule kernel. fla's `chunk_gated_delta_rule` takes the 16 heads as they are ("GVA": value head h reads key
head h // 2 -- the repeat_interleave order -- and the backward sums each group's key and query gradients): the
repeat is a copy the kernel does not need. At full depth and micro-batch 4 the H200 profile of #30 call n shows
106 copies of [4, 7798, 16, 2, 128] (33.9 ms of a 2.505 s step: 30 layers' forward and recompute, query and key),
and the repeat's backward a reduction fla then does inside its own.

With the switch on, `install(model)` rewrites one statement of the forward the model's Gated DeltaNet classes run
(`REWRITES`): the repeat's condition also asks `kernel_groups(...)`, which is true only on the chunked path (not a
one-token decode step, whose recurrent kernel keeps its inputs as before) and only when the chunk kernel the
forward's module binds is fla's. The forward rewritten is the one that runs: transformers' own (its source pinned
in swift_vora/patches.py, `gdn_qk_grouped_heads_*`), or the copy Unsloth's compiler generates for the class
(`Qwen3_5MoeGatedDeltaNet_forward` in its compiled module, called by a one-line forward), which is taken only when
its statements are transformers' pinned ones (`same_statements`) -- anything else keeps its forward, and the record
says where they differ. The rewrite is compiled against the function's own module globals with its own decorators.
Installed behind a one-time check on the live model, as the vision attention over Unsloth's rewrite
(speed/vit_attention.py): the first call runs the class's forward and ours (without a graph) on the same inputs,
returns the original's output, and keeps ours only where they agree (a kernel that refuses grouped heads keeps the
original too; a call with a cache, which the first forward updates, is left to the original and the check waits).
The Unsloth runner installs it: Unsloth's checkpointing is reentrant (unsloth_zoo forces use_reentrant=True), so a
layer recomputed in the first step's backward builds a fresh graph with ours, and no saved-tensor count has to match
the first forward's. Upstream: transformers could skip the repeat where its fla
fallback is bound (fla 0.5.1, the snapshot unsloth_zoo vendors, and 0.6 both take grouped value heads).
"""
from __future__ import annotations

import inspect
import re
import sys
import textwrap
import weakref
from typing import Any, Dict, Optional, Tuple

from .. import patches, switches
from .moe_lora_scale import RewriteMismatch, rewrite

ENV = 'SWIFT_VORA_GDN_QK_HEADS'
PATCH_PREFIX = 'gdn_qk_grouped_heads_'  # one inventoried patch per model family (swift_vora/patches.py)
GLOBAL = 'swift_vora_gdn_qk_heads'  # the one global the rewritten statement adds to the forward's module
CLASS_PATCHES = {cls: name for name, _, cls in patches.forward_patches(PATCH_PREFIX)}
CONDITION = 'if self.num_v_heads // self.num_k_heads > 1:'
# (statement as transformers writes it, what it becomes, how many times the forward holds it); the unchanged ones
# are what the rewritten condition relies on: the repeat it skips, the names it reads, the call that gets the heads
REWRITES = (
    (CONDITION, 'if self.num_v_heads // self.num_k_heads > 1 and not '
                f'{GLOBAL}.kernel_groups(torch_chunk_gated_delta_rule, use_precomputed_states and seq_len == 1):', 1),
    ('query = query.repeat_interleave(self.num_v_heads // self.num_k_heads, dim=2)',
     'query = query.repeat_interleave(self.num_v_heads // self.num_k_heads, dim=2)', 1),
    ('key = key.repeat_interleave(self.num_v_heads // self.num_k_heads, dim=2)',
     'key = key.repeat_interleave(self.num_v_heads // self.num_k_heads, dim=2)', 1),
    ('if use_precomputed_states and seq_len == 1:', 'if use_precomputed_states and seq_len == 1:', 1),
    ('core_attn_out, last_recurrent_state = torch_chunk_gated_delta_rule(',
     'core_attn_out, last_recurrent_state = torch_chunk_gated_delta_rule(', 1),
)
# Relative difference (max |ours - theirs| / max |theirs|) under which the grouped call counts as the same: the same
# kernel reads the same values (0 expected); a wrong head order differs by O(1)
LIVE_CHECK_TOLERANCE = 1e-2
_KERNEL_MODULE_PREFIX = 'fla.'  # flash-linear-attention (installed, or the snapshot unsloth_zoo vendors as `fla`)
# kernel -> whether it takes grouped heads; weak keys: an id could be reused by another function once one is gone
_kernel_verdict: 'weakref.WeakKeyDictionary[Any, bool]' = weakref.WeakKeyDictionary()
CALLS = {'grouped': 0}  # forward calls that handed the kernel ungrouped query and key, in this process


def wanted(environ=None) -> bool:
    return switches.read(ENV, environ) == 'grouped'


def bound_kernel(kernel: Any) -> Optional[Any]:
    """The package implementation behind a `torch_chunk_gated_delta_rule` global, or None where it is transformers'
    PyTorch reference. transformers' hub wrapper keeps the package's function (fla's `chunk_gated_delta_rule`) in a
    closure cell when that package imported; Unsloth's compiled module wraps that wrapper once more
    (`torch_compiler_disable_unless_decode`, which keeps it as `__wrapped__`): each layer is looked through."""
    obj = kernel
    for _ in range(8):  # a few decorator layers at most
        if obj is None:
            return None
        if getattr(obj, '__name__', '') == 'chunk_gated_delta_rule':
            return obj
        for cell in getattr(obj, '__closure__', None) or ():
            try:
                target = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if callable(target) and getattr(target, '__name__', '') == 'chunk_gated_delta_rule':
                return target
        obj = getattr(obj, '__wrapped__', None)
    return None


def kernel_name(kernel: Any) -> str:
    """What the records call the kernel (the runner's `linear_attention_kernel` too): fla's function by its module,
    else transformers' PyTorch reference."""
    target = bound_kernel(kernel)
    if target is None:
        return 'none' if kernel is None else 'transformers torch_chunk_gated_delta_rule (PyTorch reference)'
    return f'{getattr(target, "__module__", "?")}.{getattr(target, "__name__", "?")}'


def takes_grouped_heads(kernel: Any) -> bool:
    """Whether the chunk kernel is fla's (which takes query and key at their own head count). Decided once per
    kernel."""
    try:
        return _kernel_verdict[kernel]
    except (KeyError, TypeError):  # not decided yet, or an object that takes no weak reference
        pass
    target = bound_kernel(kernel)
    verdict = target is not None and str(getattr(target, '__module__', '')).startswith(_KERNEL_MODULE_PREFIX)
    try:
        _kernel_verdict[kernel] = verdict
    except TypeError:
        pass
    return verdict


def kernel_groups(kernel: Any, decode_step: bool) -> bool:
    """Asked by the rewritten forward at each call: whether this call hands the kernel query and key at their own
    head count -- not on a one-token decode step (the recurrent kernel keeps its repeated inputs), and only to fla's
    chunk kernel. Counts the calls that do."""
    if decode_step or not takes_grouped_heads(kernel):
        return False
    CALLS['grouped'] += 1
    return True


# ---- which forward runs, and is it transformers' ----------------------------------------------------------------
def _body(source: str) -> Tuple[str, ...]:
    """A function's statements, without its decorators, signature and comments (what two copies of one forward share
    when one is renamed and re-decorated)."""
    lines = textwrap.dedent(source).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('def '))
    depth = 0
    for end in range(start, len(lines)):  # the signature ends at the `:` that closes its parentheses
        depth += lines[end].count('(') - lines[end].count(')')
        if depth == 0 and lines[end].rstrip().endswith(':'):
            break
    body = (re.sub(r'\s+#.*$', '', line).rstrip() for line in lines[end + 1:])
    return tuple(line for line in body if line.strip() and not line.strip().startswith('#'))


def same_statements(ours: str, pinned: str) -> Optional[str]:
    """None where `ours` holds exactly `pinned`'s statements (in order); else the first line that differs."""
    a, b = _body(ours), _body(pinned)
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f'statement {i + 1}: {x.strip()!r} where transformers has {y.strip()!r}'
    if len(a) != len(b):
        return f'{len(a)} statements where transformers has {len(b)}'
    return None


def executed_forward(cls: type) -> Tuple[Any, str]:
    """The function a forward call of `cls` runs and what it is: the class's own forward (`class`), or -- when that
    forward is Unsloth's one-line call of a generated copy, `return {Class}_forward(self, ...)` -- the copy that line
    calls, from the forward's own module globals (`unsloth copy`)."""
    forward = cls.forward
    try:
        lines = _body(inspect.getsource(forward))
    except (OSError, TypeError, StopIteration):
        return forward, 'class'
    copy_name = f'{cls.__name__}_forward'
    if len(lines) == 1 and lines[0].strip().startswith(f'return {copy_name}('):
        copy = inspect.unwrap(forward).__globals__.get(copy_name)  # the name the one line calls, where it looks
        if copy is not None:
            return copy, 'unsloth copy'
    return forward, 'class'


def _pinned_source(cls_name: str) -> str:
    return inspect.getsource(patches.resolve(patches.BY_NAME[CLASS_PATCHES[cls_name]].target))


def grouped_forward(cls: type) -> Tuple[Any, Dict[str, Any]]:
    """`cls`'s forward with the repeat asked of the kernel, compiled against the module globals of the function that
    runs now, with its decorators; RewriteMismatch (naming why) where that function is not transformers' pinned
    forward or a copy with its statements."""
    name = CLASS_PATCHES[cls.__name__]
    if not patches.applicable(name):
        raise RewriteMismatch(patches.check(name) or f'{name} not applicable')
    function, what = executed_forward(cls)
    source = inspect.getsource(function)
    if what == 'class':
        if patches.source_hash(source) not in patches.BY_NAME[name].sources.values():
            raise RewriteMismatch(f'{cls.__module__}.{cls.__name__}.forward is not the source {name} was checked '
                                  f'against (another library replaced it?)')
    else:
        differs = same_statements(source, _pinned_source(cls.__name__))
        if differs:
            raise RewriteMismatch(f'Unsloth\'s {function.__name__} is not transformers\' forward: {differs}')
    inner = inspect.unwrap(function)
    module_globals = inner.__globals__
    module_globals[GLOBAL] = sys.modules[__name__]
    defined = patches.compile_at_lines(rewrite(source, REWRITES, f'{cls.__name__}.forward'),
                                       f'{inner.__code__.co_filename} ({name}, swift_vora/speed/gdn_qk_heads.py)',
                                       inner.__code__.co_firstlineno, module_globals)
    # where it was defined: Unsloth's generated module claims the modeling module's name (it imports `__name__`)
    info = {'forward': f'{function.__module__}.{function.__qualname__}', 'what': what,
            'defined_at': f'{inner.__code__.co_filename}:{inner.__code__.co_firstlineno}',
            'kernel': kernel_name(module_globals.get('torch_chunk_gated_delta_rule'))}
    return defined[inner.__code__.co_name], info


def install(model: Any, environ=None) -> Dict[str, Any]:
    """With the switch on: the grouped forward for every Gated DeltaNet class of `model` the inventory knows, behind
    its first-call check. Returns what the runner records (`gdn_qk_heads`): the setting and, per class, what runs or
    why the class keeps its forward (the check's verdict is filled in at the first call)."""
    state: Dict[str, Any] = {'setting': switches.read(ENV, environ)}
    if not wanted(environ):
        return state
    classes = {}
    for cls in {type(m) for m in model.modules()}:
        if cls.__name__ not in CLASS_PATCHES or patches.patched_by(cls.forward) is not None:
            continue
        entry = classes[cls.__name__] = {'class_module': cls.__module__}
        try:
            ours, info = grouped_forward(cls)
        except RewriteMismatch as why:
            entry['state'] = f'kept its forward: {why}'
            continue
        entry.update(info)
        if not takes_grouped_heads(inner_globals_kernel(ours)):
            entry['state'] = f'kept its forward: the chunk kernel is {info["kernel"]}, which takes no grouped heads'
            continue
        entry['state'] = 'installed, waiting for its first call'
        cls.forward = _checking_forward(cls, ours, entry)
    state['classes'] = classes or 'no Gated DeltaNet layer in this model'
    return state


def inner_globals_kernel(function: Any) -> Any:
    return inspect.unwrap(function).__globals__.get('torch_chunk_gated_delta_rule')


def _relative_difference(got, expected) -> float:
    expected, got = expected.detach().float(), got.detach().float()
    return float((got - expected).abs().max()) / float(expected.abs().max().clamp_min(1e-6))


def _checking_forward(cls: type, ours: Any, entry: Dict[str, Any]):
    original = cls.forward
    name = CLASS_PATCHES[cls.__name__]

    def first_call(self, *args, **kwargs):
        import torch
        cache = kwargs.get('cache_params', args[1] if len(args) > 1 else None)
        if cache is not None:  # the original's call updates the cache ours would then read: compare a later call
            return original(self, *args, **kwargs)
        expected = original(self, *args, **kwargs)
        try:
            with torch.no_grad():  # compared, never trained through: no graph kept
                got = ours(self, *args, **kwargs)
            diff = _relative_difference(got, expected) if got.shape == expected.shape else float('inf')
        except (RuntimeError, ValueError, AssertionError) as error:  # a kernel that refuses grouped heads
            entry.update(state=f'kept its forward: the grouped call failed ({type(error).__name__}: {error})')
            cls.forward = original
            return expected
        keep = diff <= LIVE_CHECK_TOLERANCE
        entry.update(state='grouped' if keep else 'kept its forward: the grouped call differs',
                     relative_difference=round(diff, 6))
        cls.forward = patches.mark(ours, name, original) if keep else original
        return expected

    return first_call
