"""Covering every rows value lo..hi without assuming where the worst one is.

The step's transient peak is not monotone in rows: kernels pick tile sizes, split counts and
workspaces from the batch size, so a rows value just past a tile boundary can beat rows=N.
Running every rows value is exact but costs N model steps. Instead we certify segments:
between two executed rows values a and b, two interior probes at irregular offsets must lie on
the straight chord between (a, P(a)) and (b, P(b)) within `tolerance`; if they do, the peak is
taken to be affine on [a, b] and so bounded by its ends (plus the tolerance). If they do not,
the segment is split at the probes and each part is certified again, down to single rows.

Pure Python: no vLLM, no torch. The probe sequence is a function of (lo, hi, seeds, tolerance)
and the measured peaks only, so every tensor-parallel rank runs the identical steps provided
`measure` returns a rank-agreed value (e.g. an all-reduce MAX of the local peaks).
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Iterable

from .types import CoveredSegment, RowsCoverage, certified_count  # noqa: F401 (re-exported)

# Irregular interior offsets (golden-section points): unlike halves/quarters they do not line
# up with power-of-two tile boundaries, so a periodic staircase is unlikely to look collinear.
PROBE_FRACTIONS = (0.382, 0.618)

METHOD_CHORD = "chord-bisection"
METHOD_EXHAUSTIVE = "exhaustive"

ARGUMENT_CHORD = (
    "Chord certificate with bisection. Assumption: a step's transient peak is piecewise affine "
    "in rows (activations scale linearly with rows; kernels change tiling, split counts or "
    "workspace only at discrete rows values), so on a segment where it is affine its maximum "
    "is at an end. Every segment [a, b] between executed rows values is probed at two irregular "
    "interior points (38% and 62% of the way); if both peaks lie within the tolerance of the "
    "straight chord between P(a) and P(b), the segment is certified and every rows value in it "
    "is bounded by max(P(a), P(b)) + tolerance; otherwise it is split at the probes and each "
    "part is probed again. A tile-rounded step function breaks collinearity, so at every step "
    "larger than the tolerance the bisection descends to adjacent rows values and the step "
    "itself is executed. The residual risk is a step or spike hidden between samples that "
    "happen to be collinear. Where chords keep failing, segments shrink until every rows value "
    "in them has run: exhaustive execution is the fallback, and --exhaustive runs all of them."
)

ARGUMENT_EXHAUSTIVE = (
    "Exhaustive: every rows value in the range was executed, so the worst peak is the exact "
    "maximum over all of them; no assumption about the shape of peak(rows) is needed."
)


def interior_probes(a: int, b: int) -> list[int]:
    """The (at most two) rows values probed strictly inside (a, b), ascending."""
    width = b - a
    if width <= 1:
        return []
    picks = {min(max(a + round(f * width), a + 1), b - 1) for f in PROBE_FRACTIONS}
    return sorted(picks)


def seed_points(lo: int, hi: int, seeds: Iterable[int] = ()) -> list[int]:
    """lo, hi and the caller's seeds that fall inside [lo, hi], ascending, deduplicated."""
    return sorted({lo, hi} | {int(s) for s in seeds if lo <= int(s) <= hi})


def planned_probe_order(lo: int, hi: int, *, seeds: Iterable[int] = (),
                        exhaustive: bool = False) -> list[int]:
    """The rows values `cover_rows` executes first whatever the measurements say: the seeds
    ascending, then the interior probes of each seed segment left to right. Later probes
    depend on the (rank-agreed) peaks. Lets ranks and tests check the plan before running."""
    _check_range(lo, hi)
    if exhaustive:
        return list(range(lo, hi + 1))
    points = seed_points(lo, hi, seeds)
    order = list(points)
    for a, b in zip(points, points[1:]):
        order.extend(interior_probes(a, b))
    return order


def on_chord(a: int, pa: int, b: int, pb: int, x: int, px: int, tolerance: int) -> bool:
    """|P(x) - chord(x)| <= tolerance, in exact integer arithmetic (no float rounding)."""
    width = b - a
    deviation = px * width - (pa * width + (pb - pa) * (x - a))
    return abs(deviation) <= tolerance * width


