"""`wcprof fit` (core/fit.py + adapter/fitting.py) over the advisor's fake StepDriver: every
candidate is derived from one sweep at the largest limits, the advisor's steps and the fit's own,
and none may claim less than a sweep of an engine started with its limits would measure,
whatever KV pool that engine gets; between measured points the bound is the next point above and
never below a measured neighbour."""

from __future__ import annotations

import dataclasses

import pytest

from test_advise import BPT, HELD, LIMITS, FakeDriver, NoMixedDriver, affine
from worstcase_profiler.adapter.advice import measure_candidates
from worstcase_profiler.adapter.fitting import measure, measure_fit
from worstcase_profiler.core import advise as core_advise
from worstcase_profiler.core import fit as core
from worstcase_profiler.core.admission import compute_admission
from worstcase_profiler.core.sweep import run_sweep
from worstcase_profiler.core.types import Shape, StepResult, Workspace
from worstcase_profiler.settings import ConfigError, from_mapping

MiB = 1 << 20
TOTAL = 16 << 30


def _step(kind, rows, ctx, reqs, need):
    return StepResult(Shape(kind, rows, ctx, reqs), peak_bytes=need, seconds=0.01)


def _admission(sweep, limits=LIMITS, explicit_kv=None):
    return compute_admission(
        requested=HELD.requested_bytes, consumed=HELD.consumed_bytes,
        weights=HELD.weights_bytes, non_torch=HELD.non_torch_bytes,
        worst_transient=sweep.peak_bytes, stock_need=sweep.stock.need_bytes, stock_kv=5 << 30,
        cudagraph=0, margin=64 * MiB, bytes_per_token=BPT, block_size=16,
        max_model_len=limits.max_model_len, explicit_kv=explicit_kv)


def _fit(limits=LIMITS, *, n=1, objective="context", explicit_kv=None, driver=FakeDriver,
         **driver_kw):
    """The whole flow as a start runs it: sweep, advisor, the fit's own steps, the decision."""
    drv = driver(limits, **driver_kw)
    sweep = run_sweep(drv, tolerance=0, attribute_ops=False)
    chunks, excluded = core_advise.candidate_chunks(limits.max_num_batched_tokens,
                                                    max_num_seqs=limits.max_num_seqs)
    am = measure_candidates(drv, limits, sweep, chunks, excluded=excluded)
    adm = _admission(sweep, limits, explicit_kv)
    advice = core_advise.advise(limits, sweep, held=HELD, admission=adm, workspace=Workspace(),
                                measured=am)
    before = len(drv.shapes)
    fm = measure_fit(drv, limits, sweep, chunks, core.seqs_candidates(limits.max_num_seqs, n),
                     advice=am)
    fit_steps = drv.shapes[before:]
    facts = core.FitFacts(limits=limits, sweep=sweep, held=HELD, admission=adm,
                          workspace=Workspace(), measured=fm, advice=advice,
                          device_total_bytes=TOTAL, gpu_memory_utilization=0.5)
    return core.fit(facts, min_concurrency=n, objective=objective), facts, fit_steps


def _own_sweep(cand, base=LIMITS, driver=FakeDriver, pool=None, **driver_kw):
    """A sweep of an engine started with the candidate's limits and KV pool (tokens)."""
    lim = dataclasses.replace(base, max_model_len=cand.max_model_len,
                              max_num_batched_tokens=cand.max_num_batched_tokens,
                              max_num_seqs=cand.max_num_seqs, kv_capacity_tokens=pool)
    return run_sweep(driver(lim, **driver_kw), tolerance=0, attribute_ops=False)


# --- the bound between measured points ---------------------------------------------------------

RISING = [_step("prefill", 512, c, 1, 10 * MiB + c * 1024) for c in (0, 512, 1024, 2048, 3584)]


def test_between_measured_contexts_the_next_point_above_bounds_never_an_interpolation():
    witnesses = core.bound(Shape("prefill", 512, 1500, 1), RISING)
    # the curve rises from 1024 to 2048: 1500 takes 2048's figure (its neighbour below and a
    # chord between the two would both say less)
    assert max(r.need_bytes for r in witnesses) == 10 * MiB + 2048 * 1024
    assert 3584 not in {r.shape.context_len for r in witnesses}  # nothing further above
    exact = core.bound(Shape("prefill", 512, 1024, 1), RISING)
    assert max(r.need_bytes for r in exact) == 10 * MiB + 1024 * 1024


