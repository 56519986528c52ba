#!/usr/bin/env bash
# Fetch the wheels that the lent GPU machine (Python 3.12.3, torch 2.11.0+cu130, transformers 5.17.0,
# peft 0.21.0, accelerate 1.15.0, no registry) needs to run `swift sft` / `swift infer` and the Unsloth path.
# Rerun any time: files already present are kept; set CLEAN=1 to start over.
#
#   bash scripts/gpu/fetch_wheels.sh            # both sets
#   bash scripts/gpu/fetch_wheels.sh swift      # .whl/swift only   (ms-swift + deepspeed + py-spy; build/ = hatchling set)
#   bash scripts/gpu/fetch_wheels.sh unsloth    # .whl/unsloth only (unsloth, slimmed; bitsandbytes, slimmed)
#   bash scripts/gpu/fetch_wheels.sh moe        # .whl/moe: what benchmarks/moe_throughput.py adds to .whl/swift --
#                                               # unsloth, unsloth_zoo, bitsandbytes (slimmed, from the unsloth set)
#                                               # and flash-linear-attention (fla-core + flash-linear-attention)
#
# Layout (all under the git-ignored .whl/):
#   .whl/swift/*.whl        installed on the GPU machine by scripts/gpu/setup_env.sh (`--target /tmp/site`)
#   .whl/swift/build/*.whl  hatchling + its deps + editables: only for `pip install --no-index
#                           --find-links .whl/swift/build --no-deps -e .` there (never installed into /tmp/site)
#   .whl/unsloth/*.whl      the Unsloth set (trl 1.15 / datasets 4.8.5: never mix with .whl/swift)
#   .whl/moe/*.whl          Unsloth without its trl/datasets pins (ms-swift's trl 0.29.1 satisfies it) + fla
#   .whl/_orig/             untouched downloads the slimmed wheels were made from (does not travel)
# Every set must stay under ~60 MiB: one device call carries at most 64 MiB, repository included.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${PY:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || PY=python3
WHL="$ROOT/.whl"
SWIFT="$WHL/swift"
BUILD="$SWIFT/build"
UNSLOTH="$WHL/unsloth"
MOE="$WHL/moe"
ORIG="$WHL/_orig"
WHAT="${1:-all}"

if [ "${CLEAN:-0}" = 1 ]; then rm -rf "$SWIFT" "$UNSLOTH" "$MOE" "$ORIG"; fi
mkdir -p "$SWIFT" "$BUILD" "$UNSLOTH" "$ORIG"

# Python 3.12, x86_64 Linux (glibc 2.35+ there): pip matches each manylinux tag exactly, so list them all.
PLAT=(--python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none --only-binary=:all: --no-deps)
for tag in manylinux1_x86_64 manylinux2010_x86_64 manylinux2014_x86_64 manylinux_2_5_x86_64 manylinux_2_12_x86_64 \
           manylinux_2_17_x86_64 manylinux_2_24_x86_64 manylinux_2_27_x86_64 manylinux_2_28_x86_64 \
           manylinux_2_31_x86_64 manylinux_2_34_x86_64 linux_x86_64 any; do
  PLAT+=(--platform "$tag")
done

fetch() {  # fetch DEST NAME==VERSION ...
  local dest="$1"; shift
  for req in "$@"; do
    local name="${req%%==*}" ver="${req##*==}"
    local norm; norm="$(echo "$name" | tr 'A-Z-' 'a-z_')"
    if ls "$dest" 2>/dev/null | tr 'A-Z-' 'a-z_' | grep -q "^${norm}-${ver}-"; then continue; fi
    "$PY" -m pip download -q "${PLAT[@]}" -d "$dest" "$req"
  done
}

