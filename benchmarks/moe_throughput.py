"""MoE video LoRA on one GPU: swift-vora's Unsloth split LoRA against plain ms-swift PEFT, same model and clips.

    python benchmarks/moe_throughput.py --layers 8    # on the GPU machine (scripts/gpu/run_all.sh moe)
    python benchmarks/moe_throughput.py --smoke       # CPU: tiny Qwen3.5-MoE, PEFT stand-in, 2 steps
    python benchmarks/moe_throughput.py --dry-run --layers 40 --variants A,B   # CPU: each variant's plan and switches

The model: a random-weight Qwen3.5/3.6-MoE of the published 35B-A3B configuration (hidden 2048, 256 experts, 8
routed + 1 shared, Gated DeltaNet + gated attention in a 3:1 pattern, the 27-block vision tower, vocab 248,320),
built with `--layers N` decoder layers (the pattern kept; all 40 do not fit the GPU machine's disk next to the
rest), written as a checkpoint and loaded by each variant the way a downloaded one is. The clips: synthetic 32 s
videos, 640x360 at 8 fps; every variant sees 64 frames per sample at up to 256 tokens per frame pair.

Variants (each one real process; same LoRA rank/alpha, same targets -- attention, Gated DeltaNet projections, the
shared expert's MLP and the routed experts' fused tensors -- micro-batch 1, the same gradient accumulation):
- `vora_unsloth`: `swift-vora train recipes/h200x1.yaml` with overrides -- the planner, then swift_vora's Unsloth
  runner: FastModel (16-bit), split MoE LoRA ((X@A)@B per expert, grouped GEMMs), offloaded checkpointing, the
  `video_ora` template encoding on a prefetch thread. `--flagship` adds every guard: the adapter reload in a fresh
  process, the merged 16-bit export and its check against base + B@A (scripts/merge_for_vllm.sh) -- to this variant,
  or to the one `--flagship-variant` names (a lever setting checked in the run that measures it).
  Unsloth's process binds the flash-linear-attention 0.5.1 that unsloth_zoo vendors for the Gated DeltaNet layers
  (Triton; on Hopper with Triton < 3.7.1 it steps fla #640's miscompiled BK=64 tile down to 32). Unsloth's per-block
  compile is off (the runner's default). `--profile-step N` adds a torch.profiler step past the measured ones.
- `vora_unsloth_torchgdn`: the same with the vendored fla off (`UNSLOTH_DISABLE_VENDORED_FLA=1`): transformers'
  PyTorch Gated DeltaNet, the kernel plain swift runs here -- the like-with-like comparison (`speedup_clean`).
- `vora_unsloth_gpu_ckpt`: the same with plain gradient checkpointing (`unsloth.gradient_checkpointing=true`): layer
  inputs stay on the GPU instead of Unsloth's host offload (more memory, no host round trip).
- `vora_unsloth_compile`: the same with Unsloth's block compile on (`UNSLOTH_BLOCK_COMPILE=1`, Unsloth's default).
- `vora_unsloth_fla`: the same with an installed flash-linear-attention on the path (`--fla-path`). fla 0.6 refuses
  its backward on Hopper with Triton < 3.7.1 (wrong results, fla #640); the GPU image has Triton 3.6.
- `swift_peft`: plain `swift sft` LoRA through PEFT, experts reached with ms-swift's `--target_parameters`
  (PEFT's ParamWrapper: the delta weight of all 256 experts materialised per layer), `qwen3_5` template, the
  budget through ms-swift's own variables (FPS, FPS_MAX_FRAMES, VIDEO_MAX_TOKEN_NUM), the strongest plain flags
  (no ViT checkpointing, 8 persistent workers, expandable segments).
- `swift_peft_attn`: the same with attention targets only (what plain swift reaches without --target_parameters).
- `swift_unsloth`: plain `swift sft --tuner_backend unsloth` with the `swift_peft` targets, if it runs.

- `vora_unsloth_offload`: the same with Unsloth's offloaded checkpointing forced (`unsloth.gradient_checkpointing=
  unsloth`: layer inputs in pinned host RAM), what the planner picks only when the GPU has no room.
- `vora_unsloth_mb2`, `vora_unsloth_mb4`: micro-batch 2 / 4 (`train.micro_batch`): more tokens per expert GEMM and
  per Python launch; the step then holds that many samples.
- `vora_unsloth_mb4_torchrun1`: `vora_unsloth_mb4` under torchrun with one process (`NPROC_PER_NODE=1`: process
  group, DDP over the LoRA tensors, the per-step reductions): what the data-parallel path costs on one GPU;
  `torchrun_overhead` in the result compares the two medians.
- the levers, each named by its suffixes and documented beside its table below (`vora_variant` reads them all):
  checkpointed layers (`_ck32`), the rank-scale rewrite (`_rank_scale`), then on top of it the permutation gather
  (`_gather`), Unsloth's fused router (`_router`), the folded down-projection LoRA (`_fold`), the fused gate gradient
  (`_gategrad`), Gated DeltaNet's query/key at their own head count (`_gva`); a lever's twin is the same name
  without its last suffix.

Full depth (`--layers 40`, the whole 35B-A3B: ~65 GiB of bf16 weights) needs a checkpoint folder with room for it:
`scripts/gpu/run_all.sh moe_full` builds it in a RAM-backed tmpfs on the GPU machine (its disk is smaller than the
model). The flagship writes one merged copy (the runner's export; merge_for_vllm.sh hard-links its files) in
`--flagship-work`, there beside the checkpoint on the tmpfs, after `--spill-dir` took enough base shards to the disk
(links left in their place, benchmarks/merge_room.py); where no move makes room it skips the merge and says why in
the result (`flagship.merge_room`, `merge_skipped`).

Every variant runs `--steps` optimizer steps (default 12); the first `--warmup-steps` (default 2) are not measured.
Per variant: `median_step_s` and `mean_step_s` over the measured steps, `tokens_per_s` = tokens per step / the median
step (the headline; `tokens_per_s_mean` beside it), `first_step_s` (process start of the loop to the end of step 1:
compile + autotune; the runner also says whether its kernel caches were warm), peak reserved memory.

Measured per variant (throughput.py's instrumentation in swift's process; the runner's own train_log.jsonl):
samples/s and tokens/s after the warm-up steps, peak reserved GiB, the share of time the loop waited for data,
and MFU over ACTIVE parameters: F = 4*N_act*T + 6*N_lora_act*T + 6*L_full*T^2*d_attn + 2*N_vit*P + 4*h*V*S
(frozen weights: forward 2N plus the activation gradient 2N; LoRA trainable 6N; causal attention of the full-
attention layers; the frozen ViT forward on P patches; the LM head on the S supervised positions), against the
H200's measured 790 TFLOP/s bf16 matmul rate.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import merge_room  # noqa: E402  (room for the flagship's merged copy: shards moved to another filesystem)
import step_timeline  # noqa: E402  (the kernel families of a profiled step)
import throughput as tp  # noqa: E402  (shared helpers: env, logged processes, clips, swift instrumentation)

REPO = tp.REPO
RECIPE = os.path.join(REPO, 'recipes', 'h200x1.yaml')
LORA_RANK, LORA_ALPHA = 16, 32
# One target list for every variant: attention, Gated DeltaNet projections, the shared expert's MLP (nn.Linear
# leaves) and, through target_parameters, the routed experts' fused tensors. Never the router (mlp.gate,
# shared_expert_gate) nor the vision tower (its linears are named qkv/proj/linear_fc*).
TARGET_MODULES = ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'in_proj_qkv', 'in_proj_z', 'out_proj', 'gate_proj',
                  'up_proj', 'down_proj']
ATTENTION_TARGETS = TARGET_MODULES[:7]
TARGET_PARAMETERS = ['mlp.experts.gate_up_proj', 'mlp.experts.down_proj']
GOAL = {'speedup': 2.0, 'memory_ratio': 0.65, 'plan_error': 0.10}
# Full depth (issue #30): >= 12,000 tokens/s for swift-vora at 64 frames, MFU (active) >= 0.25, plan within 10 %
GOAL_FULL = {'tokens_per_s': 12000, 'mfu': 0.25, 'plan_error': 0.10}
MICRO_BATCH_VARIANTS = {'vora_unsloth_mb2': 2, 'vora_unsloth_mb4': 4, 'vora_unsloth_mb8': 8}
# recipes/h200x1.yaml as shipped (micro-batch 4, every default switch): the figures a user gets without a lever. The
# headline `speedup` takes the fastest variant of the call, which may be an opt-in lever; `*_default` keeps this one.
DEFAULT_VARIANT = 'vora_unsloth_mb4'
# The expert GEMM path at the winning micro-batch: Unsloth's grouped-GEMM Triton kernels instead of torch's
# grouped_mm (its default where torch has it); the runner records which one Unsloth chose (`runner.moe_backend`).
MOE_BACKEND_VARIANTS = {'vora_unsloth_mb4_triton': (4, 'unsloth_triton')}
# Fewer checkpointed layers where the plan leaves room (train.checkpoint_layers, speed/partial_checkpoint.py):
# (micro-batch, decoder layers checkpointed of 40); the planner fits both on an H200 (131.5 and 113.4 GiB planned)
CHECKPOINT_LAYERS_VARIANTS = {'vora_unsloth_mb4_ck36': (4, 36), 'vora_unsloth_mb4_ck34': (4, 34),
                              'vora_unsloth_mb2_ck34': (2, 34),
                              # the twin of vora_unsloth_mb4_ck32_rank_scale without the lever (the lever's
                              # second twin call, at the setting recipes/h200x1.yaml's auto picks)
                              'vora_unsloth_mb4_ck32': (4, 32)}
# The runner before autocast (unsloth.autocast=false): every LoRA layer in fp32 on fp32 copies of its input, as the
# runner trained until 2026-12-03 (unsloth_runner.forward_autocast): the lever measured against the default
AUTOCAST_OFF_VARIANTS = {'vora_unsloth_mb4_fp32_lora': 4}
# One encode thread (the runner until 2026-12-03; now unsloth.encode_threads=4): the data-pipeline lever measured
ENCODE_THREADS_VARIANTS = {'vora_unsloth_mb4_enc1': (4, 1)}
# Each expert LoRA's scaling on the rank-r intermediate instead of the expert output (speed/moe_lora_scale.py, the
# switch SWIFT_VORA_MOE_LORA_SCALE): (micro-batch, decoder layers checkpointed of 40 or None for all)
RANK_SCALE_VARIANTS = {'vora_unsloth_mb4_rank_scale': (4, None), 'vora_unsloth_mb4_ck36_rank_scale': (4, 36),
                       # fewer checkpointed layers than 36 (call k: 11,703 tokens/s at 36, 3.11 GiB a freed layer,
                       # ~116 GiB expected at 32): the recipe's plan fits 32 (136.1 GiB), not 30 (146.2)
                       'vora_unsloth_mb4_ck32_rank_scale': (4, 32),
                       # the plan picks (train.checkpoint_layers=auto) at the frame-pair cap of RANK_SCALE_VIDEO
                       'vora_unsloth_mb4_ckauto_rank_scale': (4, 'auto')}
# Video overrides of a rank-scale variant: auto with the frame-pair cap at what the clips encode (640x360: 220 tokens a
# pair; the recipe caps 256), so that the plan picks for the samples themselves (30 of 40 on an H200; 32 at the cap)
RANK_SCALE_VIDEO = {'vora_unsloth_mb4_ckauto_rank_scale': ['video.pair_tokens=220']}
# The host's share of the step (call k: 95-148 ms a step the GPU waits, at the step boundary): the vision tower's
# preamble made on the prefetch thread (SWIFT_VORA_VISION_PREAMBLE=prefetch, speed/vision_preamble.py) and one step
# kept in flight (SWIFT_VORA_STEP_SYNC=lagged, backends/step_ends.py), on top of the named rank-scale variant
HOST_SYNC_VARIANTS = {name + '_nosync': name for name in RANK_SCALE_VARIANTS}
HOST_SYNC_ENV = {'SWIFT_VORA_VISION_PREAMBLE': 'prefetch', 'SWIFT_VORA_STEP_SYNC': 'lagged'}
# The routed-row gather's backward through the inverse permutation instead of a sorted index_put (call m's profile:
# 51 ms of a 2.46 s step; SWIFT_VORA_MOE_GATHER=permutation, speed/moe_gather.py), on top of the named variant
GATHER_VARIANTS = {name + '_gather': name for name in RANK_SCALE_VARIANTS}
GATHER_ENV = {'SWIFT_VORA_MOE_GATHER': 'permutation'}
# each lever's variant on top of a rank-scale variant: name -> (the rank-scale variant it builds on, the lever's
# switches); its twin in the comparison (moe_calls.py) is the name without the lever's suffix
LEVERS_ON_RANK_SCALE = {name: (twin, env) for variants, env in ((HOST_SYNC_VARIANTS, HOST_SYNC_ENV),
                                                               (GATHER_VARIANTS, GATHER_ENV))
                        for name, twin in variants.items()}
# unsloth_zoo's fused router (one Triton kernel forward and backward for softmax, top-k and the renormalisation;
# call n's profile: torch.topk alone 30 ms of a 2.505 s step; UNSLOTH_MOE_FUSED_ROUTER=1, speed/moe_router.py), on top
# of a rank-scale variant or of its gather lever: `*_router` against the same name without the suffix
ROUTER_ENV = {'UNSLOTH_MOE_FUSED_ROUTER': '1'}
ROUTER_VARIANTS = {name + '_router': name for name in (*RANK_SCALE_VARIANTS, *GATHER_VARIANTS)}
LEVERS_ON_RANK_SCALE.update({name: (LEVERS_ON_RANK_SCALE.get(twin, (twin, {}))[0],
                                    {**LEVERS_ON_RANK_SCALE.get(twin, (twin, {}))[1], **ROUTER_ENV})
                             for name, twin in ROUTER_VARIANTS.items()})
# the experts' down-projection LoRA folded into the base grouped GEMM (SWIFT_VORA_MOE_DOWN_LORA=fold,
# speed/moe_down_fold.py; call n's profile: the LoRA delta's product and addition ~80 ms of 2.505 s), on top of a
# rank-scale variant or of its gather + router levers (every lever at once): `*_fold` against the name without it
FOLD_ENV = {'SWIFT_VORA_MOE_DOWN_LORA': 'fold'}
FOLD_VARIANTS = {name + '_fold': name for name in (*RANK_SCALE_VARIANTS,
                                                   *(n for n in ROUTER_VARIANTS if n.endswith('_gather_router')))}
LEVERS_ON_RANK_SCALE.update({name: (LEVERS_ON_RANK_SCALE.get(twin, (twin, {}))[0],
                                    {**LEVERS_ON_RANK_SCALE.get(twin, (twin, {}))[1], **FOLD_ENV})
                             for name, twin in FOLD_VARIANTS.items()})
# the gate-gradient identity's fp32 dot product as one compiled reduction (SWIFT_VORA_MOE_GATE_GRAD=fused,
# speed/moe_gate_grad.py; call n's profile: its two fp32 copies alone 29.6 ms of 2.505 s), on top of a rank-scale
# variant or of every other lever: `*_gategrad` against the name without it
GATE_GRAD_ENV = {'SWIFT_VORA_MOE_GATE_GRAD': 'fused'}
GATE_GRAD_VARIANTS = {name + '_gategrad': name for name in (
    *RANK_SCALE_VARIANTS, *(n for n in ROUTER_VARIANTS if n.endswith('_gather_router')),
    *(n for n in FOLD_VARIANTS if n.endswith('_router_fold')))}
LEVERS_ON_RANK_SCALE.update({name: (LEVERS_ON_RANK_SCALE.get(twin, (twin, {}))[0],
                                    {**LEVERS_ON_RANK_SCALE.get(twin, (twin, {}))[1], **GATE_GRAD_ENV})
                             for name, twin in GATE_GRAD_VARIANTS.items()})
# Gated DeltaNet's query and key handed to fla's kernel at their 16 heads, not repeated to the 32 value heads
# (SWIFT_VORA_GDN_QK_HEADS=grouped, speed/gdn_qk_heads.py; call n's profile: 106 copies, 33.9 ms of 2.505 s), on top of
# a rank-scale variant or of the gather + router + gate-gradient levers: `*_gva` against the name without it
GVA_ENV = {'SWIFT_VORA_GDN_QK_HEADS': 'grouped'}
GVA_VARIANTS = {name + '_gva': name for name in (
    *RANK_SCALE_VARIANTS, *(n for n in GATE_GRAD_VARIANTS if n.endswith('_gather_router_gategrad')))}
LEVERS_ON_RANK_SCALE.update({name: (LEVERS_ON_RANK_SCALE.get(twin, (twin, {}))[0],
                                    {**LEVERS_ON_RANK_SCALE.get(twin, (twin, {}))[1], **GVA_ENV})
                             for name, twin in GVA_VARIANTS.items()})
# The runner under torchrun with one process against its twin without: NPROC_PER_NODE=1 makes the runner start
# `python -m torch.distributed.run --nproc_per_node 1` itself (backends/data_parallel.py) -- the process group, DDP over
# the LoRA tensors, the per-step reductions, the adapter digest at the end: what the data-parallel path costs where it
# is not needed (the goal: within 3 % of the twin's median step). name -> (twin, processes)
TORCHRUN_VARIANTS = {'vora_unsloth_mb4_torchrun1': ('vora_unsloth_mb4', 1)}
TORCHRUN_GOAL = 0.03


def budget(smoke: bool) -> Dict[str, Any]:
    if smoke:
        return {'fps': 1.0, 'max_frames': 8, 'pair_tokens': 16, 'min_pair_tokens': 4, 'clip_s': 8.0,
                'source_fps': 4.0, 'size': (128, 96)}
    return {'fps': 2.0, 'max_frames': 64, 'pair_tokens': 256, 'min_pair_tokens': 16, 'clip_s': 32.0,
            'source_fps': 8.0, 'size': (640, 360)}


# ---- inputs -------------------------------------------------------------------------------------------------------
def build_model(out_dir: str, shape: str, layers: Optional[int], device: str) -> Dict[str, Any]:
    """A random Qwen3.5-MoE checkpoint, built in its own process (the driver holds no CUDA memory)."""
    done = os.path.join(out_dir, 'swift_vora_counts.json')
    if os.path.isfile(done):
        with open(done) as f:
            built = json.load(f)
        if built.get('shape') == shape and built.get('layers') == layers:
            return built
        # another call on this warm machine built another depth here: a 3-layer run must not train the 8 layers
        # left behind (a full-SFT call planned 8 layers on an H100 that way and refused to launch)
        print(f'build_model: {out_dir} holds shape {built.get("shape")} with {built.get("layers")} layers, not '
              f'{shape} with {layers}: rebuilding', flush=True)
        shutil.rmtree(out_dir)
    t0 = time.time()
    code = ('import json, sys; sys.path.insert(0, %r); from swift_vora.tiny_model import build_qwen3_5_moe; '
            'c = build_qwen3_5_moe(%r, shape=%r, num_layers=%r, device=%r, dtype=%r); '
            'json.dump({**c, "shape": %r, "layers": %r}, open(%r, "w"))' % (
                REPO, out_dir, shape, layers, device, 'float32' if shape == 'tiny' and device == 'cpu' else 'bfloat16',
                shape, layers, done))
    subprocess.run([sys.executable, '-c', code], check=True, env=tp.base_env())
    with open(done) as f:
        counts = json.load(f)
    counts['build_s'] = round(time.time() - t0, 1)
    return counts


# ---- variants -----------------------------------------------------------------------------------------------------
def vora_command(args, b: Dict[str, Any], model: str, ann: str, out: str, flagship: bool,
                 extra: Optional[List[str]] = None, merge: bool = True) -> List[str]:
    # the card the call got (--hardware; the recipe plans for an H200, and `train` refuses another machine)
    hardware = [f'hardware={args.hardware}'] if getattr(args, 'hardware', None) else []
    overrides = [f'model.path={model}', 'model.type=qwen3_5_moe', *hardware, f'data.dataset={ann}',
                 f'data.window={b["clip_s"]:g}', f'data.stride={b["clip_s"]:g}', 'data.min_event=0.5',
                 f'video.fps={b["fps"]:g}', f'video.max_frames={b["max_frames"]}',
                 f'video.pair_tokens={b["pair_tokens"]}', f'video.min_pair_tokens={b["min_pair_tokens"]}',
                 f'train.lora_rank={LORA_RANK}', f'train.lora_alpha={LORA_ALPHA}',
                 f'train.max_steps={max(args.steps, args.profile_step or 0)}',
                 f'train.grad_accum={args.grad_accum}', f'train.save_steps={args.steps}', 'train.logging_steps=1',
                 # no warm-up, as the plain side (ms-swift's default): every step updates, the lora_update check
                 # counts from the first, and both sides run the same schedule
                 'train.warmup_ratio=0', f'train.output_dir={out}',
                 f'unsloth.save_merged={"true" if flagship and merge else "false"}',
                 *(extra or [])]
    if args.smoke:  # CPU: the runner itself, transformers + PEFT standing in for Unsloth's loader
        overrides += ['train.dtype=float32', 'unsloth.gradient_checkpointing=false']
        return [sys.executable, '-m', 'swift_vora.backends.unsloth_runner', RECIPE, *overrides, '--loader', 'peft']
    return [sys.executable, '-m', 'swift_vora', 'train', RECIPE, *overrides]


def swift_command(args, b: Dict[str, Any], model: str, rows: str, out: str, tuner_backend: str,
                  targets: List[str], parameters: List[str]) -> List[str]:
    cmd = tp.swift_cmd() + [
        'sft', '--custom_register_path', os.path.relpath(os.path.join(REPO, 'benchmarks', 'throughput.py'), REPO),
        '--model', model, '--model_type', 'qwen3_5_moe', '--template', 'qwen3_5', '--dataset', rows,
        '--tuner_type', 'lora',
        '--tuner_backend', tuner_backend, '--target_modules', *targets, '--lora_rank', str(LORA_RANK),
        '--lora_alpha', str(LORA_ALPHA), '--lora_dropout', '0', '--attn_impl', 'sdpa',
        '--per_device_train_batch_size', '1', '--gradient_accumulation_steps', str(args.grad_accum),
        '--max_steps', str(args.steps), '--learning_rate', '1e-4', '--logging_steps', '1', '--save_strategy', 'no',
        '--split_dataset_ratio', '0', '--eval_strategy', 'no', '--report_to', 'none', '--output_dir', out,
        '--add_version', 'false', '--check_model', 'false', '--callbacks', tp.CALLBACK_NAME, '--dataset_num_proc', '1',
        '--seed', '42', '--max_length', '12288', '--gradient_checkpointing', 'true',
        '--vit_gradient_checkpointing', 'false', '--dataloader_num_workers', str(args.workers)]
    if parameters:
        cmd += ['--target_parameters', *parameters]
    if args.workers > 0:
        cmd += ['--dataloader_persistent_workers', 'true']
    if args.smoke:
        cmd += ['--torch_dtype', 'float32', '--fp16', 'false', '--bf16', 'false']
    else:
        cmd += ['--torch_dtype', 'bfloat16']
    return cmd


def swift_budget_env(b: Dict[str, Any]) -> Dict[str, str]:
    """ms-swift's own budget variables: the same frames and per-pair token cap as the video_ora budget."""
    return {'FPS': f'{b["fps"]:g}', 'FPS_MAX_FRAMES': str(b['max_frames']), 'FPS_MIN_FRAMES': '4',
            'VIDEO_MAX_TOKEN_NUM': str(b['pair_tokens']), 'VIDEO_MIN_TOKEN_NUM': str(b['min_pair_tokens'])}


