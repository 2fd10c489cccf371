"""`wcprof guard URL [--timeout S] [--ranks]`: a running `vllm serve --profiler worstcase`:
scrapes URL/metrics and says whether the profile held over the steps served so far.

Exit codes: 0 held (or no step yet); 1 a step exceeded the prediction; 2 the server cannot be
read or exports no guard metrics. Imports neither vLLM nor torch.
"""

from __future__ import annotations

import sys
import urllib.error
import urllib.request

from ..errors import ArgParser, ConfigError


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


def parser() -> ArgParser:
    """`wcprof guard`'s flags."""
    p = ArgParser(prog="wcprof guard", allow_abbrev=False,
                  description="read a running `vllm serve --profiler worstcase`'s /metrics "
                              "and say whether every served step stayed within the "
                              "prediction (exit 1 when one did not)")
    p.add_argument("url", metavar="URL", help="the server, e.g. http://127.0.0.1:8000 "
                                              "(/metrics is added when no path is given)")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds (default 10)")
    p.add_argument("--ranks", action="store_true", help="one line per rank as well")
    return p


def run(argv: list[str]) -> int:
    """wcprof guard URL: did the worst-case profile hold on a running server?"""
    from ..core.guard import parse_metrics, verdict
    from ..sizes import fmt_bytes

    ns = parser().parse_args(argv)
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
