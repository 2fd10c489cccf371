"""The KV audit per group (issue 33): every KV group, the drafter's included, against its own plan;
a drafter whose layers share the target's group is named in it; the total counts a pool that
several groups overlay once."""

from __future__ import annotations

import pytest

from worstcase_profiler.core import policy
from worstcase_profiler.core.types import KVAuditGroup
from worstcase_profiler.errors import KVOvercommit

GiB, MiB = 1 << 30, 1 << 20


def g(name, declared, allocated, n=1, drafter=(), unplanned=()):
    return KVAuditGroup(name=name, layers=tuple(f"{name}.l{i}" for i in range(n)),
                        declared_bytes=declared, allocated_bytes=allocated,
                        drafter_layers=tuple(drafter), unplanned_layers=tuple(unplanned))


def test_a_draft_group_over_its_plan_is_refused_and_named_though_the_total_fits():
    # the target's group under its plan, the drafter's over it: the sum is within the budget
    groups = [g("group0:FullAttentionSpec", 3 * GiB, GiB), g("group1:SlidingWindowSpec", GiB,
              2 * GiB, drafter=["group1:SlidingWindowSpec.l0"], unplanned=["draft.l1.shadow"])]
    r = policy.kv_audit_verdict(groups, budget=4 * GiB, allowed=4 * GiB, delta_process=None)
    assert r.ratio == pytest.approx(0.75)
    assert r.verdict == "over-budget"
    over = {x.name: x for x in r.groups}
    assert over["group1:SlidingWindowSpec"].verdict == "over-budget"
    assert over["group1:SlidingWindowSpec"].ratio == pytest.approx(2.0)
    assert over["group0:FullAttentionSpec"].verdict == "ok"
    assert "group1:SlidingWindowSpec allocated 2.00 GiB against its plan of 1.00 GiB (x2.00)" \
        in r.message
    assert "group0:FullAttentionSpec allocated" not in r.message  # only the over group is named
    assert "drafter: 1 of 1 layer(s)" in r.message and "1 unplanned" in r.message
    assert isinstance(policy.kv_audit_error(r, "error"), KVOvercommit)


def test_groups_within_their_plans_are_ok_with_ratios():
    groups = [g("group0:MambaSpec", GiB, GiB - MiB, n=3),
              g("group1:FullAttentionSpec", GiB, GiB, n=3, drafter=["x"])]
    r = policy.kv_audit_verdict(groups, budget=GiB, allowed=GiB, delta_process=None,
                                allocated=GiB)  # one pool both groups overlay
    assert r.verdict == "ok" and r.allocated_bytes == GiB and r.ratio == pytest.approx(1.0)
    assert [x.verdict for x in r.groups] == ["ok", "ok"]
    assert r.groups[0].ratio == pytest.approx((GiB - MiB) / GiB)


def test_overlaid_groups_are_not_summed_when_the_distinct_total_is_given():
    groups = [g("a", GiB, GiB), g("b", GiB, GiB)]
    summed = policy.kv_audit_verdict(groups, budget=GiB, allowed=GiB, delta_process=None)
    once = policy.kv_audit_verdict(groups, budget=GiB, allowed=GiB, delta_process=None,
                                   allocated=GiB)
    assert (summed.verdict, once.verdict) == ("over-budget", "ok")


def test_outside_the_plan_has_no_group_verdict_but_counts_in_the_total():
    groups = [g("group0:FullAttentionSpec", GiB, GiB), g("outside the plan", 0, GiB // 2)]
    r = policy.kv_audit_verdict(groups, budget=GiB, allowed=GiB, delta_process=None)
    assert r.verdict == "over-budget" and r.ratio == pytest.approx(1.5)
    outside = r.groups[1]
    assert outside.ratio is None and outside.verdict is None
    assert "against its plan" not in r.message  # no group is over its own plan


def test_group_tolerance_is_one_percent():
    ok = policy.kv_audit_verdict([g("a", GiB, GiB + GiB // 100)], budget=2 * GiB,
                                 allowed=2 * GiB, delta_process=None)
    over = policy.kv_audit_verdict([g("a", GiB, GiB + GiB // 100 + 1)], budget=2 * GiB,
                                   allowed=2 * GiB, delta_process=None)
    assert (ok.verdict, over.verdict) == ("ok", "over-budget")


def test_the_terminal_report_lists_each_group_against_its_plan():
    from worstcase_profiler.render.view import kv_groups_text

    groups = [g("group0:FullAttentionSpec", GiB, GiB, n=3, drafter=["x"]),
              g("group1:MambaSpec", GiB, GiB // 2, n=3), g("outside the plan", 0, MiB)]
    r = policy.kv_audit_verdict(groups, budget=2 * GiB, allowed=2 * GiB, delta_process=None)
    text = kv_groups_text(r)
    assert text == ("; groups: group0:FullAttentionSpec x1.000 of its plan, drafter 1 of 3 "
                    "layers; group1:MambaSpec x0.500 of its plan")
