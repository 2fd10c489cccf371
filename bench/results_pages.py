#!/usr/bin/env python3
"""The pages of docs/results, rendered from each run folder's manifest.json and the JSON the tools
wrote beside it, so that no figure is typed in:

  <gpu>-vllm-<major.minor>.md   one page per configuration: its current figures only (a later
                                run replaces the cases it re-ran), then the exact commands
  history.md                    every run, oldest first: status of each case, note, findings,
                                commands and all its figures, superseded and invalid ones included

  python3 bench/results_pages.py            # write the pages
  python3 bench/results_pages.py --check    # exit 1, naming the pages that differ

The manifest format is in docs/results/README.md. A folder with a manifest for another GPU or
vLLM version (e.g. "vllm": "0.32.0") gets its own page without a change here.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from common import ROOT, gib, md_table, read_json

RES = ROOT / "docs" / "results"
KINDS = ("suite", "soak", "repro", "startup", "serve", "fit", "logs")
STATUSES = ("current", "superseded", "invalid")
REQUIRED = ("run", "sequence", "date", "gpu", "vllm", "host", "commit", "added_in", "note", "cases",
            "commands")
MOVED = ("Commands are as they were run. The host scripts they call (`device_run.sh`, "
         "`oom_suite.sh`, `install_entrypoint.py`) were in `bench/` until issue 17 and are in "
         "`staging/` now, with the same arguments ([staging/README.md](../../staging/README.md)).")


def ratio(x) -> str:
    return "n/a" if x is None else f"{x:.4f}"


# ---------------------------------------------------------------------------------------------
# run folders
# ---------------------------------------------------------------------------------------------

@dataclass
class Run:
    """A run folder and its manifest."""
    folder: Path
    m: dict

    @property
    def name(self) -> str:
        return self.folder.name

    @property
    def config(self) -> str:
        """The configuration whose page holds this run: GPU and vLLM major.minor."""
        return f"{self.m['gpu']}, vLLM {minor(self.m['vllm'])}"

    @property
    def page(self) -> str:
        return f"{self.m['gpu'].lower()}-vllm-{minor(self.m['vllm'])}.md"

    def cases(self, kind: str, status: str | None = None) -> list[str]:
        return [c for c, s in self.m["cases"].get(kind, {}).items() if status in (None, s["status"])]

    def has_current(self, kinds=KINDS) -> bool:
        return any(self.cases(k, "current") for k in kinds)

    @cached_property
    def suite(self) -> dict[str, dict]:
        s = read_json(self.folder / "summary.json", {"cases": []})
        return {c["case"]: c for c in s.get("cases", [])}  # bench/fit_run.py's has none

    @cached_property
    def fit(self) -> dict[str, dict]:
        """bench/fit_run.py's models (its summary.json, kind "fit_run"): model -> its row of the
        side-by-side comparison, with "checks" its checks. A model whose fit was taken from an
        earlier run (--fit-from) has no row here: that run holds it; its served start is a
        `serve` case (DIR/serve.json)."""
        s = read_json(self.folder / "summary.json", {})
        if s.get("kind") != "fit_run":
            return {}
        models = s["models"]
        return {row["model"]: {**row, "checks": models[row["model"]].get("checks") or {}}
                for row in s.get("comparison", [])
                if not ((models[row["model"]].get("steps") or {}).get("fit") or {}).get("fit_from")}

    @cached_property
    def soak(self) -> dict[str, dict]:
        return {r["run"]: r for r in read_json(self.folder / "oom.json", [])}

    @cached_property
    def repro(self) -> dict[str, dict]:
        """bench/oom_repro.py's results written one file per run (the first OOM suites)."""
        out = {}
        for f in sorted(self.folder.glob("*.json")):
            r = json.loads(f.read_text())
            if isinstance(r, dict) and "slack_bytes" in r:
                out[f.stem] = r
        return out

    @cached_property
    def startup(self) -> dict[str, dict | list]:
        """Model -> its startup_bench.py result; a run with CUDA graphs (--graphs in its
        command) is "MODEL (graphs)", one from another host's exported entries (--import-from)
        "MODEL (imported)", beside the same model's eager run."""
        out = {}
        for f in sorted(self.folder.glob("startup-*.json")):
            data = json.loads(f.read_text())
            argv = [a.split("=", 1)[0] for a in str(data.get("command", "")).split()]
            tag = "".join(t for flag, t in (("--graphs", " (graphs)"), ("--import-from", " (imported)"))
                          if flag in argv)
            out.update({f"{model}{tag}": res for model, res in data["models"].items()})
        return out

    @cached_property
    def serve(self) -> dict[str, dict]:
        """bench/serve_run.py's servers: "DIR/MODE" (DIR the subfolder holding its serve.json) ->
        that mode's entry, with "full_report" the report-MODE.json beside it (None without one);
        a mode skipped past its deadline holds no figure and is left out."""
        out = {}
        for f in sorted(self.folder.glob("*/serve.json")):
            for m in json.loads(f.read_text())["modes"]:
                if "skipped" not in m:
                    full = read_json(f.parent / f"report-{m['mode']}.json", None)
                    out[f"{f.parent.name}/{m['mode']}"] = {**m, "full_report": full}
        return out

    def found(self, kind: str) -> list[str]:
        """The cases of a kind that the folder's files hold."""
        if kind == "suite" and not self.suite:
            return _md_table_cases(self.folder / "suite-summary.md")
        if kind == "logs":
            return [c for c in self.cases("logs") if (self.folder / c).exists()]
        return list(getattr(self, kind))


def minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def _md_table_cases(path: Path) -> list[str]:
    """First column of a suite summary.md (a run whose summary.json did not come back)."""
    if not path.exists():
        return []
    rows = [ln.split("|")[1].strip() for ln in path.read_text().splitlines() if ln.startswith("| ")]
    return rows[1:]


def load_runs(res: Path = RES) -> list[Run]:
    runs = [Run(m.parent, json.loads(m.read_text())) for m in res.glob("*/manifest.json")]
    return sorted(runs, key=lambda r: r.m.get("sequence", 0))


def configurations(runs: list[Run]) -> dict[str, list[Run]]:
    out: dict[str, list[Run]] = {}
    for r in runs:
        out.setdefault(r.config, []).append(r)
    return out


def current_folders(runs: list[Run], kinds=("suite", "soak", "fit")) -> list[Path]:
    """The folders holding current cases of these kinds, oldest first: what tests/gpu reads
    (--results, a later folder replacing the cases it re-ran)."""
    return [r.folder for r in runs if r.has_current(kinds)]


def not_run(runs: list[Run]) -> list[dict]:
    """What the runs holding current cases say was not run, and why."""
    return [n for r in runs if r.has_current() for n in r.m.get("not_run", [])]


def _on_current_cases(runs: list[Run], key: str) -> list[dict]:
    """The manifests' `key` entries that name a current suite case of their run."""
    return [e for r in runs for e in r.m.get(key, [])
            if e.get("case") in r.cases("suite", "current")]


def exceeded(runs: list[Run]) -> list[dict]:
    """Current cases whose real requests measured above the prediction, each with the exact
    excess in bytes and why it is recorded rather than fixed (tests/gpu allows that excess, to
    the byte, and nothing else)."""
    return _on_current_cases(runs, "exceeded")


def failed(runs: list[Run]) -> list[dict]:
    """Current cases that fail one of the suite's checks, recorded with why (a product that
    refused to start where it should have started, say): tests/gpu marks that case's tests as
    expected to fail (xfail, not strict: its checks that pass still pass); the pages list them."""
    return _on_current_cases(runs, "failed")


# ---------------------------------------------------------------------------------------------
# manifest checks
# ---------------------------------------------------------------------------------------------

def problems(runs: list[Run]) -> list[str]:
    """What is wrong with the manifests: missing fields, unknown statuses, a case without a
    status or a status without a case, a superseded case whose successor is not later."""
    seq = {r.name: r.m.get("sequence") for r in runs}
    out = [f"sequence {s} used twice" for s in set(seq.values()) if list(seq.values()).count(s) > 1]
    for r in runs:
        out += _run_problems(r) + [p for kind in KINDS for p in _kind_problems(r, kind, seq)]
    return out


def _run_problems(r: Run) -> list[str]:
    out = [f"{r.name}: no {k}" for k in REQUIRED if k not in r.m]
    if r.m.get("run") != r.name:
        out.append(f"{r.name}: run is {r.m.get('run')!r}")
    out += [f"{r.name}: unknown kind {k}" for k in r.m.get("cases", {}) if k not in KINDS]
    out += [f"{r.name}: exceeded entry without case, bytes or why: {e}"
            for e in r.m.get("exceeded", [])
            if not ("case" in e and "why" in e and isinstance(e.get("bytes"), int) and e["bytes"] > 0)]
    out += [f"{r.name}: exceeded names {e['case']}, not a suite case of this run"
            for e in r.m.get("exceeded", []) if "case" in e and e["case"] not in r.cases("suite")]
    out += [f"{r.name}: failed entry without case or why, or naming no suite case: {e}"
            for e in r.m.get("failed", [])
            if not ("case" in e and "why" in e and e["case"] in r.cases("suite"))]
    return out + [f"{r.name}: not_run entry without why or case/what: {n}"
                  for n in r.m.get("not_run", []) if not _names_a_gap(n)]


