"""A cached sweep's plan on a restart whose KV pool moved (core/cache.pool_reuse,
adapter/startup._cached_pool, budget.planned_pool): on the H100 (vLLM 0.32, CUDA graphs) the
Qwen3.5 hybrid's restart found a pool of 1,376,256 tokens where its first start had planned for
1,310,720, one rounding step down, and swept again (96 s for a 23 s stock start). Within one
rounding step the entry's plan is kept, and where this start's pool is the larger one the KV
cache is held at the plan's pool, if it can be (not an explicit KV size, not report mode)."""

from __future__ import annotations

import dataclasses
import types

from worstcase_profiler.adapter import startup
from worstcase_profiler.core import budget
from worstcase_profiler.core.cache import pool_reuse
from worstcase_profiler.core.sweep import run_sweep

from test_pool_fit import BPT, LIMITS, MiB, measured, per_request
from test_sweep import FakeDriver


def test_an_entry_is_kept_within_one_rounding_step_and_held_where_it_planned_less():
    same = pool_reuse(1_310_720, 1_310_720)
    assert same.usable and same.plan_tokens == 1_310_720 and not same.hold
    # the H100 hybrid's two starts: one rounding step (65,536 tokens at this size) apart
    larger = pool_reuse(1_376_256, 1_310_720)  # planned for more: its plan bounds this pool
    assert larger.usable and larger.plan_tokens == 1_376_256 and not larger.hold
    smaller = pool_reuse(1_310_720, 1_376_256)  # planned for less: held at the planned pool
    assert smaller.usable and smaller.plan_tokens == 1_310_720 and smaller.hold
    assert "held at most at the planned pool" in smaller.why
    # a pool that cannot be held (an explicit KV size, report mode): the sweep runs again
    unheld = pool_reuse(1_310_720, 1_376_256, can_hold=False)
    assert not unheld.usable and unheld.plan_tokens == 1_376_256
    assert pool_reuse(1_376_256, 1_310_720, can_hold=False).usable  # nothing to hold there
    # further apart (a changed utilization, KV size or kv_cap): the sweep runs again, either way
    for a, b in ((1_310_720, 1_441_792), (1_441_792, 1_310_720)):
        far = pool_reuse(a, b)
        assert not far.usable and far.plan_tokens == b and "rounding step" in far.why
    # at a power of two the grid below is finer: one step there is one of its steps
    assert pool_reuse(507_904, 524_288).usable and not pool_reuse(491_520, 524_288).usable
    for a, b in ((None, 1_310_720), (1_310_720, None)):  # bounds of different things
        assert not pool_reuse(a, b).usable
    assert pool_reuse(None, None).usable


PLAN = LIMITS.kv_capacity_tokens - 512  # one rounding step (512 tokens at 12,800) below


def _decided(start_pool: int | None) -> budget.Decided:
    """A sweep planned for one rounding step less than stock's pool, its budget above both."""
    small = dataclasses.replace(LIMITS, kv_capacity_tokens=PLAN)
    sweep = run_sweep(FakeDriver(small, transient=per_request), tolerance=0, attribute_ops=False)
    facts = dataclasses.replace(measured(sweep, consumed=36 * MiB), limits=small,
                                start_pool_tokens=start_pool, stock_kv_bytes=16_384 * BPT)
    return budget.decide(facts, mode="enforce", margin_bytes=0)


def test_a_plan_for_a_smaller_pool_holds_the_kv_cache_at_it():
    plan_pool = PLAN * BPT
    free = _decided(None)  # the plan's pool is this start's own: the stock argument holds
    assert free.admission.kv_cache_bytes > plan_pool and free.admission.pool_ceiling_bytes is None
    held = _decided(LIMITS.kv_capacity_tokens)  # this start's pool is one step larger
    assert held.admission.kv_cache_bytes <= plan_pool < held.admission.budget_bytes
    assert held.budget.budget_bytes <= plan_pool  # what vLLM is handed
    assert held.admission.pool_ceiling_bytes == plan_pool
    assert held.admission.recommended_kv_cache_memory_bytes <= plan_pool
    # a start whose own pool is the plan's or smaller is not held
    assert _decided(PLAN).admission.pool_ceiling_bytes is None
    assert _decided(PLAN - 512).admission.pool_ceiling_bytes is None  # a larger plan: no hold


