"""What the worker is: its limits, rank, device, engine config, attention backends, and the facts
a sweep's figures depend on (the sweep cache's key). Read by the start-up flow (startup.py)."""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import logging
import os
import re

from .. import __version__
from ..core.shapes import Limits
from ..core.types import DeviceInfo, EngineConfig, EngineFacts
from ..errors import WcprofError
from . import kv as kvmod
from .runner import compile_sizes_and_ranges, is_v2_runner
from .versions import vllm_version

log = logging.getLogger("vllm.wcprof")


def limits_of(vllm_config, runner=None, *, block_size: int | None = None) -> Limits:
    """The scheduler limits of this engine. With the worker's `runner`, whether the model has
    one KV group is read from vLLM's own grouping of its layers (kv.kv_group_count); without
    it (a front-end process), from the configs (`_one_kv_group`).

    `block_size`: the block the engine started with (the report's config.block_size), for a
    config read after KV initialisation: vLLM 0.32+ then lowers cache_config.block_size to its
    smallest prefix-cacheable group's (DeepSeek-V4: 4, a compressor state's, where its hits
    land on 256), which is not the block a hit drops or the plan aligns to."""
    # vllm-touch: worker-config
    spec = vllm_config.speculative_config
    k = int(getattr(spec, "num_speculative_tokens", 0) or 0) if spec is not None else 0
    block = int(block_size or vllm_config.cache_config.block_size or 16)
    return Limits(
        max_model_len=int(vllm_config.model_config.max_model_len),
        max_num_batched_tokens=int(vllm_config.scheduler_config.max_num_batched_tokens),
        max_num_seqs=int(vllm_config.scheduler_config.max_num_seqs),
        num_speculative_tokens=k,
        block_size=block,
        prefix_caching=bool(getattr(vllm_config.cache_config, "enable_prefix_caching", False)),
        stock_reruns_with_kv=stock_reruns_with_kv(vllm_config, runner),
        draft_slots=draft_slots(spec),
        **prefix_hit_rows(vllm_config, None if runner is None else kvmod.kv_group_count(runner),
                          block_size=block),
    )


def draft_slots(spec) -> int:
    """Limits.draft_slots: the input slots vLLM's scheduler charges each request it schedules
    beyond its own tokens (speculative_config.max_num_new_slots_for_drafting, 0.32+: DFlash k,
    DSpark and parallel EAGLE k - 1, a draft model 1). 0 without a drafter or where vLLM has no
    such charge (0.26: the property is absent), which keeps every shape as large as before."""
    # vllm-touch: worker-config
    if spec is None:
        return 0
    try:
        return max(0, int(getattr(spec, "max_num_new_slots_for_drafting", 0) or 0))
    except Exception:  # noqa: BLE001 - a property that cannot answer charges nothing we know of
        return 0


def stock_reruns_with_kv(vllm_config, runner=None) -> bool:
    """Whether vLLM runs its own profile step again once the KV cache exists (Limits'
    `stock_reruns_with_kv`): stock_rerun_why names the warm-up that does, or None."""
    return stock_rerun_why(vllm_config, runner) is not None


