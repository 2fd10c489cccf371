"""StepDrivers: synthetic forward passes at real KV extent through vLLM's own model runners, each
measured by the device's meter (the core's sweep decides which steps run; core/sweep.py).

V1 runner (vLLM 0.26 / 0.32 GPU and CPU):
  `_dummy_run(R, force_attention=True, profile_seq_lens=S, is_profile=True, skip_eplb=True)` builds
  attention metadata for min(R, scheduler_config.max_num_seqs) requests, each with seq_len S. We
  pin `scheduler_config.max_num_seqs` to the shape's request count for the call (read at call time;
  restored in `finally`). Slot mappings are -1, so nothing is written to the KV cache.
V2 runner: see runner_v2.py.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time

from ..core.readings import measure_again
from ..core.shapes import Limits, most_requests, stock_shape
from ..core.sweep import stock_readings
from ..core.types import ProvisionalKV, Shape, StepResult
from ..errors import DoesNotFit
from ..sizes import fmt_bytes
from . import kv as kvmod
from . import workspace as ws
from .meters import PeakAttributor
from .versions import unsupported

log = logging.getLogger("vllm.wcprof")


def _set_config_ctx(vllm_config):
    # vllm-touch: kv-cache-config
    try:
        from vllm.config import set_current_vllm_config
    except ImportError:  # pragma: no cover - very old vLLM
        return contextlib.nullcontext()
    return set_current_vllm_config(vllm_config)


def init_provisional_kv(runner, limits: Limits, meter, num_blocks: int, initialize,
                        on_error=None):
    """Build and initialise a KV cache of `num_blocks` blocks; measure what it cost. Whatever the
    process grew beyond the KV tensors themselves (metadata builders, input buffers) is what vLLM
    allocates after its own profile: `post_profile_bytes`."""
    cfg = kvmod.kv_cache_config_with_blocks(runner, num_blocks)
    before = meter.in_use()
    try:
        initialize(cfg)
    except (MemoryError, RuntimeError) as e:
        if on_error is not None:
            on_error()
        if "out of memory" in str(e).lower() or isinstance(e, MemoryError):
            raise DoesNotFit(
                f"a provisional KV cache of {num_blocks} blocks (one request at "
                f"max_model_len={limits.max_model_len}, or the widest step's requests) does "
                f"not fit next to the weights",
                hint="lower --max-model-len or use a device with more memory") from e
        raise
    grown = meter.in_use() - before
    kv_bytes = kvmod.allocated_kv_bytes(runner)
    return cfg, ProvisionalKV(num_blocks=cfg.num_blocks, kv_bytes=kv_bytes,
                              post_profile_bytes=max(0, grown - kv_bytes))


def _layer_kind(layer) -> tuple:
    """What makes two decoder layers alike for memory: their class, their children's classes
    (attention vs linear attention, MoE vs dense MLP) and any sliding window."""
    kids = tuple((name, type(m).__name__) for name, m in layer.named_children())
    windows = tuple(sorted({str(getattr(m, "sliding_window", None)) for m in layer.modules()
                            if hasattr(m, "sliding_window")}))
    return type(layer).__name__, kids, windows


def decoder_cut(model, prefix: bool = False) -> tuple[object, tuple[int, ...], int]:
    """(decoder module, the indices of the layers kept, layers in all): the first layer of every
    kind, in order (a hybrid of three linear-attention layers to one attention layer keeps 2, a
    sliding-window model with one global layer in six keeps 2, not the prefix of 4 or 6 up to
    the first of its last kind). With `prefix`, and where a drafter is fed by hidden states of
    early layers (so that the layers it reads stay where it reads them), the shortest prefix
    holding every kind instead.
    ValueError when the model has no such decoder (vLLM's start_layer/end_layer loop), runs
    under the runner's model.compile(), is split by pipeline parallelism, has no two layers
    alike, or has a drafter reading layers beyond that prefix. A decoder vLLM compiles itself
    can be cut: its compiled call is bypassed for the cut steps (runs_compiled)."""
    # vllm-touch: decoder-depth
    decoder = None
    for _name, mod in model.named_modules():
        layers = getattr(mod, "layers", None)
        if isinstance(getattr(mod, "start_layer", None), int) and \
                isinstance(getattr(mod, "end_layer", None), int) and layers is not None:
            decoder = mod
            break
    if decoder is None:
        raise ValueError("no decoder with a start_layer/end_layer layer loop")
    # the runner's model.compile() of vLLM's STOCK_TORCH_COMPILE mode (nn.Module's
    # _compiled_call_impl on the model or the decoder): nothing of vLLM's to bypass it with
    if any(getattr(m, "_compiled_call_impl", None) is not None for m in (model, decoder)):
        raise ValueError("the model runs compiled by the runner's model.compile() (torch.compile "
                         "bakes the layer loop into its graph); the cut-down sweep needs a "
                         "forward it can run eagerly")
    total = len(decoder.layers)
    if decoder.start_layer != 0 or decoder.end_layer != total:
        raise ValueError("the decoder is split by pipeline parallelism")
    kinds = [_layer_kind(layer) for layer in decoder.layers]
    firsts = tuple(sorted(kinds.index(k) for k in set(kinds)))
    shortest = firsts[-1] + 1
    aux = [int(i) for m in (model, decoder) for i in getattr(m, "aux_hidden_state_layers", ()) or ()]
    prefix = prefix or bool(aux)
    if len(firsts) >= total:
        raise ValueError(f"no two of its {total} layers are alike")
    if prefix and shortest >= total:
        raise ValueError(f"the shortest prefix holding every kind of layer is all {total} ("
                         + (f"a drafter reads the hidden states of layers {sorted(set(aux))}"
                            if aux else "sweep_depth=cut-down keeps the prefix its family's "
                                        "proof ran") + ")")
    # A drafter fed by hidden states of middle layers (EAGLE3, DFlash, DSpark, hidden-state
    # extraction): the cut forward would collect none of those and return another type; the
    # loop numbers the layers it runs, so those it collects must be the prefix's own.
    if aux and max(aux) > decoder.start_layer + shortest:
        raise ValueError(f"a drafter reads the hidden states of layers {sorted(set(aux))}, beyond "
                         f"the {shortest} layer(s) a cut keeps")
    return decoder, tuple(range(shortest)) if prefix else firsts, total


def _is_prefix(kept: tuple[int, ...]) -> bool:
    return kept == tuple(range(len(kept)))


def cut_label(kept: tuple[int, ...], total: int) -> str:
    """What a cut keeps, as the report's depth says it: "1 of 32 layers", or "2 of 48 layers
    (0, 5)" where the kept layers are not the decoder's first ones."""
    where = "" if _is_prefix(kept) else f" ({', '.join(map(str, kept))})"
    return f"{len(kept)} of {total} layers{where}"


def compile_sizes_and_ranges(cc) -> tuple[list[int], list[tuple[int, int]]]:
    """A compilation_config's compile sizes (the integers, ascending, once each) and compile
    ranges as (start, end), inclusive; raises where they cannot be read. What both the graphs
    by size (compile_graph_ranges) and the compile warm-up's sizes (facts) are built from."""
    # vllm-touch: worker-config
    sizes = sorted({int(x) for x in (getattr(cc, "compile_sizes", None) or [])
                    if isinstance(x, int)})
    return sizes, [(int(r.start), int(r.end)) for r in cc.get_compile_ranges()]


def compile_graph_ranges(vllm_config) -> tuple[tuple[int, int], ...] | None:
    """The token counts vLLM compiles a graph of its own for (0.32 and 0.33 PiecewiseBackend):
    each compile size as (size, size), first (a size's graph is picked before its range's),
    then each compile range (start, end), inclusive; the last range reaches
    max_num_batched_tokens. One range and no size: one graph serves every batch size. None
    where the config cannot be read."""
    # vllm-touch: worker-config
    cc = vllm_config.compilation_config
    try:
        sizes, ranges = compile_sizes_and_ranges(cc)
    except Exception:  # noqa: BLE001 - unread: the caller treats the graphs as unknown
        return None
    if not ranges:
        return None
    return tuple([(x, x) for x in sizes if (x, x) not in ranges] + ranges)


def compiled_modules(model) -> list:
    """The modules vLLM runs through a torch.compile graph of their own (support_torch_compile's
    do_not_compile False): the decoder, and any parent that compiles it inside its own graph.
    Such a graph has the layer loop baked in, so a cut step sets do_not_compile on all of them
    for its duration and runs the Python forwards instead."""
    return [m for m in model.modules() if getattr(m, "do_not_compile", True) is False]


def runs_compiled(model) -> bool:
    return bool(compiled_modules(model))


def is_v2_runner(runner) -> bool:
    return type(runner).__module__.startswith(("vllm.v1.worker.gpu.", "vllm.v1.worker.cpu."))


class DriverBase:
    """What every StepDriver shares: how a step is measured (the meter around it, the workspace
    it asks for, the op that set its peak) and rank agreement. Subclasses run the steps:
    `run_stock()` and `run(shape)`."""

    _agree = None
    _requests: "ws.RequestRecorder"
    meter = None
    model = None
    limits: Limits

    def agree_max(self, value: int) -> int:
        """Max over every rank (identity on one rank): keeps adaptive decisions identical."""
        return self._agree(value) if self._agree else value

    def cannot_build(self, shape: Shape) -> str | None:
        return None

    def measure_stock(self) -> StepResult:
        """vLLM's own profile step. Same semantics as every synthetic step: the transient above
        what the step leaves live (lazy one-time initialisations land in the held memory). On
        the cut decoder while cut_down() is active, like every step. Where the sweep reads it
        several times (core/sweep.STOCK_READINGS: the CPU), each reading is taken once: the
        later ones already start with what the first created, and the lowest is the steady
        need by design."""
        return self._measured(stock_shape(self.limits), lambda: self._at_depth(self.run_stock),
                              attribute=False, again=stock_readings(self) == 1)

    def measure(self, shape: Shape, attribute: bool = False) -> StepResult:
        return self._measured(shape, lambda: self._at_depth(lambda: self.run(shape)), attribute)

    def measure_after(self, shape: Shape, prelude) -> StepResult:
        """`shape` measured as `measure` measures it, with `prelude()` run first inside the same
        measurement and what it returns held until the step is done: an encoder forward whose
        outputs the chunk reads (adapter/multimodal.encoder_step). Taken once: its caller reads
        the high-water mark above the start level, what the encoder leaves resident included."""
        def body() -> None:
            held = prelude()
            self._at_depth(lambda: self.run(shape))
            del held

        return self._measured(shape, body, attribute=False, again=False)

    _cut = None
    _eager = ()

    @contextlib.contextmanager
    def eager_full(self):
        """Steps run on the full decoder with its compiled forward bypassed (as a cut step runs
        it, at full depth) for the duration. Yields whether anything was compiled: False, the
        steps are the full model's own."""
        compiled = compiled_modules(self.model)
        self._eager = tuple(compiled)
        try:
            yield bool(compiled)
        finally:
            self._eager = ()

    def graph_ranges(self) -> tuple[tuple[int, int], ...] | None:
        """The row ranges vLLM compiles a graph of its own for (compile_graph_ranges), ()
        where nothing is compiled, None where they cannot be read."""
        if not compiled_modules(self.model):
            return ()
        # vllm-touch: worker-config
        return compile_graph_ranges(self.runner.vllm_config)

    @contextlib.contextmanager
    def cut_down(self, prefix: bool = False):
        """Steps (the stock step too) run on the decoder cut to the first layer of each kind for
        the duration (`prefix`: to the shortest prefix holding every kind, the cut a family's
        committed proof may have run, sweep_depth.proven_cut); ValueError names why a model
        cannot be cut."""
        decoder, kept, total = decoder_cut(self.model, prefix=prefix)
        compiled = compiled_modules(self.model)
        # the loop runs the kept layers alone, in order, where they are not the first ones
        only = None
        if not _is_prefix(kept):
            import torch

            only = torch.nn.ModuleList([decoder.layers[i] for i in kept])
        self._cut = (decoder, len(kept), only, compiled)
        try:
            yield cut_label(kept, total) + (", run eagerly" if compiled else "")
        finally:
            self._cut = None

    def _at_depth(self, run) -> None:
        if self._cut is None and not self._eager:
            run()
            return
        # vllm-touch: decoder-depth
        decoder, depth, only, compiled = self._cut or (None, 0, None, self._eager)
        saved = None if decoder is None else (decoder.end_layer, decoder.layers)
        try:
            if decoder is not None:
                if only is not None:
                    decoder.layers = only
                decoder.end_layer = decoder.start_layer + depth
            for m in compiled:  # a compiled graph runs every layer: the Python forward honours it
                m.do_not_compile = True
            run()
        finally:
            if decoder is not None:
                decoder.end_layer = saved[0]
                if decoder.layers is not saved[1]:
                    decoder.layers = saved[1]
            for m in compiled:
                m.do_not_compile = False

    def _measured(self, shape: Shape, body, attribute: bool, again: bool = True) -> StepResult:
        """`body` run as one step and read by the meter; with `again`, once more where it left
        more live than the meter resolves (core/readings.measure_again: a buffer it created
        after its peak would otherwise be taken off its reading), every rank deciding alike.
        Of two readings the larger counts, with its run's timing and op, so a second reading
        cannot lower a figure."""
        step = self._measured_once(shape, body, attribute)
        if not again:
            return step
        left = self.agree_max(self.meter.left())
        if not measure_again(left, self.meter.resolution_bytes):
            return step
        second = self._measured_once(shape, body, attribute)
        log.debug("[wcprof] %s left %s live: measured again, %s (first %s)", shape,
                  fmt_bytes(left), fmt_bytes(second.peak_bytes), fmt_bytes(step.peak_bytes))
        return step if step.peak_bytes > second.peak_bytes else second

    def _measured_once(self, shape: Shape, body, attribute: bool) -> StepResult:
        meter = self.meter
        meter.begin()
        t0 = time.perf_counter()
        top = None
        with self._requests:
            if attribute:
                with PeakAttributor(self.model, meter) as attr:
                    body()
                top = attr.top_op
            else:
                body()
        seconds = time.perf_counter() - t0
        peak = self.agree_max(meter.end())
        return StepResult(shape=shape, peak_bytes=peak, seconds=seconds, top_op=top,
                          workspace_bytes=self.agree_max(self._requests.total()))


def v1_prefill_lens(rows: int, num_reqs: int, context_len: int,
                    max_model_len: int) -> tuple[list[int], int]:
    """A prefill step's query lengths as V1's `_dummy_run(rows)` schedules them over `num_reqs`
    requests (rows // n each, the remainder rows % n on the last), and the one seq_len
    (`profile_seq_lens`, a scalar every request gets) that holds the longest: context_len plus
    rows // n + rows % n, at most max_model_len. A seq_len of context_len + rows // n left the
    last request's query longer than its sequence (e.g. 64 rows over 7 requests: 9 + 1 rows on 9
    tokens at context 0); the others' sequences are up to rows % n tokens longer than the
    shape's, the over-estimating direction. Never past max_model_len: a request's block table
    holds max_model_len tokens, and a sequence beyond it made the CPU attention kernel read
    blocks past the table (a SIGSEGV in cpu_attn_amx.hpp under the advisor's steps); the
    longest request's context is then shortened by at most rows % n tokens."""
    n = max(1, min(rows, num_reqs))  # _dummy_run: min(num_tokens, max_num_seqs) requests
    q = [rows // n] * n
    q[-1] += rows % n
    return q, max(q[-1], min(context_len + max(1, q[-1]), max_model_len))


class V1Driver(DriverBase):
    """Drives vllm.v1.worker.gpu_model_runner.GPUModelRunner (and its CPU subclass)."""

    runner_kind = "v1"

    def __init__(self, runner, limits: Limits, meter, agree_max=None):
        for attr in ("_dummy_run", "_dummy_sampler_run", "initialize_kv_cache",
                     "_cleanup_profiling_kv_cache", "get_kv_cache_spec"):
            if not hasattr(runner, attr):
                raise unsupported("v1-dummy-run",
                                  f"the V1 model runner {type(runner).__name__} lacks {attr}()")
        self.runner = runner
        self.limits = limits
        self.meter = meter
        self.model = runner.get_model() if hasattr(runner, "get_model") else runner.model
        self._agree = agree_max
        self._pool_blocks = 0
        self._requests = ws.RequestRecorder()
        # vllm-touch: kv-cache-config
        self._hybrid = any(kvmod.is_spec(s, "MambaSpec")
                           for s in runner.get_kv_cache_spec().values())

    def cannot_build(self, shape: Shape) -> str | None:
        """On a hybrid model every request of a step reads a recurrent-state slot of its own
        (the CPU GDN kernels check one conv-state row per request): a step of more requests
        than the provisional pool has slots (its blocks less the null block) cannot run."""
        slots = self._provisional_blocks() - 1
        if self._hybrid and shape.kind != "stock" and shape.num_reqs > slots:
            return (f"{shape.num_reqs} requests need {shape.num_reqs} recurrent-state slots; the "
                    f"provisional KV pool holds {slots}")
        return None

    def _provisional_blocks(self) -> int:
        """One request at max_model_len plus the null block; on a hybrid model at least one
        slot for every request of the plan's widest step (shapes.most_requests) too."""
        one = math.ceil(self.limits.max_model_len / self.limits.block_size) + 1
        return max(one, 1 + most_requests(self.limits)) if self._hybrid else one

    # -- the stock step ---------------------------------------------------------------------
    def run_stock(self) -> None:
        """vLLM's own profile step, as profile_run does it (no attention metadata)."""
        # vllm-touch: v1-dummy-run
        r = self.runner
        with pp_received(r, r.max_num_tokens):
            hidden, last = r._dummy_run(r.max_num_tokens, is_profile=True)
            out = _sample(r, last)
        r._sync_device() if hasattr(r, "_sync_device") else None
        del hidden, last, out

    # -- provisional KV cache -----------------------------------------------------------------
    @contextlib.contextmanager
    def provisional_kv(self):
        # vllm-touch: v1-dummy-run
        r = self.runner
        vllm_config = r.vllm_config
        need_blocks = self._provisional_blocks()
        with _set_config_ctx(vllm_config):
            cfg, info = init_provisional_kv(
                r, self.limits, self.meter, need_blocks,
                lambda cfg: r.initialize_kv_cache(cfg, is_profiling=True))
            self._pool_blocks = cfg.num_blocks
            try:
                yield info
            finally:
                self._clear_block_tables()
                r._cleanup_profiling_kv_cache()
                _drop_kv_views(r)
                self._pool_blocks = 0

    # -- synthetic steps ----------------------------------------------------------------------
    def run(self, shape: Shape) -> None:
        with self._computed_tokens(shape):
            self._run(shape)

    @contextlib.contextmanager
    def _computed_tokens(self, shape: Shape):
        """`_dummy_run` leaves input_batch.num_computed_tokens at 0, so metadata builders that
        read it (chunked-prefill context paths, e.g. the sparse-MLA indexer's) take the fresh-
        prompt branch. Fill in each dummy request's cached tokens for the step, zero after."""
        # vllm-touch: v1-input-batch
        ib = getattr(self.runner, "input_batch", None)
        arr = getattr(ib, "num_computed_tokens_cpu", None)
        if arr is None:
            yield
            return
        n = min(shape.num_reqs, len(arr))
        if shape.kind == "mixed":
            q = [1] * (n - 1) + [shape.rows - (n - 1)]
            seq = self.limits.max_model_len
        elif shape.kind == "decode":
            q = [self.runner.uniform_decode_query_len] * n
            seq = shape.context_len + q[0]
        else:
            q, seq = v1_prefill_lens(shape.rows, shape.num_reqs, shape.context_len,
                                     self.limits.max_model_len)
            q = q[:n]
        arr[:len(q)] = [max(0, seq - qi) for qi in q]
        drafts = self._draft_marks(shape, q)
        try:
            yield
        finally:
            arr[:n] = 0
            if drafts is not None:
                drafts.np[:] = self._saved_drafts
                drafts.copy_to_gpu()

    def _draft_marks(self, shape: Shape, q: list[int]):
        """With speculative decoding, recurrent-state backends (GDN, Mamba) read which requests
        are verify steps from runner.num_decode_draft_tokens, which _dummy_run never fills (it
        holds zeros: every request a verify step, so a 4-row prefill chunk overflows a 1+k span).
        Mark each dummy request as a step the scheduler forms: at most 1+k rows on a context, a
        verify step with rows-1 drafts (a decode of 1+k rows has k; V1's one-row mixed-batch
        decodes 0); more rows, a prompt chunk (-1). Restored after the step."""
        # vllm-touch: v1-input-batch
        k = self.limits.num_speculative_tokens
        drafts = getattr(self.runner, "num_decode_draft_tokens", None)
        if not k or drafts is None or not hasattr(drafts, "np"):
            return None
        import numpy as np

        self._saved_drafts = drafts.np.copy()
        marks = np.full(len(drafts.np), -1, dtype=drafts.np.dtype)
        marks[:len(q)] = [qi - 1 if qi <= k + 1 else -1 for qi in q]
        drafts.np[:] = marks
        drafts.copy_to_gpu()
        return drafts

    def _run(self, shape: Shape) -> None:
        # vllm-touch: v1-max-num-seqs-pin
        r = self.runner
        sched = r.scheduler_config
        saved = sched.max_num_seqs
        seq_len = v1_prefill_lens(shape.rows, shape.num_reqs, shape.context_len,
                                  self.limits.max_model_len)[1]
        kwargs = dict(force_attention=True, profile_seq_lens=seq_len, is_profile=True,
                      skip_eplb=True)
        try:
            with pp_received(r, shape.rows):
                self._run_shape(shape, seq_len, kwargs)
        finally:
            sched.max_num_seqs = saved

    def _run_shape(self, shape: Shape, seq_len: int, kwargs: dict) -> None:
        # vllm-touch: v1-max-num-seqs-pin
        r = self.runner
        sched = r.scheduler_config
        if shape.kind == "decode":
            sched.max_num_seqs = shape.num_reqs
            self._fill_block_tables(shape.num_reqs, shape.context_len + r.uniform_decode_query_len)
            kwargs["profile_seq_lens"] = shape.context_len + r.uniform_decode_query_len
            hidden, last = r._dummy_run(shape.rows, uniform_decode=True, **kwargs)
        elif shape.kind == "mixed":
            # create_mixed_batch: min(max_num_seqs-1, R//2) one-token decodes + one prefill.
            sched.max_num_seqs = shape.num_reqs
            kwargs["profile_seq_lens"] = self.limits.max_model_len
            self._fill_block_tables(shape.num_reqs, self.limits.max_model_len)
            hidden, last = r._dummy_run(shape.rows, create_mixed_batch=True, **kwargs)
        else:
            sched.max_num_seqs = shape.num_reqs
            self._fill_block_tables(shape.num_reqs, seq_len)
            hidden, last = r._dummy_run(shape.rows, **kwargs)
        out = _sample(r, last)
        if hasattr(r, "_sync_device"):
            r._sync_device()
        del hidden, last, out

    def _block_tables(self):
        # vllm-touch: v1-input-batch
        batch = getattr(self.runner, "input_batch", None)
        bt = getattr(batch, "block_table", None)
        return list(getattr(bt, "block_tables", []) or [])

    def _fill_block_tables(self, num_reqs: int, seq_len: int) -> None:
        """Give each dummy request its own blocks (wrapping when the pool runs out), so the
        kernels read a realistic spread of pages rather than block 0 over and over."""
        # vllm-touch: v1-input-batch
        if not self._pool_blocks:
            return
        import numpy as np

        for bt in self._block_tables():
            arr = bt.get_numpy_array()
            kb = int(getattr(bt, "block_size", self.limits.block_size)) or 1
            per_kv = max(1, self.limits.block_size // kb)
            pool = max(1, (self._pool_blocks - 1) * per_kv)
            nb = min(arr.shape[1], math.ceil(seq_len / kb))
            n = min(num_reqs, arr.shape[0])
            ids = (np.arange(n * nb, dtype=np.int64) % pool + per_kv).reshape(n, nb)
            arr[:n, :nb] = ids
            arr[:n, nb:] = 0

    def _clear_block_tables(self) -> None:
        for bt in self._block_tables():
            bt.clear()


__all__ = ["DriverBase", "V1Driver", "is_v2_runner", "v1_prefill_lens"]


def _drop_kv_views(runner) -> None:
    """After vLLM's own cleanup of a profiling KV cache (V1 `_cleanup_profiling_kv_cache`, which
    resets only the forward context's layers), the same reset on every module of the model and
    the drafter: a module outside the forward context that kept a view of the cache would hold
    the whole provisional cache alive. Then collect and release the allocator's cache."""
    # vllm-touch: v1-dummy-run
    import gc

    import torch

    modules = []
    for owner in (runner, getattr(runner, "drafter", None)):
        model = getattr(owner, "model", None)
        get_model = getattr(owner, "get_model", None)  # under a CUDA-graph or ubatch wrapper
        if not isinstance(model, torch.nn.Module) and callable(get_model):
            model = get_model()
        unwrap = getattr(model, "unwrap", None)
        if not isinstance(model, torch.nn.Module) and callable(unwrap):
            model = unwrap()
        if isinstance(model, torch.nn.Module):
            modules.extend(model.modules())
    dropped = 0
    for m in modules:
        cache = vars(m).get("kv_cache")
        if isinstance(cache, torch.Tensor) and cache.numel():
            m.kv_cache = torch.tensor([])
            dropped += 1
        elif isinstance(cache, (list, tuple)) and any(
                isinstance(t, torch.Tensor) and t.numel() for t in cache):
            m.kv_cache = []
            dropped += 1
    if dropped:
        log.warning("[wcprof] %d module(s) outside vLLM's forward context still held a view of "
                    "the provisional KV cache after its cleanup: dropped", dropped)
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _sample(runner, last):
    """The sampler on a step's last hidden states, as vLLM's profile_run runs it: on the last
    pipeline stage only (an earlier stage's _dummy_run hands intermediate tensors on and returns
    no last hidden states: None). Generative models only, as before: no pooler branch."""
    # vllm-touch: v1-dummy-run
    return runner._dummy_sampler_run(last) if last is not None else None


@contextlib.contextmanager
def pp_received(runner, rows: int):
    """A pipeline stage after the first, serving: vLLM's worker receives the previous stage's
    intermediate tensors into new tensors every step (irecv_tensor_dict allocates them) and holds
    them through the step, beside the runner's own buffer, which _dummy_run reads instead. So
    each sweep step there holds tensors of that size, `rows` of each of the buffer's keys, for
    its duration (about rows x hidden x 2 tensors x dtype: 128 MiB at 8,192 rows of an 8B
    model in bf16). The buffer is made first where vLLM has not yet (its _dummy_run makes it
    the same way on a later stage's first step), so that no step, the first stock reading
    included, goes without. Nothing on the first stage."""
    # vllm-touch: v1-dummy-run
    held = None
    if _later_pp_stage():
        if getattr(runner, "intermediate_tensors", None) is None:
            runner.intermediate_tensors = runner.model.make_empty_intermediate_tensors(
                batch_size=runner.max_num_tokens, dtype=runner.model_config.dtype,
                device=runner.device)
        held = {k: v[:rows].clone() for k, v in runner.intermediate_tensors.tensors.items()}
    try:
        yield
    finally:
        del held


def _later_pp_stage() -> bool:
    # vllm-touch: worker-config
    try:
        from vllm.distributed.parallel_state import get_pp_group

        return not get_pp_group().is_first_rank
    except Exception:  # noqa: BLE001 - no pipeline group: one stage
        return False
