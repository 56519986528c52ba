"""What a model is, from its `config.json` alone: family, dense or MoE, layer mix, vision tower, and
parameter counts per component (total and active), plus the trainable count for LoRA / full / selective.

Pure arithmetic on the JSON dict: no torch, no transformers, no weights. The parameter layout mirrors
the transformers 5.17 modeling code of each supported type (fused 3-D expert tensors
`mlp.experts.gate_up_proj [E, 2F, H]` / `mlp.experts.down_proj [E, H, F]`, a router weight `[E, H]`,
...); tests/test_plan_model_spec.py checks every count against the model instantiated on the meta
device (±0.5 %, in practice exact).

Supported `model_type`s: qwen3_vl, qwen3_vl_moe, qwen3_5, qwen3_5_moe, qwen3_moe, qwen3, qwen3_next,
qwen2_5_vl, mixtral. Anything else raises `UnsupportedModel`.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

COMPONENTS = ('embeddings', 'attention', 'linear_attention', 'dense_mlp', 'experts', 'router', 'shared_expert',
              'norms', 'vision', 'lm_head')

# LoRA target sets (what `--target_modules` reaches in the language model; the vision tower and lm_head are never
# targeted: swift's defaults freeze_vit/freeze_aligner=True and find_all_linears skips lm_head).
#  all-linear               every nn.Linear of the LLM **and** the fused expert tensors. PEFT targets the 3-D expert
#                           parameters through `target_parameters` (peft.tuners.lora.layer.ParamWrapper: lora_A
#                           [r*E, in], lora_B [out, r*E] = one rank-r pair per expert); Megatron's all-linear includes
#                           the grouped expert linears (TEGroupedLinear); Unsloth's split LoRA targets
#                           `mlp.experts.gate_up_proj` / `down_proj`.
#  all-linear-except-experts  what plain `swift sft --target_modules all-linear` reaches on a transformers-5 MoE: the
#                           fused experts are nn.Parameters, not nn.Linear, so find_all_linears does not see them.
#  attention                q/k/v/o and the linear-attention projections only.
LORA_TARGETS = ('all-linear', 'all-linear-except-experts', 'attention')
TUNERS = ('lora', 'full', 'selective')


class UnsupportedModel(ValueError):
    """The config's model_type is not one this planner knows how to count."""


@dataclass(frozen=True)
class ParamGroup:
    """One kind of tensor, repeated `count` times (usually once per layer).

    `numel` is the number of parameters of one instance (weight + bias). Linear groups (`linear=True`) carry
    `in_features`/`out_features` so LoRA can be counted; `experts > 1` marks a fused 3-D expert tensor.
    """
    component: str
    name: str
    numel: int
    count: int = 1
    linear: bool = False
    in_features: int = 0
    out_features: int = 0
    experts: int = 1
    tower: str = 'llm'  # 'llm' or 'vision'
    active_fraction: float = 1.0  # routed experts: top_k / num_experts of them run per token

    @property
    def total(self) -> int:
        return self.numel * self.count

    @property
    def active(self) -> float:
        return self.total * self.active_fraction

    def lora_params(self, rank: int) -> int:
        """Parameters of a rank-r LoRA on every instance (one A/B pair per expert for fused experts)."""
        return self.count * rank * self.experts * (self.in_features + self.out_features)


@dataclass
class VisionSpec:
    kind: str
    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    patch_size: int
    temporal_patch_size: int
    spatial_merge_size: int
    out_hidden_size: int
    deepstack_layers: int
    params: int = 0

    @property
    def merge_factor(self) -> int:
        """Patches per LLM token (spatial merge squared); each LLM video token covers `temporal_patch_size` frames."""
        return self.spatial_merge_size ** 2


