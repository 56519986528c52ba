"""Which backend trains this model on this hardware, whether it fits, and why — with numbers.

Rules (the product's defaults):
  dense model                -> deepspeed_zero3 (also on one GPU: the stated dense default; ZeRO-3 on one GPU
                                costs a little speed and keeps one code path from 1 to N GPUs)
  MoE model, one GPU, LoRA   -> unsloth_split_lora
  MoE model, one GPU, full / selective -> deepspeed_zero2 (ZeRO-3 is refused for MoE, Unsloth's split LoRA
                                trains adapters only)
  MoE model, several GPUs    -> megatron_ep_lora, EP = gcd(routed experts, GPUs) (EP divides both), if
                                mcore-bridge supports the model type; else deepspeed_zero2
Refusals (verdict "refused", exit 4) each name their rule and the alternative; see REFUSAL_RULES.
Does not fit (verdict "does_not_fit", exit 3): the numbers, the component that is too big, and the cheapest
alternative that fits (same hardware first: offload / another backend / selective / LoRA, then more GPUs).

`make_plan(PlanRequest) -> Plan` is the API; `swift-vora plan` and `swift-vora train` call it.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Dict, List, Optional, Tuple, Union

from . import constants as C
from .backend import AUTO, Backend
from .hardware import Hardware
from .hardware import resolve as resolve_hardware
from .memory import BACKENDS, COMPILE_MODES, DEEPSPEED_BACKENDS, VISION_MODES, MemoryEstimate, TrainSetup, estimate
from .model_source import load_model_spec
from .model_spec import LORA_TARGETS, TUNERS, ModelSpec
from .video_budget import VideoTokens, text_only_tokens, video_tokens

BACKEND_CHOICES = (AUTO, ) + BACKENDS
OFFLOADS = ('none', 'cpu')
QUANTS = ('none', '4bit')
VERDICTS = ('fits', 'does_not_fit', 'refused')
EXIT_FITS, EXIT_DOES_NOT_FIT, EXIT_REFUSED = 0, 3, 4

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

REFUSAL_RULES = {
    'zero3-moe': 'ZeRO-3 (or any DeepSpeed stage with ZeRO-3 semantics, zero3_offload included) with a MoE model',
    'qlora-moe': '4-bit / QLoRA with a MoE model',
    'quant-needs-lora': '4-bit weights with a tuner other than LoRA',
    'quant-megatron': '4-bit with the Megatron backend',
    'unsloth-multi-gpu': 'Unsloth on several GPUs',
    'unsloth-lora-only': 'unsloth_split_lora with full or selective training',
    'megatron-lora-only': 'megatron_ep_lora with full or selective training',
    'megatron-model-type': 'Megatron for a model type mcore-bridge does not support',
    'offload-deepspeed-only': 'CPU offload with a backend other than DeepSpeed',
    'parallel-megatron-only': '--ep/--tp with a backend other than megatron_ep_lora',
    'ep-needs-moe': 'expert parallelism for a dense model',
    'ep-divides': 'an EP size that does not divide both the expert count and the GPU count',
    'tp-divides': 'a TP size that does not divide the GPU count and the attention heads',
}


@dataclass
class PlanRequest:
    """Everything `plan` (and `train`) needs to decide; all fields have the CLI's defaults."""
    model: str  # model directory or config.json; only config.json is read
    hardware: Union[str, Hardware, None] = None  # profile name (3060x4, 3090x3, h200x1, h200x8), 'local', Hardware
    tuner: str = 'lora'  # lora | full | selective (attention + shared experts)
    backend: str = AUTO  # auto, or the name of a Backend (ddp, deepspeed_zero3, megatron_ep_lora, ...)
    offload: str = 'none'  # none | cpu (DeepSpeed offload_optimizer / offload_param)
    quant: str = 'none'  # none | 4bit (QLoRA: bitsandbytes NF4 base)
    ep: Optional[int] = None  # expert parallel size (Megatron); None = chosen
    tp: Optional[int] = None  # tensor parallel size (Megatron); None = 1
    micro_batch: int = 1
    pack_length: Optional[int] = None  # dataset packing (swift sft --packing): rows filled up to this many tokens
    seq_len: Optional[int] = None  # tokens per sample; when given, the sample is treated as text only
    fps: float = C.DEFAULT_FPS  # video budget (ignored when seq_len is given)
    max_frames: int = C.DEFAULT_MAX_FRAMES
    frame_tokens: int = C.DEFAULT_FRAME_TOKENS  # LLM tokens per frame pair (video.pair_tokens)
    clip_seconds: float = C.DEFAULT_CLIP_SECONDS
    text_tokens: int = C.DEFAULT_PROMPT_TOKENS + C.DEFAULT_ANSWER_TOKENS  # prompt + answer around the video
    supervised_tokens: int = C.DEFAULT_ANSWER_TOKENS  # answer tokens (positions with labels)
    lora_rank: int = C.DEFAULT_LORA_RANK
    lora_targets: str = 'all-linear'  # all-linear | all-linear-except-experts | attention
    nodes: int = 1
    gradient_checkpointing: bool = True
    compile: str = 'off'  # off | layers (recipe train.compile: the decoder layers under torch.compile)
    vision_mode: str = C.VISION_MODE_DEFAULT  # no_grad (measured default) | checkpointed_requires_grad

    def validate(self) -> None:
        checks = [('tuner', self.tuner, TUNERS), ('backend', self.backend, BACKEND_CHOICES),
                  ('offload', self.offload, OFFLOADS), ('quant', self.quant, QUANTS),
                  ('lora_targets', self.lora_targets, LORA_TARGETS), ('vision_mode', self.vision_mode, VISION_MODES),
                  ('compile', self.compile, COMPILE_MODES)]
        for name, val, allowed in checks:
            if val not in allowed:
                raise ValueError(f'{name} must be one of {", ".join(allowed)} (got {val!r})')
        for name in ('micro_batch', 'lora_rank', 'nodes', 'max_frames', 'frame_tokens'):
            if int(getattr(self, name)) < 1:
                raise ValueError(f'{name} must be >= 1')
        for name in ('ep', 'tp', 'seq_len', 'pack_length'):
            v = getattr(self, name)
            if v is not None and int(v) < 1:
                raise ValueError(f'{name} must be >= 1')
        if self.fps <= 0 or self.clip_seconds <= 0:
            raise ValueError('fps and clip_seconds must be positive')


