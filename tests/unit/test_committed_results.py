"""The committed results are what the docs show and what tests/gpu accepts: every page of
docs/results is rendered from the run folders' manifest.json and raw JSON (bench/results_pages.py),
the manifests give every case a status, and tests/gpu passes on the folders they call current."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "tests" / "gpu")]

import cpu_bench  # noqa: E402
import results_pages  # noqa: E402
from gpu_results import load_summary  # noqa: E402

RUNS = results_pages.load_runs()
CONFIGS = results_pages.configurations(RUNS)


def test_every_manifest_gives_every_case_a_status():
    assert RUNS, "no docs/results/*/manifest.json"
    assert results_pages.problems(RUNS) == []


def test_result_pages_are_rendered_from_the_manifests_and_the_committed_json():
    pages = results_pages.render_all()
    assert {"history.md", "h200-vllm-0.26.md"} <= set(pages)
    for name, text in pages.items():
        assert (RESULTS / name).read_text() == text, f"{name} is stale: python3 bench/results_pages.py"


def test_a_page_starts_with_results_and_ends_with_the_commands():
    page = (RESULTS / "h200-vllm-0.26.md").read_text()
    first_section = page.split("\n## ", 2)[1]
    assert first_section.startswith("Per configuration") and "| llama_v2 |" in first_section
    assert page.index("## The exact commands") > page.index("## What the figures say")


def test_a_new_configuration_gets_its_own_page_without_code_changes(tmp_path):
    """A folder whose manifest names another vLLM version: a page of its own, the other pages and
    the history untouched apart from the new run."""
    for run in ("h200-run15", "h200-run10-tp2"):
        shutil.copytree(RESULTS / run, tmp_path / run)
    new = tmp_path / "h200-vllm032-run1"
    new.mkdir()
    summary = json.loads((RESULTS / "h200-run15" / "summary.json").read_text())
    summary["cases"] = [c for c in summary["cases"] if c["case"] == "llama_v2"]
    (new / "summary.json").write_text(json.dumps(summary))
    (new / "manifest.json").write_text(json.dumps({
        "run": new.name, "sequence": 100, "date": "2026-12-01", "gpu": "H200", "vllm": "0.32.0",
        "host": "H200 (nvidia-h200), vLLM 0.32.0, torch 2.11.0+cu130", "commit": "abc1234",
        "added_in": "abc1234", "note": "first 0.32 run", "cases": {"suite": {"llama_v2": {"status": "current"}}},
        "not_run": [{"case": "dsv32_fp8", "why": "DeepGEMM's binding needs torch 2.13"}],
        "commands": ["STAGE=.stage32 SITE=/tmp/site32 bash staging/device_run.sh llama_v2"]}))
    runs = results_pages.load_runs(tmp_path)
    assert results_pages.problems(runs) == []
    pages = results_pages.render_all(tmp_path)
    assert set(pages) == {"h200-vllm-0.26.md", "h200-vllm-0.32.md", "history.md"}
    page = pages["h200-vllm-0.32.md"]
    assert page.startswith("# H200, vLLM 0.32: current results")
    assert "| llama_v2 | v2 |" in page and "h200-vllm032-run1" in page and "h200-run15" not in page
    assert "DeepGEMM's binding needs torch 2.13" in page and "bash staging/device_run.sh llama_v2" in page
    assert "[H200, vLLM 0.32](h200-vllm-0.32.md)" in pages["history.md"]
    assert results_pages.main(["--results", str(tmp_path), "--check"]) == 1   # not written yet
    assert results_pages.main(["--results", str(tmp_path)]) == 0
    assert results_pages.main(["--results", str(tmp_path), "--check"]) == 0


def test_a_manifest_that_misses_a_case_or_names_an_earlier_successor_is_reported(tmp_path):
    shutil.copytree(RESULTS / "h200-run5", tmp_path / "h200-run5")
    m = json.loads((tmp_path / "h200-run5" / "manifest.json").read_text())
    del m["cases"]["suite"]["llama_v2"]
    m["cases"]["suite"]["llama_graphs"] = {"status": "superseded", "by": "h200-run1"}
    (tmp_path / "h200-run5" / "manifest.json").write_text(json.dumps(m))
    found = results_pages.problems(results_pages.load_runs(tmp_path))
    assert any("suite llama_v2 has no status" in p for p in found)
    assert any("llama_graphs: superseded by 'h200-run1', not a later run" in p for p in found)


def _current(runs, kinds=("suite", "soak")) -> dict[tuple[str, str], str]:
    return {(k, c): r.name for r in runs for k in kinds for c in r.cases(k, "current")}


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_later_folders_replace_exactly_the_cases_the_manifests_call_superseded(config):
    """tests/gpu merges --results folders in order, a later one replacing the cases it re-ran:
    over the current folders that merge keeps exactly the manifests' current cases."""
    kept: dict[tuple[str, str], str] = {}
    for folder in results_pages.current_folders(CONFIGS[config]):
        s = load_summary(folder)
        kept.update({("suite", c): folder.name for c in s["by_case"]})
        kept.update({("soak", c): folder.name for c in s["soak"]})
    assert kept == _current(CONFIGS[config])


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_gpu_tests_pass_on_the_committed_results(config):
    runs = CONFIGS[config]
    folders = results_pages.current_folders(runs)
    gaps = [n["case"] for n in results_pages.not_run(runs)
            if "case" in n and n["case"].endswith("_worst_step")]
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(ROOT / "tests" / "gpu"),
           *[arg for f in folders for arg in ("--results", str(f))],
           *[arg for g in gaps for arg in ("--allowed-gap", g)],
           *[arg for e in results_pages.exceeded(runs)
             for arg in ("--allowed-over", f"{e['case']}={e['bytes']}")],
           *[arg for e in results_pages.failed(runs) for arg in ("--known-failure", e["case"])],
           *[arg for d in _served_worstcase(runs) for arg in ("--serve", str(d))]]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stdout[-3000:]
    assert " passed" in p.stdout
    if _served_worstcase(runs):  # tests/gpu/test_serve_gpu.py read them
        assert "deselected" not in p.stdout, p.stdout[-2000:]
    # What the runs did not cover, and why (manifests' not_run); any other skip fails the test.
    allowed = [f"no {n['case']} " for n in results_pages.not_run(runs) if "case" in n]
    skips = [ln for ln in p.stdout.splitlines() if ln.startswith("SKIPPED")]
    assert all(any(why in ln for why in allowed) for ln in skips), "\n".join(skips)


