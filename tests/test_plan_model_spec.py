"""Model spec from config.json: parameter counts vs the meta-device model, LoRA counts vs PEFT, video tokens."""
import json
import os
import subprocess
import sys

import pytest

from swift_vora.plan.model_source import load_model_spec
from swift_vora.plan.model_spec import UnsupportedModel, model_spec
from swift_vora.plan.video_budget import frame_pair_tokens, smart_nframes, video_tokens

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = os.path.join(HERE, 'fixtures', 'configs')
FULL = ['qwen3_vl_2b', 'qwen3_vl_moe_30b_a3b', 'qwen3_moe_30b_a3b', 'qwen3_5_dense', 'qwen3_5_moe_35b_a3b']
TINY = ['tiny_qwen3_vl', 'tiny_qwen3_vl_moe', 'tiny_qwen3_moe', 'tiny_qwen3_moe_sparse_step', 'tiny_qwen3_5',
        'tiny_qwen3_5_moe', 'tiny_qwen3', 'tiny_qwen3_next', 'tiny_qwen2_5_vl', 'tiny_mixtral']


def cfg_path(name):
    return os.path.join(CONFIGS, f'{name}.json')


def load(name):
    with open(cfg_path(name)) as f:
        return json.load(f)


def meta_model(d):
    import torch
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM, AutoModelForImageTextToText
    spec = model_spec(d)
    cls = {'AutoModelForImageTextToText': AutoModelForImageTextToText,
           'AutoModelForCausalLM': AutoModelForCausalLM}[spec.auto_class]
    cfg = CONFIG_MAPPING[d['model_type']].from_dict(d)
    with torch.device('meta'):
        return cls.from_config(cfg)


def test_auto_class_per_type():
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as CAUSAL
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES as IT
    for name in FULL + TINY:
        spec = model_spec(load(name))
        if spec.auto_class == 'AutoModelForImageTextToText':
            assert IT.get(spec.model_type) == spec.architecture, name
        else:
            assert spec.model_type not in IT and CAUSAL.get(spec.model_type) == spec.architecture, name


@pytest.mark.parametrize('name', FULL + TINY)
def test_param_count_matches_meta_model(name):
    d = load(name)
    spec = model_spec(d)
    model = meta_model(d)
    n = sum(p.numel() for p in model.parameters())
    assert abs(spec.total_params - n) <= 0.005 * n, (spec.total_params, n)
    # per component: the vision tower and the lm_head are separately checkable
    vis = sum(p.numel() for k, p in model.named_parameters() if '.visual.' in f'.{k}')
    assert abs(spec.vision_params - vis) <= 0.005 * max(vis, 1)
    comps = spec.params_by_component()
    assert sum(comps.values()) == spec.total_params
    head = sum(p.numel() for k, p in model.named_parameters() if k.startswith('lm_head'))
    assert comps['lm_head'] == head
    experts = sum(p.numel() for k, p in model.named_parameters() if '.experts.' in k)
    assert comps['experts'] == experts


def test_full_size_shapes():
    s = load_model_spec(cfg_path('qwen3_5_moe_35b_a3b'))
    assert s.is_moe and s.num_experts == 256 and s.experts_per_token == 8 and s.num_shared_experts == 1
    assert s.num_linear_attention_layers == 30 and s.num_full_attention_layers == 10
    assert 34.5e9 < s.total_params < 35.5e9 and 3e9 < s.active_params < 4.5e9
    assert s.linear_attention['conv_dim'] == 8192
    s = load_model_spec(cfg_path('qwen3_moe_30b_a3b'))
    assert 30e9 < s.total_params < 31e9 and 3e9 < s.active_params < 3.5e9
    s = load_model_spec(cfg_path('qwen3_vl_2b'))
    assert s.tie_word_embeddings and abs(s.total_params - 2.13e9) < 0.01e9 and not s.is_moe
    assert s.vision.depth == 24 and s.vision.deepstack_layers == 3
    s = load_model_spec(cfg_path('tiny_qwen3_moe_sparse_step'))
    assert s.moe_layers == [3, 5]  # (i+1) % 2 == 0, minus mlp_only_layers=[1]
    # num_experts (real checkpoints) and num_local_experts (to_dict) are the same key
    d = load('qwen3_moe_30b_a3b')
    d['num_experts'] = d.pop('num_local_experts')
    assert model_spec(d).num_experts == 128


def test_lora_30b_a3b_all_linear_r16_about_640m():
    s = load_model_spec(cfg_path('qwen3_moe_30b_a3b'))
    n = s.lora_params(16, 'all-linear')
    assert 620e6 < n < 660e6  # notes/memory-model.md: ~640 M
    assert s.lora_params(16, 'all-linear-except-experts') < 20e6


