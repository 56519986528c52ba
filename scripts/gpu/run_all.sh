#!/usr/bin/env bash
# One entry point for the lent GPU machine: set up the carried wheels, run phases, leave results in $OUT.
#
#   bash scripts/gpu/run_all.sh PHASE[,PHASE...] [extra args for the phase's command]
#
# Run from the repository root through the device tool with carry [".whl/swift"] (plus ".whl/unsloth" for the
# unsloth phase), or with carry [".wpk/<pack>.tar.xz"] alone: a wheel pack holding the sets the phases need,
# unpacked into .whl/ before anything else (`python scripts/gpu/wheel_pack.py pack --sets swift,moe,megatron
# --exclude py_spy,torchao,deepspeed,liger_kernel`: 48.5 MiB with apex, which makes megatron_moe one call from a bare
# machine; with the repository it comes near the 64 MiB a call carries, so the kernel cache no longer rides along;
# swift,moe: 30.9 MiB).
# Phases (each must fit the tool's 10-minute command limit; estimates in brackets):
#   setup         install + versions + the `--custom_register_path swift_vora` check only          [~1 min]
#   throughput    benchmarks/throughput.py: plain swift sft vs swift-vora, 2B-shape Qwen3-VL        [~6 min]
#   learnability  benchmarks/learnability.py: true vs shuffled labels, R1@0.5 on held-out videos     [~6 min]
#   calibrate     benchmarks/calibrate_memory.py (measured vs planned memory), JSON into $OUT
#   e2e           pytest -m gpu tests/ (the GPU-marked tests; none marked = rc 0 with a note); junit XML into $OUT;
#                 with .whl/moe carried, the MoE set installed first (e.g. `e2e -k flas_grouped_kernel`)
#   e2e_dense     scripts/gpu/e2e_dense.sh: recipe -> ZeRO-3 LoRA -> verify-adapter -> merge -> eval (2B shape) [~5 min]
#   multi_gpu_zero3  scripts/gpu/multi_gpu_zero3.sh: NCCL sanity + ZeRO-3 LoRA on every GPU of the host, all guards
#   moe           benchmarks/moe_throughput.py: Unsloth split LoRA vs plain swift PEFT, Qwen3.5-MoE 35B-A3B shape with
#                 N layers (needs carry [".whl/swift", ".whl/moe"]: ~56 MiB with the repo)
#   moe_full      the same at full depth: all 40 layers of the 35B-A3B (~65 GiB), built in a RAM-backed tmpfs
#                 ($TMPDIR/model_tmpfs, 88 GiB at most) because the disk is smaller; with --flagship, base shards
#                 move to the disk ($TMPDIR/model_spill) until the tmpfs holds the merged copy too; longer than one
#                 call: run it through scripts/gpu/background.sh (start, then wait from back-to-back calls)
#   unsloth       scripts/gpu/unsloth_smoke.sh (needs carry [".whl/swift", ".whl/unsloth"]: ~59 MiB with the repo)
#   megatron      scripts/gpu/megatron_smoke.sh: Megatron-SWIFT EP=1 LoRA on one GPU, random Qwen3-VL-MoE, checks +
#                 megatron-h200-<date>.json. Needs scripts/gpu/setup_megatron.sh's inputs: .te0, .te1, .te2 carried
#                 by three earlier back-to-back calls, then carry [".whl/swift", ".whl/megatron"] (docs/backends.md)
#   megatron_ep   scripts/gpu/megatron_ep.sh: the same with EP=2 over two GPUs (refuses on fewer GPUs, exit 4)
#   megatron_moe  issue #31: Megatron-SWIFT LoRA on the Qwen3.5-MoE 35B-A3B shape cut to 8 layers, side by side
#                 with swift-vora's Unsloth path and plain swift PEFT (benchmarks/megatron_moe.py budgets each
#                 variant). First scripts/gpu/gdn_grad_check.py (the Gated DeltaNet kernel Megatron will bind against
#                 the PyTorch reference; SWIFT_VORA_GDN_CHECK=skip skips its ~150 s once it has passed). Carry [".wpk/megatron-call.tar.xz"] (packed with --sets
#                 swift,moe,megatron; one call from a bare machine), or else the Megatron set installed by an earlier
#                 call (setup_megatron.sh
#                 install, carry [".te0", ".whl/megatron", ".whl/moe"], the slim TE wheel) and carry [".whl/swift"].
#                 ~18-20 min with --deadline 840: run it through scripts/gpu/background.sh (docs/backends.md)
#   megatron_optimizer_check  scripts/gpu/coalesced_optimizer_check.py: the coalesced distributed optimizer against
#                 megatron-core's per-tensor one on 8,256 MoE LoRA tensors (real DDP, TE's FusedAdam): the same weights
#                 bit for bit, the optimizer step's time; carry [".wpk/megatron-call.tar.xz"]; takes no arguments [~3 min]
#   kernel_cache_export  `swift-vora kernel-cache export` of this machine's Triton and inductor caches into $OUT
#                 (kernel-cache.tar.xz.part0, ...): keep them in .kcache/ here and carry [".kcache"]; run_all imports
#                 them before its phases, so a fresh machine's first step does not compile for minutes. Put it last:
#                 `moe_full,kernel_cache_export` (its phase arguments go to every phase; it takes none)
# Example: `bash scripts/gpu/run_all.sh throughput --variants baseline,vora,vora_gc`.
#
# $OUT receives (the tool returns at most 8 files): run.log (all output), each phase's results JSON
# (<name>-<date>.json; copy it into benchmarks/results/ in the repo) and logs-<phase>.tgz (swift logs,
# encode/progress logs, py-spy profiles, inference results; no videos, models, checkpoints, plots or TensorBoard
# events).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SCRATCH="${TMPDIR:-/tmp}"  # work dirs, logs and the MoE wheel folders below
OUT="${OUT:-$SCRATCH/swift_vora_out}"
LOGS="$SCRATCH/swift_vora_logs"

