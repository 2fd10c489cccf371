"""The sweep inside the worker, fresh or reused across engine starts.

  sweep_or_reuse: the cache key (sweep_facts) -> a hit whose cached worst step, replayed now,
      still needs what it needed, or the full sweep (with live progress), stored for next time.
  audit_warm_up:  what warm-up kept resident after the KV budget (CUDA graphs, which vLLM 0.26's
      V2 runner estimates as 0), checked against what admission set aside and cached, so the next
      start subtracts it (cached_warmup).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import json
import logging
import sys
from typing import NamedTuple

from .. import __version__
from ..cache import CacheEntry, SweepCache, cache_dir, cache_key, cached_need, verdict
from ..errors import DoesNotFit
from ..meters import meter_for
from ..report import CacheUse, Report, WarmupAudit
from ..settings import ProfilerSettings
from ..shapes import Limits
from ..sizes import fmt_bytes
from ..sweep import SweepOutcome, replay_worst, run_sweep
from ..timing import PhaseTimer
from .engine_facts import (attention_backends, device_bytes_held, device_info, engine_config,
                           world_rank)
from .versions import vllm_version

log = logging.getLogger("vllm.wcprof")

CACHE_ATTR = "_wcprof_cache"            # a CacheSlot, when the cache is on
AFTER_KV_ATTR = "_wcprof_used_after_kv"  # device bytes held right after the KV allocation


class CacheSlot(NamedTuple):
    """This start's cache entry, kept on the worker until warm-up has been audited."""

    cache: SweepCache
    key: str
    warmup_resident_bytes: int = 0


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


def sweep_facts(worker, limits: Limits, settings: ProfilerSettings, runner_kind: str) -> dict:
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
        "device": device_info(worker).model_dump(), "rank": world_rank(),
        # not the model path (its config is hf_config) nor the budget (admission is recomputed)
        "config": engine_config(vllm_config).model_dump(exclude={"gpu_memory_utilization", "model"}),
        "hf_config": {k: v for k, v in vllm_config.model_config.hf_config.to_dict().items()
                      if k not in ("_name_or_path", "name_or_path")},  # where, not what
        "dtype": str(vllm_config.model_config.dtype),
        "quantization": str(vllm_config.model_config.quantization),
        "model_class": f"{type(model).__module__}.{type(model).__qualname__}", "model_code": model_code,
        "cudagraph": [str(getattr(comp, "cudagraph_mode", None)),
                      list(getattr(comp, "cudagraph_capture_sizes", None) or [])],
        "limits": dataclasses.asdict(limits), "runner": runner_kind,
        "attention_backends": attention_backends(runner),
        "sweep": {"tolerance": settings.tolerance_bytes, "exhaustive": settings.exhaustive,
                  "context_ladder": settings.context_ladder, "attribute_ops": settings.attribute_ops},
    }
    return json.loads(json.dumps(facts, sort_keys=True, default=str))


def sweep_or_reuse(worker, driver, limits: Limits, settings: ProfilerSettings, tolerance: int,
                   clock: PhaseTimer):
    """(outcome, CacheUse, store-or-None): the full sweep, or a cached one whose worst shape,
    replayed now, still needs what it needed (every rank must agree, or all of them sweep)."""
    with clock("cache_lookup"):
        directory = cache_dir(settings.cache_dir)
        cache = SweepCache(directory) if directory is not None else None
        facts = sweep_facts(worker, limits, settings, driver.runner_kind) if cache else {}
        key = cache_key(facts) if cache else None
        entry = cache.load(key) if cache else None
    use = CacheUse(status="off") if cache is None else CacheUse(status="stored", key=key,
                                                                path=str(cache.path(key)))
    expected = cached_need(entry) if entry is not None else None
    if entry is not None and expected is None:
        log.info("[wcprof] cached sweep %s cannot be checked (its worst step is the stock step, "
                 "whose figures it predates storing); running the full sweep", cache.path(key))
    if cache is not None and driver.agree_max(int(expected is None)) == 0:
        with clock("replay"):
            replay = replay_worst(driver, entry.worstcase.worst_shape)
        clock.add("replay.stock_step", replay.stock.seconds)
        clock.add("replay.worst_step", replay.step.seconds)
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
            setattr(worker, CACHE_ATTR, CacheSlot(cache, key, entry.warmup_resident_bytes))
            return SweepOutcome(stock=replay.stock, worstcase=wc, provisional=replay.provisional), use, None
        log.warning("[wcprof] cached sweep %s is stale: %s needs %s now, %s when cached (allowed "
                    "drift %s); running the full sweep", cache.path(key), entry.worstcase.worst_shape.label(),
                    fmt_bytes(replay.step.need_bytes), fmt_bytes(expected), fmt_bytes(allowed))
        use.status = "stale"

    log.info("[wcprof] worst-case sweep: rows 1..%d at KV extent %d, %s runner",
             limits.max_num_batched_tokens, limits.max_model_len, driver.runner_kind)
    progress = SweepProgress(settings, limits.max_num_batched_tokens)
    try:
        with clock("sweep"):
            outcome = run_sweep(driver, tolerance=tolerance, exhaustive=settings.exhaustive,
                                context_ladder=settings.context_ladder,
                                attribute_ops=settings.attribute_ops, on_step=progress)
    finally:
        progress.close()
    log.info("[wcprof] sweep: %d steps in %.1fs (stock step %.2fs)", progress.count,
             outcome.worstcase.seconds, outcome.stock.seconds)
    if cache is None:
        return outcome, use, None
    setattr(worker, CACHE_ATTR, CacheSlot(cache, key))

    def store(wc) -> None:
        try:
            path = cache.store(CacheEntry(key=key, facts=facts, worstcase=wc, stock=outcome.stock,
                                          created_at=now()))
            log.info("[wcprof] sweep cached at %s", path)
        except OSError as e:  # a read-only home must not stop the engine
            log.warning("[wcprof] could not write the sweep cache in %s: %s", cache.directory, e)
            wc.cache = wc.cache.model_copy(update={"status": "off", "path": None})

    return outcome, use, store


def cached_warmup(worker) -> int:
    """Warm-up memory a cached start measured (0 without one): CUDA graphs on runners whose own
    estimate is 0."""
    slot = getattr(worker, CACHE_ATTR, None)
    return slot.warmup_resident_bytes if slot is not None else 0


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def audit_warm_up(worker, report: Report, settings: ProfilerSettings) -> DoesNotFit | None:
    """Device memory warm-up kept (CUDA graphs) vs what admission set aside for it, recorded in
    the report. The figure is cached with the sweep, so the next start of this config subtracts
    it up front; more than the margin outside the budget returns the error that fails this start
    in enforce mode (the worst step would no longer fit)."""
    after_kv = getattr(worker, AFTER_KV_ATTR, None)
    if after_kv is None:
        return None
    meter = meter_for(getattr(worker, "device", "cpu"))
    resident = max(0, device_bytes_held(worker, meter) - int(after_kv))
    adm = report.admission
    outside = resident - adm.cudagraph_bytes
    ok = outside <= settings.margin_bytes
    cached = getattr(worker, CACHE_ATTR, None)
    if cached is not None:
        cache, key = cached.cache, cached.key
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
        return None
    if settings.mode != "enforce":
        log.warning("[wcprof] %s", msg)
        report.warnings.append(msg)
        return None
    again = (" the figure is cached: start again with the same config and admission subtracts it"
             if cached is not None else "")
    return DoesNotFit(msg, hint=f"{again.strip()}{'; or' if again else ''} pass "
                                f"--kv-cache-memory-bytes {fix} ({fmt_bytes(fix)})")
