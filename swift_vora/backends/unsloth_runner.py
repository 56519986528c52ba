"""Train a MoE with Unsloth's split LoRA on one GPU -- or on N GPUs, one replica each -- with the video_ora
template and dataset.

    python -m swift_vora.backends.unsloth_runner OUTPUT/swift-vora-launch/unsloth_run.json   # what train runs
    python -m swift_vora.backends.unsloth_runner recipes/h200x1.yaml [key=value ...]         # a recipe directly
    NPROC_PER_NODE=8 python -m swift_vora.backends.unsloth_runner CONFIG.json                 # 8 replicas (torchrun)

Order matters: the environment (offline, no statistics, compiled cache under the output dir) is set and
`unsloth` is imported before transformers / ms-swift, so that all of Unsloth's patches apply. Then:
FastModel.from_pretrained (16-bit, never 4-bit) -> FastModel.get_peft_model with explicit leaf targets ->
checks on the live model (router frozen and without LoRA, LoRA on the experts, nothing quantized) ->
rows from swift_vora.dataset.build_swift_rows -> ms-swift's `video_ora` template encode + collate in the main
process (no DataLoader workers: nothing forks next to CUDA and Unsloth's compiled modules) -> a plain AdamW loop
-> `checkpoint-N/` (PEFT adapter + processor + swift_vora_adapter.json) and, with `unsloth.save_merged`,
`checkpoint-N-merged/` (save_pretrained_merged, merged_16bit).

With `NPROC_PER_NODE` (or `NNODES`) set, as `swift sft` reads them, the runner starts itself under torchrun, one
process per GPU; each trains its own samples (torch's DistributedSampler), DDP all-reduces the LoRA gradients, and
rank 0 alone writes checkpoints, the merged export and the run's logs (data_parallel.py, rank_samples.py).

`--loader peft` swaps Unsloth's loader for transformers + PEFT (LoRA on the same modules, experts through
`target_parameters`): the tests run the whole loop on CPU that way (gloo ranks for the data-parallel path).
Everything else is the same code.
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import sys
import time
from typing import Any, Dict, List, Optional

from . import kernel_cache
from .data_parallel import is_worker, torchrun_argv
from .unsloth import (
    MARKER_FILE,
    UnslothRunConfig,
    assert_router_frozen,
    from_pretrained_kwargs,
    peft_kwargs,
    unsloth_env,
)

PROCESS_START = time.time()
MODULE = 'swift_vora.backends.unsloth_runner'
_RANK = {'rank': 0, 'world': 1}  # this process among the replicas (set by train)


def log(msg: str) -> None:
    """A line about the run: printed once, by rank 0."""
    if _RANK['rank'] == 0:
        print(f'[swift-vora unsloth] {msg}', flush=True)


def log_rank(msg: str) -> None:
    """A line about this process: printed by every rank, naming it when there are several."""
    who = f' rank {_RANK["rank"]}/{_RANK["world"]}' if _RANK['world'] > 1 else ''
    print(f'[swift-vora unsloth{who}] {msg}', flush=True)


def _config_from_recipe(path: str, overrides: List[str], loader: Optional[str]) -> UnslothRunConfig:
    from .common import PlanView, common_env, config_model_type
    from .recipe import load_recipe
    from .unsloth import run_config
    recipe = load_recipe(path, overrides)
    checkpoints = None
    if recipe['unsloth.gradient_checkpointing'] == 'auto':  # the planner decides, as for `swift-vora train`
        from .planning import plan_recipe
        checkpoints = plan_recipe(recipe).checkpoints
    world = int(os.environ.get('WORLD_SIZE', '1'))  # under torchrun: the replicas it started
    per_node = int(os.environ.get('LOCAL_WORLD_SIZE', world))
    view = PlanView(backend='unsloth_split_lora', verdict='fits', reasons=[], num_gpus=per_node,
                    nodes=max(1, world // per_node), ep=1, tp=1,
                    offload='none', micro_batch=recipe['train.micro_batch'], is_moe=True,
                    model_type=recipe['model.type'] or config_model_type(recipe['model.path']), gpu_peak_gib=None,
                    host_peak_gib=None, checkpoints=checkpoints)
    for key, value in common_env(recipe, view).items():
        os.environ.setdefault(key, value)
    cfg = run_config(view, recipe)
    if loader:
        cfg.loader = loader
    return cfg


def _partial_checkpoint(model, info: Dict[str, Any]):
    """train.checkpoint_layers (SWIFT_VORA_CHECKPOINT_LAYERS): checkpointing kept on the first N decoder layers only
    (speed/partial_checkpoint.py; Unsloth checkpoints through the same per-layer flag). Returns the counter of the
    first step's recomputes, or None when the switch is unset. Imported here: they import ms-swift, which must come
    after Unsloth."""
    from ..speed import partial_checkpoint
    n = partial_checkpoint.layers_to_checkpoint()
    if n is None:
        return None
    info['partial_checkpoint'], counter = partial_checkpoint.apply(model, n)
    log(partial_checkpoint.describe(info['partial_checkpoint']))
    return counter


def load_model(cfg: UnslothRunConfig, device=None):
    """(model with LoRA, info dict). Unsloth on GPU; transformers + PEFT for the CPU stand-in. `device`: a replica's
    own GPU (cuda:LOCAL_RANK) where the whole model goes, as Unsloth places it under torchrun."""
    import torch
    info: Dict[str, Any] = {'loader': cfg.loader}
    if cfg.loader == 'unsloth':
        from unsloth import FastModel
        kwargs = from_pretrained_kwargs(cfg)
        if isinstance(kwargs['dtype'], str):  # FastModel asserts a torch dtype
            kwargs['dtype'] = getattr(torch, kwargs['dtype'])
        if device is not None and device.type == 'cuda' and device.index is not None:
            kwargs['device_map'] = {'': f'cuda:{device.index}'}
        model, _ = FastModel.from_pretrained(**kwargs)
        model = FastModel.get_peft_model(model, **peft_kwargs(cfg))
        info['from_pretrained'] = {k: str(v) for k, v in kwargs.items() if k != 'model_name'}
        info['split_lora'] = os.environ.get('UNSLOTH_MOE_LORA_MERGED', '0') != '1'
        try:
            from unsloth_zoo.temporary_patches.moe_utils import select_moe_backend
            info['moe_backend'] = select_moe_backend()
        except Exception as e:  # the name moved between versions: report, do not fail
            info['moe_backend'] = f'unknown ({e.__class__.__name__})'
        return model, info
    if cfg.loader != 'peft':
        raise ValueError(f'loader {cfg.loader!r}: unsloth | peft')
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText
    dtype = getattr(torch, cfg.dtype)
    config = AutoConfig.from_pretrained(cfg.model_path)
    auto = AutoModelForImageTextToText if hasattr(config, 'vision_config') else AutoModelForCausalLM
    model = auto.from_pretrained(cfg.model_path, dtype=dtype)
    lora = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                      target_modules=_language_regex(cfg.target_modules),
                      target_parameters=list(cfg.target_parameters) or None)
    model = get_peft_model(model, lora)
    info['split_lora'] = False
    info['moe_backend'] = 'transformers (PEFT stand-in)'
    return model, info


def _language_regex(leaves: List[str]) -> str:
    """PEFT regex: the leaf names, inside the language model only (the vision tower stays frozen)."""
    return r'.*language_model.*\.(' + '|'.join(leaves) + r')$'


def check_not_quantized(model) -> None:
    for name, param in model.named_parameters():
        cls = type(param).__name__
        if cls in ('Params4bit', 'Int8Params') or str(param.dtype) in ('torch.uint8', 'torch.int8'):
            raise AssertionError(f'{name} is quantized ({cls}, {param.dtype}): MoE training here is 16-bit only')


def build_template(cfg: UnslothRunConfig):
    import swift_vora
    swift_vora.register()
    from swift.model import get_processor
    from swift.template import get_template
    processor = get_processor(cfg.model_path, model_type=cfg.model_type or None)
    template = get_template(processor, template_type='video_ora', max_length=cfg.max_length)
    template.set_mode('train')
    return processor, template


def build_rows(cfg: UnslothRunConfig) -> List[Dict[str, Any]]:
    from swift_vora.dataset import build_swift_rows
    rows: List[Dict[str, Any]] = []
    for path in cfg.dataset:
        if _is_rows_file(path):
            with open(path, encoding='utf-8') as f:
                rows += [json.loads(line) for line in f if line.strip()]
            continue
        got, report, slivers = build_swift_rows(path, strict=cfg.strict, video_root=cfg.video_root)
        log(f'{path}: {report.total} annotation lines, {len(report.rows)} valid, {len(report.invalid)} rejected; '
            f'{len(got)} windowed samples; {slivers} sliver events dropped')
        for bad in report.invalid:
            log(f'rejected: {bad.reason}')
        rows += got
    if not rows:
        raise SystemExit('no training samples')
    return rows


def _is_rows_file(path: str) -> bool:
    from swift_vora.dataset import looks_like_annotations
    return not looks_like_annotations(path)


def _forward_keys(model) -> Optional[set]:
    import inspect
    base = model
    for attr in ('get_base_model', ):
        if hasattr(base, attr):
            base = getattr(base, attr)()
    params = inspect.signature(base.forward).parameters
    return set(params)


def train(cfg: UnslothRunConfig) -> Dict[str, Any]:
    os.makedirs(cfg.output_dir, exist_ok=True)
    for key, value in unsloth_env().items():  # before Triton / Unsloth import
        os.environ.setdefault(key, value)
    kernel_cache.use_in_this_process()
    from .. import switches
    from .data_parallel import TIMEOUT_ENV, Replicas
    # Under torchrun: the process group first -- Unsloth's compiler writes its generated modules from rank 0 alone once
    # a group exists (unsloth_zoo utils.distributed_function); one process otherwise.
    replicas = Replicas.start(switches.read(TIMEOUT_ENV))
    _RANK.update(rank=replicas.rank, world=replicas.world)
    if cfg.loader == 'unsloth':
        with kernel_cache.kept_through_imports():  # Unsloth's import drops the inductor cache folder
            import unsloth  # noqa: F401  (first: before transformers and ms-swift)
    import torch

    from swift_vora.guards.registry import enabled_guards

    from .prefetch import EncodePrefetcher, OrderedEncoder
    from .runner_guards import RunnerGuards
    from .step_profile import StepProfiler
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)  # the same on every rank: the same LoRA initialisation (DDP also broadcasts it)
    device = replicas.device
    guards_on = set(enabled_guards())
    if replicas.distributed:
        log_rank(f'replica {replicas.rank} of {replicas.world} on {device} (local rank {replicas.local_rank}, '
                 f'{replicas.backend}; pid {os.getpid()})')
        planned = cfg.num_gpus * cfg.nodes
        if planned != replicas.world:
            log(f'WARNING: the run config was planned for {planned} process(es); torchrun started {replicas.world}: '
                f'each optimizer step trains {replicas.world} x {cfg.micro_batch} x {cfg.grad_accum} samples')
        if replicas.alone:
            log('one process under the launcher: trained as the one-GPU run, without DDP (no peer to all-reduce with)')

    t_load = time.time()
    model, info = load_model(cfg, device if replicas.world > 1 else None)
    info['load_s'] = round(time.time() - t_load, 1)
    from ..speed import moe_lora_scale  # after the load: Unsloth has set up its MoE forward by now
    info['moe_lora_scale'] = moe_lora_scale.install()
    if info['moe_lora_scale']['setting'] != 'output' or 'down_lora' in info['moe_lora_scale']:
        log(f'expert LoRA (SWIFT_VORA_MOE_LORA_SCALE, SWIFT_VORA_MOE_DOWN_LORA): {json.dumps(info["moe_lora_scale"])}')
    from ..speed import moe_gather
    info['moe_gather'] = moe_gather.install()
    if info['moe_gather']['setting'] != 'index':
        log(f'routed-row gather (SWIFT_VORA_MOE_GATHER): {json.dumps(info["moe_gather"])}')
    from ..speed import moe_gate_grad
    info['moe_gate_grad'] = moe_gate_grad.install()
    if info['moe_gate_grad']['setting'] != 'eager':
        log(f'gate-gradient dot product (SWIFT_VORA_MOE_GATE_GRAD): {json.dumps(info["moe_gate_grad"])}')
    from ..speed import moe_router  # Unsloth's own switch: its fused router reached on this model's classes too
    info['moe_router'] = moe_router.install(model)
    if moe_router.wanted():
        log(f'fused MoE router ({moe_router.ENV}): {json.dumps(info["moe_router"])}')
    counts = assert_router_frozen(model)
    check_not_quantized(model)
    if cfg.is_moe and counts['expert_lora_tensors'] == 0:
        raise AssertionError('no LoRA on the experts: the MoE split-LoRA path is not active')
    info.update(counts)
    info['linear_attention_kernel'] = linear_attention_kernel(model)  # read before a lever wraps the forward
    from ..speed import gdn_qk_heads  # query and key at their own head count where fla's kernel takes them
    info['gdn_qk_heads'] = gdn_qk_heads.install(model)
    if gdn_qk_heads.wanted():
        log(f'Gated DeltaNet query/key heads ({gdn_qk_heads.ENV}): {json.dumps(info["gdn_qk_heads"])}')
    risk = linear_attention_risk(info['linear_attention_kernel'])
    if risk:
        info['linear_attention_warning'] = risk
        log(f'WARNING: {risk}')
    elif workaround := fla_hopper_workaround():
        info['linear_attention_workaround'] = workaround
    log(f'model loaded ({cfg.loader}): {counts["lora_tensors"]} LoRA tensors, {counts["expert_lora_tensors"]} on '
        f'experts, {counts["trainable_params"]:,} trainable parameters; router frozen; moe backend: '
        f'{info.get("moe_backend")}; Gated DeltaNet kernel: {info["linear_attention_kernel"]}')
    if cfg.loader == 'peft':
        model.to(device)
    autocast_dtype = forward_autocast(cfg, model, info)
    recompute_counter = _partial_checkpoint(model, info)
    guards = RunnerGuards(model, cfg.output_dir, device=device if device.type == 'cuda' else None, rank=replicas.rank)
    guards.start({'loader': cfg.loader, 'model_path': os.path.abspath(cfg.model_path), 'guards': sorted(guards_on),
                  'world_size': replicas.world})
    # One template per encode thread: a template keeps per-sample state on itself (prefetch.py). Built here, on the
    # main thread, before any encode starts.
    if cfg.encode_threads < 1:  # the recipe refuses it; a hand-written run config could still say so
        raise ValueError(f'encode_threads {cfg.encode_threads}: at least 1 (unsloth.encode_threads)')
    built = [build_template(cfg) for _ in range(cfg.encode_threads)]
    processor, template = built[0]  # the first also collates, on the prefetch thread (no per-sample state there)
    templates = [t for _, t in built]
    # The template computes M-RoPE positions with the model's get_rope_index; without a model it builds a second,
    # dummy one (ms-swift's Template._get_model). Hand it the model being trained, as `swift sft` does.
    for t in templates:
        t.model = model
    info['encode_threads'] = len(templates)
    from swift_vora.template import SampleRejected  # after build_template: ms-swift after Unsloth

    # after the plugin's own patches (build_template registers it): the ones Unsloth's rewrite made them skip
    from ..speed import vision_preamble, vit_attention
    info['vit_attention'] = vit_attention.adopt_over_rewrite(model)
    # SWIFT_VORA_VISION_PREAMBLE=prefetch: the tower's grid_thw-derived tensors made on the prefetch thread
    preamble, info['vision_preamble'] = vision_preamble.install(model)
    if info['vision_preamble'].get('not_installed'):
        log(f'vision preamble stays in the model: {info["vision_preamble"]["not_installed"]}')
    tower = preamble.tower if preamble is not None else None
    rows = build_rows(cfg)
    keys = _forward_keys(model)

    params = [p for p in model.parameters() if p.requires_grad]
    order, coverage, total = _sample_order(cfg, rows, replicas, 'coverage' in guards_on)
    info['steps'] = total
    optimizer, scheduler, info['optimizer'] = optimizer_and_schedule(torch, model, cfg.lr, cfg.warmup_ratio, total,
                                                                      cfg.swift_args)
    log(f'optimizer: {json.dumps(info["optimizer"])}')
    log_path = os.path.join(cfg.output_dir, 'train_log.jsonl')

    def draw():
        position = order.next()
        return position, rows[position.index]

    # each encode takes a drawn (position, row) and encodes the row; the position travels with it to the batch
    encodes = [lambda drawn, encode=t.encode: encode(drawn[1]) for t in templates]
    # The first batch on this thread, one template (whatever the first encode sets up lazily), then the pool: both
    # draw from the same order, so the sequence of samples does not depend on encode_threads.
    first = _next_batch(OrderedEncoder(encodes[:1], draw, rejected=(SampleRejected, )), template, len(rows), cfg,
                        tower)
    encoder = OrderedEncoder(encodes, draw, ahead=2 * len(encodes), rejected=(SampleRejected, ))
    ahead = f', up to {encoder.ahead} samples ahead' if encoder.threads > 1 else ' (inline on the prefetch thread)'
    log(f'encoding samples on {encoder.threads} thread(s) (unsloth.encode_threads), one template each{ahead}; '
        f'collating on the prefetch thread, {cfg.prefetch} micro-batches ahead')
    prefetch = EncodePrefetcher(lambda: _next_batch(encoder, template, len(rows), cfg, tower), depth=cfg.prefetch,
                                first=first)
    model.train()
    forward = replicas.wrap(model)  # DDP over the LoRA tensors under torchrun (data_parallel.py), else the model
    info['wrapped_in_ddp'] = forward is not model
    sync = torch.cuda.synchronize if device.type == 'cuda' else (lambda: None)
    # every rank profiles the same step (the steps kept in flight must match across ranks); rank 0 writes beside
    # the logs, the others in a folder of their own
    profiler = StepProfiler(cfg.output_dir if replicas.main else os.path.join(cfg.output_dir,
                                                                            f'profile.rank{replicas.rank}'))
    caches_before = kernel_cache.snapshot()
    triton_activity = kernel_cache.TritonActivity.install()
    if device.type == 'cuda':  # otherwise the first step looks like a hang
        log('first step: Triton compiles and autotunes its kernels (Gated DeltaNet, grouped GEMMs): minutes with a '
            f'cold cache, seconds with a warm one ({kernel_cache.cache_root()})')
    info['startup_s'] = round(time.time() - PROCESS_START, 1)
    from .step_ends import StepEnds, cuda_marker, lagged_requested
    lagged = device.type == 'cuda' and lagged_requested()  # SWIFT_VORA_STEP_SYNC=lagged: one step in flight
    ends = StepEnds(lagged, sync, cuda_marker(torch) if lagged else None)
    info['step_sync'] = 'lagged' if lagged else 'each'
    if lagged:  # held steps timed by their end on the GPU (step_ends.py); runs before it have a wrong mean step
        info['step_clock'] = 'gpu_end'
    start = time.time()
    step, samples, tokens, rejected, last, ckpt = 0, 0, 0, 0, {}, None

    def record(end) -> None:
        """What follows a finished step: the finite-loss check, the first-step report, the guards, the logs, saves.
        Over the replicas: the loss is their mean (what one process over the same global batch logs), the counts
        their sums."""
        nonlocal last, ckpt
        done, lr = end.step, end.info['lr']
        loss_sum, samples_all, tokens_all, rejected_all = replicas.sum(
            [end.loss, end.info['samples'], end.info['tokens'], end.info['rejected']])
        loss_sum /= replicas.world
        if not math.isfinite(loss_sum):
            raise FloatingPointError(f'step {done}: loss is {loss_sum} (not finite)')
        if done == 1:
            info['first_step'] = kernel_cache.first_step_report(end.at - start, caches_before,
                                                                kernel_cache.snapshot())
            info['first_step']['triton'] = triton_activity.summary()
            triton_activity.remove()
            log(kernel_cache.describe(info['first_step']) + triton_activity.describe())
            if info['vit_attention']:
                log('vision attention over a rewritten forward (swift_vora/speed/vit_attention.py): '
                    f'{json.dumps(info["vit_attention"])}')
            if recompute_counter is not None:
                from ..speed.partial_checkpoint import describe_recomputes
                info['partial_checkpoint'].update(recompute_counter.close())
                log(describe_recomputes(info['partial_checkpoint']))
        if 'lora_update' in guards_on:
            guards.after_step(done, lr)
        last = {'step': done, 'loss': round(loss_sum, 6), 'lr': lr, 'samples': int(samples_all),
                'tokens': int(tokens_all), 'rejected_samples': int(rejected_all),
                'seconds': round(end.at - start, 3), 'data_wait_s': round(prefetch.wait_s, 3), **_peak_memory(torch)}
        if done % cfg.logging_steps == 0 or done == total or done == 1:
            log(json.dumps(last))
        if replicas.main:
            with open(log_path, 'a', encoding='utf-8') as f:
                f.write(json.dumps(last) + '\n')
        if done % cfg.save_steps == 0 or done == total:
            guards.enter('save', done)
            if replicas.main:  # one writer: the replicas hold the same adapter (checked at the end)
                ckpt = save(model, processor, cfg, done, info)

    try:
        while step < total:
            n = step + 1
            # a step whose state is read after it (first-step report, save, profile, last) is never left in flight
            hold = lagged and not (n == 1 or n == total or n % cfg.save_steps == 0 or n == profiler.target)
            with profiler.step(n):  # SWIFT_VORA_PROFILE_STEP=N: torch.profiler over step N
                loss_sum = 0.0 if not lagged else None
                for micro in range(cfg.grad_accum):
                    guards.enter('batch_wait', step, micro)
                    batch = prefetch.next()
                    rejected += batch.rejected
                    coverage.consumed(batch.positions, batch.rejected_positions)
                    guards.on_batch(batch.supervised_per_sample, step, batch.names)
                    inputs = {k: v.to(device, non_blocking=True) if hasattr(v, 'to') else v  # pinned: prefetch.py
                              for k, v in batch.inputs.items() if k in keys}
                    if preamble is not None and batch.vision:
                        preamble.stage(inputs.get('video_grid_thw'), {
                            k: v.to(device, non_blocking=True) if hasattr(v, 'to') else v
                            for k, v in batch.vision.items()})
                    guards.enter('forward', step, micro)
                    # DDP all-reduces the gradients on the step's last micro-batch only
                    with replicas.accumulating(micro == cfg.grad_accum - 1):
                        with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                            # no KV / recurrent cache: a training forward never reads one (Unsloth turns it off
                            # only with its checkpointing; the PEFT stand-in kept one per forward)
                            loss = forward(**inputs, use_cache=False).loss / cfg.grad_accum
                        guards.enter('backward', step, micro)
                        loss.backward()
                    if lagged:  # summed on the device: no read-back until the step is recorded
                        loss_sum = loss.detach().float() if loss_sum is None else loss_sum + loss.detach().float()
                    else:
                        loss_sum += float(loss.detach())
                    samples += batch.samples
                    tokens += batch.tokens
                guards.enter('optimizer_step', step)
                clip_gradients(torch, params, info['optimizer']['max_grad_norm'])
                lr = scheduler.get_last_lr()[0]
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                step += 1
                # step times are GPU times, not launch times (each: synchronised here; lagged: one step later)
                finished = ends.end(step, loss_sum, {'lr': lr, 'samples': samples, 'tokens': tokens,
                                                     'rejected': rejected}, hold)
            for end in finished:
                record(end)
    except BaseException as error:
        guards.explain_error(error, step)
        if replicas.distributed:  # the peers stop too (torchrun, or their collective's timeout): say who started it
            log_rank(f'failed at step {step} of {total}: {type(error).__name__}: {error}')
        raise
    finally:
        encoder.close()  # first: unblocks a prefetch thread waiting on an encode
        prefetch.close()
    info['supervision'] = guards.finish()
    if 'lora_update' in guards_on:
        guards.lora_not_checked()
    summary = coverage.finish(replicas.gather, 'max_steps' if cfg.max_steps else 'step_budget')
    if summary is not None:
        from .rank_samples import describe_summary
        for row in summary:
            log(describe_summary(row))
        # counts here; which samples, in coverage_summary.jsonl
        info['coverage'] = [{k: len(v) if isinstance(v, list) and not k.endswith('_per_rank') else v
                             for k, v in row.items() if not k.endswith('_ids')} for row in summary]
    if 'down_lora' in info['moe_lora_scale']:  # how many down projections folded, and why others did not
        from ..speed import moe_down_fold
        info['moe_lora_scale']['down_fold'] = moe_down_fold.counts()
        log(f'down-projection LoRA folded: {json.dumps(info["moe_lora_scale"]["down_fold"])}')
    if moe_router.wanted():  # unsloth_zoo's count: 0 means no router took the fused path
        info['moe_router']['fused_calls'] = moe_router.fused_calls()
        log(f'fused MoE router calls: {info["moe_router"]["fused_calls"]}')
    if gdn_qk_heads.wanted():  # 0 grouped calls: the lever did nothing (each class's `state` says why)
        info['gdn_qk_heads']['grouped_calls'] = gdn_qk_heads.CALLS['grouped']
        log(f'Gated DeltaNet grouped-head calls: {gdn_qk_heads.CALLS["grouped"]}; '
            f'{json.dumps(info["gdn_qk_heads"].get("classes"))}')
    info['profile'] = profiler.written
    info['steps_left_in_flight'] = ends.held  # lagged: steps recorded after the next one was launched
    if preamble is not None:
        info['vision_preamble'] = preamble.summary()
    info.update(_peak_memory(torch))
    if 'max_memory_reserved_gib' in info:
        log(f'peak GPU memory (measured): {info["max_memory_allocated_gib"]} GiB allocated, '
            f'{info["max_memory_reserved_gib"]} GiB reserved')
    info['last'] = last
    if replicas.distributed:
        info['data_parallel'] = _replicas_end(model, replicas, torch)
    del forward
    replicas.leave()  # every rank arrives, the groups go; rank 0 alone goes on
    if not replicas.main:
        return info
    if 'verify_adapter' in guards_on and ckpt:
        # The fresh process loads the base model again (on the GPU when the host has no room for it: a 35B MoE whose
        # checkpoint sits in a tmpfs): every reference to this one goes first -- the template holds it too.
        for t in templates:
            t.model = None
        del model, optimizer, params, inputs, loss
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
            log(f'released the trained model for the adapter reload: {torch.cuda.mem_get_info()[0] / 2**30:.1f} GiB '
                'of GPU memory free')
        info['verify_adapter'] = guards.verify(ckpt, cfg.model_path)
    return info


def row_name(row: Dict[str, Any]) -> str:
    """How logs and reports name a sample: its sample id, else its video."""
    return str((row.get('chat_template_kwargs') or {}).get('sample_id') or row.get('videos'))


def optimizer_and_schedule(torch, model, lr: float, warmup_ratio: float, total: int,
                           given: Optional[Dict[str, Any]] = None):
    """(AdamW, its schedule, their record) as `swift sft` builds them, so that a run through this runner trains with
    the same update as one through `swift sft` at the same recipe:
    - ms-swift's defaults (common.swift_optimizer_defaults) where `given` (the recipe's swift_args the runner takes,
      by ms-swift's names) sets none; weight decay on every trainable parameter but biases and norms (transformers'
      Trainer.get_decay_parameter_names, called as ms-swift's own optimizers call it);
    - fused, as transformers' default `adamw_torch_fused` (torch >= 2.8) runs it: one kernel over the ~0.94 B fp32
      adapter parameters of the full-depth model instead of foreach's pass per operation with full-size temporaries
      (34 ms of a 2.5 s step on an H200); foreach where torch has no fused kernel for the parameters (their device or
      dtype), the record says why;
    - the warm-up as transformers counts it (warmup_steps: that many steps from 1 on, below 1 a ratio; else
      ceil(total x warmup_ratio)), then the schedule by transformers' get_scheduler with lr_scheduler_kwargs.
    The record's max_grad_norm is the clipping the training loop applies (clip_gradients)."""
    from transformers import Trainer, get_scheduler

    from .common import swift_optimizer_defaults
    d = {**swift_optimizer_defaults(), **(given or {})}
    decay = set(Trainer.get_decay_parameter_names(None, model))
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [{'params': [p for n, p in named if n in decay], 'weight_decay': d['weight_decay']},
              {'params': [p for n, p in named if n not in decay], 'weight_decay': 0.0}]
    groups = [g for g in groups if g['params']]
    kwargs = dict(lr=lr, betas=(d['adam_beta1'], d['adam_beta2']), eps=d['adam_epsilon'])
    record = {'name': 'AdamW', 'fused': True}
    try:
        optimizer = torch.optim.AdamW(groups, fused=True, **kwargs)
    except RuntimeError as error:  # torch's own check: every parameter a floating tensor on a supported device
        optimizer = torch.optim.AdamW(groups, **kwargs)
        record = {'name': 'AdamW', 'fused': False, 'why': str(error)}
    steps = d.get('warmup_steps') or 0
    warmup = int(steps) if steps >= 1 else math.ceil(total * (steps or warmup_ratio))
    scheduler = get_scheduler(d['lr_scheduler_type'], optimizer, num_warmup_steps=warmup, num_training_steps=total,
                              scheduler_specific_kwargs=d['lr_scheduler_kwargs'])
    record.update(lr=lr, weight_decay=d['weight_decay'], betas=[d['adam_beta1'], d['adam_beta2']],
                  eps=d['adam_epsilon'], max_grad_norm=d['max_grad_norm'], schedule=d['lr_scheduler_type'],
                  schedule_kwargs=d['lr_scheduler_kwargs'], warmup_steps=warmup,
                  decayed_tensors=sum(len(g['params']) for g in groups if g['weight_decay']),
                  undecayed_tensors=sum(len(g['params']) for g in groups if not g['weight_decay']),
                  set_by_recipe=sorted(given or {}))
    return optimizer, scheduler, record