# Unsloth (+ unsloth_zoo, bitsandbytes) in a folder of their own behind the ms-swift set ($SCRATCH/site-moe: an
# `--upgrade --target` install into the ms-swift set's folder replaces its bin/ and with it the `swift`, `megatron`
# and `py-spy` commands), flash-linear-attention in another ($SCRATCH/site-fla) so that a variant can run without it.
install_moe_wheels() {
  ls .whl/moe/unsloth-*.whl >/dev/null 2>&1 || { echo "moe: no .whl/moe (bash scripts/gpu/fetch_wheels.sh moe)"; return 2; }
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SCRATCH/site-moe" \
    .whl/moe/unsloth-*.whl .whl/moe/unsloth_zoo-*.whl .whl/moe/bitsandbytes-*.whl || return 1
  case ":$PYTHONPATH:" in *":$SCRATCH/site-moe:"*) ;; *) export PYTHONPATH="$PYTHONPATH:$SCRATCH/site-moe";; esac
  # Not on PYTHONPATH by default: fla 0.6 refuses the Gated DeltaNet backward on Hopper with Triton < 3.7.1 (wrong
  # results upstream, fla #640), and the image has Triton 3.6. moe_throughput.py's *_fla variants add it; nothing
  # else needs it (the runs bind unsloth_zoo's vendored fla), so a pack for the other phases may leave its wheels out.
  if ls .whl/moe/fla_core-*.whl .whl/moe/flash_linear_attention-*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SCRATCH/site-fla" \
      .whl/moe/fla_core-*.whl .whl/moe/flash_linear_attention-*.whl || return 1
    export SWIFT_VORA_FLA_PATH="$SCRATCH/site-fla"
  else
    echo "moe: no flash-linear-attention 0.6 wheels in .whl/moe: the *_fla variants cannot run"
  fi
  export UNSLOTH_DISABLE_STATISTICS=1
  python3 -c 'import unsloth, unsloth_zoo, fla; print("moe wheels: unsloth", unsloth.__version__, "| unsloth_zoo",
