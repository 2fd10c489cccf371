"""The context-aware chunk cap (core/chunk_cap.py, adapter/chunk_cap.py's pure parts) over the
advisor's fake engine: the step function, the levels it decides from a sweep, the capped
admission beside the uncapped one, the scheduler's clamp and the guard's count."""

from __future__ import annotations

import dataclasses

import pytest

from worstcase_profiler.adapter.chunk_cap import StepBudget, clamp, describe
from worstcase_profiler.core import budget
from worstcase_profiler.core import chunk_cap as core
from worstcase_profiler.core.guard import StepLedger
from worstcase_profiler.core.shapes import Limits
from worstcase_profiler.core.sweep import run_sweep
from worstcase_profiler.core.types import (ChunkCapMeasurements, Shape, StepResult,
                                           WarmupEstimate, Workspace)
from worstcase_profiler.errors import ConfigError
from worstcase_profiler.settings import from_mapping

from test_advise import BPT, HELD, FakeDriver

LIMITS = Limits(max_model_len=4096, max_num_batched_tokens=1024, max_num_seqs=4, block_size=16,
                kv_capacity_tokens=65536)


def context_scaled(shape: Shape) -> int:
    """A transient of rows x the longest KV extent (the scratch fixture's rule), per request."""
    per_req = -(-shape.rows // shape.num_reqs)
    longest = shape.context_len + per_req
    if shape.kind == "mixed":
        longest = LIMITS.max_model_len
    return 64 * shape.rows * longest + 100_000


def measured(limits=LIMITS, rows=256, transient=context_scaled):
    driver = FakeDriver(limits, transient=transient)
    sweep = run_sweep(driver, tolerance=0)
    missing = core.missing_shapes(limits, sweep, rows)
    with driver.provisional_kv():
        steps = tuple(driver.measure(s) for s in missing)
        timings = tuple(driver.measure(s) for s in core.timing_shapes(limits, rows))
    return sweep, ChunkCapMeasurements(rows=rows, steps=steps, timings=timings)


def test_rows_at_is_a_step_function_taking_the_next_measured_point_above():
    levels = ((512, 1024), (4096, 256))
    assert core.rows_at(levels, 0) == 1024
    assert core.rows_at(levels, 512) == 1024
    assert core.rows_at(levels, 513) == 256  # between points: the next point above's bound
    assert core.rows_at(levels, 10_000) == 256  # beyond the last point: the last level
    with pytest.raises(ValueError):
        core.rows_at((), 0)


def test_full_chunk_levels_stop_at_the_first_context_that_needs_more_than_the_capped_engine():
    sweep, m = measured()
    plan = core.decide(LIMITS, sweep, m, workspace_bytes=0)
    # rows x extent x 64: the capped chunk at full extent needs 256 x 4096 x 64 = 64 MiB; the
    # full chunk fits under that while 1024 x (ctx + 1024) <= 256 x 4096, i.e. at ctx 0 only
    # among the ladder's points 0, 512, 1024, 2048
    assert [(lv.up_to_context, lv.rows) for lv in plan.levels] == [(0, 1024), (4096, 256)]
    assert plan.transient_bytes < plan.uncapped_transient_bytes == sweep.peak_bytes
    top = core.chunk_worst(LIMITS, sweep, 256, (*m.steps, *m.timings), workspace_bytes=0)
    assert plan.transient_bytes == top.transient_bytes
    assert plan.levels[-1].need_bytes == top.transient_bytes


def test_a_shape_the_bound_needs_but_nobody_measured_is_an_error_not_a_figure():
    sweep, m = measured()
    ran = {r.shape for r in m.steps}
    level = next(s for _, found in core.level_shapes(LIMITS, sweep) for s in found if s in ran)
    short = dataclasses.replace(m, steps=tuple(r for r in m.steps if r.shape != level))
    with pytest.raises(ValueError, match="neither in the sweep nor measured"):
        core.decide(LIMITS, sweep, short, workspace_bytes=0)


def test_where_no_full_chunk_point_fits_the_cap_is_the_capped_rows_everywhere():
    flat = lambda s: 1000 * s.rows + 10 * s.context_len  # noqa: E731 - rows dominate
    sweep, m = measured(transient=flat)
    plan = core.decide(LIMITS, sweep, m, workspace_bytes=0)
    assert [(lv.up_to_context, lv.rows) for lv in plan.levels] == [(4096, 256)]


def test_capped_rows_must_be_an_engine_chunk_below_the_configured_one():
    for bad in (1024, 2048, 2):
        with pytest.raises(ValueError):
            core.check_rows(LIMITS, bad)
    assert from_mapping({"chunk_cap": "256"}).chunk_cap == 256
    assert from_mapping({}).chunk_cap is None  # off by default
    with pytest.raises(ConfigError):
        from_mapping({"chunk_cap": 0})


def _measured_start(sweep, m, plan, ws_total=0):
    return budget.Measured(
        limits=LIMITS, sweep=sweep, held=HELD, workspace=Workspace(total_bytes=ws_total),
        warmup=WarmupEstimate(), stock_kv_bytes=5 << 30, bytes_per_token=BPT,
        one_request_bytes=BPT * 4096, explicit_kv_bytes=None, tolerance_bytes=0,
        chunk_cap_measurements=m, chunk_cap_plan=plan)


def test_the_capped_admission_gains_exactly_the_transient_it_no_longer_reserves():
    sweep, m = measured()
    plan = core.decide(LIMITS, sweep, m, workspace_bytes=0)
    plain = budget.decide(dataclasses.replace(_measured_start(sweep, m, plan),
                                              chunk_cap_measurements=None, chunk_cap_plan=None),
                          mode="enforce", margin_bytes=0)
    capped = budget.decide(_measured_start(sweep, m, plan), mode="enforce", margin_bytes=0)
    rec = capped.chunk_cap
    assert rec.uncapped_budget_bytes == plain.admission.budget_bytes
    assert rec.budget_bytes == capped.admission.budget_bytes
    # allocated: never more than the pool the sweep planned its shapes for (budget.planned_pool)
    pool = LIMITS.kv_capacity_tokens * BPT
    assert capped.budget.budget_bytes == min(rec.budget_bytes, pool)
    assert rec.budget_bytes <= pool or "held at the KV pool" in capped.budget.reason
    assert rec.gained_bytes == sweep.peak_bytes - plan.transient_bytes > 0
    assert rec.gained_tokens == rec.kv_tokens - rec.uncapped_kv_tokens > 0
    assert capped.predicted_transient_bytes == plan.transient_bytes
    assert rec.capped_prefill_tokens_per_s and rec.uncapped_prefill_tokens_per_s
    assert rec.prefill_throughput_lost == pytest.approx(
        1 - rec.capped_prefill_tokens_per_s / rec.uncapped_prefill_tokens_per_s)
    from worstcase_profiler.render.view import chunk_cap_text

    line = chunk_cap_text(rec)  # the terminal's and the HTML's detail line
    assert line.startswith("chunk cap: ") and f"({rec.gained_tokens:+,} tokens)" in line
    assert f"{rec.plan.levels[-1].rows:,} beyond ctx" in line and "x uncapped" in line


def test_a_shrunk_workspace_is_credited_and_the_uncapped_figure_holds_the_grown_one():
    ws = lambda s: 8 * s.rows * (s.context_len + s.rows)  # noqa: E731 - context-scaled workspace
    driver = FakeDriver(LIMITS, transient=lambda s: 100_000, workspace=ws)
    sweep = run_sweep(driver, tolerance=0)
    with driver.provisional_kv():
        steps = tuple(driver.measure(s) for s in core.missing_shapes(LIMITS, sweep, 256))
        timings = tuple(driver.measure(s) for s in core.timing_shapes(LIMITS, 256))
    m = ChunkCapMeasurements(rows=256, steps=steps, timings=timings)
    grown = 64 << 20
    plan = core.decide(LIMITS, sweep, m, workspace_bytes=grown)
    assert plan.workspace_bytes < grown
    start = _measured_start(sweep, m, plan, ws_total=plan.workspace_bytes)
    rec = budget.decide(start, mode="enforce", margin_bytes=0).chunk_cap
    assert rec.gained_bytes == grown - plan.workspace_bytes + sweep.peak_bytes \
        - plan.transient_bytes


def test_the_scheduler_clamp_bounds_a_step_by_its_longest_requests_context():
    levels = ((512, 1024), (4096, 256))
    state = StepBudget(step=1, limit=1024)
    # a short-context prefill takes 600 tokens; then a long-context decode finds no room
    state.limit, got = clamp(levels, state.limit, state.used, 100, 600)
    state.used += got
    assert got == 600
    state.limit, got = clamp(levels, state.limit, state.used, 3000, 1)
    assert got == 0 and state.limit == 256
    # the long request first: everything after it shares its 256
    state = StepBudget(step=2, limit=1024)
    state.limit, got = clamp(levels, state.limit, state.used, 3000, 1000)
    state.used += got
    state.limit, more = clamp(levels, state.limit, state.used, 0, 1000)
    assert (got, more) == (256, 0)
    assert "ctx 513..4096: 256 tokens" in describe(levels)


def test_the_guard_counts_steps_over_the_cap_and_says_so_once():
    ledger = StepLedger(predicted=1, available=1, cap=((512, 1024), (4096, 256)))
    assert not ledger.record_cap(1024, 512)
    assert ledger.record_cap(300, 513)  # the first one over: logged
    assert not ledger.record_cap(300, 4000)  # counted, not logged
    assert ledger.over_cap == 2
    plain = StepLedger(predicted=1, available=1)
    assert not plain.record_cap(10 ** 6, 10 ** 6)
    assert core.step_over_cap(((512, 1024), (4096, 256)), 257, 600)
    assert isinstance(StepResult, type)


@pytest.mark.parametrize("change, needle", [
    (dict(cuda=True), "on CUDA"),
    (dict(chunked=False), "chunked prefill is off"),
    (dict(align=True), "'align' mode"),
    (dict(dp=2), "data parallelism"),
])
def test_the_cap_is_refused_where_it_would_not_bound_the_steps(change, needle):
    from types import SimpleNamespace

    from worstcase_profiler.adapter.chunk_cap import check_supported
    from worstcase_profiler.errors import ConfigError

    cfg = SimpleNamespace(
        scheduler_config=SimpleNamespace(enable_chunked_prefill=change.get("chunked", True)),
        cache_config=SimpleNamespace(mamba_cache_mode="align" if change.get("align") else "none"),
        model_config=SimpleNamespace(is_hybrid=True),
        parallel_config=SimpleNamespace(data_parallel_size=change.get("dp", 1)))
    with pytest.raises(ConfigError, match=needle):
        check_supported(from_mapping({"chunk_cap": 128}), cfg, cuda=change.get("cuda", False))
    check_supported(from_mapping({}), cfg, cuda=True)  # off: nothing to refuse