def run_vora(name: str, args, b, inputs, work: str, flagship: bool, fla: bool,
             extra_env: Optional[Dict[str, str]] = None, extra_overrides: Optional[List[str]] = None,
             measured: Optional[Callable[[Dict[str, Any]], None]] = None) -> Dict[str, Any]:
    """One swift-vora variant; `measured(result)` is called with its speed before the flagship's checks (minutes at
    full depth), so that a call cut short during them still returns the measurement."""
    # the flagship writes where its merged copy has room (--flagship-work: beside the checkpoint, on its filesystem)
    vdir = os.path.join(args.flagship_work or work if flagship else work, name)
    shutil.rmtree(vdir, ignore_errors=True)
    os.makedirs(os.path.dirname(vdir), exist_ok=True)
    out = os.path.join(vdir, 'output')
    room = flagship_room(inputs['model'], os.path.dirname(vdir), args.spill_dir) if flagship else None
    cmd = vora_command(args, b, inputs['model'], inputs['annotations'], out, flagship, extra_overrides or [],
                       merge=bool(room and room['fits']))
    env = {'PYTORCH_CUDA_ALLOC_CONF': 'expandable_segments:True', 'SWIFT_VORA_LOG_FIRST': '1', **(extra_env or {})}
    if not flagship:  # speed runs: the adapter reload (a second model load) is the flagship's
        env['SWIFT_VORA_GUARD_VERIFY_ADAPTER'] = 'off'
    if args.profile_step:  # torch.profiler over that step (backends/step_profile.py); not a measured step
        env['SWIFT_VORA_PROFILE_STEP'] = str(args.profile_step)
    full_env = tp.base_env(env)
    if fla:
        if not args.fla_path:
            raise SystemExit(f'{name}: --fla-path (a folder holding flash-linear-attention) is not set')
        full_env['PYTHONPATH'] = os.pathsep.join([full_env['PYTHONPATH'], args.fla_path])
    log_path = os.path.join(vdir, 'train.log')
    t0 = time.time()
    proc = tp.run_logged(cmd, log_path, full_env, timeout=args.variant_timeout)
    if args.spy_after:  # where the first step spends its time when it is slow (compile? autotune? the model?)
        spy_when_slow(proc, args.spy_after, os.path.join(vdir, 'py-spy-dump.txt'), log_path, FIRST_STEP_MARK,
                      FIRST_STEP_DONE)
    rc = tp.wait_logged(proc, f'swift-vora train ({name})', log_path,
                        measured=lambda: runner_steps(out, args) >= args.steps)
    result = summarize_runner(name, out, args, tp.cmdline(cmd, env), time.time() - t0)
    if rc == 'timeout':
        result['exit'] = tp.KILLED_AFTER_MEASURING
    if args.profile_step:
        result['profile'] = profile_summary(os.path.join(out, 'torch_profile.json'))
    if flagship:
        if measured is not None:
            measured({**result, 'flagship': 'checks running (merge_for_vllm.sh and its expert check)'})
        result['flagship'] = flagship_checks(out, inputs['model'], vdir, room)
    return result


