"""The warm-up audit (adapter/startup.after_warm_up, core/audits.warmup_verdict): memory warm-up
keeps after the KV budget was fixed (CUDA graphs and other buffers) is checked against what
admission set aside. Within the margin: recorded. Beyond it: the start fails closed with the flag
that fits, and the figure goes into the cached sweep so the next start subtracts it. Driven with
a stand-in worker: the arithmetic and the cache update, not vLLM."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from unit_helpers import build_session
from worstcase_profiler.adapter import startup
from worstcase_profiler.core.cache import CacheEntry, SweepCache
from worstcase_profiler.core.types import WarmupEstimate
from worstcase_profiler.errors import DoesNotFit

MiB = 1 << 20


def _worker(tmp_path, mode="enforce", accounted=0, graphs=0, **session_kw):
    cache = SweepCache(tmp_path)
    session = build_session(json_path=str(tmp_path / "r.json"), mode=mode,
                            cache_path=str(cache.path("k")), cudagraph=accounted, **session_kw)
    cache.store(CacheEntry(key="k", facts={}, created_at="t", sweep=session.profile.sweep))
    session.measurements.update(after_kv=1000 * MiB, graphs=graphs)
    worker = SimpleNamespace(device="cpu", **{startup.SESSION_ATTR: session})
    return worker, session, cache


@pytest.fixture
def consumed(monkeypatch):
    """box["now"]: the bytes the device holds after warm-up; box["kind"]: the meter's device
    (cuda by default: exact allocator counters, as on the GPUs these scenarios come from)."""
    box = {"kind": "cuda"}
    monkeypatch.setattr(startup, "device_bytes_held", lambda worker, meter: box["now"])
    monkeypatch.setattr(startup, "meter_for", lambda device: SimpleNamespace(device_kind=box["kind"]))
    return box


def test_graphs_within_the_margin_are_recorded(tmp_path, consumed):
    worker, session, cache = _worker(tmp_path, graphs=20 * MiB)
    consumed["now"] = 1000 * MiB + 20 * MiB
    startup.after_warm_up(worker, session.settings)
    audit = session.phases.warmup.audit
    assert audit.verdict == "ok" and audit.resident_bytes == 20 * MiB and audit.outside_bytes == 20 * MiB
    assert cache.load("k").warmup.total_bytes == 20 * MiB
    assert json.loads((tmp_path / "r.json").read_text())["warmup_audit"]["verdict"] == "ok"


def test_graphs_beyond_the_margin_fail_the_start_and_are_cached(tmp_path, consumed):
    worker, session, cache = _worker(tmp_path, graphs=404 * MiB)
    consumed["now"] = 1000 * MiB + 404 * MiB
    with pytest.raises(DoesNotFit) as exc:
        startup.after_warm_up(worker, session.settings)
    err = exc.value
    fits = session.profile.admission.kv_cache_bytes - 404 * MiB
    assert "404.00 MiB" in err.message and "CUDA graphs" in err.message
    assert "start again with the same config" in err.hint
    assert f"--kv-cache-memory-bytes {fits}" in err.hint
    assert session.phases.warmup.audit.verdict == "outside-budget"
    assert cache.load("k").warmup == WarmupEstimate(graphs_bytes=404 * MiB, other_bytes=0,
                                                    source="cache")
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["warmup_audit"]["verdict"] == "outside-budget"  # written before refusing


def test_on_the_cpu_warm_up_within_the_margin_is_not_recorded(tmp_path, consumed):
    """RSS growth within the margin is noise on the CPU: recording it would make the restart
    admit less than the start that swept (tests/cpu/test_sweep_cache.py's parity)."""
    worker, session, cache = _worker(tmp_path)
    consumed.update(now=1000 * MiB + MiB, kind="cpu")
    startup.after_warm_up(worker, session.settings)
    assert session.phases.warmup.audit.verdict == "ok"
    assert cache.load("k").warmup.total_bytes == 0


def test_buffers_other_than_graphs_are_named(tmp_path, consumed):
    worker, session, _ = _worker(tmp_path, graphs=0)
    consumed["now"] = 1000 * MiB + 114 * MiB
    with pytest.raises(DoesNotFit) as exc:
        startup.after_warm_up(worker, session.settings)
    assert "no graph was captured" in exc.value.message


def test_a_restart_that_subtracted_the_graphs_passes(tmp_path, consumed):
    worker, session, cache = _worker(tmp_path, accounted=404 * MiB, graphs=400 * MiB)
    consumed["now"] = 1000 * MiB + 400 * MiB
    startup.after_warm_up(worker, session.settings)
    audit = session.phases.warmup.audit
    assert audit.verdict == "ok" and audit.outside_bytes < 0
    entry = cache.load("k")
    assert startup.cached_warmup(SimpleNamespace(), entry).total_bytes == 400 * MiB


def test_report_mode_only_warns(tmp_path, consumed):
    worker, session, _ = _worker(tmp_path, mode="report")
    consumed["now"] = 1000 * MiB + 404 * MiB
    startup.after_warm_up(worker, session.settings)
    assert session.phases.warmup.audit.verdict == "outside-budget"
    assert any("404.00 MiB" in w for w in session.phases.warnings)


def test_a_cached_start_may_create_the_residue_its_held_memory_counted(tmp_path, consumed):
    """A cached start admits with the full sweep's residue in its held memory (buffers the sweep
    created lazily, cache_trust.reuse_consumed); when warm-up is what creates them, that is no
    surprise: the audit credits the residue, and the entry keeps warm-up's figure at what went
    beyond it, so the next start does not subtract the same bytes twice."""
    worker, session, cache = _worker(tmp_path, cache_status="hit", residue=112 * MiB)
    consumed["now"] = 1000 * MiB + 112 * MiB
    startup.after_warm_up(worker, session.settings)
    audit = session.phases.warmup.audit
    assert audit.verdict == "ok" and audit.outside_bytes == 0
    assert "112.00 MiB of the cached sweep's residue" in audit.message
    assert cache.load("k").warmup.total_bytes == 0
    # beyond the residue: refused, and only the excess is remembered
    worker, session, cache = _worker(tmp_path, cache_status="hit", residue=112 * MiB)
    consumed["now"] = 1000 * MiB + 312 * MiB
    with pytest.raises(DoesNotFit):
        startup.after_warm_up(worker, session.settings)
    assert cache.load("k").warmup == WarmupEstimate(other_bytes=200 * MiB, source="cache")


def test_the_residue_credit_never_eats_the_entrys_own_warm_up_reserve(tmp_path, consumed):
    """Warm-up that keeps its reserve (50 MiB) plus part of the residue (30 of 112 MiB): the
    start is fine, and the entry keeps the 50 MiB, so the next start sets them aside again."""
    worker, session, cache = _worker(tmp_path, accounted=50 * MiB, cache_status="hit",
                                     residue=112 * MiB)
    consumed["now"] = 1000 * MiB + 80 * MiB
    startup.after_warm_up(worker, session.settings)
    assert session.phases.warmup.audit.verdict == "ok"
    assert cache.load("k").warmup.total_bytes == 50 * MiB


class _WarmUpMeter:
    """A meter whose marks the stand-in warm-up sets: `peak` above the start, `left` live."""

    device_kind = "cuda"
    resolution_bytes = MiB

    def __init__(self):
        self.peak_mark, self.left, self.began = 0, 0, False

    def begin(self):
        self.began = True

    def peak(self):
        return self.peak_mark

    def end(self):
        return max(0, self.peak_mark - self.left)


def test_vllms_own_warm_up_is_metered_beside_the_kv_cache(tmp_path, consumed, monkeypatch):
    """warm_up meters vLLM's warm-up from its start: the audit carries the high-water mark, the
    part above what the warm-up kept, and compares it with the worst step's prediction."""
    worker, session, _ = _worker(tmp_path, graphs=20 * MiB)
    meter = _WarmUpMeter()
    monkeypatch.setattr(startup, "meter_for", lambda device: meter)
    predicted = session.profile.admission.transient_bytes
    consumed["now"] = 1000 * MiB + 20 * MiB

    def vllm_warm_up(w):
        assert meter.began
        meter.peak_mark, meter.left = predicted // 2 + 20 * MiB, 20 * MiB
        return "done"

    assert startup.warm_up(worker, vllm_warm_up, session.settings) == "done"
    audit = session.phases.warmup.audit
    assert audit.startup_peak_bytes == predicted // 2 + 20 * MiB
    assert audit.startup_transient_bytes == predicted // 2
    assert audit.startup_peak_before_capture_bytes is None  # no capture_model on this runner
    assert "0.500 of it" in audit.message and not session.phases.warnings
    report = json.loads((tmp_path / "r.json").read_text())["warmup_audit"]
    assert report["startup_transient_bytes"] == predicted // 2


def test_a_warm_up_above_the_prediction_is_a_warning(tmp_path, consumed, monkeypatch):
    worker, session, _ = _worker(tmp_path)
    meter = _WarmUpMeter()
    monkeypatch.setattr(startup, "meter_for", lambda device: meter)
    predicted = session.profile.admission.transient_bytes
    consumed["now"] = 1000 * MiB

    def vllm_warm_up(w):
        meter.peak_mark = predicted + 2 * MiB  # beyond the meter's 1 MiB resolution

    startup.warm_up(worker, vllm_warm_up, session.settings)
    assert session.phases.warmup.audit.verdict == "ok"  # what it kept is within the reserve
    assert any("2.00 MiB more than the worst case holds" in w for w in session.phases.warnings)


def test_the_startup_note_names_the_phase_that_set_the_mark():
    from worstcase_profiler.core.audits import warmup_verdict, with_startup

    audit, _ = warmup_verdict(resident=0, graphs=0, accounted=0, margin=MiB, mode="enforce",
                              kv_cache_bytes=0, cached=False)
    by_capture, _ = with_startup(audit, peak=300 * MiB, transient=100 * MiB,
                                 before_capture=50 * MiB, predicted=200 * MiB, resolution=MiB)
    before, _ = with_startup(audit, peak=300 * MiB, transient=100 * MiB,
                             before_capture=300 * MiB, predicted=200 * MiB, resolution=MiB)
    after, _ = with_startup(audit, peak=300 * MiB, transient=100 * MiB, before_capture=50 * MiB,
                            after_capture=120 * MiB, predicted=200 * MiB, resolution=MiB)
    during, _ = with_startup(audit, peak=300 * MiB, transient=100 * MiB, before_capture=50 * MiB,
                             after_capture=300 * MiB, predicted=200 * MiB, resolution=MiB)
    assert "set during graph capture" in by_capture.message
    assert "set during graph capture" in during.message
    assert "set after graph capture" in after.message  # V1: the sampler warm-up follows capture
    assert after.startup_peak_after_capture_bytes == 120 * MiB
    assert "set before graph capture" in before.message
    assert "0.500 of it" in before.message
    _, within = with_startup(audit, peak=201 * MiB, transient=201 * MiB, before_capture=None,
                             predicted=200 * MiB, resolution=MiB)
    assert within is None  # within the meter's resolution


def test_a_meter_that_fails_never_fails_vllms_start(tmp_path, consumed, monkeypatch):
    """The warm-up meter is a reading: where it raises (begin, peak or end), vLLM's warm-up
    still runs and returns, the audit carries no startup figure, and nothing is warned."""
    for broken in ("begin", "peak", "end"):
        worker, session, _ = _worker(tmp_path)
        meter = _WarmUpMeter()

        def boom(*a):
            raise RuntimeError("CUDA driver says no")

        setattr(meter, broken, boom)
        monkeypatch.setattr(startup, "meter_for", lambda device: meter)
        consumed["now"] = 1000 * MiB
        assert startup.warm_up(worker, lambda w: "done", session.settings) == "done"
        audit = session.phases.warmup.audit
        assert audit.startup_transient_bytes is None and audit.startup_peak_bytes is None, broken
        assert not any("worst case holds" in w for w in session.phases.warnings)


def test_the_capture_marks_split_the_warm_up_into_before_during_and_after(tmp_path, consumed,
                                                                           monkeypatch):
    """On CUDA the runner's capture_model is wrapped: the meter's mark when the first capture
    began and when the last returned reach the audit, which names the phase that set the peak."""
    worker, session, _ = _worker(tmp_path, graphs=20 * MiB)
    meter = _WarmUpMeter()
    monkeypatch.setattr(startup, "meter_for", lambda device: meter)
    monkeypatch.setattr(startup.warmup, "free_bytes_emptied", lambda: 0)  # no torch.cuda here
    consumed["now"] = 1000 * MiB + 20 * MiB

    def vllm_warm_up(w):
        meter.peak_mark = 40 * MiB  # kernel warm-ups
        w.model_runner.capture_model()
        w.model_runner.capture_model()
        meter.peak_mark = 90 * MiB  # the sampler's warm-up after capture (V1)

    def capture():
        meter.peak_mark = max(meter.peak_mark, 60 * MiB)

    worker.model_runner = SimpleNamespace(capture_model=capture)
    startup.warm_up(worker, vllm_warm_up, session.settings)
    audit = session.phases.warmup.audit
    assert (audit.startup_peak_before_capture_bytes, audit.startup_peak_after_capture_bytes,
            audit.startup_peak_bytes) == (40 * MiB, 60 * MiB, 90 * MiB)
    assert "set after graph capture" in audit.message



@pytest.mark.parametrize("mode", ["enforce", "observe"])
def test_a_warm_up_that_reruns_the_step_the_worst_case_left_out_is_refused_before_it_runs(
        tmp_path, consumed, monkeypatch, mode):
    """The plan left vLLM's profile step out because no warm-up was to rerun it; vLLM resolves
    the graph mode at KV initialisation, after the plan. If the resolved config now reruns it,
    enforce refuses before vLLM's warm-up runs (the report says why); observe warns and goes on."""
    import dataclasses

    from worstcase_profiler.errors import ConfigError

    worker, session, _ = _worker(tmp_path, mode=mode)
    session.phases.profile = dataclasses.replace(session.profile, sweep=dataclasses.replace(
        session.profile.sweep, stock_excluded="the pool holds at most 216 requests at once"))
    monkeypatch.setattr(startup, "stock_rerun_why",
                        lambda cfg, runner: "the compile warm-up at size(s) 8192")
    worker.vllm_config = SimpleNamespace(compilation_config=SimpleNamespace(
        cudagraph_mode=SimpleNamespace(name="NONE")))
    consumed["now"] = 1000 * MiB
    ran = []
    if mode == "enforce":
        with pytest.raises(ConfigError) as exc:
            startup.warm_up(worker, lambda w: ran.append(1), session.settings)
        assert ran == []  # refused before vLLM's warm-up ran the step
        assert "graph mode NONE" in exc.value.message and "compile warm-up" in exc.value.message
        assert "-cc.cudagraph_mode" in exc.value.hint
        assert "compile warm-up" in json.loads((tmp_path / "r.json").read_text())["warnings"][-1]
    else:
        startup.warm_up(worker, lambda w: ran.append(1), session.settings)
        assert ran == [1] and any("compile warm-up" in w for w in session.phases.warnings)
    # where nothing reruns it, the warm-up runs as before
    monkeypatch.setattr(startup, "stock_rerun_why", lambda cfg, runner: None)
    worker, session, _ = _worker(tmp_path, mode=mode)
    startup.warm_up(worker, lambda w: ran.append(2), session.settings)
    assert ran[-1] == 2


def test_a_capture_warm_up_beyond_the_admitted_transient_is_named_before_the_kv_decision():
    """vLLM warms each graph up with graphs off before capturing it, with up to max_num_seqs
    requests whatever the pool holds; metered apart from vLLM's profile, it is checked against
    the worst case's admitted transient (plus the allocator slack), within the margin."""
    from worstcase_profiler.adapter.warmup import GraphMeasure
    from worstcase_profiler.core.audits import capture_warmup_verdict

    seen = GraphMeasure()
    for tokens, reqs, transient in ((512, 512, 30 * MiB), (4608, 1024, 90 * MiB), (8, 8, MiB)):
        seen.warm_up_ran(tokens, reqs, transient)
    assert (seen.capture_warmup_bytes, seen.capture_warmup_shape) == (90 * MiB, (4608, 1024))
    kw = dict(transient=seen.capture_warmup_bytes, shape=seen.capture_warmup_shape,
              margin=64 * MiB)
    assert capture_warmup_verdict(admitted=100 * MiB, slack=0, **kw) is None
    assert capture_warmup_verdict(admitted=30 * MiB, slack=0, **kw) is None  # within the margin
    over = capture_warmup_verdict(admitted=30 * MiB, slack=8 * MiB, **kw)
    assert over is not None and "4608 tokens over 1024 requests" in over
    assert "68.00 MiB more" in over
    assert capture_warmup_verdict(transient=None, shape=None, admitted=0, slack=0,
                                  margin=0) is None  # not metered: eager, cached, V1
