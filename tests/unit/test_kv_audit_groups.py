"""The KV audit per group (issue 33): every KV group, the drafter's included, against its own plan;
a drafter whose layers share the target's group is named in it; the total counts a pool that
several groups overlay once."""

from __future__ import annotations

import pytest

from worstcase_profiler.core import audits
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
    r = audits.kv_audit_verdict(groups, budget=4 * GiB, allowed=4 * GiB, delta_process=None)
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
    assert isinstance(audits.kv_audit_error(r, "error"), KVOvercommit)


def test_groups_within_their_plans_are_ok_with_ratios():
    groups = [g("group0:MambaSpec", GiB, GiB - MiB, n=3),
              g("group1:FullAttentionSpec", GiB, GiB, n=3, drafter=["x"])]
    r = audits.kv_audit_verdict(groups, budget=GiB, allowed=GiB, delta_process=None,
                                allocated=GiB)  # one pool both groups overlay
    assert r.verdict == "ok" and r.allocated_bytes == GiB and r.ratio == pytest.approx(1.0)
    assert [x.verdict for x in r.groups] == ["ok", "ok"]
    assert r.groups[0].ratio == pytest.approx((GiB - MiB) / GiB)


def test_overlaid_groups_are_not_summed_when_the_distinct_total_is_given():
    groups = [g("a", GiB, GiB), g("b", GiB, GiB)]
    summed = audits.kv_audit_verdict(groups, budget=GiB, allowed=GiB, delta_process=None)
    once = audits.kv_audit_verdict(groups, budget=GiB, allowed=GiB, delta_process=None,
                                   allocated=GiB)
    assert (summed.verdict, once.verdict) == ("over-budget", "ok")


