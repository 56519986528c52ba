"""How fast a plan trains: tokens/s and hours per epoch, from the model's FLOPs and an efficiency measured on an H200.

    tokens/s = GPUs x achievable bf16 rate x efficiency / (FLOPs per sample / tokens per sample) x scaling

FLOPs per sample are the useful model FLOPs the benchmarks count (benchmarks/throughput.py, moe_throughput.py):
frozen weights forward + input gradient (4 x active parameters x tokens; 6 x for the trained parameters of full and
selective tuning), LoRA 6 x the adapter parameters a token passes through (k of E experts' adapters), causal
attention of the full-attention layers (6 x layers x tokens^2 x heads x head_dim), the frozen vision tower's forward
on its patches, and the LM head on the supervised positions. Recompute (gradient checkpointing) is not useful work:
it is in the efficiency. Where a backend was measured only with every layer checkpointed, its efficiency without
checkpointing is derived, not assumed equal: the same time per FLOP run, less the decoder's forward that the recompute
repeats (`recompute_flops`) -- what `train.checkpoint_layers` buys, priced by the FLOPs it removes.

The efficiency is MFU over these FLOPs (divisor: 790 TFLOP/s bf16 matmul, measured on the H200) of a run of the
**same backend on the same kind of model** -- MoE or dense -- from the result files in benchmarks/results/
(`EFFICIENCY`). A MoE plan never takes a dense run's figure nor the other way round: where no run of its backend on
its kind of model exists, the estimate is "no measurement" and carries no number (`SpeedEstimate.measured` False).
The one stand-in is listed (`STAND_IN`): DeepSpeed ZeRO-2/3 on a dense model take swift sft's own dense runs without
DeepSpeed, and say so. A setting that did not run takes the nearest measured one of the same backend and kind, and
the estimate says so; a measurement's model family and depth (a depth cut of a deeper model) are part of what the
estimate says it rests on.

Other GPUs: the same efficiency at their spec-sheet dense bf16 rate x the fraction of it the H200 reached (790 of
989), an assumption. Several GPUs: data-parallel replicas (ddp, and Unsloth's split LoRA, one replica per GPU) are
scaled by the time their gradient all-reduce adds to a step (`data_parallel_scaling`: gradient bytes over the
interconnect's all-reduce bandwidth, not overlapped with the backward), an assumption until a multi-GPU run measures
it; DeepSpeed and Megatron are scaled linearly (an assumption the estimate states).
`benchmarks/speed_table.py` puts every estimate next to the measured tokens/s (tests/test_plan_speed.py: +-20 %).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Dict, List, Optional, Tuple

from .backend import Backend
from .model_spec import ModelSpec
from .video_budget import VideoTokens

H200_MEASURED_TFLOPS = 790.0  # bf16 matmul rate measured on the lent H200 (docs/benchmarks.md)
# Dense bf16 tensor TFLOP/s (with fp32 accumulate), spec sheets: NVIDIA's Ampere GA102 whitepaper (RTX 3090: 71;
# RTX 3060: scaled by SMs and clock, 28 of 82 at 1.78 of 1.70 GHz: 25.4), Ada whitepaper (RTX 4090: 165.2; L40S:
# 362), RTX Blackwell (RTX 5090: 209.5), A100 (312), H100 SXM and H200 (989).
SPEC_BF16_TFLOPS = {'RTX 3060': 25.4, 'RTX 3090': 71.0, 'RTX 4090': 165.2, 'RTX 5090': 209.5, 'L40S': 362.0,
                    'A100 40GB': 312.0, 'A100 80GB': 312.0, 'H100 80GB': 989.0, 'H200': 989.0}
ACHIEVABLE_FRACTION = H200_MEASURED_TFLOPS / SPEC_BF16_TFLOPS['H200']

# All-reduce bus bandwidth between the GPUs of one node, GiB/s (NCCL's busBW: an all-reduce of B bytes over N GPUs
# takes 2 (N - 1) / N x B / busBW). H200: measured on the lent 2 x H200 machine (NVLink), 270 GiB/s for a 256 MiB
# float32 all-reduce (benchmarks/results/multi-gpu-zero3-h200x2-2026-11-29.json, nccl_sanity); H100 SXM has the same
# NVLink 4 (assumed equal); A100 SXM's NVLink 3 has two thirds of its links' bandwidth (assumed 2/3); the PCIe cards
# without NVLink (RTX, L40S) assumed 10 GiB/s (PCIe 4.0 x16 through the host, no peer-to-peer on GeForce cards).
ALLREDUCE_BUS_GIB_S = {'H200': 270.0, 'H100 80GB': 270.0, 'A100 80GB': 180.0, 'A100 40GB': 180.0}
PCIE_ALLREDUCE_BUS_GIB_S = 10.0
# Between nodes: one 400 Gb/s NIC per GPU (DGX H100/H200 class), about 45 GiB/s of bus bandwidth (assumed)
INTER_NODE_ALLREDUCE_BUS_GIB_S = 45.0
GIB = 1024 ** 3


@dataclass(frozen=True)
class Measured:
    """One efficiency: MFU over the planner's FLOPs of one measured run, and what ran."""
    value: float
    kind: str  # 'moe' | 'dense': the kind of model that ran
    model: str  # what ran, in a user's words
    family: str  # its model_type
    layers: int  # decoder layers it ran with
    cut: bool  # a deeper model cut to `layers` (the vision tower, LM head and embeddings weigh more than at depth)
    setting: str  # the setting that ran, in a user's words
    runs: str  # where it was measured: result file (variant)
    tokens_per_s: float  # what that run measured (median steps), one GPU
    gpu: str = 'H200'  # the card it ran on (an H100's rate is priced as the H200's: 989 x 790 / 989 TFLOP/s)

    def describe(self, backend: str) -> str:
        depth = f'cut to {self.layers} layers' if self.cut else f'{self.layers} layers'
        return f'{BACKEND_NAMES.get(backend, backend)} on {self.model} ({depth}), {self.setting}, one {self.gpu}'


