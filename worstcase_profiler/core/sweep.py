"""The worst-case sweep, independent of vLLM: which steps run, in which order, and what the
results mean. The engine side is a `StepDriver` (adapter/runner.py implements it over vLLM's
model runners and meters); unit tests drive this module with a fake one.

Order of work (identical on every rank: decisions use the rank-agreed need of each step):
  1. the stock step: vLLM's own profile shape (max_num_batched_tokens rows, empty KV, no
     attention metadata), measured by the same meter;
  2. on a provisional KV cache that holds one request at max_model_len:
     a. prefill chunks of R rows on top of max_model_len - R cached tokens, for every R in
        1..max_num_batched_tokens (executed, or certified by the chord argument of coverage.py);
     b. the worst rows value split over 2, 4, 8, ... prefills; the full-context decode batch;
        the widest decode batch the KV pool can hold; the mixed prefill+decode step;
     c. the worst rows value at growing KV extent (the curve that says when stock runs out);
     d. the worst shape once more, attributed, to name the op that set the peak.
The admitted transient is the largest executed one plus the chord certificate's slack plus the
meter's allocator slack (the same tensors read up to that much apart from one step to the next:
the caching allocator's block reuse depends on history, not on the step; adapter/meters.py).

A start that finds the sweep cached replays it instead (`replay`): the stock step and the cached
worst shape, one step each, on the same provisional KV cache (the worst shape on the cut decoder,
against its own cut-down reading, where cache_trust.replays_on_cut allows).

Cut-down sweep (`run_cut_down`): a step's transient peak is set inside one decoder layer at a
time plus the model's ends, and layers of one kind are alike, so the whole plan can run on a
decoder cut down to one layer of each kind (the driver's `cut_down()`), its cost no longer growing
with depth. The few worst shapes are then measured again on the full model; the admitted
transient always comes from full-model measurements: the largest confirmed peak, and the
cut-down figures raised by the largest full-minus-cut difference the confirmations saw.
"""

from __future__ import annotations

import dataclasses
import time
from contextlib import AbstractContextManager
from typing import Callable, Iterable, NamedTuple, Protocol, Sequence

from . import shapes as plan
from .cache_trust import reuse_transient
from .coverage import cover_rows
from .sweep_depth import depth_difference, judge_cut_down, judge_self_check, shape_class
from .shapes import Limits
from .types import CutDownProof, ProvisionalKV, Shape, StepResult, SweepResult


class StepDriver(Protocol):
    """Runs synthetic steps inside the engine and measures them (adapter/runner.py)."""

    limits: Limits

    def measure_stock(self) -> StepResult:
        """vLLM's own profile step, measured: transient and workspace, agreed across ranks."""
        ...

    def measure(self, shape: Shape, attribute: bool = False) -> StepResult:
        """One synthetic step on the provisional KV cache, measured like the stock step;
        attribute=True also names the module during which the peak was reached."""
        ...

    def provisional_kv(self) -> AbstractContextManager[ProvisionalKV]: ...

    def cannot_build(self, shape: Shape) -> str | None:
        """Why this runner cannot build `shape` as a synthetic step (None: it can). Optional:
        a driver without it builds every shape. Asked outside provisional_kv() too (a restart
        deciding whether to take its entry's fitted pool, adapter/pool_fit._entry_pool), so it
        reads the configuration and limits, not what a step has set up; a shape it refuses is
        skipped there as the start's own pool fit would skip it."""
        ...

    def cut_down(self, prefix: bool = False) -> AbstractContextManager[str]:
        """Run the decoder on the first layer of each kind for the duration (`prefix`: on the
        shortest prefix holding every kind, sweep_depth.proven_cut's "prefix"); yields a description
        (e.g. "2 of 32 layers"). Raises ValueError naming why when the model cannot be cut."""
        ...

    def eager_full(self) -> AbstractContextManager[bool]:
        """Optional: run the full model with its compiled forward bypassed, as the cut steps
        run, for the duration; yields whether the forward is compiled (False: nothing changes).
        A cut-down sweep of a compiled forward reads its full-model steps this way too, so the
        depth difference compares like with like (sweep_depth.depth_difference)."""
        ...

    def graph_ranges(self) -> tuple[tuple[int, int], ...] | None:
        """Optional: the row ranges the compiled forward has a graph of its own for, each
        (first, last) inclusive, in the order the engine picks them (a single size before the
        range holding it); () where nothing is compiled, None where they cannot be read."""
        ...


StepCallback = Callable[[StepResult], None]


def cannot_build(driver: StepDriver, shape: Shape) -> str | None:
    """Why `driver` cannot build `shape` (None: it can, or the driver does not say: cannot_build
    is optional in the protocol)."""
    ask = getattr(driver, "cannot_build", None)
    return ask(shape) if ask is not None else None


