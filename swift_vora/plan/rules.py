"""The planner's rules: which backends `auto` considers, the expert-parallel size, and the refused combinations.

`auto` plans every candidate below that is not refused and picks the one of fewest estimated hours that fits
(plan/search.py); the first of each row is the default where no estimate tells them apart:
  dense model                -> deepspeed_zero3 (also on one GPU: the stated dense default; ZeRO-3 on one GPU
                                costs a little speed and keeps one code path from 1 to N GPUs)
  dense LoRA with FP8 base   -> ddp (the FP8 layers are not shown to work under DeepSpeed)
  MoE model, LoRA            -> unsloth_split_lora (one replica per GPU where the model fits one GPU: data
                                parallel on several), megatron_ep_lora (EP = gcd(routed experts, GPUs), if
                                mcore-bridge supports the model type), ddp (plain swift sft PEFT)
  MoE model, full            -> megatron_ep_full (expert parallel, the distributed optimizer), if mcore-bridge
                                supports the model type; DeepSpeed ZeRO-2 only when asked for by name
  MoE model, selective       -> ddp (attention + shared experts trained, the experts frozen)
Refusals (verdict "refused", exit 4) each name their rule and the alternative; see REFUSAL_RULES.
"""
from __future__ import annotations

import math
from typing import List, Optional, Tuple

from .backend import Backend
from .hardware import Hardware
from .memory import DEEPSPEED_BACKENDS, MEGATRON_BACKENDS
from .model_spec import ModelSpec
from .request import PlanRequest

# Model types Megatron-SWIFT can train through mcore-bridge: the HF model_type lists of its register_model(ModelMeta(
# ...)) calls, as in mcore-bridge 1.6.5 (the version installed next to ms-swift 4.6 here) and modelscope/mcore-bridge
# main (Nov 2026): model/gpts/llm.py (qwen2, llama, qwen3, qwen2_moe, qwen3_moe, internlm3, mimo, deepseek*, kimi_k2,
# dots1, ernie4_5*, glm4_moe*, gpt_oss), gpts/qwen3_next.py, gpts/olmoe.py, gpts/glm4.py, gpts/minimax_m2.py,
# mm_gpts/qwen.py (qwen2_vl, qwen2_5_vl), mm_gpts/qwen3_vl.py (qwen3_vl, qwen3_vl_moe), mm_gpts/qwen3_5*.py
# (qwen3_5, qwen3_5_moe), mm_gpts/glm4v*.py (glm4v, glm4v_moe), llama4. Not there: mixtral, among others.
# tests/test_plan_select.py re-reads the installed package for every model type the planner has family code for.
MEGATRON_SUPPORTED_MODEL_TYPES = frozenset({
    'qwen2', 'qwen2_moe', 'qwen3', 'qwen3_moe', 'qwen3_next', 'llama', 'internlm3', 'mimo', 'deepseek',
    'deepseek_v2', 'deepseek_v3', 'deepseek_v32', 'kimi_k2', 'dots1', 'ernie4_5', 'ernie4_5_moe', 'glm4_moe',
    'glm4_moe_lite', 'glm_moe_dsa', 'gpt_oss', 'olmoe', 'glm4', 'minimax_m2', 'qwen2_vl', 'qwen2_5_vl', 'qwen3_vl',
    'qwen3_vl_moe', 'qwen3_5', 'qwen3_5_moe', 'glm4v', 'glm4v_moe', 'llama4'
})

# The Megatron backend that trains each tuner (selective unfreezing has none)
MEGATRON_FOR_TUNER = {'lora': Backend.MEGATRON_EP_LORA, 'full': Backend.MEGATRON_EP_FULL}

REFUSAL_RULES = {
    'zero3-moe': 'ZeRO-3 (or any DeepSpeed stage with ZeRO-3 semantics, zero3_offload included) with a MoE model',
    'qlora-moe': '4-bit / QLoRA with a MoE model',
    'quant-needs-lora': '4-bit weights with a tuner other than LoRA',
    'quant-megatron': '4-bit with the Megatron backend',
    'unsloth-lora-only': 'unsloth_split_lora with full or selective training',
    'megatron-lora-only': 'megatron_ep_lora with full or selective training',
    'megatron-full-only': 'megatron_ep_full with a tuner other than full (LoRA: megatron_ep_lora)',
    'megatron-model-type': 'Megatron for a model type mcore-bridge does not support',
    'moe-full-auto': 'backend auto for full SFT of a MoE model whose type mcore-bridge does not support (DeepSpeed '
                     'ZeRO-2 trains a MoE only when asked for by name)',
    'offload-deepspeed-only': 'CPU offload with a backend other than DeepSpeed',
    'parallel-megatron-only': '--ep/--tp with a backend other than Megatron (megatron_ep_lora, megatron_ep_full)',
    'ep-needs-moe': 'expert parallelism for a dense model',
    'ep-divides': 'an EP size that does not divide both the expert count and the GPU count',
    'tp-divides': 'a TP size that does not divide the GPU count and the attention heads',
    'fp8-needs-lora': 'FP8 frozen base weights with a tuner that trains the base weights',
    'fp8-quant': 'FP8 frozen base weights with a 4-bit base',
    'fp8-backend': 'FP8 frozen base weights with a backend other than ddp (ZeRO, Megatron, Unsloth: not shown to work)',
    'fp8-gpu': 'FP8 frozen base weights on a GPU without FP8 tensor cores (compute capability below 8.9)',
}


