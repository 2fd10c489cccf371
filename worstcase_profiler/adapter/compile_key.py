"""Which compile-cache key a compile made now gets (the compile-hash touch, adapter/patches.py):
stock's, unless the profiler is measuring. A module of its own, so that the budget hook's
wrapper (patches) and vLLM's profile inside it (startup) mark their phases without importing
each other."""

from __future__ import annotations

import contextlib

_APART: list[bool] = []  # the innermost compile_key_apart's flag; empty: stock's key


@contextlib.contextmanager
def compile_key_apart(apart: bool = True):
    """Inside `compile_key_apart()` (the profiler's own measuring) a compile vLLM makes is keyed
    with the profiler's section, apart from stock's cache; inside a nested
    `compile_key_apart(False)` (vLLM's own profile within the budget hook), and outside any,
    with stock's key. Same thread only: vLLM compiles on the thread that runs the forward."""
    _APART.append(apart)
    try:
        yield
    finally:
        _APART.pop()


def key_apart() -> bool:
    """True while the innermost compile_key_apart is the profiler's own."""
    return bool(_APART) and _APART[-1]
