"""The start's decision, pure: what measuring a start found (`Measured`) and the settings in,
the admission, the chunk advice and the budget vLLM allocates the KV cache from out.

The budget hook (adapter/startup.determine_available_memory) reads:

    measured = measure_start(...)                 # the adapter: sweep or cached replay, warm-up,
    decided = budget.decide(measured.facts, ...)  #   workspace, held memory
    ...record, report, apply decided.budget

so everything between the measurement and the figure vLLM receives is here and tested without
a worker (tests/unit/test_budget.py). No vLLM, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import dataclasses

from .admission import (allocator_note, compute_admission, decide_budget, host_memory_note,
                        kv_tokens, least_of)
from .advise import DEFAULT_WITHIN, advise
from ..errors import DoesNotFit
from .chunk_cap import tokens_per_s
from .fit import FitFacts, apply_longest, fit
from ..sizes import MiB
from .pool_fit import pool_ceiling_bytes
from .shapes import Limits
from .types import (Admission, Advice, AdviceMeasurements, BudgetDecision, ChunkCap,
                    ChunkCapMeasurements, ChunkCapPlan, Fit, FitMeasurements, HeldMemory,
                    SweepResult, WarmupEstimate, Workspace)


@dataclass(frozen=True)
class Measured:
    """Everything one start measured that the decision reads."""

    limits: Limits
    """The plan's limits, the KV pool's capacity included (adapter/startup.pool_limits)."""
    sweep: SweepResult
    """The worst-case sweep, or the cached one whose worst step was replayed now."""
    held: HeldMemory
    """What the process holds once the sweep ran and every workspace slot is reserved."""
    workspace: Workspace
    warmup: WarmupEstimate
    """What warm-up will keep once the budget is fixed (graphs and other buffers)."""
    stock_kv_bytes: int
    """What vLLM's own profile would give the KV cache."""
    bytes_per_token: int
    one_request_bytes: int
    """KV bytes one request at max_model_len needs, every KV group counted."""
    explicit_kv_bytes: int | None
    """--kv-cache-memory-bytes, when given."""
    tolerance_bytes: int
    """The meter's resolution (or the tolerance setting): what the stock-OOM question forgives."""
    sweep_mode: str = "full"
    allocator_slack_bytes: int = 0
    advice_measurements: AdviceMeasurements | None = None
    """The advisor's steps (None unless the advise setting is on)."""
    device_kind: str = "cuda"
    """The meter's device: on the CPU the budget follows the host's free memory."""
    fit_measurements: FitMeasurements | None = None
    """The fit's own steps (None unless the fit setting is on)."""
    device_total_bytes: int = 0
    """The device's size (host memory on the CPU): what --gpu-memory-utilization is a share of."""
    gpu_memory_utilization: float | None = None
    """The share of it this engine runs with."""
    pool_block_bytes: int | None = None
    """One block of vLLM's KV pool as its plan lays it out (the null block its block pool holds
    back); None: one block of every attention layer (bytes_per_token x block_size)."""
    chunk_cap_measurements: ChunkCapMeasurements | None = None
    """The chunk cap's steps (None unless the chunk_cap setting is on)."""
    chunk_cap_plan: ChunkCapPlan | None = None
    """The cap the adapter decided from them (core/chunk_cap.decide); `held` and `workspace`
    then count the capped workspace it sized."""
    alloc_conf: str | None = None
    """PYTORCH_CUDA_ALLOC_CONF (or PYTORCH_ALLOC_CONF) as the engine's process saw it: on CUDA,
    without expandable segments, the report says what the admission does not bound
    (admission.allocator_note)."""
    allocator_kept_free_bytes: int = 0
    """CUDA: what torch's caching allocator reserved beyond its live tensors when the held memory
    was read (after emptying its cache): segments it could not release, counted as held."""
    start_pool_tokens: int | None = None
    """This start's own KV pool bound (kv_capacity_tokens' unit, pool_limits'). Above `limits`'
    (a cached sweep's smaller plan, core/cache.pool_reuse's hold), the KV cache is held at the
    plan's pool (planned_pool). None: not known (the plan's is this start's)."""


@dataclass(frozen=True)
class Decided:
    admission: Admission
    budget: BudgetDecision
    advice: Advice | None = None
    fit: Fit | None = None
    warnings: tuple[str, ...] = ()
    """What the report's warnings carry (admission.host_memory_note, allocator_note)."""
    chunk_cap: ChunkCap | None = None
    """The chunk cap's record; `admission` is then the capped one."""
    predicted_transient_bytes: int | None = None
    """The transient the admission left room for (the guard's prediction)."""


