"""User-facing errors: each says what is wrong and what to do. The CLI prints them without a
traceback and exits non-zero; the plugin raises them inside the engine so start-up fails closed."""

from __future__ import annotations

import argparse


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
