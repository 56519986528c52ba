"""Megatron-SWIFT LoRA on the Qwen3.5-MoE 35B-A3B shape (8 layers) on one H200, side by side with swift-vora's
Unsloth path and plain `swift sft` PEFT: same random checkpoint, same 64-frame clips as benchmarks/moe_throughput.py
(its builders and measurement are reused, not copied).

    python benchmarks/megatron_moe.py [--variants mg_mb4_te_ce_gmm_pao_glora_co,...] [--steps 12]  # GPU machine:
                                                                # scripts/gpu/run_all.sh megatron_moe
    python benchmarks/megatron_moe.py --dry-run --model-dir CONFIG_OR_DIR               # CPU: the commands only

Megatron variants: `swift-vora train recipes/h200x8.yaml` overridden to one H200 (hardware=h200x1, megatron.ep=1,
tp=1) on the built model -- the planner, then `megatron sft` LoRA (mcore-bridge, TE grouped experts, Gated DeltaNet
through the flash-linear-attention that swift_vora/backends/megatron_fla.py binds: unsloth_zoo's vendored copy on
Hopper with Triton < 3.7.1). Every Megatron variant trains `--global-batch` samples per optimizer step (default 4), at
micro-batch 1 unless its name says otherwise (whatever the recipe ships: each name keeps what it measured before):
- `mg_base`: the recipe's own levers (full recompute, grouped GEMM, permute fusion, native cross entropy) at
  micro-batch 1 -- the recipe as shipped until call g.
- `mg_mb2`: micro-batch 2, the recipe as shipped from call g to 2026-12-06 (the checked run until then).
- `mg_te_ce`: `megatron.cross_entropy_fusion_impl=te` (`--cross_entropy_fusion_impl te`: TE's fused cross entropy
  over the 248k vocabulary, planned with its own logits bytes).
- `mg_selective`, `mg_norecompute`: megatron.recompute=selective (Megatron's core_attn recompute) / none.
- `mg_no_grouped_gemm`, `mg_no_permute_fusion`: those two levers off.
- `mg_mb4`: micro-batch 4 (train.micro_batch; the same global batch); `mg_mb2_norecompute`,
  `mg_mb2_te_ce`: micro-batch 2 with no recompute / TE's cross entropy; `mg_mb2_eager`: micro-batch 2 with
  `TORCHDYNAMO_DISABLE=1` (megatron-core's torch.compile'd fusions run eagerly: what the first step spends compiling
  and what the steady steps lose without the fusions).
- the fix candidates, each one change against `mg_mb2`: `mg_mb2_workers8` (the data path: 8 DataLoader workers and
  `--dataloader_prefetch_factor 4`), `mg_mb2_cutlass` (Transformer Engine's CUTLASS grouped GEMM,
  NVTE_USE_CUTLASS_GROUPED_GEMM=1), `mg_mb2_cutlass_workers8` (both). The recipe sets CUTLASS itself since
  2026-12-06: from then `mg_mb2` is `mg_mb2_cutlass`, and `mg_mb2_nocutlass` (=0) the per-expert cuBLAS twin.
- `mg_mb2_cutlass_nofusion`: `mg_mb2_cutlass` with `--gradient_accumulation_fusion false` (extra_args): its twin
  without megatron-core's gradient accumulation fusion, what a machine without apex's fused_weight_gradient_mlp_cuda
  runs; the two in one call measure what the fusion buys (the launch notes which case the machine is in).
- `mg_mb2_cutlass_noprefetch`: `mg_mb2_cutlass` with SWIFT_VORA_MEGATRON_PREFETCH=off (Megatron-SWIFT's DataLoader,
  which stalls the first step of every epoch); `mg_mb2_cutlass_pao`: with `use_precision_aware_optimizer` (TE's
  FusedAdam keeps the master weights; no per-tensor copy into the bf16 weights); `mg_mb2_cutlass_glora`: with
  SWIFT_VORA_MEGATRON_EXPERT_LORA=grouped_mm (each expert LoRA factor one torch._grouped_mm, not a GEMM per expert);
  `mg_mb2_cutlass_gmm`: the factors and the frozen experts under them (SWIFT_VORA_MEGATRON_EXPERT_BASE=grouped_mm) as
  grouped GEMMs, no per-expert work on the host; `mg_mb2_cutlass_gmm_pao`: that with the precision-aware optimizer;
  `mg_mb4_te_ce`, `mg_mb4_te_ce_gmm`, `mg_mb4_te_ce_gmm_pao`: one micro-batch of 4 a step with TE's cross entropy
  (the host's per-micro-batch work once a step; fits an H100), alone and with those levers;
  `mg_mb4_te_ce_gmm_pao_glora` adds the expert LoRA factors as grouped GEMMs, `..._glora_co` the distributed
  optimizer over coalesced runs of the gradient buffers (SWIFT_VORA_MEGATRON_OPTIMIZER=coalesced): every Megatron
  setting recipes/h200x8.yaml ships, at its micro-batch. With `--flagship` (the default) it is also the checked run
  (FLAGSHIP, or `--flagship-variant`): merged checkpoint (checkpoint-N-merged), scripts/merge_for_vllm.sh's expert
  check, scripts/gpu/megatron_report.py's checks (loss falling, expert + attention LoRA, router untouched, merged
  loads in transformers, lora_update), the guard reports. A test holds it to the recipe's settings.
Full SFT (`mgf*`: `swift-vora train recipes/h200x8-full.yaml` overridden to one GPU, EP 1, `--full-lr`, the model
cut to `--layers`, 4 on an H200): `mgf` (the recipe: micro-batch 1, native cross entropy; the call's checked run --
scripts/gpu/megatron_report.py --full: the loss, checkpoint-N, the converted HF model, against the base by part, the
router trained, the vision tower identical, checkpoint-N loads in transformers, the guard's full-mode report),
`mgf_te_ce`, `mgf_freeze_router` (megatron.freeze_router=true), `mgf_mb2`, `mgf_cutlass`, `mgf_cutlass_pao` (the
precision-aware optimizer; 2 bytes of master weight a parameter instead of 4, not in the plan). Their checkpoints
(a whole model each) are deleted once the variant is summarized. A full-SFT call writes `megatron-h200-full-*.json`
(`--name`); its checked run is its first full variant (`mgf` where asked).
Others: `vora_unsloth_best` (swift-vora's Unsloth path in its best measured configuration: micro-batch 4, GPU-resident
checkpoints, `unsloth.gradient_checkpointing=true`), `swift_peft` (moe_throughput's plain `swift sft` PEFT).

Every Megatron variant records its data wait (SWIFT_VORA_PROFILE_STEP=0: swift_vora/backends/megatron_profile.py's
`vora_step_profile` callback, data_wait.rank0.jsonl): `data_wait_fraction` over the measured steps and
`slowest_over_median`. `--megatron-profile-step N` (N > --steps; `--profile-variants` to choose) also profiles step N
under torch.profiler (the variant then trains N steps; the checked run is never profiled): the trace is attributed by
benchmarks/megatron_step_profile.py into the variant's `profile` (and step_attribution.md in its folder), the
torch tables summarized as moe_throughput's profiles are, and the trace comes back beside the result
(`NAME-VARIANT-torch_trace.json.gz`) when it is at most 15 MiB.

Measured per variant (>= 10 measured steps: `--steps` 12, `--warmup-steps` 2): `tokens_per_s` = real tokens per
step / the median step, `median_step_s`, `mean_step_s`, `peak_reserved_gib`, `planned_peak_gib`, `plan_error`
(measured reserved peak / the plan's steady reserved - 1). Megatron's per-step times come from its logging.jsonl:
`train_speed(s/it)` is the running mean since the first step, so step k ends at k * mean_k; its peak is
`memory(GiB)` (torch.cuda.max_memory_reserved). Tokens per sample: the run's SWIFT_VORA_ENCODE_LOG.

Results: `megatron-h200-moe-<date>.json` (`--name`): the flagship's keys as in megatron-h200-2026-12-01.json
(backend, gpus, ep, tp, steps, losses, expert_lora_tensors, router_trainable, merged_loads, peak_reserved_gib,
planned_peak_gib, tokens_per_s, ...) plus `variants` and `backend_ratio` (the fastest Megatron variant against the
Unsloth one: what swift_vora/plan/backend_ratio.py's table records with `--record-ratio`). A partial file after every
variant (`NAME-partial.json`): a call cut short still returns what ran.

Expected wall time on the H200 (fresh machine, 8-layer checkpoint 16.4 GB): model 41 s, clips ~20 s, Gated
DeltaNet gradient check ~2.5 min (scripts/gpu/gdn_grad_check.py, run by the phase first; 143 s measured), per
Megatron variant ~2-3 min (load + convert ~60-90 s, first step ~60 s once the kernel cache is warm -- the first
attempt, without the shared cache, averaged 147 s over its first two steps -- then 12 steps),
the flagship +3 min (merged save, merge_for_vllm.sh's check, merged load), vora_unsloth_best ~5 min (its
first step autotunes ~225 s on a fresh machine), swift_peft ~2 min. The default list puts the side-by-side first
(the recipe's setting, vora_unsloth_best, swift_peft: ~12 min), then its per-tensor-optimizer twin and mg_base (no
lever); with `--deadline 840` the run ends within ~15-17 min. Run it through scripts/gpu/background.sh and wait
from back-to-back calls (docs/runs/gpu-calls.md lists the device calls that ran it).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import megatron_step_profile as msp  # noqa: E402  (the profiled step's attribution)
import moe_throughput as mt  # noqa: E402  (the model and clip builders, the Unsloth and swift PEFT variants)
import throughput as tp  # noqa: E402

REPO = tp.REPO
RECIPE = os.path.join(REPO, 'recipes', 'h200x8.yaml')
RECIPE_FULL = os.path.join(REPO, 'recipes', 'h200x8-full.yaml')
# Megatron variants: recipe overrides on top of the one-GPU base (MEGATRON_LEVERS[name]). The base trains at
# micro-batch 1 whatever the recipe ships (BASE_MICRO_BATCH): each name keeps the setting its calibration rows and
# predictions were made for (calls b-g: the recipe shipped micro-batch 1 then; it ships 2 since call g); a lever that
# sets the micro-batch says so in its name.
BASE_MICRO_BATCH = 'train.micro_batch=1'
# The same for the recipe's Megatron settings added after the first calls (2026-12-06: TE's cross entropy, the frozen
# experts as one grouped GEMM, the precision-aware optimizer; 2026-12-07: the expert LoRA factors as grouped GEMMs,
# the optimizer over coalesced runs): every variant starts from the settings before them, and a lever that sets one
# says so in its name (`mg_shipped`: the recipe's Megatron settings as shipped on 2026-12-06, at its EP 1 cut;
# `mg_mb4_te_ce_gmm_pao_glora_co` is what it ships since)
BASE_SETTINGS = ('megatron.cross_entropy_fusion_impl=native', 'env.SWIFT_VORA_MEGATRON_EXPERT_BASE=te',
                 'megatron.precision_aware_optimizer=false', 'env.SWIFT_VORA_MEGATRON_EXPERT_LORA=te',
                 'env.SWIFT_VORA_MEGATRON_OPTIMIZER=per_tensor')
MEGATRON_LEVERS: Dict[str, List[str]] = {
    'mg_base': [],
    'mg_te_ce': ['megatron.cross_entropy_fusion_impl=te'],  # the recipe key: the plan's logits term follows it
    'mg_selective': ['megatron.recompute=selective'],
    'mg_norecompute': ['megatron.recompute=none'],
    'mg_no_grouped_gemm': ['megatron.moe_grouped_gemm=false'],
    'mg_no_permute_fusion': ['megatron.moe_permute_fusion=false'],
    'mg_mb2': ['train.micro_batch=2'],
    'mg_mb4': ['train.micro_batch=4'],
    # micro-batch 2 (the fastest lever of call g) with the next ones: no recompute, TE's cross entropy
    'mg_mb2_norecompute': ['train.micro_batch=2', 'megatron.recompute=none'],
    'mg_mb2_te_ce': ['train.micro_batch=2', 'megatron.cross_entropy_fusion_impl=te'],
    # megatron-core compiles its fusions with torch.compile (megatron/core/jit.py: jit_fuser), among them Gated
    # DeltaNet's gated norm, whose TE RMSNorm dynamo cannot trace (call g's logs: a graph break in every GDN layer);
    # call g's first steps took 110-211 s. Dynamo off runs them eagerly: the first step, and the steady steps it costs
    'mg_mb2_eager': ['train.micro_batch=2', 'env.TORCHDYNAMO_DISABLE=1'],
    # shorter samples (32 frames: about half the tokens) for the memory fit of item 4: the per-token terms against
    # the fixed ones; with and without TE's cross entropy (the logits term)
    'mg_f32': ['video.max_frames=32'],
    'mg_f32_te_ce': ['video.max_frames=32', 'megatron.cross_entropy_fusion_impl=te'],
    # The fix candidates of the profile (issue 56), each against mg_mb2 in the same call. The data path: twice the
    # DataLoader workers and twice the prefetch depth (Megatron-SWIFT's --dataloader_prefetch_factor; its DataLoader
    # is the Unsloth runner's encode threads + prefetch; ms-swift 4.6 pre-encodes no multimodal sample -- its
    # cached_dataset keeps the rows and their lengths, and the template still encodes each sample in the workers).
    # The host: Transformer Engine 2.11's CUTLASS grouped GEMM on Hopper (NVTE_USE_CUTLASS_GROUPED_GEMM=1,
    # transformer_engine/common/gemm/cublaslt_gemm.cu nvte_multi_tensor_gemm: one kernel for all of a layer's experts
    # instead of one cuBLAS GEMM per expert over 4 streams; bf16 only, every group's K the same and a multiple of
    # 128 -- the base experts' forward and input gradient qualify, a rank-16 LoRA factor's GEMMs with K = 16 fall back
    # to cuBLAS)
    'mg_mb2_workers8': ['train.micro_batch=2', 'train.dataloader_workers=8', 'swift_args.dataloader_prefetch_factor=4'],
    'mg_mb2_cutlass': ['train.micro_batch=2', 'env.NVTE_USE_CUTLASS_GROUPED_GEMM=1'],
    # recipes/h200x8.yaml sets NVTE_USE_CUTLASS_GROUPED_GEMM=1 in its env since 2026-12-06 (after the measurements
    # above), so `mg_mb2` runs CUTLASS from then on, as `mg_mb2_cutlass`; this is the per-expert cuBLAS twin
    'mg_mb2_nocutlass': ['train.micro_batch=2', 'env.NVTE_USE_CUTLASS_GROUPED_GEMM=0'],
    'mg_mb2_cutlass_workers8': ['train.micro_batch=2', 'env.NVTE_USE_CUTLASS_GROUPED_GEMM=1',
                                'train.dataloader_workers=8', 'swift_args.dataloader_prefetch_factor=4'],
    # mg_mb2_cutlass's twin without gradient accumulation fusion: megatron-core's DDP then adds each trainable
    # tensor's gradient to its fp32 main gradient with a kernel of its own, every micro-batch (what Megatron-SWIFT
    # does wherever apex is missing). Against mg_mb2_cutlass on a machine with apex and its
    # fused_weight_gradient_mlp_cuda extension: what the fusion buys. In extra_args, so that the launch's apex check
    # leaves it as it is (backends/megatron_grad_fusion.py)
    'mg_mb2_cutlass_nofusion': ['train.micro_batch=2', 'env.NVTE_USE_CUTLASS_GROUPED_GEMM=1',
                                "extra_args=[--gradient_accumulation_fusion, 'false']"],
    # mg_mb2_cutlass without the DataLoader read across epoch ends (backends/megatron_prefetch.py): Megatron-SWIFT's
    # loader as it is, whose first step of every epoch waits for its micro-batch to be encoded -- with this
    # benchmark's 16 samples at global batch 4, every fourth step
    'mg_mb2_cutlass_noprefetch': ['train.micro_batch=2', 'env.NVTE_USE_CUTLASS_GROUPED_GEMM=1',
                                  'env.SWIFT_VORA_MEGATRON_PREFETCH=off'],
    # mg_mb2_cutlass with megatron-core's precision-aware optimizer: TE's FusedAdam keeps the fp32 master weights
    # (as bf16 weight + 16-bit remainder) and writes the bf16 weights in its multi-tensor kernels, instead of the
    # distributed optimizer's one copy kernel per trainable tensor (_copy_main_params_to_model_params: 8,256 copies and
    # 0.4 s of GPU idle in the profiled step of megatron-h100-moe-fusion-2026-12-06)
    'mg_mb2_cutlass_pao': ['train.micro_batch=2', 'env.NVTE_USE_CUTLASS_GROUPED_GEMM=1',
                           'megatron.precision_aware_optimizer=true'],
    # mg_mb2_cutlass with each expert LoRA factor as one torch._grouped_mm (backends/megatron_expert_lora.py) instead
    # of TE's one GEMM per expert: _GroupedLinearBackward held the host 1.06 s of the profiled 7.8 s step
    'mg_mb2_cutlass_glora': ['train.micro_batch=2', 'env.NVTE_USE_CUTLASS_GROUPED_GEMM=1',
                             'env.SWIFT_VORA_MEGATRON_EXPERT_LORA=grouped_mm'],
    # mg_mb2_cutlass with the frozen experts under the LoRA as one torch._grouped_mm per product
    # (backends/megatron_expert_base.py: TE's grouped GEMM walks the 256 experts on the host even where its CUTLASS
    # kernel is one launch). Its first calls (megatron-h100-moe-gmm*-2026-12-06) also set
    # SWIFT_VORA_MEGATRON_EXPERT_LORA=grouped_mm, which then replaced no factor (TE's empty bias tensors read as a LoRA
    # bias): what they ran is this
    'mg_mb2_cutlass_gmm': ['train.micro_batch=2', 'env.NVTE_USE_CUTLASS_GROUPED_GEMM=1',
                           'env.SWIFT_VORA_MEGATRON_EXPERT_BASE=grouped_mm'],
    'mg_mb2_cutlass_gmm_pao': ['train.micro_batch=2', 'env.NVTE_USE_CUTLASS_GROUPED_GEMM=1',
                               'env.SWIFT_VORA_MEGATRON_EXPERT_BASE=grouped_mm',
                               'megatron.precision_aware_optimizer=true'],
    # one micro-batch of 4 samples a step (global batch 4) instead of two of 2: the host's per-micro-batch work once a
    # step, as the Unsloth path's micro-batch 4; TE's cross entropy keeps the logits to 2 bytes a position x vocab
    # (native: 10), which is what makes 4 fit an H100 (planned 45 GiB against 64 for mg_mb2)
    'mg_mb4_te_ce': ['train.micro_batch=4', 'megatron.cross_entropy_fusion_impl=te',
                     'env.NVTE_USE_CUTLASS_GROUPED_GEMM=1'],
    'mg_mb4_te_ce_gmm': ['train.micro_batch=4', 'megatron.cross_entropy_fusion_impl=te',
                         'env.NVTE_USE_CUTLASS_GROUPED_GEMM=1', 'env.SWIFT_VORA_MEGATRON_EXPERT_BASE=grouped_mm'],
    'mg_mb4_te_ce_gmm_pao': ['train.micro_batch=4', 'megatron.cross_entropy_fusion_impl=te',
                             'env.NVTE_USE_CUTLASS_GROUPED_GEMM=1', 'env.SWIFT_VORA_MEGATRON_EXPERT_BASE=grouped_mm',
                             'megatron.precision_aware_optimizer=true'],
    # recipes/h200x8.yaml's Megatron settings as shipped from that call to 2026-12-07 (its CUTLASS, TE cross entropy,
    # the grouped frozen experts, the precision-aware optimizer), at micro-batch 4: what mg_mb4_te_ce_gmm_pao ran
    'mg_shipped': ['train.micro_batch=4', 'megatron.cross_entropy_fusion_impl=te',
                   'env.SWIFT_VORA_MEGATRON_EXPERT_BASE=grouped_mm', 'megatron.precision_aware_optimizer=true'],
    # and with the expert LoRA factors as one grouped GEMM each too (their check fixed since): no expert product
    # left to TE's per-expert host work
    'mg_mb4_te_ce_gmm_pao_glora': ['train.micro_batch=4', 'megatron.cross_entropy_fusion_impl=te',
                                   'env.NVTE_USE_CUTLASS_GROUPED_GEMM=1',
                                   'env.SWIFT_VORA_MEGATRON_EXPERT_BASE=grouped_mm',
                                   'megatron.precision_aware_optimizer=true',
                                   'env.SWIFT_VORA_MEGATRON_EXPERT_LORA=grouped_mm'],
    # and the distributed optimizer over coalesced runs of the gradient buffers
    # (swift_vora/backends/megatron_coalesced_optimizer.py): TE's FusedAdam walked the 8,256 LoRA tensors in Python,
    # 650 ms of host time in the profiled step of megatron-h100-moe-glora-2026-12-06; the same updates. Every Megatron
    # setting the recipe ships since 2026-12-07
    'mg_mb4_te_ce_gmm_pao_glora_co': ['train.micro_batch=4', 'megatron.cross_entropy_fusion_impl=te',
                                      'env.NVTE_USE_CUTLASS_GROUPED_GEMM=1',
                                      'env.SWIFT_VORA_MEGATRON_EXPERT_BASE=grouped_mm',
                                      'megatron.precision_aware_optimizer=true',
                                      'env.SWIFT_VORA_MEGATRON_EXPERT_LORA=grouped_mm',
                                      'env.SWIFT_VORA_MEGATRON_OPTIMIZER=coalesced'],
}
# Megatron full SFT (megatron_ep_full, recipes/h200x8-full.yaml overridden to one GPU, EP 1) on the same shape cut to
# what fits one GPU (`--layers 4` on an H200: docs/runs/benchmarks-log.md), at the recipe's micro-batch 1 unless the
# name says
MEGATRON_FULL_LEVERS: Dict[str, List[str]] = {
    'mgf': [],
    'mgf_te_ce': ['megatron.cross_entropy_fusion_impl=te'],
    'mgf_freeze_router': ['megatron.freeze_router=true'],
    'mgf_mb2': ['train.micro_batch=2'],
    'mgf_cutlass': ['env.NVTE_USE_CUTLASS_GROUPED_GEMM=1'],
    # the precision-aware optimizer (see mg_mb2_cutlass_pao): for full SFT it also keeps 2 bytes of master weight per
    # parameter instead of 4 (the 16-bit remainder), which the plan does not count yet -- measured, not planned
    'mgf_cutlass_pao': ['env.NVTE_USE_CUTLASS_GROUPED_GEMM=1', 'megatron.precision_aware_optimizer=true'],
}
FULL_FLAGSHIP = 'mgf'  # the full-SFT call's checked run: checkpoint-N (the HF model) against the base, loaded
UNSLOTH_BEST = ['train.micro_batch=4', 'unsloth.gradient_checkpointing=true']
DEFAULT_VARIANTS = 'mg_mb4_te_ce_gmm_pao_glora_co,vora_unsloth_best,swift_peft,mg_mb4_te_ce_gmm_pao_glora,mg_base'
# The checked run (the merged export, merge_for_vllm.sh, the report): recipes/h200x8.yaml's Megatron settings as
# shipped, on one GPU (a test holds the two together); mg_base until 2026-12-04, mg_mb2 until 2026-12-07
FLAGSHIP = 'mg_mb4_te_ce_gmm_pao_glora_co'
# The result keys of megatron-h200-2026-12-01.json (scripts/gpu/megatron_report.py) every result file carries.
REPORT_KEYS = ('backend', 'gpus', 'ep', 'tp', 'steps', 'losses', 'expert_lora_tensors', 'expert_lora_source',
               'router_trainable', 'merged_loads', 'peak_reserved_gib', 'planned_peak_gib', 'tokens_per_s',
               'weights_changed', 'weights_total', 'adapter_lora', 'failures', 'seconds_per_step',
               'planned_reserved_gib', 'plan_error', 'lora_update')
VARIANT_KEYS = ('tokens_per_s', 'median_step_s', 'peak_reserved_gib', 'planned_peak_gib', 'plan_error')
# a profiled step's chrome trace comes back with the result when it is at most this big (the device tool's files)
TRACE_KEEP_MIB = 15.0


def is_megatron(name: str) -> bool:
    return name in MEGATRON_LEVERS or name in MEGATRON_FULL_LEVERS


def flagship_of(names: List[str], lora: str = FLAGSHIP) -> str:
    """The checked run of a call: where it trains full SFT, its first full-SFT variant (FULL_FLAGSHIP first where
    asked: the recipe as shipped), else item 1's LoRA run (`lora`: FLAGSHIP, or --flagship-variant)."""
    full = [n for n in names if n in MEGATRON_FULL_LEVERS]
    return (FULL_FLAGSHIP if FULL_FLAGSHIP in full else full[0]) if full else lora


