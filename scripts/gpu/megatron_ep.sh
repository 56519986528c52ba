#!/usr/bin/env bash
# Megatron-SWIFT expert-parallel LoRA over several GPUs of one host (EP=2 on two H200s by default): the same run
# and checks as scripts/gpu/megatron_smoke.sh, with the experts split EP ways. Needs a machine with >= EP GPUs:
# NCCL refuses two ranks on one GPU, so it refuses to start (exit 4) with fewer, before building anything.
#
#   bash scripts/gpu/megatron_ep.sh [WORK_DIR]      # default $TMPDIR/megatron_ep (/tmp); after setup_env.sh swift +
#                                                   # setup_megatron.sh (run_all.sh's megatron_ep phase)
#   EP=2 STEPS=8                                    # expert-parallel size (= GPUs used), optimizer steps
#   MODEL=DIR_OR_CONFIG_JSON                        # use this model instead of building the random Qwen3-VL-MoE
#   DRY_RUN=1                                       # plan and print the exact launch only (no GPU work)
#
# Every launch carries NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 (NVLink
# multicast off: the lent multi-GPU machines do not provide it). Exit: 0 ok, 1 a step or check failed, 4 refused.
set -euo pipefail

# shellcheck source=scripts/gpu/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
phase_dirs megatron_ep megatron_ep "${1:-}"
EP="${EP:-2}"
STEPS="${STEPS:-8}"
NCCL_ENV=(NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1)

case "$EP" in ''|*[!0-9]*|0) echo "megatron_ep: EP must be a positive integer, got '$EP'" >&2; exit 2;; esac
gpus="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)"
if [ "$gpus" -lt "$EP" ]; then
  echo "megatron_ep: refused: EP=$EP needs $EP GPUs, this machine has $gpus (NCCL refuses two ranks on one GPU;" \
       "use a machine kind with $EP GPUs, or scripts/gpu/megatron_smoke.sh for EP=1)" >&2
  exit 4
fi

fresh_work
export SWIFT_VORA_FPS=2 SWIFT_VORA_MAX_FRAMES=16 SWIFT_VORA_PAIR_TOKENS=256 SWIFT_VORA_MIN_PAIR_TOKENS=16

model="${MODEL:-$WORK/model}"
data="$WORK/train/annotations.jsonl"
# the clips always (a given MODEL still trains on them); the random model only where none is given
step "1. synthetic clips${MODEL:+ (model: $MODEL)}${MODEL:-, and a random Qwen3-VL-MoE (16 experts: $((16 / EP)) per GPU)}"
env "${NCCL_ENV[@]}" BUILD_MODEL="$([ -z "${MODEL:-}" ] && echo 1 || echo 0)" "$PY" - "$WORK" <<'PYEOF' 2>&1 | tee "$LOGS/1-build.log"
import os
import sys
from swift_vora.synthetic import make_dataset
from swift_vora.tiny_model import TinyShape, build_tiny_qwen3_vl
work = sys.argv[1]
if os.environ['BUILD_MODEL'] == '1':
    shape = TinyShape(hidden_size=512, num_layers=4, num_heads=8, num_kv_heads=4, head_dim=16, intermediate_size=1024,
                      vision_depth=2, vision_hidden=128, vision_intermediate=256, vision_heads=2, num_experts=16,
                      experts_per_token=4, moe_intermediate_size=256)
    build_tiny_qwen3_vl(f'{work}/model', moe=True, shape=shape)
make_dataset(f'{work}/train', 8, duration=32.0, size=(640, 360), seed=1)
PYEOF

# EP GPUs of 139.8 GiB (H200), EP-way expert parallel, no tensor parallel; DP = EP, so global batch 2 x EP.
# the recipe trains Unsloth replicas on eight H200s: this run is Megatron EP LoRA by name
OVERRIDES=(train.backend=megatron_ep_lora train.checkpoint_layers=null train.micro_batch=2 "model.path=$model" model.type=qwen3_vl_moe
  hardware=null "gpus=$EP" gpu_mem_gib=139.8 host_ram_gib=128
  "megatron.ep=$EP" megatron.tp=1 "megatron.global_batch=$((2 * EP))" "data.dataset=$data"
  "train.output_dir=$WORK/run" "train.max_steps=$STEPS" "train.save_steps=$STEPS" train.logging_steps=1
  train.lr=1e-3 train.dataloader_workers=2 video.max_frames=16 video.pair_tokens=256)

step "2. plan: swift-vora train recipes/h200x8.yaml --dry-run (EP=$EP on $EP GPUs)"
# a dry run exits with the launch's code; DRY_RUN=1 plans on any machine (the CPU check), so the hardware is trusted
PLAN_FLAGS=(--dry-run --json)
if [ "${DRY_RUN:-0}" = 1 ]; then PLAN_FLAGS+=(--trust-recipe-hardware); fi
env "${NCCL_ENV[@]}" swift-vora train recipes/h200x8.yaml "${OVERRIDES[@]}" "${PLAN_FLAGS[@]}" > "$LOGS/2-plan.json"
launch=(env "${NCCL_ENV[@]}" swift-vora train recipes/h200x8.yaml "${OVERRIDES[@]}")
printf 'launch:'; printf ' %q' "${launch[@]}"; echo
"$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["plan"]["backend"], d["launch"]["shell"])' \
  "$LOGS/2-plan.json"
if [ "${DRY_RUN:-0}" = 1 ]; then
  step "DRY_RUN=1: nothing launched"
  exit 0
fi

step "3. train (megatron sft, EP=$EP, $STEPS steps)"
"${launch[@]}" 2>&1 | tee "$LOGS/3-train.log"
ckpt="$(ls -d "$WORK"/run/v*/checkpoint-"$STEPS" | tail -1)"
cp "$(dirname "$ckpt")"/logging.jsonl "$LOGS/" 2>/dev/null || true

step "4. scripts/merge_for_vllm.sh"
env "${NCCL_ENV[@]}" bash scripts/merge_for_vllm.sh "$ckpt" "$WORK/vllm" 2>&1 | tee "$LOGS/4-merge.log"

step "5. checks and results JSON"
env "${NCCL_ENV[@]}" "$PY" scripts/gpu/megatron_report.py --base "$model" --checkpoint "$ckpt" \
  --merged "$ckpt-merged" --plan "$LOGS/2-plan.json" --encode-log "$WORK/run/encode_log.jsonl" --gpus "$EP" \
  --ep "$EP" --tp 1 --global-batch "$((2 * EP))" --out "${OUT:-$WORK}/megatron-ep$EP-h200-$(date -u +%F).json" \
  2>&1 | tee "$LOGS/5-report.log"
step "MEGATRON EP=$EP OK"