@dataclass
class ModelSpec:
    model_type: str
    family: str
    architecture: str
    auto_class: str  # the transformers auto class that builds the full model from this config
    is_moe: bool
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    intermediate_size: int
    tie_word_embeddings: bool
    layer_types: List[str]
    num_experts: int = 0
    experts_per_token: int = 0
    num_shared_experts: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    moe_layers: List[int] = field(default_factory=list)
    linear_attention: Dict[str, int] = field(default_factory=dict)
    vision: Optional[VisionSpec] = None
    groups: List[ParamGroup] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)

    # ----- counts -------------------------------------------------------------------------------------------
    def params_by_component(self) -> Dict[str, int]:
        out = {c: 0 for c in COMPONENTS}
        for g in self.groups:
            out[g.component] += g.total
        return out

    def active_by_component(self) -> Dict[str, int]:
        out = {c: 0 for c in COMPONENTS}
        for g in self.groups:
            out[g.component] += int(round(g.active))
        return out

    @property
    def total_params(self) -> int:
        return sum(g.total for g in self.groups)

    @property
    def active_params(self) -> int:
        return int(round(sum(g.active for g in self.groups)))

    @property
    def llm_params(self) -> int:
        return sum(g.total for g in self.groups if g.tower == 'llm')

    @property
    def vision_params(self) -> int:
        return sum(g.total for g in self.groups if g.tower == 'vision')

    @property
    def num_full_attention_layers(self) -> int:
        return sum(1 for t in self.layer_types if t != 'linear_attention')

    @property
    def num_linear_attention_layers(self) -> int:
        return sum(1 for t in self.layer_types if t == 'linear_attention')

    @property
    def largest_tensor_params(self) -> int:
        """The biggest single parameter tensor (a fused expert block or the embedding): what ZeRO-3 must gather."""
        return max(g.numel for g in self.groups)

    @property
    def largest_layer_params(self) -> int:
        """Parameters of the biggest decoder layer (what a checkpointed layer touches at once)."""
        per_layer = self.layer_params()
        return max(per_layer) if per_layer else 0

    def layer_params(self) -> List[int]:
        """Parameters of each decoder layer, from the layer pattern."""
        out = []
        for i, lt in enumerate(self.layer_types):
            n = 0
            for g in self.groups:
                if g.tower != 'llm' or g.component in ('embeddings', 'lm_head'):
                    continue
                if g.name == 'final_norm':
                    continue
                if g.name == 'q_norm+k_norm' and lt == 'linear_attention':
                    continue
                if g.name == 'linear_attn.norm' and lt != 'linear_attention':
                    continue
                if g.component == 'attention' and lt == 'linear_attention':
                    continue
                if g.component == 'linear_attention' and lt != 'linear_attention':
                    continue
                moe = i in self.moe_layers
                if g.component == 'dense_mlp' and moe:
                    continue
                if g.component in ('experts', 'router', 'shared_expert') and not moe:
                    continue
                n += g.numel
            out.append(n)
        return out

    def groups_of(self, *components: str, tower: Optional[str] = None) -> List[ParamGroup]:
        return [g for g in self.groups if g.component in components and (tower is None or g.tower == tower)]

    # ----- trainable parameters -----------------------------------------------------------------------------
    def lora_groups(self, targets: str = 'all-linear') -> List[ParamGroup]:
        if targets not in LORA_TARGETS:
            raise ValueError(f'unknown LoRA targets {targets!r}; choose from {", ".join(LORA_TARGETS)}')
        out = []
        for g in self.groups:
            if not g.linear or g.tower != 'llm' or g.component in ('lm_head', 'embeddings', 'router'):
                continue
            if targets == 'attention' and g.component not in ('attention', 'linear_attention'):
                continue
            if targets == 'all-linear-except-experts' and g.component == 'experts':
                continue
            out.append(g)
        return out

    def lora_params(self, rank: int, targets: str = 'all-linear') -> int:
        """Trainable LoRA parameters (A and B; no bias) at rank `rank` on `targets`."""
        return sum(g.lora_params(rank) for g in self.lora_groups(targets))

    def selective_groups(self) -> List[ParamGroup]:
        """Selective unfreezing: every parameter under self_attn / linear_attn (their q/k norms and gated norm
        included) and the shared expert (+ its gate); routed experts, router, embeddings, lm_head, the layer norms
        and the vision tower stay frozen."""
        return [g for g in self.groups if g.tower == 'llm' and (
            g.component in ('attention', 'linear_attention', 'shared_expert')
            or g.name in ('q_norm+k_norm', 'linear_attn.norm'))]

    def trainable_params(self, tuner: str, rank: int = 8, targets: str = 'all-linear') -> int:
        """Trainable parameters. `full` trains the whole LLM (embeddings, lm_head included) with the vision tower
        and merger frozen, as swift's defaults (freeze_vit=True, freeze_aligner=True) do."""
        if tuner == 'lora':
            return self.lora_params(rank, targets)
        if tuner == 'full':
            return self.llm_params
        if tuner == 'selective':
            return sum(g.total for g in self.selective_groups())
        raise ValueError(f'unknown tuner {tuner!r}; choose from {", ".join(TUNERS)}')

    # ----- presentation -------------------------------------------------------------------------------------
    def summary(self) -> Dict[str, Any]:
        d: Dict[str, Any] = {
            'model_type': self.model_type,
            'family': self.family,
            'architecture': self.architecture,
            'auto_class': self.auto_class,
            'kind': 'moe' if self.is_moe else 'dense',
            'total_params': self.total_params,
            'active_params': self.active_params,
            'params_by_component': self.params_by_component(),
            'active_by_component': self.active_by_component(),
            'hidden_size': self.hidden_size,
            'num_layers': self.num_layers,
            'num_heads': self.num_heads,
            'num_kv_heads': self.num_kv_heads,
            'head_dim': self.head_dim,
            'vocab_size': self.vocab_size,
            'tie_word_embeddings': self.tie_word_embeddings,
            'full_attention_layers': self.num_full_attention_layers,
            'linear_attention_layers': self.num_linear_attention_layers,
        }
        if self.linear_attention:
            d['linear_attention'] = dict(self.linear_attention)
        if self.is_moe:
            d['moe'] = {
                'routed_experts': self.num_experts,
                'experts_per_token': self.experts_per_token,
                'shared_experts': self.num_shared_experts,
                'moe_intermediate_size': self.moe_intermediate_size,
                'shared_expert_intermediate_size': self.shared_expert_intermediate_size,
                'moe_layers': len(self.moe_layers),
                'dense_layers': self.num_layers - len(self.moe_layers),
            }
        if self.vision is not None:
            v = self.vision
            d['vision'] = {'depth': v.depth, 'hidden_size': v.hidden_size, 'intermediate_size': v.intermediate_size,
                           'patch_size': v.patch_size, 'spatial_merge_size': v.spatial_merge_size,
                           'temporal_patch_size': v.temporal_patch_size, 'out_hidden_size': v.out_hidden_size,
                           'deepstack_layers': v.deepstack_layers, 'params': v.params}
        if self.notes:
            d['notes'] = list(self.notes)
        return d


