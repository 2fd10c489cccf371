"""The chunk advisor: for candidate max_num_batched_tokens values C, what an engine started with C
needs at its worst, the KV it would admit, and the prefill throughput it keeps at long context;
and the knee between KV tokens and prefill tokens per second.

Pure: no vLLM, no torch. The sweep (core/sweep.py) already covered every prefill chunk
1..max_num_batched_tokens at full KV extent, executed or certified by chord: the rows part of C's
worst case is that coverage restricted to rows <= C (its executed needs and its segments' bounds,
a chord straddling C bounded by its value at C). What C forms beyond the rows — its own stock
step, the worst rows value <= C split over 2, 4, ... requests, the decode batches and the mixed
step its limits allow, the worst rows value at growing context — is taken from the sweep where
the sweep ran that very shape, and otherwise measured by the adapter (adapter/advice.py,
`missing_shapes` says which): a step that could make C's worst case larger is never skipped.

The admission of C is core/admission.compute_admission with C's transient and the workspace C's
steps ask for (every slot grown to the largest of them), the rest of the held memory unchanged:
what does not scale with the chunk (weights, KV-independent buffers) is what the configured start
measured. The configured chunk's row is the admission this start actually made.

After a cut-down sweep (core/sweep.run_cut_down: every shape on a decoder cut to one layer of each
kind, the worst few confirmed on the full model) every figure taken from the sweep is raised by
the largest full-minus-cut difference its confirmations saw, as the sweep's own admission does;
what the advisor runs itself runs on the full model.

The knee (`knee`): among candidates that fit, the one admitting the most KV tokens (the
smallest chunk on a tie) whose prefill throughput is within `within` (default 5%) of the best
candidate's. One timed step per candidate at long context (chunk C on max_model_len - C cached
tokens) measures the throughput.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable

from . import shapes as plan
from .admission import compute_admission
from .coverage import segment_bound
from .shapes import Limits
from .types import (Admission, Advice, AdviceMeasurements, ChunkAdvice, ExcludedChunk,
                    HeldMemory, Shape, StepResult, SweepResult, Workspace)
from ..sizes import fmt_bytes, fmt_tokens

DEFAULT_WITHIN = 0.05
SMALLEST_CANDIDATE = 256

RULE = ("knee: among the candidates that fit, the one admitting the most KV tokens (the smallest "
        "chunk on a tie) whose prefill throughput at long context (chunk C on max_model_len - C "
        "cached tokens, one timed step) is within {within:.0%} of the best candidate's")


def candidate_chunks(configured: int, extra: Iterable[int] = (), *, max_num_seqs: int = 1
                     ) -> tuple[tuple[int, ...], tuple[tuple[int, str], ...]]:
    """(candidates ascending, excluded with the reason): powers of two from 256 up to the
    configured chunk, the configured chunk itself, and the caller's `extra`. A chunk above the
    configured one cannot be measured in this engine (its buffers are sized for the configured
    one, and the sweep covers rows up to it only); one below max_num_seqs is refused by vLLM."""
    if configured < 1:
        raise ValueError(f"configured chunk must be >= 1, got {configured}")
    wanted = {1 << k for k in range(configured.bit_length())
              if SMALLEST_CANDIDATE <= (1 << k) <= configured}
    wanted.add(configured)
    wanted.update(int(c) for c in extra)
    kept, excluded = [], []
    for chunk in sorted(wanted):
        if chunk < 1:
            excluded.append((chunk, "not a positive number of tokens"))
        elif chunk > configured:
            excluded.append((chunk, f"above the configured max_num_batched_tokens={configured}: "
                                    "this engine's buffers and sweep stop there; profile with the "
                                    "larger value to see it"))
        elif chunk < max_num_seqs:
            excluded.append((chunk, f"below max_num_seqs={max_num_seqs}: vLLM refuses "
                                    "max_num_batched_tokens < max_num_seqs"))
        else:
            kept.append(chunk)
    return tuple(kept), tuple(excluded)


def candidate_limits(limits: Limits, chunk: int) -> Limits:
    return dataclasses.replace(limits, max_num_batched_tokens=chunk)


def worst_rows(sweep: SweepResult, chunk: int) -> int:
    """The executed rows value <= chunk of largest need (the smallest on a tie), as a sweep
    with that chunk would find it among the same measurements."""
    table = [(rows, need) for rows, need in sweep.coverage.peak_table if rows <= chunk]
    if not table:
        return min(chunk, sweep.coverage.worst_rows)
    return min(table, key=lambda rn: (-rn[1], rn[0]))[0]


@dataclasses.dataclass(frozen=True)
class CandidatePlan:
    """The steps candidate `chunk` forms beyond the prefill rows coverage, in the order a sweep
    runs them (stock first), and the step its throughput is timed on."""

    chunk: int
    shapes: tuple[Shape, ...]
    timing: Shape


def plan_candidate(limits: Limits, sweep: SweepResult, chunk: int, *,
                   context_ladder: bool = True) -> CandidatePlan:
    lim = candidate_limits(limits, chunk)
    wr = worst_rows(sweep, chunk)
    shapes = [plan.stock_shape(lim), plan.prefill_chunk(lim, chunk), *plan.extra_steps(lim, wr)]
    if context_ladder:
        top = plan.prefill_chunk(lim, wr)
        shapes += [top.with_context(ctx) for ctx in plan.context_ladder(lim, wr)]
    return CandidatePlan(chunk=chunk, shapes=tuple(dict.fromkeys(shapes)),
                         timing=plan.prefill_chunk(lim, chunk))


def known_steps(sweep: SweepResult) -> dict[Shape, list[StepResult]]:
    """Every measurement the sweep holds, by shape (the stock step included)."""
    known: dict[Shape, list[StepResult]] = {}
    for r in (sweep.stock, *sweep.steps, *sweep.context_curve):
        bucket = known.setdefault(r.shape, [])
        if all(r is not k for k in bucket):
            bucket.append(r)
    return known


def missing_shapes(limits: Limits, sweep: SweepResult, chunks: Iterable[int], *,
                   context_ladder: bool = True) -> list[Shape]:
    """The shapes some candidate forms that the sweep never ran, once each, in a fixed order
    (every tensor-parallel rank derives the same list from the same sweep)."""
    known = known_steps(sweep)
    out: dict[Shape, None] = {}
    for chunk in chunks:
        for shape in plan_candidate(limits, sweep, chunk, context_ladder=context_ladder).shapes:
            if shape not in known:
                out.setdefault(shape, None)
    return list(out)


def timing_shape(limits: Limits, chunk: int) -> Shape:
    """One prefill chunk of `chunk` rows on max_model_len - chunk cached tokens."""
    return plan.prefill_chunk(limits, chunk)


def rows_bound(sweep: SweepResult, chunk: int, own: StepResult | None = None) -> tuple[int, int]:
    """(bound, worst executed need) over prefill rows 1..chunk from the sweep's coverage: executed
    segments exactly, chord segments by their certificate, a chord segment straddling `chunk`
    by its chord's value at `chunk` (the peak is affine on it). `own`: the candidate's own
    prefill chunk, measured when the sweep had not executed that rows value."""
    cov = sweep.coverage
    peaks = cov.peaks
    tol = cov.tolerance
    needs = [need for rows, need in cov.peak_table if rows <= chunk]
    if own is not None:
        needs.append(own.need_bytes)
    worst = max(needs, default=0)
    bound = worst
    for seg in cov.segments:
        if seg.lo > chunk:
            continue
        if seg.hi <= chunk:
            bound = max(bound, segment_bound(seg, peaks, tol))
        elif seg.how == "executed":
            bound = max(bound, max(peaks[r] for r in range(seg.lo, chunk + 1) if r in peaks))
        else:
            pa, pb = peaks[seg.lo], peaks[seg.hi]
            at = pa + -(-(pb - pa) * (chunk - seg.lo) // (seg.hi - seg.lo))
            inside = [peaks[p] for p in seg.probes if p <= chunk]
            bound = max(bound, max(pa, at) + tol, *inside)
    return bound, worst


def full_extent_rows(limits: Limits, sweep: SweepResult, chunk: int) -> list[StepResult]:
    """The sweep's prefill chunks at full extent with rows <= chunk (the rows coverage)."""
    out = []
    for r in sweep.steps:
        s = r.shape
        if s.kind == "prefill" and s.rows <= chunk and s == plan.prefill_chunk(limits, s.rows):
            out.append(r)
    return out


