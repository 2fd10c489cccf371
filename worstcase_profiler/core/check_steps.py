"""Steps an operator names (setting check_steps, `wcprof --check-step ROWS@CONTEXT`): one
request computing ROWS new tokens on CONTEXT cached ones, such as the step an engine died on
(`4096@149760`: a 4,096-token chunk on 149,760 cached tokens). Pure: the adapter
measures each on the full model beside the sweep, on every start (adapter/startup.py), and
builds it from real requests when validation runs (adapter/validation.py,
adapter/serve_validation.py); this parses them, says which the engine cannot form, and admits
their readings.

The sweep already bounds such a step: its rows value runs at the full KV extent, and the context
curve at growing extents. What it does not give is that step's own figure: the admitted
transient is the worst step's, so a step at a shorter context reads below it by however much
the attention's buffers grow with context. A check step's reading is the prediction for that
step, which its validation holds the real step against (measured <= predicted, and how close);
it also counts in the admitted transient like any step the sweep ran (`admit`), so naming a step
can only raise the figure, never lower it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..errors import ConfigError
from ..sizes import fmt_bytes
from .replay_rules import validation_exceeded
from .shapes import Limits
from .types import Shape, Validation, doc


@dataclass(frozen=True)
class CheckStep:
    """One named step as measured on the full model at this start."""

    shape: Shape = doc("the step: one prefill request of `rows` new tokens on `context_len` "
                       "cached ones")
    peak_bytes: int = doc("its transient peak above the pre-step baseline")
    predicted_bytes: int = doc(
        "what its validation holds real requests against: the peak plus the meter's allocator "
        "slack (the same allowance the admitted transient carries)")
    need_bytes: int = doc("its transient plus the workspace it asked for")

    @classmethod
    def of(cls, shape: Shape, step, allocator_slack: int) -> "CheckStep":
        """The named `shape` as one measured step (a StepResult: peak_bytes, need_bytes)
        predicts it: its peak plus the meter's allocator slack."""
        return cls(shape=shape, peak_bytes=step.peak_bytes,
                   predicted_bytes=step.peak_bytes + max(0, allocator_slack),
                   need_bytes=step.need_bytes)


def parse(value) -> tuple[tuple[int, int], ...]:
    """`ROWS@CONTEXT` items (a list of strings, one string, either separated by commas; blanks
    around items and around `@` ignored, empty items skipped) -> ((rows, context), ...) in the
    order given, duplicates dropped; ConfigError naming the bad item otherwise."""
    if value is not None and not isinstance(value, (str, list, tuple)):
        raise ConfigError(f"check_steps is {value!r}: a ROWS@CONTEXT string or a list of them",
                          hint='e.g. "check_steps": ["4096@149760"]')
    items = [part for item in ([value] if isinstance(value, str) else list(value or ()))
             for part in (item.split(",") if isinstance(item, str) else [repr(item)])]
    out: list[tuple[int, int]] = []
    for item in items:
        if not item.strip():
            continue  # "4096@149760," and the like
        rows, at, ctx = (t.strip() for t in item.strip().replace("_", "").partition("@"))
        if not (at and rows.isdecimal() and ctx.isdecimal()):
            raise ConfigError(
                f"check step {item.strip()!r} is not ROWS@CONTEXT",
                hint="name a step as its new tokens @ its cached tokens, e.g. 4096@149760 for a "
                     "4,096-token chunk on 149,760 cached tokens")
        if int(rows) < 1:
            raise ConfigError(f"check step {item.strip()!r}: a step computes at least 1 new token",
                              hint="e.g. 1@149760 for one token on 149,760 cached ones")
        if (int(rows), int(ctx)) not in out:
            out.append((int(rows), int(ctx)))
    return tuple(out)


def shape_of(rows: int, context: int) -> Shape:
    return Shape("prefill", rows, context, 1)


def unformable(shape: Shape, limits: Limits) -> str | None:
    """Why the engine's scheduler never forms `shape`, or None: more rows than one step holds,
    or a prompt that leaves no room in max_model_len for the token its last chunk samples."""
    if shape.rows > limits.max_num_batched_tokens:
        return (f"{shape.rows} new tokens is more than one step holds "
                f"(max_num_batched_tokens {limits.max_num_batched_tokens})")
    if shape.context_len + shape.rows > limits.max_model_len - 1:
        return (f"{shape.context_len} cached + {shape.rows} new tokens leaves no room in "
                f"max_model_len {limits.max_model_len} for the token it samples")
    return None


