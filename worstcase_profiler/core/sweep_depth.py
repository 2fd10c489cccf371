"""Sweep depth: whether the sweep runs cut down or on the full model, the evidence it rests on (the
model classes a cut-down sweep was proven on, as data), and the proof that judges a cut-down sweep
against the full one on one engine (core/sweep.prove_cut_down runs both).

  CUT_DOWN_PROVEN, CUT_DOWN_PROVEN_COMPILED   the evidence (data/cut-down-proofs/proven.json):
                      model class -> the committed results that prove it
  sweep_depth         whether the sweep runs cut down or on the full model
  judge_cut_down      whether a cut-down sweep admitted what the full sweep did (the proof)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from .types import CutDownProof, SweepResult

EVIDENCE = Path(__file__).resolve().parents[1] / "data" / "cut-down-proofs" / "proven.json"
"""The evidence tables, as data: {"eager": CUT_DOWN_PROVEN, "compiled": CUT_DOWN_PROVEN_COMPILED}.
A family enters one only with committed results that show its proof."""

_EVIDENCE: dict[str, dict[str, str]] = json.loads(EVIDENCE.read_text(encoding="utf-8"))

CUT_DOWN_PROVEN: dict[str, str] = _EVIDENCE["eager"]
"""Model classes on which a cut-down sweep was shown, on a GPU, to pick the same worst shape as
the full sweep with the confirmed peak equal within the meter's resolution (`--sweep-depth
prove`, bench/gpu_suite.py's *_prove cases): class -> "RUN: CASE, CASE; RUN: CASE", the
committed results (docs/results/RUN) that show it, checked by tests/unit/test_committed_results.py.
Scope: the class as those cases ran it (bf16 weights, default KV dtype, TP=1, eager, FA3 on sm_90);
every architecture vLLM maps onto the class is cut down alike (docs/sweep.md).
DeepseekV32ForCausalLM is not here: its fp8-cache proof failed (docs/results)."""

CUT_DOWN_PROVEN_COMPILED: dict[str, str] = _EVIDENCE["compiled"]
"""The classes of CUT_DOWN_PROVEN whose proof also held with the model compiled and CUDA graphs
on (vLLM's default): the cut steps then bypass the compiled forward and run eagerly, while the
stock step and the confirmations run compiled (the measured stock difference carries both).
Same form and check as CUT_DOWN_PROVEN. Scope: vLLM 0.32's V2 runner, TP=1, FA3 on sm_90."""


def sweep_depth(setting: str, model_class: str, *, eager: Callable[[], bool],
                device_kind: str = "cuda", runner: str = "v2",
                tensor_parallel_size: int = 1) -> tuple[str, str]:
    """("full" | "cut-down" | "prove", why). auto cuts down only proven families, on the kind of
    device they were proven on (CUDA: their kernels set the peaks), and a compiled forward only
    where the family's proof also ran compiled (CUT_DOWN_PROVEN_COMPILED: its cut steps run the
    Python forward eagerly); cut-down and prove are taken as asked (prove runs both, the full
    one admitted; cut-down on a compiled forward of another family says it is unproven).
    `eager` is asked only when the answer involves a cut (it walks the model)."""
    if setting == "full":
        return "full", "full: asked for (sweep_depth=full)"
    if setting == "auto" and model_class not in CUT_DOWN_PROVEN:
        return "full", (f"full: the cut-down sweep is not yet proven for {model_class} "
                        "(sweep_depth=prove compares both on this model)")
    if setting == "auto" and device_kind != "cuda":
        return "full", (f"full: the cut-down sweep is proven for {model_class} on CUDA devices, "
                        f"not on {device_kind} (sweep_depth=prove compares both here)")
    if setting == "prove":
        return "prove", "full, then cut-down to compare (sweep_depth=prove)"
    compiled_proof = CUT_DOWN_PROVEN_COMPILED.get(model_class)
    if compiled_proof and (runner != "v2" or tensor_parallel_size != 1):
        compiled_proof = None  # proven on the V2 runner at TP=1 only
    if setting == "cut-down":
        return "cut-down", "cut-down: asked for (sweep_depth=cut-down)" + (
            "" if compiled_proof or eager() else
            "; the model runs compiled, so its cut steps run eagerly, which no proof has covered "
            "for this family (sweep_depth=prove compares both)")
    if eager():
        return "cut-down", f"cut-down: proven for {model_class} ({CUT_DOWN_PROVEN[model_class]})"
    if compiled_proof:  # a compiled forward's cut steps run eagerly: proven for this family
        return "cut-down", (f"cut-down: proven for {model_class} compiled, its cut steps run "
                            f"eagerly ({compiled_proof})")
    scope = "eager forwards only" if model_class not in CUT_DOWN_PROVEN_COMPILED else \
        "compiled forwards only on the V2 runner at TP=1"
    return "full", (f"full: the model runs compiled, and the cut-down sweep is proven for "
                    f"{model_class} on {scope} (sweep_depth=prove compares both)")


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
