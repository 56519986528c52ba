"""What a model is, from its `config.json` alone: family, dense or MoE, layer mix, vision tower, and
parameter counts per component (total and active), plus the trainable count for LoRA / full / selective.

Pure arithmetic on the JSON dict: no torch, no transformers, no weights. Standard Hugging Face decoder configs
are counted generically from their fields (hidden_size, num_hidden_layers, heads, KV heads, head_dim, vocab,
intermediate_size; MoE through num_experts / num_local_experts / n_routed_experts, num_experts_per_tok,
moe_intermediate_size, shared experts, first_k_dense_replace / decoder_sparse_step; tied embeddings; sliding and
linear attention; multi-head latent attention), text-only or with a `vision_config`. Where a family's modeling
code differs, the family tables below say how (q/k/v biases, q/k norms, sandwich norms, gated attention, biased
experts, non-gated MLPs, the vision towers of Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5, Gemma 3 and GLM-4V; the
list is in docs/planner.md); anything else is counted generically and the spec's notes say so. The layout mirrors the
transformers 5 modeling code (fused 3-D experts `mlp.experts.gate_up_proj [E, 2F, H]` / `down_proj [E, H, F]`, a
router weight `[E, H]`, ...); tests/test_plan_model_spec.py checks every family against the model built on the
meta device.

A config must state its own size (`hidden_size`, `num_hidden_layers`); keys a family's published configs leave
out come from that family's config-class defaults (`_TEXT_DEFAULTS`), any other missing key is a `ConfigError`
naming the field and the file.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, NamedTuple, Optional

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
# The largest count a config.json may state (layers, widths, vocabulary, experts): far above any real model, low
# enough that the planner's arithmetic on it stays finite.
MAX_CONFIG_INT = 10 ** 12
# Counts the planner enumerates one by one (a list per layer, a search over how many layers to checkpoint): bounded
# far lower, so that `num_hidden_layers: 1e12` is refused by its key instead of filling memory. Ten times the
# deepest published decoder (Llama 3.1 405B: 126 layers) and vision tower.
MAX_CONFIG_LAYERS = 1_000
LAYER_COUNT_KEYS = ('num_hidden_layers', 'depth', 'mtp_num_hidden_layers', 'num_nextn_predict_layers')
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
    gated_attention: bool = False  # Qwen3.5 / Qwen3-Next: q_proj also emits an output gate
    sliding_attention_layers: int = 0  # layers with sliding-window attention (counted like full attention)
    attention_kind: str = 'mha'  # mha (incl. GQA/MQA) | mla (DeepSeek latent attention)
    source: Any = None  # model_source.ConfigSource: where config.json came from (None: a dict given in code)

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
            'sliding_attention_layers': self.sliding_attention_layers,
            'attention': self.attention_kind,
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


class ConfigError(UnsupportedModel):
    """config.json cannot be planned: a required field is missing or has the wrong type (the message names both)."""


# ---------------------------------------------------------------------------------------------------------------
# families
# ---------------------------------------------------------------------------------------------------------------
# model_type -> (family, architecture, auto class). The auto class builds the whole checkpoint (vision tower
# included): AutoModelForImageTextToText for the VL types. A model_type not listed here is planned generically from
# its config (architecture from `architectures`, the standard decoder layout) with a note saying so.
_KNOWN = {
    'llama': ('llama', 'LlamaForCausalLM', 'AutoModelForCausalLM'),
    'mistral': ('mistral', 'MistralForCausalLM', 'AutoModelForCausalLM'),
    'mixtral': ('mixtral', 'MixtralForCausalLM', 'AutoModelForCausalLM'),
    'qwen2': ('qwen2', 'Qwen2ForCausalLM', 'AutoModelForCausalLM'),
    'qwen2_moe': ('qwen2', 'Qwen2MoeForCausalLM', 'AutoModelForCausalLM'),
    'qwen2_vl': ('qwen2_vl', 'Qwen2VLForConditionalGeneration', 'AutoModelForImageTextToText'),
    'qwen2_5_vl': ('qwen2_5_vl', 'Qwen2_5_VLForConditionalGeneration', 'AutoModelForImageTextToText'),
    'qwen3': ('qwen3', 'Qwen3ForCausalLM', 'AutoModelForCausalLM'),
    'qwen3_moe': ('qwen3', 'Qwen3MoeForCausalLM', 'AutoModelForCausalLM'),
    'qwen3_next': ('qwen3_next', 'Qwen3NextForCausalLM', 'AutoModelForCausalLM'),
    'qwen3_vl': ('qwen3_vl', 'Qwen3VLForConditionalGeneration', 'AutoModelForImageTextToText'),
    'qwen3_vl_moe': ('qwen3_vl', 'Qwen3VLMoeForConditionalGeneration', 'AutoModelForImageTextToText'),
    'qwen3_5': ('qwen3_5', 'Qwen3_5ForConditionalGeneration', 'AutoModelForImageTextToText'),
    'qwen3_5_moe': ('qwen3_5', 'Qwen3_5MoeForConditionalGeneration', 'AutoModelForImageTextToText'),
    'gemma3': ('gemma3', 'Gemma3ForConditionalGeneration', 'AutoModelForImageTextToText'),
    'gemma3_text': ('gemma3', 'Gemma3ForCausalLM', 'AutoModelForCausalLM'),
    'deepseek_v3': ('deepseek_v3', 'DeepseekV3ForCausalLM', 'AutoModelForCausalLM'),
    'glm4_moe': ('glm4_moe', 'Glm4MoeForCausalLM', 'AutoModelForCausalLM'),
    'glm4v': ('glm4v', 'Glm4vForConditionalGeneration', 'AutoModelForImageTextToText'),
    'glm46v': ('glm4v', 'Glm46VForConditionalGeneration', 'AutoModelForImageTextToText'),
    'glm4v_moe': ('glm4v', 'Glm4vMoeForConditionalGeneration', 'AutoModelForImageTextToText'),
}
SUPPORTED_MODEL_TYPES = tuple(_KNOWN)

# Where a family's modeling code differs from the standard decoder (keyed by the top-level or text model_type).
_QKV_BIAS = {'qwen2', 'qwen2_moe', 'qwen2_vl', 'qwen2_5_vl', 'qwen2_vl_text', 'qwen2_5_vl_text', 'glm4v',
             'glm4v_text'}  # q/k/v bias, no o
_QK_NORM = {'qwen3', 'qwen3_moe', 'qwen3_next', 'qwen3_vl', 'qwen3_vl_moe', 'qwen3_5', 'qwen3_5_moe', 'gemma3',
            'gemma3_text', 'qwen3_vl_text', 'qwen3_vl_moe_text', 'qwen3_5_text', 'qwen3_5_moe_text'}  # per-head RMSNorm
_SANDWICH_NORM = {'gemma2', 'gemma3', 'gemma3_text', 'glm4', 'glm4v', 'glm4v_text'}  # 4 norms per layer
_HYBRID = {'qwen3_5', 'qwen3_5_moe', 'qwen3_next', 'qwen3_5_text', 'qwen3_5_moe_text'}  # gated DeltaNet + gated attn
_TIE_DEFAULT = {'gemma', 'gemma2', 'gemma3', 'gemma3_text'}  # config classes whose tie_word_embeddings defaults True
_QK_NORM_FULL = {'olmo2', 'olmo3', 'olmoe'}  # q_norm over heads x head_dim, k_norm over kv heads x head_dim
_QK_NORM_NO_WEIGHTS = {'llama4', 'llama4_text'}  # use_qk_norm is a weightless L2 norm
_NON_GATED_MLP = {'arcee', 'apertus', 'nemotron', 'nanochat', 'starcoder2'}  # up_proj + down_proj, no gate
_NORM_BIAS = {'nemotron', 'starcoder2'}  # LayerNorms with a bias
_NO_NORM_WEIGHTS = {'nanochat'}  # parameter-free RMSNorm
_ACT_PARAMS = {'apertus': 2}  # xIELU's alpha_p / alpha_n per MLP
_GPT_OSS = {'gpt_oss'}  # biased experts and router, attention sinks (one per head)
# families whose experts have their own width (moe_intermediate_size); elsewhere (mixtral, olmoe, llama4, ...) an
# expert is as wide as intermediate_size
_OWN_EXPERT_WIDTH = {'qwen2_moe', 'qwen3_moe', 'qwen3_vl_moe', 'qwen3_vl_moe_text', 'qwen3_next', 'qwen3_5_moe',
                     'qwen3_5_moe_text', 'deepseek_v2', 'deepseek_v3', 'glm4_moe', 'glm4v_moe', 'ernie4_5_moe'}
_ROUTER_BIAS_PARAM = {'ernie4_5_moe'}  # e_score_correction_bias is a parameter (elsewhere a buffer)
_VISION_STYLE = {'qwen3_vl': 'qwen3_vl', 'qwen3_vl_moe': 'qwen3_vl', 'qwen3_5': 'qwen3_5', 'qwen3_5_moe': 'qwen3_5',
                 'qwen2_5_vl': 'qwen2_5_vl', 'qwen2_vl': 'qwen2_vl', 'gemma3': 'gemma3', 'glm4v': 'glm4v',
                 'glm46v': 'glm4v', 'glm4v_moe': 'glm4v'}

# Config-class defaults (transformers 5.x) for keys that published configs of a family leave out. Only keys with
# a family-wide value are here: a config must always state its own size (hidden_size, num_hidden_layers), so a stub
# holding little more than model_type is an error, never a model invented from defaults.
_TEXT_DEFAULTS: Dict[str, Dict[str, Any]] = {
    # published gemma-3 text_configs list only what differs from Gemma3TextConfig
    'gemma3': dict(vocab_size=262208, num_attention_heads=8, num_key_value_heads=4, head_dim=256,
                   intermediate_size=9216, sliding_window_pattern=6),
    'qwen3_5': dict(linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128,
                    linear_num_key_heads=16, linear_num_value_heads=32, full_attention_interval=4),
    'qwen3_next': dict(linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128,
                       linear_num_key_heads=16, linear_num_value_heads=32, full_attention_interval=4),
    'qwen3_moe': dict(decoder_sparse_step=1),
    'qwen2_moe': dict(decoder_sparse_step=1),
    'deepseek_v3': dict(first_k_dense_replace=3, moe_layer_freq=1, n_shared_experts=1),
}
_TEXT_DEFAULTS['gemma3_text'] = _TEXT_DEFAULTS['gemma3']
# A VL wrapper's text_config may name a text model_type and leave its size to that config class, as published
# llava-1.5 configs do ({"model_type": "llama", "vocab_size": 32064}); transformers then builds the class default.
# Only there (a nested text_config next to a vision_config) are these sizes filled in, and the plan says so.
_NESTED_TEXT_DEFAULTS = {
    'llama': dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                  vocab_size=32000),  # LlamaConfig()
    'mistral': dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                    num_key_value_heads=8, vocab_size=32000),  # MistralConfig()
    'qwen2': dict(hidden_size=4096, intermediate_size=22016, num_hidden_layers=32, num_attention_heads=32,
                  num_key_value_heads=32, vocab_size=151936),  # Qwen2Config()
}
_TEXT_DEFAULTS['qwen3_5_moe'] = _TEXT_DEFAULTS['qwen3_5']
_VISION_DEFAULTS = {
    'qwen3_vl': dict(in_channels=3, patch_size=16, spatial_merge_size=2, temporal_patch_size=2,
                     num_position_embeddings=2304),
    'qwen3_5': dict(in_channels=3, patch_size=16, spatial_merge_size=2, temporal_patch_size=2,
                    num_position_embeddings=2304),
    'qwen2_5_vl': dict(in_channels=3, patch_size=14, spatial_merge_size=2, temporal_patch_size=2),
    'qwen2_vl': dict(in_channels=3, patch_size=14, spatial_merge_size=2, temporal_patch_size=2, mlp_ratio=4),
    'gemma3': dict(in_channels=3, vision_use_head=True),  # SiglipVisionConfig
    'glm4v': dict(in_channels=3, patch_size=14, spatial_merge_size=2, temporal_patch_size=2, image_size=336),
    'vit': dict(in_channels=3),
}


class _Cfg:
    """A config section with the family's defaults and key aliases; a missing key is an error naming the field."""
    _ALIASES = {'num_experts': ('num_experts', 'num_local_experts', 'n_routed_experts', 'moe_num_experts'),
                'num_experts_per_tok': ('num_experts_per_tok', 'moe_k', 'moe_topk'),
                'n_shared_experts': ('n_shared_experts', 'moe_num_shared_experts'),
                'attention_bias': ('attention_bias', 'use_bias'),
                'num_heads': ('num_heads', 'num_attention_heads'),
                'in_channels': ('in_channels', 'in_chans', 'num_channels'),
                'depth': ('depth', 'num_hidden_layers')}

    def __init__(self, d: Dict[str, Any], defaults: Dict[str, Any], where: str, prefix: str = ''):
        self.d, self.defaults, self.where, self.prefix = d, defaults, where, prefix

    def has(self, key: str) -> bool:
        return any(self.d.get(k) is not None for k in self._ALIASES.get(key, (key, )))

    def get(self, key: str, default: Any = None) -> Any:
        for k in self._ALIASES.get(key, (key, )):
            if self.d.get(k) is not None:
                return self.d[k]
        if self.defaults.get(key) is not None:
            return self.defaults[key]
        return default

    def int(self, key: str, default: Optional[int] = None, required: bool = True) -> int:
        v = self.get(key, default)
        if v is None:
            if not required:
                return 0
            raise ConfigError(f'{self.where}: config lacks {self.prefix + key!r}, which the planner needs to count '
                              f'the model')
        highest = MAX_CONFIG_LAYERS if key in LAYER_COUNT_KEYS else MAX_CONFIG_INT
        if (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or int(v) != v or v < 0
                or v > highest):
            raise ConfigError(f'{self.where}: {self.prefix + key!r} must be a non-negative integer up to '
                              f'{highest:g} (got {v!r})')
        return int(v)

    def require(self, key: str) -> int:
        """A key the config must state itself (no family default): the model's size."""
        if not self.has(key):
            raise ConfigError(f'{self.where}: config lacks {self.prefix + key!r}; a config.json must state the '
                              f'model\'s size (is this a complete config.json of a decoder model?)')
        value = self.int(key)
        if value < 1:  # a model of 0 layers or width has nothing to count (and emptied later max() calls)
            raise ConfigError(f'{self.where}: {self.prefix + key!r} must be at least 1 (got {value})')
        return value