def split_buildable(driver: StepDriver, shapes: Iterable[Shape]
                    ) -> tuple[list[Shape], tuple[tuple[Shape, str], ...]]:
    """(the shapes `driver` can build, in order; the others, each with why it cannot)."""
    shapes = list(shapes)
    skipped = tuple((s, why) for s in shapes if (why := cannot_build(driver, s)) is not None)
    return [s for s in shapes if s not in dict(skipped)], skipped


STOCK_READINGS = {"cpu": 3}
"""How many times the stock step is measured, by meter kind (default 1). On the CPU one RSS
reading of it can carry one-time allocations: the bundled tiny model's stock step read
1.16-1.65 MiB, and 3.84 MiB once, against a worst step of 4.40 MiB, which flipped its verdict
from STOCK UNSAFE to SAFE. The lowest reading is stock's steady need (what the verdict compares
with); the highest still counts for the admitted transient, so nothing is admitted below a
reading."""


def stock_readings(driver) -> int:
    meter = getattr(driver, "meter", None)
    return STOCK_READINGS.get(getattr(meter, "device_kind", ""), 1)


def measure_stock_steady(driver: StepDriver, readings: int = 1) -> tuple[StepResult, StepResult]:
    """(lowest, highest) of `readings` measurements of the stock step, by need."""
    found = [driver.measure_stock() for _ in range(max(1, readings))]
    key = lambda r: (r.need_bytes, r.peak_bytes)  # noqa: E731
    return min(found, key=key), max(found, key=key)


def run_sweep(driver: StepDriver, *, tolerance: int, exhaustive: bool = False,
              context_ladder: bool = True, attribute_ops: bool = True,
              on_step: StepCallback | None = None, allocator_slack: int = 0,
              stock_readings: int = 1) -> SweepResult:
    """Every step the scheduler can form, at its longest KV extent (see the module docstring).
    Returns the admitted transient `peak_bytes`: the largest measured transient (stock step
    included: vLLM runs it, unless it never runs beside the KV cache: `stock_excluded` says
    why) plus the chord certificate's slack plus `allocator_slack` (the
    meter's: how far the same step can read apart under another allocator history).
    `stock_readings`: measure the stock step that many times (STOCK_READINGS); `stock` is the
    lowest reading, the highest counts for the worst step and the admitted transient."""
    t_start = time.perf_counter()
    limits = driver.limits
    log: list[StepResult] = []

    def step(shape: Shape, attribute: bool = False) -> StepResult:
        result = driver.measure(shape, attribute)
        log.append(result)
        if on_step:
            on_step(result)
        return result

    stock, stock_high = measure_stock_steady(driver, stock_readings)
    hi = limits.max_num_batched_tokens
    with driver.provisional_kv() as provisional:
        by_rows: dict[int, StepResult] = {}

        def measure_rows(rows: int) -> int:
            # The certificate runs on what a step needs (transient + workspace it asks for): a
            # tile-rounded scratch request is exactly the kind of step function it must catch.
            by_rows[rows] = step(plan.prefill_chunk(limits, rows))
            return by_rows[rows].need_bytes

        seeds = [1 << k for k in range(hi.bit_length()) if (1 << k) <= hi]
        rows_cov = cover_rows(measure_rows, 1, hi, tolerance=tolerance, exhaustive=exhaustive,
                              seeds=seeds)
        skipped: list[tuple[Shape, str]] = []
        for extra in plan.extra_steps(limits, rows_cov.worst_rows):
            why = cannot_build(driver, extra)
            if why is None:
                step(extra)
            else:
                skipped.append((extra, why))

        curve: list[StepResult] = []
        if context_ladder:
            wr = rows_cov.worst_rows
            for ctx in plan.context_ladder(limits, wr):
                shape = plan.prefill_chunk(limits, wr).with_context(ctx)
                curve.append(by_rows[wr] if shape == by_rows[wr].shape else step(shape))

        # The stock step is a step vLLM itself runs: the worst case is never below it, unless
        # it never runs beside the KV cache (plan.stock_excluded_why).
        # Its stand-in must have run: a fresh prefill batch the driver could not build keeps it.
        excluded = plan.stock_excluded_why(limits)
        if excluded and any(s == plan.fresh_prefill_batch(limits) for s, _ in skipped):
            excluded = None
        stock_counts = () if excluded else (stock, stock_high)
        worst = max([*log, *stock_counts[1:]], key=lambda r: (r.need_bytes, r.peak_bytes))
        worst_op = None
        if attribute_ops and worst.shape.kind != "stock":
            worst_op = step(worst.shape, attribute=True).top_op
    # A chord-certified rows value may need up to the certificate's slack more than the
    # largest executed need; added to the admitted transient (conservative: it may be workspace).
    chord_slack = max(0, rows_cov.bound - rows_cov.worst_peak)
    return SweepResult(
        stock=stock, steps=tuple(log), worst=worst, worst_op=worst_op,
        peak_bytes=max(r.peak_bytes for r in [*log, *stock_counts]) + chord_slack
        + max(0, allocator_slack),
        coverage=rows_cov, context_curve=tuple(curve), rows_max=hi,
        post_profile_bytes=provisional.post_profile_bytes,
        seconds=time.perf_counter() - t_start, skipped=tuple(skipped), stock_excluded=excluded)