def test_a_figure_is_never_below_a_measured_neighbour_on_either_side():
    bumpy = [_step("prefill", 512, 1000, 1, 5 * MiB), _step("prefill", 512, 2000, 1, 9 * MiB),
             _step("prefill", 512, 4000, 1, 6 * MiB)]
    for ctx in (1500, 2000, 3000):  # the point at 2000 is a neighbour of each
        assert max(r.need_bytes for r in core.bound(Shape("prefill", 512, ctx, 1), bumpy)) \
            == 9 * MiB, ctx
    # below every measured point: the lowest is the next above, and only it
    assert max(r.need_bytes for r in core.bound(Shape("prefill", 512, 10, 1), bumpy)) == 5 * MiB


def test_a_shape_above_every_measurement_is_not_measured_never_given_a_lower_figure():
    with pytest.raises(core.NotMeasured):
        core.bound(Shape("prefill", 512, 3600, 1), RISING)
    with pytest.raises(core.NotMeasured):  # another rows value is another family
        core.bound(Shape("prefill", 511, 0, 1), RISING)


def test_decode_batches_are_bounded_by_ones_with_as_many_requests_or_more():
    decodes = [_step("decode", 2, 4095, 2, 1 * MiB), _step("decode", 8, 1023, 8, 3 * MiB)]
    got = core.bound(Shape("decode", 4, 511, 4), decodes)
    assert max(r.need_bytes for r in got) == 3 * MiB
    # 4 requests at 2,047: the pool-limited batch has too few requests, the wide one too short
    # a context; neither bounds it
    with pytest.raises(core.NotMeasured):
        core.bound(Shape("decode", 4, 2047, 4), decodes)
    # a mixed step only by one with as many requests: fewer decodes leave a longer chunk
    assert not core.covers(Shape("mixed", 512, 3591, 8), Shape("mixed", 512, 1000, 2))
    assert not core.covers(Shape("mixed", 512, 3591, 2), Shape("mixed", 512, 1000, 8))
    assert core.covers(Shape("mixed", 512, 3591, 8), Shape("mixed", 512, 1000, 8))
    assert not core.covers(Shape("prefill", 512, 4032, 8), Shape("prefill", 512, 100, 4))


# --- the grid --------------------------------------------------------------------------------

def test_the_grids_of_max_num_seqs_and_max_model_len():
    assert core.seqs_candidates(512) == (512, 128, 32, 8, 1)
    assert core.seqs_candidates(512, 16) == (512, 128, 32, 16)
    assert core.seqs_candidates(8, 3) == (8, 3)
    assert core.seqs_candidates(8, 9) == (8,)  # none reaches it: the fit says so, not this
    assert core.context_rungs(4096, 16, 512) == (4096, 2048, 1024, 512)
    assert core.context_rungs(4096, 16, 1024) == (4096, 2048, 1024)
    assert core.context_rungs(131072, 16, 8192) == (131072, 65536, 32768, 16384)


def test_the_longest_context_is_found_in_whole_blocks_or_at_the_top():
    assert core.longest_context(lambda m: m <= 2725, lo=512, hi=4096, block_size=16) == 2720
    assert core.longest_context(lambda m: True, lo=512, hi=4100, block_size=16) == 4100
    assert core.longest_context(lambda m: False, lo=512, hi=4096, block_size=16) is None


# --- whole fits over the fake engine -----------------------------------------------------------

SMALL_POOL = dataclasses.replace(LIMITS, kv_capacity_tokens=8192)  # two requests at 4,096


@pytest.mark.parametrize("limits", [LIMITS, SMALL_POOL], ids=["roomy-pool", "two-request-pool"])
@pytest.mark.parametrize("explicit_kv", [None, 8 * MiB * 4], ids=["budget", "explicit"])
def test_no_candidate_claims_less_than_its_own_engines_sweep_whatever_its_pool(limits,
                                                                               explicit_kv):
    """The fit's answer for every candidate is at least what a sweep of an engine started with
    its limits measures, with the pool its KV cache gives it or with the swept one."""
    f, facts, _ = _fit(limits, explicit_kv=explicit_kv)
    assert f.candidates
    for c in f.candidates:
        for pool in (c.kv_tokens, limits.kv_capacity_tokens, None):
            own = _own_sweep(c, limits, pool=pool)
            assert own.peak_bytes <= c.transient_bytes, (c.limits, pool)