BACKEND_NAMES = {'ddp': 'swift sft (no DeepSpeed)', 'unsloth_split_lora': 'Unsloth split LoRA',
                 'megatron_ep_lora': 'Megatron-SWIFT LoRA', 'megatron_ep_full': 'Megatron-SWIFT full SFT',
                 'deepspeed_zero2': 'DeepSpeed ZeRO-2', 'deepspeed_zero3': 'DeepSpeed ZeRO-3'}
_R = 'benchmarks/results/'
_DENSE = dict(kind='dense', model='Qwen3-VL 2B', family='qwen3_vl', layers=28, cut=False)
_MOE = dict(kind='moe', model='the 35B-A3B MoE', family='qwen3_5_moe', layers=40, cut=False)
_MOE8 = dict(kind='moe', model='the 35B-A3B MoE', family='qwen3_5_moe', layers=8, cut=True)
# (backend, model kind, compiled layers, gradient checkpointing, micro-batch) -> measured efficiency on the H200. The
# values are the planner-FLOPs MFU of the named runs (benchmarks/speed_table.py recomputes them); in-sample for those
# runs. Every one is LoRA (r8 dense, r16 MoE) at 64 frames a clip: 6.5k tokens a sample dense, 7.8k MoE.
EFFICIENCY: Dict[Tuple[str, str, bool, bool, int], Measured] = {
    ('ddp', 'dense', True, True, 1): Measured(0.351, **_DENSE, setting='compiled layers, checkpointed, micro-batch 1',
                                              runs=_R + 'throughput-r16b-2026-12-02.json (vora_gc_compile)',
                                              tokens_per_s=24968.9),
    ('ddp', 'dense', True, False, 1): Measured(0.435, **_DENSE, setting='compiled layers, micro-batch 1',
                                               runs=_R + 'throughput-r14c-2026-12-01.json (vora_compile)',
                                               tokens_per_s=30968.3),
    ('ddp', 'dense', True, False, 4): Measured(0.543, **_DENSE, setting='compiled layers, micro-batch 4',
                                               runs=_R + 'throughput-r16-2026-12-02.json (vora_compile_mb4)',
                                               tokens_per_s=38630.2),
    ('ddp', 'dense', False, True, 1): Measured(0.181, **_DENSE, setting='checkpointed, micro-batch 1',
                                               runs=_R + 'throughput-2026-11-29.json (vora_gc)', tokens_per_s=12878.5),
    # plain swift sft on the MoE: PEFT LoRA on the fused experts (--target_parameters), side by side with the Unsloth
    # path (its 1.0-1.1k tokens/s in the other full-depth runs are out of sample)
    ('ddp', 'moe', False, True, 1): Measured(0.0205, **_MOE, setting='PEFT LoRA, checkpointed, micro-batch 1',
                                             runs=_R + 'moe-h200-full-m-2026-12-04.json (swift_peft)',
                                             tokens_per_s=1032.2),
    # mb 1 and 2: the runner before its forward ran under autocast (LoRA in fp32): under-estimates for today's runner
    ('unsloth_split_lora', 'moe', False, True, 1): Measured(0.116, **_MOE, setting='checkpointed, micro-batch 1',
                                                            runs=_R + 'moe-h200-full-2026-12-02.json (vora_unsloth)',
                                                            tokens_per_s=5852.2),
    ('unsloth_split_lora', 'moe', False, True, 2): Measured(0.174, **_MOE, setting='checkpointed, micro-batch 2',
                                                            runs=_R + 'moe-h200-full-2026-12-02.json '
                                                                      '(vora_unsloth_mb2)', tokens_per_s=8781.2),
    ('unsloth_split_lora', 'moe', False, True, 4): Measured(0.2264, **_MOE, setting='checkpointed, micro-batch 4',
                                                            runs=_R + 'moe-h200-full-f-2026-12-03.json '
                                                                      '(vora_unsloth_mb4)', tokens_per_s=11420.0),
    # Megatron-SWIFT's own runs (benchmarks/megatron_moe.py), EP 1 with every layer recomputed, on the 8-layer cut
    # only: at 40 layers the vision tower, the LM head and the embeddings weigh less, so these are expected to price a
    # full-depth run on the slow side. The same micro-batch-1 setting measured 4,483 / 3,606 / 2,622 tokens/s on three
    # machines: the fit takes the middle one
    ('megatron_ep_lora', 'moe', False, True, 1): Measured(
        0.0281, **_MOE8, setting='EP 1, full recompute, micro-batch 1',
        runs=_R + 'megatron-h200-moe-c-2026-12-03.json (mg_base)', tokens_per_s=3605.6),
    ('megatron_ep_lora', 'moe', False, True, 2): Measured(
        0.0364, **_MOE8, setting='EP 1, full recompute, micro-batch 2',
        runs=_R + 'megatron-h200-moe-g-2026-12-04.json (mg_mb2)', tokens_per_s=4669.6),
    # micro-batch 4 with the settings recipes/h200x8.yaml ships for Megatron (TE's cross entropy, the frozen experts
    # and the expert LoRA factors as grouped GEMMs, the precision-aware optimizer over coalesced buffer runs): one run,
    # on an H100, 0.65x the Unsloth path beside it. With fewer of them the same micro-batch ran 13,553 (without the
    # last two) and 20,100 tokens/s (without the coalesced optimizer, beside this run): this prices the recipe's
    ('megatron_ep_lora', 'moe', False, True, 4): Measured(
        0.1798, **_MOE8, gpu='H100',
        setting='EP 1, full recompute, micro-batch 4, TE cross entropy, the frozen experts and the expert LoRA as '
                'grouped GEMMs, precision-aware optimizer over coalesced runs',
        runs=_R + 'megatron-h100-moe-co-2026-12-07.json (mg_mb4_te_ce_gmm_pao_glora_co)', tokens_per_s=23070.5),
    # Megatron-SWIFT full SFT of the MoE: one run, on an H100, the 35B-A3B shape cut to 3 layers (every expert, the
    # vision tower), EP 1, full recompute, TE's cross entropy; MFU over flops_per_sample(tuner='full'). At full depth
    # the vision tower, embeddings and LM head weigh less: how that moves the efficiency is not measured yet (cut to 2
    # layers it ran 1.22x this estimate, out of sample). Faster per FLOP than Megatron's LoRA at micro-batch 2
    # (0.036): that profile's time went to per-expert LoRA launches full SFT has none of
    ('megatron_ep_full', 'moe', False, True, 1): Measured(
        0.1175, kind='moe', model='the 35B-A3B MoE', family='qwen3_5_moe', layers=3, cut=True,
        setting='EP 1, full recompute, micro-batch 1, TE cross entropy',
        runs=_R + 'megatron-h100-full-2026-12-06.json (mgf_te_ce)', tokens_per_s=18916.3, gpu='H100'),
}
# FP8 frozen base weights (train.fp8) against their bf16 twin -- same call, flags, seed and samples (compiled layers,
# checkpointed, micro-batch 1): a factor on the bf16 efficiency, in-sample for that one run. Below 1: at this size
# the FP8 casts of the activations and gradients cost more than the faster GEMMs save.
FP8_FROZEN_RATIO = Measured(0.816, **_DENSE, setting='FP8 frozen base against its bf16 twin: 2.9786 / 3.6517 '
                                                     'samples/s', runs=_R + 'throughput-fp8-b-2026-12-02.json '
                                                                            '(vora_gc_compile_fp8)', tokens_per_s=0.0)
