"""Issue 34, before device time: the layouts bench/startup_bench.py benchmarks (FAMILIES)
resolve in vLLM at the bench's 131,072-token context as the model class each stands for, with
its family's geometry (a GDN hybrid's linear-attention layers, Gemma 3's 1,024-token window, the
MoE's experts). Nothing is built: ModelConfig only, in a subprocess (Qwen3.5's module imports
transformers' Qwen2-VL processor, which needs torchvision: the test stand-in
WCP_FIXTURES_QWEN_VL_CPU serves it on this torchvision-less box; the GPU host has torchvision)."""

from __future__ import annotations

import json
import sys

import pytest

from conftest import ROOT, engine_env, run_python

pytest.importorskip("vllm")

sys.path.insert(0, str(ROOT / "bench"))
import startup_bench  # noqa: E402

PROBE = r"""
import json, sys
import vllm.plugins
vllm.plugins.load_general_plugins()
from vllm.config import ModelConfig
out = {}
for name, path in json.loads(sys.argv[1]).items():
    mc = ModelConfig(model=path, max_model_len=131072, skip_tokenizer_init=True)
    t = mc.hf_text_config
    out[name] = dict(arch=mc.architecture, max_model_len=mc.max_model_len,
                     layers=t.num_hidden_layers, vocab=mc.get_vocab_size(),
                     window=mc.get_sliding_window(), experts=getattr(t, "num_experts", 0),
                     layer_types=sorted(set(getattr(t, "layer_types", None) or [])))
print("FAMILIES " + json.dumps(out))
"""


def test_the_benchmarks_families_resolve_in_vllm_as_their_classes():
    paths = {n: str(d) for n, (d, _) in startup_bench.FAMILIES.items()}
    run = run_python(PROBE.replace("sys.argv[1]", repr(json.dumps(paths))), timeout=300,
                     env=engine_env(WCP_FIXTURES_QWEN_VL_CPU="1", HF_HUB_OFFLINE="1"))
    line = [ln for ln in run.out.splitlines() if ln.startswith("FAMILIES ")]
    assert run.rc == 0 and line, run.text[-3000:]
    got = json.loads(line[-1][len("FAMILIES "):])
    print(json.dumps(got, indent=1))
    assert {n: g["arch"] for n, g in got.items()} == {
        "llama8b": "LlamaForCausalLM", "qwen2-32b": "Qwen2ForCausalLM",
        "qwen2-14b": "Qwen2ForCausalLM",
        "qwen35-32l": "Qwen3_5ForCausalLM", "gemma3-12b": "Gemma3ForCausalLM",
        "qwen3moe-30b": "Qwen3MoeForCausalLM"}
    for name, g in got.items():
        assert g["max_model_len"] == 131072 and g["layers"] >= 32 and g["vocab"] >= 128_000, g
    assert got["qwen35-32l"]["layer_types"] == ["full_attention", "linear_attention"]
    assert got["gemma3-12b"]["window"] == 1024
    assert got["qwen3moe-30b"]["experts"] == 128
    assert got["qwen2-32b"]["window"] is None  # use_sliding_window false: full attention
    assert got["qwen2-14b"]["window"] is None and got["qwen2-14b"]["layers"] == 48
