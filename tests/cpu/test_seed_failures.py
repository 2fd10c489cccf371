"""Both seed failures caught on a real engine (issue 3), and the odd-rows peak found (issue 5)."""

from __future__ import annotations

import json

import pytest
import wcp_fixtures
from wcp_fixtures import rules

from conftest import run_python, run_wcprof, within_prediction

pytestmark = pytest.mark.engine


def _cfg(name: str) -> dict:
    return json.loads((wcp_fixtures.model_dir(name) / "config.json").read_text())


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return run_wcprof(["demo", "scratch"], tmp_path_factory.mktemp("scratch"))


def test_scratch_stock_underpredicts_by_the_scratch(scratch):
    assert scratch.rc == 0, scratch.text[-3000:]
    r = scratch.report
    cfg = _cfg("scratch")
    mml = r["config"]["max_model_len"]
    rows = r["config"]["max_num_batched_tokens"]
    lanes = 2
    scratch_at_mml = lanes * rules.scratch_bytes(rows, mml, cfg)
    stock_need = r["stock"]["peak_activation_bytes"] + r["stock"]["workspace_bytes"]
    measured = r["validation"]["measured_peak_bytes"]
    assert measured - stock_need >= scratch_at_mml * 0.99, (measured, stock_need, scratch_at_mml)


def test_scratch_prediction_covers_the_real_request_within_5_percent(scratch):
    v = scratch.report["validation"]
    assert within_prediction(v), v
    assert v["predicted_peak_bytes"] <= 1.05 * v["measured_peak_bytes"], v


def test_scratch_both_lanes_end_the_sweep_at_the_same_size(scratch):
    r = scratch.report
    slots = r["worstcase"]["workspace_slots"]
    assert len(slots) == 2 and {s["lane"] for s in slots} == {0, 1}
    sizes = {s["bytes_after"] for s in slots}
    assert len(sizes) == 1
    cfg = _cfg("scratch")
    expected = rules.workspace_slot_bytes(rules.scratch_bytes(
        r["config"]["max_num_batched_tokens"], r["config"]["max_model_len"], cfg))
    assert sizes == {expected}
    assert r["worstcase"]["workspace_locked"] is True
    assert r["stock"]["workspace_bytes"] < expected / 100  # the stock step saw a tiny slot


LOCKED_GROWTH = """
import wcp_fixtures
from vllm import LLM
llm = LLM(model=str(wcp_fixtures.model_dir("scratch")), load_format="dummy",
          skip_tokenizer_init=True, enforce_eager=True, max_model_len=2048,
          max_num_batched_tokens=256, max_num_seqs=4, gpu_memory_utilization=0.25,
          additional_config={"worstcase_profiler": {"profiler": "worstcase", "kv_cap_bytes": 256 << 20,
                                                     "context_ladder": False}})
runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
# A step the sweep never saw: attention over 2x max_model_len needs twice the scratch.
try:
    runner._dummy_run(256, force_attention=True, profile_seq_lens=4096, is_profile=True)
except AssertionError as e:
    print("LOCKED-ERROR", e)
else:
    print("NO-ERROR")
"""


def test_growing_a_locked_workspace_raises_a_named_error():
    run = run_python(LOCKED_GROWTH)
    line = [l for l in run.out.splitlines() if l.startswith(("LOCKED-ERROR", "NO-ERROR"))]
    assert line and line[0].startswith("LOCKED-ERROR"), run.text[-3000:]
    msg = line[0]
    assert "locked" in msg and "scratch.py" in msg  # names the caller
    assert msg.count("MB") >= 2  # and both sizes


def test_overcommit_refused_by_default(tmp_path):
    run = run_wcprof(["demo", "overcommit"], tmp_path)
    assert run.rc == 5, run.text[-3000:]
    assert "Traceback" not in run.text
    audit = run.report["kv_audit"]
    layers = _cfg("overcommit")["num_hidden_layers"]
    assert layers - 0.1 <= audit["ratio"] <= layers + 0.5, audit
    assert audit["verdict"] == "over-budget"
    assert "(x4." in run.err and "outside the plan" in run.err and "GiB" in run.err


def test_overcommit_starts_with_warning_flag(tmp_path):
    run = run_wcprof(["demo", "overcommit", "--kv-audit", "warn", "--validate"], tmp_path)
    assert run.report is not None, run.text[-3000:]
    assert run.report["validation"] is not None  # it started and served requests
    audit = run.report["kv_audit"]
    assert audit["ratio"] > 3.9
    assert run.rc == 1  # a CI gate still sees the over-commit
    assert "KV OVER-COMMIT" in run.out


def test_tile_peak_found_exactly(tile_pair):
    run = tile_pair.cold  # `wcprof demo tile`'s start, shared with tests/cpu/test_sweep_cache.py
    assert run.rc == 0, run.text[-3000:]
    r = run.report
    cfg = _cfg("tile")
    n, mml = r["config"]["max_num_batched_tokens"], r["config"]["max_model_len"]
    # The sweep runs chunk R at KV extent max_model_len (R new on max_model_len - R cached).
    per_rows = {rows: rules.scratch_bytes(rows, mml, cfg) for rows in range(1, n + 1)}
    true_max = max(per_rows.values())
    argmax = {rows for rows, b in per_rows.items() if b == true_max}
    assert not any(rows & (rows - 1) == 0 for rows in argmax) and n not in argmax
    assert per_rows[n] < true_max
    slots = {s["bytes_after"] for s in r["worstcase"]["workspace_slots"]}
    assert slots == {rules.workspace_slot_bytes(true_max)}
    assert r["worstcase"]["worst_shape"]["rows"] in argmax
