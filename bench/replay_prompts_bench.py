#!/usr/bin/env python3
"""How long a worst-step replay takes to build its prompts, without and with the workload's memo
(core/requests_plan.token_ids), side by side in one run: N prompts on one cached prefix, each
mode in its own process so that its peak RSS is its own.

  .venv/bin/python bench/replay_prompts_bench.py                # 1,024 prompts, prefix 131,064
  .venv/bin/python bench/replay_prompts_bench.py --prompts 128 --prefix 8192

The default is h200-run69's qwen25vl case (8,192 rows over 1,024 requests at context 131,064).
Prints seconds and peak RSS per mode and the ratios.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child(mode: str, prompts: int, prefix: int, vocab: int) -> None:
    sys.path.insert(0, str(ROOT))
    from worstcase_profiler.core.requests_plan import Prompt, token_ids

    memo = {} if mode == "memo" else None
    t0 = time.perf_counter()
    built = [token_ids(Prompt(1, prefix, 8), vocab, salt, memo) for salt in range(prompts)]
    seconds = time.perf_counter() - t0
    assert len(built) == prompts and len(built[-1]) == prefix + 8
    print(json.dumps({"mode": mode, "seconds": round(seconds, 3),
                      "max_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                                           / 1024)}))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=1024)
    p.add_argument("--prefix", type=int, default=131064)
    p.add_argument("--vocab", type=int, default=152064)
    p.add_argument("--child", choices=("plain", "memo"), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        child(a.child, a.prompts, a.prefix, a.vocab)
        return 0
    out = {}
    for mode in ("plain", "memo"):
        res = subprocess.run([sys.executable, __file__, "--child", mode, "--prompts",
                              str(a.prompts), "--prefix", str(a.prefix), "--vocab", str(a.vocab)],
                             capture_output=True, text=True, check=True)
        out[mode] = json.loads(res.stdout.strip().splitlines()[-1])
        print(f"{mode:<6} {a.prompts} prompts of {a.prefix + 8} tokens: "
              f"{out[mode]['seconds']:.2f} s, peak RSS {out[mode]['max_rss_mib']} MiB")
    print(f"memo / plain: time {out['memo']['seconds'] / out['plain']['seconds']:.3f}, "
          f"peak RSS {out['memo']['max_rss_mib'] / out['plain']['max_rss_mib']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
