#!/usr/bin/env python3
"""The production guard's cost: the same 200-request soak with the guard on and off, side by side.

  python3 bench/guard_soak.py --out guard.json [--model DIR] [--requests 200] [--rounds 3]
                              [--order off,on,on,off] [--drop-first 1] [--graphs]
                              [vLLM engine options]

Every start is a fresh process running `LLM(...)` in-process with `--profiler worstcase` and the
same sweep cache (the first start sweeps, uncounted; the others replay its worst step), differing
only in the setting `guard` ("on" or "off"). Each process then serves the soak --rounds times:
--requests prompts of token ids (lengths drawn from a fixed seed between --prompt-min and
--prompt-max), each decoding --output tokens with ignore_eos, all submitted in one
`generate` call. One untimed short request comes first so no lazily compiled kernel is timed.
Throughput = (prompt + output tokens) / wall seconds of the `generate` call.

The processes alternate (default off, on, on, off) so drift hits both alike; the table gives each
mode's median over its rounds, each process's first --drop-first left out, and the overhead
(1 - on/off). bench/guard_probe.py times the guard's own per-step work, which this soak's noise
cannot resolve. Guard-on processes also report
what the guard saw (its memory-mapped figures: steps, largest step, steps above the prediction).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, run_child, worstcase_config, write_json


def prompts(a) -> list[dict]:
    vocab = json.loads((Path(a.model) / "config.json").read_text()).get("vocab_size", 32000)
    rng = random.Random(0)
    return [{"prompt_token_ids": [rng.randrange(1, min(30000, vocab - 1))
                                  for _ in range(rng.randint(a.prompt_min, a.prompt_max))]}
            for _ in range(a.requests)]


def guard_figures(llm) -> list[dict]:
    """Every rank's guard figures from its memory-mapped file ([] when the guard is off)."""
    from worstcase_profiler.adapter.guard import instance_dirs, read_channel

    out = []
    for d in instance_dirs(str(llm.llm_engine.vllm_config.instance_id)):
        for f in sorted(d.glob("*.bin")) if d.is_dir() else []:
            values = read_channel(f)
            if values is not None:
                out.append(values)
    return out


def child(a) -> int:
    from vllm import LLM, SamplingParams

    report = Path(f"{a.cache_dir}.{a.guard}.report.json")
    config = worstcase_config(str(report), cache_dir=a.cache_dir, guard=a.guard)
    t0 = time.perf_counter()
    llm = LLM(model=a.model, load_format="dummy", skip_tokenizer_init=True, seed=0,
              enforce_eager=not a.graphs, max_model_len=a.max_model_len,
              max_num_batched_tokens=a.mnbt, gpu_memory_utilization=a.util,
              additional_config=config)
    boot_s = time.perf_counter() - t0
    params = SamplingParams(max_tokens=a.output, ignore_eos=True, temperature=0.0)
    llm.generate([{"prompt_token_ids": [7] * 64}], SamplingParams(max_tokens=4, ignore_eos=True),
                 use_tqdm=False)
    batch = prompts(a)
    prompt_tokens = sum(len(p["prompt_token_ids"]) for p in batch)
    rounds = []
    for _ in range(a.rounds):
        t = time.perf_counter()
        outs = llm.generate(batch, params, use_tqdm=False)
        wall = time.perf_counter() - t
        tokens = prompt_tokens + sum(len(o.outputs[0].token_ids) for o in outs)
        rounds.append({"wall_s": wall, "tokens": tokens, "tok_s": tokens / wall})
    written = json.loads(report.read_text()) if report.exists() else {}
    cache = ((written.get("worstcase") or {}).get("cache") or {}).get("status")
    print("SOAK " + json.dumps({"guard": a.guard, "boot_s": boot_s, "rounds": rounds,
                                "cache": cache, "figures": guard_figures(llm)}), flush=True)
    return 0


