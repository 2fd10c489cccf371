"""adapter.meters.device_bytes_held on the CUDA path, driven with torch.cuda's calls
replaced (no GPU here): what it returns, the garbage generation it collects, and the sub-phase
timings that say where its seconds go (report.startup_seconds['measure_held.*']).

torch itself is not needed: the function imports torch when called, and these tests hand it a
stand-in module whose torch.cuda holds only the calls under test (so they run without torch)."""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace

import pytest

from worstcase_profiler.adapter.meters import device_bytes_held
from worstcase_profiler.core.timing import PhaseTimer

GiB = 1 << 30


@pytest.fixture
def torch(monkeypatch):
    """A stand-in `torch` whose cuda namespace each test fills in."""
    def unset(*args):
        raise AssertionError("a torch.cuda call this test did not stand in for")

    fake = types.ModuleType("torch")
    fake.cuda = SimpleNamespace(synchronize=unset, empty_cache=unset, mem_get_info=unset,
                                memory_stats=unset)
    monkeypatch.setitem(sys.modules, "torch", fake)
    return fake


@pytest.fixture
def fake_cuda(monkeypatch, torch):
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: calls.append("sync"))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (30 * GiB, 140 * GiB))
    monkeypatch.setattr("gc.collect", lambda gen=2: calls.append(f"gc{gen}") or 0)
    return calls


def _worker():
    return SimpleNamespace(init_snapshot=SimpleNamespace(free_memory=100 * GiB))


def test_held_is_free_at_init_minus_free_now_after_collecting_and_emptying(fake_cuda):
    meter = SimpleNamespace(device_kind="cuda")
    assert device_bytes_held(_worker(), meter) == 70 * GiB
    assert fake_cuda == ["sync", "gc2", "empty_cache"]


def test_sub_phases_are_timed_under_the_phase_name(fake_cuda):
    clock = PhaseTimer()
    device_bytes_held(_worker(), SimpleNamespace(device_kind="cuda"), gc_generation=1,
                      clock=clock, phase="measure_after_kv")
    assert fake_cuda == ["sync", "gc1", "empty_cache"]
    assert set(clock.seconds) == {"measure_after_kv.sync", "measure_after_kv.gc",
                                  "measure_after_kv.empty_cache"}


def test_the_empty_cache_diagnostic_is_read_only_when_debug_is_on(fake_cuda, torch, monkeypatch,
                                                                  caplog):
    frees = iter([(29 * GiB, 140 * GiB), (30 * GiB, 140 * GiB)])
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: next(frees))
    stats = {"reserved_bytes.all.current": 5 * GiB, "allocated_bytes.all.current": 3 * GiB,
             "inactive_split_bytes.all.current": 1 * GiB}
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda *a: fake_cuda.append("stats") or stats)
    meter = SimpleNamespace(device_kind="cuda")
    assert device_bytes_held(_worker(), meter) == 71 * GiB  # one free read: the one after emptying
    assert "stats" not in fake_cuda
    frees = iter([(29 * GiB, 140 * GiB), (30 * GiB, 140 * GiB)])
    caplog.set_level("DEBUG", logger="vllm.wcprof")
    assert device_bytes_held(_worker(), meter, phase="measure_held") == 70 * GiB
    assert f"measure_held: empty_cache released {GiB} B; the allocator's stats called {GiB} B" \
        in caplog.text
