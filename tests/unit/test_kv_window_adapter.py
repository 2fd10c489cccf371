"""adapter/kv.full_request_tokens against vLLM's own specs and its own max-concurrency count.

Real vLLM spec classes (no engine): the KV groups are built by hand as vLLM lays out a hybrid
(one pool, a block serving one group), and kv_cache_config_with_blocks is replaced by them. The
plan's resident count must reach vllm.v1.core.kv_cache_utils.get_max_concurrency_for_kv_cache_config
on the same pool, and stay exactly as before where no layer keeps a window."""

from __future__ import annotations

import types

import pytest

kvi = pytest.importorskip("vllm.v1.kv_cache_interface")
torch = pytest.importorskip("torch")

from vllm.v1.core.kv_cache_utils import get_max_concurrency_for_kv_cache_config  # noqa: E402

from worstcase_profiler.adapter import kv as kvmod  # noqa: E402
from worstcase_profiler.core.cache import pool_capacity_tokens  # noqa: E402
from worstcase_profiler.core.shapes import Limits, decode_batch  # noqa: E402

GiB = 1 << 30
MML, MBT, BLOCK = 131072, 8192, 16


def _config():
    # what the specs' max_memory_usage_bytes read (0.26 and 0.32)
    return types.SimpleNamespace(
        model_config=types.SimpleNamespace(max_model_len=MML),
        parallel_config=types.SimpleNamespace(decode_context_parallel_size=1),
        scheduler_config=types.SimpleNamespace(max_num_batched_tokens=MBT),
        max_in_flight_tokens=MBT)


def _spec(kind, **extra):
    return kind(block_size=BLOCK, num_kv_heads=8, head_size=64, dtype=torch.bfloat16, **extra)


def _runner(layer_specs, groups, monkeypatch, num_blocks=2):
    """A runner whose per-layer specs are `layer_specs` and whose KV config has `groups`."""
    config = _config()
    page = next(iter(layer_specs.values())).page_size_bytes
    group_layers = max(len(g.layer_names) for g in groups)
    cfg = types.SimpleNamespace(num_blocks=num_blocks, kv_cache_groups=groups,
                                kv_cache_tensors=[])
    monkeypatch.setattr(kvmod, "kv_cache_config_with_blocks", lambda runner, n: cfg)
    monkeypatch.setattr(kvmod, "declared_bytes", lambda c: c.num_blocks * group_layers * page)
    return types.SimpleNamespace(vllm_config=config, get_kv_cache_spec=lambda: dict(layer_specs))


def _gpt_oss(sliding_kind):
    names = [f"model.layers.{i}.attn" for i in range(24)]
    sliding = {n: sliding_kind() for n in names[0::2]}
    full = {n: _spec(kvi.FullAttentionSpec) for n in names[1::2]}
    return {**sliding, **full}, sliding, full


def test_gpt_oss_resident_count_reaches_vllms_own_concurrency(monkeypatch):
    specs, sliding, full = _gpt_oss(lambda: _spec(kvi.SlidingWindowSpec, sliding_window=128))
    groups = [kvi.KVCacheGroupSpec(list(sliding), next(iter(sliding.values()))),
              kvi.KVCacheGroupSpec(list(full), next(iter(full.values())))]
    runner = _runner(specs, groups, monkeypatch)
    bpt = kvmod.bytes_per_token(runner)
    assert bpt == 49152
    tokens = kvmod.full_request_tokens(runner, bpt, MML, BLOCK)
    assert tokens == (8192 + 8) * 8

    pool = 40 * GiB
    num_blocks = pool // (12 * 32768)
    vllm = get_max_concurrency_for_kv_cache_config(
        _config(), types.SimpleNamespace(num_blocks=num_blocks, kv_cache_groups=groups,
                                         hisparse_host_num_blocks=None))
    cap = pool_capacity_tokens(explicit_bytes=pool, stock_kv_bytes=0, graph_estimate_bytes=0,
                               bytes_per_token=bpt, max_model_len=MML)
    old = Limits(MML, MBT, 1024, kv_capacity_tokens=cap)
    new = Limits(MML, MBT, 1024, kv_capacity_tokens=cap, full_request_tokens=tokens)
    assert old.max_resident_requests < int(vllm) <= new.max_resident_requests
    assert decode_batch(new).num_reqs >= int(vllm)


def test_no_window_no_change_and_no_kv_config_built(monkeypatch):
    names = [f"model.layers.{i}.attn" for i in range(4)]
    specs = {n: _spec(kvi.FullAttentionSpec) for n in names}

    def boom(*a):
        raise AssertionError("no KV config is built for a model without windowed layers")

    monkeypatch.setattr(kvmod, "kv_cache_config_with_blocks", boom)
    runner = types.SimpleNamespace(vllm_config=_config(), get_kv_cache_spec=lambda: dict(specs))
    assert kvmod.full_request_tokens(runner, kvmod.bytes_per_token(runner), MML, BLOCK) is None


