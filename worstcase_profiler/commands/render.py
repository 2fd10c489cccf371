"""`wcprof render REPORT.json [--terminal] [--html P] [--png P] [--json P]`: re-render a saved
report (from `wcprof --json` or `vllm serve --profiler-report`), without an engine."""

from __future__ import annotations

import sys

from .profile_options import UnprefixedArgParser


def parser() -> UnprefixedArgParser:
    """`wcprof render`'s flags."""
    p = UnprefixedArgParser(prog="wcprof render", allow_abbrev=False,
                            description="re-render a saved report (written by `wcprof --json` or "
                                        "`vllm serve --profiler-report`)")
    p.add_argument("report", metavar="REPORT.json")
    p.add_argument("--terminal", action="store_true",
                   help="print the verdict screen (the default when no file is asked for)")
    p.add_argument("--html", metavar="PATH", help="write the self-contained HTML picture")
    p.add_argument("--png", metavar="PATH", help="write the picture as PNG")
    p.add_argument("--json", metavar="PATH", help="write the report as JSON again")
    return p


def run(argv: list[str]) -> int:
    """wcprof render REPORT.json [--terminal] [--html P] [--png P] [--json P]

    Re-render a saved report (from `wcprof --json` or `vllm serve --profiler-report`). Without
    an output flag it prints the verdict screen. Exit 0 when everything was written, 2 on bad
    input (a missing or foreign report, an unwritable destination)."""
    from .. import preflight

    ns = parser().parse_args(argv)
    dests = {fmt: getattr(ns, fmt) for fmt in ("html", "png", "json") if getattr(ns, fmt)}
    preflight.check_outputs({f"--{fmt}": dest for fmt, dest in dests.items()})
    preflight.check_picture_support({"--html": ns.html, "--png": ns.png})
    from ..render import get_reporter, load_report

    report = load_report(ns.report)
    if ns.terminal or not dests:
        get_reporter("terminal").write(report, sys.stdout)
        sys.stdout.flush()
    for fmt, dest in dests.items():
        get_reporter(fmt).write(report, dest)
        if dest != "-":
            sys.stderr.write(f"wrote {dest}\n")
    return 0
