#!/usr/bin/env bash
# Build, on the dev machine (PyPI reachable), the DeepSeek-V4 add-on to the vLLM 0.26.0 wheelhouse
# in .stage/ for the air-gapped H200 host (Python 3.12.3, torch 2.11.0+cu130, triton 3.6.0):
# what vLLM 0.26's DeepseekV4ForCausalLM + DeepSeekV4MTPModel path needs and .stage/part00-01
# lack. Everything is staged into the same SITE (/tmp/site) as the 0.26 parts.
#
#   part02  TileLang 0.1.9 (mHC kernels; 3rdparty/composable_kernel = ROCm headers dropped, an empty
#           include dir kept so tilelang does not warn), CuTe-DSL 4.6.0 without its two large
#           libraries (nvidia-cutlass-dsl, -libs-base, -libs-core, -libs-cu13's small files),
#           quack-kernels 0.6.3 (newest release whose pin, ~=4.6.0, admits cutlass-dsl 4.6.0),
#           compressed-tensors 0.17.0 (vLLM 0.26's pin) + loguru 0.7.3: 0.26 imports them for any
#           checkpoint with a quantization_config (quantization/__init__ -> auto_awq -> int_wna16),
#           which DSv4 needs on 0.26 (its FlashMLA o_proj is FP8-only; PLAN.md)
#   part03  nvidia_cutlass_dsl/dsl_packages/cutlass/_mlir/_mlir_libs/_cutlass_ir.cu13...so (180 MB raw)
#           + z3-solver 4.15.4.0 (libtvm.so NEEDS libz3.so; libz3.so.4.15 stored as a hard link)
#   part04  vllm/_moe_C_stable_libtorch.abi3.so of the same vllm-0.26.0 wheel (MoE: topk_softplus_sqrt
#           routing, fused-MoE helpers) + nvidia_cutlass_dsl/cu13/lib/libcute_dsl_runtime.so
# Not staged (on the host already, or not needed): apache-tvm-ffi 0.1.10 and typing_extensions
# (part00), cuda-bindings / cuda-pathfinder / numpy / ml-dtypes / cloudpickle / psutil / tqdm /
# einops / protobuf (host image), torch-c-dlpack-ext (torch 2.11 has __dlpack_c_exchange_api__
# natively; its wheel only carries torch 2.4-2.9 addons), nvidia-cutlass-dsl-libs-cu12 (cutlass
# loads the cu13 flavour alone), nvidia-cuda-nvdisasm (only for CUTE_DSL SASS dumps), cuda-python
# (a metapackage: nothing imports it).
#
#   bash staging/dsv4_026/build.sh              # ~4 min here (xz -9e), from the repository root
#   VLLM_WHEEL=/path/vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl bash staging/dsv4_026/build.sh
# writes .stage-dsv4/ (git-ignored): the parts, SHA256SUMS, stage.sh, env.sh, check.py
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CHECK_RECORD=$REPO/staging/check_record.py
WORK=${WORK:-/tmp/dsv4-build}
STAGE=${STAGE:-$REPO/.stage-dsv4}
PIP=${PIP:-"$REPO/.venv/bin/python -m pip"}
MAX_PART=$((60 * 1024 * 1024))
CALL_MAX=$((64 * 1024 * 1024))   # one device call: working tree + carried files
PLAT=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp)
for t in manylinux1 manylinux2010 manylinux2014 manylinux_2_17 manylinux_2_24 manylinux_2_26 \
         manylinux_2_27 manylinux_2_28 manylinux_2_31 manylinux_2_34 manylinux_2_35; do
  PLAT+=(--platform "${t}_x86_64")
done
PINS=(tilelang==0.1.9 nvidia-cutlass-dsl==4.6.0 nvidia-cutlass-dsl-libs-base==4.6.0
      nvidia-cutlass-dsl-libs-core==4.6.0 nvidia-cutlass-dsl-libs-cu13==4.6.0 quack-kernels==0.6.3
      z3-solver==4.15.4.0 compressed-tensors==0.17.0 loguru==0.7.3)
IR=nvidia_cutlass_dsl/dsl_packages/cutlass/_mlir/_mlir_libs/_cutlass_ir.cu13.cpython-312-x86_64-linux-gnu.so
RT=nvidia_cutlass_dsl/cu13/lib/libcute_dsl_runtime.so
MOE=vllm/_moe_C_stable_libtorch.abi3.so

mkdir -p "$REPO/.git/info" "$WORK/whl" "$STAGE"
grep -qxF "/.stage-dsv4/" "$REPO/.git/info/exclude" 2>/dev/null || echo "/.stage-dsv4/" >>"$REPO/.git/info/exclude"

VLLM_WHEEL=${VLLM_WHEEL:-$(ls /tmp/device-vllm-build/vllm-0.26.0-*.whl "$WORK"/vllm-0.26.0-*.whl 2>/dev/null | head -n 1 || true)}
if [ -z "$VLLM_WHEEL" ]; then
  $PIP download "${PLAT[@]}" -d "$WORK" vllm==0.26.0
  VLLM_WHEEL=$(ls "$WORK"/vllm-0.26.0-*.whl | head -n 1)
fi
echo "vllm wheel: $VLLM_WHEEL"
$PIP download -q "${PLAT[@]}" -d "$WORK/whl" "${PINS[@]}"

