"""The worst-case sweep, independent of vLLM: which steps run, in which order, and what the
results mean. The engine side is a `StepDriver` (adapter/runner.py implements it over vLLM's model
runners); unit tests drive this module with a fake driver.

Order of work (identical on every rank — decisions use the rank-agreed maximum peak):
  1. stock step: vLLM's own profile shape (max_num_batched_tokens rows, empty KV, no attention
     metadata), measured by the same meter;
  2. on a provisional KV cache that holds one request at max_model_len:
     a. prefill chunks of R rows on top of max_model_len - R cached tokens, for every R in
        1..max_num_batched_tokens (executed, or certified by the chord argument of coverage.py);
     b. the worst rows value split over 2, 4, 8, ... prefills; the full-context decode batch;
        the widest decode batch the KV pool can hold; the mixed prefill+decode step;
     c. the worst rows value at growing KV extent (the curve that says when stock runs out);
     d. the worst shape once more with per-module hooks, to name the op that set the peak.
The admitted transient is the largest executed one plus the chord certificate's slack.

A start that finds this sweep cached (cache.py) runs `replay_worst` instead: the stock step and
the cached worst shape, one step each, on the same provisional KV cache.
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Callable, Protocol

from . import shapes as plan
from .coverage import cover_rows
from .meters import MemoryMeter, PeakAttributor, gc_frozen
from .report import RowsCovered, Shape, StepResult, StockFigures, WorstCase


@dataclass
class ProvisionalKV:
    """What the provisional KV cache cost: its own tensors, and what else vLLM allocated while
    initialising it (attention-metadata builders, input buffers) — memory stock leaves out."""

    num_blocks: int
    kv_bytes: int
    post_profile_bytes: int


class StepDriver(Protocol):
    limits: plan.Limits
    meter: MemoryMeter
    model: object

    def run_stock(self) -> None: ...

    def provisional_kv(self) -> AbstractContextManager[ProvisionalKV]: ...

    def run(self, shape: Shape) -> None: ...

    def agree_max(self, value: int) -> int:
        """Max over every rank (identity on one rank): keeps adaptive decisions identical."""
        ...

    def workspace_bytes(self) -> int:
        """Bytes the engine's WorkspaceManager holds now (0 without one)."""
        ...


StepCallback = Callable[[StepResult], None]


@dataclass
class SweepOutcome:
    stock: StockFigures
    worstcase: WorstCase
    provisional: ProvisionalKV


def _timed_step(driver: StepDriver, shape: Shape, attribute: bool = False) -> StepResult:
    meter = driver.meter
    meter.begin()
    t0 = time.perf_counter()
    top = None
    if attribute:
        with PeakAttributor(driver.model, meter) as attr:
            driver.run(shape)
        top = attr.top_op
    else:
        driver.run(shape)
    seconds = time.perf_counter() - t0
    peak = driver.agree_max(meter.end())
    return StepResult(shape=shape, peak_bytes=peak, seconds=seconds, top_op=top,
                      workspace_bytes=driver.agree_max(driver.workspace_bytes()))


def measure_stock(driver: StepDriver) -> StockFigures:
    meter = driver.meter
    meter.begin()
    t0 = time.perf_counter()
    driver.run_stock()
    seconds = time.perf_counter() - t0
    limits = driver.limits
    shape = Shape(kind="stock", rows=limits.max_num_batched_tokens, context_len=0,
                  num_reqs=min(limits.max_num_batched_tokens, limits.max_num_seqs))
    # Same semantics as every synthetic step: the transient above what the step leaves live
    # (lazy one-time initialisations land in the consumed figure instead).
    return StockFigures(peak_activation_bytes=driver.agree_max(meter.end()), shape=shape,
                        seconds=seconds, workspace_bytes=driver.agree_max(driver.workspace_bytes()))


@gc_frozen()
def run_sweep(driver: StepDriver, *, tolerance: int, exhaustive: bool = False,
              context_ladder: bool = True, attribute_ops: bool = True,
              on_step: StepCallback | None = None) -> SweepOutcome:
    t_start = time.perf_counter()
    limits = driver.limits
    log: list[StepResult] = []

    def step(shape: Shape, attribute: bool = False) -> StepResult:
        result = _timed_step(driver, shape, attribute)
        log.append(result)
        if on_step:
            on_step(result)
        return result

    stock = measure_stock(driver)
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
        for extra in (*plan.split_prefills(limits, rows_cov.worst_rows), plan.decode_batch(limits),
                      plan.wide_decode_batch(limits), plan.mixed_step(limits)):
            if extra is not None:
                step(extra)

        curve: list[StepResult] = []
        if context_ladder:
            wr = rows_cov.worst_rows
            for ctx in plan.context_ladder(limits, wr):
                shape = plan.prefill_chunk(limits, wr).model_copy(update={"context_len": ctx})
                curve.append(by_rows[wr] if shape == by_rows[wr].shape else step(shape))

        # The stock step is a step vLLM itself runs: the worst case is never below it.
        stock_step = stock.as_step()
        worst = max([*log, stock_step], key=lambda r: (r.need_bytes, r.peak_bytes))
        worst_op = None
        if attribute_ops and worst.shape.kind != "stock":
            worst_op = step(worst.shape, attribute=True).top_op

    # Rows never executed are bounded by the chord certificate: whatever it adds above the
    # largest executed need is added to the admitted transient (conservative: it may be workspace).
    chord_slack = max(0, rows_cov.bound - rows_cov.worst_peak)
    peak = max(r.peak_bytes for r in [*log, stock_step]) + chord_slack
    wc = WorstCase(
        peak_activation_bytes=peak,
        workspace_bytes=0,
        post_profile_bytes=provisional.post_profile_bytes,
        worst_shape=worst.shape,
        worst_op=worst_op,
        rows_covered=RowsCovered(min=1, max=hi),
        shapes_executed=len(log),
        coverage=rows_cov.to_model(),
        context_curve=curve,
        steps=log,
        seconds=time.perf_counter() - t_start,
    )
    return SweepOutcome(stock=stock, worstcase=wc, provisional=provisional)


@dataclass
class Replay:
    stock: StockFigures
    provisional: ProvisionalKV
    step: StepResult
    seconds: float


@gc_frozen()
def replay_worst(driver: StepDriver, worst_shape: Shape) -> Replay:
    """The check behind a cached sweep: measure the stock step, then run the cached worst shape
    once on a provisional KV cache and measure what it needs now."""
    t0 = time.perf_counter()
    stock = measure_stock(driver)
    with driver.provisional_kv() as provisional:
        if worst_shape.kind == "stock":
            step = stock.as_step()
        else:
            step = _timed_step(driver, worst_shape)
    return Replay(stock=stock, provisional=provisional, step=step,
                  seconds=time.perf_counter() - t0)
