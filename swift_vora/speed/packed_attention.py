"""`vora_varlen`: packed sequences (`--padding_free` / `--packing`) without the flash-attn package.

ms-swift packs a micro-batch into one row (`--padding_free true`, or `--packing true` for whole-dataset bins)
and hands transformers the document boundaries as `cu_seq_lens_q/k`; only flash-attn's attention reads them, so
ms-swift 4.6 refuses both options for every other `--attn_impl`. flash-attn has no wheel for the torch our GPU
image carries, and sdpa or flex would not see the boundaries (the trainer pops the text position ids they would
need): every packed row would attend across its clips.

This registers a transformers attention implementation, `vora_varlen` (`AttentionInterface.register`, the public
hook for custom attention), and lets ms-swift's padding-free check accept it (`sft_padding_free_check` in
swift_vora/patches.py). A causal self-attention call over one row that carries `cu_seq_lens_q` attends within each
document: on CUDA in bf16/fp16 through PyTorch's own variable-length flash kernel
(`torch.nn.attention.varlen.varlen_attn`; offsets stay on the device, no sync), elsewhere as one causal sdpa call
per document (offsets that do not cover the row are an error there). Every other call -- unpacked batches, the
vision tower (not causal, whatever model-level kwargs reach it) -- is transformers' sdpa, mask function included.
So the arithmetic is sdpa's, per document: tests/test_packed_attention.py shows a packed run's losses and gradient
norms equal to the padded run's.

Use: `swift sft --custom_register_path swift_vora --attn_impl vora_varlen --padding_free true` (or
`--packing true`). `SWIFT_VORA_PACKED_ATTENTION=0` registers nothing and leaves ms-swift's check as it is.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, NamedTuple, Optional

from .. import patches, switches
from .vit_attention import split_sizes

ENV = 'SWIFT_VORA_PACKED_ATTENTION'
NAME = 'vora_varlen'
PADDING_FREE_PATCH = 'sft_padding_free_check'  # swift_vora/patches.py
PACKED_KEYS = ('cu_seq_lens_q', 'cu_seq_lens_k', 'max_length_q', 'max_length_k')


def enabled(environ=None) -> bool:
    return bool(switches.read(ENV, environ))


def _is_packed_self_attention(module, query, key, is_causal, kwargs) -> bool:
    """A causal self-attention over one packed row: the decoder layers of a padding-free batch. The vision tower's
    calls are not causal, an unpacked batch carries no `cu_seq_lens_q`."""
    causal = is_causal if is_causal is not None else getattr(module, 'is_causal', True)
    return (kwargs.get('cu_seq_lens_q') is not None and bool(causal) and query.shape[0] == 1
            and query.shape[2] == key.shape[2])


class VarlenKernel(NamedTuple):
    """torch's varlen flash kernel and how this torch release spells its options (read once, not per call: a
    signature lookup inside a compiled decoder layer would break its graph)."""
    call: Callable
    causal: Dict[str, Any]  # torch 2.10/2.11: is_causal=True; later releases: the window (-1, 0)
    gqa_option: bool  # later releases take fewer KV heads with enable_gqa=True; earlier ones need them repeated


def varlen_kernel(call: Optional[Callable] = None) -> Optional[VarlenKernel]:
    """`call` (default: torch.nn.attention.varlen.varlen_attn) with its options; None where torch has none."""
    if call is None:
        try:
            from torch.nn.attention.varlen import varlen_attn as call
        except ImportError:  # torch < 2.10
            return None
    params = inspect.signature(call).parameters
    return VarlenKernel(call, {'window_size': (-1, 0)} if 'window_size' in params else {'is_causal': True},
                        'enable_gqa' in params)


_KERNEL: Optional[VarlenKernel] = None  # set by register(), outside any compiled region


def _flash_documents(query, key, value, cu_seq_lens, longest: int, scaling, kernel: VarlenKernel):
    """All documents in one call of PyTorch's varlen flash kernel; q/k/v [1, heads, T, dim] -> [1, T, heads, dim].
    The offsets stay on the device and `longest` is a plain int, so nothing here waits for the GPU and a compiled
    decoder layer traces through it (an overestimated `longest` only adds thread blocks that exit at once)."""
    import torch
    q, k, v = (t[0].transpose(0, 1).contiguous() for t in (query, key, value))  # [T, heads, dim]
    options = {'scale': scaling, **kernel.causal}
    if k.shape[1] != q.shape[1]:
        if kernel.gqa_option:
            options['enable_gqa'] = True
        else:
            groups = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    cu = cu_seq_lens.to(device=q.device, dtype=torch.int32)
    return kernel.call(q, k, v, cu, cu, longest, longest, **options).unsqueeze(0)


def _flash_applies(module, query, dropout) -> bool:
    """The flash kernel takes CUDA bf16/fp16 without dropout; anything else runs sdpa per document."""
    import torch
    return query.is_cuda and query.dtype in (torch.float16, torch.bfloat16) and not (dropout and module.training)


def varlen_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                             scaling: Optional[float] = None, is_causal: Optional[bool] = None, **kwargs):
    """transformers attention interface: document-causal attention for a packed row, sdpa for everything else."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    rest = {k: v for k, v in kwargs.items() if k not in PACKED_KEYS}
    if not _is_packed_self_attention(module, query, key, is_causal, kwargs):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **rest)
    kernel = _KERNEL
    if kernel is not None and _flash_applies(module, query, dropout):
        longest = kwargs.get('max_length_q')
        longest = longest if isinstance(longest, int) else query.shape[2]  # ms-swift hands a tensor: no sync
        return _flash_documents(query, key, value, kwargs['cu_seq_lens_q'], longest, scaling, kernel), None
    sizes = split_sizes(kwargs['cu_seq_lens_q'])  # read once per forward (the vision attention's cached read)
    if sum(sizes) != query.shape[2]:
        raise ValueError(f'vora_varlen: the packed row\'s cu_seq_lens_q covers {sum(sizes)} tokens, the attention '
                         f'call has {query.shape[2]}')
    parts = zip(*(t.split(sizes, dim=2) for t in (query, key, value)))
    outs = [sdpa_attention_forward(module, q, k, v, None, dropout=dropout, scaling=scaling, is_causal=True,
                                   **rest)[0] for q, k, v in parts]
    return torch.cat(outs, dim=1), None


def register() -> bool:
    """Register `vora_varlen` with transformers (attention and mask function) when the switch is on; idempotent."""
    if not enabled():
        return False
    global _KERNEL
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
    _KERNEL = varlen_kernel()
    AttentionInterface.register(NAME, varlen_attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)  # unpacked batches get sdpa's masks
    return True


def accept_in_padding_free_check() -> bool:
    """Let ms-swift's `_check_padding_free` accept `--attn_impl vora_varlen` (it lists flash-attn's names only);
    every other value still meets ms-swift's own check. Idempotent."""
    if not enabled():
        return False
    from swift.arguments.sft_args import SftArguments
    original = SftArguments._check_padding_free
    if patches.patched_by(original) == PADDING_FREE_PATCH:
        return True
    if not patches.applicable(PADDING_FREE_PATCH):
        return False

    def _check_padding_free(self):
        if self.attn_impl == NAME:
            if self.packing:
                self.padding_free = True  # what ms-swift's check does for packing, besides refusing
            return None
        return original(self)

    SftArguments._check_padding_free = patches.mark(_check_padding_free, PADDING_FREE_PATCH, original)
    return True