# A backend no run measured on a kind of model, and the measured backend that stands in for it, with why. Only on
# the same kind of model; MoE has none: ZeRO-2 was never run here on a MoE, and the failures upstream reports for it
# (ms-swift#6473, DeepSpeed #7156) are of exactly that path.
STAND_IN = {
    ('deepspeed_zero3', 'dense'): ('ddp', 'ZeRO-3 was not benchmarked for speed: swift sft without DeepSpeed, '
                                          'uncompiled, stands in (ZeRO-3\'s gathers cost more on several GPUs)'),
    ('deepspeed_zero2', 'dense'): ('ddp', 'ZeRO-2 was not benchmarked for speed: swift sft without DeepSpeed, '
                                          'uncompiled, stands in'),
}


def active_matmul_params(spec: ModelSpec) -> float:
    """Weights one token multiplies in the language model (its k experts only), without the LM head."""
    return sum(g.active for g in spec.groups if g.tower == 'llm' and (g.linear or g.component == 'router')
               and g.component != 'lm_head')


def lora_active_params(spec: ModelSpec, rank: int, targets: str) -> float:
    """LoRA parameters one token passes through: every targeted linear, and k of E experts' adapters."""
    return sum(g.lora_params(rank) * g.active_fraction for g in spec.lora_groups(targets))