def clip_gradients(torch, params, max_grad_norm: Optional[float]) -> None:
    """The gradients scaled to `max_grad_norm` as HF Trainer clips them; 0 or None: left as they are (its rule)."""
    if max_grad_norm is not None and max_grad_norm > 0:
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)


def _sample_order(cfg: UnslothRunConfig, rows: List[Dict[str, Any]], replicas, report: bool):
    """(this rank's order, its coverage count, the optimizer steps): torch's DistributedSampler over the rows, the
    tail policy for rows that do not divide over the ranks, as for `swift sft` (rank_samples.py). `report`: the
    coverage guard is on (its files are written)."""
    from .. import switches
    from ..guards.common import GuardError, write_json
    from ..guards.coverage import NAME, REPLICATE_ENV, TAIL_ENV
    from .rank_samples import Coverage, RankOrder, describe_plan, plan_tail, steps_for
    plan = plan_tail(len(rows), replicas.world, cfg.seed, switches.read(TAIL_ENV), switches.read(REPLICATE_ENV))
    if report and replicas.main:
        write_json(os.path.join(cfg.output_dir, 'coverage_plan.json'), plan)
    if plan['error']:
        raise GuardError(NAME, plan['error'])
    order = RankOrder(len(rows), replicas.world, replicas.rank, cfg.seed, plan['drop_last'])
    per_rank_step = cfg.micro_batch * cfg.grad_accum
    total = steps_for(order.per_epoch, cfg.epochs, per_rank_step, cfg.max_steps)
    for line in describe_plan(plan, lambda i: row_name(rows[i]), per_rank_step * replicas.world):
        log(line)
    coverage = Coverage(len(rows), replicas.world, replicas.rank, cfg.seed, plan['drop_last'], order.per_epoch,
                        cfg.output_dir, lambda i: row_name(rows[i]), write=report)
    return order, coverage, total


