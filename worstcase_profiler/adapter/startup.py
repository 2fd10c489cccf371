"""The worker's start-up, hook by hook: measure, let the core decide, record, apply.

  determine_available_memory  measure_start (vLLM's own profile, the worst-case sweep or a
                              cached sweep's replay, the warm-up reserve, every workspace slot
                              reserved, what the process holds) -> core.budget.decide (admission,
                              advice, budget) -> recorded and reported -> apply_budget: the bytes
                              vLLM allocates the KV cache from.
  initialize_from_config      what KV initialisation allocated, against that budget.
  after_warm_up               what warm-up kept, against what admission set aside; the workspace
                              locked.

Each hook records one frozen phase result in the worker's StartupSession (core/session.py) and
writes the report once (report.build_report). Decisions are the core's (core/budget.py,
core/admission.py, core/audits.py, core/cache_trust.py, core/replay_rules.py,
core/sweep_depth.py); the sweep cache's flow is adapter/sweep_cache.py's; this module measures and
applies.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import functools
import gc
import logging
import os
import sys
from typing import NamedTuple

from ..core import budget
from ..core import chunk_cap as core_cap
from ..core import pool_fit as core_fit
from ..core.advise import knee_line
from ..core.audits import (capture_warmup_verdict, concurrency_note, kv_audit_error,
                           kv_audit_verdict, warmup_to_remember, warmup_verdict, with_startup)
from ..core.cache_trust import held_moved_text, reuse_consumed
from ..core import check_steps
from ..core.check_steps import CheckStep
from ..core.multimodal import (EncoderStep, MultimodalFacts, beside, encoder_line,
                               need as encoder_need, unprofiled_note)
from ..core.replay_rules import plan_agreement
from ..core import shapes
from ..core.cache import CacheEntry, pool_capacity_tokens, pool_reuse
from ..core.session import StartupSession
from ..core.shapes import Limits, plan_fingerprint
from ..core.sweep import (cannot_build, prove_cut_down, run_cut_down, run_self_checked,
                          run_sweep, stock_readings)
from ..core.sweep_depth import cut_to_prefix, sweep_depth
from ..core.timing import PhaseTimer
from ..core.types import (CacheUse, CutDownProof, HeldMemory, ProfileResult, StepResult,
                          SweepResult, WarmupEstimate, WarmupResult, Workspace)
from ..errors import ConfigError, DoesNotFit, WcprofError
from ..report import build_report
from ..settings import ProfilerSettings
from ..sizes import fmt_bytes, fmt_deltas
from . import kv as kvmod
from . import advice, chunk_cap, fitting, guard, pool_fit, sampler_buffers, sweep_cache, warmup
from . import multimodal as mm
from . import workspace as ws
from .facts import (agree_max_fn, cudagraph_applied, engine_facts, limits_of, requested_bytes,
                    sibling_hits_serialize, stock_rerun_why, world_rank)
from .meters import device_bytes_held, exact, gc_frozen, meter_for, non_torch, reserved_bytes
from .runner import V1Driver, is_v2_runner
from .runner_v2 import V2Driver

log = logging.getLogger("vllm.wcprof")

SESSION_ATTR = "_wcprof_session"  # the one attribute the profiler keeps on a vLLM worker


def session_of(worker, settings: ProfilerSettings | None = None) -> StartupSession | None:
    """This worker's session; created on the first hook (settings given), None before."""
    session = getattr(worker, SESSION_ATTR, None)
    if session is None and settings is not None:
        runner_kind = "v2" if is_v2_runner(worker.model_runner) else "v1"
        session = StartupSession(settings, engine_facts(worker, runner_kind), created_at=now())
        # vllm-touch: worker-session
        setattr(worker, SESSION_ATTR, session)
    return session


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


# --- determine_available_memory ------------------------------------------------------------

class StartMeasurement(NamedTuple):
    """What measure_start found: the decision's facts, and what the report records beside them."""

    facts: budget.Measured
    cache: CacheUse
    proof: CutDownProof | None
    multimodal: MultimodalFacts | None = None
    """A model with a multimodal encoder: its limits (adapter/multimodal.facts_of)."""
    encoder: EncoderStep | None = None
    """The encoder step measured in the sweep, where it ran."""
    encoder_why_not: str = ""
    """Why no encoder step was measured, for a model with a multimodal encoder."""
    checks: tuple[CheckStep, ...] = ()
    """The steps named in check_steps, measured beside the sweep."""
    floor: int = 0
    """The transient the pool fit never admits less than: the encoder step's and the check
    steps' predictions (steps outside the sweep's plan that any pool forms)."""
    driver: object = None
    """The step driver the sweep ran on (the pool fit measures on it)."""
    held: object = None
    """held(phase): what the process holds now, timed as that phase."""
    capture_warmup: tuple[int, tuple[int, int]] | None = None
    """The widest graph capture's eager warm-up, metered apart from vLLM's profile: (its
    transient, (tokens, requests)); None where not metered (eager, a cached start, V1)."""
    cached_fit: sweep_cache.CachedFit | None = None
    """Pool-fit readings a trusted cache entry gives (sweep_cache.reusable_pool_fit)."""


