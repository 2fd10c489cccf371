"""Issue: tensor parallel, the same sweep on every rank. The plan fingerprint identifies the
ordered step shapes, and the engine-side check stores every rank's fingerprint and fails closed
naming the ranks when they differ (no engine: the world group is faked)."""

from __future__ import annotations

import dataclasses
import json
import sys
import types

import pytest

from unit_helpers import build_session
from worstcase_profiler.adapter import startup
from worstcase_profiler.core.replay_rules import plan_agreement
from worstcase_profiler.core.shapes import (Limits, decode_batch, mixed_step, plan_fingerprint,
                                            prefill_chunk)
from worstcase_profiler.core.types import Shape, StepResult

LIMITS = Limits(max_model_len=1024, max_num_batched_tokens=128, max_num_seqs=2)


def _plan() -> list[Shape]:
    return ([prefill_chunk(LIMITS, r) for r in (1, 2, 64, 127, 128)]
            + [decode_batch(LIMITS), mixed_step(LIMITS)])


def test_identical_shape_lists_give_equal_fingerprints():
    a, b = _plan(), _plan()
    assert a is not b and a == b
    assert plan_fingerprint(a) == plan_fingerprint(b)
    # built from plain data (what a rank's report holds) it is the same plan
    c = [Shape(**json.loads(json.dumps(dataclasses.asdict(s)))) for s in a]
    assert plan_fingerprint(c) == plan_fingerprint(a)


@pytest.mark.parametrize("field,value", [("rows", 3), ("context_len", 1000), ("num_reqs", 2),
                                         ("kind", "decode")])
def test_one_differing_step_changes_the_fingerprint(field, value):
    plan = _plan()
    changed = list(plan)
    changed[1] = dataclasses.replace(plan[1], **{field: value})
    assert changed[1] != plan[1]
    assert plan_fingerprint(changed) != plan_fingerprint(plan)


def test_order_matters():
    plan = _plan()
    swapped = [plan[1], plan[0], *plan[2:]]
    assert plan_fingerprint(swapped) != plan_fingerprint(plan)


# --- the engine-side check, with a faked world group -------------------------------------


def _steps(shapes: list[Shape]) -> tuple[StepResult, ...]:
    return tuple(StepResult(shape=s, peak_bytes=1, seconds=0.0) for s in shapes)


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

        torch = pytest.importorskip("torch")  # the gather moves real uint8 tensors
        import torch.distributed as dist

        def all_gather(out, tensor, group=None):
            assert group == "CPU_GROUP" and tensor.dtype == torch.uint8
            out[0].copy_(tensor)
            for t, fp in zip(out[1:], others):
                t.copy_(torch.tensor(list(fp.encode("ascii")), dtype=torch.uint8))

        monkeypatch.setattr(dist, "all_gather", all_gather)
    mod.get_world_group = get_world_group
    monkeypatch.setitem(sys.modules, "vllm.distributed", mod)


def test_single_process_stores_its_own_fingerprint(monkeypatch):
    _fake_world(monkeypatch, None)
    assert startup.gather_plan_fingerprints(_steps(_plan())) == [plan_fingerprint(_plan())]
    assert plan_agreement([plan_fingerprint(_plan())], rank=0, steps=7) is None


def test_agreeing_ranks_store_every_fingerprint(monkeypatch):
    fp = plan_fingerprint(_plan())
    _fake_world(monkeypatch, [fp])
    fps = startup.gather_plan_fingerprints(_steps(_plan()))
    assert fps == [fp, fp]
    assert plan_agreement(fps, rank=0, steps=7) is None


def test_differing_ranks_raise_naming_them(monkeypatch, tmp_path):
    plan = _plan()
    other = plan_fingerprint(plan[:-1])
    _fake_world(monkeypatch, [plan_fingerprint(plan), other, plan_fingerprint(plan)])
    fps = startup.gather_plan_fingerprints(_steps(plan))
    error = plan_agreement(fps, rank=0, steps=len(plan))
    msg = str(error)
    assert "ranks [0, 1, 3]" in msg and "ranks [2]" in msg and other in msg
    # the start writes the report (every rank's fingerprint) before refusing: the mismatch is on
    # disk for the operator to compare
    path = tmp_path / "report.json"
    startup.write_report(build_session(json_path=str(path), fingerprints=fps))
    written = json.loads(path.read_text())
    assert written["worstcase"]["plan_fingerprints"][2] == other
    assert len(set(written["worstcase"]["plan_fingerprints"])) == 2


def test_the_log_says_where_the_report_was_written_once(tmp_path, caplog, monkeypatch):
    """Issue 39: `vllm serve`'s log never said where --profiler-report's file went. Under
    wcprof, whose report is a temporary file copied to --json, it says nothing."""
    import logging
    import sys

    path = tmp_path / "served.json"
    session = build_session(json_path=str(path), fingerprints=("a",))
    monkeypatch.setattr(sys, "argv", ["/x/bin/wcprof", "--model", "m"])
    with caplog.at_level(logging.INFO, logger="vllm.wcprof"):
        startup.write_report(session)
    assert not [r for r in caplog.records if "report written to" in r.getMessage()]
    monkeypatch.setattr(sys, "argv", ["/x/bin/vllm", "serve", "m"])
    with caplog.at_level(logging.INFO, logger="vllm.wcprof"):
        startup.write_report(session)
        startup.write_report(session)  # a later phase rewrites it: not logged again
    said = [r.getMessage() for r in caplog.records if "report written to" in r.getMessage()]
    assert len(said) == 1 and str(path) in said[0] and f"wcprof render {path}" in said[0]