def _replicas_end(model, replicas, torch) -> Dict[str, Any]:
    """After training, on every rank: the adapter each replica holds (sha256 of PEFT's state dict, what
    save_pretrained writes) and its peak memory, gathered. Replicas that disagree stop the run: a LoRA tensor DDP did
    not reduce would have trained apart on each rank."""
    from peft import get_peft_model_state_dict

    from ..guards.common import GuardError
    from .data_parallel import adapter_digest, replicas_agree
    mine = {'rank': replicas.rank, 'device': str(replicas.device),
            'adapter_sha256': adapter_digest(get_peft_model_state_dict(model)), **_peak_memory(torch)}
    ranks = replicas.gather(mine)
    report = {'world_size': replicas.world, 'backend': replicas.backend, 'ranks': ranks,
              **replicas_agree([r['adapter_sha256'] for r in ranks])}
    if not report['identical']:
        raise GuardError('lora_update', f'after training, rank(s) {report["differ_from_rank0"]} of {replicas.world} '
                                        'hold another adapter than rank 0: some LoRA tensor was not all-reduced. '
                                        'Nothing of this run is a valid result.')
    log(f'the {replicas.world} replicas hold the same adapter (sha256 {report["adapter_sha256"][0][:16]}...)')
    return report


def forward_autocast(cfg: UnslothRunConfig, model, info: Dict[str, Any]):
    """The dtype the forward runs under autocast in, or None (unsloth.autocast false, or a 32-bit model).

    HF Trainer (accelerate's mixed_precision), which runs `swift sft` and Unsloth's own trainer, puts a 16-bit model's
    forward under autocast, and the LoRA forwards are written for it: PEFT keeps the adapters in fp32, and without
    autocast PEFT casts every LoRA input to fp32 while Unsloth's rewritten LoRA forward casts the input *and the base
    layer's output* to fp32 and adds in fp32 (unsloth_zoo compiler `_patch_lora_input_cast`). At full depth that was
    a fifth of the step's GPU time in casts and fp32 CUDA-core GEMMs (docs/runs/h200-moe-full/README.md, call d).
    Under autocast the LoRA GEMMs run in 16 bit on the fp32 adapters (cast once per forward; the adapters and their
    Adam states stay fp32), as `swift sft` trains them. PEFT's own input cast is also switched off where it would
    still run (speed/lora_autocast.py, SWIFT_VORA_LORA_AUTOCAST_INPUTS)."""
    import torch
    dtype = getattr(torch, cfg.dtype)
    if not cfg.autocast or dtype not in (torch.bfloat16, torch.float16):
        info['autocast'] = None
        log(f'forward without autocast (unsloth.autocast={cfg.autocast}, train.dtype={cfg.dtype}): LoRA layers '
            'with fp32 adapters compute in fp32')
        return None
    from ..speed import lora_autocast
    info['autocast'] = cfg.dtype
    info['lora_input_cast_off'] = lora_autocast.keep_lora_inputs_in_autocast_dtype(model) if lora_autocast.enabled() \
        else 0
    log(f'forward under autocast ({cfg.dtype}): LoRA GEMMs in {cfg.dtype} on fp32 adapters, as HF Trainer runs them '
        f'(PEFT input cast off on {info["lora_input_cast_off"]} layers; unsloth.autocast=false to turn off)')
    return dtype


