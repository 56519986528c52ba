"""Which backend trains this model on this hardware, whether it fits, and why — with numbers.

The rules (which backends, what is refused) are rules.py; the search for the fastest setting that fits, search.py;
the request and the plan, request.py; whether an estimate fits, fit.py; what fits instead, alternatives.py. This
module decides one plan and writes its reasons: short, about the user's run (what fits, what limits it, the first
knob); where each number comes from goes to `explain` (`plan --explain`, the JSON).
Does not fit (verdict "does_not_fit", exit 3): the numbers, the component that is too big, and the cheapest
alternative that fits (same hardware first: offload / another backend / selective / LoRA, then more GPUs).

`make_plan(PlanRequest) -> Plan` is the API; `swift-vora plan` and `swift-vora train` call it.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Dict, List, Optional, Tuple

from ..budget import FRAME_FACTOR
from . import backend_ratio, search, speed
from . import constants as C
from .alternatives import describe_alternative, find_alternatives
from .backend import AUTO, Backend
from .fit import (
    PARTIAL_CHECKPOINT_BACKENDS,
    checkpoint_layers_sentence,
    checkpoint_sentence,
    checkpoints_of,
    estimate_for,
    fits,
    gb_and_gib,
    gib,
    param_count,
    plan_estimate,
    train_setup,
)
from .hardware import Hardware
from .hardware import resolve as resolve_hardware
from .memory import DEEPSPEED_BACKENDS, MEGATRON_BACKENDS, MemoryEstimate, fp8_saving
from .model_source import load_model_spec
from .model_spec import ModelSpec
from .request import SEARCHABLE, Plan, PlanRequest
from .rules import REFUSAL_RULES, auto_candidates, check_refusal, choose_ep
from .video_budget import VideoTokens, text_only_tokens, video_tokens

# How the plan names a searched setting to the user
SETTING_WORDS = {'micro_batch': 'micro-batch', 'checkpoint_layers': 'checkpointed layers', 'offload': 'CPU offload',
                 'video_budget': 'video budget'}
ZERO2_MOE_WARNING = (
    'Warning: DeepSpeed ZeRO-2 trains a MoE model here only because it was asked for by name. ZeRO-2 leaves the '
    'experts\' optimizer states unpartitioned (DeepSpeed #7156), and full SFT of Qwen3-30B-A3B under ZeRO-2 with CPU '
    'offload on 8 x H200 died at 1.7 TiB of host RAM (ms-swift#6473); no run measured its speed here. For a MoE, '
    'megatron_ep_full (full SFT) and megatron_ep_lora / unsloth_split_lora (LoRA) split the experts instead.')


class SampleCapError(ValueError):
    """A max_length (or pack length) no sample of the video budget fits, at any frame count: a usage error."""


def resolve_tokens(req: PlanRequest, spec: ModelSpec) -> Tuple[VideoTokens, List[str]]:
    notes = []
    if req.seq_len:
        notes.append(f'sample of {req.seq_len} tokens (--seq-len): counted as text, no vision-tower activations')
        return text_only_tokens(req.seq_len, req.supervised_tokens), notes
    v = spec.vision
    kw = {}
    if v is not None:
        kw = dict(patch_size=v.patch_size, merge_size=v.spatial_merge_size, temporal_patch_size=v.temporal_patch_size)
    # min_frames too: the template samples at least that many (`--min-frames 200` on a 60 s clip at 2 fps is 200)
    tok = video_tokens(req.clip_seconds, req.fps, req.max_frames, req.frame_tokens, text_tokens=req.text_tokens,
                       supervised_tokens=req.supervised_tokens, min_frames=req.min_frames, **kw)
    cap = req.max_length or req.pack_length  # a packed row holds whole samples, each cut to it as well
    if v is not None and cap and tok.total_tokens > cap:
        full = tok
        frames = tok.frames
        while tok.total_tokens > cap and frames > FRAME_FACTOR:  # the template's loop: a frame pair at a time
            frames -= FRAME_FACTOR
            tok = video_tokens(req.clip_seconds, req.fps, frames, req.frame_tokens, text_tokens=req.text_tokens,
                               supervised_tokens=req.supervised_tokens, min_frames=min(req.min_frames, frames), **kw)
        if tok.total_tokens > cap:
            raise SampleCapError(
                f'max_length {cap} holds no sample: even {tok.frames} frames make {tok.total_tokens} tokens, and the '
                'template rejects a sample it cannot cut to fit; raise max_length (--pack-length, recipe '
                'data.max_length) or lower the tokens a frame pair')
        notes.append(f'max_length {cap}: a {full.total_tokens}-token sample ({full.frames} frames) loses frames '
                     f'until it fits, as the template cuts it: {tok.frames} frames, {tok.total_tokens} tokens')
    if v is None:
        notes.append(f'{spec.model_type} has no vision tower: the {tok.total_tokens}-token video budget is counted '
                     f'as text')
        return text_only_tokens(tok.total_tokens, req.supervised_tokens), notes
    notes.append(f'video budget: {req.clip_seconds:g} s at {req.fps:g} fps, max {req.max_frames} frames -> '
                 f'{tok.frames} frames, {tok.groups} frame pairs x {tok.tokens_per_group} tokens = '
                 f'{tok.vision_tokens} vision tokens + {tok.timestamp_tokens} timestamp + {tok.text_tokens} text '
                 f'= {tok.total_tokens} tokens per sample')
    return tok, notes


# The breakdown's model-state items (weights, trainable states, their buffers), by the start of their names
MODEL_STATE_ITEMS = ('weights', 'LoRA adapters', 'gradient', 'optimizer states', 'distributed optimizer', 'DDP ',
                     'ZeRO-3 gathered', 'fp32 main')


def _model_state_sentence(spec: ModelSpec, est: MemoryEstimate, backend: Backend, world: int) -> str:
    """The model states per GPU, item by item, with the breakdown's own names and numbers."""
    items = {k: v for k, v in est.gpu_gib().items() if k.startswith(MODEL_STATE_ITEMS)}
    return (f'{est.setup.tuner} training of {spec.model_type} ({param_count(spec.total_params)} parameters, '
            f'{param_count(est.trainable_params)} trainable) with {backend} on {world} '
            f'GPU{"s" if world > 1 else ""}: {sum(items.values()):.2f} GiB of model states per GPU ('
            + ' + '.join(f'{k} {v:.2f}' for k, v in sorted(items.items(), key=lambda kv: -kv[1])) + ').')


