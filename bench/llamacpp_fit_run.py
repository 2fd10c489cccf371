"""llama.cpp's `--fit` on the layout `wcprof fit` ran in vLLM (docs/fit.md, "Beside llama.cpp's
`--fit`"), on the same card held to the same share: its memory plan, its fitted context for N
parallel sequences and for one, and a start with the fitted flags whose device memory is read
while one slot fills its whole context. It takes a llama.cpp build (`--bin`: llama-fit-params,
llama-server and their libraries; none is in this repository) and writes `summary.json` with every
command, its rc, wall time and output.

  python3 bench/llamacpp_fit_run.py --bin DIR --out OUT [--layout tests/gpu/models/llama-3.1-8b-layout]
      [--util 0.5] [--parallel 4] [--deadline EPOCH]

The card's share: vLLM's `--gpu-memory-utilization U` lets its instance use U x total memory;
llama.cpp's `--fit-target M` leaves M MiB of the free memory unused, so M = free - U x total
(both read with nvidia-smi just before). The fitted start's peak is nvidia-smi's used memory,
polled every 50 ms, less what was used before it started."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gguf_layout  # noqa: E402
from common import ROOT, write_json  # noqa: E402


def smi() -> dict:
    q = subprocess.run(["nvidia-smi", "--query-gpu=memory.total,memory.used,memory.free",
                        "--format=csv,noheader,nounits", "-i", "0"],
                       capture_output=True, text=True, timeout=30).stdout.split(",")
    total, used, free = (int(x) for x in q)
    return {"total_mib": total, "used_mib": used, "free_mib": free}


class Summary:
    def __init__(self, out: Path):
        self.out, self.data = out, {"kind": "llamacpp_fit_run", "steps": []}

    def save(self) -> None:
        write_json(self.out / "summary.json", self.data)

    def run(self, name: str, cmd: list[str], env: dict, timeout: float) -> dict:
        t0 = time.time()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=max(1, timeout),
                               env=env)
            rc, out, err = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired as e:
            rc, out, err = 124, (e.stdout or b"").decode(errors="replace") if isinstance(
                e.stdout, bytes) else (e.stdout or ""), "timeout"
        step = {"name": name, "cmd": cmd, "rc": rc, "seconds": round(time.time() - t0, 2),
                "stdout": out[-6000:], "stderr_tail": err[-6000:]}
        self.data["steps"].append(step)
        self.save()
        return step


def lib_env(bin_dir: Path) -> dict:
    """The build's libraries, then CUDA's runtime and cuBLAS from the host's Python packages."""
    env = dict(os.environ)
    dirs = [str(bin_dir)]
    for site in sys.path:
        for lib in Path(site).glob("nvidia/*/lib") if site and Path(site).is_dir() else ():
            if list(lib.glob("libcublas*.so*")) or list(lib.glob("libcudart*.so*")):
                dirs.append(str(lib))
    env["LD_LIBRARY_PATH"] = ":".join(dirs + [env.get("LD_LIBRARY_PATH", "")])
    return env


def poll_peak(stop: threading.Event, box: dict) -> None:
    while not stop.is_set():
        try:
            box["peak_used_mib"] = max(box.get("peak_used_mib", 0), smi()["used_mib"])
        except Exception as e:  # noqa: BLE001 - a reading missed is recorded, not fatal
            box["poll_error"] = repr(e)
        time.sleep(0.05)


