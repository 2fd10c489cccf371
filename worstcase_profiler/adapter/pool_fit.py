"""The worst step fitted to the admitted KV pool, on the engine (core/pool_fit.py has the why).

fit_to_pool runs after the start's first decision: it plans for the pool that decision leaves,
measures the shapes that plan adds on the same driver and provisional KV cache as the sweep
(or takes a trusted cache entry's readings of them), and decides again, at most ROUNDS times.
Every rank plans for the largest pool any rank left (the safe direction: each rank's allocation
is held at or below it) and stops where any rank stops, so the ranks measure the same steps in
the same order.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Callable, Mapping

from ..core import pool_fit as core
from ..core.budget import Decided, Measured
from ..core.cache import within_one_step
from ..core.cache_trust import reading_holds
from ..core.sweep import cannot_build
from ..core.types import Shape, StepResult
from ..errors import DoesNotFit
from ..sizes import fmt_bytes

log = logging.getLogger("vllm.wcprof")

ROUNDS = 3
"""The first round plans for the pool the sweep's admission left; the second where the pool a
plan's transient leaves meets the pool it plans for (core/pool_fit.next_pool); the third, where
the second overshot, for the pool the second one's transient leaves (core/pool_fit.py)."""


def fit_to_pool(driver, facts: Measured, decided: Decided, decide: Callable[[Measured], Decided],
                *, mode: str, agree_max: Callable[[int], int] | None = None,
                held: Callable[[str], int] | None = None, attribute: bool = True,
                floor: int = 0, known: Mapping[Shape, StepResult] | None = None,
                known_held: int = 0, known_pool: int | None = None
                ) -> tuple[Measured, Decided]:
    """(facts, decision) with the worst step fitted to the admitted pool, or the ones given
    where the sweep's plan stands: its worst shape fits the pool, the start is refused (on any
    rank), the pool is not the admission's (report mode, the chunk cap's plan), or no pool was
    planned. The pool fitted is the usable one (core.usable_tokens: whole blocks, the null
    block held back); an explicit KV size is that pool, and its plan is fitted the same way.
    A first round that does not fit is the answer (refused: its readings are steps the unfitted
    pool forms too); a later one ends the fit with the round before. `held(phase)` reads what
    the process holds: what the fit's steps leave behind is added to the consumed memory.
    `floor`: the transient no fitted plan admits less than (core.refit's).

    `known`: readings of this configuration's shapes to take instead of measuring (a trusted
    cache entry's, sweep_cache.reusable_pool_fit), and `known_held` what the fit's steps left
    held when they were measured (counted where it is more than this start's). A shape is taken
    only where every rank has it, at the largest figures any rank has, so the ranks run the
    same steps and admit alike. Of the taken readings the last round's plan counts, the largest
    by need and the largest by peak are measured again (_cached_readings_hold); one that reads
    more than its figure by the meter's tolerance, or far less, drops every taken reading and the
    fit measures its shapes now (PoolFit.cache_rejected). A first round refused on any rank
    refuses every rank, and no rank runs a step after it.

    `known_pool`: the pool the entry's last fit planned for (CacheEntry.pool_fit_pool_tokens).
    Where this start's budget leaves a pool at most one rounding step smaller and every shape of
    that pool's plan is known on every rank (or one the driver cannot build, skipped as the
    entry's own fit skipped it), the fit plans for the entry's pool in one round and
    measures none of its shapes (_entry_pool): that plan bounds every step the smaller pool
    forms (as a kept sweep plan for a larger pool does, core/cache.pool_reuse), and the
    allocation is what its transient leaves, held at that pool or below: a little less KV than
    this start's own fit would give, where its larger plan's transient is larger. A restart
    whose graph reserve or held memory left it a little less KV then fits as its first start
    did, instead of measuring the shapes its own pool adds."""
    limits, bpt, sweep = facts.limits, facts.bytes_per_token, facts.sweep
    agree = agree_max or (lambda v: v)
    if (mode != "enforce" or not bpt or facts.chunk_cap_plan is not None
            or limits.kv_capacity_tokens is None or sweep.pool_fit is not None):
        return facts, decided  # the same on every rank: the configuration's
    if agree(int(decided.budget.error is not None)):
        return facts, decided  # refused on some rank: every rank stops here alike
    before = held("pool_fit.before") if held is not None else 0
    best, readings, reused, refused, counted = _rounds(driver, facts, decided, decide, agree,
                                                       known or {}, floor, known_pool)
    top, rejected = None, False
    taken = [readings[s] for s in counted if s in reused]  # what the plan admits with
    if best is not None and not refused and taken:
        holds, top = _cached_readings_hold(driver, best[0].sweep.worst.shape, taken,
                                           facts.tolerance_bytes, agree, attribute)
        if not holds:  # no cached reading is taken: every shape measured now
            rejected = True
            best, readings, reused, refused, _ = _rounds(driver, facts, decided, decide, agree,
                                                         {}, floor)
    if best is None:
        return facts, decided
    trial, answer = best
    worst = trial.sweep.worst
    if not refused and attribute and worst.shape in readings and worst.shape not in reused \
            and worst.shape.kind != "stock":
        with driver.provisional_kv():
            top = driver.measure(worst.shape, attribute=True).top_op
    if top is not None:
        trial = dataclasses.replace(trial, sweep=dataclasses.replace(trial.sweep, worst_op=top))
    grown = max(0, held("pool_fit.after") - before) if held is not None else 0
    if reused:  # the steps not run now left that much held when they ran
        grown = max(grown, known_held)
    trial = dataclasses.replace(trial, sweep=dataclasses.replace(
        trial.sweep, pool_fit=dataclasses.replace(trial.sweep.pool_fit, held_bytes=grown,
                                                  cache_rejected=rejected)))
    if grown:  # what the fit's steps left behind is held, as the sweep's residue is
        trial = dataclasses.replace(trial, held=dataclasses.replace(
            trial.held, consumed_bytes=trial.held.consumed_bytes + grown))
        answer = decide(trial)
    if refused:  # on every rank alike, whichever rank's plan did not fit
        if answer.budget.error is None:
            answer = dataclasses.replace(answer, budget=dataclasses.replace(
                answer.budget, error=DoesNotFit(
                    "another rank's worst step fitted to the KV pool does not fit (its log "
                    "says why)")))
        log.error("[wcprof] %s", core.fit_line(trial.sweep))
        return trial, answer
    log.info("[wcprof] %s", core.fit_line(trial.sweep))
    return trial, answer