def stock_rerun_why(vllm_config, runner=None) -> str | None:
    """The warm-up that runs vLLM's own profile step (max_num_batched_tokens rows, requests not
    capped by the pool) again beside the KV cache, or None where none does; read from vLLM
    0.32/0.33's worker warm-ups (`compile_or_warm_up_model`):

    * the CPU worker warms the model up only when it has no KV cache: None;
    * the GPU worker with the V1 runner warms its sampler up over min(max_num_seqs,
      max_num_batched_tokens) requests after the KV cache exists;
    * the V2 runner: its compile warm-up (mode VLLM_COMPILE) runs _dummy_run(size) for every
      compile size no graph capture size equals and for the end of every compile range holding
      none of them (compile_warmup_sizes); kernel_warmup's FlashInfer autotune (installed, not
      switched off) and elastic EP's warm_and_capture run _dummy_run(max_num_batched_tokens);
      adaptive verification (DSpark) replays its profiling steps; a compiled mode other than
      VLLM_COMPILE is not read. Otherwise only capped steps run: the kernel warm-up
      (`warmup_kernels`, its requests capped at what the pool holds) and graph captures, whose
      eager warm-ups (min(size, max_num_seqs) requests, forward only) are metered before the
      KV decision (warmup.one_capture_profile or measure_graphs_apart) and checked against the
      worst case.

    The graph mode and capture sizes read here are the config's before vLLM resolves them
    against the attention backends (at KV initialisation); adapter/startup.warm_up reads them
    again before vLLM's warm-up runs and refuses a start whose resolved config reruns the step
    the worst case left out. Not read (the stock step stays): no runner (a front end), a device
    that is neither CPU nor CUDA."""
    # vllm-touch: worker-config
    if runner is None:
        return "not read without the worker's runner"
    device = str(getattr(getattr(vllm_config, "device_config", None), "device_type", "") or "")
    if device == "cpu":
        return None
    if device != "cuda":
        return f"not read on device {device or 'unknown'}"
    if not is_v2_runner(runner):
        return "the V1 runner's sampler warm-up"
    if getattr(getattr(vllm_config, "parallel_config", None), "enable_elastic_ep", False):
        return "elastic EP's warm_and_capture"
    autotune = getattr(getattr(vllm_config, "kernel_config", None), "enable_flashinfer_autotune",
                       None)
    import importlib.util

    if autotune is not False and importlib.util.find_spec("flashinfer") is not None:
        return "kernel_warmup's FlashInfer autotune"
    if getattr(runner, "adaptive_verification", None) is not None or \
            getattr(getattr(runner, "speculator", None), "enable_adaptive_verification", False) \
            or _spec_method(vllm_config) == "dspark":
        return "adaptive verification's profiling replays (DSpark)"
    mode = getattr(vllm_config.compilation_config, "mode", None)
    mode = str(getattr(mode, "name", mode))
    if mode in ("NONE", "0", "None"):
        return None
    if mode not in ("VLLM_COMPILE", "3"):
        return f"compiled mode {mode} (its warm-up not read)"
    sizes = compile_warmup_sizes(vllm_config, runner)
    if sizes is None:
        return "the compile warm-up (its sizes not read)"
    return (f"the compile warm-up at size(s) {', '.join(map(str, sizes))}" if sizes else None)


def _spec_method(vllm_config) -> str:
    spec = getattr(vllm_config, "speculative_config", None)
    return str(getattr(spec, "method", "") or "") if spec is not None else ""


def compile_warmup_sizes(vllm_config, runner=None) -> list[int] | None:
    """The token counts vLLM's compile warm-up runs `_dummy_run` at beside the KV cache (0.32 and
    0.33 `_compile_or_warm_up_model`, mode VLLM_COMPILE with a compiled submodule): the compile
    sizes no capture size equals (all of them where the graph mode is NONE), then the end of
    every compile range that none of those sizes or the capture sizes falls in. None where the
    config cannot be read (the caller keeps the stock step)."""
    # vllm-touch: worker-config
    cc = vllm_config.compilation_config
    model = getattr(runner, "model", None) if runner is not None else None
    try:  # vllm-touch: v2-graph-estimate
        from vllm.v1.worker.gpu.cudagraph_utils import has_compiled_submodule
    except ImportError:
        has_compiled_submodule = None
    try:
        if model is not None and has_compiled_submodule is not None and \
                not has_compiled_submodule(model):
            return []
        sizes, ranges = compile_sizes_and_ranges(cc)
        capture: list[int] = []
        if str(getattr(getattr(cc, "cudagraph_mode", None), "name", "NONE")) != "NONE":
            capture = list(getattr(cc, "cudagraph_capture_sizes", None) or [])
            sizes = [x for x in sizes if x not in capture]
        every = set(capture) | set(sizes)
        for start, end in ranges:
            if not any(start <= x <= end for x in every):
                sizes.append(end)
    except Exception:  # noqa: BLE001 - an unread config keeps the stock step in the worst case
        return None
    return sorted(set(sizes), reverse=True)


