"""Issue: tensor parallel, the same sweep on every rank. The plan fingerprint identifies the
ordered step shapes, and the engine-side check stores every rank's fingerprint and fails closed
naming the ranks when they differ (no engine: the world group is faked)."""

from __future__ import annotations

import json
import sys
import types

import pytest

from worstcase_profiler.adapter import engine
from worstcase_profiler.errors import WcprofError
from worstcase_profiler.report import Shape
from worstcase_profiler.settings import ProfilerSettings
from worstcase_profiler.shapes import (Limits, decode_batch, mixed_step, plan_fingerprint,
                                       prefill_chunk)

LIMITS = Limits(max_model_len=1024, max_num_batched_tokens=128, max_num_seqs=2)


def _plan() -> list[Shape]:
    return ([prefill_chunk(LIMITS, r) for r in (1, 2, 64, 127, 128)]
            + [decode_batch(LIMITS), mixed_step(LIMITS)])


def test_identical_shape_lists_give_equal_fingerprints():
    a, b = _plan(), _plan()
    assert a is not b and a == b
    assert plan_fingerprint(a) == plan_fingerprint(b)
    # built from plain data (what a rank's report holds) it is the same plan
    c = [Shape.model_validate(json.loads(s.model_dump_json())) for s in a]
    assert plan_fingerprint(c) == plan_fingerprint(a)


@pytest.mark.parametrize("field,value", [("rows", 3), ("context_len", 1000), ("num_reqs", 2),
                                         ("kind", "decode")])
def test_one_differing_step_changes_the_fingerprint(field, value):
    plan = _plan()
    changed = list(plan)
    changed[1] = plan[1].model_copy(update={field: value})
    assert changed[1] != plan[1]
    assert plan_fingerprint(changed) != plan_fingerprint(plan)


def test_order_matters():
    plan = _plan()
    swapped = [plan[1], plan[0], *plan[2:]]
    assert plan_fingerprint(swapped) != plan_fingerprint(plan)


# --- the engine-side check, with a faked world group -------------------------------------


def _report_with(make_report, shapes: list[Shape], rank: int = 0):
    rep = make_report(rank=rank)
    step = rep.worstcase.steps[0]
    rep.worstcase.steps = [step.model_copy(update={"shape": s}) for s in shapes]
    return rep


def _fake_world(monkeypatch, others: list[str] | None):
    """A world group of 1 + len(others) ranks whose all_gather answers `others` for the ranks
    after this one (this one is rank 0). None: no distributed state at all."""
    mod = types.ModuleType("vllm.distributed")
    if others is None:
        def get_world_group():
            raise AssertionError("world group is not initialized")
    else:
        group = types.SimpleNamespace(world_size=1 + len(others), rank=0, cpu_group="CPU_GROUP")

        def get_world_group():
            return group

        import torch
        import torch.distributed as dist

        def all_gather(out, tensor, group=None):
            assert group == "CPU_GROUP" and tensor.dtype == torch.uint8
            out[0].copy_(tensor)
            for t, fp in zip(out[1:], others):
                t.copy_(torch.tensor(list(fp.encode("ascii")), dtype=torch.uint8))

        monkeypatch.setattr(dist, "all_gather", all_gather)
    mod.get_world_group = get_world_group
    monkeypatch.setitem(sys.modules, "vllm.distributed", mod)


def test_single_process_stores_its_own_fingerprint(monkeypatch, make_report):
    _fake_world(monkeypatch, None)
    rep = _report_with(make_report, _plan())
    engine._check_same_plan(rep, ProfilerSettings(mode="enforce"))
    assert rep.worstcase.plan_fingerprints == [plan_fingerprint(_plan())]


def test_agreeing_ranks_store_every_fingerprint(monkeypatch, make_report):
    fp = plan_fingerprint(_plan())
    _fake_world(monkeypatch, [fp])
    rep = _report_with(make_report, _plan())
    engine._check_same_plan(rep, ProfilerSettings(mode="enforce"))
    assert rep.worstcase.plan_fingerprints == [fp, fp]


def test_differing_ranks_raise_naming_them(monkeypatch, make_report, tmp_path):
    plan = _plan()
    other = plan_fingerprint(plan[:-1])
    _fake_world(monkeypatch, [plan_fingerprint(plan), other, plan_fingerprint(plan)])
    rep = _report_with(make_report, plan)
    path = tmp_path / "report.json"
    with pytest.raises(WcprofError) as exc:
        engine._check_same_plan(rep, ProfilerSettings(mode="enforce", json_path=str(path)))
    msg = str(exc.value)
    assert "ranks [0, 1, 3]" in msg and "ranks [2]" in msg and other in msg
    # the mismatch is on disk for the operator to compare
    written = json.loads(path.read_text())
    assert written["worstcase"]["plan_fingerprints"][2] == other
    assert len(set(written["worstcase"]["plan_fingerprints"])) == 2