def _too_big(spec: ModelSpec, est: MemoryEstimate) -> str:
    """What limits the plan: every breakdown item at least half the largest (up to three), as the breakdown says."""
    items = sorted(((v, k) for k, v in est.gpu_gib().items() if v > 0), reverse=True)
    top = [(v, k) for v, k in items if v >= 0.5 * items[0][0]][:3]
    s = 'Too big on the GPU: ' + ', '.join(f'{k} {v:.2f} GiB' for v, k in top)
    comp = sorted(((b, c) for c, b in est.model_state_bytes.items() if b > 0), reverse=True)
    if comp and any(k.startswith(MODEL_STATE_ITEMS) for _, k in top):
        b, c = comp[0]
        share = b / max(1.0, sum(x for x, _ in comp))
        s += (f'; of the model states, {c.replace("_", " ")} hold{"" if c.endswith("s") else "s"} {gib(b)} '
              f'({share:.0%}) on each GPU')
    return s + '.'


def _config_source(spec: ModelSpec, model: str) -> Dict[str, Any]:
    if spec.source is not None:
        return spec.source.to_dict()
    return {'kind': 'given', 'path': '', 'requested': model, 'model_id': '', 'local_model': True,
            'description': 'a config dict given in code'}


def memory_to_spare(spec: ModelSpec, tokens: VideoTokens, req: PlanRequest, hw: Hardware,
                    backend: Backend) -> Optional[str]:
    """A sentence when a checkpointed, compiled ddp plan leaves so much GPU memory that training without
    checkpointing (at this micro-batch, or 4) fits too: the recompute is what such a step spends its time on."""
    if not (backend == Backend.DDP and req.compile == 'layers' and req.gradient_checkpointing) or spec.is_moe:
        return None  # the speed-ups it quotes were measured on a dense model
    cap = hw.gpu_mem_gib * C.GiB * C.TIGHT_FRACTION
    options = []
    for mb in sorted({req.micro_batch, max(req.micro_batch, 4)}):
        r = replace(req, gradient_checkpointing=False, micro_batch=mb)
        est = plan_estimate(spec, tokens, train_setup(r, hw, backend, 1, 1, tokens))
        if est.gpu_peak <= cap and fits(est, hw)[1]:
            options.append((mb, est.gpu_peak))
    if not options:
        return None
    said = '; '.join(f'micro-batch {mb}: {gib(peak)}' + (f' ({C.SPEEDUP_WITHOUT_CHECKPOINTING[mb]}x the samples/s '
                                                              'of checkpointed micro-batch 1, measured for a 2B '
                                                              'model at 6.5k tokens on an H200)'
                                                              if mb in C.SPEEDUP_WITHOUT_CHECKPOINTING else '')
                     for mb, peak in options)
    return (f'Memory to spare: without gradient checkpointing (train.gradient_checkpointing=false, '
            f'--no-gradient-checkpointing) the plan still fits -- {said}. A larger micro-batch changes the samples '
            f'per optimizer step unless train.grad_accum is lowered to match.')


