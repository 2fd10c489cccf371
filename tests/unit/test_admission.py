"""Admission arithmetic with round numbers, so every expectation can be checked by hand."""

from __future__ import annotations

import pytest

from worstcase_profiler.core.admission import (
    bytes_for_one_request, compute_admission, decide_budget, kv_tokens, least_kv_cache_bytes,
    stock_oom_context_len, usable_kv_bytes)

GiB = 1024**3
MiB = 1024**2
BPT = 32 * 1024  # bytes per token
BLOCK = 16
BLOCK_BYTES = BPT * BLOCK  # 512 KiB


def admission(**overrides):
    """compute_admission with round numbers; worst_peak/stock_peak name the transient and the
    stock step's need, and stock_kv defaults to what stock's own arithmetic gives (vLLM's
    figure: requested - consumed - stock need - cudagraphs, never negative)."""
    args = dict(requested=20 * GiB, consumed=4 * GiB, weights=3 * GiB, non_torch=GiB // 2,
                worst_peak=3 * GiB, stock_peak=2 * GiB, cudagraph=0, margin=GiB // 2,
                bytes_per_token=BPT, block_size=BLOCK, max_model_len=4096)
    args.update(overrides)
    args["worst_transient"] = args.pop("worst_peak")
    args["stock_need"] = args.pop("stock_peak")
    args.setdefault("stock_kv", max(0, args["requested"] - args["consumed"] - args["stock_need"]
                                    - args["cudagraph"]))
    return compute_admission(**args)


def test_kv_tokens_counts_whole_blocks():
    assert kv_tokens(BLOCK_BYTES * 10, BPT, BLOCK) == 160
    assert kv_tokens(BLOCK_BYTES * 10 + BLOCK_BYTES - 1, BPT, BLOCK) == 160
    assert kv_tokens(BLOCK_BYTES - 1, BPT, BLOCK) == 0
    assert kv_tokens(0, BPT, BLOCK) == 0
    assert kv_tokens(-5 * GiB, BPT, BLOCK) == 0
    assert kv_tokens(GiB, 0, BLOCK) == 0  # a model without KV cache
    with pytest.raises(ValueError):
        kv_tokens(GiB, -1, BLOCK)
    with pytest.raises(ValueError):
        kv_tokens(GiB, BPT, 0)


