"""vLLM 0.33 (read, not run): the feature probes that tell it from 0.26-0.32 where the adapter's
figures depend on it.

* `_max_memory_usage_bytes_from_groups` (the engine core's one-request check) moved to
  v1/core/kv_cache_planning.py and takes the KV cache config builder first; called the 0.32 way
  it raised TypeError and the per-layer fallback hid it. An unknown parameter list refuses the
  start, naming the hook.
* Lookahead block hashes (`VllmConfig.num_hash_lookahead_tokens`, on by default for EAGLE/MTP
  with prefix caching): the scheduler then drops no hit block, so a hit may leave a single row
  at a long context; the limits must not assume the EAGLE drop there."""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace as NS

import pytest

from worstcase_profiler.adapter import facts
from worstcase_profiler.adapter import kv as kvmod
from worstcase_profiler.errors import UnsupportedModel


# --- the one-request figure --------------------------------------------------------------------

@pytest.mark.parametrize("params,form", [
    (["vllm_config", "kv_cache_groups"], "plain"),               # 0.26-0.32 kv_cache_utils
    (["builder", "vllm_config", "kv_cache_groups"], "builder"),  # 0.33 kv_cache_planning
    (["vllm_config", "kv_cache_groups", "builder"], None),
    (["builder", "vllm_config", "kv_cache_groups", "tp"], None),
    ([], None),
])
def test_the_one_request_figure_is_called_only_in_a_form_read(params, form):
    assert kvmod.need_form(params) == form


def _fake_modules(monkeypatch, need):
    """vLLM 0.33's layout: kv_cache_utils without the helper, kv_cache_planning and the builder
    module with it (fake modules; the installed vLLM's kv_cache_utils loses its helper)."""
    pytest.importorskip("vllm")
    from vllm.v1.core import kv_cache_utils

    monkeypatch.delattr(kv_cache_utils, "_max_memory_usage_bytes_from_groups", raising=False)
    planning = types.ModuleType("vllm.v1.core.kv_cache_planning")
    planning._max_memory_usage_bytes_from_groups = need
    builder_mod = types.ModuleType("vllm.v1.core.kv_cache_config_builder")
    builder_mod.get_kv_cache_config_builder = lambda vllm_config: ("builder-for", vllm_config)
    monkeypatch.setitem(sys.modules, "vllm.v1.core.kv_cache_planning", planning)
    monkeypatch.setitem(sys.modules, "vllm.v1.core.kv_cache_config_builder", builder_mod)


def _runner(monkeypatch, per_layer: int):
    spec = NS(max_memory_usage_bytes=lambda cfg: per_layer)
    groups = ["g0", "g1"]
    monkeypatch.setattr(kvmod, "kv_cache_config_with_blocks",
                        lambda runner, n: NS(kv_cache_groups=groups))
    return NS(get_kv_cache_spec=lambda: {"layer.0": spec}), groups


def test_0_33_builder_form_gets_the_builder_and_the_grouped_figure(monkeypatch):
    seen = []

    def need(builder, vllm_config, kv_cache_groups):
        seen.append((builder, vllm_config, kv_cache_groups))
        return 5000

    _fake_modules(monkeypatch, need)
    runner, groups = _runner(monkeypatch, per_layer=1000)
    cfg = NS(name="cfg")
    assert kvmod.one_request_bytes(runner, cfg) == 5000
    assert seen == [(("builder-for", cfg), cfg, groups)]


def test_never_below_the_per_layer_sum(monkeypatch):
    _fake_modules(monkeypatch, lambda builder, vllm_config, kv_cache_groups: 10)
    runner, _ = _runner(monkeypatch, per_layer=1000)
    assert kvmod.one_request_bytes(runner, NS()) == 1000


def test_an_unknown_signature_refuses_the_start_naming_the_hook(monkeypatch):
    _fake_modules(monkeypatch, lambda vllm_config, kv_cache_groups, extra: 10)
    runner, _ = _runner(monkeypatch, per_layer=1000)
    with pytest.raises(UnsupportedModel, match=r"hook: kv-holders"):
        kvmod.one_request_bytes(runner, NS())