def _names_a_gap(n: dict) -> bool:
    return "why" in n and ("case" in n or "what" in n)


def _kind_problems(r: Run, kind: str, seq: dict) -> list[str]:
    listed, found = set(r.cases(kind)), set(r.found(kind))
    out = [f"{r.name}: {kind} {c} has no status in the manifest" for c in sorted(found - listed)]
    out += [f"{r.name}: {kind} {c} is not in the folder" for c in sorted(listed - found)]
    for case, s in r.m["cases"].get(kind, {}).items():
        where = f"{r.name}: {kind} {case}"
        if s.get("status") not in STATUSES:
            out.append(f"{where}: status {s.get('status')!r}")
        if s.get("status") == "superseded" and not seq.get(s.get("by"), -1) > r.m["sequence"]:
            out.append(f"{where}: superseded by {s.get('by')!r}, not a later run")
        if s.get("status") == "invalid" and not s.get("why"):
            out.append(f"{where}: invalid without why")
    return out


# ---------------------------------------------------------------------------------------------
# tables: each takes (run, item) pairs; source=True adds the run folder as a last column
# ---------------------------------------------------------------------------------------------

def _table(headers: list[str], rows: list[tuple[Run, list]], source: bool) -> str:
    if source:
        return md_table(headers + ["from"], [cells + [run.name] for run, cells in rows])
    return md_table(headers, [cells for _, cells in rows])


SUITE_HEADERS = ["case", "runner", "stock predicted GiB", "worst-case predicted GiB", "workspace GiB",
                 "measured runtime (transient+workspace) GiB", "predicted (transient+workspace) GiB",
                 "measured/predicted", "KV tokens stock", "KV tokens worst-case", "worst shape",
                 "sweep s", "status"]


def _suite_cells(c: dict) -> list:
    r = c.get("report")
    if not r:
        return [c["case"]] + [""] * 11 + [c["status"]]
    wc, adm, v = r["worstcase"], r["admission"], r.get("validation") or {}
    ws = wc["worst_shape"]
    return [c["case"], r["runner"]["runner"], gib(r["stock"]["peak_activation_bytes"]),
            gib(wc["peak_activation_bytes"]), gib(wc["workspace_bytes"]),
            gib(v.get("measured_peak_bytes")), gib(v.get("predicted_peak_bytes")), ratio(v.get("ratio")),
            f"{adm['kv_tokens_stock']:,}", f"{adm['kv_tokens_worstcase']:,}",
            f"{ws['kind']} R={ws['rows']} ctx={ws['context_len']} n={ws['num_reqs']}",
            f"{wc['seconds']:.1f}", c["status"]]


def suite_table(items: list[tuple[Run, dict]], source: bool = False) -> str:
    """bench/gpu_suite.py: `wcprof --validate` per case (validation traffic)."""
    return _table(SUITE_HEADERS, [(run, _suite_cells(c)) for run, c in items], source)


REPRO_HEADERS = ["run", "PYTORCH_CUDA_ALLOC_CONF", "slack MiB", "engine boot s", "served", "outcome",
                 "runtime peak GiB", "predicted GiB", "measured/predicted", "KV tokens"]


def _repro_cells(name: str, r: dict) -> list:
    err = r.get("error")
    return [name, r.get("alloc_conf", "") or "(default)", r["slack_bytes"] >> 20, f"{r.get('boot_s') or 0:.1f}",
            r["served"], "completed" if err is None else err.split(". GPU 0")[0][:110],
            gib(r.get("measured_peak_bytes")), gib(r.get("predicted_peak_bytes")),
            ratio(r.get("ratio_measured_over_predicted")), f"{r.get('kv_tokens') or 0:,}"]


def repro_table(items: list[tuple[Run, str, dict]], source: bool = False) -> str:
    """bench/oom_repro.py on a card held to its budget: served requests, or the error."""
    return _table(REPRO_HEADERS, [(run, _repro_cells(name, r)) for run, name, r in items], source)


CONFIG_HEADERS = ["configuration", "runner", "stock predicted GiB", "worst-case predicted GiB",
                  "soak peak GiB (served)", "worst shape replayed (real requests)", "replay peak GiB",
                  "measured/predicted", "predicted/replay", "KV tokens stock", "KV tokens worst-case",
                  "KV worst-case / ideal", "sweep s", "start"]


