"""A step the operator names (`--check-step ROWS@CONTEXT`, setting check_steps) on a real
engine: measured on its own beside the sweep, reported, held in the admitted figure, and with
--validate built from real requests against its own reading. The `scratch` fixture's attention
asks for rows x KV extent x 64 B of workspace, so a chunk on half the context needs less than the
worst step at the full extent: the case the setting is for (the step an engine died on, measured
where it happened, not only bounded by the worst one)."""

from __future__ import annotations

import pytest

from conftest import check_step_held, run_wcprof, within_prediction

pytestmark = pytest.mark.engine

wcp_fixtures = pytest.importorskip("wcp_fixtures")

ARGS = ["--load-format", "dummy", "--skip-tokenizer-init", "--enforce-eager",
        "--gpu-memory-utilization", "0.25", "--max-model-len", "2048",
        "--max-num-batched-tokens", "256", "--max-num-seqs", "4"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    r = run_wcprof(["--model", str(wcp_fixtures.model_dir("scratch")), *ARGS,
                    "--check-step", "256@768", "--validate", "worst"],
                   tmp_path_factory.mktemp("check"))
    assert r.rc == 0, r.text[-3000:]
    return r


def test_the_named_step_is_measured_and_held_in_the_admitted_figure(run):
    wc = run.report["worstcase"]
    (check,) = wc["check_steps"]
    assert check["shape"] == {"kind": "prefill", "rows": 256, "context_len": 768, "num_reqs": 1}
    assert 0 < check["peak_bytes"] <= check["predicted_bytes"] <= wc["peak_activation_bytes"]
    # its scratch is at a shorter KV extent than the worst step's: it needs less
    assert check["need_bytes"] < wc["peak_activation_bytes"] + wc["workspace_bytes"]
    assert "check step 256@768 (256 new tokens on 768 cached)" in run.out


def test_validate_builds_it_from_real_requests_against_its_own_reading(run):
    (check,) = run.report["worstcase"]["check_steps"]
    (v,) = [v for v in run.report["validations"] if v["target"] == "check-step"]
    assert v["shape"] == check["shape"] and check_step_held(v), v
    if not within_prediction(v):  # over its one reading by RSS noise: a warning, exit 0
        assert "but within the admitted figure" in run.out, run.out[-3000:]
    workspace = run.report["worstcase"]["workspace_bytes"]
    assert v["predicted_peak_bytes"] == check["predicted_bytes"] + workspace, v
    # what it must stay within to pass at all: what the budget subtracted, plus that workspace
    assert v["admitted_peak_bytes"] == run.report["admission"]["transient_bytes"] + workspace, v
    assert v["formed"]["rows"] >= 256 and v["formed"]["context_len"] >= 768, v
    # the worst step is validated too, against the admitted figure
    assert [w["target"] for w in run.report["validations"]].count("worst-step") == 1
    assert "validation (check step, against its own reading)" in run.out


def test_a_step_the_engine_cannot_form_or_a_malformed_one_is_refused_with_what_to_do(tmp_path):
    model = str(wcp_fixtures.model_dir("scratch"))
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    bad = run_wcprof(["--model", model, *ARGS, "--check-step", "256:768"], tmp_path / "a")
    assert bad.rc == 2 and "check step '256:768' is not ROWS@CONTEXT" in bad.text, bad.text[-2000:]
    over = run_wcprof(["--model", model, *ARGS, "--check-step", "512@0"], tmp_path / "b")
    assert over.rc == 2 and "check step 512@0: 512 new tokens is more than one step holds " \
        "(max_num_batched_tokens 256)" in over.text, over.text[-2000:]
