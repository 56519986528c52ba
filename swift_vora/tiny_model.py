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

    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(seed)
    config, Model = tiny_qwen3_vl_config(moe, shape)
    model = Model(config).to(torch.bfloat16)
    model.save_pretrained(out_dir, safe_serialization=True)

    write_qwen3_vl_processor(out_dir)
    with open(os.path.join(out_dir, 'SWIFT_VORA_TINY_MODEL.txt'), 'w') as f:
        f.write('Random weights built offline by swift_vora.tiny_model; for tests and demos only.\n')
    return out_dir


def tiny_qwen3_vl_config(moe: bool = False, shape: TinyShape = TinyShape()):
    """(the transformers config of the tiny Qwen3-VL build_tiny_qwen3_vl writes, its model class): no weights."""
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
        from transformers import Qwen3VLMoeConfig as Config
        from transformers import Qwen3VLMoeForConditionalGeneration as Model
        text.update(num_experts=shape.num_experts, num_experts_per_tok=shape.experts_per_token,
                    moe_intermediate_size=shape.moe_intermediate_size, decoder_sparse_step=1, mlp_only_layers=[])
    else:
        from transformers import Qwen3VLConfig as Config
        from transformers import Qwen3VLForConditionalGeneration as Model
    config = Config(text_config=text, vision_config=vision, tie_word_embeddings=True)
    config.architectures = [Model.__name__]
    return config, Model


# ---- Models of a given shape (benchmarks) ---------------------------------------------------------------------
# Added for benchmarks/throughput.py and benchmarks/learnability.py; the functions above are unchanged.

@dataclass
class Qwen3VLShape:
    """Every size of a dense Qwen3-VL checkpoint that matters for speed and memory."""
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vision_depth: int
    vision_hidden: int
    vision_intermediate: int
    vision_heads: int
    deepstack_visual_indexes: tuple = (0,)
    mrope_section: tuple = (2, 3, 3)  # sums to head_dim / 2
    rope_theta: float = 5000000.0
    vision_num_position_embeddings: int = 2304
    tie_word_embeddings: bool = True


# Qwen3-VL-2B-Instruct's sizes (text: hidden 2048, 28 layers, 16 heads, 8 KV heads, head_dim 128, FFN 6144, tied
# embeddings; vision: depth 24, hidden 1024, FFN 4096, 16 heads, deepstack [5, 11, 17]); 2.13 B parameters.
QWEN3_VL_2B = Qwen3VLShape(hidden_size=2048, num_layers=28, num_heads=16, num_kv_heads=8, head_dim=128,
                           intermediate_size=6144, vision_depth=24, vision_hidden=1024, vision_intermediate=4096,
                           vision_heads=16, deepstack_visual_indexes=(5, 11, 17), mrope_section=(24, 20, 20))

# Small enough to train from scratch in a minute on one GPU (learnability benchmark): ~4 M non-embedding
# parameters in the language model, a 2-layer vision tower.
QWEN3_VL_LEARN = Qwen3VLShape(hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=64,
                              intermediate_size=1024, vision_depth=2, vision_hidden=128, vision_intermediate=512,
                              vision_heads=2, deepstack_visual_indexes=(0,), mrope_section=(12, 10, 10))

# TinyShape's sizes (build_tiny_qwen3_vl's default), as a Qwen3VLShape: smoke tests of the benchmarks.
QWEN3_VL_TINY = Qwen3VLShape(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                             intermediate_size=128, vision_depth=2, vision_hidden=32, vision_intermediate=64,
                             vision_heads=2, deepstack_visual_indexes=(0,), mrope_section=(2, 3, 3))

QWEN3_VL_SHAPES = {'2b': QWEN3_VL_2B, 'learn': QWEN3_VL_LEARN, 'tiny': QWEN3_VL_TINY}


def qwen3_vl_config(shape: Qwen3VLShape):
    """The transformers `Qwen3VLConfig` of a shape (offline; no download)."""
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration
    text = dict(vocab_size=QWEN3_VL_VOCAB, hidden_size=shape.hidden_size, intermediate_size=shape.intermediate_size,
                num_hidden_layers=shape.num_layers, num_attention_heads=shape.num_heads,
                num_key_value_heads=shape.num_kv_heads, head_dim=shape.head_dim, max_position_embeddings=32768,
                hidden_act='silu', rope_parameters={'rope_type': 'default', 'rope_theta': shape.rope_theta,
                                                    'mrope_section': list(shape.mrope_section),
                                                    'mrope_interleaved': True})
    vision = dict(depth=shape.vision_depth, hidden_size=shape.vision_hidden,
                  intermediate_size=shape.vision_intermediate, num_heads=shape.vision_heads, patch_size=16,
                  spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=shape.hidden_size,
                  num_position_embeddings=shape.vision_num_position_embeddings,
                  deepstack_visual_indexes=list(shape.deepstack_visual_indexes), hidden_act='gelu_pytorch_tanh')
    config = Qwen3VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=shape.tie_word_embeddings)
    config.architectures = [Qwen3VLForConditionalGeneration.__name__]
    return config