def decide(m: Measured, *, mode: str, margin_bytes: int, kv_cap_bytes: int | None = None,
           advise_within: float = DEFAULT_WITHIN, context_ladder: bool = True,
           fit_min_concurrency: int = 1, fit_objective: str = "context",
           auto_max_model_len: bool = False) -> Decided:
    """Admission from the measured facts, the advice over the advisor's measurements (when
    there are any), the fit over the fit's (when there are any: core/fit.py, from the same
    admission and advice), the budget decision (admission.decide_budget: enforce, report,
    kv_cap), and the warnings the report carries (on the CPU, a budget that follows free host
    memory).

    auto_max_model_len (the setting max_model_len: auto): the swept max_model_len is an upper
    bound; the fit weighed over max_model_len alone picks the longest feasible one
    (fit.apply_longest), whose admission is the one decided, and the fit records it
    (applied_max_model_len, applied_why). No length fits, or no fit ran: refused in enforce
    mode, never a start at a length nobody weighed."""
    sweep, limits = m.sweep, m.limits
    cap = m.chunk_cap_plan
    held, workspace = m.held, m.workspace
    if cap is not None:  # without the cap the sweep's grown workspace would be held
        grown = cap.uncapped_workspace_bytes - m.workspace.total_bytes
        held = dataclasses.replace(held, consumed_bytes=held.consumed_bytes + grown)
        workspace = dataclasses.replace(workspace, total_bytes=cap.uncapped_workspace_bytes)
    admission = _admit(m, held, sweep.peak_bytes, margin_bytes)
    advice = None
    if m.advice_measurements is not None:
        advice = advise(limits, sweep, held=held, admission=admission, workspace=workspace,
                        measured=m.advice_measurements, within=advise_within,
                        context_ladder=context_ladder,
                        cut_down=str(m.sweep_mode).startswith("cut-down"),
                        allocator_slack=m.allocator_slack_bytes)
    fitted = None
    max_model_len, refusal = limits.max_model_len, None
    if m.fit_measurements is not None:
        facts = FitFacts(limits=limits, sweep=sweep, held=held, admission=admission,
                         workspace=workspace, measured=m.fit_measurements, advice=advice,
                         cut_down=str(m.sweep_mode).startswith("cut-down"),
                         allocator_slack=m.allocator_slack_bytes,
                         device_total_bytes=m.device_total_bytes,
                         gpu_memory_utilization=m.gpu_memory_utilization)
        fitted = fit(facts, min_concurrency=fit_min_concurrency, objective=fit_objective)
        if auto_max_model_len:
            applied = apply_longest(
                facts, fitted, min_concurrency=fit_min_concurrency, noise=m.tolerance_bytes,
                context_curve=[(r.shape.context_len, r.need_bytes) for r in sweep.context_curve])
            fitted, refusal = applied.fit, applied.error
            if applied.admission is not None:
                admission, max_model_len = applied.admission, fitted.applied_max_model_len
    elif auto_max_model_len:
        refusal = DoesNotFit(
            "max_model_len auto: the fit's steps did not run at this start (the log says why), "
            "so no max_model_len was weighed",
            hint="pass --max-model-len N (`wcprof fit` names one) and drop max_model_len: auto")
    capped = None
    if cap is not None:
        uncapped = admission
        admission = _admit(m, m.held, cap.transient_bytes, margin_bytes)
        capped = cap_record(m, cap, admission, uncapped, advice)
    ceiling = planned_pool(m, cap)
    budget = decide_budget(admission, mode=mode, kv_cap=kv_cap_bytes,
                           worst_label=(cap.worst_shape if cap else sweep.worst.shape).label(),
                           max_model_len=max_model_len, pool_ceiling=ceiling)
    if cap is None:  # the chunk cap's own record says what its budgets hold
        admission = held_at_pool(admission, fitted_pool(m) or ceiling, m)
    if refusal is not None and mode == "enforce":
        budget = replace(budget, error=refusal)
    notes = (host_memory_note(device_kind=m.device_kind, explicit_kv=m.explicit_kv_bytes,
                              admission=admission),
             allocator_note(device_kind=m.device_kind, alloc_conf=m.alloc_conf,
                            kept_free=m.allocator_kept_free_bytes))
    return Decided(admission=admission, budget=budget, advice=advice, fit=fitted,
                   warnings=tuple(n for n in notes if n), chunk_cap=capped,
                   predicted_transient_bytes=admission.transient_bytes)


def planned_pool(m: Measured, cap: ChunkCapPlan | None) -> int | None:
    """The KV pool the sweep planned its shapes for, where the admission could exceed it, else
    None. The plan takes vLLM's own budget as an upper bound on the pool (pool_limits), which
    holds while the admitted transient is at least stock's: where the stock step is left out
    (SweepResult.stock_excluded) or the chunk cap admits less, a larger budget would hold more
    requests at once than any planned step has. A sweep fitted to a smaller pool
    (SweepResult.pool_fit, core/pool_fit.py) plans for that pool: `limits` then carry it. A
    cached sweep planned for a smaller pool than this start's (Measured.start_pool_tokens) holds
    the admission at its plan's pool too; one planned for a larger pool (`limits` carry it) needs
    no hold: with the stock step counted the admission stays within this start's stock figure,
    below the plan's pool, and otherwise it is held at the plan's pool as above. Not with an
    explicit KV size (the plan's)."""
    tokens = m.limits.kv_capacity_tokens
    fitted = m.sweep.pool_fit is not None  # the worst step fitted to a pool: held at it
    smaller = tokens is not None and (m.start_pool_tokens or 0) > tokens  # a cached plan's
    if m.explicit_kv_bytes is not None or not tokens or not (m.sweep.stock_excluded or cap
                                                               or fitted or smaller):
        return None
    if fitted:  # the fitted plan's pool is the usable one: its whole blocks and the null block
        return fitted_pool(m)
    return tokens * m.bytes_per_token


