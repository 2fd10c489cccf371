"""`vllm serve --profiler worstcase` under real HTTP traffic (bench/serve_run.py's folders, read
with --serve DIR): every worst-case server that became healthy served all of its traffic, its
guard saw no step above the prediction, the worst step it built from requests before serving
(and each step named in check_steps) measured within its prediction and within 2% of it, its KV
allocation kept within the budget, and it shut down cleanly. Where vLLM's workspace debug log is
on, no workspace resize came after the profiler locked it (seed 002: the drafter's lane 1 beside
lane 0)."""

from __future__ import annotations

import sys
from pathlib import Path

from gpu_results import ROOT, load_served, traffic_failures, within_two_percent

sys.path.insert(0, str(ROOT / "bench"))
from gpu_suite import resizes_after_lock  # noqa: E402


def pytest_generate_tests(metafunc):
    if "served" not in metafunc.fixturenames:
        return
    found = load_served([Path(d) for d in metafunc.config.getoption("--serve") or []])
    metafunc.parametrize("served", [found[i] for i in sorted(found)], ids=sorted(found))


def test_every_request_was_served_and_the_server_stopped_cleanly(served):
    assert served["alive_after_traffic"] is True
    assert served["traffic"] and not traffic_failures(served["traffic"]), served["traffic"]
    assert not served["oom_lines"], served["oom_lines"][:1]
    assert served["shutdown"]["rc"] == 0 and not served["shutdown"]["forced"], served["shutdown"]
    assert not served["shutdown"].get("processes_left"), served["shutdown"]


def test_the_guard_saw_no_served_step_above_the_prediction(served):
    g = served["guard_metrics"]
    assert g.get("wcprof_guard_steps_total", 0) > 0, g
    assert g["wcprof_guard_steps_above_prediction_total"] == 0, g
    assert g["wcprof_guard_observed_need_bytes_max"] <= g["wcprof_guard_predicted_need_bytes"], g


def test_the_steps_built_before_serving_are_within_two_percent(served):
    """The worst step, and every step named in check_steps (each against its own reading)."""
    vals = served["report"]["validations"]
    worst = [v for v in vals if v.get("target") == "worst-step"]
    assert worst, "no startup validation of the worst step (validate_on_start off?)"
    named = [c["shape"] for c in ((served["full_report"] or {}).get("worstcase") or {})
             .get("check_steps", [])]
    checks = [v for v in vals if v.get("target") == "check-step"]  # built as near as reachable
    assert len(checks) == len(named), (named, checks)
    for v in worst + checks:
        within_two_percent(v)


def test_the_kv_allocation_kept_within_its_budget(served):
    audit = served["report"]["kv_audit"]
    assert 0 < audit["allocated_bytes"] <= audit["allowed_bytes"], audit
    assert all(g["verdict"] == "ok" for g in audit["groups"]), audit["groups"]


def test_the_workspace_was_locked_with_every_slot_reserved_alike(served):
    """Every (ubatch, lane) slot reserved to one size and locked; where vLLM's workspace debug
    log is on (VLLM_DEBUG_WORKSPACE=1), no resize after the lock."""
    wc = (served["full_report"] or {}).get("worstcase") or {}
    slots = wc.get("workspace_slots") or []
    assert wc.get("workspace_locked") is True, "the report says the workspace was not locked"
    assert slots and len({s["bytes_after"] for s in slots}) == 1, slots
    _, late = resizes_after_lock(served["log"])
    assert not late, late[0]