@dataclass
class Plan:
    """A planning decision. The first seven fields are the JSON keys of docs/contract.md."""
    backend: Backend
    verdict: str  # fits | does_not_fit | refused
    gpu_peak_gib: Optional[float]  # per GPU, the largest phase (None when refused)
    host_peak_gib: Optional[float]  # per node
    reasons: List[str]
    breakdown: Dict[str, float]  # per-GPU items at the peak, GiB
    command: List[str]  # argv `train` would run: the launch's, filled by swift_vora/cli/compose.py ([] when refused)
    host_breakdown: Dict[str, float] = field(default_factory=dict)  # per-node host items, GiB
    phases: Dict[str, Dict[str, float]] = field(default_factory=dict)  # load / first_step / steady -> gpu/host GiB
    gpu_capacity_gib: Optional[float] = None
    host_limit_gib: Optional[float] = None
    host_limit_source: str = ''
    num_gpus: int = 0  # per node
    nodes: int = 1
    tuner: str = 'lora'
    offload: str = 'none'
    quant: str = 'none'
    ep: int = 1
    tp: int = 1
    micro_batch: int = 1
    lora_rank: int = C.DEFAULT_LORA_RANK
    lora_targets: str = 'all-linear'
    trainable_params: Optional[int] = None
    tokens: Dict[str, Any] = field(default_factory=dict)
    model: Dict[str, Any] = field(default_factory=dict)  # ModelSpec.summary()
    hardware: Dict[str, Any] = field(default_factory=dict)
    rule: Optional[str] = None  # refusal rule id
    alternative: Optional[Dict[str, Any]] = None  # cheapest alternative that fits (does_not_fit / refused)
    alternatives: List[Dict[str, Any]] = field(default_factory=list)
    assumptions: List[str] = field(default_factory=list)
    config_source: Dict[str, Any] = field(default_factory=dict)  # where config.json came from (model_source)
    predicted: bool = True  # every number here is a prediction (constants.py), not a measurement
    # The model as the planner read it, for the launch: config.json is read once (not in the JSON: `model` is its
    # summary there)
    spec: Optional[ModelSpec] = field(default=None, repr=False, compare=False)

    @property
    def exit_code(self) -> int:
        return {'fits': EXIT_FITS, 'does_not_fit': EXIT_DOES_NOT_FIT, 'refused': EXIT_REFUSED}[self.verdict]

    def to_dict(self) -> Dict[str, Any]:
        out = asdict(replace(self, spec=None))
        del out['spec']
        return out


# ---------------------------------------------------------------------------------------------------------------
def _gib(x: float) -> str:
    return f'{x / C.GiB:.1f} GiB'


def _gb(x: float) -> str:
    return f'{x / C.GB:.0f} GB'


def _both(x: float) -> str:
    return f'{x / C.GB:,.0f} GB ({x / C.GiB:,.1f} GiB)'


def _params(n: float) -> str:
    return f'{n / 1e9:.2f} B' if n >= 1e9 else f'{n / 1e6:.1f} M'