def test_budget_subtracts_worst_peak_cudagraphs_and_margin():
    adm = admission(cudagraph=GiB // 4)
    expected = 20 * GiB - 4 * GiB - 3 * GiB - GiB // 4 - GiB // 2
    assert adm.budget_bytes == expected == adm.kv_cache_bytes
    assert adm.stock_kv_cache_bytes == 20 * GiB - 4 * GiB - 2 * GiB - GiB // 4  # no margin
    assert adm.kv_tokens_worstcase == expected // BPT
    assert adm.kv_tokens_stock == adm.stock_kv_cache_bytes // BPT
    assert adm.fits
    assert (adm.weights_bytes, adm.non_torch_bytes, adm.consumed_bytes) == (
        3 * GiB, GiB // 2, 4 * GiB)
    assert adm.explicit_kv_cache_memory_bytes is None


def test_recommendation_rounds_down_to_whole_mebibytes():
    adm = admission(margin=GiB // 2 + 12345)
    assert adm.budget_bytes % MiB != 0
    assert adm.recommended_kv_cache_memory_bytes % MiB == 0
    assert 0 <= adm.budget_bytes - adm.recommended_kv_cache_memory_bytes < MiB


def test_negative_budget_does_not_fit():
    adm = admission(worst_peak=17 * GiB)
    assert adm.budget_bytes < 0
    assert adm.kv_cache_bytes == 0
    assert adm.recommended_kv_cache_memory_bytes == 0
    assert adm.kv_tokens_worstcase == 0
    assert not adm.fits


def test_budget_must_hold_one_request_at_max_model_len_and_the_null_block():
    # vLLM 0.32 (get_kv_cache_configs, check_enough_kv_cache_memory) checks one request against
    # the available memory less one pool block, the null block its BlockPool holds back: a
    # budget of exactly one request's blocks is refused at start
    one = bytes_for_one_request(BPT, BLOCK, 4096)
    assert one == 4096 * BPT
    base = 20 * GiB - 4 * GiB - 3 * GiB  # budget = base - margin
    exact = admission(margin=base - one - BLOCK_BYTES)
    assert exact.budget_bytes == one + BLOCK_BYTES == exact.least_kv_cache_bytes
    assert exact.fits
    assert not admission(margin=base - one - BLOCK_BYTES + 1).fits  # a byte short of a block
    assert not admission(margin=base - one).fits  # one request, no null block: vLLM refuses
    assert exact.pool_block_bytes == BLOCK_BYTES


def test_one_request_rounds_up_to_whole_blocks():
    assert bytes_for_one_request(BPT, BLOCK, 4097) == 4112 * BPT
    base = 20 * GiB - 4 * GiB - 3 * GiB  # budget = base - margin
    assert not admission(max_model_len=4097, margin=base - 4097 * BPT - BLOCK_BYTES).fits
    assert not admission(max_model_len=4097, margin=base - 4112 * BPT).fits
    assert admission(max_model_len=4097, margin=base - 4112 * BPT - BLOCK_BYTES).fits


def test_explicit_kv_at_the_null_block_boundary():
    one = 4096 * BPT
    assert admission(explicit_kv=one + BLOCK_BYTES).fits
    assert not admission(explicit_kv=one + BLOCK_BYTES - 1).fits
    assert not admission(explicit_kv=one).fits


def test_usable_and_least_are_vllms_rule_in_whole_pool_blocks():
    # what vLLM checks: need <= available - bytes_per_block, need a whole number of blocks
    assert usable_kv_bytes(10 * BLOCK_BYTES, bytes_per_token=BPT, block_size=BLOCK) \
        == 9 * BLOCK_BYTES
    assert usable_kv_bytes(10 * BLOCK_BYTES - 1, bytes_per_token=BPT, block_size=BLOCK) \
        == 8 * BLOCK_BYTES
    assert usable_kv_bytes(BLOCK_BYTES, bytes_per_token=BPT, block_size=BLOCK) == 0
    assert usable_kv_bytes(-GiB, bytes_per_token=BPT, block_size=BLOCK) == 0
    assert usable_kv_bytes(GiB, bytes_per_token=0, block_size=BLOCK) == GiB  # no KV to block
    for one in (1, BLOCK_BYTES, 5 * BLOCK_BYTES + 1):
        least = least_kv_cache_bytes(one, bytes_per_token=BPT, block_size=BLOCK)
        assert usable_kv_bytes(least, bytes_per_token=BPT, block_size=BLOCK) >= one
        assert usable_kv_bytes(least - 1, bytes_per_token=BPT, block_size=BLOCK) < one


def test_several_kv_groups_hold_back_one_pool_block():
    # Two KV groups of equal layers: a pool block serves one group (vLLM's _pool_bytes_per_block
    # is the largest group's bytes per block), one request draws its blocks in both groups, and
    # the null block is one pool block, not one per group
    pool = BLOCK_BYTES // 2
    one = 2 * (4096 // BLOCK) * pool  # 256 blocks in each group
    assert one == 4096 * BPT
    base = 20 * GiB - 4 * GiB - 3 * GiB
    exact = admission(margin=base - one - pool, pool_block_bytes=pool)
    assert exact.fits and exact.least_kv_cache_bytes == one + pool
    assert not admission(margin=base - one - pool + 1, pool_block_bytes=pool).fits
    # without the plan's pool block, a block of every layer is held back: never less
    assert not admission(margin=base - one - pool).fits
    assert admission(margin=base - one - BLOCK_BYTES).fits


def test_refusals_name_the_least_kv_cache_vllm_starts_with():
    one = 4096 * BPT
    small = admission(explicit_kv=one)
    d = decide_budget(small, mode="enforce", kv_cap=None, worst_label="w", max_model_len=4096)
    assert d.error is not None
    assert f"--kv-cache-memory-bytes {one + BLOCK_BYTES} or more" in d.error.hint
    assert "null block" in str(d.error)
    base = 20 * GiB - 4 * GiB - 3 * GiB
    short = admission(margin=0, worst_peak=3 * GiB + base - one)  # budget: one request exactly
    assert short.budget_bytes == one and not short.fits
    d = decide_budget(short, mode="enforce", kv_cap=None, worst_label="w", max_model_len=4096)
    assert d.error is not None and "null block" in str(d.error)
    capped = decide_budget(admission(), mode="enforce", kv_cap=1, worst_label="w",
                           max_model_len=4096)
    assert capped.budget_bytes == one + BLOCK_BYTES  # kv_cap never below what vLLM starts with


def test_explicit_kv_within_budget():
    adm = admission(explicit_kv=8 * GiB)
    assert adm.kv_cache_bytes == 8 * GiB
    assert adm.explicit_kv_cache_memory_bytes == 8 * GiB
    assert adm.kv_tokens_worstcase == 8 * GiB // BPT
    assert adm.recommended_kv_cache_memory_bytes == adm.budget_bytes  # recommendation unchanged
    assert adm.fits


def test_explicit_kv_larger_than_budget_does_not_fit():
    adm = admission(explicit_kv=13 * GiB)
    assert adm.budget_bytes == 12 * GiB + GiB // 2
    assert adm.kv_cache_bytes == 13 * GiB
    assert not adm.fits


def test_explicit_kv_too_small_for_one_request_does_not_fit():
    assert not admission(explicit_kv=4096 * BPT - 1).fits
    assert not admission(explicit_kv=4096 * BPT).fits  # vLLM's null block


def test_stock_kv_never_negative():
    adm = admission(stock_peak=30 * GiB, worst_peak=30 * GiB)
    assert adm.stock_kv_cache_bytes == 0 and adm.kv_tokens_stock == 0


def test_stock_oom_context_len_uses_block_slack():
    # stock_kv = 14 GiB + 100 KiB -> 100 KiB left over after whole 512 KiB blocks
    slack = 100 * 1024
    requested = 20 * GiB + slack
    curve = [(0, 2 * GiB), (512, 2 * GiB + slack), (1024, 2 * GiB + slack + 1),
             (2048, 2 * GiB + MiB)]
    adm = admission(requested=requested, context_curve=curve)
    assert adm.stock_kv_cache_bytes % BLOCK_BYTES == slack
    assert adm.stock_oom_context_len == 1024


def test_stock_holds_when_curve_stays_under_stock_peak():
    curve = [(0, GiB), (2048, 2 * GiB), (4095, 2 * GiB)]
    assert admission(context_curve=curve).stock_oom_context_len is None
    assert admission().stock_oom_context_len is None


def test_stock_oom_context_len_takes_the_smallest_extent_in_any_order():
    curve = [(4000, 3 * GiB), (1000, 3 * GiB), (0, GiB)]
    assert stock_oom_context_len(curve, stock_need=2 * GiB, slack=0) == 1000


def test_rejects_nonsense_units():
    with pytest.raises(ValueError):
        admission(block_size=0)
    with pytest.raises(ValueError):
        admission(max_model_len=0)


def test_model_without_kv_cache_fits_on_a_non_negative_budget():
    adm = admission(bytes_per_token=0, context_curve=[(0, 5 * GiB)])
    assert adm.fits and adm.kv_tokens_worstcase == 0 and adm.kv_tokens_stock == 0
    assert adm.stock_oom_context_len == 0
    assert not admission(bytes_per_token=0, worst_peak=30 * GiB).fits
