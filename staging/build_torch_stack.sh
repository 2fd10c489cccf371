#!/usr/bin/env bash
# Build, on a dev machine with PyPI, the operator's own vLLM 0.32.0 stack for the air-gapped H200
# host: vLLM 0.32.0 on the torch it pins (2.13.0) and the triton that torch declares (3.7.1), with
# DeepGEMM as vLLM ships it (its extension links torch 2.13's C++ ABI), the MoE kernels, the API
# server's packages (`vllm serve`), torchvision 0.28.0 and CuTe-DSL (sparse MLA). Output: $STAGE/piece00 .. pieceNN,
# byte pieces (each <= 58 MiB: one transfer carries 64 MiB, the working tree without docs/results
# 3.6 MB of it; PIECE below) of ONE tar.zst stream, SHA256SUMS
# (the pieces and the whole stream), and staging/stage_stack.sh to carry with them.
#
#   bash staging/build_torch_stack.sh                 # vLLM 0.32.0 -> .stage213/ (git-ignored)
#   VLLM=0.33.0 bash staging/build_torch_stack.sh     # vLLM 0.33.0 -> .stage214/
#   ONLY=extra bash staging/build_torch_stack.sh      # only the extra piece (.extra213/), below
# torch, torchvision, CuTe-DSL and quack are the versions the vLLM wheel pins; triton and NCCL
# the ones that torch wheel pins (read from their METADATA). ~10-20 min here, mostly downloads.
#
# The extra piece, beside the stream ($EXTRA, default .extra$TAG/: tilelang.tar.xz, SHA256SUMS,
# stage_extra.sh): TileLang at the vLLM wheel's pin (0.32: tilelang==0.1.12; DeepSeek-V4 binds its
# mHC ops to TileLang alone on CUDA, `ImportError("tilelang is required for mhc")` without it)
# and z3-solver, the newest release within tilelang's own bound (libtvm_compiler.so NEEDS
# libz3.so.4.15; 0.1.12 declares z3-solver<4.15.5,>=4.13.0: 4.15.4.0). It is one xz tar of its
# own (not a piece of the stream), so the stream's pieces and SHA256SUMS stay as they are, and a
# stack already built or staged gains it without a rebuild: `ONLY=extra` builds it alone (~4 min
# here, xz -9e), and staging/stage_extra.sh unpacks it into $SITE on the host, in any call before
# or after the stream's (no file of it is in the stream: checked below). Left out of it:
# tilelang's 3rdparty/composable_kernel (ROCm headers, 44 MB raw; an empty include dir stays so
# that tilelang does not warn) and z3's bin/z3 (the CLI); libz3.so.4.15 is a hard link to
# libz3.so (byte-identical in the wheel). tilelang's other requirements: apache-tvm-ffi (the
# stream carries vLLM's pin, checked against tilelang's bound below), typing-extensions (in the
# stream), cloudpickle, ml-dtypes, numpy, psutil, tqdm (the host image has them:
# /work/.library/device/KINDS.md), torch-c-dlpack-ext (tvm-ffi's fallback for a torch without
# `torch.Tensor.__dlpack_c_exchange_api__`; torch 2.13 has it: checked below) and the `nvcc`
# extra (the host's CUDA 13 nvcc serves: TileLang compiles each kernel with it at first use and
# finds it through CUDA_HOME, which staging/env32.sh sets).
#
# What the host's own libraries decide (checked here with nm/readelf, no device time):
#   - libtorch_cuda.so of torch 2.13.0 needs 8 NCCL symbols that the host's NCCL 2.28.9 lacks
#     (ncclCommMemStats, ncclCommResume, ncclCommSuspend, ncclGetLsaMultimemDevicePointer,
#     ncclGetPeerDevicePointer, ncclPutSignal, ncclSignal, ncclWaitSignal; all strong undefined,
#     so the import fails): NCCL 2.29.7, the version torch pins, travels.
#   - cuDNN: torch pins 9.20.0.48, the host has 9.19; torch refuses a runtime cuDNN older than
#     the one it was built with only when cuDNN is first used (convolutions); the LLM paths run
#     here do not use it. It does not travel (its wheel is ~700 MB); docs/gpu.md says so.
#   - The CUDA 13.0 libraries (cuda-toolkit 13.0.3: cublas, cudart, nvrtc, ...), cusparselt and
#     nvshmem are the host's (torch 2.11+cu130 has the same layout): stage_stack.sh links each
#     host nvidia/* package into $SITE/nvidia beside the carried nccl, so torch's RPATH
#     ($ORIGIN/../../nvidia/<pkg>/lib) finds them as in a pip install.
# Left out, never loaded at run time: triton's static CUPTI archives (*.a, 77 MB) and its
# Blackwell ptxas (sm_100+; this host is sm_90); vLLM's FA2 (FA3 serves sm_90), Blackwell FMHA
# and the vllm-rs binary (as in the 0.32 wheelhouse built by build_vllm032.sh).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
VLLM=${VLLM:-0.32.0}
WORK=${WORK:-/tmp/wcprof-vllm-$VLLM-build}
PIECE=$((${PIECE_MIB:-58} * 1024 * 1024))   # + the working tree + SHA256SUMS + stage_stack.sh: < 64 MiB
# (67,108,864 B) a call. The tree is 21 MB with docs/results and 3.6 MB without it (2026-12-05):
# move docs/results out of the tree for the staging calls (docs/gpu.md). 44 MiB until 2026-12-05
# (25 pieces of 0.33's stream; 58 MiB: 19). RESPLIT=1 re-cuts an existing $STAGE's stream to
# this size without building anything.
if [ "${RESPLIT:-0}" = 1 ]; then  # the same stream (its sha256 checked) cut into $PIECE pieces
  : "${STAGE:?RESPLIT=1 needs STAGE, e.g. STAGE=.stage214}"
  sum=$(grep ' stack.tar.zst$' "$STAGE/SHA256SUMS" | cut -d' ' -f1) || {
    echo "ERROR: $STAGE/SHA256SUMS names no stack.tar.zst: build the stack first" >&2; exit 1; }
  cat "$STAGE"/piece?? >"$STAGE/stack.tar.zst"
  [ "$(sha256sum "$STAGE/stack.tar.zst" | cut -d' ' -f1)" = "$sum" ] || {
    rm -f "$STAGE/stack.tar.zst"; echo "ERROR: $STAGE's pieces do not join to its stream" >&2; exit 1; }
  rm -f "$STAGE"/piece??
  (cd "$STAGE" && split -b "$PIECE" -d -a 2 stack.tar.zst piece && sha256sum stack.tar.zst piece?? >SHA256SUMS)
  rm -f "$STAGE/stack.tar.zst"
  cp "$HERE/stage_stack.sh" "$STAGE/"
  echo "$STAGE: $(ls "$STAGE"/piece?? | wc -l) pieces of $PIECE bytes at most"
  exit 0