def determine_available_memory(worker, original, settings: ProfilerSettings) -> int:
    """vLLM's budget hook: measure this start, let the core decide, record, then apply: the
    bytes vLLM allocates the KV cache from. Refused (raised) with the decision's error or the
    ranks' disagreement on the plan, after the report is written."""
    session = session_of(worker, settings)
    measured = measure_start(worker, original, settings, session)
    decide = functools.partial(budget.decide, mode=settings.mode,
                               margin_bytes=settings.margin_bytes,
                               kv_cap_bytes=settings.kv_cap_bytes,
                               advise_within=settings.advise_within,
                               context_ladder=settings.context_ladder,
                               fit_min_concurrency=settings.fit_min_concurrency,
                               fit_objective=settings.fit_objective,
                               auto_max_model_len=settings.auto_max_model_len)
    decided = decide(measured.facts)
    cached = measured.cached_fit
    with session.clock("pool_fit"), gc_frozen():  # the worst step fitted to the pool it leaves
        facts, decided = pool_fit.fit_to_pool(
            measured.driver, measured.facts, decided, decide, mode=settings.mode,
            agree_max=agree_max_fn(), held=measured.held, attribute=settings.attribute_ops,
            floor=measured.floor, known=cached.readings if cached else None,
            known_held=cached.held_bytes if cached else 0,
            known_pool=cached.pool_tokens if cached else None)
    for note in decided.warnings:
        session.warn(note)
        log.warning("[wcprof] %s", note)
    for check in measured.checks:  # against the figure admitted after the pool fit
        log.info("[wcprof] %s", check_steps.line(check, facts.sweep.peak_bytes))
    capture_error = None
    if measured.capture_warmup is not None:
        over = capture_warmup_verdict(
            transient=measured.capture_warmup[0], shape=measured.capture_warmup[1],
            admitted=decided.admission.transient_bytes, margin=facts.tolerance_bytes,
            slack=facts.allocator_slack_bytes)
        if over is not None:
            session.warn(over)
            log.warning("[wcprof] %s", over)
            if settings.mode == "enforce":  # and the sweep just cached is not reused
                if measured.cache.status == "stored":
                    sweep_cache.forget(measured.cache)
                capture_error = DoesNotFit(over, hint=(
                    "lower --max-num-seqs or -cc.max_cudagraph_capture_size (the warm-up's "
                    "requests and tokens), or start with --enforce-eager"))
    agree = agree_max_fn()
    if agree is not None and agree(int(capture_error is not None)) and capture_error is None:
        capture_error = DoesNotFit("another rank's graph-capture warm-up needs more than the "
                                   "worst case admits (its log says how much)")
    fit = facts.sweep.pool_fit
    if fit is not None and capture_error is None and decided.budget.error is None:
        with session.clock("cache_store"):  # a restart fits without measuring them again
            sweep_cache.remember_pool_fit(measured.cache, core_fit.kept_readings(facts.sweep),
                                          fit.held_bytes, pool_tokens=fit.pool_tokens,
                                          replace=fit.cache_rejected)
    if (note := unprofiled_note(measured.multimodal, measured.encoder,
                                measured.encoder_why_not)) is not None:
        session.warn(note)  # never a silent figure: the multimodal limits not covered
        log.warning("[wcprof] %s", note)
    if (line := knee_line(decided.advice)) is not None:
        log.info("[wcprof] %s", line)
    if decided.fit is not None:
        log.info("[wcprof] fit (%s, at least %d request(s) at full length): %s",
                 decided.fit.objective, decided.fit.min_concurrency,
                 " ".join(decided.fit.flags) or "no candidate holds them")
    if decided.fit is not None and decided.fit.applied_why is not None:
        (log.info if decided.fit.applied_max_model_len else log.error)(
            "[wcprof] %s", decided.fit.applied_why)
    sweep = facts.sweep
    with session.clock("plan_check"):
        fingerprints = gather_plan_fingerprints(
            (*sweep.steps, *(sweep.pool_fit.steps if sweep.pool_fit else ())))
    session.record_profile(ProfileResult(
        sweep=sweep, cache=measured.cache, workspace=facts.workspace, warmup=facts.warmup,
        held=facts.held, admission=decided.admission, budget=decided.budget,
        plan_fingerprints=tuple(fingerprints), sweep_mode=facts.sweep_mode,
        advice=decided.advice, cut_down_proof=measured.proof, fit=decided.fit,
        encoder=measured.encoder, chunk_cap=decided.chunk_cap, check_steps=measured.checks))
    write_report(session)
    error = plan_agreement(fingerprints, rank=session.facts.rank,
                           steps=len(sweep.steps)) or decided.budget.error or capture_error
    if error is not None:
        raise error
    if decided.chunk_cap is not None:
        chunk_cap.publish(worker.vllm_config, core_cap.as_pairs(decided.chunk_cap.plan.levels),
                          session.facts.rank)
    return apply_budget(worker, sweep, decided)


def apply_budget(worker, sweep: SweepResult, decided: budget.Decided) -> int:
    """The decided budget, returned to vLLM; vLLM's own suggestion log and startup plan read
    the two worker attributes set here, so they say the same."""
    adm = decided.admission
    # vllm-touch: worker-budget-attrs
    worker.peak_activation_memory = adm.transient_bytes
    worker.available_kv_cache_memory_bytes = decided.budget.budget_bytes
    kv = (f"worst-case KV {fmt_bytes(adm.budget_bytes)}"
          if adm.explicit_kv_cache_memory_bytes is None else
          f"explicit KV {fmt_bytes(adm.kv_cache_bytes)} kept (the worst case admits up to "
          f"{fmt_bytes(adm.budget_bytes)})")
    log.info("[wcprof] stock KV %s (peak %s) -> %s (peak %s at %s%s); "
             "recommended --kv-cache-memory-bytes %d", fmt_bytes(adm.stock_kv_cache_bytes),
             fmt_bytes(sweep.stock.peak_bytes), kv,
             fmt_bytes(adm.transient_bytes), sweep.worst.shape.label(),
             f", op {sweep.worst_op}" if sweep.worst_op else "",
             adm.recommended_kv_cache_memory_bytes)
    return decided.budget.budget_bytes