def largest_peaks(steps: Iterable[StepResult]) -> dict[Shape, int]:
    """Shape -> the largest peak any of `steps` measured for it."""
    out: dict[Shape, int] = {}
    for r in steps:
        out[r.shape] = max(out.get(r.shape, 0), r.peak_bytes)
    return out


CONFIRM = 1
"""Shapes re-measured on the full model after a cut-down sweep before the bounds decide: the
worst by need (it names the op that set the peak)."""

CONFIRM_MORE = 8
"""At most this many more full-model confirmations, each of the shape whose cut-down figure
plus the largest full-minus-cut difference seen is still above every confirmed full figure."""


def run_cut_down(driver: StepDriver, *, tolerance: int, exhaustive: bool = False,
                 context_ladder: bool = True, attribute_ops: bool = True,
                 on_step: StepCallback | None = None, allocator_slack: int = 0,
                 prefix: bool = True) -> tuple[SweepResult, str]:
    """The sweep on the cut-down decoder (the stock step too), then the stock step and the
    CONFIRM worst shapes on the full model. Returns the sweep as admitted and a description of
    what ran. `prefix`: the driver's cut_down(prefix), the cut the family's proof ran
    (sweep_depth.proven_cut): this mode checks nothing itself and rests on that proof.

    The admitted transient: every confirmed shape at its full-model figure; every other shape at
    its cut-down figure plus the largest full-minus-cut difference measured (the stock step's
    included: vLLM's own profile shape, run both ways for a fraction of a second). That is the
    cut-down mode's assumption, proven per family (sweep_depth.CUT_DOWN_PROVEN, sweep_depth=prove).
    While such a bound is above every confirmed figure, that shape is confirmed too (up to
    CONFIRM_MORE), so the admitted figure is a measured full-model step wherever the bounds
    allow it, not a confirmed shape raised by another shape's larger difference (tens of MiB on
    an 8B layout: docs/sweep.md). Shapes far below the worst are not confirmed one by one: the
    decode and mixed steps at full context cost seconds each on a deep model (6.3 of 11.8 s on the 8B layout)."""
    cd = _cut_down(driver, tolerance=tolerance, exhaustive=exhaustive,
                   context_ladder=context_ladder, attribute_ops=attribute_ops,
                   on_step=on_step, allocator_slack=allocator_slack, prefix=prefix)
    return cd.result, _cut_down_line(cd)


def _cut_down_line(cd: "_CutDown") -> str:
    how = ("; the full model read eagerly as well: depth plus what compiling added, each from 0"
           if cd.eager_figures else "")
    return (f"cut-down: every shape on {cd.depth}, the stock step and {cd.result.confirmed} "
            f"worst confirmed on the full model (full minus cut-down peak: "
            f"+{cd.result.depth_delta} B at most{how})")


SAMPLE_CLASSES = ("prefill", "decode", "verify", "mixed")
"""The shape classes the self-check samples (sweep_depth.shape_class): each one that no
confirmation covered gets one full-model measurement, its heaviest member on the cut decoder."""


def graph_of(rows: int, graphs: Sequence[tuple[int, int]]) -> int:
    """The index in `graphs` (StepDriver.graph_ranges) of the graph a step of `rows` runs: the
    first range holding it; -1 where none does."""
    return next((i for i, (lo, hi) in enumerate(graphs) if lo <= rows <= hi), -1)


