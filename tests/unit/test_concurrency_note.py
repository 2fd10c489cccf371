"""The report says when the KV pool holds fewer requests at once than max_num_seqs: each request
holds a block in every KV group, and a Mamba group's 1 + k state blocks under speculative
decoding (seed 000: 6 GiB at k=8 ran 26 of 32 sequences at once on the H200, h200-run35)."""

from __future__ import annotations

from types import SimpleNamespace as NS

from worstcase_profiler.adapter.kv import request_floor
from worstcase_profiler.core.audits import concurrency_note


def _group(kind: str, spec_blocks: int = 0, host: bool = False):
    spec = type(kind, (), {"num_speculative_blocks": spec_blocks})()
    return NS(kv_cache_spec=spec, host_resident=host)


def test_a_recurrent_state_per_speculative_token_caps_the_requests_at_once():
    cfg = NS(num_blocks=270, kv_cache_groups=[_group("MambaSpec", 8), _group("FullAttentionSpec")])
    floor = request_floor(cfg)
    assert floor == {"pool_blocks": 270, "request_blocks": 10, "state_blocks": 8}
    note = concurrency_note(**floor, max_num_seqs=32)
    assert note is not None and "at most 26 request(s)" in note and "max_num_seqs=32" in note
    assert concurrency_note(**floor, max_num_seqs=26) is None  # the limit already says it


def test_groups_each_take_a_block_and_a_host_pool_takes_none():
    cfg = NS(num_blocks=9, kv_cache_groups=[_group("FullAttentionSpec"), _group("SlidingWindowSpec"),
                                            _group("FullAttentionSpec", host=True)])
    floor = request_floor(cfg)
    assert floor["request_blocks"] == 2 and floor["state_blocks"] == 0  # no Mamba: no state
    assert "at most 4 request(s)" in concurrency_note(**floor, max_num_seqs=8)
    assert concurrency_note(**floor, max_num_seqs=4) is None


def test_a_large_pool_says_nothing():
    assert concurrency_note(pool_blocks=100_000, request_blocks=1, state_blocks=0,
                            max_num_seqs=1024) is None
    assert concurrency_note(pool_blocks=1, request_blocks=1, state_blocks=0, max_num_seqs=4) is None
