"""Issue 18: the production guard on a served engine. `vllm serve --profiler worstcase` (engine core
and worker in processes of their own), a few completions over 127.0.0.1, then the guard's series
on the API server's /metrics and `wcprof guard URL` reading them back."""

from __future__ import annotations

import json
import subprocess
import urllib.request

import pytest

from conftest import (BIN, CPU_RESOLUTION, TINY, check_step_held, engine_env, free_port,
                      stop_server, wait_healthy, within_prediction)

pytestmark = pytest.mark.engine

MODEL = str(TINY)


def _post(port: int, prompt: list[int], max_tokens: int) -> dict:
    body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens,
                       "return_token_ids": True}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=120).read())


def _get(url: str) -> str:
    return urllib.request.urlopen(url, timeout=10).read().decode()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("guard")
    port = free_port()
    env = engine_env(WCPROF_CACHE_DIR=str(tmp / "cache"), WCPROF_GUARD_DIR=str(tmp / "guard"))
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING")  # the real thing: engine core in its own process
    log_path = tmp / "serve.log"
    log = open(log_path, "w")
    proc = subprocess.Popen(
        [str(BIN / "vllm"), "serve", MODEL, "--load-format", "dummy", "--skip-tokenizer-init",
         "--enforce-eager", "--max-model-len", "4096", "--max-num-batched-tokens", "512",
         "--max-num-seqs", "8", "--gpu-memory-utilization", "0.25", "--host", "127.0.0.1",
         "--port", str(port), "--profiler", "worstcase", "--profiler-report",
         str(tmp / "report.json"),
         # issue 14: the opt-in check before the server accepts traffic rides on this server,
         # with a step named in check_steps (a chunk on about half the context, off the
         # 16-token blocks a prefix-cache hit reaches: built on the block below)
         "--additional-config", '{"worstcase_profiler": {"validate_on_start": "all", '
                                '"check_steps": ["512@2050"]}}'],
        stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp)
    state = {"port": port, "tmp": tmp, "proc": proc, "log": log_path, "env": env}
    try:
        wait_healthy(proc, port)
        assert proc.poll() is None, log_path.read_text()[-4000:]
        for i in range(3):
            out = _post(port, [1, 2, 3, 4 + i], 4)
            assert out["usage"]["completion_tokens"] == 4
        _post(port, list(range(1, 900)), 3)  # a chunked prefill: 512 + 387 rows
        state["metrics"] = _get(f"http://127.0.0.1:{port}/metrics")
        state["report"] = json.loads((tmp / "report.json").read_text())
        guard = subprocess.run([str(BIN / "wcprof"), "guard", f"http://127.0.0.1:{port}"],
                               capture_output=True, text=True, env=env, timeout=60)
        state["guard"] = guard
        yield state
    finally:
        stop_server(proc)
        log.close()
        state["log_text"] = log_path.read_text()


def _series(text: str, name: str) -> float:
    lines = [l for l in text.splitlines() if l.startswith(name + "{")]
    assert lines, f"{name} missing from /metrics"
    return float(lines[0].rsplit(" ", 1)[1])


def test_metrics_carry_the_guards_series(served):
    m = served["metrics"]
    assert "vllm:" in m  # vLLM's own metrics are still there
    predicted = _series(m, "wcprof_guard_predicted_need_bytes")
    assert predicted == served["report"]["worstcase"]["peak_activation_bytes"]
    steps = _series(m, "wcprof_guard_steps_total")
    assert steps >= 3 * 4 + 2  # 3 short requests (1 prefill + 3 decodes each), 2 prefill chunks
    assert _series(m, "wcprof_guard_steps_above_prediction_total") == 0
    observed = _series(m, "wcprof_guard_observed_need_bytes_max")
    assert 0 < observed <= predicted + CPU_RESOLUTION  # the guard's own rule (core/guard)
    assert _series(m, "wcprof_guard_largest_step_rows") > 0
    headroom = _series(m, "wcprof_guard_kv_headroom_bytes")
    margin = served["report"]["admission"]["margin_bytes"]
    assert headroom >= margin * 0.9  # the margin at least (what the prediction spares on top)


def test_wcprof_guard_says_the_profile_held(served):
    g = served["guard"]
    assert g.returncode == 0, g.stdout + g.stderr
    assert g.stdout.startswith("the profile held over "), g.stdout
    assert "largest step" in g.stdout and "of predicted" in g.stdout


def test_the_worker_logged_the_guard_and_no_step_above(served):
    text = served["log"].read_text()
    assert "[wcprof] guard on:" in text and "/metrics exports wcprof_guard_*" in text
    assert "[wcprof] guard: a served step needed" not in text
    # issue 39: the server's log says where --profiler-report's file went, once
    assert text.count("[wcprof] report written to ") == 1, text[-3000:]


def test_stopping_the_server_removes_the_guards_files(served):
    proc = served["proc"]
    proc.terminate()
    proc.wait(timeout=60)
    assert not list((served["tmp"] / "guard").glob("wcprof-guard-*/*.bin"))


def test_serving_validation_built_the_worst_step_before_traffic(served):
    """validate_on_start=all: the report's own worst step, built from real requests after the
    engine is up and before the HTTP server accepts traffic, within the prediction, recorded in
    the report and logged once per rank; then generic traffic, the same way."""
    text = served["log"].read_text()
    line = next(l for l in text.splitlines() if "[wcprof] serving validation, rank 0" in l)
    started = next(i for i, l in enumerate(text.splitlines()) if "Starting vLLM server" in l
                   or "Uvicorn running" in l or "Application startup complete" in l)
    assert text.splitlines().index(line) < started, "validated after the server started"
    worst = [v for v in served["report"]["validations"] if v["target"] == "worst-step"]
    assert worst and within_prediction(worst[0]), worst
    assert worst[0]["shape"]["rows"] == served["report"]["worstcase"]["worst_shape"]["rows"]
    formed = worst[0]["formed"]  # recorded in the worker while the served requests ran
    assert formed and formed["rows"] >= worst[0]["shape"]["rows"], worst
    traffic = [v for v in served["report"]["validations"] if v["target"] == "traffic"]
    assert traffic and within_prediction(traffic[0]) and traffic[0]["shape"] is None, traffic
    assert "serving validation, rank 0: generic traffic needed" in text


def test_serving_validation_built_the_named_step_against_its_own_reading(served):
    """check_steps under `vllm serve`: the worker measured the step beside the sweep and sent its
    reading over vLLM's RPC; the API server built it from requests before serving."""
    (check,) = served["report"]["worstcase"]["check_steps"]
    assert check["shape"] == {"kind": "prefill", "rows": 512, "context_len": 2050, "num_reqs": 1}
    (v,) = [v for v in served["report"]["validations"] if v["target"] == "check-step"]
    assert v["shape"] == {**check["shape"], "context_len": 2048}, v
    assert check_step_held(v), v
    if not within_prediction(v):  # over its one reading by RSS noise: the server warned
        assert "more than its own reading" in served["log"].read_text()
    assert "context 2048" in v["note"], v  # said, not silently another step
    workspace = served["report"]["worstcase"]["workspace_bytes"]
    assert v["predicted_peak_bytes"] == check["predicted_bytes"] + workspace, v
    assert v["admitted_peak_bytes"] == \
        served["report"]["admission"]["transient_bytes"] + workspace, v
    assert v["formed"]["rows"] >= 512, v
    text = served["log"].read_text()
    assert "serving validation, rank 0: the check step (prefill rows=512 ctx=2048 reqs=1)" in text
    assert "[wcprof] check step 512@2050 (512 new tokens on 2,050 cached)" in text