def prefix_hit_rows(vllm_config, kv_groups: int | None = None, *,
                    block_size: int | None = None) -> dict[str, int]:
    """Limits.prefix_hit_min_rows and prefix_hit_drop: under a drafter that makes vLLM drop a
    prefix hit's last matched block (EAGLE, MTP; DFlash and DSpark up to 0.32: the drafter needs
    the target's hidden states of the last tokens), the dropped block, and the fewest rows a hit leaves: that
    block plus one token where the model has one KV group (vLLM's unitary coordinator caps a hit
    at the prompt's length minus one, then drops a block: a prompt S + u on a cached S computes
    u + block rows, u >= 1), the block alone where it may have several (the hybrid coordinator
    lets a block-aligned, fully cached prompt hit at its length minus one block). Else 1 and 0.

    The block is the cache's hit unit: cache_config.block_size (for a Mamba hybrid in "align"
    mode, the block every group shares), or prefix_match_unit when that is smaller. It stays 1,
    which adds shapes (the safe direction), wherever a request can reach a long context with
    fewer rows some other way, or the hit unit may be finer than the block:
      - long_prefill_token_threshold > 0 caps every prefill chunk, cached or not, below a block;
      - a KV connector (kv_transfer_config: LMCache, P/D disaggregation) adds external hits that
        need not drop anything;
      - a hybrid not in "align" mode, an attention-free model;
      - vLLM 0.33's lookahead block hashes (hash_lookahead_tokens): each block's hash covers the
        token(s) after it, and the scheduler then drops no hit block (a hit leaves at least
        that many rows, at least 1);
    DeepSeek-V4's groups of several block sizes drop the whole block too (vLLM's hybrid
    coordinator aligns the hit to the block every group divides, then the drafter's drop
    removes one such block: docs/sweep.md).
    One KV group: `kv_groups` == 1 where the worker counted vLLM's own groups (None: unknown),
    else only where neither the target's nor the draft's config names any layer kind beside
    full attention (`_one_kv_group`); otherwise the block alone stands."""
    # vllm-touch: worker-config
    none = {"prefix_hit_min_rows": 1, "prefix_hit_drop": 0}
    cache, spec = vllm_config.cache_config, vllm_config.speculative_config
    if not getattr(cache, "enable_prefix_caching", False) or not _drops_hit_block(spec):
        return none
    if hash_lookahead_tokens(vllm_config):  # 0.33+: hashes cover the next token(s), no drop
        return none
    scheduler = getattr(vllm_config, "scheduler_config", None)
    if int(getattr(scheduler, "long_prefill_token_threshold", 0) or 0) > 0:
        return none
    if getattr(vllm_config, "kv_transfer_config", None) is not None:
        return none
    model = vllm_config.model_config
    if getattr(model, "is_attention_free", False):
        return none
    if getattr(model, "is_hybrid", False) and getattr(cache, "mamba_cache_mode", None) != "align":
        return none
    block = int(block_size or cache.block_size or 16)  # limits_of: the block at the start
    unit = getattr(cache, "prefix_match_unit", None)
    drop = min(block, int(unit)) if unit else block
    one = kv_groups == 1 if kv_groups is not None else _one_kv_group(vllm_config)
    return {"prefix_hit_min_rows": drop + int(one), "prefix_hit_drop": drop}


_OTHER_LAYER_KINDS = ("sliding_window", "sliding_window_pattern", "interleaved_sliding_window",
                      "sliding_window_size", "sliding_windows", "hybrid_layer_pattern",
                      "swa_window_size", "use_swa", "loop_window_size",
                      "attention_chunk_size", "index_topk", "compress_ratios", "layers_block_type",
                      "full_attention_interval", "linear_attn_config")
"""Config fields that name a layer kind beside full attention (each gives vLLM another KV group:
sliding or chunked windows, DeepSeek's indexer cache, compressed attention, recurrent layers)."""


def _text_config(model_config):
    hf = model_config.hf_config
    return hf.get_text_config() if hasattr(hf, "get_text_config") else hf


def _one_kv_group(vllm_config) -> bool:
    """Whether every KV layer is plain full attention, target and draft alike (then vLLM builds
    one KV group, whatever the layers' sizes: UniformTypeKVCacheSpecs). False wherever a config
    names another layer kind, or layer_types lists one, or the model is hybrid, or the draft's
    config cannot be read."""
    # vllm-touch: worker-config
    configs = [vllm_config.model_config]
    draft = getattr(vllm_config.speculative_config, "draft_model_config", None)
    if draft is not None:
        configs.append(draft)
    for model in configs:
        if getattr(model, "is_hybrid", False) or getattr(model, "is_encoder_decoder", False):
            return False  # recurrent state, or cross-attention KV: groups of their own
        try:
            text = _text_config(model)
        except Exception:  # noqa: BLE001 - unreadable: do not claim one group
            return False
        nested = [getattr(text, "dflash_config", None), getattr(text, "eagle_config", None)]
        if any(getattr(text, name, None) for name in _OTHER_LAYER_KINDS) or any(
                isinstance(d, dict) and any(d.get(name) for name in _OTHER_LAYER_KINDS)
                for d in nested):
            return False
        if any(t != "full_attention" for t in (getattr(text, "layer_types", None) or ())):
            return False
    return True


