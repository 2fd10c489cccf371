#!/usr/bin/env python3
"""CPU benchmark of `--profiler worstcase` against stock vLLM, side by side, in one run.

  .venv/bin/python bench/cpu_bench.py            # tiny, scratch, tile; 2 boots of each mode

For each workload (engine args from worstcase_profiler.commands.demo.SCENARIOS, tiny = the bundled model
with wcprof's defaults) it measures, every engine in its own subprocess, in-process engine core
(VLLM_ENABLE_V1_MULTIPROCESSING=0), stock and worstcase boots alternating:

  1. start-up: wall time of `LLM(...)` alone (before the call -> after it returns); stock = the
     plugin installed but not enabled; median of --reps boots per mode and worstcase/stock;
  2. prediction vs runtime: in the last worstcase engine, adversarial traffic replayed through
     `llm.generate` — one max_model_len-2 prompt (chunked), ~20 requests that hit the prefix cache
     of a max_model_len - ~max_num_batched_tokens prefix and add a chunk of varying rows, sent in
     small batches, and min(max_num_seqs, 4) long prompts decoding a few tokens. Each generate call
     is read by the project's own meter (CpuMeter: begin() before, end() after = transient above
     max(baseline, what is left live)); measured = max transient + live workspace bytes;
     predicted = report.worstcase.peak_activation_bytes + report.worstcase.workspace_bytes;
  3. KV admitted vs ideal: ideal = the report's own admission arithmetic with the measured
     transient in place of the predicted one; ratio kv_tokens_worstcase / ideal.

Writes docs/results/cpu-bench.json (every raw number, the command, vLLM version, nproc/free) and
docs/results/cpu-bench.md (the table, the command, column meanings, what limits the rest).
Internal: `--child` runs one engine and writes one JSON (used by the parent, not by hand).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, engine_env, error_line, fmt, md_table, median, mib, worstcase_config, write_json
WORKLOADS = ("tiny", "scratch", "tile")
KV_CAP = None  # like for like: the worstcase engines allocate their full budget, as stock does
N_PREFIX_REQS = 20
PREFIX_BATCH = 2
TARGETS = {"measured_over_predicted": ("<=", 1.00), "predicted_over_measured": ("<=", 1.02),
           "kv_worstcase_over_ideal": (">=", 0.98)}


# ---------------------------------------------------------------------------------------------
# child: one engine
# ---------------------------------------------------------------------------------------------

def _engine_kwargs(workload: str) -> dict:
    from worstcase_profiler.commands.demo import scenario_args
    from worstcase_profiler.commands.engine_boot import build_engine_args

    _ns, ea = build_engine_args(scenario_args(workload))
    return {f: getattr(ea, f) for f in ea.__dataclass_fields__}


def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _token_ids(n: int, seed: int, vocab: int) -> list[int]:
    return [(seed * 7919 + i * 31) % (vocab - 1) + 1 for i in range(n)]


def _replay_calls(lim, kv_tokens: int, vocab: int) -> tuple[list[tuple[str, list, int]], int, int]:
    """The replay's generate calls (label, prompts, max_tokens), the prefix length and how many
    prompts decode at the end (see the module docstring)."""
    mml, mnbt, bs = lim.max_model_len, lim.max_num_batched_tokens, lim.block_size
    long_prompt = _token_ids(mml - 2, 1, vocab)
    prefix_len = max(bs, ((mml - mnbt - 2) // bs) * bs)  # whole blocks: all of it can be a hit
    room = mml - prefix_len - 2                          # leave room for 2 generated tokens
    prefix_reqs = []
    for i in range(N_PREFIX_REQS):
        n = max(1, min(room, mnbt - (i * 37) % (mnbt // 2)))
        prefix_reqs.append(long_prompt[:prefix_len] + [(i * 131 + j) % (vocab - 1) + 1 for j in range(n)])
    n_dec = max(1, min(lim.max_num_seqs, 4, kv_tokens // mml - 1))
    calls = [(f"1 prompt of {mml - 2} tokens (chunked by {mnbt})", [long_prompt], 2)]
    for b in range(0, N_PREFIX_REQS, PREFIX_BATCH):
        batch = prefix_reqs[b:b + PREFIX_BATCH]
        calls.append((f"prefix-hit {prefix_len} + new rows {[len(p) - prefix_len for p in batch]}",
                      batch, 2))
    calls.append((f"{n_dec} prompts of {mml - 8} tokens then 6 decode steps",
                  [_token_ids(mml - 8, 10 + i, vocab) for i in range(n_dec)], 6))
    return calls, prefix_len, n_dec


def _metered_generate(llm, meter, scratch_log, label: str, prompts: list, max_tokens: int) -> dict:
    """One generate call read by CpuMeter: begin() before, end() after."""
    from vllm import SamplingParams

    from worstcase_profiler.adapter.meters import _read_status_kb

    if scratch_log is not None:
        scratch_log.clear()
    meter.begin()
    base = meter._base
    t = time.perf_counter()
    res = llm.generate([{"prompt_token_ids": p} for p in prompts],
                       SamplingParams(max_tokens=max_tokens, ignore_eos=True), use_tqdm=False)
    secs = time.perf_counter() - t
    st = _read_status_kb("VmHWM", "VmRSS")
    transient = meter.end()
    row = {"label": label, "requests": len(prompts), "prompt_tokens": [len(p) for p in prompts],
           "max_tokens": max_tokens, "transient_bytes": transient, "rss_before": base,
           "hwm": st["VmHWM"], "rss_after": st["VmRSS"], "seconds": secs,
           "cached_tokens": [int(getattr(r, "num_cached_tokens", 0) or 0) for r in res],
           "generated": [len(r.outputs[0].token_ids) for r in res]}
    if scratch_log is not None and len(scratch_log):
        top = max(scratch_log, key=lambda e: e[4])
        row["max_scratch_request"] = {"layer": top[0], "lane": top[1], "rows": top[2],
                                      "kv_extent": top[3], "bytes": top[4]}
    return row


def _replay(llm, out: dict) -> None:
    """Adversarial traffic through the real engine, every generate call read by CpuMeter."""
    from worstcase_profiler.adapter import workspace as ws
    from worstcase_profiler.adapter.facts import limits_of
    from worstcase_profiler.adapter.meters import CpuMeter

    lim = limits_of(llm.llm_engine.vllm_config)
    worker = llm.llm_engine.model_executor.driver_worker.worker
    kv_tokens = int(worker.model_runner.kv_cache_config.num_blocks) * lim.block_size
    calls, prefix_len, n_dec = _replay_calls(lim, kv_tokens, llm.llm_engine.model_config.get_vocab_size())
    scratch_log = getattr(sys.modules.get("wcp_fixtures.scratch"), "SCRATCH_LOG", None)
    mgr = ws.manager()
    slots = (lambda: ws.slot_sizes(mgr)) if mgr is not None else list
    slots_before = slots()
    meter = CpuMeter()
    rows = []
    t0 = time.perf_counter()
    out["replay"] = {"prefix_len": prefix_len, "block_size": lim.block_size, "kv_tokens_allocated": kv_tokens,
                     "n_decode_prompts": n_dec, "calls": rows, "error": None}
    try:
        for label, prompts, max_tokens in calls:
            rows.append(_metered_generate(llm, meter, scratch_log, label, prompts, max_tokens))
    except Exception as e:  # noqa: BLE001 - a failing replay is a result: record it
        out["replay"]["error"] = error_line(e, 500)
    out["replay"]["seconds"] = time.perf_counter() - t0
    out["replay"].update(workspace_slots_before=slots_before, workspace_slots_after=slots(),
                         live_workspace_bytes=ws.total_bytes(mgr) if mgr is not None else 0,
                         max_transient_bytes=max((r["transient_bytes"] for r in rows), default=0))


def _loadavg() -> list[str]:
    return open("/proc/loadavg").read().split()[:3]


def _kv_facts(llm) -> dict:
    """What the engine allocated: KV blocks, tokens and bytes, prefix caching, RSS."""
    worker = llm.llm_engine.model_executor.driver_worker.worker
    cc = llm.llm_engine.vllm_config.cache_config
    nb, bs = int(worker.model_runner.kv_cache_config.num_blocks), int(cc.block_size)
    bpt = 0
    try:
        from worstcase_profiler.adapter import kv as kvmod

        bpt = int(kvmod.bytes_per_token(worker.model_runner))
    except Exception:  # noqa: BLE001
        pass
    return dict(num_blocks=nb, block_size=bs, kv_tokens_allocated=nb * bs, kv_bytes_allocated=nb * bs * bpt,
                enable_prefix_caching=bool(cc.enable_prefix_caching), rss_after_boot=_rss(),
                requested_cpu_memory=int(getattr(worker, "requested_cpu_memory", 0) or 0))


def _child_kwargs(a, report_path: str) -> dict:
    kwargs = _engine_kwargs(a.workload)
    if a.mode in ("worstcase", "warm"):
        extra = dict(kwargs.get("additional_config") or {})
        extra.update(worstcase_config(report_path, **({"kv_cap_bytes": KV_CAP} if KV_CAP else {})))
        kwargs["additional_config"] = extra
    return kwargs


def _boot(kwargs: dict, out: dict):
    """LLM(**kwargs), timed (wall and process CPU); None when the engine did not start."""
    from vllm import LLM

    out["loadavg_before"] = _loadavg()
    c0 = time.process_time()
    t0 = time.perf_counter()
    try:
        llm = LLM(**kwargs)
    except Exception as e:  # noqa: BLE001
        out["error"] = f"engine start: {error_line(e)}"
        return None
    out["boot_s"] = time.perf_counter() - t0
    out["boot_cpu_s"] = time.process_time() - c0  # all threads of this process: less load-sensitive
    out["loadavg_after"] = _loadavg()
    return llm


def child(a) -> int:
    import vllm

    out: dict = {"workload": a.workload, "mode": a.mode, "rep": a.rep, "error": None,
                 "vllm_version": vllm.__version__}
    report_path = a.out.replace(".json", ".report.json")
    kwargs = _child_kwargs(a, report_path)
    out["engine_args"] = {k: kwargs[k] for k in ("model", "max_model_len", "max_num_batched_tokens",
                                                  "max_num_seqs", "gpu_memory_utilization",
                                                  "load_format", "enforce_eager", "additional_config")}
    llm = _boot(kwargs, out)
    if llm is not None:
        from vllm.v1.worker.cpu_worker import CPUWorker

        out["plugin_patched"] = hasattr(CPUWorker.determine_available_memory, "_wcprof_original")
        out.update(_kv_facts(llm))
        if a.mode == "worstcase" and not os.path.exists(report_path):
            out["error"] = "worstcase engine wrote no report"
        elif a.mode == "worstcase":
            out["report"] = json.load(open(report_path))
            if a.replay:
                _replay(llm, out)
    write_json(a.out, out)
    return 0 if out["error"] is None and not (out.get("replay") or {}).get("error") else 1


# ---------------------------------------------------------------------------------------------
# parent: orchestrate, compute, render
# ---------------------------------------------------------------------------------------------

def _engine_env() -> dict:
    env = engine_env(MALLOC_MMAP_THRESHOLD_="65536", VLLM_NO_USAGE_STATS="1")
    env.pop("WCPROF_PROFILER", None)  # stock must be "installed but not enabled"
    env.pop("WCPROF_CONFIG", None)
    return env


def _machine() -> dict:
    def sh(cmd: str) -> str:
        try:
            return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=10).stdout.strip()
        except Exception as e:  # noqa: BLE001
            return f"error: {e}"

    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    # vLLM's CPU worker requests gpu_memory_utilization x the NUMA node's MemTotal, which on this
    # VM changes over time (memory hotplug): record it, it moves the stock and worstcase budgets.
    node = sh("grep -h MemTotal /sys/devices/system/node/node*/meminfo")
    return {"nproc": sh("nproc"), "free_b": sh("free -b"), "free_h": sh("free -h"), "cpu_model": cpu,
            "numa_node_memtotal": node, "loadavg": open("/proc/loadavg").read().split()[:3],
            "kernel": platform.release(), "python": platform.python_version(),
            "MALLOC_MMAP_THRESHOLD_": "65536"}


def _git() -> dict:
    """Which code ran: other people edit this tree concurrently."""
    def g(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], capture_output=True, text=True, cwd=ROOT,
                                  timeout=10).stdout.strip()
        except Exception as e:  # noqa: BLE001
            return f"error: {e}"

    return {"head": g("rev-parse", "HEAD"),
            "dirty_code": g("status", "--porcelain", "--", "worstcase_profiler", "plugins").splitlines()}


def _run_child(workload: str, mode: str, rep: int, replay: bool, tmp: Path, log,
               cache: str = "off") -> dict:
    out = tmp / f"{workload}_{mode}_{rep}.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--workload", workload,
           "--mode", mode, "--rep", str(rep), "--out", str(out)] + (["--replay"] if replay else [])
    logf = tmp / f"{workload}_{mode}_{rep}.log"
    t0 = time.perf_counter()
    with open(logf, "w") as lf:
        p = subprocess.run(cmd, stdout=lf, stderr=subprocess.STDOUT, cwd=ROOT, timeout=600,
                           env={**_engine_env(), "WCPROF_CACHE_DIR": cache})
    wall = time.perf_counter() - t0
    res = json.loads(out.read_text()) if out.exists() else {"workload": workload, "mode": mode,
                                                             "rep": rep, "error": "child wrote nothing"}
    res["process_wall_s"] = wall
    res["rc"] = p.returncode
    if p.returncode != 0:
        res["log_tail"] = logf.read_text()[-4000:]
    b = res.get("boot_s")
    log(f"  {workload:8s} {mode:9s} rep {rep}: rc={p.returncode} boot="
        f"{'-' if b is None else f'{b:.1f}s'} process={wall:.1f}s"
        + (f"  ERROR {res.get('error') or (res.get('replay') or {}).get('error')}" if p.returncode else ""))
    return res


def _values(runs: list[dict], key: str) -> list:
    return [r[key] for r in runs if r.get(key) is not None]


def _div(x, y):
    """x / y, or None where x is missing or y is missing or 0."""
    return x / y if x is not None and y else None


def _boot_figures(runs: list[dict], stock: list[dict], wc: list[dict]) -> dict:
    """Boot wall times per mode, their medians and ratios to stock; process CPU time alike."""
    sb, wb = _values(stock, "boot_s"), _values(wc, "boot_s")
    warm = _values([r for r in runs if r["mode"] == "warm"], "boot_s")
    sc, wcpu = _values(stock, "boot_cpu_s"), _values(wc, "boot_cpu_s")
    return {"boot_stock_s": sb, "boot_worstcase_s": wb, "boot_stock_median_s": median(sb),
            "boot_worstcase_median_s": median(wb), "boot_ratio": _div(median(wb), median(sb)),
            "boot_warm_s": warm, "boot_warm_ratio": _div(warm[0] if warm else None, median(sb)),
            "boot_cpu_stock_s": sc, "boot_cpu_worstcase_s": wcpu,
            "boot_cpu_ratio": _div(median(wcpu), median(sc))}


def _prediction(rep: dict, wc: list[dict]) -> dict:
    """What the report that served the replay predicted, and how much of it is chord slack."""
    w = rep["worstcase"]
    largest_step = max([st["peak_bytes"] for st in w["steps"]] + [rep["stock"]["peak_activation_bytes"]])
    return {"sweep_s": w["seconds"], "sweep_s_all": [r["report"]["worstcase"]["seconds"] for r in wc if "report" in r],
            "shapes_executed": w["shapes_executed"], "worst_shape": w["worst_shape"],
            "stock_peak_activation_bytes": rep["stock"]["peak_activation_bytes"],
            "predicted_transient_bytes": w["peak_activation_bytes"], "predicted_workspace_bytes": w["workspace_bytes"],
            "predicted_bytes": w["peak_activation_bytes"] + w["workspace_bytes"],
            "max_executed_step_bytes": largest_step, "chord_slack_bytes": w["peak_activation_bytes"] - largest_step,
            "chord_segments": sum(1 for g in w["coverage"]["segments"] if g["how"] == "chord"),
            "coverage_tolerance_bytes": w["coverage"]["tolerance_bytes"]}


def _measured(replay: dict, s: dict) -> dict:
    """What the replay measured, against the prediction."""
    measured = replay["max_transient_bytes"] + replay["live_workspace_bytes"]
    worst_call = max(replay["calls"], key=lambda c: c["transient_bytes"], default=None)
    return {"measured_transient_bytes": replay["max_transient_bytes"],
            "live_workspace_bytes": replay["live_workspace_bytes"], "measured_bytes": measured,
            "worst_call": worst_call["label"] if worst_call else None, "replay_error": replay["error"],
            "measured_over_predicted": _div(measured, s["predicted_bytes"]),
            "predicted_over_measured": _div(s["predicted_bytes"], measured),
            # Diagnostic: the same ratio without the chord slack (largest executed step + workspace).
            "predicted_over_measured_without_chord_slack":
                _div(s["max_executed_step_bytes"] + s["predicted_workspace_bytes"], measured)}


def _kv_ideal(rep: dict, s: dict) -> dict:
    """The report's own admission arithmetic with the measured transient in place of the predicted."""
    adm, block = rep["admission"], rep["config"]["block_size"]
    block_bytes = adm["bytes_per_token"] * block
    ideal_bytes = (adm["requested_bytes"] - adm["consumed_bytes"] - s["measured_transient_bytes"]
                   - adm["margin_bytes"])
    ideal_tokens = (max(0, ideal_bytes) // block_bytes) * block if block_bytes else 0
    return {"ideal_kv_bytes": ideal_bytes, "kv_tokens_ideal": ideal_tokens,
            "kv_tokens_worstcase": adm["kv_tokens_worstcase"], "kv_tokens_stock": adm["kv_tokens_stock"],
            "kv_worstcase_over_ideal": _div(adm["kv_tokens_worstcase"], ideal_tokens), "admission": adm}


def _replay_facts(replay: dict) -> dict:
    scratch = [c["max_scratch_request"] for c in replay["calls"] if c.get("max_scratch_request")]
    return {"prefix_cache_hit_tokens": sum(sum(c["cached_tokens"]) for c in replay["calls"]),
            "replay_s": replay["seconds"],
            "workspace_grew_during_replay": replay["workspace_slots_after"] != replay["workspace_slots_before"],
            "max_scratch_request_in_replay": max(scratch, key=lambda e: e["bytes"]) if scratch else None}


def _per_engine(runs: list[dict], stock: list[dict], wc: list[dict]) -> dict:
    """The load average around every boot, and the KV each engine allocated."""
    out = {"loadavg_1min": [float(r[k][0]) for r in runs for k in ("loadavg_before", "loadavg_after") if r.get(k)]}
    for what in ("bytes", "tokens"):
        for mode, engines in (("stock", stock), ("worstcase", wc)):
            out[f"kv_{what}_allocated_{mode}_engine"] = [r.get(f"kv_{what}_allocated") for r in engines]
    return out


def _summarise(workload: str, runs: list[dict]) -> dict:
    """One workload's figures (cpu-bench.json's summaries) from its engines' results."""
    stock = [r for r in runs if r["mode"] == "stock"]
    wc = [r for r in runs if r["mode"] == "worstcase"]
    s: dict = {"workload": workload, **_boot_figures(runs, stock, wc), **_per_engine(runs, stock, wc)}
    rep_run = next((r for r in reversed(wc) if r.get("replay")), None)
    if rep_run is None or "report" not in rep_run:
        s["error"] = "no worstcase replay"
        return s
    s.update(_prediction(rep_run["report"], wc))
    s.update(_measured(rep_run["replay"], s))
    s.update(_kv_ideal(rep_run["report"], s))
    s.update(_replay_facts(rep_run["replay"]))
    return s


def _ok(key: str, v) -> bool | None:
    if v is None:
        return None
    op, t = TARGETS[key]
    return v <= t + 1e-12 if op == "<=" else v >= t - 1e-12


def _mark(s: dict, key: str) -> str:
    """A ratio with its verdict against TARGETS."""
    ok = _ok(key, s.get(key))
    return fmt(s.get(key), "{:.4f}") + ("" if ok is None else (" ok" if ok else " MISS"))


def _table_rows(summaries: list[dict]) -> list[list[str]]:
    return [[s["workload"], fmt(s.get("boot_stock_median_s"), "{:.1f}"),
             fmt(s.get("boot_worstcase_median_s"), "{:.1f}"), fmt(s.get("boot_ratio"), "{:.2f}"),
             fmt((s.get("boot_warm_s") or [None])[0], "{:.1f}"), fmt(s.get("boot_warm_ratio"), "{:.2f}"),
             mib(s.get("predicted_bytes")), mib(s.get("measured_bytes")),
             _mark(s, "measured_over_predicted"), _mark(s, "predicted_over_measured"),
             str(s.get("kv_tokens_ideal", "-")), str(s.get("kv_tokens_worstcase", "-")),
             _mark(s, "kv_worstcase_over_ideal"), str(s.get("kv_tokens_stock", "-"))]
            for s in summaries]


HEADERS = ["workload", "boot stock s", "boot wc s", "wc/stock", "boot warm s", "warm/stock",
           "predicted MiB", "measured MiB",
           "meas/pred (<=1.00)", "pred/meas (<=1.02)", "KV ideal tok", "KV wc tok",
           "wc/ideal (>=0.98)", "KV stock tok"]


# "What limits the rest": every number in it is read from the run; no number is typed in.

def _targets_paragraph(summaries: list[dict]) -> str:
    misses = [f"{s['workload']} {k.replace('_', ' ')} = {s[k]:.4f} (target {TARGETS[k][0]} {TARGETS[k][1]:.2f})"
              for s in summaries for k in TARGETS if _ok(k, s.get(k)) is False]
    return "**Targets missed in this run:** " + ("; ".join(misses) + "." if misses else "none.")


def _scratch_sentence(s: dict) -> str:
    ms = s.get("max_scratch_request_in_replay")
    if not ms:
        return ""
    return (f"Largest scratch request in the replay: {ms['bytes'] / (1 << 20):.2f} MiB at rows="
            f"{ms['rows']} kv_extent={ms['kv_extent']}; workspace "
            f"{'GREW' if s['workspace_grew_during_replay'] else 'did not grow'} during the replay. ")


def _prediction_sentences(s: dict) -> str:
    gap = s["predicted_bytes"] - s["measured_bytes"]
    over = s["measured_transient_bytes"] - s["max_executed_step_bytes"]
    return (f"*{s['workload']}*: predicted {mib(s['predicted_bytes'])} MiB = transient "
            f"{mib(s['predicted_transient_bytes'])} + workspace {mib(s['predicted_workspace_bytes'])}; "
            f"measured {mib(s['measured_bytes'])} MiB = transient {mib(s['measured_transient_bytes'])} "
            f"(worst call: {s['worst_call']}) + live workspace {mib(s['live_workspace_bytes'])}; "
            f"prediction {'above' if gap >= 0 else 'BELOW'} measurement by {mib(abs(gap))} MiB. "
            f"The largest executed synthetic step was {mib(s['max_executed_step_bytes'])} MiB, so the "
            f"replay's transient is {mib(abs(over))} MiB {'above' if over > 0 else 'below'} the "
            f"largest executed step; the chord slack ({mib(s['chord_slack_bytes'])} MiB, "
            f"{s['chord_segments']} chord-certified segments at tolerance "
            f"{mib(s['coverage_tolerance_bytes'])} MiB) is what the prediction adds on top "
            f"(pred/meas without it: {fmt(s['predicted_over_measured_without_chord_slack'], '{:.4f}')}). "
            + _scratch_sentence(s)
            + f"Prefix-cache hit tokens over the replay: {s['prefix_cache_hit_tokens']}.")


def _each(ok: list[dict], cell) -> str:
    """`workload value, workload value, ...` over the workloads with a replay result."""
    return ", ".join(f"{s['workload']} {cell(s)}" for s in ok)


def _bounds_paragraph(ok: list[dict]) -> str:
    return (
        "**What bounds pred/meas.** CpuMeter reads RSS high-water marks, resolution "
        f"{mib(ok[0]['coverage_tolerance_bytes'])} MiB (the chord tolerance). The transients of these "
        "toy models are a few MiB (" + _each(ok, lambda s: mib(s["measured_transient_bytes"])) + " MiB measured), so "
        "a chord-certified segment adds up to one tolerance (max of its ends + tolerance) to the "
        "predicted transient. As a share of the predicted total the chord slack is "
        + _each(ok, lambda s: f"{100 * s['chord_slack_bytes'] / s['predicted_bytes']:.1f}%")
        + ": where no persistent workspace stands beside the transient, pred/meas is set by the "
        "meter's resolution rather than by the sweep; pred/meas of the largest executed step alone "
        "is " + _each(ok, lambda s: fmt(s["predicted_over_measured_without_chord_slack"], "{:.4f}")) + ".")


def _node_memtotal(machine: dict) -> str:
    return machine.get("numa_node_memtotal", "?").split(":")[-1].strip()


def _kv_paragraph(ok: list[dict], result: dict) -> str:
    kv = [f"{s['workload']} {mib(s['ideal_kv_bytes'])} MiB ideal, a 2% miss = {mib(0.02 * s['ideal_kv_bytes'])} MiB"
          for s in ok if s.get("ideal_kv_bytes")]
    return (
        "**Why wc/ideal is easy here.** The CPU worker requests `gpu_memory_utilization` of the node "
        "(" + _each(ok, lambda s: f"{mib(s['admission']['requested_bytes'])} MiB") + " requested; NUMA node MemTotal "
        + f"{_node_memtotal(result.get('machine_at_start', {}))} at the start of the run, "
        f"{_node_memtotal(result['machine'])} at the end: "
        "this VM's node memory changes, and the stock and worstcase budgets with it), so the KV budget is gigabytes while the transient is megabytes: " + "; ".join(kv)
        + ". The KV ratio would pass with a prediction tens of MiB too high; it is not a sensitive "
        "test on this box, the transient ratios are.")


def _mib_range(values: list) -> str:
    return f"{mib(min(values))}-{mib(max(values))} MiB" if values else "?"


def _all(summaries: list[dict], key: str) -> list:
    """key's values (lists) of every summary, in one list, without empty ones."""
    return [v for s in summaries for v in s.get(key, []) if v]


def _startup_paragraph(summaries: list[dict], ok: list[dict], result: dict) -> str:
    loads = [v for s in summaries for v in s.get("loadavg_1min", [])]
    return (
        "**Start-up.** The sweep's model steps: "
        + _each(ok, lambda s: f"{s['shapes_executed']} steps in {s['sweep_s']:.1f} s")
        + ". KV allocated: stock engines " + _mib_range(_all(summaries, "kv_bytes_allocated_stock_engine"))
        + ", worstcase engines " + _mib_range(_all(summaries, "kv_bytes_allocated_worstcase_engine"))
        + (f" (capped by `kv_cap_bytes` at {KV_CAP >> 20} MiB: not like for like)" if KV_CAP else
           " (each its full budget: like for like)")
        + ". The box has "
        + f"{result['machine']['nproc']} cores and is shared: the 1-minute load average read around the "
        + (f"boots ranged {min(loads):.2f}-{max(loads):.2f}" if loads else "boots was not read")
        + ", so wall times carry contention noise; `boot_cpu_s` (process CPU time of `LLM(...)`) in the "
        "JSON is less sensitive to it (" + _each(summaries, lambda s: f"CPU-time ratio {fmt(s.get('boot_cpu_ratio'), '{:.2f}')}") + ").")


COVERAGE_PARAGRAPH = (
    "**Coverage of the replay.** One adversarial mix, not a proof: the prefix-hit requests reach a KV "
    "extent of prefix + rows (the prefix is block-aligned below `max_model_len - max_num_batched_tokens`), "
    "the decode batch has at most 4 requests, and each `generate` call is metered as a whole, so "
    "scheduler and output bookkeeping of the in-process engine core count in the measured transient "
    "while the sweep meters model steps only.")


def _limits_paragraph(summaries: list[dict], result: dict) -> str:
    """Built from the measured numbers of this run: which targets were missed, and what bounds
    the figures that were met."""
    ok = [s for s in summaries if s.get("measured_bytes") is not None]
    paras = [_targets_paragraph(summaries)]
    paras += [f"**{s['workload']}:** no replay result ({s['error']})." for s in summaries if s.get("error")]
    if ok:
        paras += ["**Prediction vs runtime.** " + " ".join(_prediction_sentences(s) for s in ok),
                  _bounds_paragraph(ok), _kv_paragraph(ok, result)]
    paras += [_startup_paragraph(summaries, ok, result), COVERAGE_PARAGRAPH]
    return "\n\n".join(paras)


def _markdown(result: dict, summaries: list[dict]) -> str:
    md = ["# CPU benchmark: stock vs `--profiler worstcase`", "",
          f"Generated by `bench/cpu_bench.py` on {result['created_at']} ({result['machine']['cpu_model']}, "
          f"nproc {result['machine']['nproc']}, {result['machine']['free_h'].splitlines()[1].split()[1]} RAM), "
          f"vLLM {result['vllm_version']}, total runtime {result['total_s']:.0f} s. "
          "Every number below is read from `cpu-bench.json`, which holds the raw figures.", "",
          md_table(HEADERS, _table_rows(summaries))]
    md += ["", "Command:", "", "```", result["command"], "```", "",
           "## Columns", "",
           "- **boot stock s / boot wc s**: median wall time of `LLM(...)` (before the call to after it "
           f"returns), {result['reps']} boots per mode, each in its own subprocess, in-process engine "
           "core (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), stock and worstcase alternating. Stock = the "
           "plugin installed (patches applied, `plugin_patched` in the JSON) but not enabled. "
           "Python start-up and `import vllm` are outside the timing.",
           "- **wc/stock**: ratio of the two medians. Every worstcase boot here is cold: it starts "
           "from an empty sweep cache and runs the full sweep.",
           "- **boot warm s / warm/stock**: one more worstcase boot that finds the last cold boot's "
           "sweep cached (the restart path, `worstcase_profiler/cache.py`): it replays the cached "
           "worst step instead of sweeping; ratio to the stock median.",
           "- **predicted MiB**: `report.worstcase.peak_activation_bytes + report.worstcase.workspace_bytes` "
           "of the worstcase engine that served the replay.",
           "- **measured MiB**: the largest `CpuMeter.end()` over the replay's `generate` calls "
           "(VmHWM above max(baseline RSS, RSS after the call), `begin()` before each call) plus the "
           "workspace bytes live after the replay (`adapter.workspace.total_bytes`). Replay: one "
           "`max_model_len-2` prompt (chunked), "
           f"{N_PREFIX_REQS} requests that hit the prefix cache of a block-aligned "
           "`max_model_len - max_num_batched_tokens - 2` prefix and add a chunk of "
           "`max_num_batched_tokens - (i*37 % (max_num_batched_tokens/2))` rows, in batches of "
           f"{PREFIX_BATCH}, then min(max_num_seqs, 4) prompts of `max_model_len-8` tokens decoding 6 tokens.",
           "- **meas/pred**: measured / predicted; above 1.00 the prediction did not bound the runtime.",
           "- **pred/meas**: predicted / measured; how much the prediction over-reserves.",
           "- **KV ideal tok**: `(requested - consumed - measured transient - margin)` from the report's "
           "admission, in whole blocks of `bytes_per_token * block_size`, in tokens; measured transient = "
           "measured minus live workspace (the workspace is already inside `consumed`).",
           "- **KV wc tok**: `admission.kv_tokens_worstcase`, the budget the engine allocated"
           + (f" (capped at {KV_CAP >> 20} MiB with `kv_cap_bytes` in this run)" if KV_CAP else "")
           + ". **wc/ideal** = KV wc tok / KV ideal tok.",
           "- **KV stock tok**: `admission.kv_tokens_stock`, what stock admission would give in the same "
           "process; the stock engines' own allocations are in the JSON (`kv_tokens_allocated_stock_engine`).",
           "", "## What limits the rest", "", _limits_paragraph(summaries, result), ""]
    return "\n".join(md)


def _bench_workload(w: str, reps: int, tmp: Path, log) -> list[dict]:
    """reps stock and cold worstcase boots alternating (the last cold one replays traffic), then
    one warm boot that reuses the last cold boot's sweep cache: the restart path
    (worstcase_profiler/cache.py)."""
    runs = []
    for rep in range(reps):
        for mode in ("stock", "worstcase"):
            runs.append(_run_child(w, mode, rep, replay=(mode == "worstcase" and rep == reps - 1),
                                   tmp=tmp, log=log, cache=str(tmp / f"cache-{w}-{rep}")))
    runs.append(_run_child(w, "warm", 0, replay=False, tmp=tmp, log=log,
                           cache=str(tmp / f"cache-{w}-{reps - 1}")))
    return runs


def _command_line() -> str:
    """This run's command as typed from the repository root."""
    python = (os.path.relpath(sys.executable, ROOT) if sys.executable.startswith(str(ROOT))
              else sys.executable)
    env = os.environ.get("MALLOC_MMAP_THRESHOLD_")
    return ((f"MALLOC_MMAP_THRESHOLD_={env} " if env else "")
            + " ".join([shlex.quote(python), "bench/cpu_bench.py", *map(shlex.quote, sys.argv[1:])]))


def _print_table(con, summaries: list[dict], total: float) -> None:
    from rich.table import Table

    table = Table(title="worstcase vs stock on this CPU box (ratios)")
    for h in HEADERS:
        table.add_column(h, justify="left" if h == "workload" else "right")
    for r in _table_rows(summaries):
        table.add_row(*r)
    con.print(table)
    con.print(f"total runtime {total:.0f} s")


def _console():
    from rich.console import Console

    con = Console()
    if not con.is_terminal or con.width < 160:  # the table has 12 columns: never squeeze them
        con = Console(width=200)
    return con


def _engines(all_runs: dict[str, list[dict]]) -> list[dict]:
    return [r for runs in all_runs.values() for r in runs]


def parent(a) -> int:
    con = _console()
    t_start = time.perf_counter()
    git_start, machine_start = _git(), _machine()
    workloads = [w.strip() for w in a.workloads.split(",") if w.strip()]
    tmp = Path(tempfile.mkdtemp(prefix="cpu-bench-"))
    con.print(f"[bold]cpu_bench[/]: {', '.join(workloads)}, {a.reps} boots per mode; logs in {tmp}")
    all_runs = {w: _bench_workload(w, a.reps, tmp, con.print) for w in workloads}
    summaries = [_summarise(w, all_runs[w]) for w in workloads]
    total = time.perf_counter() - t_start
    vver = next((r["vllm_version"] for r in _engines(all_runs) if r.get("vllm_version")), None)
    result = {
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": _command_line(),
        "vllm_version": vver, "machine": _machine(), "machine_at_start": machine_start,
        "git": {"at_start": git_start, "at_end": _git()}, "reps": a.reps, "workloads": workloads,
        "kv_cap_bytes": KV_CAP, "targets": TARGETS, "total_s": total, "summaries": summaries,
        "runs": all_runs, "logs_dir": str(tmp)}
    _print_table(con, summaries, total)
    if not a.no_write:
        _write(a, result, summaries, con)
    return 1 if any(r.get("rc") for r in _engines(all_runs)) else 0


def _write(a, result: dict, summaries: list[dict], con) -> None:
    jp, mp = ROOT / a.json, ROOT / a.md
    jp.parent.mkdir(parents=True, exist_ok=True)
    jp.write_text(json.dumps(result, indent=1) + "\n")
    mp.write_text(_markdown(result, summaries))
    con.print(f"wrote {jp.relative_to(ROOT)} and {mp.relative_to(ROOT)}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--json", default="docs/results/cpu-bench.json")
    p.add_argument("--md", default="docs/results/cpu-bench.md")
    p.add_argument("--no-write", action="store_true", help="print the table only")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--workload", choices=WORKLOADS)
    p.add_argument("--mode", choices=("stock", "worstcase", "warm"))
    p.add_argument("--rep", type=int, default=0)
    p.add_argument("--replay", action="store_true")
    p.add_argument("--out")
    a = p.parse_args()
    return child(a) if a.child else parent(a)


if __name__ == "__main__":
    sys.exit(main())