unsloth_zoo.__version__, "| fla", getattr(fla, "__version__", "?"), fla.__file__)' 2>&1 | grep -v -i warn | tail -3
}

# A tmpfs for the full-depth MoE checkpoint: 88 GiB of RAM at most, only what is written is used (65.4 GiB of base
# weights; with --flagship, the flagship's merged copy beside what is left of them after base shards moved to the
# disk: benchmarks/merge_room.py). Remounted larger where an earlier call mounted it at 72 GiB.
MODEL_TMPFS="$SCRATCH/model_tmpfs"
MODEL_TMPFS_GIB=88
MODEL_SPILL="$SCRATCH/model_spill"  # on the disk: base shards moved out of the tmpfs (links left in their place)
mount_model_tmpfs() {
  if ! mountpoint -q "$MODEL_TMPFS"; then
    mkdir -p "$MODEL_TMPFS" && mount -t tmpfs -o "size=${MODEL_TMPFS_GIB}g" tmpfs "$MODEL_TMPFS" || {
      echo "moe_full: cannot mount a ${MODEL_TMPFS_GIB} GiB tmpfs at $MODEL_TMPFS (root needed)"; return 1; }
  else
    mount -o "remount,size=${MODEL_TMPFS_GIB}g" "$MODEL_TMPFS" || echo "moe_full: $MODEL_TMPFS kept its size"
  fi
  df -h "$MODEL_TMPFS" | tail -1
  free -g | head -2
}

# The Megatron set installed in its own folder (scripts/gpu/setup_megatron.sh, in a subshell: nothing of it is exported
# here) and that folder printed last, for a PYTHONPATH that only the Megatron processes get
megatron_site() {
  ( source "$ROOT/scripts/gpu/setup_megatron.sh" all ) >&2 || return 1
  echo "${SWIFT_VORA_MEGATRON_SITE:-$SCRATCH/site-megatron}"
}

