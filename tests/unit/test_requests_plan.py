"""Plans of real requests that reach a given step (core/requests_plan.py): the measured batch
holds exactly the step's rows and requests, on the longest context a real request can have, and
no request outgrows max_model_len."""

from __future__ import annotations

import pytest

from worstcase_profiler.core.requests_plan import plan_for, token_ids
from worstcase_profiler.core.shapes import Limits, decode_batch, mixed_step, prefill_chunk, split_prefills
from worstcase_profiler.core.types import Shape

LIMITS = Limits(max_model_len=4096, max_num_batched_tokens=512, max_num_seqs=8, block_size=16)


def _measured(plan):
    return [b for b in plan.batches if b.measured]


@pytest.mark.parametrize("caching", [True, False])
@pytest.mark.parametrize("shape", [prefill_chunk(LIMITS, 512), prefill_chunk(LIMITS, 300),
                                   prefill_chunk(LIMITS, 1), decode_batch(LIMITS),
                                   mixed_step(LIMITS), *split_prefills(LIMITS, 512),
                                   Shape("stock", 512, 0, 8)])
def test_no_request_outgrows_max_model_len(shape, caching):
    plan = plan_for(shape, LIMITS, prefix_caching=caching)
    for batch in plan.batches:
        for p in batch.prompts:
            assert p.length + batch.max_tokens <= LIMITS.max_model_len
    assert _measured(plan), plan
    assert plan.exact or plan.note


def test_a_prefill_chunk_on_a_cached_prefix_is_the_shape_block_aligned():
    shape = prefill_chunk(LIMITS, 512)  # 512 rows on 3584 cached tokens
    plan = plan_for(shape, LIMITS, prefix_caching=True)
    warm, measured = plan.batches
    assert not warm.measured and warm.prompts[0].prefix_len == plan.target.context_len
    assert [p.suffix_len for p in measured.prompts] == [512]
    assert all(p.prefix_id == warm.prompts[0].prefix_id for p in measured.prompts)
    assert plan.target.context_len % LIMITS.block_size == 0
    assert shape.context_len - 2 * LIMITS.block_size < plan.target.context_len <= shape.context_len
    assert plan.exact  # within a block of the sweep's context (a prompt stops at max_model_len - 1)
    assert plan.target.rows == shape.rows and plan.target.num_reqs == 1


def test_a_wide_prefill_puts_every_request_in_one_step():
    shape = split_prefills(LIMITS, 512)[-1]  # 512 rows over 8 requests
    plan = plan_for(shape, LIMITS, prefix_caching=True)
    (measured,) = _measured(plan)
    assert len(measured.prompts) == shape.num_reqs == 8
    assert sum(p.suffix_len for p in measured.prompts) == 512 <= LIMITS.max_num_batched_tokens
    assert plan.exact


def test_without_prefix_caching_one_request_lines_its_chunks_up():
    shape = prefill_chunk(LIMITS, 512)
    plan = plan_for(shape, LIMITS, prefix_caching=False)
    (measured,) = _measured(plan)
    (prompt,) = measured.prompts
    assert plan.target.context_len % LIMITS.max_num_batched_tokens == 0
    assert prompt.length == plan.target.context_len + 512


def test_several_long_requests_without_prefix_caching_say_why_not_exact():
    plan = plan_for(split_prefills(LIMITS, 512)[0], LIMITS, prefix_caching=False)
    assert not plan.exact and "prefix caching" in plan.note


def test_a_decode_batch_decodes_together_on_a_shared_long_prefix():
    shape = decode_batch(LIMITS)
    plan = plan_for(shape, LIMITS, prefix_caching=True)
    (measured,) = _measured(plan)
    assert len(measured.prompts) == shape.num_reqs
    assert plan.target.context_len >= LIMITS.max_model_len - 3
    # the tails are prefilled before the decode steps run out, even over several chunks
    wide = Limits(max_model_len=2048, max_num_batched_tokens=256, max_num_seqs=4, block_size=128)
    plan = plan_for(decode_batch(wide), wide, prefix_caching=True)
    (measured,) = _measured(plan)
    tails = sum(p.suffix_len for p in measured.prompts)
    assert measured.max_tokens - 1 > -(-tails // wide.max_num_batched_tokens)
    assert all(p.length + measured.max_tokens == wide.max_model_len - 1 for p in measured.prompts)


def test_token_ids_share_exactly_the_prefix():
    from worstcase_profiler.core.requests_plan import Prompt

    a, b = token_ids(Prompt(1, 64, 5), 32000, 1), token_ids(Prompt(1, 64, 5), 32000, 2)
    assert a[:64] == b[:64] and a[64:] != b[64:]
    assert all(0 < t < 32000 for t in a)
