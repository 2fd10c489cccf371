"""`wcprof`'s commands: one module per command, named as the command, each owning its parser
and its `run(argv) -> int` (an exit code of errors.EXIT_CODES; a WcprofError for bad input).

  profile.py  boot the engine with the profiler, print the verdict (the default command)
  demo.py     the bundled scenarios (a profile of a fixture model)
  check.py    is a --kv-cache-memory-bytes value safe for a saved report?
  diff.py     did worst-case memory get worse between two reports? (the gated metrics)
  render.py   re-render a saved report
  gate.py     profile a file of configurations against their baselines (CI)
  advise.py   the chunk advisor's table from a saved report
  fit.py      which max_model_len, chunk and max_num_seqs fit, from one sweep at the largest
  guard.py    did the profile hold on a running server? (/metrics)
  cache.py    list, export or import sweep-cache entries

and what they share: profile_options.py (wcprof's own profile flags, read before vLLM loads),
engine_boot.py (vLLM's engine flags, the bundled model's defaults, starting the engine and
naming why it failed) and usage.py (`wcprof --help`). Files are written through
worstcase_profiler/atomic_write.py.

Only cli.py imports this package (scripts/module_graph.py checks it); cli.main maps every error
to its exit code. A command's module is imported when it runs, so `wcprof --help` stays light.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    """One `wcprof` command: its name (also its module's), and its line in `wcprof --help`."""

    name: str
    summary: str

    def run(self, argv: list[str]) -> int:
        return importlib.import_module(f"{__name__}.{self.name}").run(argv)


COMMANDS: dict[str, Command] = {c.name: c for c in (
    Command("profile", "boot the engine with the worst-case profiler and print the verdict (the "
                       "default command: `wcprof --model M` = `wcprof profile --model M`)"),
    Command("demo", "run a bundled scenario: tiny, scratch, overcommit, tile, decode, wide"),
    Command("check", "is a --kv-cache-memory-bytes value safe for the engine a saved report "
                     "describes?"),
    Command("diff", "CI gate: did worst-case memory get worse between two saved reports?"),
    Command("render", "re-render a saved report: the verdict screen, --html, --png, --json"),
    Command("gate", "CI gate: profile a file of configurations, fail when one got worse than "
                    "its baseline"),
    Command("advise", "the chunk advisor's table from a saved report (profile with --advise): KV "
                      "tokens vs prefill throughput per max_num_batched_tokens, and the knee"),
    Command("fit", "which max_model_len, max_num_batched_tokens and max_num_seqs fit with at "
                   "least N requests at full length (--min-concurrency N, --objective "
                   "context|concurrency|throughput), from one sweep at the largest limits"),
    Command("guard", "read a running `vllm serve --profiler worstcase`'s /metrics: did the "
                     "profile hold over the steps served so far? (exit 1 when a step exceeded "
                     "it)"),
    Command("cache", "list, export or import sweep-cache entries (a fleet shares one "
                     "measurement)"),
)}
"""The command table, in `wcprof --help`'s order (profile first: the default)."""

_debugging = False


def set_debugging(on: bool) -> None:
    """--debug or WCPROF_DEBUG=1, as cli.main read them."""
    global _debugging
    _debugging = on


def debugging() -> bool:
    """Whether errors show their traceback and --quiet's log tail is printed on failure."""
    return _debugging
