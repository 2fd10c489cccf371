"""One renderer per output format behind one interface. Renderers are imported lazily, so the
JSON path never pays for rich and the html/png renderers (matplotlib) stay optional."""

from __future__ import annotations

import importlib
from typing import Any, Protocol, runtime_checkable

from worstcase_profiler.errors import ConfigError
from worstcase_profiler.report import Report


@runtime_checkable
class Reporter(Protocol):
    def write(self, report: Report, dest: Any) -> None:
        """Write `report` to `dest`: a path, an open text stream, or None for stdout."""


# format name -> "module:attribute" of a zero-argument Reporter factory. Add a format with
# register_reporter("html", "worstcase_profiler.render.html:HtmlReporter").
REPORTERS: dict[str, str] = {
    "terminal": "worstcase_profiler.render.terminal:TerminalReporter",
    "json": "worstcase_profiler.render.json_report:JsonReporter",
    "html": "worstcase_profiler.render.html:HtmlReporter",
    "png": "worstcase_profiler.render.png:PngReporter",
}


def register_reporter(fmt: str, target: str) -> None:
    REPORTERS[fmt] = target


def get_reporter(fmt: str) -> Reporter:
    target = REPORTERS.get(fmt)
    if target is None:
        raise ConfigError(f"unknown report format {fmt!r}",
                          hint=f"use one of: {', '.join(sorted(REPORTERS))}")
    module_name, _, attr = target.partition(":")
    factory = getattr(importlib.import_module(module_name), attr)
    return factory()


def load_report(path: Any) -> Report:
    """Read a JSON report back (see render.json_report.load_report)."""
    from worstcase_profiler.render.json_report import load_report as _load

    return _load(path)
