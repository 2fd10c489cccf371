#!/usr/bin/env python3
"""On the GPU host, after stage_stack.sh and `source staging/env32.sh` (SITE=/tmp/site213): does
the operator's own stack run against the host's CUDA libraries? One JSON line per check
(`CHECK {"name", "ok", ...}`), each in order, each caught on its own so that one failure names
its library and error without hiding the next; exit 0 when every check passed.

  python3 staging/check_stack.py [--out FILE]
"""

from __future__ import annotations

import json
import sys
import time
import traceback

RESULTS: list[dict] = []
"""Each check runs where it is declared (`check` calls it at once): a helper it calls is defined
above it."""


def check(name):
    def wrap(fn):
        t0 = time.perf_counter()
        try:
            got = fn() or {}
            r = {"name": name, "ok": True, **got}
        except BaseException as e:  # noqa: BLE001 - each check reports its own error
            r = {"name": name, "ok": False, "error": f"{type(e).__name__}: {e}"[:2000],
                 "where": traceback.format_exc().splitlines()[-4:]}
        r["s"] = round(time.perf_counter() - t0, 2)
        RESULTS.append(r)
        print("CHECK", json.dumps(r), flush=True)
        return fn
    return wrap


@check("torch")
def _torch():
    import torch
    x = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    y = (x @ x).float().sum().item()
    return {"version": torch.__version__, "file": torch.__file__, "cuda": torch.version.cuda,
            "device": torch.cuda.get_device_name(), "matmul_finite": y == y}


@check("nccl")
def _nccl():
    import ctypes
    import torch
    lib = next(l for l in open("/proc/self/maps").read().split() if "libnccl.so" in l)
    ctypes.CDLL(lib)
    return {"version": ".".join(map(str, torch.cuda.nccl.version())), "loaded": lib}


@check("cudnn")
def _cudnn():
    import torch
    v = torch.backends.cudnn.version()
    # the first use is where torch checks the runtime against the version it was built with
    out = torch.nn.functional.conv2d(torch.randn(1, 3, 16, 16, device="cuda"),
                                     torch.randn(4, 3, 3, 3, device="cuda"))
    return {"version": v, "conv_ok": bool(out.isfinite().all())}


@check("triton")
def _triton():
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def add(x, y, out, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out + i, tl.load(x + i, mask=i < n) + tl.load(y + i, mask=i < n), mask=i < n)

    a = torch.arange(1000, device="cuda", dtype=torch.float32)
    o = torch.empty_like(a)
    add[(4,)](a, a, o, 1000, BLOCK=256)
    return {"version": triton.__version__, "file": triton.__file__, "ok": bool((o == 2 * a).all())}


@check("torch.compile")
def _compile():
    import torch
    f = torch.compile(lambda t: torch.nn.functional.silu(t) * 2)
    t = torch.randn(4096, device="cuda")
    return {"ok": bool(torch.allclose(f(t), torch.nn.functional.silu(t) * 2))}


def _declared_but_absent(dist: str) -> list[str]:
    """The requirements `dist` declares for this host (extras and other platforms' markers left
    out) that the installed distributions do not meet: "name" where none is installed, "name
    (have X, wants SPEC)" where the version is outside the pin. What an operator's pip install
    would have and this stack does not (each imported only on some paths; an import error names
    the one that matters)."""
    import importlib.metadata as md

    from packaging.requirements import Requirement

    out = []
    for line in md.requires(dist) or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        try:
            have = md.version(req.name)
        except md.PackageNotFoundError:
            out.append(req.name)
            continue
        if req.specifier and not req.specifier.contains(have, prereleases=True):
            out.append(f"{req.name} (have {have}, wants {req.specifier})")
    return out


@check("vllm")
def _vllm():
    import vllm
    from vllm import _custom_ops  # noqa: F401 - _C_stable_libtorch
    return {"version": vllm.__version__, "file": vllm.__file__,
            "declared_but_absent": _declared_but_absent("vllm")}


@check("vllm moe kernels")
def _moe():
    import importlib
    importlib.import_module("vllm._moe_C_stable_libtorch")


@check("deep_gemm")
def _deep_gemm():
    import torch
    from vllm.utils import deep_gemm as dg
    from vllm.utils.import_utils import has_deep_gemm
    dg._lazy_init()
    impls = {k: getattr(dg, k) is not None for k in dir(dg) if k.startswith("_") and k.endswith("_impl")}
    ops = sorted(n for n in dir(torch.ops.deep_gemm) if not n.startswith("_"))
    if not ops or not has_deep_gemm():
        raise RuntimeError(f"deep_gemm registered no ops (has_deep_gemm={has_deep_gemm()})")
    return {"supported": dg.is_deep_gemm_supported(), "ops": ops[:40], "impls": impls}


@check("cutlass (CuTe-DSL)")
def _cutedsl():
    import cutlass
    import cutlass.cute  # noqa: F401
    return {"version": getattr(cutlass, "__version__", None)}


@check("tilelang")
def _tilelang():
    """The extra piece (.extra213/, staging/stage_extra.sh): import and version only, nothing
    JIT-compiled. Importing loads libtvm_compiler.so, which NEEDS z3's libz3.so.4.15 and the
    stream's tvm_ffi. The first kernel compile (DeepSeek-V4's mHC kernels, at the engine's first
    step with --enforce-eager, else in its JIT warm-up) needs nvcc, found through CUDA_HOME
    (staging/env32.sh sets it): reported here, not exercised."""
    import os
    import shutil

    import tilelang
    import z3
    from tilelang import env as tl_env
    cuda_home = getattr(tl_env, "CUDA_HOME", None) or os.environ.get("CUDA_HOME")
    nvcc = os.path.join(cuda_home, "bin", "nvcc") if cuda_home else shutil.which("nvcc")
    return {"version": getattr(tilelang, "__version__", None), "file": tilelang.__file__,
            "z3": z3.get_version_string(), "cuda_home": cuda_home,
            "nvcc": nvcc if nvcc and os.path.exists(nvcc) else None,
            "cache_dir": os.environ.get("TILELANG_CACHE_DIR")}


@check("vllm mhc tilelang kernels")
def _mhc_tilelang():
    """What DeepSeek-V4 imports on CUDA (its mHC ops are bound to these alone): vllm.tilelang_utils
    raises `ImportError("tilelang is required for mhc")` without tilelang. Defines the kernels,
    compiles none."""
    from vllm.model_executor.kernels.mhc import tilelang_kernels as k
    return {"kernels": sorted(n for n in dir(k) if n.endswith("_tilelang"))[:20]}


@check("flash attention 3")
def _fa3():
    from vllm.vllm_flash_attn import flash_attn_interface as fa
    return {"fa3": bool(fa.is_fa_version_supported(3))}


@check("api server")
def _api():
    import uvicorn
    import vllm.entrypoints.openai.api_server  # noqa: F401
    return {"uvicorn": uvicorn.__version__}


def main() -> int:
    out = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else None
    if out:
        with open(out, "w") as f:
            json.dump(RESULTS, f, indent=1)
    print("check_stack:", ", ".join(f"{r['name']} {'ok' if r['ok'] else 'FAILED'}" for r in RESULTS))
    return 0 if all(r["ok"] for r in RESULTS) else 1


if __name__ == "__main__":
    sys.exit(main())
