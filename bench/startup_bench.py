#!/usr/bin/env python3
"""Engine start-up, stock vs `--profiler worstcase`, side by side in one run (issue 5).

  python3 bench/startup_bench.py --out startup.json [--model DIR ...] [vLLM engine options]

For each model, fresh processes one after the other, the same engine arguments each time:
  stock           the profiler off;
  worstcase-cold  the profiler on with an empty sweep cache: the full sweep runs;
  worstcase-warm  the profiler on again with the cache the cold start wrote: the worst step is
                  replayed and the sweep reused (worstcase_profiler/cache.py);
  worstcase-cut   a cold start with --sweep-depth cut-down, in a cache of its own (named only);
  worstcase-prove a cold start with --sweep-depth prove (both sweeps, the full one admitted), in
                  a cache of its own (named only): its `proof` says whether the cut admits what
                  the full sweep does;
  worstcase-imported
                  a start whose empty cache first imports --import-from's entries (`wcprof cache
                  import`): another host's sweep, replayed and checked here (named only); without
                  --import-from, its round's cold start's entry, exported and imported as
                  another host would receive it (after worstcase-cold in --modes).
--modes picks the modes and their order (default: stock, worstcase-cold, worstcase-warm);
--export-to copies the cache the cold start wrote into a directory (`wcprof cache export`), for
another host's worstcase-imported.
--repeat N runs --modes N times over, interleaved and rotated (stock, cold, warm, then cold,
warm, stock: drift hits every mode alike, and no mode is always a round's first start; with the
default modes an even N starts stock first in half the rounds), each round's cold start on an
empty cache of its own and its warm start on what that cold start wrote, and compares medians.
A warm or imported start that did not reuse the cache (status other than hit) counts as an
error, not as a cached start. A warm start finds
the entry its round's cold start wrote, which this host's key signed (trust "host": it replays
its worst step only); an imported one is re-checked against the plan's heaviest shapes
(docs/cache.md). --signed signs the cache as a fleet sharing one does; the table's cache column
says which trust each cached start had ("hit/host", "hit/signed", "hit/re-checked").
--family NAME (repeatable, instead of --model) benchmarks one of FAMILIES: issue 34's five
layouts (tests/gpu/models), each with the engine options its family needs; --graphs and the
other options apply to all. --deadline (epoch s) skips a start that would not end before it
(its estimate: the longest start so far, or --timeout-s), recorded as not run; --mirror DIR
gets a copy of --out after every start (the device's $OUT). Each process times `LLM(...)`
(engine start; imports are the same for every mode and timed apart), and the report's
startup_seconds say where the profiler's part of it went. Each start is a fork of this process,
which imported vLLM once (`fork` in --out says so; --no-fork: a fresh interpreter each, whose
imports took 14-16 s a start on an H100 in h100-run87, outside the figures either way). Prints
a table of ratios to stock and writes every figure to --out. Run it on a host whose kernel caches
(Triton, inductor) are already warm, or with --prime (one uncounted worst-case start per model,
which compiles what stock and the profiler's steps run), or the first process pays for compiling
kernels the others reuse (run 8 in docs/results: a first stock start of 44 s against 7 s).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, engine_env, merged_config, run_child, worstcase_config, write_json
from worstcase_profiler.core.cache import ENV_SECRET
from worstcase_profiler.core.timing import profiler_phases
from worstcase_profiler.core.types import Shape

BENCH_SECRET = "wcprof-bench"
"""--signed's secret where none is set: a benchmark's, not an operator's."""

MODES = ("stock", "worstcase-cold", "worstcase-warm", "worstcase-cut", "worstcase-prove",
         "worstcase-imported")
DEFAULT_MODES = MODES[:3]