def measure_start(worker, original, settings: ProfilerSettings,
                  session: StartupSession) -> StartMeasurement:
    """Everything the decision reads, measured in one pass with the heap frozen: vLLM's own
    profile (the stock figure), the worst-case sweep or a cached sweep's replay, the encoder
    step and the steps named in check_steps, the advisor's steps, the warm-up reserve, every
    workspace slot reserved, and what the process then holds."""
    clock = session.clock
    # vllm-touch: worker-config
    vllm_config = worker.vllm_config
    runner = worker.model_runner
    explicit = vllm_config.cache_config.kv_cache_memory_bytes
    meter = meter_for(getattr(worker, "device", "cpu"))
    cuda = meter.device_kind == "cuda"
    agree_fn = agree_max_fn()
    agree = agree_fn or (lambda v: v)

    # A cached sweep decides how much of the start is measured (ranks agree: captures run
    # collectives). Its planned KV pool is checked once vLLM's own figure is known.
    limits = limits_of(vllm_config, worker.model_runner)
    chunk_cap.check_supported(settings, vllm_config, cuda=cuda)
    check_steps.check_formable(settings.check_steps, limits)  # before anything runs
    if settings.check_steps and settings.chunk_cap is not None:
        raise ConfigError("worstcase_profiler: check_steps with chunk_cap: the cap clamps a "
                          "step's rows at long context, so a named step may never form as named",
                          hint="drop one of them")
    with clock("cache_lookup"):  # the cap resizes the workspace: its starts are not cached
        handle, entry = (None, None) if settings.chunk_cap is not None else \
            sweep_cache.lookup(worker, session.facts, limits, settings)
    entry = _agreed_entry(entry, agree, handle)  # every rank calls it
    graphs_on = cuda and not vllm_config.model_config.enforce_eager
    with contextlib.ExitStack() as frozen:
        # vLLM's own profile gives stock's figure (its CUDA-graph estimate too: the stock KV
        # figure is stock's). On a first start its estimator captures every graph, once, for
        # the warm-up reserve (rehearse_warm_up) where it can, else they are captured apart.
        with warmup.one_capture_profile(worker, enabled=graphs_on, exact=entry is None) \
                as profiled, mm.counting_encoder(runner) as stock_encoder:
            stock_kv = profile_on_frozen_heap(frozen, lambda: int(original(worker)), cuda=cuda,
                                              clock=clock)
        if cuda:
            log_vllm_profile(worker, stock_kv)
        mm_facts = mm.facts_of(worker, stock_encoder.calls)
        # vLLM's profile resolved the graph mode against the attention backends (it may lower
        # it, and with it add a compile warm-up): read the rerun question again from what it
        # settled (warm_up asks once more before vLLM's warm-up runs)
        limits = dataclasses.replace(limits, stock_reruns_with_kv=stock_rerun_why(
            vllm_config, runner) is not None)
        bpt = kvmod.bytes_per_token(runner)
        limits = pool_limits(worker, limits, explicit, stock_kv, bpt, agree_fn,
                             kv_cap=settings.kv_cap_bytes)
        own_pool = limits.kv_capacity_tokens  # above a kept plan's, the KV is held at that
        if entry is not None:
            limits, entry = _cached_pool(
                limits, entry, agree, handle.cache.path(handle.key),
                holdable=can_hold(explicit, settings.mode))
        driver = make_driver(worker, limits, meter, agree_fn)
        for rows, ctx in settings.check_steps:  # before the sweep: refused, never left out
            if (why := cannot_build(driver, check_steps.shape_of(rows, ctx))) is not None:
                raise ConfigError(f"check step {rows}@{ctx} cannot be built here: {why}",
                                  hint="drop it from check_steps")
        tolerance = settings.tolerance_bytes if settings.tolerance_bytes is not None \
            else meter.resolution_bytes
        def held(phase: str) -> int:  # logged: where a phase leaves memory held shows
            now = device_bytes_held(worker, meter, clock=clock, phase=phase)
            log.info("[wcprof] held at %s: %s (torch allocated %s, reserved %s)", phase,
                     fmt_bytes(now), fmt_bytes(meter.in_use()), fmt_bytes(reserved_bytes(meter)))
            return now

        if cuda:  # a buffer vLLM keeps from its first top-k batch: held from here on
            with clock("sampler_buffers"):
                sampler_buffers.make_topk_topp_buffer(worker)
        with clock("measure_baseline"):
            baseline = held("measure_baseline")
        sweep, use, entry, sweep_mode, proof = sweep_cache.sweep_or_reuse(
            driver, limits, tolerance, clock, handle, entry,
            full_sweep=lambda: _full_sweep(driver, limits, settings, tolerance, clock))
        if use.status == "hit" and limits.kv_capacity_tokens != own_pool:  # the report says so
            use = dataclasses.replace(use, planned_pool_tokens=limits.kv_capacity_tokens,
                                      start_pool_tokens=own_pool)
        encoder, encoder_why_not = None, ""
        if mm_facts is not None and mm_facts.modalities:
            held("sweep.after")
            with clock("encoder_step"):  # every start: it is not kept in the sweep cache
                encoder, encoder_why_not = mm.encoder_step(driver, mm_facts, sweep.worst.shape)
            held("encoder_step.after")
        checks = measure_check_steps(driver, settings.check_steps, clock,
                                     getattr(meter, "allocator_slack_bytes", 0))
        measured_advice = advice.measure(driver, limits, sweep, settings, clock)  # wcprof --advise
        measured_fit = fitting.measure(driver, limits, sweep, measured_advice, settings,
                                       clock)  # wcprof fit
        measured_cap = chunk_cap.measure(driver, limits, sweep, settings, clock)
        capture_warmup = None
        if entry is None and cuda:
            estimate, graphs = rehearse_warm_up(worker, driver, held, clock, graphs_on,
                                                profiled)
            if graphs.capture_warmup_bytes is not None:
                capture_warmup = (graphs.capture_warmup_bytes, graphs.capture_warmup_shape)
        else:
            estimate = cached_warmup(worker, entry)
        with clock("workspace_grow"):
            workspace = reserve_workspace(entry.workspace_slot_bytes if entry else 0)
            cap_plan = None
            if measured_cap is not None:
                cap_plan = core_cap.decide(
                    limits, sweep, measured_cap,
                    workspace_bytes=workspace.total_bytes,
                    context_ladder=settings.context_ladder,
                    cut_down=str(sweep_mode).startswith("cut-down"),
                    allocator_slack=getattr(meter, "allocator_slack_bytes", 0))
                workspace = chunk_cap.size_workspace(workspace, cap_plan)
        with clock("measure_held"):
            held_now = held("measure_held")
            # a cached start's consumed figure is the cached one: the note is a first start's
            kept_free = max(0, reserved_bytes(meter) - meter.in_use()) \
                if cuda and entry is None else 0
    consumed = held_now
    if entry is not None:  # a cached start: the full sweep's residue, the same answer as then
        consumed, kept = reuse_consumed(baseline_now=baseline,
                                        cached_baseline=entry.baseline_bytes,
                                        cached_consumed=entry.consumed_bytes,
                                        replay_residue=held_now - baseline,
                                        resolution=meter.resolution_bytes)
        use = dataclasses.replace(use, held_moved_bytes=baseline - entry.baseline_bytes,
                                  held_kept=kept)
        if use.held_moved_bytes:
            log.info("[wcprof] sweep reused: %s", held_moved_text(use.held_moved_bytes, use.held_kept))
    elif handle is not None:
        with clock("cache_store"):
            use = sweep_cache.store_entry(handle, use, sweep, workspace, baseline, held_now,
                                          estimate, limits.kv_capacity_tokens, sweep_mode,
                                          created_at=now(), warn=session.warn, proof=proof)
    held_memory = HeldMemory(requested_bytes=requested_bytes(worker),
                             consumed_bytes=consumed + sweep.post_profile_bytes,
                             # vllm-touch: worker-config
                             weights_bytes=int(getattr(runner, "model_memory_usage", 0) or 0),
                             non_torch_bytes=non_torch(meter, held_now),
                             residue_bytes=max(0, consumed - held_now))
    # the admitted transient holds the encoder step and the named steps too (the cache keeps
    # the text sweep): one floor, which a pool fit holds as well
    slack = getattr(meter, "allocator_slack_bytes", 0)
    encoder = beside(sweep.peak_bytes, encoder, slack, named=check_steps.floor(checks))
    if encoder is not None:
        log.info("[wcprof] %s", encoder_line(encoder))
    floor = check_steps.floor(checks, encoder_need(encoder, slack))
    admitted = check_steps.admit(sweep, floor)  # a step measured beside counts like any other
    if cap_plan is not None and admitted.peak_bytes > sweep.peak_bytes:  # the encoder step's
        cap_plan = dataclasses.replace(   # text step is uncapped: the cap credits nothing of it
            cap_plan, transient_bytes=max(cap_plan.transient_bytes, admitted.peak_bytes),
            uncapped_transient_bytes=admitted.peak_bytes)
    facts = budget.Measured(
        limits=limits, sweep=admitted, held=held_memory, workspace=workspace, warmup=estimate,
        stock_kv_bytes=stock_kv, bytes_per_token=bpt,
        one_request_bytes=kvmod.one_request_bytes(runner, vllm_config), explicit_kv_bytes=explicit,
        tolerance_bytes=tolerance, sweep_mode=sweep_mode,
        allocator_slack_bytes=getattr(meter, "allocator_slack_bytes", 0),
        advice_measurements=measured_advice, device_kind=meter.device_kind,
        fit_measurements=measured_fit, device_total_bytes=session.facts.device.total_bytes,
        gpu_memory_utilization=session.facts.config.gpu_memory_utilization,
        pool_block_bytes=kvmod.pool_block_bytes(runner) if bpt else None,
        chunk_cap_measurements=measured_cap, chunk_cap_plan=cap_plan,
        alloc_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF", os.environ.get("PYTORCH_ALLOC_CONF")),
        allocator_kept_free_bytes=kept_free, start_pool_tokens=own_pool)
    return StartMeasurement(facts=facts, cache=use, proof=proof, multimodal=mm_facts,
                            encoder=encoder, encoder_why_not=encoder_why_not, checks=checks,
                            floor=floor, driver=driver,
                            held=held, capture_warmup=capture_warmup,
                            cached_fit=sweep_cache.reusable_pool_fit(use, entry))


