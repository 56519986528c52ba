"""The routed-row gather of Unsloth's grouped-GEMM MoE forward with a backward that undoes the permutation instead of
sorting (opt-in, `SWIFT_VORA_MOE_GATHER=permutation`; not yet measured against its twin).

unsloth_zoo's `forward_native_grouped_mm` gathers each token's row once per routed expert with
`gather_routed_rows(hidden_states, sorted_indices, top_k)`. In eager mode that is `hidden_states[sorted_indices //
top_k]`, whose backward is torch's deterministic `index_put_(accumulate=True)`: it sorts the 8 x tokens indices and
reduces the duplicates (`indexing_backward_kernel`). At full depth and micro-batch 4 the H200 profile of #30 call m
shows it at 51 ms of a 2.46 s step (40 calls, one per layer). unsloth_zoo already has the faster backward:
`_RoutedRowGather` (its forward an `index_select`, its backward `combine_permuted_moe_outputs`: a gather through the
inverse permutation -- `sorted_indices` is an argsort, so every routed slot is read once, no atomics -- and a sum
over the top_k axis, in a fixed order). It uses it only under torch.compile (where the default backward would become
atomic adds), and from top_k 8 ("L4: -55 % at k 8").

With the switch on, `gather_routed_rows` takes that path in eager mode too, wherever upstream's own condition for it
holds except compilation (grad enabled, the input requiring grad, `sorted_indices` a full permutation); otherwise,
and with the switch off, upstream's function runs unchanged. Installed like the expert LoRA scaling
(speed/moe_lora_scale.py): in unsloth_zoo's module and its compile-cache copy, and in any unsloth_zoo module that
imported the function by name. Upstream: the eager branch could use `_RoutedRowGather` whenever top_k >= 8.
"""
from __future__ import annotations

import functools
from typing import Any, Dict

from .. import patches, switches
from . import moe_lora_scale

ENV = 'SWIFT_VORA_MOE_GATHER'
PATCH = 'moe_gather_permutation'
FUNCTION = 'gather_routed_rows'
GATHER_CLASS = '_RoutedRowGather'  # unsloth_zoo's autograd function, read from the same module as the function
# the module unsloth_zoo defines it in, and the copy it loads from its compile cache (as speed/moe_lora_scale.py)
MODULES = moe_lora_scale.MODULES


def wanted(environ=None) -> bool:
    return switches.read(ENV, environ) == 'permutation'


def _wrapped(module: Any):
    """`module`'s gather_routed_rows, taking `module._RoutedRowGather` in eager mode when upstream's condition for
    it (but compilation) holds."""
    import torch
    original = getattr(module, FUNCTION)
    gather = getattr(module, GATHER_CLASS)

    @functools.wraps(original)
    def gather_routed_rows(hidden_states, sorted_indices, top_k):
        if (hidden_states.requires_grad and torch.is_grad_enabled()
                and sorted_indices.numel() == hidden_states.shape[0] * top_k):
            return gather.apply(hidden_states, sorted_indices, top_k)
        return original(hidden_states, sorted_indices, top_k)

    return patches.mark(gather_routed_rows, PATCH, original)


def install(environ=None) -> Dict[str, Any]:
    """Install the wrapper into every loaded copy of unsloth_zoo's MoE module when the switch asks for it. Returns
    what the runner records (`moe_gather` in its result): the setting, the modules patched, or why none was."""
    setting = switches.read(ENV, environ)
    state: Dict[str, Any] = {'setting': setting, 'patched': []}
    if setting == 'permutation':
        state.update(patches.install_in_loaded(PATCH, MODULES, FUNCTION, _wrapped, moe_lora_scale.LOADED_WHAT))
    return state