def qwen3_vl_param_counts(shape: Qwen3VLShape) -> Dict[str, int]:
    """Parameter counts computed from the shape alone (no model built); used for FLOP estimates.

    `llm_matmul`: the language model's per-token matmul weights (attention q/k/v/o + gated MLP, all layers),
    i.e. what every text or video token is multiplied through; embeddings and the LM head are counted apart
    (`embedding`, `lm_head`; tied checkpoints store them once). `vision_matmul`: the vision tower's per-patch
    matmul weights (blocks, plus the patch embedding); `merger`: the patch merger(s) (per merged token).
    """
    h, hd = shape.hidden_size, shape.head_dim
    attn = h * shape.num_heads * hd * 2 + h * shape.num_kv_heads * hd * 2
    mlp = 3 * h * shape.intermediate_size
    vh = shape.vision_hidden
    vblock = 4 * vh * vh + 2 * vh * shape.vision_intermediate
    patch_embed = 3 * 2 * 16 * 16 * vh
    merged_in = vh * 4
    merger = merged_in * merged_in + merged_in * h  # fc1 (4vh -> 4vh) and fc2 (4vh -> hidden)
    n_mergers = 1 + len(shape.deepstack_visual_indexes)
    return {
        'llm_matmul': shape.num_layers * (attn + mlp),
        'embedding': QWEN3_VL_VOCAB * h,
        'lm_head': QWEN3_VL_VOCAB * h,
        'vision_matmul': shape.vision_depth * vblock + patch_embed,
        'merger': n_mergers * merger,
        'attn_dim': shape.num_heads * hd,
        'vision_attn_dim': vh,
    }


def write_qwen3_vl_processor(out_dir: str, vocab_size: int = QWEN3_VL_VOCAB,
                             first_special_id: int = QWEN3_VL_FIRST_SPECIAL_ID, model_max_length: int = 32768) -> None:
    """Tokenizer (special tokens on the real ids), processor and generation config, as build_tiny_qwen3_vl writes.
    Qwen3.5 checkpoints use the same processor with the same special tokens from id 248044 (write_qwen3_5_processor)."""
    from transformers import PreTrainedTokenizerFast, Qwen2VLImageProcessor, Qwen3VLProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    raw = _byte_level_tokenizer(vocab_size, first_special_id, QWEN3_VL_SPECIAL, QWEN3_ADDED)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token='<|im_end|>', pad_token='<|endoftext|>',
                                        model_max_length=model_max_length)
    image_processor = Qwen2VLImageProcessor(patch_size=16, temporal_patch_size=2, merge_size=2)
    video_processor = Qwen3VLVideoProcessor(patch_size=16, temporal_patch_size=2, merge_size=2)
    processor = Qwen3VLProcessor(image_processor=image_processor, tokenizer=tokenizer,
                                 video_processor=video_processor)
    processor.save_pretrained(out_dir)
    eos, pad = first_special_id + 2, first_special_id  # <|im_end|>, <|endoftext|>
    with open(os.path.join(out_dir, 'generation_config.json'), 'w') as f:
        json.dump({'eos_token_id': [eos, pad], 'pad_token_id': pad, 'do_sample': False}, f)


def _random_model(cls, config, dtype: str, device: str):
    """`cls(config)` with random weights created directly in `dtype` on `device` (no float32 copy on the way)."""
    import torch
    torch_dtype = getattr(torch, dtype)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch_dtype)
    try:
        with torch.device(device):
            model = cls(config)
    finally:
        torch.set_default_dtype(previous)
    model = model.to(torch_dtype)
    model.config.dtype = torch_dtype
    return model


def build_qwen3_vl(out_dir: str, shape: 'Qwen3VLShape | str' = 'tiny', seed: int = 0, dtype: str = 'bfloat16',
                   device: str = 'cpu') -> str:
    """Write a random dense Qwen3-VL checkpoint of `shape` (a Qwen3VLShape or a QWEN3_VL_SHAPES key) to `out_dir`.

    `device='cuda'` initialises the weights on the GPU (a 2B model in seconds instead of a minute on CPU);
    the saved checkpoint is the same kind either way. Returns `out_dir`.
    """
    import torch
    from transformers import Qwen3VLForConditionalGeneration

    if isinstance(shape, str):
        shape = QWEN3_VL_SHAPES[shape]
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(seed)
    model = _random_model(Qwen3VLForConditionalGeneration, qwen3_vl_config(shape), dtype, device)
    model.save_pretrained(out_dir, safe_serialization=True)
    n_params = sum(p.numel() for p in model.parameters())
    del model
    write_qwen3_vl_processor(out_dir)
    with open(os.path.join(out_dir, 'SWIFT_VORA_TINY_MODEL.txt'), 'w') as f:
        f.write(f'Random weights built offline by swift_vora.tiny_model.build_qwen3_vl ({n_params} parameters); '
                'for tests and benchmarks only.\n')
    return out_dir


