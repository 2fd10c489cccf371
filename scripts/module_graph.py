#!/usr/bin/env python3
"""The package's import graph, read from the source (nothing is imported or run): one Mermaid
flowchart of its layers (cli, commands, plugin, adapter, render, core, shared), every arrow an
import of one module by another, and the checks docs/architecture.md states: the core imports
nothing outside itself but the shared leaves (CORE_MAY_IMPORT), nothing imports back up into the
CLI (cli.py, the entry point, is imported by nobody; commands/ only by cli.py and itself), and
no import cycle.

  python3 scripts/module_graph.py            # every module and import, as Mermaid
  python3 scripts/module_graph.py --layers   # the layers and the imports between them, counted
  python3 scripts/module_graph.py --check    # only the checks; exit 1 when one fails
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "worstcase_profiler"
CORE_MAY_IMPORT = {"sizes", "errors", "settings", "interrupts", "atomic_write"}  # vLLM- and torch-free leaves


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        if parts and parts[0] == "data":
            continue
        out[".".join(parts) or "__init__"] = path
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package modules `name` imports (module level and inside functions alike)."""
    pkg = name.split(".")[:-1] if path.name != "__init__.py" else name.split(".")
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets = []
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[: len(pkg) - (node.level - 1)] if node.level > 1 else pkg
                mod = ".".join([*base, node.module] if node.module else base)
            elif node.module and node.module.startswith("worstcase_profiler"):
                mod = node.module[len("worstcase_profiler"):].lstrip(".")
            else:
                continue
            targets = [f"{mod}.{a.name}" if mod else a.name for a in node.names] + [mod]
        elif isinstance(node, ast.Import):
            targets = [a.name[len("worstcase_profiler."):] for a in node.names
                       if a.name.startswith("worstcase_profiler.")]
        for t in targets:
            if t in known and t != name:
                found.add(t)
                break
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {n: imports(n, p, set(mods)) for n, p in mods.items()}


# the package's own top-level modules: the command line's (its entry point), the plugin's, and what
# all share (preflight.py among them: wcprof's commands, the plugin and `vllm serve`'s flag check
# use it); the commands themselves are commands/
COMMAND_LINE = {"cli", "vllm_cpu_dist_shim"}
ENTRY_POINT = "cli"  # the one module that may import commands/


def layer(name: str) -> str:
    head = name.split(".")[0]
    if head in ("core", "adapter", "render", "commands", "reporters"):
        return head
    if head in COMMAND_LINE:
        return "cli"
    return "plugin" if head == "plugin" else "shared"


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    seen, stack, out = set(), [], []

    def visit(n, on):
        if n in on:
            out.append(stack[stack.index(n):] + [n])
            return
        if n in seen:
            return
        seen.add(n)
        on.add(n)
        stack.append(n)
        for m in sorted(g.get(n, ())):
            visit(m, on)
        stack.pop()
        on.discard(n)

    for n in sorted(g):
        visit(n, set())
    return out


def problems(g: dict[str, set[str]]) -> list[str]:
    out = []
    for n, deps in sorted(g.items()):
        if layer(n) == "core":
            bad = [d for d in deps if layer(d) != "core" and d not in CORE_MAY_IMPORT]
            out += [f"core module {n} imports {d}" for d in sorted(bad)]
        if layer(n) != "commands" and n != ENTRY_POINT:
            out += [f"{n} imports {d}: only {ENTRY_POINT} imports commands/"
                    for d in sorted(deps) if layer(d) == "commands"]
        if ENTRY_POINT in deps:
            out.append(f"{n} imports {ENTRY_POINT}: nothing imports the entry point")
    out += [f"import cycle: {' -> '.join(c)}" for c in cycles(g)
            if not all(m.endswith("__init__") or m in ("core", "adapter", "render") for m in c)]
    return out


def mermaid(g: dict[str, set[str]]) -> str:
    ident = lambda n: n.replace(".", "_")  # noqa: E731
    lines = ["flowchart TB"]
    for lay in ("cli", "commands", "plugin", "reporters", "render", "adapter", "core", "shared"):
        names = sorted(n for n in g if layer(n) == lay and not n.endswith("__init__")
                       and n not in ("core", "adapter", "render", "commands", "reporters"))
        if not names:
            continue
        lines.append(f"  subgraph {lay}")
        lines += [f"    {ident(n)}[{n}]" for n in names]
        lines.append("  end")
    for n, deps in sorted(g.items()):
        for d in sorted(deps):
            if n.endswith("__init__") or d.endswith("__init__") or \
                    d in ("core", "adapter", "render", "commands", "reporters"):
                continue
            lines.append(f"  {ident(n)} --> {ident(d)}")
    return "\n".join(lines)


def layers(g: dict[str, set[str]]) -> str:
    """One box per layer (its modules and lines), one arrow per pair of layers that import each
    other, labelled with how many module imports it stands for."""
    mods = modules()
    size: dict[str, list[int]] = {}
    for n, path in mods.items():
        size.setdefault(layer(n), [0, 0])
        size[layer(n)][0] += 1
        size[layer(n)][1] += sum(1 for _ in path.open())
    count: dict[tuple[str, str], int] = {}
    for n, deps in g.items():
        for d in deps:
            if layer(n) != layer(d):
                count[(layer(n), layer(d))] = count.get((layer(n), layer(d)), 0) + 1
    lines = ["flowchart TB"]
    lines += [f"  {lay}[\"{lay}: {m} modules, {n:,} lines\"]" for lay, (m, n) in sorted(size.items())]
    lines += [f"  {a} -- {c} --> {b}" for (a, b), c in sorted(count.items())]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    g = graph()
    found = problems(g)
    if "--layers" in argv:
        print(layers(g))
    elif "--check" not in argv:
        print(mermaid(g))
    for p in found:
        print(p, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
