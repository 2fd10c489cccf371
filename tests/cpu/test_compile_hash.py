"""The profiler's additional_config section stays out of vLLM's compile-cache key (the
`compile-hash` touch): turning the profiler on, or changing its report path or cache
directory, reuses what a stock start compiled; every other caller of VllmConfig.compute_hash
(vLLM's startup-plan fingerprint, whose KV figure the profiler does change) still sees it."""

from __future__ import annotations

from conftest import run_python

CODE = r'''
import json
from vllm.config import VllmConfig
from vllm.compilation.caching import aot_compile_hash_factors
from worstcase_profiler.adapter.patches import apply_all

apply_all()
section = {"worstcase_profiler": {"profiler": "worstcase", "json_path": "/tmp/a.json"}}
other = {"worstcase_profiler": {"profiler": "worstcase", "json_path": "/tmp/b.json"}}
stock, wc, wc2 = VllmConfig(), VllmConfig(additional_config=section), \
    VllmConfig(additional_config=other)
own = VllmConfig(additional_config={"gdn_prefill_backend": "triton"})
own_wc = VllmConfig(additional_config={"gdn_prefill_backend": "triton", **section})
before = wc.additional_config
aot_compile_hash_factors(wc)
out = {
    "compile_same": aot_compile_hash_factors(stock) == aot_compile_hash_factors(wc)
                    == aot_compile_hash_factors(wc2),
    "compile_keeps_other_keys": aot_compile_hash_factors(own) == aot_compile_hash_factors(own_wc)
                                != aot_compile_hash_factors(stock),
    "elsewhere_differs": len({stock.compute_hash(), wc.compute_hash(), wc2.compute_hash()}) == 3,
    "untouched": wc.additional_config is before and before == section,
}
print("RESULT " + json.dumps(out))
'''


def test_the_compile_cache_key_leaves_the_profilers_section_out():
    out = run_python(CODE, timeout=300).result()
    assert out == {"compile_same": True, "compile_keeps_other_keys": True,
                   "elsewhere_differs": True, "untouched": True}, out
