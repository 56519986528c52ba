"""Tiny random Qwen3-VL-family checkpoints built offline, for the demo, the tests and the benchmarks.

The real loading path is kept: the directory holds `config.json`, `model.safetensors`, a tokenizer and a
processor, and is loaded by ms-swift / transformers exactly like a downloaded checkpoint. Only the sizes
are small. ms-swift's templates hard-code the vision token ids (Qwen2/3-VL: image 151655, video 151656,
vision start 151652, end 151653; Qwen3.5: image 248056, video 248057), so the tokenizer puts its special
tokens on exactly those ids and pads the vocabulary below them with unreachable filler entries.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Dict, List

# Qwen2/Qwen3 special tokens, in id order from 151643 (as in the released tokenizers).
QWEN3_VL_SPECIAL = [
    '<|endoftext|>', '<|im_start|>', '<|im_end|>', '<|object_ref_start|>', '<|object_ref_end|>', '<|box_start|>',
    '<|box_end|>', '<|quad_start|>', '<|quad_end|>', '<|vision_start|>', '<|vision_end|>', '<|vision_pad|>',
    '<|image_pad|>', '<|video_pad|>'
]
QWEN3_VL_FIRST_SPECIAL_ID = 151643
QWEN3_VL_VOCAB = 151936
# Added (non-special) tokens that follow, as in Qwen3: ids 151657.. ; <think> is 151667.
QWEN3_ADDED = ['<tool_call>', '</tool_call>', '<|fim_prefix|>', '<|fim_middle|>', '<|fim_suffix|>', '<|fim_pad|>',
               '<|repo_name|>', '<|file_sep|>', '<tool_response>', '</tool_response>', '<think>', '</think>']


@dataclass
class TinyShape:
    """Sizes of the tiny model; the defaults train in seconds on two CPU cores."""
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    intermediate_size: int = 128
    vision_depth: int = 2
    vision_hidden: int = 32
    vision_intermediate: int = 64
    vision_heads: int = 2
    num_experts: int = 4  # MoE only
    experts_per_token: int = 2
    moe_intermediate_size: int = 32


def _byte_level_tokenizer(vocab_size: int, first_special_id: int, special: List[str], added: List[str]):
    """A byte-level BPE whose special tokens sit on the given ids (no merges: one byte, one token)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = sorted(ByteLevel.alphabet())
    vocab: Dict[str, int] = {ch: i for i, ch in enumerate(alphabet)}
    # Filler entries are unreachable: without merges, BPE never produces multi-character tokens.
    for i in range(len(vocab), first_special_id):
        vocab[f'<|filler_{i}|>'] = i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    from tokenizers import AddedToken
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in added])
    for offset, t in enumerate(special + added):
        assert tok.token_to_id(t) == first_special_id + offset, (t, tok.token_to_id(t))
    return tok


def build_tiny_qwen3_vl(out_dir: str, moe: bool = False, shape: TinyShape = TinyShape(), seed: int = 0) -> str:
    """Write a random Qwen3-VL (dense or MoE) checkpoint to `out_dir`; return the directory."""
    import torch
    from transformers import (PreTrainedTokenizerFast, Qwen2VLImageProcessor, Qwen3VLProcessor)
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(seed)
    text = dict(vocab_size=QWEN3_VL_VOCAB, hidden_size=shape.hidden_size, intermediate_size=shape.intermediate_size,
                num_hidden_layers=shape.num_layers, num_attention_heads=shape.num_heads,
                num_key_value_heads=shape.num_kv_heads, head_dim=shape.head_dim, max_position_embeddings=32768,
                rope_parameters={'rope_type': 'default', 'rope_theta': 5000000.0, 'mrope_section': [2, 3, 3],
                                 'mrope_interleaved': True})
    vision = dict(depth=shape.vision_depth, hidden_size=shape.vision_hidden,
                  intermediate_size=shape.vision_intermediate, num_heads=shape.vision_heads, patch_size=16,
                  spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=shape.hidden_size,
                  num_position_embeddings=2304, deepstack_visual_indexes=[0])
    if moe:
        from transformers import Qwen3VLMoeConfig as Config, Qwen3VLMoeForConditionalGeneration as Model
        text.update(num_experts=shape.num_experts, num_experts_per_tok=shape.experts_per_token,
                    moe_intermediate_size=shape.moe_intermediate_size, decoder_sparse_step=1, mlp_only_layers=[])
    else:
        from transformers import Qwen3VLConfig as Config, Qwen3VLForConditionalGeneration as Model
    config = Config(text_config=text, vision_config=vision, tie_word_embeddings=True)
    config.architectures = [Model.__name__]
    model = Model(config).to(torch.bfloat16)
    model.save_pretrained(out_dir, safe_serialization=True)

    raw = _byte_level_tokenizer(QWEN3_VL_VOCAB, QWEN3_VL_FIRST_SPECIAL_ID, QWEN3_VL_SPECIAL, QWEN3_ADDED)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token='<|im_end|>', pad_token='<|endoftext|>',
                                        model_max_length=32768)
    image_processor = Qwen2VLImageProcessor(patch_size=16, temporal_patch_size=2, merge_size=2)
    video_processor = Qwen3VLVideoProcessor(patch_size=16, temporal_patch_size=2, merge_size=2)
    processor = Qwen3VLProcessor(image_processor=image_processor, tokenizer=tokenizer,
                                 video_processor=video_processor)
    processor.save_pretrained(out_dir)
    with open(os.path.join(out_dir, 'generation_config.json'), 'w') as f:
        json.dump({'eos_token_id': [151645, 151643], 'pad_token_id': 151643, 'do_sample': False}, f)
    with open(os.path.join(out_dir, 'SWIFT_VORA_TINY_MODEL.txt'), 'w') as f:
        f.write('Random weights built offline by swift_vora.tiny_model; for tests and demos only.\n')
    return out_dir
