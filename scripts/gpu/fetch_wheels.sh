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
#   bash scripts/gpu/fetch_wheels.sh megatron   # .whl/megatron + .te0 (slim TE, one part): Megatron-SWIFT with
#                                               # Transformer Engine (not part of `all`: it downloads torch 2.11 +
#                                               # CUDA 13 headers to build TE's torch extension, ~4 GB under .build/)
#   TE_SLIM=0 bash scripts/gpu/fetch_wheels.sh megatron   # the untouched 171 MiB TE wheel in three parts .te0-.te2
#   APEX_SRC=/path/to/apex bash scripts/gpu/fetch_wheels.sh megatron   # NVIDIA apex's source tree (git clone
#                                               # https://github.com/NVIDIA/apex), needed once: apex's wheels are
#                                               # built from it (no registry has them)
#
# Layout (all under the git-ignored .whl/):
#   .whl/swift/*.whl        installed on the GPU machine by scripts/gpu/setup_env.sh (`--target /tmp/site`)
#   .whl/swift/build/*.whl  hatchling + its deps + editables: only for `pip install --no-index
#                           --find-links .whl/swift/build --no-deps -e .` there (never installed into /tmp/site)
#   .whl/unsloth/*.whl      the Unsloth set (trl 1.15 / datasets 4.8.5: never mix with .whl/swift)
#   .whl/moe/*.whl          Unsloth without its trl/datasets pins (ms-swift's trl 0.29.1 satisfies it) + fla
#   .whl/megatron/*.whl     megatron-core, mcore-bridge, peft 0.20, TE's meta wheel and its torch extension (built
#                           here from the sdist), apex (Python package + its fused_weight_gradient_mlp_cuda extension,
#                           built here from APEX_SRC) + SHA256SUMS of the TE core wheel and its three parts
#   .te0/ [.te1/ .te2/]     the TE core wheel in 57 MiB parts, one per device call (scripts/gpu/setup_megatron.sh
#                           reassembles, checks and installs them): by default the sm_90-only slim wheel
#                           (scripts/gpu/slim_te.py: 27.7 MiB, one part); TE_SLIM=0: the 171 MiB original, three
#   .whl/_orig/             untouched downloads the slimmed wheels were made from, and the whole TE core wheel
#                           (does not travel)
#   .build/                 the Python 3.12 + torch 2.11 environment that builds TE's torch extension (does not travel)
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

if [ "${CLEAN:-0}" = 1 ]; then rm -rf "$SWIFT" "$UNSLOTH" "$MOE" "$ORIG" "$WHL/megatron" "$ROOT"/.te[012]; fi
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
  # torchao: the FP8 casts and scaled products of train.fp8=frozen_base (swift_vora/speed/fp8_frozen.py); 3.4 MB
  torchao==0.18.0
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
    # --no-build-isolation builds with $PY's own setuptools and wheel: a bare python3 (no .venv yet) lacks `wheel`
    # and pip then fails with "invalid command 'bdist_wheel'" deep in its output; say so first.
    "$PY" -c 'import setuptools, wheel' 2>/dev/null || {
      echo "fetch_wheels: $PY has no setuptools/wheel to build deepspeed's wheel; run scripts/install.sh first" \
           "(or PY=<a python with both>)" >&2; exit 1; }
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
  # Two slimmings, no code touched (gpu-machine.md): Unsloth Studio (its web UI and its server, 9 of the wheel's
  # 12 MiB) out of unsloth -- training never imports it; the two files the unsloth package reads from it by path,
  # lazily, for its decision models (unsloth/_decision_common.py, models/decision_gguf.py) stay -- and the
  # bitsandbytes native libraries for other CUDA/ROCm/XPU versions out of bitsandbytes. RECORD follows.
  "$PY" "$ROOT/scripts/gpu/slim_wheel.py" "$ORIG"/unsloth-2026.10.9-*.whl "$UNSLOTH" \
    --drop 'studio/**' --keep 'studio/backend/vendor/laya/**' \
    --keep 'studio/backend/core/systemone/gguf_export_contract.py'
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

