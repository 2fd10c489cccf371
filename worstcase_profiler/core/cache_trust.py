"""Cache trust: whether a cached sweep, its worst step replayed now, may stand in for a full sweep
(core/cache.py keeps the entries), and the figures a cached start admits with. Pure functions of
measured bytes; the adapter (adapter/startup.py) replays and applies.

  cache_verdict       whether the replayed worst step still needs what it needed when cached
  normal_drop         how far below a cached figure a fresh reading may fall (cache_verdict's)
  still_worst         whether none of the plan's heaviest other shapes now needs more
  reading_holds       whether a cached reading stands beside the same step measured now
  recheck_dominance   whether a reused entry must be re-checked against those shapes
  replays_on_cut      whether its worst step may replay on the cut decoder instead
  reuse_transient     the transient a cached start admits
  reuse_consumed      the held-memory figure a cached start admits with
  held_moved_text     how a cached start's held memory moved, in words
"""

from __future__ import annotations

from typing import NamedTuple

from ..sizes import fmt_bytes
from .types import CutDownProof, StepResult


def cache_verdict(cached: int, measured: int, tolerance: int) -> tuple[bool, int]:
    """(still valid, allowed upward drift). Valid while the replayed step needs no more than it
    needed then, within the meter's tolerance or 2% of it, whichever is larger. Needing less is
    the safe direction and normal (the cached figure is the largest of many noisy measurements),
    so only a large drop (4x the allowance or 10%, whichever is larger) also rejects the entry:
    it describes another build, and reusing it would only throw KV away."""
    allowed = max(tolerance, cached // 50)
    return cached - normal_drop(cached, tolerance) <= measured <= cached + allowed, allowed


def normal_drop(cached: int, tolerance: int) -> int:
    """How far below a cached figure (the largest of many noisy readings) a fresh reading of the
    same configuration may fall and still describe the same build (`cache_verdict`): 4x the
    allowed upward drift or 10%, whichever is larger."""
    return max(4 * max(tolerance, cached // 50), cached // 10)


def still_worst(cached_need: int, others: list[int], allowed: int) -> bool:
    """A cached worst step may stand only while none of the plan's heaviest other shapes,
    measured now, needs more than it did (within the allowed drift): a forged or foreign entry
    that names a small step as the worst is caught here."""
    return all(n <= cached_need + allowed for n in others)


def reading_holds(cached: int, measured: int, tolerance: int) -> bool:
    """Whether a cached step's figure stands beside the same step measured now: no more than the
    meter's tolerance above it (the same answer as when it was cached; more, and the cached
    figure would admit below what the step needs), and no further below it than a fresh reading
    of the same build falls (normal_drop: further, and it describes another build)."""
    return cached - normal_drop(cached, tolerance) <= measured <= cached + tolerance


def reuse_transient(cached: int, replayed: int, resolution: int) -> int:
    """The transient a cached start admits: the cached one while the replay is within the meter's
    resolution of it (the same configuration gets the same answer), else the larger of the two."""
    return cached if replayed <= cached + resolution else max(cached, replayed)


class HeldFigure(NamedTuple):
    """The held memory a cached start admits with (reuse_consumed), and whether it is the
    cached start's figure as it stood."""

    bytes: int
    kept: bool


def reuse_consumed(*, baseline_now: int, cached_baseline: int, cached_consumed: int,
                   replay_residue: int, resolution: int) -> HeldFigure:
    """The held memory a cached start admits with.

    The full sweep leaves behind buffers its many step kinds create lazily (decode and mixed
    paths, per-shape kernel state), which the engine will create too once it serves; a replay
    of one step does not. So a cached start counts the full sweep's residue (cached_consumed -
    cached_baseline) on top of its own baseline (held before the replay), and never less than
    what the replay left. While its baseline is within the meter's resolution above the cached
    one, or within BASELINE_BELOW resolutions below it, the cached figure stands as is (kept:
    the same configuration gets the same admission whether it swept or replayed), unless the
    replay left more than the sweep did beyond one resolution: then the larger of the cached
    figure and its own (never less than the cold start counted, from a replay that left more)."""
    residue = max(cached_consumed - cached_baseline, replay_residue)
    moved = baseline_now - cached_baseline
    if -BASELINE_BELOW * resolution <= moved <= resolution:
        if replay_residue <= cached_consumed - cached_baseline + resolution:
            return HeldFigure(cached_consumed, True)
        return HeldFigure(max(cached_consumed, baseline_now + residue), False)
    return HeldFigure(baseline_now + residue, False)


def held_moved_text(moved: int | None, kept: bool | None) -> str:
    """A cached start's held memory against the cached start's, where it moved at all ("" where
    not): for the start-up log and the report's cache line."""
    if not moved:
        return ""
    how = ("the cached held figure stands" if kept else
           "counted: this start's own held memory plus the larger residue")
    return f"held {fmt_bytes(abs(moved))} {'more' if moved > 0 else 'less'} than when cached ({how})"


BASELINE_BELOW = 4
"""How many meter resolutions a cached start's baseline may sit BELOW the cached one and still
keep the cached held figure (over-reserving by at most that: the safe direction). On the CPU
two starts of one configuration under -n 2 read baselines 0.86 MiB apart (resolution 0.5 MiB),
and the restart then admitted 0.86 MiB more KV than the cold start. Above it, only within one
resolution: more held memory is always counted."""


TRUST_SKIPS_RECHECK = {
    "signed": "signed under $WCPROF_CACHE_SECRET: no dominance re-check",
    "host": "written by this host (its host key): no dominance re-check"}
"""The trusts (CacheUse.trust) under which a reused entry replays only its worst step, each as
the start-up log and the verdict say it."""


def recheck_dominance(trust: str | None) -> bool:
    """Whether a reused entry's worst step must be re-checked against the plan's heaviest shapes
    (core/sweep.dominance_checks). That re-check is what stops an entry whose worst shape and
    need were swapped for a smaller self-consistent pair; an entry signed under the operator's
    secret (trust "signed") or carrying this host's own MAC (trust "host": written by a start on
    this machine, under a key no other user can read) cannot have been forged that way
    (docs/cache.md), so it replays only its worst step."""
    return trust not in TRUST_SKIPS_RECHECK


def replays_on_cut(trust: str | None, proof: CutDownProof | None,
                   on_cut: StepResult | None, *, exact: bool) -> bool:
    """Whether a reused entry's worst step replays on the cut decoder, against its own cut-down
    reading, instead of on the full model against its confirmed one: only on an exact meter
    (`exact`: CUDA's allocator counters; on the CPU a cut step of a MiB or so sits within RSS
    noise: a busy host's restart read 0 B where its sweep had read 11.17 MiB), where the entry
    skips the dominance re-check (recheck_dominance: signed, or this host's own), its sweep was
    cut down and its self-check proven on this model (the cut is the self-check's, which a
    restart can build again), and the cut decoder read its worst shape (`on_cut`: that reading,
    core/sweep.cut_reading; never the stock step, which always replays on the full model). The
    stock step's full-model replay still reads what the skipped layers add to a step; what only
    the worst step's depth part could show is left to the key (docs/cache.md, "What a restart
    replays")."""
    return (exact and not recheck_dominance(trust) and proof is not None
            and proof.method == "self-check" and proof.proven and not proof.fell_back
            and on_cut is not None and on_cut.shape.kind != "stock")
