"""max_model_len: auto (issue 37 point 2): the pure decision (core/fit.apply_longest, through
core/budget.decide) over the advisor's fake StepDriver, the engine core's agreement
(core/fit.agreed_max_model_len) and the setting itself. The engine side runs in
tests/cpu/test_max_model_len_auto_engine.py."""

from __future__ import annotations

import dataclasses

import pytest

from test_advise import BPT, HELD, LIMITS, FakeDriver
from test_fit import _fit
from worstcase_profiler.adapter.fitting import measure, measure_fit
from worstcase_profiler.core import budget
from worstcase_profiler.core import fit as core
from worstcase_profiler.core.admission import least_kv_cache_bytes
from worstcase_profiler.core.sweep import run_sweep
from worstcase_profiler.core.types import WarmupEstimate, Workspace
from worstcase_profiler.errors import ConfigError, DoesNotFit
from worstcase_profiler.settings import from_mapping, load

MiB = 1 << 20
BLOCK = LIMITS.block_size  # 16
CHUNK, SEQS = LIMITS.max_num_batched_tokens, LIMITS.max_num_seqs  # 1024, 8


def _weigh(facts, mml: int, n: int) -> core.FitCandidate:
    """One candidate at the engine's chunk and max_num_seqs, weighed on its own."""
    return core._Weigher(facts).candidate(mml, CHUNK, SEQS, n)


