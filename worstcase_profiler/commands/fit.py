"""`wcprof fit [--model M] [ENGINE ARGS] [--min-concurrency N] [--objective OBJ]`: which
max_model_len, max_num_batched_tokens and max_num_seqs (and gpu_memory_utilization) fit this
device with the worst step inside the budget and at least N requests at full length at once.

One engine starts, at the largest limits allowed: the engine flags given (--max-model-len,
--max-num-batched-tokens, --max-num-seqs are upper bounds; --kv-cache-memory-bytes, when given,
is the KV size every candidate holds), and on CUDA without --gpu-memory-utilization the share of
the device that is free now (core/fit.share_of). It runs the sweep once, the chunk advisor, and
the fit's own few steps (settings advise, fit, fit_min_concurrency, fit_objective); the report's
fit section (core/fit.py: how every candidate is derived, and how a figure between measured points
is bounded) is printed: the recommended flags first, then the trade-off table. --json, --html and
--png write the report as the profile command writes it, the picture with the frontier drawn.

Exit codes: 0 with a recommendation; 3 when no candidate holds N requests at full length (the
line names the most any holds); 2 for bad input (--min-concurrency below 1 or above
--max-num-seqs, --validate); the others as the profile command's (errors.EXIT_CODES).
"""

from __future__ import annotations

import sys
from pathlib import Path

from .. import interrupts
from ..errors import (EXIT_INTERRUPTED, INTERRUPTED_LINE, ArgParser, ConfigError, DoesNotFit,
                      WcprofError)
from .engine_boot import engine_output
from .profile_options import dashes

OBJECTIVES = ("context", "concurrency", "throughput")

FIT_HELP = """usage: wcprof fit [--model M] [ENGINE ARGS] [--min-concurrency N]
                  [--objective context|concurrency|throughput] [--json P] [--html P]
                  [--png P] [profile options]

What fits on this device, safely: max_model_len, max_num_batched_tokens and max_num_seqs (and,
on CUDA, gpu_memory_utilization up to what the device has free) whose worst step fits and whose
KV cache holds at least N requests at full length at once, from one sweep at the largest limits
the engine flags allow. Prints the recommended flags, then the trade-off frontier; --html and
--png draw the frontier below the profile's picture.

fit options:
  --min-concurrency N   requests at full length the KV cache must hold at once (default 1)
  --objective OBJ       context: the longest max_model_len (default); concurrency: the most
                        requests at the given --max-model-len; throughput: the fastest prefill
                        there
  every profile option (`wcprof --help`) and vLLM engine flag (`wcprof --help-engine`) applies;
  --max-model-len, --max-num-batched-tokens and --max-num-seqs are the largest weighed

exit codes: 0 a recommendation; 3 none holds N requests; 2 bad input (see `wcprof --help`)

how each candidate is bounded: docs/fit.md
"""


def parser() -> ArgParser:
    """`wcprof fit`'s own flags (the rest are profile's and vLLM's)."""
    p = ArgParser(prog="wcprof fit", add_help=False, allow_abbrev=False)
    p.add_argument("--min-concurrency", default="1")
    p.add_argument("--objective", choices=OBJECTIVES, default="context")
    return p


