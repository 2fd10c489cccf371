"""bench/context_end_repro.py (issue 32, point 4) on the CPU engine: requests built to end
exactly at max_model_len reach it, stock and with the profiler, and the runner's JSONs say so.
One engine per mode (the runner, --in-process), one that fails to start, a runner that times
out before vLLM is imported, and bad arguments (no engine)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import ROOT, TINY, engine_env

SCRIPT = ROOT / "bench" / "context_end_repro.py"
MAX_MODEL_LEN = 512
REQUESTS, SPREAD, SHARED, MIX = 6, 5, 100, 2  # 8 submitted, prompts of 443..448 tokens
ENGINE = ["--model", str(TINY), "--max-model-len", str(MAX_MODEL_LEN),
          "--max-num-batched-tokens", "256", "--max-num-seqs", str(REQUESTS), "--enforce-eager",
          "--kv-cache-memory-bytes", str(64 << 20), "--in-process"]
FIELDS = {"kind", "mode", "command", "vllm_version", "torch_version", "device",
          "cuda_launch_blocking", "flags", "requests", "submitted", "finished", "finish_reasons",
          "final_contexts", "reached_end", "wall_s", "error", "traceback", "phase"}


def _run(args: list[str], timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=engine_env(CUDA_LAUNCH_BLOCKING="1"))


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    out = tmp_path_factory.mktemp("ctxend")
    p = _run([*ENGINE, "--requests", str(REQUESTS), "--spread", str(SPREAD), "--shared-prefix",
              str(SHARED), "--mix-prefill", str(MIX), "--modes", "stock,worstcase",
              "--timeout-s", "240", "--out", str(out)])
    return p, out


@pytest.mark.engine
def test_both_modes_complete(both):
    p, out = both
    assert p.returncode == 0, (p.stderr[-3000:], (out / "stock.log").read_text()[-3000:])
    summary = json.loads((out / "summary.json").read_text())
    assert {m: v["verdict"] for m, v in summary["modes"].items()} == {
        "stock": "completed", "worstcase": "completed"}
    assert "mode stock: completed" in p.stderr and "mode worstcase: completed" in p.stderr


@pytest.mark.engine
@pytest.mark.parametrize("mode", ["stock", "worstcase"])
def test_every_request_ends_at_max_model_len(both, mode):
    _, out = both
    r = json.loads((out / f"{mode}.json").read_text())
    assert FIELDS <= set(r), FIELDS - set(r)
    n = REQUESTS + MIX
    assert r["mode"] == mode and r["phase"] == "done" and r["error"] is None, r["error"]
    assert (r["requests"], r["submitted"], r["finished"]) == (REQUESTS, n, n)
    assert r["finish_reasons"] == {"length": n}
    assert r["final_contexts"] == {str(MAX_MODEL_LEN): n}
    assert r["reached_end"] == r["reached_end_context"] == n
    assert r["cuda_launch_blocking"] == "1"
    assert r["vllm_version"].startswith("0.") and r["device"] == "cpu"
    assert r["flags"]["max_model_len"] == MAX_MODEL_LEN and r["flags"]["in_process"] is True
    # stock: the profiler's entry point left out (its patches never installed); worstcase: on
    assert r["profiler_imported"] is (mode == "worstcase")
    assert (r["report"] is not None) is (mode == "worstcase")
    if mode == "stock":
        assert "worstcase_profiler" not in r["vllm_plugins"].split(",")
        assert "wcp_fixtures" in r["vllm_plugins"].split(",")
    else:
        assert json.loads((out / "worstcase.report.json").read_text())["worstcase"]


@pytest.mark.engine
def test_an_engine_that_fails_exits_1_with_its_json(tmp_path):
    """A KV pool too small for one request: the engine fails to start; the JSON says where."""
    args = [a if a != str(64 << 20) else str(128 << 10) for a in ENGINE]
    out = tmp_path / "fail.json"
    p = _run([*args, "--requests", "2", "--mode", "stock", "--out", str(out)])
    assert p.returncode == 1, p.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["phase"] == "failed in engine" and r["finished"] == 0 and r["reached_end"] == 0
    assert r["error"].startswith("ValueError: ") and "cache blocks" in r["error"]
    assert 1 < len(r["traceback"]) <= 60 and r["traceback"][-1].startswith("ValueError")
    assert not (tmp_path / "fail.json.tmp").exists()


def test_the_runner_says_timed_out(tmp_path):
    """A mode past --timeout-s is killed (before vLLM is even imported here) and named so."""
    p = _run([*ENGINE, "--requests", "1", "--modes", "stock", "--timeout-s", "0.5",
              "--out", str(tmp_path)], timeout=60)
    assert p.returncode == 1, p.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["modes"]["stock"]["verdict"] == "timed out"
    assert summary["modes"]["stock"]["rc"] is None


@pytest.mark.parametrize("bad,words", [
    (["--prompt-len", str(MAX_MODEL_LEN)], "below the end context"),
    (["--spread", "10", "--shared-prefix", "500"], "longer than the shortest prompt"),
    (["--speculative-config", "{mtp"], "not JSON"),
    (["--modes", "stock,other"], "--modes takes"),
    (["--requests", "0"], "must be positive"),
    (["--modes", "stock,stock"], "each once"),
    (["--modes", "stock", "--timeout-s", "0"], "--timeout-s must be positive"),
])
def test_a_bad_argument_exits_2(tmp_path, bad, words):
    """Refused before anything starts: exit 2, argparse's message, no file written."""
    tail = ["--out", str(tmp_path)] if "--modes" in bad else [
        "--mode", "stock", "--out", str(tmp_path / "r.json")]
    p = _run([*ENGINE, "--requests", "2", *bad, *tail], timeout=60)  # a later flag's value wins
    assert p.returncode == 2 and words in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and not list(tmp_path.iterdir())


def test_a_mode_is_named_by_what_it_wrote_and_how_it_ended():
    """The runner's verdict: a run whose result was written whole completed, even where its
    engine's teardown then outlived the timeout; a run killed before that timed out."""
    sys.path.insert(0, str(SCRIPT.parent))
    import context_end_repro as repro

    done = {"phase": "done", "error": None}
    assert repro.verdict(0, done) == "completed"
    assert repro.verdict(None, done).startswith("completed (")
    assert repro.verdict(None, {"phase": "generate", "error": None}) == "timed out"
    assert repro.verdict(None, None) == "timed out"
    assert repro.verdict(1, {"phase": "failed in engine", "error": "RuntimeError: x"}) == \
        "failed: RuntimeError: x"
    assert repro.verdict(1, None) == "failed: exit code 1, no error recorded"


def test_a_runner_out_that_is_a_file_exits_2(tmp_path):
    f = tmp_path / "taken"
    f.write_text("")
    p = _run([*ENGINE, "--requests", "2", "--modes", "stock", "--out", str(f)], timeout=60)
    assert p.returncode == 2 and "names a directory" in p.stderr, p.stderr
