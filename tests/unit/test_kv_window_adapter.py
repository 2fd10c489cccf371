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
