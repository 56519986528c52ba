"""How fast a plan trains: tokens/s and hours per epoch, from the model's FLOPs and an efficiency measured on an H200.

    tokens/s = GPUs x achievable bf16 rate x efficiency / (FLOPs per sample / tokens per sample)

FLOPs per sample are the useful model FLOPs the benchmarks count (benchmarks/throughput.py, moe_throughput.py):
frozen weights forward + input gradient (4 x active parameters x tokens; 6 x for the trained parameters of full and
selective tuning), LoRA 6 x the adapter parameters a token passes through (k of E experts' adapters), causal
attention of the full-attention layers (6 x layers x tokens^2 x heads x head_dim), the frozen vision tower's forward
on its patches, and the LM head on the supervised positions. Recompute (gradient checkpointing) is not useful work:
it is in the efficiency. Where a backend was measured only with every layer checkpointed, its efficiency without
checkpointing is derived, not assumed equal: the same time per FLOP run, less the decoder's forward that the recompute
repeats (`recompute_flops`) -- what `train.checkpoint_layers` buys, priced by the FLOPs it removes.

The efficiency is MFU over these FLOPs, measured on the lent H200 (790 TFLOP/s bf16 matmul, measured there) for each
backend and setting that ran there, from the result files in benchmarks/results/ (`EFFICIENCY`); a setting that did not
run there takes the nearest measured one, and the plan says so. Other GPUs: the same efficiency at their spec-sheet
dense bf16 rate x the fraction of it the H200 reached (790 of 989), an assumption the plan states. Several GPUs:
data-parallel scaling assumed linear (not measured beyond 2 GPUs).
`benchmarks/speed_table.py` puts every estimate next to the measured tokens/s (tests/test_plan_speed.py: +-20 %).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Dict, Optional, Tuple

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


@dataclass(frozen=True)
class Measured:
    """One efficiency: MFU over the planner's FLOPs, and the runs it comes from."""
    value: float
    source: str


# (backend, compiled layers, gradient checkpointing, micro-batch) -> measured efficiency on the H200. The values are
# the planner-FLOPs MFU of the named runs (benchmarks/speed_table.py recomputes them); in-sample for those runs.
_DENSE = 'Qwen3-VL 2B shape, 64 frames, 6.5k tokens'
_MOE = 'Qwen3.5-MoE 35B-A3B, 40 layers, 64 frames, 7.8k tokens'
_MOE8 = 'Qwen3.5-MoE 35B-A3B cut to 8 layers, EP 1 on one H200, full recompute, 64 frames, 7.8k tokens'
EFFICIENCY: Dict[Tuple[str, bool, bool, int], Measured] = {
    ('ddp', True, True, 1): Measured(0.351, f'throughput run 16b vora_gc_compile ({_DENSE})'),
    ('ddp', True, False, 1): Measured(0.435, f'throughput run 14c vora_compile ({_DENSE})'),
    ('ddp', True, False, 4): Measured(0.543, f'throughput run 16 vora_compile_mb4 ({_DENSE})'),
    ('ddp', False, True, 1): Measured(0.181, f'throughput run 1 vora_gc, no compiled layers ({_DENSE})'),
    # mb 1 and 2: the runner before its forward ran under autocast (LoRA in fp32); mb 4 under autocast with 4 encode
    # threads and the batched vision attention (call f; call e, one thread: 0.211; its fp32-LoRA twin 1.16x slower):
    # the two lower ones are under-estimates now
    ('unsloth_split_lora', False, True, 1): Measured(0.116, f'moe full depth vora_unsloth, fp32 LoRA ({_MOE})'),
    ('unsloth_split_lora', False, True, 2): Measured(0.174, f'moe full depth vora_unsloth_mb2, fp32 LoRA ({_MOE})'),
    ('unsloth_split_lora', False, True, 4): Measured(0.2264, f'moe full depth call f vora_unsloth_mb4 ({_MOE})'),
    # Megatron-SWIFT's own runs (benchmarks/megatron_moe.py), on the 8-layer cut only: at 40 layers the vision tower,
    # the LM head and the embeddings weigh less, so these are expected to price a full-depth run on the slow side.
    # The same micro-batch-1 setting measured 4,483 / 3,606 / 2,622 tokens/s in calls b, c and g (machine to
    # machine): the fit takes call c's, the middle one
    ('megatron_ep_lora', False, True, 1): Measured(0.0281, f'megatron_moe call c mg_base ({_MOE8})'),
    ('megatron_ep_lora', False, True, 2): Measured(0.0364, f'megatron_moe call g mg_mb2 ({_MOE8})'),
}
# FP8 frozen base weights (train.fp8) against their bf16 twin -- same call, flags, seed and samples (compiled layers,
# checkpointed, micro-batch 1): a factor on the bf16 efficiency, in-sample for that one run. Below 1: at this size
# the FP8 casts of the activations and gradients cost more than the faster GEMMs save.
FP8_FROZEN_RATIO = Measured(0.816, f'throughput run fp8-b: vora_gc_compile_fp8 2.9786 / its bf16 twin 3.6517 '
                                   f'samples/s ({_DENSE}, one H200 run)')