def fp8_offer(spec: ModelSpec, tokens: VideoTokens, req: PlanRequest, hw: Hardware, backend: Backend,
              est: MemoryEstimate) -> Optional[Tuple[str, str]]:
    """(a short sentence, its detail) offering FP8 frozen base weights where this GPU has FP8 tensor cores and the
    ddp + FP8 plan fits (dense LoRA on a bf16 base); None elsewhere."""
    if req.fp8 != 'off' or req.tuner != 'lora' or req.quant != 'none' or spec.is_moe or hw.fp8 is not True:
        return None
    r = replace(req, fp8='frozen_base', backend=Backend.DDP)
    if check_refusal(spec, hw.world, r, Backend.DDP, 1, 1, hw):
        return None
    fp8_est, _ = estimate_for(spec, tokens, r, hw, Backend.DDP, 1, 1)
    if not all(fits(fp8_est, hw)):
        return None
    saved = fp8_saving(spec)
    short = (f'Less memory: train.fp8=frozen_base (--fp8 frozen_base, on ddp) peaks at {gib(fp8_est.gpu_peak)} '
             f'against {gib(est.gpu_peak)}, at {speed.FP8_FROZEN_RATIO.value:.2f}x the speed (measured).')
    detail = (f'{hw.gpu_name} has FP8 tensor cores: train.fp8: frozen_base holds the decoder\'s frozen linears in FP8 '
              f'({gib(saved)} less than bf16) and multiplies them in FP8; measured at '
              f'{speed.FP8_FROZEN_RATIO.value:.2f}x of bf16\'s samples/s on an H200 (2B; its losses within 2 % of '
              f'bf16\'s over 14 steps; {speed.FP8_FROZEN_RATIO.runs}), held-out learning not checked yet '
              '(docs/benchmarks.md).')
    return short, detail


def _ep(req: PlanRequest, spec: ModelSpec, world: int, backend: Backend) -> int:
    if req.ep is not None:
        return req.ep
    return choose_ep(spec, world) if backend in MEGATRON_BACKENDS else 1


def _backends(req: PlanRequest, spec: ModelSpec, world: int) -> List[Tuple[Backend, str]]:
    """(backend, why) to plan: the request's, or auto's candidates (the rules' default first)."""
    if req.backend == AUTO:
        candidates = auto_candidates(spec, world, req.tuner, req.fp8)
        if req.ep not in (None, 1) or req.tp not in (None, 1):  # --ep/--tp are Megatron's: only it is meant
            candidates = [c for c in candidates if c[0] in MEGATRON_BACKENDS] or candidates
        if spec.is_moe and req.fp8 != 'off':  # FP8 frozen weights ran on a dense model only: the default says why not
            candidates = candidates[:1]
        return candidates
    return [(Backend(req.backend), 'as requested')]


def _levels(req: PlanRequest, spec: ModelSpec) -> List[Tuple[Tuple[int, int], VideoTokens]]:
    out = []
    for frames, pair in search.budget_levels(req, spec):
        tokens, _ = resolve_tokens(replace(req, max_frames=frames, frame_tokens=pair), spec)
        out.append(((frames, pair), tokens))
    return out


