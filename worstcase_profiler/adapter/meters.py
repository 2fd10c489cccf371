"""Memory meters: how one step's peak is read, per device.

Both answer the same question — how far above the pre-step baseline did memory go — so the stock
step and every synthetic step are measured by the same instrument.

- CudaMeter: the caching allocator's allocated-bytes high-water mark (exact, host-side, free to
  read) plus free-memory deltas for what lives outside torch.
- CpuMeter: the process high-water mark, VmHWM, reset through /proc/self/clear_refs. glibc keeps
  freed heap pages resident, so we lower the mmap threshold to 64 KiB (mallopt): every buffer above
  that is mapped on allocation and unmapped when freed, and RSS tracks live memory to ~0.5 MiB.
"""

from __future__ import annotations

import ctypes
import logging
import os
from contextlib import contextmanager
from typing import Protocol

from ..core.readings import step_transient

log = logging.getLogger("vllm.wcprof")

_M_MMAP_THRESHOLD = -3


class MemoryMeter(Protocol):
    device_kind: str
    resolution_bytes: int
    allocator_slack_bytes: int
    """How far the same tensors can read apart from one step to the next because of the
    allocator's block reuse (not because anything else was allocated): added once to the
    admitted transient (core/sweep.py), so a real step is never predicted below it."""

    def begin(self) -> None:
        """Synchronize, reset the high-water mark, remember the baseline."""

    def peak(self) -> int:
        """High-water mark since begin(), above the baseline (bytes). Cheap: callable per op."""

    def in_use(self) -> int:
        """What the process holds now (bytes): RSS on CPU, allocated on CUDA."""

    def end(self, kept: int = 0, freed: int = 0) -> int:
        """The step's transient: high-water mark above max(baseline, what the step left live).
        What a step leaves allocated (a grown workspace) is persistent, counted once in the
        consumed figure, not again as transient. `kept` and `freed` adjust the two levels for
        the encoder cache (core/multimodal.encoder_cache_change): high-water mark above
        max(baseline - freed, left live - kept)."""

    def left(self) -> int:
        """What the step left live above its baseline (bytes; negative if it freed more), read
        after end(): whether its reading is taken again (core/readings.measure_again)."""

    def consumed(self) -> int:
        """Everything this process holds on the device, torch or not."""


def _read_status_kb(*keys: str) -> dict[str, int]:
    out: dict[str, int] = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in keys:
                out[k] = int(v.split()[0]) * 1024
    return out