# Backends that never ran a speed benchmark here: the measured setting they are closest to, and why.
NEAREST = {
    'deepspeed_zero3': ('ddp', 'ZeRO-3 on the swift sft path was not benchmarked for speed: ddp without compiled '
                               'layers assumed (its gathers cost more on several GPUs)'),
    'deepspeed_zero2': ('ddp', 'ZeRO-2 was not benchmarked for speed: ddp without compiled layers assumed'),
    'megatron_ep_full': ('megatron_ep_lora', 'Megatron full SFT was not benchmarked for speed yet: Megatron LoRA\'s '
                                             'efficiency assumed (over the full-SFT FLOPs)'),
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
    return any(m is measured and key[2] for key, m in EFFICIENCY.items())


@dataclass
class SpeedEstimate:
    tokens_per_s: float
    samples_per_s: float
    flops_per_sample: float
    efficiency: float
    peak_tflops: float  # the achievable rate one GPU was planned at
    source: str  # where the efficiency and the rate come from

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


# Settings no run measured, priced by assumption (the plan says so): the optimizer step of DeepSpeed's CPU offload runs
# on the host, a 4-bit base is dequantized in every forward and backward.
ASSUMED_FACTORS = {'offload': (0.5, 'CPU offload assumed to halve it (not measured)'),
                   '4bit': (0.75, 'a 4-bit base assumed to cost a quarter (dequantizing; not measured)')}


def measured_efficiency(backend: str, compiled: bool, checkpointing: bool, micro_batch: int) -> Tuple[Measured, str]:
    """The measured efficiency for this setting, or the nearest measured one; and what was assumed (or '')."""
    notes = []
    if backend in NEAREST and not any(k[0] == backend for k in EFFICIENCY):  # until a run of its own is recorded
        backend, why = NEAREST[backend]
        notes.append(why)
        compiled = False if backend == 'ddp' else compiled
    same = {k: m for k, m in EFFICIENCY.items() if k[0] == backend}
    key = (backend, compiled, checkpointing, micro_batch)
    if key in same:
        return same[key], '; '.join(notes)
    # nearest: same compile and checkpointing if measured, then the largest measured micro-batch not above this one
    pool = ({k: m for k, m in same.items() if k[1:3] == (compiled, checkpointing)}
            or {k: m for k, m in same.items() if k[2] == checkpointing} or same)
    below = [k for k in pool if k[3] <= micro_batch] or list(pool)
    nearest = max(below, key=lambda k: k[3])
    notes.append(f'not measured at this setting (compiled {compiled}, checkpointing {checkpointing}, micro-batch '
                 f'{micro_batch}): the nearest measured one (compiled {nearest[1]}, checkpointing {nearest[2]}, '
                 f'micro-batch {nearest[3]}) assumed')
    return pool[nearest], '; '.join(notes)


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
    return H200_MEASURED_TFLOPS, (f'{gpu_name or "an unknown GPU"}: no rate known, an H200\'s assumed (the '
                                  'estimate is an upper bound)')


def estimate_speed(spec: ModelSpec, tokens: VideoTokens, backend: Backend, tuner: str, lora_rank: int,
                   lora_targets: str, compiled: bool, checkpointing: bool, micro_batch: int, gpus: int,
                   gpu_name: str, offload: str = 'none', quant: str = 'none') -> SpeedEstimate:
    flops = flops_per_sample(spec, tokens, tuner, lora_rank, lora_targets)['total']
    eff, assumed = measured_efficiency(str(backend), compiled, checkpointing, micro_batch)
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
    rate, rate_source = gpu_rate(gpu_name)
    samples_per_s = max(1, gpus) * rate * 1e12 * value / flops
    source = (f'efficiency {value:.3f} from {eff.source}' + (f' ({"; ".join(notes)})' if notes else '')
              + f'; {rate_source}' + ('; data-parallel scaling over the GPUs assumed linear' if gpus > 1 else ''))
    return SpeedEstimate(tokens_per_s=round(samples_per_s * tokens.total_tokens, 1),
                         samples_per_s=round(samples_per_s, 4), flops_per_sample=round(flops),
                         efficiency=round(value, 4), peak_tflops=round(rate, 1), source=source)


def for_setup(spec: ModelSpec, tokens: VideoTokens, setup, gpu_name: str) -> SpeedEstimate:
    """estimate_speed for a memory model's TrainSetup (plan/memory.py)."""
    def at(checkpointing: bool) -> SpeedEstimate:
        return estimate_speed(spec, tokens, setup.backend, setup.tuner, setup.lora_rank, setup.lora_targets,
                              setup.compiled_layers, checkpointing, setup.micro_batch, setup.world, gpu_name,
                              setup.offload, setup.quant)

    pace = at(setup.gradient_checkpointing)
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
    if getattr(setup, 'fp8', False):
        r = FP8_FROZEN_RATIO
        pace = replace(pace, tokens_per_s=round(pace.tokens_per_s * r.value, 1),
                       samples_per_s=round(pace.samples_per_s * r.value, 4),
                       efficiency=round(pace.efficiency * r.value, 4),
                       source=pace.source + f'; FP8 frozen base x{r.value:g} of bf16 ({r.source})')
    return pace


def describe(estimate: SpeedEstimate, samples: Optional[int]) -> str:
    hours = hours_per_epoch(samples, estimate)
    epoch = (f', {hours:.2f} h per epoch of {samples:,} windowed samples' if hours is not None else
             ' (hours per epoch: give the dataset -- `train` counts its windows; `plan --samples N`)')
    return (f'Estimated speed: {estimate.tokens_per_s:,.0f} tokens/s ({estimate.samples_per_s:.3f} samples/s){epoch}; '
            f'{estimate.source}.')


def hours_per_epoch(samples: Optional[int], estimate: SpeedEstimate) -> Optional[float]:
    if not samples or not estimate.samples_per_s:
        return None
    return round(samples / estimate.samples_per_s / 3600, 3)