MODELS = ROOT / "tests" / "gpu" / "models"
FAMILIES: dict[str, tuple[Path, dict]] = {
    # issue 34's five: the 8B layout, a family the suite never ran (the 64-layer Qwen2 of the
    # issue's 2.26x; on an 80 GB card, where its 131,072 tokens do not fit, the same family at
    # Qwen2.5-14B's 48 layers), a GDN hybrid, a sliding-window model with a 262k vocabulary,
    # an MoE; each of 32+ layers. Geometry from the public configs (Qwen2.5-32B and -14B base;
    # Gemma 3 12B's text model; Qwen3-30B-A3B with the YaRN factor 4 its model card gives for 131,072 tokens);
    # the hybrid is the suite's 8-layer Qwen3.5 layout at 32 layers. Engine options beyond the
    # shared ones: the GDN prefill on Triton, as the suite's qwen35 cases run it.
    "llama8b": (MODELS / "llama-3.1-8b-layout", {}),
    "qwen2-32b": (MODELS / "qwen2.5-32b-layout", {}),
    "qwen2-14b": (MODELS / "qwen2.5-14b-layout", {}),
    "qwen35-32l": (MODELS / "qwen35-32l-layout",
                   {"additional_config": {"gdn_prefill_backend": "triton"}}),
    "gemma3-12b": (MODELS / "gemma-3-12b-layout", {}),
    "qwen3moe-30b": (MODELS / "qwen3-30b-a3b-layout", {}),
}
"""name -> (model directory, vLLM engine options of its own); a vLLM additional_config here is
merged with the profiler's."""


def engine_kwargs(family_extra: dict, profiler_config: dict | None) -> dict:
    """The family's own engine options with the profiler's additional_config merged in (None:
    the stock start, the family's options alone)."""
    out = {k: v for k, v in family_extra.items() if k != "additional_config"}
    merged = merged_config(family_extra.get("additional_config", {}), profiler_config or {})
    if merged:
        out["additional_config"] = merged
    return out


CACHED_MODES = ("worstcase-warm", "worstcase-imported")
"""Modes that start on what their round's worstcase-cold stored: they run after it."""


def start_order(modes: list[str], repeat: int) -> list[tuple[int, str]]:
    """(round, mode) in the order the starts run: --modes, `repeat` rounds over, interleaved,
    each round a rotation of --modes, in turn, among those that keep every cached mode after its
    round's cold start (stock, cold, warm; then cold, warm, stock): no mode is always a round's
    first start (h100-run89: with graphs each round's first, stock, took 1.9-7.9 s longer than
    the restart after it). The default modes have two such rotations: an even --repeat gives
    each the same number of rounds. Each round has its own sweep cache: its cold start sweeps,
    its cached starts reuse that."""
    def keeps_cache_order(order: list[str]) -> bool:
        if "worstcase-cold" not in order:
            return True
        cold = order.index("worstcase-cold")
        return all(i > cold for i, m in enumerate(order) if m in CACHED_MODES)

    if not modes:
        return []
    # never empty: the rotation that starts at the cold start keeps the order
    turns = [r for r in (modes[k:] + modes[:k] for k in range(len(modes)))
             if keeps_cache_order(r)]
    return [(i, m) for i in range(max(1, repeat)) for m in turns[i % len(turns)]]


SLOWEST = 8
"""slowest_steps keeps this many: the full-model steps that set a first start's sweep time."""


def slowest_steps(worstcase: dict) -> list[dict]:
    """The report's SLOWEST slowest measured steps (the sweep's and the pool fit's), each as
    {shape label, seconds}: where a first start's sweep time goes (its cut-down steps take
    milliseconds, its full-model confirmations and class samples seconds). A cached start's
    report carries the steps of the start that measured them: the child records none for it."""
    steps = [*(worstcase.get("steps") or ()), *((worstcase.get("pool_fit") or {}).get("steps") or ())]
    ranked = sorted(steps, key=lambda s: -s["seconds"])[:SLOWEST]
    return [{"shape": shape_label(s["shape"]), "seconds": round(s["seconds"], 3)}
            for s in ranked]


def shape_label(shape: dict) -> str | dict:
    """A report's shape (Shape's fields) as its Shape label; one this build cannot name (a
    field missing) stays as the report wrote it, and fields it does not know are left out."""
    fields = set(Shape.__dataclass_fields__)
    try:
        return Shape(**{f: v for f, v in shape.items() if f in fields}).label()
    except TypeError:
        return shape