# ---- the Megatron launch --------------------------------------------------------------------------------------------
def megatron_overrides(name: str, args, b: Dict[str, Any], model: str, ann: str, out: str,
                       flagship: bool) -> List[str]:
    """`swift-vora train RECIPE` overrides: one H200, EP 1, the moe_throughput budget, the lever; the step to
    profile, if any, after the measured ones (`--megatron-profile-step`)."""
    if not is_megatron(name):
        raise SystemExit(f'unknown Megatron variant {name!r} ({", ".join([*MEGATRON_LEVERS, *MEGATRON_FULL_LEVERS])})')
    full = name in MEGATRON_FULL_LEVERS
    last = max(args.steps, profile_step_of(name, args) or 0)
    common = [f'model.path={model}', 'model.type=qwen3_5_moe', f'hardware={args.hardware}', 'host_ram_gib=128',
              'megatron.ep=1', 'megatron.tp=1', f'megatron.global_batch={args.global_batch}',
              f'data.dataset={ann}', f'data.window={b["clip_s"]:g}', f'data.stride={b["clip_s"]:g}',
              'data.min_event=0.5', f'video.fps={b["fps"]:g}', f'video.max_frames={b["max_frames"]}',
              f'video.pair_tokens={b["pair_tokens"]}', f'video.min_pair_tokens={b["min_pair_tokens"]}',
              f'train.max_steps={last}', f'train.save_steps={last}', 'train.logging_steps=1',
              f'train.output_dir={out}', f'train.dataloader_workers={args.workers}', BASE_MICRO_BATCH,
              *BASE_SETTINGS]
    if full:  # recipes/h200x8-full.yaml: no adapter, the converted HF model in checkpoint-N
        return [*common, f'train.lr={args.full_lr:g}', *MEGATRON_FULL_LEVERS[name]]
    # the recipe's own backend on eight H200s is Unsloth's replicas: these variants are Megatron's LoRA by name
    return [*common, 'train.backend=megatron_ep_lora', 'train.checkpoint_layers=null', f'train.lr={args.lr:g}',
            f'train.lora_rank={mt.LORA_RANK}', f'train.lora_alpha={mt.LORA_ALPHA}',
            f'megatron.merge_lora={"true" if flagship else "false"}', *MEGATRON_LEVERS[name]]


