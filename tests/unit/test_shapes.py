"""The step plan is a pure function of the limits and never exceeds what the scheduler allows."""

from __future__ import annotations

import pytest

from worstcase_profiler.errors import ConfigError
from worstcase_profiler.core.types import Shape
from worstcase_profiler.core.shapes import (
    Limits, context_ladder, decode_batch, extra_steps, mixed_pair, mixed_step, plan_fingerprint,
    prefill_chunk, split_prefills,
    request_layout, stock_shape)

LIMITS = Limits(max_model_len=4096, max_num_batched_tokens=8192, max_num_seqs=256)


def assert_within_limits(limits: Limits, shape: Shape) -> None:
    layout = request_layout(limits, shape)
    assert len(layout) == shape.num_reqs
    assert sum(q for q, _ in layout) == shape.rows
    assert shape.rows <= limits.max_num_batched_tokens
    for query_len, context_len in layout:
        assert query_len >= 1 and context_len >= 0
        assert query_len + context_len <= limits.max_model_len


@pytest.mark.parametrize("field,value", [
    ("max_model_len", 0), ("max_num_batched_tokens", -1), ("max_num_seqs", 0),
    ("num_speculative_tokens", -1), ("block_size", 0), ("kv_capacity_tokens", 0),
    ("max_model_len", 4096.0), ("max_num_seqs", True)])
def test_limits_validation(field, value):
    kwargs = dict(max_model_len=4096, max_num_batched_tokens=8192, max_num_seqs=256)
    kwargs[field] = value
    with pytest.raises(ConfigError) as err:
        Limits(**kwargs)
    assert field in str(err.value) and err.value.hint


def test_limits_accept_zero_speculative_tokens_and_unknown_capacity():
    limits = Limits(4096, 8192, 256, num_speculative_tokens=0, kv_capacity_tokens=None)
    assert limits.max_resident_requests is None
    assert limits.rows_per_decode == 1


def test_prefill_chunk_sits_on_a_full_length_context():
    shape = prefill_chunk(LIMITS, 1000)
    assert shape == Shape(kind="prefill", rows=1000, context_len=3096, num_reqs=1)
    assert prefill_chunk(LIMITS, 4096) == Shape(kind="prefill", rows=4096, context_len=0)
    assert_within_limits(LIMITS, shape)


@pytest.mark.parametrize("rows", [4097, 8191, 8192, 5000])
def test_prefill_beyond_max_model_len_splits_into_full_extent_requests(rows):
    shape = prefill_chunk(LIMITS, rows)
    assert shape.num_reqs == 2
    assert_within_limits(LIMITS, shape)
    largest = max(q for q, _ in request_layout(LIMITS, shape))
    assert largest + shape.context_len == LIMITS.max_model_len


def test_prefill_rows_out_of_range():
    with pytest.raises(ValueError):
        prefill_chunk(LIMITS, 0)
    with pytest.raises(ValueError):
        prefill_chunk(LIMITS, 8193)


def test_decode_batch_limited_by_each_limit():
    assert decode_batch(LIMITS) == Shape(kind="decode", rows=256, context_len=4095, num_reqs=256)
    by_tokens = Limits(4096, 100, 256)
    assert decode_batch(by_tokens).num_reqs == 100
    spec = Limits(4096, 8192, 256, num_speculative_tokens=3)
    assert decode_batch(spec) == Shape(kind="decode", rows=1024, context_len=4092, num_reqs=256)
    spec_tokens = Limits(4096, 500, 256, num_speculative_tokens=3)
    assert decode_batch(spec_tokens).num_reqs == 125
    by_kv = Limits(4096, 8192, 256, kv_capacity_tokens=10 * 4096 + 100)
    assert decode_batch(by_kv).num_reqs == 10
    tiny_kv = Limits(4096, 8192, 256, kv_capacity_tokens=16)
    assert decode_batch(tiny_kv).num_reqs == 1  # at least one
    for limits in (LIMITS, by_tokens, spec, spec_tokens, by_kv):
        assert_within_limits(limits, decode_batch(limits))


def test_kv_capacity_counts_whole_blocks():
    odd = Limits(max_model_len=1000, max_num_batched_tokens=8192, max_num_seqs=256,
                 block_size=16, kv_capacity_tokens=3 * 1000)
    assert odd.tokens_per_full_request == 1008
    assert decode_batch(odd).num_reqs == 2


