"""The worst step fitted to the admitted KV pool (core/pool_fit.py, adapter/pool_fit.py), on a
fake driver whose step transient grows with its requests, as the GDN kernels' do under MTP, and
the real budget decision: no vLLM, no torch."""

from __future__ import annotations

import dataclasses

import pytest

from worstcase_profiler.adapter.pool_fit import fit_to_pool
from worstcase_profiler.core import budget
from worstcase_profiler.core import pool_fit as core
from worstcase_profiler.core import shapes as plan
from worstcase_profiler.core.shapes import Limits
from worstcase_profiler.core.sweep import run_cut_down, run_sweep
from worstcase_profiler.errors import DoesNotFit
from worstcase_profiler.core.types import (HeldMemory, Shape, StepResult, WarmupEstimate,
                                          Workspace)

from test_sweep import FakeDriver

KiB, MiB = 1 << 10, 1 << 20
BPT = KiB  # bytes per capacity token
# A hybrid under MTP k=2: each request holds 3 recurrent-state blocks beside a block of its own,
# so the pool bounds how many share a step: 12,800 tokens hold 200 (12,800 // (16 + 48)).
LIMITS = Limits(max_model_len=4096, max_num_batched_tokens=1024, max_num_seqs=256,
                num_speculative_tokens=2, block_size=16, kv_capacity_tokens=12_800,
                prefix_caching=True, state_request_tokens=48)


def per_request(shape) -> int:
    """A transient that grows with the step's requests (64 KiB each) and its rows (1 KiB each)."""
    return shape.num_reqs * 64 * KiB + shape.rows * KiB


def one_chunk(shape) -> int:
    """A transient set by rows alone: the single full chunk is the worst."""
    return shape.rows * 64 * KiB


REQUESTED = 64 * MiB  # what the engine asks for


def measured(sweep, *, consumed: int) -> budget.Measured:
    """The start's facts on LIMITS: vLLM's own pool is the planned capacity, REQUESTED asked."""
    return budget.Measured(
        limits=LIMITS, sweep=sweep,
        held=HeldMemory(requested_bytes=REQUESTED, consumed_bytes=consumed, weights_bytes=0,
                        non_torch_bytes=0),
        workspace=Workspace(), warmup=WarmupEstimate(),
        stock_kv_bytes=LIMITS.kv_capacity_tokens * BPT, bytes_per_token=BPT,
        one_request_bytes=LIMITS.max_model_len * BPT, explicit_kv_bytes=None, tolerance_bytes=0)


def usable(budget_bytes: int) -> int:
    """The pool's usable tokens: whole blocks of 16 tokens, the null block held back."""
    return core.usable_tokens(budget_bytes, bytes_per_token=BPT, pool_block_bytes=None,
                              block_size=16)


def decide(m: budget.Measured) -> budget.Decided:
    return budget.decide(m, mode="enforce", margin_bytes=0)


def fitted_start(transient, consumed: int, **kw):
    driver = FakeDriver(LIMITS, transient=transient)
    sweep = run_sweep(driver, tolerance=0, attribute_ops=False)
    facts = measured(sweep, consumed=consumed)
    first = decide(facts)
    driver.shapes.clear()
    kw.setdefault("attribute", False)
    facts2, second = fit_to_pool(driver, facts, first, decide, mode="enforce", **kw)
    return driver, facts, first, facts2, second


# 64 MiB requested, 64 MiB - 10 MiB consumed less the worst step: the admitted pool holds about
# 10 MiB of KV (10,240 tokens, 160 requests at once) where the sweep planned for 12,800 (200).
CONSUMED = 64 * MiB - 10 * MiB - 200 * 64 * KiB - 1024 * KiB


