"""Start-up policy: pure functions that take measured facts and settings and return decisions or
error values. The adapter measures and applies; nothing here reads vLLM or the device.

  decide_budget       the KV bytes handed to vLLM (or the DoesNotFit that refuses the start)
  cache_verdict       whether a cached sweep, replayed now, may stand in for a full sweep
  reuse_consumed      the held-memory figure a cached start admits with
  kv_audit_verdict    what KV initialisation allocated against the budget (seed 000)
  warmup_verdict      what warm-up kept against what admission set aside for it
  warmup_to_remember  what of it the sweep cache keeps for the next start
  plan_agreement      whether every tensor-parallel rank ran the same steps
  validation_exceeded whether a validation measured more than predicted
  sweep_depth         whether the sweep runs cut down or on the full model
  judge_cut_down      whether a cut-down sweep admitted what the full sweep did (the proof)
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Iterable

from ..errors import DoesNotFit, KVOvercommit, WcprofError
from ..sizes import fmt_bytes
from .types import (Admission, BudgetDecision, CutDownProof, KVAuditGroup, KVAuditResult, Shape,
                    SweepResult, WarmupAuditResult, WarmupEstimate)


def decide_budget(adm: Admission, *, mode: str, kv_cap: int | None, worst_label: str,
                  max_model_len: int) -> BudgetDecision:
    """enforce: the worst-case budget (or the explicit --kv-cache-memory-bytes when it fits);
    report: vLLM's own figure, measured and reported only. kv_cap limits what is allocated
    (never below one request at max_model_len). A configuration that does not fit is refused
    in enforce mode, with the flag value that would fit when an explicit one is too large."""
    error = None
    if not adm.fits and mode == "enforce":
        explicit = adm.explicit_kv_cache_memory_bytes
        worst = f"{fmt_bytes(adm.transient_bytes)} at {worst_label}"
        if explicit is not None and explicit > max(adm.budget_bytes, 0) \
                and adm.budget_bytes >= adm.one_request_bytes:
            error = DoesNotFit(
                f"--kv-cache-memory-bytes {explicit} ({fmt_bytes(explicit)}) leaves no room for "
                f"the worst-case step ({worst})",
                hint=f"use --kv-cache-memory-bytes {adm.recommended_kv_cache_memory_bytes} or less")
        else:
            error = DoesNotFit(
                f"after the worst-case step ({worst}) the KV budget is "
                f"{fmt_bytes(adm.budget_bytes)}; one request at max_model_len={max_model_len} "
                f"needs {fmt_bytes(adm.one_request_bytes)}",
                hint="lower --max-model-len or --max-num-batched-tokens, or give the engine more "
                     "memory")
    if mode == "report":
        budget, reason = adm.stock_kv_cache_bytes, "report mode: vLLM's own figure"
    elif adm.explicit_kv_cache_memory_bytes is not None:
        budget, reason = adm.explicit_kv_cache_memory_bytes, "explicit --kv-cache-memory-bytes"
    else:
        budget, reason = max(0, adm.budget_bytes), "worst-case budget"
    if kv_cap is not None and budget > max(kv_cap, adm.one_request_bytes):
        budget, reason = max(kv_cap, adm.one_request_bytes), f"{reason}, capped by kv_cap"
    return BudgetDecision(budget_bytes=int(budget), reason=reason, error=error)


def cache_verdict(cached: int, measured: int, tolerance: int) -> tuple[bool, int]:
    """(still valid, allowed upward drift). Valid while the replayed step needs no more than it
    needed then, within the meter's tolerance or 2% of it, whichever is larger. Needing less is
    the safe direction and normal (the cached figure is the largest of many noisy measurements),
    so only a large drop (4x the allowance or 10%, whichever is larger) also rejects the entry:
    it describes another build, and reusing it would only throw KV away."""
    allowed = max(tolerance, cached // 50)
    floor = cached - max(4 * allowed, cached // 10)
    return floor <= measured <= cached + allowed, allowed


def still_worst(cached_need: int, others: list[int], allowed: int) -> bool:
    """A cached worst step may stand only while none of the plan's heaviest other shapes,
    measured now, needs more than it did (within the allowed drift): a forged or foreign entry
    that names a small step as the worst is caught here."""
    return all(n <= cached_need + allowed for n in others)


def reuse_transient(cached: int, replayed: int, resolution: int) -> int:
    """The transient a cached start admits: the cached one while the replay is within the meter's
    resolution of it (the same configuration gets the same answer), else the larger of the two."""
    return cached if replayed <= cached + resolution else max(cached, replayed)


def reuse_consumed(*, baseline_now: int, cached_baseline: int, cached_consumed: int,
                   replay_residue: int, resolution: int) -> int:
    """The held memory a cached start admits with.

    The full sweep leaves behind buffers its many step kinds create lazily (decode and mixed
    paths, per-shape kernel state), which the engine will create too once it serves; a replay
    of one step does not. So a cached start counts the full sweep's residue (cached_consumed -
    cached_baseline) on top of its own baseline (held before the replay), and never less than
    what the replay left. While its baseline is within the meter's resolution of the cached one,
    the cached figure stands as is: the same configuration gets the same admission whether it
    swept or replayed."""
    residue = max(cached_consumed - cached_baseline, replay_residue)
    if abs(baseline_now - cached_baseline) <= resolution and replay_residue <= \
            cached_consumed - cached_baseline + resolution:
        return cached_consumed
    return baseline_now + residue


def recheck_dominance(signed: bool) -> bool:
    """Whether a reused entry's worst step must be re-checked against the plan's heaviest shapes
    (core/sweep.dominance_checks). That re-check is what stops an entry whose worst shape and
    need were swapped for a smaller self-consistent pair; an entry signed under the operator's
    secret cannot have been forged that way (docs/cache.md), so it replays only its worst step."""
    return not signed


def kv_audit_verdict(groups: Iterable[KVAuditGroup], *, budget: int, allowed: int,
                     delta_process: int | None, tolerance: float = 0.01,
                     allocated: int | None = None) -> KVAuditResult:
    """What KV initialisation allocated (`allocated`: the distinct storages, once each, where
    groups overlay one pool; by default the groups' sum) against the budget the worker returned, or against what an explicit block count
    explains (`allowed`); and each KV group (the drafter's included) against its own plan, its
    declared bytes. Over by more than `tolerance`, in total or in any planned group:
    over-budget, and the message names the groups that are over first."""
    groups = tuple(_judge_group(g, tolerance) for g in groups)
    if allocated is None:
        allocated = sum(g.allocated_bytes for g in groups)
    ratio = allocated / allowed if allowed > 0 else float("inf")
    over_groups = [g for g in groups if g.verdict == "over-budget"]
    over = allocated > allowed * (1 + tolerance) or bool(over_groups)
    shares = "; ".join(_group_share(g) for g in groups)
    if over:
        named = "".join(f"; {g.name} allocated {fmt_bytes(g.allocated_bytes)} against its plan "
                        f"of {fmt_bytes(g.declared_bytes)} (x{g.ratio:.2f})" for g in over_groups)
        msg = (f"KV initialisation allocated {fmt_bytes(allocated)} against a budget of "
               f"{fmt_bytes(allowed)} (x{ratio:.2f}){named}: {shares}")
    else:
        msg = f"KV allocation within budget (x{ratio:.3f}): {shares}"
    return KVAuditResult(budget_bytes=budget, allowed_bytes=allowed, allocated_bytes=allocated,
                         ratio=ratio, delta_process_bytes=delta_process, groups=groups,
                         verdict="over-budget" if over else "ok", message=msg)


def _judge_group(g: KVAuditGroup, tolerance: float) -> KVAuditGroup:
    """A planned group (declared bytes > 0) against its own plan; `outside the plan` (nothing
    declared) is judged by the total only."""
    if g.declared_bytes <= 0:
        return replace(g, ratio=None, verdict=None)
    ratio = g.allocated_bytes / g.declared_bytes
    return replace(g, ratio=ratio,
                   verdict="over-budget" if g.allocated_bytes > g.declared_bytes * (1 + tolerance)
                   else "ok")


def _group_share(g: KVAuditGroup) -> str:
    extra = []
    if g.drafter_layers:
        extra.append(f"drafter: {len(g.drafter_layers)} of {len(g.layers)} layer(s)")
    if g.unplanned_layers:
        extra.append(f"{len(g.unplanned_layers)} unplanned per-layer buffer(s)")
    tail = f", {', '.join(extra)}" if extra else ""
    return (f"{g.name}: {fmt_bytes(g.allocated_bytes)} in "
            f"{len(g.layers) + len(g.unplanned_layers)} holder(s) (plan "
            f"{fmt_bytes(g.declared_bytes)}{tail})")


def kv_audit_error(audit: KVAuditResult, setting: str) -> WcprofError | None:
    """The error that refuses the start (kv_audit=error and over budget), else None."""
    if audit.verdict == "ok" or setting != "error":
        return None
    return KVOvercommit(audit.message,
                        hint="the engine refuses to start; fix the KV planning of this model, or "
                             "set worstcase_profiler.kv_audit=warn to start anyway")


def warmup_verdict(*, resident: int, graphs: int, accounted: int, margin: int, mode: str,
                   kv_cache_bytes: int, cached: bool, residue: int = 0
                   ) -> tuple[WarmupAuditResult, DoesNotFit | None]:
    """Device memory warm-up kept after the KV budget was fixed (`resident`, of which `graphs`
    by CUDA graph capture), against what admission set aside for it: its warm-up reserve
    (`accounted`) plus `residue`, held memory it counted for buffers not yet allocated (a
    cached start's sweep residue, HeldMemory.residue_bytes), which warm-up may create. More than
    the margin outside both eats the worst step's headroom: in enforce mode that refuses the
    start, naming what was kept and the flag value that fits (and, when the figure went into the
    sweep cache, that the next start subtracts it)."""
    outside = resident - accounted - residue
    ok = outside <= margin
    kept = _kept_text(resident, graphs)
    aside = fmt_bytes(accounted) if not residue else (
        f"{fmt_bytes(accounted + residue)} ({fmt_bytes(accounted)} warm-up reserve, "
        f"{fmt_bytes(residue)} of the cached sweep's residue counted in held memory)")
    msg = f"warm-up kept {kept} after the KV budget was fixed; admission set aside {aside}"
    msg += ": within the margin" if ok else f", so {fmt_bytes(outside)} of the worst step's headroom is gone"
    audit = WarmupAuditResult(resident_bytes=resident, graphs_bytes=graphs,
                              accounted_bytes=accounted + residue, outside_bytes=outside,
                              allowed_bytes=margin, verdict="ok" if ok else "outside-budget",
                              message=msg)
    if ok or mode != "enforce":
        return audit, None
    fix = max(0, kv_cache_bytes - max(0, outside))
    flag = f"--kv-cache-memory-bytes {fix} ({fmt_bytes(fix)})"
    hint = (f"the figure is cached: start again with the same config and admission subtracts "
            f"it; or pass {flag}" if cached else f"pass {flag}")
    return audit, DoesNotFit(msg, hint=hint)


def warmup_to_remember(*, resident: int, graphs: int, reserve: int, residue: int, ok: bool,
                       exact: bool) -> WarmupEstimate | None:
    """What the configuration's cache entry should remember of this warm-up, or None to leave
    it as it is. A failed audit always records (the refusal's hint promises the next start
    subtracts it). A passed one records only on an exact meter (CUDA's allocator counters): on
    the CPU, RSS growth within the margin is noise, and recording it would make a restart admit
    less than the start that swept. A cached start's sweep residue (held memory it counted but
    had not allocated) is credited only against what warm-up kept beyond its own reserve."""
    if ok and not exact:
        return None
    credited = min(residue, max(0, resident - reserve))
    return WarmupEstimate(graphs_bytes=min(graphs, resident),
                          other_bytes=max(0, resident - graphs - credited), source="cache")


def _kept_text(resident: int, graphs: int) -> str:
    other = max(0, resident - graphs)
    if graphs and other:
        return (f"{fmt_bytes(resident)} resident (CUDA graphs {fmt_bytes(graphs)}, other buffers "
                f"{fmt_bytes(other)})")
    if graphs:
        return f"{fmt_bytes(resident)} resident (CUDA graphs)"
    return f"{fmt_bytes(resident)} resident (buffers other than CUDA graphs: no graph was captured)"


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
    0 where the meter is exact). Works on the core Validation and the report's alike."""
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
    (`formed`: the step formed_for chose). None when either is unknown (a traffic validation,
    or no step recorded). A replay that did not reach its target measured some other step: its
    ratio says nothing about the worst one. Works on the core Validation and the report's."""
    if v.shape is None or v.formed is None:
        return None
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


CUT_DOWN_PROVEN: dict[str, str] = {
    "LlamaForCausalLM": "h200-run26: llama_v2_prove, llama8b_prove; h200-run28: llama_v1_prove",
    "Qwen3_5ForCausalLM": "h200-run26: qwen35_prove, qwen35_mtp_prove",
}
"""Model classes on which a cut-down sweep was shown, on a GPU, to pick the same worst shape as
the full sweep with the confirmed peak equal within the meter's resolution (`--sweep-depth
prove`, bench/gpu_suite.py's *_prove cases): class -> "RUN: CASE, CASE; RUN: CASE", the
committed results (docs/results/RUN) that show it, checked by tests/unit/test_committed_results.py.
Scope: the class as those cases ran it (bf16 weights, default KV dtype, TP=1, eager, FA3 on sm_90);
every architecture vLLM maps onto the class is cut down alike (docs/sweep.md).
DeepseekV32ForCausalLM is not here: its fp8-cache proof failed (h200-run28)."""

CUT_DOWN_PROVEN_COMPILED: dict[str, str] = {
    "LlamaForCausalLM": "h200-run31: llama_graphs_prove, llama8b_graphs_prove",
}
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
                   deltas: tuple[tuple[str, int], ...] = ()) -> CutDownProof:
    """Whether the cut-down sweep `cut` would have admitted what the full sweep `full` did, on
    one engine (issue 20's proof): the same worst shape (or one that needs the same on the full
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
    largest = max((d for _, d in deltas), default=0)
    if largest > cut.depth_delta + resolution:
        why.append(f"a shape gained {largest} B from depth, more than the {cut.depth_delta} B the "
                   "cut-down sweep measured and allowed")
    return CutDownProof(
        full_worst=full.worst.shape, cut_worst=cut.worst.shape,
        full_peak_bytes=full.worst.peak_bytes, confirmed_peak_bytes=cut.worst.peak_bytes,
        full_admitted_bytes=full.peak_bytes, cut_admitted_bytes=cut.peak_bytes,
        resolution_bytes=resolution, full_seconds=round(full.seconds, 3),
        cut_seconds=round(cut.seconds, 3), depth=depth, deltas=deltas,
        depth_delta=cut.depth_delta, verdict="proven" if not why else "; ".join(why))