def _by_shape(steps: Iterable[StepResult]) -> dict[Shape, list[StepResult]]:
    out: dict[Shape, list[StepResult]] = {}
    for r in steps:
        out.setdefault(r.shape, []).append(r)
    return out


def confirmation_delta(sweep: SweepResult) -> int:
    """After a cut-down sweep, how much more the full model needed than the cut-down one: the
    sweep's own figure (the stock step included) or the largest later-minus-first peak over
    shapes it measured more than once, whichever is larger (a cached sweep may predate the
    former)."""
    first: dict[Shape, int] = {}
    delta = 0
    for r in sweep.steps:
        if r.shape in first:
            delta = max(delta, r.peak_bytes - first[r.shape])
        else:
            first[r.shape] = r.peak_bytes
    return max(delta, sweep.depth_delta)


def raiser(sweep: SweepResult, delta: int):
    """Raise a cut-down figure by `delta`: every step that ran on the cut decoder
    (SweepResult.cut_steps; the confirmations and the stock step ran on the full model)."""
    cut = {id(r) for r in sweep.cut_steps}

    def raised(steps: Iterable[StepResult]) -> list[StepResult]:
        return [dataclasses.replace(r, peak_bytes=r.peak_bytes + delta)
                if delta and id(r) in cut else r for r in steps]

    return raised


