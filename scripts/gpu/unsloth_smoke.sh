#!/usr/bin/env bash
# GPU smoke test of the Unsloth split-LoRA backend (one H200): offline, random weights, a few steps.
#
#   bash scripts/gpu/unsloth_smoke.sh [WORK_DIR]          # default WORK_DIR: /tmp/unsloth_smoke
#
# What it does, and what must hold:
#   1. builds a MoE-shaped random Qwen3-VL-MoE (8 experts, top-2) offline with swift_vora.tiny_model, and four
#      synthetic 16 s clips with known answers;
#   2. `swift-vora train recipes/h200x1.yaml` with overrides: plans (h200x1 profile), then launches
#      `python -m swift_vora.backends.unsloth_runner` = Unsloth FastModel (16-bit) + get_peft_model with explicit
#      targets + the video_ora template + a plain AdamW loop, 5 steps; saves checkpoint-5 and checkpoint-5-merged;
#   3. checks: expert LoRA tensors trained (B != 0), no LoRA on the router or the vision tower, loss finite,
#      Unsloth's split MoE LoRA path on (UNSLOTH_MOE_LORA_MERGED unset), peak GPU memory recorded;
#   4. scripts/merge_for_vllm.sh checkpoint-5 -> merged bf16 weights, verified (index, no LoRA keys, architecture).
# Prints SMOKE OK at the end; exit code non-zero on the first failure. Results (logs, result JSON) are copied to
# $OUT when that variable is set (the device tool's output folder).
#
# Environment: ms-swift 4.6 + its set, and unsloth + unsloth_zoo + bitsandbytes, importable by python3. If they
# are not, and .whl/swift and .whl/unsloth exist (bash scripts/gpu/fetch_wheels.sh on a machine with a registry),
# they are installed into /tmp/site: the ms-swift set with ITS trl 0.29.1 and datasets 4.8.4 (unsloth 2026.10.9
# accepts trl >=0.18.2,<=1.15 and datasets <5), plus unsloth, unsloth_zoo and bitsandbytes from the Unsloth set.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
WORK="${1:-/tmp/unsloth_smoke}"
PY="${PY:-python3}"
cd "$ROOT"

if ! "$PY" -c 'import swift, unsloth' >/dev/null 2>&1; then
  if ls .whl/swift/*.whl >/dev/null 2>&1 && ls .whl/unsloth/unsloth-*.whl >/dev/null 2>&1; then
    echo "== installing the wheel sets into /tmp/site"
    wheels=(.whl/swift/*.whl)
    for name in unsloth unsloth_zoo bitsandbytes; do
      wheels+=(.whl/unsloth/"$name"-*.whl)
    done
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "${wheels[@]}"
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
    export PATH="/tmp/site/bin:$PATH"
  else
    echo "unsloth_smoke: ms-swift and unsloth are not importable and .whl/swift, .whl/unsloth are missing" >&2
    echo "  (run bash scripts/gpu/fetch_wheels.sh where a registry is reachable, and carry .whl)" >&2
    exit 2
  fi
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"  # swift_vora from this checkout
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 MODELSCOPE_OFFLINE=1 USE_HF=1
export UNSLOTH_DISABLE_STATISTICS=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
unset UNSLOTH_MOE_LORA_MERGED  # the split path is Unsloth's default; this variable would turn it off

rm -rf "$WORK"
mkdir -p "$WORK"
"$PY" -c 'import torch, unsloth, unsloth_zoo, trl, transformers, peft, swift
print("versions: torch", torch.__version__, "| unsloth", unsloth.__version__, "| unsloth_zoo", unsloth_zoo.__version__,
      "| trl", trl.__version__, "| transformers", transformers.__version__, "| peft", peft.__version__,
      "| ms-swift", swift.__version__, "| cuda", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")' 2>&1 | grep -v -i warn | tail -1

echo "== 1. random MoE model and synthetic clips (offline)"
"$PY" - "$WORK" <<'PYEOF'
import sys
from swift_vora.synthetic import make_dataset
from swift_vora.tiny_model import TinyShape, build_tiny_qwen3_vl
work = sys.argv[1]
shape = TinyShape(hidden_size=256, intermediate_size=512, num_experts=8, experts_per_token=2, moe_intermediate_size=128)
build_tiny_qwen3_vl(f'{work}/model', moe=True, shape=shape)
make_dataset(f'{work}/data', 4, duration=16.0)
print('model and data in', work)
PYEOF

echo "== 2. swift-vora train recipes/h200x1.yaml (plan -> Unsloth runner), 5 steps"
set +e
"$PY" -m swift_vora train recipes/h200x1.yaml \
  "model.path=$WORK/model" model.type=qwen3_vl_moe "data.dataset=$WORK/data/annotations.jsonl" \
  "train.output_dir=$WORK/run" train.max_steps=5 train.grad_accum=1 train.save_steps=5 train.logging_steps=1 \
  train.lr=1e-3 video.max_frames=8 video.pair_tokens=64 data.window=16 data.stride=16 data.max_length=4096 \
  unsloth.save_merged=true 2>&1 | tee "$WORK/train.log"
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" -ne 0 ]; then
  echo "unsloth_smoke: training failed (exit $rc); see $WORK/train.log" >&2
  [ -n "${OUT:-}" ] && cp "$WORK/train.log" "$OUT/" || true
  exit 1
fi

echo "== 3. checks on the adapter"
"$PY" - "$WORK" <<'PYEOF'
import json, math, os, sys
from safetensors.torch import load_file
work = sys.argv[1]
ckpt = f'{work}/run/checkpoint-5'
result = json.load(open(f'{work}/run/unsloth_run_result.json'))
print(json.dumps({k: result.get(k) for k in ('loader', 'split_lora', 'moe_backend', 'lora_tensors',
                                              'expert_lora_tensors', 'trainable_params', 'max_memory_allocated_gib',
                                              'max_memory_reserved_gib')}, indent=1))
assert result['loader'] == 'unsloth' and result['split_lora'] is True, result
assert result['expert_lora_tensors'] > 0, 'no LoRA on the experts'
weights = load_file(f'{ckpt}/adapter_model.safetensors')
expert = [k for k in weights if 'experts' in k]
assert expert, sorted(weights)[:20]
trained_b = [k for k in expert if 'lora_B' in k and float(weights[k].float().abs().sum()) > 0]
assert trained_b, f'expert LoRA B still zero: {expert[:6]}'
bad = [k for k in weights if '.gate.' in k or 'shared_expert_gate' in k or 'visual' in k]
assert not bad, f'LoRA on router / vision: {bad[:6]}'
log = [json.loads(l) for l in open(f'{work}/run/train_log.jsonl')]
assert [r['step'] for r in log] == [1, 2, 3, 4, 5] and all(math.isfinite(r['loss']) for r in log), log
assert os.path.isfile(f'{ckpt}-merged/config.json'), 'save_pretrained_merged wrote nothing'
print(f'adapter OK: {len(expert)} expert LoRA tensors ({len(trained_b)} B trained), losses',
      [round(r['loss'], 4) for r in log])
PYEOF

echo "== 4. merge for vLLM"
bash scripts/merge_for_vllm.sh "$WORK/run/checkpoint-5" "$WORK/merged" | tee "$WORK/merge.log"

if [ -n "${OUT:-}" ]; then
  cp "$WORK/train.log" "$WORK/merge.log" "$WORK/run/unsloth_run_result.json" "$WORK/run/train_log.jsonl" "$OUT/" || true
fi
echo "SMOKE OK"
