"""Start-up policy (core/policy.py): the pure decisions the adapter applies. Round numbers, so
each expectation can be checked by hand; warm-up and plan agreement have their own files."""

from __future__ import annotations

from dataclasses import replace

import pytest

from worstcase_profiler.core import policy
from worstcase_profiler.core.admission import compute_admission
from worstcase_profiler.core.types import KVAuditGroup
from worstcase_profiler.errors import DoesNotFit, KVOvercommit

GiB = 1024**3
MiB = 1024**2
BPT = 32 * 1024


def adm(**over):
    args = dict(requested=20 * GiB, consumed=4 * GiB, weights=3 * GiB, non_torch=GiB // 2,
                worst_transient=3 * GiB, stock_need=2 * GiB, stock_kv=14 * GiB, cudagraph=0,
                margin=GiB // 2, bytes_per_token=BPT, block_size=16, max_model_len=4096)
    args.update(over)
    return compute_admission(**args)


def decide(a, mode="enforce", kv_cap=None):
    return policy.decide_budget(a, mode=mode, kv_cap=kv_cap, worst_label="prefill 8192/4088",
                                max_model_len=4096)


# decide_budget ---------------------------------------------------------------------------------

def test_enforce_hands_vllm_the_worst_case_budget():
    a = adm()
    d = decide(a)
    assert d.error is None
    assert d.budget_bytes == a.budget_bytes == 20 * GiB - 4 * GiB - 3 * GiB - GiB // 2
    assert d.reason == "worst-case budget"


def test_report_mode_keeps_vllms_figure_and_never_refuses():
    a = adm(worst_transient=30 * GiB)  # does not fit
    assert not a.fits
    d = decide(a, mode="report")
    assert d.error is None
    assert d.budget_bytes == 14 * GiB
    assert "report mode" in d.reason


def test_enforce_refuses_a_configuration_that_does_not_fit_and_says_what_to_lower():
    a = adm(worst_transient=16 * GiB)
    d = decide(a)
    assert isinstance(d.error, DoesNotFit)
    assert "max_model_len=4096" in str(d.error)
    assert "--max-model-len" in d.error.hint
    assert d.budget_bytes == 0  # never negative


def test_too_large_explicit_kv_is_refused_with_the_flag_value_that_fits():
    a = adm(explicit_kv=13 * GiB)
    assert not a.fits
    d = decide(a)
    assert isinstance(d.error, DoesNotFit)
    assert f"--kv-cache-memory-bytes {a.recommended_kv_cache_memory_bytes}" in d.error.hint
    assert str(13 * GiB) in str(d.error)


def test_explicit_kv_that_fits_is_used_as_given():
    d = decide(adm(explicit_kv=8 * GiB))
    assert d.error is None and d.budget_bytes == 8 * GiB
    assert d.reason == "explicit --kv-cache-memory-bytes"


def test_kv_cap_limits_the_budget_but_never_below_one_request():
    a = adm()
    d = decide(a, kv_cap=GiB)
    assert d.budget_bytes == GiB and d.reason.endswith("capped by kv_cap")
    d = decide(a, kv_cap=1)
    assert d.budget_bytes == a.one_request_bytes
    assert decide(a, kv_cap=100 * GiB).budget_bytes == a.budget_bytes  # cap above: no change


# cache reuse ------------------------------------------------------------------------------------

@pytest.mark.parametrize("measured,valid", [
    (GiB, True),                      # same
    (GiB + GiB // 50, True),          # +2%: within the allowance
    (GiB + GiB // 50 + 1, False),     # just past it: needs a new sweep
    (GiB - GiB // 10, True),          # needing less is the safe direction
    (GiB - GiB // 10 - 1, False),     # far less: another build
])
def test_cache_verdict_bounds(measured, valid):
    ok, allowed = policy.cache_verdict(GiB, measured, tolerance=MiB)
    assert ok is valid
    assert allowed == GiB // 50


def test_cache_verdict_allowance_is_at_least_the_meter_tolerance():
    ok, allowed = policy.cache_verdict(10 * MiB, 10 * MiB + 3 * MiB, tolerance=4 * MiB)
    assert ok and allowed == 4 * MiB


def test_still_worst_catches_a_forged_small_worst_step():
    assert policy.still_worst(GiB, [GiB // 2, GiB + MiB], allowed=MiB)
    assert not policy.still_worst(GiB // 4, [GiB // 2], allowed=MiB)
    assert policy.still_worst(GiB, [], allowed=0)


def test_reuse_transient_same_config_same_answer_else_the_larger():
    assert policy.reuse_transient(GiB, GiB + MiB // 4, resolution=MiB // 2) == GiB
    assert policy.reuse_transient(GiB, GiB - 50 * MiB, resolution=MiB // 2) == GiB
    assert policy.reuse_transient(GiB, GiB + 5 * MiB, resolution=MiB // 2) == GiB + 5 * MiB


def test_reuse_consumed_keeps_the_cached_figure_when_the_baseline_matches():
    kw = dict(cached_baseline=10 * GiB, cached_consumed=10 * GiB + 300 * MiB,
              resolution=MiB // 2)
    assert policy.reuse_consumed(baseline_now=10 * GiB, replay_residue=10 * MiB, **kw) \
        == 10 * GiB + 300 * MiB


def test_reuse_consumed_adds_the_sweeps_residue_to_a_moved_baseline():
    kw = dict(cached_baseline=10 * GiB, cached_consumed=10 * GiB + 300 * MiB,
              resolution=MiB // 2)
    # this node holds 1 GiB more before the replay: the residue rides on top of it
    assert policy.reuse_consumed(baseline_now=11 * GiB, replay_residue=10 * MiB, **kw) \
        == 11 * GiB + 300 * MiB
    # the replay itself left more than the sweep did: that is counted, never less
    assert policy.reuse_consumed(baseline_now=10 * GiB, replay_residue=400 * MiB, **kw) \
        == 10 * GiB + 400 * MiB


# KV audit (seed 000) ----------------------------------------------------------------------------

def group(name, declared, allocated, n=1):
    return KVAuditGroup(name=name, layers=tuple(f"l{i}" for i in range(n)),
                        declared_bytes=declared, allocated_bytes=allocated)


def test_kv_audit_within_budget_is_ok_and_does_not_refuse():
    r = policy.kv_audit_verdict([group("attn", GiB, GiB)], budget=GiB, allowed=GiB,
                                delta_process=None)
    assert r.verdict == "ok" and r.ratio == pytest.approx(1.0)
    assert policy.kv_audit_error(r, "error") is None


def test_kv_audit_names_the_overcommit_of_seed_000():
    groups = [group("attn", GiB, 4 * GiB, n=4), group("outside every group", 0, GiB // 2)]
    r = policy.kv_audit_verdict(groups, budget=GiB, allowed=GiB, delta_process=5 * GiB)
    assert r.verdict == "over-budget"
    assert r.ratio == pytest.approx(4.5)
    assert "x4.50" in r.message and "4 holder(s)" in r.message
    err = policy.kv_audit_error(r, "error")
    assert isinstance(err, KVOvercommit) and "kv_audit=warn" in err.hint
    assert policy.kv_audit_error(r, "warn") is None


def test_kv_audit_tolerance_is_one_percent():
    ok = policy.kv_audit_verdict([group("a", GiB, GiB + GiB // 100)], budget=GiB, allowed=GiB,
                                 delta_process=None)
    over = policy.kv_audit_verdict([group("a", GiB, GiB + GiB // 100 + 1)], budget=GiB,
                                   allowed=GiB, delta_process=None)
    assert (ok.verdict, over.verdict) == ("ok", "over-budget")


def test_kv_audit_with_nothing_allowed_is_over_budget_not_a_crash():
    r = policy.kv_audit_verdict([group("a", 0, MiB)], budget=0, allowed=0, delta_process=None)
    assert r.verdict == "over-budget" and r.ratio == float("inf")


# sweep depth ------------------------------------------------------------------------------------

def test_sweep_depth_full_unless_asked_or_proven(monkeypatch):
    assert policy.sweep_depth("full", "NewForCausalLM", eager=lambda: True)[0] == "full"
    assert policy.sweep_depth("cut-down", "NewForCausalLM", eager=lambda: True)[0] == "cut-down"
    depth, why = policy.sweep_depth("auto", "NewForCausalLM", eager=lambda: True)
    assert depth == "full" and "not yet proven" in why and "sweep_depth=prove" in why
    monkeypatch.setitem(policy.CUT_DOWN_PROVEN, "NewForCausalLM", "run N")
    depth, why = policy.sweep_depth("auto", "NewForCausalLM", eager=lambda: True)
    assert depth == "cut-down" and "run N" in why


def test_a_family_proven_on_cuda_is_swept_whole_elsewhere(monkeypatch):
    monkeypatch.setitem(policy.CUT_DOWN_PROVEN, "NewForCausalLM", "run N")
    depth, why = policy.sweep_depth("auto", "NewForCausalLM", eager=lambda: True,
                                    device_kind="cpu")
    assert depth == "full" and "on CUDA devices, not on cpu" in why
    assert policy.sweep_depth("cut-down", "NewForCausalLM", eager=lambda: True,
                              device_kind="cpu")[0] == "cut-down"


def test_prove_runs_both_sweeps_on_any_family_that_can_be_cut():
    depth, why = policy.sweep_depth("prove", "NewForCausalLM", eager=lambda: True)
    assert depth == "prove" and "full, then cut-down" in why


def test_a_proof_accepts_a_tie_between_two_shapes_within_the_resolution():
    from worstcase_profiler.core.types import RowsCoverage, Shape, StepResult, SweepResult

    def sweep(*steps, peak):
        stock = StepResult(Shape("stock", 64, 0, 1), MiB, 0.0)
        worst = max(steps, key=lambda r: r.peak_bytes)
        return SweepResult(stock=stock, steps=steps, worst=worst, worst_op=None, peak_bytes=peak,
                           coverage=RowsCoverage((), 64, 0, 0, 0, (), "", ""), context_curve=(), rows_max=64,
                           post_profile_bytes=0, seconds=1.0)

    a, b = Shape("prefill", 64, 100, 512), Shape("prefill", 64, 100, 256)
    full = sweep(StepResult(a, 100 * MiB, 0.0), StepResult(b, 100 * MiB - 9000, 0.0),
                 peak=102 * MiB)
    cut = sweep(StepResult(b, 100 * MiB - 9000, 0.0), peak=102 * MiB)
    assert policy.judge_cut_down(full, cut, depth="1 of 2", resolution=MiB).proven
    far = sweep(StepResult(b, 90 * MiB, 0.0), peak=92 * MiB)
    proof = policy.judge_cut_down(full, far, depth="1 of 2", resolution=MiB)
    assert not proof.proven and "confirmed peak" in proof.verdict and "admits" in proof.verdict


def test_a_compiled_forward_is_cut_down_only_where_its_family_was_proven_compiled(monkeypatch):
    monkeypatch.setitem(policy.CUT_DOWN_PROVEN, "NewForCausalLM", "run N")
    depth, why = policy.sweep_depth("auto", "NewForCausalLM", eager=lambda: False)
    assert depth == "full" and "eager forwards only" in why
    for setting in ("cut-down", "prove"):
        assert policy.sweep_depth(setting, "NewForCausalLM", eager=lambda: False)[0] == setting
    assert "no proof has covered" in policy.sweep_depth("cut-down", "NewForCausalLM",
                                                        eager=lambda: False)[1]
    monkeypatch.setitem(policy.CUT_DOWN_PROVEN_COMPILED, "NewForCausalLM", "run M")
    depth, why = policy.sweep_depth("auto", "NewForCausalLM", eager=lambda: False)
    assert depth == "cut-down" and "compiled" in why and "run M" in why
    assert "no proof" not in policy.sweep_depth("cut-down", "NewForCausalLM", eager=lambda: False)[1]
    depth, why = policy.sweep_depth("auto", "NewForCausalLM", eager=lambda: True)
    assert depth == "cut-down" and "run N" in why
    # the compiled proofs ran on the V2 runner at TP=1: elsewhere a compiled forward is swept whole
    for kw in ({"runner": "v1"}, {"tensor_parallel_size": 2}):
        depth, why = policy.sweep_depth("auto", "NewForCausalLM", eager=lambda: False, **kw)
        assert depth == "full" and "V2 runner at TP=1" in why, kw
        assert policy.sweep_depth("auto", "NewForCausalLM", eager=lambda: True, **kw)[0] == "cut-down"


def test_admission_decision_is_a_pure_function_of_its_inputs():
    a = adm()
    assert decide(a) == decide(replace(a))


# validation ------------------------------------------------------------------------------------

def test_a_validation_fails_only_beyond_the_meters_resolution():
    from worstcase_profiler.core.types import Validation
    from worstcase_profiler.render.view import validation_text

    def v(measured, resolution):
        return Validation(measured_peak_bytes=measured, predicted_peak_bytes=100 * MiB,
                          ratio=measured / (100 * MiB), requests=("r",), seconds=1.0,
                          resolution_bytes=resolution)

    assert not policy.validation_exceeded(v(100 * MiB, 0))
    assert policy.validation_exceeded(v(100 * MiB + 1, 0))  # an exact meter: one byte over fails
    within = v(100 * MiB + 256 * 1024, 512 * 1024)
    assert not policy.validation_exceeded(within)
    assert "within the meter's 512.0 KiB resolution" in validation_text(within)
    assert policy.validation_exceeded(v(100 * MiB + 512 * 1024 + 1, 512 * 1024))
    assert "resolution" not in validation_text(v(90 * MiB, 512 * 1024))


def test_sweep_depth_walks_the_model_only_when_the_answer_could_be_cut_down():
    def never():
        raise AssertionError("asked whether the model runs eagerly")

    assert policy.sweep_depth("full", "LlamaForCausalLM", eager=never)[0] == "full"
    assert policy.sweep_depth("auto", "NewForCausalLM", eager=never)[0] == "full"


def test_warm_up_creating_the_counted_residue_is_within_what_was_set_aside():
    kw = dict(resident=112 * MiB, graphs=0, accounted=0, margin=64 * MiB, mode="enforce",
              kv_cache_bytes=50 * GiB, cached=True)
    audit, error = policy.warmup_verdict(**kw)
    assert audit.outside_bytes == 112 * MiB and isinstance(error, DoesNotFit)
    audit, error = policy.warmup_verdict(**kw, residue=112 * MiB)
    assert error is None and audit.outside_bytes == 0 and audit.accounted_bytes == 112 * MiB



def test_a_replay_stops_once_formed_and_one_finished_or_once_formed_when_told():
    from worstcase_profiler.core.policy import replay_stops

    assert replay_stops(True, 1, 4, "finished") and not replay_stops(True, 0, 4, "finished")
    assert replay_stops(True, 0, 4, "formed") and not replay_stops(False, 3, 4, "formed")
    assert not replay_stops(True, 4, 4, "formed")  # nothing left running to stop


def test_an_explicit_kv_below_one_request_is_named_not_the_budget():
    """Issue 39: --kv-cache-memory-bytes 1048576 said "the KV budget is 2.14 GiB; one request
    needs 4.00 MiB -- lower --max-model-len": the budget was fine, the flag was too small."""
    a = adm(explicit_kv=MiB)  # one request at 4096 tokens needs 128 MiB here
    d = decide(a)
    assert isinstance(d.error, DoesNotFit)
    text = str(d.error)
    assert "--kv-cache-memory-bytes 1048576" in text and "less than one" in text
    assert "KV budget is" not in text
    assert f"--kv-cache-memory-bytes {a.one_request_bytes} or more" in d.error.hint
    assert str(a.recommended_kv_cache_memory_bytes) in d.error.hint


def test_a_margin_that_alone_leaves_no_room_is_named_as_the_cause():
    """Issue 39: --margin 100GiB printed "budget -97.79 GiB" and did not name the margin."""
    a = adm(margin=100 * GiB)
    d = decide(a)
    assert isinstance(d.error, DoesNotFit)
    assert "margin" in d.error.message and "100.00 GiB" in d.error.message
    room = 20 * GiB - 4 * GiB - 3 * GiB - a.one_request_bytes
    assert d.error.hint == f"lower the margin to at most 12.88 GiB (--margin {room})"


def test_the_host_memory_note_is_for_a_cpu_budget_without_an_explicit_size():
    """Issue 39 point 8: on the CPU the budget follows the host's free memory; the report says
    so and names the flag that pins it, and only there."""
    a = adm()
    note = policy.host_memory_note(device_kind="cpu", explicit_kv=None, admission=a)
    assert note and "free memory" in note
    assert f"--kv-cache-memory-bytes {a.recommended_kv_cache_memory_bytes}" in note
    assert policy.host_memory_note(device_kind="cpu", explicit_kv=8 * GiB, admission=a) is None
    assert policy.host_memory_note(device_kind="cuda", explicit_kv=None, admission=a) is None