def auto_candidates(spec: ModelSpec, world: int, tuner: str, fp8: str = 'off') -> List[Tuple[Backend, str]]:
    """The backends `auto` plans, each with why it is a candidate, the rule's default first (empty: none -- a MoE's
    full SFT where mcore-bridge does not support the type)."""
    if not spec.is_moe and fp8 != 'off' and tuner == 'lora':
        return [(Backend.DDP, 'dense model with FP8 frozen base weights: ddp (the FP8 layers are not shown to work '
                              'under DeepSpeed)')]
    if not spec.is_moe:
        return [(Backend.DEEPSPEED_ZERO3, 'dense model: DeepSpeed ZeRO-3, the dense default from 1 to N GPUs')]
    megatron = spec.model_type in MEGATRON_SUPPORTED_MODEL_TYPES
    if tuner == 'lora':
        out = [(Backend.UNSLOTH_SPLIT_LORA, 'MoE LoRA: Unsloth split LoRA, one replica per GPU' if world > 1 else
                'MoE LoRA on one GPU: Unsloth split LoRA')]
        if megatron:
            out.append((Backend.MEGATRON_EP_LORA, f'MoE LoRA: Megatron expert parallel (EP {choose_ep(spec, world)})'))
        out.append((Backend.DDP, 'MoE LoRA: plain swift sft (PEFT on the fused experts)'))
        return out
    if tuner == 'full':
        if not megatron:
            return []
        return [(Backend.MEGATRON_EP_FULL, f'MoE full SFT: Megatron expert parallel (EP {choose_ep(spec, world)}) '
                                           'with the distributed optimizer')]
    return [(Backend.DDP, 'MoE selective training (attention + shared experts, the experts frozen): swift sft')]


def auto_backend(spec: ModelSpec, world: int, tuner: str, fp8: str = 'off') -> Tuple[Backend, str]:
    """(backend, why): the rule's default for backend=auto, before any estimate (plan/search.py picks among
    `auto_candidates` by hours)."""
    candidates = auto_candidates(spec, world, tuner, fp8)
    if not candidates:
        return Backend.MEGATRON_EP_FULL, f'mcore-bridge does not support {spec.model_type}'
    return candidates[0]


def choose_ep(spec: ModelSpec, world: int) -> int:
    """Largest EP dividing both the routed expert count and the GPU count."""
    if not spec.is_moe or world <= 1:
        return 1
    return math.gcd(spec.num_experts, world)


def _moe_alternative(spec: ModelSpec, world: int) -> str:
    if world > 1 and spec.model_type in MEGATRON_SUPPORTED_MODEL_TYPES:
        return (f'unsloth_split_lora (one replica per GPU) or megatron_ep_lora (expert-parallel LoRA, EP '
                f'{choose_ep(spec, world)})')
    if world > 1:
        return 'unsloth_split_lora (one replica per GPU)'
    return 'unsloth_split_lora (bf16 split LoRA on one GPU)'