# ---- Qwen3.5 / Qwen3.6 MoE (the 35B-A3B shape, or a tiny one) ---------------------------------------------------
# Qwen3.5's tokenizer puts the same special tokens in the same order as Qwen3's, from id 248044: image 248056,
# video 248057, vision start/end 248053/248054 (the ids ms-swift's qwen3_5 template and the config hard-code).
QWEN3_5_FIRST_SPECIAL_ID = 248044
QWEN3_5_VOCAB = 248320

# Published Qwen3.6-35B-A3B values that transformers' Qwen3_5MoeConfig() defaults leave out: the merger writes the
# text model's width (the class default, 3584, belongs to another size), and the text rotary embedding's M-RoPE.
QWEN3_5_MOE_35B_TEXT = dict(rope_parameters={'rope_type': 'default', 'rope_theta': 10000000.0,
                                             'partial_rotary_factor': 0.25, 'mrope_section': [11, 11, 10],
                                             'mrope_interleaved': True})
QWEN3_5_MOE_TINY_TEXT = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                             head_dim=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                             shared_expert_intermediate_size=32, linear_num_key_heads=2, linear_num_value_heads=4,
                             linear_key_head_dim=8, linear_value_head_dim=8, max_position_embeddings=32768,
                             rope_parameters={'rope_type': 'default', 'rope_theta': 10000000.0,
                                              'partial_rotary_factor': 0.5, 'mrope_section': [1, 1, 2],
                                              'mrope_interleaved': True})
QWEN3_5_MOE_TINY_VISION = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2,
                               num_position_embeddings=2304)


def qwen3_5_moe_config(shape: str = '35b-a3b', num_layers: 'int | None' = None):
    """The transformers `Qwen3_5MoeConfig` of the 35B-A3B shape ('35b-a3b': the class defaults plus the published
    merger width and M-RoPE) or a tiny one ('tiny'), optionally cut to its first `num_layers` decoder layers
    (the layer pattern -- three Gated DeltaNet layers, then one full-attention layer -- is kept)."""
    from transformers import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration
    if shape not in ('35b-a3b', 'tiny'):
        raise ValueError(f"qwen3_5_moe shape {shape!r}: '35b-a3b' | 'tiny'")
    text = dict(QWEN3_5_MOE_35B_TEXT if shape == '35b-a3b' else QWEN3_5_MOE_TINY_TEXT)
    vision = {} if shape == '35b-a3b' else dict(QWEN3_5_MOE_TINY_VISION)
    full = Qwen3_5MoeConfig(text_config=text).text_config
    layers = full.num_hidden_layers if num_layers is None else int(num_layers)
    if not 1 <= layers <= len(full.layer_types):
        raise ValueError(f'num_layers {layers}: 1..{len(full.layer_types)}')
    text.update(num_hidden_layers=layers, layer_types=list(full.layer_types[:layers]))
    vision['out_hidden_size'] = full.hidden_size
    config = Qwen3_5MoeConfig(text_config=text, vision_config=vision)
    config.architectures = [Qwen3_5MoeForConditionalGeneration.__name__]
    return config


def write_qwen3_5_processor(out_dir: str) -> None:
    """Tokenizer with Qwen3.5's special ids, the Qwen3-VL processor Qwen3.5 checkpoints use, generation config."""
    write_qwen3_vl_processor(out_dir, QWEN3_5_VOCAB, QWEN3_5_FIRST_SPECIAL_ID, model_max_length=262144)


def build_qwen3_5_moe(out_dir: str, shape: str = 'tiny', num_layers: 'int | None' = None, seed: int = 0,
                      dtype: str = 'bfloat16', device: str = 'cpu') -> Dict[str, int]:
    """Write a random Qwen3.5-MoE checkpoint (config, safetensors shards, tokenizer, processor) to `out_dir`.

    `device='cuda'` initialises the weights on the GPU (billions of parameters in seconds). Returns the
    parameter counts of the model that was written: {'total', 'language', 'vision', 'experts'}."""
    import torch
    from transformers import Qwen3_5MoeForConditionalGeneration

    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(seed)
    config = qwen3_5_moe_config(shape, num_layers)
    model = _random_model(Qwen3_5MoeForConditionalGeneration, config, dtype, device)
    counts = {'total': 0, 'language': 0, 'vision': 0, 'experts': 0}
    for name, param in model.named_parameters():
        counts['total'] += param.numel()
        counts['vision' if '.visual.' in f'.{name}' else 'language'] += param.numel()
        if '.experts.' in name:
            counts['experts'] += param.numel()
    model.save_pretrained(out_dir, safe_serialization=True, max_shard_size='5GB')
    del model
    write_qwen3_5_processor(out_dir)
    with open(os.path.join(out_dir, 'SWIFT_VORA_TINY_MODEL.txt'), 'w') as f:
        f.write(f'Random weights built offline by swift_vora.tiny_model.build_qwen3_5_moe (shape {shape}, '
                f'{config.text_config.num_hidden_layers} layers, {counts["total"]} parameters); for tests and '
                'benchmarks only.\n')
    return counts