def flops_per_sample(spec: ModelSpec, tokens: VideoTokens, tuner: str = 'lora', lora_rank: int = 8,
                     lora_targets: str = 'all-linear') -> Dict[str, float]:
    T = float(tokens.total_tokens)
    n_active = active_matmul_params(spec)
    if tuner == 'lora':
        llm = 4 * n_active * T
        adapters = 6 * lora_active_params(spec, lora_rank, lora_targets) * T
    else:  # full / selective: the trained weights also get a weight gradient
        trained = n_active if tuner == 'full' else sum(g.active for g in spec.selective_groups() if g.linear)
        llm = 4 * n_active * T + 2 * trained * T
        adapters = 0.0
    d_attn = spec.num_heads * spec.head_dim
    parts = {'llm_matmul': llm, 'lora': adapters,
             'llm_attention': 6 * spec.num_full_attention_layers * T ** 2 * d_attn,
             'lm_head': (4 if tuner == 'lora' else 6) * spec.vocab_size * spec.hidden_size * tokens.supervised_tokens}
    v = spec.vision
    if v is not None and tokens.patches:
        vit = sum(g.total for g in spec.groups if g.tower == 'vision' and g.linear)
        groups = max(1, tokens.groups)
        parts['vision'] = (2 * vit * tokens.patches
                           + 4 * v.depth * groups * (tokens.patches / groups) ** 2 * v.hidden_size)
    parts['total'] = sum(parts.values())
    return parts


