"""The best plan that fits: the settings a user would otherwise try by hand, searched, fewest estimated hours first.

What is searched is what the user left free (`PlanRequest.search`; `plan` and `train` fill it with the settings the
flags or the recipe did not set):
  backend           with `backend=auto`, every candidate of plan/rules.py `auto_candidates` that is not refused
  micro_batch       1, 2, 4, 8 samples per GPU per step
  checkpoint_layers the fewest checkpointed decoder layers that fit at that micro-batch (plan/fit.py, `auto`)
  offload           DeepSpeed's CPU offload, off and on (DeepSpeed backends only)
  video_budget      kept as asked while anything fits at it without CPU offload; otherwise lowered -- the frame cap
                    halved down to video.min_frames, then the tokens per frame pair halved down to
                    video.min_pair_tokens (the floor the user sets) -- to the largest budget that fits
Each candidate is planned in full (memory, then speed: plan/speed.py) and ranked: a speed estimate before none
("no measurement"), then the most samples per second (the fewest hours for the same dataset), then the larger video
budget, the rule's order of backends and the smaller micro-batch. The plan is the first that fits; `options` lists it
and the best of every other backend, offload and budget that fits, each with its hours and what its estimate rests
on.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import constants as C
from . import speed
from .backend import Backend
from .fit import estimate_for, fits
from .hardware import Hardware
from .memory import DEEPSPEED_BACKENDS, MEGATRON_BACKENDS, MemoryEstimate
from .model_spec import ModelSpec
from .request import CHECKPOINT_LAYERS_AUTO, PlanRequest
from .rules import check_refusal
from .video_budget import VideoTokens

MICRO_BATCHES = (1, 2, 4, 8)
MAX_OPTIONS = 4  # the plan's own and up to three others


@dataclass
class Candidate:
    """One setting planned in full."""
    backend: Backend
    why: str  # why the rules consider this backend
    rank: int  # its place in the rules' order (0: the default)
    ep: int
    tp: int
    request: PlanRequest  # as planned: checkpoint_layers and the Unsloth checkpoints' place decided
    tokens: VideoTokens
    level: int  # 0: the video budget asked; 1, 2, ...: lowered
    estimate: MemoryEstimate
    pace: speed.SpeedEstimate
    fits: bool

    def key(self) -> Tuple:
        return (not self.pace.measured, -(self.pace.samples_per_s or 0.0), self.level, self.rank,
                self.request.micro_batch, self.request.offload != 'none')

    def group(self) -> Tuple:
        """Options are one per backend, offload and video budget: the best micro-batch and layers of each."""
        return (self.backend, self.request.offload, self.level)


@dataclass
class SearchResult:
    chosen: Optional[Candidate]  # the first that fits; None: nothing does
    asked: Candidate  # the request as asked on the rules' first backend (what a plan that does not fit shows)
    options: List[Candidate]  # the chosen first, then the best of each other group that fits
    searched: Tuple[str, ...]
    budget_lowered: bool
    planned: int  # candidates planned


def budget_levels(req: PlanRequest, spec: ModelSpec) -> List[Tuple[int, int]]:
    """(frames, tokens per frame pair) to plan, the request's first: lowered only where the budget is searched."""
    levels = [(req.max_frames, req.frame_tokens)]
    if 'video_budget' not in req.search or req.seq_len or spec.vision is None:
        return levels
    frames, pair = req.max_frames, req.frame_tokens
    floor_frames = max(2, req.min_frames)
    while frames > floor_frames:
        frames = max(floor_frames, frames // 2)
        levels.append((frames, pair))
    floor_pair = max(1, req.min_pair_tokens)
    while pair > floor_pair:
        pair = max(floor_pair, pair // 2)
        levels.append((frames, pair))
    return levels


def _micro_batches(req: PlanRequest, backend: Backend, world: int, tp: int) -> Sequence[int]:
    if 'micro_batch' not in req.search or req.pack_length:  # a packed row is planned full: its size is the knob
        return (req.micro_batch, )
    if backend in MEGATRON_BACKENDS and req.global_batch:  # megatron sft: global batch = micro-batch x DP x steps
        dp = max(1, world // max(1, tp))
        return tuple(mb for mb in MICRO_BATCHES if req.global_batch % (mb * dp) == 0) or (req.micro_batch, )
    return MICRO_BATCHES


def _offloads(req: PlanRequest, backend: Backend) -> Sequence[str]:
    if 'offload' not in req.search or backend not in DEEPSPEED_BACKENDS or req.quant != 'none':
        return (req.offload, )
    return ('none', 'cpu')


def _checkpoint_layers(req: PlanRequest) -> Any:
    if 'checkpoint_layers' in req.search and req.gradient_checkpointing:
        return CHECKPOINT_LAYERS_AUTO
    return req.checkpoint_layers


def _chooses(asked: PlanRequest, candidate: PlanRequest, level: int) -> bool:
    """Whether the search chose any of this candidate's settings (then it keeps C.SEARCH_MARGIN of the GPU free):
    a micro-batch, offload or video budget other than asked, or the checkpointed layers."""
    return (level > 0 or candidate.micro_batch != asked.micro_batch or candidate.offload != asked.offload
            or candidate.checkpoint_layers != asked.checkpoint_layers)


def plan_one(spec: ModelSpec, req: PlanRequest, hw: Hardware, tokens: VideoTokens, backend: Backend, why: str,
             rank: int, ep: int, tp: int, level: int, margin: float = C.FIT_MARGIN) -> Candidate:
    est, decided = estimate_for(spec, tokens, req, hw, backend, ep, tp, margin)
    gpu_ok, host_ok = fits(est, hw, margin)
    pace = speed.for_setup(spec, tokens, est.setup, hw.gpu_name)
    return Candidate(backend=backend, why=why, rank=rank, ep=ep, tp=tp, request=decided, tokens=tokens, level=level,
                     estimate=est, pace=pace, fits=gpu_ok and host_ok)


def search(spec: ModelSpec, req: PlanRequest, hw: Hardware, levels: List[Tuple[Tuple[int, int], VideoTokens]],
           backends: List[Tuple[Backend, str, int]]) -> SearchResult:
    """`backends`: (backend, why, ep) the rules allow and did not refuse, the default first; `levels`: the video
    budgets to plan ((frames, pair tokens), their tokens), the asked one first."""
    tp = req.tp or 1
    planned = 0

    def at_level(level: int) -> List[Candidate]:
        nonlocal planned
        (frames, pair), tokens = levels[level]
        out = []
        for rank, (backend, why, ep) in enumerate(backends):
            if level == 0 and req.search:  # the setting as asked (the defaults where free), against the whole GPU
                r = replace(req, backend=str(backend), max_frames=frames, frame_tokens=pair)
                out.append(plan_one(spec, r, hw, tokens, backend, why, rank, ep, tp, level))
                planned += 1
            for mb in _micro_batches(req, backend, hw.world, tp):
                for offload in _offloads(req, backend):
                    r = replace(req, backend=str(backend), micro_batch=mb, offload=offload, max_frames=frames,
                                frame_tokens=pair, checkpoint_layers=_checkpoint_layers(req))
                    if offload != req.offload and check_refusal(spec, hw.world, r, backend, ep, tp, hw):
                        continue
                    margin = C.SEARCH_MARGIN if _chooses(req, r, level) else C.FIT_MARGIN
                    out.append(plan_one(spec, r, hw, tokens, backend, why, rank, ep, tp, level, margin))
                    planned += 1
        return out

    first = at_level(0)
    pool = [c for c in first if c.fits]
    lowered = False
    if not any(c.request.offload == 'none' for c in pool):
        for level in range(1, len(levels)):
            found = [c for c in at_level(level) if c.fits]
            if found:
                pool += found
                lowered = True
                if any(c.request.offload == 'none' for c in found):
                    break
    pool.sort(key=Candidate.key)
    backend, why, ep = backends[0]
    (frames, pair), tokens = levels[0]
    asked = plan_one(spec, replace(req, backend=str(backend)), hw, tokens, backend, why, 0, ep, tp, 0)
    options, groups = [], set()
    for c in pool:
        if c.group() not in groups:
            groups.add(c.group())
            options.append(c)
    chosen = pool[0] if pool else None
    return SearchResult(chosen=chosen, asked=asked, options=options[:MAX_OPTIONS], searched=tuple(req.search),
                        budget_lowered=lowered and chosen is not None and chosen.level > 0, planned=planned)


def option_dict(c: Candidate, samples: Optional[int], chosen: bool) -> Dict[str, Any]:
    """An option as the plan's JSON lists it."""
    r, est, pace = c.request, c.estimate, c.pace
    return {'chosen': chosen, 'backend': str(c.backend), 'num_gpus': est.setup.gpus_per_node, 'nodes': est.setup.nodes,
            'ep': c.ep, 'tp': c.tp, 'tuner': r.tuner, 'micro_batch': r.micro_batch,
            'checkpoint_layers': est.setup.checkpoint_layers if est.setup.gradient_checkpointing else None,
            'gradient_checkpointing': est.setup.gradient_checkpointing, 'offload': r.offload, 'quant': r.quant,
            'max_frames': r.max_frames, 'pair_tokens': r.frame_tokens, 'tokens_per_sample': c.tokens.total_tokens,
            'budget_lowered': c.level > 0, 'gpu_peak_gib': round(est.gpu_peak / C.GiB, 2),
            'host_peak_gib': round(est.host_peak / C.GiB, 2), 'est_tokens_per_s': pace.tokens_per_s,
            'est_samples_per_s': pace.samples_per_s, 'est_hours_per_epoch': speed.hours_per_epoch(samples, pace),
            'est_measured': pace.measured, 'est_basis': pace.basis, 'est_source': pace.source}


def describe_setting(o: Dict[str, Any], layers: int) -> str:
    """An option's settings in a few words: 'unsloth_split_lora x8 replicas, micro-batch 4, 31 of 40 layers
    checkpointed'."""
    bits = [o['backend']]
    if o['backend'] in ('unsloth_split_lora', 'ddp') and o['num_gpus'] * o['nodes'] > 1:
        bits[0] += f' x{o["num_gpus"] * o["nodes"]} replicas'
    if o['backend'].startswith('megatron'):
        bits[0] += f' EP {o["ep"]}' + (f' TP {o["tp"]}' if o['tp'] > 1 else '')
    bits.append(f'micro-batch {o["micro_batch"]}')
    if not o['gradient_checkpointing']:
        bits.append('no checkpointing')
    elif o['checkpoint_layers'] is not None and o['checkpoint_layers'] < layers:
        bits.append(f'{o["checkpoint_layers"]} of {layers} layers checkpointed')
    if o['offload'] == 'cpu':
        bits.append('CPU offload')
    if o['quant'] == '4bit':
        bits.append('4-bit base')
    if o['budget_lowered']:
        bits.append(f'{o["max_frames"]} frames x {o["pair_tokens"]} tokens a pair')
    return ', '.join(bits)
