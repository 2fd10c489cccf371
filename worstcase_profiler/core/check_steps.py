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
from .shapes import Limits
from .types import Shape, doc


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


def parse(value) -> tuple[tuple[int, int], ...]:
    """`ROWS@CONTEXT` items (a list, or one string separated by commas) -> ((rows, context), ...)
    in the order given, duplicates dropped; ConfigError naming the bad item otherwise."""
    items = value.split(",") if isinstance(value, str) else list(value or ())
    out: list[tuple[int, int]] = []
    for item in items:
        text = str(item).strip().replace("_", "")
        rows, at, ctx = text.partition("@")
        if not (at and rows.isdigit() and ctx.isdigit() and int(rows) >= 1):
            raise ConfigError(
                f"check step {item!r} is not ROWS@CONTEXT",
                hint="name a step as its new tokens @ its cached tokens, e.g. 4096@149760 for a "
                     "4,096-token chunk on 149,760 cached tokens")
        if (int(rows), int(ctx)) not in out:
            out.append((int(rows), int(ctx)))
    return tuple(out)


def shape_of(rows: int, context: int) -> Shape:
    return Shape("prefill", rows, context, 1)


def unformable(shape: Shape, limits: Limits) -> str | None:
    """Why the engine's scheduler never forms `shape`, or None: more rows than one step holds,
    or a request longer than max_model_len."""
    if shape.rows > limits.max_num_batched_tokens:
        return (f"{shape.rows} new tokens is more than one step holds "
                f"(max_num_batched_tokens {limits.max_num_batched_tokens})")
    if shape.context_len + shape.rows > limits.max_model_len:
        return (f"{shape.context_len} cached + {shape.rows} new tokens is longer than "
                f"max_model_len {limits.max_model_len}")
    return None


def check_formable(steps: tuple[tuple[int, int], ...], limits: Limits) -> None:
    """ConfigError for the first named step the engine cannot form (before anything runs)."""
    for rows, ctx in steps:
        why = unformable(shape_of(rows, ctx), limits)
        if why is not None:
            raise ConfigError(f"check step {rows}@{ctx}: {why}",
                              hint="name a step this engine can run, or raise its limits")


def admit(sweep, checks: tuple[CheckStep, ...]):
    """The sweep whose admitted transient `peak_bytes` also holds every check step's prediction
    (a step the scheduler forms, measured: it counts like the sweep's own)."""
    top = max((c.predicted_bytes for c in checks), default=0)
    return dataclasses.replace(sweep, peak_bytes=top) if top > sweep.peak_bytes else sweep


def line(check: CheckStep, admitted: int) -> str:
    """One line for the log and the report: the step's reading against the admitted figure."""
    s = check.shape
    verdict = ("sets the admitted transient" if check.predicted_bytes >= admitted
               else f"{check.predicted_bytes / admitted:.1%} of the admitted {fmt_bytes(admitted)}")
    return (f"check step {s.rows}@{s.context_len} ({s.rows:,} new tokens on {s.context_len:,} "
            f"cached): {fmt_bytes(check.peak_bytes)}, {verdict}")
