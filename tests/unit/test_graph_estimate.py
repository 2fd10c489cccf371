"""vLLM's V2 CUDA-graph estimate and the profiler's exact graph measurement (core/graph_estimate,
adapter/warmup.observed_profile / measure_graphs_apart).

On the H200 (vLLM 0.32 and 0.33, Llama-3.1-8B layout, 51 FULL graphs) vLLM's estimate read
7.47 GiB inside the profiler's first start where stock read 0.92 GiB, so the report's stock KV
was 45.70 GiB against stock's 52.26 GiB (docs/results/h200-run46/serve). The profiler had made
vLLM's own profile sample every FULL graph. Each sample is net of the allocator cache that
torch.cuda.graph's __enter__ empties (the blocks the eager warm-up of that descriptor took),
so `- sum(samples)` adds back one warm-up cache per sample: `measured - sum(samples)` grows by
one warm-up cache per extra sample. The stand-in runner below moves a free-memory counter the way
vLLM 0.32/0.33's capture moves the device's, and runs vLLM's own constants and extrapolation."""

from __future__ import annotations

import gc
from collections import namedtuple
from types import SimpleNamespace

import pytest

from worstcase_profiler.adapter import startup, warmup
from worstcase_profiler.core.graph_estimate import GraphProfile, describe, v2_estimate
from worstcase_profiler.core.timing import PhaseTimer

MiB, GiB = 1 << 20, 1 << 30
Mode = namedtuple("Mode", "name")  # CUDAGraphMode as the manager's dict keys it
PIECEWISE, FULL = Mode("PIECEWISE"), Mode("FULL")


def test_the_formula_is_vllms():
    s = (300 * MiB, 6 * MiB, -130 * MiB)
    assert v2_estimate(GraphProfile(700 * MiB, s, 51)) == \
        700 * MiB - sum(s) + 300 * MiB + 50 * 6 * MiB
    # a second sample under the floor counts 1 MiB a graph; one sample counts only itself
    assert v2_estimate(GraphProfile(700 * MiB, (300 * MiB, -200 * MiB), 51)) == \
        700 * MiB + 200 * MiB + 50 * MiB
    assert v2_estimate(GraphProfile(700 * MiB, (300 * MiB,), 1)) == 700 * MiB
    assert v2_estimate(GraphProfile(5, (), 0)) == 5
    assert v2_estimate(GraphProfile(0, (100, 100), 2)) == 0 + (1 << 20) - 100  # floor, then max 0
    cgu = _v2_estimator_module()
    for samples, n in [((300 * MiB, 6 * MiB), 51), ((300 * MiB, -2 * MiB, 9), 7), ((1,), 3)]:
        vllm = max(700 * MiB - sum(samples) + cgu._extrapolate_full_graph_memory(list(samples), n),
                   0)
        assert v2_estimate(GraphProfile(700 * MiB, samples, n)) == vllm


def test_the_log_line_names_every_figure_and_a_formula_that_does_not_hold():
    p = GraphProfile(680 * MiB, (300 * MiB, 6 * MiB, -140 * MiB, -130 * MiB), 51)
    text = describe(p)
    assert "capture took 680.00 MiB" in text and "4 FULL sample(s) of 51 graph(s)" in text
    assert "first 300.00 MiB, second 6.00 MiB" in text and "the other 2 sum to -270.00 MiB" in text
    assert "vLLM returned" not in describe(p, v2_estimate(p))
    assert "vLLM returned 1.00 GiB" in describe(p, GiB)


class Heap:
    """The device's free memory and the allocator's cache of freed blocks (counted as used)."""
    free = 100 * GiB
    cache = 0

    def emptied(self) -> int:  # torch.cuda.empty_cache(), then mem_get_info
        self.free, self.cache = self.free + self.cache, 0
        return self.free


def _meter(monkeypatch, heap):
    monkeypatch.setattr(warmup, "_free_bytes", lambda: heap.free)
    monkeypatch.setattr(warmup, "free_bytes_emptied", heap.emptied)


class Manager:
    def __init__(self, n_full):
        self._capture_descs = {PIECEWISE: list(range(n_full)), FULL: list(range(n_full))}
        self._max_full_descs_to_capture = None
        self._capture_mem_samples = None


