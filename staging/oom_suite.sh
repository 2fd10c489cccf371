#!/usr/bin/env bash
# Issue 4's reproduction and soak on the H200, after staging/device_run.sh staged vLLM (same host,
# still warm). Every run is bench/oom_repro.py on a card held to its budget.
#   bash staging/oom_suite.sh RUN [RUN ...]          (STAGE and SITE as for staging/device_run.sh)
# RUN is <config>_<mode>: config one of llama_v2 llama_v1 llama_graphs dsv32_fp8 dsv32_bf16
# (bench/gpu_suite.py's cases), mode stock (40-request soak; dies), worstcase (200-request soak,
# then the report's worst shape replayed from real requests) or replay (that replay alone: the
# predicted/measured tightness of issue 5, exact rows per request).
# $OUT gets oom.json (the result of every run on this warm host, in order), oom.log (engine log tails) and
# oom-runs.tar.gz (per-run JSON, the worst-case reports and full logs).
set -uo pipefail
SITE=${SITE:-/tmp/site}
source "${STAGE:-.stage}/env.sh" 2>/dev/null || export PYTHONPATH=$SITE
export PYTHONPATH=$PWD:$PWD/plugins/wcp_fixtures:$PYTHONPATH VLLM_ENABLE_V1_MULTIPROCESSING=0
# Seed 002's host ran with expandable segments; without them a held card also dies of caching-
# allocator fragmentation, which no profile can bound (first H200 run, docs/results).
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF-expandable_segments:True}
# The sweep cache staging/device_run.sh filled: worst-case runs of a configuration the suite swept
# replay its worst step and reuse it (what a restart does in production).
export WCPROF_CACHE_DIR=${WCPROF_CACHE_DIR:-/tmp/wcprof-cache}
python3 staging/install_entrypoint.py --target "$SITE" >/dev/null || exit 1
OUTDIR=${OUT:-/tmp/oom-out}; W=/tmp/oom-runs; mkdir -p "$OUTDIR" "$W"
DS=tests/gpu/models/dsv32-8l-dense; LL=tests/gpu/models/llama-8l-2048
declare -A CONFIG=(
  [llama_v2]="--model $LL --slack-mib 64"
  [llama_v1]="--model $LL --slack-mib 64 --runner v1"
  [llama_graphs]="--model $LL --slack-mib 64 --graphs"
  [dsv32_fp8]="--model $DS --kv-cache-dtype fp8"
  [dsv32_bf16]="--model $DS --kv-cache-dtype auto"
)
[ $# -gt 0 ] || { echo "usage: $0 RUN [RUN ...] (e.g. llama_v2_worstcase dsv32_fp8_stock)" >&2; exit 2; }
rc_all=0
for name in "$@"; do
  config=${name%_*}; mode=${name##*_}
  case "$mode" in
    stock) args="--mode stock --soak 40"; limit=150 ;;
    worstcase) args="--mode worstcase --soak 200 --replay-worst"; limit=260 ;;
    replay) args="--mode worstcase --soak 0 --prefix 0 --replay-worst"; limit=200 ;;
    *) args="" ;;
  esac
  if [ -z "${CONFIG[$config]:-}" ] || [ -z "$args" ]; then
    echo "unknown run $name" >&2; rc_all=2; continue
  fi
  echo "== $name: ${CONFIG[$config]} $args"
  # shellcheck disable=SC2086
  timeout "$limit" python3 bench/oom_repro.py --out "$W/$name.json" ${CONFIG[$config]} $args \
    > "$W/$name.log" 2>&1
  rc=$?
  if [ $rc -ne 0 ] && grep -q "start again with the same config" "$W/$name.json" "$W/$name.log" 2>/dev/null; then
    # the warm-up audit failed the start and cached the CUDA-graph figure: restart once
    echo "   rc=$rc: warm-up audit failed the first start; restarting"
    mv "$W/$name.log" "$W/$name.first.log"; mv "$W/$name.json" "$W/$name.first-start.txt"
    # shellcheck disable=SC2086
    timeout "$limit" python3 bench/oom_repro.py --out "$W/$name.json" ${CONFIG[$config]} $args \
      > "$W/$name.log" 2>&1
    rc=$?
  fi
  echo "   rc=$rc $(tail -n 1 "$W/$name.log" | cut -c1-300)"
  [ -f "$W/$name.json" ] || echo "{\"run\": \"$name\", \"error\": \"no result (rc=$rc)\"}" > "$W/$name.json"
  python3 - "$W/$name.json" "$name" "$rc" <<'EOF'
import json, sys
path, name, rc = sys.argv[1], sys.argv[2], int(sys.argv[3])
r = json.load(open(path)); r.update(run=name, rc=rc); json.dump(r, open(path, "w"), indent=1)
EOF
done
python3 - "$OUTDIR/oom.json" "$W" <<'EOF'
import glob, json, os, sys
out, w = sys.argv[1], sys.argv[2]   # every run this warm host has done, oldest first
paths = sorted((p for p in glob.glob(f"{w}/*.json") if not p.endswith(".report.json")),
               key=os.path.getmtime)
json.dump([json.load(open(p)) for p in paths], open(out, "w"), indent=1)
EOF
for f in "$W"/*.log; do echo "=== $f"; grep -v "set_num_threads" "$f" | tail -n 25; done > "$OUTDIR/oom.log" 2>&1
tar -czf "$OUTDIR/oom-runs.tar.gz" -C "$W" . 2>/dev/null
ls -l "$OUTDIR"
exit $rc_all