def _peak_memory(torch) -> Dict[str, float]:
    if not torch.cuda.is_available():
        return {}
    return {'max_memory_allocated_gib': round(torch.cuda.max_memory_allocated() / 2**30, 3),
            'max_memory_reserved_gib': round(torch.cuda.max_memory_reserved() / 2**30, 3)}


def linear_attention_kernel(model: Any = None) -> Optional[str]:
    """Which Gated DeltaNet kernel the model's layers call (Qwen3.5 / Qwen3-Next): flash-linear-attention's Triton
    kernel when `fla` was importable when the binding was made, else transformers' PyTorch reference. Read where the
    forward that runs looks it up -- Unsloth's generated module binds its own copy of the global -- or, without a
    Gated DeltaNet layer in `model`, from transformers' modeling modules."""
    from ..speed.gdn_qk_heads import executed_forward, inner_globals_kernel, kernel_name
    for cls in ({type(m) for m in model.modules()} if model is not None else ()):
        if cls.__name__.endswith('GatedDeltaNet'):
            fn = inner_globals_kernel(executed_forward(cls)[0])
            if fn is not None:
                return kernel_name(fn)
    for module_name in ('transformers.models.qwen3_5_moe.modeling_qwen3_5_moe',
                        'transformers.models.qwen3_5.modeling_qwen3_5',
                        'transformers.models.qwen3_next.modeling_qwen3_next'):
        module = sys.modules.get(module_name)
        fn = getattr(module, 'torch_chunk_gated_delta_rule', None) if module else None
        if fn is not None:
            return kernel_name(fn)
    return None


