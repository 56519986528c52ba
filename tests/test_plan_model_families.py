"""Every model family the planner counts, against the model transformers builds on the meta device.

Two sets: small but structurally real configs of each family (built here from the transformers config classes,
so every field a family uses is exercised), and every configuration shipped in swift_vora/plan/model_configs at
its published size. The meta device allocates nothing, so a 671 B DeepSeek-V3 costs no memory.
"""
import json
import os

import pytest

from swift_vora.plan.model_source import shipped_configs
from swift_vora.plan.model_spec import ConfigError, UnsupportedModel, model_spec

TEXT = dict(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, bos_token_id=None, eos_token_id=None, pad_token_id=None)
QWEN3_VISION = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=4, out_hidden_size=64,
                    num_position_embeddings=64)
LINEAR = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
              linear_conv_kernel_dim=4)
SIGLIP = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=56,
              patch_size=14)
MOE = dict(moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2)

# family -> (model_type, config-class kwargs)
FAMILIES = {
    'llama': ('llama', dict(TEXT)),
    'llama-biases-tied': ('llama', dict(TEXT, attention_bias=True, mlp_bias=True, tie_word_embeddings=True)),
    'mistral': ('mistral', dict(TEXT, sliding_window=32)),
    'qwen2': ('qwen2', dict(TEXT)),
    'qwen2_moe': ('qwen2_moe', dict(TEXT, **MOE, shared_expert_intermediate_size=48, decoder_sparse_step=2)),
    'qwen2_vl': ('qwen2_vl', dict(text_config=dict(TEXT), vision_config=dict(depth=2, embed_dim=32, num_heads=4,
                                                                              hidden_size=64))),
    'qwen2_5_vl': ('qwen2_5_vl', dict(text_config=dict(TEXT), vision_config=dict(
        depth=2, hidden_size=32, intermediate_size=48, num_heads=4, out_hidden_size=64, fullatt_block_indexes=[1]))),
    'qwen3': ('qwen3', dict(TEXT)),
    'qwen3_moe': ('qwen3_moe', dict(TEXT, **MOE, mlp_only_layers=[0])),
    'qwen3_vl': ('qwen3_vl', dict(text_config=dict(TEXT), vision_config=dict(QWEN3_VISION,
                                                                              deepstack_visual_indexes=[0]),
                                  tie_word_embeddings=True)),
    'qwen3_vl_moe': ('qwen3_vl_moe', dict(text_config=dict(TEXT, **MOE), vision_config=dict(QWEN3_VISION))),
    'qwen3_5': ('qwen3_5', dict(text_config=dict(TEXT, **LINEAR), vision_config=dict(QWEN3_VISION))),
    'qwen3_5_moe': ('qwen3_5_moe', dict(text_config=dict(TEXT, **LINEAR, **MOE, shared_expert_intermediate_size=48),
                                        vision_config=dict(QWEN3_VISION))),
    'qwen3_next': ('qwen3_next', dict(TEXT, **LINEAR, **MOE, shared_expert_intermediate_size=48)),
    'gemma3': ('gemma3', dict(text_config=dict(TEXT, sliding_window=16), vision_config=dict(SIGLIP),
                              mm_tokens_per_image=4)),
    'gemma3-no-head': ('gemma3', dict(text_config=dict(TEXT), vision_config=dict(SIGLIP, vision_use_head=False),
                                      mm_tokens_per_image=4)),
    'gemma3_text': ('gemma3_text', dict(TEXT, sliding_window=16)),
    'mixtral': ('mixtral', dict(TEXT, num_local_experts=8, num_experts_per_tok=2)),
    'deepseek_v3': ('deepseek_v3', dict(TEXT, num_key_value_heads=4, moe_intermediate_size=32, n_routed_experts=8,
                                        n_shared_experts=2, num_experts_per_tok=2, first_k_dense_replace=1,
                                        q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4,
                                        v_head_dim=8, n_group=2, topk_group=1)),
    'deepseek_v3-no-q-lora': ('deepseek_v3', dict(TEXT, num_key_value_heads=4, moe_intermediate_size=32,
                                                  n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2,
                                                  first_k_dense_replace=2, q_lora_rank=None, kv_lora_rank=16,
                                                  qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, n_group=2,
                                                  topk_group=1)),
    'deepseek_v2': ('deepseek_v2', dict(TEXT, num_key_value_heads=4, moe_intermediate_size=32, n_routed_experts=8,
                                        n_shared_experts=2, num_experts_per_tok=2, first_k_dense_replace=1,
                                        q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4,
                                        v_head_dim=8, n_group=2, topk_group=1)),
    'glm4_moe': ('glm4_moe', dict(TEXT, moe_intermediate_size=32, n_routed_experts=8, n_shared_experts=1,
                                  num_experts_per_tok=2, first_k_dense_replace=1, use_qk_norm=True)),
    'gpt_oss': ('gpt_oss', dict(TEXT, intermediate_size=32, num_local_experts=8, num_experts_per_tok=2)),
    'llama4_text': ('llama4_text', dict(TEXT, intermediate_size=32, intermediate_size_mlp=128, num_local_experts=8,
                                        num_experts_per_tok=1, moe_layers=[1, 3])),
    'ernie4_5_moe': ('ernie4_5_moe', dict(TEXT, moe_intermediate_size=32, moe_num_experts=8, moe_k=2,
                                          moe_num_shared_experts=1, moe_layer_start_index=1, moe_layer_interval=2)),
    'olmo2': ('olmo2', dict(TEXT)),
    'olmoe': ('olmoe', dict(TEXT, num_experts=8, num_experts_per_tok=2)),
    'starcoder2': ('starcoder2', dict(TEXT)),
    'nemotron': ('nemotron', dict(TEXT)),
    'arcee': ('arcee', dict(TEXT)),
    # no family-specific code: planned as a standard decoder from the config fields
    'granite (generic)': ('granite', dict(TEXT)),
    'phi3 (generic)': ('phi3', dict(TEXT, pad_token_id=None)),
    'smollm3 (generic)': ('smollm3', dict(TEXT)),
}
# Vision-language types at their config classes' default (published-model) sizes: family code for glm4v, the
# generic ViT + projector estimate for the llava-style ones (within 1 % of the whole model).
DEFAULT_SIZE_VL = ['glm4v', 'glm4v_moe', 'llava', 'llava_onevision', 'mistral3', 'paligemma', 'internvl']
VISION_PREFIXES = ('visual.', 'vision_tower.', 'multi_modal_projector.')