@pytest.mark.parametrize('name', ['tiny_qwen3_moe', 'tiny_qwen3_5_moe', 'tiny_qwen3_vl_moe'])
@pytest.mark.parametrize('targets', ['all-linear', 'all-linear-except-experts', 'attention'])
def test_lora_count_matches_peft(name, targets):
    """PEFT gives each expert its own rank-r pair (ParamWrapper: lora_A [r*E, in], lora_B [out, r*E]).

    Module names are given as a regex over the language model (like swift's all-linear, which skips the vision
    tower and lm_head), experts through target_parameters."""
    from peft import LoraConfig, get_peft_model
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM, AutoModelForImageTextToText
    d = load(name)
    spec = model_spec(d)
    cls = AutoModelForImageTextToText if spec.auto_class == 'AutoModelForImageTextToText' else AutoModelForCausalLM
    model = cls.from_config(CONFIG_MAPPING[d['model_type']].from_dict(d))
    names = sorted({g.name.split('.')[-1] for g in spec.lora_groups(targets) if g.component != 'experts'})
    regex = r'^(model\.language_model|model)\.layers\.\d+\.(.*\.)?(' + '|'.join(names) + ')$'
    tp = ['mlp.experts.gate_up_proj', 'mlp.experts.down_proj'] if targets == 'all-linear' else None
    pm = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=regex, target_parameters=tp,
                                          lora_dropout=0.0))
    trainable = sum(p.numel() for p in pm.parameters() if p.requires_grad)
    assert trainable == spec.lora_params(4, targets)


def test_trainable_full_and_selective():
    s = load_model_spec(cfg_path('qwen3_5_moe_35b_a3b'))
    assert s.trainable_params('full') == s.total_params - s.vision_params  # swift freezes ViT + aligner
    sel = s.trainable_params('selective')
    comps = s.params_by_component()
    norms = sum(g.total for g in s.groups if g.name in ('q_norm+k_norm', 'linear_attn.norm'))
    assert sel == comps['attention'] + comps['linear_attention'] + comps['shared_expert'] + norms
    assert 1e9 < sel < 2e9


def test_unsupported_model_type():
    with pytest.raises(UnsupportedModel):
        model_spec({'model_type': 'llava'})


def _text(d):
    return d['text_config'] if 'text_config' in d else d


@pytest.mark.parametrize('edit, said', [
    (lambda t: t.update(num_experts_per_tok=200), 'num_experts_per_tok must be between 1 and the 128 experts (got '
                                                  '200)'),
    (lambda t: t.update(num_experts_per_tok=0), 'num_experts_per_tok must be between 1 and the 128 experts (got 0)'),
    (lambda t: t.update(head_dim=0), "head_dim' must be at least 1 (got 0)"),
    (lambda t: t.update(num_key_value_heads=0), "num_key_value_heads' must be at least 1 (got 0)"),
    (lambda t: t.update(num_attention_heads=30, num_key_value_heads=4),
     'num_attention_heads (30) must be a multiple of text_config.num_key_value_heads (4)'),
    (lambda t: t.pop('moe_intermediate_size'), "config lacks 'text_config.moe_intermediate_size', the width of one"),
])
def test_a_config_no_model_can_have_is_refused_naming_the_field(edit, said):
    d = load('qwen3_vl_moe_30b_a3b')
    edit(_text(d))
    with pytest.raises(UnsupportedModel) as e:
        model_spec(d, where='m/config.json')
    assert str(e.value).startswith('m/config.json: ') and said in str(e.value), str(e.value)


def test_an_expert_as_wide_as_the_dense_mlp_where_the_family_has_no_expert_width():
    spec = model_spec(load('tiny_mixtral'))  # Mixtral's experts are intermediate_size wide
    assert spec.is_moe


def test_video_tokens_like_qwen3_vl():
    # the measured baseline: 32 s, FPS=2, FPS_MAX_FRAMES=64, VIDEO_MAX_TOKEN_NUM=196, 640x360 -> 64 frames, 32 x 180
    assert frame_pair_tokens(640, 360, max_token_num=196, min_token_num=128) == 180
    t = video_tokens(32, fps=2, max_frames=64, width=640, height=360, max_token_num=196, min_token_num=128)
    assert (t.frames, t.groups, t.tokens_per_group, t.vision_tokens) == (64, 32, 180, 5760)
    assert t.patches == 4 * 5760
    # frames are floored to a multiple of 2 and clamped to [min_frames, max_frames]
    assert smart_nframes(3.3, fps=2, max_frames=768) == 6
    assert smart_nframes(1.0, fps=2) == 4  # min_frames
    assert smart_nframes(1000, fps=2, max_frames=65) == 64
    assert smart_nframes(10, fps=2, source_fps=0.5) == 4  # capped by the source's frame count (5 -> 4)
    assert video_tokens(10, 2, 64, 100).vision_tokens == 10 * 100


def test_importing_plan_does_not_import_torch():
    code = ('import sys, swift_vora.plan, swift_vora.cli.plan, swift_vora.plan.probe; '
            'bad = [m for m in ("torch", "transformers", "swift", "peft") if m in sys.modules]; '
            'print(bad); sys.exit(1 if bad else 0)')
    r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, cwd=os.path.dirname(HERE))
    assert r.returncode == 0, r.stdout + r.stderr
