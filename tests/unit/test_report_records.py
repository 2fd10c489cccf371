"""One definition per record (issue 35): the report serves the core's frozen records
(core/types.py) as they are, and each report model that projects a core record into another form
is listed here with its mapping, field by field. A field on one side only fails the parity test
until it is mapped, derived or named as left out, so a field added to a core record cannot
vanish from the report unseen (pydantic would ignore it: the projections read by name)."""

from __future__ import annotations

import dataclasses

import pytest

from worstcase_profiler import report
from worstcase_profiler.core import types
from worstcase_profiler.core.coverage import cover_rows

# The records the report serves as they are: Report field path -> the core class it holds.
SERVED = {
    ("Report", "admission"): types.Admission,
    ("Report", "kv_audit"): types.KVAudit,
    ("Report", "warmup_audit"): types.WarmupAudit,
    ("Report", "validation"): types.Validation,
    ("Report", "validations"): types.Validation,
    ("Report", "device"): types.DeviceInfo,
    ("Report", "config"): types.EngineConfig,
    ("WorstCase", "steps"): types.StepResult,
    ("WorstCase", "context_curve"): types.StepResult,
    ("WorstCase", "cut_down_proof"): types.CutDownProof,
    ("WorstCase", "worst_shape"): types.Shape,
    ("WorstCase", "workspace_slots"): types.WorkspaceSlot,
    ("WorstCase", "cache"): types.CacheUse,
    ("Coverage", "segments"): types.CoveredSegment,
    ("Report", "advice"): types.Advice,
    ("Report", "fit"): types.Fit,
}


@dataclasses.dataclass(frozen=True)
class Projection:
    """How a report model is read from a core record: `renamed` report field -> core field,
    `derived` report fields read from core properties, `left_out` core fields the report does
    not carry (and why)."""

    core: type
    renamed: dict[str, str] = dataclasses.field(default_factory=dict)
    derived: frozenset[str] = frozenset()
    left_out: dict[str, str] = dataclasses.field(default_factory=dict)


PROJECTIONS = {
    report.StockFigures: Projection(
        types.StepResult, renamed={"peak_activation_bytes": "peak_bytes"},
        left_out={"top_op": "the stock step's module is not reported"}),
    report.Coverage: Projection(
        types.RowsCoverage, renamed={"tolerance_bytes": "tolerance"},
        derived=frozenset({"executed_rows"}),
        left_out={"peak_table": "each executed step is in worstcase.steps",
                  "worst_rows": "worstcase.worst_shape carries it",
                  "worst_peak": "worstcase.peak_activation_bytes carries the admitted figure",
                  "bound": "worstcase.peak_activation_bytes carries the admitted figure"}),
}


def _core_fields(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


@pytest.mark.parametrize("model", list(PROJECTIONS), ids=lambda m: m.__name__)
def test_a_projection_names_every_field_of_both_sides(model):
    p = PROJECTIONS[model]
    core = _core_fields(p.core)
    assert set(p.renamed.values()) | set(p.left_out) <= core, "a mapping names a missing field"
    for name in p.derived:
        assert isinstance(getattr(p.core, name, None), property), f"{name} is no core property"
    expected = (core - set(p.left_out) - set(p.renamed.values())) | set(p.renamed) | p.derived
    assert set(model.model_fields) == expected, (
        f"only in the report: {sorted(set(model.model_fields) - expected)}; "
        f"only in the core: {sorted(expected - set(model.model_fields))}")


def test_no_report_model_copies_a_core_record_it_does_not_project():
    """A report model named like a core record is a copy unless it is a listed projection."""
    models = {name: obj for name, obj in vars(report).items()
              if isinstance(obj, type) and issubclass(obj, report.BaseModel)
              and obj.__module__ == report.__name__}
    core = {name for name, obj in vars(types).items()
            if isinstance(obj, type) and dataclasses.is_dataclass(obj)}
    copies = {name for name in models.keys() & core if models[name] not in PROJECTIONS}
    assert not copies, copies


@pytest.mark.parametrize("where", list(SERVED), ids=lambda w: ".".join(w))
def test_the_report_holds_the_core_records_themselves(where):
    model, field = where
    annotation = getattr(report, model).model_fields[field].annotation
    assert SERVED[where] in _classes_in(annotation), (where, annotation)


def _classes_in(annotation) -> set:
    import typing

    args = typing.get_args(annotation)
    return {annotation} if not args else set().union(*(_classes_in(a) for a in args))


def test_the_projections_carry_every_mapped_value():
    cov = cover_rows(lambda r: 1000 + 3 * r, 1, 64, tolerance=8)
    step = types.StepResult(types.Shape("stock", 256, 0, 8), 9, 0.1, "op", 4)
    for m, core_value in ((report.coverage_model(cov), cov), (report.stock_figures(step), step)):
        p = PROJECTIONS[type(m)]
        for name in type(m).model_fields:
            got, want = getattr(m, name), getattr(core_value, p.renamed.get(name, name))
            assert got == (list(want) if isinstance(want, tuple) else want), name