def profile_step_of(name: str, args) -> Optional[int]:
    """The optimizer step `--megatron-profile-step` profiles in this variant (None: none is profiled)."""
    step = getattr(args, 'megatron_profile_step', None)
    if not step:
        return None
    chosen = [v for v in (args.profile_variants or '').split(',') if v]
    return step if not chosen or name in chosen else None


def recipe_of(name: str) -> str:
    return RECIPE_FULL if name in MEGATRON_FULL_LEVERS else RECIPE


def megatron_command(overrides: List[str], dry_run: bool = False, recipe: str = RECIPE) -> List[str]:
    return [sys.executable, '-m', 'swift_vora', 'train', recipe, *overrides, *(['--dry-run', '--json'] if dry_run
                                                                               else [])]


# Megatron-SWIFT's training progress bar: the line its log shows once the first step starts
MEGATRON_TRAIN_MARK = 'Train:'


def run_megatron(name: str, args, b, inputs, work: str, flagship: bool) -> Dict[str, Any]:
    vdir = os.path.join(work, name)
    shutil.rmtree(vdir, ignore_errors=True)
    os.makedirs(vdir)
    out = os.path.join(vdir, 'output')
    profiled = profile_step_of(name, args)
    if profiled and flagship:
        raise SystemExit(f'{name}: the checked run is not profiled (its checkpoint is the measured steps\'; profile '
                         f'another variant or pass --no-flagship)')
    overrides = megatron_overrides(name, args, b, inputs['model'], inputs['annotations'], out, flagship)
    # the data wait of every step (0), and the profiled step (backends/megatron_profile.py: vora_step_profile)
    env = {'PYTORCH_CUDA_ALLOC_CONF': 'expandable_segments:True', 'SWIFT_VORA_LOG_FIRST': '1',
           'NCCL_NVLS_ENABLE': '0', 'TORCH_SYMM_MEM_DISABLE_MULTICAST': '1', 'NVSHMEM_DISABLE_NVLS': '1',
           'SWIFT_VORA_PROFILE_STEP': str(profiled or 0)}
    if not flagship:
        env['SWIFT_VORA_GUARD_VERIFY_ADAPTER'] = 'off'
    full_env = megatron_env(env, args.megatron_site)
    plan_path = os.path.join(vdir, 'plan.json')
    recipe = recipe_of(name)
    plan = subprocess.run(megatron_command(overrides, dry_run=True, recipe=recipe), capture_output=True, text=True,
                          env=full_env, cwd=REPO)
    with open(plan_path, 'w') as f:
        f.write(plan.stdout)
    if plan.returncode != 0:
        raise SystemExit(f'{name}: swift-vora train --dry-run failed (rc {plan.returncode}): {plan.stderr[-2000:]}')
    cmd = megatron_command(overrides, recipe=recipe)
    log_path = os.path.join(vdir, 'train.log')
    t0 = time.time()
    proc = tp.run_logged(cmd, log_path, full_env, timeout=args.variant_timeout)
    if args.megatron_spy_after:  # the first attempt's steps took 147 s each, cause not seen: where does the time go?
        mt.spy_when_slow(proc, args.megatron_spy_after, os.path.join(vdir, 'py-spy-dump.txt'), log_path,
                         MEGATRON_TRAIN_MARK)
    rc = tp.wait_logged(proc, f'megatron sft ({name})', log_path, measured=lambda: megatron_steps(out) >= args.steps)
    result = summarize_megatron(name, out, json.loads(plan.stdout), args, time.time() - t0)
    if rc == 'timeout':
        result['exit'] = tp.KILLED_AFTER_MEASURING
    result['command'] = tp.cmdline(cmd, env)
    result['gdn_kernel'] = gdn_kernel_line(log_path)
    if profiled:
        result['profile'] = step_profile(name, out, vdir, args)
    if flagship and name in MEGATRON_FULL_LEVERS:
        result['report'] = full_flagship_report(name, out, inputs['model'], plan_path, args, vdir)
    elif flagship:
        result['report'] = flagship_report(out, inputs['model'], plan_path, args, vdir)
    if name in MEGATRON_FULL_LEVERS:  # a whole model per checkpoint (~10 GB at 4 layers): the disk holds few
        for ckpt in glob.glob(os.path.join(run_dir(out), 'checkpoint-*')):
            shutil.rmtree(ckpt, ignore_errors=True)
    return result