def test_a_worst_step_wider_than_the_admitted_pool_is_fitted_to_it():
    driver, facts, first, facts2, second = fitted_start(per_request, CONSUMED)
    assert facts.sweep.worst.shape.num_reqs == 200  # what vLLM's own budget would hold
    fit = facts2.sweep.pool_fit
    assert fit is not None and fit.swept_worst == facts.sweep.worst.shape
    assert fit.swept_worst in fit.dropped
    # never less KV than the sweep's plan gave, and the transient is the fitted plan's
    assert second.budget.budget_bytes >= first.budget.budget_bytes
    assert facts2.sweep.peak_bytes < facts.sweep.peak_bytes
    # the allocation is held at the pool the fitted plan is for ...
    pool = usable(second.budget.budget_bytes)
    assert pool <= fit.pool_tokens == facts2.limits.kv_capacity_tokens
    # ... and every shape the scheduler can form in the allocated pool is covered
    allocated = dataclasses.replace(LIMITS, kv_capacity_tokens=pool)
    for shape in plan.extra_steps(allocated, facts.sweep.coverage.worst_rows):
        assert per_request(shape) <= facts2.sweep.peak_bytes, shape
    # the worst step is one that pool forms: its requests are what it holds at once, give or
    # take the few the second round's smaller transient let in
    held_at_once = allocated.max_concurrent_requests
    worst = facts2.sweep.worst.shape
    assert held_at_once <= worst.num_reqs <= held_at_once + 8
    # the added shapes were measured, once each, and are in the record
    assert driver.shapes and len(driver.shapes) == len(set(driver.shapes))
    assert {r.shape for r in fit.steps} == set(driver.shapes)


def test_the_second_round_gives_back_what_the_first_held_back():
    _, _, first, facts2, second = fitted_start(per_request, CONSUMED)
    assert facts2.sweep.pool_fit.rounds >= 2
    assert second.budget.budget_bytes > first.budget.budget_bytes


def test_a_worst_step_the_pool_holds_is_left_alone():
    driver, facts, first, facts2, second = fitted_start(one_chunk, CONSUMED)
    assert facts.sweep.worst.shape.num_reqs == 1
    assert facts2 is facts and second is first and driver.shapes == []


@pytest.mark.parametrize("mode", ["report"])
def test_outside_enforce_mode_nothing_is_fitted(mode):
    driver = FakeDriver(LIMITS, transient=per_request)
    facts = measured(run_sweep(driver, tolerance=0, attribute_ops=False), consumed=CONSUMED)
    first = budget.decide(facts, mode=mode, margin_bytes=0)
    out = fit_to_pool(driver, facts, first, decide, mode=mode)
    assert out == (facts, first)


def test_an_explicit_kv_size_is_the_pool_fitted_and_stays_the_allocation():
    """The plan for an explicit size was rounded up (the sweep cache's key): fitted to the
    blocks that size really holds, and vLLM still gets the size given."""
    driver = FakeDriver(LIMITS, transient=per_request)
    facts = dataclasses.replace(measured(run_sweep(driver, tolerance=0, attribute_ops=False),
                                         consumed=CONSUMED), explicit_kv_bytes=8 * MiB)
    first = decide(facts)
    facts2, second = fit_to_pool(driver, facts, first, decide, mode="enforce", attribute=False)
    assert facts2.sweep.pool_fit.pool_tokens == usable(8 * MiB) == 8 * KiB - 16
    assert second.budget.budget_bytes == first.budget.budget_bytes == 8 * MiB
    # the flag is held at the size the plan was fitted to, not the uncapped budget's
    adm = second.admission
    assert adm.kv_cache_bytes == 8 * MiB and adm.recommended_kv_cache_memory_bytes <= 8 * MiB
    assert adm.budget_bytes > 8 * MiB and adm.pool_ceiling_bytes == 8 * MiB
    assert facts2.sweep.worst.shape.num_reqs == (8 * KiB - 16) // 64


def test_what_the_fit_leaves_held_is_subtracted():
    readings = iter([100 * MiB, 100 * MiB + 3 * MiB])
    _, _, _, facts2, _ = fitted_start(per_request, CONSUMED,
                                      held=lambda phase: next(readings))
    assert facts2.held.consumed_bytes == CONSUMED + 3 * MiB


def test_the_attributed_worst_names_its_op():
    _, _, _, facts2, _ = fitted_start(per_request, CONSUMED, attribute=True)
    assert facts2.sweep.worst_op == "op"  # the fake driver's attribution