def run(argv: list[str]) -> int:
    """wcprof fit [ENGINE ARGS] [--min-concurrency N] [--objective OBJ]"""
    if any(a in ("-h", "--help") for a in argv):
        sys.stdout.write(FIT_HELP)
        return 0
    from ..settings import parse_concurrency
    from . import profile

    ns, rest = parser().parse_known_args(dashes(argv))
    n = parse_concurrency(ns.min_concurrency, "--min-concurrency")
    if any(a == "--validate" or a.startswith("--validate=") for a in rest):
        raise ConfigError("wcprof fit validates nothing: its engine runs the largest limits, not "
                          "the fitted ones",
                          hint="start the recommended flags with `wcprof ... --validate`")
    given = {a.partition("=")[0] for a in rest if a.startswith("--")}
    if "--advise" not in given:
        rest = [*rest, "--advise"]
    argv, ours, sizes, advice = profile.prepare(rest)
    section = {**advice, "fit": True, "fit_min_concurrency": n, "fit_objective": ns.objective}

    def tune(engine_args, platform) -> None:
        seqs = getattr(engine_args, "max_num_seqs", None)
        if seqs is not None and n > int(seqs):
            raise ConfigError(f"--min-concurrency {n} is above --max-num-seqs {seqs}: no "
                              f"candidate runs {n} requests at once",
                              hint=f"raise --max-num-seqs to at least {n}, or lower "
                                   f"--min-concurrency")
        if "--gpu-memory-utilization" not in given and "--model" in given \
                and platform.is_cuda_alike():
            engine_args.gpu_memory_utilization = _device_share()

    with interrupts.exit_at_once(INTERRUPTED_LINE, EXIT_INTERRUPTED), \
            interrupts.temporary_directory("wcprof-") as tmp:
        report = _fit(argv, ours, sizes, section, tmp, tune)
    return _emit(report, ours, n)


def _device_share() -> float:
    """What the device has free now, as a share (core/fit.share_of)."""
    import torch

    from ..core.fit import share_of

    free, total = torch.cuda.mem_get_info()
    return share_of(int(free), int(total))


def _fit(argv: list[str], ours, sizes: dict, section: dict, tmp: Path, tune):
    """The engine's report (its fit section), also when the swept configuration itself was
    refused after the profile (the profiler's DOES NOT FIT, or vLLM's own check that one request
    at max_model_len fits the KV cache): a shorter one may still fit, and the report with the fit
    was written before either refusal."""
    from rich.console import Console

    from ..render.json_report import load_report
    from . import profile

    log_path = tmp / "engine.log" if ours.quiet else None
    try:
        with engine_output(log_path):
            _, llm, report, _ = profile.start(argv, sizes, section, tmp, profile.status_of(ours),
                                              tune)
            del llm
    except WcprofError as e:
        profile.show_log_tail(log_path)
        path = tmp / "report.json"
        report = load_report(path) if path.exists() else None
        if report is None or report.fit is None:
            raise
        Console(stderr=True, soft_wrap=True).print(
            f"wcprof fit: the swept configuration itself did not start ({e.message}); the fit "
            f"below was measured before that", style="yellow", highlight=False)
    except BaseException:
        profile.show_log_tail(log_path)
        raise
    return report


def _emit(report, ours, n: int) -> int:
    from rich.console import Console

    from ..render import get_reporter
    from ..render.terminal import render_fit
    from ..render.view import fit_headline

    if report.fit is None:
        raise WcprofError("the engine started but its report has no fit section: measuring the "
                          "candidates failed",
                          hint="rerun with --debug: vLLM's log says why ([wcprof] fit: ...)")
    if report.fit.min_concurrency != n:
        raise WcprofError(f"the report's fit holds {report.fit.min_concurrency} request(s), not "
                          f"{n}: a setting overrode --min-concurrency",
                          hint="drop fit_min_concurrency from WCPROF_CONFIG / "
                               "--additional-config")
    if n > report.config.max_num_seqs:
        raise ConfigError(f"--min-concurrency {n} is above max_num_seqs "
                          f"{report.config.max_num_seqs}: no candidate runs {n} requests at once",
                          hint=f"pass --max-num-seqs {n} or more")
    console = Console(soft_wrap=True)
    console.width = max(console.width, 120)  # the table's nine columns, piped or not
    render_fit(report, console)
    for fmt in ("json", "html", "png"):
        dest = getattr(ours, fmt, None)
        if dest:
            get_reporter(fmt).write(report, dest)
    sys.stdout.flush()
    if report.fit.recommended is None:
        hint = ("lower --min-concurrency, give the engine more memory, or try a smaller "
                "--max-num-batched-tokens")
        if report.fit.objective != "context":
            hint = "--objective context finds the longest max_model_len that does; or " + hint
        raise DoesNotFit(fit_headline(report.fit).removeprefix("fit: "), hint=hint)
    return 0
