# Source on the GPU host after staging the vLLM 0.32 parts: the offline vLLM importable, and what
# it needs there (flashinfer is not staged: its sampler stays off).
export SITE=${SITE:-/tmp/site32}
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export VLLM_USE_FLASHINFER_SAMPLER=${VLLM_USE_FLASHINFER_SAMPLER:-0}
# CuTe-DSL (part04-06; `import cutlass`, DSv3.2 / DSv4 sparse MLA). Its nvidia_cutlass_dsl_packages.pth
# is not read from a PYTHONPATH directory, so put what it would add on the path here, and only once
# both large libraries are in place (vLLM's has_cutedsl() then finds a complete install or none).
# Its JIT caches go to /tmp: they default to $TMPDIR/$USER/..., which needs a user name.
_wcp_dsl=$SITE/nvidia_cutlass_dsl
if [ -d "$_wcp_dsl/dsl_packages" ]; then
  if ls "$_wcp_dsl"/dsl_packages/cutlass/_mlir/_mlir_libs/_cutlass_ir.cu13.*.so >/dev/null 2>&1 \
     && [ -f "$_wcp_dsl/cu13/lib/libcute_dsl_runtime.so" ]; then
    case ":$PYTHONPATH:" in
      *":$_wcp_dsl/dsl_packages:"*) ;;
      *) export PYTHONPATH=$_wcp_dsl/dsl_packages:$PYTHONPATH ;;
    esac
  else
    echo "env.sh: CuTe-DSL incomplete in $SITE (part05 and part06 staged?): cutlass left off PYTHONPATH" >&2
  fi
fi
unset _wcp_dsl
export CUTE_DSL_CACHE_DIR=${CUTE_DSL_CACHE_DIR:-/tmp/cute_dsl_cache}
export QUACK_CACHE_DIR=${QUACK_CACHE_DIR:-/tmp/quack_cache}
export FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=${FLASH_ATTENTION_CUTE_DSL_CACHE_DIR:-/tmp/fa_cute_dsl_cache}
# TileLang (DeepSeek-V4's mHC kernels; the extra piece .extra213/, staging/stage_extra.sh): it
# compiles each kernel with nvcc at first use and finds it through CUDA_HOME / CUDA_PATH, `nvcc`
# on PATH, then /usr/local/cuda (tilelang/env.py _find_cuda_home). A candidate counts only with
# bin/nvcc and include/cuda.h (an `nvcc` on PATH may be a wrapper outside the toolkit). Its JIT
# caches go to /tmp (their defaults are under $HOME). A TileLang cache brought back from an
# earlier host (`tar -czf $OUT/tilelang-cache.tgz -C /tmp tilelang_cache`, kept here as
# .extra213/tilelang-cache*.tgz and carried) is unpacked once, so those kernels do not compile
# again (they are keyed by their source and compile arguments).
if [ -d "$SITE/tilelang" ]; then
  _WCP_WHO="env.sh" source "$(dirname "${BASH_SOURCE[0]}")/cuda_home.sh"
  export TILELANG_CACHE_DIR=${TILELANG_CACHE_DIR:-/tmp/tilelang_cache}
  export TVM_FFI_CACHE_DIR=${TVM_FFI_CACHE_DIR:-/tmp/tvm_ffi_cache}
  for _wcp_jit in .extra*/tilelang-cache*.tgz; do
    [ -f "$_wcp_jit" ] || continue
    _wcp_mark="$TILELANG_CACHE_DIR/.from-$(basename "$_wcp_jit")"
    if [ ! -f "$_wcp_mark" ]; then
      mkdir -p "$TILELANG_CACHE_DIR" && tar -xzf "$_wcp_jit" -C "$TILELANG_CACHE_DIR" --strip-components=1 \
        && touch "$_wcp_mark" && echo "env.sh: TileLang cache from $_wcp_jit" >&2
    fi
  done
  unset _wcp_jit _wcp_mark
fi
# Triton's kernel cache goes to /tmp too (its default is under $HOME). One brought back from an
# earlier host (`tar -czf - -C /tmp triton_cache | split -b 15m - $OUT/triton-cache.tgz.part`,
# kept here as .kcache214/ and carried) is unpacked once, so the GDN and sampler kernels do not
# compile again inside a case's time (they are keyed by source, arguments and the GPU).
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton_cache}
# DeepGEMM's JIT kernels likewise (vLLM points DG_JIT_CACHE_DIR under ~/.cache/vllm unless it is
# set): one brought back (`tar -czf $OUT/dg-cache.tgz -C $DG_JIT_CACHE_DIR/.. deep_gemm`, kept as
# .kcache214/dg-cache.tgz) is unpacked once, so DeepSeek's sweep does not compile them again.
export DG_JIT_CACHE_DIR=${DG_JIT_CACHE_DIR:-/tmp/dg_cache/deep_gemm}
for _wcp_jit in .kcache*/dg-cache.tgz; do
  [ -f "$_wcp_jit" ] && [ ! -f "$DG_JIT_CACHE_DIR/.from-kcache" ] || continue
  mkdir -p "$DG_JIT_CACHE_DIR" && tar -xzf "$_wcp_jit" -C "$DG_JIT_CACHE_DIR" --strip-components=1 \
    && touch "$DG_JIT_CACHE_DIR/.from-kcache" && echo "env.sh: DeepGEMM cache from $_wcp_jit" >&2
done
unset _wcp_jit
if ls .kcache*/triton-cache.tgz.part* >/dev/null 2>&1 && [ ! -f "$TRITON_CACHE_DIR/.from-kcache" ]; then
  mkdir -p "$TRITON_CACHE_DIR" && cat .kcache*/triton-cache.tgz.part* \
    | tar -xzf - -C "$TRITON_CACHE_DIR" --strip-components=1 \
    && touch "$TRITON_CACHE_DIR/.from-kcache" && echo "env.sh: Triton cache from .kcache" >&2
fi