# --- Megatron-SWIFT (`megatron sft`) with Transformer Engine 2.11 ---------------------------------------------------
# megatron-core 0.16.1 (its TE range: >=2.9,<2.12) and mcore-bridge 1.6.5 are the versions this repository's CPU
# tests parse arguments with; peft 0.20.0 because ms-swift 4.6 and mcore-bridge pin peft<0.21 (the image has 0.21).
# pydantic (a TE runtime dependency) comes with .whl/swift. No flash-linear-attention: the Megatron run uses
# Qwen3-VL-MoE (no Gated DeltaNet); a Qwen3.5/3.6-MoE Megatron run would need `fetch_wheels.sh moe`'s fla wheels.
MEGATRON="$WHL/megatron"
TE_VERSION=2.11.0
TE_CORE="transformer_engine_cu13-${TE_VERSION}-py3-none-manylinux_2_28_x86_64.whl"
TE_CORE_SHA256=62febd0422cc9003f1048f97be75f4a05d6e43092baf28a5ff6b857b638181c0
TE_CORE_BYTES=179248112
TE_PART_SIZE=57M          # each part travels alone with the repository (<= 64 MiB per device call)
# TE_SLIM=1 (default): scripts/gpu/slim_te.py zeroes the device code of every GPU architecture but sm_90 (H200/H100)
# in libtransformer_engine.so (442 of the wheel's 445 MiB unpacked): 171 MiB -> 27.7 MiB, ONE device call instead of
# three. setup_megatron.sh then runs TE kernels on the GPU before anything else (a GPU of another architecture would
# find no kernel there: use TE_SLIM=0, or TE_KEEP_SM=<sm> for that one).
TE_SLIM="${TE_SLIM:-1}"
TE_KEEP_SM="${TE_KEEP_SM:-90}"
MEGATRON_SET=(megatron-core==0.16.1 mcore-bridge==1.6.5 peft==0.20.0 transformer-engine==$TE_VERSION)

# TE's torch extension has no wheel on PyPI: build it from its sdist against torch 2.11.0 (PyPI's build is the
# +cu130 one the GPU machine has) in a Python 3.12 venv under .build/. It is a C++ extension compiled by g++
# (no GPU code), but its setup.py reads the CUDA version from `nvcc -V`, and CUDA's headers include CCCL's
# <nv/target>: both come from pip (cuda-toolkit[nvcc,cccl] at torch's CUDA 13.0.2), nothing system-wide.
# Build time: 1187 s for the 28 .cpp files on the 2 shared CPU cores of the CPU machine with other jobs running
# (2026-12-01; 516 s on an idle pair). Result: a 0.7 MB cp312 linux_x86_64 wheel (needs glibc >= 2.34); with the TE
# core wheel and torch 2.11.0 it imports here on CPU (transformer_engine.pytorch, transformer_engine_torch).
build_venv() {  # build_venv WHAT: the Python 3.12 venv under .build/ that builds the compiled wheels
  local venv="$ROOT/.build/py312" py312="${PY312:-python3.12}"
  if [ ! -x "$venv/bin/python" ]; then
    "$py312" -c 'import sys; assert sys.version_info[:2] == (3, 12), sys.version' || {
      echo "fetch_wheels: need Python 3.12 for $1 (set PY312=/path/to/python3.12)" >&2; return 1; }
    "$py312" -m venv "$venv"
  fi
}

build_te_torch() {
  local venv="$ROOT/.build/py312"
  build_venv "the TE torch extension" || return 1
  "$venv/bin/python" -m pip install -q torch==2.11.0 "cuda-toolkit[nvcc,cccl]==13.0.2" setuptools
  local nv="$venv/lib/python3.12/site-packages/nvidia" tmp t0=$SECONDS
  tmp="$(mktemp -d)"
  NVTE_PYTORCH_FORCE_BUILD=TRUE CUDA_HOME="$nv/cu13" CPATH="$nv/cu13/include:$nv/nccl/include:$nv/cudnn/include" \
    MAX_JOBS="$(nproc)" "$venv/bin/python" -m pip wheel -q --no-build-isolation --no-deps \
    --no-binary transformer_engine_torch -w "$tmp" "transformer_engine_torch==$TE_VERSION"
  mv "$tmp"/transformer_engine_torch-"$TE_VERSION"-cp312-*.whl "$MEGATRON"/ && rm -rf "$tmp"
  echo "fetch_wheels: transformer_engine_torch built in $((SECONDS - t0)) s"
}

