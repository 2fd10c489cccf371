"""The context-aware chunk cap (setting chunk_cap, opt-in): a step function rows(ctx) that bounds
how many tokens a step holds when its longest request has ctx cached tokens, so the worst step is
smaller and the KV budget larger. Pure: no vLLM, no torch.

The rule the scheduler enforces (adapter/chunk_cap.py): a step whose requests' longest cached
context (num_computed_tokens, decodes included) is ctx holds at most rows(ctx) tokens in all.
rows(ctx) has two values: the configured chunk C up to a measured context c*, the capped rows r
(the setting) beyond it, up to max_model_len. So every step falls in one of two families:

- longest context above c*: at most r tokens. That is a step an engine started with
  max_num_batched_tokens = r forms, so its bound is the advisor's for chunk r (core/advise:
  rows 1..r from the sweep's coverage at full extent, its stock step, splits, decode batches,
  mixed step and context ladder: `chunk_worst`). This is the target: the cap's worst step.
- longest context at most c*: up to C tokens, every request at a context <= c*. Bounded at the
  context ladder's points (the sweep's context curve: `level_shapes`): the full chunk and the
  worst rows value on one request, and their splits over 2, 4, ... requests, at that context.
  A context between two measured points takes the next measured point above's figures (c* is a
  measured point; nothing is interpolated). c* is the longest point such that every point up to
  it needs no more than the target.

The premise is the sweep's own (docs/sweep.md): a step's need does not fall as its requests' KV
extent grows, and the worst rows value and its splits stand for the other rows values at one
context, as they do in the sweep's context ladder. Where no full-chunk point fits, rows(ctx) = r
everywhere: the engine then behaves as one started with chunk r (the advisor's static choice),
except that its configured buffers stay.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable

from . import shapes as plan
from .advise import chunk_worst, confirmation_delta, known_steps, plan_candidate, raiser
from .shapes import Limits
from .types import CapLevel, ChunkCapMeasurements, ChunkCapPlan, Shape, StepResult, SweepResult

BOUND = ("a step's longest cached context selects its level: contexts up to the full-chunk "
         "level's measured point take that point's figures (the next measured point above, never "
         "interpolated); every longer context takes the capped chunk's whole worst case, at full "
         "KV extent")


def check_rows(limits: Limits, rows: int) -> None:
    """The capped rows must be a chunk an engine could be started with below the configured
    one: ValueError naming why otherwise."""
    chunk = limits.max_num_batched_tokens
    if not limits.max_num_seqs <= rows < chunk:
        raise ValueError(f"chunk_cap {rows} must be at least max_num_seqs={limits.max_num_seqs} "
                         f"and below max_num_batched_tokens={chunk}")


def rows_at(levels: Iterable[tuple[int, int]], context: int) -> int:
    """rows(ctx) of a step function given as ((up_to_context, rows), ...) ascending: the first
    level whose up_to_context is at or above `context`; the last level beyond every point."""
    levels = list(levels)
    if not levels:
        raise ValueError("a cap needs at least one level")
    for up_to, rows in levels:
        if context <= up_to:
            return rows
    return levels[-1][1]


def capped_family(limits: Limits) -> Limits:
    """The limits the capped steps are planned from (the advisor's engine started with the
    capped chunk): without drafting slots. Under the cap the engine keeps its own chunk, whose
    budget the slots come out of, so a capped step can hold its full rows beside them; planning
    them out of the capped chunk would plan fewer rows than the scheduler forms."""
    return dataclasses.replace(limits, draft_slots=0)


def level_shapes(limits: Limits, sweep: SweepResult) -> list[tuple[int, tuple[Shape, ...]]]:
    """(context, the shapes that bound a full-chunk step at it) for each context point of the
    sweep's context curve at which a full chunk fits below max_model_len, ascending."""
    chunk, mml = limits.max_num_batched_tokens, limits.max_model_len
    worst_rows = sweep.coverage.worst_rows
    out = []
    for ctx in sorted({r.shape.context_len for r in sweep.context_curve}):
        if ctx + chunk > mml:
            continue
        found: list[Shape] = []
        for rows in dict.fromkeys((chunk, worst_rows)):
            found.append(plan.prefill_chunk(limits, rows).with_context(ctx))
            found += [s.with_context(min(s.context_len, ctx))
                      for s in plan.split_prefills(limits, rows)]
        out.append((ctx, tuple(dict.fromkeys(found))))
    return out


