"""The vision tower's preamble computed on the prefetch thread, so the training step does not wait on it.

Before its first block, transformers' Qwen3-VL / Qwen3.5 vision tower derives its position-embedding interpolation,
rotary position ids and `cu_seqlens` from `grid_thw` (transformers/vision_utils.py): a few dozen small kernels and
14 device-to-host syncs a step on the 35B-A3B at micro-batch 4 (call k's `profile.syncs`,
docs/runs/h200-moe-full/README.md), at the start of every forward, while the GPU has nothing queued. `vision_utils`
was written to take these tensors precomputed: each `get_*` pops its key from the tower's kwargs. This module
computes them with those same functions from the batch's CPU `grid_thw` on the prefetch thread (pinned, copied
with the batch), and a forward pre-hook on the tower hands them over for the `grid_thw` tensor they were made for.
It also fills swift-vora's vision-attention split sizes (speed/vit_attention.py) from the CPU copy, its one sync.

Only a tower whose forward makes exactly the calls mirrored here is hooked (`tower_of` reads the source); any other
(a transformers release that changed them, another family) keeps its own preamble, with the reason recorded.
`SWIFT_VORA_VISION_PREAMBLE=prefetch` turns it on (opt-in until measured); `model` keeps the tower's own.
"""
from __future__ import annotations

import inspect
import re
from typing import Any, Dict, Optional, Tuple

from .. import switches

ENV = 'SWIFT_VORA_VISION_PREAMBLE'
# The calls the hooked forward must make, whitespace removed: the arguments `precompute` mirrors
EXPECTED_CALLS = (
    'get_vision_interpolation_indices_and_weights(grid_thw,num_grid_per_side=self.num_grid_per_side,'
    'mode=self.interpolation_mode,align_corners=self.interpolation_align_corners,'
    'spatial_merge_size=self.config.spatial_merge_size,kwargs=kwargs,)',
    'get_vision_position_ids(grid_thw,self.spatial_merge_size,kwargs=kwargs)',
    'get_vision_attention_seqlens(grid_thw,self.config,kwargs=kwargs)',
)
SPLIT_SIZES_KEY = 'vit_split_sizes'  # not a tower kwarg: the cu_seqlens split sizes, set on the device tensor


def enabled(environ=None) -> bool:
    return switches.read(ENV, environ) == 'prefetch'


def _calls_expected(cls) -> Optional[str]:
    """None when `cls.forward` makes the mirrored calls, else why not."""
    try:
        source = re.sub(r'\s+', '', inspect.getsource(cls.forward))
    except (OSError, TypeError) as e:
        return f'{cls.__name__}.forward: source not readable ({e})'
    missing = [c.split('(', 1)[0] for c in EXPECTED_CALLS if c not in source]
    return f'{cls.__name__}.forward does not call {", ".join(missing)} as mirrored here' if missing else None


def tower_of(model) -> Tuple[Any, Optional[str]]:
    """(the vision tower, None), or (None, why not): the first module with a position-embedding grid."""
    for module in model.modules():
        if hasattr(module, 'num_grid_per_side') and hasattr(module, 'blocks'):
            why = _calls_expected(type(module))
            return (None, why) if why else (module, None)
    return None, 'no vision tower (a module with num_grid_per_side and blocks)'


def precompute(tower, grid_thw) -> Dict[str, Any]:
    """The tower's preamble for a CPU `grid_thw`, by transformers' own functions with the forward's arguments."""
    from transformers import vision_utils as vu

    from .vit_attention import split_sizes
    interp_indices, interp_weights = vu.get_vision_interpolation_indices_and_weights(
        grid_thw, num_grid_per_side=tower.num_grid_per_side, mode=tower.interpolation_mode,
        align_corners=tower.interpolation_align_corners, spatial_merge_size=tower.config.spatial_merge_size)
    position_ids = vu.get_vision_position_ids(grid_thw, tower.spatial_merge_size)
    cu_seqlens, max_seqlen = vu.get_vision_attention_seqlens(grid_thw, tower.config)
    out = {'interp_indices': interp_indices, 'interp_weights': interp_weights, 'position_ids': position_ids,
           'cu_seqlens': cu_seqlens, SPLIT_SIZES_KEY: split_sizes(cu_seqlens)}
    if max_seqlen is not None:  # flash attention only; None lets the tower decide as it would
        out['max_seqlen'] = max_seqlen
    return out


class Preamble:
    """The hook on one tower: `stage(grid_thw, tensors)` before a forward, consumed by the tower's next call with
    that very `grid_thw` tensor (an image tower call with another grid is left alone)."""

    def __init__(self, tower):
        self.tower = tower
        self.staged: Optional[Tuple[Any, Dict[str, Any]]] = None
        self.used = self.unmatched = 0
        self.handle = tower.register_forward_pre_hook(self._hook, with_kwargs=True)

    def stage(self, grid_thw, tensors: Dict[str, Any]) -> None:
        self.staged = (grid_thw, tensors)

    def _hook(self, module, args, kwargs):
        staged, self.staged = self.staged, None
        grid = kwargs.get('grid_thw', args[1] if len(args) > 1 else None)
        if staged is None or staged[0] is not grid:
            self.unmatched += staged is not None
            return None
        tensors = dict(staged[1])
        sizes = tensors.pop(SPLIT_SIZES_KEY)
        from .vit_attention import _CACHE_ATTR
        setattr(tensors['cu_seqlens'], _CACHE_ATTR, list(sizes))  # vit_attention reads them without a sync
        self.used += 1
        return args, {**kwargs, **tensors}

    def summary(self) -> Dict[str, Any]:
        return {'setting': 'prefetch', 'tower': type(self.tower).__name__, 'forwards_fed': self.used,
                'unmatched': self.unmatched}

    def remove(self) -> None:
        self.handle.remove()


def install(model, environ=None) -> Tuple[Optional[Preamble], Dict[str, Any]]:
    """(the hook, its record) when the switch says prefetch and the tower qualifies; (None, why not) otherwise."""
    if not enabled(environ):
        return None, {'setting': 'model'}
    tower, why = tower_of(model)
    if tower is None:
        return None, {'setting': 'model', 'not_installed': why}
    hook = Preamble(tower)
    return hook, hook.summary()
