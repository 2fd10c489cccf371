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


def ratio(x) -> str:
    return "n/a" if x is None else f"{x:.4f}"


def row(*cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


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
        rows.append(row(
            c["case"], r["runner"]["runner"], gib(r["stock"]["peak_activation_bytes"]),
            gib(wc["peak_activation_bytes"]), gib(wc["workspace_bytes"]),
            gib(v.get("measured_peak_bytes")), gib(v.get("predicted_peak_bytes")), ratio(v.get("ratio")),
            f"{adm['kv_tokens_stock']:,}", f"{adm['kv_tokens_worstcase']:,}",
            f"{ws['kind']} R={ws['rows']} ctx={ws['context_len']} n={ws['num_reqs']}",
            f"{wc['seconds']:.1f}", c["status"]))
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


def _latest(folders: list[Path]) -> tuple[dict, dict, dict]:
    """(suite case, soak run, folder name) per configuration; later folders replace earlier."""
    cases, soaks, where = {}, {}, {}
    for folder in folders:
        for c in json.loads((folder / "summary.json").read_text())["cases"]:
            cases[c["case"]] = c
            where[c["case"]] = folder.name
        oom = folder / "oom.json"
        for r in (json.loads(oom.read_text()) if oom.exists() else []):
            soaks[r["run"]] = r
            where[r["run"]] = folder.name
    return cases, soaks, where


def configuration_table(folders: list[Path]) -> str:
    """Issue 4's table: per configuration, stock vs worst-case prediction, what real traffic
    measured (the 200-request soak and the worst shape replayed from real requests), KV tokens."""
    cases, soaks, where = _latest(folders)
    rows = ["| configuration | runner | stock predicted GiB | worst-case predicted GiB | soak peak GiB "
            "(served) | worst shape replayed (real requests) | replay peak GiB | measured/predicted "
            "| predicted/replay | KV tokens stock | KV tokens worst-case | KV worst-case / ideal "
            "| sweep s | start | from |",
            "|" + "---|" * 15]
    for name, c in cases.items():
        r = c.get("report") or {}
        if not r:
            continue
        wc, adm = r["worstcase"], r["admission"]
        soak = soaks.get(f"{name}_worstcase") or {}
        rep = soak.get("replay") or {}
        shape = rep.get("worst_shape")
        shape_s = (f"{shape['kind']} n={rep['requests']} x {rep['new_tokens_each']} rows on "
                   f"{rep['prefix']:,} cached" if shape else "-")
        if rep.get("error"):
            shape_s += f" **{rep['error'].split('. GPU 0')[0][:70]}**"
        if name not in ("scratch",) and not soak:
            continue
        meas = soak.get("ratio_measured_over_predicted")
        p_over = soak.get("ratio_predicted_over_replay")
        served = f"{gib(soak.get('soak_peak_bytes'))} ({soak.get('served', '-')})" if soak else "-"
        kv_wc = soak.get("kv_tokens") or adm["kv_tokens_worstcase"]
        # ideal: the same budget with the measured worst step in place of the predicted one
        spare = (soak.get("predicted_peak_bytes", 0) - soak["replay_peak_bytes"]
                 if soak.get("replay_peak_bytes") else None)
        ideal = None if spare is None else kv_wc + max(0, spare) // adm["bytes_per_token"]
        start = "first start failed closed, restart ok" if c.get("first_start") else (
            (soak.get("cache") or wc.get("cache") or {}).get("status", "-"))
        rows.append(row(
            name, r["runner"]["runner"], gib(r["stock"]["peak_activation_bytes"]),
            gib(soak.get("predicted_peak_bytes", wc["peak_activation_bytes"])), served, shape_s,
            gib(soak.get("replay_peak_bytes")), ratio(meas), ratio(p_over),
            f"{adm['kv_tokens_stock']:,}", f"{kv_wc:,}", ratio(None if ideal is None else kv_wc / ideal),
            f"{wc['seconds']:.1f}", start, where.get(f"{name}_worstcase", where[name])))
    return "\n".join(rows)


def tp_table(folders: list[Path]) -> str:
    """Issue 7: the TP=2 cases per rank (each rank's own report, validated in its own worker)."""
    rows = ["| case | rank | stock predicted GiB | worst-case predicted GiB | workspace GiB | "
            "KV budget GiB | KV tokens worst-case | measured runtime GiB | predicted GiB | "
            "measured/predicted | steps | plan fingerprint | KV audit | from |", "|" + "---|" * 14]
    for folder in folders:
        for c in json.loads((folder / "summary.json").read_text())["cases"]:
            for r in (c.get("report") or {}).get("ranks") or []:
                wc, adm, v = r["worstcase"], r["admission"], r.get("validation") or {}
                fps = wc["plan_fingerprints"]
                rows.append(row(
                    c["case"], r["rank"], gib(r["stock"]["peak_activation_bytes"]),
                    gib(wc["peak_activation_bytes"]), gib(wc["workspace_bytes"]),
                    gib(adm["budget_bytes"]), f"{adm['kv_tokens_worstcase']:,}",
                    gib(v.get("measured_peak_bytes")), gib(v.get("predicted_peak_bytes")),
                    ratio(v.get("ratio")), len(wc["steps"]),
                    fps[r["rank"]] if r["rank"] < len(fps) else "-",
                    (r.get("kv_audit") or {}).get("verdict", "-"), folder.name))
    return "\n".join(rows)


def startup_table(folder: Path) -> str:
    """Engine start per mode. Newer runs (startup_bench --repeat) give medians, vLLM's own profile
    and warm-up (they run in every mode; timed in the profiled ones) and where the profiler's own seconds went
    (the report's startup_seconds); older ones one start per mode."""
    rows = ["| model | mode | starts | engine start s (median) | ratio to stock | extra s | "
            "profiler s | vLLM's own profile / warm-up s | sweep cache | where the profiler's seconds went "
            "(median) |", "|" + "---|" * 10]
    for f in sorted(folder.glob("startup-*.json")):
        for model, res in json.loads(f.read_text())["models"].items():
            if isinstance(res, list):  # one start per mode (runs before --repeat)
                stock = next(r["boot_s"] for r in res if r["mode"] == "stock")
                for r in res:
                    secs = r.get("replay_s") if r.get("cache") == "hit" else r.get("sweep_s")
                    rows.append(row(model, r["mode"], 1, f"{r['boot_s']:.2f}",
                                    f"{r['boot_s'] / stock:.2f}", f"{r['boot_s'] - stock:.2f}",
                                    "-" if secs is None else f"{secs:.2f} (sweep/replay only)", "-",
                                    r.get("cache") or "-", "-"))
                continue
            for mode, m in res["medians"].items():
                phases = dict(m["phases"])
                spent = ", ".join(f"{k} {v:.2f}" for k, v in m["phases"]
                                  if not k.startswith("vllm_") and v >= 0.005) or "-"
                boots = "/".join(f"{r['boot_s']:.2f}" for r in res["runs"] if r["mode"] == mode)
                own = (f"{phases['vllm_profile']:.2f} / {phases.get('vllm_warm_up', 0.0):.2f}"
                       if "vllm_profile" in phases else "not timed")
                rows.append(row(model, mode, m["n"], f"{m['boot_s']:.2f} ({boots})", f"{m['ratio']:.2f}",
                                f"{m['extra_s']:.2f}", f"{m['profiler_s']:.2f}", own,
                                m["cache"] or "-", spent))
    return "\n".join(rows)


def replay_table(folders: list[Path]) -> str:
    """Issue 5's tightness: each report's worst shape from real requests with exactly its rows
    (bench/oom_suite.sh <config>_replay); the step's transient against the prediction."""
    rows = ["| configuration | worst shape replayed (real requests) | predicted GiB | replay peak GiB | "
            "replay/predicted | predicted/replay | served | sweep cache | from |", "|" + "---|" * 9]
    for folder, r in [(f, r) for f in folders for r in json.loads((f / "oom.json").read_text())]:
        rep = r.get("replay") or {}
        if not r["run"].endswith("_replay") or not rep:
            continue
        pred, got = r.get("predicted_peak_bytes"), r.get("replay_peak_bytes")
        rows.append(row(
            r["run"][: -len("_replay")],
            f"{rep['kind']} n={rep['requests']} x {rep['new_tokens_each']} rows ({rep['rows']:,}) on "
            f"{rep['prefix']:,} cached", gib(pred), gib(got),
            ratio(got / pred if pred and got else None), ratio(pred / got if pred and got else None),
            f"{rep.get('served')}/{rep['requests']}", (r.get("cache") or {}).get("status", "-"),
            folder.name))
    return "\n".join(rows)


if __name__ == "__main__":
    print("### Per configuration: prediction vs real traffic (latest run of each)\n\n"
          f"{configuration_table([RES / 'h200-run4', RES / 'h200-run5'])}\n")
    print(f"### Exact-rows replay of the worst shape (runs 7 and 8)\n\n"
          f"{replay_table([RES / 'h200-run7', RES / 'h200-run8'])}\n")
    print(f"### Engine start-up at the final code, stock vs worst-case, side by side (run 10)\n\n"
          f"{startup_table(RES / 'h200-run10')}\n")
    print(f"### Run 9: start-up with the parts of measure_held timed, before the fix\n\n"
          f"{startup_table(RES / 'h200-run9')}\n")
    print(f"### Tensor parallel, TP=2 on two H200s, per rank (runs 9 and 10)\n\n"
          f"{tp_table([RES / 'h200-run9', RES / 'h200-run10-tp2'])}\n")
    print(f"### Suite run 10: all six cases at the final code\n\n"
          f"{suite_table(RES / 'h200-run10' / 'summary.json')}\n")
    print(f"### Engine start-up, stock vs worst-case, side by side (run 7)\n\n"
          f"{startup_table(RES / 'h200-run7')}\n")
    print(f"### Run 8: a heap freeze that never froze (reverted), on a host with cold kernel caches\n\n"
          f"{startup_table(RES / 'h200-run8')}\n")
    print(f"### Suite run 7: all six cases at the session-3 code\n\n"
          f"{suite_table(RES / 'h200-run7' / 'summary.json')}\n")
    print(f"### Engine start-up, stock vs worst-case, side by side (run 4)\n\n"
          f"{startup_table(RES / 'h200-run4')}\n")
    print(f"### Run 4: llama_graphs before the warm-up audit (the replay that found the bug)\n\n"
          f"{configuration_table([RES / 'h200-run4'])}\n")
    for title, p in [("run 4: all six cases (the suite; validation traffic)", RES / "h200-run4" / "summary.json"),
                     ("run 2: all cases, before the KV-capacity bound", RES / "h200-run2" / "summary.json"),
                     ("run 3: dsv32_fp8 after the KV-capacity bound", RES / "h200-run3" / "summary.json")]:
        print(f"### Suite {title}\n\n{suite_table(p)}\n")
    for title, p in [("with expandable segments (the seed-002 host's setting)", RES / "h200-oom"),
                     ("first attempt, default allocator", RES / "h200-run1")]:
        print(f"### OOM reproduction and soak, {title}\n\n{oom_table(p)}\n")
    print(f"### Soak re-run with run 2's code (split prefills, before the capacity bound)\n\n"
          f"{oom_table(RES / 'h200-run2')}\n")
