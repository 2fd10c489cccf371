"""The JSON report: the machine-readable artefact CI gates read back. Written atomically, so a
crash or full disk never leaves a half-written report that a later `wcprof diff` would trust."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from worstcase_profiler.atomic_write import write_atomically
from worstcase_profiler.errors import ConfigError
from worstcase_profiler.report import SCHEMA_VERSION, Report


class JsonReporter:
    def write(self, report: Report, dest: Any) -> None:
        """dest: a path (written atomically), an open text stream, or None / "-" for stdout."""
        emit_text(report.model_dump_json(indent=2) + "\n", dest)


def emit_text(text: str, dest: Any) -> None:
    """Text reporters' one way out: stdout for None / "-", a stream as is, a path atomically."""
    if dest is None or dest == "-":
        sys.stdout.write(text)
    elif hasattr(dest, "write"):
        dest.write(text)
    else:
        write_atomically(Path(dest), text)


def _major(version: str) -> str:
    return str(version).split(".", 1)[0]


def load_report(path: Any) -> Report:
    """Read a report written by JsonReporter. ConfigError if it is missing, not JSON, not a
    report, or from another major schema version."""
    path = Path(path)
    hint = "pass a file written by `wcprof --json PATH`"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read report {path}: {exc.strerror or exc}", hint=hint) from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not a wcprof report (not valid JSON: {exc.msg} at line "
                          f"{exc.lineno})", hint=hint) from exc
    if not isinstance(data, dict) or "schema_version" not in data:
        raise ConfigError(f"{path} is not a wcprof report (no schema_version)", hint=hint)
    found = data["schema_version"]
    if _major(found) != _major(SCHEMA_VERSION):
        raise ConfigError(
            f"{path} has report schema {found}; this wcprof reads schema {SCHEMA_VERSION}",
            hint="re-run the profile with this wcprof version, or read it with the wcprof "
                 "that wrote it")
    try:
        return Report.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"{path} is not a valid wcprof report: {where}: {first['msg']} "
                          f"({exc.error_count()} problem(s))", hint=hint) from exc