def family_config(model_type, kwargs):
    from transformers import CONFIG_MAPPING
    return CONFIG_MAPPING[model_type](**kwargs).to_dict()


def meta_params(d):
    """(total, vision tower + projector, lm_head) parameters of the model transformers builds from `d`."""
    import torch
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM, AutoModelForImageTextToText
    cls = AutoModelForImageTextToText if isinstance(d.get('vision_config'), dict) else AutoModelForCausalLM
    cfg = CONFIG_MAPPING[d['model_type']].from_dict(d)
    with torch.device('meta'):
        model = cls.from_config(cfg)
    total = vision = head = 0
    for name, p in model.named_parameters():
        total += p.numel()
        if any(f'.{v}' in f'.{name}' for v in VISION_PREFIXES):
            vision += p.numel()
        if name.startswith('lm_head'):
            head += p.numel()
    return total, vision, head


def check_counts(d, vision_tolerance=0.01):
    spec = model_spec(d)
    total, vision, head = meta_params(d)
    assert abs(spec.total_params - total) <= 0.01 * total, (spec.total_params, total)
    assert abs(spec.vision_params - vision) <= vision_tolerance * max(vision, 1), (spec.vision_params, vision)
    assert spec.params_by_component()['lm_head'] == head
    return spec, total


@pytest.mark.parametrize('family', sorted(FAMILIES))
def test_family_param_count_matches_meta_model(family):
    model_type, kwargs = FAMILIES[family]
    spec, total = check_counts(family_config(model_type, kwargs))
    assert spec.total_params == total  # the small configs are counted exactly, not just within 1 %


