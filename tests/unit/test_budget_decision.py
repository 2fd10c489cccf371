"""The budget decision (core/admission.decide_budget): the KV bytes handed to vLLM, or the
DoesNotFit that refuses the start. Round numbers, so each expectation can be checked by hand."""

from __future__ import annotations

from dataclasses import replace

from worstcase_profiler.core.admission import compute_admission, decide_budget, host_memory_note
from worstcase_profiler.errors import DoesNotFit

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
    return decide_budget(a, mode=mode, kv_cap=kv_cap, worst_label="prefill 8192/4088",
                         max_model_len=4096)


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
    assert d.budget_bytes == a.least_kv_cache_bytes == a.one_request_bytes + a.pool_block_bytes
    assert decide(a, kv_cap=100 * GiB).budget_bytes == a.budget_bytes  # cap above: no change


def test_admission_decision_is_a_pure_function_of_its_inputs():
    a = adm()
    assert decide(a) == decide(replace(a))


def test_an_explicit_kv_below_one_request_is_named_not_the_budget():
    """Issue 39: --kv-cache-memory-bytes 1048576 said "the KV budget is 2.14 GiB; one request
    needs 4.00 MiB -- lower --max-model-len": the budget was fine, the flag was too small."""
    a = adm(explicit_kv=MiB)  # one request at 4096 tokens needs 128 MiB here
    d = decide(a)
    assert isinstance(d.error, DoesNotFit)
    text = str(d.error)
    assert "--kv-cache-memory-bytes 1048576" in text and "less than one" in text
    assert "KV budget is" not in text
    assert f"--kv-cache-memory-bytes {a.least_kv_cache_bytes} or more" in d.error.hint
    assert str(a.recommended_kv_cache_memory_bytes) in d.error.hint


def test_a_margin_that_alone_leaves_no_room_is_named_as_the_cause():
    """Issue 39: --margin 100GiB printed "budget -97.79 GiB" and did not name the margin."""
    a = adm(margin=100 * GiB)
    d = decide(a)
    assert isinstance(d.error, DoesNotFit)
    assert "margin" in d.error.message and "100.00 GiB" in d.error.message
    room = 20 * GiB - 4 * GiB - 3 * GiB - a.least_kv_cache_bytes
    assert d.error.hint == f"lower the margin to at most 12.87 GiB (--margin {room})"


def test_the_host_memory_note_is_for_a_cpu_budget_without_an_explicit_size():
    """Issue 39 point 8: on the CPU the budget follows the host's free memory; the report says
    so and names the flag that pins it, and only there."""
    a = adm()
    note = host_memory_note(device_kind="cpu", explicit_kv=None, admission=a)
    assert note and "free memory" in note
    assert f"--kv-cache-memory-bytes {a.recommended_kv_cache_memory_bytes}" in note
    assert host_memory_note(device_kind="cpu", explicit_kv=8 * GiB, admission=a) is None
    assert host_memory_note(device_kind="cuda", explicit_kv=None, admission=a) is None
