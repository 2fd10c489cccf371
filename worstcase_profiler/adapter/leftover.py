"""Where a measured batch's leftover lives: a diagnostic for a validation whose batch left memory
allocated after its requests finished (Validation.left_bytes), which the meter counts as
persistent (core/readings.step_transient).

With WCPROF_MEMORY_HISTORY=DIR set, each measured validation batch on CUDA records the caching
allocator's history (torch.cuda.memory._record_memory_history, Python stacks) from its begin
to its end, and writes DIR/leftover-rank<R>-pid<P>-<N>.json: the allocations made inside the
batch still live at its end, summed by call site (core/readings.leftover_sites), read once as
the batch left them and once after a full garbage collection (tensors only a reference cycle
held). Off by default: recording stacks slows every allocation. On CPU, or without the variable,
nothing happens. The file is written whole or not at all."""

from __future__ import annotations

import gc
import json
import logging
import os
from pathlib import Path

from ..atomic_write import write_atomically
from ..core.readings import leftover_sites
from ..sizes import fmt_bytes

log = logging.getLogger("vllm.wcprof")

HISTORY_ENV = "WCPROF_MEMORY_HISTORY"
MAX_ENTRIES = 2_000_000
"""Allocator events kept (a ring: the oldest drop first). A worst-step batch of a few hundred
requests makes well under a million."""


def history_dir(environ=None) -> Path | None:
    """The directory WCPROF_MEMORY_HISTORY names, or None (the diagnostic off)."""
    raw = (os.environ if environ is None else environ).get(HISTORY_ENV, "").strip()
    return Path(raw) if raw else None


def start(device_kind: str) -> bool:
    """Begin recording the allocator's history where the diagnostic is on and the device is CUDA;
    whether it did."""
    if device_kind != "cuda" or history_dir() is None:
        return False
    import torch

    # vllm-touch: allocator-history
    torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python",
                                             max_entries=MAX_ENTRIES, clear_history=True)
    return True


def _events(torch) -> list[dict]:
    # vllm-touch: allocator-history
    snap = torch.cuda.memory._snapshot()
    traces = snap.get("device_traces") or []
    return traces[torch.cuda.current_device()] if traces else []


def finish(rank: int, left_bytes: int) -> Path | None:
    """Stop recording (whatever happens) and write what the batch left (before and after a
    garbage collection) to the history directory, as leftover-rank<R>-pid<P>-<N>.json (each
    process and batch its own file); the file written. Called only after `start` answered
    True."""
    # vllm-touch: allocator-history
    import torch

    try:
        torch.cuda.synchronize()
        before = leftover_sites(_events(torch))
        gc.collect()
        torch.cuda.synchronize()
        after = leftover_sites(_events(torch))
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    out = history_dir()
    out.mkdir(parents=True, exist_ok=True)
    stem = f"leftover-rank{rank}-pid{os.getpid()}"
    path = out / f"{stem}-{len(list(out.glob(stem + '-*.json')))}.json"
    write_atomically(path, json.dumps({"rank": rank, "pid": os.getpid(), "left_bytes": left_bytes,
                                       "before_gc": before, "after_gc": after}, indent=1) + "\n")
    log.info("[wcprof] validation: the batch left %s live that it allocated (%s after a garbage "
             "collection); call sites in %s", fmt_bytes(before["bytes"]),
             fmt_bytes(after["bytes"]), path)
    return path
