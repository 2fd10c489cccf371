"""What the worker is: its limits, rank, device, engine config and attention backends, and what
the process holds on the device right now. Read by the engine flow (engine.py) and by the sweep
cache's key (sweeping.py)."""

from __future__ import annotations

import logging
import os

from ..errors import WcprofError
from ..report import DeviceInfo, EngineConfig
from ..shapes import Limits

log = logging.getLogger("vllm.wcprof")


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


def world_rank() -> int:
    try:
        from vllm.distributed import get_world_group

        return int(get_world_group().rank)
    except Exception:  # noqa: BLE001 - before distributed init (CLI tests): rank 0
        return 0


def agree_max_fn():
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


def device_info(worker) -> DeviceInfo:
    dev = getattr(worker, "device", None)
    if getattr(dev, "type", "cpu") == "cuda":
        import torch

        props = torch.cuda.get_device_properties(dev)
        return DeviceInfo(kind="cuda", name=props.name, total_bytes=int(props.total_memory))
    import psutil

    return DeviceInfo(kind="cpu", name=os.uname().machine, total_bytes=int(psutil.virtual_memory().total))


def engine_config(vllm_config) -> EngineConfig:
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


def attention_backends(runner) -> list[str]:
    names = set()
    for layer in runner.vllm_config.compilation_config.static_forward_context.values():
        impl = getattr(layer, "impl", None)
        if impl is not None:
            names.add(type(impl).__name__)
    return sorted(names)


def requested_bytes(worker) -> int:
    for attr in ("requested_memory", "requested_cpu_memory"):
        v = getattr(worker, attr, None)
        if v:
            return int(v)
    raise WcprofError(f"{type(worker).__name__} exposes no requested memory figure",
                      hint="unsupported worker class for worstcase_profiler")


def device_bytes_held(worker, meter, gc_generation: int = 2, clock=None, phase: str = "") -> int:
    """What this process holds on the device now. CUDA: free memory at worker init minus free now
    (vLLM 0.32's total_consumed); CPU: RSS (what CPUWorker subtracts).

    Garbage is collected first so that cycles holding tensors do not count, and the allocator's
    cache released. A full collection of an unfrozen vLLM process walks every object (0.45 s of
    the 0.46 s this took on the H200, run 9; synchronize and empty_cache ~0.002 s): the engine
    calls it on a frozen heap (engine.profile_on_frozen_heap), where it walks only new objects.
    gc_generation=1 walks only the young generations, enough right after a full one. With a
    PhaseTimer, each part is timed as `<phase>.sync/.gc/.empty_cache`. The DEBUG line compares
    what empty_cache released with what the allocator's stats call releasable: equal in eager
    runs, not after graph capture (run 11), so empty_cache stays."""
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


def non_torch(meter, consumed: int) -> int:
    if meter.device_kind == "cuda":
        import torch

        return max(0, consumed - int(torch.cuda.memory_reserved()))
    return 0


def cudagraph_applied(worker) -> int:
    est = int(getattr(worker, "cudagraph_memory_estimate", 0) or 0)
    try:
        import vllm.envs as envs

        return est if getattr(envs, "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS", True) else 0
    except Exception:  # noqa: BLE001
        return est