def linear_attention_risk(kernel: Optional[str]) -> Optional[str]:
    """flash-linear-attention's gated chunk backward is wrong on Hopper with Triton >= 3.4, < 3.7.1 (fla issue #640,
    a miscompile of its BK=64 tile; fla 0.6 refuses to run there): say so when the bound fla has no workaround. The
    fla 0.5.1 that unsloth_zoo vendors steps that tile down to BK=32 on Hopper (and unsloth_zoo patches an installed
    fla the same way), so with Unsloth imported this is normally None."""
    if not kernel or not kernel.startswith('fla.'):
        return None
    import torch
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        return None
    try:
        import triton
        version = tuple(int(p) for p in triton.__version__.split('+')[0].split('.')[:3])
    except (ImportError, ValueError):
        return None
    if (3, 4, 0) <= version < (3, 7, 1) and not fla_hopper_workaround():
        return (f'Gated DeltaNet runs flash-linear-attention\'s Triton kernel with Triton {triton.__version__} on a '
                'Hopper GPU: upstream reports incorrect gradients from its gated chunk backward there (fla issue '
                '#640; fla >= 0.6 refuses it). Use Triton >= 3.7.1, or make `fla` unimportable to train with '
                'transformers\' PyTorch reference.')
    return None


def fla_hopper_workaround() -> Optional[str]:
    """How the bound flash-linear-attention avoids fla #640's BK=64 tile on Hopper, or None if it does not:
    unsloth_zoo's vendored copy probes each tensor's device in `fla.ops.common.chunk_o` (`_is_hopper_tensor`) and
    steps the tile down; an installed fla that unsloth_zoo patched carries its marker on `chunk_bwd_dqkwg`."""
    module = sys.modules.get('fla.ops.common.chunk_o')
    if module is None:
        return None
    if callable(getattr(module, '_is_hopper_tensor', None)):
        return 'unsloth_zoo vendored fla: BK=64 stepped down to 32 on Hopper'
    if getattr(getattr(module, 'chunk_bwd_dqkwg', None), '_unsloth_hopper_dqkwg_patched', False):
        return 'installed fla patched by unsloth_zoo: BK=64 stepped down on Hopper'
    return None