def measure_check_steps(driver, steps: tuple[tuple[int, int], ...], clock,
                        allocator_slack: int) -> tuple[CheckStep, ...]:
    """The steps named in check_steps (core/check_steps.py), each on the full model on a
    provisional KV cache of its own, at every start (the sweep cache does not keep them); the
    caller refused any this runner cannot build before the sweep."""
    if not steps:
        return ()
    out = []
    with clock("check_steps"), driver.provisional_kv():
        for rows, ctx in steps:
            shape = check_steps.shape_of(rows, ctx)
            out.append(CheckStep.of(shape, driver.measure(shape), allocator_slack))
    return tuple(out)


def _agreed_entry(entry: CacheEntry | None, agree, handle) -> CacheEntry | None:
    """This rank's entry where every rank found one, else None on every rank: whether a start is
    cached decides its collectives (vLLM's profile captures every graph only on a first start),
    so no rank may go on with an entry another rank lacks. Every rank calls it."""
    if agree(int(entry is None)) and entry is not None:
        log.info("[wcprof] cached sweep %s: another rank has no entry: running the full sweep",
                 handle.cache.path(handle.key))
        return None
    return entry


def can_hold(explicit: int | None, mode: str) -> bool:
    """Whether this start's KV cache can be held at a cached plan's smaller pool
    (budget.planned_pool): not with an explicit KV size, which vLLM gets as given, nor in report
    mode, which hands vLLM its own figure."""
    return explicit is None and mode == "enforce"


def _cached_pool(limits: Limits, entry: CacheEntry, agree, path, *,
                 holdable: bool) -> tuple[Limits, CacheEntry | None]:
    """(limits, the entry or None): the
    cached sweep's plan kept where core/cache.pool_reuse says it stands for this start's pool
    (`holdable`: can_hold's answer for this start), the limits then carrying its pool; else
    None, and the sweep runs again for this start's own pool. Every rank calls it (each holds
    an entry: the caller agreed on that), and they agree: each keeps its entry, all with one
    planned pool, or none does."""
    reuse = pool_reuse(entry.capacity_tokens, limits.kv_capacity_tokens, can_hold=holdable)
    planned = -1 if entry.capacity_tokens is None else int(entry.capacity_tokens)
    refused, lowest, highest = agree(int(not reuse.usable)), -agree(-planned), agree(planned)
    if refused or lowest != highest:
        why = reuse.why if not reuse.usable else (
            "another rank's entry planned for another pool" if lowest != highest
            else "another rank cannot keep its entry")
        log.info("[wcprof] cached sweep %s: %s: running the full sweep", path, why)
        return limits, None
    if reuse.plan_tokens == limits.kv_capacity_tokens:
        return limits, entry
    log.info("[wcprof] cached sweep %s: %s%s", path, reuse.why,
             " (delete the entry for a sweep of this start's own pool)" if reuse.hold else "")
    return dataclasses.replace(limits, kv_capacity_tokens=reuse.plan_tokens), entry


