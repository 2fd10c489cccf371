"""Issue 37 point 2: `vllm serve M --profiler worstcase` with the setting max_model_len: auto
picks the longest safe max_model_len, logs why, and starts with it (engine core in its own
process, as an operator runs it).

The bundled tiny model at --max-model-len 4096 (the upper bound), --max-num-batched-tokens 256,
--max-num-seqs 4 (test_fit_engine.py's short sweep), the KV cache pinned at 8 MiB (8,192 tokens
of 1 KiB: the answer does not follow the host's free memory) and fit_min_concurrency 3: one
request at 4,096 fits (two do), three need a shorter length. The length the engine serves is
read back from vLLM itself (/v1/models, its KV-cache and concurrency log lines, its refusal of a
longer prompt), and held against vLLM's own pool: three requests fit at it, one block more would
not."""

from __future__ import annotations

import json
import re
import subprocess
import urllib.error
import urllib.request

import pytest

from conftest import BIN, TINY, engine_env, free_port, stop_server, wait_healthy

pytestmark = pytest.mark.engine

MODEL = str(TINY)
N = 3
EXPLICIT_KV = 8 << 20
SETTINGS = {"worstcase_profiler": {"max_model_len": "auto", "fit_min_concurrency": N}}


def _post(port: int, prompt: list[int], max_tokens: int):
    body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens,
                       "return_token_ids": True}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    try:
        return 200, json.loads(urllib.request.urlopen(req, timeout=120).read())
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("auto_len")
    port = free_port()
    env = engine_env()
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING")  # the engine core in its own process
    log_path = tmp / "serve.log"
    state = {"tmp": tmp}
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [str(BIN / "vllm"), "serve", MODEL, "--load-format", "dummy",
             "--skip-tokenizer-init", "--enforce-eager", "--max-model-len", "4096",
             "--max-num-batched-tokens", "256", "--max-num-seqs", "4",
             "--kv-cache-memory-bytes", str(EXPLICIT_KV), "--gpu-memory-utilization", "0.25",
             "--host", "127.0.0.1", "--port", str(port), "--profiler", "worstcase",
             "--profiler-report", str(tmp / "report.json"),
             "--additional-config", json.dumps(SETTINGS)],
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp)
        try:
            healthy = wait_healthy(proc, port)
            assert healthy and proc.poll() is None, log_path.read_text()[-4000:]
            models = json.loads(urllib.request.urlopen(
                f"http://127.0.0.1:{port}/v1/models", timeout=10).read())
            state["served_len"] = models["data"][0]["max_model_len"]
            state["short"] = _post(port, [1, 2, 3, 4], 4)
            state["too_long"] = _post(port, [7] * (state["served_len"] + 1), 1)
            state["report"] = json.loads((tmp / "report.json").read_text())
        finally:
            stop_server(proc)
    state["log"] = log_path.read_text()
    return state


def _number(pattern: str, text: str) -> str:
    m = re.search(pattern, text)
    assert m, pattern
    return m.group(1).replace(",", "")


def test_the_engine_serves_the_length_the_fit_chose(served):
    fit = served["report"]["fit"]
    chosen = fit["applied_max_model_len"]
    assert chosen is not None and chosen < 4096, fit["applied_why"]
    assert served["served_len"] == chosen  # what the frontend serves (/v1/models)
    # vLLM's own concurrency line is for the chosen length, and holds N of them
    conc = re.search(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x",
                     served["log"])
    assert conc and int(conc.group(1).replace(",", "")) == chosen
    assert float(conc.group(2)) >= N
    code, _ = served["short"]
    assert code == 200
    code, body = served["too_long"]  # one token over the chosen length: vLLM refuses it
    assert code == 400 and str(chosen) in body, body[:500]


def test_the_length_is_the_longest_that_holds_n_requests_one_block_more_does_not(served):
    rep, log = served["report"], served["log"]
    chosen, block = rep["fit"]["applied_max_model_len"], rep["config"]["block_size"]
    # the pool vLLM allocated (the KV audit reads its tensors), and vLLM's own figure for it
    tokens = rep["kv_audit"]["allocated_bytes"] // rep["admission"]["bytes_per_token"]
    assert rep["kv_audit"]["allocated_bytes"] == EXPLICIT_KV
    assert abs(int(_number(r"KV cache size: ([\d,]+) tokens", log)) - tokens) <= 1
    usable = tokens - block  # vLLM's block pool holds one block back (its null block)
    assert chosen % block == 0
    assert N * chosen <= usable < N * (chosen + block), (chosen, usable)
    # the start's admission is at that length, and fits
    adm = rep["admission"]
    assert adm["fits"] and adm["one_request_bytes"] == chosen * adm["bytes_per_token"]
    print(f"max_model_len auto: {chosen} (swept 4096); vLLM pool {tokens} tokens; "
          f"{conc_line(log)}")


def conc_line(log: str) -> str:
    m = re.search(r"Maximum concurrency for [^\n]*", log)
    return m.group(0) if m else ""


def test_the_log_says_why(served):
    log, rep = served["log"], served["report"]
    chosen = rep["fit"]["applied_max_model_len"]
    line = next(l for l in log.splitlines() if "[wcprof] max_model_len auto: " in l
                and "(of 4,096)" in l)
    assert f"{chosen:,} (of 4,096), the longest" in line
    assert f"max_num_seqs 4, {N} request(s) at full length" in line
    assert f"holds {N} request(s)" in line
    assert f"at {chosen + rep['config']['block_size']:,} it would hold {N - 1}" in line
    assert line.split("[wcprof] ", 1)[1] == rep["fit"]["applied_why"]
    # the engine core applied it, and told the workers
    assert f"the engine starts with max_model_len {chosen} (configured 4096" in log


def test_no_length_that_fits_refuses_the_start_naming_the_least_that_would(tmp_path):
    """768 KiB: six blocks of 128 tokens; three requests at the shortest length weighed (the
    256-token chunk, two blocks each) and the null block need seven."""
    small = 6 * 128 << 10
    env = engine_env()
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING")
    p = subprocess.run(
        [str(BIN / "vllm"), "serve", MODEL, "--load-format", "dummy", "--skip-tokenizer-init",
         "--enforce-eager", "--max-model-len", "4096", "--max-num-batched-tokens", "256",
         "--max-num-seqs", "4", "--kv-cache-memory-bytes", str(small),
         "--gpu-memory-utilization", "0.25", "--host", "127.0.0.1", "--port", str(free_port()),
         "--profiler", "worstcase", "--profiler-report", str(tmp_path / "report.json"),
         "--additional-config", json.dumps(SETTINGS)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    text = p.stdout + p.stderr
    assert p.returncode != 0, text[-3000:]
    assert "max_model_len auto: no max_model_len from 256 to 4,096 fits" in text, text[-3000:]
    assert f"--kv-cache-memory-bytes {7 * 128 << 10} or more" in text, text[-3000:]
    fit = json.loads((tmp_path / "report.json").read_text())["fit"]
    assert fit["applied_max_model_len"] is None and "no max_model_len" in fit["applied_why"]
