#!/usr/bin/env python3
"""`vllm serve` as an operator runs it (the engine core in its own process: vLLM's default
multiprocessing), with real HTTP traffic over 127.0.0.1, stock or `--profiler worstcase`.

One server per --mode, one after another in this process's children:

  worstcase   `--profiler worstcase --profiler-report R`, validate_on_start=worst (the report's
              own worst step built from real requests before the server takes traffic), guard on
  guard-off   the same with the guard off, on the sweep cache the first left: a cached restart,
              and the decode traffic alone, to time the guard against `worstcase`
  stock       no plugin flag (the plugin is installed but the profiler stays vLLM's)

Traffic per server (token-id prompts, random ids from a fixed seed, so every mode sends the same):
  long      one prompt of --prefix tokens (max_tokens 1): chunked prefill up to the prefix
  cached    the prefix plus --chunk new tokens (max_tokens 4): one --chunk-row step on the
            cached prefix, near max_model_len (the step vLLM's empty-KV profile never ran)
  decodes   --decodes concurrent requests of --decode-prompt tokens, --decode-tokens each
  mixed     the prefix plus other new tokens, sent while --decodes more decode
  images    (--images N) a chat prompt of about --prefix text tokens, cached first without
            its images, then with N distinct images after the text: one step computes the
            images' tokens (their encoder forward included) on the cached text (seed 002's
            request carried images deep in a 156k context). The servers then get the model's
            tokenizer and bench/serve_chat_template.jinja (no --skip-tokenizer-init)
  worst     (--worst N) N prompts of the prefix plus max_num_batched_tokens // N new tokens
            each, sent while a fresh --prefix-token prompt (the blocker) fills the steps with its
            chunks: the scheduler then takes them together, one step of N requests on the
            cached prefix (the step vLLM's empty-KV profile never ran; the stock OOM on a held
            card where one exists). Last, so the other traffic is measured either way
After the traffic: /metrics, `wcprof guard URL` (plugin modes), then SIGINT and the exit.

With --hold-slack-mib N a ballast process holds the card first so that free memory is exactly
what --util requests plus N MiB once the server's CUDA context exists (how production holds a
card: whatever a step needs beyond the admission must fit in the slack). Writes
OUT/serve-<mode>.log and, for the plugin modes, OUT/report-<mode>.json; OUT/serve.json holds
every mode's figures, written after each mode. Exit 0 when every
server started and shut down cleanly (a stock OOM is a result, not a failure).

  python3 bench/serve_run.py --out OUT --model tests/gpu/models/llama-3.1-8b-layout \
      --modes worstcase,stock --hold-slack-mib 256
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, merged_config, model_vocab, plugin_problem, write_json  # noqa: E402

OOM = re.compile(r"out of memory|OutOfMemoryError|CUDA error", re.I)
CHAT_TEMPLATE = ROOT / "bench" / "serve_chat_template.jinja"


def _parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--model", default=str(ROOT / "tests/gpu/models/llama-3.1-8b-layout"))
    p.add_argument("--modes", default="worstcase,stock")
    p.add_argument("--max-model-len", type=int, default=131072)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--util", type=float, default=0.5)
    p.add_argument("--eager", action="store_true", help="--enforce-eager (default: CUDA graphs)")
    p.add_argument("--prefix", type=int, default=122880)
    p.add_argument("--chunk", type=int, default=8000)
    p.add_argument("--decodes", type=int, default=64)
    p.add_argument("--decode-prompt", type=int, default=1024)
    p.add_argument("--decode-tokens", type=int, default=128)
    p.add_argument("--validate", default="worst", help="validate_on_start (worstcase mode)")
    p.add_argument("--hold-slack-mib", type=int, default=None)
    p.add_argument("--start-timeout-s", type=float, default=300)
    p.add_argument("--deadline", type=float, default=None, help="epoch s: skip modes past it")
    p.add_argument("--extra", default="",
                   help="more `vllm serve` flags, one string split as a shell would (quote a "
                        "JSON value); an --additional-config in it is merged into the plugin's")
    p.add_argument("--worst", type=int, default=0,
                   help="N: the worst-step traffic, N requests on the cached prefix (0: off)")
    p.add_argument("--images", type=int, default=0,
                   help="N: a chat prompt of about --prefix text tokens, cached, then with N "
                        "images after it (0: off; needs the model's tokenizer)")
    p.add_argument("--image-px", type=int, default=448, help="each image's side in pixels")
    return p.parse_args(argv)


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _tokens(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(100, vocab - 100) for _ in range(n)]


class Ballast:
    """A process holding the card so that a server started next, in a process of its own, finds
    free exactly util x total + slack once its own CUDA context exists: the context's bytes are
    measured as this process's own (NVML's free before torch's CUDA init, less torch's after)."""

    CODE = ("import sys, torch\n"
            "try:\n    import pynvml\nexcept ImportError:\n    from vllm.third_party import pynvml\n"
            "pynvml.nvmlInit()\n"
            "h = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())\n"
            "before = pynvml.nvmlDeviceGetMemoryInfo(h).free\n"
            "free, total = torch.cuda.mem_get_info()\n"
            "ctx = max(before - free, 0)\n"
            "want = int(float(sys.argv[1]) * total) + int(sys.argv[2]) + ctx\n"
            "x = torch.empty(max(free - want, 0), dtype=torch.uint8, device='cuda')\n"
            "torch.cuda.synchronize()\n"
            "print('BALLAST', x.numel(), free, total, torch.cuda.mem_get_info()[0], ctx, flush=True)\n"
            "sys.stdin.read()\n")

    def __init__(self, util: float, slack_bytes: int):
        # the ballast's one tensor on the default allocator, whatever the servers are given
        # (with expandable segments it left 8.4 MiB less free than asked, h200-run71; without,
        # 0.4 MiB, h200-run70)
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")}
        self.proc = subprocess.Popen([sys.executable, "-c", self.CODE, str(util), str(slack_bytes)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env=env)
        line = self.proc.stdout.readline().split()
        if not line or line[0] != "BALLAST":
            raise RuntimeError(f"ballast failed: {line}")
        held, free, total, left, ctx = map(int, line[1:])
        self.figures = {"ballast_bytes": held, "free_before": free, "total_bytes": total,
                        "free_after_ballast": left, "context_bytes": ctx,
                        "slack_bytes": slack_bytes, "requested_bytes": int(util * total)}

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


class GpuSampler:
    """NVML, every 0.25 s while a server runs: the device's used bytes and each process's own
    (its CUDA context and allocations), by role (ballast, the API server: the process started,
    engine: its child, unmatched: a pid this namespace cannot place), with when each process
    first held memory. None where NVML is absent.
    Tells a second CUDA context in the API server from growth inside the engine."""

    def __init__(self, roles: dict[int, str]):
        try:
            try:
                import pynvml
            except ImportError:
                from vllm.third_party import pynvml
            pynvml.nvmlInit()
            self._nv, self._h = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception:  # noqa: BLE001 - no NVML, no GPU: nothing sampled
            self._nv = None
        self.roles, self.t0, self._stop = roles, time.time(), threading.Event()
        self.used_max, self.procs, self.timeline = 0, {}, []
        self._thread = threading.Thread(target=self._run, daemon=True)
        if self._nv:
            self._thread.start()

    def _run(self) -> None:
        last = -10.0
        while not self._stop.wait(0.25):
            t = time.time() - self.t0
            try:
                used = self._nv.nvmlDeviceGetMemoryInfo(self._h).used
                apps = self._nv.nvmlDeviceGetComputeRunningProcesses(self._h)
            except Exception:  # noqa: BLE001 - a failed read: the next one
                continue
            self.used_max = max(self.used_max, used)
            for app in apps:
                if app.pid not in self.procs:  # its role read once, when it first holds memory
                    self.procs[app.pid] = {"role": self._role(app.pid), "first_s": round(t, 2),
                                           "max_bytes": None}
                mine = self.procs[app.pid]
                if app.usedGpuMemory is not None:  # None where the driver does not say
                    mine["max_bytes"] = max(mine["max_bytes"] or 0, app.usedGpuMemory)
            if t - last >= 2.0 and len(self.timeline) < 400:
                self.timeline.append([round(t, 1), used])
                last = t

    def _role(self, pid: int) -> str:
        """ballast / api server by pid, "engine" for a child of the API server, else
        "unmatched": inside a container NVML may report the host's pids, which this namespace
        cannot see (then the count of processes still tells two CUDA contexts from three)."""
        if pid in self.roles:
            return self.roles[pid]
        try:
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return "unmatched"
        return "engine" if self.roles.get(ppid) == "api server" else "unmatched"

    def close(self) -> dict | None:
        self._stop.set()
        if not self._nv:
            return None
        self._thread.join(timeout=5)
        return {"device_used_max_bytes": self.used_max, "process_count": len(self.procs),
                "processes": {str(k): v for k, v in self.procs.items()},
                "timeline_s_used_bytes": self.timeline}


UNQUOTED_KEY = re.compile(r"[{,]\s*[A-Za-z_][\w.-]*\s*:")
"""A JSON object whose keys lost their quotes in a shell split (`{method:dspark,k:3}`)."""


def checked_extra(extra: str) -> list[str]:
    """--extra split as a shell would (shlex: a quoted JSON value stays one argument), checked
    before a ballast or a server starts, instead of in `vllm serve`'s argument parser minutes
    later: a flag's value that reads as a JSON object whose keys lost their quotes is refused,
    whatever the flag (vLLM parses a dozen config flags and their aliases as JSON); and
    --additional-config, which serve_run merges itself, must have a value that is a JSON object."""
    args = shlex.split(extra)
    for i, arg in enumerate(args):
        if not arg.startswith("-"):
            continue  # a value: checked with the flag before it
        name, eq, value = arg.partition("=")
        if not eq:
            value = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("-") else None
        if name.replace("_", "-") == "--additional-config":
            if value is None:
                raise SystemExit("serve_run: --extra's --additional-config has no value")
            try:
                ok = isinstance(json.loads(value), dict)
            except ValueError:
                ok = False
            if not ok:
                raise SystemExit(f"serve_run: --extra's --additional-config value {value!r} is "
                                 f"not a JSON object; quote it inside --extra, e.g. --extra "
                                 f"\"--additional-config '{{\\\"key\\\": 1}}'\"")
        elif value and value.startswith("{") and UNQUOTED_KEY.search(value):
            try:
                json.loads(value)
            except ValueError:
                raise SystemExit(f"serve_run: --extra's {name} value {value!r} has lost the quotes "
                                 f"around its keys; quote the JSON inside --extra, e.g. --extra "
                                 f"\"{name} '{{\\\"key\\\": 1}}'\"") from None
    return args


def server_argv(a, mode: str, port: int, report: Path) -> list[str]:
    """`vllm serve ...` for one mode. --extra is split as a shell would (shlex: a quoted JSON
    value stays one argument); an `--additional-config` in it is merged into the plugin modes'
    own (vLLM keeps only the last one given), its keys beside "worstcase_profiler". Stock gets
    the same config without the profiler's settings (any would turn the profiler on)."""
    extra = checked_extra(a.extra)
    more: dict = {}
    kept, i = [], 0
    while i < len(extra):
        name, eq, value = extra[i].partition("=")
        if name.replace("_", "-") == "--additional-config":
            if not eq:
                i += 1
                value = extra[i]  # there is one: checked_extra
            more = merged_config(more, json.loads(value))
        else:
            kept.append(extra[i])
        i += 1
    extra = kept
    if mode == "stock":
        more.pop("worstcase_profiler", None)
        extra += ["--additional-config", json.dumps(more)] if more else []
    # image traffic is chat: the model's tokenizer, and a template that adds nothing
    text = (["--chat-template", str(CHAT_TEMPLATE), "--chat-template-content-format", "string",
             "--interleave-mm-strings"] if getattr(a, "images", 0) else ["--skip-tokenizer-init"])
    cmd = ["serve", a.model, "--load-format", "dummy", *text,
           "--max-model-len", str(a.max_model_len),
           "--max-num-batched-tokens", str(a.max_num_batched_tokens),
           "--gpu-memory-utilization", str(a.util), "--host", "127.0.0.1",
           "--port", str(port), *(["--enforce-eager"] if a.eager else []), *extra]
    if mode != "stock":
        cfg = {"validate_on_start": a.validate} if mode == "worstcase" else {"guard": "off"}
        cmd += ["--profiler", "worstcase", "--profiler-report", str(report),
                "--additional-config", json.dumps(merged_config(more, {"worstcase_profiler": cfg}))]
    return cmd