def child(a) -> int:
    """One start of --mode on the one --model (a --child's namespace); prints STARTUP {json}."""
    t0 = time.perf_counter()
    from vllm import LLM

    import_s = time.perf_counter() - t0
    import logging

    # measure_held's detail lines are DEBUG; vLLM's handler shows INFO and up.
    debug = logging.StreamHandler(sys.stdout)
    debug.addFilter(lambda record: record.levelno == logging.DEBUG)
    logging.getLogger("vllm.wcprof").addHandler(debug)
    logging.getLogger("vllm.wcprof").setLevel(logging.DEBUG)

    report = Path(f"{a.cache_dir}.report.json")  # beside the cache: an export copies only entries
    report.unlink(missing_ok=True)  # the previous mode's
    profiler = None
    if a.mode != "stock":
        profiler = worstcase_config(str(report), cache_dir=a.cache_dir,
                                    **MODE_SETTINGS.get(a.mode, {}))
    extra = engine_kwargs(json.loads(a.engine_json or "{}"), profiler)
    kwargs = dict(model=a.model[0], load_format="dummy", skip_tokenizer_init=True, seed=0,
                  enforce_eager=not a.graphs, max_model_len=a.max_model_len,
                  max_num_batched_tokens=a.mnbt, gpu_memory_utilization=a.util,
                  kv_cache_dtype=a.kv_cache_dtype, **extra)
    t1 = time.perf_counter()
    llm = LLM(**kwargs)
    boot_s = time.perf_counter() - t1
    cache_config = llm.llm_engine.vllm_config.cache_config
    device = str(getattr(llm.llm_engine.vllm_config.device_config, "device_type", "") or "")
    out = {"mode": a.mode, "device": device, "import_s": import_s, "boot_s": boot_s,
           "kv_blocks": int(cache_config.num_gpu_blocks or 0),
           "kv_tokens": int(cache_config.num_gpu_blocks or 0) * int(cache_config.block_size or 0),
           "block_size": int(cache_config.block_size or 0)}
    if report.exists():
        out.update(report_record(json.loads(report.read_text())))
    print("STARTUP " + json.dumps(out), flush=True)
    return 0


MODE_SETTINGS = {"worstcase-cut": {"sweep_depth": "cut-down"},
                 "worstcase-prove": {"sweep_depth": "prove"}}
"""The profiler settings a mode adds to the profiler's own (the others: none, auto's depth)."""


def report_record(written: dict) -> dict:
    """What a start keeps of the report it wrote: the sweep cache's use, the sweep's mode, the
    admission (KV bytes and the terms it was made of), and, on a start that swept (not a cached
    one), the sweep's time, where it went and its cut-down proof (a cached start's report
    repeats its first start's: its own time is replay_s)."""
    wc, phases = written["worstcase"], written.get("startup_seconds") or {}
    cache, admission = wc.get("cache") or {}, written.get("admission") or {}
    swept = cache.get("status") != "hit"
    proof = wc.get("cut_down_proof") or {}
    return dict(cache=cache.get("status"), trust=cache.get("trust"),
                sweep_s=wc["seconds"] if swept else None,
                sweep_mode=wc.get("sweep_mode"), kv_cache_bytes=admission.get("kv_cache_bytes"),
                budget_terms={k: admission.get(k) for k in BUDGET_TERMS},
                held_moved_bytes=cache.get("held_moved_bytes"),
                transient_raised_bytes=cache.get("transient_raised_bytes"),
                kv_tokens_stock=admission.get("kv_tokens_stock"),
                kv_groups=len((written.get("kv_audit") or {}).get("groups") or ()) or None,
                replay_s=cache.get("replay_seconds"), replay_depth=cache.get("replay_depth"),
                peak_activation_bytes=wc["peak_activation_bytes"], startup_seconds=phases,
                profiler_s=round(sum(profiler_phases(phases).values()), 3),
                slowest_steps=slowest_steps(wc) if swept else [],
                sweep_split=(proof.get("seconds_split") or {}) if swept else {},
                proof=proof_summary(proof) if swept else None,
                pool_fit=pool_fit_summary(wc.get("pool_fit")))