@pytest.mark.parametrize("cut", [False, True])
def test_refit_over_the_sweeps_own_plan_admits_what_the_sweep_admitted(cut):
    """The refit's formula over an unchanged plan is the sweep's own: full and cut-down."""
    driver = FakeDriver(LIMITS, transient=per_request)
    if cut:
        driver.cut_down = _no_cut
        sweep, _ = run_cut_down(driver, tolerance=0, attribute_ops=False,
                                allocator_slack=2 * MiB)
        assert sweep.confirmed
    else:
        sweep = run_sweep(driver, tolerance=0, attribute_ops=False, allocator_slack=2 * MiB)
    same = core.Replan(limits=LIMITS, added=(), dropped=())
    out = core.refit(sweep, LIMITS, same, (), allocator_slack=2 * MiB)
    assert out.peak_bytes == sweep.peak_bytes and out.worst == sweep.worst


def test_a_pool_no_smaller_than_planned_is_no_replan():
    assert core.replan(LIMITS, 1024, 12_800) is None
    assert core.replan(dataclasses.replace(LIMITS, kv_capacity_tokens=None), 1024, 10) is None
    smaller = core.replan(LIMITS, 1024, 10_240)
    assert smaller is not None and smaller.dropped and smaller.added
    assert all(s.num_reqs <= 160 for s in smaller.added)


def test_the_line_says_what_was_fitted():
    _, _, _, facts2, _ = fitted_start(per_request, CONSUMED)
    line = core.fit_line(facts2.sweep)
    assert "reqs=200" in line and f"{facts2.sweep.pool_fit.pool_tokens:,}" in line


class _no_cut:
    """A cut_down() that keeps the whole fake model (the figures are the shape's either way)."""

    def __init__(self, prefix=False):
        pass

    def __enter__(self):
        return "1 of 1 layers"

    def __exit__(self, *exc):
        return False


def stepped(shape) -> int:
    """A transient that jumps at 175 requests (a kernel's split changing): the second round's
    line, through 200 and 160 requests, lands above the jump and overshoots."""
    return shape.rows * KiB + shape.num_reqs * 4 * KiB + (3 * MiB if shape.num_reqs >= 175 else 0)


@pytest.mark.parametrize("transient,rounds", [(per_request, (2, 3)), (stepped, (3,))])
def test_the_last_round_allocates_exactly_the_pool_it_planned(transient, rounds):
    """The answer's allocation is the fitted plan's pool, so its worst step is one that pool
    holds: the second round where the line met the fixed point, else a third that settles
    where the second one's transient leaves the pool."""
    consumed = 64 * MiB - 10 * MiB - transient(plan.Shape("prefill", 1024, 0, 200))
    _, _, first, facts2, second = fitted_start(transient, consumed)
    fit = facts2.sweep.pool_fit
    assert fit.rounds in rounds
    assert usable(second.budget.budget_bytes) == fit.pool_tokens
    assert second.budget.budget_bytes > first.budget.budget_bytes


@pytest.mark.parametrize("transient", [per_request, stepped])
def test_every_step_of_the_allocated_pool_is_covered_over_many_budgets(transient):
    """The safety property over a range of budgets (a review found a ceiling rounded up to a
    whole block that held one more request than the fitted plan, for 1 budget in 8): every
    shape the scheduler can form in the pool actually allocated is covered by the admitted
    transient, whichever round answered."""
    for spare in range(0, 4 * MiB, 37 * KiB + 123):
        consumed = 64 * MiB - 9 * MiB - transient(plan.Shape("prefill", 1024, 0, 200)) - spare
        _, facts, first, facts2, second = fitted_start(transient, consumed)
        if second.budget.error is not None or first.budget.budget_bytes > 12_800 * BPT:
            continue  # (a budget above vLLM's own figure: not a start that happens)
        pool = usable(second.budget.budget_bytes)
        assert pool <= facts2.limits.kv_capacity_tokens
        allocated = dataclasses.replace(LIMITS, kv_capacity_tokens=pool)
        for shape in plan.extra_steps(allocated, facts.sweep.coverage.worst_rows):
            assert transient(shape) <= facts2.sweep.peak_bytes, (spare, shape)
        # never fewer blocks than the unfitted answer (its bytes past a whole block hold none)
        assert pool >= usable(first.budget.budget_bytes)


