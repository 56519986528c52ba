"""Qwen3-VL / Qwen3.5 vision attention without a device sync per layer and with one attention call per layer.

Without flash-attn, transformers 5.17's `Qwen3VLVisionAttention.forward` (and the identical Qwen3-VL-MoE, Qwen3.5,
Qwen3.5-MoE copies) splits the packed patch sequence per frame group with `lengths.tolist()` on a CUDA tensor --
a device-to-host sync in every one of the 24 vision layers -- and runs one attention call per group (32 per
layer for a 64-frame clip). A GPU profile (docs/runs/benchmarks-log.md) showed the training step host-bound: the GPU
idle half the time. This narrow patch computes the split sizes once per vision forward (cached on the
`cu_seqlens` tensor that all layers share) and, when every group has the same length -- always the case for one
video, whose frame groups share one grid -- runs all groups as one batched attention call. The arithmetic is the
same block-diagonal attention (tests/test_vit_attention.py compares outputs with transformers' own forward).
Flash-attention configurations keep transformers' path (they pass `cu_seqlens` to a varlen kernel).
`make_equal_groups_block` gives swift_vora/speed/compile_layers.py a whole vision block with that batched call and the
group sizes as ints, which it compiles (one graph for all blocks, no sync inside).

Upstream: huggingface/transformers#47703 ("Fix D2H sync in Qwen VL vision encoder") and #48418 ("avoid repeated
vision attention synchronization"), both open when this was written. `SWIFT_VORA_VIT_ATTENTION=transformers`
keeps transformers' forward.
"""
from __future__ import annotations

import sys
from typing import Any, Dict, List

from .. import patches, switches

ENV = 'SWIFT_VORA_VIT_ATTENTION'
# (module, class) of every vision attention with the per-chunk split (identical code in transformers 5.17: Qwen3-VL,
# Qwen3-VL-MoE, Qwen3.5, Qwen3.5-MoE), as swift_vora/patches.py inventories them.
CLASSES = patches.forward_targets('vit_attention_')
_CACHE_ATTR = '_swift_vora_split_sizes'


def enabled(environ=None) -> bool:
    """`batched` (default) patches; `transformers` keeps transformers' forward; anything else is an error."""
    return switches.read(ENV, environ) == 'batched'


def split_sizes(cu_seqlens) -> List[int]:
    """Lengths of the packed sequences, read from the device once per `cu_seqlens` tensor (one sync, not 24)."""
    sizes = getattr(cu_seqlens, _CACHE_ATTR, None)
    if sizes is None:
        sizes = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
        setattr(cu_seqlens, _CACHE_ATTR, sizes)
    return sizes


def _attention_inputs(attn, mod, hidden_states, position_embeddings):
    """q, k, v as [heads, seq, head_dim] after the rotary embedding (transformers' first half of the forward)."""
    seq_length = hidden_states.shape[0]
    q, k, v = attn.qkv(hidden_states).reshape(seq_length, 3, attn.num_heads, -1).permute(1, 0, 2, 3).unbind(0)
    cos, sin = position_embeddings
    q, k = mod.apply_rotary_pos_emb_vision(q, k, cos, sin)
    return tuple(t.transpose(0, 1) for t in (q, k, v))


def _attention_call(attn, mod, kwargs):
    interface = mod.ALL_ATTENTION_FUNCTIONS.get_interface(attn.config._attn_implementation,
                                                          mod.eager_attention_forward)
    common = dict(attention_mask=None, scaling=attn.scaling,
                  dropout=0.0 if not attn.training else attn.attention_dropout, is_causal=False, **kwargs)
    return interface, common


def equal_groups_attention(attn, mod, hidden_states, position_embeddings, groups: int, length: int, **kwargs):
    """The block-diagonal attention of `groups` packed frame groups of `length` patches each, as one batched call
    (`mod`: the attention class's modeling module). Sizes are plain ints, so a compiled caller needs no sync."""
    q, k, v = _attention_inputs(attn, mod, hidden_states, position_embeddings)
    interface, common = _attention_call(attn, mod, kwargs)
    heads, head_dim = q.shape[0], q.shape[-1]
    q, k, v = (t.reshape(heads, groups, length, head_dim).transpose(0, 1) for t in (q, k, v))
    out = interface(attn, q, k, v, **common)[0]  # [groups, length, heads, head_dim]
    return attn.proj(out.reshape(groups * length, -1).contiguous())


def equal_groups_sizes(cu_seqlens):
    """(groups, length) when every packed group has the same length (one video, or videos of one grid), else None."""
    sizes = split_sizes(cu_seqlens)
    return (len(sizes), sizes[0]) if sizes and len(set(sizes)) == 1 else None


