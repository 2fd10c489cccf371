"""The start-up audits (core/audits.py): what KV initialisation allocated against the budget, and
what warm-up kept against what admission set aside (more in test_warmup_audit.py). Round
numbers, so each expectation can be checked by hand."""

from __future__ import annotations

import pytest

from worstcase_profiler.core.audits import kv_audit_error, kv_audit_verdict, warmup_verdict
from worstcase_profiler.core.types import KVAuditGroup
from worstcase_profiler.errors import DoesNotFit, KVOvercommit

GiB = 1024**3
MiB = 1024**2


def group(name, declared, allocated, n=1):
    return KVAuditGroup(name=name, layers=tuple(f"l{i}" for i in range(n)),
                        declared_bytes=declared, allocated_bytes=allocated)


def test_kv_audit_within_budget_is_ok_and_does_not_refuse():
    r = kv_audit_verdict([group("attn", GiB, GiB)], budget=GiB, allowed=GiB,
                         delta_process=None)
    assert r.verdict == "ok" and r.ratio == pytest.approx(1.0)
    assert kv_audit_error(r, "error") is None


def test_kv_audit_names_the_overcommit_of_seed_000():
    groups = [group("attn", GiB, 4 * GiB, n=4), group("outside every group", 0, GiB // 2)]
    r = kv_audit_verdict(groups, budget=GiB, allowed=GiB, delta_process=5 * GiB)
    assert r.verdict == "over-budget"
    assert r.ratio == pytest.approx(4.5)
    assert "x4.50" in r.message and "4 holder(s)" in r.message
    err = kv_audit_error(r, "error")
    assert isinstance(err, KVOvercommit) and "kv_audit=warn" in err.hint
    assert kv_audit_error(r, "warn") is None


def test_kv_audit_tolerance_is_one_percent():
    ok = kv_audit_verdict([group("a", GiB, GiB + GiB // 100)], budget=GiB, allowed=GiB,
                          delta_process=None)
    over = kv_audit_verdict([group("a", GiB, GiB + GiB // 100 + 1)], budget=GiB,
                            allowed=GiB, delta_process=None)
    assert (ok.verdict, over.verdict) == ("ok", "over-budget")


def test_kv_audit_with_nothing_allowed_is_over_budget_not_a_crash():
    r = kv_audit_verdict([group("a", 0, MiB)], budget=0, allowed=0, delta_process=None)
    assert r.verdict == "over-budget" and r.ratio == float("inf")


def test_warm_up_creating_the_counted_residue_is_within_what_was_set_aside():
    kw = dict(resident=112 * MiB, graphs=0, accounted=0, margin=64 * MiB, mode="enforce",
              kv_cache_bytes=50 * GiB, cached=True)
    audit, error = warmup_verdict(**kw)
    assert audit.outside_bytes == 112 * MiB and isinstance(error, DoesNotFit)
    audit, error = warmup_verdict(**kw, residue=112 * MiB)
    assert error is None and audit.outside_bytes == 0 and audit.accounted_bytes == 112 * MiB


def test_a_given_kv_size_below_the_budget_leaves_its_spare_for_what_warm_up_kept():
    # seed 000's launch on the H200: --kv-cache-memory-bytes 6 GiB against a 53 GiB worst-case
    # budget; warm-up kept 1.05 GiB of graphs the first start had set nothing aside for. The
    # 47 GiB the KV cache was not given stay free beside the worst step's headroom.
    kw = dict(resident=GiB + GiB // 20, graphs=GiB + GiB // 20, accounted=0, margin=64 * MiB,
              mode="enforce", kv_cache_bytes=6 * GiB, cached=True)
    audit, error = warmup_verdict(**kw)
    assert isinstance(error, DoesNotFit)  # no spare: the headroom is gone
    audit, error = warmup_verdict(**kw, spare=47 * GiB)
    assert error is None and audit.verdict == "ok" and audit.outside_bytes < 0
    assert "leaves 47.00 GiB of the worst-case KV budget unused" in audit.message
    assert "explicit --kv-cache-memory-bytes, or the pool the measured plan covers" in \
        audit.message
    # a spare smaller than what was kept still refuses, by the rest
    audit, error = warmup_verdict(**kw, spare=512 * MiB)
    assert isinstance(error, DoesNotFit)
    assert audit.outside_bytes == GiB + GiB // 20 - 512 * MiB
    # a budget below the KV given (report mode) is no spare
    audit, error = warmup_verdict(**kw, spare=-GiB)
    assert isinstance(error, DoesNotFit) and audit.outside_bytes == GiB + GiB // 20