def flagship_room(model: str, where: str, spill_dir: Optional[str]) -> Dict[str, Any]:
    """Room for the flagship's one merged copy in `where` (merge_room.room): the runner writes it there and
    merge_for_vllm.sh hard-links its weight files beside it. With `spill_dir` (--spill-dir), base shards move there
    first where that makes the room (merge_room.make_room: at full depth on the lent H200 the base fills a tmpfs and
    the disk is smaller than one copy; the two together hold both)."""
    if not spill_dir:
        return merge_room.room(model, where)
    spill = merge_room.make_room(model, where, spill_dir)
    return {**spill.pop('room'), 'spill': spill}


FIRST_STEP_MARK = 'first step: Triton compiles'  # the runner's line as its first step starts (on a GPU)
FIRST_STEP_DONE = 'first step took'  # ... and as it ends


def spy_when_slow(proc, after: float, path: str, log_path: Optional[str] = None, start_mark: Optional[str] = None,
                  done_mark: Optional[str] = None) -> None:
    """If the variant is still in its first step `after` seconds after it began (the log shows `start_mark` and not
    yet `done_mark`; without marks: `after` seconds after the start), write py-spy's stack dump of its processes."""
    def log_has(mark: str) -> bool:
        with open(log_path, errors='replace') as f:
            return mark in f.read()

    if start_mark and log_path:
        while not log_has(start_mark):
            if proc.poll() is not None:
                return
            time.sleep(2)
    deadline = time.time() + after
    while time.time() < deadline:
        if proc.poll() is not None:
            return
        time.sleep(2)
    if done_mark and log_path and log_has(done_mark):
        return
    spy = find_py_spy()
    if not spy:
        with open(path, 'w') as f:
            f.write('py-spy: not found on PATH nor next to the interpreter or the site folders\n')
        return
    pids = subprocess.run(['pgrep', '-g', str(proc.pid)], capture_output=True, text=True).stdout.split()
    with open(path, 'w') as f:
        for pid in pids:
            dump = subprocess.run([spy, 'dump', '--pid', pid], capture_output=True, text=True, timeout=60)
            f.write(f'==== pid {pid}\n{dump.stdout}{dump.stderr}\n')