def _model_type(cfg: Dict[str, Any], where: str) -> str:
    mt = cfg.get('model_type')
    if mt is None:
        raise ConfigError(f'{where}: config lacks \'model_type\'')
    if not isinstance(mt, str) or not mt:
        raise ConfigError(f'{where}: field \'model_type\' must be a non-empty string (got {mt!r})')
    return mt


class _Text(NamedTuple):
    """The text model's section of a config, as the planner reads it."""
    cfg: _Cfg  # the section with its family's defaults (`text_config`, or the config itself)
    model_type: str
    types: frozenset  # the top-level and the text model_type: the keys of the family tables
    prefix: str  # 'text_config.' or '' (for error messages)
    family: str
    architecture: str
    auto_class: str


class _Pattern(NamedTuple):
    layer_types: List[str]  # 'full_attention' | 'linear_attention' per layer
    hybrid: bool  # Gated DeltaNet + gated attention (Qwen3.5 / Qwen3-Next)
    sliding: int  # layers with sliding-window attention (counted as full attention)

    @property
    def full(self) -> int:
        return sum(1 for lt in self.layer_types if lt == 'full_attention')

    @property
    def linear(self) -> int:
        return len(self.layer_types) - self.full


class _Moe(NamedTuple):
    is_moe: bool
    experts: int = 0
    per_token: int = 0
    ffn: int = 0
    shared_ffn: int = 0
    shared: int = 0
    shared_gate: bool = False
    layers: List[int] = []


