"""sweep_depth=self-check (auto's choice on CUDA) on a real (CPU) engine, against the adversary:
the deepdecode fixture (plugins/wcp_fixtures), whose layer 1 (the one the cut decoder drops)
allocates a transient on pure-decode steps of 3+ requests only. The cut-down sweep alone never
sees it; the self-check's decode sample does, and the full sweep runs and is admitted. Also: a
compiled 32-layer decoder self-checked, a compiled 32-layer GDN + MoE hybrid self-checked on its
first layer of each kind, and a sliding-window decoder cut to its first layer of each kind (not a
prefix) and proven against the full sweep."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_wcprof

wcp_fixtures = pytest.importorskip("wcp_fixtures")

pytestmark = pytest.mark.engine

MiB = 1 << 20
ARGS = ["--load-format", "dummy", "--skip-tokenizer-init", "--enforce-eager",
        "--gpu-memory-utilization", "0.25", "--max-model-len", "2048",
        "--max-num-batched-tokens", "256", "--max-num-seqs", "4", "--sweep-depth", "self-check"]


def test_the_self_check_catches_a_deep_layer_that_sets_the_decode_peak(tmp_path):
    cfg_dir = wcp_fixtures.model_dir("deepdecode")
    run = run_wcprof(["--model", str(cfg_dir), *ARGS], tmp_path)
    assert run.rc == 0, run.text[-3000:]
    wc = run.report["worstcase"]
    proof = wc["cut_down_proof"]
    assert proof["method"] == "self-check" and proof["depth"] == "1 of 2 layers", proof
    assert proof["fell_back"] and proof["verdict"] != "proven", proof
    assert "sampled decode step gained" in proof["verdict"], proof
    # the decode sample gained the deep layer's transient (at least 3 requests' KV at 4 KiB a
    # token: the widest decode batch the pool holds), far beyond the meter's resolution
    assert proof["deltas"]["decode"] > 8 * MiB, proof
    assert any(s["kind"] == "decode" for s in proof["sampled"]), proof
    # the admitted figure is the full sweep's, whose worst is a decode step
    assert wc["peak_activation_bytes"] == proof["full_admitted_bytes"]
    assert proof["full_worst"]["kind"] == "decode"
    # the cut-down sweep alone (before its samples) would have admitted far less: the adversary
    assert proof["full_admitted_bytes"] > proof["unsampled_admitted_bytes"] + 8 * MiB, proof
    # where the sweeps' time went, on a real engine (eager: no re-reads; fell back: the full
    # sweep's own seconds beside the cut-down sweep's parts)
    split = proof["seconds_split"]
    assert set(split) == {"cut_decoder", "full_model", "full_sweep"}, split
    assert min(split.values()) > 0 and split["full_sweep"] == proof["full_seconds"], split
    assert abs(split["cut_decoder"] + split["full_model"] - proof["cut_seconds"]) < 0.01, split
    assert wc["sweep_mode"].startswith("full: the cut-down sweep's self-check failed")
    assert "cut-down self-check (1 of 2 layers)" in run.out
    print(f"deepdecode: cut-down alone admitted {proof['unsampled_admitted_bytes']} B, with "
          f"its samples {proof['cut_admitted_bytes']} B, full admitted {proof['full_admitted_bytes']} "
          f"B, deltas {proof['deltas']}, verdict {proof['verdict']!r}, "
          f"{proof['cut_seconds']} s cut + {proof['full_seconds']} s full")


def _compiled_self_check(model: Path, overrides: dict, tmp_path: Path, depth: str, *extra: str):
    """(run, its worstcase report, its cut-down proof): `wcprof` under sweep_depth=self-check on
    a compiled forward (no --enforce-eager) of `model` with `overrides`, the proof a self-check
    on the cut named `depth`."""
    run = run_wcprof(["--model", str(model), "--load-format", "dummy", "--skip-tokenizer-init",
                      "--hf-overrides", json.dumps(overrides), "--max-model-len", "4096",
                      "--max-num-batched-tokens", "512", "--max-num-seqs", "8",
                      "--kv-cache-memory-bytes", str(256 * MiB), "--sweep-depth", "self-check",
                      *extra], tmp_path, timeout=900)
    assert run.rc == 0, run.text[-3000:]
    assert run.report["config"]["enforce_eager"] is False
    wc = run.report["worstcase"]
    proof = wc["cut_down_proof"]
    assert proof["method"] == "self-check", proof
    assert proof["depth"] == depth, proof
    return run, wc, proof


def test_a_compiled_32_layer_decoder_is_self_checked_and_its_worst_step_validated(tmp_path):
    """sweep_depth=self-check on a compiled forward (no --enforce-eager), 32 layers, on a real
    engine (auto's choice on CUDA for any compiled family): the cut steps run eagerly on 1 of
    32 layers, the confirmations on the full model both compiled and eagerly (the difference
    split into depth and compiling: sweep_depth.depth_difference), and the admitted figure holds
    the worst step built from real requests. The mechanism on a real engine; the argument is
    docs/sweep.md's, the adversary tests/unit/test_sweep.py's."""
    from conftest import TINY, within_prediction

    run, wc, proof = _compiled_self_check(TINY, {"num_hidden_layers": 32}, tmp_path,
                                          "1 of 32 layers, run eagerly", "--validate")
    # the stock step and the worst shapes were read on the full (compiled) model: every class
    # the cut-down sweep ran has a full-model difference, a confirmation's or a sample's
    ran = {s["shape"]["kind"] for s in wc["steps"]} - {"stock"}
    assert {"stock", *ran} <= set(proof["deltas"]), (ran, proof)
    assert "1 of 32 layers, run eagerly" in wc["sweep_mode"], wc["sweep_mode"]
    assert "read eagerly as well" in wc["sweep_mode"], wc["sweep_mode"]
    assert all(d >= 0 for d in proof["deltas"].values()), proof  # split: each part from 0
    v = run.report["validation"]
    assert within_prediction(v), v
    print(f"compiled 32 layers: {proof['verdict']}, deltas {proof['deltas']}, sampled "
          f"{proof['sampled']}, admitted {wc['peak_activation_bytes']} B; validation "
          f"{v['measured_peak_bytes']} of {v['predicted_peak_bytes']} B at {v['shape']}")


def test_a_compiled_32_layer_gdn_moe_hybrid_is_self_checked_on_its_first_layer_of_each_kind(
        tmp_path):
    """The compiled self-check on a hybrid (h200-run86 ran it on dense layouts only; the Qwen3.5
    hybrid with graphs has not run on a GPU): tests/models/qwen3next-tiny-mtp (GDN + MoE, three
    linear-attention layers to each full one) at 32 layers, compiled (no --enforce-eager).
    The cut keeps the first layer of each kind, (0, 3), run eagerly; the full model is read
    both ways; the graphs vLLM compiles by batch size are read and sampled; the KV pool the
    admission sized holds every group's plan (the recurrent state counted)."""
    hybrid = Path(__file__).resolve().parents[1] / "models" / "qwen3next-tiny-mtp"
    types = (["linear_attention"] * 3 + ["full_attention"]) * 8
    run, wc, proof = _compiled_self_check(
        hybrid, {"num_hidden_layers": 32, "layer_types": types}, tmp_path,
        "2 of 32 layers (0, 3), run eagerly")
    assert proof["verdict"] == "proven", proof  # else the full sweep ran and the mode says so
    assert proof["sampled"], proof  # the classes no confirmation covered, read on the full model
    assert "read eagerly as well" in wc["sweep_mode"], wc["sweep_mode"]
    assert "graph(s) vLLM compiles by batch size" in wc["sweep_mode"], wc["sweep_mode"]
    assert all(d >= 0 for d in proof["deltas"].values()), proof  # split: each part from 0
    assert wc["peak_activation_bytes"] >= proof["confirmed_peak_bytes"], proof
    assert run.report["kv_audit"]["verdict"] == "ok", run.report["kv_audit"]
    print(f"compiled GDN+MoE hybrid, 32 layers: {proof['verdict']}, deltas {proof['deltas']}, "
          f"admitted {wc['peak_activation_bytes']} B, {proof['cut_seconds']} s")


GEMMA_SWA = ["--load-format", "dummy", "--skip-tokenizer-init", "--enforce-eager",
             "--max-model-len", "4096", "--max-num-batched-tokens", "256", "--max-num-seqs", "64",
             "--no-enable-prefix-caching", "--kv-cache-memory-bytes", str(16 * MiB)]


def test_a_sliding_window_decoder_is_cut_to_its_first_layer_of_each_kind(tmp_path):
    """tests/models/gemma3-tiny-swa (five sliding-window layers, then one global): the cut keeps
    layers 0 and 5 alone (the shortest prefix holding both kinds was all six, so it could not be
    cut at all before), the decoder's loop runs just those two, and on a real engine the
    cut-down sweep admits what the full sweep admits within the meter's resolution
    (`--sweep-depth prove` runs both on one engine and admits the full one)."""
    model = Path(__file__).resolve().parents[1] / "models" / "gemma3-tiny-swa"
    run = run_wcprof(["--model", str(model), *GEMMA_SWA, "--sweep-depth", "prove"], tmp_path)
    assert run.rc == 0, run.text[-3000:]
    wc = run.report["worstcase"]
    proof = wc["cut_down_proof"]
    assert proof["depth"] == "2 of 6 layers (0, 5)", proof
    assert proof["verdict"] == "proven", proof
    assert wc["sweep_mode"].startswith("full; cut-down beside it (2 of 6 layers (0, 5))")
    print(f"gemma3-tiny-swa: cut-down admitted {proof['cut_admitted_bytes']} B in "
          f"{proof['cut_seconds']} s, full {proof['full_admitted_bytes']} B in "
          f"{proof['full_seconds']} s, deltas {proof['deltas']}")


def test_an_unchecked_cut_down_of_a_family_no_proof_covers_cuts_to_each_kind(tmp_path):
    """sweep_depth=cut-down checks nothing and rests on its family's proof, cutting where that
    proof cut (sweep_depth.proven_cut: proven.json records it). Gemma 3 has no proof, so the
    cut is the self-check's, the first layer of each kind: 2 of the tiny layout's 6, where its
    shortest prefix holding every kind would be all 6 (the cut the committed proofs ran)."""
    model = Path(__file__).resolve().parents[1] / "models" / "gemma3-tiny-swa"
    run = run_wcprof(["--model", str(model), *GEMMA_SWA, "--sweep-depth", "cut-down"], tmp_path)
    assert run.rc == 0, run.text[-3000:]
    mode = run.report["worstcase"]["sweep_mode"]
    assert mode.startswith("cut-down: every shape on 2 of 6 layers (0, 5)"), mode
