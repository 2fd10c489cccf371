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
