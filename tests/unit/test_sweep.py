"""The sweep's orchestration, driven by a fake StepDriver: no vLLM, no torch, milliseconds."""

from __future__ import annotations

import contextlib
import dataclasses
import types

from worstcase_profiler.core.shapes import Limits, stock_shape
from worstcase_profiler.core.sweep import run_sweep
from worstcase_profiler.core.types import ProvisionalKV, Shape, StepResult

MiB = 1 << 20


class FakeDriver:
    """need(shape) = transient(shape) + workspace(shape), both pure functions of the shape."""

    def __init__(self, limits, transient, workspace=lambda s: 0, stock_transient=MiB):
        self.limits = limits
        self._transient, self._workspace, self._stock = transient, workspace, stock_transient
        self.shapes = []
        self.in_provisional = False

    def measure_stock(self):
        return StepResult(shape=stock_shape(self.limits), peak_bytes=self._stock, seconds=0.0)

    @contextlib.contextmanager
    def provisional_kv(self):
        self.in_provisional = True
        yield ProvisionalKV(num_blocks=5, kv_bytes=10, post_profile_bytes=7)
        self.in_provisional = False

    def cannot_build(self, shape):
        return None

    def measure_in(self, shape):
        """measure() inside the provisional KV cache (tests that measure outside a sweep)."""
        with self.provisional_kv():
            return self.measure(shape)

    def measure(self, shape, attribute=False):
        assert self.in_provisional, "synthetic steps need the provisional KV cache"
        self.shapes.append(shape)
        return StepResult(shape=shape, peak_bytes=self._transient(shape), seconds=0.0,
                          top_op="op" if attribute else None,
                          workspace_bytes=self._workspace(shape))


LIMITS = Limits(max_model_len=256, max_num_batched_tokens=64, max_num_seqs=4, block_size=16,
                kv_capacity_tokens=1024)


def test_runs_every_kind_of_step_at_full_extent():
    d = FakeDriver(LIMITS, transient=lambda s: s.rows * 1000)
    out = run_sweep(d, tolerance=0, attribute_ops=False)
    kinds = {s.kind for s in d.shapes}
    assert {"prefill", "decode", "mixed"} <= kinds
    full_extent = {s.rows for s in d.shapes
                   if s.kind == "prefill" and s.num_reqs == 1 and s.context_len + s.rows == 256}
    assert set(out.coverage.executed_rows) <= full_extent
    assert any(s.num_reqs > 1 for s in d.shapes if s.kind == "prefill")  # split prefills
    assert out.rows_max == 64  # every rows value 1..64 is covered
    assert out.post_profile_bytes == 7
    assert len(out.steps) == len(d.shapes)


