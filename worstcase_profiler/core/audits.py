"""The start-up audits: what KV initialisation allocated against the budget, and what warm-up kept
against what admission set aside for it. Pure functions of measured bytes that return the audit
record and the error that refuses the start; the adapter (adapter/kv.py, adapter/startup.py)
measures and applies.

  kv_audit_verdict    what KV initialisation allocated against the budget
  kv_audit_error      the error that refuses the start on an over-budget audit
  warmup_verdict      what warm-up kept against what admission set aside for it
  warmup_to_remember  what of it the sweep cache keeps for the next start
  concurrency_note    how many requests the KV pool holds at once, when fewer than max_num_seqs
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable

from ..errors import DoesNotFit, KVOvercommit, WcprofError
from ..sizes import fmt_bytes
from .types import KVAuditGroup, KVAudit, WarmupAudit, WarmupEstimate


def kv_audit_verdict(groups: Iterable[KVAuditGroup], *, budget: int, allowed: int,
                     delta_process: int | None, tolerance: float = 0.01,
                     allocated: int | None = None) -> KVAudit:
    """What KV initialisation allocated (`allocated`: the distinct storages, once each, where
    groups overlay one pool; by default the groups' sum) against the budget the worker
    returned, or against what an explicit block count explains (`allowed`); and each KV group
    (the drafter's included) against its own plan, its declared bytes. Over by more than
    `tolerance`, in total or in any planned group: over-budget, and the message names the
    groups that are over first."""
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
    return KVAudit(budget_bytes=budget, allowed_bytes=allowed, allocated_bytes=allocated,
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


def kv_audit_error(audit: KVAudit, setting: str) -> WcprofError | None:
    """The error that refuses the start (kv_audit=error and over budget), else None."""
    if audit.verdict == "ok" or setting != "error":
        return None
    return KVOvercommit(audit.message,
                        hint="the engine refuses to start; fix the KV planning of this model, or "
                             "set worstcase_profiler.kv_audit=warn to start anyway")


def warmup_verdict(*, resident: int, graphs: int, accounted: int, margin: int, mode: str,
                   kv_cache_bytes: int, cached: bool, residue: int = 0, spare: int = 0
                   ) -> tuple[WarmupAudit, DoesNotFit | None]:
    """Device memory warm-up kept after the KV budget was fixed (`resident`, of which `graphs`
    by CUDA graph capture), against what admission set aside for it: its warm-up reserve
    (`accounted`) plus `residue`, held memory it counted for buffers not yet allocated (a
    cached start's sweep residue, HeldMemory.residue_bytes), which warm-up may create, plus
    `spare`, the part of the worst-case KV budget the KV cache was not given (an explicit
    --kv-cache-memory-bytes below it, or the KV cache held at the pool the measured plan covers:
    Admission.pool_ceiling_bytes): that memory stays free beside the worst step's headroom.
    More than the margin outside all three eats the worst step's headroom: in enforce mode that
    refuses the start, naming what was kept and the flag value that fits (and, when the figure
    went into the sweep cache, that the next start subtracts it)."""
    spare = max(0, spare)
    outside = resident - accounted - residue - spare
    ok = outside <= margin
    kept = _kept_text(resident, graphs)
    aside = fmt_bytes(accounted) if not residue else (
        f"{fmt_bytes(accounted + residue)} ({fmt_bytes(accounted)} warm-up reserve, "
        f"{fmt_bytes(residue)} of the cached sweep's residue counted in held memory)")
    if spare:
        aside += (f", and the KV cache given (an explicit --kv-cache-memory-bytes, or the pool "
                  f"the measured plan covers) leaves {fmt_bytes(spare)} of the worst-case KV "
                  f"budget unused")
    msg = f"warm-up kept {kept} after the KV budget was fixed; admission set aside {aside}"
    msg += ": within the margin" if ok else f", so {fmt_bytes(outside)} of the worst step's headroom is gone"
    audit = WarmupAudit(resident_bytes=resident, graphs_bytes=graphs,
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


def with_startup(audit: WarmupAudit, *, peak: int, transient: int, before_capture: int | None,
                 predicted: int, resolution: int, after_capture: int | None = None
                 ) -> tuple[WarmupAudit, str | None]:
    """The audit with what vLLM's own warm-up needed beside the KV cache (adapter/startup.warm_up
    meters it): its high-water mark above its start (`peak`), the part above what it left live
    (`transient`), the mark when graph capture began (`before_capture`) and when it ended
    (`after_capture`; both None without capture); against the worst step's predicted transient
    (`predicted`). Its message says which part set the mark (a rise within the meter's
    `resolution` is not counted): the warm-ups before capture, capture itself, or what ran after
    it (the V1 runner warms its sampler up after capture). The second value is a warning when
    the transient exceeded the prediction by more than `resolution` (a startup step the worst
    case did not cover; the start itself survived it), else None."""
    setter = ""
    if before_capture is not None:
        after = before_capture if after_capture is None else max(before_capture, after_capture)
        setter = (", set after graph capture, by the warm-ups that follow it"
                  if after_capture is not None and peak > after + resolution else
                  ", set during graph capture" if peak > before_capture + resolution else
                  ", set before graph capture, by the compile and kernel warm-ups")
    note = (f"vLLM's own warm-up beside the KV cache needed {fmt_bytes(transient)} above what it "
            f"kept (high-water mark {fmt_bytes(peak)} above its start{setter}); the worst step's "
            f"predicted peak is {fmt_bytes(predicted)}"
            + (f" ({transient / predicted:.3f} of it)" if predicted else ""))
    audit = replace(audit, message=f"{audit.message}; {note}", startup_peak_bytes=peak,
                    startup_transient_bytes=transient,
                    startup_peak_before_capture_bytes=before_capture,
                    startup_peak_after_capture_bytes=after_capture)
    over = transient - predicted
    return audit, (f"{note}: {fmt_bytes(over)} more than the worst case holds" if
                   over > resolution else None)


def capture_warmup_verdict(*, transient: int | None, shape: tuple[int, int] | None,
                           admitted: int, slack: int, margin: int) -> str | None:
    """A graph capture's eager warm-up (metered before the KV decision: warmup.
    capture_warm_ups_metered) against the worst case's admitted transient: vLLM's start runs it
    beside the KV cache, with up to max_num_seqs requests whatever the pool holds. None where it
    fits within the admitted transient plus `margin` (the meter's resolution: the safety margin
    is kept for what nothing measured) or was not metered; else what it needs beyond, for a
    warning, or the refusal under enforce (the KV cache is not allocated yet)."""
    if transient is None or shape is None:
        return None
    over = transient + max(0, slack) - admitted
    if over <= margin:
        return None
    return (f"vLLM's graph capture warms each graph up with graphs off first; the widest of "
            f"those runs ({shape[0]} tokens over {shape[1]} requests) needed "
            f"{fmt_bytes(transient)} beside what was held, {fmt_bytes(over)} more than the worst "
            f"case's admitted {fmt_bytes(admitted)} (beyond the meter's {fmt_bytes(margin)}): its "
            f"start would run it beside a KV cache sized without it")


def _kept_text(resident: int, graphs: int) -> str:
    other = max(0, resident - graphs)
    if graphs and other:
        return (f"{fmt_bytes(resident)} resident (CUDA graphs {fmt_bytes(graphs)}, other buffers "
                f"{fmt_bytes(other)})")
    if graphs:
        return f"{fmt_bytes(resident)} resident (CUDA graphs)"
    return f"{fmt_bytes(resident)} resident (buffers other than CUDA graphs: no graph was captured)"


def concurrency_note(*, pool_blocks: int, request_blocks: int, state_blocks: int,
                     max_num_seqs: int) -> str | None:
    """The most requests the KV pool holds at once, when that is fewer than max_num_seqs; else
    None. `pool_blocks`: the pool's blocks (one is vLLM's null block); `request_blocks`: the
    fewest a request holds (a block in every KV group, and in a Mamba group its 1 + k state
    blocks under speculative decoding: `state_blocks` of them beyond one a group). An upper
    bound: a request never holds fewer, so the scheduler never runs more at once and queues the
    rest (a small KV size under deep speculation, 1 + k state blocks a request, holds fewer
    requests than max_num_seqs)."""
    if request_blocks < 1 or pool_blocks < 2:
        return None
    most = (pool_blocks - 1) // request_blocks
    if most >= max_num_seqs:
        return None
    why = (f"each holds at least {request_blocks} block(s), {state_blocks} of them recurrent-state "
           f"blocks kept per speculative token" if state_blocks else
           f"each holds at least {request_blocks} block(s), one per KV group")
    return (f"the KV pool ({pool_blocks} blocks) holds at most {most} request(s) at once, fewer "
            f"than max_num_seqs={max_num_seqs} ({why}): vLLM queues the rest; a larger KV budget "
            f"or a smaller --max-num-seqs makes the limit say what runs")
