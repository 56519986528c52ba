"""Which backend trains this model on this hardware, whether it fits, and why — with numbers.

The rules (which backend, what is refused) are rules.py; the request and the plan, request.py; whether an estimate
fits, fit.py; what fits instead, alternatives.py. This module decides one plan and writes its reasons.
Does not fit (verdict "does_not_fit", exit 3): the numbers, the component that is too big, and the cheapest
alternative that fits (same hardware first: offload / another backend / selective / LoRA, then more GPUs).

`make_plan(PlanRequest) -> Plan` is the API; `swift-vora plan` and `swift-vora train` call it.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Dict, List, Optional, Tuple

from . import backend_ratio, speed
from . import constants as C
from .alternatives import describe_alternative, find_alternatives
from .backend import AUTO, Backend
from .fit import (
    checkpoint_layers_sentence,
    checkpoint_sentence,
    checkpoints_of,
    estimate_for,
    fits,
    gb,
    gb_and_gib,
    gib,
    param_count,
    train_setup,
)
from .hardware import Hardware
from .hardware import resolve as resolve_hardware
from .memory import DEEPSPEED_BACKENDS, MEGATRON_BACKENDS, MemoryEstimate, estimate, fp8_saving
from .model_source import load_model_spec
from .model_spec import ModelSpec
from .request import Plan, PlanRequest
from .rules import MEGATRON_SUPPORTED_MODEL_TYPES, REFUSAL_RULES, auto_backend, check_refusal, choose_ep
from .video_budget import VideoTokens, text_only_tokens, video_tokens


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
    if v is None:
        notes.append(f'{spec.model_type} has no vision tower: the {tok.total_tokens}-token video budget is counted '
                     f'as text')
        return text_only_tokens(tok.total_tokens, req.supervised_tokens), notes
    notes.append(f'video budget: {req.clip_seconds:g} s at {req.fps:g} fps, max {req.max_frames} frames -> '
                 f'{tok.frames} frames, {tok.groups} frame pairs x {tok.tokens_per_group} tokens = '
                 f'{tok.vision_tokens} vision tokens + {tok.timestamp_tokens} timestamp + {tok.text_tokens} text '
                 f'= {tok.total_tokens} tokens per sample')
    return tok, notes


def _model_state_sentence(spec: ModelSpec, est: MemoryEstimate, backend: Backend, world: int) -> str:
    """Model states per GPU split into weights / grads / fp32 master / Adam (the seed-case sentence)."""
    g = est.gpu
    weights = sum(v for k, v in g.items() if k.startswith('weights') or k.startswith('LoRA adapters'))
    grads = sum(v for k, v in g.items() if k.startswith('gradients') or 'main grad' in k)
    optim = sum(v for k, v in g.items() if k.startswith('optimizer') or k.startswith('distributed optimizer'))
    parts = [f'bf16 weights {gb(weights)}', f'gradients {gb(grads)}']
    if 'fp32 master' in ' '.join(g):
        parts += [f'fp32 master {gb(optim * C.BYTES_MASTER_FP32 / C.BYTES_OPTIM_STATES)}',
                  f'Adam m, v {gb(optim * C.BYTES_ADAM / C.BYTES_OPTIM_STATES)}']
    else:
        parts.append(f'optimizer states {gb(optim)}')
    total = weights + grads + optim
    return (f'{est.setup.tuner} training of {spec.model_type} ({param_count(spec.total_params)} parameters, '
            f'{param_count(est.trainable_params)} trainable) with {backend} on {world} '
            f'GPU{"s" if world > 1 else ""} needs '
            f'{gb_and_gib(total)} of model states per GPU: ' + ' + '.join(parts) + '.')


def _too_big(spec: ModelSpec, est: MemoryEstimate) -> str:
    items = sorted(((v, k) for k, v in est.gpu.items()), reverse=True)
    v, k = items[0]
    comp = sorted(((b, c) for c, b in est.model_state_bytes.items() if b > 0), reverse=True)
    s = f'Too big on the GPU: {k} ({gib(v)})'
    if comp:
        b, c = comp[0]
        share = b / max(1.0, sum(x for x, _ in comp))
        s += f'; by model component, {c.replace("_", " ")} hold{"" if c.endswith("s") else "s"} {gib(b)} ' \
             f'({share:.0%}) of the model states on each GPU'
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
    if not (backend == Backend.DDP and req.compile == 'layers' and req.gradient_checkpointing):
        return None
    cap = hw.gpu_mem_gib * C.GiB * C.TIGHT_FRACTION
    options = []
    for mb in sorted({req.micro_batch, max(req.micro_batch, 4)}):
        r = replace(req, gradient_checkpointing=False, micro_batch=mb)
        est = estimate(spec, tokens, train_setup(r, hw, backend, 1, 1, tokens))
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
              est: MemoryEstimate) -> Optional[str]:
    """A sentence offering FP8 frozen base weights where this GPU has FP8 tensor cores and the ddp + FP8 plan fits
    (dense LoRA on a bf16 base); None elsewhere."""
    if req.fp8 != 'off' or req.tuner != 'lora' or req.quant != 'none' or spec.is_moe or hw.fp8 is not True:
        return None
    r = replace(req, fp8='frozen_base', backend=Backend.DDP)
    if check_refusal(spec, hw.world, r, Backend.DDP, 1, 1, hw):
        return None
    fp8_est, _ = estimate_for(spec, tokens, r, hw, Backend.DDP, 1, 1)
    if not all(fits(fp8_est, hw)):
        return None
    saved = fp8_saving(spec)
    return (f'{hw.gpu_name} has FP8 tensor cores: train.fp8: frozen_base (--fp8 frozen_base, on ddp) holds the '
            f'decoder\'s frozen linears in FP8 ({gib(saved)} less than bf16) and multiplies them in FP8 -- peak '
            f'{gib(fp8_est.gpu_peak)} against {gib(est.gpu_peak)} with {backend}; for memory, not speed: measured at '
            f'{speed.FP8_FROZEN_RATIO.value:.2f}x of bf16\'s samples/s on an H200 (2B; its losses within 2 % of '
            f'bf16\'s over 14 steps), held-out learning not checked yet (docs/benchmarks.md).')


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
    ep = req.ep if req.ep is not None else (choose_ep(spec, world) if backend in MEGATRON_BACKENDS else 1)
    base = dict(num_gpus=hw.num_gpus, nodes=hw.nodes, tuner=req.tuner, offload=req.offload, quant=req.quant,
                fp8=req.fp8, ep=ep, tp=tp, micro_batch=req.micro_batch, lora_rank=req.lora_rank,
                lora_targets=req.lora_targets,
                tokens=tokens.to_dict(), model=spec.summary(), hardware=hw.to_dict(),
                gpu_capacity_gib=hw.gpu_mem_gib, host_limit_gib=hw.host_ram_gib,
                host_limit_source=hw.host_ram_source, config_source=_config_source(spec, req.model), spec=spec)

    refusal = check_refusal(spec, world, req, backend, ep, tp, hw)
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

    choice = None
    if _single_gpu_moe_lora(req, spec, world, backend):
        choice, backend, why = _measured_choice(spec, tokens, req, hw, backend, why)
    asked_checkpoints, asked_layers = req.checkpoints, req.checkpoint_layers
    est, req = estimate_for(spec, tokens, req, hw, backend, ep, tp)
    gpu_ok, host_ok = fits(est, hw)
    verdict = 'fits' if gpu_ok and host_ok else 'does_not_fit'
    reasons = [why, *_fit_reasons(spec, tokens, req, hw, backend, est)]
    if choice:
        reasons.append(choice['sentence'])
    where = checkpoint_sentence(spec, tokens, req, asked_checkpoints, hw, backend, est)
    if where:
        reasons.append(where)
    layers = checkpoint_layers_sentence(spec, tokens, req, asked_layers, hw, backend, ep, tp, est)
    if layers:
        reasons.append(layers)
    pace = speed.for_setup(spec, tokens, est.setup, hw.gpu_name)
    reasons.append(speed.describe(pace, req.samples_per_epoch))
    offer = fp8_offer(spec, tokens, req, hw, backend, est)
    if offer:
        reasons.append(offer)
    alternatives: List[Dict[str, Any]] = []
    if verdict == 'does_not_fit' and search_alternatives:
        found = find_alternatives(spec, tokens, req, hw, (backend, ep, tp))
        for f in found:
            f.pop('request')
        reasons += _alternative_reasons(found, req, spec)
        if not found or not any(f['label'].startswith('same hardware') for f in found):
            reasons.append(budget_advice(spec, req, hw, backend, ep, tp))
        alternatives = found[:6]
    return Plan(backend=backend, verdict=verdict, gpu_peak_gib=round(est.gpu_peak / C.GiB, 2),
                host_peak_gib=round(est.host_peak / C.GiB, 2), reasons=reasons + token_notes,
                breakdown=est.gpu_gib(), command=[], host_breakdown=est.host_gib(), phases=est.phases_gib(),
                trainable_params=est.trainable_params, alternative=alternatives[0] if alternatives else None,
                alternatives=alternatives, assumptions=list(est.assumptions) + list(spec.notes) + list(hw.notes),
                checkpoints=checkpoints_of(est), checkpoint_layers=est.setup.checkpoint_layers,
                est_tokens_per_s=pace.tokens_per_s,
                est_samples_per_s=pace.samples_per_s, est_samples_per_epoch=req.samples_per_epoch,
                est_hours_per_epoch=speed.hours_per_epoch(req.samples_per_epoch, pace), est_source=pace.source,
                backend_choice=choice, **base)


def _single_gpu_moe_lora(req: PlanRequest, spec: ModelSpec, world: int, backend: Backend) -> bool:
    """Both one-GPU MoE LoRA backends are candidates: a MoE model mcore-bridge supports, LoRA on a bf16 base, one
    GPU, no parallel sizes asked, and one of the two backends (asked or auto-chosen)."""
    return (world == 1 and spec.is_moe and req.tuner == 'lora' and req.quant == 'none' and req.offload == 'none'
            and spec.model_type in MEGATRON_SUPPORTED_MODEL_TYPES and req.ep in (None, 1) and req.tp in (None, 1)
            and backend in (Backend.UNSLOTH_SPLIT_LORA, Backend.MEGATRON_EP_LORA))


def _measured_choice(spec: ModelSpec, tokens: VideoTokens, req: PlanRequest, hw: Hardware, backend: Backend,
                     why: str) -> Tuple[Optional[Dict[str, Any]], Backend, str]:
    """Where both one-GPU MoE LoRA backends fit: the cost of each, and the faster one by measurement
    (plan/backend_ratio.py). `backend=auto` takes the measured faster one; not measured, the rule's choice stands.
    (None, backend, why) unchanged when one of them does not fit."""
    costs = {}
    for candidate in (Backend.UNSLOTH_SPLIT_LORA, Backend.MEGATRON_EP_LORA):
        est, _ = estimate_for(spec, tokens, req, hw, candidate, 1, 1)
        gpu_ok, host_ok = fits(est, hw)
        pace = speed.for_setup(spec, tokens, est.setup, hw.gpu_name)
        costs[str(candidate)] = {'gpu_peak_gib': round(est.gpu_peak / C.GiB, 2), 'fits': gpu_ok and host_ok,
                                 'est_tokens_per_s': pace.tokens_per_s, 'est_source': pace.source}
    if not all(c['fits'] for c in costs.values()):
        return None, backend, why
    choice = backend_ratio.compare(spec.model_type, hw.gpu_name, str(backend), costs)
    if req.backend == AUTO and choice['faster'] and choice['faster'] != str(backend):
        backend = Backend(choice['faster'])
        why = (f'backend auto -> {backend}: measured {choice["ratio"]:g}x the tokens/s of the other one-GPU MoE LoRA '
               f'backend for {spec.model_type} on this GPU ({choice["source"]}).')
        choice = backend_ratio.compare(spec.model_type, hw.gpu_name, str(backend), costs)
    return choice, backend, why


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
        backend, why = auto_backend(spec, world, req.tuner, req.fp8)
        return backend, f'backend auto -> {backend}: {why}.'
    return Backend(req.backend), f'backend {req.backend} (as requested).'


def _fit_reasons(spec: ModelSpec, tokens: VideoTokens, req: PlanRequest, hw: Hardware, backend: Backend,
                 est: MemoryEstimate) -> List[str]:
    """The peaks against the hardware, and what is too big or what is to spare."""
    gpu_ok, host_ok = fits(est, hw)
    cap = hw.gpu_mem_gib * C.GiB
    host_lim = hw.host_ram_gib * C.GiB if hw.host_ram_gib is not None else None
    peak_phase = max(est.phases, key=lambda p: est.phases[p]['gpu'])
    reasons = [f'Per-GPU peak {gib(est.gpu_peak)} ({peak_phase.replace("_", " ")}) of {gib(cap)} '
               f'{"fits" if gpu_ok else "does NOT fit"}; host peak {gib(est.host_peak)}'
               + (f' of {gib(host_lim)} ({hw.host_ram_source or "limit"}) '
                  f'{"fits" if host_ok else "does NOT fit"}.' if host_lim is not None else
                  ' (host RAM limit unknown).')]
    if gpu_ok and est.gpu_peak > C.TIGHT_FRACTION * cap:
        # not "uncalibrated" any more: the out-of-sample rows are within +-10 % (docs/memory-model.md), which is
        # also why a plan this close is no promise
        reasons.append(f'Tight: the predicted peak is {est.gpu_peak / cap:.0%} of the GPU; the plan is within ±10 % '
                       f'of the peaks measured on an H200 (docs/memory-model.md), so keep a margin where a run must '
                       f'not fail (smaller video budget or micro batch; with train.checkpoint_layers, more layers '
                       f'checkpointed).')
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


def _offload_sentence(spec: ModelSpec, tokens: VideoTokens, req: PlanRequest, hw: Hardware, backend: Backend) -> str:
    """What offloading to host RAM would need (DeepSpeed), against the host limit."""
    off_backend = (Backend.DEEPSPEED_ZERO2 if (spec.is_moe or backend == Backend.DEEPSPEED_ZERO2)
                   else Backend.DEEPSPEED_ZERO3)
    r_off = replace(req, offload='cpu', backend=off_backend)
    oe = estimate(spec, tokens, train_setup(r_off, hw, off_backend, 1, 1, tokens))
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
            return (f'A smaller video budget fits on this hardware: at most {frames} frames per clip (recipe '
                    f'video.max_frames={frames}, plan --max-frames {frames}; {tokens.total_tokens} tokens per sample) '
                    f'peaks at {gib(est.gpu_peak)} of {gib(hw.gpu_mem_gib * C.GiB)}.')
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