def test_what_the_sweep_was_admitted_at_above_its_formula_carries_over():
    """An encoder step, a cached replay's drift, a self-check's floor: raises the fit cannot
    re-derive stay on top of the fitted figure."""
    driver = FakeDriver(LIMITS, transient=per_request)
    sweep = run_sweep(driver, tolerance=0, attribute_ops=False)
    raised = dataclasses.replace(sweep, peak_bytes=sweep.peak_bytes + 3 * MiB)
    same = core.Replan(limits=LIMITS, added=(), dropped=())
    assert core.refit(raised, LIMITS, same, ()).peak_bytes == raised.peak_bytes
    fitted = core.replan(LIMITS, sweep.coverage.worst_rows, 10_240)
    readings = [driver.measure_in(s) for s in fitted.added]
    plain = core.refit(sweep, LIMITS, fitted, readings)
    assert core.refit(raised, LIMITS, fitted, readings).peak_bytes == plain.peak_bytes + 3 * MiB


def test_a_first_round_that_does_not_fit_refuses_the_start():
    """Its readings are steps the unfitted pool forms too (a kernel regime the sweep's request
    counts skipped): falling back to the sweep's figure would admit below them."""
    def regime(shape) -> int:
        return per_request(shape) + (40 * MiB if 150 <= shape.num_reqs < 200 else 0)

    _, facts, first, facts2, second = fitted_start(regime, CONSUMED)
    assert first.budget.error is None
    assert second.budget.error is not None
    assert facts2.sweep.peak_bytes >= 40 * MiB


def test_a_rank_that_refused_stops_every_rank_before_any_step():
    driver = FakeDriver(LIMITS, transient=per_request)
    facts = measured(run_sweep(driver, tolerance=0, attribute_ops=False), consumed=CONSUMED)
    first = decide(facts)
    driver.shapes.clear()
    out = fit_to_pool(driver, facts, first, decide, mode="enforce",
                      agree_max=lambda v: max(v, 1))  # another rank says "refused"
    assert out == (facts, first) and driver.shapes == []


def test_the_recommended_flag_is_held_at_the_fitted_pool():
    """The flag an operator copies, and the KV the report says it gives, never exceed the pool
    the fitted plan covers (a larger one would hold the dropped steps again)."""
    _, _, first, facts2, second = fitted_start(per_request, CONSUMED)
    adm = second.admission
    ceiling = adm.pool_ceiling_bytes
    assert ceiling is not None and ceiling == second.budget.budget_bytes
    assert adm.recommended_kv_cache_memory_bytes <= ceiling and adm.kv_cache_bytes <= ceiling
    assert adm.budget_bytes > ceiling  # the arithmetic still adds up to the uncapped figure
    assert first.admission.pool_ceiling_bytes is None  # the unfitted plan: vLLM's own pool


def test_a_measured_step_outside_the_plan_is_never_admitted_below_its_reading():
    """A step the sweep's plan does not hold (a named check step, the encoder step) raised the
    admitted figure before the fit. The fit drops the worst step and its formula falls, and a
    raise carried as an excess over that formula falls with it; the step still forms in the
    fitted pool, so its reading is a floor."""
    driver = FakeDriver(LIMITS, transient=per_request)
    sweep = run_sweep(driver, tolerance=0, attribute_ops=False)
    floor = sweep.peak_bytes + 2 * MiB
    facts = measured(dataclasses.replace(sweep, peak_bytes=floor), consumed=CONSUMED)
    first = decide(facts)
    plain, _ = fit_to_pool(driver, facts, first, decide, mode="enforce", attribute=False)
    assert plain.sweep.pool_fit is not None and plain.sweep.peak_bytes < floor
    held, _ = fit_to_pool(driver, facts, first, decide, mode="enforce", attribute=False,
                          floor=floor)
    assert held.sweep.pool_fit is not None and held.sweep.peak_bytes == floor


def test_a_restart_with_the_readings_fits_the_same_measuring_only_its_worst_step():
    """A trusted cache entry's readings (sweep_cache.reusable_pool_fit, kept as
    core/pool_fit.kept_readings keeps them) stand in for the fit's steps: the same transient,
    pool, worst step and op; the one step run is the admitted worst, measured again (and
    attributed to its op)."""
    driver, facts, first, fresh, fresh_answer = fitted_start(per_request, CONSUMED, attribute=True)
    known = {r.shape: r for r in core.kept_readings(fresh.sweep)}
    driver.shapes.clear()
    again, answer = fit_to_pool(driver, facts, first, decide, mode="enforce", attribute=True,
                                known=known)
    assert driver.shapes == [fresh.sweep.worst.shape]
    assert again.sweep.peak_bytes == fresh.sweep.peak_bytes
    assert answer.budget.budget_bytes == fresh_answer.budget.budget_bytes
    assert again.sweep.worst.shape == fresh.sweep.worst.shape
    assert again.sweep.worst.need_bytes == fresh.sweep.worst.need_bytes
    assert again.sweep.worst_op == fresh.sweep.worst_op == "op"
    fit = again.sweep.pool_fit
    assert fit.reused == len(fit.steps) == len(fresh.sweep.pool_fit.steps)
    assert "at an earlier start" in core.fit_line(again.sweep)
    assert fresh.sweep.pool_fit.reused == 0 and "earlier" not in core.fit_line(fresh.sweep)


