#!/usr/bin/env bash
# Merged bf16 weights that vLLM can load, from a swift / Megatron / Unsloth adapter checkpoint.
#
#   scripts/merge_for_vllm.sh ADAPTER_DIR OUT_DIR [--base MODEL_DIR] [--copy]
#
# Detects where the adapter came from (swift LoRA -> swift export --merge_lora; Megatron -> its
# checkpoint-N-merged, copied and verified; Unsloth -> merged_16bit). An existing merged folder's weight
# files are hard-linked on the same filesystem (no second copy; --copy copies them). Writes into a temporary directory
# next to OUT_DIR and renames it at the end. Refuses to overwrite OUT_DIR. Checks the result (bf16
# safetensors, complete index, no LoRA keys, an architecture vLLM serves, tokenizer/processor files).
# Exit codes: 0 merged and verified, 1 merge or check failed, 2 usage (missing input, OUT_DIR exists).
set -euo pipefail

if [ "$#" -lt 2 ]; then
  echo "usage: $0 ADAPTER_DIR OUT_DIR [--base MODEL_DIR] [--copy]" >&2
  exit 2
fi
adapter_dir="$1"
out_dir="$2"
shift 2

verify_only=0
for arg in "$@"; do
  if [ "$arg" = --verify-only ]; then verify_only=1; fi
done
# --verify-only checks an existing OUT_DIR; a merge never writes over one
if [ "$verify_only" = 0 ] && { [ -e "$out_dir" ] || [ -L "$out_dir" ]; }; then
  echo "merge_for_vllm: $out_dir exists: refusing to overwrite it" >&2
  exit 2
fi

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo_root="$(dirname "$script_dir")"
python="${PYTHON:-}"
if [ -z "$python" ]; then
  if [ -x "$repo_root/.venv/bin/python" ]; then
    python="$repo_root/.venv/bin/python"
  else
    python="python3"
  fi
fi

export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 MODELSCOPE_OFFLINE=1 USE_HF=1
exec "$python" -m swift_vora.backends.merge "$adapter_dir" "$out_dir" "$@"
