"""The worker-side flow, called by the patches in patches.py:

  determine_available_memory: stock figure (vLLM's own method) -> worst-case sweep -> grow every
      workspace slot -> read what the process holds -> admission -> report; returns the budget.
  initialize_from_config:     audit the KV the engine actually allocated against that budget.
  compile_or_warm_up_model:   lock the workspace after warm-up; log the summary; write the JSON.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import json
import logging
import os
import sys

from .. import __version__
from ..admission import compute_admission, kv_tokens
from ..cache import CacheEntry, SweepCache, cache_dir, cache_key, cached_need, round_capacity_up, verdict
from ..errors import DoesNotFit, KVOvercommit, WcprofError
from ..meters import meter_for
from ..report import CacheUse, DeviceInfo, EngineConfig, Report, RunnerInfo, WarmupAudit
from ..settings import ProfilerSettings
from ..shapes import Limits
from ..sizes import fmt_bytes
from ..sweep import SweepOutcome, replay_worst, run_sweep
from . import kv as kvmod
from . import workspace as ws
from .runner import is_v2_runner, make_driver
from .versions import vllm_version

log = logging.getLogger("vllm.wcprof")

REPORT_ATTR = "_wcprof_report"
BUDGET_ATTR = "_wcprof_budget"
CACHE_ATTR = "_wcprof_cache"          # (SweepCache, key) when the cache is on
AFTER_KV_ATTR = "_wcprof_used_after_kv"


def limits_of(vllm_config, runner=None) -> Limits:
    spec = vllm_config.speculative_config
    k = int(getattr(spec, "num_speculative_tokens", 0) or 0) if spec is not None else 0
    return Limits(
        max_model_len=int(vllm_config.model_config.max_model_len),
        max_num_batched_tokens=int(vllm_config.scheduler_config.max_num_batched_tokens),
        max_num_seqs=int(vllm_config.scheduler_config.max_num_seqs),
        num_speculative_tokens=k,
        block_size=int(vllm_config.cache_config.block_size or 16),
        prefix_caching=bool(getattr(vllm_config.cache_config, "enable_prefix_caching", False)),
    )


def _rank() -> int:
    try:
        from vllm.distributed import get_world_group

        return int(get_world_group().rank)
    except Exception:  # noqa: BLE001 - before distributed init (CLI tests): rank 0
        return 0


def _agree_max_fn():
    """Max over every rank of the world group, on its CPU group, so that adaptive choices in the
    sweep (bisection) are identical everywhere and no rank waits in a collective alone."""
    try:
        from vllm.distributed import get_world_group

        group = get_world_group()
        if group.world_size <= 1:
            return None
    except Exception:  # noqa: BLE001
        return None
    import torch
    import torch.distributed as dist

    def agree(value: int) -> int:
        t = torch.tensor([int(value)], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group.cpu_group)
        return int(t.item())

    return agree


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


def _device_info(worker) -> DeviceInfo:
    dev = getattr(worker, "device", None)
    if getattr(dev, "type", "cpu") == "cuda":
        import torch

        props = torch.cuda.get_device_properties(dev)
        return DeviceInfo(kind="cuda", name=props.name, total_bytes=int(props.total_memory))
    import psutil

    return DeviceInfo(kind="cpu", name=os.uname().machine, total_bytes=int(psutil.virtual_memory().total))


def _engine_config(vllm_config) -> EngineConfig:
    lim = limits_of(vllm_config)
    return EngineConfig(
        model=str(vllm_config.model_config.model),
        max_model_len=lim.max_model_len,
        max_num_batched_tokens=lim.max_num_batched_tokens,
        max_num_seqs=lim.max_num_seqs,
        num_speculative_tokens=lim.num_speculative_tokens,
        block_size=lim.block_size,
        kv_cache_dtype=str(vllm_config.cache_config.cache_dtype),
        enforce_eager=bool(vllm_config.model_config.enforce_eager),
        gpu_memory_utilization=float(vllm_config.cache_config.gpu_memory_utilization),
        tensor_parallel_size=int(vllm_config.parallel_config.tensor_parallel_size),
    )


def _attention_backends(runner) -> list[str]:
    names = set()
    for layer in runner.vllm_config.compilation_config.static_forward_context.values():
        impl = getattr(layer, "impl", None)
        if impl is not None:
            names.add(type(impl).__name__)
    return sorted(names)


def _requested(worker) -> int:
    for attr in ("requested_memory", "requested_cpu_memory"):
        v = getattr(worker, attr, None)
        if v:
            return int(v)
    raise WcprofError(f"{type(worker).__name__} exposes no requested memory figure",
                      hint="unsupported worker class for worstcase_profiler")


def _consumed(worker, meter) -> int:
    """What this process holds on the device now. CUDA: free memory at worker init minus free now
    (vLLM 0.32's total_consumed); CPU: RSS (what CPUWorker subtracts)."""
    if meter.device_kind == "cuda":
        import torch

        torch.cuda.synchronize()
        import gc

        gc.collect()
        torch.cuda.empty_cache()
        free, _ = torch.cuda.mem_get_info()
        init = getattr(worker, "init_snapshot", None)
        return int(init.free_memory - free) if init is not None else meter.consumed()
    return meter.in_use()


def _non_torch(meter, consumed: int) -> int:
    if meter.device_kind == "cuda":
        import torch

        return max(0, consumed - int(torch.cuda.memory_reserved()))
    return 0


def _cudagraph_applied(worker) -> int:
    est = int(getattr(worker, "cudagraph_memory_estimate", 0) or 0)
    try:
        import vllm.envs as envs

        return est if getattr(envs, "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS", True) else 0
    except Exception:  # noqa: BLE001
        return est


class _SweepProgress:
    """A live progress line on a terminal (steps done, the step that ran, the worst so far), one
    log line per step otherwise. The step count is not known up front: bisection decides it."""

    def __init__(self, settings: ProfilerSettings, rows_max: int):
        self.count = 0
        self.worst = 0
        self._enabled = settings.progress
        self._bar = None
        if self._enabled and sys.stderr.isatty() and _rank() == 0:
            from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self._bar = Progress(SpinnerColumn(), TextColumn("[bold]wcprof sweep[/] {task.description}"),
                                 TimeElapsedColumn(), transient=True)
            self._task = self._bar.add_task(f"rows 1..{rows_max}", total=None)
            self._bar.start()

    def __call__(self, result) -> None:
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


def _sweep_facts(worker, limits: Limits, settings: ProfilerSettings, runner_kind: str) -> dict:
    """Everything the sweep's figures depend on (cache.py hashes it): the model, the limits,
    the kernels and the device. What it cannot see, the replay of the worst shape checks."""
    import inspect

    import torch

    vllm_config = worker.vllm_config
    runner = worker.model_runner
    model = getattr(runner, "model", None)
    try:
        source = inspect.getsourcefile(type(model)) if model is not None else None
        model_code = hashlib.sha256(open(source, "rb").read()).hexdigest()[:16] if source else None
    except (OSError, TypeError):
        model_code = None
    comp = vllm_config.compilation_config
    facts = {
        "tool": __version__, "vllm": vllm_version(), "torch": torch.__version__,
        "cuda": getattr(torch.version, "cuda", None),
        "device": _device_info(worker).model_dump(), "rank": _rank(),
        # not the model path (its config is hf_config) nor the budget (admission is recomputed)
        "config": _engine_config(vllm_config).model_dump(exclude={"gpu_memory_utilization", "model"}),
        "hf_config": {k: v for k, v in vllm_config.model_config.hf_config.to_dict().items()
                      if k not in ("_name_or_path", "name_or_path")},  # where, not what
        "dtype": str(vllm_config.model_config.dtype),
        "quantization": str(vllm_config.model_config.quantization),
        "model_class": f"{type(model).__module__}.{type(model).__qualname__}", "model_code": model_code,
        "cudagraph": [str(getattr(comp, "cudagraph_mode", None)),
                      list(getattr(comp, "cudagraph_capture_sizes", None) or [])],
        "limits": dataclasses.asdict(limits), "runner": runner_kind,
        "attention_backends": _attention_backends(runner),
        "sweep": {"tolerance": settings.tolerance_bytes, "exhaustive": settings.exhaustive,
                  "context_ladder": settings.context_ladder, "attribute_ops": settings.attribute_ops},
    }
    return json.loads(json.dumps(facts, sort_keys=True, default=str))


def _sweep_or_reuse(worker, driver, limits: Limits, settings: ProfilerSettings, tolerance: int):
    """(outcome, CacheUse, store-or-None): the full sweep, or a cached one whose worst shape,
    replayed now, still needs what it needed (every rank must agree, or all of them sweep)."""
    directory = cache_dir(settings.cache_dir)
    cache = SweepCache(directory) if directory is not None else None
    facts = _sweep_facts(worker, limits, settings, driver.runner_kind) if cache else {}
    key = cache_key(facts) if cache else None
    entry = cache.load(key) if cache else None
    use = CacheUse(status="off") if cache is None else CacheUse(status="stored", key=key,
                                                                path=str(cache.path(key)))
    if cache is not None and driver.agree_max(int(entry is None)) == 0:
        replay = replay_worst(driver, entry.worstcase.worst_shape)
        expected = cached_need(entry.worstcase)
        ok, allowed = verdict(expected, replay.step.need_bytes, tolerance)
        use = use.model_copy(update=dict(
            status="hit", cached_at=entry.created_at, cached_need_bytes=expected,
            replayed_need_bytes=replay.step.need_bytes, allowed_drift_bytes=allowed,
            replay_seconds=round(replay.seconds, 3)))
        if driver.agree_max(int(not ok)) == 0:
            wc = entry.worstcase.model_copy(deep=True)
            wc.peak_activation_bytes = max(wc.peak_activation_bytes, replay.step.peak_bytes,
                                           replay.stock.peak_activation_bytes)
            log.info("[wcprof] sweep reused from %s: %s replayed, needs %s (cached %s, drift "
                     "allowed %s) in %.1fs", cache.path(key), wc.worst_shape.label(),
                     fmt_bytes(replay.step.need_bytes), fmt_bytes(expected), fmt_bytes(allowed),
                     replay.seconds)
            setattr(worker, CACHE_ATTR, (cache, key, entry.warmup_resident_bytes))
            return SweepOutcome(stock=replay.stock, worstcase=wc, provisional=replay.provisional), use, None
        log.warning("[wcprof] cached sweep %s is stale: %s needs %s now, %s when cached (allowed "
                    "drift %s); running the full sweep", cache.path(key), entry.worstcase.worst_shape.label(),
                    fmt_bytes(replay.step.need_bytes), fmt_bytes(expected), fmt_bytes(allowed))
        use.status = "stale"

    log.info("[wcprof] worst-case sweep: rows 1..%d at KV extent %d, %s runner",
             limits.max_num_batched_tokens, limits.max_model_len, driver.runner_kind)
    progress = _SweepProgress(settings, limits.max_num_batched_tokens)
    try:
        outcome = run_sweep(driver, tolerance=tolerance, exhaustive=settings.exhaustive,
                            context_ladder=settings.context_ladder,
                            attribute_ops=settings.attribute_ops, on_step=progress)
    finally:
        progress.close()
    log.info("[wcprof] sweep: %d steps in %.1fs (stock step %.2fs)", progress.count,
             outcome.worstcase.seconds, outcome.stock.seconds)
    if cache is None:
        return outcome, use, None
    setattr(worker, CACHE_ATTR, (cache, key, 0))

    def store(wc) -> None:
        try:
            path = cache.store(CacheEntry(key=key, facts=facts, worstcase=wc, created_at=_now()))
            log.info("[wcprof] sweep cached at %s", path)
        except OSError as e:  # a read-only home must not stop the engine
            log.warning("[wcprof] could not write the sweep cache in %s: %s", cache.directory, e)
            wc.cache = wc.cache.model_copy(update={"status": "off", "path": None})

    return outcome, use, store


def _cached_warmup(worker) -> int:
    """Warm-up memory a cached start measured (0 without one): CUDA graphs on runners whose own
    estimate is 0."""
    return int((getattr(worker, CACHE_ATTR, None) or (None, None, 0))[2])


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def determine_available_memory(worker, original, settings: ProfilerSettings) -> int:
    runner = worker.model_runner
    vllm_config = worker.vllm_config
    limits = limits_of(vllm_config)
    meter = meter_for(getattr(worker, "device", "cpu"))
    explicit = vllm_config.cache_config.kv_cache_memory_bytes

    stock_kv = int(original(worker))  # vLLM's own figure, its own profile included

    # What the scheduler can form is bounded by the KV pool: vLLM's own budget is an upper bound
    # on it (ours only comes out smaller), so shapes never exceed what could be resident at once.
    bpt = kvmod.bytes_per_token(runner)
    if bpt:
        limits = dataclasses.replace(limits, kv_capacity_tokens=round_capacity_up(max(
            limits.max_model_len, int(explicit if explicit is not None else stock_kv) // bpt)))
    driver = make_driver(worker, limits, meter, _agree_max_fn())
    tolerance = settings.tolerance_bytes if settings.tolerance_bytes is not None else meter.resolution_bytes
    outcome, cache_use, store = _sweep_or_reuse(worker, driver, limits, settings, tolerance)

    mgr = ws.manager()
    wc = outcome.worstcase
    if mgr is not None:
        # A reused sweep replayed only its worst shape: grow to what every cached step asked.
        cached_slot = max((s.bytes_after for s in wc.workspace_slots), default=0)
        wc.workspace_slots = ws.grow_all_slots(mgr, at_least=cached_slot)
        wc.workspace_bytes = ws.total_bytes(mgr)
    wc.cache = cache_use
    if store is not None:
        store(wc)

    measured_consumed = _consumed(worker, meter)
    consumed = measured_consumed + wc.post_profile_bytes
    requested = _requested(worker)
    # The stock-OOM question is about everything non-KV a step needs, workspace included: stock
    # budgets its own step's need; a longer context needs more (seed 002).
    curve = [(r.shape.context_len, r.need_bytes) for r in wc.context_curve]
    stock_need = outcome.stock.peak_activation_bytes + outcome.stock.workspace_bytes
    admission = compute_admission(
        requested=requested, consumed=consumed,
        weights=int(getattr(runner, "model_memory_usage", 0) or 0),
        non_torch=_non_torch(meter, measured_consumed), worst_peak=wc.peak_activation_bytes,
        stock_peak=stock_need, cudagraph=max(_cudagraph_applied(worker), _cached_warmup(worker)),
        margin=settings.margin_bytes, bytes_per_token=bpt, block_size=limits.block_size,
        max_model_len=limits.max_model_len, explicit_kv=explicit, context_curve=curve)
    admission.stock_kv_cache_bytes = stock_kv
    admission.kv_tokens_stock = kv_tokens(stock_kv, bpt, limits.block_size)

    report = Report(
        tool_version=__version__, vllm_version=vllm_version(),
        created_at=_now(),
        rank=_rank(), device=_device_info(worker), config=_engine_config(vllm_config),
        runner=RunnerInfo(runner="v2" if is_v2_runner(runner) else "v1",
                          worker=type(worker).__name__,
                          attention_backends=_attention_backends(runner)),
        stock=outcome.stock, worstcase=wc, admission=admission)
    _check_same_plan(report, settings)
    setattr(worker, REPORT_ATTR, report)
    write_report(report, settings)

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
    before = meter.consumed()
    result = original(worker, kv_cache_config)
    if meter.device_kind == "cuda" and getattr(worker, REPORT_ATTR, None) is not None:
        setattr(worker, AFTER_KV_ATTR, _consumed(worker, meter))
    report: Report | None = getattr(worker, REPORT_ATTR, None)
    budget = getattr(worker, BUDGET_ATTR, None)
    if settings.kv_audit == "off" or budget is None:
        return result
    audit = kvmod.audit(worker.model_runner, kv_cache_config, int(budget),
                        delta_process=meter.consumed() - before)
    if report is not None:
        report.kv_audit = audit
        write_report(report, settings)
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


def _audit_warm_up(worker, report: Report, settings: ProfilerSettings) -> None:
    """Device memory warm-up kept (CUDA graphs) vs what admission set aside for it. The figure is
    cached with the sweep, so the next start of this config subtracts it up front; more than the
    margin outside the budget fails this start (the worst step would no longer fit)."""
    after_kv = getattr(worker, AFTER_KV_ATTR, None)
    if after_kv is None:
        return
    meter = meter_for(getattr(worker, "device", "cpu"))
    resident = max(0, _consumed(worker, meter) - int(after_kv))
    adm = report.admission
    outside = resident - adm.cudagraph_bytes
    ok = outside <= settings.margin_bytes
    cached = getattr(worker, CACHE_ATTR, None)
    if cached is not None:
        cache, key, _ = cached
        entry = cache.load(key)
        if entry is not None and entry.warmup_resident_bytes != resident:
            try:
                cache.store(entry.model_copy(update={"warmup_resident_bytes": resident}))
            except OSError as e:
                log.warning("[wcprof] could not update the sweep cache: %s", e)
    fix = max(0, adm.kv_cache_bytes - max(0, outside))
    msg = (f"warm-up kept {fmt_bytes(resident)} resident after the KV budget was fixed (CUDA graphs);"
           f" admission set aside {fmt_bytes(adm.cudagraph_bytes)}")
    msg += ": within the margin" if ok else (
        f", so {fmt_bytes(outside)} of the worst step's headroom is gone")
    report.warmup_audit = WarmupAudit(resident_bytes=resident, accounted_bytes=adm.cudagraph_bytes,
                                      outside_bytes=outside, allowed_bytes=settings.margin_bytes,
                                      verdict="ok" if ok else "outside-budget", message=msg)
    if ok:
        log.info("[wcprof] %s", msg)
        return
    write_report(report, settings)
    if settings.mode != "enforce":
        log.warning("[wcprof] %s", msg)
        report.warnings.append(msg)
        return
    again = (" the figure is cached: start again with the same config and admission subtracts it"
             if cached is not None else "")
    raise DoesNotFit(msg, hint=f"{again.strip()}{'; or' if again else ''} pass "
                               f"--kv-cache-memory-bytes {fix} ({fmt_bytes(fix)})")


def after_warm_up(worker, settings: ProfilerSettings) -> None:
    report: Report | None = getattr(worker, REPORT_ATTR, None)
    if report is not None:
        _audit_warm_up(worker, report, settings)
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
