"""staging/check_stack.py runs each check where it is declared (`check` calls it at once), so a
module-level helper a check calls must be defined above it (on the H200 the vllm check failed
with `NameError: name '_declared_but_absent' is not defined` when the helper sat below it)."""

from __future__ import annotations

import ast
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "staging" / "check_stack.py"


def test_every_helper_a_check_calls_is_defined_above_it():
    tree = ast.parse(SCRIPT.read_text())
    top = {n.name: n.lineno for n in tree.body if isinstance(n, ast.FunctionDef)}
    checks = [n for n in tree.body if isinstance(n, ast.FunctionDef) and any(
        isinstance(d, ast.Call) and getattr(d.func, "id", None) == "check"
        for d in n.decorator_list)]
    assert checks
    late = [(fn.name, call.func.id) for fn in checks for call in ast.walk(fn)
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
            and call.func.id in top and top[call.func.id] > fn.lineno]
    assert late == []