def hash_lookahead_tokens(vllm_config) -> int:
    """vLLM 0.33+'s `VllmConfig.num_hash_lookahead_tokens`: the tokens after each block that its
    prefix-cache hash covers (EAGLE, EAGLE-3, MTP with prefix caching and no KV connector, unless
    disable_lookahead_block_hashes). Where it is nonzero the scheduler sets its
    use_eagle_block_drop to False (Scheduler.__init__): no hit block is dropped, whatever the
    drafter's `use_eagle_block_drop()` says. 0 where the property is absent (0.26-0.32); 1 where
    it cannot be read (a hit taken as not dropped: fewer rows a hit, the safe direction)."""
    # vllm-touch: worker-config
    try:
        return int(getattr(vllm_config, "num_hash_lookahead_tokens", 0) or 0)
    except Exception:  # noqa: BLE001 - unreadable: no drop assumed
        return 1


def _drops_hit_block(spec) -> bool:
    """Whether the drafter makes vLLM drop a prefix hit's last matched block
    (`use_eagle_block_drop`; 0.26 has only `use_eagle`; 0.33's excludes DFlash and DSpark,
    which read no next token); an unknown drafter (the call fails) is taken not to. The
    scheduler may still keep the block (0.33 lookahead hashes: hash_lookahead_tokens)."""
    # vllm-touch: worker-config
    if spec is None:
        return False
    drops = getattr(spec, "use_eagle_block_drop", None) or getattr(spec, "use_eagle", None)
    try:
        return bool(callable(drops) and drops())
    except Exception:  # noqa: BLE001 - an unknown drafter: no constraint
        return False


def sibling_hits_serialize(vllm_config) -> bool:
    """Whether requests that resume from one cached block, each computing less than a block
    beyond it, are kept out of one another's step (`plan_for(distinct_hits=...)`, which then
    gives each its own cached last block): a Mamba hybrid in "align" mode with prefix caching
    and no drafter that drops a hit's last block.

    vLLM 0.32: such a request's prompt ends within the block after its hit, so the prompt's
    last hash boundary is the hit itself, and caching its blocks registers the hit's state block
    as cached in this step (single_type_kv_cache_manager.MambaManager._cache_partial_tail_block);
    a later request whose hit ends on a block cached in this step is refused for the step
    (MambaManager.get_num_blocks_to_allocate returns num_gpu_blocks + 1, and the scheduler stops
    admitting), so such requests run one a step: a plan of many requests a few rows each on one
    cached prefix forms a step of one request, not the step it stands for (docs/sweep.md). A
    block-dropping drafter (MTP, EAGLE) makes each request compute past the next block, and the
    same plan forms its step.

    vLLM 0.33: the same method skips a source block already keyed at that boundary (a hit's
    own cached block: `source_block.block_hash_num_tokens == num_tokens`), so nothing is
    registered as cached this step and siblings share it (the 0.33 scheduler forms all 64
    requests of such a plan in one step): False there, with or without a drafter. False also
    where the method cannot be read: True would cap the sweep's requests on one prefix at what
    the pool holds on hits of their own (Limits.prefix_request_tokens), fewer than the
    scheduler may form."""
    # vllm-touch: worker-config
    cache, model = vllm_config.cache_config, vllm_config.model_config
    return (bool(getattr(cache, "enable_prefix_caching", False))
            and bool(getattr(model, "is_hybrid", False))
            and getattr(cache, "mamba_cache_mode", None) == "align"
            and not _drops_hit_block(vllm_config.speculative_config)
            and _mamba_caches_partial_tail())


def _mamba_caches_partial_tail() -> bool:
    """The mechanism behind sibling_hits_serialize is there: MambaManager has
    `_cache_partial_tail_block` (0.26 and 0.32) and it re-keys a block already keyed at the
    prompt's last boundary (`partial_tail_rekeys_hit_block`; 0.33 skips it). Where it is not,
    requests on one hit share a step and hold fewer blocks each; the limits then keep one block a
    request (more requests at once: the safe direction)."""
    # vllm-touch: mamba-hit-serialize
    try:
        from vllm.v1.core.single_type_kv_cache_manager import MambaManager
    except ImportError:
        return False
    method = getattr(MambaManager, "_cache_partial_tail_block", None)
    if not callable(method):
        return False
    try:
        source = inspect.getsource(method)
    except (OSError, TypeError):  # no source to read: not taken to serialize
        return False
    from .versions import version_tuple

    return partial_tail_rekeys_hit_block(source, version_tuple())