def resolve_tokens(req: PlanRequest, spec: ModelSpec) -> Tuple[VideoTokens, List[str]]:
    notes = []
    if req.seq_len:
        notes.append(f'sample of {req.seq_len} tokens (--seq-len): counted as text, no vision-tower activations')
        return text_only_tokens(req.seq_len, req.supervised_tokens), notes
    v = spec.vision
    kw = {}
    if v is not None:
        kw = dict(patch_size=v.patch_size, merge_size=v.spatial_merge_size, temporal_patch_size=v.temporal_patch_size)
    tok = video_tokens(req.clip_seconds, req.fps, req.max_frames, req.frame_tokens, text_tokens=req.text_tokens,
                       supervised_tokens=req.supervised_tokens, **kw)
    if v is None:
        notes.append(f'{spec.model_type} has no vision tower: the {tok.total_tokens}-token video budget is counted '
                     f'as text')
        return text_only_tokens(tok.total_tokens, req.supervised_tokens), notes
    notes.append(f'video budget: {req.clip_seconds:g} s at {req.fps:g} fps, max {req.max_frames} frames -> '
                 f'{tok.frames} frames, {tok.groups} frame pairs x {tok.tokens_per_group} tokens = '
                 f'{tok.vision_tokens} vision tokens + {tok.timestamp_tokens} timestamp + {tok.text_tokens} text '
                 f'= {tok.total_tokens} tokens per sample')
    return tok, notes


def auto_backend(spec: ModelSpec, world: int, tuner: str) -> Tuple[Backend, str]:
    """(backend, why) for backend=auto."""
    if not spec.is_moe:
        return Backend.DEEPSPEED_ZERO3, 'dense model -> DeepSpeed ZeRO-3 (the dense default, from 1 to N GPUs)'
    if world <= 1:
        if tuner == 'lora':
            return Backend.UNSLOTH_SPLIT_LORA, 'MoE model on one GPU -> Unsloth split LoRA'
        return Backend.DEEPSPEED_ZERO2, (f'MoE model, {tuner} training on one GPU -> DeepSpeed ZeRO-2 (ZeRO-3 is '
                                         f'refused for MoE; Unsloth split LoRA trains adapters only)')
    if spec.model_type in MEGATRON_SUPPORTED_MODEL_TYPES and tuner == 'lora':
        return Backend.MEGATRON_EP_LORA, f'MoE model on {world} GPUs -> Megatron expert-parallel (mcore-bridge)'
    if tuner != 'lora':  # the Megatron launcher trains LoRA only
        return Backend.DEEPSPEED_ZERO2, (f'MoE model, {tuner} training on {world} GPUs -> DeepSpeed ZeRO-2 '
                                         '(megatron_ep_lora trains LoRA only; ZeRO-3 is refused for MoE)')
    return Backend.DEEPSPEED_ZERO2, (f'MoE model on {world} GPUs, but mcore-bridge does not support '
                                     f'{spec.model_type} -> DeepSpeed ZeRO-2 (ZeRO-3 is refused for MoE)')


def choose_ep(spec: ModelSpec, world: int) -> int:
    """Largest EP dividing both the routed expert count and the GPU count."""
    if not spec.is_moe or world <= 1:
        return 1
    return math.gcd(spec.num_experts, world)


def _moe_alternative(spec: ModelSpec, world: int) -> str:
    if world > 1 and spec.model_type in MEGATRON_SUPPORTED_MODEL_TYPES:
        return f'megatron_ep_lora (expert-parallel LoRA, EP {choose_ep(spec, world)})'
    if world > 1:
        return 'unsloth_split_lora on one GPU, or deepspeed_zero2'
    return 'unsloth_split_lora (bf16 split LoRA on one GPU)'


def check_refusal(spec: ModelSpec, world: int, req: PlanRequest, backend: Backend, ep: int,
                  tp: int) -> Optional[Tuple[str, str, str]]:
    """(rule id, reason, alternative) if the combination is refused, else None."""
    moe = spec.is_moe
    if req.quant == '4bit' and moe:
        return ('qlora-moe', f'{spec.model_type} is a MoE model: bitsandbytes 4-bit does not quantize the fused 3-D '
                'expert tensors (nn.Parameters, not nn.Linear), and the MoE paths here (Unsloth split LoRA, Megatron '
                'EP) train on a bf16 base', f'bf16 LoRA with {_moe_alternative(spec, world)}')
    if req.quant == '4bit' and req.tuner != 'lora':
        return ('quant-needs-lora', f'4-bit weights cannot be trained: QLoRA is LoRA on a frozen 4-bit base, not '
                f'{req.tuner} training', '--tuner lora --quant 4bit, or --quant none')
    if req.quant == '4bit' and backend == Backend.MEGATRON_EP_LORA:
        return ('quant-megatron', 'Megatron-SWIFT has no bitsandbytes 4-bit path', 'deepspeed_zero3 with --quant 4bit')
    if backend == Backend.DEEPSPEED_ZERO3 and moe:
        return ('zero3-moe', f'{spec.model_type} is a MoE model ({spec.num_experts} routed experts): ZeRO-3 gathers '
                'every fused expert block on every rank; DeepSpeed\'s own MoE layer refuses ZeRO-3, and swift\'s '
                'leaf-module workaround runs but slowly — maintainers point MoE users to Megatron',
                _moe_alternative(spec, world) + ('' if world > 1 else '; or deepspeed_zero2 for full training'))
    if backend == Backend.UNSLOTH_SPLIT_LORA and world > 1:
        alt = _moe_alternative(spec, world) if moe else Backend.DEEPSPEED_ZERO3
        return ('unsloth-multi-gpu', f'Unsloth trains on one GPU; this plan has {world} GPUs', alt)
    if backend == Backend.UNSLOTH_SPLIT_LORA and req.tuner != 'lora':
        return ('unsloth-lora-only', f'unsloth_split_lora trains LoRA adapters only, not {req.tuner} training',
                '--tuner lora, or deepspeed_zero2' + ('' if moe else ' / deepspeed_zero3'))
    if backend == Backend.MEGATRON_EP_LORA and req.tuner != 'lora':  # what the Megatron launcher accepts
        return ('megatron-lora-only', f'megatron_ep_lora trains LoRA adapters only, not {req.tuner} training',
                '--tuner lora, or deepspeed_zero2' + ('' if moe else ' / deepspeed_zero3'))
    if backend == Backend.MEGATRON_EP_LORA and spec.model_type not in MEGATRON_SUPPORTED_MODEL_TYPES:
        alt = ('unsloth_split_lora (one GPU) or deepspeed_zero2' if moe else Backend.DEEPSPEED_ZERO3)
        return ('megatron-model-type', f'mcore-bridge does not support model_type {spec.model_type!r} (supported '
                f'list: select.MEGATRON_SUPPORTED_MODEL_TYPES, from modelscope/mcore-bridge)', alt)
    if req.offload == 'cpu' and backend not in DEEPSPEED_BACKENDS:
        return ('offload-deepspeed-only', f'CPU offload here means DeepSpeed offload_optimizer/offload_param; '
                f'{backend} has no such option in this planner',
                'deepspeed_zero2 --offload cpu' + ('' if moe else ' or deepspeed_zero3 --offload cpu'))
    if (req.ep not in (None, 1) or req.tp not in (None, 1)) and backend != Backend.MEGATRON_EP_LORA:
        return ('parallel-megatron-only', f'--ep/--tp set Megatron parallelism; backend {backend} does not use them',
                '--backend megatron_ep_lora, or drop --ep/--tp')
    if backend == Backend.MEGATRON_EP_LORA:
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