def recompute_flops(spec: ModelSpec, tokens: VideoTokens, tuner: str = 'lora', lora_rank: int = 8,
                    lora_targets: str = 'all-linear') -> float:
    """FLOPs gradient checkpointing adds per sample with every decoder layer checkpointed: the decoder's forward run
    again in backward -- its matmuls (2 x active parameters x tokens), the adapters' forward and causal attention's
    forward (a third of flops_per_sample's 6x). Not the vision tower's (frozen: outside the decoder's checkpoints) nor
    the LM head's (after the last layer)."""
    T = float(tokens.total_tokens)
    adapters = 2 * lora_active_params(spec, lora_rank, lora_targets) * T if tuner == 'lora' else 0.0
    return (2 * active_matmul_params(spec) * T + adapters
            + 2 * spec.num_full_attention_layers * T ** 2 * spec.num_heads * spec.head_dim)


def _checkpointed_setting(measured: Measured) -> bool:
    """Whether the runs behind this efficiency checkpointed every layer (its EFFICIENCY key)."""
    return any(m is measured and key[3] for key, m in EFFICIENCY.items())


@dataclass
class SpeedEstimate:
    """tokens/s and samples/s of a plan, or None for both where no run of its backend on its kind of model exists
    (`measured` False: the plan says "no measurement" and prints no number)."""
    tokens_per_s: Optional[float]
    samples_per_s: Optional[float]
    flops_per_sample: float
    efficiency: Optional[float]
    peak_tflops: float  # the achievable rate one GPU was planned at
    basis: str  # what the estimate rests on, in a user's words (the default text)
    source: str  # where every factor comes from: result files, derivations, assumptions (--explain, --json)
    measured: bool = True
    scaling: Optional[float] = None  # data-parallel scaling applied (several GPUs; None: one GPU or linear)

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


NO_MEASUREMENT = 'no measurement'

# Settings no run measured, priced by assumption (the plan says so): the optimizer step of DeepSpeed's CPU offload runs
# on the host, a 4-bit base is dequantized in every forward and backward.
ASSUMED_FACTORS = {'offload': (0.5, 'CPU offload assumed to halve it (not measured)'),
                   '4bit': (0.75, 'a 4-bit base assumed to cost a quarter (dequantizing; not measured)')}


def model_kind(spec: ModelSpec) -> str:
    return 'moe' if spec.is_moe else 'dense'


def measured_efficiency(backend: str, kind: str, compiled: bool, checkpointing: bool,
                        micro_batch: int) -> Tuple[Optional[Measured], str, str]:
    """(the measured efficiency for this setting on this kind of model or the nearest measured one of the same
    backend and kind -- None where there is none --, what was assumed or '', the backend whose run it is)."""
    notes = []
    measured_backend = backend
    if not any(k[0] == backend and k[1] == kind for k in EFFICIENCY) and (backend, kind) in STAND_IN:
        measured_backend, why = STAND_IN[(backend, kind)]
        notes.append(why)
        compiled = False if measured_backend == 'ddp' else compiled
    same = {k: m for k, m in EFFICIENCY.items() if k[0] == measured_backend and k[1] == kind}
    if not same:
        return None, '', measured_backend
    key = (measured_backend, kind, compiled, checkpointing, micro_batch)
    if key in same:
        return same[key], '; '.join(notes), measured_backend
    # nearest: the same compile and checkpointing if measured, else the same compile (a checkpointed run priced without
    # its recompute below), then the largest measured micro-batch not above this one; a compiled run never prices an
    # uncompiled setting where an uncompiled one ran
    pool = ({k: m for k, m in same.items() if k[2:4] == (compiled, checkpointing)}
            or {k: m for k, m in same.items() if k[2] == compiled}
            or {k: m for k, m in same.items() if k[3] == checkpointing} or same)
    below = [k for k in pool if k[4] <= micro_batch] or list(pool)
    nearest = max(below, key=lambda k: k[4])
    notes.append(f'not measured at this setting (compiled {compiled}, checkpointing {checkpointing}, micro-batch '
                 f'{micro_batch}): the nearest measured one (compiled {nearest[2]}, checkpointing {nearest[3]}, '
                 f'micro-batch {nearest[4]}) assumed')
    return pool[nearest], '; '.join(notes), measured_backend


