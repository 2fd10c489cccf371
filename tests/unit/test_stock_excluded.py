"""The stock step leaves the worst case only where it never runs beside the KV cache
(shapes.stock_excluded_why): vLLM runs it again after allocating the pool on neither path, and
the pool holds fewer requests at once than it has. h200-run37 (qwen3.5 + DFlash k=8, 131k, eager
V2): vLLM's profile step of 8,192 rows over 1,024 requests was admitted at 4.06 GiB while the
pool held 225 requests, and the largest step real requests formed needed 2.03 GiB."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from worstcase_profiler.core.requests_plan import plan_for
from worstcase_profiler.core.shapes import (Limits, fresh_prefill_batch, most_fresh_requests,
                                            prefill_chunk, stock_excluded_why, stock_shape)
from worstcase_profiler.core.sweep import (Replay, dominance_checks, reused, run_cut_down,
                                           run_sweep)
from worstcase_profiler.core.types import ProvisionalKV

from test_sweep import CutDriver, FakeDriver

MiB = 1 << 20
# 64 rows over up to 64 requests; a recurrent state of 112 tokens beside each request's block:
# the pool of 1,024 tokens holds 1024 // (16 + 112) = 8 requests at once
POOL = Limits(max_model_len=256, max_num_batched_tokens=64, max_num_seqs=64, block_size=16,
              kv_capacity_tokens=1024, state_request_tokens=112, stock_reruns_with_kv=False)
f = lambda s: s.rows * 100 * 1024 + s.context_len * 1024  # noqa: E731
BIG_STOCK = 40 * MiB  # stock's 64 requests' sampling, far above every formable step


def test_the_rule_needs_both_no_rerun_and_a_pool_too_small_for_stocks_requests():
    assert stock_shape(POOL).num_reqs == 64 and POOL.max_concurrent_requests == 8
    why = stock_excluded_why(POOL)
    assert why and "64 requests" in why and "at most 8" in why
    assert stock_excluded_why(dataclasses.replace(POOL, stock_reruns_with_kv=True)) is None
    assert stock_excluded_why(dataclasses.replace(POOL, kv_capacity_tokens=None)) is None
    roomy = dataclasses.replace(POOL, state_request_tokens=0, kv_capacity_tokens=64 * 16)
    assert roomy.max_concurrent_requests == 64 and stock_excluded_why(roomy) is None
    assert Limits(max_model_len=8, max_num_batched_tokens=8, max_num_seqs=1).stock_reruns_with_kv


def test_a_sweep_leaves_out_a_stock_step_no_one_runs_beside_the_pool():
    out = run_sweep(FakeDriver(POOL, transient=f, stock_transient=BIG_STOCK), tolerance=0,
                    attribute_ops=False)
    assert out.stock.peak_bytes == BIG_STOCK  # still measured and reported
    assert out.stock_excluded == stock_excluded_why(POOL)
    assert out.worst.shape.kind != "stock"
    assert out.peak_bytes == max(r.peak_bytes for r in out.steps) < BIG_STOCK
    kept = run_sweep(FakeDriver(dataclasses.replace(POOL, stock_reruns_with_kv=True),
                                transient=f, stock_transient=BIG_STOCK),
                     tolerance=0, attribute_ops=False)
    assert kept.stock_excluded is None and kept.worst.shape.kind == "stock"
    assert kept.peak_bytes == BIG_STOCK


def test_a_cut_down_sweep_leaves_it_out_the_same_way():
    gap = lambda s: MiB  # noqa: E731
    cut, _ = run_cut_down(CutDriver(POOL, f, gap, stock_transient=BIG_STOCK), tolerance=0,
                          attribute_ops=False)
    full = run_sweep(FakeDriver(POOL, transient=f, stock_transient=BIG_STOCK), tolerance=0,
                     attribute_ops=False)
    assert cut.stock_excluded and cut.worst.shape.kind != "stock"
    assert cut.peak_bytes < BIG_STOCK and cut.peak_bytes >= full.worst.peak_bytes


# prefix caching with hits of at least 32 rows: split prefills of 64 rows stop at 1 + 63 // 32 = 2
# requests, so only the fresh prefill batch spreads the budget over the 8 the pool holds
HITS = dataclasses.replace(POOL, prefix_caching=True, prefix_hit_min_rows=32)
per_req = lambda s: f(s) + s.num_reqs * 2 * MiB  # noqa: E731  (a drafter's rows per request)


def test_the_fresh_prefill_batch_stands_in_for_an_excluded_stock_step():
    shape = fresh_prefill_batch(HITS)
    assert (shape.kind, shape.rows, shape.context_len, shape.num_reqs) == ("prefill", 64, 0, 8)
    assert fresh_prefill_batch(dataclasses.replace(HITS, stock_reruns_with_kv=True)) is None
    out = run_sweep(FakeDriver(HITS, transient=per_req, stock_transient=BIG_STOCK), tolerance=0,
                    attribute_ops=False)
    assert out.stock_excluded and out.worst.shape == shape
    assert max(r.peak_bytes for r in out.steps if r.shape != shape) < out.peak_bytes
    assert shape in dominance_checks(HITS, plan_shape := prefill_chunk(HITS, 64)) \
        and plan_shape != shape
    req = plan_for(shape, HITS, prefix_caching=True)
    assert req.exact and req.target == shape
    assert [p.suffix_len for p in req.batches[-1].prompts] == [8] * 8


def test_a_fresh_prefill_batch_the_driver_cannot_build_keeps_the_stock_step():
    class NoFresh(FakeDriver):
        def cannot_build(self, shape):
            return "no" if shape == fresh_prefill_batch(self.limits) else None

    out = run_sweep(NoFresh(HITS, transient=per_req, stock_transient=BIG_STOCK), tolerance=0,
                    attribute_ops=False)
    assert out.stock_excluded is None and out.peak_bytes == BIG_STOCK


def test_a_provisional_pool_holds_a_state_slot_for_each_fresh_request():
    assert most_fresh_requests(HITS) == 8  # the fresh prefill batch's 8 requests on no context
    assert most_fresh_requests(dataclasses.replace(HITS, stock_reruns_with_kv=True)) == 1
    # a split prefill whose extent is its chunk: 64 rows over 4 requests of 16 on no context
    tight = Limits(max_model_len=16, max_num_batched_tokens=64, max_num_seqs=4, block_size=16)
    assert most_fresh_requests(tight) == 4


def test_a_replay_whose_stock_step_drifted_keeps_the_cached_figure_where_it_does_not_count():
    cached = run_sweep(FakeDriver(POOL, transient=f, stock_transient=BIG_STOCK), tolerance=0,
                       attribute_ops=False)
    drifted = dataclasses.replace(cached.stock, peak_bytes=BIG_STOCK + 8 * MiB)
    check = Replay(stock=drifted, step=cached.worst, others=(), seconds=0.0,
                   provisional=ProvisionalKV(num_blocks=5, kv_bytes=10, post_profile_bytes=7))
    assert reused(cached, check, MiB).peak_bytes == cached.peak_bytes
    counted = dataclasses.replace(cached, stock_excluded=None)
    assert reused(counted, check, MiB).peak_bytes > cached.peak_bytes


def _worker(device: str, module: str, mode: str):
    runner = type("Runner", (), {"__module__": module})()
    cfg = SimpleNamespace(device_config=SimpleNamespace(device_type=device),
                          compilation_config=SimpleNamespace(mode=SimpleNamespace(name=mode)))
    return cfg, runner


@pytest.mark.parametrize("device, module, mode, reruns", [
    ("cpu", "vllm.v1.worker.cpu.model_runner", "NONE", False),  # warms up before the KV only
    ("cuda", "vllm.v1.worker.gpu_model_runner", "NONE", True),  # V1: the sampler warm-up
    ("cuda", "vllm.v1.worker.gpu.model_runner", "NONE", False),  # eager V2: capped kernel warm-up
    ("cuda", "vllm.v1.worker.gpu.model_runner", "VLLM_COMPILE", True),  # compiled warm-up sizes
    ("xpu", "vllm.v1.worker.gpu.model_runner", "NONE", True),  # not read: the stock step stays
])
def test_which_workers_run_the_stock_step_again_once_the_pool_exists(device, module, mode, reruns):
    from worstcase_profiler.adapter.facts import stock_reruns_with_kv

    cfg, runner = _worker(device, module, mode)
    assert stock_reruns_with_kv(cfg, runner) is reruns
    assert stock_reruns_with_kv(cfg, None) is True  # no runner (a front end): it stays


def test_a_budget_above_the_planned_pool_is_held_at_it_where_the_stock_step_is_left_out():
    """The plan takes vLLM's own budget as the pool's bound; left out, the stock step no longer
    keeps ours below it, so more KV would hold more requests at once than any planned step."""
    from test_budget import _measured

    from worstcase_profiler.core import budget

    m = _measured()
    ours = budget.decide(m, mode="enforce", margin_bytes=0).admission.budget_bytes
    pool = (ours - 4 * MiB) // m.bytes_per_token  # a plan from a pool below our budget
    limits = dataclasses.replace(m.limits, kv_capacity_tokens=pool)
    kept = budget.decide(dataclasses.replace(m, limits=limits), mode="enforce", margin_bytes=0)
    assert kept.budget.budget_bytes == kept.admission.budget_bytes  # the stock step counts: as ever
    sweep = dataclasses.replace(m.sweep, stock_excluded="stock runs only before the KV cache")
    held = budget.decide(dataclasses.replace(m, limits=limits, sweep=sweep), mode="enforce",
                         margin_bytes=0)
    assert held.admission.budget_bytes > pool * m.bytes_per_token
    assert held.budget.budget_bytes == pool * m.bytes_per_token
    assert "held at the KV pool the sweep planned" in held.budget.reason
    # the flag an operator copies and the KV the report gives are held there too
    adm = held.admission
    assert adm.pool_ceiling_bytes == held.budget.budget_bytes
    assert adm.recommended_kv_cache_memory_bytes <= adm.pool_ceiling_bytes >= adm.kv_cache_bytes
    # a pool below one request's least cache: held at the least, as the allocation is
    tiny = dataclasses.replace(m, limits=dataclasses.replace(limits, kv_capacity_tokens=64),
                               sweep=sweep)
    small = budget.decide(tiny, mode="enforce", margin_bytes=0)
    least = small.admission.least_kv_cache_bytes
    assert small.budget.budget_bytes == least
    assert small.admission.recommended_kv_cache_memory_bytes >= least
    assert small.admission.kv_cache_bytes == least == small.admission.pool_ceiling_bytes
    explicit = budget.decide(dataclasses.replace(m, limits=limits, sweep=sweep,
                                                 explicit_kv_bytes=8 * GiB),
                             mode="enforce", margin_bytes=0)
    assert explicit.budget.budget_bytes == 8 * GiB


GiB = 1 << 30


def test_an_eager_v2_worker_reruns_it_with_flashinfers_autotune_or_elastic_ep(monkeypatch):
    """kernel_warmup's FlashInfer autotune and elastic EP's warm_and_capture both run
    _dummy_run(max_num_batched_tokens) after the KV cache exists, their requests not capped."""
    import importlib.util

    from worstcase_profiler.adapter.facts import stock_reruns_with_kv

    cfg, runner = _worker("cuda", "vllm.v1.worker.gpu.model_runner", "NONE")
    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "flashinfer" else found(name, *a))
    assert stock_reruns_with_kv(cfg, runner) is True  # autotune unset: vLLM's -O2 default is on
    cfg.kernel_config = SimpleNamespace(enable_flashinfer_autotune=False)
    assert stock_reruns_with_kv(cfg, runner) is False
    cfg.parallel_config = SimpleNamespace(enable_elastic_ep=True)
    assert stock_reruns_with_kv(cfg, runner) is True


def test_a_step_on_no_context_beyond_the_pools_state_slots_is_refused():
    from worstcase_profiler.core.shapes import state_slots_beyond_pool
    from worstcase_profiler.core.types import Shape

    why = state_slots_beyond_pool(Shape("stock", 8192, 0, 1024), 159)
    assert why and "1024 requests" in why and "159 blocks" in why
    assert state_slots_beyond_pool(Shape("prefill", 1800, 0, 158), 159) is None  # slots 1..158
    assert state_slots_beyond_pool(Shape("prefill", 1800, 0, 159), 159)
    assert state_slots_beyond_pool(Shape("prefill", 8192, 4096, 1024), 159) is None  # ids wrap
    # the sweep's own plan always fits the pool the V2 driver sizes (1 + most_fresh_requests)
    pool = 1 + most_fresh_requests(HITS)
    assert state_slots_beyond_pool(fresh_prefill_batch(HITS), pool) is None


def test_the_v2_driver_refuses_a_fresh_step_beyond_its_pool_on_a_hybrid_model():
    pytest.importorskip("numpy")
    from worstcase_profiler.adapter.runner_v2 import V2Driver
    from worstcase_profiler.core.types import Shape

    def drv(hybrid):
        return SimpleNamespace(_hybrid=hybrid, _state_slots=True, limits=HITS,
                               _provisional_blocks=lambda: 9)

    big, ok = Shape("stock", 64, 0, 64), Shape("prefill", 64, 0, 8)
    assert "64 requests" in V2Driver.cannot_build(drv(True), big)
    assert V2Driver.cannot_build(drv(True), ok) is None
    assert V2Driver.cannot_build(drv(False), big) is None


class _Range:  # vLLM's config.utils.Range: inclusive at both ends
    def __init__(self, start, end):
        self.start, self.end = start, end

    def __contains__(self, x):
        return self.start <= x <= self.end


def _compiled_v2(capture=(1, 2, 4, 8, 512), compile_sizes=(), ranges=((1, 8192),),
                 graph_mode="FULL_AND_PIECEWISE", method=None):
    cfg, runner = _worker("cuda", "vllm.v1.worker.gpu.model_runner", "VLLM_COMPILE")
    cc = cfg.compilation_config
    cc.cudagraph_mode = SimpleNamespace(name=graph_mode)
    cc.cudagraph_capture_sizes, cc.compile_sizes = list(capture), list(compile_sizes)
    cc.get_compile_ranges = lambda: [_Range(a, b) for a, b in ranges]
    cfg.kernel_config = SimpleNamespace(enable_flashinfer_autotune=False)
    cfg.speculative_config = SimpleNamespace(method=method) if method else None
    return cfg, runner


@pytest.mark.parametrize("change, why", [
    ({}, None),  # every capture size inside the one compile range: no compile warm-up (h200-run59)
    ({"ranges": ((1, 2048), (2049, 8192))}, "the compile warm-up at size(s) 8192"),
    ({"compile_sizes": (8192,)}, "the compile warm-up at size(s) 8192"),
    ({"compile_sizes": (512,)}, None),  # a compile size that is also captured: no extra run
    ({"graph_mode": "NONE"}, "the compile warm-up at size(s) 8192"),  # nothing captured
    ({"method": "dspark"}, "adaptive verification's profiling replays (DSpark)"),
])
def test_a_compiled_v2_worker_reruns_the_stock_step_only_where_vllms_warm_up_does(change, why):
    """vLLM's _compile_or_warm_up_model (0.32, 0.33): _dummy_run(size) for compile sizes no
    capture size equals, and for each compile range's end where no size falls in the range."""
    from worstcase_profiler.adapter.facts import stock_rerun_why, stock_reruns_with_kv

    cfg, runner = _compiled_v2(**change)
    assert stock_rerun_why(cfg, runner) == why
    assert stock_reruns_with_kv(cfg, runner) is (why is not None)


def test_an_unread_compiled_config_keeps_the_stock_step():
    from worstcase_profiler.adapter.facts import stock_rerun_why

    cfg, runner = _compiled_v2()
    del cfg.compilation_config.get_compile_ranges  # a vLLM whose config has no such method
    assert stock_rerun_why(cfg, runner) == "the compile warm-up (its sizes not read)"
    cfg, runner = _worker("cuda", "vllm.v1.worker.gpu.model_runner", "STOCK_TORCH_COMPILE")
    assert "not read" in stock_rerun_why(cfg, runner)