class _Groups(list):
    """The parameter groups of a model, added component by component."""

    def lin(self, component, name, fin, fout, count, bias=False, experts=1, tower='llm', active=1.0):
        if count <= 0:
            return
        numel = experts * fin * fout + (fout * experts if bias else 0)
        self.append(ParamGroup(component, name, numel, count, True, fin, fout, experts, tower, active))

    def other(self, component, name, numel, count=1, tower='llm'):
        if count <= 0 or numel <= 0:
            return
        self.append(ParamGroup(component, name, numel, count, False, tower=tower))


def _check_heads(t: '_Cfg', heads: int, kv: int, head_dim: int) -> None:
    """Attention widths a model can have: at least one head, KV head and channel, and the query heads in whole
    groups per KV head (transformers' repeat_kv repeats each KV head heads / kv times)."""
    for key, value in (('num_attention_heads', heads), ('num_key_value_heads', kv), ('head_dim', head_dim)):
        if value < 1:
            raise ConfigError(f'{t.where}: {t.prefix + key!r} must be at least 1 (got {value})')
    if heads % kv:
        raise ConfigError(f'{t.where}: {t.prefix}num_attention_heads ({heads}) must be a multiple of '
                          f'{t.prefix}num_key_value_heads ({kv}): each KV head serves a whole group of query heads')


