"""The sweep cache's flow inside a start: find this configuration's entry, reuse it when its
worst step replayed now still needs what it needed (or sweep), store a new sweep, and remember
what warm-up kept and what the pool fit measured. The entries and their trust are core/cache.py's and core/cache_trust.py's."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Callable, NamedTuple

from ..core.cache import ENV_DIR, CacheEntry, SweepCache, cache_dir, cache_key
from ..core.cache_trust import (TRUST_SKIPS_RECHECK, cache_verdict, recheck_dominance,
                                replays_on_cut, still_worst)
from ..core.pool_fit import merged_readings
from ..core.shapes import Limits
from ..core.sweep import (cut_reading, dominance_checks, replay, replayed_against, reused,
                          stock_readings)
from ..core.timing import PhaseTimer
from ..core.types import (CacheUse, CutDownProof, EngineFacts, Shape, StepResult, SweepResult,
                          WarmupEstimate, Workspace)
from ..settings import ProfilerSettings
from ..sizes import fmt_bytes
from .facts import sweep_facts
from .meters import exact

log = logging.getLogger("vllm.wcprof")


class CacheHandle(NamedTuple):
    cache: SweepCache
    key: str
    facts: dict
    trust: str | None = None
    """How the entry found is trusted beyond its replay (SweepCache.load_with_trust)."""


def lookup(worker, engine: EngineFacts, limits: Limits, settings: ProfilerSettings):
    """(handle, entry): this configuration's cache slot and its entry (None: a miss, or
    sweep_depth=prove), or (None, None) with the cache off. The key leaves the KV pool size out;
    the entry records it."""
    directory = cache_dir(settings.cache_dir)
    if directory is None:
        return None, None
    cache, no_host_key = SweepCache.for_engine(directory)
    if no_host_key:
        log.info("[wcprof] the sweep cache has no host key (%s): a cached start re-checks the "
                 "plan's heaviest shapes unless $WCPROF_CACHE_SECRET signs it", no_host_key)
    facts = sweep_facts(worker, engine, dataclasses.replace(limits, kv_capacity_tokens=None),
                        settings)
    key = cache_key(facts)
    # A proof compares two sweeps measured now: a cached one proves nothing (it is still stored).
    entry, trust, _ = (None, None, False) if settings.sweep_depth == "prove" else \
        cache.load_with_trust(key)
    return CacheHandle(cache, key, facts, trust), entry


def sweep_or_reuse(driver, limits: Limits, tolerance: int, clock: PhaseTimer,
                   handle: CacheHandle | None, entry: CacheEntry | None,
                   full_sweep: Callable[[], tuple[SweepResult, str, CutDownProof | None]]):
    """(sweep, CacheUse, the entry reused or None, the sweep's mode line, the cut-down proof or
    None): `full_sweep()`, or a cached sweep whose worst shape, replayed now, still needs what
    it needed (every rank must agree, or all sweep)."""
    if handle is None:
        sweep, mode, proof = full_sweep()
        return sweep, CacheUse(status="off"), None, mode, proof
    use = CacheUse(status="stored", key=handle.key, path=str(handle.cache.path(handle.key)))
    if driver.agree_max(int(entry is None)) == 0:
        # With a secret, the cache loads only entries whose signature it verified.
        # every rank runs the same steps (they hold collectives): one rank's re-check is all's
        recheck = bool(driver.agree_max(int(recheck_dominance(handle.trust))))
        on_cut = cut_reading(entry.sweep, entry.sweep.worst.shape)
        cut = not driver.agree_max(int(not replays_on_cut(
            handle.trust, entry.proof, on_cut, exact=exact(getattr(driver, "meter", None)))))
        with clock("replay"):
            check = replay(driver, entry.sweep.worst.shape,
                           dominance_checks(limits, entry.sweep.worst.shape) if recheck else (),
                           stock_readings=stock_readings(driver), cut=cut)
        clock.add("replay.stock_step", check.stock.seconds)
        clock.add("replay.worst_step", check.step.seconds)
        expected = replayed_against(entry.sweep, check)
        ok, allowed = cache_verdict(expected, check.step.need_bytes, tolerance)
        if check.cut_depth is not None and check.cut_depth != entry.proof.depth:
            ok = False  # another cut than the one its reading was taken on: not like with like
            log.warning("[wcprof] cached sweep %s was cut to %s, this start cuts to %s: the "
                        "entry is not reused", use.path, entry.proof.depth, check.cut_depth)
        if not still_worst(expected, [o.need_bytes for o in check.others], allowed):
            ok = False
            beaten = max(check.others, key=lambda o: o.need_bytes)
            log.warning("[wcprof] cached sweep %s names %s as the worst step, but %s needs %s now "
                        "(more than its %s): the entry is not trusted", handle.cache.path(handle.key),
                        entry.sweep.worst.shape.label(), beaten.shape.label(),
                        fmt_bytes(beaten.need_bytes), fmt_bytes(expected))
        use = dataclasses.replace(use, status="hit", cached_at=entry.created_at,
                                  cached_need_bytes=expected,
                                  replayed_need_bytes=check.step.need_bytes,
                                  allowed_drift_bytes=allowed, replay_seconds=round(check.seconds, 3),
                                  trust="re-checked" if recheck else handle.trust,
                                  replay_depth=check.cut_depth)
        where = f" on the cut decoder ({check.cut_depth})" if check.cut_depth else ""
        if driver.agree_max(int(not ok)) == 0:
            sweep = reused(entry.sweep, check, tolerance,
                           getattr(driver.meter, "allocator_slack_bytes", 0))
            raised = sweep.peak_bytes - entry.sweep.peak_bytes
            use = dataclasses.replace(use, transient_raised_bytes=raised)
            if raised:
                log.warning("[wcprof] the replay read %s above the cached sweep (beyond the "
                            "meter's tolerance): admitting the larger transient, %s",
                            fmt_bytes(raised), fmt_bytes(sweep.peak_bytes))
            log.info("[wcprof] sweep reused from %s: %s replayed%s, needs %s (cached %s, drift "
                     "allowed %s) in %.1fs; %s", use.path, entry.sweep.worst.shape.label(), where,
                     fmt_bytes(check.step.need_bytes), fmt_bytes(expected), fmt_bytes(allowed),
                     check.seconds, f"{len(check.others)} heaviest plan shape(s) re-checked"
                     if recheck else TRUST_SKIPS_RECHECK[handle.trust])
            return sweep, use, entry, entry.sweep_mode, entry.proof
        log.warning("[wcprof] cached sweep %s is stale: %s%s needs %s now, %s when cached (allowed "
                    "drift %s); running the full sweep", use.path, entry.sweep.worst.shape.label(),
                    where, fmt_bytes(check.step.need_bytes), fmt_bytes(expected), fmt_bytes(allowed))
        use = dataclasses.replace(use, status="stale")
    sweep, mode, proof = full_sweep()
    return sweep, use, None, mode, proof


def store_entry(handle: CacheHandle, use: CacheUse, sweep: SweepResult, workspace: Workspace,
                baseline: int, consumed: int, estimate: WarmupEstimate,
                capacity_tokens: int | None, sweep_mode: str = "full", *,
                created_at: str, warn: Callable[[str], None] | None = None,
                proof: CutDownProof | None = None) -> CacheUse:
    """Store this start's sweep (its CacheUse unchanged); a cache directory that cannot be
    written does not stop the engine, and is said where the operator reads (`warn`: the
    report's warnings, hence the verdict screen), not only in vLLM's log (status off). `proof`:
    the self-check's verdict, kept with the entry (a prove run's comparison is not)."""
    entry = CacheEntry(key=handle.key, facts=handle.facts, created_at=created_at, sweep=sweep,
                       workspace_slot_bytes=max((s.bytes_after for s in workspace.slots), default=0),
                       baseline_bytes=baseline, consumed_bytes=consumed, warmup=estimate,
                       capacity_tokens=capacity_tokens, sweep_mode=sweep_mode,
                       proof=proof if proof is not None and proof.method == "self-check" else None)
    try:
        path = handle.cache.store(entry)
        log.info("[wcprof] sweep cached at %s", path)
        return use
    except OSError as e:  # a read-only home must not stop the engine
        log.warning("[wcprof] could not write the sweep cache in %s: %s", handle.cache.directory, e)
        if warn is not None:
            warn(cache_unwritable_text(handle.cache.directory, e))
        return dataclasses.replace(use, status="off", path=None)


def cache_unwritable_text(directory, error: OSError) -> str:
    """The warning for a sweep cache that could not be written: where, why, what it costs, and
    what to set."""
    why = error.strerror or str(error)
    return (f"the sweep cache could not be written in {directory} ({why}): this sweep is not "
            f"cached, so every start sweeps again; set {ENV_DIR} to a writable directory (or "
            f"{ENV_DIR}=off to silence this)")


def remember_warmup(use: CacheUse, warmup: WarmupEstimate) -> None:
    """Store what warm-up kept in this configuration's cache entry: the next start subtracts it
    up front."""
    _update(use, lambda entry: None if entry.warmup == warmup else entry.replace(warmup=warmup))


class CachedFit(NamedTuple):
    """The pool fit's readings a trusted entry gives a restart, what they left held, and the
    pool the last fit that stored them planned for (CacheEntry.pool_fit_pool_tokens)."""

    readings: dict[Shape, StepResult]
    held_bytes: int = 0
    pool_tokens: int | None = None


def remember_pool_fit(use: CacheUse, steps: tuple[StepResult, ...], held_bytes: int, *,
                      pool_tokens: int, replace: bool = False) -> None:
    """Add the pool fit's full-model readings to this configuration's cache entry, one per
    shape, the larger figures where it has one (core/pool_fit.merged_readings), the most its
    steps left held, and the pool its plan was for (`pool_tokens`: every shape of that plan is
    among `steps`): a restart that trusts the entry fits without measuring them again
    (reusable_pool_fit). `replace`: the entry's readings were rejected (measured again, they no
    longer matched): these stand instead of them."""
    def merged(entry: CacheEntry) -> CacheEntry | None:
        kept = merged_readings(() if replace else entry.pool_fit_steps, steps)
        held = held_bytes if replace else max(entry.pool_fit_held_bytes, held_bytes)
        if (kept, held, pool_tokens) == (entry.pool_fit_steps, entry.pool_fit_held_bytes,
                                         entry.pool_fit_pool_tokens):
            return None
        return entry.replace(pool_fit_steps=kept, pool_fit_held_bytes=held,
                             pool_fit_pool_tokens=pool_tokens)
    _update(use, merged)


def reusable_pool_fit(use: CacheUse, entry: CacheEntry | None) -> CachedFit | None:
    """The pool-fit readings a start may take from its entry instead of measuring: those of an
    entry reused without the dominance re-check (its trust: this host's own, or fleet-signed),
    else None. Ranks agree on the trust with the re-check (sweep_or_reuse)."""
    if entry is None or use.status != "hit" or use.trust not in TRUST_SKIPS_RECHECK:
        return None
    return CachedFit({r.shape: r for r in entry.pool_fit_steps}, entry.pool_fit_held_bytes,
                     entry.pool_fit_pool_tokens)


def _update(use: CacheUse, change: Callable[[CacheEntry], CacheEntry | None]) -> None:
    """Re-store this start's entry as `change` returns it (None: unchanged), re-signed as this
    host's own only where it was (an import stays an import); a write that fails is logged."""
    if use.path is None or use.key is None:
        return
    cache, _ = SweepCache.for_engine(Path(use.path).parent)
    entry, _, own = cache.load_with_trust(use.key)
    changed = change(entry) if entry is not None else None
    if changed is None:
        return
    try:
        cache.store(changed, as_own=own)
    except OSError as e:
        log.warning("[wcprof] could not update the sweep cache: %s", e)


def forget(use: CacheUse) -> None:
    """Remove the entry this start stored (a start refused after its sweep was cached: the next
    start must measure again, not reuse a plan that was refused)."""
    if use.path is None:
        return
    try:
        Path(use.path).unlink(missing_ok=True)
        log.info("[wcprof] sweep cache entry %s removed: this start was refused", use.path)
    except OSError as e:
        log.warning("[wcprof] could not remove the sweep cache entry %s: %s", use.path, e)
