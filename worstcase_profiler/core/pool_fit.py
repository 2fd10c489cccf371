"""The worst step fitted to the KV pool the admission leaves, pure.

The sweep plans its shapes for vLLM's own KV budget (adapter/startup.pool_limits): an upper bound
on the pool while the admitted transient is at least stock's. A shape whose request count the
pool bounds (requests under speculative decoding each holding 1 + k blocks of a recurrent state;
prefills lined up on a shared cached prefix) is then planned for more requests than the admitted
pool holds. Where that shape is the worst, the admission reserves for a step no scheduler forms,
and a replay of it from real requests forms only what the pool holds (docs/sweep.md has the
measured case).

The fit (adapter/pool_fit.fit_to_pool drives it):
  1. `replan`: the plan for the admitted pool; the shapes it adds (never measured) and drops (the
     pool cannot hold them);
  2. the added shapes are measured on the full model;
  3. `refit`: the admitted transient over the shapes the fitted plan keeps, the chord and
     allocator slack as the sweep added them; the allocation is then held at the fitted plan's
     pool (budget.planned_pool), so no wider step than was measured can form.
A second round plans for the pool between the first's and the sweep's where the pool its transient
leaves meets the pool it plans for (`next_pool`), in whole blocks, and a third settles at the pool
the second one's transient leaves where that line overshot. Every round's allocation is held at
(or below) the whole blocks of the pool its plan is for, and its transient covers every shape of
that plan, so each round's answer is safe on its own; the later ones give back KV the first held
back. A round that does not fit ends the fit with the last round that did, and a first round that
does not fit refuses the start: its readings are steps the unfitted pool forms too.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterable

from ..sizes import fmt_bytes
from .admission import pool_block, usable_kv_bytes
from . import shapes as plan
from .shapes import Limits
from .sweep import admitted_figures, certified_bound, full_model_steps
from .types import PoolFit, Shape, StepResult, SweepResult


@dataclass(frozen=True)
class Replan:
    """The plan for a smaller pool, against the sweep's."""

    limits: Limits
    """The sweep's limits with the pool's capacity."""
    added: tuple[Shape, ...]
    """Its shapes the sweep's plan did not have, in plan order."""
    dropped: tuple[Shape, ...]
    """The sweep's plan's shapes it does not have: the pool cannot hold them."""


def replan(limits: Limits, worst_rows: int, pool_tokens: int) -> Replan | None:
    """The plan for a pool of `pool_tokens` capacity tokens (Limits.kv_capacity_tokens' unit),
    or None where that pool is not smaller than the one planned (or none was). Only the shapes
    beside the rows curve depend on the pool (shapes.extra_steps at the sweep's worst rows); the
    prefill chunks and the context ladder are one request each. The stock step is not
    re-judged: where it counted, it still counts."""
    if limits.kv_capacity_tokens is None or pool_tokens >= limits.kv_capacity_tokens:
        return None
    fitted = dataclasses.replace(limits, kv_capacity_tokens=max(1, pool_tokens))
    before = plan.extra_steps(limits, worst_rows)
    after = plan.extra_steps(fitted, worst_rows)
    return Replan(limits=fitted, added=tuple(s for s in after if s not in before),
                  dropped=tuple(s for s in before if s not in after))