def pool_fit_summary(fit: dict | None) -> dict | None:
    """The pool fit's pools, rounds, steps and how many of them a cached entry gave (None where
    the sweep's plan stood): a restart that measured its fit again shows here (h100-run88)."""
    if not fit:
        return None
    return {"planned_pool_tokens": fit.get("planned_pool_tokens"),
            "pool_tokens": fit.get("pool_tokens"), "rounds": fit.get("rounds"),
            "steps": len(fit.get("steps") or ()), "reused": fit.get("reused")}


BUDGET_TERMS = ("consumed_bytes", "non_torch_bytes", "cudagraph_bytes", "warmup_graphs_bytes",
                "transient_bytes", "margin_bytes", "budget_bytes")
"""The report's admission terms a start keeps: where two starts of one configuration that admit
different KV differ (h200-run86: a restart admitted 438 MiB less than its first start)."""

PROOF_KEYS = ("method", "verdict", "depth", "full_worst", "cut_worst", "full_admitted_bytes",
              "cut_admitted_bytes", "confirmed_peak_bytes", "full_peak_bytes", "resolution_bytes",
              "deltas", "fell_back", "full_seconds", "cut_seconds")
"""The report's cut_down_proof fields a start's `proof` keeps: the verdict, both worst shapes
(as labels) and both admitted figures (prove: full against cut; self-check: the full ones are
None unless it fell back)."""


def proof_summary(proof: dict | None) -> dict | None:
    """The cut-down proof's verdict and figures (PROOF_KEYS, the shapes as Shape labels), None
    when the start had none."""
    if not proof:
        return None
    out = {k: proof.get(k) for k in PROOF_KEYS if k in proof}
    for k in ("full_worst", "cut_worst"):
        if isinstance(out.get(k), dict):
            out[k] = shape_label(out[k])
    return out


def wcprof_cache(verb: str, directory: str, cache_dir: str) -> str:
    """`wcprof cache VERB DIRECTORY` against the sweep cache in cache_dir; its output line(s)."""
    p = subprocess.run([sys.executable, "-m", "worstcase_profiler.cli", "cache", verb, directory],
                       capture_output=True, text=True, cwd=ROOT,
                       env=engine_env(WCPROF_CACHE_DIR=cache_dir), timeout=120)
    if p.returncode != 0:
        raise RuntimeError(f"wcprof cache {verb} {directory}: rc={p.returncode}: {p.stderr.strip()}")
    return p.stdout.strip()


LOGGED = ("[wcprof]", "torch.compile took", "Directly load the compiled graph",
          "Compiling a graph for", "Directly load AOT compilation", "saved AOT compiled function",
          "Compiling model again")
"""The log lines a start keeps (wcprof_log): the profiler's, and vLLM's compile-cache lines
(whether the start compiled or loaded what an earlier start compiled)."""


CUDA_FORK = "Cannot re-initialize CUDA in forked subprocess"
"""torch's error where a forked child finds CUDA initialised in its parent."""