def cover_rows(measure: Callable[[int], int], lo: int, hi: int, *, tolerance: int,
               exhaustive: bool = False, seeds: Iterable[int] = (),
               on_probe: Callable[[int, int], None] | None = None) -> RowsCoverage:
    """Run `measure` on enough rows values in [lo, hi] to bound the peak of every one of them.

    measure(rows) -> peak bytes is called at most once per rows value; on_probe(rows, peak) is
    called after each call. Segments are processed breadth-first, left to right."""
    _check_range(lo, hi)
    if tolerance < 0:
        raise ValueError(f"tolerance must be >= 0 bytes, got {tolerance}")
    peaks: dict[int, int] = {}

    def run(rows: int) -> int:
        if rows not in peaks:
            peak = int(measure(rows))
            peaks[rows] = peak
            if on_probe is not None:
                on_probe(rows, peak)
        return peaks[rows]

    if exhaustive:
        for rows in range(lo, hi + 1):
            run(rows)
        segments = [CoveredSegment(lo, hi, "executed")]
        return _result(peaks, segments, tolerance, METHOD_EXHAUSTIVE, ARGUMENT_EXHAUSTIVE)

    points = seed_points(lo, hi, seeds)
    for rows in points:
        run(rows)
    pending = deque(zip(points, points[1:]))
    done: list[CoveredSegment] = []
    while pending:
        a, b = pending.popleft()
        probes = interior_probes(a, b)
        for x in probes:
            run(x)
        if len(probes) == b - a - 1:  # nothing left unexecuted inside
            done.append(CoveredSegment(a, b, "executed"))
        elif all(on_chord(a, peaks[a], b, peaks[b], x, peaks[x], tolerance) for x in probes):
            done.append(CoveredSegment(a, b, "chord", tuple(probes)))
        else:
            cuts = [a, *probes, b]
            pending.extend(zip(cuts, cuts[1:]))
    if not done:  # lo == hi
        done.append(CoveredSegment(lo, hi, "executed"))
    return _result(peaks, _merge_executed(sorted(done, key=lambda s: s.lo)), tolerance,
                   METHOD_CHORD, ARGUMENT_CHORD)


def segment_bound(segment: CoveredSegment, peaks: dict[int, int], tolerance: int) -> int:
    """Executed: the exact maximum. Chord: max of the ends plus the tolerance (never below an
    executed probe)."""
    if segment.how == "executed":
        return max(peaks[r] for r in range(segment.lo, segment.hi + 1))
    ends = max(peaks[segment.lo], peaks[segment.hi]) + tolerance
    return max([ends, *(peaks[p] for p in segment.probes)])


def _result(peaks: dict[int, int], segments: list[CoveredSegment], tolerance: int, method: str,
            argument: str) -> RowsCoverage:
    # Ties go to the smallest rows value, like max() over range(lo, hi + 1).
    worst_rows = min(peaks, key=lambda r: (-peaks[r], r))
    bound = max(segment_bound(s, peaks, tolerance) for s in segments)
    return RowsCoverage(peak_table=tuple(sorted(peaks.items())), worst_rows=worst_rows,
                        worst_peak=peaks[worst_rows], bound=bound, tolerance=tolerance,
                        segments=tuple(segments), method=method, argument=argument)


def _merge_executed(segments: list[CoveredSegment]) -> list[CoveredSegment]:
    """Fold runs of adjacent executed segments into one, so the report stays short."""
    merged: list[CoveredSegment] = []
    for seg in segments:
        prev = merged[-1] if merged else None
        if prev and prev.how == seg.how == "executed" and prev.hi == seg.lo:
            merged[-1] = CoveredSegment(prev.lo, seg.hi, "executed")
        else:
            merged.append(seg)
    return merged


def _check_range(lo: int, hi: int) -> None:
    if not (1 <= lo <= hi):
        raise ValueError(f"rows range must satisfy 1 <= lo <= hi, got lo={lo} hi={hi}")
