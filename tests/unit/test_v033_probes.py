"""vLLM 0.33 (read, not run): the feature probes that tell it from 0.26-0.32 where the adapter's
figures depend on it.

* `_max_memory_usage_bytes_from_groups` (the engine core's one-request check) moved to
  v1/core/kv_cache_planning.py and takes the KV cache config builder first; called the 0.32 way
  it raised TypeError and the per-layer fallback hid it. An unknown parameter list refuses the
  start, naming the hook."""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace as NS

import pytest

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
