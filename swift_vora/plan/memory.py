"""Predicted GPU (per device) and host (per node) memory of one training setup, per phase.

Backends (swift_vora/plan/backend.py names them):
  ddp                 no DeepSpeed: one process per GPU, each a full replica (on one GPU: plain single-GPU
                      training). swift without DeepSpeed trains bf16 weights with bf16 AdamW states.
  deepspeed_zero2     ZeRO-2: bf16 weights replicated, gradients and fp32 optimizer states partitioned;
                      offload='cpu' moves the fp32 master + Adam states and the fp32 gradient partition to host RAM.
  deepspeed_zero3     ZeRO-3: everything partitioned, each module gathered when used; offload='cpu' (swift's
                      zero3_offload) also keeps the bf16 parameters in host RAM.
  megatron_ep_lora    Megatron-SWIFT (mcore-bridge): dense parts split by TP, routed experts by EP (expert TP 1,
                      swift's default), distributed optimizer over data-parallel ranks, full recompute.
  megatron_ep_full    the same layout, full SFT of the language model: bf16 weights, an fp32 gradient buffer,
                      fp32 master + Adam states sharded over the data-parallel ranks of each group (experts: world/EP).
  unsloth_split_lora  Unsloth on one GPU: bf16 base, split MoE LoRA ((X@A)@B per expert), gradient checkpoints on
                      the GPU, or (checkpoint_offload) Unsloth's offloaded checkpointing: every layer input in pinned
                      host RAM.

Phases: `load` (weights placed, nothing else), `first_step` (the larger of forward/backward without optimizer
states and the first optimizer.step, which allocates them), `steady` (states live through forward/backward).
Every number is a prediction from the constants in constants.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

from .. import switches
from . import constants as C
from .backend import DEEPSPEED, Backend
from .model_spec import ModelSpec
from .video_budget import VideoTokens, frame_pair_tokens, smart_nframes, text_only_tokens, video_tokens  # noqa: F401

BACKENDS = tuple(Backend)
DEEPSPEED_BACKENDS = DEEPSPEED
# megatron sft: expert-parallel LoRA and full SFT share the model-state layout below, the activations and the logits
MEGATRON_BACKENDS = (Backend.MEGATRON_EP_LORA, Backend.MEGATRON_EP_FULL)
# full SFT under Megatron: one fp32 buffer allocated when DDP wraps the model (not a per-step allocation)
MEGATRON_FULL_GRAD_BUFFER = 'gradients: fp32 main grads, DDP buffer (every local trainable parameter)'
VISION_MODES = ('checkpointed_requires_grad', 'no_grad')
# recipe train.compile: the values of its switch, SWIFT_VORA_COMPILE (swift_vora/speed/compile_layers.py)
COMPILE_MODES = switches.switch('SWIFT_VORA_COMPILE').choices
# recipe train.fp8: the values of its switch, SWIFT_VORA_FP8 (swift_vora/speed/fp8_frozen.py)
FP8_MODES = switches.switch('SWIFT_VORA_FP8').choices
# What swift_vora/speed/fp8_frozen.py converts: the frozen nn.Linear layers of the decoder (not the fused experts, the
# embeddings, the LM head or the vision tower) whose dimensions torch._scaled_mm takes
FP8_COMPONENTS = ('attention', 'linear_attention', 'dense_mlp', 'shared_expert')
FP8_DIM_MULTIPLE = 16
PHASES = ('load', 'first_step', 'steady')


@dataclass
class TrainSetup:
    backend: Backend
    tuner: str = 'lora'
    gpus_per_node: int = 1
    nodes: int = 1
    offload: str = 'none'  # 'none' | 'cpu' (DeepSpeed backends)
    quant: str = 'none'  # 'none' | '4bit'
    tp: int = 1
    ep: int = 1
    micro_batch: int = 1
    samples_per_row: float = 1.0  # dataset packing: samples in one packed row (tokens per row / per sample)
    lora_rank: int = C.DEFAULT_LORA_RANK
    lora_targets: str = 'all-linear'
    gradient_checkpointing: bool = True
    # the first N decoder layers checkpointed, the rest keep their activations (train.checkpoint_layers); None: all
    checkpoint_layers: Optional[int] = None
    # unsloth_split_lora: layer checkpoints in pinned host RAM (Unsloth's offloaded checkpointing) instead of on the GPU
    checkpoint_offload: bool = False
    # the decoder layers compiled (train.compile=layers; applied by swift sft without DeepSpeed, with the CUDA
    # allocator's expandable segments): fewer saved activations, little fragmentation
    compiled_layers: bool = False
    # the decoder's frozen base linears held and multiplied in FP8 (train.fp8=frozen_base; LoRA on ddp)
    fp8: bool = False
    vision_mode: str = C.VISION_MODE_DEFAULT
    logits_positions: str = 'auto'  # 'auto' (the backend's default) | 'supervised' | 'all'
    # megatron_ep_lora: --cross_entropy_fusion_impl (recipe megatron.cross_entropy_fusion_impl): native | te
    cross_entropy: str = C.MEGATRON_CROSS_ENTROPY_DEFAULT
    # megatron_ep_lora: --recompute_granularity (recipe megatron.recompute): full | selective | none; the last two
    # are planned with gradient_checkpointing off (constants.MEGATRON_RECOMPUTE says why for selective)
    recompute: str = 'full'
    dataloader_workers: int = C.HOST_DATALOADER_WORKERS
    zero3_max_live_params: float = C.ZERO3_MAX_LIVE_PARAMS  # the generated DeepSpeed JSON's value

    @property
    def world(self) -> int:
        return self.gpus_per_node * self.nodes


@dataclass
class MemoryEstimate:
    setup: TrainSetup
    gpu: Dict[str, float]  # bytes per GPU, steady-state items
    host: Dict[str, float]  # bytes per node, items at the host peak (load or steady)
    phases: Dict[str, Dict[str, float]]  # phase -> {'gpu': bytes, 'host': bytes}
    trainable_params: int
    tokens: VideoTokens
    model_state_bytes: Dict[str, float]  # per GPU, by model component (weights + grads + optimizer)
    assumptions: List[str] = field(default_factory=list)
    host_by_phase: Dict[str, Dict[str, float]] = field(default_factory=dict)  # 'load' / 'steady' -> items

    @property
    def gpu_peak(self) -> float:
        return max(p['gpu'] for p in self.phases.values())

    @property
    def host_peak(self) -> float:
        return max(p['host'] for p in self.phases.values())

    def gpu_gib(self) -> Dict[str, float]:
        return _rounded_gib(self.gpu)

    def host_gib(self) -> Dict[str, float]:
        return _rounded_gib(self.host)

    def phases_gib(self) -> Dict[str, Dict[str, float]]:
        return {ph: {'gpu_gib': round(v['gpu'] / C.GiB, 2), 'host_gib': round(v['host'] / C.GiB, 2),
                     'gpu_allocated_gib': round(v['gpu_allocated'] / C.GiB, 2),
                     'gpu_reserved_gib': round(v['gpu_reserved'] / C.GiB, 2)}
                for ph, v in self.phases.items()}


def _rounded_gib(items: Dict[str, float]) -> Dict[str, float]:
    """Items in GiB to 2 decimals that add up to their total rounded the same way (largest remainders take the
    last hundredth), negative ones included (memory freed within the moment): a breakdown whose total is the peak."""
    kept = {k: v / C.GiB for k, v in items.items() if abs(v) >= 0.0005 * C.GiB}
    cents = {k: int(v * 100 // 1) for k, v in kept.items()}
    short = round(sum(kept.values()) * 100) - sum(cents.values())
    for k in sorted(kept, key=lambda k: kept[k] * 100 - cents[k], reverse=True)[:max(0, short)]:
        cents[k] += 1
    return {k: c / 100 for k, c in cents.items() if c}


# ---------------------------------------------------------------------------------------------------------------
def fp8_eligible(g) -> bool:
    """Whether train.fp8=frozen_base holds this parameter group in FP8 (what speed/fp8_frozen.py converts)."""
    return (g.linear and g.tower == 'llm' and g.experts == 1 and g.component in FP8_COMPONENTS
            and g.in_features % FP8_DIM_MULTIPLE == 0 and g.out_features % FP8_DIM_MULTIPLE == 0)


def _weight_bytes(spec: ModelSpec, quant: str, fp8: bool = False) -> Dict[str, float]:
    """bf16 (or NF4 for the LLM's linear weights, or FP8 for the decoder's frozen linears) bytes of the base model,
    by component."""
    out: Dict[str, float] = {}
    for g in spec.groups:
        per = C.BYTES_BF16
        if quant == '4bit' and g.linear and g.tower == 'llm' and g.component not in ('lm_head', ):
            per = C.BYTES_NF4
        elif fp8 and fp8_eligible(g):
            per = C.BYTES_FP8  # the bias stays bf16: a rounding error at this scale
        out[g.component] = out.get(g.component, 0.0) + g.total * per
    return out


def fp8_saving(spec: ModelSpec) -> float:
    """Bytes the FP8 copies save against bf16: what the load phase holds more (the model loads in bf16 and is
    converted at train begin)."""
    return sum(_weight_bytes(spec, 'none').values()) - sum(_weight_bytes(spec, 'none', fp8=True).values())


def _trainable_by_component(spec: ModelSpec, s: TrainSetup) -> Dict[str, int]:
    out: Dict[str, int] = {}
    if s.tuner == 'lora':
        for g in spec.lora_groups(s.lora_targets):
            out[g.component] = out.get(g.component, 0) + g.lora_params(s.lora_rank)
    elif s.tuner == 'full':
        for g in spec.groups:
            if g.tower == 'llm':
                out[g.component] = out.get(g.component, 0) + g.total
    elif s.tuner == 'selective':
        for g in spec.selective_groups():
            out[g.component] = out.get(g.component, 0) + g.total
    else:
        raise ValueError(f'unknown tuner {s.tuner!r}')
    return out


def _megatron_split(component: str, s: TrainSetup) -> int:
    """How many ways Megatron splits a component's parameters across GPUs."""
    if component == 'experts':
        return max(1, s.ep)  # expert_tensor_parallel_size = 1 (swift's default)
    if component in ('embeddings', 'lm_head', 'attention', 'linear_attention', 'dense_mlp', 'shared_expert'):
        return max(1, s.tp)
    return 1  # norms, router, vision tower: replicated