def test_a_cached_worst_step_that_needs_more_now_is_not_reused():
    """Where the admitted worst step, measured again, needs more than its cached reading (beyond
    the meter's tolerance), no cached reading is taken: the fit measures every shape now and
    admits what a first start would."""
    driver, facts, first, fresh, fresh_answer = fitted_start(per_request, CONSUMED)
    worst = fresh.sweep.worst.shape
    known = {r.shape: (dataclasses.replace(r, peak_bytes=r.peak_bytes - 64 * KiB)
                       if r.shape == worst else r) for r in fresh.sweep.pool_fit.steps}
    driver.shapes.clear()
    again, answer = fit_to_pool(driver, facts, first, decide, mode="enforce", attribute=False,
                                known=known)
    assert driver.shapes[0] == worst and set(driver.shapes[1:]) == set(known)
    assert again.sweep.pool_fit.reused == 0
    assert again.sweep.peak_bytes == fresh.sweep.peak_bytes
    assert answer.budget.budget_bytes == fresh_answer.budget.budget_bytes


def test_what_the_cached_steps_left_held_counts_on_a_restart():
    """A restart that runs none of the fit's steps counts what they left held when they ran
    (known_held), where that is more than its own reading: the consumed memory, and so the KV,
    are the first start's."""
    readings = iter([100 * MiB, 100 * MiB + 3 * MiB])
    _, facts, first, fresh, _ = fitted_start(per_request, CONSUMED,
                                             held=lambda phase: next(readings))
    assert fresh.sweep.pool_fit.held_bytes == 3 * MiB
    driver = FakeDriver(LIMITS, transient=per_request)
    again, _ = fit_to_pool(driver, facts, first, decide, mode="enforce", attribute=False,
                           known={r.shape: r for r in fresh.sweep.pool_fit.steps},
                           known_held=3 * MiB, held=lambda phase: 100 * MiB)
    assert again.held.consumed_bytes == fresh.held.consumed_bytes == CONSUMED + 3 * MiB
    assert again.sweep.pool_fit.held_bytes == 3 * MiB


def test_a_cache_entry_keeps_the_larger_reading_of_a_shape():
    shape = Shape(kind="prefill", rows=64, context_len=0, num_reqs=3)
    low = StepResult(shape=shape, peak_bytes=10, seconds=0.1, top_op="x")
    high = dataclasses.replace(low, peak_bytes=12, top_op=None)
    other = dataclasses.replace(low, shape=dataclasses.replace(shape, num_reqs=4))
    assert core.merged_readings((low,), (high, other)) == (high, other)
    assert core.merged_readings((high,), (low,)) == (high,)


def test_a_reading_one_rank_lacks_is_measured_on_every_rank():
    """Ranks measure the same steps (a step holds collectives): a shape is taken from the cache
    only where every rank has it, so a rank with every reading still measures the one another
    rank's entry lacks."""
    driver, facts, first, fresh, _ = fitted_start(per_request, CONSUMED)
    steps = fresh.sweep.pool_fit.steps
    missing = steps[0].shape

    class Known(dict):  # this rank's readings: all of them; it remembers the shape asked about
        asked = None

        def __contains__(self, shape):
            Known.asked = shape
            return super().__contains__(shape)

    def agree_max(v: int) -> int:  # the other rank lacks `missing`, and has every other one
        lacks, Known.asked = Known.asked == missing, None  # only the question just asked
        return max(v, int(lacks))

    driver.shapes.clear()
    again, _ = fit_to_pool(driver, facts, first, decide, mode="enforce", attribute=False,
                           known=Known({r.shape: r for r in steps}), agree_max=agree_max)
    worst = again.sweep.worst.shape  # measured again where its reading was taken
    assert driver.shapes == [missing] + ([worst] if worst != missing else [])
    assert again.sweep.pool_fit.reused == len(steps) - 1