def _cached_readings_hold(driver, worst: Shape, taken: list[StepResult], tolerance: int,
                          agree: Callable[[int], int], attribute: bool
                          ) -> tuple[bool, str | None]:
    """(whether the cached readings the fitted plan admits with stand, the admitted worst step's
    op): of the readings taken, the largest by need and the largest by peak (what the admitted
    transient is set by), measured again now on every rank (the same shapes: the taken figures
    are agreed) and each judged by core/cache_trust.reading_holds, need and peak; the worst step
    attributed to its op where it is one of them."""
    by_need = max(taken, key=lambda r: (r.need_bytes, r.peak_bytes))
    by_peak = max(taken, key=lambda r: (r.peak_bytes, r.need_bytes))
    top = None
    with driver.provisional_kv():
        for cached in dict.fromkeys((by_need, by_peak)):
            named = attribute and cached.shape == worst and worst.kind != "stock"
            now = driver.measure(cached.shape, attribute=named)
            if agree(int(not reading_holds(cached.need_bytes, now.need_bytes, tolerance)
                         or not reading_holds(cached.peak_bytes, now.peak_bytes, tolerance))):
                log.warning("[wcprof] the cached pool fit's step %s needs %s now, %s when cached: "
                            "its readings are not reused, the fit measures them now",
                            cached.shape.label(), fmt_bytes(now.need_bytes),
                            fmt_bytes(cached.need_bytes))
                return False, None
            if cached.shape == worst:
                top = now.top_op or cached.top_op
    return True, top


