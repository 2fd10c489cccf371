"""Issue: the worst-case profiler end to end inside a real (CPU) vLLM engine."""

from __future__ import annotations

import json

import pytest

from conftest import TINY, engine_env, run_python, run_wcprof, within_prediction

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def validated(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wcprof")
    return run_wcprof(["--validate"], tmp)


def test_report_has_the_documented_keys(validated):
    assert validated.rc == 0, validated.text[-3000:]
    r = validated.report
    assert r["schema_version"] and r["vllm_version"].startswith("0.32")
    assert r["device"]["kind"] == "cpu"
    assert {"max_model_len", "max_num_batched_tokens", "max_num_seqs"} <= set(r["config"])
    assert "peak_activation_bytes" in r["stock"]
    wc = r["worstcase"]
    for key in ("peak_activation_bytes", "workspace_bytes", "worst_shape", "rows_covered",
                "shapes_executed"):
        assert key in wc
    assert {"rows", "context_len", "num_reqs"} <= set(wc["worst_shape"])
    for key in ("budget_bytes", "kv_cache_bytes", "recommended_kv_cache_memory_bytes",
                "kv_tokens_stock", "kv_tokens_worstcase"):
        assert key in r["admission"]
    assert {"measured_peak_bytes", "predicted_peak_bytes"} <= set(r["validation"])


def test_every_rows_value_is_covered(validated):
    r = validated.report
    mnbt = r["config"]["max_num_batched_tokens"]
    assert r["worstcase"]["rows_covered"] == {"min": 1, "max": mnbt}
    cov = r["worstcase"]["coverage"]
    covered = set()
    for seg in cov["segments"]:
        covered.update(range(seg["lo"], seg["hi"] + 1))
    assert covered == set(range(1, mnbt + 1))
    executed = set(cov["executed_rows"])
    # every chord segment's ends were executed: the bound rests on measurements
    for seg in cov["segments"]:
        assert seg["lo"] in executed and seg["hi"] in executed


def test_worst_case_is_at_least_stock_and_ran_at_long_context(validated):
    r = validated.report
    assert r["worstcase"]["peak_activation_bytes"] >= r["stock"]["peak_activation_bytes"]
    mml = r["config"]["max_model_len"]
    kinds = {s["shape"]["kind"] for s in r["worstcase"]["steps"]}
    assert {"prefill", "decode", "mixed"} <= kinds
    prefill = [s["shape"] for s in r["worstcase"]["steps"] if s["shape"]["kind"] == "prefill"]
    assert any(p["context_len"] + p["rows"] == mml for p in prefill)


def test_validation_measured_within_prediction(validated):
    v = validated.report["validation"]
    assert v["measured_peak_bytes"] > 0 and within_prediction(v), v


def test_admission_arithmetic_adds_up(validated):
    a = validated.report["admission"]
    assert a["budget_bytes"] == (a["requested_bytes"] - a["consumed_bytes"]
                                 - validated.report["worstcase"]["peak_activation_bytes"]
                                 - a["cudagraph_bytes"] - a["margin_bytes"])
    assert a["recommended_kv_cache_memory_bytes"] <= a["budget_bytes"]
    assert a["kv_tokens_worstcase"] <= a["kv_tokens_stock"] or a["stock_kv_cache_bytes"] < a["budget_bytes"]


def test_terminal_verdict(validated):
    out = validated.out
    assert "SAFE" in out or "STOCK UNSAFE" in out
    assert "--kv-cache-memory-bytes" in out
    assert "GiB" in out or "MiB" in out


def test_vllm_serve_with_profiler_flag_answers(tmp_path):
    """`vllm serve --profiler worstcase` (an exact flag) starts, logs the report, answers."""
    import socket
    import subprocess
    import time
    import urllib.request

    from conftest import BIN

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    report = tmp_path / "serve.json"
    env = engine_env()
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING")
    proc = subprocess.Popen(
        [str(BIN / "vllm"), "serve", str(TINY), "--load-format", "dummy", "--skip-tokenizer-init",
         "--enforce-eager", "--max-model-len", "2048", "--max-num-batched-tokens", "256",
         "--max-num-seqs", "4", "--gpu-memory-utilization", "0.2", "--host", "127.0.0.1",
         "--port", str(port), "--profiler", "worstcase", "--profiler-report", str(report)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        deadline = time.time() + 240
        while time.time() < deadline:
            if proc.poll() is not None:
                break
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                time.sleep(1)
        assert proc.poll() is None, proc.stdout.read()[-4000:]
        body = json.dumps({"model": str(TINY), "prompt": list(range(1, 600)), "max_tokens": 4}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                     headers={"content-type": "application/json"})
        answer = json.loads(urllib.request.urlopen(req, timeout=60).read())
        assert answer["usage"]["completion_tokens"] == 4
        rep = json.loads(report.read_text())
        assert rep["worstcase"]["rows_covered"] == {"min": 1, "max": 256}
    finally:
        proc.terminate()
        try:
            out = proc.communicate(timeout=30)[0]
        except subprocess.TimeoutExpired:
            proc.kill()
            out = proc.communicate()[0]
    assert "[wcprof] stock KV" in out and "recommended --kv-cache-memory-bytes" in out


ENGINE_SNIPPET = """
import json, os
from vllm import LLM
llm = LLM(model={model!r}, load_format="dummy", skip_tokenizer_init=True, enforce_eager=True,
          max_model_len=1024, max_num_batched_tokens=128, max_num_seqs=2,
          gpu_memory_utilization=0.2, {extra})
w = llm.llm_engine.model_executor.driver_worker.worker
session = getattr(w, "_wcprof_session", None)
print("RESULT", json.dumps({{"report": session is not None and session.profile is not None,
      "patched": hasattr(type(w).determine_available_memory, "_wcprof_original")}}))
"""


def test_disabled_changes_nothing():
    run = run_python(ENGINE_SNIPPET.format(model=str(TINY), extra=""))
    res = run.result()
    assert res == {"report": False, "patched": True}
    assert "[wcprof]" not in run.text


def test_enabled_by_environment_variable():
    run = run_python(ENGINE_SNIPPET.format(model=str(TINY), extra=""),
                     env=engine_env(WCPROF_PROFILER="worstcase"))
    assert run.result()["report"] is True
    assert "[wcprof] worst-case sweep" in run.text


def test_enabled_by_additional_config():
    extra = 'additional_config={"worstcase_profiler": {"profiler": "worstcase", "context_ladder": False}}'
    run = run_python(ENGINE_SNIPPET.format(model=str(TINY), extra=extra))
    assert run.result()["report"] is True


def test_correct_model_audits_within_budget(validated):
    audit = validated.report["kv_audit"]
    assert audit["verdict"] == "ok" and audit["ratio"] <= 1.01, audit


def test_sweep_depth_prove_admits_the_full_sweep_and_reports_the_cut_down_beside_it(tmp_path):
    """--sweep-depth prove on a real engine: the decoder (2 layers) is cut to 1 for the cut-down
    pass, stock step included; the full sweep is the one admitted; the report carries both."""
    run = run_wcprof(["--sweep-depth", "prove"], tmp_path)
    assert run.rc == 0, run.text[-3000:]
    wc = run.report["worstcase"]
    proof = wc["cut_down_proof"]
    assert proof["depth"] == "1 of 2 layers"
    assert wc["sweep_mode"].startswith("full; cut-down ")
    assert wc["peak_activation_bytes"] == proof["full_admitted_bytes"]
    assert proof["full_peak_bytes"] > 0 and proof["confirmed_peak_bytes"] > 0
    assert proof["verdict"] == "proven" or "B" in proof["verdict"], proof
    assert set(proof["deltas"]) <= {"prefill", "decode", "mixed", "stock"}
    assert "stock" in proof["deltas"] and "prefill" in proof["deltas"]  # both ran both ways
    # two single readings of the full stock step (the cut-down sweep's and the full sweep's):
    # RSS noise, which a busy host can push past one resolution; the proof then says so
    res, stock = proof["resolution_bytes"], proof["deltas"]["stock"]
    assert stock <= proof["depth_delta"] + res or "from depth" in proof["verdict"], proof
    assert stock <= proof["depth_delta"] + 4 * res, proof
    assert wc["sweep_mode"].startswith("full; cut-down beside it (1 of 2 layers): ")
    assert "cut-down proof (1 of 2 layers)" in run.out


def test_a_compiled_decoder_runs_its_cut_steps_eagerly(tmp_path):
    """torch.compile on (no --enforce-eager): vLLM's compiled graph has the layer loop baked in,
    so the cut-down steps bypass it (support_torch_compile's do_not_compile) and the full sweep
    and the confirmations run compiled."""
    run = run_wcprof(["--model", str(TINY), "--load-format", "dummy", "--skip-tokenizer-init",
                      "--max-model-len", "4096", "--max-num-batched-tokens", "512",
                      "--max-num-seqs", "8", "--gpu-memory-utilization", "0.25",
                      "--sweep-depth", "prove"], tmp_path)
    assert run.rc == 0, run.text[-3000:]
    assert run.report["config"]["enforce_eager"] is False
    proof = run.report["worstcase"]["cut_down_proof"]
    assert proof["depth"] == "1 of 2 layers, run eagerly"
    assert proof["full_peak_bytes"] > 0 and proof["confirmed_peak_bytes"] > 0