def run_mode(a, model: str, mode: str, cache_dir: str, passthrough: list[str],
             engine: dict | None = None, import_from: str | None = None,
             timeout_s: float | None = None) -> dict:
    """One start in a fresh process (a fork of this one, or a new interpreter with --no-fork, or
    where a forked start found CUDA initialised: then this and every later one), killed after
    `timeout_s` (--timeout-s unless given)."""
    imported = None
    if mode in MODE_SETTINGS:  # another sweep depth: a cache of its own, never the round's
        cache_dir = tempfile.mkdtemp(prefix=f"wcprof-startup-{mode}-")
    elif mode == "worstcase-imported":  # an empty cache that holds only what was imported
        cache_dir = tempfile.mkdtemp(prefix="wcprof-startup-imported-")
        imported = wcprof_cache("import", import_from or a.import_from, cache_dir)
    cmd = [sys.executable, __file__, "--child", "--mode", mode, "--model", model,
           "--cache-dir", cache_dir, *passthrough, "--engine-json", json.dumps(engine or {})]

    def start() -> dict:
        return {"mode": mode, **run_child(cmd, "STARTUP", timeout_s=timeout_s or a.timeout_s,
                                          log_match=LOGGED, log_key="wcprof_log", log_lines=48,
                                          forked=child_main if a.fork else None),
                **({"imported": imported} if imported else {})}

    out = start()
    if a.fork and "error" in out and any(CUDA_FORK in line for line in out.get("tail", [])):
        a.fork = False  # this and every later start in a fresh interpreter (--out says so)
        a.forking = f"off from a {mode} start on: its fork found CUDA initialised"
        out = {**start(), "fork_failed": out["error"]}
    if "error" in out:
        return out
    if mode in ("worstcase-warm", "worstcase-imported") and out.get("cache") != "hit":
        # a cached mode that swept is not a cached start: keep its figures, not its label
        out["error"] = f"cache {out.get('cache')!r}, not hit: the sweep ran"
        out.pop("boot_s", None)
    return out


def child_main(argv: list[str]) -> int:
    """One start from its argv (--child ...), in this process: what a forked start runs."""
    return child(_parse(argv))


def _parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mode", choices=MODES, default="stock", help=argparse.SUPPRESS)
    p.add_argument("--cache-dir", default="", help=argparse.SUPPRESS)
    p.add_argument("--model", action="append", default=None)
    p.add_argument("--family", action="append", default=None, choices=sorted(FAMILIES),
                   help="one of issue 34's layouts, with its own engine options (repeatable)")
    p.add_argument("--engine-json", default=None, help=argparse.SUPPRESS)
    p.add_argument("--deadline", type=float, default=None,
                   help="epoch s: a start that would not end before it is not made")
    p.add_argument("--mirror", default=None, help="copy --out here after every start")
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--max-model-len", type=int, default=131072)
    p.add_argument("--mnbt", type=int, default=8192)
    p.add_argument("--util", type=float, default=0.5)
    p.add_argument("--graphs", action="store_true")
    p.add_argument("--timeout-s", type=float, default=240)
    p.add_argument("--repeat", type=int, default=1,
                   help="rounds of --modes per model, interleaved (medians over them)")
    p.add_argument("--modes", default=",".join(DEFAULT_MODES),
                   help=f"comma-separated, in order (default: %(default)s); of {', '.join(MODES)}")
    p.add_argument("--export-to", default=None,
                   help="copy the sweep cache the cold start wrote here (wcprof cache export)")
    p.add_argument("--import-from", default=None,
                   help="worstcase-imported starts from this directory's entries (wcprof cache import)")
    p.add_argument("--prime", action="store_true",
                   help="one uncounted start per model first, the profiler on and its sweep "
                        "cache thrown away (a stock one if that fails): a fresh host compiles "
                        "there the kernels either start runs (Triton's, inductor's)")
    p.add_argument("--no-fork", dest="fork", action="store_false",
                   help="each start in a fresh interpreter, its imports its own (default: a "
                        "fork of this process, which imported vLLM once)")
    p.add_argument("--prime-timeout-s", type=float, default=300,
                   help="the priming start's own timeout (at least --timeout-s): on a fresh host "
                        "it compiles every kernel of the model, which a start cut short leaves "
                        "to the first counted start")
    p.add_argument("--signed", action="store_true",
                   help=f"sign the sweep cache ({ENV_SECRET}={BENCH_SECRET} unless one is set), as "
                        "a fleet sharing a cache does: an imported start then replays its worst "
                        "step only, where an unsigned import also re-checks the plan's heaviest "
                        "shapes")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    if not a.child and not a.out:
        p.error("--out is required")
    a.order = [m.strip() for m in a.modes.split(",") if m.strip()]
    unknown = [m for m in a.order if m not in MODES]
    if unknown:
        p.error(f"unknown mode(s) {unknown}; known: {', '.join(MODES)}")
    if "worstcase-imported" in a.order and not a.import_from and not (
            "worstcase-cold" in a.order
            and a.order.index("worstcase-cold") < a.order.index("worstcase-imported")):
        p.error("worstcase-imported needs --import-from DIR, or worstcase-cold before it (its "
                "round's own entry, exported and imported into an empty cache)")
    return a


