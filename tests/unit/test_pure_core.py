"""The core must import without vLLM or torch (it runs in the CLI, in CI gates and on every rank
before the engine exists), and without the report schema: the core decides in its own frozen
values, and only report.py maps them onto the public schema."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import worstcase_profiler.core as core

CORE = sorted(f"worstcase_profiler.core.{m.name}" for m in pkgutil.iter_modules(core.__path__))
RENDER = ["worstcase_profiler.render", "worstcase_profiler.render.json_report",
          "worstcase_profiler.render.terminal", "worstcase_profiler.render.view",
          "worstcase_profiler.commands.check", "worstcase_profiler.commands.diff"]


def _imported_after(modules: list[str]) -> set[str]:
    code = ("import sys\n" + "".join(f"import {m}\n" for m in modules)
            + "print(' '.join(sorted(sys.modules)))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return set(out.stdout.split())


def test_core_imports_neither_vllm_nor_torch_nor_the_report_schema():
    assert {"worstcase_profiler.core.admission", "worstcase_profiler.core.audits",
            "worstcase_profiler.core.cache_trust", "worstcase_profiler.core.replay_rules",
            "worstcase_profiler.core.sweep", "worstcase_profiler.core.sweep_depth"} <= set(CORE)
    loaded = _imported_after(CORE)
    heavy = {m for m in loaded if m.split(".")[0] in ("vllm", "torch", "pydantic")}
    assert not heavy, sorted(heavy)[:5]
    assert "worstcase_profiler.report" not in loaded
    assert not any(m.startswith("worstcase_profiler.adapter") for m in loaded)


def test_reports_and_renderers_import_neither_vllm_nor_torch():
    loaded = _imported_after(RENDER)
    assert not {m for m in loaded if m.split(".")[0] in ("vllm", "torch")}