ANSWER_ERRORS = (OSError, ValueError, KeyError)
"""What a request to a server can raise: no answer (OSError, HTTPError among them), or one that
is not the JSON expected."""


def error_text(e: Exception) -> str:
    """A failed request in one line: the error, and an HTTP error's body (vLLM says why there)."""
    body = e.read().decode(errors="replace")[:300] if isinstance(e, urllib.error.HTTPError) else ""
    return f"{type(e).__name__}: {e} {body}"[:500]


class Server:
    def __init__(self, a, mode: str, out: Path):
        self.mode, self.port = mode, _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = out / f"serve-{mode}.log"
        self.report = out / f"report-{mode}.json"
        cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main",
               *server_argv(a, mode, self.port, self.report)]
        env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
        # the plugin from this checkout, as common.plugin_problem checked it, in every process
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
        self.cmd = cmd
        self.log = open(self.log_path, "w")
        self.t0 = time.time()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     cwd=ROOT, start_new_session=True)

    def wait_healthy(self, timeout: float) -> float | None:
        deadline = time.time() + timeout
        while time.time() < deadline and self.proc.poll() is None:
            try:
                urllib.request.urlopen(self.url + "/health", timeout=2)
                return time.time() - self.t0
            except OSError:
                time.sleep(0.5)
        return None

    def alive(self) -> bool:
        """The server process runs and its /health answers 200: after its engine core died (a
        CUDA OOM in a step) the API server process may still run for a while, answering 500s."""
        if self.proc.poll() is not None:
            return False
        try:
            return urllib.request.urlopen(self.url + "/health", timeout=5).status == 200
        except OSError:
            return False

    def post(self, model: str, prompt: list[int], max_tokens: int, timeout: float = 600) -> dict:
        return self.request("/v1/completions", {"model": model, "prompt": prompt}, max_tokens,
                            timeout)

    def chat(self, model: str, content: list[dict], max_tokens: int, timeout: float = 600) -> dict:
        """One user message of OpenAI content parts (text, image_url) to /v1/chat/completions."""
        return self.request("/v1/chat/completions", {
            "model": model, "messages": [{"role": "user", "content": content}]}, max_tokens,
            timeout)

    def tokens(self, model: str, content: list[dict]) -> int:
        """How many prompt tokens that message makes (vLLM's /tokenize, the chat template
        applied as /v1/chat/completions applies it)."""
        return int(self.post_json("/tokenize", {
            "model": model, "messages": [{"role": "user", "content": content}],
            "add_generation_prompt": True}, timeout=120)["count"])

    def request(self, path: str, fields: dict, max_tokens: int, timeout: float = 600) -> dict:
        t0 = time.perf_counter()
        try:
            out = self.post_json(path, {**fields, "max_tokens": max_tokens, "ignore_eos": True,
                                        "temperature": 0.0}, timeout)
            return {"ok": True, "s": time.perf_counter() - t0,
                    "completion_tokens": out["usage"]["completion_tokens"],
                    "prompt_tokens": out["usage"]["prompt_tokens"]}
        except ANSWER_ERRORS as e:
            return {"ok": False, "s": time.perf_counter() - t0, "error": error_text(e)}

    def post_json(self, path: str, body: dict, timeout: float) -> dict:
        """POST `body` as JSON to `path`; the answer's JSON (raises one of ANSWER_ERRORS)."""
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        return json.loads(urllib.request.urlopen(req, timeout=timeout).read())

    def get(self, path: str) -> str | None:
        try:
            return urllib.request.urlopen(self.url + path, timeout=20).read().decode()
        except OSError:
            return None

    def stop(self, timeout: float = 90) -> dict:
        """SIGINT, as a terminal's Ctrl-C; then how the process group ended."""
        t0 = time.perf_counter()
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
        try:
            rc = self.proc.wait(timeout=timeout)
            forced = False
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            rc, forced = self.proc.wait(), True
        left = True  # anything left of the process group (the engine core) 10 s later?
        for _ in range(100):
            try:
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                left = False
                break
            time.sleep(0.1)
        self.log.close()
        return {"rc": rc, "stop_s": round(time.perf_counter() - t0, 2), "forced": forced,
                "processes_left": left}


