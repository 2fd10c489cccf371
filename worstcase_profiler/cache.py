"""Sweep results kept across engine starts, so that a restart does not pay the sweep again.

The sweep's outcome depends on the model, the engine limits, the kernels (vLLM, torch, CUDA,
attention backend, runner) and the device; `cache_key` hashes all of them. A hit is not trusted
blindly: the engine replays the cached worst step on its provisional KV cache and compares what
it needs now with what it needed when the entry was written (`verdict`). Needing more than the
meter's tolerance allows means something the key did not see changed (a driver, a model plugin's code);
the entry is then discarded and the full sweep runs — never a silent reuse of a stale figure.

Entries are JSON files named by the key, written atomically; a corrupt or foreign entry reads as
a miss. The directory: the `cache_dir` setting, else $WCPROF_CACHE_DIR, else
$XDG_CACHE_HOME/worstcase_profiler (~/.cache/worstcase_profiler). `off` disables the cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from .report import StockFigures, WorstCase

ENV_DIR = "WCPROF_CACHE_DIR"
OFF = "off"
SCHEMA = 1


def cache_dir(setting: str | None, environ: dict[str, str] | None = None) -> Path | None:
    """Where entries live, or None when the cache is off."""
    env = os.environ if environ is None else environ
    chosen = setting or env.get(ENV_DIR)
    if chosen is None:
        base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        chosen = os.path.join(base, "worstcase_profiler")
    return None if chosen.strip().lower() == OFF else Path(chosen)


def cache_key(facts: dict[str, Any]) -> str:
    """24 hex chars of sha256 over the canonical JSON of everything the sweep depends on."""
    canonical = json.dumps({"schema": SCHEMA, **facts}, sort_keys=True, separators=(",", ":"),
                           default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:24]


def round_capacity_up(tokens: int) -> int:
    """KV capacity to 1/16 precision, rounded up: vLLM's own budget moves by a few blocks from
    one start to the next, which must not change the key. Up is the safe direction (longer
    extents are planned than the pool can hold)."""
    quantum = 1 << max(0, tokens.bit_length() - 5)
    return -(-tokens // quantum) * quantum


class CacheEntry(BaseModel):
    key: str
    facts: dict[str, Any]
    created_at: str
    worstcase: WorstCase
    stock: StockFigures | None = None
    """The stock step as measured then: the worst shape when nothing the sweep ran needed more."""
    warmup_resident_bytes: int = 0
    """What warm-up (CUDA graph capture) kept resident at the start that wrote or last used the
    entry; admission subtracts it up front on the next start (vLLM 0.26's V2 runner estimates 0)."""


@dataclass
class SweepCache:
    directory: Path

    def path(self, key: str) -> Path:
        return self.directory / f"{key}.json"

    def load(self, key: str) -> CacheEntry | None:
        try:
            entry = CacheEntry.model_validate_json(self.path(key).read_text())
        except (OSError, ValueError, ValidationError):
            return None
        return entry if entry.key == key else None

    def store(self, entry: CacheEntry) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        target = self.path(entry.key)
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=f".{entry.key}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(entry.model_dump_json(indent=1))
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return target


def cached_need(entry: CacheEntry) -> int | None:
    """What the cached worst shape needed when the entry was written; None when the entry cannot
    say (the worst was the stock step and the entry predates storing it): not reusable."""
    wc = entry.worstcase
    if wc.worst_shape.kind == "stock":
        return entry.stock.need_bytes if entry.stock else None
    return max((s.need_bytes for s in wc.steps if s.shape == wc.worst_shape), default=None)


def verdict(cached: int, measured: int, tolerance: int) -> tuple[bool, int]:
    """(still valid, allowed upward drift). Valid while the replayed step needs no more than it
    needed then, within the meter's tolerance or 2% of it, whichever is larger. Needing less is
    the safe direction and normal (the cached figure is the largest of many noisy measurements),
    so only a large drop — 4x the allowance or 10%, whichever is larger — also rejects the entry:
    it describes another build, and reusing it would only throw KV away."""
    allowed = max(tolerance, cached // 50)
    floor = cached - max(4 * allowed, cached // 10)
    return floor <= measured <= cached + allowed, allowed
