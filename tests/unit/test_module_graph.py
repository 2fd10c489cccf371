"""scripts/module_graph.py: the core imports no adapter, CLI or render module (only the shared
leaves it is allowed), and the package has no import cycle; the checker catches both."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("module_graph", ROOT / "scripts" / "module_graph.py")
mg = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mg)


def test_the_package_keeps_its_layers_and_has_no_cycle():
    g = mg.graph()
    assert "core.budget" in g and "adapter.startup" in g
    assert mg.problems(g) == []


def test_a_core_module_importing_the_adapter_or_a_cycle_is_found():
    g = {"core.a": {"adapter.b", "sizes"}, "adapter.b": {"core.a"}, "sizes": set()}
    found = mg.problems(g)
    assert "core module core.a imports adapter.b" in found
    assert any(p.startswith("import cycle:") for p in found)
    assert mg.problems({"core.a": {"sizes", "errors"}, "sizes": set(), "errors": set()}) == []


def test_the_layers_picture_counts_imports_between_layers():
    text = mg.layers(mg.graph())
    assert text.startswith("flowchart TB") and "adapter -- " in text and "--> core" in text
    from_core = [l.strip() for l in text.splitlines() if l.strip().startswith("core --")]
    assert from_core and all(l.endswith("--> shared") for l in from_core), from_core
