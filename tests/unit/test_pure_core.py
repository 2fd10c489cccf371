"""The core modules must import without vLLM or torch: they run in the CLI, in CI gates and on
every rank before the engine exists."""

from __future__ import annotations

import subprocess
import sys

PURE_MODULES = ["worstcase_profiler.coverage", "worstcase_profiler.shapes",
                "worstcase_profiler.admission", "worstcase_profiler.render",
                "worstcase_profiler.render.json_report", "worstcase_profiler.render.terminal"]


def test_core_imports_neither_vllm_nor_torch():
    code = ("import sys\n"
            + "".join(f"import {m}\n" for m in PURE_MODULES)
            + "heavy = sorted(m for m in ('vllm', 'torch') if m in sys.modules)\n"
            + "assert not heavy, heavy\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
