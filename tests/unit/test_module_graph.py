"""scripts/module_graph.py: the core imports no adapter, CLI or render module (only the shared
leaves it is allowed), only cli.py imports commands/, nothing imports cli.py, and the package
has no import cycle; the checker catches each."""

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
    assert {mg.layer(n) for n in g if n.startswith("commands")} == {"commands"}
    assert "commands.profile" in g["cli"] or "commands" in g["cli"]


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


def test_an_import_of_a_command_or_of_the_entry_point_from_below_is_found():
    g = {"cli": {"commands.gate"}, "commands.gate": {"commands.diff", "errors"},
         "commands.diff": set(), "errors": set(), "adapter.x": {"commands.diff"},
         "render.y": {"cli"}}
    found = mg.problems(g)
    assert "adapter.x imports commands.diff: only cli imports commands/" in found
    assert "render.y imports cli: nothing imports the entry point" in found
    assert len(found) == 2  # cli -> commands and commands -> commands are the layout
