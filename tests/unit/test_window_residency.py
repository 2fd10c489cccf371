"""Residency on models whose sliding-window (or chunked-local) layers sit beside full attention.

vLLM's pool gives every KV group its own blocks, and a request at max_model_len holds only about
window / block + 1 blocks in a sliding-window group. Charging it its whole length in every layer
(kv_capacity_tokens // block-rounded max_model_len) plans fewer full-length requests than the
scheduler can form: the decode batch at full context is then planned too small (an
under-prediction). `Limits.full_request_tokens` (from `request_capacity_tokens`) counts per group
the way vLLM's get_max_concurrency_for_kv_cache_config does, and is never below it."""

from __future__ import annotations

import dataclasses

import pytest

from worstcase_profiler.core.cache import pool_capacity_tokens
from worstcase_profiler.core.shapes import (
    Limits, _extent_for, decode_batch, mixed_step, plan_fingerprint, prefill_chunk,
    request_capacity_tokens, split_prefills, wide_decode_batch)

GiB = 1 << 30


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclasses.dataclass(frozen=True)
class Layout:
    """A hybrid model as vLLM lays out its pool: `full` full-attention groups and `windows` (one
    window each) sliding-window groups of `group_layers` layers of `page` bytes per block."""

    full: int
    windows: tuple[int, ...]
    group_layers: int
    page: int
    block: int = 16

    @property
    def bytes_per_token(self) -> int:  # adapter/kv.bytes_per_token: every layer's page / block
        return (self.full + len(self.windows)) * self.group_layers * self.page // self.block

    @property
    def pool_block_bytes(self) -> int:
        return self.group_layers * self.page

    def vllm_reserved(self, window: int | None, mml: int, in_flight: int) -> int:
        """cdiv(spec.max_memory_usage_bytes, page): vLLM 0.32's (and 0.26's) admission cap for a
        sliding window group (window - 1 + in-flight tokens, plus one), the whole length else."""
        if window is None:
            return cdiv(mml, self.block)
        return cdiv(min(window - 1 + in_flight, mml), self.block) + 1

    def groups(self, mml: int, in_flight: int):
        return ([(self.block, self.vllm_reserved(None, mml, in_flight), None)] * self.full
                + [(self.block, self.vllm_reserved(w, mml, in_flight), w) for w in self.windows])

    def vllm_max_concurrency(self, num_blocks: int, mml: int, in_flight: int) -> float:
        """get_max_concurrency_for_kv_cache_config: pool blocks over the blocks one request
        reserves, summed over groups."""
        return num_blocks / sum(r for _, r, _ in self.groups(mml, in_flight))

    def decode_blocks(self, extent: int) -> int:
        """The fewest blocks a decoding request at `extent` holds: every block of each full
        group, the window (block-aligned) of each sliding group."""
        return (self.full * cdiv(extent, self.block)
                + sum(min(cdiv(extent, self.block), cdiv(w, self.block)) for w in self.windows))

    def limits(self, pool_bytes: int, mml: int, mbt: int, seqs: int, *, prefix: bool = False,
               windowed: bool = True) -> Limits:
        cap = pool_capacity_tokens(explicit_bytes=pool_bytes, stock_kv_bytes=0,
                                   graph_estimate_bytes=0, bytes_per_token=self.bytes_per_token,
                                   max_model_len=mml)
        full_request = None if not windowed else request_capacity_tokens(
            max_model_len=mml, block_size=self.block, pool_block_bytes=self.pool_block_bytes,
            bytes_per_token=self.bytes_per_token, groups=self.groups(mml, mbt))
        return Limits(max_model_len=mml, max_num_batched_tokens=mbt, max_num_seqs=seqs,
                      block_size=self.block, kv_capacity_tokens=cap, prefix_caching=prefix,
                      full_request_tokens=full_request)


# gpt-oss-20b: 24 layers alternating sliding window 128 and full attention, 8 KV heads of 64,
# bf16 KV: two groups of 12 layers, 32 KiB pages.
GPT_OSS = Layout(full=1, windows=(128,), group_layers=12, page=2 * 16 * 8 * 64 * 2)
# Gemma 3 27B-like: 62 layers, 5 sliding (1024) per full one: 10 full layers, groups of 10, six
# sliding groups (the last of 2 layers, padded in the pool).
GEMMA3 = Layout(full=1, windows=(1024,) * 6, group_layers=10, page=2 * 16 * 16 * 128 * 2)


