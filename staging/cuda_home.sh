# Sourced (bash), not run: find the CUDA toolkit TileLang (and DeepGEMM) compile with at first use
# and export CUDA_HOME, CUDA_PATH and its bin/ on PATH. TileLang looks at CUDA_HOME, CUDA_PATH,
# `nvcc` on PATH, then /usr/local/cuda (tilelang/env.py _find_cuda_home); a candidate counts only
# with bin/nvcc and include/cuda.h (an `nvcc` on PATH may be a wrapper outside the toolkit).
# _WCP_WHO names the caller in the warning. Used by staging/env32.sh and staging/dsv4_026/env.sh.
_wcp_ok() { [ -n "$1" ] && [ -x "$1/bin/nvcc" ] && [ -f "$1/include/cuda.h" ]; }
if ! _wcp_ok "${CUDA_HOME:-}"; then
  _wcp_nvcc=$(command -v nvcc 2>/dev/null || true)
  _wcp_nvcc=${_wcp_nvcc:+$(readlink -f "$_wcp_nvcc")}
  unset CUDA_HOME
  for _wcp_c in "${CUDA_PATH:-}" ${_wcp_nvcc:+"$(dirname "$(dirname "$_wcp_nvcc")")"} /usr/local/cuda \
                /usr/local/cuda-13.0 /usr/local/cuda-13* /usr/local/cuda-1[0-9]* /opt/cuda; do
    if _wcp_ok "$_wcp_c"; then export CUDA_HOME=$_wcp_c; break; fi
  done
  unset _wcp_nvcc _wcp_c
fi
if _wcp_ok "${CUDA_HOME:-}"; then
  export CUDA_PATH=$CUDA_HOME
  case ":$PATH:" in *":$CUDA_HOME/bin:"*) ;; *) export PATH=$PATH:$CUDA_HOME/bin ;; esac
else
  echo "${_WCP_WHO:-cuda_home.sh}: no CUDA toolkit (bin/nvcc + include/cuda.h) found; set CUDA_HOME: TileLang cannot compile" >&2
fi
unset -f _wcp_ok
