"""Replay rules: whether every tensor-parallel rank ran the same steps, which step a replay formed,
when a running replay may stop, and whether a validation measured more than predicted. Pure
functions; the replay loops (adapter/validation.py, adapter/serve_validation.py) and the renderers
apply them.

  plan_agreement      whether every tensor-parallel rank ran the same steps
  formed_for          the step to report for a replay, from the steps it formed
  covers              whether a formed step reaches a target
  target_formed       whether a replay already formed its target step
  replay_stops        whether a running replay stops the rest of its requests now
  replay_reached      whether a worst-step validation reached its target
  validation_exceeded whether a validation measured more than predicted
"""

from __future__ import annotations

from ..errors import WcprofError
from .types import Shape


def plan_agreement(fingerprints: list[str], *, rank: int, steps: int) -> WcprofError | None:
    """Every tensor-parallel rank must have run the same steps in the same order (a mismatch would
    deadlock the collectives): the error naming the ranks that disagree, else None."""
    if len(set(fingerprints)) <= 1:
        return None
    groups: dict[str, list[int]] = {}
    for r, fp in enumerate(fingerprints):
        groups.setdefault(fp, []).append(r)
    detail = "; ".join(f"ranks {ranks}: {fp}" for fp, ranks in groups.items())
    return WcprofError(
        f"tensor-parallel ranks executed different worst-case sweeps (plan fingerprints differ: "
        f"{detail}); rank {rank} ran {steps} steps",
        hint="every rank must see the same engine limits and settings; compare the per-rank "
             "reports (.rankN.json)")


def validation_exceeded(v) -> bool:
    """A validation fails when it measured more than predicted by more than the meter can
    resolve (`resolution_bytes`: RSS on the CPU moves with heap reuse below the mmap threshold;
    0 where the meter is exact). `v`: a Validation, or anything with its fields."""
    return v.measured_peak_bytes > v.predicted_peak_bytes + (v.resolution_bytes or 0)


def formed_for(target: Shape | None, frontier) -> Shape | None:
    """The step to report for a replay, from the frontier of steps it formed (core.guard
    .frontier_add; StepShape items): with a target, the smallest step covering its rows,
    requests and context, else the one that came closest (by the smallest of its rows, requests
    and context over the target's); without one, the step of most rows."""
    if not frontier:
        return None
    if target is None:
        best = max(frontier, key=lambda s: (s.rows, s.reqs, s.max_context))
    else:
        def share(s) -> float:  # a dimension the target does not use (context 0) is met
            return min(s.rows / max(1, target.rows), s.reqs / max(1, target.num_reqs),
                       s.max_context / target.context_len if target.context_len else 1.0)

        covering = [s for s in frontier if share(s) >= 1]
        best = (min(covering, key=lambda s: (s.rows, s.reqs, s.max_context)) if covering
                else max(frontier, key=lambda s: (share(s), s.rows, s.reqs)))
    kind = "decode" if not best.prefills else "prefill" if best.prefills == best.reqs else "mixed"
    return Shape(kind=kind, rows=best.rows, context_len=best.max_context, num_reqs=best.reqs)


def replay_reached(v) -> bool | None:
    """Whether a worst-step validation's requests made the scheduler form its target step: a
    step with at least the target's rows over at least its requests, at no shorter a context
    (`formed`: the step formed_for chose), and for a multimodal one an encoder run on at least
    its items in one step (`encoder_items_formed`). None when either is unknown (a traffic validation,
    or no step recorded). A replay that did not reach its target measured some other step: its
    ratio says nothing about the worst one. `v`: a Validation, or anything with its fields."""
    if v.shape is None or v.formed is None:
        return None
    want = getattr(v, "encoder_items", 0) or 0
    if want and (getattr(v, "encoder_items_formed", None) or 0) < want:
        return False  # a multimodal replay whose step never ran its encoder on every item
    return covers(v.formed, v.shape)


def covers(formed: Shape, target: Shape) -> bool:
    """A formed step reaches a target: at least its rows over at least its requests, at no
    shorter a context."""
    return (formed.rows >= target.rows and formed.num_reqs >= target.num_reqs
            and formed.context_len >= target.context_len)


def target_formed(target: Shape, frontier) -> bool:
    """Whether a replay's frontier so far (StepShape items) already holds its target step: the
    replay may stop there (adapter/validation.py), the rest of its requests measure nothing
    the target step has not."""
    best = formed_for(target, frontier)
    return best is not None and covers(best, target)


def replay_stops(formed: bool, finished: int, total: int, stop: str) -> bool:
    """Whether a running replay of `total` requests, `finished` of them done, stops the rest now
    (settings.replay_stop's `stop`): once its target formed and one request finished (the first
    to finish held the longest context any reaches), or with "formed" as soon as it formed;
    never when none is left running."""
    return formed and (finished > 0 or stop == "formed") and finished < total