def test_outside_the_plan_has_no_group_verdict_but_counts_in_the_total():
    groups = [g("group0:FullAttentionSpec", GiB, GiB), g("outside the plan", 0, GiB // 2)]
    r = audits.kv_audit_verdict(groups, budget=GiB, allowed=GiB, delta_process=None)
    assert r.verdict == "over-budget" and r.ratio == pytest.approx(1.5)
    outside = r.groups[1]
    assert outside.ratio is None and outside.verdict is None
    assert "against its plan" not in r.message  # no group is over its own plan


def test_group_tolerance_is_one_percent():
    ok = audits.kv_audit_verdict([g("a", GiB, GiB + GiB // 100)], budget=2 * GiB,
                                 allowed=2 * GiB, delta_process=None)
    over = audits.kv_audit_verdict([g("a", GiB, GiB + GiB // 100 + 1)], budget=2 * GiB,
                                   allowed=2 * GiB, delta_process=None)
    assert (ok.verdict, over.verdict) == ("ok", "over-budget")


def test_the_terminal_report_lists_each_group_against_its_plan():
    from worstcase_profiler.render.view import kv_groups_text

    groups = [g("group0:FullAttentionSpec", GiB, GiB, n=3, drafter=["x"]),
              g("group1:MambaSpec", GiB, GiB // 2, n=3), g("outside the plan", 0, MiB)]
    r = audits.kv_audit_verdict(groups, budget=2 * GiB, allowed=2 * GiB, delta_process=None)
    text = kv_groups_text(r)
    assert text == ("; groups: group0:FullAttentionSpec x1.000 of its plan, drafter 1 of 3 "
                    "layers; group1:MambaSpec x0.500 of its plan")


# adapter/kv.allocation on hand-built runners (real tensors and modules, no engine) ----------------

torch = pytest.importorskip("torch")


def _runner(model, ctx, groups, num_blocks, *, speculative=True, tensors=None):
    import types

    vllm_config = types.SimpleNamespace(
        compilation_config=types.SimpleNamespace(static_forward_context=ctx),
        cache_config=types.SimpleNamespace(num_gpu_blocks_override=None),
        speculative_config=object() if speculative else None)
    cfg = types.SimpleNamespace(
        num_blocks=num_blocks, kv_cache_tensors=tensors or [],
        kv_cache_groups=[types.SimpleNamespace(layer_names=list(names), kv_cache_spec=spec)
                         for names, spec in groups])
    return types.SimpleNamespace(vllm_config=vllm_config, model=model), cfg


class _Spec:
    def __init__(self, page):
        self.page_size_bytes = page


class FullAttentionSpec(_Spec):
    pass


class SlidingWindowSpec(_Spec):
    pass


class MambaSpec(_Spec):
    pass


class _Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.kv_cache = torch.tensor([])


def test_overlaid_groups_each_count_their_views_and_the_pool_counts_once():
    """vLLM 0.32: one backing allocation, every group's layers viewing it (a hybrid's attention
    and GDN state overlay the pool): each group its own views, the total the storage once; the
    drafter's layer (not in the target model) named in its group."""
    from worstcase_profiler.adapter import kv as kvmod

    blocks, page = 8, 1024
    buf = torch.zeros(blocks * page * 2, dtype=torch.int8)  # two layers' pages per block
    target = torch.nn.Module()
    target.attn, target.state = _Layer(), _Layer()
    draft = _Layer()
    view = buf.view(blocks, 2, page)
    target.attn.kv_cache = view[:, 0]
    draft.kv_cache = view[:, 1]
    target.state.kv_cache = (view[:, 0, :256], view[:, 1, :512])  # conv, ssm: under the page
    ctx = {"attn": target.attn, "draft": draft, "state": target.state}
    runner, cfg = _runner(target, ctx, [(("attn", "draft"), FullAttentionSpec(page)),
                                        (("state",), MambaSpec(2 * page))], blocks)
    groups, allowed, total = kvmod.allocation(runner, cfg, budget=buf.numel())
    assert total == buf.numel() and allowed == buf.numel()
    by = {x.name: x for x in groups}
    attn, state = by["group0:FullAttentionSpec"], by["group1:MambaSpec"]
    assert attn.allocated_bytes == 2 * blocks * page == attn.declared_bytes
    assert attn.drafter_layers == ("draft",) and state.drafter_layers == ()
    assert state.allocated_bytes == blocks * 768 and len(groups) == 2
    r = audits.kv_audit_verdict(groups, budget=total, allowed=allowed, delta_process=None,
                                allocated=total)
    assert r.verdict == "ok" and [x.verdict for x in r.groups] == ["ok", "ok"]


def test_one_placeholder_per_group_its_real_layers_buffers_counted_in_it():
    """Seed 000's registry: each group lists one placeholder, every other real layer of the group
    calls it and gets a buffer of its own. Both groups' pages have one shape: the module tree
    (the placeholder reached under the buffer's own layer) says whose each buffer is."""
    from worstcase_profiler.adapter import kv as kvmod

    blocks, shape = 4, (2, 4, 16, 2, 8)
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList(torch.nn.Module() for _ in range(6))
    fa, fa_draft = _Layer(), _Layer()
    for i, layer in enumerate(model.layers):
        layer.self_attn = torch.nn.Module()
        layer.self_attn.attn = fa if i < 4 else fa_draft
        if i not in (0, 4):
            layer.self_attn.shadow = _Layer()
            layer.self_attn.shadow.kv_cache = torch.zeros(shape, dtype=torch.bfloat16)
    fa.kv_cache = torch.zeros(shape, dtype=torch.bfloat16)
    fa_draft.kv_cache = torch.zeros(shape, dtype=torch.bfloat16)
    state = _Layer()
    state.kv_cache = (torch.zeros(4, 100, dtype=torch.uint8),)  # a recurrent state, no group's
    model.state = state
    page = fa.kv_cache.numel() * 2 // blocks
    ctx = {"model.layers.0.self_attn.attn": fa, "model.layers.4.self_attn.attn": fa_draft}
    runner, cfg = _runner(model, ctx, [(("model.layers.0.self_attn.attn",),
                                        FullAttentionSpec(page)),
                                       (("model.layers.4.self_attn.attn",),
                                        SlidingWindowSpec(page))], blocks, speculative=False)
    groups, allowed, total = kvmod.allocation(runner, cfg, budget=2 * blocks * page)
    by = {x.name: x for x in groups}
    full, draft = by["group0:FullAttentionSpec"], by["group1:SlidingWindowSpec"]
    assert full.unplanned_layers == tuple(f"layers.{i}.self_attn.shadow" for i in (1, 2, 3))
    assert draft.unplanned_layers == ("layers.5.self_attn.shadow",)
    assert (full.allocated_bytes, draft.allocated_bytes) == (4 * blocks * page, 2 * blocks * page)
    assert by["outside the plan"].allocated_bytes == 400
    assert total == 6 * blocks * page + 400
    r = audits.kv_audit_verdict(groups, budget=allowed, allowed=allowed, delta_process=None,
                                allocated=total)
    assert r.verdict == "over-budget"
    assert "group1:SlidingWindowSpec allocated" in r.message and "(x2.00)" in r.message
    assert "group0:FullAttentionSpec allocated" in r.message and "(x4.00)" in r.message


class UniformTypeKVCacheSpecs(_Spec):
    """vLLM's aggregate spec: its page_size_bytes is the sum of its layers' pages."""
    def __init__(self, specs):
        super().__init__(sum(x.page_size_bytes for x in specs.values()))
        self.kv_cache_specs = specs


def test_a_uniform_type_group_declares_its_layers_pages_once():
    """DSv3.2's sparse MLA (one UniformTypeKVCacheSpecs group of 16 layers, H200 run 34): the
    plan was read as the aggregate page times the layers, 16x what the plan allocates
    ('61.39 GiB in 16 holder(s) (plan 982.30 GiB)'). Each layer's page, once."""
    from worstcase_profiler.adapter import kv as kvmod

    blocks, page, n = 4, 512, 3
    names = [f"layers.{i}.attn" for i in range(n)]
    buf = torch.zeros(blocks * page * n, dtype=torch.int8)
    view = buf.view(blocks, n, page)
    model = torch.nn.Module()
    layers = [_Layer() for _ in names]
    for i, layer in enumerate(layers):
        layer.kv_cache = view[:, i]
        model.add_module(f"l{i}", layer)
    spec = UniformTypeKVCacheSpecs({name: _Spec(page) for name in names})
    runner, cfg = _runner(model, dict(zip(names, layers)), [(tuple(names), spec)], blocks,
                          speculative=False)
    groups, allowed, total = kvmod.allocation(runner, cfg, budget=buf.numel())
    (g,) = groups
    assert g.declared_bytes == blocks * n * page == g.allocated_bytes == total
    r = audits.kv_audit_verdict(groups, budget=total, allowed=allowed, delta_process=None,
                                allocated=total)
    assert r.verdict == "ok" and r.groups[0].ratio == 1.0