# NVIDIA apex (not PyPI's unrelated `apex`): megatron-core fuses the weight-gradient GEMM of its own linear layers
# with the accumulation into the fp32 main gradient through apex's CUDA extension fused_weight_gradient_mlp_cuda,
# and ms-swift 4.6 keeps that fusion on only where `import apex` works -- without apex each trainable tensor's
# gradient is added by a kernel of its own every micro-batch (swift_vora/backends/megatron_grad_fusion.py). No
# registry has apex's wheels and Megatron-SWIFT's users build it with --cpp_ext --cuda_ext: ~15 extensions, far too
# long on two cores. So two wheels from APEX_SRC (an apex source tree): (a) apex's Python package, built by its own
# setup.py without extension flags (py3-none-any); (b) the one extension megatron-core imports, compiled by
# scripts/gpu/build_apex_wgrad.py from apex's own sources with apex's own flags, for sm_90 only
# (cp312-cp312-linux_x86_64, torch 2.11.0+cu130). nvcc compiles CUDA here (TE's extension is C++ only): nvcc,
# nvvm (cicc) and crt must all be CUDA 13.0 -- nvidia-cuda-nvcc leaves nvvm/crt unpinned and pip then takes 13.5,
# whose PTX 9.5 13.0's ptxas refuses -- hence the nvvm,crt extras. Build time (2026-12-06, the 2 shared CPU cores):
# (a) 7 s, 0.24 MB; (b) 152-161 s for its 1 .cpp + 2 .cu files, 0.08 MB (its link drops the debug information
# Python's -g puts in: 2.9 MB with it). Both import on CPU with torch 2.11.0 (no GPU needed to import).
APEX_WHEEL="apex-0.1-py3-none-any.whl"
APEX_WGRAD_WHEEL="apex_fused_weight_gradient_mlp_cuda-0.1+cu130.torch2.11.0-cp312-cp312-linux_x86_64.whl"
build_apex() {
  local src="${APEX_SRC:-}" venv="$ROOT/.build/py312" tmp t0=$SECONDS
  if [ -z "$src" ] || [ ! -f "$src/setup.py" ] || [ ! -f "$src/csrc/megatron/fused_weight_gradient_dense.cpp" ]; then
    echo "fetch_wheels: the Megatron set needs NVIDIA apex's wheels, built from its source: set APEX_SRC to an apex" \
         "source tree (git clone https://github.com/NVIDIA/apex) -- $([ -z "$src" ] && echo "APEX_SRC is not set" ||
         echo "APEX_SRC=$src has no setup.py and csrc/megatron/fused_weight_gradient_dense.cpp")" >&2
    return 1
  fi
  src="$(cd "$src" && pwd)"
  build_venv "apex's CUDA extension" || return 1
  "$venv/bin/python" -m pip install -q torch==2.11.0 "cuda-toolkit[nvcc,cccl,nvvm,crt]==13.0.2" setuptools packaging
  local nv="$venv/lib/python3.12/site-packages/nvidia"
  tmp="$(mktemp -d)"
  # (called after ||: set -e does not hold in here, each step says so itself)
  # (a) pip builds a local tree in place (build/, egg-info): a copy, so APEX_SRC stays as it was. apex's setup.py
  # runs `nvcc -V` even without extensions (CUDA_HOME), and adds extensions for any APEX_* variable set to 1: none.
  cp -r "$src" "$tmp/apex" && (
    for v in $(compgen -e); do case "$v" in APEX_*) unset "$v";; esac; done
    CUDA_HOME="$nv/cu13" "$venv/bin/python" -m pip wheel -q --no-build-isolation --no-deps -w "$tmp/out" "$tmp/apex"
  ) || { echo "fetch_wheels: apex's Python wheel did not build" >&2; rm -rf "$tmp"; return 1; }
  # (b) the extension, from APEX_SRC's own sources and flags
  CUDA_HOME="$nv/cu13" CPATH="$nv/cu13/include:$nv/nccl/include:$nv/cudnn/include" MAX_JOBS="$(nproc)" \
    "$venv/bin/python" "$ROOT/scripts/gpu/build_apex_wgrad.py" "$src" "$tmp/out" --arch 9.0 \
    || { echo "fetch_wheels: apex's fused_weight_gradient_mlp_cuda did not build" >&2; rm -rf "$tmp"; return 1; }
  mv "$tmp/out/$APEX_WHEEL" "$tmp/out/$APEX_WGRAD_WHEEL" "$MEGATRON"/ || { rm -rf "$tmp"; return 1; }
  rm -rf "$tmp"
  echo "fetch_wheels: apex wheels built in $((SECONDS - t0)) s"
}

