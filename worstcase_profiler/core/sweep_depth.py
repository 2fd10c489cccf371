"""Sweep depth: whether the sweep runs cut down or on the full model, the evidence it rests on (the
model classes a cut-down sweep was proven on, as data), and the proof that judges a cut-down sweep
against the full one on one engine (core/sweep.prove_cut_down runs both).

  CUT_DOWN_PROVEN, CUT_DOWN_PROVEN_COMPILED   the evidence (data/cut-down-proofs/proven.json):
                      model class -> the committed results that prove it
  proven_cut          the cut a class's proof ran, which sweep_depth=cut-down keeps
  sweep_depth         whether the sweep runs cut down or on the full model
  judge_cut_down      whether a cut-down sweep admitted what the full sweep did (the proof)
  shape_class         the class a shape is sampled for (prefill, decode, verify, mixed, stock)
  judge_self_check    whether a cut-down sweep's own sampled confirmations bear out its
                      assumption on this model (sweep_depth=auto), else it falls back to full

auto on CUDA: the self-check decides for an eager forward of any family (docs/sweep.md
"Self-checked cut-down sweep"), and for a compiled one where the batch sizes vLLM compiles a
graph of its own for can be read (or a committed proof covers the family compiled: V2 runner,
TP=1). On a compiled forward the cut steps run eagerly, so every full-model step is read
eagerly as well and its difference split into depth and what compiling added
(depth_difference): the lab's compiled proofs show compilation otherwise netting out the depth
difference. What compiling adds is read on the measured members only, so the samples take both
ends of every class (its fewest and most rows) in each of those graphs that the sweep's steps
run (core/sweep.class_samples), at any TP and on either runner, as the eager self-check runs.
The tables stay the record of the families where a proof found the cut-down sweep
matching the full one, name the proof in the sweep mode, and tell `sweep_depth=cut-down`
(which checks nothing) on a compiled forward whether a proof covered it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Iterable

from .types import CutDownProof, Shape, StepResult, SweepResult

EVIDENCE = Path(__file__).resolve().parents[1] / "data" / "cut-down-proofs" / "proven.json"
"""The evidence tables, as data: {"eager": {class: {"runs": CUT_DOWN_PROVEN's value, "cut": CUTS
member}}, "compiled": the same for CUT_DOWN_PROVEN_COMPILED}. A family enters one only with
committed results that show its proof, and "cut" names the cut those results ran."""

CUTS = ("prefix", "kinds")
"""The cuts a proof can have run: the shortest prefix holding every kind of layer (every proof
committed before the kinds cut existed), or the first layer of each kind (what self-check and
prove cut to since; the same layers where every layer is alike)."""

_EVIDENCE: dict[str, dict[str, dict[str, str]]] = json.loads(EVIDENCE.read_text(encoding="utf-8"))
_bad = [(t, c, e.get("cut")) for t, table in _EVIDENCE.items() for c, e in table.items()
        if e.get("cut") not in CUTS]
if _bad:
    raise ValueError(f"{EVIDENCE}: a proof's cut must be one of {CUTS}: {_bad}")

CUT_DOWN_PROVEN: dict[str, str] = {c: e["runs"] for c, e in _EVIDENCE["eager"].items()}
"""Model classes on which a cut-down sweep was shown, on a GPU, to pick the same worst shape as
the full sweep with the confirmed peak equal within the meter's resolution (`--sweep-depth
prove`, bench/gpu_suite.py's *_prove cases): class -> "RUN: CASE, CASE; RUN: CASE", the
committed results (docs/results/RUN) that show it, checked by tests/unit/test_committed_results.py.
Scope: the class as those cases ran it (bf16 weights, default KV dtype, TP=1, eager, FA3 on sm_90;
the cut proven.json records for it, which sweep_depth=cut-down keeps: proven_cut); every
architecture vLLM maps onto the class is cut down alike (docs/sweep.md).
DeepseekV32ForCausalLM is not here: its fp8-cache proof failed (docs/results)."""

CUT_DOWN_PROVEN_COMPILED: dict[str, str] = {c: e["runs"] for c, e in _EVIDENCE["compiled"].items()}
"""The classes of CUT_DOWN_PROVEN whose proof also held with the model compiled and CUDA graphs
on (vLLM's default): the cut steps then bypass the compiled forward and run eagerly, while the
stock step and the confirmations run compiled (the measured stock difference carries both).
Same form and check as CUT_DOWN_PROVEN. Scope: vLLM 0.32's V2 runner, TP=1, FA3 on sm_90."""


def proven_cut(model_class: str, *, compiled: bool = False) -> str:
    """The cut (a CUTS member) sweep_depth=cut-down keeps for `model_class`: the one its proof
    for this forward ran (the compiled table's on a compiled forward, else the eager one's), so
    that the unchecked mode cuts where its evidence cut; "kinds", self-check's and prove's cut,
    for a class no proof covers (nothing to match). It reads proven.json itself, as
    CUT_DOWN_PROVEN is read from it; the compiled proof's runner and TP scope (sweep_depth)
    does not change which cut it ran."""
    for table in (("compiled", "eager") if compiled else ("eager",)):
        entry = _EVIDENCE[table].get(model_class)
        if entry:
            return entry["cut"]
    return "kinds"


def cut_to_prefix(mode: str, model_class: str, compiled: Callable[[], bool]) -> bool:
    """Whether a cut-down sweep in `mode` (sweep_depth's) cuts to the shortest prefix holding
    every kind of layer: only the unchecked cut-down, and only where its family's proof ran
    that cut (proven_cut); self-check and prove, which check the cut themselves, cut to the
    first layer of each kind. `compiled` is asked only for cut-down."""
    return mode == "cut-down" and proven_cut(model_class, compiled=compiled()) == "prefix"


SELF_CHECK_DEVICES = ("cuda", "cpu")
"""The meters the self-check's resolution is known for (adapter/meters.py): CUDA's allocator
counts (1 MiB resolution, 2 MiB allocator slack) and the CPU's RSS high-water mark (512 KiB, the
mmap threshold's page granularity). sweep_depth=self-check runs on these; elsewhere (ROCm, ...)
it sweeps the full model."""

AUTO_SELF_CHECK_DEVICES = ("cuda",)
"""Where auto self-checks. Not on the CPU: its meter reads the cut decoder's stock step 1-2 MB
apart from one start to the next, and the cut-down figure raises every unconfirmed shape by that
difference, so two starts of one configuration would admit different KV (a restart of the tiny
model read 4,780,032 B against 6,836,224 B). The full sweep reads the stock step three times and
admits the same figure; sweep_depth=self-check asks for the self-check there."""


def sweep_depth(setting: str, model_class: str, *, eager: Callable[[], bool],
                device_kind: str = "cuda", runner: str = "v2",
                tensor_parallel_size: int = 1,
                graphs: Callable[[], tuple | None] | None = None) -> tuple[str, str]:
    """("full" | "cut-down" | "prove" | "self-check", why). self-check: the self-checked cut-down
    sweep on every family (core/sweep.run_self_checked: it falls back to the full sweep itself
    when this model's samples contradict the cut-down assumption), on the devices whose meter
    resolution is known (SELF_CHECK_DEVICES); auto: the same on CUDA (AUTO_SELF_CHECK_DEVICES)
    for an eager forward of any family, and for a compiled one whose graphs by size `graphs()`
    reads (StepDriver.graph_ranges: the self-check then samples what compiling adds at both
    ends of every class in each graph, core/sweep.class_samples) or of a family proven
    compiled (CUT_DOWN_PROVEN_COMPILED, V2 runner, TP=1); its full-model steps read eagerly
    too, each difference split (depth_difference); full where neither holds (the graphs
    unknown and no proof); cut-down and prove are taken
    as asked (prove runs both, the full one admitted; cut-down on a compiled forward of a
    family no proof covered compiled says it is unproven). The proof a self-check names is the
    one for its forward (eager or compiled) and says where its scope differs. `eager` is asked
    only where the answer depends on it (it walks the model)."""
    if setting == "full":
        return "full", "full: asked for (sweep_depth=full)"
    if setting == "auto" and device_kind not in AUTO_SELF_CHECK_DEVICES:
        why = ("its cut-down figure moves with the meter's noise between starts" if device_kind
               in SELF_CHECK_DEVICES else "the meter's resolution is not known here")
        return "full", (f"full: auto self-checks a cut-down sweep on "
                        f"{' and '.join(AUTO_SELF_CHECK_DEVICES)} only, not on {device_kind} "
                        f"({why}; sweep_depth=self-check or prove compares both)")
    if setting == "self-check" and device_kind not in SELF_CHECK_DEVICES:
        return "full", (f"full: the cut-down sweep's self-check runs on "
                        f"{' and '.join(SELF_CHECK_DEVICES)} meters, not on {device_kind} "
                        "(sweep_depth=prove compares both here)")
    if setting == "prove":
        return "prove", "full, then cut-down to compare (sweep_depth=prove)"
    compiled_proof = CUT_DOWN_PROVEN_COMPILED.get(model_class)
    if compiled_proof and (runner != "v2" or tensor_parallel_size != 1):
        compiled_proof = None  # proven on the V2 runner at TP=1 only
    by_size = None
    if setting == "auto" and not compiled_proof and not eager():
        by_size = graphs() if graphs is not None else None
        if by_size is None:
            # The split difference (depth_difference) reads depth like with like, but what
            # compiling adds is read on the members measured only: a graph specialised to some
            # sizes could add to a light member alone, and which sizes have a graph of their own
            # could not be read (docs/sweep.md, "What `auto` does").
            return "full", (f"full: the model runs compiled, the batch sizes vLLM compiles a "
                            f"graph of its own for could not be read, and no proof covered a "
                            f"compiled {model_class} on this runner and TP (sweep_depth="
                            "self-check asks for it, prove compares both)")
    if setting in ("auto", "self-check"):
        graphs_note = "" if by_size is None else (
            f"; compiled, so what compiling adds is sampled at both ends of every class in "
            f"each graph vLLM compiles by batch size that its steps run ({max(1, len(by_size))} "
            f"read)")
        return "self-check", ("cut-down, self-checked: the worst shapes and a sample of every "
                              "shape class confirmed on the full model, the full sweep if they "
                              "disagree" + graphs_note + _proof_note(model_class, eager, runner,
                                                                     tensor_parallel_size))
    return "cut-down", "cut-down: asked for (sweep_depth=cut-down)" + (
        "" if compiled_proof or eager() else
        "; the model runs compiled, so its cut steps run eagerly, which no proof has covered "
        "for this family (sweep_depth=prove compares both)")


def _proof_note(model_class: str, eager: Callable[[], bool], runner: str, tp: int) -> str:
    """" (lab-proven ...: RUNS)" naming the proof for this forward, eager or compiled, with its
    scope where this start is outside it ("" where no proof covers the family)."""
    eager_proof, compiled_proof = (CUT_DOWN_PROVEN.get(model_class),
                                   CUT_DOWN_PROVEN_COMPILED.get(model_class))
    if not eager_proof and not compiled_proof:
        return ""
    if eager():
        if not eager_proof:
            return ""
        scope = "" if tp == 1 else ", at TP=1"
        return f" (lab-proven eager for {model_class}{scope}: {eager_proof})"
    if not compiled_proof:
        return f" (lab-proven for {model_class} eager only: {eager_proof})"
    scope = "" if runner == "v2" and tp == 1 else ", on the V2 runner at TP=1"
    return f" (lab-proven compiled for {model_class}{scope}: {compiled_proof})"


def shape_class(shape: Shape) -> str:
    """The class a shape stands for in the self-check's samples: its kind, except a decode step
    whose requests schedule more than one row each, which is a drafter's verify step."""
    if shape.kind == "decode" and shape.rows > shape.num_reqs:
        return "verify"
    return shape.kind


def depth_difference(full: int, cut: int, eager: int | None = None) -> int:
    """What the full model adds to a shape over its cut-down figure. Eager forward (`eager`
    None): full minus cut. Compiled forward: the cut steps ran eagerly, so the difference is
    split where it was measured: depth, the full model run eagerly minus the cut (like with
    like), plus what compiling added, full compiled minus full eager, each counted from 0. A
    saving from compilation (the lab's 8B layout: the eager cut decoder read 60 MiB more than
    the compiled full model on the stock step) then cannot hide what depth adds."""
    if eager is None:
        return full - cut
    return max(0, eager - cut) + max(0, full - eager)


def judge_self_check(cut: SweepResult, cut_figures: dict[Shape, int],
                     samples: Iterable[StepResult], *, depth: str, resolution: int,
                     base_delta: int, seconds: float,
                     unsampled_admitted: int | None = None,
                     eager_figures: dict[Shape, int] | None = None) -> CutDownProof:
    """Whether a cut-down sweep's assumption holds on this model, from its own measurements.

    `cut`: the cut-down sweep as admitted (its samples among the confirmations), `cut_figures`:
    each shape's cut-down peak, `samples`: the full-model steps measured for a class no
    confirmation covered (one member each), `base_delta`: the largest full-minus-cut difference
    the confirmations (stock step included) measured before the samples, `unsampled_admitted`:
    the transient the cut-down sweep admitted before them (recorded). The assumption: every
    unconfirmed shape's full-model peak is at most its cut-down peak plus that difference. It is
    refuted, and the full sweep must run, when a sample of class K
      (a) gained more from depth than base_delta + resolution: depth affects K more than the
          bound allowed, so K's unsampled members may too; or
      (b) at its class's own difference, leaves an unconfirmed member of K whose bound (cut-down
          peak + that difference) is above the admitted figure beyond the resolution.
    (b) can only fire with (a) (the admitted figure holds every bound at base_delta); it is the
    statement the admitted figure is checked by, kept so a change to the bounds cannot skip it.
    `eager_figures` (a compiled forward): each full-model shape read eagerly too; every
    difference is then depth_difference's split one."""
    eager = eager_figures or {}
    confirmed = {r.shape for r in cut.steps[len(cut.steps) - cut.confirmed:]} | {cut.stock.shape}
    per_class: dict[str, int] = {}
    deltas: dict[str, int] = {}
    for r in (cut.stock, *cut.steps[len(cut.steps) - cut.confirmed:]):
        if r.shape in cut_figures:
            k = shape_class(r.shape)
            d = depth_difference(r.peak_bytes, cut_figures[r.shape], eager.get(r.shape))
            deltas[k] = max(deltas.get(k, d), d)
    sampled = []
    for r in samples:
        k = shape_class(r.shape)
        d = depth_difference(r.peak_bytes, cut_figures[r.shape], eager.get(r.shape))
        per_class[k] = max(per_class.get(k, d), d)
        sampled.append(r.shape)
    why = []
    for k, d in sorted(per_class.items()):
        if d > base_delta + resolution:
            why.append(f"a sampled {k} step gained {d} B from depth, more than the {base_delta} B "
                       f"the confirmations measured and allowed (resolution {resolution} B)")
            continue
        over = [sh for sh, p in cut_figures.items() if shape_class(sh) == k
                and sh not in confirmed and p + max(0, d) > cut.peak_bytes + resolution]
        if over:
            worst = max(over, key=lambda sh: cut_figures[sh])
            why.append(f"{worst.label()} at its class's difference ({d} B) is bounded above the "
                       f"admitted {cut.peak_bytes} B")
    return CutDownProof(
        verdict="proven" if not why else "; ".join(why), depth=depth, full_worst=None,
        cut_worst=cut.worst.shape, full_peak_bytes=None, confirmed_peak_bytes=cut.worst.peak_bytes,
        full_admitted_bytes=None, cut_admitted_bytes=cut.peak_bytes, resolution_bytes=resolution,
        full_seconds=None, cut_seconds=round(seconds, 3), deltas=dict(sorted(deltas.items())),
        depth_delta=base_delta, method="self-check", sampled=tuple(sampled),
        unsampled_admitted_bytes=unsampled_admitted)


def judge_cut_down(full: SweepResult, cut: SweepResult, *, depth: str, resolution: int,
                   deltas: dict[str, int] | None = None) -> CutDownProof:
    """Whether the cut-down sweep `cut` would have admitted what the full sweep `full` did, on
    one engine: the same worst shape (or one that needs the same on the full
    model, within the meter's `resolution`: two splits of one chunk can tie), its confirmed
    full-model peak equal to the full sweep's within `resolution`, and an admitted transient no
    smaller than the full sweep's beyond it (a larger one only reserves more)."""
    full_on: dict = {}
    for r in (*full.steps, full.stock):
        full_on[r.shape] = max(full_on.get(r.shape, 0), r.need_bytes)
    tie = abs(full_on.get(cut.worst.shape, -resolution - 1) - full.worst.need_bytes) <= resolution
    why = []
    if cut.worst.shape != full.worst.shape and not tie:
        why.append(f"the cut-down sweep's worst is {cut.worst.shape.label()}, the full sweep's "
                   f"{full.worst.shape.label()}")
    gap = cut.worst.peak_bytes - full.worst.peak_bytes
    if abs(gap) > resolution:
        why.append(f"the confirmed peak is {gap:+d} B from the full sweep's (resolution "
                   f"{resolution} B)")
    short = full.peak_bytes - cut.peak_bytes
    if short > resolution:
        why.append(f"the cut-down sweep admits {short} B less than the full sweep")
    # The assumption itself: no shape gained more from depth than the difference the cut-down
    # sweep measured and raised every unconfirmed shape by.
    largest = max((deltas or {}).values(), default=0)
    if largest > cut.depth_delta + resolution:
        why.append(f"a shape gained {largest} B from depth, more than the {cut.depth_delta} B the "
                   "cut-down sweep measured and allowed")
    return CutDownProof(
        full_worst=full.worst.shape, cut_worst=cut.worst.shape,
        full_peak_bytes=full.worst.peak_bytes, confirmed_peak_bytes=cut.worst.peak_bytes,
        full_admitted_bytes=full.peak_bytes, cut_admitted_bytes=cut.peak_bytes,
        resolution_bytes=resolution, full_seconds=round(full.seconds, 3),
        cut_seconds=round(cut.seconds, 3), depth=depth, deltas=dict(deltas or {}),
        depth_delta=cut.depth_delta, verdict="proven" if not why else "; ".join(why))
