"""cover_rows against synthetic peak(rows) functions whose true maximum is known by brute force."""

from __future__ import annotations

import math
import random

import pytest

from worstcase_profiler import report
from worstcase_profiler.core.coverage import (
    ARGUMENT_CHORD, certified_count, cover_rows, interior_probes, on_chord,
    planned_probe_order)
from worstcase_profiler.core.types import CoveredSegment

N = 8192
POWERS_OF_TWO = [2**i for i in range(14)]


def brute_force(peak, lo=1, hi=N):
    worst = max(range(lo, hi + 1), key=peak)
    return worst, peak(worst)


def affine(r):
    return 50 * 2**20 + 12_288 * r


def tile_rounded(r):
    return math.ceil(r / 64) * 64 * 4096


def padding_adversary(r):
    """A kernel whose tile is 1536 rows up to 6000 rows and 64 beyond, and whose padded rows
    cost 3x a real row: rows just past a big-tile boundary (4609) beat rows=N, and the maximum
    is neither a power of two nor N."""
    tile = 1536 if r <= 6000 else 64
    padded = math.ceil(r / tile) * tile
    return 1000 * r + 3000 * (padded - r)


def split_k_adversary(r):
    """Split-K scratch: 8 splits below 1500 rows, 2 up to 5000, 1 beyond; tile 48 then 128."""
    splits = 8 if r <= 1500 else (2 if r <= 5000 else 1)
    tile = 48 if r <= 3000 else 128
    return 100 * r + splits * math.ceil(r / tile) * tile * 900


class CountingMeasure:
    def __init__(self, peak):
        self.peak = peak
        self.calls: list[int] = []

    def __call__(self, rows):
        self.calls.append(rows)
        return self.peak(rows)


def test_affine_needs_few_probes():
    measure = CountingMeasure(affine)
    res = cover_rows(measure, 1, N, tolerance=0)
    assert len(res.peaks) <= 8
    assert (res.worst_rows, res.worst_peak) == (N, affine(N))
    assert res.bound == affine(N)
    assert all(s.how == "chord" for s in res.segments)
    assert res.certified_rows == N - len(res.peaks)


def test_affine_with_power_of_two_seeds_is_still_cheap():
    res = cover_rows(affine, 1, N, tolerance=0, seeds=POWERS_OF_TWO)
    assert len(res.peaks) <= 3 * len(POWERS_OF_TWO)
    assert set(POWERS_OF_TWO) <= set(res.peaks)
    assert res.worst_rows == N


def test_constant_peak():
    res = cover_rows(lambda r: 7 * 2**20, 1, N, tolerance=0)
    assert len(res.peaks) <= 4
    assert res.worst_peak == res.bound == 7 * 2**20
    assert res.worst_rows == 1  # ties go to the smallest rows value


@pytest.mark.parametrize("tolerance", [0, 4096, 2**20])
def test_tile_rounded_staircase(tolerance):
    res = cover_rows(tile_rounded, 1, N, tolerance=tolerance, seeds=POWERS_OF_TWO)
    _, true_max = brute_force(tile_rounded)
    assert res.worst_peak == true_max
    assert tile_rounded(res.worst_rows) == true_max
    assert res.bound >= true_max
    assert res.bound <= true_max + tolerance


@pytest.mark.parametrize("peak", [padding_adversary, split_k_adversary])
@pytest.mark.parametrize("tolerance", [0, 1024, 100_000])
@pytest.mark.parametrize("seeds", [(), POWERS_OF_TWO], ids=["no-seeds", "pow2-seeds"])
def test_adversarial_non_monotone_steps_find_true_argmax(peak, tolerance, seeds, record_property):
    true_rows, true_max = brute_force(peak)
    assert true_rows not in POWERS_OF_TWO and true_rows != N  # the adversary is adversarial
    assert true_max > peak(N)
    res = cover_rows(peak, 1, N, tolerance=tolerance, seeds=seeds)
    assert (res.worst_rows, res.worst_peak) == (true_rows, true_max)
    assert res.bound >= true_max
    assert len(res.peaks) < N // 2
    record_property("coverage_cost", f"{peak.__name__} tolerance={tolerance} seeds={len(seeds)}: "
                    f"executed {len(res.peaks)}/{N} rows, {res.certified_rows} certified by chord")


def test_bound_holds_for_every_rows_value_of_the_staircase():
    res = cover_rows(tile_rounded, 1, N, tolerance=0)
    peaks = res.peaks
    for seg in res.segments:
        assert seg.lo in peaks and seg.hi in peaks
    assert max(tile_rounded(r) for r in range(1, N + 1)) <= res.bound


def test_segments_partition_the_range():
    res = cover_rows(split_k_adversary, 1, N, tolerance=0, seeds=POWERS_OF_TWO)
    segs = res.segments
    assert segs[0].lo == 1 and segs[-1].hi == N
    for left, right in zip(segs, segs[1:]):
        assert left.hi == right.lo
    for seg in segs:
        if seg.how == "executed":
            assert all(r in res.peaks for r in range(seg.lo, seg.hi + 1))
    covered = len(res.peaks) + res.certified_rows
    assert covered == N