# ---------------------------------------------------------------------------------------------------------------
# config loading
# ---------------------------------------------------------------------------------------------------------------
def load_config(path: str) -> Dict[str, Any]:
    """Read `config.json` from a model directory, or a JSON file given directly. No weights are touched."""
    p = os.fspath(path)
    if os.path.isdir(p):
        p = os.path.join(p, 'config.json')
    if not os.path.isfile(p):
        raise FileNotFoundError(f'no config.json at {path!r}')
    with open(p, encoding='utf-8') as f:
        cfg = json.load(f)
    if not isinstance(cfg, dict):
        raise ValueError(f'{p}: config is not a JSON object')
    return cfg


def load_model_spec(path: str) -> ModelSpec:
    return model_spec(load_config(path))


# Per model_type: (family, architecture, auto class, text style, vision style). The auto class is the one that
# builds the whole checkpoint (vision tower included) — AutoModelForImageTextToText for the VL types.
_TYPES = {
    'qwen3_vl': ('qwen3_vl', 'Qwen3VLForConditionalGeneration', 'AutoModelForImageTextToText', 'qwen3', 'qwen3_vl'),
    'qwen3_vl_moe': ('qwen3_vl', 'Qwen3VLMoeForConditionalGeneration', 'AutoModelForImageTextToText', 'qwen3_moe',
                     'qwen3_vl'),
    'qwen3_5': ('qwen3_5', 'Qwen3_5ForConditionalGeneration', 'AutoModelForImageTextToText', 'qwen3_5', 'qwen3_5'),
    'qwen3_5_moe': ('qwen3_5', 'Qwen3_5MoeForConditionalGeneration', 'AutoModelForImageTextToText', 'qwen3_5_moe',
                    'qwen3_5'),
    'qwen3_moe': ('qwen3', 'Qwen3MoeForCausalLM', 'AutoModelForCausalLM', 'qwen3_moe', None),
    'qwen3': ('qwen3', 'Qwen3ForCausalLM', 'AutoModelForCausalLM', 'qwen3', None),
    'qwen3_next': ('qwen3_next', 'Qwen3NextForCausalLM', 'AutoModelForCausalLM', 'qwen3_next', None),
    'qwen2_5_vl': ('qwen2_5_vl', 'Qwen2_5_VLForConditionalGeneration', 'AutoModelForImageTextToText', 'qwen2',
                   'qwen2_5_vl'),
    'mixtral': ('mixtral', 'MixtralForCausalLM', 'AutoModelForCausalLM', 'mixtral', None),
}
SUPPORTED_MODEL_TYPES = tuple(_TYPES)