def find_py_spy() -> Optional[str]:
    """py-spy on PATH, else next to this interpreter or in a `bin/` beside a sys.path entry (pip --target)."""
    found = shutil.which('py-spy')
    if found:
        return found
    dirs = [os.path.dirname(sys.executable)] + [os.path.join(p, 'bin') for p in sys.path if p]
    for d in dirs:
        candidate = os.path.join(d, 'py-spy')
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def profile_summary(path: str) -> Optional[Dict[str, Any]]:
    """torch_profile.json (the runner's profiled step) -> wall, device busy share and GPU time per family."""
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        data = json.load(f)
    by_family: Dict[str, float] = {}
    for event in data['events']:
        if not event['kernel'] or event['device_us'] <= 0:
            continue
        family = step_timeline.kernel_family(event['name'])
        by_family[family] = by_family.get(family, 0.0) + event['device_us']
    total = sum(by_family.values()) or 1.0
    return {'step': data['step'], 'wall_s': data['wall_s'], 'device_kernel_s': data['device_kernel_s'],
            'device_busy_fraction': data['device_busy_fraction'],
            'gpu_time_by_family': {k: {'s': round(v / 1e6, 3), 'fraction': round(v / total, 4)}
                                   for k, v in sorted(by_family.items(), key=lambda kv: -kv[1])},
            'top_kernels': [{'name': e['name'][:100], 'ms': round(e['device_us'] / 1e3, 2), 'calls': e['calls']}
                            for e in data['events'] if e['kernel']][:15],
            'cuda_runtime': data.get('cuda_runtime'), 'syncs': data.get('syncs')}


def run_swift(name: str, args, b, inputs, work: str, tuner_backend: str, targets, parameters) -> Dict[str, Any]:
    vdir = os.path.join(work, name)
    shutil.rmtree(vdir, ignore_errors=True)
    os.makedirs(vdir)
    env = {**swift_budget_env(b), tp.BENCH_DIR_ENV: vdir, 'PYTORCH_CUDA_ALLOC_CONF': 'expandable_segments:True'}
    if tuner_backend == 'unsloth':
        env.update({'UNSLOTH_DISABLE_STATISTICS': '1', 'UNSLOTH_COMPILE_LOCATION': os.path.join(vdir, 'unsloth_cache')})
    cmd = swift_command(args, b, inputs['model'], inputs['rows'], os.path.join(vdir, 'output'), tuner_backend,
                        targets, parameters)
    log_path = os.path.join(vdir, 'sft.log')
    t0 = time.time()
    proc = tp.run_logged(cmd, log_path, tp.base_env(env), timeout=args.variant_timeout)
    rc = tp.wait_logged(proc, f'swift sft ({name})', log_path, measured=lambda: tp.progress_steps(vdir) >= args.steps)
    result = tp.summarize_variant(name, vdir, args, tp.cmdline(cmd, env), time.time() - t0, None)
    if rc == 'timeout':
        result['exit'] = tp.KILLED_AFTER_MEASURING
    result['samples_per_s_mean'] = result.pop('samples_per_s', None)
    result['tokens_per_s_mean'] = result.pop('tokens_per_s', None)
    result.update(swift_step_stats(vdir, args, tp.real_tokens(result)))
    result['lora'] = swift_lora_counts(log_path)
    return result


def swift_lora_counts(log_path: str) -> Dict[str, Any]:
    """What swift's own log says was trained (its 'trainable params' line) -- a check that targets matched."""
    found: Dict[str, Any] = {}
    with open(log_path, errors='replace') as f:
        for line in f:
            if 'model_parameter_info' in line and 'Trainable' in line:  # swift's own count after PEFT wrapped
                found['trainable_params_line'] = line.strip()[-200:]
    return found


def runner_steps(out: str, args) -> int:
    """How many measured-or-warm-up steps the runner logged (train_log.jsonl; a profiled step does not count)."""
    rows = tp.read_jsonl(os.path.join(out, 'train_log.jsonl'))
    return sum(1 for r in rows if not args.profile_step or r.get('step', 0) < args.profile_step)