def refit(sweep: SweepResult, limits: Limits, fitted: Replan, measured: Iterable[StepResult],
          *, allocator_slack: int = 0, rounds: int = 1,
          skipped: Iterable[tuple[Shape, str]] = (),
          ran: Iterable[StepResult] | None = None, floor: int = 0,
          reused: int = 0) -> SweepResult:
    """`sweep` admitted for the fitted plan: `measured` holds the full-model readings of the
    plan's added shapes (those the driver could build; the others in `skipped`, with why).

    The admitted transient is the sweep's own formula over the fitted plan's shapes (`_formula`:
    every kept shape at the figure the sweep counted it at, sweep.admitted_figures, every added
    one at its reading, the largest plus the chord certificate's slack, never below a cut-down
    sweep's certified bound, plus `allocator_slack`), raised by whatever the sweep was admitted
    at above that formula over its own plan: raises the fit cannot re-derive (the encoder step
    of a multimodal model, a cached sweep's replay drift, a self-check's full-model floor, the
    CPU's highest stock reading) carry over as the same excess. Where the stock step was left
    out and its stand-in (the fitted plan's fresh prefill batch) could not be built, the stock
    step counts again, as in the sweep. The worst step is the largest full-model reading kept
    (by need, then peak); `worst_op` stays only where the worst shape does. `limits`: the
    sweep's (its rows curve's shapes). `ran`: every step the fit measured, earlier rounds'
    included, for the record (default `measured`). `floor`: measured steps outside the plan that
    the fitted pool still forms (the encoder step, the named check steps: their predictions); the
    admitted transient never goes below it, since a carried excess shrinks with the formula.
    `reused`: how many of `ran` came from the sweep cache instead of being measured now."""
    measured, skipped = tuple(measured), tuple(skipped)
    excluded = sweep.stock_excluded
    stand_in = plan.fresh_prefill_batch(fitted.limits)
    if excluded and stand_in is not None and any(s == stand_in for s, _ in skipped):
        excluded = None  # its stand-in did not run: the stock step counts
    carried = max(0, sweep.peak_bytes - _formula(sweep, limits, (), (), sweep.stock_excluded,
                                                 allocator_slack))
    peak = max(_formula(sweep, limits, measured, fitted.dropped, excluded, allocator_slack)
               + carried, floor)
    dropped = set(fitted.dropped)
    readings = [r for r in (*full_model_steps(sweep), *measured) if r.shape not in dropped
                and not (excluded and r.shape.kind == "stock")]
    worst = max(readings, key=lambda r: (r.need_bytes, r.peak_bytes))
    fit = PoolFit(planned_pool_tokens=int(limits.kv_capacity_tokens or 0),
                  pool_tokens=int(fitted.limits.kv_capacity_tokens or 0),
                  swept_worst=sweep.worst.shape, swept_peak_bytes=sweep.peak_bytes,
                  dropped=fitted.dropped, steps=measured if ran is None else tuple(ran),
                  rounds=rounds, reused=reused)
    return dataclasses.replace(
        sweep, worst=worst, peak_bytes=peak, pool_fit=fit, stock_excluded=excluded,
        worst_op=sweep.worst_op if worst.shape == sweep.worst.shape else worst.top_op,
        skipped=(*sweep.skipped, *(s for s in skipped if s not in sweep.skipped)))


def _formula(sweep: SweepResult, limits: Limits, measured: tuple[StepResult, ...],
             dropped: Iterable[Shape], excluded: str | None, allocator_slack: int) -> int:
    """The sweep's admitted-transient formula over its figures with `measured` added and
    `dropped` left out (the stock step left out where `excluded` says so)."""
    dropped = set(dropped)
    figures = admitted_figures(sweep)
    for r in measured:
        figures[r.shape] = max(figures.get(r.shape, 0), r.peak_bytes)
    counted = [p for sh, p in figures.items()
               if sh not in dropped and not (excluded and sh.kind == "stock")]
    chord = max(0, sweep.coverage.bound - sweep.coverage.worst_peak)
    return max(max(counted) + chord, certified_bound(sweep, limits)) + max(0, allocator_slack)


def usable_tokens(budget_bytes: int, *, bytes_per_token: int,
                  pool_block_bytes: int | None, block_size: int) -> int:
    """The capacity tokens (Limits.kv_capacity_tokens' unit) requests can hold in a KV pool
    allocated from `budget_bytes`: admission.usable_kv_bytes (its whole blocks of
    `pool_block_bytes`, less the null block vLLM's block pool holds back) in tokens. A plan for
    this pool forms its steps block by block: a fraction of a block, or the null block, holds
    no request's tokens."""
    return usable_kv_bytes(budget_bytes, bytes_per_token=bytes_per_token, block_size=block_size,
                           pool_block_bytes=pool_block_bytes) // bytes_per_token