def _model_states(spec: ModelSpec, s: TrainSetup):
    """(gpu items, host items, per-component gpu bytes, trainable count, notes)."""
    N = s.world
    gpu: Dict[str, float] = {}
    host: Dict[str, float] = {}
    notes: List[str] = []
    wb = _weight_bytes(spec, s.quant, s.fp8)
    W = sum(wb.values())
    tr = _trainable_by_component(spec, s)
    T = sum(tr.values())
    lora = s.tuner == 'lora'
    wname = 'weights (frozen base, NF4 + bf16)' if s.quant == '4bit' else (
        'weights (frozen base, FP8 linears + bf16)' if s.fp8 else
        'weights (frozen base, bf16)' if lora else 'weights (bf16)')
    comp_bytes: Dict[str, float] = {c: 0.0 for c in wb}

    def add(d, k, v):
        if v:
            d[k] = d.get(k, 0.0) + v

    b = s.backend
    if b in (Backend.DDP, Backend.UNSLOTH_SPLIT_LORA):
        add(gpu, wname, W)
        for c, v in wb.items():
            comp_bytes[c] += v
        if lora:
            add(gpu, 'LoRA adapters (fp32)', C.BYTES_LORA_PARAM_PEFT * T)
            add(gpu, 'gradients (LoRA, fp32)', C.BYTES_LORA_PARAM_PEFT * T)
            add(gpu, 'optimizer states (Adam m, v fp32)', C.BYTES_ADAM * T)
            per = 2 * C.BYTES_LORA_PARAM_PEFT + C.BYTES_ADAM
        else:
            add(gpu, 'gradients (bf16)', C.BYTES_GRAD_BF16 * T)
            add(gpu, 'optimizer states (Adam m, v bf16)', C.BYTES_PURE_BF16_ADAM * T)
            per = C.BYTES_GRAD_BF16 + C.BYTES_PURE_BF16_ADAM
            notes.append('without DeepSpeed swift trains bf16 weights with bf16 AdamW states (no fp32 master copy)')
        for c, n in tr.items():
            comp_bytes[c] = comp_bytes.get(c, 0.0) + per * n
        if N > 1:  # DDP (ddp; Unsloth's replicas on several GPUs) all-reduces the gradients through its buckets
            add(gpu, 'DDP gradient buckets', (C.BYTES_LORA_PARAM_PEFT if lora else C.BYTES_GRAD_BF16) * T)
    elif b in (Backend.DEEPSPEED_ZERO2, Backend.DEEPSPEED_ZERO3):
        z3 = b == Backend.DEEPSPEED_ZERO3
        off = s.offload == 'cpu'
        # DeepSpeed's bf16 mode casts the module (LoRA adapters included) to bf16.
        adapters = C.BYTES_BF16 * T if lora else 0.0
        if z3:
            if off:
                add(host, 'offloaded bf16 parameters (ZeRO-3)', (W + adapters) / s.nodes)
            else:
                add(gpu, 'weights shard (ZeRO-3, bf16)', (W + adapters) / N)
                for c, v in wb.items():
                    comp_bytes[c] += v / N
            # a parameter is gathered whole, however small stage3_max_live_parameters is
            gathered = C.ZERO3_GATHER_FACTOR * C.BYTES_BF16 * spec.largest_tensor_params
            if N > 1:  # other ranks' partitions, kept gathered for reuse up to stage3_max_live_parameters
                gathered += C.BYTES_BF16 * min(s.zero3_max_live_params, spec.total_params * (N - 1) / N)
            add(gpu, 'ZeRO-3 gathered parameters (working set)', gathered)
        else:
            add(gpu, wname, W)
            add(gpu, 'LoRA adapters (bf16)', adapters)
            for c, v in wb.items():
                comp_bytes[c] += v
        grads = C.BYTES_GRAD_BF16 * T
        bucket = min(grads, C.ZERO2_BUCKET_ELEMENTS * C.BYTES_GRAD_BF16 * C.ZERO2_BUCKET_COPIES)
        add(gpu, 'gradient buckets', bucket)
        if off:
            add(host, 'offloaded optimizer states (fp32 master + Adam m, v)', C.BYTES_OPTIM_STATES * T / s.nodes)
            add(host, 'offloaded fp32 gradient partition', C.BYTES_FP32 * T / s.nodes)
            pinned = C.OFFLOAD_HOST_OVERHEAD * sum(host.values())
            add(host, 'pinned/bounce buffers', pinned)
        else:
            add(gpu, 'gradients (bf16, partitioned)', grads / N)
            add(gpu, 'optimizer states (fp32 master + Adam m, v, partitioned)', C.BYTES_OPTIM_STATES * T / N)
            for c, n in tr.items():
                comp_bytes[c] = comp_bytes.get(c, 0.0) + (C.BYTES_GRAD_BF16 + C.BYTES_OPTIM_STATES) * n / N
                if lora:
                    comp_bytes[c] += C.BYTES_BF16 * n / (N if z3 else 1)
    elif b in MEGATRON_BACKENDS:
        # What Megatron-SWIFT 4.6 holds besides activations and logits (all in the allocator unless said):
        # - bf16 weights, dense parts / TP, routed experts / EP (expert_tensor_parallel_size 1); the frozen vision
        #   tower replicated (swift's --freeze_vit, no grad buffer for it);
        # - the DDP grad buffer: an fp32 main grad per trainable parameter (main_grads_dtype fp32,
        #   swift/megatron/arguments/megatron_args.py:525; accumulate_allreduce_grads_in_fp32) -- LoRA adapters only
        #   under LoRA (frozen parameters get no buffer, megatron/core/distributed/distributed_data_parallel.py);
        # - the distributed optimizer (use_distributed_optimizer True): fp32 main params + Adam m, v of the
        #   trainable parameters, sharded over the data-parallel ranks of their group;
        # - outside the allocator: the CUDA context and cuBLAS/TE workspaces (CUDA_CONTEXT_GIB; TE's GEMM workspace
        #   is 32 MiB per stream) and NCCL's buffers.
        # Full SFT (megatron_ep_full), as megatron-core 0.16.1 allocates it: the trainable bf16 weights are moved into
        # DDP's param buffer (param.data replaced, not copied: distributed/param_and_grad_buffer.py); its grad buffer
        # holds an fp32 main grad for every local trainable parameter, whole on every rank (the reduce-scatter works
        # in place); the DistributedOptimizer keeps an fp32 copy of this rank's shard (shard_fp32_from_float16_groups,
        # made when the optimizer is built) and TE FusedAdam's exp_avg / exp_avg_sq of it (fp32, at the first step);
        # the shard is the local parameters over the data-parallel group of their kind -- the expert-data-parallel
        # group (world / EP) for the routed experts, world / TP for the rest.
        dp_dense = max(1, N // max(1, s.tp))
        dp_exp = max(1, N // max(1, s.ep))
        w = 0.0
        for c, v in wb.items():
            part = v / _megatron_split(c, s)
            w += part
            comp_bytes[c] += part
        add(gpu, wname, w)
        pg = grads = master = adam = 0.0
        for c, n in tr.items():
            dp = dp_exp if c == 'experts' else dp_dense
            local = n / _megatron_split(c, s)
            if lora:
                pg += C.BYTES_MEGATRON_PARAM_AND_GRAD * local
                comp_bytes[c] = comp_bytes.get(c, 0.0) + C.BYTES_MEGATRON_PARAM_AND_GRAD * local
            else:  # the bf16 weight is counted above
                grads += C.BYTES_FP32 * local
                comp_bytes[c] = comp_bytes.get(c, 0.0) + C.BYTES_FP32 * local
            master += C.BYTES_MASTER_FP32 * local / dp
            adam += C.BYTES_ADAM * local / dp
            comp_bytes[c] += C.BYTES_OPTIM_STATES * local / dp
        if lora:
            add(gpu, 'LoRA adapters (bf16) + fp32 main grads', pg)
            add(gpu, 'distributed optimizer (fp32 master + Adam, sharded over DP)', master + adam)
        else:
            add(gpu, MEGATRON_FULL_GRAD_BUFFER, grads)
            add(gpu, 'distributed optimizer: fp32 master params (sharded over DP)', master)
            add(gpu, 'distributed optimizer: Adam m, v fp32 (sharded over DP)', adam)
            notes.append(f'megatron_ep_full: optimizer states sharded over {dp_dense} data-parallel rank(s) for the '
                         f'dense parts and {dp_exp} for the routed experts (EP {s.ep}); the fp32 gradient buffer '
                         'is whole on every rank')
    else:
        raise ValueError(f'unknown backend {b!r}')
    return gpu, host, comp_bytes, T, notes


# ---------------------------------------------------------------------------------------------------------------
def _layer_activation_bytes(spec: ModelSpec, s: TrainSetup, tokens: float, layer: int) -> float:
    """Saved activations of decoder layer `layer` for `tokens` tokens (no recompute), bf16."""
    h = spec.hidden_size
    n = C.ACT_BYTES_PER_HIDDEN * h
    lt = spec.layer_types[layer]
    if lt == 'linear_attention':
        la = spec.linear_attention
        n += C.ACT_LINEAR_ATTN_BYTES_PER_CONV * la['conv_dim'] + C.ACT_LINEAR_ATTN_BYTES_PER_VALUE * la['value_dim']
        if s.backend == Backend.UNSLOTH_SPLIT_LORA:
            # the fla Triton kernel Unsloth runs (ChunkGatedDeltaRuleFunction) keeps the chunk's WY matrix A
            # [tokens, heads, chunk] in fp32 and recomputes the per-chunk states in its backward
            n += la['num_value_heads'] * C.LINEAR_ATTN_CHUNK * C.LINEAR_ATTN_STATE_BYTES
        else:
            # chunked delta rule (the PyTorch reference) keeps one fp32 state [heads, dk, dv] per chunk
            n += (la['num_value_heads'] * la['key_head_dim'] * la['value_head_dim'] * C.LINEAR_ATTN_STATE_BYTES /
                  C.LINEAR_ATTN_CHUNK)
    else:
        gated = 2 if spec.gated_attention else 1
        q = spec.num_heads * spec.head_dim
        kv = spec.num_kv_heads * spec.head_dim
        n += C.ACT_BYTES_PER_QKV * (gated * q + 2 * kv) + C.ACT_BYTES_PER_ATTN_OUT * q
    if layer in spec.moe_layers:
        k = spec.experts_per_token
        n += C.ACT_BYTES_PER_ROUTER_LOGIT * spec.num_experts
        if s.backend == Backend.UNSLOTH_SPLIT_LORA:  # what its grouped-GEMM expert path keeps (constants.py)
            ffn, copies = C.UNSLOTH_ACT_BYTES_PER_EXPERT_FFN, C.UNSLOTH_MOE_DISPATCH_COPIES
        else:
            ffn, copies = C.ACT_BYTES_PER_FFN, C.MOE_DISPATCH_COPIES
        n += k * (ffn * spec.moe_intermediate_size + copies * C.BYTES_BF16 * h)
        n += C.ACT_BYTES_PER_FFN * spec.shared_expert_intermediate_size
    else:
        n += C.ACT_BYTES_PER_FFN * spec.intermediate_size
    if s.tuner == 'lora' and s.backend != Backend.UNSLOTH_SPLIT_LORA:
        ins = 0.0
        for g in spec.lora_groups(s.lora_targets):
            if g.component == 'attention' and lt == 'linear_attention':
                continue
            if g.component == 'linear_attention' and lt != 'linear_attention':
                continue
            moe = layer in spec.moe_layers
            if g.component in ('experts', 'shared_expert') and not moe:
                continue
            if g.component == 'dense_mlp' and moe:
                continue
            ins += g.in_features * (spec.experts_per_token if g.component == 'experts' else 1)
        n += C.ACT_LORA_BYTES_PER_INPUT * ins
    return n * tokens


def _activations(spec: ModelSpec, s: TrainSetup, tok: VideoTokens):
    """(gpu items, host items, notes) for activations, logits and the vision tower."""
    gpu: Dict[str, float] = {}
    host: Dict[str, float] = {}
    notes: List[str] = []
    b = s.micro_batch * s.samples_per_row  # samples per micro-batch: a packed row holds several
    seq = tok.total_tokens * b
    sp = max(1, s.tp) if s.backend in MEGATRON_BACKENDS else 1  # sequence parallel splits activations by TP
    local = seq / sp
    h = spec.hidden_size
    L = spec.num_layers
    saved = C.ACT_COMPILED_SAVED_FRACTION if s.compiled_layers else 1.0
    backward = C.ACT_BACKWARD_FACTOR_COMPILED if s.compiled_layers else C.ACT_BACKWARD_FACTOR
    per_layer = [saved * _layer_activation_bytes(spec, s, local, i) for i in range(L)]
    if s.compiled_layers:
        notes.append('decoder layers compiled (torch.compile): fused kernels save fewer activations')
    if s.gradient_checkpointing:
        # train.checkpoint_layers: the first K layers checkpointed, the last L - K keep everything they save
        K = L if s.checkpoint_layers is None else max(0, min(L, s.checkpoint_layers))
        ckpt = K * C.ACT_CHECKPOINT_BYTES_PER_HIDDEN * h * local
        if K < L:
            gpu[f'activations: {L - K} of {L} layers not checkpointed'] = sum(per_layer[K:])
            if K:  # K = 0: the assumption says so (gradient checkpointing on, of no decoder layer)
                notes.append(f'gradient checkpointing of the first {K} of {L} decoder layers only')
        ws = backward * max(per_layer)
        if s.backend == Backend.UNSLOTH_SPLIT_LORA and s.checkpoint_offload:
            # one process per GPU of the node, each with its own pinned checkpoints
            host['offloaded layer checkpoints (Unsloth, pinned)'] = (ckpt * C.UNSLOTH_OFFLOAD_PINNED_FACTOR
                                                                     * s.gpus_per_node)
            gpu['activations: in-flight layer inputs (offloaded checkpointing)'] = (
                C.UNSLOTH_GPU_INFLIGHT_LAYERS * C.ACT_CHECKPOINT_BYTES_PER_HIDDEN * h * local)
            notes.append('Unsloth offloaded gradient checkpointing keeps every layer input in pinned host RAM')
        else:
            gpu['activations: layer checkpoints'] = ckpt
        llm_ws = ws
    else:
        kept = C.MEGATRON_ACT_SAVED_FRACTION if s.backend in MEGATRON_BACKENDS else 1.0
        gpu['activations: all layers (no checkpointing)'] = kept * sum(per_layer)
        llm_ws = backward * max(per_layer) - max(per_layer)
        notes.append('gradient checkpointing off: every layer keeps its activations')
        if s.backend in MEGATRON_BACKENDS and s.recompute == 'selective':
            notes.append('megatron.recompute=selective recomputes the core attention only, which with fused '
                         'attention keeps nothing a recompute drops: planned as no recompute')

    # vision tower ---------------------------------------------------------------------------------------------
    vit_ws = 0.0
    v = spec.vision
    if v is not None and tok.patches > 0:
        P = tok.patches * b
        merged_out = tok.vision_tokens * b * v.out_hidden_size * C.BYTES_BF16 * (1 + v.deepstack_layers)
        pixels = P * 3 * v.temporal_patch_size * v.patch_size ** 2 * C.BYTES_BF16
        block = P * (C.VIT_ACT_BYTES_PER_HIDDEN * v.hidden_size + C.VIT_ACT_BYTES_PER_QKV * v.hidden_size +
                     C.VIT_ACT_BYTES_PER_FFN * v.intermediate_size)
        if s.vision_mode == 'checkpointed_requires_grad':
            kept = v.depth * C.ACT_CHECKPOINT_BYTES_PER_HIDDEN * v.hidden_size * P
            gpu['activations: vision tower (frozen, checkpointed, inputs require grad)'] = kept + merged_out + pixels
            # The recomputed block's activations plus the gradients alive at once: the block is frozen, so only
            # activation gradients exist, and autograd frees them as it goes -- the FFN-wide one and the
            # residual-stream one at most (not ACT_BACKWARD_FACTOR x block, which assumes every saved tensor has
            # a gradient of its own at the same time).
            vit_ws = block + P * C.BYTES_BF16 * (v.intermediate_size + v.hidden_size)
        elif s.vision_mode == 'no_grad':
            gpu['activations: vision tower outputs (frozen, no grad)'] = merged_out + pixels
            vit_ws = block  # transient during its forward only
        else:
            raise ValueError(f'unknown vision mode {s.vision_mode!r}')
    ws_label = ('activations: working set of one layer (recompute + backward)' if vit_ws <= llm_ws else
                'activations: working set of one vision block (recompute + backward)')
    ws = max(llm_ws, vit_ws)
    gpu[ws_label] = ws

    # PEFT LoRA on fused experts (HF backends): W + B@A of one layer's experts is materialised ------------------
    if (s.tuner == 'lora' and spec.is_moe and s.backend in (Backend.DDP, *DEEPSPEED)
            and any(g.component == 'experts' for g in spec.lora_groups(s.lora_targets))):
        largest = max(g.numel for g in spec.groups if g.component == 'experts')
        gpu['PEFT expert LoRA: materialised W + B@A (transient)'] = C.PEFT_EXPERT_LORA_TRANSIENT_BYTES * largest
        notes.append('PEFT LoRA on fused experts materialises W + B@A per layer (Unsloth split LoRA does not)')

    # Megatron full SFT: without apex there is no gradient-accumulation fusion (swift turns it off), so each weight
    # gradient is made in bf16 and only then added to its fp32 main grad by DDP's hook (and freed): the largest local
    # tensor's, once ------------------------------------------------------------------------------------------
    if s.backend == Backend.MEGATRON_EP_FULL and s.tuner != 'lora':
        largest = max((g.numel / _megatron_split(g.component, s) for g in spec.groups if g.tower == 'llm'), default=0)
        gpu['weight gradient in flight (bf16, the largest local tensor, before DDP adds it in fp32)'] = (
            C.BYTES_BF16 * largest)

    # logits ---------------------------------------------------------------------------------------------------
    mode = s.logits_positions
    if mode == 'auto':
        mode = 'all' if s.backend in MEGATRON_BACKENDS else 'supervised'
    positions = (tok.supervised_tokens + 1) * b if mode == 'supervised' else seq
    if s.backend in MEGATRON_BACKENDS:
        if s.cross_entropy not in C.LOGITS_BYTES_MEGATRON:
            raise ValueError(f'unknown Megatron cross entropy {s.cross_entropy!r}')
        logits = positions * spec.vocab_size * C.LOGITS_BYTES_MEGATRON[s.cross_entropy] / max(1, s.tp)
        label = ('logits + loss (all positions, vocab-parallel, TE fused cross entropy)' if s.cross_entropy == 'te'
                 else 'logits + loss (all positions, vocab-parallel, fp32 softmax)')
    elif s.backend == Backend.UNSLOTH_SPLIT_LORA:
        logits = positions * spec.vocab_size * C.LOGITS_BYTES_UNSLOTH
        label = 'logits + loss (supervised suffix, fused CE)' if mode == 'supervised' else 'logits + loss (fused CE)'
    else:
        logits = positions * spec.vocab_size * C.LOGITS_BYTES_HF
        label = ('logits + loss (supervised positions only, fp32)' if mode == 'supervised' else
                 'logits + loss (all positions, fp32)')
    if s.backend in MEGATRON_BACKENDS and logits > ws:
        # Megatron's model returns the per-token loss, not the logits (megatron/core/models/common/language_module/
        # language_module.py compute_language_model_loss): the loss's backward through the output layer frees
        # them before the last layer is recomputed, so the layer's working set comes after, not on top. The other
        # backends still add both: their logits are the supervised positions' (small), never measured apart.
        del gpu[ws_label]
        gpu[label] = logits
        notes.append(f'{ws_label.split(": ", 1)[1]} ({ws / C.GiB:.2f} GiB) comes after Megatron\'s loss backward '
                     'has freed the logits: the larger, the logits, counts')
    elif s.backend in MEGATRON_BACKENDS:
        notes.append(f'the logits + loss ({logits / C.GiB:.2f} GiB) are freed by Megatron\'s loss backward before '
                     'the last layer is recomputed: the larger, its working set, counts')
    else:
        gpu[label] = logits
    # input embeddings (+ their grad when the inputs require grad) and the hidden state handed to the lm_head
    gpu['activations: embeddings / final hidden'] = 3 * C.BYTES_BF16 * h * local
    return gpu, host, notes


# ---------------------------------------------------------------------------------------------------------------
def estimate(spec: ModelSpec, tokens: VideoTokens, setup: TrainSetup) -> MemoryEstimate:
    """Predict per-GPU and per-node host memory for `setup` training `spec` on samples of `tokens`."""
    s = setup
    if s.backend not in BACKENDS:
        raise ValueError(f'unknown backend {s.backend!r}')
    ms_gpu, ms_host, comp_bytes, T, notes = _model_states(spec, s)
    act_gpu, act_host, act_notes = _activations(spec, s, tokens)
    notes += act_notes
    if s.fp8:
        # torch._scaled_mm takes its second operand column-major: the input gradient's product (grad @ W) makes a
        # transposed FP8 copy of the weight for the call (torchao's preprocess_addmm), one linear at a time
        largest = max((g.out_features * g.in_features for g in spec.groups if fp8_eligible(g)), default=0)
        act_gpu['FP8: transposed weight of one linear (backward, transient)'] = largest * C.BYTES_FP8
        notes.append('train.fp8=frozen_base: the decoder\'s frozen linears are held and multiplied in FP8 after the '
                     'model loads in bf16 (the load phase holds the bf16 weights)')

    ckpt = act_gpu.get('activations: layer checkpoints', 0.0)
    grads = ms_gpu.get('gradients (LoRA, fp32)', 0.0)
    if s.backend == Backend.UNSLOTH_SPLIT_LORA and ckpt and grads:
        # Backward walks the layers from the last: layer i's LoRA gradients appear as its checkpoint is freed, so
        # checkpoints + gradients peak at the larger of the two, not their sum (at micro-batch 1 the H200's backward
        # peak was 6.00 GiB with the checkpoints on the GPU and 6.00 with them offloaded; docs/memory-model.md)
        act_gpu['activations: layer checkpoints freed as the LoRA gradients fill (backward)'] = -min(ckpt, grads)
    gpu: Dict[str, float] = {}
    gpu.update(ms_gpu)
    gpu.update(act_gpu)
    ctx = C.CUDA_CONTEXT_GIB * C.GiB
    nccl = C.NCCL_BUFFERS_GIB * C.GiB if s.world > 1 else 0.0
    optim_keys = [k for k in ms_gpu if k.startswith('optimizer') or k.startswith('distributed optimizer')]
    optim = sum(ms_gpu[k] for k in optim_keys)
    act_total = sum(act_gpu.values())
    static = sum(v for k, v in ms_gpu.items() if k not in optim_keys)

    # dynamic = what is allocated and freed every step (fragments); static = allocated once
    dynamic_keys = [k for k in ms_gpu if (k.startswith('gradient') or k.startswith('DDP') or 'main grad' in k
                                          or k.startswith('ZeRO-3 gathered')) and k != MEGATRON_FULL_GRAD_BUFFER]
    dynamic = sum(ms_gpu[k] for k in dynamic_keys)
    weights = static - dynamic

    def total(w, o, g, a):
        """(total on the device, fragmentation, allocated) of one moment."""
        # expandable segments (every launch sets them, backends/common.py): checked by allocated and reserved
        # peaks for the compiled layers and the Unsloth path; the others keep the caching allocator's fraction,
        # which their rows were fitted and checked with
        expandable = s.compiled_layers or s.backend == Backend.UNSLOTH_SPLIT_LORA
        dynamic_frag = C.ALLOCATOR_FRAGMENTATION_EXPANDABLE if expandable else C.ALLOCATOR_FRAGMENTATION
        frag = (g + a) * dynamic_frag + (w + o) * C.ALLOCATOR_FRAGMENTATION_STATIC
        alloc = w + o + g + a
        return alloc + frag + ctx + nccl, frag, alloc

    # load: weights placed. first step: forward/backward before any optimizer state exists, then optimizer.step
    # allocates the states (+ temporaries). steady: the larger of forward/backward with the states alive and the
    # optimizer step. torch's foreach AdamW (no DeepSpeed / Unsloth) makes a temporary the size of one of its two
    # moment buffers; DeepSpeed's and Megatron's fused Adam update in place. The Unsloth runner's AdamW is fused now
    # too: its term stays, an upper bound where the step is the peak, until a measured row says what to drop.
    temp = C.ADAM_STEP_TEMP_FRACTION * optim if s.backend in (Backend.DDP, Backend.UNSLOTH_SPLIT_LORA) else 0.0
    load_w = sum(v for k, v in ms_gpu.items() if k.startswith('weights') or k.startswith('LoRA adapters'))
    moments = {
        'load': total(load_w + (fp8_saving(spec) if s.fp8 else 0.0), 0.0, 0.0, 0.0),
        'first_fwd_bwd': total(weights, 0.0, dynamic, act_total),
        'step': total(weights, optim + temp, dynamic, 0.0),
        'steady_fwd_bwd': total(weights, optim, dynamic, act_total),
    }
    first = max(moments['first_fwd_bwd'], moments['step'])
    steady = max(moments['steady_fwd_bwd'], moments['step'])
    if moments['step'][0] > moments['steady_fwd_bwd'][0]:  # the optimizer step is the peak: show that moment
        for k in act_gpu:
            gpu.pop(k, None)
        gpu['optimizer step temporaries (foreach AdamW)'] = temp
    frag = steady[1]

    gpu['CUDA context'] = ctx
    if nccl:
        gpu['NCCL buffers'] = nccl
    gpu['allocator fragmentation (reserved - allocated)'] = frag

    # host ---------------------------------------------------------------------------------------------------
    procs = s.gpus_per_node
    per_proc = C.MEGATRON_HOST_PER_PROCESS_GIB if s.backend in MEGATRON_BACKENDS else C.HOST_PER_PROCESS_GIB
    proc_key = f'training processes ({procs} x {per_proc:g} GiB)'
    steady_host: Dict[str, float] = {proc_key: procs * per_proc * C.GiB}
    workers = procs * s.dataloader_workers
    if workers:
        steady_host[f'dataloader workers ({workers} x {C.HOST_PER_WORKER_GIB:g} GiB)'] = (
            workers * C.HOST_PER_WORKER_GIB * C.GiB)
    steady_host.update(ms_host)
    steady_host.update(act_host)
    # load: each process streams safetensors shards (one at a time) into GPU memory or, with ZeRO-3 offload,
    # into the pinned host partitions.
    # a shard is at most the whole checkpoint: a 4.3 GB model is one file of 4.3 GB, not a 5 GB shard
    shard = min(C.SAFETENSORS_SHARD_GB * C.GB, spec.total_params * C.BYTES_BF16)
    load_host: Dict[str, float] = {proc_key: procs * per_proc * C.GiB,
                                   f'safetensors shard being loaded ({procs} x {shard / C.GB:.3g} GB, '
                                   f'transient)': procs * shard}
    for k in ('offloaded bf16 parameters (ZeRO-3)', ):
        if k in ms_host:
            load_host[k] = ms_host[k]
    load_host_total, steady_host_total = sum(load_host.values()), sum(steady_host.values())
    host = load_host if load_host_total > steady_host_total else steady_host

    def phase(m, host_bytes):
        return {'gpu': m[0], 'gpu_reserved': m[0] - ctx - nccl, 'gpu_allocated': m[2], 'host': host_bytes}

    phases = {
        'load': phase(moments['load'], load_host_total),
        'first_step': phase(first, steady_host_total),
        'steady': phase(steady, steady_host_total),
    }
    assumptions = [
        f'vision tower: {s.vision_mode}' if spec.vision is not None else 'no vision tower',
        ('gradient checkpointing off' if not s.gradient_checkpointing else
         'gradient checkpointing on' if s.checkpoint_layers != 0 else
         'gradient checkpointing on, of no decoder layer: each keeps its activations'),
        f'micro batch {s.micro_batch}, {tokens.total_tokens} tokens per sample',
    ] + ([f'dataset packing: each row holds up to {s.samples_per_row * tokens.total_tokens:.0f} tokens '
          f'({s.samples_per_row:.2f} samples), planned full'] if s.samples_per_row > 1 else []) + notes
    return MemoryEstimate(setup=s, gpu=gpu, host=host, phases=phases, trainable_params=T, tokens=tokens,
                          model_state_bytes=comp_bytes, assumptions=assumptions,
                          host_by_phase={'load': load_host, 'steady': steady_host})
