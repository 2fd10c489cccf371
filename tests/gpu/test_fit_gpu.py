"""Issue 37 point 4 on the GPU: bench/fit_run.py's results, read from a folder (no engine here).

  pytest tests/gpu/test_fit_gpu.py --results docs/results/<folder>   a folder of fit_run's output
  pytest tests/gpu/test_fit_gpu.py      (with a GPU) the committed folders under docs/results

A folder is fit_run's when its summary.json says kind "fit_run" (gpu_suite's folders are passed
over). Per model whose fitted start ran: fit's recommended configuration was admitted at fit's
limits, the KV it admitted is fit's figure within the meter's resolution (the same tokens; fit's
flags pin it) and the fitted start's own measured budget holds it, and
the worst step built from real requests measured <= predicted with predicted/measured <= 1.02.
The figures are recomputed from the folder's own reports (fit-<model>.json,
fitted-<model>.json) where they are there, else read from the summary. Skips when there is no
such folder, or a model's steps were not run (the deadline); where --results names only the GPU
suite's folders there is nothing of fit_run's to check and the tests pass without checking
(tests/unit/test_committed_results.py runs tests/gpu on those and allows no skip their manifests
do not name)."""

from __future__ import annotations

import json
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import fit_run  # noqa: E402

COMMITTED = ROOT / "docs" / "results"


def fit_run_folders(given: list[str] | None) -> list[Path]:
    """The folders given (or, with none, those committed) that hold fit_run's summary."""
    if given:
        dirs = [Path(g) if Path(g).is_dir() else Path(g).parent for g in given]
    else:
        dirs = sorted({p.parent for pat in ("*/fit-*.json", f"*/{fit_run.PACK}")
                       for p in COMMITTED.glob(pat)})
    out = []
    for d in dirs:
        s = d / "summary.json"
        try:
            if s.exists() and json.loads(s.read_text()).get("kind") == "fit_run":
                out.append(d)
        except ValueError:
            continue
    return out


def pytest_generate_tests(metafunc):
    if "fit_model" not in metafunc.fixturenames:
        return
    params = []
    for d in fit_run_folders(metafunc.config.getoption("--results", default=None)):
        for name in json.loads((d / "summary.json").read_text())["models"]:
            params.append(pytest.param((d, name), id=f"{d.name}/{name}"))
    if not params and metafunc.config.getoption("--results", default=None):
        # suite folders only (tests/unit/test_committed_results.py runs tests/gpu on them and
        # allows no skip a manifest does not name): nothing of fit_run's to check there
        params = [pytest.param(None, id="no-fit-run-folder-among-the-results")]
    elif not params:
        params = [pytest.param(None, id="no-fit-run-results",
                               marks=pytest.mark.skip(reason="no fit_run results folder "
                                                             "(bench/fit_run.py --out DIR)"))]
    metafunc.parametrize("fit_model", params)


def _figures(folder: Path, name: str) -> tuple[dict, dict, dict]:
    """(model's summary entry, fit's figures, the fitted start's figures)."""
    doc = json.loads((folder / "summary.json").read_text())
    m = {**doc["models"][name], "device_kind": doc["args"].get("device_kind", "cuda")}
    steps = m["steps"]
    fitted_step = steps.get("fitted") or {}
    if fitted_step.get("status") in (None, "skipped"):
        pytest.skip(f"{name}: the fitted start was not run: "
                    f"{fitted_step.get('why', 'no such step')}")
    fit_rep, fitted_rep = _report(folder, f"fit-{name}.json"), _report(folder, f"fitted-{name}.json")
    fit = fit_run.fit_result(fit_rep) if fit_rep else steps["fit"]["result"]
    fitted = (fit_run.fitted_result(fitted_rep, fitted_step.get("rc"), fit) if fitted_rep
              else fitted_step.get("result") or {})
    return m, fit, fitted


def _report(folder: Path, name: str) -> dict | None:
    """A report in the folder, or in its fit-run.tar.gz (fit_run --mirror), or None."""
    if (folder / name).exists():
        return json.loads((folder / name).read_text())
    pack = folder / fit_run.PACK
    if pack.exists():
        with tarfile.open(pack) as tar:
            try:
                return json.loads(tar.extractfile(name).read())
            except KeyError:
                return None
    return None


def test_fits_recommendation_was_admitted(fit_model):
    if fit_model is None:
        return  # --results named gpu_suite folders only: nothing of fit_run's in them
    folder, name = fit_model
    _, fit, fitted = _figures(folder, name)
    rec = fit["recommended"]
    assert rec is not None and rec["feasible"], fit.get("notes")
    assert fitted.get("admitted"), fitted
    assert fitted["config"] == [rec["max_model_len"], rec["max_num_batched_tokens"],
                                rec["max_num_seqs"]]


def test_the_admitted_kv_is_fits_figure(fit_model):
    if fit_model is None:
        return  # --results named gpu_suite folders only: nothing of fit_run's in them
    folder, name = fit_model
    _, fit, fitted = _figures(folder, name)
    rec, adm = fit["recommended"], fitted["admission"]
    resolution = (fitted.get("worst_step") or {}).get("resolution_bytes") or 0
    assert resolution <= 1 << 20  # the CUDA meter's (adapter/meters.py); the CPU's is 512 KiB
    assert abs(adm["kv_cache_bytes"] - rec["kv_cache_bytes"]) <= resolution, (adm, rec)
    assert adm["kv_tokens_worstcase"] == rec["kv_tokens"]
    assert rec["concurrency"] >= fit["min_concurrency"]
    # fit's flags pin that KV: what can fail is the budget the fitted start measured for itself
    assert adm["budget_bytes"] >= rec["kv_cache_bytes"] - resolution, (adm, rec)


def test_the_worst_step_measured_within_the_prediction(fit_model):
    if fit_model is None:
        return  # --results named gpu_suite folders only: nothing of fit_run's in them
    folder, name = fit_model
    m, _, fitted = _figures(folder, name)
    v = fitted.get("worst_step")
    assert v, "no worst-step validation in the fitted start's report"
    measured, predicted = v["measured_peak_bytes"], v["predicted_peak_bytes"]
    if m["device_kind"] != "cuda":  # fit_run --device-kind cpu: the plumbing, on RSS
        assert measured <= predicted + v["resolution_bytes"], v
        pytest.skip(f"a CPU run: predicted/measured {predicted / measured:.3f} is the CPU "
                    f"meter's, not held to 1.02")
    assert measured <= predicted, v
    assert predicted / measured <= 1.02, v


def test_vllms_auto_fit_beside_it(fit_model):
    """Recorded beside fit's answer: the length stock vLLM's auto-fit chose on the same model
    and utilization (docs/fit.md's table), read back from its own engine."""
    if fit_model is None:
        return  # --results named gpu_suite folders only: nothing of fit_run's in them
    folder, name = fit_model
    m, _, _ = _figures(folder, name)
    stock = m["steps"].get("stock") or {}
    if stock.get("status") in (None, "skipped"):
        pytest.skip(f"{name}: stock auto-fit not run: {stock.get('why', 'no such step')}")
    assert stock["status"] == "ok", stock.get("tail")
    auto = stock["auto_fit"]
    assert auto and stock["max_model_len"] == auto["max_model_len"] <= auto["from"], stock