def _concurrent(srv: Server, model: str, prompts: list[list[int]], max_tokens: int,
                extra=None) -> tuple[list[dict], float]:
    results: list[dict | None] = [None] * len(prompts)

    def one(i: int) -> None:
        results[i] = srv.post(model, prompts[i], max_tokens)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    side = extra() if extra else None
    for t in threads:
        t.join()
    return results, time.perf_counter() - t0, side


def _tally(results: list[dict | None]) -> dict:
    """How many of a batch's answers were ok, and the first three errors."""
    return {"ok": sum(1 for r in results if r and r["ok"]),
            "errors": [r["error"] for r in results if r and not r["ok"]][:3]}


def _metrics(text: str | None) -> dict:
    if not text:
        return {}
    out = {}
    for line in text.splitlines():
        if line.startswith("wcprof_guard_") and " " in line:
            name, value = line.rsplit(" ", 1)
            out[name.split("{")[0]] = float(value)
    return out


def traffic(srv: Server, a, rng_seed: int = 0, decodes_only: bool = False) -> dict:
    vocab = model_vocab(a.model)
    rng = random.Random(rng_seed)
    prefix = _tokens(rng, a.prefix, vocab)
    new = _tokens(rng, a.chunk, vocab)
    other = _tokens(rng, a.chunk, vocab)
    dec = [_tokens(rng, a.decode_prompt, vocab) for _ in range(2 * a.decodes)]
    t: dict = {}
    if not decodes_only:
        t["long"] = srv.post(a.model, prefix, 1)
        t["cached"] = srv.post(a.model, prefix + new, 4) if srv.alive() else {"ok": False, "error": "server down"}
    if srv.alive():
        res, wall, _ = _concurrent(srv, a.model, dec[:a.decodes], a.decode_tokens)
        done = sum(r["completion_tokens"] for r in res if r and r["ok"])
        t["decodes"] = {"n": a.decodes, "wall_s": wall, "tokens": done,
                        "tokens_per_s": done / wall if wall else None, **_tally(res)}
    if not decodes_only and srv.alive():
        res, wall, side = _concurrent(srv, a.model, dec[a.decodes:], a.decode_tokens,
                                      extra=lambda: srv.post(a.model, prefix + other, 4))
        t["mixed"] = {"n": a.decodes, "wall_s": wall, "long": side, **_tally(res)}
    if getattr(a, "images", 0) and not decodes_only and srv.alive():
        t["images"] = image_traffic(srv, a)
    if a.worst and not decodes_only and srv.alive():
        t["worst"] = worst_traffic(srv, a, prefix, _tokens(rng, a.prefix, vocab), rng, vocab)
    return t