def pool_limits(worker, limits: Limits, explicit: int | None, stock_kv: int, bpt: int,
                agree_fn, kv_cap: int | None = None) -> Limits:
    """The engine's `limits`, bounded by the KV pool: what the scheduler can form is bounded by
    what can be resident at once. The pool planned is vLLM's own budget (or the explicit size),
    at most `kv_cap`; the admission never gives the engine more than it (budget.decide holds a
    budget that would come out larger, as where the stock step is left out). Windowed groups keep part of each request, and requests on one
    cached prefix may share a step only on hits of their own; a recurrent state holds 1 + k
    blocks of each request in each Mamba group (k speculative, 0 without a drafter); every rank
    plans the same."""
    # vllm-touch: worker-config
    vllm_config = worker.vllm_config
    runner = worker.model_runner
    if bpt:
        limits = dataclasses.replace(limits, kv_capacity_tokens=pool_capacity_tokens(
            explicit_bytes=explicit, stock_kv_bytes=stock_kv,
            graph_estimate_bytes=cudagraph_applied(worker), bytes_per_token=bpt,
            max_model_len=limits.max_model_len, kv_cap_bytes=kv_cap),
            # sliding-window / chunked-local groups keep a window of each request, not all
            full_request_tokens=kvmod.full_request_tokens(runner, bpt, limits.max_model_len,
                                                          limits.block_size),
            # a recurrent state: 1 + k blocks of every request in each Mamba group (k = 0
            # without a drafter)
            state_request_tokens=kvmod.state_request_tokens(runner, bpt))
        if limits.state_request_tokens:
            log.info("[wcprof] the recurrent state holds 1 + k blocks of each request in each "
                     "Mamba group, k its speculative blocks (%d KV tokens of the pool): one at "
                     "max_model_len "
                     "holds %d, so up to %s of them sit at the full extent at once",
                     limits.state_request_tokens, limits.tokens_per_full_request,
                     limits.max_resident_requests)
        if limits.full_request_tokens is not None:
            log.info("[wcprof] windowed KV groups keep only part of each request: one at "
                     "max_model_len holds %d KV tokens of the pool (not %d), so up to %s of "
                     "them sit at the full extent at once", limits.tokens_per_full_request,
                     limits.rounded_model_len, limits.max_resident_requests)
        if limits.prefix_caching and sibling_hits_serialize(vllm_config):
            limits = dataclasses.replace(
                limits, prefix_request_tokens=kvmod.prefix_request_tokens(runner, bpt))
            log.info("[wcprof] requests on one cached prefix share a prefill step only on "
                     "hits of their own here: each owns %d KV tokens, so at most %d of them "
                     "share one at the full extent", limits.prefix_request_tokens,
                     limits.max_distinct_hit_requests)
    if agree_fn is not None:  # one plan on every rank (pipeline-parallel ranks differ)
        limits = shapes.agreed(limits, agree_fn)
    return limits


def rehearse_warm_up(worker, driver, held, clock: PhaseTimer, graphs_on: bool,
                     profiled: warmup.GraphMeasure | None = None
                     ) -> tuple[WarmupEstimate, warmup.GraphMeasure]:
    """A CUDA start's warm-up reserve where no cached entry gives it (a first start, or one
    whose entry was dropped: capacity, stale replay, dominance): CUDA graphs as measured in
    vLLM's profile's one capture of every graph (`profiled`, warmup.one_capture_profile), else
    apart from it (measure_graphs; or, on V2 runners without an estimator, by the rehearsal),
    so vLLM's sampled figure, or 0 B where the KV size is given, is never the reserve; plus
    what vLLM's warm-up, rehearsed on a provisional KV cache, kept that goes away with that
    cache (it returns after the real one). What it kept beyond the provisional
    cache stays, and is in the held memory. Ranks agree on calling it (the captures run
    collectives): they agreed on the entry."""
    graphs = profiled if profiled is not None and profiled.bytes is not None else \
        measure_graphs(worker, graphs_on, clock)
    # vllm-touch: worker-warm-up
    original = type(worker).compile_or_warm_up_model
    original = getattr(original, "_wcprof_original", original)
    with clock("warmup_rehearsal"):
        before = held("warmup_rehearsal.before")
        with driver.provisional_kv():
            rehearsal = warmup.rehearse(worker, lambda: original(worker),
                                        lambda: held("warmup_rehearsal.kept"), graphs=graphs_on)
        survived = held("warmup_rehearsal.after") - before
    other = max(0, rehearsal.kept_bytes - max(0, survived) - rehearsal.graphs_bytes)
    graph_bytes = graphs.bytes if graphs.bytes is not None else rehearsal.graphs_bytes
    if graphs_on and graphs.bytes is None and not rehearsal.graphs_bytes:
        graph_bytes = cudagraph_applied(worker)  # vLLM's own figure, checked by the audit
    log.info("[wcprof] warm-up rehearsed in %.1fs: it keeps %s of CUDA graphs and %s of other "
             "buffers beyond the KV cache%s; %s stayed held once its provisional KV cache was "
             "freed", rehearsal.seconds, fmt_bytes(graph_bytes),
             fmt_bytes(other), "" if rehearsal.transient_bytes is None else
             f"; its steps needed {fmt_bytes(rehearsal.transient_bytes)} above what they kept",
             fmt_bytes(max(0, survived)))
    return WarmupEstimate(graphs_bytes=graph_bytes, other_bytes=other, source="rehearsal"), graphs


def make_driver(worker, limits: Limits, meter, agree_max=None):
    """The step driver over this worker's model runner: V2 (vllm/v1/worker/gpu/) or V1."""
    runner = worker.model_runner
    cls = V2Driver if is_v2_runner(runner) else V1Driver
    return cls(runner, limits, meter, agree_max)


def profile_on_frozen_heap(stack: contextlib.ExitStack, run_profile, *, cuda: bool,
                           clock: PhaseTimer) -> int:
    """Run vLLM's own profile (`run_profile`, returns its KV figure) and leave the heap frozen in
    `stack` until it closes, i.e. until the held-memory measurement.

    Every collection on a frozen heap (the KV teardowns, the measurements) walks only the
    objects made since instead of the whole process (0.3-0.5 s each on a vLLM process). vLLM's
    CUDA profile collects fully twice itself (memory_profiling): the heap is frozen before it,
    after one collection of ours, so those become cheap too and no garbage is frozen. A profile
    that unfreezes the whole heap on its way out (vLLM 0.26 V1's profile_cudagraph_memory ends
    in gc.unfreeze(); gc.collect()) is followed by a second freeze: nothing it froze is garbage.
    The CPU profile collects nothing: the freeze starts after it."""
    if cuda:
        with clock("heap_freeze"):
            gc.collect()
        stack.enter_context(gc_frozen())
    with clock("vllm_profile"):
        stock_kv = run_profile()
    if cuda:
        gc.freeze()  # again, in case the profile unfroze; gc_frozen's exit unfreezes it all
    else:
        stack.enter_context(gc_frozen())
    return stock_kv


def log_vllm_profile(worker, stock_kv: int) -> None:
    """Log the parts of vLLM's own KV figure as its profile left them on the worker: what the
    engine consumed by the profile's end (mem_get_info, from the worker's start), the transient
    headroom above it, and the CUDA-graph estimate it subtracted. A reading for the log (the
    stock KV figure of a first start and a restart can be compared part by part); never
    raises, and logs nothing where the worker has no such figures. CUDA only."""
    # vllm-touch: worker-config
    try:
        consumed = int(worker.total_consumed)
        graphs = cudagraph_applied(worker)
        transient = int(worker.peak_activation_memory) - graphs
        requested = requested_bytes(worker)
    except (AttributeError, TypeError, ValueError, WcprofError):
        return
    log.info("[wcprof] vLLM's profile: requested %s; consumed %s by its end, transient %s above "
             "it, CUDA graphs %s -> stock KV %s (%s unaccounted)", fmt_bytes(requested),
             fmt_bytes(consumed), fmt_bytes(transient), fmt_bytes(graphs), fmt_bytes(stock_kv),
             fmt_bytes(requested - consumed - transient - graphs - stock_kv))