def samples_per_row(req: PlanRequest, tokens: VideoTokens) -> float:
    """Samples in one packed row: with dataset packing a row holds up to `pack_length` tokens, so the row is
    planned at that length (pack_length / tokens per sample samples, at least one); unpacked, one."""
    if not req.pack_length:
        return 1.0
    return max(1.0, req.pack_length / max(1, tokens.total_tokens))


def _setup(req: PlanRequest, hw: Hardware, backend: Backend, ep: int, tp: int, tokens: VideoTokens) -> TrainSetup:
    return TrainSetup(backend=backend, tuner=req.tuner, gpus_per_node=hw.num_gpus, nodes=hw.nodes,
                      offload=req.offload, quant=req.quant, tp=tp, ep=ep, micro_batch=req.micro_batch,
                      samples_per_row=samples_per_row(req, tokens),
                      lora_rank=req.lora_rank, lora_targets=req.lora_targets,
                      gradient_checkpointing=req.gradient_checkpointing, vision_mode=req.vision_mode,
                      # swift-vora compiles the layers under swift sft without DeepSpeed only (compile_layers.py)
                      compiled_layers=req.compile == 'layers' and backend == Backend.DDP,
                      zero3_max_live_params=(C.ZERO3_MAX_LIVE_PARAMS_SMALL_GPU
                                             if hw.gpu_mem_gib <= C.ZERO3_SMALL_GPU_GIB else C.ZERO3_MAX_LIVE_PARAMS))


def _fits(est: MemoryEstimate, hw: Hardware) -> Tuple[bool, bool]:
    gpu_ok = est.gpu_peak <= hw.gpu_mem_gib * C.GiB * (1 - C.FIT_MARGIN)
    host_ok = hw.host_ram_gib is None or est.host_peak <= hw.host_ram_gib * C.GiB
    return gpu_ok, host_ok


def _model_state_sentence(spec: ModelSpec, est: MemoryEstimate, backend: Backend, world: int) -> str:
    """Model states per GPU split into weights / grads / fp32 master / Adam (the seed-case sentence)."""
    g = est.gpu
    weights = sum(v for k, v in g.items() if k.startswith('weights') or k.startswith('LoRA adapters'))
    grads = sum(v for k, v in g.items() if k.startswith('gradients') or 'main grad' in k)
    optim = sum(v for k, v in g.items() if k.startswith('optimizer') or k.startswith('distributed optimizer'))
    parts = [f'bf16 weights {_gb(weights)}', f'gradients {_gb(grads)}']
    if 'fp32 master' in ' '.join(g):
        parts += [f'fp32 master {_gb(optim * C.BYTES_MASTER_FP32 / C.BYTES_OPTIM_STATES)}',
                  f'Adam m, v {_gb(optim * C.BYTES_ADAM / C.BYTES_OPTIM_STATES)}']
    else:
        parts.append(f'optimizer states {_gb(optim)}')
    total = weights + grads + optim
    return (f'{est.setup.tuner} training of {spec.model_type} ({_params(spec.total_params)} parameters, '
            f'{_params(est.trainable_params)} trainable) with {backend} on {world} GPU{"s" if world > 1 else ""} needs '
            f'{_both(total)} of model states per GPU: ' + ' + '.join(parts) + '.')