def advise(limits: Limits, sweep: SweepResult, *, held: HeldMemory, admission: Admission,
           workspace: Workspace, measured: AdviceMeasurements,
           within: float = DEFAULT_WITHIN, context_ladder: bool = True,
           cut_down: bool = False, allocator_slack: int = 0) -> Advice:
    """Every candidate of `measured.chunks` (see the module docstring), and the knee.
    cut_down: the sweep ran cut down (its figures are raised by `confirmation_delta`).
    allocator_slack: the meter's, added to every candidate's transient as the sweep adds it to
    the configured chunk's (core/sweep.run_sweep), so candidates compare like for like.
    Under an explicit --kv-cache-memory-bytes a candidate's kv_tokens and fits are what an engine
    at that chunk admits (compute_admission with the same explicit size: it, where it fits the
    candidate's budget), while budget_bytes stays the room the candidate leaves."""
    if not 0 <= within < 1:
        raise ValueError(f"within must be a fraction in [0, 1), got {within}")
    configured = limits.max_num_batched_tokens
    raised = raiser(sweep, confirmation_delta(sweep) if cut_down else 0)
    known = {shape: raised(found) for shape, found in known_steps(sweep).items()}
    unbuildable = dict(sweep.skipped)
    unbuildable.update(measured.skipped)
    extra = _by_shape(measured.steps)
    timed = dict(zip(measured.chunks, measured.timings))
    everything = [sweep.stock, *sweep.steps, *measured.steps]
    ws_scale = max((r.workspace_bytes for r in everything), default=0)
    rows = []
    for chunk in measured.chunks:
        w = _worst(limits, sweep, chunk, known, extra, unbuildable, raised, ws_scale,
                   workspace.total_bytes, allocator_slack, context_ladder)
        transient, ws, worst, reused, measured_n, left_out = (
            w.transient_bytes, w.workspace_bytes, w.worst, w.reused, w.measured, w.left_out)
        timing = timed.get(chunk)
        if chunk == configured:  # what this start admitted: the reference every delta is against
            row = ChunkAdvice(chunk=chunk, transient_bytes=sweep.peak_bytes,
                              workspace_bytes=workspace.total_bytes, worst_shape=sweep.worst.shape,
                              budget_bytes=admission.budget_bytes,
                              kv_tokens=admission.kv_tokens_worstcase, fits=admission.fits,
                              note="; ".join(left_out) or None)
        else:
            adm = compute_admission(
                requested=held.requested_bytes,
                consumed=held.consumed_bytes - workspace.total_bytes + ws,
                weights=held.weights_bytes, non_torch=held.non_torch_bytes,
                worst_transient=transient, stock_need=sweep.stock.need_bytes,
                stock_kv=admission.stock_kv_cache_bytes, cudagraph=admission.cudagraph_bytes,
                margin=admission.margin_bytes, bytes_per_token=admission.bytes_per_token,
                block_size=limits.block_size, max_model_len=limits.max_model_len,
                one_request=admission.one_request_bytes,
                explicit_kv=admission.explicit_kv_cache_memory_bytes,
                pool_block_bytes=admission.pool_block_bytes)
            row = ChunkAdvice(chunk=chunk, transient_bytes=transient, workspace_bytes=ws,
                              worst_shape=worst.shape, budget_bytes=adm.budget_bytes,
                              kv_tokens=adm.kv_tokens_worstcase,
                              fits=adm.fits and not w.unmeasured,
                              note="; ".join([*unknown_worst(w.unmeasured),
                                              "its stock step ran with attention "
                                              "metadata (an upper estimate of vLLM's own profile "
                                              "step at this chunk)", *left_out]))
        rows.append(dataclasses.replace(
            row, prefill_seconds=timing.seconds if timing is not None else None,
            reused_steps=reused, measured_steps=measured_n))
    return Advice(configured_chunk=configured, candidates=tuple(rows),
                  knee_chunk=knee(rows, within), within=within, rule=RULE.format(within=within),
                  excluded=tuple(ExcludedChunk(c, why) for c, why in measured.excluded),
                  steps=(*measured.steps, *measured.timings), seconds=measured.seconds)


