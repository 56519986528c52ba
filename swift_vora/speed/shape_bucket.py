"""Training sequences padded at their end to a multiple of N tokens, so kernels meet few distinct lengths.

Every new sequence length costs the host work the GPU then waits for: cuDNN's fused attention builds an execution
plan per length (forward and backward), GEMM heuristics are queried per shape. Video clips of one length encode to
many slightly different token counts, and with the decoder layers compiled the optimizer steps that met a
first-seen length were the slow ones (docs/runs/benchmarks-log.md).

Padding at the END of a causal sequence changes nothing that is trained: no real token attends to a later
position, the pad tokens carry label -100 (no loss, no gradient, not in `num_items_in_batch`), and the attention
mask stays all ones so SDPA keeps its causal fast path (a mask with zeros would move it to a slower kernel). The
cost is fewer than N extra tokens per sample. Only training encodes are
padded (inference and generation never), never beyond `max_length`, and each sample's padding is in the encode log.

`SWIFT_VORA_PAD_MULTIPLE=N` sets N; by default 64 when the decoder layers are compiled (`SWIFT_VORA_COMPILE=layers`,
where stable shapes also spare dynamo and inductor work) and 0 (off) otherwise.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

from .. import switches

ENV = 'SWIFT_VORA_PAD_MULTIPLE'
COMPILED_DEFAULT = 64


def pad_multiple(environ=None) -> int:
    multiple = switches.read(ENV, environ)
    if multiple is None:  # unset: on with compiled decoder layers
        from .compile_layers import mode
        return COMPILED_DEFAULT if mode(environ) != 'off' else 0
    return multiple


def padding_for(length: int, multiple: int, max_length: Optional[int] = None) -> int:
    """How many tokens bring `length` up to the next multiple (0 if off, aligned, or it would pass `max_length`)."""
    if multiple <= 1:
        return 0
    target = -(-length // multiple) * multiple
    if max_length is not None and target > max_length:
        return 0
    return target - length


def pad_tail(encoded: Dict[str, Any], count: int, pad_token_id: int) -> None:
    """Append `count` pad tokens to a training encode: label -100, loss scale 0, text token type."""
    if count <= 0:
        return
    import torch
    encoded['input_ids'] = list(encoded['input_ids']) + [pad_token_id] * count
    if encoded.get('labels') is not None:
        encoded['labels'] = list(encoded['labels']) + [-100] * count
    if encoded.get('loss_scale') is not None:
        encoded['loss_scale'] = list(encoded['loss_scale']) + [0.0] * count
    types = encoded.get('mm_token_type_ids')
    if isinstance(types, torch.Tensor):
        encoded['mm_token_type_ids'] = torch.cat([types, types.new_zeros((*types.shape[:-1], count))], dim=-1)
    elif types is not None:
        encoded['mm_token_type_ids'] = list(types) + [0] * count