def make_plan(request: PlanRequest, spec: Optional[ModelSpec] = None, hardware: Optional[Hardware] = None,
              search_alternatives: bool = True) -> Plan:
    """Decide backend, settings and verdict for `request`. Reads config.json only (unless `spec` is given).

    The plan says what to run, not how: its `command` (and each alternative's) is left empty here and filled from
    the launch the backend builds for it (swift_vora/cli/compose.py)."""
    req = request
    req.validate()
    spec = spec or load_model_spec(req.model)
    hw = _hardware(req, hardware)
    world = hw.world
    tokens, token_notes = resolve_tokens(req, spec)
    tp = req.tp or 1
    base = dict(num_gpus=hw.num_gpus, nodes=hw.nodes, tuner=req.tuner, offload=req.offload, quant=req.quant,
                fp8=req.fp8, tp=tp, micro_batch=req.micro_batch, lora_rank=req.lora_rank,
                lora_targets=req.lora_targets, model=spec.summary(), hardware=hw.to_dict(),
                gpu_capacity_gib=hw.gpu_mem_gib, host_limit_gib=hw.host_ram_gib,
                host_limit_source=hw.host_ram_source, config_source=_config_source(spec, req.model), spec=spec)

    candidates = _backends(req, spec, world)
    if not candidates:
        rule = 'moe-full-auto'
        alt = ('--backend deepspeed_zero2 by name (read its warning first), or --tuner lora with '
               'unsloth_split_lora')
        reason = (f'full SFT of {spec.model_type} (MoE) needs Megatron\'s expert parallelism, and mcore-bridge does '
                  f'not support {spec.model_type}')
        return Plan(backend=Backend.MEGATRON_EP_FULL, verdict='refused', gpu_peak_gib=None, host_peak_gib=None,
                    reasons=[f'Refused by rule {rule} ({REFUSAL_RULES[rule]}): {reason}.', f'Alternative: {alt}.'],
                    breakdown={}, command=[], rule=rule, alternative={'suggestion': alt}, ep=1,
                    tokens=tokens.to_dict(), **base)
    usable, refusal = [], None
    for backend, why in candidates:
        ep = _ep(req, spec, world, backend)
        refused = check_refusal(spec, world, req, backend, ep, tp, hw)
        if refused:
            refusal = refusal or (backend, ep, refused)
        else:
            usable.append((backend, why, ep))
    if not usable:
        backend, ep, (rule, reason, alt) = refusal
        reasons = [f'Refused by rule {rule} ({REFUSAL_RULES[rule]}): {reason}.', f'Alternative: {alt}.']
        return Plan(backend=backend, verdict='refused', gpu_peak_gib=None, host_peak_gib=None, reasons=reasons,
                    breakdown={}, command=[], rule=rule, alternative={'suggestion': alt}, ep=ep,
                    tokens=tokens.to_dict(), **base)
    if world < 1:
        backend, why, ep = usable[0]
        reasons = [_backend_sentence(req, backend, why, 1), f'No GPU on {hw.name} '
                   f'({"; ".join(hw.notes) or "0 GPUs"}): pass --hardware NAME or --gpus N --gpu-mem-gib G.']
        return Plan(backend=backend, verdict='does_not_fit', gpu_peak_gib=None, host_peak_gib=None, reasons=reasons,
                    breakdown={}, command=[], ep=ep, tokens=tokens.to_dict(), **base)

    found = search.search(spec, req, hw, _levels(req, spec), usable)
    cand = found.chosen or found.asked
    backend, ep, est, pace = cand.backend, cand.ep, cand.estimate, cand.pace
    asked_checkpoints, asked_layers = req.checkpoints, req.checkpoint_layers
    planned = cand.request
    if cand.level:
        tokens, token_notes = resolve_tokens(planned, spec)
    verdict = 'fits' if cand.fits else 'does_not_fit'
    samples = req.samples_per_epoch
    options = [search.option_dict(c, samples, c is cand) for c in found.options]
    reasons = [_backend_sentence(req, backend, cand.why, len(usable))]
    explain: List[str] = []
    if backend == Backend.DEEPSPEED_ZERO2 and spec.is_moe:
        reasons.insert(0, ZERO2_MOE_WARNING)
    reasons += _fit_reasons(spec, tokens, planned, hw, backend, est)
    said = _search_sentence(req, found, cand, spec)
    if said:
        reasons.append(said)
    where = checkpoint_sentence(spec, tokens, planned, asked_checkpoints, hw, backend, est)
    if where:  # offloaded to host RAM is a choice about the run (its host memory, its speed); on the GPU, the default
        (reasons if checkpoints_of(est) == 'host' else explain).append(where)
    searched_layers = 'checkpoint_layers' in found.searched
    layers = checkpoint_layers_sentence(spec, tokens, planned, 'auto' if searched_layers else asked_layers, hw,
                                        backend, ep, tp, est)
    if layers and backend in PARTIAL_CHECKPOINT_BACKENDS:  # the search sentence says the number it chose
        (explain if searched_layers else reasons).append(layers)
    elif layers and not searched_layers:
        reasons.append(layers)
    reasons.append(speed.describe(pace, samples))
    explain.append(f'Speed estimate: {pace.source}.')
    explain += _option_sources(options, spec)
    cited = _measured_side_by_side(spec, hw, usable)
    if cited:
        explain.append(cited)
    offer = fp8_offer(spec, tokens, planned, hw, backend, est)
    if offer:
        reasons.append(offer[0])
        explain.append(offer[1])
    alternatives: List[Dict[str, Any]] = []
    if verdict == 'does_not_fit' and search_alternatives:
        found_alts = find_alternatives(spec, tokens, planned, hw, (backend, ep, tp))
        for f in found_alts:
            f.pop('request')
        host_bound = host_advice(spec, tokens, planned, hw, backend, ep, tp, est)
        if host_bound:  # the GPUs have room: GPU advice (more GPUs, fewer frames) would not help
            reasons.append(host_bound)
        else:
            reasons += _alternative_reasons(found_alts, planned, spec)
        if not host_bound and (not found_alts or not any(f['label'].startswith('same hardware')
                                                         for f in found_alts)):
            reasons.append(budget_advice(spec, planned, hw, backend, ep, tp))
        alternatives = found_alts[:6]
    if not cand.fits:
        options = []
    chosen = _chosen_settings(found, cand)
    return Plan(backend=backend, verdict=verdict, gpu_peak_gib=round(est.gpu_peak / C.GiB, 2),
                host_peak_gib=round(est.host_peak / C.GiB, 2), reasons=reasons + token_notes,
                breakdown=est.gpu_gib(), command=[], host_breakdown=est.host_gib(), phases=est.phases_gib(),
                trainable_params=est.trainable_params, alternative=alternatives[0] if alternatives else None,
                alternatives=alternatives, assumptions=list(est.assumptions) + list(spec.notes) + list(hw.notes),
                checkpoints=checkpoints_of(est), checkpoint_layers=est.setup.checkpoint_layers,
                est_tokens_per_s=pace.tokens_per_s, est_samples_per_s=pace.samples_per_s,
                est_samples_per_epoch=samples, est_hours_per_epoch=speed.hours_per_epoch(samples, pace),
                est_source=pace.source, est_basis=pace.basis, est_measured=pace.measured, options=options,
                search={'searched': list(found.searched), 'kept': [s for s in SEARCHABLE if s not in found.searched],
                        'chosen': chosen, 'budget_lowered': found.budget_lowered, 'candidates': found.planned},
                explain=explain, ep=ep, tokens=tokens.to_dict(),
                **{**base, 'offload': planned.offload, 'micro_batch': planned.micro_batch})


