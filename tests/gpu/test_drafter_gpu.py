"""Issue 33, from bench/gpu_suite.py's drafter cases (named only; run them by name):

  llama8b_eagle3[_eager]         the Llama-3.1-8B layout with a 1-layer EAGLE-3 draft, k=3, 131k
  qwen35_dflash[_eager]          the Qwen3.5 hybrid (8 layers, GDN + full attention) with a DFlash
                                 draft at seed 000's geometry (5 layers, 4 KV heads, head_dim 256),
                                 k=8, at seed 000's launch: 32k, 32 sequences, 6 GiB KV flag
  qwen35_dflash_long[_eager]     the same at 131k with default concurrency

Each result (the tests below check the drafter cases among the given results, nothing for the
others): the KV audit lists every group, the drafter's layers named
in theirs, each within its own plan (ratio <= 1.000), the GDN state group present for the hybrid
(vLLM 0.32 keeps it in the pool: (1 + k) blocks per request, MambaSpec.num_speculative_blocks);
decode/verify steps of 1 + k tokens per request; the worst step built from real requests within
1.02 of the prediction (measured <= predicted). The 6 GiB flag is held: `wcprof check` on the
report accepts it. The generic checks (test_wcprof_gpu.py) run on these cases too."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from gpu_results import ROOT, report_of, worst_step_within_two_percent

DRAFTER = {"llama8b_eagle3": ("eagle3", 3), "llama8b_eagle3_eager": ("eagle3", 3),
           "qwen35_dflash": ("dflash", 8), "qwen35_dflash_eager": ("dflash", 8),
           "qwen35_dflash_long": ("dflash", 8), "qwen35_dflash_long_eager": ("dflash", 8)}
DRAFT_MODELS = {"eagle3": ROOT / "tests" / "gpu" / "models" / "llama-3.1-8b-eagle3",
                "dflash": ROOT / "tests" / "gpu" / "models" / "qwen35-dflash-5l"}
SIX_GIB = 6 << 30


@pytest.fixture
def drafter(case) -> tuple[str, dict] | None:
    """The drafter case among the results' cases (conftest parametrizes `case` over them);
    None for any other case, whose tests then check nothing here."""
    return (case["case"], case) if case["case"] in DRAFTER else None


def _spec(c: dict) -> dict:
    argv = c["cli_argv"]
    return json.loads(argv[argv.index("--speculative-config") + 1])


def test_drafter_case_started_first_time(drafter):
    if drafter is None:
        return
    name, c = drafter
    assert c["rc"] == 0, (name, c.get("log_tail", [])[-20:])
    assert c.get("first_start") is None, c.get("first_start")
    method, k = DRAFTER[name]
    spec = _spec(c)
    assert (spec["method"], spec["num_speculative_tokens"]) == (method, k)
    assert report_of(c)["config"]["num_speculative_tokens"] == k


def test_decode_and_verify_steps_carry_one_plus_k_tokens(drafter):
    if drafter is None:
        return
    name, c = drafter
    k = DRAFTER[name][1]
    decodes = [s["shape"] for s in report_of(c)["worstcase"]["steps"]
               if s["shape"]["kind"] == "decode"]
    assert decodes and all(s["rows"] == s["num_reqs"] * (1 + k) for s in decodes), decodes[:4]


def test_every_kv_group_within_its_plan_drafter_included(drafter):
    if drafter is None:
        return
    name, c = drafter
    method = DRAFTER[name][0]
    audit = report_of(c)["kv_audit"]
    assert audit is not None and audit["verdict"] == "ok", audit and audit["message"]
    assert audit["ratio"] <= 1.0, audit["message"]
    planned = [g for g in audit["groups"] if g["declared_bytes"] > 0]
    for g in planned:
        assert g["ratio"] is not None and g["ratio"] <= 1.0, g
        assert g["verdict"] == "ok", g
    draft_layers = json.loads((DRAFT_MODELS[method] / "config.json").read_text())[
        "num_hidden_layers"]
    assert sum(len(g["drafter_layers"]) for g in planned) == draft_layers, audit["message"]
    if method == "dflash":  # the hybrid: the GDN state group is audited beside attention
        names = [g["name"] for g in planned]
        assert any("Mamba" in n for n in names) and any("Attention" in n for n in names), names
    assert not any(g["name"] == "outside the plan" for g in audit["groups"]), audit["message"]


def test_worst_step_from_real_requests_within_two_percent(drafter):
    if drafter is None:
        return
    name, c = drafter
    worst_step_within_two_percent(name, report_of(c))


def test_seed_000_kv_flag_is_held(drafter, tmp_path):
    """qwen35_dflash[_eager]: --kv-cache-memory-bytes 6 GiB against the worst case: the engine
    started with it (admission fits, the explicit value recorded) and `wcprof check` on the
    report accepts it (exit 0)."""
    if drafter is None:
        return
    name, c = drafter
    if "--kv-cache-memory-bytes" not in c["cli_argv"]:
        return
    r = report_of(c)
    adm = r["admission"]
    assert adm["explicit_kv_cache_memory_bytes"] == SIX_GIB and adm["fits"] is True, adm
    path = tmp_path / "report.json"
    path.write_text(json.dumps(r))
    p = subprocess.run([sys.executable, "-m", "worstcase_profiler.cli", "check", str(path),
                        "--kv-cache-memory-bytes", str(SIX_GIB)], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