def serve(s: Summary, bin_dir: Path, gguf: Path, n_ctx: int, ngl: int, parallel: int, env: dict,
          deadline: float) -> dict:
    """llama-server with the fitted flags; one slot's context filled by one prompt of token ids
    (the model's pieces are dummies); nvidia-smi's used memory polled throughout."""
    before = smi()
    port = 18123
    cmd = [str(bin_dir / "llama-server"), "-m", str(gguf), "-c", str(n_ctx), "-np", str(parallel),
           "-ngl", str(ngl), "--fit", "off", "--host", "127.0.0.1", "--port", str(port)]
    box: dict = {}
    stop = threading.Event()
    poller = threading.Thread(target=poll_peak, args=(stop, box), daemon=True)
    poller.start()
    t0 = time.time()
    log = open(s.out / "llama-server.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    rec = {"name": "fitted start", "cmd": cmd, "used_before_mib": before["used_mib"]}
    try:
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except Exception:  # noqa: BLE001 - not up yet
                time.sleep(0.5)
            if proc.poll() is not None:
                break
        rec["ready_s"] = round(time.time() - t0, 2)
        rec["loaded_used_mib"] = smi()["used_mib"]
        slot = n_ctx // parallel
        ids = [(i * 7919) % 120000 + 1000 for i in range(slot - 8)]  # normal pieces only
        body = json.dumps({"prompt": ids, "n_predict": 4, "cache_prompt": False}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", data=body,
                                     headers={"Content-Type": "application/json"})
        t1 = time.time()
        try:
            with urllib.request.urlopen(req, timeout=max(5, deadline - time.time())) as r:
                answer = json.loads(r.read())
            rec["prompt_tokens"] = answer.get("tokens_evaluated")
            rec["timings"] = answer.get("timings")
        except Exception as e:  # noqa: BLE001 - recorded
            rec["request_error"] = repr(e)[:2000]
        rec["request_s"] = round(time.time() - t1, 2)
    finally:
        stop.set()
        poller.join(timeout=2)
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
    rec["rc"] = proc.returncode
    rec["peak_used_mib"] = box.get("peak_used_mib")
    rec["peak_above_before_mib"] = (box["peak_used_mib"] - before["used_mib"]
                                    if "peak_used_mib" in box else None)
    rec["log_tail"] = (s.out / "llama-server.log").read_text(errors="replace")[-8000:]
    s.data["steps"].append(rec)
    s.save()
    return rec


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bin", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--layout", type=Path,
                   default=ROOT / "tests" / "gpu" / "models" / "llama-3.1-8b-layout")
    p.add_argument("--util", type=float, default=0.5)
    p.add_argument("--parallel", type=int, default=4)
    p.add_argument("--deadline", type=float, default=time.time() + 500)
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    s = Summary(a.out)
    env = lib_env(a.bin)
    gguf = Path("/tmp/wcp-llamacpp") / f"{a.layout.name}-f16.gguf"
    gguf.parent.mkdir(parents=True, exist_ok=True)
    weights = gguf_layout.write(json.loads((a.layout / "config.json").read_text()), gguf,
                               name=a.layout.name)
    card = smi()
    margin = max(0, card["free_mib"] - int(a.util * card["total_mib"]))
    s.data.update({"layout": str(a.layout.resolve()).removeprefix(f"{ROOT}/"),
                   "gguf_tensor_bytes": weights,
                   "card": card, "util": a.util, "parallel": a.parallel,
                   "fit_target_mib": margin, "ld_library_path": env["LD_LIBRARY_PATH"]})
    s.save()
    fp = str(a.bin / "llama-fit-params")
    left = lambda: a.deadline - time.time()  # noqa: E731
    s.run("plan at the default context (n_ctx_train per sequence)",
          [fp, "-m", str(gguf), "-np", str(a.parallel), "--fit-print", "on"], env, min(90, left()))
    fits = {}
    for n in (a.parallel, 1):
        step = s.run(f"fit for {n} sequence(s)",
                     [fp, "-m", str(gguf), "-np", str(n), "-fitt", str(margin)], env,
                     min(90, left()))
        m = re.search(r"-c (\d+) -ngl (-?\d+)", step["stdout"])
        fits[n] = {"n_ctx": int(m.group(1)), "ngl": int(m.group(2))} if m else None
    s.data["fits"] = {str(k): v for k, v in fits.items()}
    s.save()
    if fits.get(a.parallel) and left() > 40:
        fit = fits[a.parallel]
        serve(s, a.bin, gguf, fit["n_ctx"], fit["ngl"], a.parallel, env, a.deadline - 5)
    print(json.dumps({"fits": s.data["fits"], "card": card, "fit_target_mib": margin}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
