"""core/budget.decide: the start's decision from what measuring it found, without a worker.
Every figure the admission subtracts comes from the Measured record it is given, and the
budget vLLM receives follows the mode, an explicit --kv-cache-memory-bytes and kv_cap."""

from __future__ import annotations

import dataclasses

import pytest

from worstcase_profiler.core import budget
from worstcase_profiler.core.shapes import Limits
from worstcase_profiler.core.types import (HeldMemory, RowsCoverage, Shape, StepResult,
                                           SweepResult, WarmupEstimate, Workspace)
from worstcase_profiler.errors import DoesNotFit

MiB, GiB = 1 << 20, 1 << 30
LIMITS = Limits(max_model_len=8192, max_num_batched_tokens=2048, max_num_seqs=8, block_size=16,
                kv_capacity_tokens=1 << 20)
BPT = 64 * 1024  # bytes per KV token
ONE_REQUEST = 8192 * BPT  # 512 MiB


def _sweep(peak: int, stock_need: int, curve=()) -> SweepResult:
    worst = StepResult(Shape("prefill", 2048, 6144), peak, 0.1)
    cov = RowsCoverage(peak_table=((2048, peak),), worst_rows=2048, worst_peak=peak, bound=peak,
                       tolerance=0, segments=(), method="exhaustive", argument="")
    return SweepResult(stock=StepResult(Shape("stock", 2048, 0), stock_need, 0.1), steps=(worst,),
                       worst=worst, worst_op=None, peak_bytes=peak, coverage=cov,
                       context_curve=tuple(curve), rows_max=2048, post_profile_bytes=0,
                       seconds=0.2)


def _measured(**kw) -> budget.Measured:
    base = dict(limits=LIMITS, sweep=_sweep(3 * GiB, 1 * GiB),
                held=HeldMemory(requested_bytes=40 * GiB, consumed_bytes=10 * GiB,
                                weights_bytes=8 * GiB, non_torch_bytes=1 * GiB),
                workspace=Workspace(), warmup=WarmupEstimate(graphs_bytes=512 * MiB),
                stock_kv_bytes=28 * GiB, bytes_per_token=BPT, one_request_bytes=ONE_REQUEST,
                explicit_kv_bytes=None, tolerance_bytes=MiB,
                alloc_conf="expandable_segments:True")
    base.update(kw)
    return budget.Measured(**base)


