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


class ArgParser(argparse.ArgumentParser):
    """argparse that raises ConfigError (exit 2, one line, a hint to --help) instead of printing
    its usage. `name_prog`: the message starts with the prog ("wcprof check: ...")."""

    name_prog = True

    def error(self, message: str):  # type: ignore[override]
        raise ConfigError(f"{self.prog}: {message}" if self.name_prog else message,
                          hint=f"see `{self.prog} --help`")
