"""wcprof's own profile flags (--json, --validate, --margin, ...), read twice: before vLLM loads
by the light parser (preflight's checks, `wcprof --help`), and beside vLLM's engine flags by
engine_boot's parser. vLLM's spelling rules apply to both: --max_model_len is --max-model-len.
"""

from __future__ import annotations

import argparse

from ..errors import ArgParser, ConfigError


HELP_ENGINE = "--help-engine"

DEBUG_ENV = "WCPROF_DEBUG"


class UnprefixedArgParser(ArgParser):
    """wcprof's own flags (and `wcprof render`'s): the message without the prog (it is the
    whole command)."""

    name_prog = False


def profiler_flag(value: str) -> str:
    if value == "worstcase":
        return value
    if value == "default":
        raise ConfigError("wcprof always runs the worst-case profiler; drop --profiler default",
                          hint="the report's 'stock' column is vLLM's default profile, measured "
                               "in the same run")
    raise ConfigError(f"unknown --profiler {value!r}",
                      hint="wcprof always runs the worst-case profiler; drop --profiler")


def _profiler_report_flag(value: str) -> str:
    raise ConfigError("--profiler-report is a `vllm serve` flag",
                      hint=f"wcprof writes the report with --json {value}")


def add_profile_flags(p, title: str = "wcprof") -> None:
    g = p.add_argument_group(title)
    g.add_argument("--json", metavar="PATH",
                   help="write the report as JSON, atomically (`wcprof render/check/diff` read it)")
    g.add_argument("--html", metavar="PATH",
                   help="write the picture as one self-contained HTML file (needs matplotlib)")
    g.add_argument("--png", metavar="PATH", help="write the picture as PNG (needs matplotlib)")
    g.add_argument("--validate", nargs="?", const="all", default=None,
                   choices=("all", "worst", "quick", "traffic"),
                   help="serve real requests and report the measured peak against the "
                        "prediction (exit 1 when it exceeds it by more than the meter resolves: "
                        "512 KiB on the CPU, 1 MiB on CUDA; a --check-step step within the "
                        "admitted figure only warns): `worst` builds the report's own "
                        "worst step from requests, `quick` its rows and requests at the "
                        "shortest context within a few steps (where `worst` would wait "
                        "hundreds), `traffic` a generic workload, `all` worst and traffic "
                        "(the default when given alone). A worst/quick replay runs until the "
                        "scheduler has built its step and one request has finished; with "
                        "WCPROF_REPLAY_STOP=formed it stops as soon as the step is built "
                        "(faster, and its requests never reach their full context: for an "
                        "engine that fails near max_model_len)")
    g.add_argument("--check-step", metavar="ROWS@CONTEXT", action="append", default=None,
                   help="also measure this step on its own: one request of ROWS new tokens on "
                        "CONTEXT cached ones (e.g. 4096@149760, the step an engine died on); it "
                        "counts in the worst case, and --validate worst/all builds it from real "
                        "requests against its own reading (repeatable)")
    g.add_argument("--exhaustive", action="store_true",
                   help="execute every rows value 1..max_num_batched_tokens instead of "
                        "certifying segments by chord (slower)")
    g.add_argument("--sweep-depth", choices=("auto", "full", "cut-down", "self-check", "prove"),
                   default=None,
                   help="cut-down: every shape on one decoder layer of each kind (or the prefix "
                        "its family's proof cut to), the worst confirmed on the full model (cost "
                        "independent of depth); self-check: "
                        "cut-down, then a sample of every shape class confirmed on the full "
                        "model too, the full sweep where one disagrees; full: every shape on "
                        "the whole model; prove: both, the full one admitted, and the report "
                        "says whether the cut-down one agreed; auto: self-check on CUDA (a "
                        "compiled forward: what compiling adds sampled in each graph vLLM "
                        "compiles by batch size), full elsewhere (default: auto)")
    g.add_argument("--margin", metavar="SIZE", default=None,
                   help="safety margin subtracted from the KV budget, bytes or a unit such as "
                        "256MiB (default: 64MiB)")
    g.add_argument("--kv-audit", choices=("error", "warn", "off"), default=None,
                   help="when KV initialisation allocates more than its budget: error refuses "
                        "(exit 5), warn records it in the report, off skips the audit "
                        "(default: error)")
    g.add_argument("--no-lock-workspace", action="store_true",
                   help="leave vLLM's WorkspaceManager unlocked after warm-up (default: locked, "
                        "so later growth is a named error instead of an OOM)")
    g.add_argument("--kv-cap", metavar="SIZE", default=None,
                   help="KV actually allocated by this run (default: the full budget on GPU, "
                        "512MiB on CPU); the report always states the full budget")
    g.add_argument("--advise", action="store_true",
                   help="also run the chunk advisor: for max_num_batched_tokens = 256, 512, ... "
                        "up to the configured one, the worst-case need, the KV it admits and "
                        "prefill tokens/s at long context, and the knee (docs/advise.md)")
    g.add_argument("--advise-chunk", metavar="N", action="append", default=None,
                   help="one more candidate chunk for --advise (repeatable; implies --advise)")
    g.add_argument("--advise-within", metavar="PCT", default=None,
                   help="the knee keeps prefill throughput within PCT of the best candidate's "
                        "(default: 5%%)")
    g.add_argument("--no-cache", action="store_true",
                   help="always run the full sweep (default: reuse a cached sweep of this exact "
                        "model/limits/kernels/device after replaying its worst step)")
    g.add_argument("--quiet", action="store_true",
                   help="print only the verdict: vLLM's logs, warnings and progress go to a "
                        "temporary log (its last lines are shown on failure with --debug)")
    g.add_argument("--debug", action="store_true",
                   help="on any error, show the traceback (and, with --quiet, vLLM's log); "
                        f"also {DEBUG_ENV}=1")
    g.add_argument("--profiler", type=profiler_flag, default=None, help=argparse.SUPPRESS)
    g.add_argument("--profiler-report", type=_profiler_report_flag, default=None,
                   help=argparse.SUPPRESS)