fi
PIP=${PIP:-"python3 -m pip"}
PLAT=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp)
for t in manylinux1 manylinux2010 manylinux2014 manylinux_2_17 manylinux_2_18 manylinux_2_24 \
         manylinux_2_26 manylinux_2_27 manylinux_2_28 manylinux_2_31 manylinux_2_34 manylinux_2_35; do
  PLAT+=(--platform "${t}_x86_64")
done
req() {  # req WHEEL DIST: the requirement WHEEL's METADATA declares on DIST (e.g. triton~=3.8.0,
         # z3-solver<4.15.5,>=4.13.0)
  local r
  r=$(unzip -p "$1" '*.dist-info/METADATA' | sed -n "s/^Requires-Dist: \($2[<>=~!][^; ]*\).*/\1/p" | head -1)
  [ -n "$r" ] || { echo "ERROR: $(basename "$1") declares no version of $2" >&2; return 1; }
  echo "$r"
}
pin() {  # pin WHEEL DIST: the version alone, where WHEEL pins DIST with ==
  local r
  r=$(req "$1" "$2") && [ "${r#*==}" != "$r" ] || { echo "ERROR: $(basename "$1") does not pin $2" >&2; return 1; }
  echo "${r#*==}"
}
mkdir -p "$WORK/whl"
$PIP download "${PLAT[@]}" -d "$WORK/whl" "vllm==$VLLM"
VW=$(ls "$WORK"/whl/vllm-"$VLLM"-*.whl)
TORCH=$(pin "$VW" torch)
$PIP download "${PLAT[@]}" -d "$WORK/whl" "torch==$TORCH"
TW=$(ls "$WORK"/whl/torch-"$TORCH"-*.whl)
CDSL=$(pin "$VW" 'nvidia-cutlass-dsl\[cu13\]')
QUACK=$(pin "$VW" quack-kernels)
VISION=$(pin "$VW" torchvision)
TRITON=$(req "$TW" triton)
NCCL=$(pin "$TW" nvidia-nccl-cu13)
TAG=$(echo "$TORCH" | cut -d. -f1,2 | tr -d .)
STAGE=${STAGE:-$REPO/.stage$TAG}
EXTRA=${EXTRA:-$REPO/.extra$TAG}
TILELANG=$(pin "$VW" tilelang)
TVMFFI=$(pin "$VW" apache-tvm-ffi)
echo "vLLM $VLLM: torch $TORCH ($TRITON, NCCL $NCCL, torchvision $VISION, CuTe-DSL $CDSL) -> $STAGE"
echo "extra: tilelang $TILELANG -> $EXTRA"
PINS=("$TRITON" "nvidia-nccl-cu13==$NCCL"
      "nvidia-cutlass-dsl==$CDSL" "nvidia-cutlass-dsl-libs-base==$CDSL"
      "nvidia-cutlass-dsl-libs-core==$CDSL" "nvidia-cutlass-dsl-libs-cu13==$CDSL"
      "quack-kernels==$QUACK" cuda-bindings==13.0.3 cuda-pathfinder==1.9.1
      # vLLM imports torchvision even for a text model (0.32: kernel_warmup -> minimax_m3's
      # processor), and its API server model_hosting_container_standards (with jmespath and
      # supervisor, which the host lacks): both seen failing on the H200 (docs/results/h200-run34).
      # orjson: declared from 0.33 on
      "torchvision==$VISION" model-hosting-container-standards==0.1.16
      jmespath==1.1.0 supervisor==4.3.0 orjson==3.13.0)