def class_samples(cut_steps: Iterable[StepResult], confirmed: Iterable[Shape],
                  graphs: Sequence[tuple[int, int]] | None = None) -> list[Shape]:
    """The self-check's full-model samples, in SAMPLE_CLASSES order. Eager (`graphs` None): one
    shape per class that none of `confirmed` belongs to, its member with the largest cut-down
    need (then peak). Compiled (`graphs`: StepDriver.graph_ranges, () where they are one graph
    or unknown): per class and graph, the heaviest member where no confirmation runs that
    graph for that class, and its narrowest and widest members (fewest and most rows, each
    then the largest need) where they are not already measured: what compiling adds is read on
    each graph vLLM compiles by size that the sweep's steps run, at both ends of the token
    counts each class runs there (the compiled pieces see token-shaped tensors only; attention
    runs eagerly between them), so a graph specialised to some sizes shows, and so does an
    addition that grows with the rows."""
    confirmed = list(confirmed)
    compiled = graphs is not None

    def group(sh: Shape) -> tuple[str, int]:
        return shape_class(sh), graph_of(sh.rows, graphs) if graphs else 0

    covered = {group(sh) for sh in confirmed}
    heavy: dict[tuple[str, int], StepResult] = {}
    narrow: dict[tuple[str, int], StepResult] = {}
    wide: dict[tuple[str, int], StepResult] = {}
    for r in cut_steps:
        g = group(r.shape)
        if g[0] not in SAMPLE_CLASSES:
            continue
        if g not in covered and (g not in heavy or (r.need_bytes, r.peak_bytes) > (
                heavy[g].need_bytes, heavy[g].peak_bytes)):
            heavy[g] = r
        if compiled:
            if g not in narrow or (r.shape.rows, -r.need_bytes) < (narrow[g].shape.rows,
                                                                   -narrow[g].need_bytes):
                narrow[g] = r
            if g not in wide or (r.shape.rows, r.need_bytes) > (wide[g].shape.rows,
                                                                wide[g].need_bytes):
                wide[g] = r
    out: list[Shape] = []
    for g in sorted({*heavy, *narrow}, key=lambda g: (SAMPLE_CLASSES.index(g[0]), g[1])):
        for pick in (heavy.get(g), narrow.get(g), wide.get(g)):
            if pick is not None and pick.shape not in out and pick.shape not in confirmed:
                out.append(pick.shape)
    return out


def run_self_checked(driver: StepDriver, *, resolution: int, tolerance: int,
                     exhaustive: bool = False, context_ladder: bool = True,
                     attribute_ops: bool = True, on_step: StepCallback | None = None,
                     allocator_slack: int = 0, stock_readings: int = 1
                     ) -> tuple[SweepResult, str, CutDownProof]:
    """sweep_depth=self-check (auto's on CUDA): the cut-down sweep (run_cut_down's), plus one
    full-model sample of every shape class no confirmation covered (class_samples), judged by
    sweep_depth.judge_self_check against the cut-down assumption at `resolution` (the meter's
    resolution or allocator slack, whichever is larger); a class whose sample cannot be built
    refutes it (the class would go unchecked). Proven: the cut-down sweep is admitted, the
    samples among its confirmations (their full figures exact, their differences in
    depth_delta). Refuted: the full sweep runs (run_sweep's, `stock_readings` as there) and is
    admitted, never below a full-model step the self-check read, and the proof says why
    (fell_back). The stock step is read `stock_readings` times on each model. A model that
    cannot be cut raises ValueError before anything ran."""
    cd = _cut_down(driver, tolerance=tolerance, exhaustive=exhaustive,
                   context_ladder=context_ladder, attribute_ops=attribute_ops, on_step=on_step,
                   allocator_slack=allocator_slack, sample=True, stock_readings=stock_readings)
    proof = judge_self_check(cd.result, cd.cut_figures, cd.samples, depth=cd.depth,
                             resolution=resolution, base_delta=cd.base_delta,
                             seconds=cd.result.seconds, unsampled_admitted=cd.base_peak,
                             eager_figures=cd.eager_figures)
    proof = dataclasses.replace(proof, seconds_split=cd.seconds_split)
    if cd.unbuilt:  # a class left unsampled: the argument needs every class measured
        why = ", ".join(sh.label() for sh in cd.unbuilt)
        proof = dataclasses.replace(proof, verdict=f"no full-model sample could be built for "
                                                   f"{why}, so its class is unchecked")
    line = (_cut_down_line(cd) + f"; {len(cd.samples)} class sample(s) on the full model"
            + cd.graphs_note)
    if proof.proven:
        return cd.result, line + ": self-check proven", proof
    full = run_sweep(driver, tolerance=tolerance, exhaustive=exhaustive,
                     context_ladder=context_ladder, attribute_ops=attribute_ops, on_step=on_step,
                     allocator_slack=allocator_slack, stock_readings=stock_readings)
    # Nothing is admitted below a reading: the full-model steps the self-check measured (the
    # sample that refuted it among them) count beside the full sweep's own.
    measured = max((r.peak_bytes for r in cd.full_readings), default=0) + max(0, allocator_slack)
    if measured > full.peak_bytes:
        full = dataclasses.replace(full, peak_bytes=measured)
    proof = dataclasses.replace(
        proof, fell_back=True, full_worst=full.worst.shape, full_peak_bytes=full.worst.peak_bytes,
        full_admitted_bytes=full.peak_bytes, full_seconds=round(full.seconds, 3),
        seconds_split={**proof.seconds_split, "full_sweep": round(full.seconds, 3)})
    return full, (f"full: the cut-down sweep's self-check failed ({proof.verdict}), so the "
                  f"full sweep ran and is admitted"), proof