def step_profile(name: str, out: str, vdir: str, args) -> Dict[str, Any]:
    """The profiled step (backends/megatron_profile.py): torch's tables summarized as the Unsloth runner's are
    (moe_throughput.profile_summary) and the chrome trace attributed (megatron_step_profile.py: step_attribution.md
    and .json in the variant's folder). The trace comes back next to the result when it is small enough, and leaves
    the logs archive either way."""
    rdir = run_dir(out)
    found: Dict[str, Any] = {'torch_profile': mt.profile_summary(os.path.join(rdir, 'torch_profile.json'))}
    trace = os.path.join(rdir, 'torch_trace.json.gz')
    if not os.path.isfile(trace):
        found['attribution'] = {'error': f'no torch_trace.json.gz in {rdir} (see train.log: vora_step_profile)'}
        return found
    attribution = msp.attribute(msp.load_trace(trace))
    found['attribution'] = attribution
    with open(os.path.join(vdir, 'step_attribution.json'), 'w') as f:
        json.dump(attribution, f, indent=1)
    with open(os.path.join(vdir, 'step_attribution.md'), 'w') as f:
        f.write(msp.render(attribution) + '\n')
    mib = os.path.getsize(trace) / 2 ** 20
    found['trace_mib'] = round(mib, 2)
    if args.out and mib <= TRACE_KEEP_MIB:
        kept = os.path.join(args.out, f'{args.name}-{name}-torch_trace.json.gz')
        shutil.copy(trace, kept)
        found['trace'] = os.path.basename(kept)
    else:
        found['trace'] = f'not kept ({mib:.1f} MiB, over {TRACE_KEEP_MIB:g})' if args.out else trace
    if args.out:
        os.remove(trace)
    return found


