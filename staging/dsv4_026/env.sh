# Source on the GPU host, after staging .stage-dsv4/part02-04 into $SITE (the 0.26 SITE, /tmp/site):
# what vLLM 0.26's DeepSeek-V4 path (TileLang mHC, CuTe-DSL compressor, MoE) needs beyond
# .stage/env.sh. Either after .stage/env.sh, or before `bash staging/device_run.sh CASE`, whose
# prepare() sources .stage/env.sh and keeps every variable set here (it only prepends to PYTHONPATH).
export SITE=${SITE:-/tmp/site}
case ":${PYTHONPATH:-}:" in *":$SITE:"*) ;; *) export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH} ;; esac

# CuTe-DSL (`import cutlass`): its nvidia_cutlass_dsl_packages.pth is not read from a PYTHONPATH
# directory, so put what it would add on the path here, and only once both large libraries are in
# place (part03, part04): vLLM's has_cutedsl() then sees a complete install or none.
_wcp_dsl=$SITE/nvidia_cutlass_dsl
if [ -d "$_wcp_dsl/dsl_packages/cutlass" ]; then
  if ls "$_wcp_dsl"/dsl_packages/cutlass/_mlir/_mlir_libs/_cutlass_ir.cu13.*.so >/dev/null 2>&1 \
     && [ -f "$_wcp_dsl/cu13/lib/libcute_dsl_runtime.so" ]; then
    case ":$PYTHONPATH:" in
      *":$_wcp_dsl/dsl_packages:"*) ;;
      *) export PYTHONPATH=$PYTHONPATH:$_wcp_dsl/dsl_packages ;;
    esac
  else
    echo "dsv4 env.sh: CuTe-DSL incomplete in $SITE (part03 and part04 staged?): cutlass left off PYTHONPATH" >&2
  fi
else
  echo "dsv4 env.sh: no CuTe-DSL in $SITE (part02 staged?)" >&2
fi
unset _wcp_dsl
[ -f "$SITE/tilelang/lib/libtvm.so" ] || echo "dsv4 env.sh: no tilelang in $SITE (part02 staged?)" >&2
[ -f "$SITE/z3/lib/libz3.so" ] || echo "dsv4 env.sh: no libz3 in $SITE (part03 staged?): tilelang cannot load" >&2
[ -f "$SITE/vllm/_moe_C_stable_libtorch.abi3.so" ] || echo "dsv4 env.sh: no _moe_C in $SITE (part04 staged?)" >&2

# nvcc: TileLang compiles its kernels with it at first use (DeepGEMM too); TileLang looks at
# CUDA_HOME, CUDA_PATH, `nvcc` on PATH, then /usr/local/cuda. A candidate counts only with
# bin/nvcc and include/cuda.h (an `nvcc` on PATH may be a wrapper script outside the toolkit).
_WCP_WHO="dsv4 env.sh" source staging/cuda_home.sh  # from the repository root, as every call runs

# JIT caches under /tmp (their defaults are under $HOME or need a user name).
export TILELANG_CACHE_DIR=${TILELANG_CACHE_DIR:-/tmp/tilelang_cache}
# A TileLang cache brought back from an earlier host (h200-run30: `tar -czf $OUT/dsv4-jit-cache.tgz
# -C /tmp tilelang_cache`, kept as .stage-dsv4/jit-cache-*.tgz) skips the mHC kernels' compiles
# (5-16 s each, at every new token count): carry it and it is unpacked once per host.
for _wcp_jit in "$(dirname "${BASH_SOURCE[0]:-$0}")"/jit-cache-*.tgz; do
  [ -f "$_wcp_jit" ] || continue
  _wcp_mark="$TILELANG_CACHE_DIR/.from-$(basename "$_wcp_jit")"
  if [ ! -f "$_wcp_mark" ]; then
    mkdir -p "$TILELANG_CACHE_DIR" && tar -xzf "$_wcp_jit" -C "$TILELANG_CACHE_DIR" --strip-components=1 \
      && touch "$_wcp_mark" && echo "dsv4 env.sh: TileLang cache from $(basename "$_wcp_jit")" >&2
  fi
done
unset _wcp_jit _wcp_mark
export TVM_FFI_CACHE_DIR=${TVM_FFI_CACHE_DIR:-/tmp/tvm_ffi_cache}
export CUTE_DSL_CACHE_DIR=${CUTE_DSL_CACHE_DIR:-/tmp/cute_dsl_cache}
export QUACK_CACHE_DIR=${QUACK_CACHE_DIR:-/tmp/quack_cache}
export FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=${FLASH_ATTENTION_CUTE_DSL_CACHE_DIR:-/tmp/fa_cute_dsl_cache}
# flashinfer is not staged (0.26's .stage/env.sh sets this too).
export VLLM_USE_FLASHINFER_SAMPLER=${VLLM_USE_FLASHINFER_SAMPLER:-0}