def test_the_installed_vllm_keeps_its_plain_form(monkeypatch):
    pytest.importorskip("vllm.v1.core.kv_cache_utils")
    need = kvmod._one_request_need()
    assert need is None or callable(need)  # 0.32 (the CPU venv): the function itself


# --- lookahead block hashes --------------------------------------------------------------------

def _config(lookahead=None, method="eagle3", hybrid=False, block=16):
    spec = NS(method=method, num_speculative_tokens=3, draft_model_config=None,
              use_eagle_block_drop=lambda: method in ("eagle", "eagle3", "mtp"))
    cfg = NS(speculative_config=spec,
             scheduler_config=NS(long_prefill_token_threshold=0),
             kv_transfer_config=None,
             cache_config=NS(enable_prefix_caching=True, block_size=block,
                             prefix_match_unit=None, mamba_cache_mode="align"),
             model_config=NS(hf_config=NS(compress_ratios=None), is_hybrid=hybrid,
                             is_attention_free=False, is_encoder_decoder=False))
    if lookahead is not None:
        cfg.num_hash_lookahead_tokens = lookahead
    return cfg


def test_0_32_eagle_drops_a_block_and_0_33_lookahead_hashes_do_not():
    before = facts.prefix_hit_rows(_config(), kv_groups=1)
    assert (before["prefix_hit_min_rows"], before["prefix_hit_drop"]) == (17, 16)
    assert facts.prefix_hit_rows(_config(lookahead=0), kv_groups=1) == before
    for lookahead in (1, 3):  # EAGLE-family: 1; multi-module MTP: k
        got = facts.prefix_hit_rows(_config(lookahead=lookahead), kv_groups=1)
        assert (got["prefix_hit_min_rows"], got["prefix_hit_drop"]) == (1, 0)


def test_an_unreadable_lookahead_is_taken_as_no_drop():
    class Config(NS):
        @property
        def num_hash_lookahead_tokens(self):
            raise RuntimeError("a config this adapter does not know")

    cfg = Config(**vars(_config()))
    assert facts.hash_lookahead_tokens(cfg) == 1
    got = facts.prefix_hit_rows(cfg, kv_groups=1)
    assert (got["prefix_hit_min_rows"], got["prefix_hit_drop"]) == (1, 0)


def test_siblings_do_not_serialize_under_a_drafter_with_lookahead_hashes(monkeypatch):
    monkeypatch.setattr(facts, "_mamba_caches_partial_tail", lambda: True)
    assert facts.sibling_hits_serialize(_config(lookahead=1, method="mtp", hybrid=True)) is False
    assert facts.sibling_hits_serialize(_config(method=None, hybrid=True)) is True


_TAIL_0_32 = """
        block_idx = cdiv(num_tokens, self.block_size) - 1
        blocks = self.req_to_blocks[request.request_id]
        source_block = blocks[block_idx]
        if source_block.is_null:
            return None

        partial_hash = self.block_pool.cache_partial_block(
"""
_TAIL_0_33 = _TAIL_0_32.replace("""            return None
""", """            return None
        # Already keyed here by a hit or an earlier step; re-caching would
        # mark it cached this step and defer every sibling that hits it.
        if source_block.block_hash_num_tokens == num_tokens:
            return None
""", 1)


