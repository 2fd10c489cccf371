#!/usr/bin/env bash
# What an operator's production start needs proven on the GPU, after the suite, on the same host:
#   advise   the chunk advisor's 2048 row against an engine really started with 2048 (1%)
#   soak     the production guard's cost: bench/guard_soak.py, guard on vs off, 200 requests
#            (SOAK_ARGS, default 6 rounds per process over off,on,off,on,on,off), then
#            bench/guard_probe.py: the probe's own cost per step against that soak's step time
#   startup  the 8B layout: stock, cold (full sweep), cold (cut-down), cached restart, exported
#   import   the 8B layout on a fresh host: stock vs a start from another host's exported entry
#            (IMPORT_FROM names the directory, carried in the checkout; IMPORT_SECRET the secret
#            it was signed with; IMPORT_MODES the modes), then its own cold start and restart
#   signed   the 8B layout's stock, cold start and cached restart under $WCPROF_CACHE_SECRET
#            (a signed entry replays its worst step only)
#   first    the 8B layout's first start (issue 20): eager stock, cold cut-down, cold full and
#            signed cached restart, twice interleaved, the signed entries exported to
#            $P/cache-export-signed for another host; then with CUDA graphs, stock vs cold (primed)
#            A fresh host starts from such an export with
#            IMPORT_FROM=docs/results/h200-run27/production/cache-export-signed IMPORT_SECRET=wcprof-bench
#            IMPORT_MODES=stock,worstcase-imported,stock,worstcase-imported ... production_run.sh import
# Run through staging/device_run.sh, which stages and sets the environment:
#   bash staging/device_run.sh exec bash staging/production_run.sh advise soak startup
# Each step gets what is left of $DEADLINE. Everything lands in $OUT/production.tar.gz (the
# device returns few files), the step lines in device_run.log.
set -uo pipefail
OUTDIR=${OUT:-/tmp/wcprof-gpu-out}
P=/tmp/wcprof-production
rm -rf "$P"; mkdir -p "$P" "$OUTDIR"
DEADLINE=${DEADLINE:-$(( $(date +%s) + 570 ))}
LLAMA=tests/gpu/models/llama-8l-2048
LLAMA8B=tests/gpu/models/llama-3.1-8b-layout
ENGINE=(--load-format dummy --skip-tokenizer-init --gpu-memory-utilization 0.5 --seed 0
        --max-model-len 131072 --enforce-eager)
rc=0

left() { echo $(( DEADLINE - $(date +%s) - 15 )); }   # 15 s to pack

step() {  # step NAME CMD ...: CMD within what is left, its output to $P/NAME.log
  local name=$1; shift
  local t=$(left)
  if [ "$t" -lt 30 ]; then echo "[production] $name: skipped, ${t}s left"; rc=1; return; fi
  local t0=$(date +%s)
  timeout "$t" "$@" > "$P/$name.log" 2>&1
  local r=$?
  echo "[production] $name: rc=$r in $(( $(date +%s) - t0 ))s (limit ${t}s)"
  tail -n 12 "$P/$name.log" | sed "s/^/[production]   /"
  [ "$r" -eq 0 ] || rc=1
}

for what in "$@"; do
  case $what in
    advise)
      step advise-8192 env WCPROF_CACHE_DIR=off python3 -m worstcase_profiler.cli --model "$LLAMA" \
        "${ENGINE[@]}" --max-num-batched-tokens 8192 --advise --json "$P/advise-8192.json"
      step advise-real-2048 env WCPROF_CACHE_DIR=off python3 -m worstcase_profiler.cli \
        --model "$LLAMA" "${ENGINE[@]}" --max-num-batched-tokens 2048 --json "$P/advise-real-2048.json"
      step advise-check python3 -m worstcase_profiler.cli advise "$P/advise-8192.json" \
        --against "$P/advise-real-2048.json" ;;
    soak)
      # shellcheck disable=SC2086
      step guard-soak python3 bench/guard_soak.py --out "$P/guard-soak.json" --model "$LLAMA" \
        ${SOAK_ARGS:---rounds 6 --order off,on,off,on,on,off}
      step guard-probe python3 bench/guard_probe.py --out "$P/guard-probe.json" \
        --soak "$P/guard-soak.json" ;;
    startup)
      step startup-8b python3 bench/startup_bench.py --out "$P/startup-8b.json" --model "$LLAMA8B" \
        --modes stock,worstcase-cold,worstcase-cut,worstcase-warm --repeat 2 \
        --export-to "$P/cache-export" ;;
    import)
      if [ -z "${IMPORT_FROM:-}" ]; then
        echo "[production] import: skipped, IMPORT_FROM names no directory of exported entries"
        rc=2; continue
      fi
      # IMPORT_SECRET: the entries are signed (first's export): this host verifies them
      step startup-8b-imported env ${IMPORT_SECRET:+WCPROF_CACHE_SECRET=$IMPORT_SECRET} \
        python3 bench/startup_bench.py --out "$P/startup-8b-imported.json" \
        --model "$LLAMA8B" --prime \
        --modes "${IMPORT_MODES:-stock,worstcase-imported,stock,worstcase-imported,worstcase-cold,worstcase-warm}" \
        --import-from "$IMPORT_FROM" ;;
    signed)
      step startup-8b-signed env WCPROF_CACHE_SECRET=wcprof-bench python3 bench/startup_bench.py \
        --out "$P/startup-8b-signed.json" --model "$LLAMA8B" ;;
    first)
      step first-eager env WCPROF_CACHE_SECRET=wcprof-bench python3 bench/startup_bench.py \
        --out "$P/first-eager.json" --model "$LLAMA8B" \
        --modes stock,worstcase-cut,worstcase-cold,worstcase-warm --repeat 2 \
        --export-to "$P/cache-export-signed"
      # --prime: one uncounted stock start first, so neither counted start compiles alone
      # (h200-run27 ran without it: the cold start could reuse what stock had compiled)
      step first-graphs python3 bench/startup_bench.py --out "$P/first-graphs.json" \
        --model "$LLAMA8B" --graphs --prime --modes stock,worstcase-cold --timeout-s 400 ;;
    *) echo "[production] unknown step $what (advise, soak, startup, import, signed, first)"; rc=2 ;;
  esac
done
tar -czf "$OUTDIR/production.tar.gz" -C "$P" . && ls -l "$OUTDIR/production.tar.gz"
exit $rc
