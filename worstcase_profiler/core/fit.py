"""`wcprof fit`: which max_model_len, max_num_batched_tokens and max_num_seqs serve at least N
requests at full length with the worst step inside the budget, derived from one sweep.

Pure: no vLLM, no torch.

What it starts from (`FitFacts`): the sweep of one engine at the largest limits the user allows
(L, C, S: max_model_len, max_num_batched_tokens, max_num_seqs), the chunk advisor's steps and
timings (core/advise.py: each candidate chunk's own stock, split, decode, mixed and context-ladder
steps, and its prefill throughput), the admission that start made, and the fit's own steps
(`FitMeasurements`: a shape family some candidate forms that nothing measured, run once, at the
longest context and the most requests any candidate needs of it; `missing_shapes` says which).
Nothing is swept per candidate.

The candidates (`fit`): every advised chunk C' (256, 512, ... up to C, and C itself), max_num_seqs
S' from `seqs_candidates` (S, S/4, S/16, S/64 and the minimum concurrency N; each at least N and
at most C', below which vLLM refuses the chunk), and max_model_len L' from `context_rungs` (L,
L/2, L/4, L/8 in whole blocks, none below C') plus, for each (C', S'), the longest L' at which the
candidate holds N requests (`longest_context`).

A candidate's worst step. Every step an engine with (L', C', S') can form (core/shapes.py's plan
at its limits: `candidate_plan`), an engine with (L, C', S) can form at an equal or longer KV
extent, with as many requests or more. The plan leaves the KV pool unbounded, so no request count
or extent depends on a budget not yet known: more requests at longer extents than the
candidate's pool may hold, the safe direction. Its figures:
  - prefill rows 1..C' on one request: the sweep's rows coverage (advise.rows_bound: executed
    needs, chord segments by their certificate). It ran, or certified, each rows value at the
    swept max_model_len only, which is the next measured point above every shorter one: a
    shorter max_model_len is credited with the KV it frees, not with a smaller prefill step;
  - every other shape (its stock step, the worst rows value split over requests, the decode
    batch, the mixed step, the context ladder of the worst rows value) from the measurements of
    its family (`covers`: the same kind and rows; a decode batch also by one with more
    requests, as the sweep's own decode batch stands for those with fewer). A mixed step is
    covered only by one with as many requests: on the same rows, fewer decodes leave a larger
    chunk (the sweep measures both ends, mixed_step and mixed_pair, for that reason).

How a figure between measured points is bounded (`bound`): of the family's measured points that
cover the shape (a context at or above its own, as many requests or more where the kind allows),
the nearest are taken (the next measured point above: no other covering point lies between it
and the shape), and the figure is the largest need over them and over every measured point they
cover (every point below, the neighbour under the shape included). A figure is thus never below
a measured neighbour on either side and never interpolated: where the curve rises between two
measured contexts, the upper one is used. That is the safe direction under the sweep's own
premise, that a step's need does not fall as its requests' KV extent grows (shapes.py plans
every step at its longest extent on it). A shape no measurement covers is never given a figure:
that candidate is not fitted, and the fit's notes say which shape was not measured. The shapes
the runner cannot build at all are left out as the sweep leaves them out, and the candidate's
note says so; one the sweep did not leave out alike (advise.left_out_as_swept: a candidate's
stock step on more requests than the V2 provisional pool has state slots for) leaves the
candidate unfitted (fits and feasible False), never weighed without it.

The rest is the admission's (admission.compute_admission) at the candidate: the held memory the
start measured, with the workspace scaled to the candidate's steps as the advisor scales it
(buffers vLLM sizes by the limits are left as measured: the larger, the safe direction); the
warm-up reserve and margin as admitted; one request's KV at L' (whole blocks, plus whatever
per-request state one at L held beyond its tokens). Its KV cache: --kv-cache-memory-bytes when
given, else the budget rounded down to a whole MiB, the value fit recommends passing. Its
concurrency: whole requests at L' in that KV cache less the one block vLLM's block pool holds
back (its null block), at most S'. A candidate with the swept chunk
and max_num_seqs is never given less transient or workspace than that start admitted.

The objective (`RULES`) picks among the feasible candidates (fits, concurrency >= N); the frontier
holds the feasible candidates that no other feasible one matches on max_model_len, concurrency
and prefill throughput while beating it on one.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable, NamedTuple

from . import shapes as plan
from .admission import (bytes_for_one_request, compute_admission, kv_tokens, least_kv_cache_bytes,
                        usable_kv_bytes)
from .advise import (confirmation_delta, full_extent_rows, left_out_as_swept, plan_candidate,
                     raiser, rows_bound, unknown_worst)
from .shapes import Limits
from .types import (Admission, Advice, Fit, FitCandidate, FitMeasurements, FitObjective,
                    HeldMemory, Shape, StepResult, SweepResult, Workspace)
from ..errors import DoesNotFit
from ..sizes import MiB, fmt_bytes, fmt_tokens

OBJECTIVES: tuple[str, ...] = ("context", "concurrency", "throughput")

RULES = {
    "context": "the longest max_model_len among the candidates that fit and hold {n} request(s) "
               "at full length at once; then the fastest prefill, the most requests, the most "
               "max_num_seqs, the least need",
    "concurrency": "at the swept max_model_len ({mml}), the candidate holding the most requests "
                   "at full length at once (at least {n}); then the fastest prefill, the most "
                   "max_num_seqs, the least need",
    "throughput": "at the swept max_model_len ({mml}), the candidate with the fastest prefill "
                  "among those holding {n} request(s) at full length at once; then the most "
                  "requests, the most max_num_seqs, the least need",
}

BOUND = ("between measured points, the next measured point above (a longer context, or as many "
         "requests or more), and never below a measured point under it; prefill rows at the "
         "swept max_model_len's coverage; never interpolated, never an unmeasured shape")

SEQS_STEPS = 3
"""seqs_candidates: how many quarterings of max_num_seqs are weighed (S/4, S/16, S/64)."""

RUNGS = 3
"""context_rungs: how many halvings of max_model_len are shown (L/2, L/4, L/8)."""

_ORDERED_REQS = ("decode",)


class NotMeasured(ValueError):
    """A shape a candidate forms that no measurement covers: the candidate is not fitted."""

    def __init__(self, shape: Shape):
        super().__init__(f"{shape.label()} was not measured at or above its context")
        self.shape = shape


def seqs_candidates(max_num_seqs: int, min_concurrency: int = 1) -> tuple[int, ...]:
    """max_num_seqs values weighed, descending: S, S/4, S/16, S/64 (those at least
    min_concurrency) and min_concurrency itself when below S."""
    if max_num_seqs < 1 or min_concurrency < 1:
        raise ValueError(f"max_num_seqs and min_concurrency must be >= 1, got {max_num_seqs}, "
                         f"{min_concurrency}")
    out = {max_num_seqs}
    s = max_num_seqs
    for _ in range(SEQS_STEPS):
        s //= 4
        if s >= min_concurrency:
            out.add(s)
    if min_concurrency < max_num_seqs:
        out.add(min_concurrency)
    return tuple(sorted(out, reverse=True))


def context_rungs(max_model_len: int, block_size: int, chunk: int) -> tuple[int, ...]:
    """max_model_len values shown for a chunk, descending: L and L/2, L/4, L/8 in whole blocks,
    none below the chunk (a shorter one holds several whole prompts in a step, which the sweep at
    the longest context did not plan) nor below one block."""
    out = {max_model_len} if max_model_len >= chunk else set()
    for k in range(1, RUNGS + 1):
        rung = (max_model_len >> k) // block_size * block_size
        if rung >= max(chunk, block_size):
            out.add(rung)
    return tuple(sorted(out, reverse=True))


def fit_limits(limits: Limits, max_model_len: int, max_num_seqs: int) -> Limits:
    """The swept limits at a candidate's max_model_len and max_num_seqs, the KV pool unbounded
    (every request count and extent the scheduler could form with any pool)."""
    return dataclasses.replace(limits, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                               kv_capacity_tokens=None, full_request_tokens=None,
                               prefix_request_tokens=None)


def candidate_plan(limits: Limits, sweep: SweepResult, max_model_len: int, chunk: int,
                   max_num_seqs: int) -> tuple[Shape, ...]:
    """The steps a candidate forms beyond the rows 1..chunk (the advisor's candidate plan at the
    candidate's limits): its stock step, its own chunk, the worst rows value split over
    requests, the decode batch, the mixed step and the worst rows value's context ladder."""
    lim = fit_limits(limits, max_model_len, max_num_seqs)
    return plan_candidate(lim, sweep, chunk).shapes


def _family(shape: Shape) -> tuple:
    if shape.kind == "decode":
        return ("decode", shape.rows // max(1, shape.num_reqs))
    return (shape.kind, shape.rows, shape.num_reqs)


def covers(measured: Shape, shape: Shape) -> bool:
    """Whether a measurement of `measured` bounds `shape` from above under the sweep's premises:
    the same family (kind and rows; stock, prefill and mixed steps also the same request count:
    more decodes beside a mixed step's chunk shorten it), a context at or above `shape`'s, and
    for a decode batch as many requests or more."""
    if _family(measured) != _family(shape) or measured.context_len < shape.context_len:
        return False
    return shape.kind not in _ORDERED_REQS or measured.num_reqs >= shape.num_reqs


def bound(shape: Shape, measured: Iterable[StepResult]) -> list[StepResult]:
    """The measurements that bound `shape` (the module docstring): the nearest covering points
    and every measured point they cover. Raises NotMeasured when no measurement covers it."""
    found = [r for r in measured if _family(r.shape) == _family(shape)]
    above = [r for r in found if covers(r.shape, shape)]
    if not above:
        raise NotMeasured(shape)
    nearest = [r for r in above if not any(o.shape != r.shape and covers(r.shape, o.shape)
                                           for o in above)]
    return [r for r in found if any(covers(n.shape, r.shape) for n in nearest)]


def missing_shapes(limits: Limits, sweep: SweepResult, known: Iterable[StepResult],
                   chunks: Iterable[int], seqs: Iterable[int]) -> list[Shape]:
    """The shapes the fit needs measured: one per family some candidate forms that no step in
    `known` (the sweep's, the advisor's) covers, at the swept max_model_len (every shorter
    candidate's shape of that family is covered by it), the most requests first, so one step
    covers its family's smaller members. A fixed order: every rank derives the same list."""
    pool = [r.shape for r in known]
    want: dict[Shape, None] = {}
    for chunk in chunks:
        if chunk > limits.max_model_len:
            continue
        for s in seqs:
            if s <= chunk:
                for shape in candidate_plan(limits, sweep, limits.max_model_len, chunk, s):
                    want.setdefault(shape, None)
    out: list[Shape] = []
    for shape in sorted(want, key=lambda sh: (-sh.num_reqs, -sh.context_len, sh.kind, sh.rows)):
        if not any(covers(m, shape) for m in (*pool, *out)):
            out.append(shape)
    return out


@dataclasses.dataclass(frozen=True)
class FitFacts:
    """What one start measured and admitted, which the fit derives every candidate from."""

    limits: Limits
    """The swept engine's limits (the largest any candidate has)."""
    sweep: SweepResult
    held: HeldMemory
    admission: Admission
    workspace: Workspace
    measured: FitMeasurements
    advice: Advice | None = None
    """The chunk advisor's steps and timings (None: no advice; the fit measured what it needs)."""
    cut_down: bool = False
    allocator_slack: int = 0
    device_total_bytes: int = 0
    gpu_memory_utilization: float | None = None


class _Weigher:
    """One fit's measurements, indexed once; `candidate` weighs one configuration."""

    def __init__(self, facts: FitFacts):
        self.facts = facts
        sweep = facts.sweep
        self.raised = raiser(sweep, confirmation_delta(sweep) if facts.cut_down else 0)
        advice_steps = facts.advice.steps if facts.advice is not None else ()
        self.pool = [*self.raised((sweep.stock, *sweep.steps, *sweep.context_curve)),
                     *advice_steps, *facts.measured.steps]
        self.unbuildable = [s for s, _ in (*sweep.skipped, *facts.measured.skipped)]
        self.why = dict((*sweep.skipped, *facts.measured.skipped))
        self.ws_scale = max((r.workspace_bytes for r in self.pool), default=0)
        self.rates = {c.chunk: c.prefill_tokens_per_s for c in facts.advice.candidates} \
            if facts.advice is not None else {}

    def one_request(self, max_model_len: int) -> int:
        adm, lim = self.facts.admission, self.facts.limits
        swept = bytes_for_one_request(adm.bytes_per_token, lim.block_size, lim.max_model_len)
        state = max(0, (adm.one_request_bytes or swept) - swept)
        return bytes_for_one_request(adm.bytes_per_token, lim.block_size, max_model_len) + state

    def candidate(self, max_model_len: int, chunk: int, seqs: int, min_concurrency: int
                  ) -> FitCandidate:
        f = self.facts
        lim, sweep, adm = f.limits, f.sweep, f.admission
        found: list[StepResult] = []
        left_out: list[str] = []
        unmeasured: list[str] = []
        worst_bound = (-1, None, None)
        own = None
        for shape in candidate_plan(lim, sweep, max_model_len, chunk, seqs):
            try:
                witnesses = bound(shape, self.pool)
            except NotMeasured:
                if any(covers(u, shape) for u in self.unbuildable):
                    why = next((self.why[u] for u in self.unbuildable if covers(u, shape)), "")
                    left_out.append(f"{shape.label()} not run: {why}")
                    if not left_out_as_swept(shape, sweep):
                        unmeasured.append(left_out[-1])
                    continue
                raise
            found += witnesses
            top = max(witnesses, key=lambda r: (r.need_bytes, r.peak_bytes))
            if top.need_bytes > worst_bound[0]:
                worst_bound = (top.need_bytes, shape, top.shape)
            if shape == plan.prefill_chunk(fit_limits(lim, max_model_len, seqs), chunk):
                own = top
        if chunk in sweep.coverage.peaks:
            own = None
        rows = self.raised(full_extent_rows(lim, sweep, chunk))
        steps = [*rows, *found]
        rows_b, worst_need = rows_bound(sweep, chunk, own)
        transient = max(r.peak_bytes for r in steps) + max(0, rows_b - worst_need) \
            + max(0, f.allocator_slack)
        ws_need = max(r.workspace_bytes for r in steps)
        ws = f.workspace.total_bytes if not self.ws_scale else \
            -(-f.workspace.total_bytes * ws_need // self.ws_scale)
        worst_shape, bounded_by = worst_bound[1], worst_bound[2]
        top_row = max(rows, key=lambda r: (r.need_bytes, r.peak_bytes), default=None)
        if top_row is not None and top_row.need_bytes > worst_bound[0]:
            worst_shape = plan.prefill_chunk(fit_limits(lim, max_model_len, seqs),
                                             top_row.shape.rows)
            bounded_by = top_row.shape
        swept = (chunk, seqs) == (lim.max_num_batched_tokens, lim.max_num_seqs)
        if swept:
            # what that start itself admitted: never less
            transient = max(transient, sweep.peak_bytes)
            ws = max(ws, f.workspace.total_bytes)
        one = self.one_request(max_model_len)
        a = admission_at(f, max_model_len=max_model_len, transient=transient, workspace=ws,
                         one_request=one)
        explicit = adm.explicit_kv_cache_memory_bytes
        kv = explicit if explicit is not None else a.recommended_kv_cache_memory_bytes
        if swept and max_model_len == lim.max_model_len and explicit is None \
                and adm.pool_ceiling_bytes is not None:
            # the start's own configuration: its flag is held at the pool its measured plan
            # covers (budget.held_at_pool); a larger one holds wider steps than any measured
            kv = min(kv, adm.recommended_kv_cache_memory_bytes)
        tokens = kv_tokens(kv, adm.bytes_per_token, lim.block_size)
        # vLLM's block pool holds one block back (its null block) from every request
        usable = usable_kv_bytes(kv, bytes_per_token=adm.bytes_per_token,
                                 block_size=lim.block_size, pool_block_bytes=adm.pool_block_bytes)
        held = usable // one if one else seqs
        # a step it forms that could not be built (advise.left_out_as_swept): its worst case
        # is unknown, so it is neither fitted nor recommended
        fits = a.fits and held >= 1 and not unmeasured
        left_out[:0] = unknown_worst(unmeasured)
        concurrency = min(seqs, held) if fits else 0
        return FitCandidate(
            max_model_len=max_model_len, max_num_batched_tokens=chunk, max_num_seqs=seqs,
            transient_bytes=transient, workspace_bytes=ws, worst_shape=worst_shape,
            bounded_by=bounded_by if bounded_by != worst_shape else None,
            budget_bytes=a.budget_bytes, kv_cache_bytes=kv, kv_tokens=tokens,
            one_request_bytes=one, concurrency=concurrency, fits=fits,
            feasible=fits and concurrency >= min_concurrency,
            min_gpu_memory_utilization=self._least_share(a, one, min_concurrency),
            prefill_tokens_per_s=self.rates.get(chunk),
            note="; ".join(left_out) or None)

    def _least_share(self, a: Admission, one: int, n: int) -> float | None:
        """The smallest share of the device (hundredths, up) whose requested memory still leaves
        this candidate's KV: the explicit size, else n requests at full length and the null
        block vLLM's pool holds back (admission.usable_kv_bytes)."""
        total = self.facts.device_total_bytes
        if total <= 0:
            return None
        explicit = a.explicit_kv_cache_memory_bytes
        kv = explicit if explicit is not None else least_kv_cache_bytes(
            n * one, bytes_per_token=a.bytes_per_token, block_size=self.facts.limits.block_size,
            pool_block_bytes=a.pool_block_bytes)
        needed = a.consumed_bytes + (a.transient_bytes or 0) + a.cudagraph_bytes \
            + a.margin_bytes + kv
        return -(-needed * 100 // total) / 100


def admission_at(facts: FitFacts, *, max_model_len: int, transient: int, workspace: int,
                 one_request: int, noise: int = 0,
                 context_curve: Iterable[tuple[int, int]] = ()) -> Admission:
    """The start's admission (compute_admission) at a candidate: the held memory the start
    measured with the workspace the candidate holds, its worst transient and one request at its
    max_model_len; the stock figures, warm-up reserve and margin as that start admitted."""
    f, adm, lim = facts, facts.admission, facts.limits
    return compute_admission(
        requested=f.held.requested_bytes,
        consumed=f.held.consumed_bytes - f.workspace.total_bytes + workspace,
        weights=f.held.weights_bytes, non_torch=f.held.non_torch_bytes,
        worst_transient=transient, stock_need=f.sweep.stock.need_bytes,
        stock_kv=adm.stock_kv_cache_bytes, cudagraph=adm.cudagraph_bytes,
        margin=adm.margin_bytes, bytes_per_token=adm.bytes_per_token,
        block_size=lim.block_size, max_model_len=max_model_len, one_request=one_request,
        explicit_kv=adm.explicit_kv_cache_memory_bytes, pool_block_bytes=adm.pool_block_bytes,
        noise=noise, context_curve=context_curve)


def longest_context(feasible: Callable[[int], bool], *, lo: int, hi: int, block_size: int
                    ) -> int | None:
    """The largest max_model_len in [lo, hi] (whole blocks, or hi itself) for which `feasible`
    holds, assuming it holds for every shorter one once it holds for one (a candidate's bound
    only grows with its context; the answer is weighed again on its own); None when lo fails."""
    values = list(range(-(-lo // block_size) * block_size, hi + 1, block_size))
    if not values or values[-1] != hi:
        values.append(hi)
    values = [v for v in values if lo <= v <= hi]
    if not values or not feasible(values[0]):
        return None
    a, b = 0, len(values) - 1  # values[a] feasible
    while a < b:
        mid = (a + b + 1) // 2
        if feasible(values[mid]):
            a = mid
        else:
            b = mid - 1
    return values[a]


def _rank(objective: str) -> Callable[[FitCandidate], tuple]:
    def rate(c: FitCandidate) -> float:
        return c.prefill_tokens_per_s or 0.0

    tail = lambda c: (c.max_num_seqs, -c.need_bytes, c.max_num_batched_tokens)  # noqa: E731
    if objective == "context":
        return lambda c: (c.max_model_len, rate(c), c.concurrency, *tail(c))
    if objective == "concurrency":
        return lambda c: (c.concurrency, rate(c), *tail(c))
    return lambda c: (rate(c), c.concurrency, *tail(c))


def frontier(candidates: Iterable[FitCandidate], objective: str = "context") -> set[tuple]:
    """The limits of the feasible candidates no other feasible one matches on max_model_len,
    concurrency and prefill throughput while beating it on one; of candidates equal on all
    three, the one the objective ranks first."""
    rank = _rank(objective)
    best: dict[tuple, FitCandidate] = {}
    for c in candidates:
        if c.feasible:
            point = (c.max_model_len, c.concurrency, c.prefill_tokens_per_s or 0.0)
            if point not in best or rank(c) > rank(best[point]):
                best[point] = c
    points = list(best)
    kept = {p for p in points
            if not any(q != p and all(x >= y for x, y in zip(q, p)) for q in points)}
    return {best[p].limits for p in kept}


VLLM_DEFAULT_GPU_MEMORY_UTILIZATION = 0.92
"""vLLM's CacheConfig.gpu_memory_utilization default (0.26-0.32)."""


def recommended_flags(c: FitCandidate, gpu_memory_utilization: float | None) -> tuple[str, ...]:
    """The `vllm serve` flags of candidate `c`: its limits and its KV cache, always as
    --kv-cache-memory-bytes. With that flag stock vLLM sizes the KV cache from it alone (0.32:
    Worker.determine_available_memory returns it after the profile run), but the line is also
    run with `--profiler worstcase`, whose budget starts from the worker's requested memory,
    utilization x total on CUDA and on the CPU alike (adapter/facts): the KV size was fitted
    against that share, so --gpu-memory-utilization is printed whenever it is not vLLM's default,
    on any device (leaving out 0.95 would start the plugin at 0.92, below the fitted budget, and
    enforce mode would refuse the start). CUDA's init_device also checks free memory against it."""
    flags = ["--max-model-len", str(c.max_model_len),
             "--max-num-batched-tokens", str(c.max_num_batched_tokens),
             "--max-num-seqs", str(c.max_num_seqs)]
    if gpu_memory_utilization is not None \
            and abs(gpu_memory_utilization - VLLM_DEFAULT_GPU_MEMORY_UTILIZATION) > 1e-9:
        flags += ["--gpu-memory-utilization", f"{gpu_memory_utilization:g}"]
    return (*flags, "--kv-cache-memory-bytes", str(c.kv_cache_bytes))


def fit(facts: FitFacts, *, min_concurrency: int = 1, objective: FitObjective = "context"
        ) -> Fit:
    """Every candidate (the module docstring), the recommendation and the frontier."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    if min_concurrency < 1:
        raise ValueError(f"min_concurrency must be >= 1, got {min_concurrency}")
    lim = facts.limits
    weigh = _Weigher(facts)
    notes: list[str] = []
    seen: dict[tuple[int, int, int], FitCandidate] = {}

    def weighed(mml: int, chunk: int, seqs: int) -> FitCandidate | None:
        key = (mml, chunk, seqs)
        if key not in seen:
            try:
                seen[key] = weigh.candidate(mml, chunk, seqs, min_concurrency)
            except NotMeasured as e:
                notes.append(f"max_model_len {fmt_tokens(mml)}, chunk {fmt_tokens(chunk)}, "
                             f"max_num_seqs {seqs}: not fitted, {e}")
                return None
        return seen[key]

    shown: set[tuple[int, int, int]] = set()
    for chunk in facts.measured.chunks:
        if chunk > lim.max_model_len:
            notes.append(f"chunk {fmt_tokens(chunk)}: above max_model_len "
                         f"{fmt_tokens(lim.max_model_len)}, not weighed")
            continue
        for seqs in facts.measured.seqs:
            if seqs > chunk:
                notes.append(f"max_num_seqs {seqs} with chunk {fmt_tokens(chunk)}: vLLM refuses "
                             f"max_num_batched_tokens < max_num_seqs")
                continue
            rungs = context_rungs(lim.max_model_len, lim.block_size, chunk)
            longest = longest_context(
                lambda mml: (c := weighed(mml, chunk, seqs)) is not None and c.feasible,
                lo=chunk, hi=lim.max_model_len, block_size=lim.block_size)
            for mml in {*rungs, *([longest] if longest is not None else [])}:
                if weighed(mml, chunk, seqs) is not None:
                    shown.add((mml, chunk, seqs))
    candidates = sorted((seen[k] for k in shown), key=lambda c: (-c.max_model_len,
                                                                -c.max_num_batched_tokens,
                                                                -c.max_num_seqs))
    on_frontier = frontier(candidates, objective)
    candidates = [dataclasses.replace(c, frontier=c.limits in on_frontier) for c in candidates]
    pool = [c for c in candidates if c.feasible
            and (objective == "context" or c.max_model_len == lim.max_model_len)]
    best = max(pool, key=_rank(objective), default=None)
    if facts.advice is not None:
        notes += [f"chunk {fmt_tokens(e.chunk)} left out: {e.reason}" for e in facts.advice.excluded]
    return Fit(objective=objective, min_concurrency=min_concurrency,
               swept=(lim.max_model_len, lim.max_num_batched_tokens, lim.max_num_seqs),
               gpu_memory_utilization=facts.gpu_memory_utilization, recommended=best,
               flags=recommended_flags(best, facts.gpu_memory_utilization)
               if best else (),
               rule=RULES[objective].format(n=min_concurrency,
                                            mml=fmt_tokens(lim.max_model_len)),
               bound=BOUND, candidates=tuple(candidates), notes=tuple(dict.fromkeys(notes)),
               steps=facts.measured.steps, seconds=facts.measured.seconds)


class Applied(NamedTuple):
    """What max_model_len: auto decides at one start (apply_longest)."""

    fit: Fit
    """The fit, its applied_max_model_len and applied_why filled in."""
    admission: Admission | None
    """The start's admission at the applied max_model_len; None when no length fits."""
    error: DoesNotFit | None
    """The refusal when no length fits: what would, named."""


def apply_longest(facts: FitFacts, fitted: Fit, *, min_concurrency: int = 1, noise: int = 0,
                  context_curve: Iterable[tuple[int, int]] = ()) -> Applied:
    """max_model_len: auto (the setting; docs/fit.md): the longest max_model_len the engine
    starts with, the fit weighed over max_model_len only. Its candidates have the engine's own
    max_num_batched_tokens C and max_num_seqs S and a max_model_len from min(C, L) up to the swept
    L, in whole blocks (or L itself), each weighed as every fit candidate is (its worst step
    bounded from the sweep, its admission, the requests at full length its KV cache holds
    beside vLLM's null block); the answer is the longest feasible one (fits, and holds
    `min_concurrency` requests at once), found as `longest_context` finds it, so the next
    length weighed above it (one block more) was weighed and is not feasible. Its admission
    (admission_at, with the sweep's context curve up to it and the stock-OOM `noise`) is the one
    the start then applies. None feasible: a DoesNotFit whose hint names the least that would
    start. The same facts give the same answer."""
    lim = facts.limits
    top, chunk, seqs, block = (lim.max_model_len, lim.max_num_batched_tokens, lim.max_num_seqs,
                               lim.block_size)
    n = min_concurrency
    weigh = _Weigher(facts)
    seen: dict[int, FitCandidate | NotMeasured] = {}

    def at(mml: int) -> FitCandidate | NotMeasured:
        if mml not in seen:
            try:
                seen[mml] = weigh.candidate(mml, chunk, seqs, n)
            except NotMeasured as e:
                seen[mml] = e
        return seen[mml]

    def feasible(mml: int) -> bool:
        c = at(mml)
        return isinstance(c, FitCandidate) and c.feasible

    lo = min(chunk, top)
    where = (f"max_num_batched_tokens {fmt_tokens(chunk)}, max_num_seqs {seqs}, "
             f"{n} request(s) at full length at once")
    longest = longest_context(feasible, lo=lo, hi=top, block_size=block)
    if longest is None:
        why, hint = _refusal(facts, at(lo), lo=lo, n=n)
        why = (f"max_model_len auto: no max_model_len from {fmt_tokens(lo)} to {fmt_tokens(top)} "
               f"fits with {where}: {why}")
        return Applied(dataclasses.replace(fitted, applied_max_model_len=None, applied_why=why),
                       None, DoesNotFit(why, hint=hint))
    c = at(longest)
    assert isinstance(c, FitCandidate)
    above = min(longest + block, top) if longest < top else None
    if above is None:
        beyond = "the engine's max_model_len, the longest weighed"
    else:
        nxt = at(above)
        if isinstance(nxt, NotMeasured):
            beyond = f"{fmt_tokens(above)} not bounded ({nxt})"
        elif nxt.fits:
            beyond = f"at {fmt_tokens(above)} it would hold {nxt.concurrency}"
        elif nxt.kv_cache_bytes < least_kv_cache_bytes(
                nxt.one_request_bytes, bytes_per_token=facts.admission.bytes_per_token,
                block_size=block, pool_block_bytes=facts.admission.pool_block_bytes):
            beyond = (f"at {fmt_tokens(above)} it would not hold one request of "
                      f"{fmt_bytes(nxt.one_request_bytes)} beside the null block")
        else:
            beyond = (f"at {fmt_tokens(above)} its worst step would leave a budget of "
                      f"{fmt_bytes(nxt.budget_bytes)}, below its KV cache")
    why = (f"max_model_len auto: {fmt_tokens(longest)} (of {fmt_tokens(top)}), the longest in "
           f"whole blocks of {block} with {where}: its KV cache {fmt_bytes(c.kv_cache_bytes)} "
           f"({fmt_tokens(c.kv_tokens)} tokens) holds {c.concurrency} request(s) of "
           f"{fmt_bytes(c.one_request_bytes)} beside vLLM's null block, its worst step "
           f"{fmt_bytes(c.need_bytes)} at {c.worst_shape.label()} inside a budget of "
           f"{fmt_bytes(c.budget_bytes)}; {beyond}")
    admission = admission_at(facts, max_model_len=longest, transient=c.transient_bytes,
                             workspace=c.workspace_bytes, one_request=c.one_request_bytes,
                             noise=noise,
                             context_curve=[(x, y) for x, y in context_curve if x <= longest])
    return Applied(dataclasses.replace(fitted, applied_max_model_len=longest, applied_why=why),
                   admission, None)


def _refusal(facts: FitFacts, c: FitCandidate | NotMeasured, *, lo: int, n: int
             ) -> tuple[str, str]:
    """Why the shortest length weighed (`lo`) is not feasible, and the hint naming the least
    that would start: more max_num_seqs, a smaller explicit KV size or a larger one, more
    memory, a shorter chunk."""
    lim, adm = facts.limits, facts.admission
    shorter = (f"or lower --max-num-batched-tokens (no max_model_len below it, "
               f"{fmt_tokens(lim.max_num_batched_tokens)}, is weighed)")
    if isinstance(c, NotMeasured):
        return (f"at {fmt_tokens(lo)} {c}",
                f"pass --max-model-len N (`wcprof fit` weighs the lengths this sweep bounds) "
                f"{shorter}")
    if n > lim.max_num_seqs:
        return (f"max_num_seqs {lim.max_num_seqs} admits fewer than {n} at once",
                f"raise --max-num-seqs to {n} or lower fit_min_concurrency to "
                f"{lim.max_num_seqs}")
    blocks = dict(bytes_per_token=adm.bytes_per_token, block_size=lim.block_size,
                  pool_block_bytes=adm.pool_block_bytes)
    least = least_kv_cache_bytes(n * c.one_request_bytes, **blocks)
    budget = max(0, c.budget_bytes) // MiB * MiB
    worst = f"its worst step {fmt_bytes(c.need_bytes)} at {c.worst_shape.label()}"
    explicit = adm.explicit_kv_cache_memory_bytes
    state = (f"at {fmt_tokens(lo)} {worst} leaves a budget of {fmt_bytes(c.budget_bytes)} and its "
             f"KV cache {fmt_bytes(c.kv_cache_bytes)} holds {c.concurrency}; {n} of "
             f"{fmt_bytes(c.one_request_bytes)} and vLLM's null block need {fmt_bytes(least)}")
    if explicit is not None and least <= budget:
        return state, (f"use --kv-cache-memory-bytes {least} or more, up to {budget} (the "
                       f"worst-case budget), {shorter}")
    more = (f"at --gpu-memory-utilization {c.min_gpu_memory_utilization:g} or more"
            if explicit is None and c.min_gpu_memory_utilization is not None
            and c.min_gpu_memory_utilization <= 1
            else f"{fmt_bytes(least - budget)} more memory")
    instead = "drop --kv-cache-memory-bytes or " if explicit is not None and explicit > budget \
        else ""
    return state, (f"{instead}give the engine {more} (a KV cache of {least} bytes at "
                   f"{fmt_tokens(lo)}), lower fit_min_concurrency, {shorter}")


def agreed_max_model_len(configured: int, chosen: Iterable[int | None]) -> int:
    """The max_model_len the engine core applies under max_model_len: auto: the least any
    worker chose (each rank's budget is safe at any shorter length: its worst step bounds every
    shorter candidate's), never above the configured one. A worker that chose none (its profile
    has no applied length) is a ValueError: the engine must not start at a length nobody
    weighed."""
    values = list(chosen)
    if not values or any(v is None or v < 1 for v in values):
        raise ValueError(f"max_model_len auto: not every worker chose a max_model_len ({values})")
    return min(configured, *values)


def share_of(free_bytes: int, total_bytes: int) -> float:
    """The share of a device `wcprof fit` may ask for when no --gpu-memory-utilization is given:
    what is free now, in hundredths rounded down, one hundredth kept back (vLLM refuses a share
    above what is free at its start, and its own start takes a little)."""
    if total_bytes <= 0 or free_bytes <= 0:
        raise ValueError(f"free and total bytes must be positive, got {free_bytes}, {total_bytes}")
    return max(0.01, (free_bytes * 100 // total_bytes - 1) / 100)