def _agree(other):
    """An agree-max over this rank and one other rank, whose values are `other`'s, keyed by what
    is agreed: "missing" (int(entry is None)), "refused" (int(not usable)) and "planned" (its
    entry's pool; -1 for none). _cached_pool asks refused, then -planned, then planned."""
    asked = iter([other.get("refused", 0), -other["planned"], other["planned"]])
    return lambda v: max(v, next(asked))


def test_a_restart_keeps_the_entrys_plan_and_ranks_agree_on_it(caplog):
    entry = types.SimpleNamespace(capacity_tokens=12_288)  # LIMITS: 12,800, a step of 512
    one_rank = lambda v: v  # noqa: E731

    def cached(limits, e, agree=one_rank, hold=True):
        return startup._cached_pool(limits, e, agree, "entry.json", holdable=hold)

    limits, kept = cached(LIMITS, entry)  # held: LIMITS' own 12,800 is above the plan's
    assert kept is entry and limits.kv_capacity_tokens == 12_288
    same = dataclasses.replace(LIMITS, kv_capacity_tokens=12_288)
    assert cached(same, entry) == (same, entry)
    bigger = types.SimpleNamespace(capacity_tokens=13_312)
    limits, kept = cached(LIMITS, bigger)
    assert kept is bigger and limits.kv_capacity_tokens == 13_312
    # an explicit KV size or report mode: a smaller plan's pool cannot be held, so sweep again
    assert cached(LIMITS, entry, hold=False) == (LIMITS, None)
    # far apart: this start's own pool is swept
    assert cached(LIMITS, types.SimpleNamespace(capacity_tokens=6_400)) == (LIMITS, None)
    unbounded = types.SimpleNamespace(capacity_tokens=None)
    assert cached(LIMITS, unbounded) == (LIMITS, None)
    # two ranks whose entries planned for one pool keep them together
    limits, kept = cached(LIMITS, entry, _agree({"planned": 12_288}))
    assert kept is entry and limits.kv_capacity_tokens == 12_288
    # another rank's entry planned for another pool: no rank keeps its entry
    with caplog.at_level("INFO", logger="vllm.wcprof"):
        caplog.clear()
        assert cached(LIMITS, entry, _agree({"planned": 12_800})) == (LIMITS, None)
        assert "another rank's entry planned for another pool" in caplog.text
        # another rank cannot keep its entry: none does
        caplog.clear()
        assert cached(LIMITS, entry, _agree({"refused": 1, "planned": 12_288}))[1] is None
        assert "another rank cannot keep its entry" in caplog.text


def test_no_rank_keeps_an_entry_another_rank_lacks(caplog):
    """Whether a start is cached decides its collectives (vLLM's profile captures every graph
    only on a first start): a rank with an entry drops it, and says so, where another has none."""
    entry = types.SimpleNamespace(capacity_tokens=12_288)
    handle = types.SimpleNamespace(key="k", cache=types.SimpleNamespace(path=lambda k: f"{k}.json"))
    other_lacks = lambda v: max(v, 1)  # noqa: E731
    other_has = lambda v: max(v, 0)  # noqa: E731
    with caplog.at_level("INFO", logger="vllm.wcprof"):
        assert startup._agreed_entry(entry, other_lacks, handle) is None
        assert "another rank has no entry" in caplog.text
    assert startup._agreed_entry(entry, other_has, handle) is entry
    assert startup._agreed_entry(None, other_has, handle) is None
    assert startup._agreed_entry(None, lambda v: v, None) is None  # the cache off: no handle


def test_only_an_enforced_start_without_an_explicit_kv_size_can_be_held():
    assert startup.can_hold(None, "enforce")
    assert not startup.can_hold(8 << 30, "enforce")  # vLLM gets an explicit size as given
    assert not startup.can_hold(None, "report")  # report hands vLLM its own figure