def summarize_runner(name: str, out: str, args, command: Optional[str], wall: Optional[float]) -> Dict[str, Any]:
    """The runner's train_log.jsonl (CUDA-synchronised step times, tokens, data wait, peaks) -> the same keys as
    throughput.summarize_variant."""
    steps = tp.read_jsonl(os.path.join(out, 'train_log.jsonl'))
    if args.profile_step:  # the profiled step runs slower: it and the ones after it are not measured
        steps = [r for r in steps if r['step'] < args.profile_step]
    if len(steps) <= args.warmup_steps:
        raise SystemExit(f'{name}: only {len(steps)} steps logged (warm-up {args.warmup_steps}); see its train.log')
    first, last = steps[args.warmup_steps - 1] if args.warmup_steps else None, steps[-1]
    base = first or {'seconds': 0.0, 'samples': 0, 'tokens': 0, 'data_wait_s': 0.0}
    seconds = last['seconds'] - base['seconds']
    samples = last['samples'] - base['samples']
    tokens = last['tokens'] - base['tokens']
    encode = tp.read_jsonl(os.path.join(out, 'encode_log.jsonl'))
    result_path = os.path.join(out, 'unsloth_run_result.json')
    run = json.load(open(result_path)) if os.path.isfile(result_path) else {}
    ends = [r['seconds'] for r in steps]

    def per_step(key: str) -> List[float]:  # the measured steps' own amounts (the log's are running totals)
        totals = [r[key] for r in steps]
        return [b - a for a, b in zip([0] + totals, totals)][args.warmup_steps:]

    stats = step_stats(per_step('seconds'), per_step('tokens'), per_step('samples'))
    first_step = run.get('first_step') or {}
    return {**stats,
        'first_step_s': first_step.get('first_step_s', round(ends[0], 2)),
        'first_step': first_step or None,
        'startup_s': run.get('startup_s'), 'load_s': run.get('load_s'),
        'micro_batch': steps[0]['samples'] // max(1, args.grad_accum),
        'samples_per_s_mean': round(samples / seconds, 4) if seconds > 0 else None,
        'tokens_per_s_mean': round(tokens / seconds, 1) if seconds > 0 else None,
        'variant': name, 'command': command, 'samples_measured': samples, 'seconds_measured': round(seconds, 3),
        'warmup_steps': args.warmup_steps, 'steps': len(steps), 'grad_accum': args.grad_accum,
        'data_wait_s_measured': round(last['data_wait_s'] - base['data_wait_s'], 3),
        'data_wait_fraction': round((last['data_wait_s'] - base['data_wait_s']) / seconds, 4) if seconds else None,
        'peak_allocated_gib': last.get('max_memory_allocated_gib'), 'peak_reserved_gib': last.get(
            'max_memory_reserved_gib'),
        'tokens_per_sample': tp._mean([r['total_tokens'] for r in encode]),
        'video_tokens_per_sample': tp._mean([r['video_tokens'] for r in encode]),
        'supervised_tokens_per_sample': tp._mean([r['supervised_tokens'] for r in encode]),
        'video_grid_thw': encode[0]['video_grid_thw'][0] if encode and encode[0].get('video_grid_thw') else None,
        'losses': [r['loss'] for r in steps], 'wall_s': round(wall, 1) if wall is not None else None,
        'runner': {k: run.get(k) for k in ('loader', 'split_lora', 'moe_backend', 'lora_tensors', 'expert_lora_tensors',
                                           'trainable_params', 'linear_attention_kernel', 'autocast',
                                           'encode_threads', 'moe_lora_scale', 'moe_gather', 'moe_router',
                                           'moe_gate_grad', 'gdn_qk_heads', 'optimizer', 'wrapped_in_ddp',
                                           'step_sync', 'step_clock', 'steps_left_in_flight', 'vision_preamble')},
        'planned': read_plan(out),
    }


def step_stats(seconds: List[float], tokens: List[float], samples: List[float]) -> Dict[str, Any]:
    """The measured steps' times, their median and mean, and the headline rates on the median step: one slow step
    (a 5 s step among 1 s ones was seen on the H200) moves the mean, not the median."""
    if not seconds:
        return {}
    median = statistics.median(seconds)
    per_step_tokens, per_step_samples = statistics.mean(tokens), statistics.mean(samples)
    return {'step_s': [round(x, 3) for x in seconds], 'median_step_s': round(median, 3),
            'mean_step_s': round(statistics.mean(seconds), 3), 'min_step_s': round(min(seconds), 3),
            'max_step_s': round(max(seconds), 3), 'samples_per_step': per_step_samples,
            'tokens_per_s': round(per_step_tokens / median, 1) if median > 0 else None,
            'samples_per_s': round(per_step_samples / median, 4) if median > 0 else None}


def swift_step_stats(vdir: str, args, tokens_per_sample: Optional[float]) -> Dict[str, Any]:
    """step_stats for a plain `swift sft` variant, from throughput.py's progress.jsonl (CUDA-synchronised step ends)."""
    progress = tp.read_jsonl(os.path.join(vdir, 'progress.jsonl'))
    begin = next((r for r in progress if r.get('event') == 'begin'), None)
    steps = [r for r in progress if r.get('event') == 'step'][:args.steps]
    if not begin or not steps:
        return {}
    ends = [r['t'] for r in steps]
    seconds = [b - a for a, b in zip([begin['t']] + ends, ends)]
    samples = [b['samples'] - a['samples'] for a, b in zip([{'samples': 0}] + steps, steps)]
    stats = step_stats(seconds[args.warmup_steps:], [n * (tokens_per_sample or 0) for n in samples][
        args.warmup_steps:], samples[args.warmup_steps:])
    stats['first_step_s'] = round(seconds[0], 2)
    return stats


def read_plan(out: str) -> Optional[Dict[str, Any]]:
    """The planner's prediction `swift-vora train` recorded before launching (swift-vora-launch/launch.json)."""
    path = os.path.join(out, 'swift-vora-launch', 'launch.json')
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        plan = json.load(f).get('plan') or {}
    steady = (plan.get('phases') or {}).get('steady') or {}
    return {**{k: plan.get(k) for k in ('backend', 'verdict', 'gpu_peak_gib', 'host_peak_gib')},
            'gpu_reserved_gib': steady.get('gpu_reserved_gib'), 'gpu_allocated_gib': steady.get('gpu_allocated_gib')}


