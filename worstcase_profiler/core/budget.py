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

from .admission import compute_admission, decide_budget, host_memory_note
from .advise import DEFAULT_WITHIN, advise
from ..errors import DoesNotFit
from .fit import FitFacts, apply_longest, fit
from .shapes import Limits
from .types import (Admission, Advice, AdviceMeasurements, BudgetDecision, Fit, FitMeasurements,
                    HeldMemory, SweepResult, WarmupEstimate, Workspace)


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


@dataclass(frozen=True)
class Decided:
    admission: Admission
    budget: BudgetDecision
    advice: Advice | None = None
    fit: Fit | None = None
    warnings: tuple[str, ...] = ()
    """What the report's warnings carry (admission.host_memory_note)."""


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
    admission = compute_admission(
        requested=m.held.requested_bytes, consumed=m.held.consumed_bytes,
        weights=m.held.weights_bytes, non_torch=m.held.non_torch_bytes,
        worst_transient=sweep.peak_bytes, stock_need=sweep.stock.need_bytes,
        stock_kv=m.stock_kv_bytes, cudagraph=m.warmup.total_bytes, margin=margin_bytes,
        bytes_per_token=m.bytes_per_token, block_size=limits.block_size,
        max_model_len=limits.max_model_len, one_request=m.one_request_bytes,
        explicit_kv=m.explicit_kv_bytes, noise=m.tolerance_bytes,
        pool_block_bytes=m.pool_block_bytes,
        # The stock-OOM question is about everything non-KV a step needs, workspace included.
        context_curve=[(r.shape.context_len, r.need_bytes) for r in sweep.context_curve])
    advice = None
    if m.advice_measurements is not None:
        advice = advise(limits, sweep, held=m.held, admission=admission, workspace=m.workspace,
                        measured=m.advice_measurements, within=advise_within,
                        context_ladder=context_ladder,
                        cut_down=str(m.sweep_mode).startswith("cut-down"),
                        allocator_slack=m.allocator_slack_bytes)
    fitted = None
    max_model_len, refusal = limits.max_model_len, None
    if m.fit_measurements is not None:
        facts = FitFacts(limits=limits, sweep=sweep, held=m.held, admission=admission,
                         workspace=m.workspace, measured=m.fit_measurements, advice=advice,
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
    budget = decide_budget(admission, mode=mode, kv_cap=kv_cap_bytes,
                           worst_label=sweep.worst.shape.label(),
                           max_model_len=max_model_len)
    if refusal is not None and mode == "enforce":
        budget = replace(budget, error=refusal)
    note = host_memory_note(device_kind=m.device_kind, explicit_kv=m.explicit_kv_bytes,
                            admission=admission)
    return Decided(admission=admission, budget=budget, advice=advice, fit=fitted,
                   warnings=(note,) if note else ())