def test_the_cached_readings_checked_are_the_largest_by_need_and_by_peak():
    """The admitted transient is set by the largest peak, the worst step by the largest need:
    where two cached readings hold those, both are measured again, and either one reading above
    its cached figure drops them all."""
    from worstcase_profiler.adapter import pool_fit as adapter

    a = StepResult(shape=Shape(kind="prefill", rows=512, context_len=0, num_reqs=9),
                   peak_bytes=10 * MiB, seconds=0.1, workspace_bytes=8 * MiB)  # by need
    b = StepResult(shape=Shape(kind="prefill", rows=512, context_len=0, num_reqs=8),
                   peak_bytes=12 * MiB, seconds=0.1)  # by peak
    sweep = dataclasses.replace(fitted_start(per_request, CONSUMED)[3].sweep, worst=a)

    class Driver(FakeDriver):
        def __init__(self, now):
            super().__init__(LIMITS, transient=per_request)
            self.now = now

        def measure(self, shape, attribute=False):
            self.shapes.append(shape)
            return self.now[shape]

    same = Driver({a.shape: a, b.shape: dataclasses.replace(b, top_op="op")})
    assert adapter._cached_readings_hold(same, sweep, [a, b], 0, lambda v: v, True) == (True, None)
    assert same.shapes == [a.shape, b.shape]
    grown = Driver({a.shape: a, b.shape: dataclasses.replace(b, peak_bytes=b.peak_bytes + 1)})
    assert adapter._cached_readings_hold(grown, sweep, [a, b], 0, lambda v: v, True)[0] is False


def test_a_round_another_rank_refused_refuses_this_rank_too_and_runs_nothing_more():
    """The first round's refusal is agreed: a rank whose own plan fits is refused with the
    others, and neither checks cached readings nor attributes a worst step (steps the refused
    ranks would not run)."""
    driver = FakeDriver(LIMITS, transient=per_request)
    facts = measured(run_sweep(driver, tolerance=0, attribute_ops=False), consumed=CONSUMED)
    first = decide(facts)
    calls = []

    def agree_max(v: int) -> int:  # every question after the first: another rank says "refused"
        calls.append(v)
        return v if len(calls) == 1 else max(v, 1)

    driver.shapes.clear()
    fitted, answer = fit_to_pool(driver, facts, first, decide, mode="enforce", attribute=True,
                                 agree_max=agree_max)
    assert isinstance(answer.budget.error, DoesNotFit)
    assert "another rank" in str(answer.budget.error)
    assert fitted.sweep.pool_fit is not None
    assert set(driver.shapes) == set(r.shape for r in fitted.sweep.pool_fit.steps)  # no more


def _entry_of_a_fitted_start(transient=per_request, consumed: int = CONSUMED):
    """A first start fitted to its pool and what its entry gives a restart: (the driver, the
    start's facts before the fit and after it, the entry's pool, the entry's readings)."""
    driver, facts, _, fresh, _ = fitted_start(transient, consumed)
    return (driver, facts, fresh, fresh.sweep.pool_fit.pool_tokens,
            {r.shape: r for r in core.kept_readings(fresh.sweep)})


def _holding_more(facts: budget.Measured, more: int) -> budget.Measured:
    """`facts` with `more` bytes consumed: a restart whose budget leaves a smaller pool."""
    return dataclasses.replace(facts, held=dataclasses.replace(
        facts.held, consumed_bytes=facts.held.consumed_bytes + more))


def _said(caplog, marker: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if marker in r.getMessage()]