def full_flagship_report(name: str, out: str, model: str, plan_path: str, args, vdir: str) -> Dict[str, Any]:
    """The full-SFT call's checks (scripts/gpu/megatron_report.py --full): the loss, checkpoint-N (the converted HF
    model) against the base by part -- experts, attention, shared expert changed; the router as the variant says;
    the vision tower identical --, checkpoint-N loads in transformers, the guard's full-mode report."""
    rdir = run_dir(out)
    ckpt = os.path.join(rdir, f'checkpoint-{args.steps}')
    router = 'frozen' if 'megatron.freeze_router=true' in MEGATRON_FULL_LEVERS[name] else 'trained'
    out_json = os.path.join(vdir, 'megatron-report.json')
    proc = subprocess.run([sys.executable, os.path.join(REPO, 'scripts', 'gpu', 'megatron_report.py'), '--full',
                           '--router', router, '--base', model, '--checkpoint', ckpt, '--plan', plan_path,
                           '--encode-log', os.path.join(out, 'encode_log.jsonl'), '--gpus', '1', '--ep', '1', '--tp',
                           '1', '--global-batch', str(args.global_batch), '--out', out_json],
                          capture_output=True, text=True, cwd=REPO, env=megatron_env({}, args.megatron_site))
    report: Dict[str, Any] = {'checkpoint': ckpt, 'report_rc': proc.returncode}
    if os.path.isfile(out_json):
        with open(out_json) as f:
            report.update(json.load(f))
    else:
        report['failures'] = [f'megatron_report.py wrote nothing: {proc.stderr[-1500:]}']
    return report


def megatron_env(extra: Dict[str, str], site: str) -> Dict[str, str]:
    """The Megatron processes' environment: the Megatron set's folder (TE, megatron-core, mcore-bridge, peft 0.20 --
    scripts/gpu/setup_megatron.sh's --target) right after this checkout on PYTHONPATH, for them only: the Unsloth
    and swift PEFT variants keep the image's peft, as in benchmarks/moe_throughput.py's runs."""
    env = tp.base_env(extra)
    if site:
        rest = [p for p in env['PYTHONPATH'].split(os.pathsep) if p and p not in (REPO, site)]
        env['PYTHONPATH'] = os.pathsep.join([REPO, site, *rest])
    return env


def gdn_kernel_line(log_path: str) -> Optional[str]:
    """backends/megatron_fla.py's one line: which Gated DeltaNet kernel the run bound."""
    with open(log_path, errors='replace') as f:
        for line in f:
            if 'Gated DeltaNet kernels (SWIFT_VORA_MEGATRON_FLA' in line:
                return line.strip()[-400:]
    return None


def run_dir(out: str) -> str:
    """The folder Megatron-SWIFT wrote logging.jsonl into (OUTPUT or OUTPUT/vN-...)."""
    found = sorted(glob.glob(os.path.join(out, 'logging.jsonl')) + glob.glob(os.path.join(out, '*', 'logging.jsonl')))
    if not found:
        raise SystemExit(f'no logging.jsonl under {out}')
    return os.path.dirname(found[-1])


def megatron_steps(out: str) -> int:
    """How many steps Megatron-SWIFT logged so far (0 before its logging.jsonl exists)."""
    try:
        records = tp.read_jsonl(os.path.join(run_dir(out), 'logging.jsonl'))
    except SystemExit:
        return 0
    return sum(1 for r in records if '/' in str(r.get('iteration', '')))


def megatron_step_stats(records: List[Dict[str, Any]], tokens_per_sample: Optional[float], global_batch: int,
                        warmup: int, last: Optional[int] = None) -> Dict[str, Any]:
    """Per-step seconds from Megatron-SWIFT's running mean (`train_speed(s/it)` at `iteration` 'k/N': step k ends
    at k * mean_k), the measured steps after `warmup` up to `last` (a profiled step after them is not measured),
    and moe_throughput's step_stats on them."""
    ends: Dict[int, float] = {}
    for record in records:
        speed, iteration = record.get('train_speed(s/it)'), str(record.get('iteration', ''))
        if isinstance(speed, (int, float)) and '/' in iteration:
            k = int(iteration.split('/')[0])
            if last is None or k <= last:
                ends[k] = k * float(speed)
    ks = sorted(ends)
    if len(ks) <= warmup or ks != list(range(1, len(ks) + 1)):
        raise SystemExit(f'Megatron logged steps {ks}: need every step from 1 (train.logging_steps=1) and more '
                         f'than {warmup}')
    seconds = [ends[k] - ends.get(k - 1, 0.0) for k in ks][warmup:]
    tokens = (tokens_per_sample or 0.0) * global_batch
    stats = mt.step_stats(seconds, [tokens] * len(seconds), [global_batch] * len(seconds))
    stats['first_step_s'] = round(ends[1], 2)
    if not tokens_per_sample:
        stats['tokens_per_s'] = None
    return stats