def test_hybrid_manager_off_keeps_the_whole_request(monkeypatch):
    """With the hybrid KV cache manager off vLLM turns sliding layers into FullAttentionSpec
    (with a sliding_window) and allocates every token: the groups decide, not the layers."""
    specs, sliding, full = _gpt_oss(lambda: _spec(kvi.SlidingWindowSpec, sliding_window=128))
    promoted = _spec(kvi.FullAttentionSpec, sliding_window=128)
    groups = [kvi.KVCacheGroupSpec([*sliding, *full], promoted)]
    runner = _runner(specs, groups, monkeypatch)
    assert kvmod.full_request_tokens(runner, kvmod.bytes_per_token(runner), MML, BLOCK) is None


def test_chunked_local_groups_keep_one_block(monkeypatch):
    names = [f"model.layers.{i}.attn" for i in range(8)]
    chunked = {n: _spec(kvi.ChunkedLocalAttentionSpec, attention_chunk_size=8192)
               for n in names[:6]}
    full = {n: _spec(kvi.FullAttentionSpec) for n in names[6:]}
    groups = [kvi.KVCacheGroupSpec(list(full), next(iter(full.values())))] + [
        kvi.KVCacheGroupSpec(list(chunked)[i:i + 2], next(iter(chunked.values())))
        for i in range(0, 6, 2)]
    runner = _runner({**chunked, **full}, groups, monkeypatch)
    bpt = kvmod.bytes_per_token(runner)
    # 8192 full blocks + one block in each of three chunked groups; a pool block = 4 tokens
    assert kvmod.full_request_tokens(runner, bpt, MML, BLOCK) == (8192 + 3) * 2 * 32768 // bpt


def test_declared_bytes_counts_the_one_backing_once_whatever_the_overlay_strides():
    """vLLM 0.32 places every KVCacheTensor in ONE backing allocation (its worker asserts a single
    size); layers of two page sizes in one group give two tensors with different block strides.
    Counting each stride once doubled the pool block (review): prefix_request_tokens and
    full_request_tokens then charged each request twice what it holds."""
    from vllm.v1.core import kv_cache_utils as ku

    try:
        from vllm.v1.kv_cache_layout import KVCacheLayout
    except ImportError:
        pytest.skip("this vLLM has no KV cache layouts (0.26)")
    specs = {n: _spec(kvi.SlidingWindowSpec, sliding_window=128) for n in ("a", "c")}
    specs["b"] = kvi.SlidingWindowSpec(block_size=BLOCK, num_kv_heads=4, head_size=64,
                                       dtype=torch.bfloat16, sliding_window=128)
    uniform = kvi.UniformTypeKVCacheSpecs.from_specs(specs)
    if uniform is None:
        pytest.skip("this vLLM does not group layers of different page sizes")
    vc = types.SimpleNamespace(
        attention_config=types.SimpleNamespace(hisparse_config=None),
        cache_config=types.SimpleNamespace(get_resolved_kv_cache_layout=lambda: KVCacheLayout.LBHNC,
                                           num_gpu_blocks_override=2,
                                           prefix_cache_retention_interval=None))
    cfg = ku.get_kv_cache_config_from_groups(vc, [kvi.KVCacheGroupSpec(list(specs), uniform)],
                                             available_memory=0)
    sizes = {t.size for t in cfg.kv_cache_tensors}
    assert len(cfg.kv_cache_tensors) > 1 and len(sizes) == 1
    assert len({t.block_stride for t in cfg.kv_cache_tensors}) > 1  # the case that doubled
    assert kvmod.declared_bytes(cfg) == sizes.pop()


def test_a_mamba_group_is_charged_the_one_block_a_decoding_request_holds():
    """vLLM reserves a Mamba group 2 + speculative + checkpoint blocks a request, but a decoding
    request holds one (MambaManager.remove_skipped_blocks): charging the reservation would count
    fewer requests than can sit in the pool beside a sliding-window group (review). A pure Mamba
    hybrid keeps the plan it had (no windowed layer: no per-group count at all)."""
    mamba = kvi.MambaSpec(block_size=BLOCK, shapes=((1, 1),), dtypes=(torch.float32,),
                          mamba_cache_mode="align")
    assert kvmod._kept_tokens(mamba) == 1
    assert kvmod._kept_tokens(_spec(kvi.FullAttentionSpec)) is None
    runner = types.SimpleNamespace(get_kv_cache_spec=lambda: {"m": mamba,
                                                              "f": _spec(kvi.FullAttentionSpec)})
    assert kvmod.full_request_tokens(runner, 1024, MML, BLOCK) is None


