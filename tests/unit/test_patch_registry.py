"""The patch registry (adapter/patches.py REGISTRY) is the truth about how the profiler touches
vLLM: every function in the adapter that touches vLLM carries a `# vllm-touch: NAME` marker
naming a registry entry, and every entry is used by at least one marker.

A function touches vLLM when it imports from vllm, reads or calls a private attribute
(`x._name`) of anything but itself, assigns an attribute of anything but itself, or calls
setattr/delattr. The check is by the source's syntax tree, so a new touch without a marker (or a
marker without an entry) fails here."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from worstcase_profiler.adapter.patches import INSTALLERS, REGISTRY

ADAPTER = Path(__file__).resolve().parents[2] / "worstcase_profiler" / "adapter"
MARKER = re.compile(r"#\s*vllm-touch:\s*([a-z0-9-]+)")
OWN = {"self", "cls", "session"}  # the profiler's own objects


def _touches(fn: ast.AST) -> list[str]:
    why = []
    for node in ast.walk(fn):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("vllm"):
            why.append(f"imports {node.module}")
        elif isinstance(node, ast.Import) and any(a.name.startswith("vllm") for a in node.names):
            why.append("imports vllm")
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") \
                and not node.attr.startswith("__") and not node.attr.startswith("_wcprof") \
                and not (isinstance(node.value, ast.Name) and node.value.id in OWN):
            why.append(f"private .{node.attr}")
        elif isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for sub in ast.walk(t):
                    if isinstance(sub, ast.Attribute) and not (
                            isinstance(sub.value, ast.Name) and sub.value.id in OWN):
                        why.append(f"writes .{sub.attr}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("setattr", "delattr"):
            why.append(node.func.id)
    return why


def _functions():
    for path in sorted(ADAPTER.glob("*.py")):
        source = path.read_text()
        lines = source.splitlines()
        tree = ast.parse(source)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                # only the function's own body: nested functions are checked on their own
                own = [n for n in node.body]
                body_lines = lines[node.lineno - 1:node.end_lineno]
                yield path.name, node, own, body_lines


def _markers() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted(ADAPTER.glob("*.py")):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            for name in MARKER.findall(line):
                found.setdefault(name, []).append(f"{path.name}:{i}")
    return found


def test_every_touch_of_vllm_is_marked():
    unmarked = []
    for fname, fn, body, lines in _functions():
        module = ast.Module(body=body, type_ignores=[])
        nested = {id(n) for n in ast.walk(module)
                  if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))}
        why = [w for stmt in body if not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef))
               for w in _touches(stmt)]
        if why and not any(MARKER.search(line) for line in lines):
            unmarked.append(f"{fname}:{fn.lineno} {fn.name}: {', '.join(sorted(set(why)))[:120]}")
        del nested
    assert not unmarked, "touches of vLLM without a `# vllm-touch: NAME` marker:\n" + "\n".join(unmarked)


def test_markers_and_registry_agree():
    names = {t.name for t in REGISTRY}
    assert len(names) == len(REGISTRY), "duplicate registry names"
    markers = _markers()
    unknown = {m: where for m, where in markers.items() if m not in names}
    unused = names - set(markers)
    assert not unknown, f"markers naming no registry entry: {unknown}"
    assert not unused, f"registry entries no code marks: {sorted(unused)}"


def test_every_entry_says_what_why_and_versions():
    for t in REGISTRY:
        assert t.kind in ("class-wrap", "instance-swap", "private-read", "private-write",
                          "config-pin"), t
        assert t.target and len(t.why) > 20 and t.run and t.read, t
    assert set(INSTALLERS) == {t.name for t in REGISTRY if t.kind == "class-wrap"}