def steep_decode(shape: Shape) -> int:
    """A decode batch whose need rises steeply with the KV extent it reads: the swept engine's
    pool holds two requests at 4,096, so its own decode batch is short of requests and its widest
    one short of context; a shorter max_model_len lets 8 requests sit far deeper."""
    if shape.kind == "decode":
        return 400 * shape.num_reqs * (shape.context_len + 1) + 100_000
    return affine(shape) // 4


def test_a_decode_batch_only_a_shorter_context_can_form_is_measured_not_assumed():
    f, _, fit_steps = _fit(SMALL_POOL, transient=steep_decode)
    # the unbounded plan's batch: 8 requests at the full swept context, run by the fit
    assert Shape("decode", 8, 4095, 8) in fit_steps
    for c in f.candidates:
        own = _own_sweep(c, SMALL_POOL, pool=c.kv_tokens, transient=steep_decode)
        assert own.peak_bytes <= c.transient_bytes, c.limits
    at_full = next(c for c in f.candidates if c.limits == (4096, 1024, 8))
    assert at_full.worst_shape.kind == "decode"
    assert at_full.transient_bytes >= steep_decode(Shape("decode", 8, 4095, 8))
    # at 1,024 the widest batch was measured exactly (8 requests at 1,023): that figure, lower
    at_1024 = next(c for c in f.candidates if c.limits == (1024, 1024, 8))
    assert at_1024.bounded_by is None and at_1024.worst_shape == Shape("decode", 8, 1023, 8)
    assert at_1024.transient_bytes < at_full.transient_bytes


def rising_curve(shape: Shape) -> int:
    """The worst rows value's need jumps between two context-ladder rungs (1,024 and 2,048) on a
    single request: a candidate whose longest context lies between them must get the upper
    figure."""
    base = affine(shape)
    if shape.kind == "prefill" and shape.num_reqs == 1 and shape.context_len > 1500:
        return base + 30 * MiB
    return base


def test_a_curve_that_rises_between_measured_points_does_not_under_predict():
    f, _, _ = _fit(transient=rising_curve)
    between = [c for c in f.candidates if 1500 < c.max_model_len < 4096]
    assert between
    for c in f.candidates:
        own = _own_sweep(c, transient=rising_curve)
        assert own.peak_bytes <= c.transient_bytes, c.limits
        if c.max_model_len - c.max_num_batched_tokens > 1500:
            assert c.transient_bytes >= 30 * MiB, c.limits


def test_the_swept_configuration_is_never_given_less_than_its_start_admitted():
    f, facts, _ = _fit()
    swept = next(c for c in f.candidates if c.limits == (4096, 1024, 8))
    assert swept.transient_bytes >= facts.sweep.peak_bytes
    assert swept.budget_bytes <= facts.admission.budget_bytes


def test_the_swept_configuration_keeps_the_flag_held_at_the_planned_pool():
    """Where the start's flag is held at the pool its measured plan covers (budget.held_at_pool:
    the fit to the admitted pool, or the sweep's pool with stock left out), fit's candidate for
    that very configuration recommends no more: a larger KV cache holds wider steps than any
    measured. Other candidates are not held by it."""
    f, facts, _ = _fit()
    swept = next(c for c in f.candidates if c.limits == (4096, 1024, 8))
    adm = facts.admission
    held = adm.recommended_kv_cache_memory_bytes - 64 * MiB
    facts = dataclasses.replace(facts, admission=dataclasses.replace(
        adm, pool_ceiling_bytes=held, recommended_kv_cache_memory_bytes=held))
    again = core.fit(facts, min_concurrency=1, objective="context")
    after = next(c for c in again.candidates if c.limits == (4096, 1024, 8))
    assert swept.kv_cache_bytes > held and after.kv_cache_bytes == held
    others = [(c.limits, c.kv_cache_bytes) for c in f.candidates if c.limits != swept.limits]
    assert others == [(c.limits, c.kv_cache_bytes) for c in again.candidates
                      if c.limits != swept.limits]


