#!/usr/bin/env bash
# A run longer than one device command (600 s) on the warm H200 host: start it detached, then
# follow it from later calls, each well inside its own limit. A detached process (setsid) outlives
# the command that started it and lives while the host stays warm (30 s after each call), so the
# calls must follow each other back to back. The run works from a copy of the checkout under
# /tmp (a later call re-sends the working tree; the copy keeps the run's files still).
#
#   bash staging/device_bg.sh start NAME [ENV=VALUE ...] -- CMD ...   copy the checkout, start CMD
#   bash staging/device_bg.sh wait NAME SECONDS                       follow it for up to SECONDS
#
# CMD runs in /tmp/wcp-bg/NAME/tree with OUT=/tmp/wcp-bg/NAME/out; `wait` copies that folder's
# files and the run's log into $OUT each time (the device returns at most 8 files), prints the
# log's tail and exits 0 when the run has ended (its exit status in $OUT/NAME.rc), 3 while it runs,
# 4 when it is lost (no such run on this host, or killed before it could write its status).
# The copy takes the tracked and untracked-not-ignored files plus what COPY names (default: the
# staging env files and .whl), not the wheelhouse parts: stage those in the foreground first.
set -uo pipefail
ROOT=/tmp/wcp-bg
verb=${1:?start or wait}; name=${2:?a name}; shift 2
dir=$ROOT/$name
case "$verb" in
  start)
    envs=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
    [ "${1:-}" = "--" ] && shift
    [ $# -gt 0 ] || { echo "device_bg.sh: no command after --" >&2; exit 2; }
    if [ -f "$dir/pid" ] && [ ! -f "$dir/rc" ] && kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
      echo "device_bg.sh: $name is already running (pid $(cat "$dir/pid"))" >&2; exit 2
    fi
    rm -rf "$dir"; mkdir -p "$dir/tree" "$dir/out"
    { git ls-files -co --exclude-standard 2>/dev/null || find . \( -path ./.git -o -path './.stage*' -o -path ./.venv -o -path ./.whl \) -prune -o -type f -print; } \
      | tar -cf - -T - 2>/dev/null | tar -xf - -C "$dir/tree"
    for p in ${COPY:-.stage/env.sh .stage-dsv4/env.sh .stage32/env.sh .whl}; do
      [ -e "$p" ] && { mkdir -p "$dir/tree/$(dirname "$p")"; cp -r "$p" "$dir/tree/$p"; }
    done
    ( cd "$dir/tree" && exec setsid env OUT="$dir/out" "${envs[@]}" bash -c \
        'echo $$ > "$1/pid"; d=$1; shift; "$@"; echo $? > "$d/rc.tmp"; mv "$d/rc.tmp" "$d/rc"' \
        _ "$dir" "$@" > "$dir/log" 2>&1 < /dev/null ) &
    sleep 1
    echo "device_bg.sh: $name started at $(date +%T) in $dir/tree (pid $(cat "$dir/pid" 2>/dev/null))"
    ;;
  wait)
    secs=${1:?seconds}; t0=$(date +%s)
    alive() { [ -f "$dir/pid" ] && kill -0 "$(cat "$dir/pid")" 2>/dev/null; }
    while [ ! -f "$dir/rc" ] && alive && [ $(( $(date +%s) - t0 )) -lt "$secs" ]; do sleep 1; done
    if [ -n "${OUT:-}" ]; then
      cp "$dir/log" "$OUT/$name.log" 2>/dev/null
      find "$dir/out" -maxdepth 1 -type f -exec cp {} "$OUT/" \; 2>/dev/null
      [ -f "$dir/rc" ] && cp "$dir/rc" "$OUT/$name.rc"
    fi
    tail -c 6000 "$dir/log" 2>/dev/null
    if [ -f "$dir/rc" ]; then echo "device_bg.sh: $name ended, rc=$(cat "$dir/rc")"; exit 0; fi
    if ! alive; then  # a wrong NAME, a fresh host (the warm one went back), or a killed run
      echo "device_bg.sh: $name is not running here and left no exit status (lost)"; exit 4
    fi
    echo "device_bg.sh: $name still running after ${secs}s of waiting"; exit 3
    ;;
  *) echo "device_bg.sh: start or wait, not $verb" >&2; exit 2 ;;
esac