def _too_big(spec: ModelSpec, est: MemoryEstimate) -> str:
    items = sorted(((v, k) for k, v in est.gpu.items()), reverse=True)
    v, k = items[0]
    comp = sorted(((b, c) for c, b in est.model_state_bytes.items() if b > 0), reverse=True)
    s = f'Too big on the GPU: {k} ({_gib(v)})'
    if comp:
        b, c = comp[0]
        share = b / max(1.0, sum(x for x, _ in comp))
        s += f'; by model component, {c.replace("_", " ")} hold{"" if c.endswith("s") else "s"} {_gib(b)} ' \
             f'({share:.0%}) of the model states on each GPU'
    return s + '.'


# ---------------------------------------------------------------------------------------------------------------
def _candidate_backends(spec: ModelSpec, world: int, tuner: str) -> List[Backend]:
    if not spec.is_moe:
        return [Backend.DEEPSPEED_ZERO3, Backend.DEEPSPEED_ZERO2, Backend.DDP]
    out = []
    if world == 1 and tuner == 'lora':
        out.append(Backend.UNSLOTH_SPLIT_LORA)
    if world > 1 and tuner == 'lora' and spec.model_type in MEGATRON_SUPPORTED_MODEL_TYPES:
        out.append(Backend.MEGATRON_EP_LORA)
    return out + [Backend.DEEPSPEED_ZERO2, Backend.DDP]


_TUNER_LADDER = {'full': ['full', 'selective', 'lora'], 'selective': ['selective', 'lora'], 'lora': ['lora']}


def _evaluate(spec: ModelSpec, tokens: VideoTokens, req: PlanRequest, hw: Hardware, backend: Backend,
              ep: Optional[int] = None, tp: Optional[int] = None):
    ep = ep if ep is not None else (choose_ep(spec, hw.world) if backend == Backend.MEGATRON_EP_LORA else 1)
    tp = tp if tp is not None else 1
    if check_refusal(spec, hw.world, req, backend, ep, tp):
        return None
    est = estimate(spec, tokens, _setup(req, hw, backend, ep, tp, tokens))
    gpu_ok, host_ok = _fits(est, hw)
    return est, gpu_ok and host_ok, ep, tp


def _alt_dict(req: PlanRequest, hw: Hardware, backend: Backend, est: MemoryEstimate, ep: int, tp: int,
              label: str) -> Dict[str, Any]:
    return {'label': label, 'backend': backend, 'tuner': req.tuner, 'offload': req.offload, 'quant': req.quant,
            'micro_batch': req.micro_batch, 'pack_length': req.pack_length, 'num_gpus': hw.num_gpus,
            'nodes': hw.nodes, 'ep': ep, 'tp': tp,
            'gpu_mem_gib': hw.gpu_mem_gib, 'gpu_peak_gib': round(est.gpu_peak / C.GiB, 2),
            'host_peak_gib': round(est.host_peak / C.GiB, 2), 'host_limit_gib': hw.host_ram_gib,
            'trainable_params': est.trainable_params}


def _describe_alt(a: Dict[str, Any], spec: ModelSpec) -> str:
    tuner = {'lora': f'LoRA (r={a.get("lora_rank", "")})' if a.get('lora_rank') else 'LoRA',
             'full': 'full SFT',
             'selective': 'selective unfreezing (attention' + (' + shared experts' if spec.num_shared_experts else '')
                          + ')'}[a['tuner']]
    bits = [f'{tuner} with {a["backend"]}']
    if a['offload'] == 'cpu':
        bits.append('CPU offload')
    if a['quant'] == '4bit':
        bits.append('4-bit base (QLoRA)')
    if a['backend'] == Backend.MEGATRON_EP_LORA:
        bits.append(f'EP {a["ep"]}, TP {a["tp"]}')
    if a['micro_batch'] != 1:
        bits.append(f'micro batch {a["micro_batch"]}')
    if a.get('pack_length'):
        bits.append(f'packed rows of up to {a["pack_length"]} tokens')
    gpus = f'{a["num_gpus"]} x {a["gpu_mem_gib"]:g} GiB GPU' + ('s' if a['num_gpus'] > 1 else '')
    if a['nodes'] > 1:
        gpus += f' x {a["nodes"]} nodes'
    host = (f'host {a["host_peak_gib"]:.1f} GiB of {a["host_limit_gib"]:.1f} GiB limit'
            if a['host_limit_gib'] is not None else f'host {a["host_peak_gib"]:.1f} GiB')
    return (f'{", ".join(bits)} on {gpus}: {a["gpu_peak_gib"]:.1f} GiB per GPU '
            f'({_params(a["trainable_params"])} trainable), {host}')


