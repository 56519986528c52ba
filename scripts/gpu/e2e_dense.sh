#!/usr/bin/env bash
# The whole dense path on one H200, as a user runs it: recipe -> plan -> ZeRO-3 LoRA training with every guard ->
# verify-adapter -> merge_for_vllm.sh -> eval of the merged weights on held-out clips.
#
#   bash scripts/gpu/e2e_dense.sh [WORK_DIR]        # default $TMPDIR/e2e_dense (/tmp); after scripts/gpu/setup_env.sh swift
#
# Model: random-weight Qwen3-VL with the 2B shape (swift_vora.tiny_model.build_qwen3_vl(..., '2b')), built offline.
# Data: synthetic 32 s clips (640x360, a red square marks the moments to keep), 16 for training, 4 held out.
# The recipe is recipes/h200x1.yaml with the model swapped for the dense one and `train.backend=auto`: the planner
# picks DeepSpeed ZeRO-3 (the dense default, also on one GPU). A random model trained for a few steps does not
# answer in JSON yet: the eval step shows the path (inference, parsing, metrics, report), and counts the parse
# failures; benchmarks/learnability.py is where learning is shown.
# Every step's log goes to $OUT/e2e_dense/ when OUT is set. Exit non-zero on the first failing step.
set -euo pipefail

# shellcheck source=scripts/gpu/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
phase_dirs e2e_dense e2e_dense "${1:-}"
fresh_work
# The video budget of this run, for training and for inference alike (SWIFT_VORA_* is what video_ora reads).
export SWIFT_VORA_FPS=2 SWIFT_VORA_MAX_FRAMES=32 SWIFT_VORA_PAIR_TOKENS=256 SWIFT_VORA_MIN_PAIR_TOKENS=16

step "1. 2B-shaped random Qwen3-VL and synthetic clips (offline)"
"$PY" - "$WORK" <<'PYEOF' 2>&1 | tee "$LOGS/1-build.log"
import sys, time
from swift_vora.synthetic import make_dataset
from swift_vora.tiny_model import build_qwen3_vl
work = sys.argv[1]
t0 = time.time()
build_qwen3_vl(f'{work}/model', '2b', dtype='bfloat16', device='cuda')
print(f'model built in {time.time() - t0:.0f} s')
make_dataset(f'{work}/train', 16, duration=32.0, size=(640, 360), seed=1)
make_dataset(f'{work}/heldout', 4, duration=32.0, size=(640, 360), seed=2)
print('clips written')
PYEOF

step "2. swift-vora train recipes/h200x1.yaml (dense model, backend auto)"
swift-vora train recipes/h200x1.yaml \
  "model.path=$WORK/model" model.type=qwen3_vl train.backend=auto \
  "data.dataset=$WORK/train/annotations.jsonl" "train.output_dir=$WORK/run" \
  train.max_steps=8 train.grad_accum=2 train.save_steps=8 train.logging_steps=1 train.dataloader_workers=4 \
  video.max_frames=32 video.pair_tokens=256 2>&1 | tee "$LOGS/2-train.log"
ckpt="$(ls -d "$WORK"/run/v*/checkpoint-8 | tail -1)"
echo "checkpoint: $ckpt"
cp "$(dirname "$ckpt")"/memory_phases.rank0.jsonl "$(dirname "$ckpt")"/logging.jsonl "$LOGS/" 2>/dev/null || true
cp "$(dirname "$ckpt")"/*.json "$LOGS/" 2>/dev/null || true

step "3. swift-vora verify-adapter (reload base + adapter in a new process)"
swift-vora verify-adapter "$ckpt" 2>&1 | tee "$LOGS/3-verify-adapter.log"

step "4. scripts/merge_for_vllm.sh"
bash scripts/merge_for_vllm.sh "$ckpt" "$WORK/merged" 2>&1 | tee "$LOGS/4-merge.log"

step "5. swift-vora eval of the merged weights on the held-out clips"
swift-vora eval --annotations "$WORK/heldout/annotations.jsonl" --model "$WORK/merged" --model-type qwen3_vl \
  --predictions "$WORK/eval/predictions.jsonl" --out-dir "$WORK/eval" --max-new-tokens 48 --json \
  2>&1 | tee "$LOGS/5-eval.log"
cp "$WORK/eval/metrics.json" "$WORK/eval/report.md" "$WORK/eval/predictions.jsonl" "$LOGS/" 2>/dev/null || true
step "E2E DENSE OK"