@pytest.mark.parametrize('model_type', DEFAULT_SIZE_VL)
def test_vision_language_defaults_match_meta_model(model_type):
    from transformers import CONFIG_MAPPING
    d = CONFIG_MAPPING[model_type]().to_dict()
    generic = model_type not in ('glm4v', 'glm4v_moe')
    spec, _ = check_counts(d, vision_tolerance=0.25 if generic else 0.01)  # a generic tower: an estimate
    assert spec.vision is not None
    assert generic == any('estimated as a standard ViT' in n for n in spec.notes)


@pytest.mark.parametrize('model_id', sorted(shipped_configs()))
def test_shipped_config_matches_meta_model(model_id):
    with open(shipped_configs()[model_id]) as f:
        d = json.load(f)
    spec, _ = check_counts(d)
    if spec.vision is not None:
        assert spec.auto_class == 'AutoModelForImageTextToText'


@pytest.mark.parametrize('model_id, billions', [
    ('Qwen/Qwen3-VL-2B-Instruct', 2.13), ('Qwen/Qwen3-VL-8B-Instruct', 8.77), ('Qwen/Qwen3-8B', 8.19),
    ('Qwen/Qwen2.5-7B-Instruct', 7.62), ('Qwen/Qwen2.5-14B-Instruct', 14.77),
    ('meta-llama/Llama-3.1-8B-Instruct', 8.03),
    ('mistralai/Mistral-7B-Instruct-v0.3', 7.25), ('mistralai/Mixtral-8x7B-Instruct-v0.1', 46.70),
    ('Qwen/Qwen3-30B-A3B', 30.53), ('deepseek-ai/DeepSeek-V3', 671.03), ('Qwen/Qwen2.5-VL-7B-Instruct', 8.29)])
def test_shipped_configs_have_their_published_size(model_id, billions):
    """The sizes on the model cards (the safetensors parameter counts), within 1 %: the shipped files are the
    published shapes, not approximations."""
    with open(shipped_configs()[model_id]) as f:
        spec = model_spec(json.load(f))
    assert abs(spec.total_params / 1e9 - billions) <= 0.01 * billions, spec.total_params


def test_moe_fields_of_each_convention():
    ds = model_spec(family_config(*FAMILIES['deepseek_v3']))
    assert ds.is_moe and ds.num_experts == 8 and ds.num_shared_experts == 2 and ds.moe_layers == [1, 2, 3]
    assert ds.shared_expert_intermediate_size == 64 and ds.attention_kind == 'mla'
    mx = model_spec(family_config(*FAMILIES['mixtral']))
    assert mx.is_moe and mx.moe_intermediate_size == 128 and mx.num_shared_experts == 0
    q2 = model_spec(family_config(*FAMILIES['qwen2_moe']))
    assert q2.moe_layers == [1, 3] and q2.num_shared_experts == 1
    g = model_spec(family_config(*FAMILIES['gemma3_text']))
    assert g.tie_word_embeddings and g.sliding_attention_layers > 0 and not g.is_moe


def test_stub_config_is_an_error_naming_the_field():
    for d in ({'model_type': 'qwen3_vl'}, {'model_type': 'llama'}, {'model_type': 'qwen3_vl', 'text_config': {}}):
        with pytest.raises(ConfigError, match='hidden_size'):
            model_spec(d, where='/x/config.json')
    d = family_config(*FAMILIES['llama'])
    del d['vocab_size']
    with pytest.raises(ConfigError, match=r"/x/config.json: config lacks 'vocab_size'"):
        model_spec(d, where='/x/config.json')
    d = family_config(*FAMILIES['qwen3_vl'])
    del d['vision_config']
    with pytest.raises(ConfigError, match='vision_config'):
        model_spec(d)


