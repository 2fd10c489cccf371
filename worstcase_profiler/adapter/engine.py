"""The worker-side flow, called by the patches in patches.py:

  determine_available_memory: stock figure (vLLM's own method) -> worst-case sweep -> grow every
      workspace slot -> read what the process holds -> admission -> report; returns the budget.
  initialize_from_config:     audit the KV the engine actually allocated against that budget.
  compile_or_warm_up_model:   audit what warm-up kept (CUDA graphs); lock the workspace; write the
      JSON.
What the worker is lives in engine_facts.py; the sweep, fresh or reused across starts, in
sweeping.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import os

from .. import __version__
from ..admission import compute_admission, kv_tokens
from ..cache import round_capacity_up
from ..errors import DoesNotFit, KVOvercommit, WcprofError
from ..meters import gc_frozen, meter_for
from ..report import Report, RunnerInfo
from ..settings import ProfilerSettings
from ..sizes import fmt_bytes
from ..timing import PhaseTimer
from . import kv as kvmod
from . import workspace as ws
from .engine_facts import (agree_max_fn, attention_backends, cudagraph_applied,
                           device_bytes_held, device_info, engine_config, limits_of, non_torch,
                           requested_bytes, world_rank)
from .runner import is_v2_runner, make_driver
from .sweeping import AFTER_KV_ATTR, audit_warm_up, cached_warmup, now, sweep_or_reuse
from .versions import vllm_version

log = logging.getLogger("vllm.wcprof")

REPORT_ATTR = "_wcprof_report"
BUDGET_ATTR = "_wcprof_budget"
TIMER_ATTR = "_wcprof_timer"


def timer_of(worker) -> PhaseTimer:
    """This worker's start-up phase timer (report.startup_seconds)."""
    timer = getattr(worker, TIMER_ATTR, None)
    if timer is None:
        timer = PhaseTimer()
        setattr(worker, TIMER_ATTR, timer)
    return timer


def _check_same_plan(report: Report, settings: ProfilerSettings) -> None:
    """Prove every rank executed the same synthetic steps in the same order: all-gather the
    plan_fingerprint of the executed step shapes over the world group's CPU group, store every
    rank's fingerprint (indexed by rank) in the report, and fail closed naming the ranks that
    disagree (after writing this rank's report, so the mismatch can be read back)."""
    from ..shapes import plan_fingerprint

    wc = report.worstcase
    mine = plan_fingerprint([s.shape for s in wc.steps])
    fingerprints = [mine]
    try:
        from vllm.distributed import get_world_group

        group = get_world_group()
        world_size = int(group.world_size)
    except Exception:  # noqa: BLE001 - no distributed state (CLI tests): one rank
        world_size = 1
    if world_size > 1:
        import torch
        import torch.distributed as dist

        mine_t = torch.tensor(list(mine.encode("ascii")), dtype=torch.uint8)
        gathered = [torch.empty_like(mine_t) for _ in range(world_size)]
        dist.all_gather(gathered, mine_t, group=group.cpu_group)
        fingerprints = [bytes(t.tolist()).decode("ascii") for t in gathered]
    wc.plan_fingerprints = fingerprints
    if len(set(fingerprints)) > 1:
        groups: dict[str, list[int]] = {}
        for rank, fp in enumerate(fingerprints):
            groups.setdefault(fp, []).append(rank)
        detail = "; ".join(f"ranks {ranks}: {fp}" for fp, ranks in groups.items())
        write_report(report, settings)
        raise WcprofError(
            f"tensor-parallel ranks executed different worst-case sweeps (plan fingerprints "
            f"differ: {detail}); rank {report.rank} ran {len(wc.steps)} steps",
            hint="every rank must see the same engine limits and settings; compare the per-rank "
                 "reports (.rankN.json)")


def _sweep_and_measure(worker, limits, meter, settings: ProfilerSettings, clock: PhaseTimer):
    """The sweep (or the cached one's replay), every workspace slot grown, then what the process
    holds."""
    driver = make_driver(worker, limits, meter, agree_max_fn())
    tolerance = settings.tolerance_bytes if settings.tolerance_bytes is not None else meter.resolution_bytes
    outcome, cache_use, store = sweep_or_reuse(worker, driver, limits, settings, tolerance, clock)

    mgr = ws.manager()
    wc = outcome.worstcase
    if mgr is not None:
        with clock("workspace_grow"):
            # A reused sweep replayed only its worst shape: grow to what every cached step asked.
            cached_slot = max((s.bytes_after for s in wc.workspace_slots), default=0)
            wc.workspace_slots = ws.grow_all_slots(mgr, at_least=cached_slot)
            wc.workspace_bytes = ws.total_bytes(mgr)
    wc.cache = cache_use
    if store is not None:
        with clock("cache_store"):
            store(wc)

    with clock("measure_held"):
        measured_consumed = device_bytes_held(worker, meter, clock=clock, phase="measure_held")
    return outcome, measured_consumed