def measure_graphs(worker, graphs_on: bool, clock: PhaseTimer) -> warmup.GraphMeasure:
    """The exact CUDA-graph memory (warmup.measure_graphs_apart) where graphs are on, timed as
    the profiler's own phase `graph_measure`. The heap is frozen again after it: the estimator
    may unfreeze it as vLLM's profile may (0.26 V1)."""
    if not graphs_on:
        return warmup.GraphMeasure()
    with clock("graph_measure"):
        graphs = warmup.measure_graphs_apart(worker, enabled=True)
    gc.freeze()
    return graphs


def _tp_size(driver) -> int:
    """The engine's tensor-parallel size, from the runner's config (1 when unknown)."""
    # vllm-touch: worker-config
    cfg = getattr(getattr(driver, "runner", None), "vllm_config", None)
    return int(getattr(getattr(cfg, "parallel_config", None), "tensor_parallel_size", 1) or 1)


def _full_sweep(driver, limits: Limits, settings: ProfilerSettings, tolerance: int,
                clock: PhaseTimer) -> tuple[SweepResult, str, CutDownProof | None]:
    """(the sweep, its mode line, the cut-down proof or None): cut down when sweep_depth
    says so and the model can be cut, both when it says prove (the full one admitted), else on
    the full model."""
    model = getattr(driver, "model", None)
    model_class = f"{type(model).__qualname__}" if model is not None else ""
    eager = functools.cache(lambda: _runs_eagerly(driver))  # it walks the model: once
    mode, why = sweep_depth(settings.sweep_depth, model_class, eager=eager,
                            graphs=getattr(driver, "graph_ranges", lambda: None),
                            device_kind=_device_kind(driver.meter), runner=driver.runner_kind,
                            tensor_parallel_size=_tp_size(driver))
    log.info("[wcprof] worst-case sweep: rows 1..%d at KV extent %d, %s runner; %s",
             limits.max_num_batched_tokens, limits.max_model_len, driver.runner_kind, why)
    progress = SweepProgress(settings, limits.max_num_batched_tokens)
    slack = getattr(driver.meter, "allocator_slack_bytes", 0)
    kw = dict(tolerance=tolerance, exhaustive=settings.exhaustive,
              context_ladder=settings.context_ladder, attribute_ops=settings.attribute_ops,
              on_step=progress, allocator_slack=slack)
    proof = None
    try:
        with clock("sweep"), gc_frozen():
            sweep = None
            if mode in ("cut-down", "prove", "self-check"):
                prefix = cut_to_prefix(mode, model_class, lambda: not eager())
                try:
                    _can_cut(driver, prefix=prefix)
                except ValueError as e:  # the model cannot be cut: say so, sweep it whole
                    why = f"full: the model cannot be cut down ({e})"
                    log.info("[wcprof] %s", why)
                else:
                    if mode == "prove":  # the meter's own spread, never the chord tolerance
                        sweep, proof = prove_cut_down(
                            driver, resolution=max(driver.meter.resolution_bytes, slack), **kw)
                        why = f"full; cut-down beside it ({proof.depth}): {proof.verdict}"
                        log.info("[wcprof] cut-down proof: %s", _proof_line(proof))
                    elif mode == "self-check":
                        sweep, why, proof = run_self_checked(
                            driver, resolution=max(driver.meter.resolution_bytes, slack),
                            stock_readings=stock_readings(driver), **kw)
                        log.info("[wcprof] cut-down self-check: %s", _proof_line(proof))
                    else:
                        sweep, why = run_cut_down(driver, prefix=prefix, **kw)
            if sweep is None:
                sweep = run_sweep(driver, **kw, stock_readings=stock_readings(driver))
    finally:
        progress.close()
    log.info("[wcprof] sweep: %d steps in %.1fs (stock step %.2fs)", progress.count,
             sweep.seconds, sweep.stock.seconds)
    return sweep, why, proof


def _proof_line(p: CutDownProof) -> str:
    if p.full_worst is None:  # a self-check that kept the cut-down sweep: no full sweep ran
        return (f"{p.verdict}: worst {p.cut_worst.label()} (cut-down), peak "
                f"{fmt_bytes(p.confirmed_peak_bytes)} confirmed, admitted "
                f"{fmt_bytes(p.cut_admitted_bytes)}, full minus cut-down {fmt_deltas(p.deltas)}, "
                f"{p.cut_seconds:.1f}s{_split_line(p.seconds_split)}")
    return (f"{p.verdict}: worst {p.full_worst.label()} (full) / {p.cut_worst.label()} "
            f"(cut-down), peak {fmt_bytes(p.full_peak_bytes)} / {fmt_bytes(p.confirmed_peak_bytes)} "
            f"confirmed, admitted {fmt_bytes(p.full_admitted_bytes)} / "
            f"{fmt_bytes(p.cut_admitted_bytes)}, {p.full_seconds:.1f}s / {p.cut_seconds:.1f}s"
            f"{_split_line(p.seconds_split)}")


def _split_line(split: dict[str, float]) -> str:
    """' (cut decoder 0.4s, full model 9.8s, eager re-reads 9.1s)': the cut-down sweep's parts
    (a fallback's full sweep is the line's own figure), or '' with no split."""
    parts = ", ".join(f"{k.replace('_', ' ').replace('rereads', 're-reads')} {v:.1f}s"
                      for k, v in split.items() if k != "full_sweep")  # shown as full_seconds
    return f" ({parts})" if parts else ""


def _runs_eagerly(driver) -> bool:
    """Whether the decoder's forward runs as Python (no torch.compile graph)."""
    from .runner import decoder_cut, runs_compiled

    try:
        decoder_cut(driver.model)
    except ValueError as e:
        return "compiled" not in str(e)
    return not runs_compiled(driver.model)


def _can_cut(driver, prefix: bool) -> None:
    """Raises ValueError naming why the model cannot be cut down (runner.decoder_cut)."""
    from .runner import decoder_cut

    decoder_cut(driver.model, prefix=prefix)


def _device_kind(meter) -> str:
    """The meter's device kind; ROCm builds of torch report their devices as cuda."""
    kind = meter.device_kind
    if kind == "cuda":
        import torch

        if getattr(torch.version, "hip", None):
            return "rocm"
    return kind