def test_mixed_step_fills_the_token_budget():
    shape = mixed_step(LIMITS)
    assert shape is not None and shape.kind == "mixed"
    assert shape.num_reqs == 256
    layout = request_layout(LIMITS, shape)
    assert layout[:-1] == [(1, 4095)] * 255
    prefill_rows, prefill_ctx = layout[-1]
    assert prefill_rows == 4096 and prefill_ctx == 0  # 8192 - 255 capped at max_model_len
    assert_within_limits(LIMITS, shape)

    small = Limits(max_model_len=32768, max_num_batched_tokens=2048, max_num_seqs=64)
    shape = mixed_step(small)
    assert shape.rows == 2048 and shape.num_reqs == 64
    assert request_layout(small, shape)[-1] == (2048 - 63, 32768 - (2048 - 63))
    assert_within_limits(small, shape)


def test_mixed_step_with_speculative_decoding():
    limits = Limits(max_model_len=32768, max_num_batched_tokens=2048, max_num_seqs=64,
                    num_speculative_tokens=2)
    shape = mixed_step(limits)
    layout = request_layout(limits, shape)
    assert layout[:-1] == [(3, 32765)] * 63
    assert layout[-1][0] == 2048 - 63 * 3
    assert_within_limits(limits, shape)


def test_mixed_step_none_when_it_would_be_a_pure_shape():
    assert mixed_step(Limits(4096, 8192, max_num_seqs=1)) is None  # no room for a decode
    assert mixed_step(Limits(4096, 256, max_num_seqs=256)) is None  # prefill part is 1 row
    assert mixed_step(Limits(4096, 8192, 256, kv_capacity_tokens=4096)) is None
    limited = mixed_step(Limits(4096, 8192, 256, kv_capacity_tokens=3 * 4096))
    assert limited is not None and limited.num_reqs == 3


def test_mixed_pair_puts_one_decode_beside_the_largest_chunk():
    small = Limits(max_model_len=32768, max_num_batched_tokens=2048, max_num_seqs=64,
                   num_speculative_tokens=2)
    pair = mixed_pair(small)
    assert pair is not None and pair.kind == "mixed" and pair.num_reqs == 2
    assert request_layout(small, pair) == [(3, 32765), (2045, 32768 - 2045)]
    assert pair.rows == small.max_num_batched_tokens
    # mixed_step's chunk is shortened by every decode; the pair's is the largest a decode leaves
    assert request_layout(small, mixed_step(small))[-1][0] < 2045
    assert_within_limits(small, pair)
    # capped at max_model_len like the chunk itself
    assert request_layout(LIMITS, mixed_pair(LIMITS))[-1] == (4096, 0)


def test_mixed_pair_none_where_mixed_step_is_it_or_absent():
    assert mixed_pair(Limits(4096, 8192, max_num_seqs=1)) is None
    two = Limits(32768, 2048, max_num_seqs=2)
    assert mixed_step(two).num_reqs == 2 and mixed_pair(two) is None
    assert mixed_pair(Limits(4096, 8192, 256, kv_capacity_tokens=4096)) is None


def test_mixed_pair_where_the_decodes_take_the_whole_budget():
    """With k=8 drafts and a 8,192-token budget the decodes leave mixed_step no chunk, but one
    decode beside a long prompt's chunk is still a step real traffic forms."""
    drafts = Limits(max_model_len=131072, max_num_batched_tokens=8192, max_num_seqs=1024,
                    num_speculative_tokens=8)
    assert mixed_step(drafts) is None
    pair = mixed_pair(drafts)
    assert pair is not None and request_layout(drafts, pair) == [(9, 131063), (8183, 131072 - 8183)]
    assert_within_limits(drafts, pair)


def test_extra_steps_hold_both_mixed_steps_once():
    small = Limits(max_model_len=32768, max_num_batched_tokens=2048, max_num_seqs=64)
    extra = extra_steps(small, 2048)
    assert mixed_step(small) in extra and mixed_pair(small) in extra
    assert decode_batch(small) in extra and None not in extra
    assert all(s in extra for s in split_prefills(small, 2048))


def test_context_ladder():
    # the coarse rungs, and one token past each power of two of the KV length read (1,025 and
    # 2,049 tokens for a 1,000-row chunk)
    assert context_ladder(LIMITS, 1000) == [0, 25, 512, 1024, 1049, 2048, 3096]
    assert context_ladder(LIMITS, 3500) == [0, 512, 596]
    assert context_ladder(LIMITS, 4096) == [0]
    assert context_ladder(LIMITS, 1) == [0, 512, 1024, 2048, 4095]
    # a chunk spread over two requests tops out at the split chunk's own context
    assert context_ladder(LIMITS, 8000) == [0, 96]


