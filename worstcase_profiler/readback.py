"""Commands that read figures back without starting an engine.

  wcprof advise REPORT.json [--within PCT]   the chunk advisor's table from a saved report
                                             (written by `wcprof --advise --json` or a server
                                             whose settings had advise on); --within recomputes
                                             the knee from the saved rows with another X
  wcprof guard URL [--timeout S]             a running `vllm serve --profiler worstcase`:
                                             scrapes URL/metrics and says whether the profile
                                             held over the steps served so far

Exit codes: advise 0, or 2 for a report without advice; guard 0 held (or no step yet), 1 a step
exceeded the prediction, 2 the server cannot be read or exports no guard metrics.
Neither imports vLLM or torch.
"""

from __future__ import annotations

import argparse
import sys
import urllib.error
import urllib.request

from .errors import ConfigError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        raise ConfigError(f"{self.prog}: {message}", hint=f"see `{self.prog} --help`")


def advise_main(argv: list[str]) -> int:
    """wcprof advise REPORT.json [--within PCT]: the chunk advisor's table from a saved report"""
    from .core.advise import knee
    from .render import load_report
    from .render.terminal import render_advice
    from .settings import parse_within

    parser = _Parser(prog="wcprof advise", allow_abbrev=False,
                     description="the chunk advisor's table from a saved report (profile with "
                                 "`wcprof --advise --json REPORT.json`)")
    parser.add_argument("report", metavar="REPORT.json")
    parser.add_argument("--within", metavar="PCT", default=None,
                        help="recompute the knee: prefill throughput within PCT of the best "
                             "(default: the report's own, 5%% unless profiled otherwise)")
    ns = parser.parse_args(argv)
    report = load_report(ns.report)
    if report.advice is None:
        raise ConfigError(f"{ns.report} has no advice section",
                          hint="profile with `wcprof --advise --json REPORT.json` (or the "
                               "setting advise: true)")
    if ns.within is not None:
        within = parse_within(ns.within, "--within")
        advice = report.advice.model_copy(update={
            "within": within, "knee_chunk": knee(report.advice.candidates, within),
            "rule": report.advice.rule.replace(f"{report.advice.within:.0%}", f"{within:.0%}")})
        report = report.model_copy(update={"advice": advice})
    from rich.console import Console

    console = Console(soft_wrap=True)
    console.width = max(console.width, 110)  # the table's eight columns, piped or not
    render_advice(report, console)
    return 0


def metrics_url(url: str) -> str:
    """http://host:port -> http://host:port/metrics; a URL with a path is taken as it is."""
    text = url.strip()
    if "://" not in text:
        text = "http://" + text
    scheme, _, rest = text.partition("://")
    host, slash, path = rest.partition("/")
    if not path.strip("/"):
        return f"{scheme}://{host}/metrics"
    return text


def scrape(url: str, timeout: float = 10.0) -> str:
    target = metrics_url(url)
    try:
        with urllib.request.urlopen(target, timeout=timeout) as resp:  # noqa: S310 - operator's URL
            return resp.read().decode("utf-8", errors="replace")
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        raise ConfigError(f"cannot read {target}: {reason}",
                          hint="is the server up? pass its address, e.g. http://127.0.0.1:8000"
                          ) from None


def guard_main(argv: list[str]) -> int:
    """wcprof guard URL: did the worst-case profile hold on a running server?"""
    from .core.guard import parse_metrics, verdict
    from .sizes import fmt_bytes

    parser = _Parser(prog="wcprof guard", allow_abbrev=False,
                     description="read a running `vllm serve --profiler worstcase`'s /metrics "
                                 "and say whether every served step stayed within the "
                                 "prediction (exit 1 when one did not)")
    parser.add_argument("url", metavar="URL", help="the server, e.g. http://127.0.0.1:8000 "
                                                   "(/metrics is added when no path is given)")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds (default 10)")
    parser.add_argument("--ranks", action="store_true", help="one line per rank as well")
    ns = parser.parse_args(argv)
    figures = parse_metrics(scrape(ns.url, ns.timeout))
    if not figures:
        raise ConfigError(f"{metrics_url(ns.url)} exports no wcprof_guard_* metrics",
                          hint="start the server with `--profiler worstcase` (guard on: the "
                               "default under vllm serve) and one API server")
    held, line = verdict(figures)
    print(line)
    if ns.ranks or len(figures) > 1:
        for f in figures:
            print(f"  rank {f.rank} engine {f.engine}: {f.steps} steps, {f.above} above; largest "
                  f"{fmt_bytes(f.observed)} of predicted {fmt_bytes(f.predicted)}; KV headroom "
                  f"{fmt_bytes(f.headroom)}")
    sys.stdout.flush()
    return 0 if held else 1
