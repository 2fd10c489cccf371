"""Tensor parallel on GPUs (issue 7): `wcprof --validate` on the DeepSeek-V3.2-style sparse-MLA
engine at tensor_parallel_size 2 (bench/gpu_suite.py cases dsv32_fp8_tp2 and dsv32_bf16_tp2,
2 GPUs). Every rank runs the sweep with NCCL collectives inside each forward pass, so every rank
must execute the same steps in the same order; each rank's budget is its own, so the report
carries one entry per rank, each validated in its own worker.

These cases need a 2-GPU host: they are read from --results folders that hold them and skipped
otherwise (a 1-GPU run of the suite does not request them).
"""

from __future__ import annotations

import pytest
from gpu_results import asked, gib, report_of

TP_CASES = ("dsv32_fp8_tp2", "dsv32_bf16_tp2")


@pytest.fixture(params=TP_CASES)
def tp_case(request, suite) -> dict:
    c = suite.get("by_case", {}).get(request.param)
    if c is None:
        pytest.skip(f"no {request.param} in these results (needs 2 GPUs)")
    if c["status"] == "skipped":
        pytest.fail(f"{request.param} was skipped by the suite: {c.get('detail')}")
    return c


def _ranks(c: dict) -> dict[int, dict]:
    r = report_of(c)
    return {rank["rank"]: rank for rank in r.get("ranks") or []}


def test_tp2_engine_started_and_validated(tp_case):
    r = report_of(tp_case)
    assert tp_case["rc"] == 0, f"wcprof exited {tp_case['rc']}: {tp_case.get('log_tail', [])[-20:]}"
    assert r["config"]["tensor_parallel_size"] == 2
    assert r["validation"] is not None


def test_one_report_per_rank(tp_case):
    assert sorted(_ranks(tp_case)) == [0, 1]


def test_every_rank_ran_the_same_steps_in_the_same_order(tp_case):
    ranks = _ranks(tp_case)
    steps = [[s["shape"] for s in ranks[k]["worstcase"]["steps"]] for k in sorted(ranks)]
    assert steps[0] and all(s == steps[0] for s in steps)
    prints = [ranks[k]["worstcase"]["plan_fingerprints"] for k in sorted(ranks)]
    assert all(p == prints[0] for p in prints) and len(prints[0]) == 2 and len(set(prints[0])) == 1


def test_every_rank_within_its_own_prediction(tp_case):
    for rank, rep in sorted(_ranks(tp_case).items()):
        v = rep["validation"]
        assert v is not None and v["rank"] == rank, f"rank {rank} was not validated"
        assert v["measured_peak_bytes"] <= v["predicted_peak_bytes"], (
            f"rank {rank}: real requests peaked at {gib(v['measured_peak_bytes'])}, above its "
            f"prediction {gib(v['predicted_peak_bytes'])}")
        assert rep["worstcase"]["peak_activation_bytes"] >= rep["stock"]["peak_activation_bytes"]
        assert rep["kv_audit"] is not None and rep["kv_audit"]["verdict"] == "ok", rep["kv_audit"]


def test_every_rows_value_covered_on_every_rank(tp_case):
    mnbt = asked(tp_case, "--max-num-batched-tokens")
    for rep in _ranks(tp_case).values():
        assert rep["worstcase"]["rows_covered"] == {"min": 1, "max": mnbt}