def test_siblings_serialize_only_where_the_partial_tail_re_keys_the_hit_block(monkeypatch):
    """0.32's _cache_partial_tail_block re-keys the block a sibling hit, so the next sibling on
    it waits a step; 0.33's skips a block already keyed there, and the siblings share the step
    (its scheduler forms all 64 of tests/cpu/test_hybrid_hit_scheduling.py's plain plan in one):
    taking 0.33 to serialize would cap the sweep's requests on one prefix below what it forms."""
    assert _TAIL_0_33 != _TAIL_0_32
    assert facts.partial_tail_rekeys_hit_block(_TAIL_0_32, (0, 32)) is True
    assert facts.partial_tail_rekeys_hit_block(_TAIL_0_33, (0, 33)) is False
    # only the forms read count as serializing: a later vLLM, the 0.33 check written the other
    # way round, or a body that caches nothing are taken to let siblings share a step
    assert facts.partial_tail_rekeys_hit_block(_TAIL_0_32, (0, 34)) is False
    reversed_check = _TAIL_0_33.replace("source_block.block_hash_num_tokens == num_tokens",
                                        "num_tokens == source_block.block_hash_num_tokens")
    assert facts.partial_tail_rekeys_hit_block(reversed_check, (0, 32)) is False
    assert facts.partial_tail_rekeys_hit_block("def f(self):\n    return None\n", (0, 32)) is False
    for source, version, serialize in ((_TAIL_0_32, (0, 32), True), (_TAIL_0_33, (0, 33), False)):
        monkeypatch.setattr(facts, "_mamba_caches_partial_tail",
                            lambda s=source, v=version: facts.partial_tail_rekeys_hit_block(s, v))
        assert facts.sibling_hits_serialize(_config(method=None, hybrid=True)) is serialize
        assert facts.sibling_hits_serialize(_config(method="dflash", hybrid=True)) is serialize


# --- a KV cache config of exactly N blocks through 0.33's builder -------------------------------

def _planner_0_33(monkeypatch, builder):
    """0.33's layout: kv_cache_utils without the planner, the builder modules with it."""
    pytest.importorskip("vllm")
    from vllm.v1.core import kv_cache_utils

    for name in ("get_kv_cache_config_from_groups", "get_kv_cache_groups"):
        monkeypatch.delattr(kv_cache_utils, name, raising=False)
    builder_mod = types.ModuleType("vllm.v1.core.kv_cache_config_builder")
    builder_mod.get_kv_cache_config_builder = lambda vllm_config: builder
    planning = types.ModuleType("vllm.v1.core.kv_cache_planning")
    planning.get_kv_cache_groups_from_builder = lambda b, vllm_config, spec: ["groups", b]
    monkeypatch.setitem(sys.modules, "vllm.v1.core.kv_cache_config_builder", builder_mod)
    monkeypatch.setitem(sys.modules, "vllm.v1.core.kv_cache_planning", planning)


def _kv_runner(override):
    cfg = NS(cache_config=NS(num_gpu_blocks_override=override))
    return NS(vllm_config=cfg, get_kv_cache_spec=lambda: {"layer.0": "spec"}), cfg


def test_the_builder_plans_exactly_n_blocks_with_a_users_override_cleared_for_the_call(monkeypatch):
    seen = []

    class Builder:
        def get_kv_cache_config_from_groups(self, vllm_config, kv_cache_groups, num_blocks):
            seen.append((vllm_config.cache_config.num_gpu_blocks_override, num_blocks))
            return NS(num_blocks=num_blocks)

    _planner_0_33(monkeypatch, Builder())
    runner, cfg = _kv_runner(override=4096)
    assert kvmod.kv_cache_config_with_blocks(runner, 9).num_blocks == 9
    assert seen == [(None, 9)]                        # the override did not replace ours
    assert cfg.cache_config.num_gpu_blocks_override == 4096  # and is back afterwards


def test_a_builder_without_num_blocks_refuses_the_start(monkeypatch):
    class Builder:
        def get_kv_cache_config_from_groups(self, vllm_config, kv_cache_groups, available_memory):
            raise AssertionError("not called")

    _planner_0_33(monkeypatch, Builder())
    with pytest.raises(UnsupportedModel, match=r"hook: kv-cache-config"):
        kvmod.kv_cache_config_with_blocks(_kv_runner(None)[0], 2)


def test_no_planner_at_all_refuses_the_start(monkeypatch):
    _planner_0_33(monkeypatch, None)
    monkeypatch.setitem(sys.modules, "vllm.v1.core.kv_cache_planning", None)  # import fails
    with pytest.raises(UnsupportedModel, match=r"hook: kv-cache-config"):
        kvmod.kv_cache_config_with_blocks(_kv_runner(None)[0], 2)