def test_the_ladder_reads_just_past_each_power_of_two_of_the_kv_length():
    """A 131k engine's worst chunk (8,192 rows) is re-run where it reads 2^14 + 1, 2^15 + 1 and
    2^16 + 1 tokens: a 131k DSv3.2 engine's traffic set its mark with a chunk reading 32,772,
    above every coarse rung (h200-run53)."""
    big = Limits(max_model_len=131072, max_num_batched_tokens=8192, max_num_seqs=1024)
    ladder = context_ladder(big, 8192)
    assert [c + 8192 for c in ladder if c not in (0, 16384, 32768, 65536, 122880)] == \
        [2 ** 14 + 1, 2 ** 15 + 1, 2 ** 16 + 1]
    assert max(ladder) == prefill_chunk(big, 8192).context_len  # never past the chunk's own


def test_stock_shape_matches_vllm_profile_run():
    assert stock_shape(LIMITS) == Shape(kind="stock", rows=8192, context_len=0, num_reqs=256)
    layout = request_layout(LIMITS, stock_shape(LIMITS))
    assert sum(q for q, _ in layout) == 8192 and {q for q, _ in layout} == {32}


def test_plan_fingerprint_is_stable_and_order_sensitive():
    plan = [prefill_chunk(LIMITS, r) for r in (1, 64, 8192)] + [decode_batch(LIMITS)]
    same = [prefill_chunk(LIMITS, r) for r in (1, 64, 8192)] + [decode_batch(LIMITS)]
    fp = plan_fingerprint(plan)
    assert len(fp) == 16 and int(fp, 16) >= 0
    assert fp == plan_fingerprint(same) == plan_fingerprint(iter(same))
    assert fp != plan_fingerprint(list(reversed(plan)))
    assert fp != plan_fingerprint(plan[:-1])
    assert plan_fingerprint([]) == plan_fingerprint(())


