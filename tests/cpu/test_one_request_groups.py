"""One request's KV need is the figure vLLM's engine core checks (get_kv_cache_configs, 0.32):
the pool block times every KV group's blocks. A hybrid whose layer types come in unequal counts
is padded into groups of one size, so a group of fewer layers pays the largest group's block,
and the sum of the layers' own specs falls short of it (that shortfall let a KV size the
profiler called 'fits' be refused by vLLM's start)."""

import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")

from vllm.config import ModelConfig, VllmConfig  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec  # noqa: E402

from worstcase_profiler.adapter import kv  # noqa: E402
from worstcase_profiler.data import __path__ as data_path  # noqa: E402


def _runner(specs):
    cfg = VllmConfig(model_config=ModelConfig(model=f"{data_path[0]}/tiny-llama", max_model_len=4096,
                                              skip_tokenizer_init=True))
    cfg.cache_config.kv_cache_layout = "LBHNC"  # the engine core resolves it before profiling
    return types.SimpleNamespace(vllm_config=cfg, get_kv_cache_spec=lambda: specs), cfg


def test_a_padded_hybrid_needs_the_pool_block_for_every_group_block():
    full = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.float16)
    swa = SlidingWindowSpec(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.float16,
                            sliding_window=128)
    specs = {"l0": full, "l1": full, "l2": full, "l3": swa, "l4": swa}
    runner, cfg = _runner(specs)
    groups = kv.kv_cache_config_with_blocks(runner, 2).kv_cache_groups
    widest = max(len(g.layer_names) for g in groups)
    assert min(len(g.layer_names) for g in groups) < widest  # padded: 3 full layers in groups of 2
    pool_block = widest * full.page_size_bytes
    blocks = sum(-(-g.kv_cache_spec.max_memory_usage_bytes(cfg) // g.kv_cache_spec.page_size_bytes)
                 for g in groups)
    per_layer = sum(s.max_memory_usage_bytes(cfg) for s in specs.values())
    got = kv.one_request_bytes(runner, cfg)
    assert got == pool_block * blocks
    assert got > per_layer


def test_one_group_keeps_the_per_layer_figure():
    full = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.float16)
    specs = {f"l{i}": full for i in range(4)}
    runner, cfg = _runner(specs)
    assert kv.one_request_bytes(runner, cfg) == sum(s.max_memory_usage_bytes(cfg)
                                                    for s in specs.values())