@pytest.mark.parametrize("layout", [GPT_OSS, GEMMA3], ids=["gpt-oss-20b", "gemma3-like"])
@pytest.mark.parametrize("pool_gib", [40, 100])
@pytest.mark.parametrize("mbt", [2048, 8192])
def test_resident_count_is_never_below_vllms_max_concurrency(layout, pool_gib, mbt):
    mml = 131072
    pool = pool_gib * GiB
    blocks = pool // layout.pool_block_bytes
    vllm = int(layout.vllm_max_concurrency(blocks, mml, in_flight=mbt))
    old = layout.limits(pool, mml, mbt, 1024, windowed=False)
    new = layout.limits(pool, mml, mbt, 1024)
    assert vllm >= 2
    assert old.max_resident_requests < vllm  # the bug: charged its whole length in every layer
    assert new.max_resident_requests >= vllm
    # and at least what the pool really holds of decoding requests at full length
    assert new.max_resident_requests >= blocks // layout.decode_blocks(mml)
    assert decode_batch(new).num_reqs == new.max_resident_requests > decode_batch(old).num_reqs
    assert mixed_step(new).num_reqs == new.max_resident_requests


def test_gpt_oss_numbers():
    """The figures in the report: a 40 GiB pool, mml 131072, 8192 batched tokens."""
    limits = GPT_OSS.limits(40 * GiB, 131072, 8192, 1024)
    blocks = 40 * GiB // GPT_OSS.pool_block_bytes
    assert (GPT_OSS.bytes_per_token, GPT_OSS.pool_block_bytes, blocks) == (49152, 393216, 109226)
    assert limits.kv_capacity_tokens == 884736
    # 8192 full-attention blocks + 8 window blocks, one pool block = 8 capacity tokens
    assert limits.full_request_tokens == (8192 + 8) * 8 == 65600
    assert dataclasses.replace(limits, full_request_tokens=None).max_resident_requests == 6
    assert round(GPT_OSS.vllm_max_concurrency(blocks, 131072, 8192), 2) == 12.54
    assert limits.max_resident_requests == 13 == blocks // GPT_OSS.decode_blocks(131072)
    shared = dataclasses.replace(limits, prefix_caching=True)
    # the prefix held once (8200 blocks), then one block in each of the two groups per request
    assert shared.max_resident_requests >= (blocks - 8200) // 2 + 1 == 50514
    assert dataclasses.replace(shared, full_request_tokens=None).max_resident_requests == 47105


def test_window_extents_beyond_the_resident_count_are_upper_bounds():
    """_extent_for: n requests at once each get at least the longest extent that n of them
    really fit in the pool (block by block), with and without the windowed groups."""
    layout = Layout(full=1, windows=(128,), group_layers=2, page=64)
    mml, mbt = 4096, 512
    for blocks in (300, 600, 1000, 2500):
        pool = blocks * layout.pool_block_bytes
        limits = layout.limits(pool, mml, mbt, 256)
        old = dataclasses.replace(limits, full_request_tokens=None)
        for n in range(1, 257, 5):
            fit = max((e for e in range(1, mml + 1) if n * layout.decode_blocks(e) <= blocks),
                      default=1)
            assert _extent_for(limits, n) >= fit
            assert _extent_for(limits, n) >= _extent_for(old, n)  # never shorter than before
        assert (wide_decode_batch(limits) or decode_batch(limits)).context_len >= \
            (wide_decode_batch(old) or decode_batch(old)).context_len


def test_prefix_sharing_extents_above_the_resident_count():
    """With prefix caching, n requests beyond the resident count still share one prefix and
    each own a block: they sit at capacity - (n - 1) blocks, not at capacity // n (review note:
    that planned the wide decode batch and the widest splits far too short)."""
    limits = Limits(4096, 8192, 256, kv_capacity_tokens=4096 + 16 * 200, prefix_caching=True)
    assert limits.max_resident_requests == 201
    blocks = limits.kv_capacity_tokens // 16
    for n in (202, 230, 256):
        # block by block: a prefix of (blocks - n) blocks, one own block per request
        assert _extent_for(limits, n) == (blocks - n + 1) * 16 > limits.kv_capacity_tokens // n
    wide = wide_decode_batch(limits)
    assert wide.num_reqs == 256 and wide.context_len == (blocks - 255) * 16 - 1 == 3215
    widest = split_prefills(limits, 8192)[-1]
    assert widest.num_reqs == 256 and widest.context_len == (blocks - 255) * 16 - 32

    # a sliding layout: the shared prefix costs its windowed share, each request one block per
    # group (block_size capacity tokens over both groups)
    layout = Layout(full=1, windows=(128,), group_layers=2, page=64)
    mml = 4096
    for blocks in (400, 700):
        shared = layout.limits(blocks * layout.pool_block_bytes, mml, 512, 256, prefix=True)
        for n in range(2, 257, 7):
            def fits(e: int) -> bool:  # prefix of e - 16 tokens shared, one own block each
                p = cdiv(e - 16, 16)
                return layout.decode_blocks(16 * p) + 2 * n <= blocks
            best = max((e for e in range(16, mml + 1, 16) if fits(e)), default=1)
            assert _extent_for(shared, n) >= min(best, mml)


