"""What warm-up will keep once the KV budget is fixed, measured before it is fixed.

vLLM's warm-up (compile_or_warm_up_model) runs after the KV cache is allocated and keeps memory
outside it: CUDA graphs, and buffers some warm-up steps create and keep (samplers, kernel
warm-ups, per-step state). Admission has to subtract both up front, or the first start of a
configuration fails the warm-up audit. On a first start (no cached sweep) this module measures
both; a cached start reuses what the earlier start measured.

  one_capture_profile(worker) around vLLM's own profile. On a first start, where nothing
                         captures after the FULL graphs (V2 0.32/0.33): its estimator captures
                         every FULL graph, once, measured exactly, and vLLM is handed back the
                         figure its two-sample estimate would have given (the report's stock KV
                         is stock's). Elsewhere observed_profile.
  observed_profile(worker) around vLLM's own profile, read-only: what vLLM's V2 estimator
                         captured (its samples, for the log line). vLLM's profile itself runs
                         as stock runs it, so its figure (the report's stock KV) is stock's.
  measure_graphs_apart(worker) after vLLM's profile, on a first start the one capture did not
                         measure (V1, a drafter, LoRA, inner graphs): the runner's estimator
                         once more, under exact_graphs: it captures every graph instead of
                         sampling two and extrapolating (V1: all descriptors; V2 0.29+: all
                         FULL descriptors), and the free memory the captures took is summed:
                         the exact graph memory. Its return value is dropped: with every FULL
                         graph sampled, V2's formula over-counts (core/graph_estimate.py).
  rehearse(...)          on a provisional KV cache: vLLM's own warm-up, with graph capture
                         replaced (no-op, or, on V2 runners without an estimator of their own,
                         0.26-0.28, a capture into a throwaway graph pool that is discarded);
                         what it kept that goes away with the provisional KV cache comes back
                         after the real one, so it is reserved (WarmupEstimate.other_bytes).
                         Its batch is vLLM's real warm-up batch where vLLM allows it
                         (full_warm_up_batch), not what the provisional cache's blocks hold.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

from ..core.graph_estimate import GraphProfile, describe
from ..sizes import fmt_bytes

log = logging.getLogger("vllm.wcprof")


@dataclass
class GraphMeasure:
    """Graph bytes summed over the captures the runner's estimator made under exact_graphs, apart
    from vLLM's own profile (None: nothing was captured, e.g. eager mode, or no estimator on
    this runner)."""

    bytes: int | None = None
    profile: GraphProfile | None = None   # V2 0.29+: what the estimator's capture sampled

    capture_warmup_bytes: int | None = None
    """The largest transient of a capture's eager warm-up run (V2 0.32+: each graph's descriptor
    runs once with graphs off before it is captured; min(size, max_num_seqs) requests, forward
    only), above what was allocated when it began and what it left: a step vLLM's start runs
    beside the KV cache, read before the KV decision. None where not metered."""
    capture_warmup_shape: tuple[int, int] | None = None  # its (tokens, requests)

    def add(self, n: int) -> None:
        self.bytes = (self.bytes or 0) + max(0, int(n))

    def warm_up_ran(self, tokens: int, reqs: int, transient: int) -> None:
        if self.capture_warmup_bytes is None or transient > self.capture_warmup_bytes:
            self.capture_warmup_bytes, self.capture_warmup_shape = int(transient), (tokens, reqs)

    def sampled(self, profile: GraphProfile | None) -> None:
        self.profile = profile


def _free_bytes() -> int:
    import torch

    torch.cuda.synchronize()
    return int(torch.cuda.mem_get_info()[0])


def free_bytes_emptied() -> int:
    """The device's free memory, synchronised, after the allocator's cache is emptied: how the
    start's held memory is read (startup's capture marks), and the start of a capture
    measurement. vLLM's capture_model empties the cache before it reads its own start, so blocks
    the cache held before a capture (such as what the estimator's minimal KV cache set-up left) are
    released inside it; read with them held, the capture's growth is offset by their release and
    the graphs read short by them (docs/gpu.md has the run that showed it)."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return _free_bytes()


class _AllDescs(list):
    """A descriptor list whose leading slices return every descriptor: vLLM's V1
    profile_cudagraph_memory profiles `descs[:2]`; with this it profiles all of them."""

    def __getitem__(self, item):
        if isinstance(item, slice) and item.start in (None, 0) and item.step in (None, 1):
            return list(self)
        return super().__getitem__(item)


@contextlib.contextmanager
def exact_graphs(worker, enabled: bool):
    """For the duration, the runner's CUDA-graph estimator captures every graph and the capture
    is measured (`enabled`: a first start on CUDA with graphs on; ranks must agree on it, as the
    captures run collectives). Yields a GraphMeasure. Around vLLM's own profile only inside
    one_capture_profile, which hands vLLM stock's figure back: V2's figure with every FULL graph
    sampled is not stock's (core/graph_estimate.py)."""
    measure = GraphMeasure()
    runner = getattr(worker, "model_runner", None)
    if not enabled or runner is None:
        yield measure
        return
    with contextlib.ExitStack() as stack:
        if hasattr(runner, "cudagraph_dispatcher") and hasattr(runner, "_warmup_and_capture"):
            stack.enter_context(_v1_all_descriptors(runner, measure))
        else:
            stack.enter_context(_v2_all_full_graphs(runner, measure))
        yield measure


def measure_graphs_apart(worker, enabled: bool) -> GraphMeasure:
    """The exact CUDA-graph memory of a first start, measured after vLLM's own profile: the
    runner's estimator runs once more, as vLLM runs it, inside exact_graphs (every graph
    captured into the estimator's throwaway pool, the capture measured, all of it released by
    the estimator's own teardown). vLLM's profile is left as stock runs it: inside it, sampling
    every FULL graph raised V2's figure, and with it the stock KV figure (7.47 GiB against
    stock's 0.92 GiB for the Llama-8B layout; core/graph_estimate.py says why). It also covers
    a given KV size, where vLLM's profile skips its estimate altogether. The estimator's return
    is dropped. Returns an empty GraphMeasure where it is not `enabled` (a first start on CUDA
    with graphs on; ranks agree, the captures run collectives) or on runners without an
    estimator (V2 before 0.29: the rehearsal captures into a throwaway pool instead)."""
    runner = getattr(worker, "model_runner", None)
    # vllm-touch: v2-graph-estimate
    if not enabled or runner is None or \
            getattr(runner, "profile_cudagraph_memory", None) is None or \
            needs_graph_rehearsal(runner):
        return GraphMeasure()
    with exact_graphs(worker, enabled=True) as measure, capture_warm_ups_metered(measure):
        figure = runner.profile_cudagraph_memory()
    beside = "" if measure.capture_warmup_bytes is None else \
        (f"; the widest eager warm-up before a capture ({measure.capture_warmup_shape[0]} "
         f"tokens over {measure.capture_warmup_shape[1]} requests) needed "
         f"{fmt_bytes(measure.capture_warmup_bytes)} beside what was held")
    if measure.profile is not None:
        log.info("[wcprof] every CUDA graph captured apart from vLLM's profile: %s (%s; vLLM's "
                 "estimator returned %s there, not used%s)", fmt_bytes(measure.bytes),
                 describe(measure.profile), fmt_bytes(figure), beside)
    elif measure.bytes is not None:
        log.info("[wcprof] every CUDA graph captured apart from vLLM's profile: %s%s",
                 fmt_bytes(measure.bytes), beside)
    return measure


@contextlib.contextmanager
def capture_warm_ups_metered(measure: GraphMeasure, cuda=None, manager_cls=None, mode_none=None):
    """For the duration, every V2 graph capture's eager warm-up (CudaGraphManager.capture makes
    create_forward_fn(desc, warmup=True), which builds the descriptor's inputs and attention
    metadata, then runs it with graphs off) is metered on its own: synchronised and the
    allocator's high-water mark reset before that function is made, read after its run with
    graphs off; its transient above max(what was allocated before, what it left) is kept in
    `measure` with its (tokens, requests). The function made for the capture itself
    (warmup=False) is left as it is: nothing may synchronise inside a capture. The mark is reset
    per warm-up, so no other peak meter may be open around it. A no-op where vLLM has no such
    manager (V1, 0.26-0.31) or the device is not CUDA. `cuda`, `manager_cls`, `mode_none`: the
    allocator API (torch.cuda), the manager class and CUDAGraphMode.NONE (tests pass fakes)."""
    # vllm-touch: v2-graph-estimate
    if cuda is None or manager_cls is None or mode_none is None:
        try:
            import torch
            from vllm.v1.worker.gpu import cudagraph_utils
        except ImportError:
            yield
            return
        mode_cls = getattr(cudagraph_utils, "CUDAGraphMode", None)
        cuda = cuda or (torch.cuda if torch.cuda.is_available() else None)
        manager_cls = manager_cls or getattr(cudagraph_utils, "CudaGraphManager", None)
        mode_none = mode_none if mode_none is not None else getattr(mode_cls, "NONE", None)
    original = getattr(manager_cls, "capture", None)
    if cuda is None or original is None or mode_none is None:
        yield
        return

    def capture(self, create_forward_fn, *args, **kwargs):
        def create(desc, warmup):
            if not warmup:
                return create_forward_fn(desc, warmup)
            tokens = int(desc.num_tokens)
            reqs = int(getattr(desc, "num_reqs", None) or
                       min(tokens, int(getattr(self, "max_num_reqs", tokens))))
            cuda.synchronize()
            base = cuda.memory_allocated()
            cuda.reset_peak_memory_stats()
            fn = create_forward_fn(desc, warmup)

            def run(cg_mode):
                out = fn(cg_mode)
                if cg_mode == mode_none:
                    cuda.synchronize()
                    left = cuda.memory_allocated()
                    measure.warm_up_ran(tokens, reqs,
                                        max(0, cuda.max_memory_allocated() - max(base, left)))
                return out
            return run
        return original(self, create, *args, **kwargs)

    with replaced(manager_cls, "capture", capture):
        yield


@dataclass
class MeterReading:
    """What `metered` read: `bytes`, the high-water mark above what the block left live (the
    transient its steps needed beside what was held), and `peak`, the mark above the block's
    start; both None where the meter could not be read."""
    bytes: int | None = None
    peak: int | None = None
    meter: object = None

    def mark(self) -> int | None:
        """The high-water mark so far, above the block's start (None: no meter); never raises."""
        try:
            return None if self.meter is None else int(self.meter.peak())
        except Exception:  # noqa: BLE001 - a reading, never the start's failure
            return None

    def open(self, meter_for, device) -> None:
        """Begin on `meter_for(device)`; a meter that fails leaves the reading empty."""
        try:
            meter = meter_for(device)
            meter.begin()
            self.meter = meter
        except Exception:  # noqa: BLE001 - a reading for the log, never the start's failure
            self.meter = None

    def close(self) -> None:
        """Read the mark and the transient; a meter that fails leaves both None."""
        if self.meter is None:
            return
        try:
            self.peak = int(self.meter.peak())
            self.bytes = int(self.meter.end())
        except Exception:  # noqa: BLE001
            self.peak = self.bytes = None


@contextlib.contextmanager
def metered(worker, enabled: bool = True, meter_for=None):
    """For the duration, the device's meter (`meter_for(device)`, default adapter/meters') from a
    reset high-water mark; the MeterReading it yields is filled on exit. Never raises for the
    meter: a meter that fails leaves the reading empty and the block runs as it would have."""
    if meter_for is None:
        from .meters import meter_for

    reading = MeterReading()
    if enabled:
        reading.open(meter_for, getattr(worker, "device", "cpu"))
    yield reading
    reading.close()


@contextlib.contextmanager
def observed_profile(worker, enabled: bool):
    """Around vLLM's own profile, read-only: yields a GraphMeasure whose `profile` is what V2's
    estimator (0.29+) captured, for the log line. runner.capture_model is wrapped to read the
    FULL samples vLLM took; it returns vLLM's value unchanged and synchronizes nothing, so the
    figure vLLM computes is stock's. A no-op elsewhere."""
    seen = GraphMeasure()
    runner = getattr(worker, "model_runner", None)
    original = getattr(runner, "capture_model", None)
    if not enabled or original is None or hasattr(runner, "cudagraph_dispatcher") or \
            needs_graph_rehearsal(runner):
        yield seen
        return

    def capture_model(*a, **kw):
        out = original(*a, **kw)
        if kw.get("profile_only"):
            seen.sampled(_sampled(runner, out))
        return out

    # vllm-touch: runner-capture-model
    with replaced(runner, "capture_model", capture_model):
        yield seen
    estimate = getattr(worker, "cudagraph_memory_estimate", None)
    if seen.profile is not None:
        log.info("[wcprof] vLLM's own CUDA-graph estimate %s, its profile as stock runs it (%s)",
                 fmt_bytes(estimate), describe(seen.profile, _int_or_none(estimate)))


class _StockSamples(list):
    """The FULL capture samples of one capture of every FULL graph; the device's free memory is
    read right after the `k`-th (the last graph stock's estimator would capture)."""

    def __init__(self, k: int):
        super().__init__()
        self.k, self.free_after_k = k, None

    def append(self, x) -> None:
        super().append(x)
        if len(self) == self.k:
            self.free_after_k = _free_bytes()  # vLLM synchronized just before its sample


def one_capture_why_not(runner) -> str | None:
    """Why vLLM's own profile cannot also be the exact graph measurement on this runner (None:
    it can). It needs vLLM 0.32/0.33's V2 estimator (FULL samples, the extrapolation) and nothing
    captured or freed after the FULL graphs: no speculator, no model state capturing inner
    graphs, no LoRA (whose dummy adapters are freed before vLLM reads the end of the capture),
    no KV connector but the no-op one (vLLM's base KVConnector)."""
    try:
        # vllm-touch: v2-graph-estimate
        from vllm.v1.worker.gpu import cudagraph_utils as cgu
    except ImportError:
        return "no V2 runner in this vLLM"
    if hasattr(runner, "cudagraph_dispatcher"):
        return "the V1 runner"
    for name in ("_FULL_GRAPH_PROFILING_SAMPLES", "_extrapolate_full_graph_memory",
                 "profile_cudagraph_memory"):
        if not hasattr(cgu, name):
            return f"this vLLM's estimator has no {name}"
    if not hasattr(runner, "cudagraph_manager") or getattr(runner, "capture_model", None) is None:
        return "the runner has no graph manager"  # (vLLM's estimator makes the manager itself)
    if getattr(runner, "speculator", None) is not None:
        return "a drafter captures its graphs after the FULL ones"
    if getattr(runner, "lora_config", None) is not None:
        return "LoRA"
    connector = getattr(runner, "kv_connector", None)
    if connector is not None and type(connector).__name__ != "KVConnector":
        return f"a KV connector ({type(connector).__name__}) resets its capture state after them"
    state = getattr(runner, "model_state", None)
    inner = getattr(type(state), "capture_inner_cudagraphs", None)
    if inner is not None and getattr(inner, "__qualname__", "").split(".")[0] != "ModelState":
        return f"{type(state).__name__} captures inner graphs after the FULL ones"
    return None


@contextlib.contextmanager
def one_capture_profile(worker, enabled: bool, exact: bool):
    """Around vLLM's own profile. With `exact` (a first start: the exact graph memory is wanted)
    and where one_capture_why_not allows, vLLM's estimator captures every FULL graph instead of
    two, so its one capture is also the exact measurement, and measure_graphs_apart's second
    capture is not made (issue 34: graphs captured once per start beside the real capture); the
    capture warm-ups are metered as there. vLLM is handed back the figure its own estimator
    would have given (core/graph_estimate.stock_from_one_capture), so the stock KV figure is
    stock's; the figure vLLM then kept is checked against it and a difference is logged.
    Elsewhere observed_profile's read-only watch. Yields a GraphMeasure: `bytes` the exact graph
    memory (measured as measure_graphs_apart measures it), None where the capture was not made
    here (the caller measures apart)."""
    runner = getattr(worker, "model_runner", None)
    why = one_capture_why_not(runner) if enabled and exact and runner is not None else "off"
    if why is not None:
        if enabled and exact and why != "off":
            log.info("[wcprof] CUDA graphs are measured apart from vLLM's profile (%s)", why)
        with observed_profile(worker, enabled) as seen:
            yield seen
        return
    # vllm-touch: v2-graph-estimate
    from vllm.v1.worker.gpu import cudagraph_utils as cgu

    from ..core.graph_estimate import stock_from_one_capture

    k = int(cgu._FULL_GRAPH_PROFILING_SAMPLES)
    handed: dict[str, object] = {}
    # exact_graphs: every FULL graph captured and measured, as measure_graphs_apart measures
    # them; inside it, the samples are read so that vLLM gets stock's figure back
    with exact_graphs(worker, enabled=True) as measure, capture_warm_ups_metered(measure):
        measuring = runner.capture_model

        def capture_model(*a, **kw):
            # vllm-touch: v2-graph-estimate
            if not kw.get("profile_only"):
                return measuring(*a, **kw)
            manager = runner.cudagraph_manager
            vllms, ours = manager._capture_mem_samples, _StockSamples(k)
            manager._capture_mem_samples = ours
            try:
                out = int(measuring(*a, **kw))
            finally:
                manager._capture_mem_samples = vllms
                if vllms is not None:
                    vllms.extend(ours)  # vLLM's formula reads its own list
            profile = measure.profile
            if profile is None:  # not 0.32/0.33's manager: vLLM's figure is over every FULL graph
                log.warning("[wcprof] vLLM's graph manager kept no FULL samples: its CUDA-graph "
                            "estimate, and the report's stock KV, are over every FULL graph, "
                            "not stock's two")
                return out
            stock, figure, back = stock_from_one_capture(
                out, _free_bytes(), ours.free_after_k, profile.full_samples, profile.full_graphs,
                k, cgu._extrapolate_full_graph_memory)
            handed.update(stock=stock, figure=figure)
            return back

        with replaced(runner, "capture_model", capture_model):
            yield measure
    kept = _int_or_none(getattr(worker, "cudagraph_memory_estimate", None))
    if "figure" not in handed:
        measure.bytes = None  # nothing sampled: the caller measures apart
        return
    figure = handed["figure"]
    log.info("[wcprof] every CUDA graph captured once, in vLLM's own profile: %s (%s); vLLM "
             "kept its own estimate, %s (%s)", fmt_bytes(measure.bytes), describe(measure.profile),
             fmt_bytes(figure), describe(handed["stock"]))
    if kept is not None and kept != figure:
        log.warning("[wcprof] vLLM kept a CUDA-graph estimate of %s where its own two-sample "
                    "formula gives %s: the report's stock KV figure may not be stock's "
                    "(this vLLM's estimator is not the one read from 0.32/0.33; "
                    "docs/vllm-hooks.md)",
                    fmt_bytes(kept), fmt_bytes(figure))


def _int_or_none(v) -> int | None:
    try:
        return None if v is None else int(v)
    except (TypeError, ValueError):
        return None


def _sampled(runner, measured) -> GraphProfile | None:
    """What vLLM's V2 estimator sampled in the capture that just returned `measured`: its FULL
    samples (the list profile_cudagraph_memory hands the manager) and the FULL graph count.
    None where the runner does not have them as 0.32/0.33 do; never raises."""
    # vllm-touch: v2-graph-estimate
    try:
        manager = getattr(runner, "cudagraph_manager", None)
        samples = getattr(manager, "_capture_mem_samples", None)
        descs = getattr(manager, "_capture_descs", None)
        if samples is None or not isinstance(descs, dict):
            return None
        full = next((len(d) for mode, d in descs.items()
                     if getattr(mode, "name", None) == "FULL"), 0)
        return GraphProfile(measured_bytes=int(measured),
                            full_samples=tuple(int(x) for x in samples), full_graphs=int(full))
    except (TypeError, ValueError, AttributeError):
        return None


@contextlib.contextmanager
def _v1_all_descriptors(runner, measure: GraphMeasure):
    # vllm-touch: v1-graph-estimate
    dispatcher = runner.cudagraph_dispatcher
    original_descs = dispatcher.get_capture_descs
    original_capture = runner._warmup_and_capture

    def get_capture_descs(*a, **kw):
        return [(mode, _AllDescs(descs)) for mode, descs in original_descs(*a, **kw)]

    def warmup_and_capture(*a, **kw):
        # held, not emptied: vLLM's V1 estimator empties the cache once before its descriptor
        # loop, and each capture's torch.cuda.graph releases what the last one left cached
        # inside the next window, so the windows' sum telescopes to the graphs and one cache;
        # emptied starts would add every descriptor's leftover cache once more
        before = _free_bytes()
        out = original_capture(*a, **kw)
        measure.add(before - _free_bytes())
        return out

    dispatcher.get_capture_descs = get_capture_descs
    runner._warmup_and_capture = warmup_and_capture
    try:
        yield
    finally:
        del dispatcher.get_capture_descs
        del runner._warmup_and_capture


@contextlib.contextmanager
def _v2_all_full_graphs(runner, measure: GraphMeasure):
    # vllm-touch: v2-graph-estimate
    try:
        from vllm.v1.worker.gpu import cudagraph_utils
    except ImportError:
        yield
        return
    if not hasattr(cudagraph_utils, "_FULL_GRAPH_PROFILING_SAMPLES") or \
            not hasattr(cudagraph_utils, "profile_cudagraph_memory"):
        yield  # no estimator of its own (0.26-0.28): the rehearsal measures the graphs
        return
    saved = cudagraph_utils._FULL_GRAPH_PROFILING_SAMPLES
    original_capture = runner.capture_model

    def capture_model(*a, **kw):
        before = free_bytes_emptied()
        out = original_capture(*a, **kw)
        measure.add(before - _free_bytes())
        if kw.get("profile_only"):
            measure.sampled(_sampled(runner, out))
        return out

    cudagraph_utils._FULL_GRAPH_PROFILING_SAMPLES = 1 << 30
    runner.capture_model = capture_model
    try:
        yield
    finally:
        cudagraph_utils._FULL_GRAPH_PROFILING_SAMPLES = saved
        del runner.capture_model


def needs_graph_rehearsal(runner) -> bool:
    """V2 runners whose vLLM has no CUDA-graph estimator of its own (0.26-0.28)."""
    if hasattr(runner, "cudagraph_dispatcher"):
        return False
    try:
        # vllm-touch: v2-graph-estimate
        from vllm.v1.worker.gpu import cudagraph_utils
    except ImportError:
        return False
    return not hasattr(cudagraph_utils, "profile_cudagraph_memory")


@dataclass
class Rehearsal:
    kept_bytes: int       # held memory the warm-up added, on the provisional KV cache
    graphs_bytes: int     # of it, what graph capture took (V2 0.26-0.28 only; else 0)
    seconds: float
    transient_bytes: int | None = None  # its high-water mark above what it kept (for the log)


def rehearse(worker, warm_up, held_now, *, graphs: bool) -> Rehearsal:
    """Run `warm_up()` (vLLM's own compile_or_warm_up_model, unwrapped) on the provisional KV
    cache the caller holds, with graph capture replaced, and measure what it kept.
    `held_now()` reads the held device memory. graphs=True: on runners that need it, capture
    the graphs for real into a throwaway pool, measure, discard."""
    import time

    runner = worker.model_runner
    t0 = time.perf_counter()
    before = held_now()
    measured = GraphMeasure()
    with _graph_capture_replaced(runner, measured, capture=graphs and needs_graph_rehearsal(runner)), \
            full_warm_up_batch(runner), _end_of_warm_up_deferred(worker), \
            stall_watch("the warm-up rehearsal"), metered(worker) as transient:
        warm_up()
    kept = max(0, held_now() - before)
    return Rehearsal(kept_bytes=kept, graphs_bytes=measured.bytes or 0,
                     seconds=time.perf_counter() - t0, transient_bytes=transient.bytes)


STALL_DUMP_S = 120.0
"""A rehearsal still running after this long logs one warning and writes every thread's Python
stack to stderr (the engine log), once: what it waits on, without stopping it. A long warm-up
(autotuning, a large model's kernels) can pass it and is not a hang; the line says so."""


@contextlib.contextmanager
def stall_watch(what: str, after_s: float = STALL_DUMP_S):
    """For the duration, a daemon timer: if it lasts longer than `after_s` seconds, one warning
    line, then every thread's stack on stderr (a GPU kernel that never ends shows as the host
    sync waiting on it). Leaves any faulthandler timer of the process alone."""
    import faulthandler
    import sys
    import threading

    def dump():
        log.warning("[wcprof] %s has run for %.0f s: every thread's stack follows on stderr "
                    "(a long warm-up is not necessarily a hang; it goes on)", what, after_s)
        try:
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        except (RuntimeError, ValueError, OSError, AttributeError):  # no usable stderr
            pass

    done = threading.Event()

    def watch():
        if not done.wait(after_s):
            dump()

    threading.Thread(target=watch, name="wcprof-stall-watch", daemon=True).start()
    try:
        yield
    finally:
        done.set()


@contextlib.contextmanager
def replaced(obj, name: str, value):
    """`obj.name` is `value` for the duration (an instance or module attribute over whatever the
    class or module had); afterwards the object's own earlier value again, or none. The swap
    behind the touches that name it."""
    # vllm-touch: runner-capture-model
    # vllm-touch: v2-warmup-null-block
    # vllm-touch: warm-up-serving-checks
    own = vars(obj)
    had, old = name in own, own.get(name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        if had:
            setattr(obj, name, old)
        else:
            delattr(obj, name)


@contextlib.contextmanager
def _end_of_warm_up_deferred(worker):
    """vLLM ends its warm-up by switching on checks meant for serving: the kernel JIT monitor
    (any later compile is logged, or raised in its "error" mode; 0.32 through the worker's
    _maybe_activate_jit_monitor, 0.26 through vllm.utils.jit_monitor.activate, which the 0.26
    warm-up imports at call time, so it too comes on inside the rehearsal unless replaced) and,
    under VLLM_GPU_SYNC_CHECK, the sync check (0.26+). After the rehearsal the real warm-up still
    has to run, so for the rehearsal both stay off; the real warm-up switches them on as usual.

    It ends too by freezing the heap (`freeze_gc_heap`: gc.freeze() after full collections, 0.32+).
    Inside the rehearsal that would freeze any reference cycle holding a view of the provisional
    KV cache, which only the collector frees (the V1 runner's teardown,
    `_cleanup_profiling_kv_cache`, drops its references and collects): the cache would stay
    held. The freeze, and vLLM's gc debug callback beside it, wait for the real warm-up too."""
    # vllm-touch: warm-up-serving-checks
    import sys

    fn = getattr(type(worker), "compile_or_warm_up_model", None)
    fn = getattr(fn, "_wcprof_original", fn)  # the module whose globals vLLM's warm-up reads
    module = sys.modules.get(getattr(fn, "__module__", None) or type(worker).__module__)
    off = lambda *a, **kw: None  # noqa: E731
    try:  # 0.26 calls the monitor's activate() directly, imported at call time
        import importlib

        jit = importlib.import_module("vllm.utils.jit_monitor")
    except ImportError:
        jit = None
    with contextlib.ExitStack() as stack:
        if callable(getattr(worker, "_maybe_activate_jit_monitor", None)):
            stack.enter_context(replaced(worker, "_maybe_activate_jit_monitor", off))
        if callable(getattr(jit, "activate", None)):
            stack.enter_context(replaced(jit, "activate", off))
        for name in ("enable_gpu_sync_check", "freeze_gc_heap", "maybe_attach_gc_debug_callback"):
            if module is not None and callable(getattr(module, name, None)):
                stack.enter_context(replaced(module, name, off))
        yield


@contextlib.contextmanager
def full_warm_up_batch(runner):
    """vLLM's V2 warm-up (0.26+: `warmup.warmup_kernels`) runs as many requests as the KV cache's
    blocks hold, at most max_num_seqs. On the provisional cache (one request's blocks) that is a
    few requests where the real cache gives hundreds, and what the sampler and kernels keep grows
    with that batch (about 12 B per vocabulary entry per request: gigabytes for a large
    vocabulary at hundreds of requests; docs/sweep.md has the measured case). Where vLLM can send
    every KV and state write to one block (0.32+:
    `BlockTables.redirect_writes_to_null_block`, which its elastic-EP re-warm-up uses), the
    rehearsal sets it, so the warm-up skips that cap and runs its full batch on the provisional
    cache (`warmup_kernels`; other warm-ups that size themselves by the cache's blocks, a mixed
    prefill-decode warm-up or an SSM autotune, still see the provisional one). Yields whether it
    could; where it cannot, the warm-up audit stays the check.

    Not the null block itself: block 0 is vLLM's padding marker, and the Mamba/GDN kernels skip
    a sequence whose state index is 0, leaving outputs made with torch.empty unwritten, so every
    later layer, the drafter and the samplers ran on uninitialised memory (the Qwen3.5 hybrid
    with MTP and graphs never finished that rehearsal). Each KV group's writes go
    to a scratch block of its own instead (group g: block 1 + g, real blocks of the provisional
    cache that nothing else holds), so every kernel computes on finite data; the requests share
    it, which changes values, not what the warm-up allocates."""
    # vllm-touch: v2-warmup-null-block
    tables = getattr(runner, "block_tables", None)
    if tables is None or not isinstance(
            getattr(type(tables), "redirect_writes_to_null_block", None), bool) or \
            not callable(getattr(tables, "append_block_ids", None)):
        yield False
        return
    groups = int(getattr(tables, "num_kv_cache_groups", 0) or 0)
    blocks = int(getattr(getattr(runner, "kv_cache_config", None), "num_blocks", 0) or 0)
    if groups < 1 or blocks <= groups:
        yield False
        return
    original = tables.append_block_ids

    def append_block_ids(req_index, new_block_ids, *args, **kwargs):
        scratch = tuple([1 + g] * len(ids) for g, ids in enumerate(new_block_ids))
        with replaced(tables, "redirect_writes_to_null_block", False):
            return original(req_index, scratch, *args, **kwargs)

    with replaced(tables, "redirect_writes_to_null_block", True), \
            replaced(tables, "append_block_ids", append_block_ids):
        yield True


@contextlib.contextmanager
def _graph_capture_replaced(runner, measure: GraphMeasure, capture: bool):
    # vllm-touch: runner-capture-model
    original = getattr(runner, "capture_model", None)
    if original is None:
        yield
        return

    def no_capture(*a, **kw):
        return 0

    def throwaway_capture(*a, **kw):
        with _throwaway_graph_pool(runner):
            before = free_bytes_emptied()
            original(*a, **kw)
            measure.add(before - _free_bytes())
        return 0

    with replaced(runner, "capture_model", throwaway_capture if capture else no_capture):
        yield


@contextlib.contextmanager
def _throwaway_graph_pool(runner):
    """Graphs captured into a pool of their own and discarded afterwards (what vLLM 0.29+'s own
    profile_cudagraph_memory does): the global pool the real capture uses is never touched."""
    # vllm-touch: v2-graph-estimate
    from vllm.compilation.cuda_graph import CUDAGraphWrapper
    from vllm.platforms import current_platform

    platform_cls = type(current_platform)
    saved_global = platform_cls._global_graph_pool
    throwaway = current_platform.graph_pool_handle()
    platform_cls._global_graph_pool = throwaway
    manager = getattr(runner, "cudagraph_manager", None)
    saved_manager_pool = getattr(manager, "pool", None)
    wrappers = list(CUDAGraphWrapper._all_instances)
    saved_pools = {id(w): w.graph_pool for w in wrappers}
    if manager is not None:
        manager.pool = throwaway
    for w in wrappers:
        w.graph_pool = throwaway
    try:
        yield
    finally:
        CUDAGraphWrapper.clear_all_graphs()
        for w in wrappers:
            w.graph_pool = saved_pools[id(w)]
        if manager is not None:
            manager.pool = saved_manager_pool
        platform_cls._global_graph_pool = saved_global