def flagship_checks(out: str, model: str, vdir: str, room: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The guards' report files, then scripts/merge_for_vllm.sh on the saved adapter (with its expert check) when
    `room` (merge_room) says a merged copy fits."""
    report: Dict[str, Any] = {'merge_room': room}
    for name in ('lora_update.json', 'verify_adapter.json', 'supervision.rank0.json', 'fingerprint.json'):
        path = os.path.join(out, name)
        report[name] = os.path.isfile(path)
    with open(os.path.join(out, 'lora_update.json')) as f:
        report['lora_update'] = {k: v for k, v in json.load(f).items() if k != 'not_updated'}
    with open(os.path.join(out, 'verify_adapter.json')) as f:
        v = json.load(f)
    report['verify_adapter'] = {k: v.get(k) for k in ('ok', 'matched', 'tensors', 'exit_code')}
    ckpts = sorted((d for d in os.listdir(out) if d.startswith('checkpoint-') and not d.endswith('-merged')),
                   key=lambda d: int(d.split('-')[1]))
    if room is not None and not room['fits']:
        report['merge_skipped'] = (f'a merged 16-bit copy needs {room["needs_gib"]} GiB (the runner\'s export; '
                                   f'merge_for_vllm.sh links its files): {room.get("why_not") or "no room"}')
        return report
    merged = os.path.join(vdir, 'merged')
    proc = subprocess.run(['bash', os.path.join(REPO, 'scripts', 'merge_for_vllm.sh'), os.path.join(out, ckpts[-1]),
                           merged, '--base', model], capture_output=True, text=True, env=tp.base_env())
    with open(os.path.join(vdir, 'merge.log'), 'w') as f:
        f.write(proc.stdout + proc.stderr)
    report['merge_exit_code'] = proc.returncode
    check = os.path.join(merged, 'swift_vora_merge_check.json')
    if os.path.isfile(check):
        with open(check) as f:
            report['merge_check'] = json.load(f)
    shutil.rmtree(merged, ignore_errors=True)  # links to the runner's export (a copy where they could not be)
    # the export itself once checked: at full depth 65 GiB, in RAM where it sits on the checkpoint's tmpfs, which a
    # later call on the same machine needs for its own processes (the logs archive leaves checkpoints out anyway)
    export = os.path.join(out, ckpts[-1] + '-merged')
    report['merged_export_removed'] = os.path.isdir(export)
    shutil.rmtree(export, ignore_errors=True)
    return report


# ---- FLOPs --------------------------------------------------------------------------------------------------------
def flops_per_sample(config: Dict[str, Any], counts: Dict[str, int], tokens: float, video_tokens: float,
                     supervised: float, grid) -> Dict[str, float]:
    """Useful model FLOPs of one sample over the ACTIVE parameters (module docstring)."""
    text = config['text_config']
    h, vocab = text['hidden_size'], text['vocab_size']
    experts, k = text['num_experts'], text['num_experts_per_tok']
    embed_and_head = 2 * vocab * h  # untied: embed_tokens and lm_head, both outside the per-token matmuls
    active_language = counts['language'] - counts['experts'] * (1 - k / experts) - embed_and_head
    full_layers = sum(1 for t in text['layer_types'] if t == 'full_attention')
    d_attn = text['num_attention_heads'] * text['head_dim']
    lora_active = lora_params_active(text)
    t_groups, gh, gw = grid
    patches = t_groups * gh * gw
    parts = {
        'llm_matmul': 4 * active_language * tokens,
        'lora': 6 * lora_active * tokens,
        'llm_attention': 6 * full_layers * tokens ** 2 * d_attn,
        'vision': 2 * counts['vision'] * patches,
        'lm_head': 4 * vocab * h * supervised,
    }
    parts['total'] = sum(parts.values())
    parts['active_params'] = active_language + embed_and_head / 2 + counts['vision']
    return parts


def lora_params_active(text: Dict[str, Any]) -> int:
    """LoRA parameters a token passes through: every targeted linear of its layer, and its k routed experts'."""
    r, h = LORA_RANK, text['hidden_size']
    heads, kv, hd = text['num_attention_heads'], text['num_key_value_heads'], text['head_dim']
    kdim = text['linear_num_key_heads'] * text['linear_key_head_dim']
    vdim = text['linear_num_value_heads'] * text['linear_value_head_dim']
    full = r * (h + 2 * heads * hd) + 2 * r * (h + kv * hd) + r * (heads * hd + h)  # q (gated: 2x), k, v, o
    linear = r * (h + 2 * kdim + vdim) + r * (h + vdim) + r * (vdim + h)  # in_proj_qkv, in_proj_z, out_proj
    shared = 3 * r * (h + text['shared_expert_intermediate_size'])
    routed = text['num_experts_per_tok'] * r * ((h + 2 * text['moe_intermediate_size']) + (text[
        'moe_intermediate_size'] + h))
    n = 0
    for kind in text['layer_types']:
        n += (full if kind == 'full_attention' else linear) + shared + routed
    return n


# ---- swift-vora variants -----------------------------------------------------------------------------------------
FLAGSHIP = 'vora_unsloth'  # the recipe as shipped; --flagship adds every guard, the merged export and its check


class VoraVariant(NamedTuple):
    env: Dict[str, str]  # switches on top of the runner's defaults
    overrides: List[str]  # recipe overrides after the common ones (vora_command)
    fla: bool = False  # an installed flash-linear-attention on the path (--fla-path)


def vora_variant(name: str) -> Optional[VoraVariant]:
    """A swift-vora variant's switches and recipe overrides (None: not a swift-vora variant). One table for the run
    and for --dry-run."""
    fixed = {'vora_unsloth': VoraVariant({}, []), 'vora_unsloth_fla': VoraVariant({}, [], fla=True),
             # = vora_unsloth since the runner turns the block compile off
             'vora_unsloth_nocompile': VoraVariant({'UNSLOTH_BLOCK_COMPILE': '0'}, []),
             # Unsloth's own default: each decoder block compiled
             'vora_unsloth_compile': VoraVariant({'UNSLOTH_BLOCK_COMPILE': '1'}, []),
             # the Gated DeltaNet kernel plain swift runs: the PyTorch reference
             'vora_unsloth_torchgdn': VoraVariant({'UNSLOTH_DISABLE_VENDORED_FLA': '1'}, []),
             # checkpoints kept on the GPU instead of Unsloth's host offload
             'vora_unsloth_gpu_ckpt': VoraVariant({}, ['unsloth.gradient_checkpointing=true']),
             # Unsloth's offloaded checkpointing forced (the planner's fallback)
             'vora_unsloth_offload': VoraVariant({}, ['unsloth.gradient_checkpointing=unsloth'])}
    if name in fixed:
        return fixed[name]
    if name in TORCHRUN_VARIANTS:  # the twin's switches and overrides, under torchrun
        twin, processes = TORCHRUN_VARIANTS[name]
        base = vora_variant(twin)
        return VoraVariant({**base.env, 'NPROC_PER_NODE': str(processes)}, base.overrides, base.fla)
    if name in MICRO_BATCH_VARIANTS:  # more samples (tokens per expert GEMM) per micro-batch
        return VoraVariant({}, [f'train.micro_batch={MICRO_BATCH_VARIANTS[name]}'])
    if name in MOE_BACKEND_VARIANTS:
        micro_batch, moe_backend = MOE_BACKEND_VARIANTS[name]
        return VoraVariant({'UNSLOTH_MOE_BACKEND': moe_backend}, [f'train.micro_batch={micro_batch}'])
    if name in ENCODE_THREADS_VARIANTS:
        micro_batch, threads = ENCODE_THREADS_VARIANTS[name]
        return VoraVariant({}, [f'train.micro_batch={micro_batch}', f'unsloth.encode_threads={threads}'])
    if name in AUTOCAST_OFF_VARIANTS:
        return VoraVariant({}, [f'train.micro_batch={AUTOCAST_OFF_VARIANTS[name]}', 'unsloth.autocast=false'])
    if name in CHECKPOINT_LAYERS_VARIANTS:
        micro_batch, checkpointed = CHECKPOINT_LAYERS_VARIANTS[name]
        return VoraVariant({}, [f'train.micro_batch={micro_batch}', 'unsloth.gradient_checkpointing=true',
                                f'train.checkpoint_layers={checkpointed}'])
    if name in RANK_SCALE_VARIANTS or name in LEVERS_ON_RANK_SCALE:
        base, lever_env = LEVERS_ON_RANK_SCALE.get(name, (name, {}))
        micro_batch, checkpointed = RANK_SCALE_VARIANTS[base]
        # exactly its twin's overrides (the micro-batch variant's, or the checkpoint-layers variant's) + the switch,
        # so that the twin comparison measures the lever alone
        layers = ['unsloth.gradient_checkpointing=true', f'train.checkpoint_layers={checkpointed}'] \
            if checkpointed else []
        return VoraVariant({'SWIFT_VORA_MOE_LORA_SCALE': 'rank', **lever_env},
                           [f'train.micro_batch={micro_batch}', *RANK_SCALE_VIDEO.get(base, []), *layers])
    return None


CONFIG_35B_A3B = os.path.join(REPO, 'tests', 'fixtures', 'configs', 'qwen3_5_moe_35b_a3b.json')


def cut_config(config: str, layers: int, out_dir: str) -> str:
    """The 35B-A3B config.json with `layers` decoder layers (the 3:1 pattern kept), as build_model builds it: what
    the planner reads for a dry run (no weights)."""
    with open(config) as f:
        data = json.load(f)
    text = data['text_config']
    text['num_hidden_layers'] = layers
    text['layer_types'] = text['layer_types'][:layers]
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, 'config.json')
    with open(path, 'w') as f:
        json.dump(data, f)
    return path


def dry_run(args, gpu_gib: Optional[float] = None) -> int:
    """Each swift-vora variant of --variants as a device call would launch it, planned on the CPU by `swift-vora
    train --dry-run --json`: its backend, verdict and planned peak, its switches (each read as the runner will read
    it) and overrides. A recipe override that is refused, a switch value that does not exist or a plan that does not
    fit is found here, not on the GPU. Plain swift variants are listed, not planned. With `gpu_gib` (--gpu-gib, or
    the card a GPU run found), a plan whose peak exceeds that card is refused too: the recipe plans for an H200, and
    a call that lands on an H100 would otherwise spend its first minute building a 65 GiB checkpoint on a 79 GiB
    card and die in the build (call s, 2026-12-05)."""
    from swift_vora import switches
    b = budget(False)
    model = args.model_dir or cut_config(CONFIG_35B_A3B, args.layers, os.path.join(
        args.work or tempfile.gettempdir(), 'moe_throughput_dry_run'))
    failed = 0
    for name in [v for v in args.variants.split(',') if v]:
        variant = vora_variant(name)
        if variant is None:
            print(f'== {name}: ' + ('plain swift sft (not planned by swift-vora)' if name.startswith('swift_')
                                    else 'unknown variant'))
            failed += not name.startswith('swift_')
            continue
        try:
            for key, value in variant.env.items():
                if key.startswith(switches.PREFIX):
                    switches.read(key, {key: value})
        except switches.SwitchError as error:
            failed += 1
            print(f'== {name}: {error}')
            continue
        flagship = args.flagship and name == args.flagship_variant
        out = os.path.join(tempfile.gettempdir(), name, 'output')
        cmd = vora_command(args, b, model, 'data/train.jsonl', out, flagship, variant.overrides)
        cmd += ['--dry-run', '--json', '--trust-recipe-hardware']
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=tp.base_env(variant.env))
        done = json.loads(proc.stdout) if proc.stdout.strip().startswith('{') else {}
        plan = done.get('plan')
        # planned here, launched on the GPU machine: that this CPU lacks the checkpoint's weights and the clips (the
        # dry run's `not_launched`, its exit code) is expected; a refused override or switch leaves no plan
        if not plan or plan.get('verdict') != 'fits' or (proc.returncode != 0 and not done.get('not_launched')):
            failed += 1
            print(f'== {name}: refused (rc {proc.returncode}): ' + (' '.join(plan.get('reasons', [])[:2]) if plan
                                                                  else proc.stderr[-1500:]))
            continue
        if gpu_gib is not None and plan['gpu_peak_gib'] > gpu_gib:
            failed += 1
            print(f'== {name}: refused: planned peak {plan["gpu_peak_gib"]} GiB does not fit this {gpu_gib:g} GiB '
                  f'card (the recipe plans for {plan.get("hardware", {}).get("name", "its own hardware")}); nothing '
                  'was built')
            continue
        notes = (json.loads(proc.stdout).get('launch') or {}).get('notes') or []
        torchrun = [note for note in notes if 'through torchrun' in note]
        if 'NPROC_PER_NODE' in variant.env and not torchrun:
            failed += 1
            print(f'== {name}: refused: NPROC_PER_NODE={variant.env["NPROC_PER_NODE"]} but the launch does not go '
                  f'through torchrun (notes: {notes})')
            continue
        print(f'== {name}: {plan["backend"]} {plan["verdict"]} {plan["gpu_peak_gib"]} GiB; '
              f'switches {json.dumps(variant.env, sort_keys=True)}; overrides {" ".join(variant.overrides)}'
              + ('; flagship' if flagship else '') + (f'; {torchrun[0]}' if torchrun else ''))
    return 1 if failed else 0


