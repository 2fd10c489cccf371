"""Shared unit-test helpers. `make_report` builds a complete, realistic Report by hand (no
engine), so renderers, diff gates and the CLI can be tested in milliseconds."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from worstcase_profiler.report import Report

GiB = 1024**3
MiB = 1024**2


def _step(kind: str, rows: int, ctx: int, peak: int, reqs: int = 1, op: str | None = None) -> dict:
    return {"shape": {"kind": kind, "rows": rows, "context_len": ctx, "num_reqs": reqs},
            "peak_bytes": peak, "seconds": 0.05, "top_op": op}


def base_report_dict() -> dict[str, Any]:
    """A SAFE single-rank report for a small model; edit the dict or pass overrides."""
    worst_shape = {"kind": "prefill", "rows": 2049, "context_len": 2047, "num_reqs": 1}
    return {
        "tool_version": "0.1.0",
        "vllm_version": "0.32.0",
        "created_at": "2025-01-01T00:00:00+00:00",
        "rank": 0,
        "device": {"kind": "cuda", "name": "NVIDIA H200", "total_bytes": 140 * GiB},
        "config": {"model": "tiny-llama", "max_model_len": 4096, "max_num_batched_tokens": 8192,
                   "max_num_seqs": 256, "block_size": 16, "gpu_memory_utilization": 0.9},
        "runner": {"runner": "v1", "worker": "GPUWorker", "attention_backends": ["FLASH_ATTN"]},
        "stock": {"peak_activation_bytes": 3 * GiB,
                  "shape": {"kind": "stock", "rows": 8192, "context_len": 0, "num_reqs": 256},
                  "seconds": 0.4},
        "worstcase": {
            "peak_activation_bytes": 4 * GiB,
            "workspace_bytes": 64 * MiB,
            "post_profile_bytes": 16 * MiB,
            "worst_shape": worst_shape,
            "worst_op": "model.layers.0.self_attn",
            "rows_covered": {"min": 1, "max": 8192},
            "shapes_executed": 9,
            "coverage": {
                "method": "chord-bisection",
                "argument": "peak is piecewise affine in rows; chords certify segments",
                "tolerance_bytes": MiB,
                "executed_rows": [1, 2048, 2049, 2050, 4096, 8192],
                "segments": [
                    {"lo": 1, "hi": 2048, "how": "chord", "probes": [783, 1266]},
                    {"lo": 2048, "hi": 2050, "how": "executed"},
                    {"lo": 2050, "hi": 4096, "how": "chord", "probes": []},
                    {"lo": 4096, "hi": 8192, "how": "chord", "probes": []},
                ],
            },
            "context_curve": [_step("prefill", 2049, c, 3 * GiB + c * MiB // 4)
                              for c in (0, 512, 1024, 2047)],
            "steps": [_step("prefill", 8192, 0, 3 * GiB, 2),
                      {**_step("prefill", 2049, 2047, 4 * GiB, op="model.layers.0.self_attn"),
                       "shape": worst_shape},
                      _step("decode", 256, 4095, GiB, 256)],
            "workspace_slots": [{"ubatch": 0, "lane": 0, "bytes_before": 32 * MiB,
                                 "bytes_after": 64 * MiB}],
            "workspace_locked": True,
            "seconds": 12.5,
        },
        "admission": {
            "requested_bytes": 126 * GiB, "weights_bytes": 2 * GiB, "non_torch_bytes": GiB // 2,
            "consumed_bytes": 3 * GiB, "cudagraph_bytes": 0, "margin_bytes": GiB // 4,
            "budget_bytes": 118 * GiB + 3 * GiB // 4,
            "kv_cache_bytes": 118 * GiB + 3 * GiB // 4,
            "stock_kv_cache_bytes": 120 * GiB,
            "recommended_kv_cache_memory_bytes": 118 * GiB + 3 * GiB // 4,
            "bytes_per_token": 32768, "kv_tokens_stock": 3932160, "kv_tokens_worstcase": 3891200,
            "stock_oom_context_len": None, "fits": True,
        },
    }


def _set_path(data: dict, dotted: str, value: Any) -> None:
    keys = dotted.split("__")
    for key in keys[:-1]:
        data = data[key]
    data[keys[-1]] = value


def build_report(**overrides: Any) -> Report:
    """Report from base_report_dict(); `section__field=value` patches nested fields
    (e.g. admission__fits=False), plain keys replace top-level fields (kv_audit={...})."""
    data = copy.deepcopy(base_report_dict())
    for key, value in overrides.items():
        if hasattr(value, "model_dump"):
            value = value.model_dump()
        _set_path(data, key, value)
    return Report.model_validate(data)


@pytest.fixture
def make_report():
    return build_report


def pytest_terminal_summary(terminalreporter):
    """Show what the adversarial coverage tests cost (rows executed out of N)."""
    lines = [value for rep in terminalreporter.stats.get("passed", [])
             for key, value in rep.user_properties if key == "coverage_cost"]
    if lines:
        terminalreporter.write_sep("-", "rows coverage cost on adversarial peaks")
        for line in lines:
            terminalreporter.write_line(line)