def reserve_workspace(at_least: int) -> Workspace:
    """Every WorkspaceManager slot grown to the largest any slot reached (or `at_least`, what a
    cached sweep's slots reached: a replay runs one step)."""
    mgr = ws.manager()
    if mgr is None:
        return Workspace()
    slots = ws.grow_all_slots(mgr, at_least=at_least)
    return Workspace(slots=tuple(slots), total_bytes=ws.total_bytes(mgr))


def cached_warmup(worker, entry: CacheEntry | None) -> WarmupEstimate:
    """A start that does not rehearse warm-up (a cached start, or the CPU): what an earlier start
    of this configuration measured warm-up keeping, or vLLM's own CUDA-graph estimate, whichever
    is larger."""
    est = cudagraph_applied(worker)
    cached = entry.warmup if entry is not None else WarmupEstimate()
    if cached.total_bytes > est:
        return dataclasses.replace(cached, source="cache")
    return WarmupEstimate(graphs_bytes=est, other_bytes=0, source="vllm-estimate" if est else "none")


def gather_plan_fingerprints(steps: tuple[StepResult, ...]) -> list[str]:
    """Every rank's plan_fingerprint of its executed steps, indexed by rank (all-gathered over
    the world group's CPU group; one entry without distributed state)."""
    mine = plan_fingerprint([s.shape for s in steps])
    try:
        from vllm.distributed import get_world_group  # vllm-touch: world-group

        group = get_world_group()
        world_size = int(group.world_size)
    except Exception:  # noqa: BLE001 - no distributed state (CLI tests): one rank
        return [mine]
    if world_size <= 1:
        return [mine]
    import torch
    import torch.distributed as dist

    mine_t = torch.tensor(list(mine.encode("ascii")), dtype=torch.uint8)
    gathered = [torch.empty_like(mine_t) for _ in range(world_size)]
    dist.all_gather(gathered, mine_t, group=group.cpu_group)
    return [bytes(t.tolist()).decode("ascii") for t in gathered]


class SweepProgress:
    """A live progress line on a terminal (steps done, the step that ran, the worst so far), one
    log line per step otherwise. The step count is not known up front: bisection decides it."""

    def __init__(self, settings: ProfilerSettings, rows_max: int):
        self.count = 0
        self.worst = 0
        self._enabled = settings.progress
        self._bar = None
        if self._enabled and sys.stderr.isatty() and world_rank() == 0:
            from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self._bar = Progress(SpinnerColumn(), TextColumn("[bold]wcprof sweep[/] {task.description}"),
                                 TimeElapsedColumn(), transient=True)
            self._task = self._bar.add_task(f"rows 1..{rows_max}", total=None)
            self._bar.start()

    def __call__(self, result: StepResult) -> None:
        self.count += 1
        self.worst = max(self.worst, result.need_bytes)
        if self._bar is not None:
            self._bar.update(self._task, description=f"step {self.count}: {result.shape.label()} "
                             f"-> {fmt_bytes(result.need_bytes)} (worst {fmt_bytes(self.worst)})")
        elif self._enabled:
            log.info("[wcprof] step %d: %s -> %s in %.2fs", self.count, result.shape.label(),
                     fmt_bytes(result.need_bytes), result.seconds)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


# --- initialize_from_config ----------------------------------------------------------------

def initialize_from_config(worker, original, kv_cache_config, settings: ProfilerSettings):
    session = session_of(worker)
    meter = meter_for(getattr(worker, "device", "cpu"))
    clock = session.clock if session is not None else PhaseTimer()
    before = meter.consumed()
    with clock("vllm_kv_init"):
        result = original(worker, kv_cache_config)
    if session is None or session.profile is None:
        return result
    if meter.device_kind == "cuda":
        with clock("measure_after_kv"):
            # measure_held collected fully after the sweep; only KV init's objects are new.
            session.measurements["after_kv"] = device_bytes_held(
                worker, meter, gc_generation=1, clock=clock, phase="measure_after_kv")
    if settings.kv_audit == "off":
        return result
    with clock("kv_audit"):
        budget_bytes = session.profile.budget.budget_bytes
        groups, allowed, allocated = kvmod.allocation(worker.model_runner, kv_cache_config,
                                                      budget_bytes)
        audit = kv_audit_verdict(groups, budget=budget_bytes, allowed=allowed,
                                 delta_process=meter.consumed() - before, allocated=allocated)
    session.record_kv_audit(audit)
    if audit.verdict != "ok" and settings.kv_audit == "warn":
        session.warn(audit.message)
    note = concurrency_note(**kvmod.request_floor(kv_cache_config),
                            max_num_seqs=int(worker.vllm_config.scheduler_config.max_num_seqs))
    if note is not None:
        session.warn(note)
        log.warning("[wcprof] %s", note)
    write_report(session)
    error = kv_audit_error(audit, settings.kv_audit)
    if error is not None:
        raise error
    (log.info if audit.verdict == "ok" else log.warning)("[wcprof] %s", audit.message)
    return result


# --- compile_or_warm_up_model --------------------------------------------------------------

def warm_up(worker, original, settings: ProfilerSettings, *args, **kwargs):
    """vLLM's warm-up, metered (its high-water mark beside the KV cache, and that mark when graph
    capture began and when it ended) with what CUDA-graph capture kept measured, then the
    warm-up audit. The meter never fails the start: an unreadable meter leaves no figure."""
    import time

    session = session_of(worker)
    if session is not None and (refused := _rerun_since_the_plan(worker, session, settings)):
        write_report(session)  # the report says why before vLLM's start ends
        raise refused
    t0 = time.perf_counter()
    with warmup.metered(worker, enabled=session is not None, meter_for=meter_for) as reading, \
            _recording_capture(worker, session, reading):
        out = original(worker, *args, **kwargs)
    if session is not None and reading.bytes is not None:
        session.measurements["startup_peak"] = reading.peak
        session.measurements["startup_transient"] = reading.bytes
    after_warm_up(worker, settings, time.perf_counter() - t0)
    return out