def _chosen_settings(found: 'search.SearchResult', cand: 'search.Candidate') -> Dict[str, Any]:
    """The searched settings as the plan decided them (what the launch applies over the recipe)."""
    r, s = cand.request, cand.estimate.setup
    out: Dict[str, Any] = {}
    if 'micro_batch' in found.searched:
        out['micro_batch'] = r.micro_batch
    if 'checkpoint_layers' in found.searched and s.gradient_checkpointing:
        out['checkpoint_layers'] = s.checkpoint_layers
    if 'offload' in found.searched:
        out['offload'] = r.offload
    if 'video_budget' in found.searched and cand.level:
        out['max_frames'], out['pair_tokens'] = r.max_frames, r.frame_tokens
    return out


def _backend_sentence(req: PlanRequest, backend: Backend, why: str, planned: int) -> str:
    if req.backend != AUTO:
        return f'backend {backend} (as requested).'
    if planned > 1:
        return (f'backend auto -> {backend}: the fewest estimated hours of the {planned} backends that can train this '
                f'({why}).')
    return f'backend auto -> {backend}: {why}.'


def _search_sentence(req: PlanRequest, found: 'search.SearchResult', cand: 'search.Candidate',
                     spec: ModelSpec) -> Optional[str]:
    """What the search chose and what it kept as the user set it; None where nothing was searched."""
    if not found.searched:
        return None
    r, s = cand.request, cand.estimate.setup
    applies = {'micro_batch': not r.pack_length,
               'checkpoint_layers': s.gradient_checkpointing and cand.backend in PARTIAL_CHECKPOINT_BACKENDS,
               'offload': backend_offloads(cand.backend), 'video_budget': not req.seq_len}
    words = {'micro_batch': f'micro-batch {r.micro_batch}',
             'checkpoint_layers': ('every decoder layer checkpointed' if s.checkpoint_layers is None
                                   or s.checkpoint_layers >= spec.num_layers else
                                   'no decoder layer checkpointed' if s.checkpoint_layers == 0 else
                                   f'the first {s.checkpoint_layers} of {spec.num_layers} decoder layers checkpointed'),
             'offload': 'CPU offload' if r.offload == 'cpu' else 'no CPU offload'}
    searched = [k for k in found.searched if applies[k] and k != 'video_budget']
    kept = [SETTING_WORDS[k] for k in SEARCHABLE if k not in found.searched and applies[k]]
    text = ''
    if searched and found.chosen is not None:
        text = (f'Searched {" and ".join(SETTING_WORDS[k] for k in searched)}: '
                f'{", ".join(words[k] for k in searched)} is the fastest that fits.')
    elif searched:
        text = f'Searched {" and ".join(SETTING_WORDS[k] for k in searched)}: no setting fits.'
    if found.budget_lowered:
        text += (f' The video budget asked ({req.max_frames} frames x {req.frame_tokens} tokens a pair) fits only '
                 f'with CPU offload or not at all: planned at {r.max_frames} frames x {r.frame_tokens} tokens a pair '
                 f'(the frame cap first, then the tokens a pair; the floor is video.min_frames and '
                 f'video.min_pair_tokens).')
    if kept:
        text += f' Kept as set: {", ".join(kept)}.'
    return text.strip() or None


