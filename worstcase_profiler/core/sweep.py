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
The admitted transient is the largest executed one plus the chord certificate's slack.

A start that finds the sweep cached replays it instead (`replay`): the stock step and the cached
worst shape, one step each, on the same provisional KV cache.
"""

from __future__ import annotations

import dataclasses
import time
from contextlib import AbstractContextManager
from typing import Callable, Protocol

from . import shapes as plan
from .coverage import cover_rows
from .shapes import Limits
from .types import ProvisionalKV, Shape, StepResult, SweepResult


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


StepCallback = Callable[[StepResult], None]


def run_sweep(driver: StepDriver, *, tolerance: int, exhaustive: bool = False,
              context_ladder: bool = True, attribute_ops: bool = True,
              on_step: StepCallback | None = None) -> SweepResult:
    """Every step the scheduler can form, at its longest KV extent (see the module docstring).
    Returns the admitted transient `peak_bytes`: the largest measured transient (stock step
    included: vLLM runs it) plus the chord certificate's slack."""
    t_start = time.perf_counter()
    limits = driver.limits
    log: list[StepResult] = []

    def step(shape: Shape, attribute: bool = False) -> StepResult:
        result = driver.measure(shape, attribute)
        log.append(result)
        if on_step:
            on_step(result)
        return result

    stock = driver.measure_stock()
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
                shape = plan.prefill_chunk(limits, wr).with_context(ctx)
                curve.append(by_rows[wr] if shape == by_rows[wr].shape else step(shape))

        # The stock step is a step vLLM itself runs: the worst case is never below it.
        worst = max([*log, stock], key=lambda r: (r.need_bytes, r.peak_bytes))
        worst_op = None
        if attribute_ops and worst.shape.kind != "stock":
            worst_op = step(worst.shape, attribute=True).top_op
    # A chord-certified rows value may need up to the certificate's slack more than the
    # largest executed need; added to the admitted transient (conservative: it may be workspace).
    chord_slack = max(0, rows_cov.bound - rows_cov.worst_peak)
    return SweepResult(
        stock=stock, steps=tuple(log), worst=worst, worst_op=worst_op,
        peak_bytes=max(r.peak_bytes for r in [*log, stock]) + chord_slack,
        coverage=rows_cov, context_curve=tuple(curve), rows_max=hi,
        post_profile_bytes=provisional.post_profile_bytes,
        seconds=time.perf_counter() - t_start)


@dataclasses.dataclass(frozen=True)
class Replay:
    """A cached sweep's check: the stock step and the cached worst shape, measured now."""

    stock: StepResult
    step: StepResult
    provisional: ProvisionalKV
    seconds: float


def replay(driver: StepDriver, worst_shape: Shape) -> Replay:
    """Measure the stock step, then the cached worst shape once on a provisional KV cache."""
    t0 = time.perf_counter()
    stock = driver.measure_stock()
    with driver.provisional_kv() as provisional:
        step = stock if worst_shape.kind == "stock" else driver.measure(worst_shape)
    return Replay(stock=stock, step=step, provisional=provisional,
                  seconds=time.perf_counter() - t0)


def reused(cached: SweepResult, check: Replay) -> SweepResult:
    """A cached sweep, admitted after its replay: the transient is never below what the replay
    measured now, and the stock step and provisional KV are this start's."""
    peak = max(cached.peak_bytes, check.step.peak_bytes, check.stock.peak_bytes)
    return dataclasses.replace(cached, stock=check.stock, peak_bytes=peak,
                               post_profile_bytes=check.provisional.post_profile_bytes)
