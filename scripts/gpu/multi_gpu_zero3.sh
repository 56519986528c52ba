#!/usr/bin/env bash
# Multi-GPU dense video SFT under DeepSpeed ZeRO-3 with every guard on (issue 8), on all GPUs of this host.
#
#   bash scripts/gpu/multi_gpu_zero3.sh [WORK_DIR]      # after scripts/gpu/setup_env.sh swift; default $TMPDIR/mgpu (/tmp)
#
# 1. NCCL sanity: scripts/gpu/nccl_sanity.py on every GPU (known all-reduce answer + bus bandwidth).
# 2. A random Qwen3-VL with the 2B shape and 5 synthetic clips of 12-40 s cut into 16 s windows: 9 training
#    samples of different lengths (16, 8, 12 s windows -> different frame counts per rank), not divisible by 2 or 4.
# 3. `swift-vora train recipes/3090x3.yaml hardware=local ...`: the planner sees this host's GPUs and picks ZeRO-3;
#    one epoch; guards: ZeRO-3 load verification, rank coverage (dropped / padded samples), per-rank sample ids,
#    LoRA update, memory per phase and rank, adapter reload in a fresh process at the end (verify_adapter).
# Logs into $OUT/multi_gpu_zero3 when OUT is set.
set -euo pipefail

# shellcheck source=scripts/gpu/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
phase_dirs multi_gpu_zero3 mgpu "${1:-}"
N="$(nvidia-smi -L | wc -l)"
fresh_work

step "1. NCCL sanity on $N GPUs"
"$PY" -m torch.distributed.run --nproc_per_node "$N" scripts/gpu/nccl_sanity.py 2>&1 | tee "$LOGS/1-nccl.log"

step "2. 2B-shaped random Qwen3-VL and 5 clips of different lengths"
"$PY" - "$WORK" <<'PYEOF' 2>&1 | tee "$LOGS/2-build.log"
import sys
from swift_vora.synthetic import make_dataset
from swift_vora.tiny_model import build_qwen3_vl
work = sys.argv[1]
build_qwen3_vl(f'{work}/model', '2b', dtype='bfloat16', device='cuda')
make_dataset(f'{work}/data', 5, size=(640, 360), seed=3, durations=[16.0, 24.0, 40.0, 12.0, 28.0])
PYEOF

step "3. swift-vora train recipes/3090x3.yaml on this host ($N GPUs)"
SWIFT_VORA_MEMORY_FIRST=100 swift-vora train recipes/3090x3.yaml hardware=local \
  "model.path=$WORK/model" model.type=qwen3_vl "data.dataset=$WORK/data/annotations.jsonl" \
  data.window=16 data.stride=16 "train.output_dir=$WORK/run" train.grad_accum=1 train.epochs=1 \
  train.logging_steps=1 train.save_steps=100 train.dataloader_workers=2 video.max_frames=32 \
  2>&1 | tee "$LOGS/3-train.log"
run="$(ls -d "$WORK"/run/v* | tail -1)"
cp "$run"/*.json "$run"/*.jsonl "$LOGS/" 2>/dev/null || true
step "MULTI-GPU ZERO-3 OK"