@dataclasses.dataclass(frozen=True)
class ChunkWorst:
    """What an engine started with one chunk needs at its worst (advise's figures per row)."""

    transient_bytes: int
    workspace_bytes: int
    """The workspace that engine holds: the configured start's, scaled by its steps' largest
    request against the largest any step made."""
    worst: StepResult
    reused: int
    measured: int
    left_out: tuple[str, ...]
    unmeasured: tuple[str, ...] = ()
    """The left-out shapes the sweep did not leave out alike (`left_out_as_swept`): without
    them this engine's worst case is not known, so the candidate is not recommended."""


def chunk_worst(limits: Limits, sweep: SweepResult, chunk: int, steps: Iterable[StepResult], *,
                workspace_bytes: int, skipped=(), context_ladder: bool = True,
                cut_down: bool = False, allocator_slack: int = 0) -> ChunkWorst:
    """The worst case of an engine started with `chunk` (advise's row, without its admission):
    `steps` are the measurements beyond the sweep (missing_shapes' and the timing steps)."""
    steps = tuple(steps)
    raised = raiser(sweep, confirmation_delta(sweep) if cut_down else 0)
    known = {shape: raised(found) for shape, found in known_steps(sweep).items()}
    unbuildable = dict(sweep.skipped)
    unbuildable.update(skipped)
    ws_scale = max((r.workspace_bytes for r in [sweep.stock, *sweep.steps, *steps]), default=0)
    return _worst(limits, sweep, chunk, known, _by_shape(steps), unbuildable, raised, ws_scale,
                  workspace_bytes, allocator_slack, context_ladder)