def fitted_pool(m: Measured) -> int | None:
    """The allocation whose usable pool is the one the worst step was fitted to
    (SweepResult.pool_fit), an explicit KV size's included; None without a fit."""
    if m.sweep.pool_fit is None or not m.limits.kv_capacity_tokens:
        return None
    return pool_ceiling_bytes(m.limits.kv_capacity_tokens, bytes_per_token=m.bytes_per_token,
                              pool_block_bytes=m.pool_block_bytes, block_size=m.limits.block_size)


def held_at_pool(adm: Admission, ceiling: int | None, m: Measured) -> Admission:
    """The admission with its KV cache and recommended flag held at `ceiling` (the fitted pool,
    or planned_pool) where that is below them, never below the least KV cache vLLM starts with
    (as decide_budget allocates): a larger cache, passed back as --kv-cache-memory-bytes or
    checked with `wcprof check`, would hold wider steps than the plan measured. The budget
    arithmetic (budget_bytes) stays as it adds up; an explicit size is the user's and stays the
    KV cache given, its recommended flag held like any other."""
    if ceiling is None:
        return adm
    ceiling = max(ceiling, least_of(adm))
    if ceiling >= max(adm.budget_bytes, 0):
        return adm
    kv = adm.kv_cache_bytes if adm.explicit_kv_cache_memory_bytes is not None \
        else min(adm.kv_cache_bytes, ceiling)
    return dataclasses.replace(
        adm, pool_ceiling_bytes=ceiling, kv_cache_bytes=kv,
        kv_tokens_worstcase=kv_tokens(kv, m.bytes_per_token, m.limits.block_size),
        recommended_kv_cache_memory_bytes=min(adm.recommended_kv_cache_memory_bytes,
                                              max((ceiling // MiB) * MiB, least_of(adm))))


def _admit(m: Measured, held: HeldMemory, transient: int, margin_bytes: int) -> Admission:
    sweep, limits = m.sweep, m.limits
    return compute_admission(
        requested=held.requested_bytes, consumed=held.consumed_bytes,
        weights=held.weights_bytes, non_torch=held.non_torch_bytes,
        worst_transient=transient, stock_need=sweep.stock.need_bytes,
        stock_kv=m.stock_kv_bytes, cudagraph=m.warmup.total_bytes, margin=margin_bytes,
        bytes_per_token=m.bytes_per_token, block_size=limits.block_size,
        max_model_len=limits.max_model_len, one_request=m.one_request_bytes,
        explicit_kv=m.explicit_kv_bytes, noise=m.tolerance_bytes,
        pool_block_bytes=m.pool_block_bytes,
        # The stock-OOM question is about everything non-KV a step needs, workspace included.
        context_curve=[(r.shape.context_len, r.need_bytes) for r in sweep.context_curve])


def cap_record(m: Measured, cap: ChunkCapPlan, capped: Admission, uncapped: Admission,
               advice: Advice | None) -> ChunkCap:
    """The chunk cap's record: both budgets from this start's sweep (the tokens each holds, in
    whole blocks, whatever KV size is given explicitly), the timed prefill steps at long
    context, and the advisor's static choice beside them."""
    block = m.limits.block_size

    def tokens(budget: int) -> int:
        return kv_tokens(max(budget, 0), m.bytes_per_token, block)

    timings = m.chunk_cap_measurements.timings if m.chunk_cap_measurements else ()
    rate = [tokens_per_s(t) for t in timings] + [None, None]
    lost = 1 - rate[0] / rate[1] if rate[0] and rate[1] else None
    static = advice.candidate(advice.knee_chunk) if advice is not None else None
    measured = m.chunk_cap_measurements
    return ChunkCap(
        plan=cap, budget_bytes=capped.budget_bytes, uncapped_budget_bytes=uncapped.budget_bytes,
        kv_tokens=tokens(capped.budget_bytes), uncapped_kv_tokens=tokens(uncapped.budget_bytes),
        gained_bytes=capped.budget_bytes - uncapped.budget_bytes,
        gained_tokens=tokens(capped.budget_bytes) - tokens(uncapped.budget_bytes),
        capped_prefill_tokens_per_s=rate[0], uncapped_prefill_tokens_per_s=rate[1],
        prefill_throughput_lost=lost,
        static_chunk=static.chunk if static else None,
        static_kv_tokens=static.kv_tokens if static else None,
        static_prefill_tokens_per_s=static.prefill_tokens_per_s if static else None,
        steps=(*measured.steps, *measured.timings) if measured else (),
        seconds=measured.seconds if measured else 0.0)