def test_prefix_caching_lets_requests_share_a_full_length_prefix():
    """Seed 002's traffic: many requests hit one cached prefix. The pool holds that prefix once
    plus a block per request, so every request sits at the full extent — the capacity bound
    that holds without prefix caching would under-estimate these steps."""
    cap = 2 * 4096  # two private full-length requests, or one shared prefix + 256 own blocks
    private = Limits(4096, 8192, 256, kv_capacity_tokens=cap)
    shared = Limits(4096, 8192, 256, kv_capacity_tokens=cap, prefix_caching=True)
    assert private.max_resident_requests == 2
    assert shared.max_resident_requests == 4096 // 16 + 1
    assert decode_batch(private).num_reqs == 2
    assert decode_batch(shared) == Shape(kind="decode", rows=256, context_len=4095, num_reqs=256)
    assert [s.context_len for s in split_prefills(shared, 8192)][-1] == 4096 - 8192 // 256
    assert all(s.context_len + -(-s.rows // s.num_reqs) == 4096 for s in split_prefills(shared, 8192))
    assert max(s.context_len for s in split_prefills(private, 8192)[2:]) < 4096 // 2
    assert mixed_step(shared).num_reqs == 256
    # a pool that cannot hold even the shared prefix plus the requests still bounds them
    tight = Limits(4096, 8192, 256, kv_capacity_tokens=4096 + 16 * 3, prefix_caching=True)
    assert tight.max_resident_requests == 4
    assert decode_batch(tight).num_reqs == 4


def test_requests_owning_more_than_a_block_fit_fewer_at_once_and_that_count_is_swept():
    # Qwen3.5 hybrid on the H200 (run 20): 7,332 pool blocks of 784 tokens; in align mode each
    # request on the shared prefix owns a cached last block and a new one in each of 4 groups
    from worstcase_profiler.core.shapes import Limits, split_prefills
    base = dict(max_model_len=131072, max_num_batched_tokens=8192, max_num_seqs=1024,
                block_size=784, kv_capacity_tokens=7332 * 784, prefix_caching=True)
    one_block = Limits(**base)
    own = Limits(**base, prefix_request_tokens=8 * 784)
    assert one_block.max_resident_requests >= 1024
    assert own.max_distinct_hit_requests == (7332 * 784 - 168 * 784) // (8 * 784) + 1 == 896
    # decoding siblings hold a block per group at most: decode and mixed keep the one-block floor
    assert own.max_resident_requests == one_block.max_resident_requests
    full = [s for s in split_prefills(own, 8192) if s.context_len > 130000]
    assert 896 in [s.num_reqs for s in full]  # the most that sit at full extent at once
    # more than that stay planned at full extent too: an over-estimate, the safe direction
    assert 1024 in [s.num_reqs for s in full]
    assert [s.num_reqs for s in split_prefills(one_block, 8192)][-1] == 1024


# --- each scheduled request's drafting slots (Limits.draft_slots) ------------------------------
# vLLM's scheduler charges a request it schedules num_new_tokens + max_num_new_slots_for_drafting
# of max_num_batched_tokens (DFlash k, DSpark k - 1). On the H200 (h200-run41) the DFlash k=8
# 131k case's fresh prefill batch was planned as 8,192 rows over 228 requests; the scheduler
# formed 6,696 rows over 186 (186 x (36 + 8) = 8,184 <= 8,192 < 187 x 44), measured 0.780 of it.

def _dflash(**kw) -> Limits:
    base = dict(max_model_len=131072, max_num_batched_tokens=8192, max_num_seqs=1024,
                num_speculative_tokens=8, draft_slots=8, block_size=832,
                kv_capacity_tokens=2284 * 832, state_request_tokens=9 * 832,
                stock_reruns_with_kv=False)
    base.update(kw)
    return Limits(**base)


def test_a_prefill_step_of_n_requests_holds_the_budget_less_their_drafting_slots():
    from worstcase_profiler.core.shapes import fresh_prefill_batch

    lim = _dflash()
    fresh = fresh_prefill_batch(lim)
    assert (fresh.rows, fresh.context_len, fresh.num_reqs) == (8192 - 228 * 8, 0, 228)
    for shape in [fresh, *split_prefills(lim, 8192)]:
        assert_within_limits(lim, shape)
        assert shape.rows + shape.num_reqs * lim.draft_slots <= lim.max_num_batched_tokens, shape
    # the one-request chunk keeps the full budget: it measures the drafter at it (V1)
    assert prefill_chunk(lim, 8192).rows == 8192


def test_decode_and_mixed_steps_keep_counting_one_plus_k_rows_a_request():
    # a verifying request may carry fewer than k drafts (the step's last, structured output)
    # and is charged less: more of them fit than 1 + k + slots allows, so the decode batch keeps
    # max_num_batched_tokens // (1 + k) requests (an over-estimate where all verify k drafts)
    lim = _dflash(kv_capacity_tokens=None, state_request_tokens=0)
    assert decode_batch(lim).num_reqs == 8192 // 9
    plain = _dflash(kv_capacity_tokens=None, state_request_tokens=0, draft_slots=0)
    assert mixed_step(lim) == mixed_step(plain) and decode_batch(lim) == decode_batch(plain)


def test_the_chunk_caps_capped_steps_are_planned_without_drafting_slots():
    # under the cap the engine keeps its own chunk, whose budget the slots come out of: a capped
    # step of r rows over n requests is formable while r + n * slots <= the engine's chunk
    from worstcase_profiler.core.advise import candidate_limits
    from worstcase_profiler.core.chunk_cap import capped_family

    lim = _dflash()
    engine_with_512 = candidate_limits(lim, 512)  # the advisor's engine started with 512
    capped_at_512 = candidate_limits(capped_family(lim), 512)  # 512 under the 8,192 chunk
    assert engine_with_512.rows_for(8) == 512 - 8 * 8
    assert capped_at_512.rows_for(8) == 512
    assert [s.rows for s in split_prefills(capped_at_512, 512)] == [512] * len(
        split_prefills(capped_at_512, 512))


def test_without_drafting_slots_every_shape_is_as_before():
    plain = _dflash(draft_slots=0, num_speculative_tokens=3)
    assert plain.rows_for(228) == 8192
    assert fresh_prefill_batch_rows(plain) == 8192


def fresh_prefill_batch_rows(lim):
    from worstcase_profiler.core.shapes import fresh_prefill_batch

    return fresh_prefill_batch(lim).rows


def test_a_split_prefill_of_seed_002s_drafter_is_the_rows_the_scheduler_formed():
    # DSpark k=3 (2 slots a request), 4,096-token chunks: h200-run39's replay formed 4,092 rows
    # over 2 requests where the plan said 4,096
    lim = Limits(max_model_len=262144, max_num_batched_tokens=4096, max_num_seqs=4,
                 num_speculative_tokens=3, draft_slots=2, block_size=256)
    assert [(s.rows, s.num_reqs) for s in split_prefills(lim, 4096)] == [(4092, 2), (4088, 4)]
