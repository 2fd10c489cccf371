#!/usr/bin/env bash
# DeepSeek-V4 at 8k context (bench/gpu_suite.py case dsv4_mtp_fp8_short, or the CASE named, e.g.
# dsv4_mtp_fp8_short_quick) on vLLM 0.26, for staging/device_bg.sh (its first sweep can outlast
# one device call), then what a later run needs back in $OUT: the sweep-cache entry (`wcprof
# cache export`, unsigned; not when the run imported one: IMPORT=DIR, staging/device_run.sh), the
# TileLang cache (.stage-dsv4/jit-cache-*.tgz, unpacked by env.sh) and DeepGEMM's JIT cache.
# Run from the repository root after staging part00-04 and `source .stage-dsv4/env.sh`:
#   bash staging/device_bg.sh start dsv4 LIMIT_S=1750 -- bash staging/dsv4_026/run_short.sh
# Exit status: the suite's.
set -uo pipefail
# shellcheck disable=SC2086 # CASE: one or more case names
bash staging/device_run.sh --case-timeout-s "${CASE_TIMEOUT_S:-1700}" ${CASE:-dsv4_mtp_fp8_short}
rc=$?
# shellcheck disable=SC1091
source .stage/env.sh
if [ -z "${IMPORT:-}" ]; then
  rm -rf /tmp/wcp-cache-export
  PYTHONPATH=$PWD:$PYTHONPATH WCPROF_CACHE_DIR=${WCPROF_CACHE_DIR:-/tmp/wcprof-cache} \
    python3 -m worstcase_profiler.cli cache export /tmp/wcp-cache-export \
    && tar -czf "$OUT/cache-export.tgz" -C /tmp wcp-cache-export
fi
tar -czf "$OUT/dsv4-jit-cache.tgz" -C /tmp tilelang_cache
dg=${DG_JIT_CACHE_DIR:-$HOME/.cache/vllm/deep_gemm}
[ -d "$dg" ] && tar -czf "$OUT/deepgemm-cache.tgz" -C "$(dirname "$dg")" "$(basename "$dg")"
ls -l "$OUT"
exit "$rc"