def test_a_restart_left_a_smaller_pool_plans_for_the_entrys_and_measures_none_of_its_shapes():
    """h100-run87: the hybrid's restart with graphs set aside vLLM's larger graph estimate, so
    its budget left a pool 0.9% smaller than its first start's fit planned for; that pool's plan
    added shapes the entry had no reading of, and the restart measured its fit again (4.70 s).
    Within one rounding step of the entry's pool (CacheEntry.pool_fit_pool_tokens) it plans for
    that one instead, whose plan bounds every step the smaller pool forms, takes every reading
    from the entry, admits the first start's transient, and allocates no more than that pool.
    Further below, the larger plan's transient would leave it much less KV than its own fit:
    its own rounds run (taking what readings the entry has)."""
    driver, facts, fresh, pool, known = _entry_of_a_fitted_start()

    def restart(requests_less: int, **kw):
        smaller = _holding_more(facts, requests_less * 64 * KiB)
        less = decide(smaller)
        driver.shapes.clear()
        return usable(less.budget.budget_bytes), fit_to_pool(
            driver, smaller, less, decide, mode="enforce", attribute=False, known=known, **kw)

    own_pool, (own, _) = restart(4)
    assert own_pool < pool and own.sweep.pool_fit.pool_tokens < pool
    assert set(driver.shapes) - set(known), "its own pool's plan adds shapes: measured"
    _, (again, answer) = restart(4, known_pool=pool)
    fit = again.sweep.pool_fit
    assert fit.pool_tokens == pool and fit.reused == len(fit.steps) > 0
    assert set(driver.shapes) <= set(known)  # only the two taken readings measured again
    assert again.sweep.peak_bytes == fresh.sweep.peak_bytes
    assert usable(answer.admission.kv_cache_bytes) <= pool
    # more than one rounding step below (40 requests' worth), a pool not above this start's
    # own, or one whose plan is not all known: its own rounds
    needed = core.replan(facts.limits, facts.sweep.coverage.worst_rows, pool).added[0]
    for less, known_pool, have in ((40, pool, known), (4, own_pool, known),
                                   (4, pool, {s: r for s, r in known.items() if s != needed})):
        known, kept = have, known
        _, (mine, _) = restart(less, known_pool=known_pool)
        known = kept
        assert mine.sweep.pool_fit.pool_tokens < pool, (less, known_pool)


def test_an_entry_pool_not_taken_says_why(caplog):
    """h100-run88: the hybrid's restart with graphs measured its fit again (4.70 s) although its
    entry held a fitted pool, and nothing said why. Each refusal names its reason."""
    import logging

    driver, facts, fresh, pool, known = _entry_of_a_fitted_start()
    smaller = _holding_more(facts, 4 * 64 * KiB)
    less = decide(smaller)
    needed = core.replan(facts.limits, facts.sweep.coverage.worst_rows, pool).added[0]
    cases = ((pool, {s: r for s, r in known.items() if s != needed},
              f"no reading of (first: {needed.label()})"),
             (1, known, "it must lie between"), (pool, {}, "the entry holds no readings"))
    for known_pool, have, why in cases:
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="vllm.wcprof"):
            fit_to_pool(driver, smaller, less, decide, mode="enforce", attribute=False,
                        known=have, known_pool=known_pool)
        said = _said(caplog, "is not taken")
        assert len(said) == 1 and why in said[0], (why, said)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="vllm.wcprof"):
        fit_to_pool(driver, smaller, less, decide, mode="enforce", attribute=False,
                    known=known, known_pool=pool)
    assert not _said(caplog, "is not taken")
    far = _holding_more(facts, 40 * 64 * KiB)  # taken, then too far below
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="vllm.wcprof"):
        fit_to_pool(driver, far, decide(far), decide, mode="enforce", attribute=False,
                    known=known, known_pool=pool)
    said = _said(caplog, "own rounds run")
    assert len(said) == 1 and "more than one rounding step below it" in said[0], said


def _hybrid_h100_geometry(monkeypatch):
    """h100-run88/89's Qwen3.5 hybrid with graphs, in this module's fake terms (784-token blocks,
    3 recurrent-state blocks and 8 blocks a request on a shared prefix, a 1,376,256-token plan,
    80 GiB asked), fitted on a first start: _entry_of_a_fitted_start's tuple."""
    import sys

    here = sys.modules[__name__]
    limits = Limits(max_model_len=131072, max_num_batched_tokens=8192, max_num_seqs=1024,
                    block_size=784, kv_capacity_tokens=1_376_256, prefix_caching=True,
                    state_request_tokens=2352, prefix_request_tokens=6272)
    for name, value in (("LIMITS", limits), ("BPT", 32 * KiB), ("REQUESTED", 80 << 30)):
        monkeypatch.setattr(here, name, value)
    return _entry_of_a_fitted_start(lambda s: s.num_reqs * 8 * MiB + s.rows * 64 * KiB,
                                    (80 << 30) - 1_376_256 * 32 * KiB + (5 << 30))


