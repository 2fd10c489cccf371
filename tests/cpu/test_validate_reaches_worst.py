"""`--validate` builds the report's own worst step from real requests, also when that step is not
a long single-request chunk: a fixture whose worst step is the widest full-context decode batch,
and one whose worst step is a prefill spread over every request (wcp_fixtures `decode`, `wide`).
Generic traffic need not reach those steps; the worst-step check must, within the CPU meter."""

from __future__ import annotations

import pytest

from conftest import run_wcprof, within_prediction

pytestmark = pytest.mark.engine

wcp_fixtures = pytest.importorskip("wcp_fixtures")

ARGS = ["--load-format", "dummy", "--skip-tokenizer-init", "--enforce-eager",
        "--gpu-memory-utilization", "0.25", "--max-model-len", "2048",
        "--max-num-batched-tokens", "256", "--max-num-seqs", "4", "--validate"]
MML, SEQS = 2048, 4


@pytest.fixture(scope="module", params=["decode", "wide"])
def run(request, tmp_path_factory):
    name = request.param
    r = run_wcprof(["--model", str(wcp_fixtures.model_dir(name)), *ARGS],
                   tmp_path_factory.mktemp(name))
    assert r.rc == 0, r.text[-3000:]
    return name, r


def _worst_step_validation(report):
    (v,) = [v for v in report["validations"] if v["target"] == "worst-step"]
    return v


def test_the_sweep_finds_the_fixtures_worst_step(run):
    name, r = run
    worst = r.report["worstcase"]["worst_shape"]
    assert worst["num_reqs"] == SEQS, worst
    if name == "decode":
        assert worst["kind"] == "decode" and worst["context_len"] == MML - 1
    else:
        assert worst["kind"] == "prefill" and worst["rows"] == 256
        assert worst["context_len"] + 256 // SEQS >= MML // 2  # every request on a long context
    # the fixture's scratch (two lanes) is what makes it the worst: tens of MiB over stock
    assert r.report["worstcase"]["workspace_bytes"] >= 32 << 20


def test_validate_reaches_that_step_from_real_requests(run):
    name, r = run
    worst = r.report["worstcase"]["worst_shape"]
    v = _worst_step_validation(r.report)
    assert (v["shape"]["kind"], v["shape"]["num_reqs"], v["shape"]["rows"]) == (
        worst["kind"], worst["num_reqs"], worst["rows"])
    assert v["ratio"] >= 0.9 and within_prediction(v), v
    # the scheduler formed it: the largest step recorded during the replay covers the target
    assert v["formed"]["rows"] >= worst["rows"] and v["formed"]["num_reqs"] >= worst["num_reqs"], v
    assert "NOT REACHED" not in r.out
    # the terminal names the step and the requests that formed it
    assert "validation (worst step)" in r.out and "requests:" in r.out


def test_validate_quick_forms_the_worst_steps_rows_and_requests_within_a_few_steps(tmp_path):
    """`--validate quick`: the decode fixture's worst step (4 requests at max_model_len) as 4
    short prompts prefilled together, then decoding together: the scheduler forms that many
    rows over that many requests at once, the replay stops there, and it is said to be quick
    (its context is not the worst step's)."""
    args = [a for a in ARGS if a != "--validate"] + ["--validate", "quick"]
    r = run_wcprof(["--model", str(wcp_fixtures.model_dir("decode")), *args], tmp_path)
    assert r.rc == 0, r.text[-3000:]
    (v,) = r.report["validations"]
    worst = r.report["worstcase"]["worst_shape"]
    assert v["target"] == "quick" and within_prediction(v), v
    assert (v["shape"]["kind"], v["shape"]["rows"], v["shape"]["num_reqs"]) == (
        "decode", worst["rows"], worst["num_reqs"])
    assert v["shape"]["context_len"] < worst["context_len"] and "quick" in v["note"], v
    assert v["formed"]["rows"] >= worst["rows"] and v["formed"]["num_reqs"] >= worst["num_reqs"]
    assert v["seconds"] < 30, v
    assert "validation (quick" in r.out and "NOT REACHED" not in r.out
