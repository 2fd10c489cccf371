"""sweep_depth=self-check (auto's choice on CUDA) on a real (CPU) engine, against the adversary:
the deepdecode fixture (plugins/wcp_fixtures), whose layer 1 (the one the cut decoder drops)
allocates a transient on pure-decode steps of 3+ requests only. The cut-down sweep alone never
sees it; the self-check's decode sample does, and the full sweep runs and is admitted."""

from __future__ import annotations

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
    assert wc["sweep_mode"].startswith("full: the cut-down sweep's self-check failed")
    assert "cut-down self-check (1 of 2 layers)" in run.out
    print(f"deepdecode: cut-down alone admitted {proof['unsampled_admitted_bytes']} B, with "
          f"its samples {proof['cut_admitted_bytes']} B, full admitted {proof['full_admitted_bytes']} "
          f"B, deltas {proof['deltas']}, verdict {proof['verdict']!r}, "
          f"{proof['cut_seconds']} s cut + {proof['full_seconds']} s full")