# --- the ms-swift set (gpu-machine.md: 31 MiB, ran `swift sft` LoRA and --deepspeed zero3 there) -------
# Versions: the ones of this repository's .venv, where the CPU tests run (pinned, so reruns agree).
SWIFT_SET=(
  ms-swift==4.6.0 modelscope==1.40.2 modelscope-hub==0.5.1 datasets==4.8.4 dill==0.4.1 multiprocess==0.70.19
  trl==0.29.1 qwen-vl-utils==0.0.14 decord==0.6.0 json-repair==0.64.6 cryptography==50.0.2 cffi==2.1.1
  pycparser==3.12 defusedxml==0.7.1 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0
  typing-inspection==0.4.5 addict==2.4.0 binpacking==2.0.1 dacite==1.9.2 hjson==3.1.0
  # py-spy: sampling profiler for benchmarks/throughput.py (binary in /tmp/site/bin).
  py-spy==0.4.3
  # liger-kernel: Triton RMSNorm / RoPE / fused linear cross entropy (`--use_liger_kernel true`; Triton is in the
  # image with torch). Pure Python, 0.9 MB.
  liger-kernel==0.8.5
)
# Not carried, already in the image (KINDS.md list): pyarrow, xxhash, fsspec, pandas, requests, httpx,
# huggingface-hub, numpy, pyyaml, tqdm, filelock, packaging, safetensors, tokenizers, einops, msgpack,
# ninja, py-cpuinfo, psutil, nvidia-ml-py, tiktoken, sentencepiece, simplejson, sortedcontainers, tensorboard,
# aiohttp, scipy, pillow, matplotlib, opencv-python-headless, triton, torchvision.
# Not carried and not imported by `swift sft` / `swift infer --infer_backend transformers` (checked on CPU
# with a 3.11 venv holding only the image's names + this set, see benchmarks/README.md): fastapi, uvicorn,
# openai, oss2, nltk, rouge, attrdict, cpm-kernels, transformers-stream-generator, zstandard, av.
BUILD_SET=(hatchling==1.33.0 pathspec==1.1.1 pluggy==1.7.0 trove-classifiers==2026.9.21.13 packaging==26.3 tomlkit==0.15.2 editables==0.6)

UNSLOTH_SET=(
  unsloth==2026.10.9 unsloth-zoo==2026.10.9 trl==1.15.0 datasets==4.8.5 dill==0.4.1 multiprocess==0.70.19
  bitsandbytes==0.50.2 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
)

if [ "$WHAT" = all ] || [ "$WHAT" = swift ]; then
  fetch "$SWIFT" "${SWIFT_SET[@]}"
  fetch "$BUILD" "${BUILD_SET[@]}"
  # deepspeed ships an sdist only: build a pure-Python wheel with no compiled ops (they JIT-build, or are unused).
  if ! ls "$SWIFT"/deepspeed-0.19.8-*.whl >/dev/null 2>&1; then
    tmp="$(mktemp -d)"
    DS_BUILD_OPS=0 DS_BUILD_AIO=0 DS_BUILD_GDS=0 "$PY" -m pip wheel -q --no-deps --no-build-isolation \
      --no-binary deepspeed -w "$tmp" deepspeed==0.19.8
    mv "$tmp"/deepspeed-0.19.8-*.whl "$SWIFT"/ && rm -rf "$tmp"
  fi
fi

if [ "$WHAT" = all ] || [ "$WHAT" = unsloth ] || [ "$WHAT" = moe ]; then
  fetch "$ORIG" unsloth==2026.10.9 bitsandbytes==0.50.2
  rest=()
  for req in "${UNSLOTH_SET[@]}"; do
    case "$req" in unsloth==*|bitsandbytes==*) ;; *) rest+=("$req");; esac
  done
  fetch "$UNSLOTH" "${rest[@]}"
  # Two slimmings, no code touched (gpu-machine.md): the Studio web-UI assets out of unsloth, and the
  # bitsandbytes native libraries for other CUDA/ROCm/XPU versions out of bitsandbytes. RECORD follows.
  "$PY" "$ROOT/scripts/gpu/slim_wheel.py" "$ORIG"/unsloth-2026.10.9-*.whl "$UNSLOTH" \
    --drop 'studio/frontend/**' --drop 'studio/src-tauri/**'
  "$PY" "$ROOT/scripts/gpu/slim_wheel.py" "$ORIG"/bitsandbytes-0.50.2-*.whl "$UNSLOTH" \
    --drop '**/*.so' --drop '**/*.dll' --drop '**/*.dylib' \
    --keep '**/libbitsandbytes_cpu.so' --keep '**/libbitsandbytes_cuda130.so'
fi

if [ "$WHAT" = all ] || [ "$WHAT" = moe ]; then
  # Gated DeltaNet kernels for Qwen3.5/3.6 (Triton, pure Python): transformers binds them when `fla` imports.
  mkdir -p "$MOE"
  fetch "$MOE" fla-core==0.6.0 flash-linear-attention==0.6.0
  for name in unsloth unsloth_zoo bitsandbytes; do
    cp -n "$UNSLOTH/$name"-*.whl "$MOE"/
  done
fi

echo "== sizes (one device call carries <= 64 MiB including the repository)"
for d in "$SWIFT" "$BUILD" "$UNSLOTH" "$MOE"; do
  n=$(ls "$d"/*.whl 2>/dev/null | wc -l)
  printf "%-28s %3s wheels  %s\n" "${d#$ROOT/}" "$n" "$(du -sh "$d" | cut -f1)"
done
