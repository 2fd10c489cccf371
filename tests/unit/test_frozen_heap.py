"""The frozen heap that keeps garbage collection off the start-up path (meters.gc_frozen, and the
adapter's freeze around vLLM's own profile): what stays frozen, what is still collected, and that
a freeze made by someone else, before or inside vLLM's profile, neither disables ours nor is
undone by it."""

from __future__ import annotations

import contextlib
import gc
import weakref

from worstcase_profiler.adapter.meters import gc_frozen
from worstcase_profiler.adapter.startup import profile_on_frozen_heap
from worstcase_profiler.core.timing import PhaseTimer


def _frozen(obj) -> bool:
    """In the permanent generation: gc.get_objects() walks only the collected generations. (A
    freeze count is no witness: frozen objects that refcounting frees leave it, as two did in a
    fresh clone's run.)"""
    return gc.is_tracked(obj) and not any(o is obj for o in gc.get_objects())


def test_gc_frozen_nests_and_never_undoes_someone_elses_freeze():
    assert gc.get_freeze_count() == 0
    sentinel: list = []  # a container the collector tracks, alive throughout
    assert not _frozen(sentinel)
    with gc_frozen():
        assert gc.get_freeze_count() > 0 and _frozen(sentinel)
        with gc_frozen():
            pass
        assert _frozen(sentinel)  # the inner exit did not unfreeze the outer
    assert gc.get_freeze_count() == 0 and not _frozen(sentinel)
    gc.freeze()  # someone froze part of the heap before us (the sentinel among it)
    try:
        made_since: list = []
        assert _frozen(sentinel) and not _frozen(made_since)
        with gc_frozen():
            assert _frozen(made_since)  # frozen all the same
        assert _frozen(sentinel)  # theirs is not undone
    finally:
        gc.unfreeze()


class _Node:
    def __init__(self):
        self.me = self  # a cycle: only the collector frees it


def test_gc_frozen_keeps_old_garbage_and_collects_new():
    ref = weakref.ref(_Node())
    with gc_frozen():
        gc.collect()
        assert ref() is not None  # frozen garbage survives a full collection
        young = weakref.ref(_Node())
        gc.collect()
        assert young() is None  # garbage made while frozen is collected
    gc.collect()
    assert ref() is None  # and the old garbage after unfreeze


def _unfreezing_profile(seen: dict):
    """Stands in for vLLM 0.26's V1 profile with CUDA graphs: _freeze_gc ends in
    gc.unfreeze(); gc.collect()."""
    def run() -> int:
        seen["frozen_during_profile"] = gc.get_freeze_count()
        gc.unfreeze()
        gc.collect()
        return 123
    return run


def test_cuda_profile_runs_on_a_frozen_heap_and_the_sweep_stays_frozen_after_vllm_unfreezes():
    assert gc.get_freeze_count() == 0
    old = weakref.ref(_Node())
    seen: dict = {}
    clock = PhaseTimer()
    with contextlib.ExitStack() as stack:
        assert profile_on_frozen_heap(stack, _unfreezing_profile(seen), cuda=True, clock=clock) == 123
        assert old() is None  # collected before freezing: no garbage frozen
        assert seen["frozen_during_profile"] > 0
        assert gc.get_freeze_count() > 0  # frozen again after vLLM's unfreeze
        young = weakref.ref(_Node())
        gc.collect()
        assert young() is None  # what the sweep makes is still collected
    assert gc.get_freeze_count() == 0  # nothing was frozen before: all unfrozen
    assert {"heap_freeze", "vllm_profile"} <= set(clock.seconds)


def test_cpu_profile_runs_unfrozen_and_the_freeze_starts_after_it():
    seen: dict = {}
    clock = PhaseTimer()

    def profile() -> int:
        seen["frozen_during_profile"] = gc.get_freeze_count()
        return 7

    with contextlib.ExitStack() as stack:
        assert profile_on_frozen_heap(stack, profile, cuda=False, clock=clock) == 7
        assert seen["frozen_during_profile"] == 0
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0
    assert "heap_freeze" not in clock.seconds  # the CPU profile collects nothing to save


def test_vllm_profile_parts_are_logged_and_add_up(caplog, monkeypatch):
    """The log line splits vLLM's own KV figure into what its profile consumed, its transient
    headroom and its graph estimate; a figure that does not add up shows as unaccounted."""
    import types

    from worstcase_profiler.adapter import startup

    monkeypatch.setattr(startup, "cudagraph_applied", lambda w: w.cudagraph_memory_estimate)
    gib = 1 << 30
    worker = types.SimpleNamespace(requested_memory=70 * gib, total_consumed=20 * gib,
                                   peak_activation_memory=3 * gib,
                                   cudagraph_memory_estimate=1 * gib)
    with caplog.at_level("INFO", logger="vllm.wcprof"):
        caplog.clear()
        startup.log_vllm_profile(worker, 47 * gib)
        startup.log_vllm_profile(worker, 46 * gib)
        startup.log_vllm_profile(types.SimpleNamespace(requested_memory=gib), gib)  # no parts
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert "transient 2.00 GiB" in lines[0] and "(0 B unaccounted)" in lines[0], lines[0]
    assert "(1.00 GiB unaccounted)" in lines[1], lines[1]