def find_alternatives(spec: ModelSpec, tokens: VideoTokens, req: PlanRequest, hw: Hardware,
                      current: Tuple[str, int, int]) -> List[Dict[str, Any]]:
    """Candidates that fit, cheapest first: same hardware (smaller micro batch, other backend / offload, selective,
    LoRA, 4-bit for dense LoRA), then more GPUs of the same kind (2, 4, 8 per node with the same host RAM, then 2,
    4, 8 nodes like this one)."""
    found: List[Dict[str, Any]] = []
    seen = {(req.tuner, current[0], req.offload, req.quant, req.micro_batch, req.pack_length, hw.num_gpus, hw.nodes,
             current[2])}

    def consider(r: PlanRequest, h: Hardware, backend: Backend, label: str, tp: int = 1) -> bool:
        key = (r.tuner, backend, r.offload, r.quant, r.micro_batch, r.pack_length, h.num_gpus, h.nodes, tp)
        if key in seen:
            return False
        seen.add(key)
        res = _evaluate(spec, tokens, r, h, backend, tp=tp)
        if res is None:
            return False
        est, ok, ep, tp = res
        if ok:
            d = _alt_dict(r, h, backend, est, ep, tp, label)
            d['lora_rank'] = r.lora_rank if r.tuner == 'lora' else None
            d['request'] = replace(r, ep=ep, tp=tp)
            found.append(d)
        return ok

    def sweep(h: Hardware, label: str) -> None:
        for tuner in _TUNER_LADDER[req.tuner]:
            if spec.is_moe or tuner != 'lora':
                quants = ['none']
            else:  # dense LoRA: bf16 first, then QLoRA (or the other way round if 4-bit was asked for)
                quants = [req.quant] + [q for q in QUANTS if q != req.quant]
            for quant in quants:
                for off in OFFLOADS:
                    for backend in _candidate_backends(spec, h.world, tuner):
                        if off == 'cpu' and (backend not in DEEPSPEED_BACKENDS or quant != 'none'):
                            continue
                        r = replace(req, tuner=tuner, offload=off, quant=quant, backend=backend, ep=None, tp=None)
                        tps = [1]
                        if backend == Backend.MEGATRON_EP_LORA:  # tensor parallel also splits the vocab-parallel logits
                            tps = [t for t in (1, 2, 4, 8) if h.world % t == 0 and spec.num_heads % t == 0
                                   and spec.num_kv_heads % t == 0]
                        for tp in tps:
                            consider(r, h, backend, label, tp)

    if req.micro_batch > 1:
        r1 = replace(req, micro_batch=1, ep=None, tp=None)
        consider(r1, hw, current[0], 'same hardware, micro batch 1')
    if req.pack_length and samples_per_row(req, tokens) > 1:  # shorter packed rows, then none
        for length, label in ((tokens.total_tokens * 2, 'rows of two samples'), (None, 'unpacked')):
            if length is not None and length >= req.pack_length:
                continue
            r1 = replace(req, pack_length=length, micro_batch=1, ep=None, tp=None)
            if consider(r1, hw, current[0], f'same hardware, dataset packing: {label}'):
                break
    sweep(hw, 'same hardware')
    bigger = []
    for n in (2, 4, 8):
        if n > hw.num_gpus:
            bigger.append(hw.with_gpus(n, 1 if hw.nodes == 1 else hw.nodes))
    for nodes in (2, 4, 8):  # more nodes like this one
        if nodes > hw.nodes:
            bigger.append(hw.with_gpus(hw.num_gpus, nodes))
    for h in bigger:
        before = len(found)
        sweep(h, 'more GPUs')
        if len(found) > before and any(f['tuner'] == req.tuner for f in found):
            break
    return found


def _config_source(spec: ModelSpec, model: str) -> Dict[str, Any]:
    if spec.source is not None:
        return spec.source.to_dict()
    return {'kind': 'given', 'path': '', 'requested': model, 'model_id': '', 'local_model': True,
            'description': 'a config dict given in code'}


def memory_to_spare(spec: ModelSpec, tokens: VideoTokens, req: PlanRequest, hw: Hardware,
                    backend: Backend) -> Optional[str]:
    """A sentence when a checkpointed, compiled ddp plan leaves so much GPU memory that training without
    checkpointing (at this micro-batch, or 4) fits too: the recompute is what such a step spends its time on."""
    if not (backend == Backend.DDP and req.compile == 'layers' and req.gradient_checkpointing):
        return None
    cap = hw.gpu_mem_gib * C.GiB * C.TIGHT_FRACTION
    options = []
    for mb in sorted({req.micro_batch, max(req.micro_batch, 4)}):
        r = replace(req, gradient_checkpointing=False, micro_batch=mb)
        est = estimate(spec, tokens, _setup(r, hw, backend, 1, 1, tokens))
        if est.gpu_peak <= cap and _fits(est, hw)[1]:
            options.append((mb, est.gpu_peak))
    if not options:
        return None
    said = '; '.join(f'micro-batch {mb}: {_gib(peak)}' + (f' ({C.SPEEDUP_WITHOUT_CHECKPOINTING[mb]}x the samples/s '
                                                              'of checkpointed micro-batch 1, measured for a 2B '
                                                              'model at 6.5k tokens on an H200)'
                                                              if mb in C.SPEEDUP_WITHOUT_CHECKPOINTING else '')
                     for mb, peak in options)
    return (f'Memory to spare: without gradient checkpointing (train.gradient_checkpointing=false, '
            f'--no-gradient-checkpointing) the plan still fits -- {said}. A larger micro-batch changes the samples '
            f'per optimizer step unless train.grad_accum is lowered to match.')