def test_the_context_objective_finds_the_longest_max_model_len_holding_n_requests():
    explicit = 8192 * BPT  # 8,192 tokens: two requests at 4,096, three at 2,720
    f, _, _ = _fit(n=3, explicit_kv=explicit)
    r = f.recommended
    assert r is not None and r.max_model_len == 2720 and r.concurrency == 3
    assert r.kv_cache_bytes == explicit and r.kv_tokens == 8192
    assert r.feasible and r.frontier
    assert not any(c.feasible for c in f.candidates if c.max_model_len > 2720)
    assert f.flags[:2] == ("--max-model-len", "2720")
    assert f.flags[-2:] == ("--kv-cache-memory-bytes", str(explicit))
    # CUDA at 0.5, below vLLM's default 0.92: the share still gates the start (request_memory)
    assert f.flags[-4:-2] == ("--gpu-memory-utilization", "0.5")
    # the fastest chunk: every chunk holds the same explicit KV, the advisor timed them
    best_rate = max(c.prefill_tokens_per_s for c in f.candidates if c.max_model_len == 2720)
    assert r.prefill_tokens_per_s == best_rate


def test_concurrency_and_throughput_stay_at_the_swept_max_model_len():
    roomy = dataclasses.replace(LIMITS, max_num_seqs=64)  # KV, not seqs, caps concurrency
    explicit = 40 * 4096 * BPT
    conc, _, _ = _fit(roomy, n=2, objective="concurrency")
    fast, _, _ = _fit(roomy, n=2, objective="throughput", explicit_kv=explicit)
    for f in (conc, fast):
        assert f.recommended.max_model_len == 4096 and f.recommended.concurrency >= 2
    at_4096 = [c for c in conc.candidates if c.max_model_len == 4096 and c.feasible]
    assert conc.recommended.concurrency == max(c.concurrency for c in at_4096)
    assert fast.recommended.prefill_tokens_per_s == max(
        c.prefill_tokens_per_s for c in fast.candidates if c.max_model_len == 4096 and c.feasible)


def test_none_feasible_gives_no_recommendation_and_no_flags():
    f, _, _ = _fit(n=9)  # above max_num_seqs: no candidate runs 9 at once
    assert f.recommended is None and f.flags == ()
    assert not any(c.feasible for c in f.candidates)


def test_the_frontier_keeps_only_undominated_feasible_candidates():
    f, _, _ = _fit(SMALL_POOL, n=1, explicit_kv=8192 * BPT)
    front = f.frontier
    assert front and all(c.feasible for c in front)
    points = [(c.max_model_len, c.concurrency, c.prefill_tokens_per_s or 0) for c in front]
    for p in points:
        assert not any(q != p and all(x >= y for x, y in zip(q, p)) for q in points)
    # shorter contexts hold more requests: more than one point on it
    assert len({c.max_model_len for c in front}) > 1


def test_the_least_device_share_holds_the_candidates_kv():
    f, facts, _ = _fit(n=2)
    for c in f.candidates:
        need = facts.held.consumed_bytes + c.transient_bytes + 64 * MiB + 2 * c.one_request_bytes
        assert c.min_gpu_memory_utilization * TOTAL >= need
        assert (c.min_gpu_memory_utilization - 0.01) * TOTAL < need
    assert core.share_of(100, 200) == 0.49 and core.share_of(1, 1000) == 0.01


def test_shapes_the_runner_cannot_build_are_left_out_and_said_so():
    f, _, _ = _fit(driver=NoMixedDriver)
    assert f.candidates
    assert all("mixed" in (c.note or "") for c in f.candidates if c.max_num_seqs > 1)


def test_the_fit_runs_only_when_its_setting_is_on_and_its_settings_are_checked():
    drv = FakeDriver(LIMITS)
    sweep = run_sweep(drv, tolerance=0, attribute_ops=False)
    assert measure(drv, LIMITS, sweep, None, from_mapping({})) is None
    got = measure(drv, LIMITS, sweep, None, from_mapping({"fit": True,
                                                           "fit_min_concurrency": "2"}))
    assert got is not None and got.seqs == (8, 2) and got.chunks == (256, 512, 1024)
    for bad in ({"fit_min_concurrency": 0}, {"fit_min_concurrency": "2.5"},
                {"fit_objective": "speed"}):
        with pytest.raises(ConfigError):
            from_mapping(bad)