def check_refusal(spec: ModelSpec, world: int, req: PlanRequest, backend: Backend, ep: int,
                  tp: int, hw: Optional[Hardware] = None) -> Optional[Tuple[str, str, str]]:
    """(rule id, reason, alternative) if the combination is refused, else None."""
    moe = spec.is_moe
    refused = _fp8_refusal(req, backend, hw) if req.fp8 != 'off' else None
    if refused:
        return refused
    if req.quant == '4bit' and moe:
        return ('qlora-moe', f'{spec.model_type} is a MoE model: bitsandbytes 4-bit does not quantize the fused 3-D '
                'expert tensors (nn.Parameters, not nn.Linear), and the MoE paths here (Unsloth split LoRA, Megatron '
                'EP) train on a bf16 base', f'bf16 LoRA with {_moe_alternative(spec, world)}')
    if req.quant == '4bit' and req.tuner != 'lora':
        return ('quant-needs-lora', f'4-bit weights cannot be trained: QLoRA is LoRA on a frozen 4-bit base, not '
                f'{req.tuner} training', '--tuner lora --quant 4bit, or --quant none')
    if req.quant == '4bit' and backend in MEGATRON_BACKENDS:
        return ('quant-megatron', 'Megatron-SWIFT has no bitsandbytes 4-bit path', 'deepspeed_zero3 with --quant 4bit')
    if backend == Backend.DEEPSPEED_ZERO3 and moe:
        return ('zero3-moe', f'{spec.model_type} is a MoE model ({spec.num_experts} routed experts): ZeRO-3 gathers '
                'every fused expert block on every rank; DeepSpeed\'s own MoE layer refuses ZeRO-3, and swift\'s '
                'leaf-module workaround runs but slowly — maintainers point MoE users to Megatron',
                _moe_alternative(spec, world) + '; megatron_ep_full for full training')
    if backend == Backend.UNSLOTH_SPLIT_LORA and req.tuner != 'lora':
        return ('unsloth-lora-only', f'unsloth_split_lora trains LoRA adapters only, not {req.tuner} training',
                '--tuner lora, or ' + ('megatron_ep_full' if moe else 'deepspeed_zero3'))
    if backend == Backend.MEGATRON_EP_LORA and req.tuner != 'lora':  # what the Megatron launcher accepts
        return ('megatron-lora-only', f'megatron_ep_lora trains LoRA adapters only, not {req.tuner} training',
                ('--backend megatron_ep_full (full SFT, expert parallel, distributed optimizer)'
                 if req.tuner == 'full' else '--tuner lora') + ', or deepspeed_zero2'
                + ('' if moe else ' / deepspeed_zero3'))
    if backend == Backend.MEGATRON_EP_FULL and req.tuner != 'full':  # the full-SFT launcher trains every weight
        return ('megatron-full-only', f'megatron_ep_full trains every weight of the language model, not '
                f'{req.tuner} training', '--backend megatron_ep_lora' if req.tuner == 'lora' else
                '--tuner full, or deepspeed_zero2' + ('' if moe else ' / deepspeed_zero3'))
    if backend in MEGATRON_BACKENDS and spec.model_type not in MEGATRON_SUPPORTED_MODEL_TYPES:
        alt = ('unsloth_split_lora (one GPU) or deepspeed_zero2' if moe else Backend.DEEPSPEED_ZERO3)
        return ('megatron-model-type', f'mcore-bridge does not support model_type {spec.model_type!r} (supported '
                f'list: plan/rules.py MEGATRON_SUPPORTED_MODEL_TYPES, from modelscope/mcore-bridge)', alt)
    if req.offload == 'cpu' and backend not in DEEPSPEED_BACKENDS:
        return ('offload-deepspeed-only', f'CPU offload here means DeepSpeed offload_optimizer/offload_param; '
                f'{backend} has no such option in this planner',
                'deepspeed_zero2 --offload cpu' + ('' if moe else ' or deepspeed_zero3 --offload cpu'))
    if (req.ep not in (None, 1) or req.tp not in (None, 1)) and backend not in MEGATRON_BACKENDS:
        return ('parallel-megatron-only', f'--ep/--tp set Megatron parallelism; backend {backend} does not use them',
                f'--backend {MEGATRON_FOR_TUNER[req.tuner]}, or drop --ep/--tp' if req.tuner in MEGATRON_FOR_TUNER
                else 'drop --ep/--tp')
    if backend in MEGATRON_BACKENDS:
        if ep > 1 and not moe:
            return ('ep-needs-moe', f'{spec.model_type} is dense: there are no experts to split',
                    '--ep 1 (or omit it)')
        if moe and (spec.num_experts % ep or world % ep):
            return ('ep-divides', f'EP {ep} must divide both the {spec.num_experts} routed experts and the {world} '
                    f'GPUs', f'--ep {choose_ep(spec, world)}')
        if world % tp or spec.num_heads % tp or spec.num_kv_heads % tp:
            return ('tp-divides', f'TP {tp} must divide the {world} GPUs, the {spec.num_heads} attention heads and '
                    f'the {spec.num_kv_heads} KV heads', '--tp 1')
    return None


def _fp8_refusal(req: PlanRequest, backend: Backend, hw: Optional[Hardware]) -> Optional[Tuple[str, str, str]]:
    """train.fp8=frozen_base where it cannot run or was not shown to (swift_vora/speed/fp8_frozen.py)."""
    if req.tuner != 'lora':
        return ('fp8-needs-lora', f'--fp8 {req.fp8} computes the frozen base weights in FP8; {req.tuner} training '
                'updates them (FP8 training of the weights themselves is not offered)', '--tuner lora, or --fp8 off')
    if req.quant != 'none':
        return ('fp8-quant', f'the frozen base is held either in {req.quant} or in FP8, not both',
                '--quant none --fp8 frozen_base (1 byte per weight), or --fp8 off')
    if backend != Backend.DDP:
        why = {Backend.DEEPSPEED_ZERO3: 'ZeRO-3 partitions the weights and gathers them per module, which the FP8 '
                                        'copies would bypass',
               Backend.MEGATRON_EP_LORA: 'Megatron builds its own (Transformer Engine) layers',
               Backend.UNSLOTH_SPLIT_LORA: 'Unsloth patches its own layers and kernels'}.get(
            backend, f'{backend} was not measured with it')
        return ('fp8-backend', f'--fp8 {req.fp8} is applied to swift sft\'s PEFT model on the ddp backend; {why}',
                '--backend ddp --fp8 frozen_base, or --fp8 off')
    if hw is not None and hw.num_gpus and hw.fp8 is False:
        return ('fp8-gpu', f'{hw.gpu_name or "this GPU"} has no FP8 tensor cores (compute capability below 8.9: '
                'Ampere and older); FP8 GEMMs need Ada, Hopper or Blackwell', '--fp8 off (bf16)')
    return None