def light_parser() -> UnprefixedArgParser:
    """wcprof's flags plus the engine flags preflight reads; everything else passes through."""
    p = UnprefixedArgParser(prog="wcprof", add_help=False, allow_abbrev=False)
    add_profile_flags(p)
    p.add_argument("--model", default=None)
    p.add_argument("--kv-cache-memory-bytes", default=None)
    p.add_argument("--max-num-batched-tokens", default=None)
    p.add_argument("--additional-config", default=None)
    p.add_argument("--load-format", default=None)
    return p


_VALUED = ("--json", "--html", "--png", "--margin", "--kv-cap", "--model",
           "--kv-cache-memory-bytes", "--advise-chunk", "--advise-within",
           "--max-num-batched-tokens", "--additional-config", "--load-format", "--check-step")


def dashes(argv: list[str]) -> list[str]:
    """vLLM accepts --max_model_len for --max-model-len; read ours the same way. A value that
    starts with a dash (--margin -5MiB) stays the flag's value, so preflight can say what is
    wrong with it instead of argparse's "expected one argument"."""
    out: list[str] = []
    for a in argv:
        if a.startswith("--"):
            name, eq, value = a.partition("=")
            a = name.replace("_", "-") + eq + value
        if out and out[-1] in _VALUED and a[:1] == "-" and a[1:2].isdigit():
            out[-1] = f"{out[-1]}={a}"
            continue
        out.append(a)
    return out


def with_flag_value(argv: list[str], flag: str, value: str) -> list[str]:
    """argv with every value of `flag` (`--flag V`, `--flag=V`, `--flag_name V`) replaced."""
    out = dashes(argv)
    for i, a in enumerate(out):
        if a == flag and i + 1 < len(out):
            out[i + 1] = value
        elif a.startswith(flag + "="):
            out[i] = f"{flag}={value}"
    return out


def parse_ours(argv: list[str]) -> argparse.Namespace:
    ns, _engine = light_parser().parse_known_args(dashes(argv))
    return ns