def test_full_attention_and_mamba_plans_stay_bit_identical():
    """No windowed group: request_capacity_tokens is None and nothing changes; a figure at or
    above the block-rounded length changes nothing either (Limits takes the smaller)."""
    assert request_capacity_tokens(max_model_len=4096, block_size=16, pool_block_bytes=1 << 20,
                                   bytes_per_token=1 << 16,
                                   groups=[(16, 256, None), (16, 1, None)]) is None
    cases = [Limits(4096, 8192, 256, kv_capacity_tokens=10 * 4096 + 100),
             Limits(4096, 8192, 256, kv_capacity_tokens=4096 + 48, prefix_caching=True),
             Limits(1000, 8192, 256, kv_capacity_tokens=3 * 1000),
             Limits(131072, 8192, 1024, block_size=784, kv_capacity_tokens=7332 * 784,
                    prefix_caching=True, prefix_request_tokens=8 * 784)]

    def plan(limits):
        shapes = [prefill_chunk(limits, 8192), *split_prefills(limits, 8192), decode_batch(limits),
                  wide_decode_batch(limits), mixed_step(limits)]
        return plan_fingerprint([s for s in shapes if s is not None])

    for limits in cases:
        for figure in (limits.rounded_model_len, limits.rounded_model_len + 1, 10 ** 9):
            same = dataclasses.replace(limits, full_request_tokens=figure)
            assert same.tokens_per_full_request == limits.tokens_per_full_request
            assert same.max_resident_requests == limits.max_resident_requests
            assert same.max_distinct_hit_requests == limits.max_distinct_hit_requests
            assert plan(same) == plan(limits)
    assert cases[-1].max_distinct_hit_requests == 896  # the Qwen3.5 hybrid's count, as before


def test_request_capacity_tokens_contract():
    # a window group holds its window's blocks, capped by vLLM's own reservation
    one = dict(max_model_len=131072, block_size=16, pool_block_bytes=16 * 100, bytes_per_token=200)
    assert request_capacity_tokens(**one, groups=[(16, 8192, None), (16, 521, 128)]) == 8200 * 8
    assert request_capacity_tokens(**one, groups=[(16, 8192, None), (16, 5, 128)]) == 8197 * 8
    # a window longer than the model holds the whole request
    assert request_capacity_tokens(**one, groups=[(16, 8192, None), (16, 8193, 1 << 20)]) \
        == 2 * 8192 * 8
    # chunked local attention: a request just past a chunk boundary keeps one block
    assert request_capacity_tokens(**one, groups=[(16, 8192, None), (16, 513, 1)]) == 8193 * 8
    # a group of larger blocks rounds max_model_len further: the figure is scaled down by it
    odd = dict(one, max_model_len=1000)
    assert request_capacity_tokens(**odd, groups=[(16, 63, None), (64, 3, 128)]) \
        == (63 + 2) * 8 * 1008 // 1024
    # nothing below one token
    assert request_capacity_tokens(**dict(one, bytes_per_token=1 << 40),
                                   groups=[(16, 1, 16)]) == 1


def test_limits_validates_full_request_tokens():
    from worstcase_profiler.errors import ConfigError

    with pytest.raises(ConfigError):
        Limits(4096, 8192, 256, full_request_tokens=0)
    assert Limits(4096, 8192, 256, full_request_tokens=None).tokens_per_full_request == 4096
    assert Limits(4096, 8192, 256, full_request_tokens=272).tokens_per_full_request == 272


def test_ranks_plan_with_the_largest_pool_and_the_cheapest_request_any_rank_computed():
    """Pipeline-parallel ranks hold different layers, so their KV arithmetic differs; every rank
    must plan the same steps (a different plan hangs the collectives), and the largest request
    counts are the safe direction (review)."""
    from worstcase_profiler.core.shapes import agreed

    base = Limits(max_model_len=131072, max_num_batched_tokens=8192, max_num_seqs=1024,
                  block_size=16, prefix_caching=True)
    ranks = [dataclasses.replace(base, kv_capacity_tokens=400_000, full_request_tokens=70_000),
             dataclasses.replace(base, kv_capacity_tokens=300_000, full_request_tokens=None,
                                 prefix_request_tokens=32)]

    def on_every_rank(fn):
        """Run fn(limits, agree_max) on each rank in lockstep, agree_max taking the max."""
        calls = [[] for _ in ranks]

        def agree_for(r):
            def agree_max(v):
                calls[r].append(v)
                return max(c[len(calls[r]) - 1] for c in calls if len(c) >= len(calls[r]))
            return agree_max
        # rank 1 first posts its values, then rank 0 sees both (a fake all-reduce)
        fn(ranks[1], agree_for(1))
        return fn(ranks[0], agree_for(0))

    out = on_every_rank(agreed)
    assert out.kv_capacity_tokens == 400_000
    assert out.full_request_tokens == 70_000 and out.prefix_request_tokens == 32
    assert agreed(base, lambda v: v) == base  # one rank: unchanged


