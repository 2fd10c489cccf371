#!/usr/bin/env bash
# The GPU suite (bench/gpu_suite.py) on the air-gapped H200 host, from the repository root, after
# /work/shared/device/README.md: vLLM arrives as wheelhouse parts ($STAGE, default .stage/, built
# once on the dev machine by build_wheelhouse.sh), each in its own transfer (<= 64 MiB), back to
# back (the host keeps /tmp only while it stays warm, 30 s after a command returns).
#
#   call 1  carry: .stage/part00 .stage/SHA256SUMS .stage/stage.sh .whl
#           run:   bash staging/device_run.sh stage                (~30-60 s)
#   call 2  carry: .stage/part01 .stage/SHA256SUMS .stage/stage.sh .stage/env.sh
#           run:   bash staging/device_run.sh [CASE ...]           (timeout_s 600; suite <= ~540 s)
#
# `stage PART ...` stages other parts (e.g. part02, the MoE kernels) in calls of their own.
# `exec CMD ...` runs CMD in the suite's environment instead of the suite (e.g.
# staging/production_run.sh), with $DEADLINE the epoch second it should finish by.
# The operator's own stack (staging/build_torch_stack.sh, staged by stage_stack.sh): SITE=/tmp/site213
# ENV_SH=staging/env32.sh, no parts to stage.
# Another wheelhouse (e.g. vLLM 0.32 in .stage32/): STAGE=.stage32 SITE=/tmp/site32 on every call,
# carrying .stage32/... instead. Other settings: OUT (what comes back), WORK, LIMIT_S, WCPROF_CACHE_DIR,
# IMPORT (a directory `wcprof cache export` wrote, imported into the fresh cache before the cases).
#
# .whl (git-ignored) holds rich and its three dependencies, pure-Python wheels the wcprof CLI needs
# and the vLLM wheelhouse lacks; installed only when the host's python3 has no rich. Once, here:
#   .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
#     -d .whl rich==15.0.0 pygments==2.21.0 markdown-it-py==4.3.0 mdurl==0.1.2
# The project is not pip-installed there (no wheel): it imports from the checkout (PYTHONPATH=$PWD),
# and staging/install_entrypoint.py writes a metadata-only worstcase_profiler-*.dist-info into $SITE
# so that vLLM's importlib.metadata plugin loader finds the vllm.general_plugins entry point.
#
# $OUT gets at most 4 files (the device returns at most 8): device_run.log, summary.json (every
# case's checks and full wcprof report), summary.md (the table), cases.tar.gz (per-case report JSON
# and engine log). Exit code: the suite's (0 = every case passed).
set -uo pipefail
STAGE=${STAGE:-.stage}
SITE=${SITE:-/tmp/site}
OUTDIR=${OUT:-/tmp/wcprof-gpu-out}
WORK=${WORK:-/tmp/wcprof-gpu-suite}
LIMIT_S=${LIMIT_S:-590}   # the device's per-command limit is 600 s
T0=$(date +%s)
mkdir -p "$OUTDIR" "$SITE"

stage_part() {  # idempotent while the host stays warm
  local n=$1
  if [ -f "$SITE/.staged-$n" ]; then echo "$n already staged in $SITE"; return 0; fi
  if [ ! -f "$STAGE/$n" ]; then echo "ERROR: $STAGE/$n not carried and not staged yet" >&2; return 1; fi
  SITE=$SITE bash "$STAGE/stage.sh" "$STAGE/$n"
}

install_wheels() {  # rich (+ pygments, markdown-it-py, mdurl) unless the image already has it
  if PYTHONPATH=$SITE python3 -c 'import rich' 2>/dev/null; then echo "rich: present"; return 0; fi
  if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$SITE" .whl/*.whl && echo "rich: installed from .whl into $SITE"
  else
    echo "ERROR: python3 has no rich and no .whl was carried (see the header of $0)" >&2; return 1
  fi
}

do_stage() {  # stage [PART ...]: part00 unless parts are named
  local n
  for n in "${@:-part00}"; do stage_part "$n" || return 1; done
  install_wheels || return 1
  ls -A "$SITE" | grep '^\.staged-'
}

prepare() {  # stage what is missing, set the engine environment, register the entry point
  if [ ! -f "$SITE/.staged-stack" ]; then  # a whole stack (stage_stack.sh) has no parts
    [ -f "$SITE/.staged-part00" ] || stage_part part00 || return 1
    stage_part part01 || return 1
  fi
  if [ -n "${ENV_SH:-}" ]; then  # e.g. ENV_SH=staging/env32.sh for the stack in $SITE
    # shellcheck disable=SC1090
    source "$ENV_SH"
  elif [ -f "$STAGE/env.sh" ]; then
    # shellcheck disable=SC1091
    source "$STAGE/env.sh"
  else  # the same settings as $STAGE/env.sh
    export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 \
      TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 VLLM_USE_FLASHINFER_SAMPLER=0
  fi
  export PYTHONPATH=$PWD:$PWD/plugins/wcp_fixtures:$PYTHONPATH VLLM_ENABLE_V1_MULTIPROCESSING=0
  # A fresh sweep cache: the suite measures the full sweep; staging/oom_suite.sh then reuses it.
  export WCPROF_CACHE_DIR=${WCPROF_CACHE_DIR:-/tmp/wcprof-cache}
  rm -rf "$WCPROF_CACHE_DIR"
  install_wheels || return 1
  if [ -n "${IMPORT:-}" ]; then  # an exported entry (`wcprof cache export`): the case replays it
    python3 -m worstcase_profiler.cli cache import "$IMPORT" || return 1
  fi
  python3 staging/install_entrypoint.py --target "$SITE" --fixtures || return 1
  nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv,noheader || true
  python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__)'
}

do_run() {
  prepare || return 1
  local left=$(( LIMIT_S - ($(date +%s) - T0) - 20 ))   # 20 s to pack $OUT
  echo "suite budget ${left}s"
  rm -rf "$WORK"
  python3 bench/gpu_suite.py --out "$WORK" --mirror "$OUTDIR" --budget-s "$left" "$@"
  local rc=$?
  cp "$WORK/summary.json" "$WORK/summary.md" "$OUTDIR/" 2>/dev/null
  tar -czf "$OUTDIR/cases.tar.gz" -C "$WORK" --exclude=summary.json --exclude=summary.md . || true
  ls -l "$OUTDIR"
  return $rc
}

do_exec() {  # exec CMD ...: the same environment as the suite, then CMD (its output to the log)
  prepare || return 1
  export DEADLINE=$(( T0 + LIMIT_S - 20 ))   # epoch seconds CMD should be done by
  "$@"
}

main() {
  case "${1:-}" in
    stage) shift; do_stage "$@" ;;
    exec) shift; do_exec "$@" ;;
    *) do_run "$@" ;;
  esac
}

main "$@" 2>&1 | tee -a "$OUTDIR/device_run.log"
rc=${PIPESTATUS[0]}
echo "device_run.sh: rc=$rc after $(( $(date +%s) - T0 ))s"
exit "$rc"
