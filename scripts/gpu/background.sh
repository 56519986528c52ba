#!/usr/bin/env bash
# A GPU job longer than one device call: started in a session of its own (it outlives the call that started it),
# then waited on by the calls that follow, back to back (the machine stays warm 30 s after a call). Every call copies
# what the job has written so far into $OUT, so a job cut short still returns its logs.
#
#   bash scripts/gpu/background.sh start NAME SECONDS -- COMMAND [ARGS...]   # start, then wait up to SECONDS
#   bash scripts/gpu/background.sh wait NAME SECONDS                           # wait up to SECONDS more
#   bash scripts/gpu/background.sh stop NAME                                   # end it (its whole session)
#
# The job runs with OUT set to its own folder ($TMPDIR/swift_vora_bg/NAME/out, /tmp without TMPDIR), whose files
# (at most 8, as the device tool returns) are copied into the caller's $OUT; its stdout+stderr go to job.log there.
# Exit code: the job's when it has ended, 75 (EX_TEMPFAIL) while it still runs, 2 on a usage error.
set -uo pipefail

usage() { sed -n '2,13p' "$0" >&2; exit 2; }
[ $# -ge 2 ] || usage
verb="$1" name="$2"
shift 2
case "$name" in *[!A-Za-z0-9_.-]*|'') echo "background: NAME must be letters, digits, . _ -" >&2; exit 2;; esac
dir="${TMPDIR:-/tmp}/swift_vora_bg/$name"

collect() {
  [ -n "${OUT:-}" ] || return 0
  mkdir -p "$OUT"
  if [ -d "$dir/out" ]; then
    find "$dir/out" -maxdepth 1 -type f -exec cp -p {} "$OUT"/ \; 2>/dev/null
  fi
  cp -p "$dir/job.log" "$OUT/job.log" 2>/dev/null || true
}

wait_for() {  # wait_for SECONDS: until the job ends or SECONDS pass; then its log's tail and its files
  local deadline=$((SECONDS + $1))
  while [ ! -f "$dir/rc" ] && [ $SECONDS -lt $deadline ]; do
    kill -0 "$(cat "$dir/pid" 2>/dev/null)" 2>/dev/null || break
    sleep 5
  done
  collect
  echo "== background $name: last lines of $dir/job.log"
  tail -n 40 "$dir/job.log" 2>/dev/null
  if [ -f "$dir/rc" ]; then
    echo "== background $name ended, rc=$(cat "$dir/rc")"
    return "$(cat "$dir/rc")"
  fi
  if kill -0 "$(cat "$dir/pid" 2>/dev/null)" 2>/dev/null; then
    echo "== background $name still running (pid $(cat "$dir/pid")); call: bash $0 wait $name SECONDS"
    return 75
  fi
  echo "== background $name is gone without an exit code (the machine was restarted?)"
  return 1
}

case "$verb" in
  start)
    [ $# -ge 2 ] && [ "$2" = -- ] || usage
    seconds="$1"
    shift 2
    [ $# -ge 1 ] || usage
    if [ -f "$dir/pid" ] && [ ! -f "$dir/rc" ] && kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
      echo "background: $name already runs (pid $(cat "$dir/pid"))" >&2
      exit 2
    fi
    rm -rf "$dir"
    mkdir -p "$dir/out"
    # setsid: a session of its own, so that the device tool's end-of-call cleanup leaves it running
    OUT="$dir/out" setsid bash -c 'echo $$ > "$1/pid"; shift; "$@" > "$0/job.log" 2>&1; echo $? > "$0/rc"' \
      "$dir" "$dir" "$@" < /dev/null > /dev/null 2>&1 &
    sleep 2
    echo "== background $name started (pid $(cat "$dir/pid" 2>/dev/null)): $*"
    wait_for "$seconds"
    ;;
  wait)
    [ $# -eq 1 ] || usage
    [ -d "$dir" ] || { echo "background: no job $name here (fresh machine?)" >&2; exit 2; }
    wait_for "$1"
    ;;
  stop)
    [ -f "$dir/pid" ] || { echo "background: no job $name" >&2; exit 2; }
    kill -- -"$(cat "$dir/pid")" 2>/dev/null
    sleep 2
    collect
    echo "== background $name stopped"
    ;;
  *) usage;;
esac