def _rounds(driver, facts: Measured, decided: Decided, decide: Callable[[Measured], Decided],
            agree: Callable[[int], int], known: Mapping[Shape, StepResult], floor: int,
            known_pool: int | None = None):
    """fit_to_pool's rounds: (the last round's (facts, decision) or None where the sweep's plan
    stands, every reading by shape, the shapes whose reading was taken from `known`, whether
    the first round did not fit on some rank (the start is refused on all), the shapes that
    round's plan counts). With the entry's pool taken (_entry_pool), one round at it, kept
    where its transient leaves this start a pool within one rounding step below it
    (core/cache.within_one_step: further below, the larger plan would cost it more KV than its
    own fit); else, and where that round does not fit (a step the larger pool's plan holds need
    not be one this pool forms, so its refusal would not be this start's), its own rounds."""
    limits, bpt, sweep = facts.limits, facts.bytes_per_token, facts.sweep
    blocks = dict(bytes_per_token=bpt, pool_block_bytes=facts.pool_block_bytes,
                  block_size=limits.block_size)

    def usable(budget_bytes: int) -> int:  # every rank plans for the largest pool any rank has
        return agree(core.usable_tokens(budget_bytes, **blocks))

    readings: dict[Shape, StepResult] = {}
    reused: set[Shape] = set()
    skipped: dict[Shape, str] = {}
    best: tuple[Measured, Decided] | None = None
    counted: tuple[Shape, ...] = ()
    tokens = usable(decided.budget.budget_bytes)
    entry_pool = _entry_pool(limits, sweep, tokens, known, known_pool, agree, driver=driver)
    if entry_pool is not None:
        log.info("[wcprof] pool fit: this start's budget leaves %d tokens, below the %d the "
                 "cached fit planned for; planning for those (their plan bounds every step the "
                 "smaller pool forms), every reading from the cache", tokens, entry_pool)
        tokens = entry_pool
    for rounds in range(1, ROUNDS + 1):
        fitted = core.replan(limits, sweep.coverage.worst_rows, tokens)
        if fitted is None or (best is None and sweep.worst.shape not in fitted.dropped):
            break
        with driver.provisional_kv():
            for shape in fitted.added:
                if shape in readings or shape in skipped:
                    continue
                if agree(int(shape not in known)) == 0:  # every rank has it: not measured
                    r = known[shape]
                    readings[shape] = dataclasses.replace(
                        r, peak_bytes=agree(r.peak_bytes), workspace_bytes=agree(r.workspace_bytes))
                    reused.add(shape)
                    continue
                why = cannot_build(driver, shape)
                if why is not None:
                    skipped[shape] = why
                else:
                    readings[shape] = driver.measure(shape)
        refit = core.refit(sweep, limits, fitted,
                           [readings[s] for s in fitted.added if s in readings],
                           allocator_slack=facts.allocator_slack_bytes, rounds=rounds,
                           skipped=[(s, skipped[s]) for s in fitted.added if s in skipped],
                           ran=readings.values(), floor=floor, reused=len(reused))
        trial = dataclasses.replace(facts, limits=fitted.limits, sweep=refit)
        answer = decide(trial)
        refused = agree(int(answer.budget.error is not None))
        if entry_pool is not None:  # one round: the allocation is held at that pool or below
            left = usable(answer.budget.budget_bytes)
            if not refused and within_one_step(left, entry_pool):
                return (trial, answer), readings, reused, False, fitted.added
            log.info("[wcprof] pool fit: the plan for the cached fit's pool (%d tokens) %s: "
                     "this start's own rounds run", entry_pool, "does not fit" if refused else
                     f"leaves this start {left} tokens, more than one rounding step below it")
            return _rounds(driver, facts, decided, decide, agree, known, floor)  # this pool's
        if refused:
            if best is None:  # its readings are steps the unfitted pool forms too: refused
                return (trial, answer), readings, reused, True, fitted.added
            break
        best, counted = (trial, answer), fitted.added
        # the pool this round's transient leaves under the sweep's own plan
        left = usable(decide(dataclasses.replace(
            facts, sweep=dataclasses.replace(refit, pool_fit=None))).budget.budget_bytes)
        if rounds == 1:  # next: where the pool left meets the pool planned
            nxt = core.whole_blocks(core.next_pool(limits.kv_capacity_tokens, tokens, left),
                                    **blocks)
            if nxt <= tokens:
                break  # this transient leaves no more than the pool planned
            tokens = nxt
        elif left >= tokens:
            break  # the allocation is this plan's pool: its worst step is one that pool forms
        else:
            tokens = left  # the line overshot: settle where this transient leaves the pool
    return best, readings, reused, False, counted


def _entry_pool(limits, sweep, tokens: int, known: Mapping[Shape, StepResult],
                known_pool: int | None, agree: Callable[[int], int], *, driver=None
                ) -> int | None:
    """The pool the entry's fit planned for, where this start plans for it instead of its own
    `tokens` (its first round's pool): every rank has it (the same value), it lies above `tokens`
    and below the sweep's planned pool, its plan drops the sweep's worst step (a fit was needed
    there too), and every shape that plan adds is known on every rank or one `driver` cannot
    build (core/sweep.cannot_build: skipped in the round as in the entry's own fit, which has
    no reading of it either; no driver: every shape needs a reading). Else None (the rounds
    plan for `tokens`), and where the entry had a pool, the log says why it was not taken.
    Whether its transient leaves this start a pool near it is _rounds' check, once it is
    decided."""
    if limits.kv_capacity_tokens is None:  # agreed limits: the same on every rank
        if known_pool is not None:
            _not_taken(known_pool, "the sweep planned for no pool")
        return None
    have = known_pool if known_pool is not None and known else None
    if agree(int(have is None)):
        if known_pool is not None:
            _not_taken(known_pool, "the entry holds no readings" if not known else
                       "another rank's entry holds no fitted pool")
        return None
    pool = agree(have)
    if agree(int(pool != have)):
        _not_taken(have, "the ranks' entries planned for different pools")
        return None
    if not tokens < pool < limits.kv_capacity_tokens:  # tokens is agreed: every rank alike
        _not_taken(pool, f"this start's first round plans for {tokens} tokens and the sweep for "
                         f"{limits.kv_capacity_tokens}: it must lie between")
        return None
    fitted = core.replan(limits, sweep.coverage.worst_rows, pool)
    unknown = [] if fitted is None else [
        s for s in fitted.added if s not in known and cannot_build(driver, s) is None]
    ok = fitted is not None and sweep.worst.shape in fitted.dropped and not unknown
    if agree(int(not ok)) == 0:
        return pool
    _not_taken(pool, "another rank could not take it" if ok else
               "no plan for it" if fitted is None else
               f"its plan adds {len(unknown)} shape(s) the entry has no reading of (first: "
               f"{unknown[0].label()})" if unknown else "its plan keeps the sweep's worst step")
    return None


def _not_taken(pool: int, why: str) -> None:
    log.info("[wcprof] pool fit: the cached fit's pool (%d tokens) is not taken: %s", pool, why)