WORDS = "hello world "
"""The text unit of the image traffic's prompt: it repeats to about --prefix tokens."""


def image_traffic(srv, a) -> dict:
    """--images N: the text (WORDS repeated to about --prefix tokens, counted by the server's
    /tokenize) sent alone and cached (max_tokens 1); then the same text followed by N distinct
    --image-px square images (max_tokens 2), which hits the cached text up to its last whole
    block and computes the rest with the images' tokens. Reports the token counts, the prefix
    cache hits the second request added (vLLM's /metrics) and whether the server lived."""
    def content(n: int, images: int = 0) -> list[dict]:
        return [{"type": "text", "text": WORDS * n},
                *({"type": "image_url", "image_url": {"url": image_url(i, a.image_px)}}
                  for i in range(images))]

    try:  # a server that cannot render the prompt (its tokenizer, its template) answers 400
        one, two = srv.tokens(a.model, content(1)), srv.tokens(a.model, content(2))
        per = max(1, two - one)
        n = max(1, (a.prefix - (one - per)) // per)
        text = srv.tokens(a.model, content(n))
        with_images = srv.tokens(a.model, content(n, a.images))
    except ANSWER_ERRORS as e:
        failed = {"ok": False, "error": f"/tokenize: {error_text(e)}"}
        return {"images": a.images, "image_px": a.image_px, "text_tokens": None,
                "prompt_tokens": None, "image_tokens": None, "cached": failed, "request": failed,
                "prefix_cache_hit_tokens": None, "alive_after": srv.alive()}
    cached = srv.chat(a.model, content(n), 1)
    hits = prefix_cache_hits(srv.get("/metrics"))
    out = srv.chat(a.model, content(n, a.images), 2)
    after = prefix_cache_hits(srv.get("/metrics"))
    return {"images": a.images, "image_px": a.image_px, "text_tokens": text,
            "prompt_tokens": with_images, "image_tokens": with_images - text,
            "cached": cached, "request": out,
            "prefix_cache_hit_tokens": None if hits is None or after is None else after - hits,
            "alive_after": srv.alive()}


def image_url(i: int, px: int) -> str:
    """Image i as a PNG data URL: a square of its own colour, so that no two share an
    encoder-cache entry."""
    import base64
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (px, px), ((40 * i) % 256, (90 + 70 * i) % 256, (200 + 30 * i) % 256)) \
        .save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def prefix_cache_hits(text: str | None) -> int | None:
    """vLLM's prefix-cache hits so far (tokens; the sum over engines), from /metrics."""
    if not text:
        return None
    got = [float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
           if ln.startswith("vllm:prefix_cache_hits_total")]
    return int(sum(got)) if got else None