class _CutDown(NamedTuple):
    result: SweepResult
    depth: str
    cut_stock: StepResult
    """The stock step as measured on the cut decoder."""
    cut_figures: dict[Shape, int]
    """Each shape's cut-down peak (the stock step's included)."""
    samples: tuple[StepResult, ...] = ()
    """The self-check's class samples, measured on the full model (among result's confirmations)."""
    base_delta: int = 0
    """The largest full-minus-cut difference before the samples."""
    base_peak: int = 0
    """The admitted transient before the samples (what run_cut_down admits)."""
    unbuilt: tuple[Shape, ...] = ()
    """Class samples the driver could not build (their classes unchecked)."""
    full_readings: tuple[StepResult, ...] = ()
    """Every full-model reading: the stock step's (each of them), confirmations, samples."""
    eager_figures: dict[Shape, int] = {}
    """A compiled forward: each full-model shape read eagerly as well (empty where eager)."""
    seconds_split: dict[str, float] = {}
    """Where the sweep's wall time went (CutDownProof.seconds_split)."""
    graphs_note: str = ""
    """A compiled forward's samples: which of vLLM's graphs by size they read ("" where eager
    or unsampled)."""


def _cut_down(driver: StepDriver, *, tolerance: int, exhaustive: bool, context_ladder: bool,
              attribute_ops: bool, on_step: StepCallback | None, allocator_slack: int,
              sample: bool = False, stock_readings: int = 1, prefix: bool = False) -> _CutDown:
    """run_cut_down's sweep, what the cut kept, the cut decoder's figures; with `sample`, the
    self-check's class samples measured on the full model after the confirmations (they count
    as confirmations in the admitted figure). The stock step is read `stock_readings` times on
    each model: the lowest readings give the full-minus-cut difference (like with like), the
    highest full-model one counts for the worst step and the admitted figure. `prefix`: the
    driver's cut_down(prefix)."""
    t_start = time.perf_counter()
    with driver.cut_down(prefix) as depth:
        cut = run_sweep(driver, tolerance=tolerance, exhaustive=exhaustive,
                        context_ladder=context_ladder, attribute_ops=False, on_step=on_step,
                        stock_readings=stock_readings)
    cut_seconds = time.perf_counter() - t_start
    eager_seconds = 0.0  # the eager re-reads' wall time, summed
    stock, stock_high = measure_stock_steady(driver, stock_readings)  # the full model's
    # A compiled forward: its cut steps ran eagerly, so every full-model step is read eagerly
    # as well, and its difference is depth (full eager minus cut) plus what compiling added
    # (full compiled minus full eager), each from 0 (sweep_depth.depth_difference).
    eager_of: dict[Shape, int] = {}
    compiled = False
    if getattr(driver, "eager_full", None) is not None:
        t0 = time.perf_counter()
        with driver.eager_full() as compiled:
            if compiled:  # the stock step, like with like: its lowest reading
                eager_stock = measure_stock_steady(driver, stock_readings)[0]
                eager_of[eager_stock.shape] = eager_stock.peak_bytes
        if compiled:
            eager_seconds += time.perf_counter() - t0
    ranked = sorted(cut.steps, key=lambda r: (-r.need_bytes, -r.peak_bytes))
    chosen: list[StepResult] = []
    for r in ranked:
        if len(chosen) < CONFIRM and r.shape not in {c.shape for c in chosen}:
            chosen.append(r)
    cut_peak = largest_peaks((*cut.steps, cut.stock))  # a shape's cut-down figure
    confirmed: list[StepResult] = [stock]

    def delta() -> int:
        return max(0, max(depth_difference(f.peak_bytes, cut_peak[f.shape],
                                           eager_of.get(f.shape)) for f in confirmed))

    def bounds() -> dict:
        exact, d = {f.shape for f in confirmed}, delta()
        return {shape: p + d for shape, p in cut_peak.items()
                if shape not in exact and not (excluded and shape.kind == "stock")}

    excluded = cut.stock_excluded  # the same limits on both models

    def counted(results) -> list[StepResult]:  # the readings the admitted figure holds
        return [r for r in results if not (excluded and r.shape.kind == "stock")]

    def top() -> int:
        return max((f.peak_bytes for f in counted([stock_high, *confirmed])), default=0)

    def confirm(shape: Shape, attribute: bool = False) -> StepResult:
        """`shape` measured on the full model (and, compiled, eagerly too), counted confirmed."""
        nonlocal eager_seconds
        full = driver.measure(shape, attribute=attribute)
        if compiled:
            t0 = time.perf_counter()
            with driver.eager_full():
                eager_of[shape] = max(eager_of.get(shape, 0), driver.measure(shape).peak_bytes)
            eager_seconds += time.perf_counter() - t0
        confirmed.append(full)
        if on_step:
            on_step(full)
        return full

    more = 0
    with driver.provisional_kv():
        for c in chosen:
            confirm(c.shape, attribute=attribute_ops and c is chosen[0])
        while more < CONFIRM_MORE:
            above = {shape: b for shape, b in bounds().items() if b > top()}
            if not above:
                break
            confirm(max(above, key=lambda sh: (above[sh], cut_peak[sh])))
            more += 1
        chord_slack = max(0, cut.coverage.bound - cut.coverage.worst_peak)

        def admitted() -> int:
            # A rows value the chord certified never ran, on either model: on the full model it
            # is bounded by its segment's cut-down bound plus the difference, not by a confirmed
            # neighbour's own full-model figure.
            return max([top() + chord_slack, *(b + chord_slack for b in bounds().values()),
                        _certified_bound(cut, driver.limits) + delta()]) + max(0, allocator_slack)

        # what the cut-down sweep admits before any sample (run_cut_down's figure)
        base_delta, base_peak = delta(), admitted()
        samples: list[StepResult] = []
        unbuilt: list[Shape] = []
        graphs_note = ""
        if sample:
            # eager: a class's heaviest member; compiled: per graph, both ends too
            ask = getattr(driver, "graph_ranges", None) if compiled else None
            read = ask() if ask is not None else None
            picks = class_samples(cut.steps, (f.shape for f in confirmed),
                                  (read or ()) if compiled else None)
            if compiled:
                graphs_note = _graphs_note(read, [f.shape for f in confirmed[1:]], picks)
            for shape in picks:
                if cannot_build(driver, shape) is not None:
                    unbuilt.append(shape)
                    continue
                samples.append(confirm(shape))
    peak_delta, peak = delta(), admitted()
    worst = max(counted([*confirmed, stock_high]), key=lambda r: (r.need_bytes, r.peak_bytes))
    worst_op = next((f.top_op for f in confirmed if f.shape == worst.shape and f.top_op), None)
    # The context curve says where stock runs out: full-model figures, the confirmed reading
    # where the point was confirmed (as the admitted figure counts it), else raised.
    on_full = largest_peaks(confirmed[1:])
    curve = tuple(dataclasses.replace(r, peak_bytes=on_full.get(r.shape,
                                                                r.peak_bytes + peak_delta))
                  for r in cut.context_curve)
    result = dataclasses.replace(
        cut, stock=stock, steps=tuple([*cut.steps, *confirmed[1:]]), worst=worst,
        worst_op=worst_op, peak_bytes=peak, context_curve=curve, depth_delta=peak_delta,
        confirmed=len(confirmed) - 1, seconds=time.perf_counter() - t_start)
    split = {"cut_decoder": round(cut_seconds, 3),
             "full_model": round(result.seconds - cut_seconds - eager_seconds, 3)}
    if compiled:
        split["eager_rereads"] = round(eager_seconds, 3)
    return _CutDown(result, depth, cut.stock, cut_peak, tuple(samples), base_delta, base_peak,
                    tuple(unbuilt), (stock_high, *confirmed), eager_of, split, graphs_note)