def set_malloc_mmap_threshold(nbytes: int = 64 << 10) -> bool:
    """Make glibc return large frees to the OS so RSS is a live-memory meter. No-op off glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, nbytes))
    except (OSError, AttributeError):
        return False


@contextmanager
def gc_frozen():
    """Freeze every object that exists now (the engine, the model, vLLM's state) for the
    duration: a collection then walks only objects made since, instead of the whole vLLM
    process (0.3-0.5 s per full collection). Cycles made while frozen are still collected.
    Garbage that already existed stays frozen, so it cannot be freed in the middle of a step and
    shrink a measured peak (collect just before entering, and there is none).

    Nests: only the outermost freezes. It freezes even when someone else already froze part of
    the heap; gc.unfreeze() cannot undo only ours, so then the heap stays frozen on exit (what
    vLLM does to the whole heap after warm-up anyway), and it is unfrozen on exit only when
    nothing was frozen before. Also a decorator."""
    import gc

    ours = _FREEZE["depth"] == 0
    frozen_before = gc.get_freeze_count()
    if ours:
        gc.freeze()
    _FREEZE["depth"] += 1
    try:
        yield
    finally:
        _FREEZE["depth"] -= 1
        if ours and frozen_before == 0:
            gc.unfreeze()


_FREEZE = {"depth": 0}


class CpuMeter:
    device_kind = "cpu"
    # With the 64 KiB mmap threshold RSS moves in pages for every tensor above 64 KiB; heap
    # reuse below that is the remaining noise.
    resolution_bytes = 512 << 10
    allocator_slack_bytes = 0  # RSS noise is the resolution's (validation_exceeded allows it)

    def __init__(self) -> None:
        set_malloc_mmap_threshold()
        self._base = 0
        self._can_reset = os.access("/proc/self/clear_refs", os.W_OK)

    def _reset_hwm(self) -> None:
        if self._can_reset:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")

    def begin(self) -> None:
        import gc

        gc.collect()
        self._reset_hwm()
        self._base = _read_status_kb("VmRSS")["VmRSS"]

    def peak(self) -> int:
        return max(0, _read_status_kb("VmHWM")["VmHWM"] - self._base)

    def in_use(self) -> int:
        return _read_status_kb("VmRSS")["VmRSS"]

    def end(self, kept: int = 0, freed: int = 0) -> int:
        v = _read_status_kb("VmHWM", "VmRSS")
        return step_transient(v["VmHWM"], self._base, v["VmRSS"], kept, freed)

    def left(self) -> int:
        import gc

        gc.collect()  # as begin() did: garbage is not what the step left
        return self.in_use() - self._base

    def consumed(self) -> int:
        return self.in_use()


class CudaMeter:
    device_kind = "cuda"
    resolution_bytes = 1 << 20
    # memory_allocated counts whole blocks, not the bytes asked for: PyTorch's caching allocator
    # hands a cached large-pool block out unsplit when less than kSmallSize (1 MiB) would remain
    # (CUDACachingAllocator.cpp should_split; allocated_bytes grows by block->size), so a tensor
    # can be charged up to 1 MiB more than it asked for, depending on which blocks the cache
    # holds: history, not shape. The same tensors of one step can read up to a block apart
    # either way between the sweep and a real engine, and between sweep steps whose activations
    # are identical (the measured spread: docs/sweep.md "Allocator slack"). Two such blocks'
    # worth is admitted on top of the largest step.
    allocator_slack_bytes = 2 << 20

    def __init__(self, device=None) -> None:
        import torch

        self._torch = torch
        self._device = device if device is not None else torch.device("cuda", torch.cuda.current_device())
        self._base = 0

    def begin(self) -> None:
        torch = self._torch
        torch.cuda.synchronize(self._device)
        torch.cuda.reset_peak_memory_stats(self._device)
        self._base = torch.cuda.memory_allocated(self._device)

    def peak(self) -> int:
        return max(0, self._torch.cuda.max_memory_allocated(self._device) - self._base)

    def in_use(self) -> int:
        return self._torch.cuda.memory_allocated(self._device)

    def consumed(self) -> int:
        free, total = self._torch.cuda.mem_get_info(self._device)
        return total - free

    def end(self, kept: int = 0, freed: int = 0) -> int:
        torch = self._torch
        torch.cuda.synchronize(self._device)
        return step_transient(torch.cuda.max_memory_allocated(self._device), self._base,
                              torch.cuda.memory_allocated(self._device), kept, freed)

    def left(self) -> int:
        return self.in_use() - self._base


def meter_for(device) -> MemoryMeter:
    kind = getattr(device, "type", str(device))
    return CudaMeter(device) if kind == "cuda" else CpuMeter()


class PeakAttributor:
    """Which module was running when the step's high-water mark was last raised.

    Forward hooks on leaf modules read meter.peak() after each call; the module after which the
    running maximum last increased is the one that set the peak. Costs one meter read per module
    call, so it is used for the worst shape only.
    """

    def __init__(self, model, meter: MemoryMeter) -> None:
        self._meter = meter
        self._handles = []
        self._best = 0
        self.top_op: str | None = None
        for name, mod in model.named_modules():
            if next(mod.children(), None) is None:
                self._handles.append(mod.register_forward_hook(self._hook(name, mod)))

    def _hook(self, name: str, mod):
        label = f"{name} ({type(mod).__name__})"

        def hook(_module, _inp, _out):
            p = self._meter.peak()
            if p > self._best:
                self._best = p
                self.top_op = label

        return hook

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def __enter__(self) -> "PeakAttributor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def device_bytes_held(worker, meter, gc_generation: int = 2, clock=None, phase: str = "") -> int:
    """What this process holds on the device now. CUDA: free memory at worker init minus free
    now (vLLM's own total_consumed); CPU: RSS (what CPUWorker subtracts).

    Garbage is collected first so that cycles holding tensors do not count, and the allocator's
    cache released (it is reusable by any later step, so it is not held). A full collection of an
    unfrozen vLLM process walks every object: callers run this on a frozen heap
    (startup.profile_on_frozen_heap), where it walks only new objects; gc_generation=1 walks only
    the young generations, enough right after a full one. With a PhaseTimer, each part is timed
    as `<phase>.sync/.gc/.empty_cache`. At DEBUG it also logs what empty_cache released against
    what the allocator's stats call releasable."""
    if meter.device_kind == "cuda":
        import contextlib
        import gc

        import torch

        part = ((lambda name: clock(f"{phase}.{name}")) if clock is not None
                else (lambda name: contextlib.nullcontext()))
        with part("sync"):
            torch.cuda.synchronize()
        with part("gc"):
            gc.collect(gc_generation)
        debug = log.isEnabledFor(logging.DEBUG)
        if debug:  # a diagnostic only: the allocator's stats and one more free-memory read
            stats = torch.cuda.memory_stats()
            releasable = (stats.get("reserved_bytes.all.current", 0)
                          - stats.get("allocated_bytes.all.current", 0)
                          - stats.get("inactive_split_bytes.all.current", 0))
            free_before, _ = torch.cuda.mem_get_info()
        with part("empty_cache"):
            torch.cuda.empty_cache()
        free, _ = torch.cuda.mem_get_info()
        if debug:
            log.debug("[wcprof] %s: empty_cache released %d B; the allocator's stats called %d B "
                      "releasable", phase or "held", free - free_before, releasable)
        init = getattr(worker, "init_snapshot", None)
        return int(init.free_memory - free) if init is not None else meter.consumed()
    return meter.in_use()


def exact(meter) -> bool:
    """Whether `meter` reads the allocator's own counters (CUDA), not RSS with its noise: what
    core/cache_trust.replays_on_cut and core/audits.warmup_to_remember take as `exact`. False
    for no meter (a driver without one)."""
    return getattr(meter, "device_kind", "") == "cuda"


def reserved_bytes(meter) -> int:
    """What torch's caching allocator reserves on CUDA (its segments, live tensors or not); on
    the CPU what the process holds."""
    if meter.device_kind == "cuda":
        import torch

        return int(torch.cuda.memory_reserved(getattr(meter, "_device", None)))
    return meter.in_use()


def non_torch(meter, consumed: int) -> int:
    """CUDA: what the process holds outside torch's allocator (consumed less reserved); 0 on CPU."""
    return max(0, consumed - reserved_bytes(meter)) if meter.device_kind == "cuda" else 0