def _served_worstcase(runs) -> list[Path]:
    """The serve_run folders holding a current `--profiler worstcase` server (DIR/worstcase)."""
    return [r.folder / c.rsplit("/", 1)[0] for r in runs for c in r.cases("serve", "current")
            if c.endswith("/worstcase")]


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_every_family_cut_down_by_default_cites_committed_proofs_that_hold(compiled):
    """sweep_depth.CUT_DOWN_PROVEN (and CUT_DOWN_PROVEN_COMPILED): each entry names current
    --sweep-depth prove cases of a committed run, each proven there, on a model of that class,
    eager (or with the model compiled, for the compiled table), with the cut proven.json records
    for it: a prefix cut's depth names no kept layers ("4 of 8 layers"), which sweep_depth=cut-down
    relies on when it keeps that cut (sweep_depth.proven_cut)."""
    from worstcase_profiler.core.sweep_depth import (CUT_DOWN_PROVEN, CUT_DOWN_PROVEN_COMPILED,
                                                     CUTS, proven_cut)

    table = CUT_DOWN_PROVEN_COMPILED if compiled else CUT_DOWN_PROVEN
    assert table and set(CUT_DOWN_PROVEN_COMPILED) <= set(CUT_DOWN_PROVEN)
    cited = [(model_class, *c.split(": ", 1)) for model_class, evidence in table.items()
             for c in evidence.split("; ")]
    for model_class, run, cases in cited:
        cut = proven_cut(model_class, compiled=compiled)
        assert cut in CUTS, (model_class, cut)
        summary = load_summary(RESULTS / run)
        for name in cases.split(", "):
            c = summary["by_case"][name]
            proof = c["report"]["worstcase"]["cut_down_proof"]
            assert proof["verdict"] == "proven", (model_class, name, proof["verdict"])
            assert _arch_of(c) == model_class, name
            assert c["report"]["config"]["enforce_eager"] is (not compiled), name
            if cut == "prefix":
                assert re.fullmatch(r"\d+ of \d+ layers(, run eagerly)?", proof["depth"]), \
                    (model_class, name, proof["depth"])


