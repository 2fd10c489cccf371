"""User-facing errors: each says what is wrong and what to do. The CLI prints them without a
traceback and exits non-zero; the plugin raises them inside the engine so start-up fails closed."""

from __future__ import annotations

import argparse
import errno as _errno


class WcprofError(Exception):
    """Base: a problem the operator can fix. `hint` says how."""

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message + (f"\n  -> {self.hint}" if self.hint else "")


class ConfigError(WcprofError):
    """Bad or contradictory flags / settings."""


class OutputError(WcprofError, OSError):
    """A file could not be written (a full disk, a read-only mount, permissions): the operator's
    to fix, so it names the path. Still an OSError, for callers that catch those."""

    def __init__(self, message: str, hint: str | None = None, errno: int | None = None):
        WcprofError.__init__(self, message, hint)
        self.errno = errno  # type: ignore[misc]

    @classmethod
    def writing(cls, path, error: OSError) -> "OutputError":
        import tempfile

        why = error.strerror or str(error)
        where = str(path)
        hint = "free space there, or choose another destination"
        if error.errno not in (_errno.ENOSPC, _errno.EDQUOT):
            hint = "choose a writable destination (check its permissions and whether it is a " \
                   "read-only mount)"
        if where.startswith(tempfile.gettempdir()):
            hint += "; wcprof's temporary files follow TMPDIR"
        found = cls(f"cannot write {where}: {why}", hint=hint, errno=error.errno)
        found.strerror, found.filename = error.strerror, where  # type: ignore[misc]
        return found


class DoesNotFit(WcprofError):
    """The configuration cannot serve even one request at max_model_len."""

    exit_code = 3


class UnsupportedModel(WcprofError):
    """The sweep cannot drive this model/runner/backend; we fail closed rather than fall back."""

    exit_code = 4


class KVOvercommit(WcprofError):
    """KV initialisation allocated more than the budget the worker returned."""

    exit_code = 5


class WorkspaceGrowth(WcprofError, AssertionError):
    """A locked workspace was asked to grow after warm-up."""


EXIT_INTERNAL = 70  # EX_SOFTWARE (sysexits.h): wcprof or vLLM failed, not the input

EXIT_CODES = {
    0: "a safe value was found: SAFE, or STOCK UNSAFE (vLLM's own figure would not hold; the "
       "recommended one does)",
    1: "the run finished but something measured is unsafe: --validate measured more than "
       "predicted (a --check-step step within the admitted figure only warns), or KV "
       "over-committed under --kv-audit warn; for check/diff/gate/guard: the gate failed",
    2: "bad input or a host problem you can fix: a flag, a setting, a path, a model without "
       "weights, vLLM refusing the configuration, a full disk",
    3: "does not fit: after the worst step not even one request at max_model_len fits, or the "
       "given --kv-cache-memory-bytes is outside what fits; for fit: no candidate holds "
       "--min-concurrency requests at full length",
    4: "unsupported model: an architecture this vLLM lacks, or one the sweep cannot drive",
    5: "KV over-commit: KV initialisation allocated more than the budget (start refused)",
    70: "internal error: not your input; rerun with --debug and report it",
    130: "interrupted (Ctrl-C)",
}
"""wcprof's exit codes (each error class above carries its own as `exit_code`); `wcprof
--help`, the README and docs/faq.md's table say the same."""

EXIT_INTERRUPTED = 130

INTERRUPTED_LINE = "wcprof: interrupted"


def exception_chain(e: BaseException, *, context: bool) -> list[BaseException]:
    """`e` and what it was raised from (`__cause__`), and with `context` also what it was raised
    while handling (`__context__`); each once."""
    chain: list[BaseException] = []
    cause: BaseException | None = e
    while cause is not None and all(cause is not c for c in chain):
        chain.append(cause)
        cause = cause.__cause__ or (cause.__context__ if context else None)
    return chain


def first_line(exc: BaseException) -> str:
    """An error's message in one line of at most 500 characters (pydantic's errors named by the
    flag each came from)."""
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


class ArgParser(argparse.ArgumentParser):
    """argparse that raises ConfigError (exit 2, one line, a hint to --help) instead of printing
    its usage. `name_prog`: the message starts with the prog ("wcprof check: ...")."""

    name_prog = True

    def error(self, message: str):  # type: ignore[override]
        raise ConfigError(f"{self.prog}: {message}" if self.name_prog else message,
                          hint=f"see `{self.prog} --help`")