def worst_traffic(srv, a, prefix: list[int], blocker: list[int], rng, vocab: int,
                  lead_s: float = 0.5) -> dict:
    """--worst N: the blocker (a fresh prompt as long as the prefix) first; `lead_s` later the N
    requests on the cached prefix, max_num_batched_tokens // N new tokens each, together; then
    whether the server is still alive. The blocker's chunks take each step's whole token budget
    while it runs, so the N queue and are scheduled in one step once it finishes."""
    n = a.worst
    rows = max(1, a.max_num_batched_tokens // n)
    prompts = [prefix + _tokens(rng, rows, vocab) for _ in range(n)]
    side: dict = {}
    lead = threading.Thread(target=lambda: side.update(srv.post(a.model, blocker, 1)))
    lead.start()
    time.sleep(lead_s)
    res, wall, _ = _concurrent(srv, a.model, prompts, 1)
    lead.join()
    return {"n": n, "rows_each": rows, "context": len(prefix), "wall_s": wall, "blocker": side,
            **_tally(res), "alive_after": srv.alive()}


def run_mode(a, mode: str, out: Path) -> dict:
    r: dict = {"mode": mode, "model": a.model, "max_model_len": a.max_model_len,
               "max_num_batched_tokens": a.max_num_batched_tokens, "util": a.util,
               "graphs": not a.eager, "prefix": a.prefix, "chunk": a.chunk,
               # the allocator's settings the servers inherit: without expandable segments a
               # held card can fail of fragmentation (docs/results/h200-run54)
               "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF",
                                            os.environ.get("PYTORCH_ALLOC_CONF"))}
    ballast = None
    if a.hold_slack_mib is not None:
        ballast = Ballast(a.util, a.hold_slack_mib << 20)
        r["hold"] = ballast.figures
    srv = Server(a, mode, out)
    r["cmd"] = srv.cmd
    roles = {srv.proc.pid: "api server", **({ballast.proc.pid: "ballast"} if ballast else {})}
    sampler = GpuSampler(roles)
    try:
        r["healthy_s"] = srv.wait_healthy(a.start_timeout_s)
        if r["healthy_s"] is not None:
            r["traffic"] = traffic(srv, a, decodes_only=(mode == "guard-off"))
            r["alive_after_traffic"] = srv.alive()
            r["guard_metrics"] = _metrics(srv.get("/metrics"))
            if mode != "stock" and srv.alive():
                g = subprocess.run([sys.executable, "-m", "worstcase_profiler.cli", "guard", srv.url],
                                   capture_output=True, text=True, timeout=60, cwd=ROOT)
                r["wcprof_guard"] = {"rc": g.returncode, "stdout": g.stdout, "stderr": g.stderr[-2000:]}
    finally:
        r["shutdown"] = srv.stop()
        r["gpu_memory"] = sampler.close()
        if ballast:
            ballast.close()
    text = srv.log_path.read_text(errors="replace")
    # vLLM's dump of a failed step lists every token id on one line: cut lines so the log comes back
    srv.log_path.write_text("".join(ln[:2000] + "\n" for ln in text.splitlines()))
    r["oom_lines"] = [ln for ln in text.splitlines() if OOM.search(ln)][:5]
    r["wcprof_lines"] = [ln for ln in text.splitlines() if "[wcprof]" in ln][:40]
    if srv.report.exists():
        rep = json.loads(srv.report.read_text())
        wc, adm = rep.get("worstcase") or {}, rep.get("admission") or {}
        r["report"] = {"peak_activation_bytes": wc.get("peak_activation_bytes"),
                       "worst_shape": wc.get("worst_shape"),
                       "kv_cache_bytes": adm.get("kv_cache_bytes"),
                       "validations": rep.get("validations"), "kv_audit": rep.get("kv_audit")}
    return r