def test_a_speculative_state_adds_its_blocks_to_every_request():
    """Issue 33: Limits.state_request_tokens (a recurrent state's 1 + k blocks under speculative
    decoding) is added to each request's cost, after a window's figure, never lowering it; 0
    changes nothing, bit for bit."""
    base = Limits(32768, 8192, 32, block_size=1024, kv_capacity_tokens=219 * 1024)
    assert base.max_resident_requests == 6  # the attention blocks alone
    seed = dataclasses.replace(base, state_request_tokens=9 * 1024)  # k = 8: 9 state blocks
    assert seed.tokens_per_full_request == 32768 + 9 * 1024
    assert seed.max_resident_requests == 5 == 219 // (32 + 9)
    assert decode_batch(seed).num_reqs <= 219 // 9  # never more than the pool holds
    windowed = dataclasses.replace(seed, full_request_tokens=16384)
    assert windowed.tokens_per_full_request == 16384 + 9 * 1024
    zero = dataclasses.replace(base, state_request_tokens=0)
    assert zero == base and zero.tokens_per_full_request == base.tokens_per_full_request


def test_requests_on_one_cached_prefix_each_hold_their_own_state_blocks():
    """With prefix caching the siblings on one shared prefix share its attention blocks, not a
    recurrent state: each holds its 1 + k state blocks beside its own block (H200 run 36: the
    DFlash hybrid at 131k swept a 910-request decode batch that the pool held 181 of, the state
    not counted per sibling)."""
    base = Limits(131072, 8192, 1024, num_speculative_tokens=8, block_size=1024,
                  kv_capacity_tokens=2000 * 1024, prefix_caching=True)
    seed = dataclasses.replace(base, state_request_tokens=9 * 1024)
    first = seed.tokens_per_full_request // 1024  # the shared prefix and the first state
    assert seed.max_resident_requests == (2000 - first) // 10 + 1 < base.max_resident_requests
    assert decode_batch(seed).num_reqs <= seed.max_resident_requests
    # a distinct-hit request's own figure stands where it is more
    wide = dataclasses.replace(seed, prefix_request_tokens=20 * 1024)
    assert wide.max_distinct_hit_requests == (2000 - first) // 20 + 1
    assert seed.max_distinct_hit_requests == seed.max_resident_requests


def test_no_step_holds_more_requests_than_their_state_blocks_leave_room_for():
    """Without prefix caching too: each request holds its 1 + k state blocks and a block of its
    own, so no split prefill or wide decode batch plans more requests than the pool holds at once
    (seed 000's 6 GiB at k=8: the sweep planned 32 requests, the H200 ran 26 at once)."""
    from worstcase_profiler.core.shapes import split_prefills, wide_decode_batch

    base = Limits(32768, 8192, 32, num_speculative_tokens=8, block_size=832,
                  kv_capacity_tokens=270 * 832)
    seed = dataclasses.replace(base, state_request_tokens=9 * 832)
    assert seed.max_concurrent_requests == 27 and base.max_concurrent_requests == 270
    assert max(s.num_reqs for s in split_prefills(base, 8192)) == 32  # no state: max_num_seqs
    assert max(s.num_reqs for s in split_prefills(seed, 8192)) == 27  # the cap itself, not 32
    wide = wide_decode_batch(seed) or decode_batch(seed)
    assert wide.num_reqs <= 27
    assert dataclasses.replace(seed, kv_capacity_tokens=None).max_concurrent_requests is None


def test_many_requests_on_one_prefix_under_a_state_are_planned_where_they_fit():
    """The widest split prefill of a hybrid under MTP (each request: its own block and 6
    recurrent-state blocks, every block 800 tokens) sits at an extent whose block-aligned prefix
    and the requests' own blocks fit the pool block by block: the state is not scaled down with
    the extent (0.33's qwen35 + MTP planned 769 requests at a 7,200-token prefix its 5,385 blocks
    could not hold beside them; real requests formed 767)."""
    from worstcase_profiler.core.shapes import split_prefills

    bs = 800
    for blocks in (5385, 6000, 7000):
        limits = Limits(131072, 8192, 1024, num_speculative_tokens=2, block_size=bs,
                        kv_capacity_tokens=blocks * bs, prefix_caching=True,
                        state_request_tokens=6 * bs)
        widest = split_prefills(limits, 8192)[-1]
        n = widest.num_reqs
        assert n == limits.max_concurrent_requests  # the count the pool bounds
        prefix = widest.context_len // bs  # the block-aligned prefix requests share
        assert prefix + n * 7 <= blocks, (blocks, n, widest)