if [ "$WHAT" = megatron ]; then
  mkdir -p "$MEGATRON"
  fetch "$MEGATRON" "${MEGATRON_SET[@]}"
  ls "$MEGATRON"/transformer_engine_torch-"$TE_VERSION"-cp312-*.whl >/dev/null 2>&1 || build_te_torch
  [ -f "$MEGATRON/$APEX_WHEEL" ] && [ -f "$MEGATRON/$APEX_WGRAD_WHEEL" ] || build_apex
  fetch "$ORIG" "transformer-engine-cu13==$TE_VERSION"
  got="$(sha256sum "$ORIG/$TE_CORE" | cut -d' ' -f1)"
  if [ "$got" != "$TE_CORE_SHA256" ] || [ "$(stat -c %s "$ORIG/$TE_CORE")" != "$TE_CORE_BYTES" ]; then
    echo "fetch_wheels: $ORIG/$TE_CORE is not the wheel seen working (sha256 $got)" >&2; exit 1
  fi
  core="$ORIG/$TE_CORE" core_sha="$TE_CORE_SHA256"
  if [ "$TE_SLIM" = 1 ]; then
    rm -rf "$ORIG/te_slim"
    "$PY" "$ROOT/scripts/gpu/slim_te.py" "$ORIG/$TE_CORE" "$ORIG/te_slim" --keep-sm "$TE_KEEP_SM" --keep-ptx "$TE_KEEP_SM"
    core="$ORIG/te_slim/$TE_CORE" core_sha="$(sha256sum "$core" | cut -d' ' -f1)"
  fi
  # One part per git-ignored folder: each device call carries one of them; they accumulate on the warm machine.
  rm -rf "$ROOT"/.te0 "$ROOT"/.te1 "$ROOT"/.te2 "$ROOT"/.te3
  tmp="$(mktemp -d)"
  split -b "$TE_PART_SIZE" -d -a 1 "$core" "$tmp/$TE_CORE.part"
  n="$(ls "$tmp" | wc -l)"
  {
    echo "$core_sha  $TE_CORE"
    for ((i = 0; i < n; i++)); do
      mkdir -p "$ROOT/.te$i" && mv "$tmp/$TE_CORE.part$i" "$ROOT/.te$i/"
      (cd "$ROOT" && sha256sum ".te$i/$TE_CORE.part$i")
    done
  } > "$MEGATRON/SHA256SUMS"
  rm -rf "$tmp"
  echo "fetch_wheels: TE core wheel $([ "$TE_SLIM" = 1 ] && echo "slimmed to sm_$TE_KEEP_SM") in $n part(s):" \
       "carry each .teN in its own device call (back to back), then .whl/megatron"
fi

echo "== sizes (one device call carries <= 64 MiB including the repository)"
for d in "$SWIFT" "$BUILD" "$UNSLOTH" "$MOE" "$WHL/megatron" "$ROOT"/.te[0-9]; do
  [ -d "$d" ] || continue
  n=$(find "$d" -maxdepth 1 -name '*.whl*' | wc -l)  # (ls of an empty folder would stop the script: pipefail)
  printf "%-28s %3s wheels/parts  %s\n" "${d#$ROOT/}" "$n" "$(du -sh "$d" | cut -f1)"
done