# ---- main ---------------------------------------------------------------------------------------------------------
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--smoke', action='store_true', help='CPU: tiny Qwen3.5-MoE, PEFT stand-in, 2 steps')
    parser.add_argument('--out', default=os.environ.get('OUT') or None)
    parser.add_argument('--work', default=None)
    parser.add_argument('--results-dir', default=os.path.join(REPO, 'benchmarks', 'results'))
    parser.add_argument('--name', default='moe-h200')
    parser.add_argument('--shape', default=None, help="'35b-a3b' (default) or 'tiny' (smoke)")
    parser.add_argument('--layers', type=int, default=None, help='decoder layers of the built model (default 8)')
    parser.add_argument('--model-dir', default=None, help='reuse a built checkpoint')
    parser.add_argument('--variants', default='vora_unsloth,swift_peft,swift_unsloth')
    parser.add_argument('--flagship', action='store_true',
                        help='the checked run (--flagship-variant) with every guard, the merged export and its check')
    parser.add_argument('--flagship-variant', default=FLAGSHIP, metavar='NAME',
                        help=f'the swift-vora variant --flagship checks (default {FLAGSHIP}, the recipe as shipped): '
                             'a lever setting run once with the speed and the checks')
    parser.add_argument('--dry-run', action='store_true',
                        help="CPU, no run: each swift-vora variant's plan (swift-vora train --dry-run) and switches, "
                             'for the 35B-A3B config cut to --layers (or --model-dir); exit 1 if any is refused')
    parser.add_argument('--flagship-work', default=None,
                        help="the flagship variant's folder (default --work): on the filesystem its merged copy "
                             'has room on (scripts/gpu/run_all.sh moe_full: the checkpoint\'s tmpfs)')
    parser.add_argument('--spill-dir', default=None,
                        help="a folder on another filesystem: base shards move there (links left in their place) "
                             "until the flagship's folder has room for a merged copy (benchmarks/merge_room.py)")
    parser.add_argument('--steps', type=int, default=None, help='optimizer steps per variant (default 12; smoke 2)')
    parser.add_argument('--grad-accum', type=int, default=None, help='micro-batches per step (default 1)')
    parser.add_argument('--warmup-steps', type=int, default=None, help='default 2 (smoke 1)')
    parser.add_argument('--workers', type=int, default=None, help='swift DataLoader workers (default 8; smoke 0)')
    parser.add_argument('--clips', type=int, default=None)
    parser.add_argument('--variant-timeout', type=float, default=None)
    parser.add_argument('--fla-path', default=tp.switch('SWIFT_VORA_FLA_PATH') or '',
                        help='PYTHONPATH entry holding flash-linear-attention (added by *_fla variants)')
    parser.add_argument('--hardware', default=None,
                        help='the planner\'s profile of the card this call runs on (h100x1 on an H100; default: the '
                             'recipe\'s own, h200x1)')
    parser.add_argument('--gpu-gib', type=float, default=None,
                        help='with --dry-run: also refuse a plan above a card of this many GiB (79.2: an H100)')
    parser.add_argument('--deadline', type=float, default=None, help='seconds: skip variants that would start later')
    parser.add_argument('--profile-step', type=int, default=None,
                        help='swift-vora variants: torch.profiler over that optimizer step (take it past --steps '
                             'measured ones: the run gets one more step)')
    parser.add_argument('--summarize-logs', metavar='VARIANT_DIR', nargs='+', default=None,
                        help="no run: the measured steps of swift-vora variants' kept logs (VARIANT_DIR/output/"
                             "train_log.jsonl, e.g. from a logs-moe_full.tgz), printed as a result file's variants; "
                             "with the run's --steps/--warmup-steps/--profile-step/--grad-accum")
    parser.add_argument('--spy-after', type=float, default=None,
                        help='seconds: py-spy stack dump of a swift-vora variant still running then (diagnosis)')
    args = parser.parse_args(argv)
    if args.flagship and args.flagship_variant not in args.variants.split(','):
        parser.error(f'--flagship checks {args.flagship_variant}, which --variants does not run '
                     '(add it, or name another with --flagship-variant)')
    if vora_variant(args.flagship_variant) is None:
        parser.error(f'--flagship-variant {args.flagship_variant}: not a swift-vora variant')
    smoke = args.smoke
    args.shape = args.shape or ('tiny' if smoke else '35b-a3b')
    args.layers = args.layers if args.layers is not None else (8 if args.shape == '35b-a3b' else None)
    args.steps = args.steps or (2 if smoke else 12)
    args.grad_accum = args.grad_accum or 1
    args.warmup_steps = args.warmup_steps if args.warmup_steps is not None else (1 if smoke else 2)
    args.workers = args.workers if args.workers is not None else (0 if smoke else 8)
    # summarize_variant (throughput.py) reads these
    args.torch_profile, args.sync_debug = [], []
    if args.dry_run:  # CPU: what a device call would launch, checked before it is sent
        return dry_run(args, args.gpu_gib)
    if args.summarize_logs:  # derived figures, from logs a run kept (its result file stays as written)
        variants = tp.summarize_kept_logs(args.summarize_logs, lambda name, vdir: summarize_runner(
            name, os.path.join(vdir, 'output'), args, None, None))
        return tp.print_derived('moe_throughput', argv, args, variants)
    t_start = time.time()
    work = args.work or os.path.join(tempfile.gettempdir(), 'swift_vora_moe')
    os.makedirs(work, exist_ok=True)
    b = budget(smoke)
    device = 'cuda' if tp.cuda_available() else 'cpu'
    if device == 'cuda' and not smoke:  # the plans against the card this call got, before a minute of building
        card_gib = tp.hardware().get('gpu_mem_gib')
        print(f'== preflight: each swift-vora variant planned against this {card_gib} GiB card', flush=True)
        if card_gib and dry_run(args, card_gib):
            print('== preflight refused: nothing built, nothing run (a variant above does not fit this card)',
                  flush=True)
            return 1
    model_dir = args.model_dir or os.path.join(work, 'model')
    counts = build_model(model_dir, args.shape, args.layers, device)
    n_samples = args.steps * args.grad_accum
    clips = tp.make_clips(os.path.join(work, 'clips'), args.clips or n_samples, b['clip_s'], b['source_fps'],
                          b['size'], workers=1 if smoke else min(16, os.cpu_count() or 1))
    inputs = {'model': model_dir, **tp.write_datasets(work, clips)}
    with open(os.path.join(model_dir, 'config.json')) as f:
        config = json.load(f)
    payload: Dict[str, Any] = {
        'benchmark': 'moe_throughput', 'date': tp.now_stamp(), 'machine': tp.hardware(),
        'command': ' '.join(['python', 'benchmarks/moe_throughput.py'] + list(argv if argv is not None else
                                                                               sys.argv[1:])),
        'model': {'config': '35B-A3B (Qwen3_5MoeConfig defaults + published merger width and M-RoPE)'
                  if counts.get('shape', args.shape) == '35b-a3b' else 'tiny',
                  'layers': config['text_config']['num_hidden_layers'],
                  'layer_types': config['text_config']['layer_types'], 'total_params': counts['total'],
                  'vision_params': counts['vision'], 'expert_params': counts['experts'],
                  'build_s': counts.get('build_s')},
        'lora': {'rank': LORA_RANK, 'alpha': LORA_ALPHA, 'target_modules': TARGET_MODULES,
                 'target_parameters': TARGET_PARAMETERS},
        'budget': {k: v for k, v in b.items() if k != 'size'} | {'clip_size': list(b['size'])},
        'steps': args.steps, 'grad_accum': args.grad_accum, 'warmup_steps': args.warmup_steps, 'variants': {},
    }
    if args.flagship:
        payload['flagship_variant'] = args.flagship_variant
    for name in [v for v in args.variants.split(',') if v]:
        if args.deadline and time.time() - t_start > args.deadline:
            payload['variants'][name] = {'skipped': f'deadline {args.deadline:.0f} s passed'}
            continue
        try:
            variant = vora_variant(name)
            if variant is not None:
                result = run_vora(name, args, b, inputs, work, flagship=args.flagship and name == args.flagship_variant,
                                  fla=variant.fla, extra_env=variant.env, extra_overrides=variant.overrides,
                                  measured=lambda so_far, name=name: write_partial(
                                      {**payload, 'variants': {**payload['variants'], name: so_far}}, config, counts,
                                      args.out or work, args.name))
            elif name == 'swift_peft':
                result = run_swift(name, args, b, inputs, work, 'peft', TARGET_MODULES, TARGET_PARAMETERS)
            elif name == 'swift_peft_attn':
                result = run_swift(name, args, b, inputs, work, 'peft', ATTENTION_TARGETS, [])
            elif name == 'swift_unsloth':
                result = run_swift(name, args, b, inputs, work, 'unsloth', TARGET_MODULES, TARGET_PARAMETERS)
            else:
                raise SystemExit(f'unknown variant {name!r}')
        except (SystemExit, subprocess.CalledProcessError, RuntimeError, OSError, KeyError, ValueError) as error:
            result = {'failed': str(error)[-3000:]}
        payload['variants'][name] = result
        print(f'== {name}: ' + json.dumps({k: result.get(k) for k in (
            'samples_per_s', 'tokens_per_s', 'median_step_s', 'mean_step_s', 'first_step_s', 'peak_reserved_gib',
            'data_wait_fraction', 'failed')}), flush=True)
        write_partial(payload, config, counts, args.out or work, args.name)
    headline(payload, config, counts)
    path = tp.write_results(payload, args.results_dir if not smoke else work, args.name, args.out)
    print(f'results: {path}')
    return 0