def bench_model(a, name: str, model: str, engine: dict, passthrough: list[str],
                results: dict, save) -> None:
    """--modes, --repeat rounds over, interleaved, in fresh processes (start_order), each round on
    a sweep cache of its own; each start's ratio to the stock median, and the medians per mode.
    A start the --deadline leaves no time for, or a cached start whose round's first start did
    not store a sweep, is recorded as not run (with why)."""
    caches: dict[int, str] = {}
    entry = results["models"][name] = {"model": model, "engine": engine, "runs": [],
                                       "medians": {}}
    if a.prime:
        results.setdefault("primed", {})[name] = prime(a, model, passthrough, engine, results)
    for rnd, mode in start_order(a.order, a.repeat):
        why = _no_time(a, results)
        from_cold = mode == "worstcase-warm" or (mode == "worstcase-imported" and not a.import_from)
        if not why and from_cold and "worstcase-cold" in a.order and \
                not any(r.get("cache") == "stored" for r in entry["runs"]
                        if r.get("round") == rnd and r["mode"] == "worstcase-cold"):
            why = "this round's cold start stored no sweep to restart from"
        if why:
            entry["runs"].append({"mode": mode, "round": rnd, "not_run": why})
            continue
        if rnd not in caches:
            caches[rnd] = tempfile.mkdtemp(prefix="wcprof-startup-")
        try:
            source = None
            if mode == "worstcase-imported" and not a.import_from:  # this round's own entry,
                source = tempfile.mkdtemp(prefix="wcprof-startup-export-")  # as another host
                wcprof_cache("export", source, caches[rnd])  # would receive it
            run = run_mode(a, model, mode, caches[rnd], passthrough, engine, import_from=source)
        except RuntimeError as e:  # wcprof cache import failed: this start cannot be made
            run = {"mode": mode, "error": str(e)}
        entry["runs"].append({**run, "round": rnd})
        _ratios(entry)
        save()
    if a.export_to:
        stored = [r["round"] for r in entry["runs"]
                  if r["mode"] == "worstcase-cold" and r.get("cache") == "stored"]
        try:
            exported = wcprof_cache("export", a.export_to, caches[stored[0]]) if stored else \
                "nothing exported: no first start stored a sweep"
        except RuntimeError as e:
            exported = f"export failed: {e}"
        results.setdefault("exported", {})[name] = exported


def prime(a, model: str, passthrough: list[str], engine: dict, results: dict) -> dict:
    """The uncounted first start (--prime): a worst-case one on a sweep cache thrown away, so
    that the kernel caches (Triton, inductor, vLLM's compile cache) hold what the profiler's own
    steps compile as well as what a stock start does: on a host with warm caches a first start
    pays for its sweep, not for compiling the top-k sampler or the fused-MoE kernel at the
    sweep's batch sizes. Where it fails (a start the profiler refuses), a stock one instead; not
    after a timeout (that would spend the prime's time twice). {"mode", "wall_s", "boot_s"} of
    the start made, or {"mode", "wall_s", "error"}."""
    out: dict = {}
    for mode in ("worstcase-cold", "stock"):
        why = _no_time(a, results)
        if why:
            return {"mode": mode, "error": why}
        run = run_mode(a, model, mode, tempfile.mkdtemp(prefix="wcprof-startup-prime-"),
                       passthrough, engine, timeout_s=prime_timeout(a))
        out = {"mode": mode, "wall_s": run.get("wall_s"),
               **({"boot_s": run["boot_s"]} if "boot_s" in run else
                  {"error": run.get("error", "no boot time")})}
        if "boot_s" in run or run.get("timed_out"):
            break
    return out


def prime_timeout(a) -> float:
    """The priming start's timeout: --prime-timeout-s (at least --timeout-s), never past
    --deadline (a start cut short there still leaves the counted ones their time)."""
    t = max(a.timeout_s, a.prime_timeout_s)
    if a.deadline is not None:
        t = min(t, max(1.0, a.deadline - time.time()))
    return t