def _next_batch(encoder, template, n_rows: int, cfg: UnslothRunConfig, tower=None):
    """Collate one micro-batch of the encoder's samples (on the prefetch thread); rejected samples are counted and
    logged, in the order drawn. `encode_s`: the time this took, waiting for the encode threads included. With a
    vision `tower` (SWIFT_VORA_VISION_PREAMBLE=prefetch) its preamble for the videos' grid too."""
    from .prefetch import Batch, pin_tensors
    t0 = time.perf_counter()
    encoded, names, reasons, positions, rejected_positions = [], [], [], [], []
    while len(encoded) < cfg.micro_batch:
        got = encoder.next()
        position, row = got.row  # draw() hands (position in this rank's order, row)
        if got.rejection is not None:
            if cfg.strict:
                raise got.rejection
            reasons.append(str(got.rejection))
            rejected_positions.append(position)
            log_rank(f'sample rejected: {got.rejection}')
            if len(reasons) > n_rows:
                raise SystemExit('every sample was rejected by the template') from got.rejection
            continue
        encoded.append(got.sample)
        positions.append(position)
        names.append(row_name(row))
    supervised = [sum(1 for t in e['labels'] if t != -100) for e in encoded]
    inputs = template.data_collator(encoded)
    vision = {}
    if tower is not None and inputs.get('video_grid_thw') is not None:
        from ..speed.vision_preamble import precompute
        vision = pin_tensors(precompute(tower, inputs['video_grid_thw']))
    return Batch(inputs=pin_tensors(inputs), vision=vision, samples=len(encoded),
                 tokens=sum(len(e['input_ids']) for e in encoded), supervised_per_sample=supervised,
                 rejected=len(reasons), encode_s=time.perf_counter() - t0, rejections=reasons, names=names,
                 positions=positions, rejected_positions=rejected_positions)