wheel_of() {  # PIN -> the downloaded wheel
  local name=${1%%==*} ver=${1##*==} w
  w=$(ls "$WORK/whl/${name//-/_}-$ver-"*.whl 2>/dev/null | head -n 1 || true)
  [ -n "$w" ] || { echo "ERROR: no wheel for $1 in $WORK/whl" >&2; return 1; }
  echo "$w"
}

check_record() {  # WHEEL REL FILE: FILE has the sha256 that WHEEL's RECORD gives REL
  python3 "$CHECK_RECORD" "$@"
}

SITE_T="$WORK/tree/site" MOE_T="$WORK/tree/moe"
rm -rf "$WORK/tree"
mkdir -p "$SITE_T" "$MOE_T"
for pin in "${PINS[@]}"; do unzip -q -o "$(wheel_of "$pin")" -d "$SITE_T"; done
rm -rf "$SITE_T"/*.data                     # z3's standalone bin/z3 (22 MB)
rm -rf "$SITE_T/tilelang/3rdparty/composable_kernel"
mkdir -p "$SITE_T/tilelang/3rdparty/composable_kernel/include"
cmp "$SITE_T/z3/lib/libz3.so" "$SITE_T/z3/lib/libz3.so.4.15"
ln -f "$SITE_T/z3/lib/libz3.so" "$SITE_T/z3/lib/libz3.so.4.15"
unzip -q -o "$VLLM_WHEEL" "$MOE" -d "$MOE_T"
check_record "$(wheel_of nvidia-cutlass-dsl-libs-cu13==4.6.0)" "$IR" "$SITE_T/$IR"
check_record "$(wheel_of nvidia-cutlass-dsl-libs-cu13==4.6.0)" "$RT" "$SITE_T/$RT"
check_record "$VLLM_WHEEL" "$MOE" "$MOE_T/$MOE"
# Nothing here may overwrite a file of .stage/part00-01.
if [ -f "$REPO/.stage/part00" ]; then
  dup=$( (cd "$SITE_T" && find . -type f -o -type l; cd "$MOE_T" && find . -type f) | sed 's|^\./||' | sort |
         comm -12 - <( (xz -dc "$REPO/.stage/part00"; xz -dc "$REPO/.stage/part01") | tar -t 2>/dev/null |
                       sed 's|^\./||' | sort) || true)
  if [ -n "$dup" ]; then echo "ERROR: would overwrite files of .stage: $dup" >&2; exit 1; fi
fi

TAR=(tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=2026-01-01)
rm -f "$STAGE"/part?? "$STAGE/SHA256SUMS"
( "${TAR[@]}" -C "$SITE_T" --exclude="./$IR" --exclude="./$RT" -cf - \
      ./nvidia_cutlass_dsl ./nvidia_cutlass_dsl-4.6.0.dist-info \
      ./nvidia_cutlass_dsl_libs_base-4.6.0.dist-info ./nvidia_cutlass_dsl_libs_core-4.6.0.dist-info \
      ./nvidia_cutlass_dsl_libs_cu13-4.6.0.dist-info ./nvidia_cutlass_dsl_packages.pth \
      ./quack ./quack_kernels-0.6.3.dist-info ./tilelang ./tilelang-0.1.9.dist-info \
      ./compressed_tensors ./compressed_tensors-0.17.0.dist-info ./loguru ./loguru-0.7.3.dist-info |
    xz -9e -T1 >"$STAGE/part02"
  "${TAR[@]}" -C "$SITE_T" -cf - "./$IR" ./z3 ./z3_solver-4.15.4.0.dist-info | xz -9e -T1 >"$STAGE/part03" ) &
bg=$!
"${TAR[@]}" -C "$WORK/tree" --transform='s|^\./moe/|./|;s|^\./site/|./|' -cf - "./moe/$MOE" "./site/$RT" |
  xz -9e -T1 >"$STAGE/part04"
wait "$bg"
# Every file of the tree is in exactly one part.
all=$( (cd "$SITE_T" && find . ! -type d; cd "$MOE_T" && find . ! -type d) | sort)
got=$(for p in part02 part03 part04; do xz -dc "$STAGE/$p" | tar -t; done | grep -v '/$' | sort)
if [ "$all" != "$got" ]; then
  echo "ERROR: parts and tree differ:" >&2; diff <(echo "$all") <(echo "$got") >&2 || true; exit 1
fi
for p in "$STAGE"/part??; do
  s=$(stat -c %s "$p")
  if [ "$s" -gt "$MAX_PART" ]; then echo "ERROR: $p is $s bytes > 60 MiB" >&2; exit 1; fi
done
(cd "$STAGE" && sha256sum part?? >SHA256SUMS && cat SHA256SUMS)
cp "$REPO/staging/stage_part.sh" "$STAGE/stage.sh"
cp "$REPO/staging/dsv4_026/env.sh" "$REPO/staging/dsv4_026/check.py" "$STAGE/"

# What each device call carries (the working tree travels with every call).
tree=$(cd "$REPO" && git ls-files -co --exclude-standard -z | xargs -0 stat -c %s 2>/dev/null | awk '{s+=$1} END {print s}')
sz() { local s=0 f; for f in "$@"; do s=$((s + $(du -sb "$REPO/$f" | cut -f1))); done; echo $s; }
small=".stage-dsv4/SHA256SUMS .stage-dsv4/stage.sh"
printf '%-6s %12s  %s\n' call bytes carried
for c in "1|.stage/part00 .stage/SHA256SUMS .stage/stage.sh .whl .stage-dsv4/part02 $small" \
         "2|.stage-dsv4/part03 $small" \
         "3|.stage-dsv4/part04 $small .stage-dsv4/env.sh .stage-dsv4/check.py" \
         "4|.stage/part01 .stage/SHA256SUMS .stage/stage.sh .stage/env.sh .stage-dsv4/env.sh"; do
  n=${c%%|*} files=${c#*|}
  b=$(( tree + $(sz $files) ))
  printf '%-6s %12d  tree %d + %s%s\n' "$n" "$b" "$tree" "$files" "$([ "$b" -gt "$CALL_MAX" ] && echo '  OVER 64 MiB')"
done