ignore() {  # ignore DIR: keep a built folder out of git (in a worktree, .git is a file)
  git -C "$REPO" check-ignore -q "$1/" 2>/dev/null && return 0
  local ex
  ex=$(git -C "$REPO" rev-parse --git-path info/exclude 2>/dev/null || echo "$REPO/.git/info/exclude")
  case "$ex" in /*) ;; *) ex=$REPO/$ex ;; esac
  mkdir -p "$(dirname "$ex")" && echo "/$1/" >>"$ex"
}

build_extra() {  # the extra piece: tilelang + z3-solver, one tar.xz beside the stream
  local tlw z3spec z3w t
  $PIP download "${PLAT[@]}" -d "$WORK/whl" "tilelang==$TILELANG"
  tlw=$(ls "$WORK"/whl/tilelang-"$TILELANG"-*.whl)
  z3spec=$(req "$tlw" z3-solver)
  # tilelang's bound on apache-tvm-ffi must admit the version the stream carries (vLLM's pin)
  t=$(req "$tlw" apache-tvm-ffi)
  python3 -c 'import sys; from packaging.specifiers import SpecifierSet as S
sys.exit(0 if sys.argv[2] in S(sys.argv[1].split("apache-tvm-ffi", 1)[1]) else 1)' "$t" "$TVMFFI" ||
    { echo "ERROR: tilelang $TILELANG wants $t, the stack carries apache-tvm-ffi $TVMFFI" >&2; return 1; }
  # torch-c-dlpack-ext is only tvm-ffi's fallback for a torch without the DLPack exchange API
  unzip -p "$TW" torch/_tensor.py | grep '__dlpack_c_exchange_api__' >/dev/null ||
    { echo "ERROR: torch $TORCH lacks __dlpack_c_exchange_api__: carry torch-c-dlpack-ext too" >&2; return 1; }
  $PIP download "${PLAT[@]}" -d "$WORK/whl" "$z3spec"
  z3w=$(ls -t "$WORK"/whl/z3_solver-*.whl | head -1)
  echo "extra: $(basename "$tlw") ($t: $TVMFFI carried), $(basename "$z3w") ($z3spec)"
  rm -rf "$WORK/extra" && mkdir -p "$WORK/extra" "$EXTRA"
  unzip -q -o "$tlw" -d "$WORK/extra" -x 'tilelang/3rdparty/composable_kernel/*'
  unzip -q -o "$z3w" -d "$WORK/extra" -x '*.data/*'
  mkdir -p "$WORK/extra/tilelang/3rdparty/composable_kernel/include"
  cmp "$WORK/extra/z3/lib/libz3.so" "$WORK/extra/z3/lib/libz3.so.4.15"
  ln -f "$WORK/extra/z3/lib/libz3.so" "$WORK/extra/z3/lib/libz3.so.4.15"
  if [ -d "$WORK/site" ]; then  # no file of the extra may be one of the stream's
    t=$(comm -12 <(cd "$WORK/extra" && find . ! -type d | sort) <(cd "$WORK/site" && find . ! -type d | sort) | head -5)
    [ -z "$t" ] || { echo "ERROR: the extra would overwrite files of the stack: $t" >&2; return 1; }
  fi
  rm -f "$EXTRA/tilelang.tar.xz" "$EXTRA/SHA256SUMS"
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=2026-01-01 -C "$WORK/extra" -cf - . |
    xz -9e -T2 >"$EXTRA/tilelang.tar.xz"   # 176 MB raw -> ~32 MB in ~4 min here
  t=$(stat -c %s "$EXTRA/tilelang.tar.xz")
  [ "$t" -le "$PIECE" ] || { echo "ERROR: $EXTRA/tilelang.tar.xz is $t bytes > $PIECE bytes" >&2; return 1; }
  (cd "$EXTRA" && sha256sum tilelang.tar.xz >SHA256SUMS)
  cp "$HERE/stage_extra.sh" "$EXTRA/"
  ls -l "$EXTRA"
}

ignore ".extra$TAG"
if [ "${ONLY:-}" = extra ]; then
  build_extra
  exit 0
fi
mkdir -p "$STAGE"
ignore ".stage$TAG"

$PIP download "${PLAT[@]}" -d "$WORK/whl" "${PINS[@]}"
$PIP download "${PLAT[@]}" -d "$WORK/whl" -r "$HERE/requirements-vllm-0.32.txt"

rm -rf "$WORK/site"
mkdir -p "$WORK/site"
for w in "$WORK"/whl/*.whl; do
  case "$(basename "$w")" in
    vllm-*) unzip -q -o "$w" -d "$WORK/site" -x 'vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so' \
              'vllm/vllm-rs' 'vllm/third_party/fmha_sm100/*' \
              'vllm/third_party/deep_gemm/_C.cpython-310-*' 'vllm/third_party/deep_gemm/_C.cpython-311-*' \
              'vllm/third_party/deep_gemm/_C.cpython-313-*' 'vllm/third_party/deep_gemm/_C.cpython-314-*' ;;
    triton-*) unzip -q -o "$w" -d "$WORK/site" -x '*.a' 'triton/backends/nvidia/bin/ptxas-blackwell' ;;
    cuda_bindings-*) unzip -q -o "$w" -d "$WORK/site" -x '*.cpp' '*.pyx' ;;
    *) unzip -q -o "$w" -d "$WORK/site" ;;
  esac
done
rm -rf "$WORK"/site/*.data
echo "site tree: $(du -sh "$WORK/site" | cut -f1)"

rm -f "$STAGE"/piece?? "$STAGE/SHA256SUMS" "$STAGE/stack.tar.zst"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=2026-01-01 -C "$WORK/site" -cf - . |
  zstd -q -3 --long=27 -T2 -o "$STAGE/stack.tar.zst"   # 1.05 GB in ~1 min here (gzip -1: 1.27 GB)
(cd "$STAGE" && split -b "$PIECE" -d -a 2 stack.tar.zst piece && sha256sum stack.tar.zst piece?? >SHA256SUMS)
rm -f "$STAGE/stack.tar.zst"
cp "$HERE/stage_stack.sh" "$STAGE/"
# The host may have no zstd: python's zstandard travels with the last piece (.whl213/).
mkdir -p "$REPO/.whl213"
ignore .whl213
$PIP download "${PLAT[@]}" -d "$REPO/.whl213" zstandard==0.25.0
build_extra
ls -l "$STAGE"
echo "$(ls "$STAGE"/piece?? | wc -l) pieces; carry 1 a call (staging/stage_stack.sh names the calls)"
echo "and $EXTRA/ (tilelang, z3-solver): bash $EXTRA/stage_extra.sh $EXTRA/tilelang.tar.xz in any call"