class V2Runner:
    """vLLM 0.32/0.33's V2 runner as the free memory sees it: `pieces` of PIECEWISE graphs and the
    cache their warm-ups leave (`c0`), then per FULL graph an eager warm-up that grows the cache
    by `w` and a capture that first empties the cache (torch.cuda.graph's __enter__) and then
    grows the graph pool by `g`. `kv_init`: what the estimator's minimal KV cache setup leaves in
    the allocator's cache before capture_model, which empties it first."""

    def __init__(self, heap, n_full=51, pieces=250 * MiB, c0=40 * MiB, w=137 * MiB, g=2 * MiB,
                 kv_init=0):
        self.heap, self.n_full = heap, n_full
        self.pieces, self.c0, self.w, self.g = pieces, c0, w, g
        self.kv_init = kv_init
        self.cudagraph_manager = None
        self.pool = 0

    def capture_model(self, *, profile_only=False):  # model_runner.capture_model
        m, h = self.cudagraph_manager, self.heap
        start = h.emptied()  # torch.accelerator.empty_cache(), then its start reading
        h.free -= self.pieces + self.c0
        self.pool += self.pieces
        cache = self.c0
        descs = m._capture_descs[FULL]
        if m._max_full_descs_to_capture is not None:
            descs = descs[: m._max_full_descs_to_capture]
        for _ in descs:
            h.free -= self.w  # the warm-up forward_fn(NONE): its blocks stay cached
            cache += self.w
            before = h.free
            h.free += cache  # torch.cuda.graph.__enter__: empty_cache()
            cache = 0
            h.free -= self.g
            self.pool += self.g
            if m._capture_mem_samples is not None:
                m._capture_mem_samples.append(before - h.free)
        return start - h.free

    def profile_cudagraph_memory(self):  # cudagraph_utils.profile_cudagraph_memory
        from vllm.v1.worker.gpu import cudagraph_utils as cgu

        self.cudagraph_manager = m = Manager(self.n_full)
        self.heap.free -= self.kv_init  # _init_minimal_kv_cache_for_profiling's freed blocks
        self.heap.cache += self.kv_init
        m._max_full_descs_to_capture = cgu._FULL_GRAPH_PROFILING_SAMPLES
        samples: list[int] = []
        m._capture_mem_samples = samples
        try:
            measured = int(self.capture_model(profile_only=True))
            full = cgu._extrapolate_full_graph_memory(samples, len(m._capture_descs[FULL]))
            return max(measured - sum(samples) + full, 0)
        finally:  # _teardown_profiling_state: the throwaway pool goes
            self.heap.free += self.pool
            self.pool = 0
            self.cudagraph_manager = None



def _v2_estimator_module():
    """vLLM's V2 cudagraph_utils where it has its own estimator (0.29+); the tests that run it
    skip elsewhere (the CUDA venv's 0.26 has the module, not the estimator)."""
    cgu = pytest.importorskip("vllm.v1.worker.gpu.cudagraph_utils")
    if not hasattr(cgu, "profile_cudagraph_memory") or \
            not hasattr(cgu, "_extrapolate_full_graph_memory"):
        pytest.skip("this vLLM's V2 runner has no CUDA-graph estimator of its own (before 0.29)")
    return cgu

@pytest.fixture
def runner(monkeypatch):
    _v2_estimator_module()
    heap = Heap()
    _meter(monkeypatch, heap)
    return V2Runner(heap)


def test_sampling_every_full_graph_inside_vllms_profile_raised_its_figure(runner):
    worker = SimpleNamespace(model_runner=runner)
    stock = runner.profile_cudagraph_memory()
    with warmup.exact_graphs(worker, enabled=True) as measure:  # what the profiler used to do
        inflated = runner.profile_cudagraph_memory()
    assert inflated - stock == (runner.n_full - 2) * runner.w  # one warm-up cache a graph
    assert measure.bytes == runner.pieces + runner.n_full * runner.g  # the exact capture


def test_vllms_profile_is_observed_not_changed_and_the_graphs_are_measured_apart(runner):
    from vllm.v1.worker.gpu import cudagraph_utils as cgu

    worker = SimpleNamespace(model_runner=runner)
    stock = runner.profile_cudagraph_memory()
    with warmup.observed_profile(worker, enabled=True) as seen:
        assert cgu._FULL_GRAPH_PROFILING_SAMPLES == 2
        figure = runner.profile_cudagraph_memory()
    assert figure == stock and "capture_model" not in vars(runner)
    assert len(seen.profile.full_samples) == 2 and seen.profile.full_graphs == runner.n_full
    assert v2_estimate(seen.profile) == stock and seen.bytes is None
    graphs = warmup.measure_graphs_apart(worker, enabled=True)
    assert graphs.bytes == runner.pieces + runner.n_full * runner.g
    assert len(graphs.profile.full_samples) == runner.n_full
    assert cgu._FULL_GRAPH_PROFILING_SAMPLES == 2 and "capture_model" not in vars(runner)
    assert runner.profile_cudagraph_memory() == stock  # nothing left behind