def left_out_as_swept(shape: Shape, sweep: SweepResult) -> bool:
    """Whether a candidate's `shape` that the runner cannot build is left out as the sweep left
    out the configured start's own (a step of the same kind in sweep.skipped: V2's mixed step
    on a hybrid or speculative model), so that the candidate is weighed as that start was
    admitted. Any other unbuildable shape (a candidate's stock step or fresh prefill batch with
    more requests on no context than the V2 provisional pool has state slots for) leaves the
    candidate's worst case unknown: it is not recommended, never weighed without the shape.
    A stock step is never left out alike: the sweep measures its own through measure_stock."""
    return shape.kind != "stock" and any(s.kind == shape.kind for s, _ in sweep.skipped)


def unknown_worst(unmeasured) -> list[str]:
    """The note a candidate carries when steps it forms could not be built (`left_out_as_swept`
    said no): its worst case is unknown, so it is not recommended. Empty otherwise."""
    return [f"NOT RECOMMENDED: its worst case is unknown ({len(unmeasured)} step(s) it forms "
            "could not be built here)"] if unmeasured else []


def _worst(limits, sweep, chunk, known, extra, unbuildable, raised, ws_scale, ws_total,
           allocator_slack, context_ladder) -> ChunkWorst:
    cp = plan_candidate(limits, sweep, chunk, context_ladder=context_ladder)
    reused = measured_n = 0
    found: list[StepResult] = []
    left_out: list[str] = []
    unmeasured: list[str] = []
    for shape in cp.shapes:
        if shape in unbuildable and shape not in known and shape not in extra:
            left_out.append(f"{shape.label()} not run: {unbuildable[shape]}")
            if not left_out_as_swept(shape, sweep):
                unmeasured.append(left_out[-1])
        elif shape in known:
            found += known[shape]
            reused += 1
        elif shape in extra:
            found += extra[shape]
            measured_n += 1
        else:
            raise ValueError(f"candidate {chunk}: {shape.label()} was neither in the sweep "
                             "nor measured (run missing_shapes first)")
    own = None
    if chunk not in sweep.coverage.peaks:
        own = max(extra.get(cp.timing, []) or known.get(cp.timing, []),
                  key=lambda r: r.need_bytes, default=None)
    steps = [*raised(full_extent_rows(limits, sweep, chunk)), *found]
    bound, worst_need = rows_bound(sweep, chunk, own)
    worst = max(steps, key=lambda r: (r.need_bytes, r.peak_bytes))
    transient = max(r.peak_bytes for r in steps) + max(0, bound - worst_need) \
        + max(0, allocator_slack)
    ws_need = max(r.workspace_bytes for r in steps)
    ws = ws_total if not ws_scale else -(-ws_total * ws_need // ws_scale)
    return ChunkWorst(transient_bytes=transient, workspace_bytes=ws, worst=worst,
                      reused=reused, measured=measured_n, left_out=tuple(left_out),
                      unmeasured=tuple(unmeasured))


def knee(rows: Iterable[ChunkAdvice], within: float = DEFAULT_WITHIN) -> int | None:
    """The chunk that admits the most KV tokens (the smallest on a tie) among those that fit and
    keep prefill throughput within `within` of the best; None when none fits or none was
    timed."""
    timed = [r for r in rows if r.fits and r.prefill_tokens_per_s]
    if not timed:
        return None
    best = max(r.prefill_tokens_per_s for r in timed)
    eligible = [r for r in timed if r.prefill_tokens_per_s >= (1 - within) * best]
    return max(eligible, key=lambda r: (r.kv_tokens, -r.chunk)).chunk


def knee_line(result: Advice | None) -> str | None:
    """The advice in one line, the knee against the configured chunk (None without advice or
    without both candidates)."""
    if result is None:
        return None
    knee = result.candidate(result.knee_chunk) if result.knee_chunk is not None else None
    configured = result.candidate(result.configured_chunk)
    if knee is None or configured is None:
        return None
    return (f"advice: knee at max_num_batched_tokens={knee.chunk}: KV "
            f"{fmt_tokens(knee.kv_tokens)} tokens ({knee.kv_tokens - configured.kv_tokens:+d} vs "
            f"{configured.chunk} configured), need {fmt_bytes(knee.need_bytes)}")