def backend_offloads(backend: Backend) -> bool:
    return backend in DEEPSPEED_BACKENDS


def _option_sources(options: List[Dict[str, Any]], spec: ModelSpec) -> List[str]:
    out = []
    for o in options:
        if o['chosen']:
            continue
        out.append(f'Option {search.describe_setting(o, spec.num_layers)}: {o["est_source"]}.')
    return out


def _measured_side_by_side(spec: ModelSpec, hw: Hardware, usable: List[Tuple[Backend, str, int]]) -> Optional[str]:
    """The measured ratio of the two one-GPU MoE LoRA backends (plan/backend_ratio.py), quoted only at the depth it
    was measured at: a ratio of an 8-layer cut is not the ratio of a 40-layer model."""
    names = {str(b) for b, _, _ in usable}
    if not spec.is_moe or not {backend_ratio.MEGATRON, backend_ratio.UNSLOTH} <= names:
        return None
    entry = backend_ratio.lookup(spec.model_type, hw.gpu_name)
    if entry is None:
        return None
    layers = entry.get('layers')
    slower = backend_ratio.UNSLOTH if entry['faster'] == backend_ratio.MEGATRON else backend_ratio.MEGATRON
    if layers != spec.num_layers:
        return (f'{entry["faster"]} and {slower} were measured side by side on {entry["gpu"]} at '
                f'{layers or "another"} layers ({entry["source"]}); that ratio is not quoted for this '
                f'{spec.num_layers}-layer model: each backend is estimated from its own runs.')
    return (f'Measured side by side at this depth on {entry["gpu"]}: {entry["faster"]} '
            f'{entry["ratio"]:g}x the tokens/s of {slower} ({entry["tokens_per_s"][entry["faster"]]:,.0f} vs '
            f'{entry["tokens_per_s"][slower]:,.0f}; {entry["source"]}).')


def _hardware(req: PlanRequest, hardware: Optional[Hardware]) -> Hardware:
    if hardware is None:
        hw = req.hardware if isinstance(req.hardware, Hardware) else resolve_hardware(req.hardware, nodes=req.nodes)
    else:
        hw = hardware
    if hw.nodes != req.nodes and req.nodes != 1:
        hw = replace(hw, nodes=req.nodes)
    return hw


