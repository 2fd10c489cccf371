"""The picture as a PNG (see render/picture.py for what it shows). Written atomically."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from worstcase_profiler.atomic_write import write_atomically
from worstcase_profiler.render.picture import figure_bytes
from worstcase_profiler.report import Report


class PngReporter:
    def write(self, report: Report, dest: Any) -> None:
        """dest: a path (written atomically), a binary stream, or None / "-" for stdout."""
        data = figure_bytes(report, "png")
        if dest is None or dest == "-":
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
        elif hasattr(dest, "write"):
            dest.write(data)
        else:
            write_atomically(Path(dest), data)