def test_the_entry_pool_is_taken_on_the_hybrids_h100_geometry(monkeypatch):
    """A first start fitted in 2 rounds, a restart left about 400 MB less: the pure logic takes
    the entry's pool and every reading (on the GPU the V2 runner's unbuildable mixed step kept
    it from doing so: the next test)."""
    driver, facts, fresh, _, known = _hybrid_h100_geometry(monkeypatch)
    fit = fresh.sweep.pool_fit
    assert fit is not None and fit.rounds == 2
    smaller = _holding_more(facts, 400 * MiB)
    driver.shapes.clear()
    again, _ = fit_to_pool(driver, smaller, decide(smaller), decide, mode="enforce",
                           attribute=False, known=known, known_pool=fit.pool_tokens)
    assert again.sweep.pool_fit.pool_tokens == fit.pool_tokens
    assert again.sweep.pool_fit.reused == len(again.sweep.pool_fit.steps) > 0


def test_the_entry_pool_is_taken_where_its_plan_adds_a_shape_the_runner_cannot_build(
        monkeypatch, caplog):
    """h100-run89 (the hybrid's restart with graphs, e39dec6's log line): "its plan adds 1
    shape(s) the entry has no reading of (first: mixed rows=8192 ctx=123220 reqs=341)". vLLM's V2
    runner cannot build a hybrid's mixed step (core/sweep.cannot_build), so the first start's fit
    skipped it and its entry has no reading of it: the entry's pool is taken all the same, and
    the round skips that shape as the first start's did."""
    import logging

    monkeypatch.setattr(FakeDriver, "cannot_build", lambda self, shape: (
        "the V2 runner builds no mixed step on a hybrid" if shape.kind == "mixed" else None))
    driver, facts, fresh, pool, known = _hybrid_h100_geometry(monkeypatch)
    added = core.replan(facts.limits, facts.sweep.coverage.worst_rows, pool).added
    assert any(s.kind == "mixed" for s in added)  # the shape no entry has a reading of
    assert not any(s.kind == "mixed" for s in known)
    smaller = _holding_more(facts, 400 * MiB)
    driver.shapes.clear()
    with caplog.at_level(logging.INFO, logger="vllm.wcprof"):
        again, _ = fit_to_pool(driver, smaller, decide(smaller), decide, mode="enforce",
                               attribute=False, known=known, known_pool=pool)
    assert not _said(caplog, "is not taken")
    fit = again.sweep.pool_fit
    assert fit.pool_tokens == pool and fit.reused == len(fit.steps) > 0
    assert set(driver.shapes) <= set(known)  # no step measured but the two taken ones again
    newly = {s for s, _ in again.sweep.skipped} - {s for s, _ in facts.sweep.skipped}
    assert {s for s in added if s.kind == "mixed"} <= newly  # skipped by this round, as before


def test_an_entry_pool_another_rank_refuses_says_so_on_this_rank(caplog):
    """The messages where the ranks disagree (a fake world of two: agree returns the larger of
    this rank's value and the other rank's, scripted per call): the other rank's entry holds no
    fitted pool, the ranks' entries planned for different pools (said on the rank whose pool is
    the larger too), the other rank could not take it."""
    import logging

    from worstcase_profiler.adapter.pool_fit import _entry_pool

    _, facts, _, pool, known = _entry_of_a_fitted_start()
    tokens = usable(decide(_holding_more(facts, 4 * 64 * KiB)).budget.budget_bytes)
    assert _entry_pool(facts.limits, facts.sweep, tokens, known, pool, lambda v: v) == pool
    for other, why in (([1], "another rank's entry holds no fitted pool"),
                       ([0, pool - 16, 1], "the ranks' entries planned for different pools"),
                       ([0, pool, 0, 1], "another rank could not take it")):
        script = iter(other)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="vllm.wcprof"):
            got = _entry_pool(facts.limits, facts.sweep, tokens, known, pool,
                              lambda v: max(v, next(script)))
        said = _said(caplog, "is not taken")
        assert got is None and len(said) == 1 and why in said[0], (why, said)
        assert next(script, None) is None  # every scripted agreement was asked for