def _no_time(a, results: dict) -> str:
    """Why the next start is not made before --deadline ("" when it is)."""
    if a.deadline is None:
        return ""
    left, need = a.deadline - time.time(), expected_start_s(results, a.timeout_s)
    return "" if left >= need else \
        f"{left:.0f} s before the deadline, a start takes ~{need:.0f} s"


def expected_start_s(results: dict, timeout_s: float) -> float:
    """What the next start is expected to take: the longest one so far, a prime's included
    (wall clock, process start and imports included: what a start costs the call, any model),
    at most the per-start timeout (a fresh host's prime compiles: the hybrid's took 192 s), else
    the per-start timeout. A worst-case prime that ended is a first start, the longest kind (a
    stock one is not counted: it would under-estimate one): h100-run88's Gemma with graphs
    primed in 104 s, then skipped every counted start with 135 s left on the 150 s timeout's
    estimate."""
    walls = [r["wall_s"] for m in results["models"].values() for r in m["runs"] if "wall_s" in r]
    walls += [min(p["wall_s"], timeout_s) for p in (results.get("primed") or {}).values()
              if isinstance(p, dict) and p.get("mode") == "worstcase-cold" and "boot_s" in p
              and p.get("wall_s")]
    return max(walls) if walls else timeout_s


def _ratios(entry: dict) -> None:
    runs = entry["runs"]
    stocks = [r["boot_s"] for r in runs if r["mode"] == "stock" and "boot_s" in r]
    stock = statistics.median(stocks) if stocks else None
    for r in runs:
        if stock and r.get("boot_s"):
            r["boot_ratio_to_stock"] = r["boot_s"] / stock
    entry["medians"] = _medians(runs, stock)
    # the report's stock KV is vLLM's own profile's figure: equal to what a stock start got?
    got = sorted({r["kv_tokens"] for r in runs if r["mode"] == "stock" and "kv_tokens" in r})
    said = sorted({r["kv_tokens_stock"] for r in runs if r.get("kv_tokens_stock") is not None})
    if got and said:
        # Compared where tokens are one measure: one KV group (vLLM shares blocks across groups,
        # and the report's tokens count every layer's bytes), within a block; not on the CPU,
        # where vLLM's figure follows the host's free memory.
        cpu = any(r.get("device") == "cpu" for r in runs)
        groups = max((r.get("kv_groups") or 1 for r in runs), default=1)
        block = max((r.get("block_size") or 0 for r in runs), default=0)
        agree = None if cpu or groups > 1 else max(said + got) - min(said + got) <= block
        entry["stock_kv_tokens"] = {"stock_starts": got, "reports": said, "agree": agree,
                                    "kv_groups": groups}


def print_table(results: dict) -> None:
    print(f"{'model':<22} {'mode':<18} {'n':>2} {'boot s':>7} {'ratio':>6} {'+s':>6} {'profiler s':>10} "
          f"{'cache':>14}  where the profiler's time went (median)")
    for name, res in results["models"].items():
        if "stock_kv_tokens" in res:
            k = res["stock_kv_tokens"]
            verdict = {True: "equal within a block", False: "NOT EQUAL",
                       None: "not compared (the CPU's figure follows the host's free memory, "
                             "or several KV groups share its blocks)"}
            print(f"{name:<22} stock KV tokens: stock starts {k['stock_starts']}, the reports' "
                  f"stock figure {k['reports']}: {verdict[k['agree']]}")
        for r in res["runs"]:
            if "error" in r:
                print(f"{name:<22} {r['mode']:<18} ERROR {r['error']}")
            elif "not_run" in r:
                print(f"{name:<22} {r['mode']:<18} NOT RUN {r['not_run']}")
        for mode, m in res["medians"].items():
            top = ", ".join(f"{k} {v:.2f}" for k, v in m["phases"]
                            if not k.startswith("vllm_") and v >= 0.05)
            print(f"{name:<22} {mode:<18} {m['n']:>2} {m['boot_s']:7.2f} {m['ratio']:6.2f} "
                  f"{m['extra_s']:6.2f} {m['profiler_s']:10.2f} {str(m['cache'] or '-'):>14}  {top}")