def _arch_of(case: dict) -> str:
    """The architecture of a suite case's model (its config.json in tests/gpu/models)."""
    model = case["cli_argv"][case["cli_argv"].index("--model") + 1]
    config = ROOT / "tests" / "gpu" / "models" / model.split("tests/gpu/models/")[1] / "config.json"
    return json.loads(config.read_text())["architectures"][0]


def test_cpu_bench_page_and_summaries_are_rendered_from_its_json():
    result = json.loads((RESULTS / "cpu-bench.json").read_text())
    summaries = [cpu_bench._summarise(w, result["runs"][w]) for w in result["workloads"]]
    assert json.dumps(summaries) == json.dumps(result["summaries"])
    assert cpu_bench._markdown(result, summaries) == (RESULTS / "cpu-bench.md").read_text()


def test_committed_schema_docs_match_the_report_models():
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_schema.py"), "--check"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def test_compatibility_page_is_rendered_from_the_committed_results():
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "compatibility.py"), "--check"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    page = (ROOT / "docs" / "compatibility.md").read_text()
    assert "| 0.32.0 | 2.11 | H200 | v2 | on | 1 | llama8b_graphs | pass" in page
    # 0.32 on the torch it pins, told apart from the trimmed wheelhouse on the host's torch
    assert "| 0.32.0 | 2.13 | H200 | v2 | off | 1 | dsv32_fp8 | pass" in page
    assert "## Read, not run" in page and "| 0.33 |" in page
    # a case that timed out before its report: the graphs it asked for, from its own flags
    assert "| 0.33.0 | 2.14 | H200 | ? | on | 1 | dsv4_dspark_graphs | FAIL" in page


def test_a_served_run_is_tabulated_from_its_serve_json():
    """bench/serve_run.py's folders (DIR/serve.json, by DIR/mode): a server that never became
    healthy reads so, not as a figure; a mode the manifest does not name is a problem."""
    page = (RESULTS / "h200-vllm-0.32.md").read_text()
    section = page.split("## `vllm serve` under HTTP traffic", 1)[1].split("\n## ", 1)[0]
    rows = {ln.split("|")[1].strip(): ln for ln in section.splitlines() if ln.startswith("| ")}
    assert "| free |" in rows["serve/worstcase"] and "decodes 16/16" in rows["serve/worstcase"]
    assert "| never | not reached |" in rows["held/worstcase"]
    run = next(r for r in RUNS if r.name == "h200-run34")
    bare = results_pages.Run(run.folder, {**run.m, "cases": {**run.m["cases"], "serve": {}}})
    assert f"{run.name}: serve serve/worstcase has no status in the manifest" in results_pages.problems([bare])


def test_a_fit_run_folder_is_read_as_fit_results_not_as_a_suite(tmp_path):
    """bench/fit_run.py writes summary.json with kind "fit_run" and no suite cases: the pages
    read it as the fit kind (its comparison row and checks), and the suite reader finds none."""
    from results_pages import Run, fit_table

    summary = {"kind": "fit_run", "models": {"m": {"checks": {"a": {"ok": True},
                                                              "b": {"ok": False}}}},
               "comparison": [{"model": "m", "util": 0.5, "n": 4, "vllm_auto_max_model_len": 131072,
                               "vllm_auto_concurrency": 3.34, "fit_max_model_len": 109008,
                               "fit_chunk": 4096, "fit_max_num_seqs": 64, "fit_kv_tokens": 436080,
                               "fit_kv_cache_bytes": 57157877760, "fitted_admitted": True,
                               "fitted_worst_step_ratio": 0.9955}]}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    run = Run(tmp_path, {"cases": {"fit": {"m": {"status": "current"}}}})
    assert run.suite == {} and list(run.fit) == ["m"] and run.found("fit") == ["m"]
    table = fit_table([(run, "m", run.fit["m"])])
    assert "109,008 / 4,096 / 64" in table and "131,072 (3.34x)" in table and "| b |" in table