def test_the_exact_pass_runs_only_where_enabled_and_where_the_runner_has_an_estimator(runner):
    # It also runs where a given KV size made vLLM skip its estimate (vLLM 0.32's
    # determine_available_memory returns kv_cache_memory_bytes before profile_cudagraph_memory;
    # h200 seed 000: the reserve read 0 B of graphs and the warm-up audit refused the start).
    calls = []
    original = runner.profile_cudagraph_memory
    runner.profile_cudagraph_memory = lambda: calls.append(1) or original()
    worker = SimpleNamespace(model_runner=runner)
    assert warmup.measure_graphs_apart(worker, enabled=False).bytes is None and not calls
    # V2 before 0.29 (no estimator of its own): the rehearsal captures into a throwaway pool
    assert warmup.measure_graphs_apart(SimpleNamespace(model_runner=SimpleNamespace()),
                                       enabled=True).bytes is None
    assert warmup.measure_graphs_apart(worker, enabled=True).bytes and calls == [1]


def test_the_exact_pass_is_the_profilers_own_phase_and_leaves_the_heap_frozen(runner):
    worker = SimpleNamespace(model_runner=runner)
    clock = PhaseTimer()
    assert startup.measure_graphs(worker, False, clock).bytes is None
    assert "graph_measure" not in clock.seconds
    try:
        graphs = startup.measure_graphs(worker, True, clock)
        assert graphs.bytes and "graph_measure" in clock.seconds
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


def test_the_start_wraps_vllms_profile_only_in_the_capture_that_hands_back_stocks_figure():
    import inspect

    source = inspect.getsource(startup.measure_start)
    assert "exact_graphs" not in source and "one_capture_profile" in source


def test_one_capture_of_every_graph_gives_the_exact_memory_and_vllm_keeps_stocks_figure(
        runner, caplog):
    """Issue 34: graphs captured once per start beside the real capture. vLLM's estimator
    captures every FULL graph (the exact measurement, as measure_graphs_apart reads it) and is
    handed back its own two-sample figure: the stock KV figure is stock's to the byte."""
    from vllm.v1.worker.gpu import cudagraph_utils as cgu

    worker = SimpleNamespace(model_runner=runner)
    stock = runner.profile_cudagraph_memory()
    apart = warmup.measure_graphs_apart(worker, enabled=True).bytes
    with caplog.at_level("INFO", logger="vllm.wcprof"), \
            warmup.one_capture_profile(worker, enabled=True, exact=True) as measure:
        worker.cudagraph_memory_estimate = runner.profile_cudagraph_memory()  # vLLM's worker
    assert worker.cudagraph_memory_estimate == stock  # vLLM kept stock's figure
    assert measure.bytes == apart == runner.pieces + runner.n_full * runner.g
    assert len(measure.profile.full_samples) == runner.n_full  # every FULL graph, once
    assert cgu._FULL_GRAPH_PROFILING_SAMPLES == 2 and "capture_model" not in vars(runner)
    assert "every CUDA graph captured once, in vLLM's own profile" in caplog.text
    assert "may not be stock's" not in caplog.text
    # a vLLM that kept another figure (its formula moved) is named, not trusted silently
    caplog.clear()
    with caplog.at_level("INFO", logger="vllm.wcprof"), \
            warmup.one_capture_profile(worker, enabled=True, exact=True):
        runner.profile_cudagraph_memory()
        worker.cudagraph_memory_estimate = stock + MiB
    assert "the report's stock KV figure may not be stock's" in caplog.text


@pytest.mark.parametrize("n_full", [1, 2, 3])
def test_few_full_graphs_the_capture_is_stocks_own(monkeypatch, n_full):
    _v2_estimator_module()
    heap = Heap()
    _meter(monkeypatch, heap)
    runner = V2Runner(heap, n_full=n_full)
    worker = SimpleNamespace(model_runner=runner)
    stock = runner.profile_cudagraph_memory()
    with warmup.one_capture_profile(worker, enabled=True, exact=True) as measure:
        assert runner.profile_cudagraph_memory() == stock
    assert measure.bytes == runner.pieces + n_full * runner.g