def _blocks(tokens: int) -> int:
    return -(-tokens // BLOCK) * BLOCK


def test_the_longest_length_holding_n_requests_is_chosen_and_one_block_more_is_not_feasible():
    explicit = 8192 * BPT  # 512 blocks; less the null block, three requests of 2,720 (170 each)
    f, facts, _ = _fit(n=3, explicit_kv=explicit)
    got = core.apply_longest(facts, f, min_concurrency=3)
    assert got.error is None
    chosen = got.fit.applied_max_model_len
    usable = 8192 - BLOCK
    assert chosen == 2720 and 3 * _blocks(chosen) <= usable < 3 * (_blocks(chosen) + BLOCK)
    here, above = _weigh(facts, chosen, 3), _weigh(facts, chosen + BLOCK, 3)
    assert here.feasible and here.concurrency == 3
    assert above.fits and not above.feasible and above.concurrency == 2
    # the admission the start applies is at that length, and it fits
    adm = got.admission
    assert adm.fits and adm.one_request_bytes == chosen * BPT
    assert adm.kv_cache_bytes == explicit and adm.transient_bytes == here.transient_bytes
    # why, in one line: the length, the engine's limits, what it holds, the next block
    why = got.fit.applied_why
    assert why.startswith("max_model_len auto: 2,720 (of 4,096)")
    assert "max_num_batched_tokens 1,024, max_num_seqs 8, 3 request(s)" in why
    assert "at 2,736 it would hold 2" in why
    # the same facts, the same answer
    assert core.apply_longest(facts, f, min_concurrency=3) == got


def test_a_roomy_budget_keeps_the_engines_own_length():
    f, facts, _ = _fit(n=1)  # 8 GiB requested: 16 MiB a request at 4,096
    got = core.apply_longest(facts, f, min_concurrency=1)
    assert got.fit.applied_max_model_len == LIMITS.max_model_len
    assert "the engine's max_model_len, the longest weighed" in got.fit.applied_why


def _measured(facts, fm, explicit):
    return budget.Measured(
        limits=LIMITS, sweep=facts.sweep, held=HELD, workspace=Workspace(),
        warmup=WarmupEstimate(), stock_kv_bytes=5 << 30, bytes_per_token=BPT,
        one_request_bytes=LIMITS.max_model_len * BPT, explicit_kv_bytes=explicit,
        tolerance_bytes=0, fit_measurements=fm, device_total_bytes=16 << 30,
        gpu_memory_utilization=0.5)


def _decide(explicit, *, auto=True, n=1, fit_ran=True):
    drv = FakeDriver(LIMITS)
    sweep = run_sweep(drv, tolerance=0, attribute_ops=False)
    fm = measure_fit(drv, LIMITS, sweep, (CHUNK,), (SEQS,)) if fit_ran else None
    facts = core.FitFacts(limits=LIMITS, sweep=sweep, held=HELD, admission=None,
                          workspace=Workspace(), measured=fm)
    return budget.decide(_measured(facts, fm, explicit), mode="enforce", margin_bytes=64 * MiB,
                         fit_min_concurrency=n, auto_max_model_len=auto)


def test_the_decision_starts_at_the_chosen_length_where_the_engines_own_is_refused():
    explicit = 3000 * BPT  # 187 whole blocks: one request of 2,976 beside the null block
    fixed = _decide(explicit, auto=False)
    assert isinstance(fixed.budget.error, DoesNotFit)  # 4,096 does not fit in it
    d = _decide(explicit)
    assert d.budget.error is None and d.budget.budget_bytes == explicit
    assert d.fit.applied_max_model_len == 2976 == (3000 // BLOCK - 1) * BLOCK
    assert "at 2,992 it would not hold one request" in d.fit.applied_why
    assert d.admission.fits and d.admission.one_request_bytes == 2976 * BPT
    assert d.admission.least_kv_cache_bytes <= explicit < d.admission.least_kv_cache_bytes + \
        BLOCK * BPT
    again = _decide(explicit)  # the same config, the same answer (the fit's timings aside)
    assert (again.admission, again.budget, again.fit.applied_max_model_len,
            again.fit.applied_why) == (d.admission, d.budget, 2976, d.fit.applied_why)


def test_nothing_fits_is_refused_naming_the_least_that_would():
    small = 1000 * BPT  # less than one request at the chunk (1,024), the shortest weighed
    d = _decide(small)
    err = d.budget.error
    assert isinstance(err, DoesNotFit) and d.fit.applied_max_model_len is None
    assert "no max_model_len from 1,024 to 4,096" in err.message
    assert d.fit.applied_why == err.message
    least = least_kv_cache_bytes(1024 * BPT, bytes_per_token=BPT, block_size=BLOCK)
    assert f"--kv-cache-memory-bytes {least} or more" in err.hint
    # and it would: the least named starts at the chunk's length
    ok = _decide(least)
    assert ok.budget.error is None and ok.fit.applied_max_model_len == 1024
    assert _decide(least - 1).budget.error is not None
    # more requests than max_num_seqs can hold at once: say so
    many = _decide(64 * MiB, n=SEQS + 1).budget.error
    assert isinstance(many, DoesNotFit) and "--max-num-seqs to 9" in many.hint


def test_without_the_fits_steps_nothing_is_chosen_and_the_start_is_refused():
    d = _decide(8192 * BPT, fit_ran=False)
    assert isinstance(d.budget.error, DoesNotFit) and d.fit is None
    assert "--max-model-len N" in d.budget.error.hint


def test_the_engine_core_applies_the_least_any_worker_chose():
    assert core.agreed_max_model_len(4096, [2720]) == 2720
    assert core.agreed_max_model_len(4096, [2720, 2704]) == 2704
    assert core.agreed_max_model_len(2048, [2720]) == 2048  # never above the configured one
    for bad in ([], [None], [2720, None]):
        with pytest.raises(ValueError):
            core.agreed_max_model_len(4096, bad)


def test_the_setting_is_checked_and_measures_only_the_engines_own_chunk_and_seqs():
    assert from_mapping({"max_model_len": "auto"}).auto_max_model_len
    assert not from_mapping({}).auto_max_model_len
    assert not from_mapping({"max_model_len": "auto", "mode": "off"}).auto_max_model_len
    for bad in (4096, "4096", "Auto", True):
        with pytest.raises(ConfigError) as e:
            from_mapping({"max_model_len": bad})
        assert "--max-model-len" in e.value.hint
    with pytest.raises(ConfigError):  # the cap would cut the KV the length was chosen for
        load(environ={"WCPROF_CONFIG": '{"max_model_len": "auto", "kv_cap_bytes": "1GiB"}'})
    with pytest.raises(ConfigError, match="report mode"):  # report mode changes nothing
        load(environ={"WCPROF_CONFIG": '{"max_model_len": "auto", "mode": "report"}'})
    with pytest.raises(ConfigError, match="chunk_cap"):  # levels weighed at the swept length
        load(environ={"WCPROF_CONFIG": '{"max_model_len": "auto", "chunk_cap": 128}'})
    drv = FakeDriver(LIMITS)
    sweep = run_sweep(drv, tolerance=0, attribute_ops=False)
    got = measure(drv, LIMITS, sweep, None, from_mapping({"max_model_len": "auto"}))
    assert got is not None and (got.chunks, got.seqs) == ((CHUNK,), (SEQS,))


def test_wcprof_runs_at_its_max_model_len_whatever_the_environment_says():
    from types import SimpleNamespace

    from worstcase_profiler.commands.profile import _settings
    from worstcase_profiler.preflight import check_wcprof_section

    ns = SimpleNamespace(exhaustive=False, no_lock_workspace=False, no_cache=False)
    section = _settings(ns, "/tmp/r.json", True, {}, {})
    env = {"WCPROF_CONFIG": '{"max_model_len": "auto"}'}
    assert not load(additional_config={"worstcase_profiler": section}, environ=env).max_model_len
    with pytest.raises(ConfigError) as e:
        check_wcprof_section({"worstcase_profiler": {"max_model_len": "auto"}}, environ={})
    assert "wcprof fit" in e.value.hint


def test_limits_are_unchanged_for_a_start_without_the_setting():
    d = _decide(8192 * BPT, auto=False)
    assert d.fit is not None and d.fit.applied_max_model_len is None and d.fit.applied_why is None
    assert d.admission.one_request_bytes == LIMITS.max_model_len * BPT
    assert dataclasses.replace(d.fit) == d.fit