def test_every_shape_a_candidate_forms_is_covered_after_the_fits_own_steps():
    f, facts, _ = _fit(SMALL_POOL, n=1)
    assert not [n for n in f.notes if "not fitted" in n]
    pool = [*facts.sweep.steps, facts.sweep.stock, *facts.advice.steps, *facts.measured.steps]
    for c in f.candidates:
        for shape in core.candidate_plan(SMALL_POOL, facts.sweep, c.max_model_len,
                                         c.max_num_batched_tokens, c.max_num_seqs):
            assert core.bound(shape, pool)


def test_the_decision_carries_the_fit_and_the_report_serves_it(tmp_path):
    from worstcase_profiler.core import budget
    from worstcase_profiler.core.types import WarmupEstimate
    from worstcase_profiler.report import SCHEMA_VERSION

    drv = FakeDriver(LIMITS)
    sweep = run_sweep(drv, tolerance=0, attribute_ops=False)
    fm = measure_fit(drv, LIMITS, sweep, (256, 1024), (8,))
    m = budget.Measured(limits=LIMITS, sweep=sweep, held=HELD, workspace=Workspace(),
                        warmup=WarmupEstimate(), stock_kv_bytes=5 << 30, bytes_per_token=BPT,
                        one_request_bytes=4096 * BPT, explicit_kv_bytes=None, tolerance_bytes=0,
                        fit_measurements=fm, device_total_bytes=TOTAL,
                        gpu_memory_utilization=0.5)
    d = budget.decide(m, mode="enforce", margin_bytes=64 * MiB, fit_min_concurrency=2)
    assert d.fit is not None and d.fit.recommended is not None and d.fit.min_concurrency == 2
    assert all(c.prefill_tokens_per_s is None for c in d.fit.candidates)  # no advisor: untimed
    assert tuple(map(int, SCHEMA_VERSION.split("."))) >= (1, 10)  # fit arrived in 1.10


@pytest.mark.parametrize("kind, share, shown", [
    ("cuda", 0.5, True),    # below vLLM's default: the plugin's budget and the start check
    ("cuda", 0.92, False),  # the default itself: changes nothing
    ("cuda", 0.95, True),   # above: the plugin would start at 0.92, under the fitted budget
    ("cpu", 0.5, True),     # the plugin's CPU budget is the requested share too
    ("cpu", 0.92, False),
    ("cuda", None, False),
])
def test_the_serve_line_names_the_utilization_wherever_it_is_not_the_default(kind, share, shown):
    f, facts, _ = _fit()
    facts = dataclasses.replace(facts, gpu_memory_utilization=share)
    flags = core.fit(facts).flags
    assert flags[-2] == "--kv-cache-memory-bytes"  # the KV size is always explicit
    assert ("--gpu-memory-utilization" in flags) == shown
    if shown:
        assert flags[flags.index("--gpu-memory-utilization") + 1] == f"{share:g}"
    assert core.recommended_flags(f.recommended, share) == flags


def test_a_candidate_whose_stock_step_cannot_be_built_is_neither_fitted_nor_recommended():
    from test_advise import FewStateSlotsDriver

    f, facts, fit_steps = _fit(n=1, driver=FewStateSlotsDriver)
    assert all(FewStateSlotsDriver(LIMITS).cannot_build(s) is None for s in fit_steps)
    blocked = [c for c in f.candidates if "NOT RECOMMENDED" in (c.note or "")]
    assert blocked and all(not c.fits and not c.feasible and c.concurrency == 0 for c in blocked)
    # each of them forms a stock step of more than 4 requests on a chunk the sweep did not run
    assert all(c.max_num_seqs > 4 and c.max_num_batched_tokens != LIMITS.max_num_batched_tokens
               for c in blocked)
    swept = [c for c in f.candidates if (c.max_num_batched_tokens, c.max_num_seqs)
             == (LIMITS.max_num_batched_tokens, LIMITS.max_num_seqs)]
    assert swept and all(c not in blocked for c in swept)
    assert f.recommended is None or f.recommended not in blocked
    assert not any(c.frontier for c in blocked)