def partial_tail_rekeys_hit_block(source: str, version: tuple[int, int]) -> bool:
    """Whether `MambaManager._cache_partial_tail_block`'s `source` re-keys the block a request
    hit. True only where that was read: vLLM before 0.33 (0.26, 0.32), its source caching the
    partial block (`cache_partial_block`) with no early return for a block whose key already
    ends at that boundary (0.33: `if source_block.block_hash_num_tokens == num_tokens: return
    None`). Any other version or form is taken not to serialize (the safe direction)."""
    if version >= (0, 33) or "cache_partial_block" not in source:
        return False
    early = r"block_hash_num_tokens\s*==\s*num_tokens|num_tokens\s*==\s*\S*block_hash_num_tokens"
    return re.search(early, source) is None


def world_rank() -> int:
    # vllm-touch: world-group
    try:
        from vllm.distributed import get_world_group

        return int(get_world_group().rank)
    except Exception:  # noqa: BLE001 - before distributed init (CLI tests): rank 0
        return 0


def agree_max_fn():
    """Max over every rank of the world group, on its CPU group, so that adaptive choices in the
    sweep (bisection) are identical everywhere and no rank waits in a collective alone."""
    # vllm-touch: world-group
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
        pipeline_parallel_size=int(getattr(vllm_config.parallel_config,
                                           "pipeline_parallel_size", 1) or 1),
    )


def engine_facts(worker, runner_kind: str) -> EngineFacts:
    runner = worker.model_runner
    return EngineFacts(tool_version=__version__, vllm_version=vllm_version(), rank=world_rank(),
                       device=device_info(worker), config=engine_config(worker.vllm_config),
                       runner=runner_kind, worker=type(worker).__name__,
                       attention_backends=tuple(attention_backends(runner)))


def sweep_facts(worker, engine: EngineFacts, limits: Limits, settings) -> dict:
    """Everything the sweep's figures depend on (the cache key): the model, the limits, the
    kernels and the device (`engine`: what the session already read of this worker). What it
    cannot see, the replay of the worst shape checks."""
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
        "tool": engine.tool_version, "vllm": engine.vllm_version, "torch": torch.__version__,
        "cuda": getattr(torch.version, "cuda", None),
        "device": dataclasses.asdict(engine.device), "rank": engine.rank,
        # not the model path (its config is hf_config) nor the budget (admission is recomputed)
        "config": {k: v for k, v in dataclasses.asdict(engine.config).items()
                   if k not in ("gpu_memory_utilization", "model")},
        "hf_config": {k: v for k, v in vllm_config.model_config.hf_config.to_dict().items()
                      if k not in ("_name_or_path", "name_or_path")},  # where, not what
        "dtype": str(vllm_config.model_config.dtype),
        "quantization": str(vllm_config.model_config.quantization),
        "model_class": f"{type(model).__module__}.{type(model).__qualname__}", "model_code": model_code,
        "cudagraph": [str(getattr(comp, "cudagraph_mode", None)),
                      list(getattr(comp, "cudagraph_capture_sizes", None) or [])],
        "limits": dataclasses.asdict(limits), "runner": engine.runner,
        "attention_backends": list(engine.attention_backends),
        "sweep": {"tolerance": settings.tolerance_bytes, "exhaustive": settings.exhaustive,
                  "depth": settings.sweep_depth,
                  "context_ladder": settings.context_ladder, "attribute_ops": settings.attribute_ops},
    }
    import json

    return json.loads(json.dumps(facts, sort_keys=True, default=str))


def attention_backends(runner) -> list[str]:
    names = set()
    for layer in runner.vllm_config.compilation_config.static_forward_context.values():
        impl = getattr(layer, "impl", None)
        if impl is not None:
            names.add(type(impl).__name__)
    return sorted(names)


def requested_bytes(worker) -> int:
    # vllm-touch: worker-config
    for attr in ("requested_memory", "requested_cpu_memory"):
        v = getattr(worker, attr, None)
        if v:
            return int(v)
    raise WcprofError(f"{type(worker).__name__} exposes no requested memory figure",
                      hint="unsupported worker class for worstcase_profiler")


def cudagraph_applied(worker) -> int:
    # vllm-touch: envs-cudagraph-estimate
    est = int(getattr(worker, "cudagraph_memory_estimate", 0) or 0)
    try:
        import vllm.envs as envs

        return est if getattr(envs, "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS", True) else 0
    except Exception:  # noqa: BLE001
        return est
