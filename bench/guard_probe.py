#!/usr/bin/env python3
"""What the production guard costs per step, timed by itself: its probe's start() and end()
(adapter/guard.py), the only work the guard adds to a step, on this machine's device.

  python3 bench/guard_probe.py --out probe.json [--steps 20000] [--device cuda|cpu]
                               [--soak guard-soak.json]

Each timed step allocates and frees a few tensors on the device (the allocator's counters then
move as in a forward pass) and is timed with and without the probe around it, interleaved in
blocks of 100 so drift hits both alike; the probe's cost is the difference of the two medians
per step, and the probe's start()+end() alone is timed too. Nothing here synchronises the
device except once before timing starts.

With --soak (bench/guard_soak.py's JSON from a run on the same kind of device), the cost is also
given as a fraction of the soak's mean step time (guard-on wall seconds / the steps its guard
counted): the guard's overhead on that soak's throughput, resolved far below the soak's own
round-to-round noise.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import write_json  # noqa: E402


def _work(torch, device, n: int):
    """A step's allocator traffic: n tensors of 1-4 MiB allocated, one kept, the rest freed."""
    keep = None
    for i in range(n):
        t = torch.empty((1 + i % 4) << 18, dtype=torch.float32, device=device)
        if i == n - 1:
            keep = t
    return keep


def measure(device: str, steps: int, tensors: int) -> dict:
    import torch

    from worstcase_profiler.adapter.guard import make_probe

    dev = torch.device(device)
    probe = make_probe(dev)
    if probe is None:
        raise SystemExit(f"no guard probe for {device}")
    _work(torch, dev, tensors)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    block = 100
    bare, guarded, alone = [], [], []
    for _ in range(max(1, steps // block)):
        t0 = time.perf_counter_ns()
        for _ in range(block):
            _work(torch, dev, tensors)
        bare.append((time.perf_counter_ns() - t0) / block)
        t0 = time.perf_counter_ns()
        for _ in range(block):
            probe.start()
            _work(torch, dev, tensors)
            probe.end()
        guarded.append((time.perf_counter_ns() - t0) / block)
        t0 = time.perf_counter_ns()
        for _ in range(block):
            probe.start()
            probe.end()
        alone.append((time.perf_counter_ns() - t0) / block)
    med = {k: statistics.median(v) / 1000 for k, v in
           (("bare_step_us", bare), ("guarded_step_us", guarded), ("probe_alone_us", alone))}
    return {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
            "torch": torch.__version__, "probe": type(probe).__name__, "steps": len(bare) * block,
            "tensors_per_step": tensors, **med,
            "probe_cost_us": med["guarded_step_us"] - med["bare_step_us"]}


def against_soak(result: dict, soak_path: str) -> dict:
    """The probe's cost as a fraction of the soak's mean guard-on step time."""
    soak = json.loads(Path(soak_path).read_text())
    runs = [r for r in soak.get("runs", []) if r.get("guard") == "on" and r.get("rounds")]
    out = []
    for r in runs:
        steps = sum(f.get("steps", 0) for f in r.get("figures", []))
        wall = sum(x["wall_s"] for x in r["rounds"])
        if steps:
            step_us = 1e6 * wall / steps
            out.append({"step_us": step_us,
                        "overhead": max(result["probe_cost_us"], result["probe_alone_us"])
                        / step_us})
    return {"soak": soak_path, "per_process": out}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--steps", type=int, default=20000)
    p.add_argument("--tensors", type=int, default=8)
    p.add_argument("--soak", default=None)
    a = p.parse_args()
    result = measure(a.device, a.steps, a.tensors)
    if a.soak:
        result["against_soak"] = against_soak(result, a.soak)
    write_json(a.out, result)
    print(f"{result['device']}: {result['probe']} start+end alone {result['probe_alone_us']:.1f} "
          f"us; a step of {result['tensors_per_step']} allocations {result['bare_step_us']:.1f} us "
          f"bare, {result['guarded_step_us']:.1f} us guarded: +{result['probe_cost_us']:.1f} us")
    for x in (result.get("against_soak") or {}).get("per_process", []):
        print(f"soak step {x['step_us']:.0f} us: the probe is {100 * x['overhead']:.3f}% of it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