def _make_forward(original, mod):
    import torch

    def forward(self, hidden_states, cu_seqlens, position_embeddings=None, max_seqlen=None, **kwargs):
        if mod.is_flash_attention_requested(self.config):
            return original(self, hidden_states, cu_seqlens, position_embeddings=position_embeddings,
                            max_seqlen=max_seqlen, **kwargs)
        equal = equal_groups_sizes(cu_seqlens)
        if equal is not None:
            return equal_groups_attention(self, mod, hidden_states, position_embeddings, *equal, **kwargs)
        q, k, v = _attention_inputs(self, mod, hidden_states, position_embeddings)
        interface, common = _attention_call(self, mod, kwargs)
        parts = zip(*(t.split(split_sizes(cu_seqlens), dim=1) for t in (q, k, v)))
        out = torch.cat([interface(self, a.unsqueeze(0), b.unsqueeze(0), c.unsqueeze(0), **common)[0]
                         for a, b, c in parts], dim=1)
        return self.proj(out.reshape(hidden_states.shape[0], -1).contiguous())

    return forward


def is_patched(attention_class) -> bool:
    return patches.patched_by(attention_class.forward) is not None


def batched_groups(attn, cu_seqlens):
    """(groups, length) when `attn` can run as one batched call of equal groups through an interface that takes no
    further arguments (transformers' `sdpa` and `eager`, and `vora_varlen` on the non-causal vision tower, ignore
    the model-level kwargs such as `num_items_in_batch` that reach every vision block); None otherwise (flash
    attention's varlen kernel, flex, unequal groups)."""
    if attn.config._attn_implementation not in ('sdpa', 'eager', 'vora_varlen'):  # vora_varlen: sdpa here
        return None
    return equal_groups_sizes(cu_seqlens)


def make_equal_groups_block(block_class, attention_class):
    """`block_class.forward` (transformers 5.17's Qwen3-VL vision block: pre-norm attention and MLP, each added to
    the residual) with the attention as one batched call of equal frame groups: the function compile_layers
    compiles for the vision blocks, taking the group sizes as ints so the compiled graph has no host sync.
    Needs `attention_class` patched."""
    mod = sys.modules[attention_class.__module__]

    def block_forward(block, hidden_states, position_embeddings, groups: int, length: int):
        attended = equal_groups_attention(block.attn, mod, block.norm1(hidden_states), position_embeddings,
                                          groups, length)
        hidden_states = hidden_states + attended
        return hidden_states + block.mlp(block.norm2(hidden_states))

    block_forward.__qualname__ = f'{block_class.__name__}.equal_groups_forward'
    return block_forward


# Relative difference (max |ours - theirs| / max |theirs|) under which a rewritten forward counts as computing what
# ours does: bf16 attention through another kernel differs by ~1e-2 at most; a different computation by far more.
LIVE_CHECK_TOLERANCE = 5e-2


def adopt_over_rewrite(model) -> Dict[str, Any]:
    """The batched forward for vision attention classes of `model` whose forward another library rewrote after
    import -- Unsloth's compiler regenerates Qwen3.5-MoE's modeling classes when it loads the model, so the source
    check of `patch_vision_attention` skipped them (and the tower made one attention call per frame group: 3,456 a
    step at full depth, micro-batch 4). Ours is installed behind a one-time check on the live model: its first call
    runs the rewritten forward and ours on the same inputs, returns the rewritten one's output, and keeps ours only
    when they agree within LIVE_CHECK_TOLERANCE; else the rewritten forward stays. Returns {class: what happened}
    (filled in at that first call)."""
    if not enabled():
        return {}
    import importlib
    report: Dict[str, Any] = {}
    # by class name: a rewriting library may also move the class into a generated module; the helpers ours calls
    # (rotary embedding, attention interfaces) come from transformers' module all the same
    names = {cls: (name, module) for name, module, cls in patches.forward_patches('vit_attention_')}
    for cls in {type(m) for m in model.modules()}:
        if cls.__name__ not in names or patches.patched_by(cls.forward) is not None:
            continue
        name, module = names[cls.__name__]
        report[cls.__name__] = {'state': 'installed, waiting for its first call', 'class_module': cls.__module__}
        cls.forward = _checking_forward(cls, name, importlib.import_module(module), report[cls.__name__])
    return report


def _checking_forward(cls, name: str, mod, entry: Dict[str, Any]):
    rewritten = cls.forward
    ours = _make_forward(rewritten, mod)

    def first_call(self, *args, **kwargs):
        expected = rewritten(self, *args, **kwargs)
        got = ours(self, *args, **kwargs)
        scale = float(expected.detach().float().abs().max().clamp_min(1e-6))
        diff = float((got.detach().float() - expected.detach().float()).abs().max()) / scale
        keep = diff <= LIVE_CHECK_TOLERANCE
        entry.update(state='batched' if keep else 'kept the rewritten forward', relative_difference=round(diff, 6))
        cls.forward = patches.mark(ours, name, rewritten) if keep else rewritten
        return expected

    return first_call


def patch_vision_attention() -> List[str]:
    """Install the forward on every importable class of CLASSES (idempotent); returns the patched class names."""
    if not enabled():
        return []
    from . import replace_forwards
    return replace_forwards('vit_attention_', lambda cls: _make_forward(cls.forward, sys.modules[cls.__module__]))