def pool_ceiling_bytes(tokens: int, *, bytes_per_token: int, pool_block_bytes: int | None,
                       block_size: int) -> int:
    """The largest allocation whose usable pool (`usable_tokens`) holds no more than `tokens`:
    the whole blocks inside them and the null block. A fraction of a block rounds down: one
    more block would hold a wider step than the plan for `tokens` has."""
    block = pool_block(bytes_per_token, block_size, pool_block_bytes)
    return (tokens * bytes_per_token // block + 1) * block


def whole_blocks(tokens: int, *, bytes_per_token: int, pool_block_bytes: int | None,
                 block_size: int) -> int:
    """`tokens` down to the pool's whole blocks (what an allocation held at
    `pool_ceiling_bytes(tokens)` can hold): a round plans for exactly what it allocates."""
    kw = dict(bytes_per_token=bytes_per_token, pool_block_bytes=pool_block_bytes,
              block_size=block_size)
    return usable_tokens(pool_ceiling_bytes(tokens, **kw), **kw)


def next_pool(planned: int, first: int, after_first: int) -> int:
    """The pool the second round plans for (capacity tokens): where the line through the two
    rounds' (pool planned, pool its transient leaves) points, (planned, first) and (first,
    after_first), meets pool planned = pool left. A pool left grows as the plan's pool shrinks
    (fewer requests a step, less transient), so the fixed point lies between `first` and
    `planned`, and the line's is its estimate; no estimate is trusted for safety (the round's
    allocation is held at its plan's pool either way), only for how much KV the round gives
    back. `first` where the first round's transient leaves no more than it."""
    if after_first <= first or planned <= first:
        return first
    slope = (after_first - first) / (planned - first)
    return max(first, min(planned - 1, int((first + slope * planned) / (1 + slope))))


def fit_line(sweep: SweepResult) -> str | None:
    """What the fit did, in one line (the log's), or None where the sweep's plan stands."""
    if sweep.pool_fit is None:
        return None
    return fit_text(sweep.pool_fit, sweep.worst.shape, sweep.peak_bytes)


def fit_text(fit: PoolFit, worst: Shape, peak_bytes: int) -> str:
    """The fit in one line, from its record and the worst step it admitted (the log and the
    report's renderers say the same)."""
    return (f"worst step fitted to the KV pool: the sweep's ({fit.swept_worst.label()}, "
            f"{fmt_bytes(fit.swept_peak_bytes)} admitted) holds more requests or context than "
            f"the admitted pool ({fit.pool_tokens:,} of the {fit.planned_pool_tokens:,} tokens "
            f"planned); the plan for that pool admits {fmt_bytes(peak_bytes)} at "
            f"{worst.label()} ({len(fit.steps)} step(s) measured{_reused_text(fit.reused)}, "
            f"{fit.rounds} round(s)), and the pool is held at it")


def _reused_text(reused: int) -> str:
    return f", {reused} of them at an earlier start, read from the sweep cache" if reused else ""


def kept_readings(sweep: SweepResult) -> tuple[StepResult, ...]:
    """The fit's readings as a sweep-cache entry keeps them (adapter/sweep_cache.remember_pool_fit):
    the fitted worst step's with the op the fit attributed it to."""
    fit = sweep.pool_fit
    if fit is None:
        return ()
    return tuple(dataclasses.replace(r, top_op=sweep.worst_op)
                 if r.shape == sweep.worst.shape and sweep.worst_op else r for r in fit.steps)


def merged_readings(kept: Iterable[StepResult], new: Iterable[StepResult]
                    ) -> tuple[StepResult, ...]:
    """One reading per shape, the larger peak and the larger workspace where both have one
    (each as rank agreement takes them), so what a cache entry keeps only grows; the op of the
    one with the larger peak; `kept`'s order first, then `new` shapes in theirs."""
    out: dict[Shape, StepResult] = {r.shape: r for r in kept}
    for r in new:
        have = out.get(r.shape)
        if have is None:
            out[r.shape] = r
            continue
        top = r.top_op if r.peak_bytes > have.peak_bytes else have.top_op
        out[r.shape] = dataclasses.replace(
            have, peak_bytes=max(have.peak_bytes, r.peak_bytes), top_op=top,
            workspace_bytes=max(have.workspace_bytes, r.workspace_bytes))
    return tuple(out.values())
