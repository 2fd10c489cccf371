"""On the GPU host, after staging .stage-dsv4/part02-04 and `source .stage-dsv4/env.sh`: does each
DeepSeek-V4 dependency load and run on this GPU, without importing vllm (17-29 s there)?

  python3 .stage-dsv4/check.py          # ~20-40 s cold (nvcc for TileLang, CuTe-DSL JIT)

1. TileLang: import (libtvm + libz3 + part00's tvm_ffi), compile a tiny kernel with nvcc, run it.
2. CuTe-DSL: import cutlass, cuda.bindings.driver, quack.compile_utils (what the DSv4 compressor
   imports), compile a tiny kernel for this GPU, run it.
3. _moe_C: load vllm/_moe_C_stable_libtorch.abi3.so, run topk_softplus_sqrt (DSv4's router with 16
   experts, top-6, with and without the hash table) against vLLM's own torch reference.
Exit code: the number of failed checks.
"""
import os
import sys
import time
import traceback

import torch

SITE = os.environ.get("SITE", "/tmp/site")
failed = 0


def check(name):
    def wrap(fn):
        global failed
        t0 = time.time()
        try:
            msg = fn()
            print(f"OK   {name} ({time.time() - t0:.1f}s){': ' + msg if msg else ''}", flush=True)
        except Exception as e:  # noqa: BLE001
            failed += 1
            traceback.print_exc()
            print(f"FAIL {name} ({time.time() - t0:.1f}s): {type(e).__name__}: {str(e)[:500]}", flush=True)
        return fn
    return wrap


print(f"python {sys.version.split()[0]} torch {torch.__version__} cuda {torch.version.cuda} "
      f"device {torch.cuda.get_device_name(0)} sm_{''.join(map(str, torch.cuda.get_device_capability(0)))} "
      f"CUDA_HOME={os.environ.get('CUDA_HOME')}", flush=True)


@check("tilelang")
def _tilelang():
    import tilelang
    import tilelang.language as T

    @tilelang.jit
    def add_one(n: int, block: int = 256):
        @T.prim_func
        def main(a: T.Tensor((n,), "float32"), b: T.Tensor((n,), "float32")):
            with T.Kernel(T.ceildiv(n, block), threads=block) as bx:
                for i in T.Parallel(block):
                    b[bx * block + i] = a[bx * block + i] + 1.0
        return main

    a = torch.arange(1024, device="cuda", dtype=torch.float32)
    b = torch.empty_like(a)
    add_one(1024)(a, b)
    torch.cuda.synchronize()
    assert torch.equal(b, a + 1), "wrong result"
    return f"{tilelang.__version__}, nvcc from {tilelang.env.CUDA_HOME}"


@check("cutlass (CuTe-DSL) + quack")
def _cutedsl():
    import cutlass
    import cutlass.cute as cute
    from cuda.bindings.driver import CUstream  # noqa: F401
    from cutlass.cute.runtime import from_dlpack
    from quack.compile_utils import make_fake_tensor  # noqa: F401

    @cute.kernel
    def add_one_kernel(g_a: cute.Tensor, g_b: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        i = bidx * 128 + tidx
        g_b[i] = g_a[i] + cutlass.Float32(1.0)

    @cute.jit
    def add_one(m_a: cute.Tensor, m_b: cute.Tensor):
        add_one_kernel(m_a, m_b).launch(grid=(8, 1, 1), block=(128, 1, 1))

    a = torch.arange(1024, device="cuda", dtype=torch.float32)
    b = torch.empty_like(a)
    fn = cute.compile(add_one, from_dlpack(a), from_dlpack(b))
    fn(from_dlpack(a), from_dlpack(b))
    torch.cuda.synchronize()
    assert torch.equal(b, a + 1), "wrong result"
    import quack
    return f"cutlass from {os.path.dirname(cutlass.__file__)}, quack {quack.__version__}"


@check("vllm._moe_C topk_softplus_sqrt (16 experts, top-6)")
def _moe():
    torch.ops.load_library(os.path.join(SITE, "vllm", "_moe_C_stable_libtorch.abi3.so"))
    op = torch.ops._moe_C.topk_softplus_sqrt
    torch.manual_seed(0)
    m, e, k, scale = 37, 16, 6, 1.5
    logits = torch.randn(m, e, device="cuda", dtype=torch.float32)
    bias = torch.randn(e, device="cuda", dtype=torch.float32) * 0.1
    ids = torch.randint(0, 1000, (m,), device="cuda", dtype=torch.int32)
    table = torch.stack([torch.randperm(e)[:k] for _ in range(1000)]).to("cuda", torch.int32)
    for name, b, tok, tab in (("noaux_tc", bias, None, None), ("hash", None, ids, table)):
        w = torch.empty(m, k, device="cuda", dtype=torch.float32)
        idx = torch.empty(m, k, device="cuda", dtype=torch.int32)
        tei = torch.empty(m, k, device="cuda", dtype=torch.int32)
        op(w, idx, tei, logits, True, scale, b, tok, tab)
        scores = torch.sqrt(torch.nn.functional.softplus(logits))
        if tab is not None:
            ref_idx = tab[tok.long()].long()
        else:
            ref_idx = torch.topk(scores + b, k=k, dim=-1).indices
        ref_w = scores.gather(1, ref_idx)
        ref_w = ref_w / ref_w.sum(-1, keepdim=True) * scale
        got = torch.zeros(m, e, device="cuda").scatter(1, idx.long(), w)
        ref = torch.zeros(m, e, device="cuda").scatter(1, ref_idx, ref_w)
        torch.testing.assert_close(got, ref, rtol=1e-3, atol=1e-4, msg=f"{name} routing differs")
    return "noaux_tc and hash routing match the torch reference"


sys.exit(failed)
