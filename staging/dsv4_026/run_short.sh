#!/usr/bin/env bash
# DeepSeek-V4 at 8k context (bench/gpu_suite.py case dsv4_mtp_fp8_short, or the CASE named, e.g.
# dsv4_mtp_fp8_short_quick) on vLLM 0.26, for staging/device_bg.sh (its first sweep can outlast
# one device call), then what a later run needs back in $OUT/dsv4-caches.tgz: the sweep-cache
# entry (`wcprof cache export`, unsigned; a later run imports it with IMPORT=DIR,
# staging/device_run.sh), the TileLang cache (kept as .stage-dsv4/jit-cache-*.tgz, which env.sh
# unpacks) and DeepGEMM's JIT cache.
# Run from the repository root after staging part00-04 and `source .stage-dsv4/env.sh`:
#   bash staging/device_bg.sh start dsv4 LIMIT_S=1750 -- bash staging/dsv4_026/run_short.sh
# Exit status: the suite's.
set -uo pipefail
# shellcheck disable=SC2086 # CASE: one or more case names
bash staging/device_run.sh --case-timeout-s "${CASE_TIMEOUT_S:-1700}" ${CASE:-dsv4_mtp_fp8_short}
rc=$?
# One archive, so that $OUT stays within the 8 files a device call returns (device_run.sh's 4,
# device_bg.sh's log and status): wcp-cache-export/, tilelang_cache/ and deep_gemm/, those that
# exist, each as its folder.
# shellcheck disable=SC1091
source "${STAGE:-.stage}/env.sh"
rm -rf /tmp/wcp-cache-export
PYTHONPATH=$PWD:$PYTHONPATH WCPROF_CACHE_DIR=${WCPROF_CACHE_DIR:-/tmp/wcprof-cache} \
  python3 -m worstcase_profiler.cli cache export /tmp/wcp-cache-export
parts=()
for d in /tmp/wcp-cache-export "${TILELANG_CACHE_DIR:-/tmp/tilelang_cache}" \
         "${DG_JIT_CACHE_DIR:-$HOME/.cache/vllm/deep_gemm}"; do
  [ -d "$d" ] && parts+=(-C "$(dirname "$d")" "$(basename "$d")")
done
[ ${#parts[@]} -gt 0 ] && tar -czf "$OUT/dsv4-caches.tgz" "${parts[@]}"
ls -l "$OUT"
exit "$rc"