def _fit_reasons(spec: ModelSpec, tokens: VideoTokens, req: PlanRequest, hw: Hardware, backend: Backend,
                 est: MemoryEstimate) -> List[str]:
    """The peaks against the hardware, and what is too big or what is to spare."""
    gpu_ok, host_ok = fits(est, hw)
    cap = hw.gpu_mem_gib * C.GiB
    host_lim = hw.host_ram_gib * C.GiB if hw.host_ram_gib is not None else None
    peak_phase = max(est.phases, key=lambda p: est.phases[p]['gpu'])
    verdict = 'Fits' if gpu_ok and host_ok else 'Does NOT fit'
    reasons = [f'{verdict}: {est.gpu_peak / C.GiB:.2f} GiB per GPU at its peak ({peak_phase.replace("_", " ")}), of '
               f'the GPU\'s {hw.gpu_mem_gib:.2f} GiB{"" if gpu_ok else " (too big)"}; host {est.host_peak / C.GiB:.2f} '
               'GiB' + (f' of the {hw.host_ram_gib:.2f} GiB{"" if host_ok else " (too big)"}.' if host_lim is not None
                        else ' (host RAM limit unknown).')]
    if gpu_ok and est.gpu_peak > C.TIGHT_FRACTION * cap:
        reasons.append(f'Tight: {est.gpu_peak / cap:.0%} of the GPU, and the plan is within ±10 % of measured peaks: '
                       f'where a run must not fail, {_first_knob(spec, req, est)}.')
    if not gpu_ok:
        reasons.append(_model_state_sentence(spec, est, backend, hw.world))
        reasons.append(_too_big(spec, est))
        if backend in DEEPSPEED_BACKENDS + (Backend.DDP, ) and req.offload == 'none' and req.tuner != 'lora':
            reasons.append(_offload_sentence(spec, tokens, req, hw, backend))
    elif not host_ok:
        big = sorted(((v, k) for k, v in est.host.items()), reverse=True)[0]
        reasons.append(f'Too big in host RAM: {big[1]} ({gib(big[0])}) — the container limit is enforced by the '
                       f'OOM killer (SIGKILL, exit 137).')
    else:
        spare = memory_to_spare(spec, tokens, req, hw, backend)
        if spare:
            reasons.append(spare)
    return reasons


def _first_knob(spec: ModelSpec, req: PlanRequest, est: MemoryEstimate) -> str:
    """The first setting to turn for a margin, and what it buys."""
    s = est.setup
    if s.gradient_checkpointing and s.checkpoint_layers is not None and s.checkpoint_layers < spec.num_layers:
        return (f'checkpoint more layers (train.checkpoint_layers={min(spec.num_layers, s.checkpoint_layers + 4)}: '
                'each one checkpointed gives back its activations)')
    if req.micro_batch > 1:
        return f'lower the micro-batch (train.micro_batch={req.micro_batch // 2}: about half the activations)'
    return 'lower video.max_frames (the activations and logits scale with the frames)'


def _offload_sentence(spec: ModelSpec, tokens: VideoTokens, req: PlanRequest, hw: Hardware, backend: Backend) -> str:
    """What offloading to host RAM would need (DeepSpeed), against the host limit."""
    off_backend = (Backend.DEEPSPEED_ZERO2 if (spec.is_moe or backend == Backend.DEEPSPEED_ZERO2)
                   else Backend.DEEPSPEED_ZERO3)
    r_off = replace(req, offload='cpu', backend=off_backend)
    oe = plan_estimate(spec, tokens, train_setup(r_off, hw, off_backend, 1, 1, tokens))
    opt = oe.host.get('offloaded optimizer states (fp32 master + Adam m, v)', 0.0)
    _, oh = fits(oe, hw)
    host_lim = hw.host_ram_gib * C.GiB if hw.host_ram_gib is not None else None
    stages = 'ZeRO-2' + ('' if spec.is_moe else '/3')
    s = (f'{stages} with CPU offload moves the fp32 master + Adam states to host RAM: they alone need '
         f'{gb_and_gib(opt)}; the predicted host peak is {gb_and_gib(oe.host_peak)} with the fp32 gradient partition'
         f'{" and offloaded parameters" if off_backend == Backend.DEEPSPEED_ZERO3 else ""} and pinned buffers')
    if host_lim is not None:
        s += (f', against the {gb_and_gib(host_lim)} container/host limit'
              + (' — over the limit: the OOM killer would end the job with SIGKILL (exit 137), no Python '
                 'error' if not oh else ' — that fits in host RAM'))
    if spec.is_moe:
        s += ' (ZeRO-3 offload needs at least as much and is refused for MoE models anyway)'
    return s + '.'