def profile_on_frozen_heap(stack: contextlib.ExitStack, run_profile, *, cuda: bool,
                           clock: PhaseTimer) -> int:
    """Run vLLM's own profile (`run_profile`, returns its KV figure) and leave the heap frozen in
    `stack` until it closes, i.e. until the held-memory measurement.

    Every collection on a frozen heap (the KV teardowns, the measurement) walks only the objects
    made since instead of the whole process (0.3-0.5 s each on a vLLM process). vLLM's CUDA
    profile collects fully twice itself (memory_profiling): there the heap is frozen before it,
    after one collection of ours, so those two become cheap too and no garbage is frozen. vLLM
    0.26's V1 profile_cudagraph_memory unfreezes the whole heap on its way out (_freeze_gc ends in
    gc.unfreeze(); gc.collect()), so the heap is frozen again after the profile, which ends in a
    full collection: nothing it froze is garbage. The CPU profile collects nothing: the freeze
    starts after it."""
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


def determine_available_memory(worker, original, settings: ProfilerSettings) -> int:
    runner = worker.model_runner
    vllm_config = worker.vllm_config
    limits = limits_of(vllm_config)
    meter = meter_for(getattr(worker, "device", "cpu"))
    explicit = vllm_config.cache_config.kv_cache_memory_bytes
    clock = timer_of(worker)

    frozen_before = gc.get_freeze_count()
    with contextlib.ExitStack() as frozen:
        stock_kv = profile_on_frozen_heap(frozen, lambda: int(original(worker)),
                                          cuda=meter.device_kind == "cuda", clock=clock)
        log.debug("[wcprof] heap frozen until the held-memory measurement (%d objects were "
                  "frozen before)", frozen_before)

        # What the scheduler can form is bounded by the KV pool: vLLM's own budget is an upper
        # bound on it (ours only comes out smaller), so shapes never exceed what could be
        # resident at once.
        bpt = kvmod.bytes_per_token(runner)
        if bpt:
            limits = dataclasses.replace(limits, kv_capacity_tokens=round_capacity_up(max(
                limits.max_model_len, int(explicit if explicit is not None else stock_kv) // bpt)))
        outcome, measured_consumed = _sweep_and_measure(worker, limits, meter, settings, clock)
    wc = outcome.worstcase
    consumed = measured_consumed + wc.post_profile_bytes
    requested = requested_bytes(worker)
    # The stock-OOM question is about everything non-KV a step needs, workspace included: stock
    # budgets its own step's need; a longer context needs more (seed 002).
    curve = [(r.shape.context_len, r.need_bytes) for r in wc.context_curve]
    stock_need = outcome.stock.need_bytes
    admission = compute_admission(
        requested=requested, consumed=consumed,
        weights=int(getattr(runner, "model_memory_usage", 0) or 0),
        non_torch=non_torch(meter, measured_consumed), worst_peak=wc.peak_activation_bytes,
        stock_peak=stock_need, cudagraph=max(cudagraph_applied(worker), cached_warmup(worker)),
        margin=settings.margin_bytes, bytes_per_token=bpt, block_size=limits.block_size,
        max_model_len=limits.max_model_len, explicit_kv=explicit, context_curve=curve)
    admission.stock_kv_cache_bytes = stock_kv
    admission.kv_tokens_stock = kv_tokens(stock_kv, bpt, limits.block_size)

    report = Report(
        tool_version=__version__, vllm_version=vllm_version(),
        created_at=now(),
        rank=world_rank(), device=device_info(worker), config=engine_config(vllm_config),
        runner=RunnerInfo(runner="v2" if is_v2_runner(runner) else "v1",
                          worker=type(worker).__name__,
                          attention_backends=attention_backends(runner)),
        stock=outcome.stock, worstcase=wc, admission=admission)
    with clock("plan_check"):
        _check_same_plan(report, settings)
    setattr(worker, REPORT_ATTR, report)
    _write(worker, report, settings)

    if not admission.fits and settings.mode == "enforce":
        need = kvmod.one_request_bytes(runner, vllm_config)
        if explicit is not None and explicit > max(admission.budget_bytes, 0) and admission.budget_bytes >= need:
            raise DoesNotFit(
                f"--kv-cache-memory-bytes {explicit} ({fmt_bytes(explicit)}) leaves no room for the "
                f"worst-case step ({fmt_bytes(wc.peak_activation_bytes)} at {wc.worst_shape.label()})",
                hint=f"use --kv-cache-memory-bytes {admission.recommended_kv_cache_memory_bytes} or less")
        raise DoesNotFit(
            f"after the worst-case step ({fmt_bytes(wc.peak_activation_bytes)} at "
            f"{wc.worst_shape.label()}) the KV budget is {fmt_bytes(admission.budget_bytes)}; one "
            f"request at max_model_len={limits.max_model_len} needs {fmt_bytes(need)}",
            hint="lower --max-model-len or --max-num-batched-tokens, or give the engine more memory")

    budget = explicit if explicit is not None else max(0, admission.budget_bytes)
    if settings.mode == "report":
        budget = stock_kv
    if settings.kv_cap_bytes is not None:
        budget = min(budget, max(settings.kv_cap_bytes, kvmod.one_request_bytes(runner, vllm_config)))
    # Keep vLLM's own suggestion log and startup plan consistent with ours.
    worker.peak_activation_memory = wc.peak_activation_bytes
    worker.available_kv_cache_memory_bytes = budget
    setattr(worker, BUDGET_ATTR, budget)
    log.info("[wcprof] stock KV %s (peak %s) -> worst-case KV %s (peak %s at %s%s); "
             "recommended --kv-cache-memory-bytes %d", fmt_bytes(stock_kv),
             fmt_bytes(outcome.stock.peak_activation_bytes), fmt_bytes(admission.budget_bytes),
             fmt_bytes(wc.peak_activation_bytes), wc.worst_shape.label(),
             f", op {wc.worst_op}" if wc.worst_op else "",
             admission.recommended_kv_cache_memory_bytes)
    return int(budget)


def initialize_from_config(worker, original, kv_cache_config, settings: ProfilerSettings):
    meter = meter_for(getattr(worker, "device", "cpu"))
    clock = timer_of(worker)
    before = meter.consumed()
    with clock("vllm_kv_init"):
        result = original(worker, kv_cache_config)
    report: Report | None = getattr(worker, REPORT_ATTR, None)
    if meter.device_kind == "cuda" and report is not None:
        with clock("measure_after_kv"):
            # measure_held collected fully after the sweep; only KV init's objects are new.
            setattr(worker, AFTER_KV_ATTR, device_bytes_held(worker, meter, gc_generation=1,
                                                             clock=clock, phase="measure_after_kv"))
    budget = getattr(worker, BUDGET_ATTR, None)
    if settings.kv_audit == "off" or budget is None:
        return result
    with clock("kv_audit"):
        audit = kvmod.audit(worker.model_runner, kv_cache_config, int(budget),
                            delta_process=meter.consumed() - before)
    if report is not None:
        report.kv_audit = audit
        _write(worker, report, settings)
    if audit.verdict != "ok":
        if settings.kv_audit == "error":
            raise KVOvercommit(
                audit.message,
                hint="the engine refuses to start; fix the KV planning of this model, or set "
                     "worstcase_profiler.kv_audit=warn to start anyway")
        log.warning("[wcprof] %s", audit.message)
        if report is not None:
            report.warnings.append(audit.message)
    else:
        log.info("[wcprof] %s", audit.message)
    return result


def after_warm_up(worker, settings: ProfilerSettings, warm_up_seconds: float = 0.0) -> None:
    report: Report | None = getattr(worker, REPORT_ATTR, None)
    clock = timer_of(worker)
    clock.add("vllm_warm_up", warm_up_seconds)
    if report is not None:
        with clock("warmup_audit"):
            error = audit_warm_up(worker, report, settings)
        if error is not None:
            _write(worker, report, settings)
            raise error
    mgr = ws.manager()
    if mgr is not None and settings.lock_workspace and settings.mode == "enforce":
        if report is not None:
            # Warm-up may have grown a slot after the budget was fixed: say so, loudly.
            grown = ws.total_bytes(mgr) - report.worstcase.workspace_bytes
            if grown > 0:
                msg = f"workspace grew by {fmt_bytes(grown)} during warm-up, after the KV budget"
                log.warning("[wcprof] %s", msg)
                report.warnings.append(msg)
            report.worstcase.workspace_locked = True
        ws.lock(mgr)
        log.info("[wcprof] workspace locked at %s per slot; growth now raises an error naming the "
                 "caller", fmt_bytes(max(ws.slot_sizes(mgr), default=0)))
    if report is not None:
        _write(worker, report, settings)


def _write(worker, report: Report, settings: ProfilerSettings) -> None:
    clock = timer_of(worker)
    with clock("report_write"):
        report.startup_seconds = dict(clock.seconds)
        write_report(report, settings)


def write_report(report: Report, settings: ProfilerSettings) -> None:
    if not settings.json_path:
        return
    from ..render.json_report import JsonReporter

    path = settings.json_path
    if report.rank:
        root, ext = os.path.splitext(path)
        path = f"{root}.rank{report.rank}{ext or '.json'}"
    JsonReporter().write(report, path)