def _replayed_shape(rep: dict) -> str:
    shape = rep.get("worst_shape")
    out = (f"{shape['kind']} n={rep['requests']} x {rep['new_tokens_each']} rows on {rep['prefix']:,} cached"
           if shape else "-")
    if rep.get("error"):
        out += f" **{rep['error'].split('. GPU 0')[0][:70]}**"
    return out


def _ideal_ratio(soak: dict, kv_wc: int, bytes_per_token: int | None) -> str:
    """The worst-case KV tokens against the same budget with the measured worst step in place of
    the predicted one."""
    if not soak.get("replay_peak_bytes") or not bytes_per_token:
        return ratio(None)
    spare = soak.get("predicted_peak_bytes", 0) - soak["replay_peak_bytes"]
    return ratio(kv_wc / (kv_wc + max(0, spare) // bytes_per_token))


def _start(soak: dict, c: dict, wc: dict) -> str:
    if c.get("first_start"):
        return "first start failed closed, restart ok"
    return (soak.get("cache") or wc.get("cache") or {}).get("status", "-")


def _config_cells(name: str, soak: dict, c: dict) -> list:
    """A soak (<config>_worstcase) beside the suite case of the same run ({} when none)."""
    r = c.get("report") or {}
    wc, adm = r.get("worstcase", {}), r.get("admission", {})
    stock = r["stock"]["peak_activation_bytes"] if r else soak.get("stock_peak_bytes")
    kv_wc = soak.get("kv_tokens") or adm.get("kv_tokens_worstcase")
    return [name, r.get("runner", {}).get("runner", "-"), gib(stock),
            gib(soak.get("predicted_peak_bytes", wc.get("peak_activation_bytes"))),
            f"{gib(soak.get('soak_peak_bytes'))} ({soak.get('served', '-')})",
            _replayed_shape(soak.get("replay") or {}), gib(soak.get("replay_peak_bytes")),
            ratio(soak.get("ratio_measured_over_predicted")), ratio(soak.get("ratio_predicted_over_replay")),
            f"{adm['kv_tokens_stock']:,}" if adm else "-", f"{kv_wc:,}",
            _ideal_ratio(soak, kv_wc, adm.get("bytes_per_token")),
            f"{wc.get('seconds', soak.get('sweep_s', 0.0)):.1f}", _start(soak, c, wc)]


def configuration_table(items: list[tuple[Run, str, dict]], source: bool = False) -> str:
    """Issue 4: per configuration, stock vs worst-case prediction, what real traffic measured (the
    200-request soak and the worst shape replayed from real requests), KV tokens."""
    rows = []
    for run, name, soak in items:
        config = name[: -len("_worstcase")]
        rows.append((run, _config_cells(config, soak, run.suite.get(config, {}))))
    return _table(CONFIG_HEADERS, rows, source)


REPLAY_HEADERS = ["configuration", "worst shape replayed (real requests)", "predicted GiB", "replay peak GiB",
                  "replay/predicted", "predicted/replay", "served", "sweep cache"]


def _replay_cells(name: str, r: dict) -> list:
    rep = r.get("replay") or {}
    pred, got = r.get("predicted_peak_bytes"), r.get("replay_peak_bytes")
    both = bool(pred and got)
    return [name[: -len("_replay")],
            f"{rep['kind']} n={rep['requests']} x {rep['new_tokens_each']} rows ({rep['rows']:,}) on "
            f"{rep['prefix']:,} cached", gib(pred), gib(got),
            ratio(got / pred if both else None), ratio(pred / got if both else None),
            f"{rep.get('served')}/{rep['requests']}", (r.get("cache") or {}).get("status", "-")]


def replay_table(items: list[tuple[Run, str, dict]], source: bool = False) -> str:
    """Issue 5's tightness: each report's worst shape from real requests with exactly its rows
    (staging/oom_suite.sh <config>_replay); the step's transient against the prediction."""
    rows = [(run, _replay_cells(name, r)) for run, name, r in items if r.get("replay")]
    return _table(REPLAY_HEADERS, rows, source)


TP_HEADERS = ["case", "rank", "stock predicted GiB", "worst-case predicted GiB", "workspace GiB",
              "KV budget GiB", "KV tokens worst-case", "measured runtime GiB", "predicted GiB",
              "measured/predicted", "steps", "plan fingerprint", "KV audit"]


def _rank_cells(case: str, r: dict) -> list:
    wc, adm, v = r["worstcase"], r["admission"], r.get("validation") or {}
    fps = wc["plan_fingerprints"]
    return [case, r["rank"], gib(r["stock"]["peak_activation_bytes"]), gib(wc["peak_activation_bytes"]),
            gib(wc["workspace_bytes"]), gib(adm["budget_bytes"]), f"{adm['kv_tokens_worstcase']:,}",
            gib(v.get("measured_peak_bytes")), gib(v.get("predicted_peak_bytes")), ratio(v.get("ratio")),
            len(wc["steps"]), fps[r["rank"]] if r["rank"] < len(fps) else "-",
            (r.get("kv_audit") or {}).get("verdict", "-")]


def tp_table(items: list[tuple[Run, dict]], source: bool = False) -> str:
    """Issue 7: the TP cases per rank (each rank's own report, validated in its own worker)."""
    rows = [(run, _rank_cells(c["case"], r)) for run, c in items for r in (c.get("report") or {}).get("ranks") or []]
    return _table(TP_HEADERS, rows, source)


STARTUP_HEADERS = ["model", "mode", "starts", "engine start s (median)", "ratio to stock", "extra s",
                   "profiler s", "vLLM's own profile / warm-up s", "sweep cache",
                   "where the profiler's seconds went (median)"]


def _single_start_rows(model: str, res: list[dict]) -> list[list]:
    """One start per mode (bench/startup_bench.py before --repeat)."""
    stock = next(r["boot_s"] for r in res if r["mode"] == "stock")
    rows = []
    for r in res:
        secs = r.get("replay_s") if r.get("cache") == "hit" else r.get("sweep_s")
        rows.append([model, r["mode"], 1, f"{r['boot_s']:.2f}", f"{r['boot_s'] / stock:.2f}",
                     f"{r['boot_s'] - stock:.2f}", "-" if secs is None else f"{secs:.2f} (sweep/replay only)",
                     "-", r.get("cache") or "-", "-"])
    return rows


def _median_rows(model: str, res: dict) -> list[list]:
    """Medians per mode, vLLM's own profile and warm-up (timed in the profiled modes) and where
    the profiler's own seconds went (the report's startup_seconds)."""
    rows = []
    for mode, m in res["medians"].items():
        phases = dict(m["phases"])
        spent = ", ".join(f"{k} {v:.2f}" for k, v in m["phases"] if not k.startswith("vllm_") and v >= 0.005) or "-"
        boots = "/".join(f"{r['boot_s']:.2f}" if "boot_s" in r else
                         "not run" if "not_run" in r else "failed"
                         for r in res["runs"] if r["mode"] == mode)
        own = (f"{phases['vllm_profile']:.2f} / {phases.get('vllm_warm_up', 0.0):.2f}"
               if "vllm_profile" in phases else "not timed")
        rows.append([model, mode, m["n"], f"{m['boot_s']:.2f} ({boots})", f"{m['ratio']:.2f}",
                     f"{m['extra_s']:.2f}", f"{m['profiler_s']:.2f}", own, m["cache"] or "-", spent])
    return rows


def startup_table(items: list[tuple[Run, str, dict | list]], source: bool = False) -> str:
    """bench/startup_bench.py: engine start per mode, stock vs worst-case, side by side."""
    rows = [(run, cells) for run, model, res in items
            for cells in (_single_start_rows(model, res) if isinstance(res, list) else _median_rows(model, res))]
    return _table(STARTUP_HEADERS, rows, source)


SERVE_HEADERS = ["server", "model", "graphs", "card", "healthy after s",
                 "worst step at start: measured / predicted GiB", "measured/predicted",
                 "KV GiB worst-case / stock", "traffic", "guard: steps (above prediction)", "shutdown"]


def _traffic_cell(t: dict | None) -> str:
    if not t:
        return "none sent"
    parts = [f"{k} {'ok' if t[k]['ok'] else 'failed'}" for k in ("long", "cached") if k in t]
    parts += [f"{k} {t[k]['ok']}/{t[k]['n']}" for k in ("decodes", "mixed") if k in t]
    if "worst" in t:  # --worst N: the worst step's requests on the cached prefix
        parts.append(f"worst step {t['worst']['ok']}/{t['worst']['n']} on "
                     f"{t['worst']['context']:,} cached")
    return ", ".join(parts)


def _serve_cells(name: str, m: dict) -> list:
    vals = (m.get("report") or {}).get("validations") or []
    v = vals[0] if vals else {}
    adm = (m.get("full_report") or {}).get("admission") or {}
    hold = m.get("hold")
    card = f"held: requested + {hold['slack_bytes'] // 2**20} MiB" if hold else "free"
    g = m.get("guard_metrics") or {}
    guard = (f"{int(g['wcprof_guard_steps_total'])} ({int(g['wcprof_guard_steps_above_prediction_total'])})"
             if g else "-")
    down = m.get("shutdown") or {}
    return [name, Path(m["model"]).name, "on" if m.get("graphs") else "off", card,
            "never" if m.get("healthy_s") is None else f"{m['healthy_s']:.1f}",
            f"{gib(v.get('measured_peak_bytes'))} / {gib(v.get('predicted_peak_bytes'))}" if v else "not reached",
            ratio(v.get("ratio")),
            f"{gib(adm.get('kv_cache_bytes'))} / {gib(adm.get('stock_kv_cache_bytes'))}" if adm else "-",
            _traffic_cell(m.get("traffic")), guard,
            f"rc {down.get('rc')}{', forced' if down.get('forced') else ''}"]


def serve_table(items: list[tuple[Run, str, dict]], source: bool = False) -> str:
    """bench/serve_run.py: `vllm serve` with vLLM's default multiprocessing, HTTP traffic over
    127.0.0.1; the worst step the report names built from real requests before it took traffic."""
    return _table(SERVE_HEADERS, [(run, _serve_cells(name, m)) for run, name, m in items], source)


FIT_HEADERS = ["model", "util", "N", "vLLM auto-fit max_model_len (concurrency)",
               "wcprof fit max_model_len / chunk / max_num_seqs", "fit KV GiB (tokens)",
               "fitted start admitted", "its worst step measured/predicted", "checks"]


def _fit_cells(name: str, row: dict) -> list:
    checks = row.get("checks") or {}
    failed = [k for k, c in checks.items() if not c.get("ok")]
    ratio = row.get("fitted_worst_step_ratio")
    return [name, row.get("util"), row.get("n"),
            f"{row.get('vllm_auto_max_model_len'):,} ({row.get('vllm_auto_concurrency')}x)"
            if row.get("vllm_auto_max_model_len") else "not run",
            f"{row['fit_max_model_len']:,} / {row['fit_chunk']:,} / {row['fit_max_num_seqs']}"
            if row.get("fit_max_model_len") else "none",
            f"{gib(row.get('fit_kv_cache_bytes'))} ({row.get('fit_kv_tokens') or 0:,})",
            "yes" if row.get("fitted_admitted") else "no",
            f"{ratio:.4f}" if ratio is not None else "-",
            "all ok" if checks and not failed else ", ".join(failed) or "-"]


def fit_table(items: list[tuple[Run, str, dict]], source: bool = False) -> str:
    """bench/fit_run.py: `wcprof fit`, an engine started with its recommended flags (its worst
    step built from real requests), and vLLM's own --max-model-len auto, per model."""
    return _table(FIT_HEADERS, [(run, _fit_cells(name, row)) for run, name, row in items], source)


def logs_list(items: list[tuple[Run, str]]) -> str:
    return "\n".join(f"- [{run.name}/{name}]({run.name}/{name}): "
                     f"{run.m['cases']['logs'][name].get('why', '')}".rstrip(": ") for run, name in items)


# ---------------------------------------------------------------------------------------------
# the sections: which cases of which runs go to which table
# ---------------------------------------------------------------------------------------------

def _pick(runs: list[Run], kind: str, status: str | None) -> list[tuple[Run, str]]:
    return [(r, c) for r in runs for c in r.cases(kind, status)]


def _soaks(runs: list[Run], status: str | None, ends: tuple[str, ...], keep: bool) -> list[tuple[Run, str, dict]]:
    """The soak runs (oom.json) whose name ends with one of ends (keep) or with none (not keep)."""
    return [(r, c, r.soak[c]) for r, c in _pick(runs, "soak", status) if c.endswith(ends) == keep]


def _suite(runs: list[Run], status: str | None) -> list[tuple[Run, dict]]:
    return [(r, r.suite[c]) for r, c in _pick(runs, "suite", status) if c in r.suite]


def _has_ranks(c: dict) -> bool:
    return bool((c.get("report") or {}).get("ranks"))


SECTIONS = [
    ("Per configuration: prediction vs real traffic (soak, then the worst shape from real requests)",
     lambda runs, st, src: configuration_table(_soaks(runs, st, ("_worstcase",), True), src)),
    ("Exact-rows replay of the worst shape",
     lambda runs, st, src: replay_table(_soaks(runs, st, ("_replay",), True), src)),
    ("Stock vs worst-case on a card held to its budget (OOM reproduction)",
     lambda runs, st, src: repro_table([(r, c, r.repro[c]) for r, c in _pick(runs, "repro", st)]
                                       + _soaks(runs, st, ("_worstcase", "_replay"), False), src)),
    ("The GPU suite: `wcprof --validate` per case", lambda runs, st, src: suite_table(_suite(runs, st), src)),
    ("Tensor parallel, per rank",
     lambda runs, st, src: tp_table([(r, c) for r, c in _suite(runs, st) if _has_ranks(c)], src)),
    ("Engine start-up, stock vs worst-case, side by side",
     lambda runs, st, src: startup_table([(r, c, r.startup[c]) for r, c in _pick(runs, "startup", st)], src)),
    ("`vllm serve` under HTTP traffic (vLLM's default multiprocessing)",
     lambda runs, st, src: serve_table([(r, c, r.serve[c]) for r, c in _pick(runs, "serve", st)], src)),
    ("What fits: `wcprof fit` against vLLM's auto-fit, the fitted start validated",
     lambda runs, st, src: fit_table([(r, c, r.fit[c]) for r, c in _pick(runs, "fit", st)], src)),
    ("Logs (not tabulated)", lambda runs, st, src: logs_list(_pick(runs, "logs", st))),
]


def sections(runs: list[Run], status: str | None, source: bool) -> list[tuple[str, str]]:
    """(heading, table) for every kind of result the runs hold with this status (None: all);
    a table without rows is left out."""
    out = [(heading, render(runs, status, source)) for heading, render in SECTIONS]
    return [(h, t) for h, t in out if t.count("\n") > 1 or (t and not t.startswith("|"))]


# ---------------------------------------------------------------------------------------------
# pages
# ---------------------------------------------------------------------------------------------

def _not_run_line(n: dict) -> str:
    return f"- **{n.get('what') or n['case']}**: {n['why'].rstrip('.')}."


def _exceeded_line(e: dict) -> str:
    return f"- **{e['case']}**: measured {e['bytes']:,} B above the prediction. {e['why'].rstrip('.')}."


def _pytest_command(folders: list[Path]) -> list[str]:
    args = [f"--results {f.relative_to(ROOT) if f.is_relative_to(ROOT) else f}" for f in folders]
    lines = ["    .venv/bin/python -m pytest -q tests/gpu \\"]
    lines += [f"        {' '.join(args[i:i + 2])} \\" for i in range(0, len(args), 2)]
    lines[-1] = lines[-1][:-2]
    return lines


def _commands_block(run: Run) -> list[str]:
    lines = [f"### {run.name}", ""]
    if run.m["commands"]:
        lines += ["    " + c for c in run.m["commands"]] + [""]
    if run.m.get("commands_from"):
        lines += [f"(From {run.m['commands_from']}.)", ""]
    return lines


def _intro(config: str, cur: list[Run]) -> list[str]:
    # the machine kinds; each run's full host line (stack, staging, caches) is in the runs table
    machines = sorted({r.m.get("machine") or r.m["host"] for r in cur})
    return [f"# {config}: current results", "",
            f"Stock vLLM against `--profiler worstcase` on {', '.join(machines)} (each run's host, "
            "stack and code: [Runs, hosts and code](#runs-hosts-and-code)). Only the current figure of "
            f"each case: from {', '.join(f'`{r.name}/`' for r in cur)}, a later run replacing the cases it "
            "re-ran. Every run, superseded and invalid ones included, is in [history.md](history.md). "
            "Rendered by `python3 bench/results_pages.py` from each folder's `manifest.json` and the JSON "
            "beside it; nothing is typed in. The engines and cases: [bench/README.md](../../bench/README.md).",
            ""]


def _bullets(heading: str, lines: list[str]) -> list[str]:
    return [f"## {heading}", "", *lines, ""] if lines else []


def _runs_table(cur: list[Run]) -> list[str]:
    rows = [[f"`{r.name}/`", r.m["host"], f"{r.m['commit']} ({r.m.get('commit_from', '')})",
             ", ".join(c for k in KINDS for c in r.cases(k, "current")), r.m["note"]] for r in cur]
    return ["## Runs, hosts and code", "", md_table(["run", "host", "commit", "current cases", "note"], rows), ""]


def _commands(cur: list[Run], folders: list[Path]) -> list[str]:
    lines = ["## The exact commands", "", MOVED, ""] + [ln for r in cur for ln in _commands_block(r)]
    if folders:
        lines += ["### here: tests/gpu on the committed results", "", *_pytest_command(folders), "",
                  "(`tests/unit/test_committed_results.py` runs it, with the folders and the allowed skips "
                  "read from the manifests.)", ""]
    return lines


def current_page(config: str, runs: list[Run]) -> str:
    """The configuration's current figures first, then what they say, what was not run, the runs
    they come from and, last, the exact commands."""
    cur = [r for r in runs if r.has_current()]
    lines = _intro(config, cur)
    for heading, table in sections(cur, "current", source=True):
        lines += [f"## {heading}", "", table, ""]
    lines += _bullets("What the figures say", [f"- {b}" for r in cur for b in r.m.get("summary", [])])
    lines += _bullets("Measured above the prediction", [_exceeded_line(e) for e in exceeded(cur)])
    lines += _bullets("Failing cases", [_not_run_line(e) for e in failed(cur)])
    lines += _bullets("What was not run", [_not_run_line(n) for n in not_run(cur)])
    lines += _runs_table(cur) + _commands(cur, current_folders(runs))
    return "\n".join(lines).rstrip() + "\n"


def _case_rows(run: Run) -> list[list[str]]:
    rows = []
    for kind in KINDS:
        for case, s in run.m["cases"].get(kind, {}).items():
            detail = ": ".join(filter(None, [f"by `{s['by']}/`" if s.get("by") else "", s.get("why", "")]))
            rows.append([kind, case, s["status"], detail or "-"])
    return rows


def _count(run: Run, status: str) -> int:
    return sum(len(run.cases(k, status)) for k in KINDS)


def _history_run(run: Run) -> list[str]:
    counts = ", ".join(f"{_count(run, st)} {st}" for st in STATUSES)
    lines = [f"## {run.name}", "", run.m["note"], "",
             f"{run.m['host']}; {run.m['date']}; code {run.m['commit']} ({run.m.get('commit_from', '')}); "
             f"folder added in {run.m['added_in']}. Cases: {counts}; current figures are on "
             f"[{run.config}]({run.page}).", "",
             md_table(["kind", "case", "status", "why"], _case_rows(run)), ""]
    if run.cases("suite") and not run.suite:
        lines += [f"Its suite wrote only [summary.md]({run.name}/suite-summary.md).", ""]
    notes = [f"- {b}" for b in run.m.get("findings", []) + run.m.get("summary", [])]
    notes += ["- Above the prediction: " + _exceeded_line(e)[2:] for e in run.m.get("exceeded", [])]
    notes += ["- Failing: " + _not_run_line(e)[2:] for e in run.m.get("failed", [])]
    notes += ["- Not run: " + _not_run_line(n)[2:] for n in run.m.get("not_run", [])]
    lines += notes + [""] * bool(notes)
    for heading, table in sections([run], None, source=False):
        lines += [f"### {heading}", "", table, ""]
    return lines + ["### Commands", ""] + _commands_block(run)[2:]


def history_page(runs: list[Run]) -> str:
    pages = {r.config: r.page for r in runs}
    lines = ["# Every GPU run of the investigation", "",
             "Oldest first, superseded and invalid runs included: what each ran, the status of each of its "
             "cases (current, superseded by a later run, invalid and why), what it showed, and all its "
             "figures, rendered by `python3 bench/results_pages.py` from the folders' `manifest.json` and "
             "JSON. The current figures: " + ", ".join(f"[{c}]({p})" for c, p in pages.items()) + ". "
             + MOVED, "",
             md_table(["run", "configuration", "host", "code", "current", "superseded", "invalid", "note"],
                      [[f"[{r.name}](#{r.name})", r.config, r.m.get("machine", r.m["host"]), r.m["commit"],
                        *(_count(r, st) for st in STATUSES), r.m["note"]]
                       for r in runs]), ""]
    for r in runs:
        lines += _history_run(r)
    return "\n".join(lines).rstrip() + "\n"


def render_all(res: Path = RES) -> dict[str, str]:
    """Page name (in res) -> its text."""
    runs = load_runs(res)
    pages = {runs_[0].page: current_page(config, runs_) for config, runs_ in configurations(runs).items()}
    if runs:
        pages["history.md"] = history_page(runs)
    return pages


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="compare, write nothing")
    p.add_argument("--results", type=Path, default=RES)
    a = p.parse_args(argv)
    bad = problems(load_runs(a.results))
    if bad:
        print("manifest problems:\n  " + "\n  ".join(bad), file=sys.stderr)
        return 2
    stale = []
    for name, text in render_all(a.results).items():
        path = a.results / name
        if a.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    if stale:
        print(f"out of date: {' '.join(stale)} (python3 bench/results_pages.py)", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