def test_where_something_captures_after_the_full_graphs_they_are_measured_apart(runner, caplog):
    """A drafter (or LoRA, or inner graphs) captures after the FULL graphs, into what the extra
    FULL graphs left: stock's end cannot be read, so vLLM's profile is only watched, and a
    cached start (not exact) never captures more than stock."""
    worker = SimpleNamespace(model_runner=runner)
    stock = runner.profile_cudagraph_memory()
    runner.speculator = object()
    with caplog.at_level("INFO", logger="vllm.wcprof"), \
            warmup.one_capture_profile(worker, enabled=True, exact=True) as seen:
        assert runner.profile_cudagraph_memory() == stock
    assert seen.bytes is None and len(seen.profile.full_samples) == 2
    assert "measured apart from vLLM's profile (a drafter captures" in caplog.text
    runner.speculator = None
    runner.kv_connector = type("NixlConnector", (), {})()  # an active KV connector
    with warmup.one_capture_profile(worker, enabled=True, exact=True) as seen:
        assert runner.profile_cudagraph_memory() == stock
    assert seen.bytes is None
    runner.kv_connector = type("KVConnector", (), {})()  # vLLM's no-op one
    with warmup.one_capture_profile(worker, enabled=True, exact=True) as seen:
        assert runner.profile_cudagraph_memory() == stock
    assert seen.bytes is not None
    del runner.kv_connector
    with warmup.one_capture_profile(worker, enabled=True, exact=False) as seen:
        assert runner.profile_cudagraph_memory() == stock
    assert seen.bytes is None and len(seen.profile.full_samples) == 2
    with warmup.one_capture_profile(worker, enabled=False, exact=True) as seen:
        assert runner.profile_cudagraph_memory() == stock
    assert seen.bytes is None and seen.profile is None


def test_stock_from_one_capture_is_the_identity_when_the_capture_was_stocks():
    from worstcase_profiler.core.graph_estimate import stock_from_one_capture

    cgu = _v2_estimator_module()
    ex = cgu._extrapolate_full_graph_memory
    s = (300 * MiB, 6 * MiB)
    prof, figure, back = stock_from_one_capture(700 * MiB, 5 * GiB, None, s, 2, 2, ex)
    assert back == 700 * MiB and figure == v2_estimate(GraphProfile(700 * MiB, s, 2))
    assert prof == GraphProfile(700 * MiB, s, 2)
    # more samples: stock's measured ends where its last sample did; vLLM's formula over every
    # sample, given `back`, returns stock's figure
    s = (300 * MiB, 6 * MiB, -130 * MiB, 2 * MiB)
    prof, figure, back = stock_from_one_capture(900 * MiB, 5 * GiB, 5 * GiB + 200 * MiB, s, 51,
                                                2, ex)
    assert prof.measured_bytes == 700 * MiB and prof.full_samples == s[:2]
    assert figure == v2_estimate(prof)
    assert max(back - sum(s) + ex(list(s), 51), 0) == figure


def test_cache_held_before_the_capture_is_not_taken_off_the_graphs(monkeypatch):
    """h100-run75 (DeepSeek-V4 + MTP, graphs, 0.33): the minimal KV cache vLLM's estimator sets up
    left 192 MiB in the allocator's cache; capture_model empties it before its own start reading.
    Read with it held, the capture's growth was offset by its release: 520 MiB measured where the
    capture took 712 MiB, and the warm-up audit refused the first start (the real capture kept
    644 MiB). The start is read with the cache emptied, as vLLM reads its own."""
    _v2_estimator_module()
    heap = Heap()
    _meter(monkeypatch, heap)
    runner = V2Runner(heap, kv_init=192 * MiB)
    worker = SimpleNamespace(model_runner=runner)
    exact = runner.pieces + runner.n_full * runner.g
    assert warmup.measure_graphs_apart(worker, enabled=True).bytes == exact
    with warmup.one_capture_profile(worker, enabled=True, exact=True) as measure:
        runner.profile_cudagraph_memory()
    assert measure.bytes == exact
    # the reading this replaces: the start read with the cache held comes out short by it
    monkeypatch.setattr(warmup, "free_bytes_emptied", lambda: heap.free)
    assert warmup.measure_graphs_apart(worker, enabled=True).bytes == exact - 192 * MiB
