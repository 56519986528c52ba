#!/usr/bin/env bash
# Megatron-SWIFT expert-parallel LoRA on ONE GPU (EP=1), as a user runs it: recipes/h200x8.yaml overridden to one
# H200 -> plan -> `megatron sft` LoRA (TE grouped LoRA on the experts, LoRA on attention, router frozen) ->
# checkpoint-N-merged loads in transformers -> scripts/merge_for_vllm.sh verifies it -> results JSON.
#
#   [STEPS=8] bash scripts/gpu/megatron_smoke.sh [WORK_DIR]   # default $TMPDIR/megatron_smoke (/tmp); after setup_env.sh
#                                                             # swift and setup_megatron.sh (run_all.sh does both)
#
# Model: a random Qwen3-VL-MoE (a type the recipe targets; swift_vora.tiny_model.build_tiny_qwen3_vl(moe=True))
# with 16 experts, top-4, 4 layers, hidden 512: every Megatron code path of the real model (grouped experts,
# router, vision tower, deepstack), built in seconds. Data: 8 synthetic 32 s clips (video_ora samples).
# Results: ${OUT:-WORK_DIR}/megatron-h200-<date>.json (scripts/gpu/megatron_report.py: backend, gpus, ep, tp, steps,
# losses, expert_lora_tensors, router_trainable, merged_loads, peak_reserved_gib, planned_peak_gib, tokens_per_s)
# and every step's log in ${OUT:-WORK_DIR}/megatron/ (WORK_DIR/logs without OUT). Exit non-zero on the first failing step or check.
set -euo pipefail

# shellcheck source=scripts/gpu/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
phase_dirs megatron megatron_smoke "${1:-}"
STEPS="${STEPS:-8}"
fresh_work
export SWIFT_VORA_FPS=2 SWIFT_VORA_MAX_FRAMES=16 SWIFT_VORA_PAIR_TOKENS=256 SWIFT_VORA_MIN_PAIR_TOKENS=16

step "1. random Qwen3-VL-MoE (16 experts, top-4) and synthetic clips (offline)"
"$PY" - "$WORK" <<'PYEOF' 2>&1 | tee "$LOGS/1-build.log"
import sys, time
from swift_vora.synthetic import make_dataset
from swift_vora.tiny_model import TinyShape, build_tiny_qwen3_vl
work = sys.argv[1]
t0 = time.time()
# head_dim 16: build_tiny_qwen3_vl's mrope_section [2, 3, 3] covers head_dim / 2.
shape = TinyShape(hidden_size=512, num_layers=4, num_heads=8, num_kv_heads=4, head_dim=16, intermediate_size=1024,
                  vision_depth=2, vision_hidden=128, vision_intermediate=256, vision_heads=2, num_experts=16,
                  experts_per_token=4, moe_intermediate_size=256)
build_tiny_qwen3_vl(f'{work}/model', moe=True, shape=shape)
print(f'model built in {time.time() - t0:.0f} s')
make_dataset(f'{work}/train', 8, duration=32.0, size=(640, 360), seed=1)
print('clips written')
PYEOF

# One H200, EP 1: the h200x8 recipe with the hardware profile, the model and the run length swapped.
# lr 1e-3: a random model's loss must visibly fall within a few steps. host_ram_gib: the lent machine's 128 GiB.
# the recipe trains Unsloth replicas on eight H200s: this run is Megatron LoRA by name
OVERRIDES=(train.backend=megatron_ep_lora train.checkpoint_layers=null train.micro_batch=2 "model.path=$WORK/model" model.type=qwen3_vl_moe
  hardware=h200x1 host_ram_gib=128 megatron.ep=1
  megatron.tp=1 megatron.global_batch=2 "data.dataset=$WORK/train/annotations.jsonl" "train.output_dir=$WORK/run"
  "train.max_steps=$STEPS" "train.save_steps=$STEPS" train.logging_steps=1 train.lr=1e-3 train.dataloader_workers=2
  video.max_frames=16 video.pair_tokens=256)

step "2. swift-vora train recipes/h200x8.yaml --dry-run (the plan the run is compared with)"
swift-vora train recipes/h200x8.yaml "${OVERRIDES[@]}" --dry-run --json > "$LOGS/2-plan.json"
"$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["plan"]["backend"], d["launch"]["shell"])' \
  "$LOGS/2-plan.json"

step "3. swift-vora train recipes/h200x8.yaml (megatron sft, EP 1, $STEPS steps)"
swift-vora train recipes/h200x8.yaml "${OVERRIDES[@]}" 2>&1 | tee "$LOGS/3-train.log"
ckpt="$(ls -d "$WORK"/run/v*/checkpoint-"$STEPS" | tail -1)"
merged="$ckpt-merged"
echo "checkpoint: $ckpt  merged: $merged"
cp "$(dirname "$ckpt")"/logging.jsonl "$(dirname "$ckpt")"/*.json "$LOGS/" 2>/dev/null || true

step "4. scripts/merge_for_vllm.sh (Megatron: verifies checkpoint-N-merged and copies it)"
bash scripts/merge_for_vllm.sh "$ckpt" "$WORK/vllm" 2>&1 | tee "$LOGS/4-merge.log"

step "5. checks and results JSON"
"$PY" scripts/gpu/megatron_report.py --base "$WORK/model" --checkpoint "$ckpt" --merged "$merged" \
  --plan "$LOGS/2-plan.json" --encode-log "$WORK/run/encode_log.jsonl" --gpus 1 --ep 1 --tp 1 --global-batch 2 \
  --out "${OUT:-$WORK}/megatron-h200-$(date -u +%F).json" 2>&1 | tee "$LOGS/5-report.log"
step "MEGATRON ONE-GPU OK"
