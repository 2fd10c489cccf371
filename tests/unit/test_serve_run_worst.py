"""bench/serve_run.py's worst-step traffic (--worst N): the blocker, a fresh prompt as long as
the prefix, goes first, and N requests of the cached prefix plus max_num_batched_tokens // N new
tokens each follow it together, so that a server's scheduler takes them in one step once the
blocker's chunks are done; the result says how many were served and whether the server lived."""

from __future__ import annotations

import random
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import serve_run  # noqa: E402


class FakeServer:
    def __init__(self, dies: bool = False):
        self.calls: list[tuple[float, int, int]] = []
        self.lock = threading.Lock()
        self.dies = dies

    def post(self, model, prompt, max_tokens):
        with self.lock:
            self.calls.append((time.perf_counter(), len(prompt), max_tokens))
            prompts = [c for c in self.calls if c[1] != 64]
        if self.dies and len(prompts) > 2:
            return {"ok": False, "error": "connection reset"}
        return {"ok": True, "completion_tokens": max_tokens, "prompt_tokens": len(prompt)}

    def alive(self):
        return not self.dies


def test_the_blocker_goes_first_then_n_requests_on_the_prefix_together():
    a = SimpleNamespace(worst=8, max_num_batched_tokens=64, model="m", prefix=64)
    srv = FakeServer()
    prefix = list(range(64))
    out = serve_run.worst_traffic(srv, a, prefix, list(range(100, 164)), random.Random(0), 1000,
                                  lead_s=0.05)
    first, *rest = srv.calls
    assert first[1] == 64 and first[2] == 1  # the blocker: as long as the prefix, one token out
    assert len(rest) == 8 and all(c[0] >= first[0] + 0.04 for c in rest)
    assert all((c[1], c[2]) == (64 + 8, 1) for c in rest)  # the prefix plus 64 // 8 new tokens
    assert out["ok"] == 8 and out["rows_each"] == 8 and out["context"] == 64
    assert out["alive_after"] is True and out["blocker"]["ok"] is True


def test_a_server_that_dies_in_that_step_is_reported_so():
    a = SimpleNamespace(worst=4, max_num_batched_tokens=64, model="m", prefix=64)
    out = serve_run.worst_traffic(FakeServer(dies=True), a, list(range(64)),
                                  list(range(100, 164)), random.Random(0), 1000, lead_s=0.01)
    assert out["ok"] < 4 and out["errors"] and out["alive_after"] is False
