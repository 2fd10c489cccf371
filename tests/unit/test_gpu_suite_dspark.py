"""bench/gpu_suite.py's issue-32 cases (seed 002's system, DeepSeek-V4 + DSpark on one H200):
their argv carries the seed's limits, and their checks (gpu_suite._check_dspark) pass a report
that shows what the issue asks and fail one that misses it: a lane-1 slot left small, a
workspace resize after the lock, no lock line in vLLM's workspace debug log."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import gpu_suite  # noqa: E402

NAME = "dsv4_dspark_eager"
LOCK = "INFO [workspace.py:93] [WORKSPACE DEBUG] Workspace locked. Current sizes: [64.0, 64.0]"
RESIZE = ("INFO [workspace.py:270] [WORKSPACE DEBUG] Resized workspace from 'x': 1.00 MB -> "
          "64.00 MB (ubatch 0, lane 1)")


def _report() -> dict:
    slot = 64 << 20
    decode = {"kind": "decode", "rows": 16, "num_reqs": 4, "context_len": 262140}
    return {
        "config": {"num_speculative_tokens": 3, "max_model_len": 262144, "enforce_eager": True},
        "runner": {"runner": "v2"},
        "stock": {"peak_activation_bytes": 1 << 30, "workspace_bytes": 1 << 20},
        "worstcase": {
            "peak_activation_bytes": 2 << 30, "workspace_bytes": 2 * slot,
            "rows_covered": {"min": 1, "max": 4096},
            "steps": [{"shape": decode}, {"shape": {"kind": "prefill", "rows": 4096, "num_reqs": 1}}],
            "workspace_slots": [{"ubatch": 0, "lane": 0, "bytes_before": slot, "bytes_after": slot},
                                {"ubatch": 0, "lane": 1, "bytes_before": 1 << 20, "bytes_after": slot}],
            "workspace_locked": True},
        "kv_audit": {"verdict": "ok", "message": "ok", "groups": [
            {"name": f"group{i}:UniformTypeKVCacheSpecs", "declared_bytes": 100, "ratio": 1.0,
             "drafter_layers": [f"model.layers.{i}.attn.swa_cache"] if i in (4, 5, 6) else []}
            for i in range(10)]},
        "validation": {"measured_peak_bytes": 99, "predicted_peak_bytes": 100},
        "validations": [{"target": "worst-step", "measured_peak_bytes": 99,
                         "predicted_peak_bytes": 100, "ratio": 0.99},
                        {"target": "check-step", "measured_peak_bytes": 95,
                         "predicted_peak_bytes": 96, "ratio": 0.99,
                         "shape": dict(gpu_suite.SEED002_STEP)}],
    }


def _failed(report: dict, log: str) -> list[str]:
    return [k for k, v in gpu_suite._check(report, NAME, 0, log).items() if not v["ok"]]


def test_the_cases_carry_seed_002s_limits():
    for name in gpu_suite.DSPARK_CASES:
        argv = gpu_suite._cli_argv(name, Path("/tmp"))
        flags = dict(zip(argv, argv[1:]))
        assert json.loads(flags["--speculative-config"]) == {"method": "dspark",
                                                             "num_speculative_tokens": 3}
        assert (flags["--max-model-len"], flags["--max-num-seqs"],
                flags["--max-num-batched-tokens"], flags["--block-size"],
                flags["--kv-cache-dtype"]) == ("262144", "4", "4096", "256", "fp8_ds_mla")
        assert "--enable-prefix-caching" in argv and flags["--validate"] == "worst"
        assert flags["--check-step"] == "4096@149760"  # the seed's step, measured on its own
        assert gpu_suite._env(name)["VLLM_DEBUG_WORKSPACE"] == "1"
        assert name in gpu_suite.NAMED_ONLY and name not in gpu_suite.DEFAULT_CASES
    graphs = gpu_suite._cli_argv("dsv4_dspark_graphs", Path("/tmp"))
    assert "--enforce-eager" not in graphs
    assert json.loads(graphs[graphs.index("--compilation-config") + 1]) == {
        "cudagraph_mode": "FULL_AND_PIECEWISE"}


def test_a_report_that_shows_the_issue_passes():
    assert _failed(_report(), f"{LOCK}\n... serving ...\n") == []


@pytest.mark.parametrize("break_it, log, failed", [
    (lambda r: r["worstcase"]["workspace_slots"][1].update(bytes_after=1 << 20), LOCK,
     ["both_lanes_reserved"]),
    (lambda r: r["worstcase"]["workspace_slots"].pop(), LOCK, ["both_lanes_reserved"]),
    (lambda r: None, f"{LOCK}\n{RESIZE}\n", ["no_workspace_resize_after_lock"]),
    (lambda r: None, f"{RESIZE}\n{LOCK}\n", []),  # a resize before the lock is the sweep's
    (lambda r: None, "no debug lines", ["no_workspace_resize_after_lock"]),
    (lambda r: r["kv_audit"]["groups"][6].update(drafter_layers=[]), LOCK, ["drafter_layers_audited"]),
    (lambda r: r["worstcase"]["steps"][0]["shape"].update(rows=8), LOCK, ["decode_steps_one_plus_k"]),
    (lambda r: r["validations"][0].update(predicted_peak_bytes=110), LOCK, ["worst_step_within_1.02"]),
    (lambda r: r["config"].update(max_model_len=131072), LOCK, ["max_model_len_ge_262144"]),
    (lambda r: r["validations"].pop(), LOCK, ["seed_step_within_1.02"]),
    (lambda r: r["validations"][1].update(predicted_peak_bytes=100), LOCK, ["seed_step_within_1.02"]),
    (lambda r: r["validations"][1]["shape"].update(context_len=8192), LOCK,
     ["seed_step_within_1.02"]),
])
def test_a_report_that_misses_it_fails_the_check_that_says_so(break_it, log, failed):
    r = copy.deepcopy(_report())
    break_it(r)
    assert _failed(r, log) == failed


def test_a_resize_counts_after_its_own_process_locked():
    """Under `vllm serve` and TP each worker logs its own lock: a resize in a worker that has
    not locked yet is its sweep's, one after its own lock is late."""
    a, b = "(Worker_TP0 pid=11) INFO ", "(Worker_TP1 pid=12) INFO "
    early = f"{a}{LOCK}\n{b}{RESIZE}\n{b}{LOCK}\n"
    assert gpu_suite.resizes_after_lock(early) == (True, [])
    assert gpu_suite.resizes_after_lock(early + f"{b}{RESIZE}\n") == (True, [f"{b}{RESIZE}"])
    assert gpu_suite.resizes_after_lock(f"{RESIZE}\n") == (False, [RESIZE])
    # a worker that resized and never locked: its workspace was never fixed
    assert gpu_suite.resizes_after_lock(f"{a}{LOCK}\n{b}{RESIZE}\n") == (True, [f"{b}{RESIZE}"])