@pytest.mark.parametrize("k", [0, 8])
def test_a_mamba_state_is_charged_its_one_plus_k_blocks(monkeypatch, k):
    """Issue 33: under speculative decoding (k = num_speculative_blocks) vLLM's MambaManager
    allocates 1 + k state blocks with each request and keeps them, so a Mamba hybrid's request
    at max_model_len holds its attention blocks plus 1 + k; the plan's resident count then equals
    vLLM's own max concurrency on the same pool (it counted attention alone before: more
    requests at the full extent than the scheduler can form). Without a drafter (k = 0) the
    running state's one block a group still counts: h100-run77's Qwen3.5 formed 788 requests
    where attention alone held 3,154."""
    names = [f"model.layers.{i}" for i in range(4)]
    full = {f"{n}.attn": _spec(kvi.FullAttentionSpec) for n in names[:2]}
    page = next(iter(full.values())).page_size_bytes
    mamba = {f"{n}.linear_attn": kvi.MambaSpec(
        block_size=MML, shapes=((page // 4,),), dtypes=(torch.float32,),
        mamba_cache_mode="none", num_speculative_blocks=k) for n in names[2:]}
    groups = [kvi.KVCacheGroupSpec(list(full), next(iter(full.values()))),
              kvi.KVCacheGroupSpec(list(mamba), next(iter(mamba.values())))]
    num_blocks = 1000 * (MML // BLOCK + 1 + k)
    runner = _runner({**full, **mamba}, groups, monkeypatch, num_blocks=num_blocks)
    bpt = kvmod.bytes_per_token(runner)
    assert kvmod.full_request_tokens(runner, bpt, MML, BLOCK) is None  # no window
    state = kvmod.state_request_tokens(runner, bpt)
    assert state == (1 + k) * BLOCK  # a pool block: BLOCK capacity tokens here
    cap = num_blocks * 2 * page // bpt
    limits = Limits(MML, MBT, 1024, kv_capacity_tokens=cap, state_request_tokens=state)
    assert limits.tokens_per_full_request == MML + (1 + k) * BLOCK
    assert limits.max_resident_requests == 1000
    cfg = types.SimpleNamespace(num_blocks=num_blocks, kv_cache_groups=groups)
    vc = _config()
    vc.cache_config = types.SimpleNamespace(mamba_cache_mode="none")
    assert limits.max_resident_requests == int(get_max_concurrency_for_kv_cache_config(vc, cfg))
    old = Limits(MML, MBT, 1024, kv_capacity_tokens=cap)  # the attention blocks alone
    assert old.tokens_per_full_request == MML  # the state left out
    assert old.max_resident_requests > 1000 or k == 0  # one block in 8,193: rounding hides it
    assert decode_batch(limits).num_reqs <= 1000


def test_a_mamba_block_is_charged_once_beside_a_sliding_window(monkeypatch):
    """A hybrid with a window layer (NemotronH with sliding_window, say): full_request_tokens
    counts the attention groups per group, and the Mamba group's running-state block belongs to
    state_request_tokens alone; tokens_per_full_request adds the two, so the block is paid once
    (it was paid in both, a request charged one pool block more than it holds)."""
    names = [f"model.layers.{i}" for i in range(3)]
    full = {f"{names[0]}.attn": _spec(kvi.FullAttentionSpec)}
    swa = {f"{names[1]}.attn": _spec(kvi.SlidingWindowSpec, sliding_window=128)}
    page = next(iter(full.values())).page_size_bytes
    mamba = {f"{names[2]}.mixer": kvi.MambaSpec(
        block_size=MML, shapes=((page // 4,),), dtypes=(torch.float32,),
        mamba_cache_mode="none")}
    groups = [kvi.KVCacheGroupSpec(list(d), next(iter(d.values()))) for d in (full, swa, mamba)]
    runner = _runner({**full, **swa, **mamba}, groups, monkeypatch, num_blocks=3000)
    bpt = kvmod.bytes_per_token(runner)
    tokens = kvmod.full_request_tokens(runner, bpt, MML, BLOCK)
    state = kvmod.state_request_tokens(runner, bpt)
    unit = kvmod._pool_block(runner)[1] // bpt  # one pool block, in capacity tokens
    assert state == unit  # the running state's one block
    limits = Limits(MML, MBT, 1024, kv_capacity_tokens=10**9, full_request_tokens=tokens,
                    state_request_tokens=state)
    # the full group's MML // BLOCK blocks and the window's 128 // BLOCK, then the state's
    assert tokens == (MML // BLOCK + 128 // BLOCK) * unit
    assert limits.tokens_per_full_request == tokens + unit


def test_a_non_mamba_model_builds_no_config_for_its_state(monkeypatch):
    def boom(*a):
        raise AssertionError("no KV config is built without a recurrent state")

    monkeypatch.setattr(kvmod, "kv_cache_config_with_blocks", boom)
    runner = types.SimpleNamespace(get_kv_cache_spec=lambda: {"f": _spec(kvi.FullAttentionSpec)})
    assert kvmod.state_request_tokens(runner, 1024) == 0
    mamba = kvi.MambaSpec(block_size=MML, shapes=((1, 1),), dtypes=(torch.float32,),
                          mamba_cache_mode="none")
    assert (kvmod.speculative_state_blocks(mamba), kvmod.state_blocks(mamba)) == (0, 1)