# transformers 5.17 config-class defaults for the keys used below (a config.json that omits a key gets these,
# exactly as AutoConfig would fill them in).
_TEXT_DEFAULTS = {
    'qwen3_vl': dict(vocab_size=151936, hidden_size=4096, intermediate_size=22016, num_hidden_layers=32,
                     num_attention_heads=32, num_key_value_heads=None, head_dim=128, attention_bias=False),
    'qwen3_vl_moe': dict(vocab_size=151936, hidden_size=2048, intermediate_size=5632, num_hidden_layers=24,
                         num_attention_heads=16, num_key_value_heads=None, head_dim=128, attention_bias=False,
                         moe_intermediate_size=1408, num_experts_per_tok=4, num_experts=60, decoder_sparse_step=1,
                         mlp_only_layers=[]),
    'qwen3_5': dict(vocab_size=248320, hidden_size=4096, intermediate_size=12288, num_hidden_layers=32,
                    num_attention_heads=16, num_key_value_heads=4, head_dim=256, attention_bias=False,
                    linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128,
                    linear_num_key_heads=16, linear_num_value_heads=32),
    'qwen3_5_moe': dict(vocab_size=248320, hidden_size=2048, num_hidden_layers=40, num_attention_heads=16,
                        num_key_value_heads=2, head_dim=256, attention_bias=False, moe_intermediate_size=512,
                        shared_expert_intermediate_size=512, num_experts_per_tok=8, num_experts=256,
                        linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128,
                        linear_num_key_heads=16, linear_num_value_heads=32),
    'qwen3_moe': dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=24,
                      num_attention_heads=32, num_key_value_heads=4, attention_bias=False, moe_intermediate_size=768,
                      num_experts_per_tok=8, num_experts=128, decoder_sparse_step=1, mlp_only_layers=[]),
    'qwen3': dict(vocab_size=151936, hidden_size=4096, intermediate_size=22016, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=32, head_dim=128, attention_bias=False),
    'qwen3_next': dict(vocab_size=151936, hidden_size=2048, intermediate_size=5632, num_hidden_layers=48,
                       num_attention_heads=16, num_key_value_heads=2, head_dim=256, attention_bias=False,
                       moe_intermediate_size=512, shared_expert_intermediate_size=512, num_experts_per_tok=10,
                       num_experts=512, decoder_sparse_step=1, mlp_only_layers=[], linear_conv_kernel_dim=4,
                       linear_key_head_dim=128, linear_value_head_dim=128, linear_num_key_heads=16,
                       linear_num_value_heads=32),
    'qwen2_5_vl': dict(vocab_size=152064, hidden_size=8192, intermediate_size=29568, num_hidden_layers=80,
                       num_attention_heads=64, num_key_value_heads=8),
    'mixtral': dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                    num_attention_heads=32, num_key_value_heads=8, head_dim=None, num_experts_per_tok=2,
                    num_experts=8),
}
_VISION_DEFAULTS = {
    'qwen3_vl': dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, in_channels=3, patch_size=16,
                     spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=3584, num_position_embeddings=2304,
                     deepstack_visual_indexes=[8, 16, 24]),
    'qwen3_5': dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, in_channels=3, patch_size=16,
                    spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=3584, num_position_embeddings=2304),
    'qwen2_5_vl': dict(depth=32, hidden_size=3584, intermediate_size=3420, num_heads=16, in_channels=3, patch_size=14,
                       spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=3584),
}


class _Cfg:
    """dict lookup with defaults and key aliases (num_experts/num_local_experts, num_heads/num_attention_heads)."""
    _ALIASES = {'num_experts': ('num_experts', 'num_local_experts'),
                'num_heads': ('num_heads', 'num_attention_heads')}

    def __init__(self, d: Dict[str, Any], defaults: Dict[str, Any]):
        self.d, self.defaults = d, defaults

    def get(self, key: str, default: Any = None) -> Any:
        for k in self._ALIASES.get(key, (key, )):
            if self.d.get(k) is not None:
                return self.d[k]
        if self.defaults.get(key) is not None:
            return self.defaults[key]
        return default

    def int(self, key: str, default: Optional[int] = None) -> int:
        v = self.get(key, default)
        if v is None:
            raise ValueError(f'config.json lacks {key!r}')
        return int(v)