@pytest.mark.parametrize('value', [5, None, ['llama'], ''])
def test_model_type_must_be_a_string(value):
    d = family_config(*FAMILIES['llama'])
    d['model_type'] = value
    with pytest.raises(ConfigError, match=r"/m/config.json: .*'model_type'"):
        model_spec(d, where='/m/config.json')


def test_wrong_field_type_names_the_field():
    d = family_config(*FAMILIES['qwen3'])
    d['num_hidden_layers'] = '4'
    with pytest.raises(ConfigError, match="'num_hidden_layers' must be a non-negative integer"):
        model_spec(d)
    d = family_config(*FAMILIES['qwen3_vl'])
    d['text_config']['hidden_size'] = None
    with pytest.raises(ConfigError, match="'text_config.hidden_size'"):
        model_spec(d)


def test_encoder_decoder_is_unsupported():
    with pytest.raises(UnsupportedModel, match='encoder-decoder'):
        model_spec({'model_type': 't5', 'is_encoder_decoder': True, 'd_model': 512})


def test_shipped_configs_readme_lists_every_file():
    from swift_vora.plan.model_source import SHIPPED_DIR
    with open(os.path.join(SHIPPED_DIR, 'README.md')) as f:
        readme = f.read()
    for model_id in shipped_configs():
        assert f'https://huggingface.co/{model_id}' in readme, model_id


def test_sparse_text_config_of_a_vl_wrapper_takes_its_class_defaults():
    """Published llava-1.5 configs give the text model only by type and vocabulary; transformers builds LlamaConfig's
    default size, and so does the planner (saying so). A top-level stub still is an error."""
    d = {'model_type': 'llava', 'architectures': ['LlavaForConditionalGeneration'], 'image_token_index': 32000,
         'projector_hidden_act': 'gelu', 'vision_feature_layer': -2, 'vision_feature_select_strategy': 'default',
         'text_config': {'model_type': 'llama', 'max_position_embeddings': 4096, 'rms_norm_eps': 1e-05,
                         'vocab_size': 32064},
         'vision_config': {'hidden_size': 1024, 'image_size': 336, 'intermediate_size': 4096,
                           'model_type': 'clip_vision_model', 'num_attention_heads': 16, 'num_hidden_layers': 24,
                           'patch_size': 14, 'projection_dim': 768, 'vocab_size': 32000}}
    spec, total = check_counts(d, vision_tolerance=0.25)
    assert abs(total / 1e9 - 7.06) < 0.01 and any('LlamaConfig' in n or 'llama config class' in n for n in spec.notes)
    with pytest.raises(ConfigError, match='hidden_size'):
        model_spec({'model_type': 'llama', 'vocab_size': 32000})


def test_every_transformers_decoder_config_plans_or_is_refused_cleanly():
    """Every causal-LM and image-text-to-text config class of the installed transformers, at its default size:
    the planner counts it and plans it, or refuses with UnsupportedModel / ConfigError naming the field — never
    another exception (a traceback for the user)."""
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as CAUSAL
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES as IT

    from swift_vora.plan import PlanRequest, make_plan
    planned = 0
    for model_type in sorted(set(CAUSAL) | set(IT)):
        try:
            d = CONFIG_MAPPING[model_type]().to_dict()
        except Exception:  # noqa: BLE001 - a config class that needs extra arguments or packages is not ours
            continue
        try:
            spec = model_spec(d)
        except UnsupportedModel as e:
            assert 'config' in str(e), (model_type, e)
            continue
        plan = make_plan(PlanRequest(model=model_type, hardware='h200x1'), spec=spec, search_alternatives=False)
        assert plan.verdict in ('fits', 'does_not_fit', 'refused'), model_type
        planned += 1
    assert planned > 100