def missing_shapes(limits: Limits, sweep: SweepResult, rows: int, *,
                   context_ladder: bool = True) -> list[Shape]:
    """The shapes the cap's bound needs that the sweep never ran, once each, in a fixed order
    (the capped chunk's plan, then each full-chunk level's)."""
    known = known_steps(sweep)
    wanted = list(plan_candidate(capped_family(limits), sweep, rows,
                                 context_ladder=context_ladder).shapes)
    for _, found in level_shapes(limits, sweep):
        wanted += found
    return [s for s in dict.fromkeys(wanted) if s not in known]


def timing_shapes(limits: Limits, rows: int) -> tuple[Shape, Shape]:
    """The prefill steps timed at long context: the capped rows, then the full chunk, each on
    max_model_len - rows cached tokens (the advisor's timing step)."""
    return (plan.prefill_chunk(limits, rows),
            plan.prefill_chunk(limits, limits.max_num_batched_tokens))


def decide(limits: Limits, sweep: SweepResult, measured: ChunkCapMeasurements, *,
           workspace_bytes: int, context_ladder: bool = True, cut_down: bool = False,
           allocator_slack: int = 0) -> ChunkCapPlan:
    """The cap (see the module docstring) from the sweep and the cap's own measurements.
    `workspace_bytes`: the workspace the sweep grew (every slot), which the capped engine's is
    scaled from. A shape the bound needs that was neither swept nor measured is a ValueError,
    never a figure."""
    rows = measured.rows
    check_rows(limits, rows)
    steps = (*measured.steps, *measured.timings)
    top = chunk_worst(capped_family(limits), sweep, rows, steps, workspace_bytes=workspace_bytes,
                      skipped=measured.skipped, context_ladder=context_ladder,
                      cut_down=cut_down, allocator_slack=allocator_slack)
    if top.unmeasured:  # advise.left_out_as_swept: the capped engine's worst case is unknown
        raise ValueError(f"chunk cap: {'; '.join(top.unmeasured)}")
    target = top.transient_bytes + top.workspace_bytes
    raised = raiser(sweep, confirmation_delta(sweep) if cut_down else 0)
    by_shape: dict[Shape, list[StepResult]] = {}
    for shape, found in known_steps(sweep).items():
        by_shape[shape] = raised(found)
    for r in steps:
        by_shape.setdefault(r.shape, []).append(r)
    unbuildable = {**dict(sweep.skipped), **dict(measured.skipped)}
    ws_scale = max((r.workspace_bytes for r in [sweep.stock, *sweep.steps, *steps]), default=0)

    def scaled(ws_need: int) -> int:
        return workspace_bytes if not ws_scale else -(-workspace_bytes * ws_need // ws_scale)

    levels: list[CapLevel] = []
    transient, workspace, worst = top.transient_bytes, top.workspace_bytes, top.worst
    for ctx, found in level_shapes(limits, sweep):
        results = []
        for shape in found:
            if shape in by_shape:
                results += by_shape[shape]
            elif shape not in unbuildable:
                raise ValueError(f"chunk cap: {shape.label()} was neither in the sweep nor "
                                 "measured (run missing_shapes first)")
        if not results:
            break
        peak = max(r.peak_bytes for r in results) + max(0, allocator_slack)
        ws = scaled(max(r.workspace_bytes for r in results))
        if peak + ws > target:
            break  # this point and every longer context take the capped rows
        levels.append(CapLevel(up_to_context=ctx, rows=limits.max_num_batched_tokens,
                               need_bytes=peak + ws))
        if (peak, ws) > (transient, workspace):
            worst = max(results, key=lambda r: (r.need_bytes, r.peak_bytes))
        transient, workspace = max(transient, peak), max(workspace, ws)
    levels.append(CapLevel(up_to_context=limits.max_model_len, rows=rows, need_bytes=target))
    return ChunkCapPlan(rows=rows, levels=tuple(levels), transient_bytes=transient,
                        workspace_bytes=min(workspace, workspace_bytes),
                        uncapped_transient_bytes=sweep.peak_bytes,
                        uncapped_workspace_bytes=workspace_bytes, worst_shape=worst.shape,
                        bound=BOUND)


def as_pairs(levels: Iterable[CapLevel]) -> tuple[tuple[int, int], ...]:
    """((up_to_context, rows), ...): what the scheduler and the guard carry."""
    return tuple((lv.up_to_context, lv.rows) for lv in levels)


def step_over_cap(levels: Iterable[tuple[int, int]], rows: int, longest_context: int) -> bool:
    """Whether a served step of `rows` tokens whose longest request had `longest_context` cached
    tokens exceeds the cap."""
    return rows > rows_at(levels, longest_context)


def tokens_per_s(step: StepResult | None) -> float | None:
    if step is None or not step.seconds or step.seconds <= 0:
        return None
    return step.shape.rows / step.seconds