def save(model, processor, cfg: UnslothRunConfig, step: int, info: Dict[str, Any]) -> str:
    ckpt = os.path.join(cfg.output_dir, f'checkpoint-{step}')
    model.save_pretrained(ckpt)
    processor.save_pretrained(ckpt)
    marker = {'source': 'unsloth' if cfg.loader == 'unsloth' else 'peft', 'base_model': os.path.abspath(cfg.model_path),
              'model_type': cfg.model_type, 'template': 'video_ora', 'step': step,
              'split_lora': info.get('split_lora'), 'moe_backend': info.get('moe_backend'),
              'target_modules': cfg.target_modules, 'target_parameters': cfg.target_parameters}
    with open(os.path.join(ckpt, MARKER_FILE), 'w', encoding='utf-8') as f:
        json.dump(marker, f, indent=2)
    # ms-swift reads these keys from a checkpoint's args.json (`swift infer --adapters CKPT`).
    with open(os.path.join(ckpt, 'args.json'), 'w', encoding='utf-8') as f:
        json.dump({'model': os.path.abspath(cfg.model_path), 'model_type': cfg.model_type, 'template': 'video_ora',
                   'custom_register_path': ['swift_vora'], 'tuner_type': 'lora'}, f, indent=2)
    from swift_vora import trained_budget  # the budget it was trained on goes with it (swift infer applies it)
    trained_budget.record(ckpt, 'swift-vora unsloth runner')
    log(f'saved adapter {ckpt}')
    if cfg.save_merged and cfg.loader == 'unsloth':
        merged = ckpt + '-merged'
        model.save_pretrained_merged(merged, processor, save_method='merged_16bit')
        trained_budget.copy_into(os.path.join(ckpt, trained_budget.FILE), merged)
        log(f'saved merged 16-bit weights {merged}')
    return ckpt


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog='python -m swift_vora.backends.unsloth_runner', description=__doc__.split(
        '\n\n')[0])
    parser.add_argument('config', help='unsloth_run.json written by `swift-vora train`, or a recipe YAML')
    parser.add_argument('overrides', nargs='*', default=[], help='key=value recipe overrides (recipe form only)')
    parser.add_argument('--loader', choices=('unsloth', 'peft'), default=None,
                        help='peft: transformers + PEFT stand-in (CPU tests); default: the config\'s')
    args = parser.parse_args(argv)
    relaunch = torchrun_argv(MODULE, list(sys.argv[1:] if argv is None else argv))
    if relaunch is not None:  # NPROC_PER_NODE / NNODES set, not a worker yet: torchrun starts the replicas
        print(f'[swift-vora unsloth] one process per GPU through torchrun: {" ".join(relaunch)}', flush=True)
        os.execv(relaunch[0], relaunch)
    if args.config.endswith('.json') and args.overrides:
        parser.error('overrides apply to a recipe YAML, not to a run config JSON')
    if is_worker():
        # torchrun's summary then carries this rank's traceback, not only its exit code
        from torch.distributed.elastic.multiprocessing.errors import record
        return record(_run)(args)
    return _run(args)


def _run(args) -> int:
    if args.config.endswith('.json'):
        with open(args.config, encoding='utf-8') as f:
            cfg = UnslothRunConfig.from_json(f.read())
        if args.loader:
            cfg.loader = args.loader
    else:
        cfg = _config_from_recipe(args.config, args.overrides, args.loader)
    info = train(cfg)
    if _RANK['rank'] == 0:
        with open(os.path.join(cfg.output_dir, 'unsloth_run_result.json'), 'w', encoding='utf-8') as f:
            json.dump(info, f, indent=2, default=str)
    return 0


if __name__ == '__main__':
    sys.exit(main())
