"""What fits instead: the alternatives a plan that does not fit offers, cheapest first."""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Dict, List, Optional, Tuple

from . import constants as C
from . import search, speed
from .backend import Backend
from .fit import checkpoints_of, estimate_for, fits, param_count, samples_per_row
from .hardware import Hardware
from .memory import DEEPSPEED_BACKENDS, MEGATRON_BACKENDS, MemoryEstimate
from .model_spec import ModelSpec
from .request import OFFLOADS, QUANTS, PlanRequest
from .rules import auto_candidates, check_refusal, choose_ep
from .video_budget import VideoTokens


def _candidate_backends(spec: ModelSpec, world: int, tuner: str) -> List[Backend]:
    """The backends an alternative may use: the dense ones for a dense model; for a MoE the ones `auto` plans
    (rules.auto_candidates) -- DeepSpeed ZeRO-2 trains a MoE only when asked for by name, so it is never offered."""
    if not spec.is_moe:
        return [Backend.DEEPSPEED_ZERO3, Backend.DEEPSPEED_ZERO2, Backend.DDP]
    return [backend for backend, _ in auto_candidates(spec, world, tuner)]


_TUNER_LADDER = {'full': ['full', 'selective', 'lora'], 'selective': ['selective', 'lora'], 'lora': ['lora']}


def _evaluate(spec: ModelSpec, tokens: VideoTokens, req: PlanRequest, hw: Hardware, backend: Backend,
              ep: Optional[int] = None, tp: Optional[int] = None):
    ep = ep if ep is not None else (choose_ep(spec, hw.world) if backend in MEGATRON_BACKENDS else 1)
    tp = tp if tp is not None else 1
    if check_refusal(spec, hw.world, req, backend, ep, tp, hw):
        return None
    free = tuple(s for s in req.search if s in ('micro_batch', 'checkpoint_layers'))
    if free:  # what the user left free is searched here as for the plan (search.py): the fastest that fits
        r = replace(req, search=free, tp=tp)
        found = search.search(spec, r, hw, [((r.max_frames, r.frame_tokens), tokens)], [(backend, '', ep)])
        best = found.chosen or found.asked
        return best.estimate, found.chosen is not None, ep, tp, best.request
    est, decided = estimate_for(spec, tokens, req, hw, backend, ep, tp)
    gpu_ok, host_ok = fits(est, hw)
    return est, gpu_ok and host_ok, ep, tp, decided


def _alt_dict(spec: ModelSpec, tokens: VideoTokens, req: PlanRequest, hw: Hardware, backend: Backend,
              est: MemoryEstimate, ep: int, tp: int, label: str) -> Dict[str, Any]:
    pace = speed.for_setup(spec, tokens, est.setup, hw.gpu_name)
    return {'label': label, 'backend': backend, 'tuner': req.tuner, 'offload': req.offload, 'quant': req.quant,
            'fp8': req.fp8,
            'micro_batch': req.micro_batch, 'pack_length': req.pack_length, 'num_gpus': hw.num_gpus,
            'nodes': hw.nodes, 'ep': ep, 'tp': tp,
            'gpu_mem_gib': hw.gpu_mem_gib, 'gpu_peak_gib': round(est.gpu_peak / C.GiB, 2),
            'host_peak_gib': round(est.host_peak / C.GiB, 2), 'host_limit_gib': hw.host_ram_gib,
            'trainable_params': est.trainable_params, 'checkpoints': checkpoints_of(est),
            'checkpoint_layers': est.setup.checkpoint_layers,
            'est_tokens_per_s': pace.tokens_per_s, 'est_samples_per_s': pace.samples_per_s,
            'est_hours_per_epoch': speed.hours_per_epoch(req.samples_per_epoch, pace), 'est_measured': pace.measured,
            'est_basis': pace.basis, 'est_source': pace.source}


def speed_key(a: Dict[str, Any]):
    """Fewest hours first: an estimate before none, then the most samples per second."""
    return (not a.get('est_measured'), -(a.get('est_samples_per_s') or 0.0))


def describe_alternative(a: Dict[str, Any], spec: ModelSpec) -> str:
    tuner = {'lora': f'LoRA (r={a.get("lora_rank", "")})' if a.get('lora_rank') else 'LoRA',
             'full': 'full SFT',
             'selective': 'selective unfreezing (attention' + (' + shared experts' if spec.num_shared_experts else '')
                          + ')'}[a['tuner']]
    bits = [f'{tuner} with {a["backend"]}']
    if a['offload'] == 'cpu':
        bits.append('CPU offload')
    if a['quant'] == '4bit':
        bits.append('4-bit base (QLoRA)')
    if a['backend'] in MEGATRON_BACKENDS:
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
    if a.get('est_tokens_per_s'):
        pace = f', about {a["est_tokens_per_s"]:,.0f} tokens/s'
        if a.get('est_hours_per_epoch') is not None:
            pace += f', {speed.format_hours(a["est_hours_per_epoch"])} per epoch'
    else:
        pace = f'; speed: {speed.NO_MEASUREMENT}'
    return (f'{", ".join(bits)} on {gpus}: {a["gpu_peak_gib"]:.1f} GiB per GPU '
            f'({param_count(a["trainable_params"])} trainable), {host}{pace}')


def find_alternatives(spec: ModelSpec, tokens: VideoTokens, req: PlanRequest, hw: Hardware,
                      current: Tuple[str, int, int]) -> List[Dict[str, Any]]:
    """Candidates that fit: on the same hardware (smaller micro batch, other backend / offload, selective, LoRA,
    4-bit for dense LoRA) fewest estimated hours first (plan/speed.py's estimate: CPU offload fits in less memory and
    trains slower than a 4-bit base without it; a setting no run measured comes after those with an estimate), then
    more GPUs of the same kind (2, 4, 8 per node with the same host RAM, then 2, 4, 8 nodes like this one), fewest
    first."""
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
        est, ok, ep, tp, r = res
        if ok:
            d = _alt_dict(spec, tokens, r, h, backend, est, ep, tp, label)
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
                        if backend in MEGATRON_BACKENDS:  # tensor parallel also splits the vocab-parallel logits
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
    same = sorted((f for f in found if f['label'].startswith('same hardware')), key=speed_key)
    return same + [f for f in found if not f['label'].startswith('same hardware')]