def gpu_rate(gpu_name: str) -> Tuple[float, str]:
    """(achievable bf16 TFLOP/s of one GPU, where it comes from)."""
    from .hardware import gpu_class_of
    name = gpu_class_of(gpu_name or '')
    if name == 'H200':
        return H200_MEASURED_TFLOPS, 'H200: 790 TFLOP/s bf16 matmul, measured'
    if name in SPEC_BF16_TFLOPS:
        spec = SPEC_BF16_TFLOPS[name]
        return spec * ACHIEVABLE_FRACTION, (f'{name}: {spec:g} TFLOP/s bf16 (spec sheet) x {ACHIEVABLE_FRACTION:.2f}, '
                                            'the fraction of its spec the H200 reached (assumed)')
    return H200_MEASURED_TFLOPS, (f'{gpu_name or "an unknown GPU"}: {UNKNOWN_RATE} (the estimate is an upper '
                                  'bound)')


UNKNOWN_RATE = "no rate known, an H200's assumed"


def unknown_gpu_note(gpu_name: str) -> Optional[str]:
    """What a speed for a GPU of no known rate rests on, for the plan's words; None for a known GPU."""
    from .hardware import gpu_class_of
    name = gpu_class_of(gpu_name or '')
    if name == 'H200' or name in SPEC_BF16_TFLOPS:
        return None
    return (f'upper bound: no rate is known for {gpu_name or "this GPU"}, an H200\'s is assumed (known, by '
            '--hardware: ' + ', '.join(sorted({'H200', *SPEC_BF16_TFLOPS})) + ')')


def allreduce_bandwidth(gpu_name: str, nodes: int) -> Tuple[float, str]:
    """(all-reduce bus bandwidth in bytes/s, where it comes from) for GPUs of this class over this many nodes."""
    from .hardware import gpu_class_of
    name = gpu_class_of(gpu_name or '') or ''
    if name in ALLREDUCE_BUS_GIB_S:
        bus = ALLREDUCE_BUS_GIB_S[name]
        why = (f'{bus:g} GiB/s all-reduce bus bandwidth, measured on 2 x H200 (NVLink)' if name == 'H200' else
               f'{bus:g} GiB/s all-reduce bus bandwidth over NVLink (assumed from the H200\'s measured 270)')
    else:
        bus, why = PCIE_ALLREDUCE_BUS_GIB_S, f'{PCIE_ALLREDUCE_BUS_GIB_S:g} GiB/s over PCIe (assumed)'
    if nodes > 1 and INTER_NODE_ALLREDUCE_BUS_GIB_S < bus:
        bus, why = INTER_NODE_ALLREDUCE_BUS_GIB_S, (f'{INTER_NODE_ALLREDUCE_BUS_GIB_S:g} GiB/s between nodes '
                                                    '(one 400 Gb/s NIC per GPU, assumed)')
    return bus * GIB, why


# Data-parallel replicas all-reduce their gradients every step: what each trainable parameter's gradient weighs
# (PEFT LoRA adapters are fp32 -- constants.BYTES_LORA_PARAM_PEFT --; full / selective gradients bf16 without DeepSpeed)
GRADIENT_BYTES = {'lora': 4, 'full': 2, 'selective': 2}
DATA_PARALLEL_BACKENDS = ('ddp', 'unsloth_split_lora')


def data_parallel_scaling(trainable_params: float, tuner: str, micro_batch: int, samples_per_s_one: float,
                          world: int, gpu_name: str, nodes: int) -> Tuple[float, str]:
    """(scaling, why) of `world` data-parallel replicas against `world` x one GPU: each micro-batch computes
    micro_batch samples on every replica, then all-reduces the gradients (2 (N - 1) / N x their bytes over the bus
    bandwidth), not overlapped with the backward -- the cautious end (under gradient accumulation DDP all-reduces once
    per optimizer step, and overlaps its buckets with the backward), until a multi-GPU run measures it."""
    if world <= 1 or not samples_per_s_one:
        return 1.0, ''
    grad_bytes = trainable_params * GRADIENT_BYTES.get(tuner, 2)
    bandwidth, bw_source = allreduce_bandwidth(gpu_name, nodes)
    comm = 2 * (world - 1) / world * grad_bytes / bandwidth
    step = micro_batch / samples_per_s_one
    factor = step / (step + comm)
    return factor, (f'x{factor:.3f} for the gradient all-reduce of {world} data-parallel replicas (assumed, not '
                    f'measured on several GPUs): {grad_bytes / 1e9:.2f} GB of gradients in {1000 * comm:.0f} ms at '
                    f'{bw_source}, counted after every {step:.2f} s micro-batch and not overlapped (the cautious end)')