def _rerun_since_the_plan(worker, session: StartupSession, settings: ProfilerSettings):
    """Where the worst case left vLLM's profile step out (no warm-up was to run it beside the KV
    cache), the same question asked of the config vLLM resolved at KV initialisation (graph mode
    and capture sizes), before its warm-up runs. A warm-up that now reruns it: the error to
    raise under enforce (the KV cache is sized without it), a warning otherwise; else None."""
    prof = session.profile
    if prof is None or not prof.sweep.stock_excluded:
        return None
    # vllm-touch: worker-config
    why = stock_rerun_why(worker.vllm_config, getattr(worker, "model_runner", None))
    if why is None:
        return None
    mode = getattr(worker.vllm_config.compilation_config, "cudagraph_mode", None)
    note = (f"the worst case left vLLM's profile step out ({prof.sweep.stock_excluded}), but "
            f"the config vLLM resolved at KV initialisation (graph mode "
            f"{getattr(mode, 'name', mode)}) runs it beside the KV cache: {why}")
    hint = ("start again with that graph mode set (-cc.cudagraph_mode=...) so the plan reads it, "
            "or with --enforce-eager")
    session.warn(note)
    log.warning("[wcprof] %s (%s)", note, hint)
    return ConfigError(note, hint=hint) if settings.mode == "enforce" else None


@contextlib.contextmanager
def _recording_capture(worker, session: StartupSession | None, reading=None):
    """Wrap the runner's capture_model for the warm-up: the free device memory it consumed is
    what the graphs kept (measured like the held memory: synchronised, allocator cache emptied),
    and the warm-up meter's mark (`reading`, a warmup.MeterReading) when the first capture began
    and when the last one returned (session.measurements["startup_before_capture"] and
    ["startup_after_capture"]): what ran before, during and after capture."""
    runner = getattr(worker, "model_runner", None)
    original = getattr(runner, "capture_model", None)
    if session is None or original is None or meter_for(getattr(worker, "device", "cpu")).device_kind != "cuda":
        yield
        return

    def mark(name: str, first_only: bool) -> None:
        value = reading.mark() if reading is not None else None
        if value is not None and not (first_only and name in session.measurements):
            session.measurements[name] = value

    def capture_model(*args, **kwargs):
        mark("startup_before_capture", first_only=True)
        before = warmup.free_bytes_emptied()
        out = original(*args, **kwargs)
        session.measurements["graphs"] = session.measurements.get("graphs", 0) + \
            max(0, before - warmup.free_bytes_emptied())
        mark("startup_after_capture", first_only=False)
        return out

    # vllm-touch: runner-capture-model
    with warmup.replaced(runner, "capture_model", capture_model):
        yield


def after_warm_up(worker, settings: ProfilerSettings, warm_up_seconds: float = 0.0) -> None:
    session = session_of(worker)
    if session is None or session.profile is None:
        return
    clock = session.clock
    clock.add("vllm_warm_up", warm_up_seconds)
    prof = session.profile
    audit = error = None
    after_kv = session.measurements.get("after_kv")
    if after_kv is not None:
        with clock("warmup_audit"):
            meter = meter_for(getattr(worker, "device", "cpu"))
            resident = max(0, device_bytes_held(worker, meter) - int(after_kv))
            graphs = int(session.measurements.get("graphs", 0))
            cached = prof.cache.status in ("stored", "hit")
            residue = prof.held.residue_bytes
            audit, error = warmup_verdict(
                resident=resident, graphs=min(graphs, resident),
                accounted=prof.admission.cudagraph_bytes, margin=settings.margin_bytes,
                mode=settings.mode, kv_cache_bytes=prof.admission.kv_cache_bytes, cached=cached,
                residue=residue, spare=prof.admission.budget_bytes - prof.admission.kv_cache_bytes)
            remember = warmup_to_remember(
                resident=resident, graphs=graphs, reserve=prof.admission.cudagraph_bytes,
                residue=residue, ok=audit.verdict == "ok", exact=exact(meter))
            startup = session.measurements.get("startup_transient")
            if startup is not None:
                audit, over = with_startup(
                    audit, peak=int(session.measurements["startup_peak"]), transient=int(startup),
                    before_capture=session.measurements.get("startup_before_capture"),
                    after_capture=session.measurements.get("startup_after_capture"),
                    predicted=prof.admission.transient_bytes,
                    resolution=int(meter.resolution_bytes))
                if over is not None:
                    session.warn(over)
                    log.warning("[wcprof] %s", over)
            if cached and remember is not None:
                sweep_cache.remember_warmup(prof.cache, remember)
        if audit.verdict != "ok" and error is None:
            session.warn(audit.message)
        (log.info if audit.verdict == "ok" else log.warning)("[wcprof] %s", audit.message)
    if error is not None:
        session.record_warmup(WarmupResult(audit=audit))
        write_report(session)
        raise error
    locked, grown = False, 0
    mgr = ws.manager()
    if mgr is not None and settings.lock_workspace and settings.mode == "enforce":
        # Warm-up may have grown a slot after the budget was fixed: say so, loudly.
        grown = max(0, ws.total_bytes(mgr) - prof.workspace.total_bytes)
        if grown:
            session.warn(f"workspace grew by {fmt_bytes(grown)} during warm-up, after the KV budget")
            log.warning("[wcprof] %s", session.phases.warnings[-1])
        ws.lock(mgr)
        locked = True
        log.info("[wcprof] workspace locked at %s per slot; growth now raises an error naming the "
                 "caller", fmt_bytes(max(ws.slot_sizes(mgr), default=0)))
    session.record_warmup(WarmupResult(audit=audit, workspace_locked=locked,
                                       workspace_grown_bytes=grown))
    write_report(session)
    guard.install(worker, session, settings)  # the serving guard (under vllm serve)


# --- the report ----------------------------------------------------------------------------

def write_report(session: StartupSession) -> None:
    """The report of the phases so far, at the session's json_path (rank r > 0 writes
    PATH.rank<r>.json); atomically, so a reader never sees half of it."""
    path = session.settings.json_path
    if not path:
        return
    from ..render.json_report import JsonReporter

    with session.clock("report_write"):
        report = build_report(session, created_at=session.created_at)
        if report.rank:
            root, ext = os.path.splitext(path)
            path = f"{root}.rank{report.rank}{ext or '.json'}"
        JsonReporter().write(report, path)
    # The operator of `vllm serve` reads the log: say where the report is, once per file (later
    # phases rewrite it in place; the report says which phases it holds). wcprof's own report
    # is a temporary file it copies to --json: naming it there would point at a file that goes.
    if path not in _REPORTS_LOGGED and guard.under_api_server():
        _REPORTS_LOGGED.add(path)
        log.info("[wcprof] report written to %s (rewritten in place as the start goes on; "
                 "`wcprof render %s` shows it)", os.path.abspath(path), path)


_REPORTS_LOGGED: set[str] = set()
