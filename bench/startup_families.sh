#!/usr/bin/env bash
# Issue 34's start-up benchmark on one host, family by family, each forward (CUDA graphs first,
# then eager) after one uncounted worst-case start of its own (--prime, which warms the kernel
# caches), then stock vs first start vs restart (bench/startup_bench.py). An eager run that
# followed the graphs run's prime alone had its stock start be the host's first eager start
# (h100-run88's hybrid and MoE): its own prime keeps that from favouring the later modes. On the
# GPU host, inside staging/device_run.sh exec (which sets DEADLINE and OUT):
#
#   bash bench/startup_families.sh FAMILY[:UTIL[:MAX_MODEL_LEN]] ...
#
# UTIL defaults to 0.9, MAX_MODEL_LEN to 131072. Each run's JSON is mirrored to $OUT/<family>/
# after every start and its whole output kept there as <family>-<forward>.log; once a family is
# done, $OUT/<family>.tgz holds them (the device brings back at most 8 files); the table of
# ratios is printed. A start the deadline leaves no time for is recorded as not run. REPEAT
# (default 1) is --repeat; FORWARDS (default "graphs eager") picks and orders the forwards.
set -u
: "${OUT:?OUT: where the results go}" "${DEADLINE:?DEADLINE: epoch seconds}"
for spec in "$@"; do
  IFS=: read -r family util max_len <<< "$spec"
  for forward in ${FORWARDS:-graphs eager}; do
    if [ "$forward" = graphs ]; then flags=(--graphs --timeout-s 150); else flags=(--timeout-s 90); fi
    name="$family-$forward"
    mkdir -p "$OUT/$family"
    python3 bench/startup_bench.py "${flags[@]}" --prime --family "$family" --util "${util:-0.9}" \
      --max-model-len "${max_len:-131072}" --repeat "${REPEAT:-1}" --deadline "$DEADLINE" \
      --out "/tmp/$name.json" --mirror "$OUT/$family" > "$OUT/$family/$name.log" 2>&1
    rc=$?
    echo "== $name (rc $rc)"
    grep -A 12 "^model " "$OUT/$family/$name.log" | cut -c1-240
  done
  # one file per family (the device brings back at most 8)
  tar -czf "$OUT/$family.tgz" -C "$OUT" "$family" && rm -rf "${OUT:?}/$family"
done