def host_advice(spec: ModelSpec, tokens: VideoTokens, req: PlanRequest, hw: Hardware, backend: Backend, ep: int,
                tp: int, est: MemoryEstimate) -> Optional[str]:
    """Where the GPUs have room and host memory is what does not fit: how many processes per node would fit (each
    holds its own host memory and loads a shard at once), and how much host memory the run as asked needs. None
    when the GPU is the limit too."""
    gpu_ok, host_ok = fits(est, hw)
    if not gpu_ok or host_ok or hw.host_ram_gib is None:
        return None
    s = (f'The GPUs have room ({gib(est.gpu_peak)} of {gib(hw.gpu_mem_gib * C.GiB)}); host memory is the limit: '
         f'{gib(est.host_peak)} per node against {gib(hw.host_ram_gib * C.GiB)}. Give the machine (or the container) '
         f'at least {gib(est.host_peak)}')
    for gpus in range(hw.num_gpus - 1, 0, -1):
        fewer = replace(hw, num_gpus=gpus)
        smaller, _ = estimate_for(spec, tokens, req, fewer, backend, ep if ep <= gpus else 1, tp)
        if all(fits(smaller, fewer)):
            return s + (f', or train on {gpus} of the {hw.num_gpus} GPUs (recipe gpus: {gpus}, plan --gpus {gpus}): '
                        f'host {gib(smaller.host_peak)}, {gib(smaller.gpu_peak)} per GPU.')
    return s + '.'


def budget_advice(spec: ModelSpec, req: PlanRequest, hw: Hardware, backend: Backend, ep: int, tp: int) -> str:
    """Whether a smaller video budget makes this plan fit on this hardware, and how small: the largest frame cap
    (halving from the request's) that fits, or that even the smallest budget does not (the model states alone are
    too big: then advising the budget would waste the user's time)."""
    if req.seq_len:
        return 'Shorter samples (--seq-len) or bigger GPUs.'
    frames = req.max_frames
    while frames > 4:
        frames = max(4, frames // 2)
        smaller = replace(req, max_frames=frames)
        tokens, _ = resolve_tokens(smaller, spec)
        est, _ = estimate_for(spec, tokens, smaller, hw, backend, ep, tp)
        if all(fits(est, hw)):
            pace = speed.for_setup(spec, tokens, est.setup, hw.gpu_name)
            hours = speed.hours_per_epoch(req.samples_per_epoch, pace)
            return (f'A smaller video budget fits on this hardware: at most {frames} frames per clip (recipe '
                    f'video.max_frames={frames}, plan --max-frames {frames}; {tokens.total_tokens} tokens per sample) '
                    f'peaks at {gib(est.gpu_peak)} of {gib(hw.gpu_mem_gib * C.GiB)}'
                    + (f', {speed.format_hours(hours)} per epoch' if hours is not None else '') + '.')
    floor = replace(req, max_frames=4, frame_tokens=min(req.frame_tokens, 16))
    tokens, _ = resolve_tokens(floor, spec)
    est, _ = estimate_for(spec, tokens, floor, hw, backend, ep, tp)
    return (f'No video budget fits on this hardware: even 4 frames at 16 tokens per frame pair peak at '
            f'{gib(est.gpu_peak)} of {gib(hw.gpu_mem_gib * C.GiB)} (what the model needs before any video); '
            f'it needs bigger or more GPUs.')


def _alternative_reasons(found: List[Dict[str, Any]], req: PlanRequest, spec: ModelSpec) -> List[str]:
    if not found:
        return ['No alternative with up to 8 GPUs per node or 8 such nodes fits.']
    cheapest = found[0]
    reasons = ['Fastest alternative that fits: ' + describe_alternative(cheapest, spec) + '.']
    if cheapest['tuner'] != req.tuner:
        keep = next((f for f in found if f['tuner'] == req.tuner), None)
        if keep:
            reasons.append(f'Keeping {req.tuner} training: ' + describe_alternative(keep, spec) + '.')
    return reasons