def estimate_speed(spec: ModelSpec, tokens: VideoTokens, backend: Backend, tuner: str, lora_rank: int,
                   lora_targets: str, compiled: bool, checkpointing: bool, micro_batch: int, gpus: int,
                   gpu_name: str, offload: str = 'none', quant: str = 'none', nodes: int = 1) -> SpeedEstimate:
    """`gpus`: every GPU of the run (all nodes); `nodes`: how many nodes they are on (the all-reduce's link)."""
    flops = flops_per_sample(spec, tokens, tuner, lora_rank, lora_targets)['total']
    kind = model_kind(spec)
    eff, assumed, measured_backend = measured_efficiency(str(backend), kind, compiled, checkpointing, micro_batch)
    rate, rate_source = gpu_rate(gpu_name)
    if eff is None:
        what = BACKEND_NAMES.get(str(backend), str(backend))
        basis = f'{NO_MEASUREMENT}: {what} never ran on a {"MoE" if kind == "moe" else "dense"} model here'
        return SpeedEstimate(tokens_per_s=None, samples_per_s=None, flops_per_sample=round(flops), efficiency=None,
                             peak_tflops=round(rate, 1), basis=basis, source=basis + ' (benchmarks/results/)',
                             measured=False)
    value, notes = eff.value, [assumed] if assumed else []
    if not checkpointing and _checkpointed_setting(eff):  # measured only checkpointed: no recompute here
        gain = (flops + recompute_flops(spec, tokens, tuner, lora_rank, lora_targets)) / flops
        value *= gain
        notes.append(f'without the recompute of the decoder\'s forward that run paid: x{gain:.3f} (derived from the '
                     f'FLOPs, not measured)')
    for setting in ('offload' if offload != 'none' else None, '4bit' if quant == '4bit' else None):
        if setting in ASSUMED_FACTORS:
            factor, why = ASSUMED_FACTORS[setting]
            value *= factor
            notes.append(why)
    one = rate * 1e12 * value / flops
    scaling, scale_note = 1.0, ''
    if gpus > 1 and str(backend) in DATA_PARALLEL_BACKENDS:
        trainable = spec.trainable_params(tuner, lora_rank, lora_targets)
        scaling, scale_note = data_parallel_scaling(trainable, tuner, micro_batch, one, gpus, gpu_name, nodes)
    elif gpus > 1:
        scale_note = f'{gpus} GPUs scaled linearly (assumed, not measured on several GPUs)'
    if tuner != 'lora':  # every run is LoRA: full training is never estimated faster than LoRA on the same GPUs
        lora_flops = flops_per_sample(spec, tokens, 'lora', lora_rank, lora_targets)['total']
        if flops < lora_flops:
            flops = lora_flops
            notes.append('capped at the LoRA estimate of the same setting (every measured run trained LoRA)')
            one = rate * 1e12 * value / flops
    samples_per_s = max(1, gpus) * one * scaling
    basis = 'measured: ' + eff.describe(measured_backend)
    if measured_backend != str(backend):
        basis = f'{basis}, standing in for {BACKEND_NAMES.get(str(backend), backend)}'
    if eff.family != spec.model_type:
        basis += f' (another family: {eff.family})'
    if gpus > 1:
        basis += (f'; x{gpus} replicas at an assumed {scaling:.2f} scaling' if str(backend) in DATA_PARALLEL_BACKENDS
                  else f'; x{gpus} GPUs assumed linear')
    unknown = unknown_gpu_note(gpu_name)
    if unknown:
        basis += f'; {unknown}'
    source = (f'efficiency {value:.4g} (MFU over the planner\'s FLOPs at 790 TFLOP/s) from {eff.runs}'
              + (f' ({"; ".join(notes)})' if notes else '') + f'; {rate_source}'
              + (f'; {scale_note}' if scale_note else ''))
    return SpeedEstimate(tokens_per_s=round(samples_per_s * tokens.total_tokens, 1),
                         samples_per_s=round(samples_per_s, 4), flops_per_sample=round(flops),
                         efficiency=round(value, 4), peak_tflops=round(rate, 1), basis=basis, source=source,
                         scaling=round(scaling, 4) if gpus > 1 and str(backend) in DATA_PARALLEL_BACKENDS else None)


