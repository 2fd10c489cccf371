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


class FakeChatServer:
    """/tokenize counts 3 template tokens, 2 a WORDS unit and 258 an image; /metrics adds the
    cached text's whole 16-token blocks as hits once the text was sent."""

    def __init__(self):
        self.sent, self.hits = [], 0

    @staticmethod
    def _count(content):
        text = next(p["text"] for p in content if p["type"] == "text")
        images = sum(p["type"] == "image_url" for p in content)
        return 3 + 2 * text.count(serve_run.WORDS) + 258 * images

    def tokens(self, model, content):
        return self._count(content)

    def chat(self, model, content, max_tokens):
        self.sent.append((self._count(content), max_tokens,
                          [p["image_url"]["url"] for p in content if p["type"] == "image_url"]))
        if len(self.sent) == 2:
            self.hits += self.sent[0][0] // 16 * 16
        return {"ok": True, "completion_tokens": max_tokens}

    def get(self, path):
        return f'vllm:prefix_cache_hits_total{{engine="0"}} {float(self.hits)}\n'

    def alive(self):
        return True


def test_image_traffic_caches_the_text_then_sends_it_with_distinct_images_after_it():
    a = SimpleNamespace(model="m", prefix=1000, images=2, image_px=32)
    srv = FakeChatServer()
    out = serve_run.image_traffic(srv, a)
    (text, t1, none), (full, t2, urls) = srv.sent
    assert (t1, t2, none) == (1, 2, []) and len(urls) == 2 and urls[0] != urls[1]
    assert abs(text - 1000) <= 2 and full == text + 2 * 258  # about --prefix text tokens
    assert out["text_tokens"] == text and out["image_tokens"] == 2 * 258
    assert out["prefix_cache_hit_tokens"] == text // 16 * 16 and out["alive_after"] is True
    assert serve_run.prefix_cache_hits(None) is None
    assert serve_run.prefix_cache_hits("other 1\n") is None


def test_image_traffic_gives_the_servers_a_tokenizer_and_the_pass_through_template():
    a = SimpleNamespace(extra="", model="m", max_model_len=4096, max_num_batched_tokens=512,
                        util=0.5, eager=True, validate="worst", images=2)
    argv = serve_run.server_argv(a, "stock", 1, Path("r.json"))
    assert "--skip-tokenizer-init" not in argv and "--interleave-mm-strings" in argv
    assert argv[argv.index("--chat-template") + 1] == str(serve_run.CHAT_TEMPLATE)
    assert serve_run.CHAT_TEMPLATE.is_file()
    a.images = 0
    assert "--skip-tokenizer-init" in serve_run.server_argv(a, "stock", 1, Path("r.json"))


def test_image_traffic_that_the_server_cannot_render_is_a_result_not_a_crash():
    """A server whose tokenizer or template cannot render the prompt answers /tokenize with an
    error: the image traffic says so, and the run goes on to its other traffic and modes."""
    class Refuses(FakeChatServer):
        def tokens(self, model, content):
            raise ValueError("no placeholder")

    out = serve_run.image_traffic(Refuses(), SimpleNamespace(model="m", prefix=100, images=2,
                                                             image_px=8))
    assert out["request"]["ok"] is False and "no placeholder" in out["request"]["error"]
    assert out["alive_after"] is True and out["text_tokens"] is None