def write_partial(payload: Dict[str, Any], config: Dict[str, Any], counts: Dict[str, int], out: str,
                  name: str) -> None:
    """The results so far, after every variant (`NAME-partial.json`, overwritten): a call cut short by the device's
    time limit still returns what ran. The final file is written once, at the end, by write_results."""
    snapshot = json.loads(json.dumps(payload))
    headline(snapshot, config, counts)
    snapshot['partial'] = True
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f'{name}-partial.json'), 'w') as f:
        json.dump(snapshot, f, indent=2)
        f.write('\n')


def headline(payload: Dict[str, Any], config: Dict[str, Any], counts: Dict[str, int]) -> None:
    """MFU per variant; ours against the strongest plain-swift variant that reached the experts."""
    variants = payload['variants']
    for result in variants.values():
        grid = result.get('video_grid_thw')
        if grid and isinstance(grid[0], list):  # swift's encode log keeps one [t, h, w] per video
            result['video_grid_thw'] = grid = grid[0]
        if result.get('samples_per_s') and result.get('tokens_per_sample') and grid:
            f = flops_per_sample(config, counts, result['tokens_per_sample'], result['video_tokens_per_sample'] or 0,
                                 result['supervised_tokens_per_sample'] or 0, result['video_grid_thw'])
            result['flops_per_sample'] = round(f['total'])
            result['mfu'] = round(f['total'] * result['samples_per_s'] / tp.PEAK_BF16_FLOPS, 4)
            payload['model']['active_params'] = round(f['active_params'])
    first = next(iter(variants.values()), {})
    payload['tokens_per_sample'] = first.get('tokens_per_sample')
    payload['video_tokens_per_sample'] = first.get('video_tokens_per_sample')
    mine = {n: r for n, r in variants.items() if n.startswith('vora_unsloth') and r.get('tokens_per_s')}
    payload['swift_vora_variant'] = max(mine, key=lambda n: mine[n]['tokens_per_s']) if mine else None
    ours = mine.get(payload['swift_vora_variant']) or {}
    plain = {n: r for n, r in variants.items() if n in ('swift_peft', 'swift_unsloth') and r.get('tokens_per_s')}
    payload['baseline_variant'] = max(plain, key=lambda n: plain[n]['tokens_per_s']) if plain else None
    if ours.get('tokens_per_s') and payload['baseline_variant']:
        base = plain[payload['baseline_variant']]
        payload['speedup'] = round(ours['tokens_per_s'] / base['tokens_per_s'], 3)  # median steps
        if ours.get('tokens_per_s_mean') and base.get('tokens_per_s_mean'):
            payload['speedup_mean'] = round(ours['tokens_per_s_mean'] / base['tokens_per_s_mean'], 3)
        if ours.get('peak_reserved_gib') and base.get('peak_reserved_gib'):
            payload['memory_ratio'] = round(ours['peak_reserved_gib'] / base['peak_reserved_gib'], 3)
    # Like with like: ours on transformers' PyTorch Gated DeltaNet, the kernel plain swift runs here (fla 0.6
    # refuses its backward on Hopper with this Triton; unsloth_zoo's vendored fla steps the bad tile down).
    clean = variants.get('vora_unsloth_torchgdn') or {}
    if clean.get('tokens_per_s') and payload['baseline_variant']:
        payload['speedup_clean'] = round(clean['tokens_per_s'] / plain[payload['baseline_variant']]['tokens_per_s'], 3)
    payload['side_by_side'] = bool(ours.get('tokens_per_s') and payload['baseline_variant'])
    default = mine.get(DEFAULT_VARIANT) or {}
    if default and payload['baseline_variant']:
        payload['default_variant'] = DEFAULT_VARIANT
        payload['speedup_default'] = round(default['tokens_per_s'] / plain[payload['baseline_variant']]['tokens_per_s'],
                                           3)
    default_plan = default.get('planned') or {}
    if default_plan.get('gpu_reserved_gib') and default.get('peak_reserved_gib'):
        payload['plan_error_default'] = round(default['peak_reserved_gib'] / default_plan['gpu_reserved_gib'] - 1, 3)
    # The frozen bf16 weights both paths hold: the lowest memory ratio any bf16 LoRA could reach
    if payload['baseline_variant'] and plain[payload['baseline_variant']].get('peak_reserved_gib'):
        weights = counts['total'] * 2 / 2**30
        payload['weights_gib'] = round(weights, 2)
        payload['memory_ratio_floor'] = round(weights / plain[payload['baseline_variant']]['peak_reserved_gib'], 3)
        # What each path adds on top of the frozen weights both hold, ours over plain's
        if ours.get('peak_reserved_gib'):
            above = plain[payload['baseline_variant']]['peak_reserved_gib'] - weights
            payload['memory_above_weights_ratio'] = round((ours['peak_reserved_gib'] - weights) / above, 3) \
                if above > 0 else None
    # The planner's torch-reserved prediction against torch's measured reserved peak (docs/memory-model.md's
    # convention: its headline gpu_peak_gib adds the ~0.75 GiB CUDA context torch does not count).
    planned = ours.get('planned') or {}
    if planned.get('gpu_reserved_gib') and ours.get('peak_reserved_gib'):
        payload['planned_peak_gib'] = planned['gpu_peak_gib']
        payload['planned_reserved_gib'] = planned['gpu_reserved_gib']
        payload['plan_error'] = round(ours['peak_reserved_gib'] / planned['gpu_reserved_gib'] - 1, 3)
    if payload['model'].get('layers') == len(payload['model'].get('layer_types') or []) and \
            payload['model']['layers'] >= 40:  # the full 35B-A3B: issue #30's goals
        payload['goal_full_depth'] = GOAL_FULL
        payload['goal_full_depth_met'] = {
            'tokens_per_s': (ours.get('tokens_per_s') or 0) >= GOAL_FULL['tokens_per_s'],
            'mfu': (ours.get('mfu') or 0) >= GOAL_FULL['mfu'],
            'plan_error': payload.get('plan_error') is not None and abs(payload['plan_error']) <= GOAL_FULL[
                'plan_error']}
    # the data-parallel path on one GPU against the runner without torchrun (median steps, same call)
    for name, (twin, processes) in TORCHRUN_VARIANTS.items():
        dp, plain_run = variants.get(name) or {}, variants.get(twin) or {}
        if dp.get('tokens_per_s') and plain_run.get('tokens_per_s'):
            ratio = dp['tokens_per_s'] / plain_run['tokens_per_s']
            payload.setdefault('torchrun_overhead', {})[name] = {
                'twin': twin, 'processes': processes, 'tokens_per_s_ratio': round(ratio, 4),
                'median_step_s': [dp.get('median_step_s'), plain_run.get('median_step_s')],
                'goal': f'within {TORCHRUN_GOAL:.0%}', 'goal_met': ratio >= 1 - TORCHRUN_GOAL}
    payload['goal'] = GOAL
    payload['goal_met'] = {
        'speedup': payload.get('speedup') is not None and payload['speedup'] >= GOAL['speedup'],
        'memory_ratio': payload.get('memory_ratio') is not None and payload['memory_ratio'] <= GOAL['memory_ratio'],
        'plan_error': payload.get('plan_error') is not None and abs(payload['plan_error']) <= GOAL['plan_error'],
    }


if __name__ == '__main__':
    sys.exit(main())