def model_spec(cfg: Dict[str, Any]) -> ModelSpec:
    """Build a ModelSpec from a parsed config.json dict."""
    model_type = cfg.get('model_type')
    if model_type not in _TYPES:
        raise UnsupportedModel(f'model_type {model_type!r} is not supported by the planner '
                               f'(supported: {", ".join(SUPPORTED_MODEL_TYPES)})')
    family, arch, auto_class, text_style, vision_style = _TYPES[model_type]
    archs = cfg.get('architectures') or []
    if archs:
        arch = archs[0]
    text_d = cfg.get('text_config') if isinstance(cfg.get('text_config'), dict) else None
    t = _Cfg(text_d if text_d is not None else cfg, _TEXT_DEFAULTS[model_type])

    hidden = t.int('hidden_size')
    layers = t.int('num_hidden_layers')
    heads = t.int('num_attention_heads')
    kv = t.get('num_key_value_heads') or heads
    head_dim = t.get('head_dim') or hidden // heads
    vocab = t.int('vocab_size')
    ffn = int(t.get('intermediate_size') or 0)
    # For the VL wrappers transformers 5 ties lm_head to the embeddings from the *top-level* flag (class default
    # False); text_config's own flag is ignored. For text-only types the top level is the text config.
    tie = bool(cfg.get('tie_word_embeddings', False))

    # ----- layer pattern ------------------------------------------------------------------------------------
    hybrid = text_style in ('qwen3_5', 'qwen3_5_moe', 'qwen3_next')
    if hybrid:
        layer_types = t.get('layer_types')
        if not layer_types:
            interval = int(t.get('full_attention_interval', 4) or 4)
            layer_types = ['linear_attention' if (i + 1) % interval else 'full_attention' for i in range(layers)]
        layer_types = ['linear_attention' if lt in ('linear_attention', 'linear') else 'full_attention'
                       for lt in layer_types]
    else:
        layer_types = ['full_attention'] * layers
    if len(layer_types) != layers:
        raise ValueError(f'layer_types has {len(layer_types)} entries for {layers} layers')

    is_moe = text_style in ('qwen3_moe', 'qwen3_5_moe', 'qwen3_next', 'mixtral')
    E = k = moe_ffn = shared_ffn = 0
    moe_layers: List[int] = []
    if is_moe:
        E = t.int('num_experts')
        k = t.int('num_experts_per_tok')
        moe_ffn = ffn if text_style == 'mixtral' else t.int('moe_intermediate_size')
        if text_style in ('qwen3_5_moe', 'qwen3_next'):
            shared_ffn = int(t.get('shared_expert_intermediate_size') or 0)
        if text_style in ('qwen3_moe', 'qwen3_next'):
            # transformers Qwen3MoeDecoderLayer: sparse iff not in mlp_only_layers and (i+1) % decoder_sparse_step == 0
            step = int(t.get('decoder_sparse_step', 1) or 1)
            only_dense = set(t.get('mlp_only_layers') or [])
            moe_layers = [i for i in range(layers) if i not in only_dense and E > 0 and (i + 1) % step == 0]
        else:  # qwen3_5_moe, mixtral: every layer is sparse
            moe_layers = list(range(layers))
        if not moe_layers:
            is_moe = False
    n_moe = len(moe_layers)
    n_dense_mlp = layers - n_moe
    n_full = sum(1 for lt in layer_types if lt == 'full_attention')
    n_lin = layers - n_full

    G: List[ParamGroup] = []

    def lin(component, name, fin, fout, count, bias=False, experts=1, tower='llm', active=1.0):
        if count <= 0:
            return
        numel = experts * fin * fout + (fout * experts if bias else 0)
        G.append(ParamGroup(component, name, numel, count, True, fin, fout, experts, tower, active))

    def other(component, name, numel, count=1, tower='llm'):
        if count <= 0 or numel <= 0:
            return
        G.append(ParamGroup(component, name, numel, count, False, tower=tower))

    # ----- embeddings / head --------------------------------------------------------------------------------
    other('embeddings', 'embed_tokens', vocab * hidden)
    if not tie:
        lin('lm_head', 'lm_head', hidden, vocab, 1)
    other('norms', 'final_norm', hidden)
    other('norms', 'input_layernorm', hidden, layers)
    other('norms', 'post_attention_layernorm', hidden, layers)

    # ----- full attention -----------------------------------------------------------------------------------
    q_out = heads * head_dim * (2 if hybrid else 1)  # Qwen3.5 / Qwen3-Next: gated attention, q_proj emits q and gate
    kv_out = kv * head_dim
    if text_style == 'qwen2':
        lin('attention', 'q_proj', hidden, q_out, n_full, bias=True)
        lin('attention', 'k_proj', hidden, kv_out, n_full, bias=True)
        lin('attention', 'v_proj', hidden, kv_out, n_full, bias=True)
        lin('attention', 'o_proj', heads * head_dim, hidden, n_full)
    else:
        bias = bool(t.get('attention_bias', False))
        lin('attention', 'q_proj', hidden, q_out, n_full, bias=bias)
        lin('attention', 'k_proj', hidden, kv_out, n_full, bias=bias)
        lin('attention', 'v_proj', hidden, kv_out, n_full, bias=bias)
        lin('attention', 'o_proj', heads * head_dim, hidden, n_full, bias=bias)
        if text_style != 'mixtral':
            other('norms', 'q_norm+k_norm', 2 * head_dim, n_full)

    # ----- linear attention (Gated DeltaNet) ----------------------------------------------------------------
    lin_dims: Dict[str, int] = {}
    if hybrid and n_lin:
        nk, nv = t.int('linear_num_key_heads'), t.int('linear_num_value_heads')
        dk, dv = t.int('linear_key_head_dim'), t.int('linear_value_head_dim')
        kernel = t.int('linear_conv_kernel_dim')
        key_dim, value_dim = nk * dk, nv * dv
        conv_dim = 2 * key_dim + value_dim
        lin_dims = dict(num_key_heads=nk, num_value_heads=nv, key_head_dim=dk, value_head_dim=dv,
                        conv_kernel=kernel, key_dim=key_dim, value_dim=value_dim, conv_dim=conv_dim)
        if text_style == 'qwen3_next':
            lin('linear_attention', 'in_proj_qkvz', hidden, 2 * key_dim + 2 * value_dim, n_lin)
            lin('linear_attention', 'in_proj_ba', hidden, 2 * nv, n_lin)
        else:
            lin('linear_attention', 'in_proj_qkv', hidden, conv_dim, n_lin)
            lin('linear_attention', 'in_proj_z', hidden, value_dim, n_lin)
            lin('linear_attention', 'in_proj_b', hidden, nv, n_lin)
            lin('linear_attention', 'in_proj_a', hidden, nv, n_lin)
        lin('linear_attention', 'out_proj', value_dim, hidden, n_lin)
        other('linear_attention', 'conv1d', conv_dim * kernel, n_lin)
        other('linear_attention', 'dt_bias+A_log', 2 * nv, n_lin)
        other('norms', 'linear_attn.norm', dv, n_lin)

    # ----- MLPs ---------------------------------------------------------------------------------------------
    if n_dense_mlp:
        if not ffn:
            raise ValueError('config.json lacks intermediate_size for the dense MLP layers')
        lin('dense_mlp', 'gate_proj', hidden, ffn, n_dense_mlp)
        lin('dense_mlp', 'up_proj', hidden, ffn, n_dense_mlp)
        lin('dense_mlp', 'down_proj', ffn, hidden, n_dense_mlp)
    if n_moe:
        frac = k / E
        lin('experts', 'experts.gate_up_proj', hidden, 2 * moe_ffn, n_moe, experts=E, active=frac)
        lin('experts', 'experts.down_proj', moe_ffn, hidden, n_moe, experts=E, active=frac)
        other('router', 'gate', E * hidden, n_moe)
        if shared_ffn:
            lin('shared_expert', 'shared_expert.gate_proj', hidden, shared_ffn, n_moe)
            lin('shared_expert', 'shared_expert.up_proj', hidden, shared_ffn, n_moe)
            lin('shared_expert', 'shared_expert.down_proj', shared_ffn, hidden, n_moe)
            lin('shared_expert', 'shared_expert_gate', hidden, 1, n_moe)

    # ----- vision tower -------------------------------------------------------------------------------------
    vision = None
    notes: List[str] = []
    if vision_style is not None:
        vd = cfg.get('vision_config') if isinstance(cfg.get('vision_config'), dict) else {}
        v = _Cfg(vd, _VISION_DEFAULTS['qwen3_vl' if vision_style == 'qwen3_vl' else vision_style])
        depth, vh, vf = v.int('depth'), v.int('hidden_size'), v.int('intermediate_size')
        ps, tps, m = v.int('patch_size'), v.int('temporal_patch_size'), v.int('spatial_merge_size')
        cin, vout = v.int('in_channels'), v.int('out_hidden_size')
        merged = vh * m * m
        n_deep = 0
        before = len(G)
        if vision_style in ('qwen3_vl', 'qwen3_5'):
            other('vision', 'patch_embed', vh * cin * tps * ps * ps + vh, tower='vision')
            other('vision', 'pos_embed', v.int('num_position_embeddings') * vh, tower='vision')
            other('vision', 'blocks.norm1+norm2', 4 * vh, depth, tower='vision')
            lin('vision', 'blocks.attn.qkv', vh, 3 * vh, depth, bias=True, tower='vision')
            lin('vision', 'blocks.attn.proj', vh, vh, depth, bias=True, tower='vision')
            lin('vision', 'blocks.mlp.linear_fc1', vh, vf, depth, bias=True, tower='vision')
            lin('vision', 'blocks.mlp.linear_fc2', vf, vh, depth, bias=True, tower='vision')
            other('vision', 'merger.norm', 2 * vh, tower='vision')
            lin('vision', 'merger.linear_fc1', merged, merged, 1, bias=True, tower='vision')
            lin('vision', 'merger.linear_fc2', merged, vout, 1, bias=True, tower='vision')
            if vision_style == 'qwen3_vl':
                n_deep = len(v.get('deepstack_visual_indexes') or [])
                other('vision', 'deepstack_merger.norm', 2 * merged, n_deep, tower='vision')
                lin('vision', 'deepstack_merger.linear_fc1', merged, merged, n_deep, bias=True, tower='vision')
                lin('vision', 'deepstack_merger.linear_fc2', merged, vout, n_deep, bias=True, tower='vision')
        else:  # qwen2_5_vl: RMSNorm, SwiGLU MLP with biases, window attention (no extra params)
            other('vision', 'patch_embed', vh * cin * tps * ps * ps, tower='vision')
            other('vision', 'blocks.norm1+norm2', 2 * vh, depth, tower='vision')
            lin('vision', 'blocks.attn.qkv', vh, 3 * vh, depth, bias=True, tower='vision')
            lin('vision', 'blocks.attn.proj', vh, vh, depth, bias=True, tower='vision')
            lin('vision', 'blocks.mlp.gate_proj', vh, vf, depth, bias=True, tower='vision')
            lin('vision', 'blocks.mlp.up_proj', vh, vf, depth, bias=True, tower='vision')
            lin('vision', 'blocks.mlp.down_proj', vf, vh, depth, bias=True, tower='vision')
            other('vision', 'merger.ln_q', vh, tower='vision')
            lin('vision', 'merger.mlp.0', merged, merged, 1, bias=True, tower='vision')
            lin('vision', 'merger.mlp.2', merged, vout, 1, bias=True, tower='vision')
        vparams = sum(g.total for g in G[before:])
        vision = VisionSpec(vision_style, depth, vh, vf, v.int('num_heads'), ps, tps, m, vout, n_deep, vparams)
        if vout != hidden:
            notes.append(f'vision out_hidden_size {vout} != text hidden_size {hidden}: the merger output does not '
                         f'match the LLM (counted as configured).')
    mtp = t.get('mtp_num_hidden_layers')
    if mtp:
        notes.append(f'{mtp} MTP layer(s) in config.json are not counted: transformers drops mtp.* weights at load.')

    return ModelSpec(
        model_type=model_type, family=family, architecture=arch, auto_class=auto_class, is_moe=is_moe,
        hidden_size=hidden, num_layers=layers, num_heads=heads, num_kv_heads=int(kv), head_dim=int(head_dim),
        vocab_size=vocab, intermediate_size=ffn, tie_word_embeddings=tie, layer_types=list(layer_types),
        num_experts=E, experts_per_token=k, num_shared_experts=1 if (is_moe and shared_ffn) else 0,
        moe_intermediate_size=moe_ffn, shared_expert_intermediate_size=shared_ffn, moe_layers=moe_layers,
        linear_attention=lin_dims, vision=vision, groups=G, notes=notes)