def summarize_megatron(name: str, out: str, plan_json: Dict[str, Any], args, wall: Optional[float]
                       ) -> Dict[str, Any]:
    rdir = run_dir(out)
    records = tp.read_jsonl(os.path.join(rdir, 'logging.jsonl'))
    encode = tp.read_jsonl(os.path.join(out, 'encode_log.jsonl'))
    encode = [r for r in encode if r.get('mode', 'train') == 'train' and r.get('total_tokens')]
    tokens_per_sample = statistics.mean(r['total_tokens'] for r in encode) if encode else None
    stats = megatron_step_stats(records, tokens_per_sample, args.global_batch, args.warmup_steps, last=args.steps)
    stats.update(data_wait(out, rdir, args, stats))
    memory = [float(r['memory(GiB)']) for r in records if isinstance(r.get('memory(GiB)'), (int, float))]
    plan = plan_json['plan']
    steady = (plan.get('phases') or {}).get('steady') or {}
    peak = max(memory) if memory else None
    micro = plan_json.get('plan', {}).get('micro_batch')
    return {**stats, 'variant': name, 'backend': plan['backend'], 'micro_batch': micro,
            'global_batch': args.global_batch, 'warmup_steps': args.warmup_steps, 'steps': len(records),
            'peak_reserved_gib': peak, 'planned_peak_gib': plan.get('gpu_peak_gib'),
            'planned_reserved_gib': steady.get('gpu_reserved_gib'),
            'plan_error': round(peak / steady['gpu_reserved_gib'] - 1, 3) if peak and steady.get('gpu_reserved_gib')
            else None,
            'tokens_per_sample': tokens_per_sample,
            'losses': [float(r['loss']) for r in records if isinstance(r.get('loss'), (int, float))],
            'argv': (plan_json.get('launch') or {}).get('argv'), 'wall_s': round(wall, 1) if wall is not None else None,
            'guard_files': guard_files(out, rdir), 'first_step': first_step_caches(out, rdir)}


def data_wait(out: str, rdir: str, args, stats: Dict[str, Any]) -> Dict[str, Any]:
    """The data wait of the measured steps (vora_step_profile's data_wait.rank0.jsonl: seconds in the data
    iterator's next() per step) over their seconds, and the slowest measured step over the median: issue 56's
    < 2 % and <= 1.3x."""
    found: Dict[str, Any] = {'slowest_over_median': round(stats['max_step_s'] / stats['median_step_s'], 3)
                             if stats.get('max_step_s') and stats.get('median_step_s') else None}
    path = report_file(out, rdir, 'data_wait.rank0.jsonl')
    if path is None:
        return {**found, 'data_wait_fraction': None, 'data_wait_s': None}
    rows = {r['iteration']: r for r in tp.read_jsonl(path)}
    measured = [rows[k]['data_wait_s'] for k in range(args.warmup_steps + 1, args.steps + 1) if k in rows]
    seconds = sum(stats.get('step_s') or [])
    return {**found, 'data_wait_s': measured,
            'data_wait_fraction': round(sum(measured) / seconds, 4) if measured and seconds else None}


def first_step_caches(out: str, rdir: str) -> Optional[Dict[str, Any]]:
    """The memory guard's first_step.json (guards/megatron.py): the first step as the process timed it and whether
    the kernel caches were warm; None where it wrote none."""
    path = report_file(out, rdir, 'first_step.json')
    if path is None:
        return None
    with open(path) as f:
        report = json.load(f)
    return {k: report.get(k) for k in ('first_step_s', 'warm', 'cache_entries_before', 'cache_entries_written')}


GUARD_FILES = {'fingerprint': 'fingerprint.json', 'memory': 'memory_phases.rank*.jsonl',
               'lora_update': 'lora_update.json'}


def guard_files(out: str, rdir: str) -> Dict[str, Optional[str]]:
    """The report each Megatron guard wrote (swift_vora/guards/megatron.py), under the run folder or the output
    folder; None for a guard that wrote nothing."""
    found: Dict[str, Optional[str]] = {}
    for guard, pattern in GUARD_FILES.items():
        path = report_file(out, rdir, pattern)
        found[guard] = os.path.relpath(path, out) if path else None
    return found


def report_file(out: str, rdir: str, pattern: str) -> Optional[str]:
    """The first (by name) file matching `pattern` in the run folder or the output folder; None: neither has one."""
    paths = sorted(glob.glob(os.path.join(rdir, pattern)) + glob.glob(os.path.join(out, pattern)))
    return paths[0] if paths else None


def flagship_report(out: str, model: str, plan_path: str, args, vdir: str) -> Dict[str, Any]:
    """Item 1's checks: merge_for_vllm.sh (Megatron: verifies checkpoint-N-merged, its expert check) and
    scripts/gpu/megatron_report.py (loss, LoRA placement, router, merged load, lora_update)."""
    rdir = run_dir(out)
    ckpt = os.path.join(rdir, f'checkpoint-{args.steps}')
    merged = ckpt + '-merged'
    report: Dict[str, Any] = {'checkpoint': ckpt, 'merged': merged}
    merge_log = os.path.join(vdir, 'merge_for_vllm.log')
    with open(merge_log, 'w') as log:
        rc = subprocess.run(['bash', os.path.join(REPO, 'scripts', 'merge_for_vllm.sh'), ckpt,
                             os.path.join(vdir, 'vllm')], stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                            env=megatron_env({}, args.megatron_site)).returncode
    report['merge_for_vllm_rc'] = rc
    with open(merge_log, errors='replace') as f:
        report['merge_for_vllm_tail'] = f.read()[-1500:]
    check = os.path.join(vdir, 'vllm', 'swift_vora_merge_check.json')  # the expert check's report, beside the weights
    if os.path.isfile(check):
        with open(check) as f:
            expert = json.load(f)
        report['expert_check'] = {k: expert.get(k) for k in ('ok', 'trained', 'checked', 'layers', 'elements_telling',
                                                             'scale')}
        shutil.copy(check, os.path.join(vdir, 'swift_vora_merge_check.json'))  # kept with the logs
    shutil.rmtree(os.path.join(vdir, 'vllm'), ignore_errors=True)  # hard links to the export (copies elsewhere)
    out_json = os.path.join(vdir, 'megatron-report.json')
    proc = subprocess.run([sys.executable, os.path.join(REPO, 'scripts', 'gpu', 'megatron_report.py'), '--base', model,
                           '--checkpoint', ckpt, '--merged', merged, '--plan', plan_path, '--encode-log',
                           os.path.join(out, 'encode_log.jsonl'), '--gpus', '1', '--ep', '1', '--tp', '1',
                           '--global-batch', str(args.global_batch), '--out', out_json],
                          capture_output=True, text=True, cwd=REPO, env=megatron_env({}, args.megatron_site))
    report['report_rc'] = proc.returncode
    if os.path.isfile(out_json):
        with open(out_json) as f:
            report.update(json.load(f))
    else:
        report['failures'] = [f'megatron_report.py wrote nothing: {proc.stderr[-1500:]}']
    if rc != 0:
        report.setdefault('failures', []).append(f'scripts/merge_for_vllm.sh exited {rc} (see merge_for_vllm.log)')
    elif 'expert_check' not in report:  # item 1: the merged experts checked against base + B @ A, not only loaded
        report.setdefault('failures', []).append('scripts/merge_for_vllm.sh ran no expert check (no per-expert LoRA '
                                                 f'found in {ckpt})')
    return report