main() {
  local phases="${1:-setup}"
  shift || true
  cd "$ROOT" || return 2
  echo "== run_all $phases $* ($(date -u +%FT%TZ)) on $(hostname), $(nproc) cores"
  nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader 2>/dev/null || true
  local t0=$SECONDS
  # A wheel pack (scripts/gpu/wheel_pack.py, carry [".wpk/<pack>.tar.xz"]) puts its sets under .whl/ first: one call
  # brings what used to take several back to back
  local pack
  for pack in "$ROOT"/.wpk/*.tar.xz; do
    [ -f "$pack" ] || continue
    python3 "$ROOT/scripts/gpu/wheel_pack.py" unpack "$pack" --root "$ROOT" || { echo "== setup failed"; return 1; }
  done
  # shellcheck source=/dev/null
  source "$ROOT/scripts/gpu/setup_env.sh" swift || { echo "== setup failed"; return 1; }
  # Compiled kernels of an earlier machine (carry [".kcache"], from the kernel_cache_export phase): the first
  # optimizer step then reads them instead of compiling and autotuning for minutes
  if [ -f "$ROOT/.kcache/kernel-cache.tar.xz" ] || [ -f "$ROOT/.kcache/kernel-cache.tar.xz.part0" ]; then
    swift-vora kernel-cache import "$ROOT/.kcache/kernel-cache.tar.xz" || echo "== kernel cache not imported"
  fi
  echo "== setup done in $((SECONDS - t0)) s"

  local rc=0 phase t1 work extra_logs
  IFS=',' read -r -a list <<< "$phases"
  for phase in "${list[@]}"; do
    t1=$SECONDS
    work="" extra_logs=""
    echo "== phase $phase"
    case "$phase" in
      setup) ;;
      throughput)
        work="$SCRATCH/swift_vora_bench"
        python3 benchmarks/throughput.py --out "$LOGS/$phase" --work "$work" "$@" || rc=1;;
      learnability)
        work="$SCRATCH/swift_vora_learn"
        python3 benchmarks/learnability.py --out "$LOGS/$phase" --work "$work" "$@" || rc=1;;
      calibrate)
        mkdir -p "$LOGS/$phase"
        if [ -f benchmarks/calibrate_memory.py ]
        then python3 benchmarks/calibrate_memory.py --out "$LOGS/$phase/calibrate_memory-$(date +%F).json" "$@" || rc=1
        else echo "calibrate: benchmarks/calibrate_memory.py is not in this checkout"; rc=2
        fi;;
      e2e)
        # the MoE set where it was carried: its GPU tests (fla's kernel as Unsloth binds it) run instead of skipping
        if ls .whl/moe/unsloth-*.whl >/dev/null 2>&1; then install_moe_wheels || rc=1; fi
        python3 -m pytest -m gpu -q -rs --junitxml="$OUT/e2e-junit.xml" tests/ "$@"
        case $? in 0) ;; 5) echo "e2e: no test is marked gpu";; *) rc=1;; esac;;
      e2e_dense)
        work="$SCRATCH/e2e_dense"
        OUT="$LOGS/$phase" bash scripts/gpu/e2e_dense.sh "$work" "$@" || rc=1;;
      multi_gpu_zero3)
        work="$SCRATCH/mgpu"
        OUT="$LOGS/$phase" bash scripts/gpu/multi_gpu_zero3.sh "$work" "$@" || rc=1;;
      moe)
        # benchmarks/moe_throughput.py: Unsloth split LoRA vs plain swift PEFT on a Qwen3.5-MoE (carry .whl/moe too)
        install_moe_wheels || { rc=1; continue; }
        work="$SCRATCH/swift_vora_moe"
        python3 benchmarks/moe_throughput.py --out "$LOGS/$phase" --work "$work" "$@" || rc=1;;
      moe_full)
        # The whole 35B-A3B (40 layers, ~65 GiB in bf16) does not fit the machine's 64 GiB disk: its checkpoint is
        # built in a RAM-backed tmpfs (128 GiB of RAM; root) and loaded from there by every variant, as from a disk.
        install_moe_wheels || { rc=1; continue; }
        mount_model_tmpfs || { rc=1; continue; }
        work="$SCRATCH/swift_vora_moe_full"
        # --flagship writes beside the checkpoint (its merged copy is hard-linked there, not copied) after moving
        # base shards to the disk until the tmpfs has room for that copy; other variants leave both as they are
        extra_logs="${MODEL_TMPFS#"$SCRATCH"/}/flagship"
        python3 benchmarks/moe_throughput.py --out "$OUT" --work "$work" --model-dir "$MODEL_TMPFS/model" \
          --flagship-work "$MODEL_TMPFS/flagship" --spill-dir "$MODEL_SPILL" --layers 40 --name moe-h200-full "$@" \
          || rc=1;;
      unsloth)
        if [ -f scripts/gpu/unsloth_smoke.sh ]; then
          mkdir -p "$LOGS/$phase"
          OUT="$LOGS/$phase" bash scripts/gpu/unsloth_smoke.sh "$SCRATCH/unsloth_smoke" "$@" || rc=1
        else
          echo "unsloth: scripts/gpu/unsloth_smoke.sh is not in this checkout"; rc=2
        fi;;
      megatron|megatron_ep)
        # TE + megatron-core + mcore-bridge + peft 0.20 into $TMPDIR/site-megatron (/tmp), in front of PYTHONPATH (once)
        # shellcheck source=/dev/null
        source "$ROOT/scripts/gpu/setup_megatron.sh" all || { rc=1; continue; }
        command -v megatron >/dev/null || { echo "megatron: no \`megatron\` command on PATH (ms-swift's; see setup_env.sh)"
          rc=1; continue; }
        work="$SCRATCH/$phase"
        if [ "$phase" = megatron ]
        then OUT="$LOGS/$phase" bash scripts/gpu/megatron_smoke.sh "$work" "$@" || rc=1
        else OUT="$LOGS/$phase" bash scripts/gpu/megatron_ep.sh "$work" "$@"; r=$?; [ $r = 0 ] || rc=$r
        fi;;
      megatron_moe)
        # Unsloth + unsloth_zoo (the vendored fla the Megatron run binds) + fla 0.6 aside; the Megatron set in its own
        # folder, on PYTHONPATH for the Megatron processes only (benchmarks/megatron_moe.py --megatron-site): the
        # Unsloth and swift PEFT variants keep the image's peft, as in the moe phase.
        install_moe_wheels || { rc=1; continue; }
        local msite
        msite=$(megatron_site) || { rc=1; continue; }
        command -v megatron >/dev/null || { echo "megatron_moe: no \`megatron\` command on PATH"; rc=1; continue; }
        mkdir -p "$LOGS/$phase"
        case "${SWIFT_VORA_GDN_CHECK:-run}" in
          skip) echo "megatron_moe: Gated DeltaNet gradient check skipped (SWIFT_VORA_GDN_CHECK=skip)";;
          run) PYTHONPATH="$msite:$PYTHONPATH" python3 scripts/gpu/gdn_grad_check.py --out "$OUT/gdn-grad-check.json" \
                 || { echo "megatron_moe: the Gated DeltaNet kernel does not match the PyTorch reference: no Megatron run"
                      rc=1; continue; };;
          *) echo "megatron_moe: SWIFT_VORA_GDN_CHECK=${SWIFT_VORA_GDN_CHECK}: run or skip"; rc=2; continue;;
        esac
        work="$SCRATCH/swift_vora_megatron_moe"
        python3 benchmarks/megatron_moe.py --out "$OUT" --work "$work" --megatron-site "$msite" "$@" || rc=1;;
      megatron_optimizer_check)
        # the Megatron set in its own folder (as megatron_moe), on PYTHONPATH for this process only
        local osite
        osite=$(megatron_site) || { rc=1; continue; }
        PYTHONPATH="$osite:$PYTHONPATH" python3 scripts/gpu/coalesced_optimizer_check.py --out "$OUT" || rc=1;;
      kernel_cache_export)
        # into $OUT itself, in parts the device tool returns (16 MiB a file): keep them in .kcache/ for the next call
        swift-vora kernel-cache export "$OUT/kernel-cache.tar.xz" --part-mib 15.5 || rc=1;;
      *) echo "unknown phase '$phase' (setup|throughput|learnability|calibrate|e2e|e2e_dense|multi_gpu_zero3|moe|"\
"moe_full|unsloth|megatron|megatron_ep|megatron_moe|megatron_optimizer_check|kernel_cache_export)"; rc=2;;
    esac
    echo "== phase $phase done in $((SECONDS - t1)) s (rc so far $rc)"
    # Results JSON flat into $OUT; the logs into one archive (the 8-file limit). Left out besides weights and media:
    # ms-swift's PNG plots and TensorBoard events, two copies of logging.jsonl, which is kept (the archive rides in the
    # repository, and every later call carries it)
    find "$LOGS/$phase" -maxdepth 1 -name '*.json' -exec cp {} "$OUT"/ \; 2>/dev/null
    local dirs=()
    [ -d "$LOGS/$phase" ] && dirs+=("${LOGS#"$SCRATCH"/}/$phase")
    [ -n "$work" ] && [ -d "$work" ] && dirs+=("${work#"$SCRATCH"/}")
    [ -n "$extra_logs" ] && [ -d "$SCRATCH/$extra_logs" ] && dirs+=("$extra_logs")
    if [ ${#dirs[@]} -gt 0 ]; then
      tar czf "$OUT/logs-$phase.tgz" -C "$SCRATCH" --exclude='*.mp4' --exclude='*.safetensors' --exclude='*.pt' \
        --exclude='*.bin' --exclude='*.pth' --exclude='checkpoint-*' --exclude='model' --exclude='model-*' \
        --exclude='clips' --exclude='data' --exclude='*.png' --exclude='events.out.tfevents.*' \
        "${dirs[@]}" 2>/dev/null || true
    fi
  done
  ls -la "$OUT"
  echo "== run_all done in $SECONDS s, rc=$rc"
  return $rc
}

mkdir -p "$OUT" "$LOGS"
main "$@" 2>&1 | tee -a "$OUT/run.log"
exit "${PIPESTATUS[0]}"