def run(a, guard: str, cache_dir: str) -> dict:
    cmd = [sys.executable, __file__, "--child", "--guard", guard, "--cache-dir", cache_dir,
           *a.passthrough]
    return {"guard": guard, **run_child(cmd, "SOAK", timeout_s=a.timeout_s,
                                        log_match="[wcprof] guard", log_key="guard_log",
                                        log_lines=10)}


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--guard", choices=("on", "off"), default="off", help=argparse.SUPPRESS)
    p.add_argument("--cache-dir", default="", help=argparse.SUPPRESS)
    p.add_argument("--model", default=str(ROOT / "tests/gpu/models/llama-8l-2048"))
    p.add_argument("--max-model-len", type=int, default=131072)
    p.add_argument("--mnbt", type=int, default=8192)
    p.add_argument("--util", type=float, default=0.5)
    p.add_argument("--graphs", action="store_true")
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--prompt-min", type=int, default=256)
    p.add_argument("--prompt-max", type=int, default=2048)
    p.add_argument("--output", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3, help="timed soaks per process")
    p.add_argument("--drop-first", type=int, default=1,
                   help="rounds of each process left out of the medians (kernels that compile "
                        "or autotune at their first use); they stay in the JSON")
    p.add_argument("--order", default="off,on,on,off", help="guard per process, in order")
    p.add_argument("--timeout-s", type=float, default=300)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    if not a.child and not a.out:
        p.error("--out is required")
    a.passthrough = ["--model", a.model, "--max-model-len", str(a.max_model_len), "--mnbt",
                     str(a.mnbt), "--util", str(a.util), "--requests", str(a.requests),
                     "--prompt-min", str(a.prompt_min), "--prompt-max", str(a.prompt_max),
                     "--output", str(a.output), "--rounds", str(a.rounds),
                     *(["--graphs"] if a.graphs else [])]
    return a


def summarise(runs: list[dict], drop_first: int = 0) -> dict:
    """Per mode, the median throughput over the rounds of its processes (each process's first
    `drop_first` left out); the overhead."""
    out: dict = {"dropped_per_process": drop_first}
    for mode in ("off", "on"):
        tps = [r["tok_s"] for run in runs if run.get("guard") == mode and "rounds" in run
               for r in run["rounds"][drop_first:]]
        if tps:
            out[mode] = {"rounds": len(tps), "median_tok_s": statistics.median(tps),
                         "min_tok_s": min(tps), "max_tok_s": max(tps)}
    if "on" in out and "off" in out:
        out["on_over_off"] = out["on"]["median_tok_s"] / out["off"]["median_tok_s"]
        out["overhead"] = 1 - out["on_over_off"]
    figs = [f for run in runs if run.get("guard") == "on" for f in run.get("figures", [])]
    if figs:
        out["guard_saw"] = figs
    return out


def main() -> int:
    a = _parse()
    if a.child:
        return child(a)
    cache_dir = tempfile.mkdtemp(prefix="wcprof-guard-soak-")
    results: dict = {"command": " ".join(sys.argv), "runs": []}
    results["prime"] = run(a, "off", cache_dir)  # sweeps and caches: uncounted
    for guard in [g.strip() for g in a.order.split(",") if g.strip()]:
        results["runs"].append(run(a, guard, cache_dir))
        results["summary"] = summarise(results["runs"], a.drop_first)
        write_json(a.out, results)
    s = results.get("summary", {})
    for mode in ("off", "on"):
        if mode in s:
            m = s[mode]
            print(f"guard {mode:<3}  {m['rounds']} rounds  median {m['median_tok_s']:.0f} tok/s "
                  f"(min {m['min_tok_s']:.0f}, max {m['max_tok_s']:.0f})")
    if "overhead" in s:
        print(f"on/off {s['on_over_off']:.4f}  overhead {100 * s['overhead']:.2f}%")
    for f in s.get("guard_saw", []):
        print(f"guard saw: {json.dumps(f)}")
    errors = [r for r in [results["prime"], *results["runs"]] if "error" in r]
    for r in errors:
        print(f"ERROR guard {r['guard']}: {r['error']}\n  " + "\n  ".join(r.get("tail", [])))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
