"""The chunk advisor (core/advise.py + adapter/advice.py) over a fake StepDriver: for every
candidate chunk C it must say what a sweep of an engine started with C would say, from the
configured sweep plus only the steps that sweep did not run."""

from __future__ import annotations

import contextlib
import dataclasses

import pytest

from worstcase_profiler.adapter.advice import measure, measure_candidates
from worstcase_profiler.core import advise as core
from worstcase_profiler.core import budget
from worstcase_profiler.core import shapes as plan
from worstcase_profiler.core.admission import compute_admission
from worstcase_profiler.core.shapes import Limits
from worstcase_profiler.core.sweep import run_sweep
from worstcase_profiler.core.types import (ChunkAdvice, CoveredSegment, HeldMemory, ProvisionalKV,
                                           RowsCoverage, Shape, StepResult, SweepResult,
                                           WarmupEstimate,
                                           Workspace, WorkspaceSlot)
from worstcase_profiler.settings import ProfilerSettings, from_mapping

MiB = 1 << 20
LIMITS = Limits(max_model_len=4096, max_num_batched_tokens=1024, max_num_seqs=8, block_size=16,
                kv_capacity_tokens=65536)


def affine(shape: Shape) -> int:
    """Piecewise affine in rows (so chords certify), growing with requests and context."""
    per_req = -(-shape.rows // shape.num_reqs)
    return 3000 * shape.rows + 40 * (shape.context_len + per_req) * shape.num_reqs \
        + 200_000 * shape.num_reqs + (500_000 if shape.kind == "mixed" else 0)


def no_workspace(shape: Shape) -> int:
    return 0


class FakeDriver:
    """A deterministic engine: every step's figures are functions of its shape; the stock step
    is the same function of vLLM's stock shape for these limits."""

    def __init__(self, limits, transient=affine, workspace=no_workspace, seconds=None):
        self.limits = limits
        self._t, self._w = transient, workspace
        self._s = seconds or (lambda s: s.rows / 1e5 + 0.01)
        self.shapes: list[Shape] = []
        self.inside = False

    def measure_stock(self):
        return self._result(plan.stock_shape(self.limits))

    @contextlib.contextmanager
    def provisional_kv(self):
        self.inside = True
        yield ProvisionalKV(num_blocks=257, kv_bytes=1, post_profile_bytes=0)
        self.inside = False

    def measure(self, shape, attribute=False):
        assert self.inside, "steps run on the provisional KV cache"
        self.shapes.append(shape)
        return self._result(shape)

    def _result(self, shape):
        return StepResult(shape=shape, peak_bytes=self._t(shape), seconds=self._s(shape),
                          workspace_bytes=self._w(shape))


HELD = HeldMemory(requested_bytes=8 << 30, consumed_bytes=2 << 30, weights_bytes=1 << 30,
                  non_torch_bytes=0)
BPT = 4096


def _admission(sweep: SweepResult, workspace_total: int = 0, explicit_kv: int | None = None):
    return compute_admission(
        requested=HELD.requested_bytes, consumed=HELD.consumed_bytes,
        weights=HELD.weights_bytes, non_torch=HELD.non_torch_bytes,
        worst_transient=sweep.peak_bytes, stock_need=sweep.stock.need_bytes, stock_kv=5 << 30,
        cudagraph=0, margin=64 * MiB, bytes_per_token=BPT, block_size=16, max_model_len=4096,
        explicit_kv=explicit_kv)


def _advise(limits=LIMITS, extra=(), explicit_kv=None, **driver_kw):
    drv = FakeDriver(limits, **driver_kw)
    sweep = run_sweep(drv, tolerance=0, attribute_ops=False)
    swept = len(drv.shapes)
    chunks, excluded = core.candidate_chunks(limits.max_num_batched_tokens, extra,
                                             max_num_seqs=limits.max_num_seqs)
    measured = measure_candidates(drv, limits, sweep, chunks, excluded=excluded)
    advice = core.advise(limits, sweep, held=HELD,
                         admission=_admission(sweep, explicit_kv=explicit_kv),
                         workspace=Workspace(), measured=measured)
    return advice, sweep, drv.shapes[swept:]


def test_candidates_are_powers_of_two_from_256_to_the_configured_chunk_plus_extras():
    assert core.candidate_chunks(8192) == ((256, 512, 1024, 2048, 4096, 8192), ())
    chunks, excluded = core.candidate_chunks(3000, [100, 768, 9000], max_num_seqs=128)
    assert chunks == (256, 512, 768, 1024, 2048, 3000)
    assert [c for c, _ in excluded] == [100, 9000]
    assert "max_num_seqs" in excluded[0][1] and "above" in excluded[1][1]
    assert core.candidate_chunks(128) == ((128,), ())


def test_every_candidate_matches_a_sweep_of_an_engine_started_with_it():
    advice, _sweep, _extra = _advise(extra=[384, 700])
    assert [c.chunk for c in advice.candidates] == [256, 384, 512, 700, 1024]
    for cand in advice.candidates:
        limits_c = dataclasses.replace(LIMITS, max_num_batched_tokens=cand.chunk)
        own = run_sweep(FakeDriver(limits_c), tolerance=0, attribute_ops=False)
        assert cand.transient_bytes == own.peak_bytes, cand.chunk
        assert cand.worst_shape == own.worst.shape, cand.chunk
        assert cand.budget_bytes == _admission(own).budget_bytes, cand.chunk
        assert cand.kv_tokens == _admission(own).kv_tokens_worstcase, cand.chunk


@pytest.mark.parametrize("explicit_gib", [2, 100])  # fits every candidate / none
def test_under_an_explicit_kv_size_every_candidate_admits_what_its_engine_would(explicit_gib):
    """An engine started with --kv-cache-memory-bytes X admits X (where X fits its budget): the
    advisor's kv_tokens and fits say the same for every chunk, so an engine started at a
    candidate chunk with the same X matches it exactly, whatever the room."""
    explicit = explicit_gib << 30
    advice, _sweep, _extra = _advise(extra=[384], explicit_kv=explicit)
    for cand in advice.candidates:
        limits_c = dataclasses.replace(LIMITS, max_num_batched_tokens=cand.chunk)
        own = _admission(run_sweep(FakeDriver(limits_c), tolerance=0, attribute_ops=False),
                         explicit_kv=explicit)
        assert own.explicit_kv_cache_memory_bytes == explicit
        assert (cand.budget_bytes, cand.kv_tokens, cand.fits) == \
            (own.budget_bytes, own.kv_tokens_worstcase, own.fits), cand.chunk
        assert cand.fits is (explicit_gib == 2)
    assert len({c.kv_tokens for c in advice.candidates}) == 1


def test_candidates_carry_the_allocator_slack_their_own_sweep_would():
    """Each candidate's transient is what its own sweep admits, allocator slack included (the
    configured row has it through the sweep; the others must too, or they look 2 MiB cheaper)."""
    slack = 2 * MiB
    drv = FakeDriver(LIMITS)
    sweep = run_sweep(drv, tolerance=0, attribute_ops=False, allocator_slack=slack)
    chunks, excluded = core.candidate_chunks(LIMITS.max_num_batched_tokens, (384,),
                                             max_num_seqs=LIMITS.max_num_seqs)
    measured = measure_candidates(drv, LIMITS, sweep, chunks, excluded=excluded)
    advice = core.advise(LIMITS, sweep, held=HELD, admission=_admission(sweep),
                         workspace=Workspace(), measured=measured, allocator_slack=slack)
    for cand in advice.candidates:
        limits_c = dataclasses.replace(LIMITS, max_num_batched_tokens=cand.chunk)
        own = run_sweep(FakeDriver(limits_c), tolerance=0, attribute_ops=False,
                        allocator_slack=slack)
        assert cand.transient_bytes == own.peak_bytes, cand.chunk


def test_the_configured_row_is_this_starts_admission_and_nothing_is_run_again_for_it():
    advice, sweep, extra = _advise()
    ref = advice.candidate(1024)
    adm = _admission(sweep)
    assert (ref.transient_bytes, ref.budget_bytes, ref.kv_tokens) == \
        (sweep.peak_bytes, adm.budget_bytes, adm.kv_tokens_worstcase)
    assert ref.measured_steps == 0 and ref.reused_steps > 0
    # what ran beyond the sweep: the shapes some smaller chunk forms, then the timings
    missing = core.missing_shapes(LIMITS, sweep, (256, 512, 1024))
    timings = [core.timing_shape(LIMITS, c) for c in (256, 512, 1024) for _ in range(2)]
    assert extra == missing + timings
    assert not set(missing) & set(core.known_steps(sweep))


def test_smaller_chunks_admit_more_kv_and_the_steps_they_need_are_measured_not_skipped():
    advice, sweep, extra = _advise()
    kv = [c.kv_tokens for c in advice.candidates]
    assert kv == sorted(kv, reverse=True) and kv[0] > kv[-1]
    small = advice.candidate(256)
    # its mixed step and its stock step exist in no sweep of 1024: run, never skipped
    lim = dataclasses.replace(LIMITS, max_num_batched_tokens=256)
    assert plan.mixed_step(lim) in extra and plan.stock_shape(lim) in extra
    assert small.measured_steps >= 2
    assert small.note and "upper estimate" in small.note


def test_a_step_that_only_the_candidate_forms_sets_its_worst_case():
    """The mixed step of chunk 256 (not formed at 1024) needs more than anything else: the
    advisor must run it and report it as 256's worst."""
    lim256 = dataclasses.replace(LIMITS, max_num_batched_tokens=256)
    target = plan.mixed_step(lim256)

    def spiky(shape):
        return 50 * MiB if shape == target else affine(shape)

    advice, _, extra = _advise(transient=spiky)
    assert target in extra
    assert advice.candidate(256).worst_shape == target
    assert advice.candidate(256).transient_bytes >= 50 * MiB
    assert advice.candidate(256).kv_tokens < advice.candidate(512).kv_tokens


def test_workspace_scales_with_what_the_candidates_steps_ask():
    def ws(shape):
        return 2 * shape.rows * 1024 if shape.kind == "prefill" and shape.num_reqs == 1 else 0

    drv = FakeDriver(LIMITS, workspace=ws)
    sweep = run_sweep(drv, tolerance=0, attribute_ops=False)
    measured = measure_candidates(drv, LIMITS, sweep, (256, 1024))
    slots = (WorkspaceSlot(0, 0, 0, 2 * 1024 * 1024), WorkspaceSlot(0, 1, 0, 2 * 1024 * 1024))
    workspace = Workspace(slots=slots, total_bytes=4 * 1024 * 1024)
    advice = core.advise(LIMITS, sweep, held=HELD, admission=_admission(sweep),
                         workspace=workspace, measured=measured)
    assert advice.candidate(1024).workspace_bytes == 4 * 1024 * 1024
    assert advice.candidate(256).workspace_bytes == 1024 * 1024  # two slots of 256 rows' ask


def test_knee_is_the_most_kv_within_x_of_the_best_throughput():
    def row(chunk, kv, tps, fits=True):
        return ChunkAdvice(chunk=chunk, transient_bytes=0, workspace_bytes=0,
                           worst_shape=Shape("prefill", chunk, 0), budget_bytes=kv,
                           kv_tokens=kv, fits=fits, prefill_seconds=chunk / tps)

    rows = [row(256, 1000, 60.0), row(512, 900, 96.0), row(1024, 800, 100.0),
            row(2048, 700, 101.0)]
    assert core.knee(rows, 0.05) == 512  # 96 >= 0.95 * 101; 60 is not
    assert core.knee(rows, 0.50) == 256
    assert core.knee(rows, 0.0) == 2048
    assert core.knee([row(256, 1000, 60.0, fits=False), row(512, 900, 96.0)], 0.5) == 512
    assert core.knee([row(256, 1000, 60.0, fits=False)], 0.5) is None
    tie = [row(256, 900, 99.0), row(512, 900, 100.0)]
    assert core.knee(tie, 0.05) == 256


def test_knee_on_the_fake_engine_is_reported():
    # throughput saturates: 256 rows run at 80% of 1024's, 512 at 97%
    def seconds(shape):
        return shape.rows / {256: 80.0, 512: 97.0}.get(shape.rows, 100.0)

    advice, _, _ = _advise(seconds=seconds)
    assert advice.knee_chunk == 512
    assert advice.candidate(512).prefill_tokens_per_s == pytest.approx(97.0)
    assert "5%" in advice.rule


def test_a_chord_straddling_the_candidate_is_bounded_by_its_value_there():
    cov = RowsCoverage(peak_table=((1, 100), (10, 1000), (300, 2000)), worst_rows=300,
                       worst_peak=2000, bound=2000 + 7, tolerance=7,
                       segments=(CoveredSegment(1, 10, "executed"),
                                 CoveredSegment(10, 300, "chord", (120, 190))), method="m",
                       argument="a")
    table = dict(cov.peak_table)
    table.update({r: 100 * r for r in range(2, 10)})
    table.update({120: 1400, 190: 1640})
    cov = dataclasses.replace(cov, peak_table=tuple(sorted(table.items())))
    sweep = SweepResult(stock=StepResult(Shape("stock", 300, 0), 0, 0.0), steps=(),
                        worst=StepResult(Shape("prefill", 300, 0), 2000, 0.0), worst_op=None,
                        peak_bytes=2007, coverage=cov, context_curve=(), rows_max=300,
                        post_profile_bytes=0, seconds=0.0)
    bound, worst = core.rows_bound(sweep, 150)
    # chord from (10, 1000) to (300, 2000) at 150: 1000 + ceil(1000 * 140 / 290) = 1483
    assert worst == 1400 and bound == 1483 + 7
    assert core.rows_bound(sweep, 300) == (2007, 2000)


def test_the_adapter_runs_nothing_unless_asked_and_times_after_an_untimed_run():
    drv = FakeDriver(LIMITS)
    sweep = run_sweep(drv, tolerance=0, attribute_ops=False)
    assert measure(drv, LIMITS, sweep, ProfilerSettings(mode="enforce")) is None
    n = len(drv.shapes)
    settings = from_mapping({"advise": True, "advise_chunks": "384, 4096"})
    got = measure(drv, LIMITS, sweep, settings)
    assert got.chunks == (256, 384, 512, 1024) and [c for c, _ in got.excluded] == [4096]
    timed = [core.timing_shape(LIMITS, c) for c in got.chunks]
    ran = drv.shapes[n:]
    for shape in timed:  # each timing step runs twice: untimed, then timed
        assert ran.count(shape) >= 2
    # the advice is decided with the admission, from what measure() returned (core/budget.py)
    facts = budget.Measured(limits=LIMITS, sweep=sweep, held=HELD, workspace=Workspace(),
                            warmup=WarmupEstimate(), stock_kv_bytes=5 << 30, bytes_per_token=BPT,
                            one_request_bytes=4096 * BPT, explicit_kv_bytes=None,
                            tolerance_bytes=0, advice_measurements=got)
    advice = budget.decide(facts, mode="enforce", margin_bytes=64 * MiB).advice
    assert advice.configured_chunk == 1024
    assert [(e.chunk, e.reason) for e in advice.excluded] == list(got.excluded)
    assert advice == core.advise(LIMITS, sweep, held=HELD, admission=_admission(sweep),
                                 workspace=Workspace(), measured=got)
    no_measurements = dataclasses.replace(facts, advice_measurements=None)
    assert budget.decide(no_measurements, mode="enforce", margin_bytes=64 * MiB).advice is None


def test_settings_read_chunks_and_within():
    s = from_mapping({"advise": "true", "advise_chunks": [512, "768"], "advise_within": "10%"})
    assert s.advise and s.advise_chunks == (512, 768) and s.advise_within == pytest.approx(0.1)
    from worstcase_profiler.errors import ConfigError

    for bad in ({"advise_chunks": [0]}, {"advise_chunks": "12x"}, {"advise_within": 5},
                {"advise_within": "120%"}, {"guard": "maybe"}):
        with pytest.raises(ConfigError):
            from_mapping(bad)
    assert from_mapping({"guard": False}).guard == "off"


class CutDownDriver(FakeDriver):
    """A decoder that can be cut to one layer: there every step needs 3 MiB less."""

    def __init__(self, limits, **kw):
        super().__init__(limits, **kw)
        self.cut = False

    @contextlib.contextmanager
    def cut_down(self, prefix=False):
        self.cut = True
        yield "1 layer"
        self.cut = False

    def _result(self, shape):
        r = super()._result(shape)
        return dataclasses.replace(r, peak_bytes=r.peak_bytes - (3 * MiB if self.cut else 0)) \
            if self.cut and shape.kind != "stock" else r


def test_after_a_cut_down_sweep_reused_figures_are_raised_to_the_full_model():
    from worstcase_profiler.core.sweep import run_cut_down

    base = lambda s: affine(s) + 4 * MiB  # noqa: E731 - every step above the cut
    drv = CutDownDriver(LIMITS, transient=base)
    sweep, mode = run_cut_down(drv, tolerance=0, attribute_ops=False)
    assert mode.startswith("cut-down") and core.confirmation_delta(sweep) == 3 * MiB
    measured = measure_candidates(drv, LIMITS, sweep, (256, 512, 1024))
    advice = core.advise(LIMITS, sweep, held=HELD, admission=_admission(sweep),
                         workspace=Workspace(), measured=measured, cut_down=True)
    for chunk in (256, 512):
        full = run_sweep(FakeDriver(dataclasses.replace(LIMITS, max_num_batched_tokens=chunk),
                                    transient=base), tolerance=0, attribute_ops=False)
        assert advice.candidate(chunk).transient_bytes == full.peak_bytes, chunk
    blind = core.advise(LIMITS, sweep, held=HELD, admission=_admission(sweep),
                        workspace=Workspace(), measured=measured)
    assert all(b.transient_bytes <= a.transient_bytes
               for a, b in zip(advice.candidates, blind.candidates))
    cut_only = core.raiser(sweep, 3 * MiB)(sweep.steps[:1])[0]  # the first step: a cut figure
    assert cut_only.peak_bytes == sweep.steps[0].peak_bytes + 3 * MiB


class NoMixedDriver(FakeDriver):
    """A runner that cannot build mixed steps (V2 + hybrid or speculative models)."""

    def cannot_build(self, shape):
        return "no mixed steps here" if shape.kind == "mixed" else None

    def measure(self, shape, attribute=False):
        assert shape.kind != "mixed", "a shape the runner cannot build was run"
        return super().measure(shape, attribute)


def test_shapes_the_runner_cannot_build_are_left_out_and_said_so():
    drv = NoMixedDriver(LIMITS)
    sweep = run_sweep(drv, tolerance=0, attribute_ops=False)
    measured = measure_candidates(drv, LIMITS, sweep, (256, 1024))
    assert [s.kind for s, _ in measured.skipped] == ["mixed"] * 4  # both of 256's and 1024's
    advice = core.advise(LIMITS, sweep, held=HELD, admission=_admission(sweep),
                         workspace=Workspace(), measured=measured)
    for chunk in (256, 1024):
        assert "mixed" in advice.candidate(chunk).note and "not run" in advice.candidate(chunk).note


class FewStateSlotsDriver(FakeDriver):
    """V2 on a hybrid model: a step on no context gives its requests the recurrent-state slots
    1..n of the provisional pool (5 blocks here), so a candidate's stock step of 8 requests at
    another chunk cannot be built (shapes.state_slots_beyond_pool); measuring it would kill
    the engine (a CUDA gather out of bounds)."""

    POOL_BLOCKS = 5

    def cannot_build(self, shape):
        return plan.state_slots_beyond_pool(shape, self.POOL_BLOCKS)

    def measure(self, shape, attribute=False):
        assert self.cannot_build(shape) is None, "a shape the runner cannot build was run"
        return super().measure(shape, attribute)


def test_a_candidate_whose_stock_step_cannot_be_built_is_not_recommended():
    drv = FewStateSlotsDriver(LIMITS)
    sweep = run_sweep(drv, tolerance=0, attribute_ops=False)
    assert not sweep.skipped  # the sweep's own stock step runs as vLLM's (no state slots)
    measured = measure_candidates(drv, LIMITS, sweep, (256, 512, 1024))
    assert {(s.kind, s.rows, s.num_reqs) for s, _ in measured.skipped} == {
        ("stock", 256, 8), ("stock", 512, 8)}
    advice = core.advise(LIMITS, sweep, held=HELD, admission=_admission(sweep),
                         workspace=Workspace(), measured=measured)
    for chunk in (256, 512):
        row = advice.candidate(chunk)
        assert not row.fits and "NOT RECOMMENDED" in row.note and "state slots" in row.note
    assert advice.candidate(1024).fits and advice.knee_chunk in (1024, None)
    # the same candidates on a runner that builds them all fit (the refusal is what flips them)
    full = FakeDriver(LIMITS)
    ok = core.advise(LIMITS, sweep, held=HELD, admission=_admission(sweep), workspace=Workspace(),
                     measured=measure_candidates(full, LIMITS, sweep, (256, 512, 1024)))
    assert all(ok.candidate(c).fits for c in (256, 512))


def test_a_left_out_shape_counts_as_swept_only_where_the_sweep_left_out_its_kind():
    drv = NoMixedDriver(LIMITS)
    sweep = run_sweep(drv, tolerance=0, attribute_ops=False)
    assert [s.kind for s, _ in sweep.skipped] == ["mixed", "mixed"]  # mixed_step, mixed_pair
    assert core.left_out_as_swept(Shape("mixed", 256, 100, 4), sweep)
    assert not core.left_out_as_swept(Shape("stock", 256, 0, 8), sweep)
    assert not core.left_out_as_swept(Shape("prefill", 256, 0, 8), sweep)