def check_formable(steps: tuple[tuple[int, int], ...], limits: Limits) -> None:
    """ConfigError for the first named step the engine cannot form (before anything runs)."""
    for rows, ctx in steps:
        why = unformable(shape_of(rows, ctx), limits)
        if why is not None:
            raise ConfigError(f"check step {rows}@{ctx}: {why}",
                              hint="name a step this engine can run, or raise its limits")


def floor(checks: tuple[CheckStep, ...], encoder_need: int = 0) -> int:
    """The least admitted transient the steps measured beside the sweep allow: every named
    step's prediction and the encoder step's need (its peak plus the allocator slack). The
    admission holds it (`admit`), and so does a pool fit that drops the sweep's worst step
    (core/pool_fit.refit's floor)."""
    return max([c.predicted_bytes for c in checks] + [encoder_need])


def admit(sweep, least: int):
    """The sweep whose admitted transient `peak_bytes` is at least `least` (`floor`: steps the
    scheduler forms, measured, count like the sweep's own)."""
    return dataclasses.replace(sweep, peak_bytes=least) if least > sweep.peak_bytes else sweep


def readings(per_rank) -> dict[Shape, dict[int, int]]:
    """Each named step's own prediction on every rank: `per_rank` is (rank, that rank's
    CheckSteps) pairs; returns shape -> {rank: predicted_bytes}, shapes in the order named."""
    read = [(c.shape, rank, c.predicted_bytes) for rank, checks in per_rank for c in checks]
    return {shape: {rank: b for sh, rank, b in read if sh == shape} for shape, _, _ in read}


def with_admitted(v: Validation, reading: int, admitted: int) -> Validation:
    """`v`, a named step's validation held against `reading` (its own prediction), with
    `admitted_peak_bytes`: `admitted` (the rank's admitted transient, what its budget
    subtracted) plus the workspace `v`'s prediction holds beside the reading."""
    return dataclasses.replace(v, admitted_peak_bytes=v.predicted_peak_bytes - reading + admitted)


def missed(v: Validation) -> bool:
    """Whether `v` is a named step's validation over its own reading (beyond the meter's
    resolution) but within its admitted figure (`with_admitted`): a reading that missed, not an
    engine at risk. `wcprof` and `vllm serve` warn and go on; any other validation over its
    prediction fails the run (`wcprof` exits 1, the server does not start). Its reading is one
    measurement, where the admitted figure is the largest of many: on a busy CPU host a replay
    can read above one reading by RSS noise alone."""
    return (v.target == "check-step" and v.admitted_peak_bytes is not None
            and validation_exceeded(v)
            and v.measured_peak_bytes <= v.admitted_peak_bytes + (v.resolution_bytes or 0))


def fails(v: Validation) -> bool:
    """Whether validation `v` fails the run (`wcprof` exits 1, the server does not start): over
    its prediction beyond the meter's resolution, and not a named step's reading that `missed`."""
    return validation_exceeded(v) and not missed(v)


def admitted_transients(report) -> dict[int, int]:
    """Each rank's admitted transient in a report (core/types, report.Report): what its KV
    budget subtracted (admission.transient_bytes; the worst peak where a report has none)."""
    return {r.rank: (r.admission.transient_bytes if r.admission.transient_bytes is not None
                     else r.worstcase.peak_activation_bytes)
            for r in (report.ranks or [report])}


def line(check: CheckStep, admitted: int) -> str:
    """One line for the log and the report: the step's prediction (its reading plus the meter's
    allocator slack) against the admitted figure."""
    s = check.shape
    verdict = ("sets the admitted transient" if check.predicted_bytes >= admitted
               else f"{check.predicted_bytes / admitted:.1%} of the admitted {fmt_bytes(admitted)}")
    return (f"check step {s.rows}@{s.context_len} ({s.rows:,} new tokens on {s.context_len:,} "
            f"cached): {fmt_bytes(check.predicted_bytes)}, {verdict}")