def main(argv=None) -> int:
    a = _parse(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    # a SIGTERM (a driver's timeout) unwinds like Ctrl-C: run_mode's finally stops the server
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    checked_extra(a.extra)
    if "worstcase" in a.modes.split(",") and (problem := plugin_problem()):
        raise SystemExit(f"serve_run: {problem}")  # before a ballast or a server starts
    summary = {"args": vars(a), "modes": []}
    ok = True
    for mode in a.modes.split(","):
        if a.deadline and time.time() > a.deadline:
            summary["modes"].append({"mode": mode, "skipped": "past the deadline"})
            continue
        print(f"serve_run: {mode} ...", flush=True)
        r = run_mode(a, mode, out)
        summary["modes"].append(r)
        write_json(out / "serve.json", summary)
        sd = r["shutdown"]
        print(f"serve_run: {mode}: healthy {r.get('healthy_s')}, alive after traffic "
              f"{r.get('alive_after_traffic')}, shutdown rc {sd['rc']} in {sd['stop_s']} s "
              f"(forced {sd['forced']}, left {sd['processes_left']}); oom {r['oom_lines'][:1]}; "
              f"guard {(r.get('wcprof_guard') or {}).get('stdout', '').strip()}"
              + (f"; worst step over HTTP: {w['ok']} of {w['n']} served, alive after "
                 f"{w['alive_after']}" if (w := (r.get('traffic') or {}).get('worst')) else "")
              + (f"; {m['images']} image(s) on {m['text_tokens']} cached text tokens: "
                 f"{'served' if m['request']['ok'] else m['request'].get('error')}, prefix hit "
                 f"{m['prefix_cache_hit_tokens']}, alive after {m['alive_after']}"
                 if (m := (r.get('traffic') or {}).get('images')) else ""),
              flush=True)
        ok &= r.get("healthy_s") is not None and not sd["forced"] and not sd["processes_left"]
    write_json(out / "serve.json", summary)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
