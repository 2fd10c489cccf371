#!/usr/bin/env python3
"""Engine start-up, stock vs `--profiler worstcase`, side by side in one run (issue 5).

  python3 bench/startup_bench.py --out startup.json [--model DIR ...] [vLLM engine options]

For each model, three fresh processes one after the other, the same engine arguments each time:
  stock           the profiler off;
  worstcase-cold  the profiler on with an empty sweep cache: the full sweep runs;
  worstcase-warm  the profiler on again with the cache the cold start wrote: the worst step is
                  replayed and the sweep reused (worstcase_profiler/cache.py).
Each process times `LLM(...)` (engine start; imports are the same for every mode and timed
apart). Prints a table of ratios to stock and writes every figure to --out. Run it on a host whose
kernel caches (Triton, inductor) are already warm — e.g. after bench/gpu_suite.py — or the first
process pays for compiling kernels the others reuse.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODES = ("stock", "worstcase-cold", "worstcase-warm")


def child(a) -> int:
    t0 = time.perf_counter()
    from vllm import LLM

    import_s = time.perf_counter() - t0
    extra = {}
    report = Path(a.cache_dir) / "report.json"
    if a.mode != "stock":
        extra["additional_config"] = {"worstcase_profiler": {"profiler": "worstcase",
                                                              "json_path": str(report),
                                                              "cache_dir": a.cache_dir}}
    kwargs = dict(model=a.model, load_format="dummy", skip_tokenizer_init=True, seed=0,
                  enforce_eager=not a.graphs, max_model_len=a.max_model_len,
                  max_num_batched_tokens=a.mnbt, gpu_memory_utilization=a.util,
                  kv_cache_dtype=a.kv_cache_dtype, **extra)
    t1 = time.perf_counter()
    llm = LLM(**kwargs)
    boot_s = time.perf_counter() - t1
    out = {"mode": a.mode, "import_s": import_s, "boot_s": boot_s,
           "kv_blocks": int(llm.llm_engine.vllm_config.cache_config.num_gpu_blocks or 0)}
    if report.exists():
        wc = json.loads(report.read_text())["worstcase"]
        out.update(cache=(wc.get("cache") or {}).get("status"), sweep_s=wc["seconds"],
                   replay_s=(wc.get("cache") or {}).get("replay_seconds"),
                   peak_activation_bytes=wc["peak_activation_bytes"])
    print("STARTUP " + json.dumps(out), flush=True)
    return 0


def run_mode(a, model: str, mode: str, cache_dir: str, passthrough: list[str]) -> dict:
    cmd = [sys.executable, __file__, "--child", "--mode", mode, "--model", model,
           "--cache-dir", cache_dir, *passthrough]
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", PYTHONUNBUFFERED="1")
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=a.timeout_s)
    wall = time.perf_counter() - t0
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("STARTUP ")]
    if p.returncode != 0 or not lines:
        return {"mode": mode, "error": f"rc={p.returncode}", "wall_s": wall,
                "tail": (p.stdout + p.stderr).splitlines()[-30:]}
    return {**json.loads(lines[-1][len("STARTUP "):]), "wall_s": wall}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mode", choices=MODES, default="stock", help=argparse.SUPPRESS)
    p.add_argument("--cache-dir", default="", help=argparse.SUPPRESS)
    p.add_argument("--model", action="append", default=None)
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--max-model-len", type=int, default=131072)
    p.add_argument("--mnbt", type=int, default=8192)
    p.add_argument("--util", type=float, default=0.5)
    p.add_argument("--graphs", action="store_true")
    p.add_argument("--timeout-s", type=float, default=240)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    if a.child:
        a.model = a.model[0]
        return child(a)
    if not a.out:
        p.error("--out is required")
    passthrough = ["--kv-cache-dtype", a.kv_cache_dtype, "--max-model-len", str(a.max_model_len),
                   "--mnbt", str(a.mnbt), "--util", str(a.util), *(["--graphs"] if a.graphs else [])]
    results = {"command": " ".join(sys.argv), "models": {}}
    for model in a.model or [str(ROOT / "tests/gpu/models/llama-8l-2048")]:
        cache_dir = tempfile.mkdtemp(prefix="wcprof-startup-")
        runs = [run_mode(a, model, mode, cache_dir, passthrough) for mode in MODES]
        stock = runs[0].get("boot_s")
        for r in runs:
            if stock and r.get("boot_s"):
                r["boot_ratio_to_stock"] = r["boot_s"] / stock
        results["models"][Path(model).name] = runs
        Path(a.out).write_text(json.dumps(results, indent=1))
    print(f"{'model':<22} {'mode':<16} {'boot s':>7} {'ratio':>6} {'import s':>8} {'cache':>7} {'sweep/replay s':>14}")
    for name, runs in results["models"].items():
        for r in runs:
            if "error" in r:
                print(f"{name:<22} {r['mode']:<16} ERROR {r['error']}")
                continue
            swept = r.get("replay_s") if r.get("cache") == "hit" else r.get("sweep_s")
            print(f"{name:<22} {r['mode']:<16} {r['boot_s']:7.1f} {r.get('boot_ratio_to_stock', 0):6.2f} "
                  f"{r['import_s']:8.1f} {str(r.get('cache') or '-'):>7} "
                  f"{(f'{swept:.1f}' if swept is not None else '-'):>14}")
    return 0 if all("error" not in r for rs in results["models"].values() for r in rs) else 1


if __name__ == "__main__":
    sys.exit(main())
