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

from contextlib import contextmanager

import ctypes
import os
from typing import Protocol

_M_MMAP_THRESHOLD = -3


class MemoryMeter(Protocol):
    device_kind: str
    resolution_bytes: int

    def begin(self) -> None:
        """Synchronize, reset the high-water mark, remember the baseline."""

    def peak(self) -> int:
        """High-water mark since begin(), above the baseline (bytes). Cheap: callable per op."""

    def in_use(self) -> int:
        """What the process holds now (bytes): RSS on CPU, allocated on CUDA."""

    def end(self) -> int:
        """The step's transient: high-water mark above max(baseline, what the step left live).
        What a step leaves allocated (a grown workspace) is persistent, counted once in the
        consumed figure, not again as transient."""

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
    duration. A collection then only walks objects made since: a full collection of a vLLM
    process costs 0.3-0.5 s (this CPU and the H200 host alike; 690k objects), which made it 95% of
    a CPU sweep's time (CpuMeter.begin collects per step) and, twice over, most of what a cached
    start added on the H200 (the replay's KV teardown and the held-memory measurement each ran
    one). Cycles made while frozen are still collected. Garbage that already existed stays frozen,
    so it cannot be freed in the middle of a step and shrink a measured peak (collect just before
    entering, and there is none).

    Nests: only the outermost freezes. It freezes even when someone else already froze part of
    the heap (on the H200's vLLM 0.26 something has by the time the KV cache is sized; a check
    for that left the heap unfrozen in runs 8 and 9). gc.unfreeze() cannot undo only ours, so
    then the heap stays frozen on exit — what vLLM does to the whole heap after warm-up anyway —
    and it is unfrozen on exit only when nothing was frozen before. Also a decorator."""
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

    def end(self) -> int:
        v = _read_status_kb("VmHWM", "VmRSS")
        return max(0, v["VmHWM"] - max(self._base, v["VmRSS"]))

    def consumed(self) -> int:
        return self.in_use()


class CudaMeter:
    device_kind = "cuda"
    resolution_bytes = 1 << 20

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

    def end(self) -> int:
        torch = self._torch
        torch.cuda.synchronize(self._device)
        top = torch.cuda.max_memory_allocated(self._device)
        return max(0, top - max(self._base, torch.cuda.memory_allocated(self._device)))


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