# ---- the result file ----------------------------------------------------------------------------------------------
def backend_ratio(variants: Dict[str, Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The fastest Megatron variant against the Unsloth one (tokens/s on median steps), both measured here."""
    mg = {n: r for n, r in variants.items() if n in MEGATRON_LEVERS and r.get('tokens_per_s')}
    un = variants.get('vora_unsloth_best') or {}
    if not mg or not un.get('tokens_per_s'):
        return None
    best = max(mg, key=lambda n: mg[n]['tokens_per_s'])
    return {'megatron_variant': best, 'unsloth_variant': 'vora_unsloth_best',
            'megatron_tokens_per_s': mg[best]['tokens_per_s'], 'unsloth_tokens_per_s': un['tokens_per_s'],
            'megatron_over_unsloth': round(mg[best]['tokens_per_s'] / un['tokens_per_s'], 3),
            'megatron_peak_reserved_gib': mg[best].get('peak_reserved_gib'),
            'unsloth_peak_reserved_gib': un.get('peak_reserved_gib'),
            'megatron_levers': MEGATRON_LEVERS[best]}


def assemble(payload: Dict[str, Any]) -> Dict[str, Any]:
    """The result file: the flagship report's keys at the top (as megatron-h200-2026-12-01.json), the variants'
    headline keys, the backend ratio. Under `--no-flagship` (the payload's `flagship_asked` false, read by the partial
    and the final file alike) a FLAGSHIP that ran, or was not asked for, is not a failure: its item-1 report was not
    asked for, and the file says so in `flagship`."""
    variants = payload['variants']
    checked = payload.get('flagship_variant', FLAGSHIP)  # a full-SFT call's: flagship_of
    mg = variants.get(checked) or {}
    flagship = mg.get('report') or {}
    top = {k: flagship.get(k) for k in REPORT_KEYS}
    asked = payload.get('flagship_asked', True)
    if not flagship and not asked and mg and not (mg.get('failed') or mg.get('skipped')):
        top['flagship'] = f'not asked (--no-flagship): {checked} ran without the merged export and item-1 report'
    elif not flagship and not asked and not mg:  # a call of other variants (the memory calls d-f said "not run")
        top['flagship'] = f'not asked (--no-flagship), and {checked} was not among the variants'
    elif not flagship:
        top['failures'] = [f'{checked} (the checked run) did not report: {mg.get("failed", "not run")}'[:500]]
    if flagship:
        top['guard_files'] = mg.get('guard_files')
        silent = [g for g, path in (mg.get('guard_files') or {}).items() if path is None]
        if silent or not mg.get('guard_files'):
            top['failures'] = list(top.get('failures') or []) + [
                f'guards {", ".join(silent) or "(none recorded)"} wrote no report under megatron sft']
    for key in VARIANT_KEYS:  # the flagship's measured numbers (its report computes a mean; ours the median)
        if mg.get(key) is not None:
            top[key] = mg[key]
    for result in variants.values():
        for key in VARIANT_KEYS:
            result.setdefault(key, None)
    return {**top, **{k: v for k, v in payload.items() if k != 'variants'},
            'variants': variants, 'backend_ratio': backend_ratio(variants)}


def write_partial(payload: Dict[str, Any], out: str, name: str) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f'{name}-partial.json'), 'w') as f:
        json.dump({**assemble(json.loads(json.dumps(payload))), 'partial': True}, f, indent=2)
        f.write('\n')


# ---- main ---------------------------------------------------------------------------------------------------------
def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--out', default=os.environ.get('OUT') or None)
    parser.add_argument('--work', default=None)
    parser.add_argument('--results-dir', default=os.path.join(REPO, 'benchmarks', 'results'))
    parser.add_argument('--name', default='megatron-h200-moe')
    parser.add_argument('--layers', type=int, default=8)
    parser.add_argument('--model-dir', default=None, help='reuse a built checkpoint (dry run: a config.json path)')
    parser.add_argument('--variants', default=DEFAULT_VARIANTS)
    parser.add_argument('--no-flagship', action='store_true',
                        help='the checked run (--flagship-variant) without the merged export and checks')
    parser.add_argument('--flagship-variant', default=FLAGSHIP, metavar='NAME',
                        help=f'the Megatron LoRA variant that is the checked run (default {FLAGSHIP}; e.g. '
                             'mg_shipped, the recipe\'s Megatron settings at micro-batch 4, so that the twin of a '
                             'lever call is also its checked run); it must be among --variants')
    parser.add_argument('--steps', type=int, default=12)
    parser.add_argument('--warmup-steps', type=int, default=2)
    parser.add_argument('--global-batch', type=int, default=4, help='samples per Megatron optimizer step')
    parser.add_argument('--lr', type=float, default=1e-3,
                        help='Megatron variants (item 1 checks that a random model\'s loss falls in 12 steps)')
    parser.add_argument('--full-lr', type=float, default=1e-4,
                        help='the full-SFT variants (mgf*): every weight moves, so a tenth of the LoRA rate')
    parser.add_argument('--hardware', default='h200x1',
                        help='the planner\'s profile of the one GPU (h100x1 on an H100)')
    parser.add_argument('--megatron-profile-step', type=int, default=None, metavar='N',
                        help='torch.profiler over optimizer step N of each Megatron variant (N > --steps: after the '
                             'measured ones; backends/megatron_profile.py), attributed by megatron_step_profile.py '
                             'into the result\'s `profile` and step_attribution.md')
    parser.add_argument('--profile-variants', default='',
                        help='with --megatron-profile-step: only these Megatron variants (comma list; default all)')
    parser.add_argument('--workers', type=int, default=4)
    parser.add_argument('--clips', type=int, default=16)
    parser.add_argument('--variant-timeout', type=float, default=900)
    parser.add_argument('--deadline', type=float, default=None, help='seconds: skip variants that would start later')
    parser.add_argument('--megatron-spy-after', type=float, default=None, metavar='SECONDS',
                        help='py-spy stack dump of a Megatron variant SECONDS after its training began (its log shows '
                             f'{MEGATRON_TRAIN_MARK!r}): py-spy-dump.txt in its folder')
    parser.add_argument('--dry-run', action='store_true', help='print each Megatron variant\'s plan and argv (CPU)')
    parser.add_argument('--summarize-logs', metavar='VARIANT_DIR', nargs='+', default=None,
                        help='no run: Megatron variants\' kept folders (VARIANT_DIR/plan.json, output/logging.jsonl, '
                             'e.g. from a logs-megatron_moe.tgz) through the summary a run writes, printed as a result '
                             'file\'s variants (a variant killed after its steps were logged); with the run\'s '
                             '--global-batch/--warmup-steps')
    parser.add_argument('--megatron-site', default=tp.switch('SWIFT_VORA_MEGATRON_SITE') or '',
                        help='folder holding the Megatron set (put on PYTHONPATH for the Megatron variants only)')
    args = parser.parse_args(argv)
    if args.flagship_variant not in MEGATRON_LEVERS:
        parser.error(f'--flagship-variant {args.flagship_variant}: not a Megatron LoRA variant '
                     f'({", ".join(MEGATRON_LEVERS)})')
    names = [v for v in args.variants.split(',') if v]
    checked = flagship_of(names, args.flagship_variant)
    if not (args.dry_run or args.summarize_logs or args.no_flagship) and checked not in names:
        # said before the model is built, not as "did not report" after the whole call
        parser.error(f'the checked run {checked} is not among --variants ({args.variants}): add it, name another '
                     'with --flagship-variant, or pass --no-flagship')
    if args.megatron_profile_step is not None and args.megatron_profile_step <= args.steps:
        parser.error(f'--megatron-profile-step {args.megatron_profile_step}: after the {args.steps} measured steps '
                     '(the profiler slows the step it profiles)')
    # moe_throughput's run_vora / run_swift read these
    args.grad_accum, args.smoke, args.profile_step, args.spy_after, args.fla_path = 1, False, None, None, ''
    args.torch_profile, args.sync_debug, args.flagship = [], [], False
    return args


# the 35B-A3B config cut to N layers, as the builder builds it (moe_throughput's): what a dry run plans
cut_config = mt.cut_config


# the variants' own switches a dry run prints beside Transformer Engine's
SHOWN_SWITCHES = ('SWIFT_VORA_PROFILE_STEP', 'SWIFT_VORA_MEGATRON_PREFETCH', 'SWIFT_VORA_MEGATRON_EXPERT_LORA',
                  'SWIFT_VORA_MEGATRON_EXPERT_BASE', 'SWIFT_VORA_MEGATRON_OPTIMIZER')


def dry_run(args) -> int:
    """The argv of every Megatron variant, from `swift-vora train --dry-run --json` (runs on CPU)."""
    b = mt.budget(False)
    model = args.model_dir or cut_config(mt.CONFIG_35B_A3B,
                                         args.layers, os.path.join(args.work or '/tmp', 'megatron_moe_dry_run'))
    failed = 0
    names = ([*MEGATRON_LEVERS, *MEGATRON_FULL_LEVERS] if args.variants == 'all' else
             [v for v in args.variants.split(',') if is_megatron(v)])
    checked = flagship_of(names, args.flagship_variant)
    for name in names:
        overrides = megatron_overrides(name, args, b, model, 'data/train.jsonl', f'/tmp/{name}',
                                       name == checked and not args.no_flagship)
        cmd = [*megatron_command(overrides, dry_run=True, recipe=recipe_of(name)), '--trust-recipe-hardware']
        profiled = profile_step_of(name, args)
        env = tp.base_env({'SWIFT_VORA_PROFILE_STEP': str(profiled or 0)})  # as run_megatron launches it
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env)
        plan = json.loads(proc.stdout) if proc.stdout.strip().startswith('{') else {}
        # planned here, launched on the GPU machine: this CPU lacks the checkpoint's weights and the clips (the dry
        # run's `not_launched`, its exit code) -- expected; a refused override or switch leaves no plan
        if not plan.get('plan') or (proc.returncode != 0 and not plan.get('not_launched')):
            failed += 1
            print(f'== {name}: rc {proc.returncode}: {proc.stderr[-1500:]}')
            continue
        if plan['plan']['verdict'] != 'fits':
            failed += 1
        extra = {k: v for k, v in plan['launch']['env'].items()
                 if k.startswith('NVTE_') or k in SHOWN_SWITCHES}
        print(f'== {name}: {plan["plan"]["backend"]} {plan["plan"]["verdict"]} {plan["plan"]["gpu_peak_gib"]} GiB '
              f'(reserved {plan["plan"]["phases"]["steady"]["gpu_reserved_gib"]}) on {args.hardware}; '
              f'{plan["launch"]["env"].get("SWIFT_VORA_MEGATRON_FLA")}; {extra}; '
              + ' '.join(plan['launch']['argv'][1:]))
    return 1 if failed else 0


def summarize_kept_variant(name: str, vdir: str, args) -> Dict[str, Any]:
    """--summarize-logs: one kept Megatron variant folder as run_megatron summarizes it (its wall time unknown)."""
    plan_path = os.path.join(vdir, 'plan.json')
    if not os.path.isfile(plan_path):
        raise SystemExit(f'{plan_path}: not found (a megatron_moe variant folder holds plan.json and output/)')
    with open(plan_path) as f:
        plan_json = json.load(f)
    return summarize_megatron(name, os.path.join(vdir, 'output'), plan_json, args, None)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        return dry_run(args)
    if args.summarize_logs:  # derived figures, from logs a run kept (its result file stays as written)
        derived = tp.summarize_kept_logs(args.summarize_logs, lambda name, vdir: summarize_kept_variant(
            name, vdir, args))
        return tp.print_derived('megatron_moe', argv, args, derived)
    t_start = time.time()
    work = args.work or os.path.join(__import__('tempfile').gettempdir(), 'swift_vora_megatron_moe')
    os.makedirs(work, exist_ok=True)
    b = mt.budget(False)
    model_dir = args.model_dir or os.path.join(work, 'model')
    counts = mt.build_model(model_dir, '35b-a3b', args.layers, 'cuda' if tp.cuda_available() else 'cpu')
    clips = tp.make_clips(os.path.join(work, 'clips'), args.clips, b['clip_s'], b['source_fps'], b['size'],
                          workers=min(16, os.cpu_count() or 1))
    inputs = {'model': model_dir, **tp.write_datasets(work, clips)}
    names = [v for v in args.variants.split(',') if v]
    checked = flagship_of(names, args.flagship_variant)
    full = checked == FULL_FLAGSHIP
    payload: Dict[str, Any] = {
        'benchmark': 'megatron_moe', 'model_family': 'qwen3_5_moe', 'date': tp.now_stamp(), 'machine': tp.hardware(),
        'command': ' '.join(['python', 'benchmarks/megatron_moe.py'] + list(argv if argv is not None else
                                                                             sys.argv[1:])),
        'model': f'random Qwen3.5-MoE, 35B-A3B shape cut to {args.layers} layers (benchmarks/moe_throughput.py '
                 f'build_model): {counts.get("total")} params',
        'samples': f'{args.clips} synthetic {b["clip_s"]:g} s clips, {b["max_frames"]} frames at {b["fps"]:g} fps, '
                   f'<= {b["pair_tokens"]} tokens per frame pair',
        'launch': f'swift-vora train recipes/{"h200x8-full" if full else "h200x8"}.yaml hardware={args.hardware} '
                  'megatron.ep=1 megatron.tp=1 ... (benchmarks/megatron_moe.py megatron_overrides)',
        **({'tuner': 'full', 'lr': args.full_lr} if full else {'lora': {'rank': mt.LORA_RANK, 'alpha': mt.LORA_ALPHA}}),
        'steps_per_variant': args.steps, 'warmup_steps': args.warmup_steps, 'global_batch': args.global_batch,
        'megatron_profile_step': args.megatron_profile_step,
        'flagship_asked': not args.no_flagship, 'flagship_variant': checked, 'variants': {},
    }
    for name in names:
        if args.deadline and time.time() - t_start > args.deadline:
            payload['variants'][name] = {'skipped': f'deadline {args.deadline:.0f} s passed'}
            continue
        try:
            if is_megatron(name):
                result = run_megatron(name, args, b, inputs, work, flagship=name == checked and not args.no_flagship)
            elif name == 'vora_unsloth_best':
                # on the card the call got (--hardware: moe_throughput.vora_command passes it), as the Megatron ones
                result = mt.run_vora(name, args, b, inputs, work, flagship=False, fla=False,
                                     extra_overrides=UNSLOTH_BEST)
                result['planned_peak_gib'] = (result.get('planned') or {}).get('gpu_peak_gib')
                planned = (result.get('planned') or {}).get('gpu_reserved_gib')
                result['plan_error'] = round(result['peak_reserved_gib'] / planned - 1, 3) \
                    if planned and result.get('peak_reserved_gib') else None
            elif name == 'swift_peft':
                result = mt.run_swift(name, args, b, inputs, work, 'peft', mt.TARGET_MODULES, mt.TARGET_PARAMETERS)
            else:
                raise SystemExit(f'unknown variant {name!r}')
        except (SystemExit, subprocess.CalledProcessError, RuntimeError, OSError, KeyError, ValueError) as error:
            result = {'failed': str(error)[-3000:]}
        payload['variants'][name] = result
        shown = (*VARIANT_KEYS, 'first_step_s', 'data_wait_fraction', 'slowest_over_median', 'failed')
        print(f'== {name}: ' + json.dumps({k: result.get(k) for k in shown}), flush=True)
        write_partial(payload, args.out or work, args.name)
    final = assemble(payload)
    path = tp.write_results(final, args.results_dir, args.name, args.out)
    print(f'results: {path}')
    return 0 if not final.get('failures') else 1


if __name__ == '__main__':
    sys.exit(main())
