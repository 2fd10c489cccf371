#!/usr/bin/env bash
# Issue 34's start-up benchmark on one host, family by family: each with CUDA graphs first
# (--prime: one uncounted worst-case start, which warms the kernel caches for both forwards),
# then eager on the caches that run warmed; stock vs first start vs restart each time
# (bench/startup_bench.py). On the GPU host, inside staging/device_run.sh exec (which sets
# DEADLINE and OUT):
#
#   bash bench/startup_families.sh FAMILY[:UTIL[:MAX_MODEL_LEN]] ...
#
# UTIL defaults to 0.9, MAX_MODEL_LEN to 131072. Each run's JSON is mirrored to
# $OUT/<family>-<forward>/ after every start and its whole output kept in
# $OUT/<family>-<forward>.log; the table of ratios is printed. A start the deadline leaves no
# time for is recorded as not run. REPEAT (default 1) is --repeat; FORWARDS (default
# "graphs eager") picks and orders the forwards.
set -u
: "${OUT:?OUT: where the results go}" "${DEADLINE:?DEADLINE: epoch seconds}"
for spec in "$@"; do
  IFS=: read -r family util max_len <<< "$spec"
  for forward in ${FORWARDS:-graphs eager}; do
    if [ "$forward" = graphs ]; then flags=(--graphs --prime --timeout-s 200); else flags=(--timeout-s 90); fi
    [ "$forward" = eager ] && [[ " ${FORWARDS:-graphs eager} " != *" graphs "* ]] && flags+=(--prime)
    name="$family-$forward"
    python3 bench/startup_bench.py "${flags[@]}" --family "$family" --util "${util:-0.9}" \
      --max-model-len "${max_len:-131072}" --repeat "${REPEAT:-1}" --deadline "$DEADLINE" \
      --out "/tmp/$name.json" --mirror "$OUT/$name" > "$OUT/$name.log" 2>&1
    echo "== $name (rc $?)"
    grep -A 12 "^model " "$OUT/$name.log" | cut -c1-240
  done
done