def _graphs_note(graphs: tuple[tuple[int, int], ...] | None, confirmed: list[Shape],
                 samples: list[Shape]) -> str:
    """The mode line's word on a compiled forward's graphs by size: how many of them the
    full-model readings ran, or that they could not be read (every class sampled as one)."""
    if graphs is None:
        return ("; vLLM's graphs by batch size could not be read, so what compiling adds was "
                "sampled as if one graph served every size")
    ran = {graph_of(sh.rows, graphs) for sh in (*confirmed, *samples)} - {-1}
    return (f"; what compiling adds read at both ends of every class in {len(ran)} of the "
            f"{max(1, len(graphs))} graph(s) vLLM compiles by batch size (those the sweep's "
            f"steps run)")


def _certified_bound(sweep: SweepResult, limits: Limits) -> int:
    """The largest transient the chord certificate allows a rows value it did not run: its
    segment's larger end plus the tolerance, in peak units (the workspace a step leaves is held
    memory, not transient); 0 where nothing was certified."""
    cov, peaks = sweep.coverage, largest_peaks(sweep.steps)

    def end(rows: int) -> int:
        return peaks.get(plan.prefill_chunk(limits, rows), 0)

    return max((max(end(seg.lo), end(seg.hi)) + cov.tolerance for seg in cov.segments
                if seg.how == "chord" and seg.hi - seg.lo > 1), default=0)


