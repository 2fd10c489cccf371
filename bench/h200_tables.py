#!/usr/bin/env python3
"""Render the tables of docs/results/h200-vllm-0.26.md from the raw JSON committed beside it, so
every figure in the doc is read from a measurement file, never typed.

  python3 bench/h200_tables.py > /tmp/tables.md
"""

from __future__ import annotations

import json
from pathlib import Path

RES = Path(__file__).resolve().parent.parent / "docs" / "results"
G = 1024**3


def gib(n) -> str:
    return "n/a" if n is None else f"{n / G:.3f}"


def suite_table(path: Path) -> str:
    s = json.loads(path.read_text())
    cases = s["cases"] if isinstance(s["cases"], list) else list(s["cases"].values())
    rows = ["| case | runner | stock predicted GiB | worst-case predicted GiB | workspace GiB | "
            "measured runtime (transient+workspace) GiB | predicted (transient+workspace) GiB | "
            "measured/predicted | KV tokens stock | KV tokens worst-case | worst shape | sweep s | status |",
            "|" + "---|" * 13]
    for c in cases:
        r = c["report"]
        if not r:
            rows.append(f"| {c['case']} | | | | | | | | | | | | {c['status']} |")
            continue
        wc, adm, v = r["worstcase"], r["admission"], r.get("validation") or {}
        ws = r["worstcase"]["worst_shape"]
        rows.append(
            f"| {c['case']} | {r['runner']['runner']} | {gib(r['stock']['peak_activation_bytes'])} | "
            f"{gib(wc['peak_activation_bytes'])} | {gib(wc['workspace_bytes'])} | "
            f"{gib(v.get('measured_peak_bytes'))} | {gib(v.get('predicted_peak_bytes'))} | "
            f"{v.get('ratio', float('nan')):.4f} | {adm['kv_tokens_stock']:,} | "
            f"{adm['kv_tokens_worstcase']:,} | {ws['kind']} R={ws['rows']} ctx={ws['context_len']} "
            f"n={ws['num_reqs']} | {wc['seconds']:.1f} | {c['status']} |")
    return "\n".join(rows)


def oom_table(folder: Path) -> str:
    rows = ["| run | PYTORCH_CUDA_ALLOC_CONF | slack MiB | engine boot s | served | outcome | "
            "runtime peak GiB | predicted GiB | measured/predicted | KV tokens |", "|" + "---|" * 10]
    for f in sorted(folder.glob("*.json")):
        if f.name.endswith(".report.json"):
            continue
        r = json.loads(f.read_text())
        if "slack_bytes" not in r:
            continue
        err = r.get("error")
        outcome = "completed" if err is None else err.split(". GPU 0")[0][:110]
        ratio = r.get("ratio_measured_over_predicted")
        rows.append(
            f"| {f.stem} | {r.get('alloc_conf', '') or '(default)'} | {r['slack_bytes'] >> 20} | "
            f"{r.get('boot_s') or 0:.1f} | {r['served']} | {outcome} | {gib(r.get('measured_peak_bytes'))} | "
            f"{gib(r.get('predicted_peak_bytes'))} | {'n/a' if ratio is None else f'{ratio:.4f}'} | "
            f"{r.get('kv_tokens') or 0:,} |")
    return "\n".join(rows)


if __name__ == "__main__":
    for title, p in [("run 2: all cases, before the KV-capacity bound", RES / "h200-run2" / "summary.json"),
                     ("run 3: dsv32_fp8 after the KV-capacity bound", RES / "h200-run3" / "summary.json")]:
        print(f"### Suite {title}\n\n{suite_table(p)}\n")
    for title, p in [("with expandable segments (the seed-002 host's setting)", RES / "h200-oom"),
                     ("first attempt, default allocator", RES / "h200-run1")]:
        print(f"### OOM reproduction and soak, {title}\n\n{oom_table(p)}\n")
    print(f"### Soak re-run with run 2's code (split prefills, before the capacity bound)\n\n"
          f"{oom_table(RES / 'h200-run2')}\n")
