"""`wcprof advise REPORT.json [--within PCT] [--against R.json ...]`: the chunk advisor's table
from a saved report (written by `wcprof --advise --json` or a server whose settings had advise
on); --within recomputes the knee from the saved rows with another X.

--against holds the advice against reports of engines really started with an advised chunk:
each one's KV budget within --tolerance (1%) of what the advisor said; where both were started
with the same explicit --kv-cache-memory-bytes, the KV tokens admitted and whether it fits,
exactly (the budget then only says how much room the explicit size leaves, and on the CPU that
follows resident memory).

Exit codes: 0; 1 when an --against report admitted more than --tolerance away from the advice;
2 for a report without advice (or an --against chunk it has no row for). Imports neither vLLM
nor torch.
"""

from __future__ import annotations

import dataclasses

from ..errors import ArgParser, ConfigError


def parser() -> ArgParser:
    """`wcprof advise`'s flags."""
    p = ArgParser(prog="wcprof advise", allow_abbrev=False,
                  description="the chunk advisor's table from a saved report (profile with "
                              "`wcprof --advise --json REPORT.json`)")
    p.add_argument("report", metavar="REPORT.json")
    p.add_argument("--within", metavar="PCT", default=None,
                   help="recompute the knee: prefill throughput within PCT of the best "
                        "(default: the report's own, 5%% unless profiled otherwise)")
    p.add_argument("--against", metavar="R.json", nargs="+", default=(),
                   help="reports of engines started with an advised chunk (same model and "
                        "limits otherwise): is each one's KV budget what the advice said?")
    p.add_argument("--tolerance", metavar="PCT", default="1%",
                   help="how far an --against budget may be from the advice (default 1%%)")
    return p


def run(argv: list[str]) -> int:
    """wcprof advise REPORT.json [--within PCT]: the chunk advisor's table from a saved report"""
    from ..core.advise import RULE, knee
    from ..render import load_report
    from ..render.terminal import render_advice
    from ..settings import parse_within

    ns = parser().parse_args(argv)
    report = load_report(ns.report)
    if report.advice is None:
        raise ConfigError(f"{ns.report} has no advice section",
                          hint="profile with `wcprof --advise --json REPORT.json` (or the "
                               "setting advise: true)")
    if ns.within is not None:
        within = parse_within(ns.within, "--within")
        advice = dataclasses.replace(
            report.advice, within=within, knee_chunk=knee(report.advice.candidates, within),
            rule=RULE.format(within=within))
        report = report.model_copy(update={"advice": advice})
    from rich.console import Console

    console = Console(soft_wrap=True)
    console.width = max(console.width, 110)  # the table's eight columns, piped or not
    render_advice(report, console)
    if not ns.against:
        return 0
    tolerance = parse_within(ns.tolerance, "--tolerance")
    return 0 if all(_check_against(report, load_report(path), path, tolerance)
                    for path in list(ns.against)) else 1


def _check_against(report, other, path: str, tolerance: float) -> bool:
    """One line: the advisor's row for `other`'s chunk against what `other` admitted."""
    from ..sizes import fmt_bytes, fmt_tokens

    advice = report.advice
    chunk = other.config.max_num_batched_tokens
    row = advice.candidate(chunk)
    if row is None:
        raise ConfigError(f"{path}: max_num_batched_tokens={chunk} is not among the advised "
                          f"chunks ({', '.join(str(c.chunk) for c in advice.candidates)})",
                          hint="pass --advise-chunk N when profiling to advise that chunk")
    explicit = other.admission.explicit_kv_cache_memory_bytes
    if explicit is not None and explicit == report.admission.explicit_kv_cache_memory_bytes:
        fits = lambda yes: "fits" if yes else "does not fit"  # noqa: E731
        got = other.admission
        ok = row.fits == got.fits and row.kv_tokens == got.kv_tokens_worstcase
        print(f"chunk {fmt_tokens(chunk)}: under the same --kv-cache-memory-bytes {explicit} the "
              f"advisor said {fmt_tokens(row.kv_tokens)} KV tokens ({fits(row.fits)}), the engine "
              f"admitted {fmt_tokens(got.kv_tokens_worstcase)} ({fits(got.fits)}): "
              f"{'ok' if ok else 'OFF'} (room left: advised {fmt_bytes(row.budget_bytes)}, "
              f"engine {fmt_bytes(got.budget_bytes)}) ({path})")
        return ok
    got = other.admission.budget_bytes
    ratio = row.budget_bytes / got if got else float("inf")
    ok = abs(ratio - 1) <= tolerance
    print(f"chunk {fmt_tokens(chunk)}: advised KV budget {fmt_bytes(row.budget_bytes)} "
          f"({fmt_tokens(row.kv_tokens)} tokens), the engine admitted {fmt_bytes(got)} "
          f"({fmt_tokens(other.admission.kv_tokens_worstcase)} tokens): ratio {ratio:.4f} "
          f"{'ok' if ok else f'OFF by more than {tolerance:.0%}'} ({path})")
    return ok