def main() -> int:
    a = _parse()
    if a.child:
        return child(a)
    a.forking = import_for_forks() if a.fork else "off (--no-fork)"
    a.fork = a.forking.startswith("on")
    passthrough = ["--kv-cache-dtype", a.kv_cache_dtype, "--max-model-len", str(a.max_model_len),
                   "--mnbt", str(a.mnbt), "--util", str(a.util), *(["--graphs"] if a.graphs else [])]
    if a.signed and not os.environ.get(ENV_SECRET):
        os.environ[ENV_SECRET] = BENCH_SECRET  # every child inherits it (common.engine_env)
    results = {"command": " ".join(sys.argv), "graphs": a.graphs, "repeat": a.repeat,
               "signed": bool(os.environ.get(ENV_SECRET)), "fork": a.forking, "models": {}}

    def save() -> None:
        results["fork"] = a.forking  # a fork that found CUDA initialised turned it off
        write_json(a.out, results)
        if a.mirror:
            Path(a.mirror).mkdir(parents=True, exist_ok=True)
            write_json(Path(a.mirror) / Path(a.out).name, results)

    targets = [(Path(m).name, m, {}) for m in a.model or []]
    targets += [(f, str(FAMILIES[f][0]), FAMILIES[f][1]) for f in a.family or []]
    for name, model, engine in targets or [("llama-8l-2048", str(MODELS / "llama-8l-2048"), {})]:
        bench_model(a, name, model, engine, passthrough, results, save)
        save()
    print_table(results)
    runs = [r for res in results["models"].values() for r in res["runs"]]
    return 0 if all("error" not in r and "not_run" not in r for r in runs) else 1


def import_for_forks() -> str:
    """Import vLLM here, once, for every start to fork from (common.run_forked): "on: ..." with
    the import's seconds, or "off: why" (the starts then run in fresh interpreters). Off where
    the import initialised CUDA, which a forked child could not use."""
    os.environ.update(engine_env())  # as every child's: read at import where vLLM reads it then
    t0 = time.perf_counter()
    try:
        from vllm import LLM  # noqa: F401
        import torch
    except Exception as e:  # noqa: BLE001 - the starts then import (and fail) on their own
        return f"off: importing vLLM here failed ({type(e).__name__}: {e})"
    if torch.cuda.is_initialized():
        return "off: importing vLLM initialised CUDA, which a forked start could not use"
    return f"on: vLLM imported once in {time.perf_counter() - t0:.2f} s, each start forked"


def _medians(runs: list[dict], stock: float | None) -> dict:
    """Per mode: the median boot, its ratio to stock's median and extra seconds, the profiler's
    own seconds and its phases (median each), largest first."""
    out = {}
    for mode in MODES:
        ok = [r for r in runs if r["mode"] == mode and "boot_s" in r]
        if ok and stock:
            out[mode] = _mode_medians(ok, stock)
    return out


def _mode_medians(ok: list[dict], stock: float) -> dict:
    boot = statistics.median([r["boot_s"] for r in ok])
    # the sweep's split (cut decoder, full model, eager re-reads) beside the report's phases
    phases = [{**(r.get("startup_seconds") or {}),
               **{f"sweep.{k}": v for k, v in (r.get("sweep_split") or {}).items()}} for r in ok]
    names = {k for p in phases for k in p}
    medians = {k: statistics.median([p.get(k, 0.0) for p in phases]) for k in names}
    return {"n": len(ok), "boot_s": boot, "ratio": boot / stock, "extra_s": boot - stock,
            "profiler_s": statistics.median([r.get("profiler_s", 0.0) for r in ok]),
            "cache": "/".join(filter(None, (ok[-1].get("cache"), ok[-1].get("trust")))) or None,
            "phases": sorted(medians.items(), key=lambda kv: -kv[1])}


if __name__ == "__main__":
    sys.exit(main())
