#!/usr/bin/env bash
# Issue 4's reproduction and soak on the H200, after bench/device_run.sh staged vLLM (same host,
# still warm). Writes $OUT/oom.json (all runs) and $OUT/oom.log.
#   bash bench/oom_suite.sh [RUN ...]   (dsv32_fp8_stock dsv32_fp8_worstcase llama_stock llama_worstcase)
set -uo pipefail
source .stage/env.sh 2>/dev/null || export PYTHONPATH=/tmp/site
export PYTHONPATH=$PWD:$PYTHONPATH VLLM_ENABLE_V1_MULTIPROCESSING=0
# Seed 002's host ran with expandable segments; without them a held card also dies of caching-
# allocator fragmentation, which no profile can bound (first H200 run, docs/results).
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF-expandable_segments:True}
python3 bench/install_entrypoint.py --target /tmp/site >/dev/null || exit 1
OUTDIR=${OUT:-/tmp/oom-out}; W=/tmp/oom-runs; mkdir -p "$OUTDIR" "$W"
DS=tests/gpu/models/dsv32-8l-dense; LL=tests/gpu/models/llama-8l-2048
# Results go straight to $OUT (at most 8 files come back): <run>.json, and <run>.report.json for
# worst-case runs; engine logs stay in $W and their tails are packed into oom.log at the end.
ONLY=" $* "   # optional run names; default: all four
run() { local name=$1 limit=$2; shift 2
  [ "$ONLY" = "  " ] || [[ "$ONLY" == *" $name "* ]] || return 0
  echo "== $name: $*"
  timeout "$limit" python3 bench/oom_repro.py --out "$OUTDIR/$name.json" "$@" > "$W/$name.log" 2>&1
  echo "   rc=$? $(tail -n 1 "$W/$name.log" | cut -c1-400)"; }
run dsv32_fp8_stock 130 --model $DS --kv-cache-dtype fp8 --mode stock --soak 40
run dsv32_fp8_worstcase 220 --model $DS --kv-cache-dtype fp8 --mode worstcase --soak 200
run llama_stock 100 --model $LL --mode stock --soak 40 --slack-mib 64
run llama_worstcase 130 --model $LL --mode worstcase --soak 200 --slack-mib 64
for f in "$W"/*.log; do echo "=== $f"; grep -v "set_num_threads" "$f" | tail -n 25; done > "$OUTDIR/oom.log" 2>&1