def test_enforce_admits_what_is_left_after_the_worst_step_warm_up_and_margin():
    d = budget.decide(_measured(), mode="enforce", margin_bytes=256 * MiB)
    want = 40 * GiB - 10 * GiB - 3 * GiB - 512 * MiB - 256 * MiB
    assert d.admission.budget_bytes == want == d.budget.budget_bytes
    assert d.admission.cudagraph_bytes == 512 * MiB and d.admission.stock_kv_cache_bytes == 28 * GiB
    assert d.budget.reason == "worst-case budget" and d.budget.error is None and d.advice is None
    assert d.admission.kv_tokens_worstcase == (want // (BPT * 16)) * 16
    assert d.warnings == ()  # on CUDA the budget does not follow free host memory


@pytest.mark.parametrize("conf,warned", [(None, True), ("", True),
                                         ("expandable_segments:False", True),
                                         ("max_split_size_mb:512", True),
                                         ("expandable_segments:True", False),
                                         ("garbage_collection_threshold:0.8, "
                                          "expandable_segments:True", False)])
def test_cuda_without_expandable_segments_says_what_the_admission_does_not_bound(conf, warned):
    """A held card can still run out of memory between segments (fragmentation): no step's
    peak measures it, so the report says so and names the setting, on CUDA only."""
    d = budget.decide(_measured(alloc_conf=conf), mode="enforce", margin_bytes=256 * MiB)
    notes = [w for w in d.warnings if "expandable segments" in w]
    assert bool(notes) == warned
    if warned:
        assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in notes[0]
    cpu = budget.decide(_measured(alloc_conf=conf, device_kind="cpu", explicit_kv_bytes=GiB),
                        mode="enforce", margin_bytes=256 * MiB)
    assert not [w for w in cpu.warnings if "expandable segments" in w]


def test_memory_the_allocator_kept_beyond_its_live_tensors_is_named_in_the_note():
    """Without expandable segments torch's allocator can keep memory reserved beyond its live
    tensors (a segment it cannot release); it counts as held (h200-run62: a VLM start refused,
    32 GiB). From 1 GiB on, the note says how much and that the KV budget is that much smaller."""
    kept = budget.decide(_measured(alloc_conf=None, allocator_kept_free_bytes=32 * GiB),
                         mode="enforce", margin_bytes=256 * MiB)
    note = [w for w in kept.warnings if "expandable segments" in w][0]
    assert "32.00 GiB that the allocator kept reserved beyond its live tensors" in note
    small = budget.decide(_measured(alloc_conf=None, allocator_kept_free_bytes=512 * MiB),
                          mode="enforce", margin_bytes=256 * MiB)
    assert "kept reserved" not in [w for w in small.warnings if "expandable" in w][0]
    on = budget.decide(_measured(allocator_kept_free_bytes=32 * GiB), mode="enforce",
                       margin_bytes=256 * MiB)
    assert not [w for w in on.warnings if "kept reserved" in w]  # expandable segments: no note


def test_a_cpu_budget_without_an_explicit_size_says_it_follows_free_host_memory():
    d = budget.decide(_measured(device_kind="cpu"), mode="enforce", margin_bytes=0)
    assert len(d.warnings) == 1 and "free memory" in d.warnings[0]
    assert f"--kv-cache-memory-bytes {d.admission.recommended_kv_cache_memory_bytes}" in d.warnings[0]
    pinned = budget.decide(_measured(device_kind="cpu", explicit_kv_bytes=20 * GiB),
                           mode="enforce", margin_bytes=0)
    assert pinned.warnings == ()


def test_report_mode_gives_vllm_its_own_figure_and_still_measures():
    d = budget.decide(_measured(), mode="report", margin_bytes=256 * MiB)
    assert d.budget.budget_bytes == 28 * GiB and d.budget.reason.startswith("report mode")
    assert d.admission.budget_bytes < 28 * GiB


def test_an_explicit_kv_size_is_honoured_when_it_fits_and_refused_naming_the_flag_when_not():
    ok = budget.decide(_measured(explicit_kv_bytes=20 * GiB), mode="enforce", margin_bytes=0)
    assert ok.budget.budget_bytes == 20 * GiB and ok.budget.error is None
    big = budget.decide(_measured(explicit_kv_bytes=30 * GiB), mode="enforce", margin_bytes=0)
    assert isinstance(big.budget.error, DoesNotFit)
    assert "--kv-cache-memory-bytes" in str(big.budget.error)
    assert str(big.admission.recommended_kv_cache_memory_bytes) in big.budget.error.hint


def test_kv_cap_caps_but_never_below_one_request():
    d = budget.decide(_measured(), mode="enforce", margin_bytes=0, kv_cap_bytes=4 * GiB)
    assert d.budget.budget_bytes == 4 * GiB and "kv_cap" in d.budget.reason
    d = budget.decide(_measured(), mode="enforce", margin_bytes=0, kv_cap_bytes=1)
    assert d.budget.budget_bytes == ONE_REQUEST + BPT * 16  # and vLLM's null block


def test_a_worst_step_that_leaves_no_room_for_one_request_is_refused():
    m = _measured(sweep=_sweep(int(29.5 * GiB), 1 * GiB))
    d = budget.decide(m, mode="enforce", margin_bytes=0)
    assert not d.admission.fits and isinstance(d.budget.error, DoesNotFit)
    assert budget.decide(m, mode="report", margin_bytes=0).budget.error is None


def test_the_stock_oom_context_comes_from_the_sweeps_context_curve_within_the_tolerance():
    curve = [StepResult(Shape("prefill", 2048, c), need, 0.1)
             for c, need in ((0, 1 * GiB), (4096, 1 * GiB + MiB // 2), (6144, 2 * GiB))]
    m = _measured(sweep=_sweep(2 * GiB, 1 * GiB, curve))
    d = budget.decide(m, mode="enforce", margin_bytes=0)
    # half a MiB over stock's need is within the meter's 1 MiB: only 6144 outgrows it
    assert d.admission.stock_oom_context_len == 6144
    assert d.admission.stock_shortfall_bytes == 1 * GiB
    strict = budget.decide(dataclasses.replace(m, tolerance_bytes=0), mode="enforce",
                           margin_bytes=0)
    assert strict.admission.stock_oom_context_len == 4096


@pytest.mark.parametrize("mode", ["enforce", "report"])
def test_the_same_facts_give_the_same_decision(mode):
    assert budget.decide(_measured(), mode=mode, margin_bytes=MiB) == \
        budget.decide(_measured(), mode=mode, margin_bytes=MiB)


def test_the_advice_line_names_the_knee_against_the_configured_chunk():
    from worstcase_profiler.core.advise import knee_line
    from worstcase_profiler.core.types import Advice, ChunkAdvice

    def cand(chunk, kv):
        return ChunkAdvice(chunk=chunk, transient_bytes=chunk * MiB, workspace_bytes=0,
                           worst_shape=Shape("prefill", chunk, 0), budget_bytes=kv * BPT,
                           kv_tokens=kv, fits=True)

    assert knee_line(None) is None
    adv = Advice(configured_chunk=1024, candidates=(cand(512, 9000), cand(1024, 8000)),
                 knee_chunk=512, within=0.05, rule="within 5%")
    assert knee_line(adv) == ("advice: knee at max_num_batched_tokens=512: KV 9,000 tokens "
                              "(+1000 vs 1024 configured), need 512.00 MiB")
    assert knee_line(dataclasses.replace(adv, knee_chunk=None)) is None