def model_spec(cfg: Dict[str, Any], where: str = 'config.json') -> ModelSpec:
    """Build a ModelSpec from a parsed config.json dict (`where` names it in errors): the text section and its family,
    the model's size, its layer pattern and MoE layout, then its parameters component by component."""
    if not isinstance(cfg, dict):
        raise ConfigError(f'{where}: config is not a JSON object')
    notes: List[str] = []
    text = _text_section(cfg, where, notes)
    t, types = text.cfg, text.types
    hidden = t.require('hidden_size')
    layers = t.require('num_hidden_layers')
    heads = t.int('num_attention_heads')
    kv = t.int('num_key_value_heads', heads)
    head_dim = t.int('head_dim', hidden // heads if heads else None)
    _check_heads(t, heads, kv, head_dim)
    vocab = t.int('vocab_size')
    ffn = t.int('intermediate_size', required=False)
    # VL wrappers tie lm_head to the embeddings from the *top-level* flag in transformers 5 (text_config's own flag
    # is ignored); for text-only types the top level is the text config.
    tie = cfg.get('tie_word_embeddings')
    tie = bool(tie) if tie is not None else bool(types & _TIE_DEFAULT)
    pattern = _layer_pattern(t, types, layers, where, text.prefix, notes)
    moe = _moe_layout(t, types, text.model_type, layers, notes)

    groups = _Groups()
    _embedding_and_norm_groups(groups, t, types, vocab, hidden, layers, tie)
    mla = t.has('kv_lora_rank')
    if mla:
        head_dim, kv = _latent_attention_groups(groups, t, hidden, heads, pattern.full)
    else:
        _attention_groups(groups, t, types, where, text.prefix, hidden, heads, kv, head_dim, pattern)
    lin_dims = _linear_attention_groups(groups, t, types, hidden, pattern)
    dense_ffn = _mlp_groups(groups, t, types, where, text.prefix, hidden, ffn, layers, moe)
    vision = _vision_tower(groups, cfg, text.model_type, where, hidden, notes)
    for key in ('mtp_num_hidden_layers', 'num_nextn_predict_layers'):
        mtp = t.get(key)
        if mtp:
            notes.append(f'{mtp} MTP layer(s) in config.json ({key}) are not counted: transformers drops their '
                         f'weights at load.')

    return ModelSpec(
        model_type=text.model_type, family=text.family, architecture=text.architecture, auto_class=text.auto_class,
        is_moe=moe.is_moe, hidden_size=hidden, num_layers=layers, num_heads=heads, num_kv_heads=int(kv),
        head_dim=int(head_dim), vocab_size=vocab, intermediate_size=dense_ffn, tie_word_embeddings=tie,
        layer_types=list(pattern.layer_types), num_experts=moe.experts if moe.is_moe else 0,
        experts_per_token=moe.per_token, num_shared_experts=moe.shared if moe.is_moe else 0,
        moe_intermediate_size=moe.ffn, shared_expert_intermediate_size=moe.shared_ffn, moe_layers=moe.layers,
        linear_attention=lin_dims, vision=vision, groups=list(groups), notes=notes, gated_attention=pattern.hybrid,
        sliding_attention_layers=pattern.sliding, attention_kind='mla' if mla else 'mha')


def _text_section(cfg: Dict[str, Any], where: str, notes: List[str]) -> _Text:
    """The text model's section with its family's defaults; the family, architecture and auto class."""
    model_type = _model_type(cfg, where)
    if cfg.get('is_encoder_decoder'):
        raise UnsupportedModel(f'{where}: {model_type!r} is an encoder-decoder model; the planner plans decoder '
                               f'(causal LM) models, with or without a vision tower')
    text_d = cfg.get('text_config')
    if text_d is not None and not isinstance(text_d, dict):
        raise ConfigError(f'{where}: field \'text_config\' must be an object (got {type(text_d).__name__})')
    prefix = 'text_config.' if text_d is not None else ''
    text_d = text_d if text_d is not None else cfg
    text_type = text_d.get('model_type') if isinstance(text_d.get('model_type'), str) else model_type
    if model_type in _KNOWN:
        family, arch, auto_class = _KNOWN[model_type]
    else:
        has_vision = isinstance(cfg.get('vision_config'), dict)
        family = model_type
        arch = ''
        auto_class = 'AutoModelForImageTextToText' if has_vision else 'AutoModelForCausalLM'
        notes.append(f'model_type {model_type!r} has no family-specific code in the planner: counted as a standard '
                     f'Hugging Face decoder from its config fields')
    archs = cfg.get('architectures')
    if isinstance(archs, list) and archs and isinstance(archs[0], str):
        arch = archs[0]
    arch = arch or model_type
    defaults = dict(_TEXT_DEFAULTS.get(model_type) or _TEXT_DEFAULTS.get(text_type) or {})
    nested = _NESTED_TEXT_DEFAULTS.get(text_type) if prefix and isinstance(cfg.get('vision_config'), dict) else None
    if nested:
        filled = sorted(k for k in nested if text_d.get(k) is None)
        if filled:
            defaults.update({k: nested[k] for k in filled})
            text_d = dict(text_d, **{k: nested[k] for k in filled})
            notes.append(f'text_config leaves {", ".join(filled)} to the {text_type} config class: counted with its '
                         f'defaults, as transformers builds it')
    return _Text(_Cfg(text_d, defaults, where, prefix), model_type, frozenset({model_type, text_type}), prefix, family,
                 arch, auto_class)


def _layer_pattern(t: _Cfg, types, layers: int, where: str, prefix: str, notes: List[str]) -> _Pattern:
    """Which layers are linear attention (Gated DeltaNet, hybrid families only) and which slide their window."""
    hybrid = bool(types & _HYBRID)
    raw_types = t.get('layer_types')
    if raw_types is not None and (not isinstance(raw_types, list) or not all(isinstance(x, str) for x in raw_types)):
        raise ConfigError(f'{where}: {prefix}layer_types must be a list of strings')
    if hybrid and not raw_types:
        interval = t.int('full_attention_interval')
        raw_types = ['linear_attention' if (i + 1) % interval else 'full_attention' for i in range(layers)]
    if not raw_types and t.get('sliding_window_pattern') and t.get('sliding_window'):
        pattern = t.int('sliding_window_pattern')  # gemma3: every pattern-th layer is global
        raw_types = ['full_attention' if (i + 1) % pattern == 0 else 'sliding_attention' for i in range(layers)]
    if raw_types and len(raw_types) != layers:
        raise ConfigError(f'{where}: {prefix}layer_types has {len(raw_types)} entries for {layers} layers')
    raw_types = raw_types or ['full_attention'] * layers
    # Gated DeltaNet layers are counted for the hybrid families only; other layer kinds (another family's linear
    # attention, Mamba / conv blocks) have no family code and are counted as attention layers, which the plan says.
    layer_types = ['linear_attention' if hybrid and lt in ('linear_attention', 'linear') else 'full_attention'
                   for lt in raw_types]
    unknown = sorted({lt for lt in raw_types if lt not in ('full_attention', 'sliding_attention', 'attention')
                      and not (hybrid and lt in ('linear_attention', 'linear'))})
    if unknown:
        notes.append(f'layer types {", ".join(unknown)} have no family code in the planner: counted as standard '
                     f'attention layers (an estimate)')
    sliding = sum(1 for lt in raw_types if 'sliding' in lt)
    if sliding:
        notes.append(f'{sliding} of {layers} layers use sliding-window attention ({t.get("sliding_window")} tokens): '
                     f'with SDPA / flash attention no score matrix is kept, so their activations are counted like '
                     f'full attention')
    if t.get('use_sliding_window') and t.get('sliding_window') and not sliding:
        notes.append('use_sliding_window is set: counted like full attention (SDPA / flash keep no score matrix)')
    return _Pattern(layer_types, hybrid, sliding)


def _moe_layout(t: _Cfg, types, model_type: str, layers: int, notes: List[str]) -> _Moe:
    """Routed experts (through the one alias table, `_Cfg._ALIASES`), shared experts and the sparse layers."""
    E = t.int('num_experts', required=False)
    if E <= 1:
        return _Moe(False, E)
    k = t.int('num_experts_per_tok')
    if not 1 <= k <= E:
        raise ConfigError(f'{t.where}: {t.prefix}num_experts_per_tok must be between 1 and the {E} experts (got {k})')
    if types & _OWN_EXPERT_WIDTH and not t.has('moe_intermediate_size'):
        # these families' experts are narrower than the dense MLP: intermediate_size would count them several times
        raise ConfigError(f'{t.where}: config lacks {t.prefix + "moe_intermediate_size"!r}, the width of one '
                          f'{sorted(types & _OWN_EXPERT_WIDTH)[0]} expert, which the planner needs to count the model')
    moe_ffn = t.int('moe_intermediate_size') if t.has('moe_intermediate_size') else t.int('intermediate_size')
    shared_ffn = n_shared = 0
    shared_gate = False
    if t.get('shared_expert_intermediate_size'):  # qwen2_moe / qwen3_next / qwen3_5_moe: one gated expert
        shared_ffn, n_shared, shared_gate = t.int('shared_expert_intermediate_size'), 1, True
    elif t.get('n_shared_experts'):  # deepseek / glm4_moe / ernie4_5_moe: n shared experts in one MLP, ungated
        n_shared = t.int('n_shared_experts')
        shared_ffn = moe_ffn * n_shared
    elif types & {'llama4', 'llama4_text'}:  # one ungated shared expert as wide as a routed one
        n_shared, shared_ffn = 1, moe_ffn
    moe_layers = _sparse_layers(t, model_type, layers)
    if not moe_layers:
        notes.append(f'{E} experts configured but no layer is sparse: planned as dense')
    return _Moe(bool(moe_layers), E, k, moe_ffn, shared_ffn, n_shared, shared_gate, moe_layers)


def _sparse_layers(t: _Cfg, model_type: str, layers: int) -> List[int]:
    explicit = t.get('moe_layers')
    if isinstance(explicit, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in explicit):
        return sorted(i for i in set(explicit) if 0 <= i < layers)  # llama4: the config lists them
    if t.has('moe_layer_start_index'):  # ernie4_5_moe: [start, end] every `interval` layers
        start, interval = t.int('moe_layer_start_index'), t.int('moe_layer_interval', 1) or 1
        end = t.int('moe_layer_end_index', layers - 1)
        end = layers - 1 if end < 0 else end
        return [i for i in range(start, min(end, layers - 1) + 1) if (i - start) % interval == 0]
    if t.has('first_k_dense_replace') or model_type in ('deepseek_v3', 'glm4_moe'):
        first = t.int('first_k_dense_replace', 0)
        freq = t.int('moe_layer_freq', 1) or 1
        return [i for i in range(layers) if i >= first and i % freq == 0]
    # qwen2_moe / qwen3_moe / qwen3_next / qwen3_vl_moe: decoder_sparse_step and mlp_only_layers
    step = t.int('decoder_sparse_step', 1) or 1
    only_dense = set(t.get('mlp_only_layers') or [])
    return [i for i in range(layers) if i not in only_dense and (i + 1) % step == 0]


def _embedding_and_norm_groups(g: _Groups, t: _Cfg, types, vocab: int, hidden: int, layers: int, tie: bool) -> None:
    g.other('embeddings', 'embed_tokens', vocab * hidden)
    if not tie:
        g.lin('lm_head', 'lm_head', hidden, vocab, 1)
    norm = 0 if types & _NO_NORM_WEIGHTS else (2 if types & _NORM_BIAS else 1) * hidden
    g.other('norms', 'final_norm', norm)
    g.other('norms', 'input_layernorm', norm, layers)
    g.other('norms', 'post_attention_layernorm', norm, layers)
    if types & _SANDWICH_NORM:
        g.other('norms', 'pre+post_feedforward_layernorm', 2 * hidden, layers)


def _latent_attention_groups(g: _Groups, t: _Cfg, hidden: int, heads: int, n_full: int):
    """DeepSeek's multi-head latent attention; returns the (head_dim, kv heads) the attention kernel sees (for the
    activation estimate)."""
    nope, rope, vd = t.int('qk_nope_head_dim'), t.int('qk_rope_head_dim'), t.int('v_head_dim')
    qk_dim = nope + rope
    kv_rank = t.int('kv_lora_rank')
    q_rank = t.int('q_lora_rank', required=False)
    bias = bool(t.get('attention_bias', False))
    if q_rank:
        g.lin('attention', 'q_a_proj', hidden, q_rank, n_full, bias=bias)
        g.other('attention', 'q_a_layernorm', q_rank, n_full)
        g.lin('attention', 'q_b_proj', q_rank, heads * qk_dim, n_full)
    else:
        g.lin('attention', 'q_proj', hidden, heads * qk_dim, n_full)
    g.lin('attention', 'kv_a_proj_with_mqa', hidden, kv_rank + rope, n_full, bias=bias)
    g.other('attention', 'kv_a_layernorm', kv_rank, n_full)
    g.lin('attention', 'kv_b_proj', kv_rank, heads * (nope + vd), n_full)
    g.lin('attention', 'o_proj', heads * vd, hidden, n_full, bias=bias)
    return qk_dim, heads


def _attention_groups(g: _Groups, t: _Cfg, types, where: str, prefix: str, hidden: int, heads: int, kv: int,
                      head_dim: int, pattern: _Pattern) -> None:
    """Full attention (GQA/MQA included): q/k/v/o with the family's biases, q/k norms and sinks."""
    if not heads:
        raise ConfigError(f'{where}: config lacks {prefix + "num_attention_heads"!r}')
    n_full = pattern.full
    q_out = heads * head_dim * (2 if pattern.hybrid else 1)  # Qwen3.5 / Qwen3-Next: q_proj emits q and its gate
    kv_out = kv * head_dim
    if types & _QKV_BIAS:
        qkv_bias, o_bias = True, False
    else:
        qkv_bias = o_bias = bool(t.get('attention_bias', False))
    g.lin('attention', 'q_proj', hidden, q_out, n_full, bias=qkv_bias)
    g.lin('attention', 'k_proj', hidden, kv_out, n_full, bias=qkv_bias)
    g.lin('attention', 'v_proj', hidden, kv_out, n_full, bias=qkv_bias)
    g.lin('attention', 'o_proj', heads * head_dim, hidden, n_full, bias=o_bias)
    if types & _QK_NORM_FULL:
        g.other('norms', 'q_norm+k_norm', q_out + kv_out, n_full)
    elif (types & _QK_NORM or t.get('use_qk_norm')) and not types & (_QK_NORM_NO_WEIGHTS | _NO_NORM_WEIGHTS):
        g.other('norms', 'q_norm+k_norm', 2 * head_dim, n_full)
    if types & _GPT_OSS:
        g.other('attention', 'sinks', heads, n_full)


def _linear_attention_groups(g: _Groups, t: _Cfg, types, hidden: int, pattern: _Pattern) -> Dict[str, int]:
    """Gated DeltaNet layers (hybrid families); returns their dimensions ({} without)."""
    n_lin = pattern.linear
    if not (pattern.hybrid and n_lin):
        return {}
    nk, nv = t.int('linear_num_key_heads'), t.int('linear_num_value_heads')
    dk, dv = t.int('linear_key_head_dim'), t.int('linear_value_head_dim')
    kernel = t.int('linear_conv_kernel_dim')
    key_dim, value_dim = nk * dk, nv * dv
    conv_dim = 2 * key_dim + value_dim
    if 'qwen3_next' in types:
        g.lin('linear_attention', 'in_proj_qkvz', hidden, 2 * key_dim + 2 * value_dim, n_lin)
        g.lin('linear_attention', 'in_proj_ba', hidden, 2 * nv, n_lin)
    else:
        g.lin('linear_attention', 'in_proj_qkv', hidden, conv_dim, n_lin)
        g.lin('linear_attention', 'in_proj_z', hidden, value_dim, n_lin)
        g.lin('linear_attention', 'in_proj_b', hidden, nv, n_lin)
        g.lin('linear_attention', 'in_proj_a', hidden, nv, n_lin)
    g.lin('linear_attention', 'out_proj', value_dim, hidden, n_lin)
    g.other('linear_attention', 'conv1d', conv_dim * kernel, n_lin)
    g.other('linear_attention', 'dt_bias+A_log', 2 * nv, n_lin)
    g.other('norms', 'linear_attn.norm', dv, n_lin)
    return dict(num_key_heads=nk, num_value_heads=nv, key_head_dim=dk, value_head_dim=dv, conv_kernel=kernel,
                key_dim=key_dim, value_dim=value_dim, conv_dim=conv_dim)


def _mlp_groups(g: _Groups, t: _Cfg, types, where: str, prefix: str, hidden: int, ffn: int, layers: int,
                moe: _Moe) -> int:
    """The dense MLPs, the routed experts with their router, and the shared experts; returns the dense width."""
    n_moe = len(moe.layers)
    n_dense_mlp = layers - n_moe
    mlp_bias = bool(t.get('mlp_bias', False)) or ('starcoder2' in types and bool(t.get('use_bias', True)))
    dense_ffn = t.int('intermediate_size_mlp') if t.has('intermediate_size_mlp') else ffn  # llama4's dense layers
    if n_dense_mlp:
        if not dense_ffn:
            raise ConfigError(f'{where}: config lacks {prefix + "intermediate_size"!r} for the dense MLP layers')
        if not types & _NON_GATED_MLP:
            g.lin('dense_mlp', 'gate_proj', hidden, dense_ffn, n_dense_mlp, bias=mlp_bias)
        g.lin('dense_mlp', 'up_proj', hidden, dense_ffn, n_dense_mlp, bias=mlp_bias)
        g.lin('dense_mlp', 'down_proj', dense_ffn, hidden, n_dense_mlp, bias=mlp_bias)
        for name, n in _ACT_PARAMS.items():
            if name in types:
                g.other('dense_mlp', 'act_fn', n, n_dense_mlp)
    if n_moe:
        E, frac = moe.experts, moe.per_token / moe.experts
        expert_bias = bool(types & _GPT_OSS)
        g.lin('experts', 'experts.gate_up_proj', hidden, 2 * moe.ffn, n_moe, bias=expert_bias, experts=E, active=frac)
        g.lin('experts', 'experts.down_proj', moe.ffn, hidden, n_moe, bias=expert_bias, experts=E, active=frac)
        g.other('router', 'gate', E * hidden + (E if types & (_GPT_OSS | _ROUTER_BIAS_PARAM) else 0), n_moe)
        if moe.shared_ffn:
            g.lin('shared_expert', 'shared_expert.gate_proj', hidden, moe.shared_ffn, n_moe)
            g.lin('shared_expert', 'shared_expert.up_proj', hidden, moe.shared_ffn, n_moe)
            g.lin('shared_expert', 'shared_expert.down_proj', moe.shared_ffn, hidden, n_moe)
            if moe.shared_gate:
                g.lin('shared_expert', 'shared_expert_gate', hidden, 1, n_moe)
    return dense_ffn


def _vision_tower(g: _Groups, cfg: Dict[str, Any], model_type: str, where: str, hidden: int,
                  notes: List[str]) -> Optional[VisionSpec]:
    """The vision tower's groups (`vision_config`, by the family's style) and its description; None without one."""
    vd_raw = cfg.get('vision_config')
    style = _VISION_STYLE.get(model_type)
    if vd_raw is not None and not isinstance(vd_raw, dict):
        raise ConfigError(f'{where}: field \'vision_config\' must be an object (got {type(vd_raw).__name__})')
    if style is not None and vd_raw is None:
        raise ConfigError(f'{where}: config lacks \'vision_config\' ({model_type} is a vision-language model)')
    if vd_raw is None:
        return None
    style = style or 'vit'
    if style == 'vit':
        notes.append(f'vision tower of {model_type!r} estimated as a standard ViT (LayerNorm, biased q/k/v/o, '
                     f'two-layer MLP) plus a two-layer projector; exact counts need family-specific code')
    before = len(g)
    vision = _vision(style, _Cfg(vd_raw, _VISION_DEFAULTS[style], where, 'vision_config.'), cfg, hidden, g)
    vision.params = sum(group.total for group in g[before:])
    if vision.out_hidden_size != hidden:
        notes.append(f'vision out_hidden_size {vision.out_hidden_size} != text hidden_size {hidden}: the merger '
                     f'output does not match the LLM (counted as configured).')
    return vision


class _Tower(NamedTuple):
    """What every vision tower has, read before its style's builder adds its groups."""
    style: str
    v: _Cfg  # vision_config with the style's defaults
    cfg: Dict[str, Any]  # the whole config (some towers read top-level keys)
    text_hidden: int
    depth: int
    heads: int
    cin: int  # input channels
    ps: int  # patch size


def _vision(style: str, v: _Cfg, cfg: Dict[str, Any], text_hidden: int, g: _Groups) -> VisionSpec:
    """Add the vision tower's parameter groups to `g` and describe it for the token budget: the sizes every tower
    has, then the tower of its style (`_VISION_TOWERS`)."""
    depth, heads = v.require('depth'), v.int('num_heads', required=style != 'vit')
    cin = v.int('in_channels')
    if style == 'vit':  # some towers give square sizes as pairs ([14, 14], [448, 448]): one side is enough here
        v.d = {k: (x[0] if k in ('patch_size', 'image_size') and isinstance(x, list) and x else x)
               for k, x in v.d.items()}
    ps = v.int('patch_size', required=style != 'vit') or 14
    return _VISION_TOWERS[style](_Tower(style, v, cfg, text_hidden, depth, heads, cin, ps), g)


def _qwen3_vl_tower(tower: _Tower, g: _Groups) -> VisionSpec:
    """Qwen3-VL and Qwen3.5: LayerNorm blocks, a two-layer merger, and (Qwen3-VL) the DeepStack mergers."""
    style, v, cfg, text_hidden, depth, heads, cin, ps = tower
    vh, vf = v.require('hidden_size'), v.int('intermediate_size')
    tps, m, vout = v.int('temporal_patch_size'), v.int('spatial_merge_size'), v.int('out_hidden_size')
    merged = vh * m * m
    g.other('vision', 'patch_embed', vh * cin * tps * ps * ps + vh, tower='vision')
    g.other('vision', 'pos_embed', v.int('num_position_embeddings') * vh, tower='vision')
    g.other('vision', 'blocks.norm1+norm2', 4 * vh, depth, tower='vision')
    g.lin('vision', 'blocks.attn.qkv', vh, 3 * vh, depth, bias=True, tower='vision')
    g.lin('vision', 'blocks.attn.proj', vh, vh, depth, bias=True, tower='vision')
    g.lin('vision', 'blocks.mlp.linear_fc1', vh, vf, depth, bias=True, tower='vision')
    g.lin('vision', 'blocks.mlp.linear_fc2', vf, vh, depth, bias=True, tower='vision')
    g.other('vision', 'merger.norm', 2 * vh, tower='vision')
    g.lin('vision', 'merger.linear_fc1', merged, merged, 1, bias=True, tower='vision')
    g.lin('vision', 'merger.linear_fc2', merged, vout, 1, bias=True, tower='vision')
    n_deep = 0
    if style == 'qwen3_vl':
        n_deep = len(v.get('deepstack_visual_indexes') or [])
        g.other('vision', 'deepstack_merger.norm', 2 * merged, n_deep, tower='vision')
        g.lin('vision', 'deepstack_merger.linear_fc1', merged, merged, n_deep, bias=True, tower='vision')
        g.lin('vision', 'deepstack_merger.linear_fc2', merged, vout, n_deep, bias=True, tower='vision')
    return VisionSpec(style, depth, vh, vf, heads, ps, tps, m, vout, n_deep)


def _qwen2_5_vl_tower(tower: _Tower, g: _Groups) -> VisionSpec:
    """Qwen2.5-VL: RMSNorm, SwiGLU MLP with biases, window attention (no extra params)"""
    style, v, cfg, text_hidden, depth, heads, cin, ps = tower
    n_deep = 0
    vh, vf = v.require('hidden_size'), v.int('intermediate_size')
    tps, m, vout = v.int('temporal_patch_size'), v.int('spatial_merge_size'), v.int('out_hidden_size')
    merged = vh * m * m
    g.other('vision', 'patch_embed', vh * cin * tps * ps * ps, tower='vision')
    g.other('vision', 'blocks.norm1+norm2', 2 * vh, depth, tower='vision')
    g.lin('vision', 'blocks.attn.qkv', vh, 3 * vh, depth, bias=True, tower='vision')
    g.lin('vision', 'blocks.attn.proj', vh, vh, depth, bias=True, tower='vision')
    g.lin('vision', 'blocks.mlp.gate_proj', vh, vf, depth, bias=True, tower='vision')
    g.lin('vision', 'blocks.mlp.up_proj', vh, vf, depth, bias=True, tower='vision')
    g.lin('vision', 'blocks.mlp.down_proj', vf, vh, depth, bias=True, tower='vision')
    g.other('vision', 'merger.ln_q', vh, tower='vision')
    g.lin('vision', 'merger.mlp.0', merged, merged, 1, bias=True, tower='vision')
    g.lin('vision', 'merger.mlp.2', merged, vout, 1, bias=True, tower='vision')
    return VisionSpec(style, depth, vh, vf, heads, ps, tps, m, vout, n_deep)


def _qwen2_vl_tower(tower: _Tower, g: _Groups) -> VisionSpec:
    """Qwen2-VL: LayerNorm, GELU MLP of embed_dim * mlp_ratio; vision_config.hidden_size = LLM width"""
    style, v, cfg, text_hidden, depth, heads, cin, ps = tower
    n_deep = 0
    vh = v.require('embed_dim')
    vf = v.int('intermediate_size', vh * v.int('mlp_ratio'))
    tps, m = v.int('temporal_patch_size'), v.int('spatial_merge_size')
    vout = v.int('hidden_size', text_hidden)
    merged = vh * m * m
    g.other('vision', 'patch_embed', vh * cin * tps * ps * ps, tower='vision')
    g.other('vision', 'blocks.norm1+norm2', 4 * vh, depth, tower='vision')
    g.lin('vision', 'blocks.attn.qkv', vh, 3 * vh, depth, bias=True, tower='vision')
    g.lin('vision', 'blocks.attn.proj', vh, vh, depth, bias=True, tower='vision')
    g.lin('vision', 'blocks.mlp.fc1', vh, vf, depth, bias=True, tower='vision')
    g.lin('vision', 'blocks.mlp.fc2', vf, vh, depth, bias=True, tower='vision')
    g.other('vision', 'merger.ln_q', 2 * vh, tower='vision')
    g.lin('vision', 'merger.mlp.0', merged, merged, 1, bias=True, tower='vision')
    g.lin('vision', 'merger.mlp.2', merged, vout, 1, bias=True, tower='vision')
    return VisionSpec(style, depth, vh, vf, heads, ps, tps, m, vout, n_deep)


def _glm4v_tower(tower: _Tower, g: _Groups) -> VisionSpec:
    """GLM-4V: RMSNorm ViT with a SwiGLU MLP as wide as the LLM, conv downsample, SwiGLU merger"""
    style, v, cfg, text_hidden, depth, heads, cin, ps = tower
    n_deep = 0
    vh, vf = v.require('hidden_size'), v.int('intermediate_size')
    tps, m, vout = v.int('temporal_patch_size'), v.int('spatial_merge_size'), v.int('out_hidden_size')
    vbias = bool(v.get('attention_bias', False))
    side = v.int('image_size') // ps
    g.other('vision', 'patch_embed', vh * cin * tps * ps * ps + vh, tower='vision')
    g.other('vision', 'position_embedding', side * side * vh, tower='vision')
    g.other('vision', 'post_conv_layernorm+post_layernorm', 2 * vh, tower='vision')
    g.other('vision', 'blocks.norm1+norm2', 2 * vh, depth, tower='vision')
    g.lin('vision', 'blocks.attn.qkv', vh, 3 * vh, depth, bias=vbias, tower='vision')
    g.lin('vision', 'blocks.attn.proj', vh, vh, depth, bias=vbias, tower='vision')
    for name in ('gate_proj', 'up_proj'):
        g.lin('vision', f'blocks.mlp.{name}', vh, vout, depth, tower='vision')
    g.lin('vision', 'blocks.mlp.down_proj', vout, vh, depth, tower='vision')
    g.other('vision', 'downsample', vh * vout * m * m + vout, tower='vision')
    g.lin('vision', 'merger.proj', vout, vout, 1, tower='vision')
    g.other('vision', 'merger.post_projection_norm', 2 * vout, tower='vision')
    for name in ('gate_proj', 'up_proj'):
        g.lin('vision', f'merger.{name}', vout, vf, 1, tower='vision')
    g.lin('vision', 'merger.down_proj', vf, vout, 1, tower='vision')
    return VisionSpec(style, depth, vh, vf, heads, ps, tps, m, vout, n_deep)


def _vit_tower(tower: _Tower, g: _Groups) -> VisionSpec:
    """Gemma 3 (SigLIP + a pooled projection) and the generic ViT estimate: one image per frame, no time merge."""
    style, v, cfg, text_hidden, depth, heads, cin, ps = tower
    n_deep = 0
    vh = v.require('hidden_size')
    vf = v.int('intermediate_size', required=style == 'gemma3') or 4 * vh  # estimate: the usual 4x MLP
    image = v.int('image_size', required=style == 'gemma3')
    side = image // ps if image else 0  # no image_size: position embeddings not counted (an estimate)
    tps, vout = 1, text_hidden
    g.other('vision', 'patch_embedding', vh * cin * ps * ps + vh, tower='vision')
    g.other('vision', 'position_embedding', side * side * vh, tower='vision')
    g.other('vision', 'layer_norm1+2', 4 * vh, depth, tower='vision')
    for name in ('q_proj', 'k_proj', 'v_proj', 'out_proj'):
        g.lin('vision', f'self_attn.{name}', vh, vh, depth, bias=True, tower='vision')
    g.lin('vision', 'mlp.fc1', vh, vf, depth, bias=True, tower='vision')
    g.lin('vision', 'mlp.fc2', vf, vh, depth, bias=True, tower='vision')
    g.other('vision', 'post_layernorm', 2 * vh, tower='vision')
    if style == 'gemma3':
        if v.get('vision_use_head'):  # SigLIP's attention-pooling head (published gemma-3 configs turn it off)
            g.other('vision', 'head.probe+layernorm', 3 * vh, tower='vision')
            g.lin('vision', 'head.attention.in_proj', vh, 3 * vh, 1, bias=True, tower='vision')
            g.lin('vision', 'head.attention.out_proj', vh, vh, 1, bias=True, tower='vision')
            g.lin('vision', 'head.mlp.fc1', vh, vf, 1, bias=True, tower='vision')
            g.lin('vision', 'head.mlp.fc2', vf, vh, 1, bias=True, tower='vision')
        g.other('vision', 'multi_modal_projector.mm_input_projection', vh * text_hidden, tower='vision')
        g.other('vision', 'multi_modal_projector.mm_soft_emb_norm', vh, tower='vision')
        per_image = int(cfg.get('mm_tokens_per_image') or 256)
    else:
        g.lin('vision', 'projector.linear_1', vh, text_hidden, 1, bias=True, tower='vision')
        g.lin('vision', 'projector.linear_2', text_hidden, text_hidden, 1, bias=True, tower='vision')
        per_image = side * side or 256
    # tokens per image = (side / pool)^2: `spatial_merge_size` is the pooling factor per side
    pooled = max(1, int(round(per_image ** 0.5)))
    m = max(1, side // pooled)
    return VisionSpec(style, depth, vh, vf, heads, ps, tps, m, vout, n_deep)


# the tower of each style (_VISION_STYLE maps a model_type to its style; anything else is the generic ViT)
_VISION_TOWERS = {'qwen3_vl': _qwen3_vl_tower, 'qwen3_5': _qwen3_vl_tower, 'qwen2_5_vl': _qwen2_5_vl_tower,
                  'qwen2_vl': _qwen2_vl_tower, 'glm4v': _glm4v_tower, 'gemma3': _vit_tower, 'vit': _vit_tower}