def _tile_rule(rows: int) -> int:
    """Kernel-plan-like tile rounding: the tile and split count change with rows, so the need is
    a non-monotone step function of rows whose plateau (33..48) holds neither a power of two
    nor max_num_batched_tokens (64)."""
    tile, splits = (8, 2) if rows <= 32 else (24, 3) if rows <= 48 else (4, 1)
    return -(-rows // tile) * tile * splits * MiB // 16


def _single_prefill(s) -> bool:
    return s.kind == "prefill" and s.num_reqs == 1


def test_tile_rounded_workspace_peak_is_found():
    d = FakeDriver(LIMITS, transient=lambda s: s.rows * 100,
                   workspace=lambda s: _tile_rule(s.rows) if _single_prefill(s) else 0)
    out = run_sweep(d, tolerance=0, attribute_ops=False)
    true_max = max(_tile_rule(r) for r in range(1, 65))
    assert 33 <= out.worst.shape.rows <= 48
    assert max(r.workspace_bytes for r in out.steps) == true_max
    assert len({s.rows for s in d.shapes if _single_prefill(s)}) < 64  # not exhaustive


def test_a_spike_between_collinear_samples_needs_exhaustive():
    """The chord argument's stated residual risk: a narrow spike inside an otherwise affine
    segment, between samples that lie on one line. --exhaustive is the fallback that finds it."""
    def ws(s):
        return 50 * MiB if _single_prefill(s) and s.rows == 39 else s.rows * 1000

    d = FakeDriver(LIMITS, transient=lambda s: 0, workspace=ws)
    out = run_sweep(d, tolerance=0, exhaustive=True, attribute_ops=False)
    assert out.worst.shape.rows == 39


def test_admitted_transient_never_below_stock_or_any_step():
    d = FakeDriver(LIMITS, transient=lambda s: s.rows * 10, stock_transient=5 * MiB)
    out = run_sweep(d, tolerance=0, attribute_ops=False)
    assert out.peak_bytes >= out.stock.peak_bytes == 5 * MiB
    assert out.worst.shape.kind == "stock"


def test_context_ladder_reports_the_worst_rows_at_growing_extent():
    d = FakeDriver(LIMITS, transient=lambda s: s.rows * 1000 + s.context_len)
    out = run_sweep(d, tolerance=0, attribute_ops=False)
    ctxs = [r.shape.context_len for r in out.context_curve]
    assert ctxs == sorted(ctxs) and ctxs[0] == 0 and ctxs[-1] == 256 - 64


def test_same_measurements_same_plan():
    """Determinism: identical measurements give an identical step sequence (what keeps TP ranks
    in lockstep once each peak is agreed across ranks)."""
    f = lambda s: (s.rows * 7919) % 1000 * 1000  # noqa: E731 - a jagged function of rows
    a, b = FakeDriver(LIMITS, transient=f), FakeDriver(LIMITS, transient=f)
    run_sweep(a, tolerance=0, attribute_ops=False)
    run_sweep(b, tolerance=0, attribute_ops=False)
    assert a.shapes == b.shapes


def test_allocator_slack_is_admitted_on_top_of_the_largest_step():
    """The caching allocator can charge the same tensors up to a block's remainder more under
    another history (adapter/meters.CudaMeter.allocator_slack_bytes): the admitted transient
    carries it, the measured steps do not."""
    f = lambda s: s.rows * 1000  # noqa: E731
    plain = run_sweep(FakeDriver(LIMITS, transient=f), tolerance=0, attribute_ops=False)
    padded = run_sweep(FakeDriver(LIMITS, transient=f), tolerance=0, attribute_ops=False,
                       allocator_slack=2 * MiB)
    assert padded.peak_bytes == plain.peak_bytes + 2 * MiB
    assert [r.peak_bytes for r in padded.steps] == [r.peak_bytes for r in plain.steps]
    assert padded.worst.shape == plain.worst.shape


def test_a_reused_sweep_that_drifted_up_keeps_its_slack_over_the_replay():
    """A cached start whose worst step now needs more than the cached one (within the cache's
    drift allowance) admits the replay plus the cached margin over that step (allocator and
    chord slack), not the bare replay; within the meter's resolution, the cached figure."""
    import dataclasses

    from worstcase_profiler.core.sweep import Replay, reused

    f = lambda s: s.rows * 1000  # noqa: E731
    cached = run_sweep(FakeDriver(LIMITS, transient=f), tolerance=0, attribute_ops=False,
                       allocator_slack=2 * MiB)
    margin = cached.peak_bytes - cached.worst.peak_bytes
    assert margin >= 2 * MiB

    def replay(delta):
        step = dataclasses.replace(cached.worst, peak_bytes=cached.worst.peak_bytes + delta)
        return Replay(stock=cached.stock, step=step, others=(),
                      provisional=ProvisionalKV(num_blocks=5, kv_bytes=10, post_profile_bytes=7),
                      seconds=0.0)

    assert reused(cached, replay(0), MiB).peak_bytes == cached.peak_bytes
    assert reused(cached, replay(MiB // 2), MiB).peak_bytes == cached.peak_bytes
    drifted = reused(cached, replay(3 * MiB), MiB).peak_bytes
    assert drifted == cached.worst.peak_bytes + 3 * MiB + margin > cached.peak_bytes
    # a re-checked shape that now needs more than the worst (within the drift allowed) counts too
    other = dataclasses.replace(cached.worst, peak_bytes=cached.worst.peak_bytes + 5 * MiB)
    check = dataclasses.replace(replay(0), others=(other,))
    assert reused(cached, check, MiB).peak_bytes == other.peak_bytes + margin
    # a re-checked shape the sweep never ran: what it measured now, plus the allocator slack
    unseen = StepResult(shape=Shape("prefill", 64, 7, 3), peak_bytes=cached.peak_bytes + 4 * MiB,
                        seconds=0.0)
    check = dataclasses.replace(replay(0), others=(unseen,))
    assert reused(cached, check, MiB, 2 * MiB).peak_bytes == unseen.peak_bytes + 2 * MiB
    small = dataclasses.replace(unseen, peak_bytes=cached.worst.peak_bytes)  # below: no change
    assert reused(cached, dataclasses.replace(replay(0), others=(small,)), MiB, 2 * MiB
                  ).peak_bytes == cached.peak_bytes


class CutDriver(FakeDriver):
    """A decoder cut to one layer: every step (the stock step too, as on a real engine) needs
    `gap(shape)` less there than on the full model."""

    def __init__(self, limits, transient, gap, stock_transient=MiB):
        super().__init__(limits, transient=transient, stock_transient=stock_transient)
        self.cut, self.gap, self.full_shapes = False, gap, []

    @contextlib.contextmanager
    def cut_down(self, prefix=False):
        self.cut, self.prefixes = True, [*getattr(self, "prefixes", ()), prefix]
        yield "1 layer"
        self.cut = False

    def measure_stock(self):
        r = super().measure_stock()
        return dataclasses.replace(r, peak_bytes=r.peak_bytes - self.gap(r.shape)) if self.cut else r

    def measure(self, shape, attribute=False):
        r = super().measure(shape, attribute)
        if self.cut:
            return StepResult(shape=shape, peak_bytes=r.peak_bytes - self.gap(shape), seconds=0.0)
        self.full_shapes.append(shape)
        return r


def test_a_cut_down_sweep_admits_the_full_models_worst_not_a_confirmed_shape_raised_by_another():
    """H200 run 13 (the 8B layout): the confirmed worst step was raised by another confirmed
    shape's larger full-minus-cut difference, 64 MiB above what the full model needs (0.972 from
    real requests). Confirmed shapes count at their full-model figure; a shape whose bound
    (cut figure + largest difference) still beats them is confirmed too. The decode batch, far
    below the worst, is not confirmed on the full model although depth adds more to it there."""
    from worstcase_profiler.core.sweep import CONFIRM, CONFIRM_MORE, run_cut_down

    f = lambda s: (300 * MiB + s.rows * 4 * MiB + s.context_len * 256 * 1024  # noqa: E731
                   - s.num_reqs * 20 * MiB)
    gap = lambda s: (64 * MiB if s.kind == "decode" else 3 * MiB)  # noqa: E731 - decode: more layers' worth
    full = run_sweep(FakeDriver(LIMITS, transient=f), tolerance=0, attribute_ops=False)
    drv = CutDriver(LIMITS, f, gap)
    cut, mode = run_cut_down(drv, tolerance=0, attribute_ops=False)
    assert not any(s.kind == "decode" for s in drv.full_shapes)
    assert cut.peak_bytes == full.peak_bytes
    assert cut.worst.shape == full.worst.shape and "+3145728 B" in mode
    assert cut.depth_delta == 3 * MiB
    assert len(drv.full_shapes) <= CONFIRM + CONFIRM_MORE


def test_cut_down_cuts_where_its_proof_cut_and_self_check_to_the_first_layer_of_each_kind():
    """run_cut_down asks the driver for the cut it is given (startup passes the one the family's
    proof ran, sweep_depth.proven_cut), the prefix unless told; the self-check always for the
    first layer of each kind."""
    from worstcase_profiler.core.sweep import run_cut_down, run_self_checked

    f = lambda s: s.rows * MiB  # noqa: E731
    gap = lambda s: 0  # noqa: E731
    for prefix in (True, False):
        drv = CutDriver(LIMITS, f, gap)
        run_cut_down(drv, tolerance=0, attribute_ops=False, prefix=prefix)
        assert drv.prefixes == [prefix]
    drv = CutDriver(LIMITS, f, gap)
    run_cut_down(drv, tolerance=0, attribute_ops=False)
    assert drv.prefixes == [True]
    drv = CutDriver(LIMITS, f, gap)
    run_self_checked(drv, tolerance=0, attribute_ops=False, resolution=MiB)
    assert drv.prefixes == [False]


def test_the_stock_steps_difference_bounds_shapes_never_confirmed():
    """The stock step runs both ways (vLLM's own profile shape, cheap): its full-minus-cut
    difference raises every unconfirmed shape, so a shape that close to the worst is confirmed
    rather than admitted at its cut-down figure plus a smaller difference."""
    from worstcase_profiler.core.sweep import run_cut_down

    f = lambda s: s.rows * MiB + (5 * MiB if s.num_reqs == 2 else 0)  # noqa: E731
    gap = lambda s: 32 * MiB if s.kind == "stock" else 0  # noqa: E731
    drv = CutDriver(LIMITS, f, gap, stock_transient=40 * MiB)
    cut, mode = run_cut_down(drv, tolerance=0, attribute_ops=False)
    worst = max(drv.full_shapes, key=f)
    near = [s for s in drv.full_shapes if s != worst]
    assert near, "a shape within the stock step's difference of the worst was confirmed"
    assert cut.depth_delta == 32 * MiB and "+33554432 B" in mode
    assert cut.stock.peak_bytes == 40 * MiB  # the admitted stock step is the full model's


def test_a_cut_down_proof_passes_on_a_faithful_cut_and_names_a_hidden_worst():
    from worstcase_profiler.core.sweep import prove_cut_down

    f = lambda s: 300 * MiB + s.rows * 4 * MiB - s.num_reqs * MiB  # noqa: E731
    full, proof = prove_cut_down(CutDriver(LIMITS, f, lambda s: MiB), resolution=2 * MiB,
                                 tolerance=0, attribute_ops=False)
    assert proof.proven and proof.cut_worst == proof.full_worst == full.worst.shape
    assert dict(proof.deltas)["prefill"] == MiB and proof.depth == "1 layer"
    assert full.peak_bytes == run_sweep(FakeDriver(LIMITS, transient=f), tolerance=0,
                                        attribute_ops=False).peak_bytes

    # depth adds 400 MiB to decode steps only: on the full model a decode step is the worst,
    # on the cut one it is far below the prefill chunk, so the cut-down sweep never looks at it
    g = lambda s: f(s) + (400 * MiB if s.kind == "decode" else 0)  # noqa: E731
    gap = lambda s: 400 * MiB if s.kind == "decode" else 0  # noqa: E731
    full, proof = prove_cut_down(CutDriver(LIMITS, g, gap), resolution=2 * MiB, tolerance=0,
                                 attribute_ops=False)
    assert full.worst.shape.kind == "decode" and not proof.proven
    assert "the cut-down sweep's worst is" in proof.verdict and "admits" in proof.verdict


def test_a_cut_down_bound_above_every_confirmed_figure_is_confirmed_or_admitted():
    """Every shape's admitted bound stays at least its full-model need wherever its difference is
    no larger than the largest confirmed one (the cut-down assumption)."""
    from worstcase_profiler.core import sweep as core_sweep

    f = lambda s: s.rows * 100_000 + (s.num_reqs - 1) * 2 * MiB  # noqa: E731
    gap = lambda s: MiB * (1 + s.num_reqs % 3)  # noqa: E731
    full = run_sweep(FakeDriver(LIMITS, transient=f), tolerance=0, attribute_ops=False)
    cut, _ = core_sweep.run_cut_down(CutDriver(LIMITS, f, gap), tolerance=0, attribute_ops=False)
    assert cut.peak_bytes >= full.peak_bytes


def test_a_cached_cut_down_sweep_restarts_at_the_figure_it_first_admitted():
    """A restart re-checks shapes the cut-down sweep ran only on the cut decoder: their full
    figure is not drift (they were admitted at cut figure + depth_delta), so the restart admits
    what the first start did, and what a full sweep does."""
    from worstcase_profiler.core.sweep import dominance_checks, replay, reused, run_cut_down

    f = lambda s: 300 * MiB + s.rows * 4 * MiB - s.num_reqs * MiB  # noqa: E731
    drv = CutDriver(LIMITS, f, lambda s: 10 * MiB, stock_transient=20 * MiB)
    cut, _ = run_cut_down(drv, tolerance=0, attribute_ops=False)
    check = replay(drv, cut.worst.shape, dominance_checks(LIMITS, cut.worst.shape))
    assert check.others, "the dominance shapes were replayed on the full model"
    full = run_sweep(FakeDriver(LIMITS, transient=f), tolerance=0, attribute_ops=False)
    assert reused(cut, check, resolution=MiB).peak_bytes == cut.peak_bytes == full.peak_bytes


def test_a_rows_value_certified_on_the_cut_decoder_is_bounded_on_the_full_model():
    """A rows value the chord certified never ran on either model: its full-model need is
    bounded by its segment's cut-down bound plus the difference, even when the confirmed worst
    beside it gained nothing from depth."""
    from worstcase_profiler.core.shapes import prefill_chunk
    from worstcase_profiler.core.sweep import run_cut_down

    def on_cut(s):
        if s.kind == "prefill" and s.num_reqs == 1:
            return int((90 + 10 * (s.rows - 32) / 32) * MiB) if s.rows > 32 else 90 * MiB
        return 50 * MiB

    def gap(s):
        return 0 if (s.kind, s.num_reqs, s.rows) == ("prefill", 1, 64) else 10 * MiB

    full_f = lambda s: on_cut(s) + gap(s)  # noqa: E731
    cut, _ = run_cut_down(CutDriver(LIMITS, full_f, gap, stock_transient=20 * MiB), tolerance=0,
                          attribute_ops=False)
    assert set(range(1, 65)) - set(cut.coverage.executed_rows)  # some rows were certified
    truth = max(full_f(prefill_chunk(LIMITS, r)) for r in range(1, 65))
    assert cut.peak_bytes >= truth > cut.worst.peak_bytes


def test_a_proof_fails_when_a_shape_gained_more_from_depth_than_was_allowed():
    """sweep_depth.judge_cut_down checks the assumption, not only the outcome: a shape far below the
    worst whose full-minus-cut difference exceeds the one the cut-down sweep measured."""
    from worstcase_profiler.core.sweep import prove_cut_down

    f = lambda s: 300 * MiB + s.rows * 4 * MiB - s.num_reqs * MiB  # noqa: E731
    gap = lambda s: 30 * MiB if s.kind == "decode" else 0  # noqa: E731 - never confirmed
    _, proof = prove_cut_down(CutDriver(LIMITS, f, gap), resolution=2 * MiB, tolerance=0,
                              attribute_ops=False)
    assert proof.cut_worst == proof.full_worst and proof.depth_delta == 0
    assert not proof.proven and "gained 31457280 B from depth" in proof.verdict
    assert dict(proof.deltas)["stock"] == 0


def test_a_cut_down_sweep_does_not_count_the_workspace_a_step_leaves_as_transient():
    """Chord-certified rows on the cut decoder are bounded in peak units: the workspace a step
    leaves is held memory, already in what the process holds."""
    from worstcase_profiler.core.sweep import run_cut_down

    f = lambda s: 300 * MiB + s.rows * 4 * MiB  # noqa: E731 - affine: chords certify
    ws = lambda s: 64 * MiB  # noqa: E731
    full = run_sweep(FakeDriver(LIMITS, transient=f, workspace=ws), tolerance=0,
                     attribute_ops=False)
    drv = CutDriver(LIMITS, f, lambda s: 0)
    drv._workspace = ws
    cut, _ = run_cut_down(drv, tolerance=0, attribute_ops=False)
    assert cut.coverage.certified_rows > 0
    assert cut.peak_bytes == full.peak_bytes


def test_a_restart_tells_confirmed_figures_from_cut_ones_where_a_shape_ran_twice():
    """With chunks longer than max_model_len the widest split of the worst rows is the chunk
    itself, so the cut decoder runs one shape twice; the restart still raises it by the depth
    difference (it was never confirmed), so it admits what the first start did."""
    from worstcase_profiler.core.sweep import dominance_checks, replay, reused, run_cut_down

    limits = Limits(max_model_len=48, max_num_batched_tokens=64, max_num_seqs=4, block_size=16,
                    kv_capacity_tokens=1024)
    f = lambda s: 300 * MiB + s.rows * 4 * MiB + s.num_reqs * 9 * MiB  # noqa: E731
    drv = CutDriver(limits, f, lambda s: 10 * MiB, stock_transient=20 * MiB)
    cut, _ = run_cut_down(drv, tolerance=0, attribute_ops=False)
    check = replay(drv, cut.worst.shape, dominance_checks(limits, cut.worst.shape))
    assert reused(cut, check, resolution=MiB).peak_bytes == cut.peak_bytes


class NoisyStockDriver(FakeDriver):
    """The stock step reads differently each time, as one RSS reading on the CPU does (the
    bundled tiny model: 1.16-1.65 MiB, and 3.84 MiB once)."""

    device_kind = "cpu"

    def __init__(self, limits, transient, readings):
        super().__init__(limits, transient)
        self._readings = list(readings)
        self.meter = type("Meter", (), {"device_kind": self.device_kind,
                                        "resolution_bytes": 512 << 10})()

    def measure_stock(self):
        return StepResult(shape=stock_shape(self.limits), peak_bytes=self._readings.pop(0),
                          seconds=0.0)


def test_the_stock_step_is_read_three_times_on_the_cpu_and_its_steady_reading_kept():
    """Issue 39: one high reading of the stock step flipped the tiny model's verdict. On the CPU
    the stock step is measured three times: `stock` is the lowest (its steady need, which the
    verdict compares with), while the highest still bounds the admitted transient."""
    from worstcase_profiler.core.sweep import stock_readings

    d = NoisyStockDriver(LIMITS, lambda s: MiB, [3840 << 10, 1190 << 10, 1690 << 10])
    assert stock_readings(d) == 3
    out = run_sweep(d, tolerance=0, attribute_ops=False, stock_readings=stock_readings(d))
    assert out.stock.peak_bytes == 1190 << 10
    assert out.peak_bytes == 3840 << 10 and out.worst.shape.kind == "stock"
    d = NoisyStockDriver(LIMITS, lambda s: MiB, [3840 << 10])
    d.meter.device_kind = "cuda"  # an exact allocator: one reading
    assert stock_readings(d) == 1


def test_a_cached_stock_worst_replayed_is_held_against_its_own_highest_reading():
    """A fresh clone's make test: the tiny model's worst step was the stock step's highest of
    three readings (4.48 MiB; its lowest 1.44 MiB); the cached restart's replay read the stock
    step high at 3.94 MiB, which reused() held against the cached lowest reading and so admitted
    4.48 + 2.50 MiB. Like with like, the replay is within the cached figure: it is admitted as
    it was, and a replay that really reads higher still raises it."""
    import dataclasses

    from worstcase_profiler.core.sweep import Replay, reused, stock_readings

    d = NoisyStockDriver(LIMITS, lambda s: MiB, [4694016, 1511424, 1600000])
    cached = run_sweep(d, tolerance=0, attribute_ops=False, stock_readings=stock_readings(d))
    assert cached.worst.shape.kind == "stock" and cached.stock.peak_bytes == 1511424
    provisional = ProvisionalKV(num_blocks=5, kv_bytes=10, post_profile_bytes=7)

    def replay(low, high):
        return Replay(stock=dataclasses.replace(cached.stock, peak_bytes=low),
                      step=dataclasses.replace(cached.worst, peak_bytes=high), others=(),
                      provisional=provisional, seconds=0.0)

    assert reused(cached, replay(1544192, 4132864), 512 * 1024).peak_bytes == cached.peak_bytes
    higher = reused(cached, replay(1544192, 4694016 + 3 * MiB), 512 * 1024).peak_bytes
    assert higher == cached.peak_bytes + 3 * MiB


# --- sweep_depth=auto: the cut-down sweep's self-check (issue 34) ----------------------------


def _self_checked(drv, resolution=MiB):
    from worstcase_profiler.core.sweep import run_self_checked

    return run_self_checked(drv, resolution=resolution, tolerance=0, attribute_ops=False)


PREFILL_HEAVY = lambda s: 300 * MiB + s.rows * 4 * MiB - s.num_reqs * MiB  # noqa: E731


def test_a_faithful_cut_keeps_the_cut_down_sweep_with_a_sample_of_every_class():
    """A well-behaved model (every layer alike: depth adds the same to every step) keeps the
    cut-down sweep: each class no confirmation covered (decode, mixed) is sampled once on the
    full model, its difference within the confirmations', and the admitted figure bounds the
    full sweep's."""
    drv = CutDriver(LIMITS, PREFILL_HEAVY, lambda s: MiB)
    sweep, mode, proof = _self_checked(drv)
    assert proof.proven and not proof.fell_back and proof.method == "self-check"
    assert {s.kind for s in proof.sampled} == {"decode", "mixed"}
    assert set(proof.sampled) <= set(drv.full_shapes)
    assert proof.deltas == {"decode": MiB, "mixed": MiB, "prefill": MiB, "stock": MiB}
    assert proof.full_admitted_bytes is None and "self-check proven" in mode
    full = run_sweep(FakeDriver(LIMITS, transient=PREFILL_HEAVY), tolerance=0, attribute_ops=False)
    assert sweep.peak_bytes >= full.peak_bytes and sweep.confirmed >= 3
    assert proof.unsampled_admitted_bytes <= sweep.peak_bytes


def test_a_deep_layer_that_sets_the_peak_for_one_class_makes_the_self_check_fall_back():
    """The adversary: a layer the cut drops allocates 400 MiB more, on decode steps of more than
    two requests only. The cut-down sweep alone admits the prefill chunk's figure (an
    under-prediction: run_cut_down never looks at a decode step that far below); the decode
    sample gains 400 MiB from depth against the confirmations' 0, so the full sweep runs and is
    admitted, and the proof says why."""
    from worstcase_profiler.core.sweep import run_cut_down

    gap = lambda s: 400 * MiB if s.kind == "decode" and s.num_reqs > 2 else 0  # noqa: E731
    full_f = lambda s: PREFILL_HEAVY(s) + gap(s)  # noqa: E731
    truth = run_sweep(FakeDriver(LIMITS, transient=full_f), tolerance=0, attribute_ops=False)
    blind, _ = run_cut_down(CutDriver(LIMITS, full_f, gap), tolerance=0, attribute_ops=False)
    assert blind.peak_bytes < truth.peak_bytes  # what the self-check exists to catch
    sweep, mode, proof = _self_checked(CutDriver(LIMITS, full_f, gap))
    assert proof.fell_back and not proof.proven and "sampled decode step gained" in proof.verdict
    assert sweep.peak_bytes == truth.peak_bytes == proof.full_admitted_bytes
    assert proof.unsampled_admitted_bytes == blind.peak_bytes  # run_cut_down's figure, recorded
    assert proof.full_worst.kind == "decode" and mode.startswith("full: the cut-down sweep's self-check failed")
    # its seconds: the cut-down sweep's parts, and the full sweep's beside them
    assert set(proof.seconds_split) == {"cut_decoder", "full_model", "full_sweep"}
    assert proof.seconds_split["full_sweep"] == proof.full_seconds


def test_a_class_whose_depth_difference_stays_within_the_resolution_keeps_the_cut():
    """The meter's resolution is the check's only allowance: a sample 1 MiB over the
    confirmations' difference passes at 1 MiB resolution and fails at 512 KiB."""
    gap = lambda s: 2 * MiB if s.kind == "mixed" else MiB  # noqa: E731
    _, _, proof = _self_checked(CutDriver(LIMITS, PREFILL_HEAVY, gap), resolution=MiB)
    assert proof.proven and proof.deltas["mixed"] == 2 * MiB
    _, _, proof = _self_checked(CutDriver(LIMITS, PREFILL_HEAVY, gap), resolution=MiB // 2)
    assert proof.fell_back and "sampled mixed step" in proof.verdict


def test_judge_self_check_refutes_a_class_bound_above_the_admitted_figure():
    """(b): a class difference that would put an unconfirmed member above the admitted figure
    refutes the assumption even when the samples' own check (a) is given more room."""
    from worstcase_profiler.core.sweep import run_cut_down
    from worstcase_profiler.core.sweep_depth import judge_self_check

    gap = lambda s: 0  # noqa: E731
    drv = CutDriver(LIMITS, PREFILL_HEAVY, gap)
    cut, _ = run_cut_down(drv, tolerance=0, attribute_ops=False)
    cut_figures = {r.shape: r.peak_bytes for r in cut.cut_steps}
    decode = [r for r in cut.cut_steps if r.shape.kind == "decode"]
    lo = min(decode, key=lambda r: r.peak_bytes)
    hi = max(decode, key=lambda r: r.peak_bytes)
    boost = cut.peak_bytes - hi.peak_bytes + 10 * MiB
    sample = dataclasses.replace(lo, peak_bytes=lo.peak_bytes + boost)
    proof = judge_self_check(cut, cut_figures, [sample], depth="1 layer", resolution=MiB,
                             base_delta=boost, seconds=0.0)  # (a) passes: its allowance is the boost
    assert not proof.proven and "is bounded above the admitted" in proof.verdict
    assert hi.shape.label() in proof.verdict


def test_a_verify_step_is_a_class_of_its_own_under_a_drafter():
    from worstcase_profiler.core.sweep_depth import shape_class

    assert shape_class(Shape("decode", rows=8, context_len=100, num_reqs=8)) == "decode"
    assert shape_class(Shape("decode", rows=24, context_len=100, num_reqs=8)) == "verify"
    assert shape_class(Shape("mixed", rows=24, context_len=100, num_reqs=8)) == "mixed"


def test_a_model_that_cannot_be_cut_raises_before_the_self_check_measures_anything():
    import pytest

    class Uncut(CutDriver):
        @contextlib.contextmanager
        def cut_down(self, prefix=False):
            raise ValueError("no decoder")
            yield

    drv = Uncut(LIMITS, PREFILL_HEAVY, lambda s: 0)
    with pytest.raises(ValueError, match="no decoder"):
        _self_checked(drv)
    assert drv.shapes == []


def test_a_fallback_admits_no_less_than_a_full_model_step_the_self_check_read():
    """Review: the fallback admitted the fresh full sweep alone; on a noisy meter its re-reading
    of the step that refuted the self-check can come out lower than that first reading. Nothing
    is admitted below a reading taken in the same start."""
    gap = lambda s: 400 * MiB if s.kind == "decode" and s.num_reqs > 2 else 0  # noqa: E731
    full_f = lambda s: PREFILL_HEAVY(s) + gap(s)  # noqa: E731

    class Settling(CutDriver):
        """The full model's decode steps read 5 MiB lower after their first reading."""
        def __init__(self, *a):
            super().__init__(*a)
            self.seen = set()

        def measure(self, shape, attribute=False):
            r = super().measure(shape, attribute)
            if self.cut or shape.kind != "decode":
                return r
            if shape not in self.seen:
                self.seen.add(shape)
                return r
            return dataclasses.replace(r, peak_bytes=r.peak_bytes - 5 * MiB)

    drv = Settling(LIMITS, full_f, gap)
    sweep, _, proof = _self_checked(drv)
    sampled = max(p for p in (full_f(s) for s in proof.sampled))
    assert proof.fell_back and sweep.peak_bytes >= sampled
    assert proof.full_admitted_bytes == sweep.peak_bytes


def test_a_class_whose_sample_cannot_be_built_refutes_the_self_check():
    """Review: a class left unsampled was skipped and the verdict could still read proven,
    though the argument needs every class measured: the full sweep runs instead."""

    class NoMixed(CutDriver):
        def cannot_build(self, shape):
            return "no mixed step on the full model" if shape.kind == "mixed" and not self.cut else None

    drv = NoMixed(LIMITS, PREFILL_HEAVY, lambda s: MiB)
    sweep, mode, proof = _self_checked(drv)
    assert not proof.proven and proof.fell_back and "mixed" in proof.verdict
    assert "could be built" in proof.verdict and mode.startswith("full: the cut-down sweep's self-check failed")
    full = run_sweep(FakeDriver(LIMITS, transient=PREFILL_HEAVY), tolerance=0, attribute_ops=False)
    assert sweep.peak_bytes >= full.peak_bytes


def test_a_decode_beside_the_full_chunk_is_swept_and_can_be_the_worst():
    """A per-decode buffer on top of a full chunk's (a sparse indexer's logits row) peaks in the
    mixed pair; the many-decode mixed step's chunk is shorter and a lone chunk has no decode."""
    limits = Limits(max_model_len=4096, max_num_batched_tokens=512, max_num_seqs=16,
                    block_size=16)

    def transient(s):
        chunk = s.rows - (s.num_reqs - 1) if s.kind == "mixed" else s.rows
        return chunk * MiB + (3 * MiB if s.kind == "mixed" and chunk == 511 else 0)

    d = FakeDriver(limits, transient=transient)
    out = run_sweep(d, tolerance=0, attribute_ops=False)
    assert Shape("mixed", 512, 4096 - 511, 2) in d.shapes
    assert out.worst.shape == Shape("mixed", 512, 4096 - 511, 2)


def test_a_reused_sweep_keeps_its_post_profile_figure_within_the_resolution():
    """The same configuration gets the same admission on a restart: the replay's post-profile
    reading (RSS on the CPU, 4 KiB apart between starts) stands in for the cached one only when
    it is more than the meter's resolution above it."""
    from worstcase_profiler.core.sweep import replay, reused

    d = FakeDriver(LIMITS, transient=lambda s: s.rows * 1000 + 5 * MiB)
    cached = dataclasses.replace(run_sweep(d, tolerance=0, attribute_ops=False),
                                 post_profile_bytes=7 + 4096 - 1)  # the fake replay reads 7
    check = replay(d, cached.worst.shape)
    assert reused(cached, check, MiB).post_profile_bytes == cached.post_profile_bytes
    low = dataclasses.replace(cached, post_profile_bytes=7 - 4096)
    assert reused(low, check, resolution=4096 - 1).post_profile_bytes == 7  # far above: the new
    assert reused(low, check, resolution=MiB).post_profile_bytes == low.post_profile_bytes


def test_a_context_curve_point_confirmed_on_the_full_model_shows_its_full_model_figure():
    """The context curve (where stock runs out; the picture's context panel) counts a point as
    the admitted figure does: a confirmed shape at its full-model reading, not its cut-down one
    raised. On a real CPU engine, compiled, the first cut step (rows=1 at full context, the
    first eager call) read 33 MB that its full-model confirmation did not: the curve showed 36
    MB beside an admitted 5.4 MB."""
    from worstcase_profiler.core.sweep import run_cut_down

    first = Shape("prefill", 1, LIMITS.max_model_len - 1, 1)
    f = lambda s: s.rows * MiB // 4  # noqa: E731
    gap = lambda s: -40 * MiB if s == first else 0  # noqa: E731 - the cut step reads 40 MiB more
    drv = CutDriver(LIMITS, f, gap)
    cut, _ = run_cut_down(drv, tolerance=0, attribute_ops=False)
    assert first in drv.full_shapes  # the cut-down sweep's heaviest step was confirmed
    point = {r.shape: r.peak_bytes for r in cut.context_curve}
    assert first in point and point[first] == f(first) == MiB // 4
    assert max(point.values()) <= cut.peak_bytes


class CompiledCutDriver(CutDriver):
    """A compiled forward: the cut steps run eagerly (`transient - gap`), the full model
    compiled (`transient`) or, under eager_full, eagerly (`eager(shape)`)."""

    def __init__(self, limits, transient, gap, eager, stock_transient=MiB):
        super().__init__(limits, transient, gap, stock_transient=stock_transient)
        self.eager, self.eager_mode, self.eager_shapes = eager, False, []

    @contextlib.contextmanager
    def eager_full(self):
        self.eager_mode = True
        yield True
        self.eager_mode = False

    def measure_stock(self):
        r = super().measure_stock()
        if self.eager_mode:
            return dataclasses.replace(r, peak_bytes=self.eager(r.shape))
        return r

    def measure(self, shape, attribute=False):
        if self.eager_mode:
            assert not self.cut
            self.eager_shapes.append(shape)
            return StepResult(shape=shape, peak_bytes=self.eager(shape), seconds=0.0)
        return super().measure(shape, attribute)


def test_on_a_compiled_forward_a_saving_from_compiling_cannot_hide_what_depth_adds():
    """The lab's compiled proofs (h200-run31) read full-compiled minus cut-eager as 0 where the
    eager proofs read +64 MiB of depth: compiling saved about what the skipped layers add. If
    the saving grows with the step, the heaviest member's difference is 0 while a light one's
    is not, and an admitted figure built on full-compiled minus cut-eager falls short. Read
    eagerly on the full model too, depth (+100 MiB here) is allowed whatever compiling saves."""
    from worstcase_profiler.core.sweep import run_self_checked
    from worstcase_profiler.core.sweep_depth import depth_difference

    prefill = lambda s: s.kind in ("prefill", "stock")  # noqa: E731
    base = lambda s: s.rows * MiB  # noqa: E731 - the cut decoder, eager
    eager = lambda s: base(s) + (100 * MiB if prefill(s) else 0)  # noqa: E731 - depth adds 100
    saving = lambda s: (100 * MiB * s.rows // LIMITS.max_num_batched_tokens  # noqa: E731
                        if prefill(s) else 0)
    full = lambda s: eager(s) - saving(s)  # noqa: E731 - compiled: saves most on heavy steps
    gap = lambda s: full(s) - base(s)  # noqa: E731
    truth = max(full(s) for s in [*_every_shape(), ])
    sweep, mode, proof = run_self_checked(
        CompiledCutDriver(LIMITS, full, gap, eager, stock_transient=full(_stock())),
        resolution=MiB, tolerance=0, attribute_ops=False)
    # the prefill class is covered by its confirmed heaviest member (no sample), the others'
    # samples gain nothing: only the split difference allows what depth adds to a light prefill
    assert sweep.peak_bytes >= truth, (sweep.peak_bytes, truth, mode)
    assert proof.depth_delta >= 100 * MiB and proof.proven, proof
    # the old reading, full compiled minus cut eager, saw nothing on the heaviest step
    heavy = Shape("prefill", LIMITS.max_num_batched_tokens, 192, 1)
    assert full(heavy) - base(heavy) == 0 and depth_difference(full(heavy), base(heavy),
                                                               eager(heavy)) == 100 * MiB


def test_compiled_samples_take_both_ends_of_every_class_in_each_graph():
    """class_samples: eager, one per uncovered class, its heaviest member; compiled, per class
    and graph vLLM compiles by size, the heaviest where no confirmation runs that graph and the
    lightest (fewest rows), none twice and none already confirmed."""
    from worstcase_profiler.core.sweep import class_samples, graph_of

    def r(kind, rows, reqs, need):
        return StepResult(Shape(kind, rows, 100, reqs), peak_bytes=need, seconds=0.0)

    steps = [r("prefill", 1, 1, 1), r("prefill", 4, 1, 4), r("prefill", 64, 1, 64),
             r("prefill", 512, 1, 512), r("decode", 2, 2, 2), r("decode", 256, 256, 256),
             r("mixed", 300, 2, 300)]
    top = steps[3].shape
    assert class_samples(steps, [top]) == [Shape("decode", 256, 100, 256),
                                           Shape("mixed", 300, 100, 2)]
    one = class_samples(steps, [top], ())
    assert one == [Shape("prefill", 1, 100, 1), Shape("decode", 256, 100, 256),
                   Shape("decode", 2, 100, 2), Shape("mixed", 300, 100, 2)]
    graphs = ((4, 4), (1, 8), (9, 8192))
    assert [graph_of(n, graphs) for n in (4, 1, 8, 9, 9000)] == [0, 1, 1, 2, -1]
    two = class_samples(steps, [top], graphs)
    assert two == [Shape("prefill", 4, 100, 1), Shape("prefill", 1, 100, 1),
                   Shape("prefill", 64, 100, 1), Shape("decode", 2, 100, 2),
                   Shape("decode", 256, 100, 256), Shape("mixed", 300, 100, 2)]


def test_a_graph_specialised_to_small_sizes_refutes_the_compiled_self_check():
    """The adversary that kept auto's full sweep for compiled forwards: compiling adds 80 MiB
    to prefill chunks of 8 rows or fewer only (a graph of their own), where the classes' heavy
    members read nothing of it. The compiled self-check samples both ends of every class in
    each graph, reads it on a light prefill, and falls back to the full sweep, which admits
    it; with the graphs unknown (one assumed) the lightest prefill still shows it."""
    from worstcase_profiler.core import sweep as core_sweep
    from worstcase_profiler.core.sweep import run_self_checked

    base = lambda s: 200 * MiB + s.rows * 1024  # noqa: E731 - the cut decoder, eager
    eager = lambda s: base(s)  # noqa: E731 - depth adds nothing
    small = lambda s: 80 * MiB if s.kind == "prefill" and s.rows <= 8 else 0  # noqa: E731
    full = lambda s: eager(s) + small(s)  # noqa: E731
    gap = lambda s: full(s) - base(s)  # noqa: E731
    truth = max(full(s) for s in _every_shape())
    assert truth >= 280 * MiB  # a light prefill sets the peak, compiled
    # read as the eager self-check reads (each class's heaviest member only), it is missed
    eager_samples = core_sweep.class_samples
    core_sweep.class_samples = lambda steps, confirmed, graphs=None: eager_samples(steps, confirmed)
    try:
        drv = CompiledCutDriver(LIMITS, full, gap, eager, stock_transient=full(_stock()))
        missed, _, blind = run_self_checked(drv, resolution=MiB, tolerance=0, attribute_ops=False)
    finally:
        core_sweep.class_samples = eager_samples
    assert blind.proven and missed.peak_bytes < truth, (missed.peak_bytes, truth)
    for graphs in (((1, 8), (9, LIMITS.max_num_batched_tokens)), ()):
        drv = CompiledCutDriver(LIMITS, full, gap, eager, stock_transient=full(_stock()))
        drv.graph_ranges = lambda g=graphs: g
        sweep, mode, proof = run_self_checked(drv, resolution=MiB, tolerance=0,
                                              attribute_ops=False)
        assert not proof.proven and proof.fell_back, (graphs, proof.verdict)
        assert "prefill" in proof.verdict and sweep.peak_bytes >= truth, (sweep.peak_bytes, truth)
        assert any(s.kind == "prefill" and s.rows <= 8 for s in proof.sampled)


def test_each_graph_vllm_compiles_by_size_is_sampled_not_only_the_ends_of_a_class():
    """Compiling adds 80 MiB to prefills of 9 to 16 rows only, a graph of their own: neither
    the narrowest nor the widest prefill runs it, so only sampling per graph finds it. With
    the graphs unknown the self-check cannot, and its mode line says they were unknown (auto
    then sweeps a family no compiled proof covers whole: sweep_depth)."""
    from worstcase_profiler.core.sweep import run_self_checked

    base = lambda s: 200 * MiB + s.rows * 1024  # noqa: E731
    mid = lambda s: 80 * MiB if s.kind == "prefill" and 9 <= s.rows <= 16 else 0  # noqa: E731
    full = lambda s: base(s) + mid(s)  # noqa: E731
    gap = lambda s: full(s) - base(s)  # noqa: E731
    truth = max(full(s) for s in _every_shape())
    assert truth >= 280 * MiB
    top = LIMITS.max_num_batched_tokens
    drv = CompiledCutDriver(LIMITS, full, gap, base, stock_transient=full(_stock()))
    drv.graph_ranges = lambda: ((1, 8), (9, 16), (17, top))
    sweep, mode, proof = run_self_checked(drv, resolution=MiB, tolerance=0, attribute_ops=False)
    assert proof.fell_back and sweep.peak_bytes >= truth, (proof.verdict, sweep.peak_bytes)
    drv = CompiledCutDriver(LIMITS, base, lambda s: 0, base, stock_transient=base(_stock()))
    drv.graph_ranges = lambda: ((1, 8), (9, 16), (17, top))
    sweep, mode, proof = run_self_checked(drv, resolution=MiB, tolerance=0, attribute_ops=False)
    assert proof.proven and "in 3 of the 3 graph(s) vLLM compiles by batch size" in mode, mode
    drv = CompiledCutDriver(LIMITS, full, gap, base, stock_transient=full(_stock()))
    drv.graph_ranges = lambda: None
    sweep, mode, proof = run_self_checked(drv, resolution=MiB, tolerance=0, attribute_ops=False)
    assert proof.proven and sweep.peak_bytes < truth  # what unknown graphs cannot show
    assert "graphs by batch size could not be read" in mode, mode


def test_what_compiling_adds_per_row_is_read_on_each_class_s_widest_member_too():
    """A review's adversary: the cut-down need grows with the context (so a class's heaviest
    member by need is a narrow step at long context) while compiling adds 1 MiB per prefill
    row. Sampled at the heaviest and the narrowest members only, the self-check read it
    'proven' and admitted 264.75 MiB against a true 312 MiB; the widest member shows it."""
    from worstcase_profiler.core.sweep import run_self_checked

    base = lambda s: 200 * MiB + s.context_len * 1024 // 64  # noqa: E731 - need grows with context
    eager = lambda s: base(s)  # noqa: E731 - depth adds nothing
    full = lambda s: eager(s) + (s.rows * MiB // 64 if s.kind == "prefill" else 0)  # noqa: E731
    gap = lambda s: full(s) - base(s)  # noqa: E731
    truth = max(full(s) for s in _every_shape())
    for graphs in (((1, LIMITS.max_num_batched_tokens),), ()):
        drv = CompiledCutDriver(LIMITS, full, gap, eager, stock_transient=full(_stock()))
        drv.graph_ranges = lambda g=graphs: g
        sweep, mode, proof = run_self_checked(drv, resolution=MiB, tolerance=0,
                                              attribute_ops=False)
        assert sweep.peak_bytes >= truth, (graphs, sweep.peak_bytes, truth, proof.verdict)
        widest = max(s.rows for s in _every_shape() if s.kind == "prefill")
        assert any(s.kind == "prefill" and s.rows == widest for s in drv.full_shapes)


def _stock():
    from worstcase_profiler.core.shapes import stock_shape
    return stock_shape(LIMITS)


def _every_shape():
    """Every shape a full sweep of LIMITS measures (a plain run on the eager-free fake)."""
    d = FakeDriver(LIMITS, transient=lambda s: 0)
    run_sweep(d, tolerance=0, attribute_ops=False)
    return d.shapes


class _Clock:
    """time.perf_counter for core.sweep, advanced by the fake drivers' steps."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _timed(driver_cls, clock, cut_s, full_s, eager_s):
    """driver_cls whose steps advance `clock`: cut_s a cut step, full_s a full-model step
    (compiled), eager_s an eager re-read of one."""

    class Timed(driver_cls):
        def _tick(self):
            clock.now += (eager_s if getattr(self, "eager_mode", False)
                          else cut_s if self.cut else full_s)

        def measure_stock(self):
            self._tick()
            return super().measure_stock()

        def measure(self, shape, attribute=False):
            self._tick()
            return super().measure(shape, attribute)

    return Timed


def test_the_self_checks_time_is_split_where_it_went(monkeypatch):
    """The proof says how much of a cut-down start's sweep the cut decoder, the full model's
    readings and (compiled) their eager re-reads took, each the steps' own time: issue 34's
    question of what costs a first start with graphs. An eager forward has no re-reads."""
    import pytest

    import worstcase_profiler.core.sweep as sweep_mod

    f = PREFILL_HEAVY
    for compiled in (False, True):
        clock = _Clock()
        monkeypatch.setattr(sweep_mod, "time", types.SimpleNamespace(perf_counter=clock))
        if compiled:
            drv = _timed(CompiledCutDriver, clock, 0.001, 1.0, 10.0)(
                LIMITS, f, lambda s: MiB, f, stock_transient=f(_stock()))
        else:  # an eager forward whose eager_full finds nothing compiled (after a 5 s look)
            class Eager(CutDriver):
                @contextlib.contextmanager
                def eager_full(self):
                    clock.now += 5.0
                    yield False

            drv = _timed(Eager, clock, 0.001, 1.0, 10.0)(LIMITS, f, lambda s: MiB)
        _, _, proof = _self_checked(drv)
        split = proof.seconds_split
        full_reads = len(drv.full_shapes) + 1  # the confirmations and samples, the stock step
        looked = 0.0 if compiled else 5.0  # finding nothing compiled is the full model's time
        assert split["full_model"] == pytest.approx(full_reads * 1.0 + looked, abs=1e-6), split
        assert split["cut_decoder"] < 1.0 < split["full_model"]
        if compiled:  # every full-model reading was read eagerly too
            assert split["eager_rereads"] == pytest.approx(10.0 * full_reads, abs=1e-6), split
            assert len(drv.eager_shapes) == full_reads - 1
        else:
            assert "eager_rereads" not in split
        assert sum(split.values()) == pytest.approx(proof.cut_seconds, abs=2e-3)


# --- a restart on its own (or a signed) entry replays its worst step on the cut decoder ---------


def test_a_trusted_self_checked_entry_replays_its_worst_step_on_the_cut_decoder():
    """Issue 34's restarts: the worst step runs on the cut decoder and is judged against its own
    cut-down reading (like with like), the stock step still on the full model; the same
    configuration restarts at the figure it first admitted, and the worst shape never runs on
    the full model."""
    from worstcase_profiler.core.cache_trust import cache_verdict, replays_on_cut
    from worstcase_profiler.core.sweep import cut_reading, replay, replayed_against, reused

    sweep, _, proof = _self_checked(CutDriver(LIMITS, PREFILL_HEAVY, lambda s: 7 * MiB))
    assert proof.proven
    assert replays_on_cut("host", proof, cut_reading(sweep, sweep.worst.shape), exact=True)
    drv = CutDriver(LIMITS, PREFILL_HEAVY, lambda s: 7 * MiB)  # the restart's engine
    check = replay(drv, sweep.worst.shape, cut=True)
    assert check.cut_depth == "1 layer" and drv.full_shapes == []  # the stock step: measure_stock
    assert check.step.peak_bytes == PREFILL_HEAVY(sweep.worst.shape) - 7 * MiB
    on_cut = cut_reading(sweep, sweep.worst.shape)
    assert replayed_against(sweep, check) == on_cut.need_bytes < sweep.worst.need_bytes
    assert cache_verdict(replayed_against(sweep, check), check.step.need_bytes, 0)[0]
    assert reused(sweep, check, MiB).peak_bytes == sweep.peak_bytes


def test_a_cut_replay_that_reads_more_raises_the_transient_and_a_full_one_compares_full_figures():
    """What changed under the key shows on the cut decoder: a worst step reading 3 MiB more
    there raises the admitted transient by that drift (never compared with the larger full
    figure, which would hide it); a full-model replay of the same entry is judged as before."""
    import pytest

    from worstcase_profiler.core.sweep import replay, replayed_against, reused

    sweep, _, _ = _self_checked(CutDriver(LIMITS, PREFILL_HEAVY, lambda s: 7 * MiB))
    more = CutDriver(LIMITS, lambda s: PREFILL_HEAVY(s) + 3 * MiB, lambda s: 7 * MiB)
    check = replay(more, sweep.worst.shape, cut=True)
    assert check.step.need_bytes - replayed_against(sweep, check) == 3 * MiB
    assert reused(sweep, check, MiB).peak_bytes == sweep.peak_bytes + 3 * MiB
    full = replay(CutDriver(LIMITS, PREFILL_HEAVY, lambda s: 7 * MiB), sweep.worst.shape)
    assert full.cut_depth is None and replayed_against(sweep, full) == sweep.worst.need_bytes
    assert reused(sweep, full, MiB).peak_bytes == sweep.peak_bytes
    with pytest.raises(ValueError):
        replay(more, sweep.worst.shape, (sweep.stock.shape,), cut=True)


def test_only_a_trusted_proven_self_check_replays_on_the_cut_decoder():
    """replays_on_cut: a re-checked entry (unsigned, imported), a full sweep, a proof that fell
    back or was a prove run, or a stock worst step replay on the full model as before."""
    from worstcase_profiler.core.cache_trust import replays_on_cut
    from worstcase_profiler.core.sweep import cut_reading

    sweep, _, proof = _self_checked(CutDriver(LIMITS, PREFILL_HEAVY, lambda s: 7 * MiB))
    on_cut = cut_reading(sweep, sweep.worst.shape)
    assert replays_on_cut("host", proof, on_cut, exact=True)
    assert replays_on_cut("signed", proof, on_cut, exact=True)
    assert not replays_on_cut("host", proof, on_cut, exact=False)  # RSS: within its noise
    assert not replays_on_cut("re-checked", proof, on_cut, exact=True)
    assert not replays_on_cut(None, proof, on_cut, exact=True)
    assert not replays_on_cut("host", None, on_cut, exact=True)
    for other in (dataclasses.replace(proof, method="prove"),
                  dataclasses.replace(proof, verdict="refuted"),
                  dataclasses.replace(proof, fell_back=True)):
        assert not replays_on_cut("host", other, on_cut, exact=True)
    stock_worst = dataclasses.replace(sweep, worst=sweep.stock)
    assert cut_reading(stock_worst, stock_worst.worst.shape) is None
    assert not replays_on_cut("host", proof, cut_reading(stock_worst, sweep.stock.shape),
                              exact=True)
    assert not replays_on_cut("host", proof, dataclasses.replace(on_cut, shape=sweep.stock.shape),
                              exact=True)  # a stock reading never replays on the cut
    full = run_sweep(FakeDriver(LIMITS, transient=PREFILL_HEAVY), tolerance=0, attribute_ops=False)
    assert cut_reading(full, full.worst.shape) is None
    assert not replays_on_cut("host", proof, cut_reading(full, full.worst.shape), exact=True)


def test_beside_a_cut_replay_the_stock_steps_full_model_drift_counts_even_where_left_out():
    """The stock step is the one full-model reading a cut replay takes: where every full-model
    step needs 20 MiB more after a change the cut decoder does not show, its drift raises the
    admitted transient, also where the sweep left the stock step out of the worst (a drafter's
    small pool), where it would drift nothing beside a full-model replay."""
    from worstcase_profiler.core.sweep import replay, reused

    sweep, _, _ = _self_checked(CutDriver(LIMITS, PREFILL_HEAVY, lambda s: 7 * MiB))

    class Deeper(CutDriver):  # the full model needs 20 MiB more; the cut decoder the same
        def measure_stock(self):
            r = super().measure_stock()
            return r if self.cut else dataclasses.replace(r, peak_bytes=r.peak_bytes + 20 * MiB)

    for excluded in (None, "the stock step never runs beside the KV cache"):
        cached = dataclasses.replace(sweep, stock_excluded=excluded)
        check = replay(Deeper(LIMITS, PREFILL_HEAVY, lambda s: 7 * MiB), cached.worst.shape,
                       cut=True)
        assert check.step.peak_bytes == PREFILL_HEAVY(cached.worst.shape) - 7 * MiB  # unchanged
        assert reused(cached, check, MiB).peak_bytes == cached.peak_bytes + 20 * MiB, excluded


def test_a_cut_replay_runs_the_cut_stock_step_first_as_the_sweep_did():
    """The cut decoder's first step pays one-time allocations (a compiled model's first eager
    call read 31 MiB on a CPU engine, the same shape 780 KiB warm). The sweep ran the cut stock
    step first; the replay does too, unread, so the worst shape reads warm, like with like."""
    from worstcase_profiler.core.sweep import replay, replayed_against

    sweep, _, _ = _self_checked(CutDriver(LIMITS, PREFILL_HEAVY, lambda s: 7 * MiB))

    class ColdFirst(CutDriver):  # the first step on the cut decoder reads 31 MiB more
        def _cold(self, r):
            if self.cut and not getattr(self, "warm", False):
                self.warm = True
                return dataclasses.replace(r, peak_bytes=r.peak_bytes + 31 * MiB)
            return r

        def measure_stock(self):
            return self._cold(super().measure_stock())

        def measure(self, shape, attribute=False):
            return self._cold(super().measure(shape, attribute))

    check = replay(ColdFirst(LIMITS, PREFILL_HEAVY, lambda s: 7 * MiB), sweep.worst.shape,
                   cut=True)
    assert check.step.need_bytes == replayed_against(sweep, check)


def test_a_shape_read_several_times_on_the_cut_is_judged_against_its_largest_reading():
    from worstcase_profiler.core.sweep import Replay, cut_reading, replayed_against, reused

    sweep, _, _ = _self_checked(CutDriver(LIMITS, PREFILL_HEAVY, lambda s: 7 * MiB))
    first = cut_reading(sweep, sweep.worst.shape)
    again = dataclasses.replace(first, peak_bytes=first.peak_bytes + 3 * MiB)
    cut = sweep.cut_steps
    twice = dataclasses.replace(sweep, steps=(*cut, again, *sweep.steps[len(cut):]))
    assert twice.cut_steps[-1] == again and cut_reading(twice, sweep.worst.shape) == again
    check = Replay(stock=sweep.stock, step=again, seconds=0.0, cut_depth="1 layer",
                   provisional=ProvisionalKV(1, 1, sweep.post_profile_bytes))
    assert replayed_against(twice, check) == again.need_bytes
    assert reused(twice, check, MiB).peak_bytes == twice.peak_bytes  # no drift against its own


def test_sweep_or_reuse_replays_a_trusted_entry_on_its_cut_and_never_on_another_cut(tmp_path):
    """The adapter's reuse (adapter/sweep_cache.sweep_or_reuse) over the fake driver: an entry
    this host wrote, self-checked proven, is reused after a cut replay on CUDA's meter
    (replay_depth set, the cut-down reading as the cached need); one whose proof names another
    cut than this start cuts to is stale, and the full sweep runs; on the CPU's RSS meter the
    worst step replays on the full model."""
    from worstcase_profiler.adapter.sweep_cache import CacheHandle, sweep_or_reuse
    from worstcase_profiler.core.cache import CacheEntry, SweepCache
    from worstcase_profiler.core.timing import PhaseTimer

    sweep, _, proof = _self_checked(CutDriver(LIMITS, PREFILL_HEAVY, lambda s: 7 * MiB))
    drv = CutDriver(LIMITS, PREFILL_HEAVY, lambda s: 7 * MiB)
    drv.agree_max = lambda v: v
    drv.meter = types.SimpleNamespace(device_kind="cuda", resolution_bytes=MiB,
                                      allocator_slack_bytes=0)
    handle = CacheHandle(SweepCache(tmp_path), "k", {}, trust="host")
    swept = []

    def full():
        swept.append(True)
        return sweep, "full", None

    entry = CacheEntry(key="k", facts={}, created_at="t", sweep=sweep, proof=proof)
    got, use, kept, _, _ = sweep_or_reuse(drv, LIMITS, MiB, PhaseTimer(), handle, entry, full)
    assert use.status == "hit" and use.replay_depth == "1 layer" and kept is entry and not swept
    assert use.cached_need_bytes < sweep.worst.need_bytes and got.peak_bytes == sweep.peak_bytes
    other = dataclasses.replace(entry, proof=dataclasses.replace(proof, depth="2 layers"))
    _, use, kept, _, _ = sweep_or_reuse(drv, LIMITS, MiB, PhaseTimer(), handle, other, full)
    assert use.status == "stale" and kept is None and swept == [True]
    drv.meter.device_kind = "cpu"  # RSS: the worst step replays on the full model
    _, use, kept, _, _ = sweep_or_reuse(drv, LIMITS, MiB, PhaseTimer(), handle, entry, full)
    assert use.status == "hit" and use.replay_depth is None
    assert use.cached_need_bytes == sweep.worst.need_bytes


def test_a_rank_whose_peer_refuses_the_cut_replays_on_the_full_model_too(tmp_path):
    """The cut replay is agreed: where another rank cannot replay on the cut decoder (its entry
    re-checked, its meter inexact), this rank, which could, replays its worst step on the full
    model as well (both run the same steps, which hold collectives), judged against the full
    model's figure. A fake world of two: agree_max returns the larger of this rank's value and
    the other rank's, scripted per question."""
    import pytest

    from worstcase_profiler.adapter.sweep_cache import CacheHandle, sweep_or_reuse
    from worstcase_profiler.core.cache import CacheEntry, SweepCache
    from worstcase_profiler.core.timing import PhaseTimer

    sweep, _, proof = _self_checked(CutDriver(LIMITS, PREFILL_HEAVY, lambda s: 7 * MiB))
    entry = CacheEntry(key="k", facts={}, created_at="t", sweep=sweep, proof=proof)
    handle = CacheHandle(SweepCache(tmp_path), "k", {}, trust="host")

    def start(other_refuses_cut: bool):
        drv = CutDriver(LIMITS, PREFILL_HEAVY, lambda s: 7 * MiB)
        drv.meter = types.SimpleNamespace(device_kind="cuda", resolution_bytes=MiB,
                                          allocator_slack_bytes=0)
        # the other rank's answers: has an entry, no re-check, then the cut (1: it refuses)
        other, asked = iter([0, 0, int(other_refuses_cut)]), []

        def agree_max(v: int) -> int:
            asked.append(v)
            return max(v, next(other, 0))

        drv.agree_max = agree_max
        got = sweep_or_reuse(drv, LIMITS, MiB, PhaseTimer(), handle, entry,
                             lambda: pytest.fail("the entry is reused, nothing sweeps"))
        assert len(asked) == 4  # entry, re-check, cut, verdict: the script's order
        return got

    _, alone, _, _, _ = start(False)
    assert alone.status == "hit" and alone.replay_depth == "1 layer"
    _, use, kept, _, _ = start(True)
    assert use.status == "hit" and kept is entry and use.replay_depth is None
    assert use.cached_need_bytes == sweep.worst.need_bytes > alone.cached_need_bytes