# ---------------------------------------------------------------------------------------------------------------
def make_plan(request: PlanRequest, spec: Optional[ModelSpec] = None, hardware: Optional[Hardware] = None,
              search_alternatives: bool = True) -> Plan:
    """Decide backend and verdict for `request`. Reads config.json only (unless `spec` is given).

    The plan says what to run, not how: its `command` (and each alternative's) is left empty here and filled from
    the launch the backend builds for it (swift_vora/cli/compose.py)."""
    req = request
    req.validate()
    spec = spec or load_model_spec(req.model)
    hw = _hardware(req, hardware)
    world = hw.world
    tokens, token_notes = resolve_tokens(req, spec)
    backend, why = _backend(req, spec, world)
    tp = req.tp or 1
    ep = req.ep if req.ep is not None else (choose_ep(spec, world) if backend == Backend.MEGATRON_EP_LORA else 1)
    base = dict(num_gpus=hw.num_gpus, nodes=hw.nodes, tuner=req.tuner, offload=req.offload, quant=req.quant, ep=ep,
                tp=tp, micro_batch=req.micro_batch, lora_rank=req.lora_rank, lora_targets=req.lora_targets,
                tokens=tokens.to_dict(), model=spec.summary(), hardware=hw.to_dict(),
                gpu_capacity_gib=hw.gpu_mem_gib, host_limit_gib=hw.host_ram_gib,
                host_limit_source=hw.host_ram_source, config_source=_config_source(spec, req.model), spec=spec)

    refusal = check_refusal(spec, world, req, backend, ep, tp)
    if refusal:
        rule, reason, alt = refusal
        reasons = [f'Refused by rule {rule} ({REFUSAL_RULES[rule]}): {reason}.', f'Alternative: {alt}.']
        return Plan(backend=backend, verdict='refused', gpu_peak_gib=None, host_peak_gib=None, reasons=reasons,
                    breakdown={}, command=[], rule=rule, alternative={'suggestion': alt}, **base)
    if world < 1:
        reasons = [why, f'No GPU on {hw.name} ({"; ".join(hw.notes) or "0 GPUs"}): pass --hardware NAME or '
                   f'--gpus N --gpu-mem-gib G.']
        return Plan(backend=backend, verdict='does_not_fit', gpu_peak_gib=None, host_peak_gib=None, reasons=reasons,
                    breakdown={}, command=[], **base)

    est = estimate(spec, tokens, _setup(req, hw, backend, ep, tp, tokens))
    gpu_ok, host_ok = _fits(est, hw)
    verdict = 'fits' if gpu_ok and host_ok else 'does_not_fit'
    reasons = [why, *_fit_reasons(spec, tokens, req, hw, backend, est)]
    alternatives: List[Dict[str, Any]] = []
    if verdict == 'does_not_fit' and search_alternatives:
        found = find_alternatives(spec, tokens, req, hw, (backend, ep, tp))
        for f in found:
            f.pop('request')
        reasons += _alternative_reasons(found, req, spec)
        alternatives = found[:6]
    return Plan(backend=backend, verdict=verdict, gpu_peak_gib=round(est.gpu_peak / C.GiB, 2),
                host_peak_gib=round(est.host_peak / C.GiB, 2), reasons=reasons + token_notes,
                breakdown=est.gpu_gib(), command=[], host_breakdown=est.host_gib(), phases=est.phases_gib(),
                trainable_params=est.trainable_params, alternative=alternatives[0] if alternatives else None,
                alternatives=alternatives, assumptions=list(est.assumptions) + list(spec.notes) + list(hw.notes),
                **base)


def alternative_plan(plan: Plan, alternative: Dict[str, Any]) -> Plan:
    """One of `plan.alternatives` as a plan of its own (it fits), for the launch that would train it."""
    a = alternative
    return Plan(backend=Backend(a['backend']), verdict='fits', gpu_peak_gib=a['gpu_peak_gib'],
                host_peak_gib=a['host_peak_gib'], reasons=[], breakdown={}, command=[], num_gpus=a['num_gpus'],
                nodes=a['nodes'], tuner=a['tuner'], offload=a['offload'], quant=a['quant'], ep=a['ep'], tp=a['tp'],
                micro_batch=a['micro_batch'], lora_rank=plan.lora_rank, tokens=plan.tokens, model=plan.model,
                gpu_capacity_gib=a['gpu_mem_gib'], spec=plan.spec)


def _hardware(req: PlanRequest, hardware: Optional[Hardware]) -> Hardware:
    if hardware is None:
        hw = req.hardware if isinstance(req.hardware, Hardware) else resolve_hardware(req.hardware, nodes=req.nodes)
    else:
        hw = hardware
    if hw.nodes != req.nodes and req.nodes != 1:
        hw = replace(hw, nodes=req.nodes)
    return hw


