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


def test_gc_frozen_nests_and_never_undoes_someone_elses_freeze():
    import gc

    from worstcase_profiler.meters import gc_frozen

    assert gc.get_freeze_count() == 0
    with gc_frozen():
        outer = gc.get_freeze_count()
        assert outer > 0
        with gc_frozen():
            pass
        assert gc.get_freeze_count() == outer  # the inner exit did not unfreeze the outer
    assert gc.get_freeze_count() == 0
    gc.freeze()  # someone froze part of the heap before us
    try:
        theirs = gc.get_freeze_count()
        made_since = [[] for _ in range(1000)]
        with gc_frozen():
            assert gc.get_freeze_count() >= theirs + len(made_since)  # frozen all the same
        assert gc.get_freeze_count() >= theirs  # theirs is not undone
    finally:
        gc.unfreeze()


class _Node:
    def __init__(self):
        self.me = self  # a cycle: only the collector frees it


def test_gc_frozen_keeps_old_garbage_and_collects_new():
    import gc
    import weakref

    from worstcase_profiler.meters import gc_frozen

    ref = weakref.ref(_Node())
    with gc_frozen():
        gc.collect()
        assert ref() is not None  # frozen garbage survives a full collection
        young = weakref.ref(_Node())
        gc.collect()
        assert young() is None  # garbage made while frozen is collected
    gc.collect()
    assert ref() is None  # and the old garbage after unfreeze
