"""KV-cache arithmetic read from vLLM's own specs, and what KV initialisation allocated.

The allocation measurement does not trust the planner: after the engine's real KV initialisation
it sums the bytes actually allocated (unique storages of every `kv_cache` attribute on every
module of the model and every layer of the forward context, recurrent state included), per KV
group and outside every group. audits.kv_audit_verdict compares the sum with the budget: a
divisor that counts one placeholder layer per group while one buffer is allocated per real layer
shows up as a ratio near the layer count.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..core.shapes import request_capacity_tokens
from ..core.types import KVAuditGroup
from .versions import unsupported


def _tensors(obj) -> Iterable:
    import torch

    if isinstance(obj, torch.Tensor):
        if obj.numel() > 0:
            yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _tensors(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors(o)


def _storage_key(t):
    s = t.untyped_storage()
    return (str(t.device), s.data_ptr()), s.nbytes()


def kv_holders(runner) -> dict[str, object]:
    """name -> kv_cache object, from the forward context and from every module of the model."""
    # vllm-touch: kv-holders
    holders: dict[str, object] = {}
    ctx = runner.vllm_config.compilation_config.static_forward_context
    for name, layer in ctx.items():
        if hasattr(layer, "kv_cache"):
            holders[name] = layer.kv_cache
    known = {id(layer) for layer in ctx.values()}
    model = getattr(runner, "model", None)
    if model is not None:
        for name, mod in model.named_modules():
            kv = getattr(mod, "kv_cache", None)
            if kv is not None and id(mod) not in known:
                holders[name] = kv
    for i, t in enumerate(getattr(runner, "kv_caches", []) or []):
        holders.setdefault(f"runner.kv_caches[{i}]", t)
    return holders


def allocated_kv_bytes(runner) -> int:
    seen: dict = {}
    for obj in kv_holders(runner).values():
        for t in _tensors(obj):
            k, n = _storage_key(t)
            seen[k] = max(seen.get(k, 0), n)
    return sum(seen.values())


def bytes_per_token(runner) -> int:
    """KV bytes one token costs across every attention layer (per-token specs only)."""
    # vllm-touch: kv-holders
    total = 0.0
    for spec in runner.get_kv_cache_spec().values():
        bs = getattr(spec, "block_size", None)
        if bs and hasattr(spec, "num_kv_heads"):
            total += spec.page_size_bytes / bs
    return int(round(total))


def prefix_request_tokens(runner, bytes_per_token: int) -> int:
    """Limits.prefix_request_tokens where requests share a step only on cached hits of their own
    (facts.sibling_hits_serialize): each holds, in every KV group, its own cached last block and
    one new block. A pool block is what the plan allocates per block (every group's layers share
    the pool: one block serves one group); in capacity tokens, rounded down (fewer tokens a
    request means more requests at once: the safe direction)."""
    # vllm-touch: kv-holders
    cfg, block_bytes = _pool_block(runner)
    return max(1, 2 * len(cfg.kv_cache_groups) * block_bytes // bytes_per_token)


def _pool_block(runner):
    """(a KVCacheConfig of vLLM's own grouping for this runner, the bytes of one pool block: what
    the plan allocates per block, every group's layers sharing the pool)."""
    cfg = kv_cache_config_with_blocks(runner, 2)
    return cfg, declared_bytes(cfg) // max(1, int(cfg.num_blocks))


def pool_block_bytes(runner) -> int | None:
    """One block of vLLM's KV pool as its plan lays it out (the largest KV group's bytes per
    block, aligned: what vLLM's BlockPool holds back as its null block and what its
    get_kv_cache_configs subtracts before checking one request); None where the plan cannot be
    built here (the admission then counts one block of every attention layer)."""
    # vllm-touch: kv-cache-config
    try:
        return _pool_block(runner)[1] or None
    except Exception:  # noqa: BLE001 - the admission's default is the safe direction
        return None


def is_spec(spec, name: str) -> bool:
    """Whether `spec` is a vLLM `name` spec (by class name through the MRO: SlidingWindowMLASpec
    is a SlidingWindowSpec; a vLLM that moves the classes does not break every start)."""
    return any(c.__name__ == name for c in type(spec).__mro__)


def _kept_tokens(spec) -> int | None:
    """The fewest trailing tokens a decoding request keeps in a group of `spec`
    (shapes.request_capacity_tokens' kept_tokens): the window of a SlidingWindowSpec, 1 for a
    ChunkedLocalAttentionSpec and for a MambaSpec (vLLM reserves more for it, speculative and
    checkpoint blocks, but a decoding request holds one: MambaManager.remove_skipped_blocks),
    the window plus one of an RSWASpec, None for every other spec — a FullAttentionSpec that carries a
    sliding_window (vLLM's conversion when the hybrid KV cache manager is off) keeps everything.
    A UniformTypeKVCacheSpecs group answers for its layers when they all agree. Classes are
    matched by name through the MRO (SlidingWindowMLASpec is a SlidingWindowSpec), so a vLLM
    that moves them does not break every start: an unknown class counts as holding it all."""
    # vllm-touch: kv-holders
    inner = list((getattr(spec, "kv_cache_specs", None) or {}).values()) or [spec]
    if all(is_spec(s, "SlidingWindowSpec") for s in inner):
        return max(1, min(int(s.sliding_window) for s in inner))
    if all(is_spec(s, "ChunkedLocalAttentionSpec") for s in inner):
        return 1
    if all(is_spec(s, "MambaSpec") for s in inner):  # a running state: one block in steady state
        return 1
    if all(is_spec(s, "RSWASpec") for s in inner) and \
            all(getattr(s, "rswa_window", None) for s in inner):  # evicts the gap behind it
        return max(1, min(int(s.rswa_window) + 1 for s in inner))
    return None


def speculative_state_blocks(spec) -> int:
    """The blocks a decoding request holds in a Mamba group beyond the one of its running state:
    the speculative blocks (num_speculative_blocks = k under MTP, EAGLE-3, DFlash), which vLLM's
    MambaManager allocates with the request and keeps (get_num_blocks_to_allocate adds them in
    both cache modes; remove_skipped_blocks frees none of them). 0 for any other spec."""
    # vllm-touch: kv-holders
    inner = list((getattr(spec, "kv_cache_specs", None) or {}).values()) or [spec]
    if not all(is_spec(s, "MambaSpec") for s in inner):
        return 0
    return max(0, min(int(getattr(s, "num_speculative_blocks", 0) or 0) for s in inner))


def full_request_tokens(runner, bytes_per_token: int, max_model_len: int,
                        block_size: int) -> int | None:
    """Limits.full_request_tokens: what one max_model_len request holds of the pool, in capacity
    tokens, counted per KV group on a KVCacheConfig of vLLM's own grouping (the pool block is
    what the plan allocates per block, as in prefix_request_tokens). None, without building a
    config, unless some layer keeps only a window (sliding window, chunked local attention):
    pure full-attention models and Mamba hybrids keep the block-rounded max_model_len. Mamba
    groups are left out: their blocks are state_request_tokens', added to this in
    Limits.tokens_per_full_request (counted here too, a hybrid with a window paid them twice)."""
    # vllm-touch: kv-cache-config
    if not any(_kept_tokens(spec) is not None and not is_spec(spec, "MambaSpec")
               for spec in runner.get_kv_cache_spec().values()):
        return None
    cfg, block_bytes = _pool_block(runner)
    vllm_config = runner.vllm_config
    groups = []
    for group in cfg.kv_cache_groups:
        if getattr(group, "host_resident", False):  # a pool of its own (0.32 HiSparse)
            continue
        spec = group.kv_cache_spec
        if state_blocks(spec):  # a Mamba group's blocks are state_request_tokens' (1 + k)
            continue
        reserved = -(-int(spec.max_memory_usage_bytes(vllm_config)) // int(spec.page_size_bytes))
        groups.append((int(spec.block_size), reserved, _kept_tokens(spec)))
    if block_bytes <= 0 or not groups:
        return None
    return request_capacity_tokens(max_model_len=max_model_len, block_size=block_size,
                                   pool_block_bytes=block_bytes, bytes_per_token=bytes_per_token,
                                   groups=groups)


def state_blocks(spec) -> int:
    """The pool blocks a request holds in a group of `spec` whatever its length: 1 + k in a
    Mamba group (its running state, plus speculative_state_blocks' k), 0 in any other."""
    # vllm-touch: kv-holders
    inner = list((getattr(spec, "kv_cache_specs", None) or {}).values()) or [spec]
    if not all(is_spec(s, "MambaSpec") for s in inner):
        return 0
    return 1 + speculative_state_blocks(spec)


def state_request_tokens(runner, bytes_per_token: int) -> int:
    """Limits.state_request_tokens: the pool blocks a request holds whatever its length, in
    capacity tokens (rounded down: fewer tokens a request means more requests at once, the
    safe direction): state_blocks over the Mamba groups, 1 + k each: the running state's
    block with or without a drafter, and a drafter's k speculative blocks. Left out, a pool
    a few thousand blocks deep holds far fewer short requests than the plan counts (each
    holds one block in every group). 0, without building a config, when no group is Mamba."""
    # vllm-touch: kv-cache-config
    if not any(state_blocks(spec) for spec in runner.get_kv_cache_spec().values()):
        return 0
    cfg, block_bytes = _pool_block(runner)
    blocks = sum(state_blocks(g.kv_cache_spec) for g in cfg.kv_cache_groups
                 if not getattr(g, "host_resident", False))
    return blocks * block_bytes // max(1, bytes_per_token)


def request_floor(kv_cache_config) -> dict[str, int]:
    """core/audits.concurrency_note's pool facts from the KV cache config vLLM built: its blocks,
    and the fewest a request holds (one in every device-pool group, plus a Mamba group's
    speculative blocks, speculative_state_blocks)."""
    # vllm-touch: kv-cache-config
    groups = [g for g in kv_cache_config.kv_cache_groups if not getattr(g, "host_resident", False)]
    state = sum(speculative_state_blocks(g.kv_cache_spec) for g in groups)
    return {"pool_blocks": int(kv_cache_config.num_blocks), "request_blocks": len(groups) + state,
            "state_blocks": state}


def kv_group_count(runner) -> int | None:
    """How many KV groups vLLM makes of this runner's layers (its own grouping, as KV
    initialisation will build it); None where that cannot be built here."""
    # vllm-touch: kv-cache-config
    try:
        return len(kv_cache_config_with_blocks(runner, 2).kv_cache_groups)
    except Exception:  # noqa: BLE001 - unknown: the configs decide (facts._one_kv_group)
        return None


def one_request_bytes(runner, vllm_config) -> int:
    """What one request at max_model_len needs in the check vLLM's engine core runs
    (get_kv_cache_configs: `_max_memory_usage_bytes_from_groups`): the pool block times
    every KV group's blocks, so a group of fewer layers than the largest is charged the largest
    group's block (a hybrid's padding). Never below the sum of each layer's own spec, which is
    the figure where vLLM's grouping cannot be built here."""
    # vllm-touch: kv-holders
    per_layer = sum(spec.max_memory_usage_bytes(vllm_config)
                    for spec in runner.get_kv_cache_spec().values())
    need = _one_request_need()  # an unknown signature refuses the start (before the try)
    if need is None:
        return per_layer
    try:
        groups = kv_cache_config_with_blocks(runner, 2).kv_cache_groups
        return max(per_layer, int(need(vllm_config, groups)))
    except Exception:  # noqa: BLE001 - no grouped figure here: the per-layer sum (vLLM's older check)
        return per_layer


NEED_FORMS = {("vllm_config", "kv_cache_groups"): "plain",               # 0.26-0.32 kv_cache_utils
              ("builder", "vllm_config", "kv_cache_groups"): "builder"}  # 0.33 kv_cache_planning
"""The parameter lists of `_max_memory_usage_bytes_from_groups` the adapter knows."""


def need_form(params) -> str | None:
    """How to call vLLM's one-request figure, from its parameter names: "plain" (vllm_config,
    kv_cache_groups), "builder" (the KV cache config builder first), None for any other list."""
    return NEED_FORMS.get(tuple(params))


def _one_request_need():
    """vLLM's one-request figure as f(vllm_config, groups): kv_cache_utils' (0.26-0.32) or
    kv_cache_planning's (0.33, which takes the KV cache config builder first); None where this
    vLLM has neither. A signature the adapter does not know refuses the start, naming it (called
    with the old arguments it raised TypeError, which the per-layer fallback used to hide)."""
    # vllm-touch: kv-holders
    import inspect

    try:
        from vllm.v1.core.kv_cache_utils import _max_memory_usage_bytes_from_groups as need
    except ImportError:
        try:  # 0.33 moved the planning helpers
            from vllm.v1.core.kv_cache_planning import _max_memory_usage_bytes_from_groups as need
        except ImportError:
            return None
    params = list(inspect.signature(need).parameters)
    form = need_form(params)
    if form is None:
        raise unsupported("kv-holders", f"_max_memory_usage_bytes_from_groups takes "
                                        f"({', '.join(params)}), not a form the adapter knows")
    if form == "plain":
        return need
    from vllm.v1.core.kv_cache_config_builder import get_kv_cache_config_builder

    return lambda vllm_config, groups: need(get_kv_cache_config_builder(vllm_config),
                                            vllm_config, groups)


def kv_cache_config_with_blocks(runner, num_blocks: int):
    """A KVCacheConfig of exactly `num_blocks` blocks for this runner's layers.

    0.26-0.32: `num_gpu_blocks_override` + get_kv_cache_config_from_groups(available_memory=0),
    the trick vLLM's own _init_minimal_kv_cache_for_profiling uses. 0.33: the KVCacheConfigBuilder
    (`builder.get_kv_cache_config_from_groups(vllm_config, groups, num_blocks=)`, with a user's
    override cleared for the call; read, not run).
    """
    # vllm-touch: kv-cache-config
    vllm_config = runner.vllm_config
    spec = runner.get_kv_cache_spec()
    cache_config = vllm_config.cache_config
    saved = cache_config.num_gpu_blocks_override
    try:
        from vllm.v1.core.kv_cache_utils import get_kv_cache_config_from_groups, get_kv_cache_groups
    except ImportError:  # 0.33: the builder takes the block count itself; a user's override
        import inspect

        try:
            from vllm.v1.core.kv_cache_config_builder import get_kv_cache_config_builder
            from vllm.v1.core.kv_cache_planning import get_kv_cache_groups_from_builder
        except ImportError as e:
            raise unsupported("kv-cache-config", "neither kv_cache_utils' planner (0.26-0.32) nor "
                              f"the KV cache config builder (0.33) is importable ({e})") from e
        builder = get_kv_cache_config_builder(vllm_config)
        if "num_blocks" not in inspect.signature(builder.get_kv_cache_config_from_groups).parameters:
            raise unsupported("kv-cache-config", f"{type(builder).__name__}."
                              "get_kv_cache_config_from_groups takes no num_blocks")
        groups = get_kv_cache_groups_from_builder(builder, vllm_config, spec)
        # the default builder still applies a user's override (may_override_num_blocks): cleared
        # for the call, as vLLM's own _pool_bytes_per_block_from_builder does
        cache_config.num_gpu_blocks_override = None
        try:
            return builder.get_kv_cache_config_from_groups(vllm_config, groups, num_blocks=num_blocks)
        finally:
            cache_config.num_gpu_blocks_override = saved
    groups = get_kv_cache_groups(vllm_config, spec)
    cache_config.num_gpu_blocks_override = num_blocks
    try:
        return get_kv_cache_config_from_groups(vllm_config, groups, available_memory=0)
    finally:
        cache_config.num_gpu_blocks_override = saved


def declared_bytes(kv_cache_config) -> int:
    """What the plan says it allocates on the device. 0.32+ (KVCacheTensor has `layers`): every
    tensor places its layers in ONE backing allocation of `size` bytes (vLLM's worker asserts a
    single size, v1/worker/utils.py), so that size, once, whatever the overlays' strides. 0.26: one
    tensor per KVCacheTensor. Host-resident pools (0.32 HiSparse) are not device memory."""
    # vllm-touch: kv-holders
    device = [t for t in kv_cache_config.kv_cache_tensors if not getattr(t, "host_resident", False)]
    if any(getattr(t, "layers", None) is not None for t in device):
        return max((int(t.size) for t in device), default=0)
    return sum(int(t.size) for t in device)


def _view_key(t):
    """One view of a storage: where it starts, its shape, strides and dtype."""
    return (str(t.device), t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape),
            tuple(t.stride()), t.dtype)


def _view_bytes(t) -> int:
    """The bytes a KV view addresses (its elements: a layer's [blocks, ...] view of a pool laid
    out block-major addresses its own pages, not the span between its first and last)."""
    return min(t.numel() * t.element_size(), t.untyped_storage().nbytes())


def drafter_layer_names(runner) -> set[str]:
    """The attention/state layers of the speculative drafter's own model: the forward context's
    layers that the target model (runner.model) does not hold. Empty without a drafter, and
    empty (no label, nothing else changes) when the target cannot be walked."""
    # vllm-touch: kv-holders
    model = getattr(runner, "model", None)
    if model is None or getattr(runner.vllm_config, "speculative_config", None) is None:
        return set()
    try:
        target = {id(m) for m in model.modules()}
    except Exception:  # noqa: BLE001 - a wrapper that is not a module: no drafter label
        return set()
    ctx = runner.vllm_config.compilation_config.static_forward_context
    return {name for name, layer in ctx.items() if id(layer) not in target}


def _layer_paths(runner, kv_cache_config) -> list[tuple[str, int]]:
    """(module path, group index) for every path of the target model that reaches a planned
    layer's module, aliases included: a registry that lists one placeholder layer per group
    has every real layer of the group call it, so the placeholder sits under each of their
    paths."""
    # vllm-touch: kv-holders
    ctx = runner.vllm_config.compilation_config.static_forward_context
    group_of = {id(ctx[n]): gi for gi, g in enumerate(kv_cache_config.kv_cache_groups)
                for n in g.layer_names if n in ctx}
    model = getattr(runner, "model", None)
    try:
        return [(path, group_of[id(m)]) for path, m in
                model.named_modules(remove_duplicate=False) if id(m) in group_of]
    except Exception:  # noqa: BLE001 - no module tree to read: shapes alone decide
        return []


def _nearest_group(holder: str, aliases: list[tuple[str, int]], among: list[int]) -> int | None:
    """The one group among `among` whose layer is reached under the nearest module above
    `holder` (model.layers.5.self_attn.x: a group layer under model.layers.5.self_attn); None
    when none is, or more than one at the nearest level."""
    parts = holder.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        prefix = ".".join(parts[:cut]) + "."
        found = {gi for path, gi in aliases if path.startswith(prefix) and gi in among}
        if found:
            return found.pop() if len(found) == 1 else None
    return None


def _group_blocks(kv_cache_config, names) -> int:
    """The blocks a group's layers address: num_blocks, or (0.32) the most of num_blocks_of over
    the KV cache tensors holding them (a host-resident HiSparse pool has its own count)."""
    # vllm-touch: kv-holders
    of = getattr(kv_cache_config, "num_blocks_of", None)
    mine = [t for t in kv_cache_config.kv_cache_tensors
            if set(getattr(t, "layers", None) or getattr(t, "shared_by", None) or ()) & set(names)]
    if of is None or not mine:
        return int(kv_cache_config.num_blocks)
    return max(int(of(t)) for t in mine)


def _group_page_bytes(spec, names) -> int:
    """A group's bytes per block: each layer's page. A UniformTypeKVCacheSpecs group's own
    page_size_bytes already sums its layers' pages, so it counts once, not once per layer."""
    # vllm-touch: kv-holders
    inner = getattr(spec, "kv_cache_specs", None)
    if inner:
        return sum(int(inner[n].page_size_bytes) for n in names
                   if n in inner) or int(getattr(spec, "page_size_bytes", 0))
    return int(getattr(spec, "page_size_bytes", 0)) * len(names)


def allocation(runner, kv_cache_config, budget: int) -> tuple[list[KVAuditGroup], int, int]:
    """(what KV initialisation allocated per group, plus one group for storages outside every
    group; the bytes allowed: the budget, or what num_gpu_blocks_override explains; the bytes
    allocated in all: the distinct storages).

    Per group: the bytes its layers' KV views address (vLLM 0.32 places every group's layers in
    one backing allocation, the groups overlaying it: a group's share is its own views, not the
    storage), plus every storage outside the plan whose tensors have the shape and dtype of this
    group's layer views — one buffer per real layer that a plan listing one placeholder layer
    per group never counted. The drafter's layers are named per group.
    The total is the distinct storages, once each, however many groups view them."""
    holders = kv_holders(runner)
    drafter = drafter_layer_names(runner)
    storages: dict = {}            # storage key -> bytes
    holders_of: dict = {}          # storage key -> holder names
    tensors_of: dict[str, list] = {}
    for name, obj in holders.items():
        for t in _tensors(obj):
            k, n = _storage_key(t)
            storages[k] = max(storages.get(k, 0), n)
            holders_of.setdefault(k, []).append(name)
            tensors_of.setdefault(name, []).append(t)
    plan = []
    grouped_layers: set[str] = set()
    for gi, group in enumerate(kv_cache_config.kv_cache_groups):
        names = tuple(group.layer_names)
        grouped_layers.update(names)
        spec = group.kv_cache_spec
        declared = _group_blocks(kv_cache_config, names) * _group_page_bytes(spec, names)
        views = {_view_key(t): _view_bytes(t) for n in names for t in tensors_of.get(n, [])}
        shapes = {(tuple(t.shape), t.dtype) for n in names for t in tensors_of.get(n, [])}
        plan.append([f"group{gi}:{type(spec).__name__}", names, declared, sum(views.values()),
                     shapes, []])
    outside = [k for k, hs in holders_of.items() if not any(h in grouped_layers for h in hs)]
    aliases = _layer_paths(runner, kv_cache_config) if outside else []
    unexplained = []
    for k in outside:
        ts = [t for h in holders_of[k] for t in tensors_of[h] if _storage_key(t)[0] == k]
        match = [gi for gi, g in enumerate(plan)
                 if any((tuple(t.shape), t.dtype) in g[4] for t in ts)]
        if len(match) > 1:  # groups of one page shape: the module tree tells them apart
            near = {_nearest_group(h, aliases, match) for h in holders_of[k]} - {None}
            match = list(near) if len(near) == 1 else []
        if len(match) == 1:  # a per-layer buffer of one group's layer shape
            plan[match[0]][3] += storages[k]
            plan[match[0]][5].extend(sorted(set(holders_of[k])))
        else:
            unexplained.append(k)
    groups = [KVAuditGroup(name=name, layers=names, declared_bytes=declared,
                           allocated_bytes=alloc,
                           drafter_layers=tuple(n for n in names if n in drafter),
                           unplanned_layers=tuple(unplanned))
              for name, names, declared, alloc, _, unplanned in plan]
    if unexplained:
        groups.append(KVAuditGroup(
            name="outside the plan",
            layers=tuple(sorted({h for k in unexplained for h in holders_of[k]})),
            declared_bytes=0, allocated_bytes=sum(storages[k] for k in unexplained)))
    allowed = budget
    # vllm-touch: kv-cache-config
    override = getattr(runner.vllm_config.cache_config, "num_gpu_blocks_override", None)
    if override is not None:
        allowed = max(budget, declared_bytes(kv_cache_config))
    return groups, allowed, sum(storages.values())
