"""bench/startup_bench.py (issue 34's start-up benchmark): the order its starts run in, each
round on a sweep cache of its own, the family layouts it names, and the engine options merged
with the profiler's. Pure: nothing starts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import startup_bench  # noqa: E402


def test_rounds_interleave_every_mode_so_drift_hits_them_alike():
    order = startup_bench.start_order(["stock", "worstcase-cold", "worstcase-warm"], 3)
    assert [m for _, m in order] == ["stock", "worstcase-cold", "worstcase-warm"] * 3
    assert [r for r, _ in order] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert startup_bench.start_order(["stock"], 0) == [(0, "stock")]


def test_a_family_keeps_its_own_vllm_config_beside_the_profilers():
    fam = {"additional_config": {"gdn_prefill_backend": "triton"}, "max_num_seqs": 64}
    prof = {"worstcase_profiler": {"profiler": "worstcase"}}
    assert startup_bench.engine_kwargs(fam, prof) == {
        "max_num_seqs": 64, "additional_config": {"gdn_prefill_backend": "triton", **prof}}
    assert startup_bench.engine_kwargs(fam, None) == {
        "max_num_seqs": 64, "additional_config": {"gdn_prefill_backend": "triton"}}
    assert startup_bench.engine_kwargs({}, None) == {}


def test_the_five_families_are_the_issues_layouts_at_32_layers_or_more():
    """Issue 34: the 8B layout, a family the suite never ran, a GDN or Mamba hybrid, a sliding-
    window model, an MoE; 32+ layers each, and vocabularies of 128k+ (DEVELOPERS.md)."""
    cfgs = {n: json.loads((d / "config.json").read_text())
            for n, (d, _) in startup_bench.FAMILIES.items()}
    assert len(cfgs) == 5
    for name, c in cfgs.items():
        assert c["num_hidden_layers"] >= 32 and c["vocab_size"] >= 128_000, name
        assert c.get("max_position_embeddings", 0) >= 131072, name  # the bench's default context
        if "layer_types" in c:
            assert len(c["layer_types"]) == c["num_hidden_layers"], name
    kinds = {n: set(c.get("layer_types", ())) for n, c in cfgs.items()}
    assert any("linear_attention" in k for k in kinds.values())           # GDN hybrid
    assert any("sliding_attention" in k for k in kinds.values())          # sliding window
    assert any(c.get("num_experts", 0) > 1 for c in cfgs.values())        # MoE
    archs = {c["architectures"][0] for c in cfgs.values()}
    assert "LlamaForCausalLM" in archs, archs
    # a family whose architecture no GPU suite case runs (the suite names its models' folders)
    suite = (ROOT / "bench" / "gpu_suite.py").read_text()
    suite_archs = {json.loads(p.read_text())["architectures"][0]
                   for p in (ROOT / "tests" / "gpu" / "models").glob("*/config.json")
                   if p.parent.name in suite}
    assert archs - suite_archs, (archs, suite_archs)