def prove_cut_down(driver: StepDriver, *, resolution: int, **kw
                   ) -> tuple[SweepResult, CutDownProof]:
    """The cut-down sweep, then the full sweep on the same engine (kw: run_sweep's). Returns the
    full sweep, which is the one admitted, and the comparison (sweep_depth.judge_cut_down decides
    whether the cut-down one would have admitted the same; `resolution`: how far two
    measurements of one step may read apart, the meter's resolution or allocator slack)."""
    # The cut-down one first: a model that cannot be cut raises (ValueError) before the full
    # sweep has run, and the caller sweeps it whole once.
    cd = _cut_down(driver, **{"exhaustive": False, "context_ladder": True, "on_step": None,
                              "allocator_slack": 0, **kw, "attribute_ops": False})
    cut, depth, cut_stock = cd.result, cd.depth, cd.cut_stock
    full = run_sweep(driver, **kw)
    first: dict[Shape, StepResult] = {}
    for r in (cut_stock, *cut.cut_steps):  # a shape's first cut-down figure
        first.setdefault(r.shape, r)
    on_full = largest_peaks((*full.steps, full.stock))
    deltas: dict[str, int] = {}
    for shape, r in first.items():
        if shape in on_full:
            d = on_full[shape] - r.peak_bytes
            deltas[shape.kind] = max(deltas.get(shape.kind, d), d)
    return full, judge_cut_down(full, cut, depth=depth, resolution=resolution,
                                deltas=dict(sorted(deltas.items())))


@dataclasses.dataclass(frozen=True)
class Replay:
    """A cached sweep's check: the stock step and the cached worst shape, measured now, and the
    plan's heaviest shapes of each kind, which the cached worst must still dominate."""

    stock: StepResult
    step: StepResult
    provisional: ProvisionalKV
    seconds: float
    others: tuple[StepResult, ...] = ()
    cut_depth: str | None = None
    """What the cut decoder kept where `step` ran there (replay(cut=True)), e.g. "1 of 64
    layers"; None: on the full model."""


def dominance_checks(limits: Limits, worst: Shape) -> tuple[Shape, ...]:
    """The shapes a cached worst step is checked against on reuse: the full chunk at full
    extent, the widest split of it, the decode batch (the largest of their kinds in the plan), the
    mixed pair (a full chunk with a decode beside it) and,
    where the stock step is left out, the fresh prefill batch that stands in for it.
    An entry whose worst shape was swapped for a small one, with a need to match, fails here."""
    hi = limits.max_num_batched_tokens
    splits = plan.split_prefills(limits, hi)
    found = [plan.prefill_chunk(limits, hi), *(splits[-1:]), plan.decode_batch(limits),
             plan.mixed_pair(limits), plan.fresh_prefill_batch(limits)]
    return tuple(s for s in dict.fromkeys(found) if s is not None and s != worst)


def replay(driver: StepDriver, worst_shape: Shape, checks: tuple[Shape, ...] = (),
           stock_readings: int = 1, cut: bool = False) -> Replay:
    """Measure the stock step on the full model (`stock_readings` times: its lowest reading, as
    run_sweep), then the cached worst shape and `checks` once each on a provisional KV cache.
    `cut` (cache_trust.replays_on_cut): the worst shape runs on the decoder cut as the
    self-check cut it (the driver's cut_down()), in the sweep's order there: the cut stock step
    first, unread (the cut's first step pays its one-time allocations: on a CPU engine a
    compiled model's first eager call read 31 MiB where the same shape read 780 KiB warm),
    then the worst shape on a provisional KV cache, compared with its own cut-down reading
    (replayed_against); no `checks` then."""
    if cut and (checks or worst_shape.kind == "stock"):
        raise ValueError("a cut replay runs the worst shape alone, and never the stock step")
    t0 = time.perf_counter()
    stock, stock_high = measure_stock_steady(driver, stock_readings)
    if cut:
        with driver.cut_down() as depth:
            driver.measure_stock()  # as the cut-down sweep ran it first, before its shapes
            with driver.provisional_kv() as provisional:
                step = driver.measure(worst_shape)
        return Replay(stock=stock, step=step, provisional=provisional,
                      seconds=time.perf_counter() - t0, cut_depth=depth)
    with driver.provisional_kv() as provisional:
        step = stock_high if worst_shape.kind == "stock" else driver.measure(worst_shape)
        others = tuple(driver.measure(s) for s in checks if cannot_build(driver, s) is None)
    return Replay(stock=stock, step=step, provisional=provisional,
                  seconds=time.perf_counter() - t0, others=others)


def cut_reading(sweep: SweepResult, shape: Shape) -> StepResult | None:
    """A cut-down sweep's reading of `shape` on the cut decoder (its largest need where the
    shape ran there more than once); None after a full sweep or for a shape it never ran
    there."""
    if not _cut_down_sweep(sweep):
        return None
    found = [r for r in sweep.cut_steps if r.shape == shape]
    return max(found, key=lambda r: (r.need_bytes, r.peak_bytes), default=None)


def replayed_against(cached: SweepResult, check: Replay) -> int:
    """The cached need the replayed worst step is judged against (cache_trust.cache_verdict):
    like with like, its own cut-down reading where it ran on the cut decoder, else the cached
    worst step's (a full-model reading)."""
    if check.cut_depth is None:
        return cached.worst.need_bytes
    on_cut = cut_reading(cached, check.step.shape)
    if on_cut is None:
        raise ValueError(f"no cut-down reading of {check.step.shape.label()} to replay against")
    return on_cut.need_bytes


