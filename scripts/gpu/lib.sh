# The start every GPU phase script shares (e2e_dense, multi_gpu_zero3, megatron_smoke, megatron_ep). Sourced:
#
#   source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
#   phase_dirs LOG_NAME WORK_NAME "${1:-}"   # ROOT, WORK, PY, LOGS; the caller is then in ROOT
#   fresh_work                               # empty WORK, create WORK and LOGS (after any refusal, not before)
#   step "1. what this step does"            # a timestamped heading in the log
#
# WORK: the script's first argument, else $TMPDIR/WORK_NAME (/tmp without TMPDIR). LOGS: $OUT/LOG_NAME when the
# caller (run_all.sh) sets OUT, else WORK/logs. PY: the interpreter (default python3).

phase_dirs() {
  ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
  WORK="${3:-${TMPDIR:-/tmp}/$2}"
  PY="${PY:-python3}"
  LOGS="${OUT:+$OUT/$1}"
  LOGS="${LOGS:-$WORK/logs}"
  cd "$ROOT"
}

fresh_work() {
  rm -rf "$WORK"
  mkdir -p "$WORK" "$LOGS"
}

step() { echo "== $(date -u +%T) $*"; }
