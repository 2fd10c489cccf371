"""The warm-up audit (adapter/sweeping.py): memory warm-up keeps after the KV budget was fixed (CUDA
graphs, which vLLM 0.26's V2 runner estimates as 0) is checked against what admission set aside.
Within the margin: recorded. Beyond it: the start fails closed with the flag that fits, and the
figure goes into the cached sweep so the next start subtracts it. Driven with a stand-in worker:
the arithmetic and the cache update, not vLLM."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from worstcase_profiler.adapter import sweeping
from worstcase_profiler.cache import CacheEntry, SweepCache
from worstcase_profiler.errors import DoesNotFit
from worstcase_profiler.report import Report
from worstcase_profiler.settings import ProfilerSettings

DATA = Path(__file__).parent / "data"
MiB = 1 << 20


def _worker(tmp_path, accounted: int = 0):
    report = Report.model_validate_json((DATA / "h200_dsv32_fp8.json").read_text())
    report.admission.cudagraph_bytes = accounted
    cache = SweepCache(tmp_path)
    cache.store(CacheEntry(key="k", facts={}, created_at="t", worstcase=report.worstcase))
    worker = SimpleNamespace(device="cpu", **{sweeping.AFTER_KV_ATTR: 1000 * MiB,
                                              sweeping.CACHE_ATTR: sweeping.CacheSlot(cache, "k", accounted)})
    return worker, report, cache


@pytest.fixture
def consumed(monkeypatch):
    box = {}
    monkeypatch.setattr(sweeping, "device_bytes_held", lambda worker, meter: box["now"])
    return box


def test_graphs_within_the_margin_are_recorded(tmp_path, consumed):
    worker, report, cache = _worker(tmp_path)
    consumed["now"] = 1000 * MiB + 20 * MiB
    sweeping.audit_warm_up(worker, report, ProfilerSettings(mode="enforce"))
    audit = report.warmup_audit
    assert audit.verdict == "ok" and audit.resident_bytes == 20 * MiB and audit.outside_bytes == 20 * MiB
    assert cache.load("k").warmup_resident_bytes == 20 * MiB


def test_graphs_beyond_the_margin_fail_the_start_and_are_cached(tmp_path, consumed):
    worker, report, cache = _worker(tmp_path)
    consumed["now"] = 1000 * MiB + 404 * MiB
    err = sweeping.audit_warm_up(worker, report, ProfilerSettings(mode="enforce"))
    assert isinstance(err, DoesNotFit)
    fits = report.admission.kv_cache_bytes - 404 * MiB
    assert "404.00 MiB" in err.message
    assert "start again with the same config" in err.hint
    assert f"--kv-cache-memory-bytes {fits}" in err.hint
    assert report.warmup_audit.verdict == "outside-budget"
    assert cache.load("k").warmup_resident_bytes == 404 * MiB


def test_a_restart_that_subtracted_the_graphs_passes(tmp_path, consumed):
    worker, report, _ = _worker(tmp_path, accounted=404 * MiB)
    consumed["now"] = 1000 * MiB + 400 * MiB
    sweeping.audit_warm_up(worker, report, ProfilerSettings(mode="enforce"))
    assert report.warmup_audit.verdict == "ok" and report.warmup_audit.outside_bytes < 0
    assert sweeping.cached_warmup(worker) == 404 * MiB


def test_report_mode_only_warns(tmp_path, consumed):
    worker, report, _ = _worker(tmp_path)
    consumed["now"] = 1000 * MiB + 404 * MiB
    sweeping.audit_warm_up(worker, report, ProfilerSettings(mode="report"))
    assert report.warmup_audit.verdict == "outside-budget"
    assert any("404.00 MiB" in w for w in report.warnings)
