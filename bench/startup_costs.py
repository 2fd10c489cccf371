#!/usr/bin/env python3
"""Where each first start's extra time goes, from bench/startup_bench.py's JSON (issue 34).

  python3 bench/startup_costs.py FILE.json[:FAMILY] ...

For every model in each file (or FAMILY alone), with its first round's stock, first
(worstcase-cold) and cached (worstcase-warm) start, two markdown tables on stdout (the ones in
docs/faq.md, "Where each first start's extra time goes"):
  - against stock: first minus stock, split into the sweep's parts (sweep_split: cut decoder,
    full-model readings, eager re-reads), the pool fit, the warm-up rehearsal, how much longer
    vLLM's own profile took than on the restart, and the rest;
  - against the restart (which runs what a stock start runs, plus its own profiler seconds):
    first minus restart, the same named parts, and what they leave unnamed.
Pure: reads the files, starts nothing.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def starts(path: str) -> list[tuple[str, str, dict, dict, dict]]:
    """(family, forward, stock, first, restart) of each model in `path` ("FILE[:FAMILY]"), its
    first round's starts."""
    file, _, only = path.partition(":")
    d = json.loads(Path(file).read_text())
    out = []
    for fam, m in d["models"].items():
        if only and fam != only:
            continue
        first_round = {}
        for r in m["runs"]:
            first_round.setdefault(r["mode"], r)
        out.append((fam, "graphs" if d.get("graphs") else "eager", first_round["stock"],
                    first_round["worstcase-cold"], first_round["worstcase-warm"]))
    return out


def named_parts(first: dict, restart: dict) -> dict[str, float]:
    """The first start's named costs: its sweep's parts, pool fit, rehearsal, and vLLM's
    profile beyond the restart's."""
    phases, split = first["startup_seconds"], first.get("sweep_split") or {}
    return {"cut": split.get("cut_decoder", 0.0), "full": split.get("full_model", 0.0),
            "eager": split.get("eager_rereads", 0.0), "pool_fit": phases.get("pool_fit", 0.0),
            "rehearsal": phases.get("warmup_rehearsal", 0.0),
            "profile": phases.get("vllm_profile", 0.0)
            - restart["startup_seconds"].get("vllm_profile", 0.0)}


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    rows = [row for path in argv for row in starts(path)]
    print("| family | forward | stock s | first s (x) | restart s (x) | extra s | sweep: cut / "
          "full / eager re-reads | pool fit | rehearsal | vLLM profile +s vs restart | rest |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for fam, fw, s, c, w in rows:
        p = named_parts(c, w)
        extra = c["boot_s"] - s["boot_s"]
        print(f"| {fam} | {fw} | {s['boot_s']:.2f} | {c['boot_s']:.2f} "
              f"({c['boot_ratio_to_stock']:.2f}x) | {w['boot_s']:.2f} "
              f"({w['boot_ratio_to_stock']:.2f}x) | {extra:.2f} | {p['cut']:.2f} / "
              f"{p['full']:.2f} / {p['eager']:.2f} | {p['pool_fit']:.2f} | "
              f"{p['rehearsal']:.2f} | {p['profile']:.2f} | {extra - sum(p.values()):.2f} |")
    print()
    print("| family | forward | first - restart s | named parts s | the restart's own profiler s "
          "| unnamed |")
    print("|---|---|---|---|---|---|")
    for fam, fw, _, c, w in rows:
        gap, named, own = c["boot_s"] - w["boot_s"], sum(named_parts(c, w).values()), \
            w.get("profiler_s") or 0
        print(f"| {fam} | {fw} | {gap:.2f} | {named:.2f} | {own:.2f} | {gap - named + own:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