def for_setup(spec: ModelSpec, tokens: VideoTokens, setup, gpu_name: str) -> SpeedEstimate:
    """estimate_speed for a memory model's TrainSetup (plan/memory.py)."""
    def at(checkpointing: bool) -> SpeedEstimate:
        return estimate_speed(spec, tokens, setup.backend, setup.tuner, setup.lora_rank, setup.lora_targets,
                              setup.compiled_layers, checkpointing, setup.micro_batch, setup.world, gpu_name,
                              setup.offload, setup.quant, nodes=setup.nodes)

    pace = at(setup.gradient_checkpointing)
    if not pace.measured:
        return pace
    layers = spec.num_layers
    k = getattr(setup, 'checkpoint_layers', None)
    if setup.gradient_checkpointing and k is not None and k < layers and pace.samples_per_s:
        # train.checkpoint_layers: the recompute is paid by K of L layers -- the time per sample between the
        # checkpointed and the uncheckpointed estimates, in proportion
        free = at(False)
        share = max(0, k) / layers
        seconds = share / pace.samples_per_s + (1 - share) / free.samples_per_s
        scale = (1 / seconds) / pace.samples_per_s
        pace = replace(pace, tokens_per_s=round(pace.tokens_per_s * scale, 1), samples_per_s=round(1 / seconds, 4),
                       efficiency=round(pace.efficiency * scale, 4),
                       source=pace.source + f'; {k} of {layers} layers checkpointed: the time per sample between the '
                                            f'checkpointed and uncheckpointed estimates ({free.source}) in proportion')
    if getattr(setup, 'fp8', False) and model_kind(spec) != FP8_FROZEN_RATIO.kind:  # the ratio is a dense run's
        basis = f'{NO_MEASUREMENT}: FP8 frozen base weights never ran on a MoE model here'
        return replace(pace, tokens_per_s=None, samples_per_s=None, efficiency=None, basis=basis,
                       source=basis + f' (the one FP8 measurement is a dense model\'s: {FP8_FROZEN_RATIO.runs})',
                       measured=False, scaling=None)
    if getattr(setup, 'fp8', False):
        r = FP8_FROZEN_RATIO
        pace = replace(pace, tokens_per_s=round(pace.tokens_per_s * r.value, 1),
                       samples_per_s=round(pace.samples_per_s * r.value, 4),
                       efficiency=round(pace.efficiency * r.value, 4),
                       basis=pace.basis + f'; FP8 frozen base x{r.value:g} of bf16 (measured)',
                       source=pace.source + f'; FP8 frozen base x{r.value:g} of bf16 ({r.runs}: {r.setting})')
    return pace


def describe(estimate: SpeedEstimate, samples: Optional[int]) -> str:
    """The plan's speed sentence: tokens/s and hours with what they rest on, or plainly that no run measured it."""
    if not estimate.measured:
        return f'Speed: {estimate.basis}; no estimate is given.'
    hours = hours_per_epoch(samples, estimate)
    epoch = (f', {format_hours(hours)} per epoch of {samples:,} samples' if hours is not None else
             ' (hours: `plan --samples N`, or `train` counts the dataset\'s windows)')
    return f'Estimated {estimate.tokens_per_s:,.0f} tokens/s{epoch}; {estimate.basis}.'


def format_hours(hours: Optional[float]) -> str:
    if hours is None:
        return '-'
    return f'{hours:.2f} h' if hours < 100 else f'{hours:,.0f} h'


def hours_per_epoch(samples: Optional[int], estimate: SpeedEstimate) -> Optional[float]:
    if not samples or not estimate.samples_per_s:
        return None
    return round(samples / estimate.samples_per_s / 3600, 3)


def measurements(kind: Optional[str] = None) -> List[Tuple[Tuple[str, str, bool, bool, int], Measured]]:
    """The measured efficiencies (of one kind of model, or all), for the docs and the recipe headers."""
    return [(k, m) for k, m in EFFICIENCY.items() if kind is None or k[1] == kind]