def admitted_figures(sweep: SweepResult) -> dict[Shape, int]:
    """Shape -> the figure the sweep's admitted transient counts it at: its largest full-model
    peak where it ran on the full model (every step of a full sweep; a cut-down sweep's
    confirmations and its stock step), else its cut-down peak plus depth_delta."""
    if _cut_down_sweep(sweep):
        cut = sweep.cut_steps
        out = {sh: p + sweep.depth_delta for sh, p in largest_peaks(cut).items()}
        out.update(largest_peaks((*sweep.steps[len(cut):], sweep.stock, *_stock_worst(sweep))))
        return out
    return largest_peaks((*sweep.steps, sweep.stock, *_stock_worst(sweep)))


def full_model_steps(sweep: SweepResult) -> tuple[StepResult, ...]:
    """The sweep's readings on the full model: every step of a full sweep, a cut-down sweep's
    confirmations; its stock step (and the worst, where that is the stock step's highest
    reading) either way."""
    ran = sweep.steps[len(sweep.cut_steps):] if _cut_down_sweep(sweep) else sweep.steps
    return (*ran, sweep.stock, *_stock_worst(sweep))


def _cut_down_sweep(sweep: SweepResult) -> bool:
    """Whether `sweep` ran cut down (its figures then cut-down peaks plus depth_delta, but for
    its confirmations)."""
    return bool(sweep.depth_delta or sweep.confirmed)


def certified_bound(sweep: SweepResult, limits: Limits) -> int:
    """What the admitted transient holds for rows values the chord certificate never ran: a
    cut-down sweep's certified bound (on its cut steps) plus depth_delta; 0 after a full sweep,
    whose chord slack covers them."""
    if not _cut_down_sweep(sweep):
        return 0
    return _certified_bound(dataclasses.replace(sweep, steps=sweep.cut_steps, confirmed=0),
                            limits) + sweep.depth_delta


def _stock_worst(sweep: SweepResult) -> tuple[StepResult, ...]:
    """The sweep's worst step when it is the stock step (its highest reading), else nothing."""
    return (sweep.worst,) if sweep.worst.shape.kind == "stock" else ()


def reused(cached: SweepResult, check: Replay, resolution: int,
           allocator_slack: int = 0) -> SweepResult:
    """A cached sweep, admitted after its replay: the transient is the cached one while the
    replay is within the meter's resolution of it, else the cached one plus the largest drift
    any replayed step shows against the same shape's cached figure (the cached worst, the shapes
    re-checked for dominance, the stock step; after a cut-down sweep, a shape confirmed on the
    full model counts at that figure, any other at its cut figure plus depth_delta; a worst
    step replayed on the cut decoder, against its own cut-down reading); a re-checked shape
    the cached sweep never ran (the full chunk's widest split, say, where the worst rows were
    smaller) counts at what it measured now plus the meter's `allocator_slack`
    (cache_trust.reuse_transient); the stock step and provisional KV are this start's (the stock
    step drifts nothing where the cached sweep left it out, SweepResult.stock_excluded, except
    beside a cut replay: there it is the one full-model reading, and its drift always counts).
    A stock step read several times (stock_readings) is compared like with like: the cached
    worst, when it is the stock step, is its highest reading, as the replay's step is. The
    post-profile buffers stay the cached figure while the replay's reading is within the
    meter's resolution above it (below it: the cached, larger figure stands)."""
    before = admitted_figures(cached)

    def bound(r: StepResult) -> int:
        if r.shape in before:
            return cached.peak_bytes + max(0, r.peak_bytes - before[r.shape])
        return r.peak_bytes + max(0, allocator_slack)

    def drifted(r: StepResult) -> int:  # the worst step, replayed on the cut decoder
        return cached.peak_bytes + max(0, r.peak_bytes - cut_reading(cached, r.shape).peak_bytes)

    # the stock step drifts the figure only where it counts (SweepResult.stock_excluded), and
    # always beside a cut replay: it is the one full-model reading a cut replay takes
    stock = () if cached.stock_excluded and check.cut_depth is None else (check.stock,)
    replayed = max([drifted(check.step) if check.cut_depth is not None else bound(check.step),
                    *(bound(r) for r in (*check.others, *stock))])
    peak = reuse_transient(cached.peak_bytes, replayed, resolution)
    # what vLLM allocates after its profile, as the cached sweep read it while the replay reads
    # no more than the meter's resolution above it (reuse_consumed's rule for the held memory:
    # the same configuration gets the same admission; RSS read 4 KiB apart flipped a MiB flag)
    post = check.provisional.post_profile_bytes
    if post <= cached.post_profile_bytes + resolution:
        post = cached.post_profile_bytes
    return dataclasses.replace(cached, stock=check.stock, peak_bytes=peak, post_profile_bytes=post)