def _backend(req: PlanRequest, spec: ModelSpec, world: int) -> Tuple[Backend, str]:
    """(backend, the first reason: why this one)."""
    if req.backend == AUTO:
        backend, why = auto_backend(spec, world, req.tuner)
        return backend, f'backend auto -> {backend}: {why}.'
    return Backend(req.backend), f'backend {req.backend} (as requested).'


def _fit_reasons(spec: ModelSpec, tokens: VideoTokens, req: PlanRequest, hw: Hardware, backend: Backend,
                 est: MemoryEstimate) -> List[str]:
    """The peaks against the hardware, and what is too big or what is to spare."""
    gpu_ok, host_ok = _fits(est, hw)
    cap = hw.gpu_mem_gib * C.GiB
    host_lim = hw.host_ram_gib * C.GiB if hw.host_ram_gib is not None else None
    peak_phase = max(est.phases, key=lambda p: est.phases[p]['gpu'])
    reasons = [f'Per-GPU peak {_gib(est.gpu_peak)} ({peak_phase.replace("_", " ")}) of {_gib(cap)} '
               f'{"fits" if gpu_ok else "does NOT fit"}; host peak {_gib(est.host_peak)}'
               + (f' of {_gib(host_lim)} ({hw.host_ram_source or "limit"}) '
                  f'{"fits" if host_ok else "does NOT fit"}.' if host_lim is not None else
                  ' (host RAM limit unknown).')]
    if gpu_ok and est.gpu_peak > C.TIGHT_FRACTION * cap:
        reasons.append(f'Tight: the predicted peak is {est.gpu_peak / cap:.0%} of the GPU; the constants are not yet '
                       f'calibrated, keep a margin (smaller video budget or micro batch).')
    if not gpu_ok:
        reasons.append(_model_state_sentence(spec, est, backend, hw.world))
        reasons.append(_too_big(spec, est))
        if backend in DEEPSPEED_BACKENDS + (Backend.DDP, ) and req.offload == 'none' and req.tuner != 'lora':
            reasons.append(_offload_sentence(spec, tokens, req, hw, backend))
    elif not host_ok:
        big = sorted(((v, k) for k, v in est.host.items()), reverse=True)[0]
        reasons.append(f'Too big in host RAM: {big[1]} ({_gib(big[0])}) — the container limit is enforced by the '
                       f'OOM killer (SIGKILL, exit 137).')
    else:
        spare = memory_to_spare(spec, tokens, req, hw, backend)
        if spare:
            reasons.append(spare)
    return reasons


def _offload_sentence(spec: ModelSpec, tokens: VideoTokens, req: PlanRequest, hw: Hardware, backend: Backend) -> str:
    """What offloading to host RAM would need (DeepSpeed), against the host limit."""
    off_backend = (Backend.DEEPSPEED_ZERO2 if (spec.is_moe or backend == Backend.DEEPSPEED_ZERO2)
                   else Backend.DEEPSPEED_ZERO3)
    r_off = replace(req, offload='cpu', backend=off_backend)
    oe = estimate(spec, tokens, _setup(r_off, hw, off_backend, 1, 1, tokens))
    opt = oe.host.get('offloaded optimizer states (fp32 master + Adam m, v)', 0.0)
    _, oh = _fits(oe, hw)
    host_lim = hw.host_ram_gib * C.GiB if hw.host_ram_gib is not None else None
    stages = 'ZeRO-2' + ('' if spec.is_moe else '/3')
    s = (f'{stages} with CPU offload moves the fp32 master + Adam states to host RAM: they alone need '
         f'{_both(opt)}; the predicted host peak is {_both(oe.host_peak)} with the fp32 gradient partition'
         f'{" and offloaded parameters" if off_backend == Backend.DEEPSPEED_ZERO3 else ""} and pinned buffers')
    if host_lim is not None:
        s += (f', against the {_both(host_lim)} container/host limit'
              + (' — over the limit: the OOM killer would end the job with SIGKILL (exit 137), no Python '
                 'error' if not oh else ' — that fits in host RAM'))
    if spec.is_moe:
        s += ' (ZeRO-3 offload needs at least as much and is refused for MoE models anyway)'
    return s + '.'


def _alternative_reasons(found: List[Dict[str, Any]], req: PlanRequest, spec: ModelSpec) -> List[str]:
    if not found:
        return ['No alternative with up to 8 GPUs per node or 8 such nodes fits: reduce the video budget '
                '(--max-frames, --frame-tokens) or use bigger GPUs.']
    cheapest = found[0]
    reasons = ['Cheapest alternative that fits: ' + _describe_alt(cheapest, spec) + '.']
    if cheapest['tuner'] != req.tuner:
        keep = next((f for f in found if f['tuner'] == req.tuner), None)
        if keep:
            reasons.append(f'Keeping {req.tuner} training: ' + _describe_alt(keep, spec) + '.')
    return reasons
