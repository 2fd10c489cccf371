"""Helpers for tests/gpu: where the suite's results are, how to read them (no vLLM import)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
SUITE = ROOT / "bench" / "gpu_suite.py"
CASES = ("llama_v2", "llama_v1", "llama_graphs", "dsv32_bf16", "dsv32_fp8", "scratch")
GiB = 1 << 30


def gpu_available() -> bool:
    if importlib.util.find_spec("vllm") is None:
        return False
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def find_summary(path: Path) -> Path:
    if path.is_file():
        return path
    direct = path / "summary.json"
    if direct.exists():
        return direct
    found = sorted(path.rglob("summary.json"))
    if not found:
        raise FileNotFoundError(f"no summary.json under {path}")
    return found[0]


def load_summary(path: Path) -> dict:
    """A results folder: the suite's summary.json and/or staging/oom_suite.sh's oom.json (a folder
    of soaks or replays alone has no summary)."""
    if path.is_dir() and not (path / "summary.json").exists() and (path / "oom.json").exists():
        summary = {"cases": [], "wall_s": 0.0}
        oom = path / "oom.json"
    else:
        summary = json.loads(find_summary(path).read_text())
        oom = find_summary(path).parent / "oom.json"
    summary["by_case"] = {c["case"]: c for c in summary.get("cases", [])}
    summary["soak"] = {r["run"]: r for r in json.loads(oom.read_text())} if oom.exists() else {}
    manifest = (path if path.is_dir() else path.parent) / "manifest.json"
    if manifest.exists():  # only what the folder's manifest calls current
        cases = json.loads(manifest.read_text()).get("cases", {})

        def current(kind: str, name: str) -> bool:
            return cases.get(kind, {}).get(name, {}).get("status", "current") == "current"

        summary["by_case"] = {n: c for n, c in summary["by_case"].items() if current("suite", n)}
        summary["soak"] = {n: r for n, r in summary["soak"].items() if current("soak", n)}
    return summary


def load_results(paths: list[Path]) -> dict:
    """Several result folders, later ones replacing the cases and soak runs they re-ran (a fix
    re-measured on one configuration replaces that configuration's earlier result)."""
    merged: dict = {"by_case": {}, "soak": {}, "sources": [], "wall_s": 0.0}
    for path in paths:
        s = load_summary(path)
        if s.get("error"):
            return s
        merged["by_case"].update(s["by_case"])
        merged["soak"].update(s["soak"])
        merged["sources"].append(str(path))
        merged["wall_s"] = max(merged["wall_s"], s.get("wall_s", 0.0))
        if s.get("budget_s", 0) <= 600:  # a suite given more ran detached (staging/device_bg.sh)
            merged["call_wall_s"] = max(merged.get("call_wall_s", 0.0), s.get("wall_s", 0.0))
    return merged


def run_suite(out: Path, timeout_s: int = 900) -> None:
    """bench/gpu_suite.py on this machine (each engine in its own subprocess)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    subprocess.run([sys.executable, str(SUITE), "--out", str(out), *CASES], cwd=ROOT, env=env,
                   timeout=timeout_s, check=False)


def report_of(c: dict) -> dict:
    r = c.get("report")
    if r is None:
        tail = "\n".join(c.get("log_tail", [])[-40:])
        pytest.fail(f"{c['case']}: no report (rc={c.get('rc')}, status {c['status']})\n{tail}")
    return r


def worst_step_within_two_percent(name: str, report: dict) -> None:
    """The report's worst-step validations (at least one): each measured <= predicted and
    predicted/measured <= 1.02."""
    worst = [v for v in report.get("validations") or [] if v.get("target") == "worst-step"]
    assert worst, f"{name}: no worst-step validation"
    for v in worst:
        within_two_percent(v)


def within_two_percent(v: dict) -> None:
    """One validation: measured <= predicted and predicted/measured <= 1.02."""
    assert v["measured_peak_bytes"] <= v["predicted_peak_bytes"], v
    assert v["predicted_peak_bytes"] <= 1.02 * v["measured_peak_bytes"], v


def asked(case: dict, flag: str) -> int:
    """The integer the suite passed for `flag` on this case's wcprof command line."""
    argv = case["cli_argv"]
    return int(argv[argv.index(flag) + 1])


def gib(b: int) -> str:
    return f"{b / GiB:.3f} GiB"


def within(v: dict, case: str, allowed: dict[str, int]) -> bool:
    """measured <= predicted; for a case a manifest records as exceeding, the excess must be
    exactly the recorded one (a larger or a different one fails)."""
    over = v["measured_peak_bytes"] - v["predicted_peak_bytes"]
    return over <= 0 or over == allowed.get(case)


def load_served(dirs: list[Path]) -> dict[str, dict]:
    """bench/serve_run.py's folders (DIR/serve.json, with report-MODE.json and serve-MODE.log
    beside it): "RUN/DIR/worstcase" -> that server's entry, with "full_report" (its report or
    None) and "log" (its server log, "" without one), for every `--profiler worstcase` server
    that became healthy. One that never did (its start refused, stopped, or dead in its startup
    validation) served nothing and is not read here: its folder's manifest says why. A stock
    server is the comparison, not the product."""
    out = {}
    for d in dirs:
        for m in json.loads((d / "serve.json").read_text())["modes"]:
            if m["mode"] != "worstcase" or "skipped" in m or m.get("healthy_s") is None:
                continue
            full, log = d / "report-worstcase.json", d / "serve-worstcase.log"
            out[f"{d.parent.name}/{d.name}/worstcase"] = {
                **m, "full_report": json.loads(full.read_text()) if full.exists() else None,
                "log": log.read_text(errors="replace") if log.exists() else ""}
    return out


def traffic_failures(traffic: dict) -> list[str]:
    """The parts of serve_run's traffic that did not all succeed, each a single request ("ok" true
    or false) or a batch ("ok" of "n" requests, with "errors")."""
    bad = []
    for part, t in traffic.items():
        if not isinstance(t, dict):
            continue
        ok = t.get("ok")
        if isinstance(ok, bool):
            if not ok:
                bad.append(f"{part}: {t.get('error', 'failed')}")
        elif ok != t.get("n") or t.get("errors"):
            bad.append(f"{part}: {ok} of {t.get('n')} ({(t.get('errors') or [''])[0]})")
    return bad