def test_noisy_affine_within_tolerance_is_certified():
    rng = random.Random(1234)
    noise = {r: rng.randint(-4000, 4000) for r in range(1, N + 1)}
    res = cover_rows(lambda r: affine(r) + noise[r], 1, N, tolerance=8192)
    assert len(res.peaks) <= 8
    assert all(s.how == "chord" for s in res.segments)
    assert res.bound >= max(affine(r) + noise[r] for r in range(1, N + 1))


def test_noise_beyond_tolerance_forces_bisection():
    rng = random.Random(99)
    noise = {r: rng.randint(-50_000, 50_000) for r in range(1, 513)}
    peak = lambda r: affine(r) + noise[r]  # noqa: E731
    res = cover_rows(peak, 1, 512, tolerance=1000)
    assert len(res.peaks) > 8
    assert res.bound >= max(peak(r) for r in range(1, 513))


def test_exhaustive_executes_every_rows_value():
    measure = CountingMeasure(padding_adversary)
    res = cover_rows(measure, 1, 300, tolerance=0, exhaustive=True)
    assert measure.calls == list(range(1, 301))
    assert res.executed_rows == list(range(1, 301))
    assert res.method == "exhaustive"
    assert [(s.lo, s.hi, s.how) for s in res.segments] == [(1, 300, "executed")]
    assert res.bound == res.worst_peak == max(padding_adversary(r) for r in range(1, 301))


def test_measure_is_memoized_and_on_probe_sees_each_call():
    measure = CountingMeasure(split_k_adversary)
    seen: list[tuple[int, int]] = []
    res = cover_rows(measure, 1, N, tolerance=0, seeds=[1, 1, N, 64, 64, 99999, 0],
                     on_probe=lambda r, p: seen.append((r, p)))
    assert len(measure.calls) == len(set(measure.calls))
    assert [r for r, _ in seen] == measure.calls
    assert all(res.peaks[r] == p for r, p in seen)
    assert 99999 not in res.peaks and 0 not in res.peaks  # out-of-range seeds are dropped


def test_planned_probe_order_is_deterministic_and_is_what_runs_first():
    seeds = [4096, 1024, 4096, 17]
    first = planned_probe_order(1, N, seeds=seeds)
    assert first == planned_probe_order(1, N, seeds=list(reversed(seeds)))
    assert first[:5] == [1, 17, 1024, 4096, N]
    for peak in (affine, padding_adversary):
        runs = [CountingMeasure(peak) for _ in range(2)]
        results = [cover_rows(m, 1, N, tolerance=0, seeds=seeds) for m in runs]
        assert runs[0].calls == runs[1].calls  # identical sequence on every rank
        assert runs[0].calls[:len(first)] == first
        assert report.coverage_model(results[0]) == report.coverage_model(results[1])


def test_planned_probe_order_exhaustive():
    assert planned_probe_order(3, 7, exhaustive=True) == [3, 4, 5, 6, 7]


def test_interior_probes_are_irregular_and_strictly_inside():
    assert interior_probes(1, 2) == []
    assert interior_probes(1, 3) == [2]
    assert interior_probes(0, 1000) == [382, 618]
    for a, b in [(1, 4), (10, 15), (1, 8192), (4096, 8192)]:
        probes = interior_probes(a, b)
        assert probes == sorted(set(probes))
        assert all(a < p < b for p in probes)


def test_on_chord_uses_exact_integers():
    assert on_chord(0, 0, 3, 10, 1, 3, tolerance=0) is False  # chord(1) = 3.33...
    assert on_chord(0, 0, 3, 9, 1, 3, tolerance=0) is True
    assert on_chord(0, 0, 3, 10, 1, 3, tolerance=1) is True


def test_single_row_range():
    res = cover_rows(lambda r: 5, 7, 7, tolerance=0)
    assert res.executed_rows == [7]
    assert res.bound == 5
    assert [(s.lo, s.hi, s.how) for s in res.segments] == [(7, 7, "executed")]


def test_bad_arguments():
    with pytest.raises(ValueError):
        cover_rows(affine, 0, 10, tolerance=0)
    with pytest.raises(ValueError):
        cover_rows(affine, 10, 5, tolerance=0)
    with pytest.raises(ValueError):
        cover_rows(affine, 1, 10, tolerance=-1)


def test_to_model_is_a_report_coverage():
    res = cover_rows(padding_adversary, 1, N, tolerance=1024, seeds=POWERS_OF_TWO)
    model = report.coverage_model(res)
    assert isinstance(model, report.Coverage)
    assert model.method == "chord-bisection"
    assert model.argument == ARGUMENT_CHORD
    assert model.tolerance_bytes == 1024
    assert model.executed_rows == sorted(res.peaks)
    assert all(isinstance(s, CoveredSegment) for s in model.segments)
    assert certified_count(model.segments, model.executed_rows) == res.certified_rows
    chord = [s for s in model.segments if s.how == "chord"]
    assert chord and all(s.probes for s in chord)
    assert "piecewise affine" in model.argument and "exhaustive" in model.argument
