"""The view model every renderer formats: the verdict, the flag to paste, the stock vs worst-case
rows and the detail lines, each with a kind and a severity. Built from a report alone, so a saved
report renders the same as a fresh one. Every derived figure a renderer shows is computed here,
once; renderers only lay it out and style it by severity.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..core.admission import least_of, null_block_text, pool_hold_text
from ..core.cache_trust import TRUST_SKIPS_RECHECK, held_moved_text
from ..core.check_steps import fails, line as check_line, missed
from ..core.coverage import certified_count
from ..core.multimodal import encoder_line
from ..core.pool_fit import fit_text
from ..core.replay_rules import replay_reached, validation_exceeded
from ..core.timing import profiler_phases
from ..report import Report, Shape, StepResult, Verdict
from ..sizes import fmt_bytes, fmt_deltas, fmt_tokens

INFO, WARN, ERROR = 0, 1, 2
MAX_SLOTS_SHOWN = 4


@dataclass(frozen=True)
class Detail:
    kind: str
    text: str
    severity: int = INFO


@dataclass(frozen=True)
class Row:
    label: str
    stock: str
    worst: str
    difference: str


@dataclass(frozen=True)
class AdviceRow:
    chunk: int
    need: str
    kv_bytes: str
    kv_tokens: str
    kv_change: str
    prefill: str
    prefill_change: str
    mark: str
    severity: int = INFO


@dataclass(frozen=True)
class AdviceView:
    """The chunk advisor's table (report.advice): one row per candidate, the knee's line."""

    rows: tuple[AdviceRow, ...]
    headline: str
    rule: str
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class FitRow:
    max_model_len: str
    chunk: str
    seqs: str
    need: str
    kv_bytes: str
    requests: str
    prefill: str
    share: str
    mark: str
    severity: int = INFO


@dataclass(frozen=True)
class FitPoint:
    """One point of the frontier chart: a max_model_len against the requests at full length its
    KV cache holds at once. kind: "recommended", "frontier" (one point per frontier candidate,
    labelled with its chunk, max_num_seqs and prefill rate), "feasible" (weighed, off the
    frontier) or "infeasible" (does not fit, or holds fewer than min_concurrency); off the
    frontier, one point per position and kind, unlabelled."""

    max_model_len: int
    requests: int
    kind: str
    label: str = ""


@dataclass(frozen=True)
class FitView:
    """The fit (report.fit): the recommended flags, its line, the trade-off table (the frontier,
    or without a recommendation the candidates that came closest), the rule, bound and notes;
    the chart's points and its staircase (the most requests any frontier candidate holds at
    each max_model_len or longer, as (max_model_len, requests) from the shortest)."""

    flags: str | None
    headline: str
    rows: tuple[FitRow, ...]
    rule: str
    bound: str
    notes: tuple[str, ...] = ()
    points: tuple[FitPoint, ...] = ()
    staircase: tuple[tuple[int, int], ...] = ()
    min_concurrency: int = 1
    chart_title: str = ""


@dataclass(frozen=True)
class View:
    verdict: Verdict
    model: str
    limits_text: str
    where_text: str
    flag_bytes: int
    flag_note: str
    rows: tuple[Row, ...]
    details: tuple[Detail, ...]
    summary: str
    advice: AdviceView | None = None
    fit: FitView | None = None
    flag_fits: bool = True
    """The recommended value holds one request at max_model_len (else there is none to paste)."""

    @property
    def flag(self) -> str:
        if not self.flag_fits:
            return "none"
        return f"--kv-cache-memory-bytes {self.flag_bytes}"


def shape_text(shape: Shape) -> str:
    return (f"{shape.kind} rows={fmt_tokens(shape.rows)} ctx={fmt_tokens(shape.context_len)} "
            f"reqs={shape.num_reqs}")


def signed(n: int, fmt=fmt_bytes) -> str:
    return ("+" if n > 0 else "") + fmt(n)


def short_model(name: str, limit: int = 48) -> str:
    """A local checkpoint directory by its last component; a hub id as it is."""
    if name.startswith(("/", "./", "../", "~")) and Path(name).name:
        name = Path(name).name
    return name if len(name) <= limit else "…" + name[-(limit - 1):]


def transient_bytes(report: Report) -> int:
    """The worst transient admission subtracted (reports before schema 1.3 did not store it)."""
    adm = report.admission
    return adm.transient_bytes if adm.transient_bytes is not None \
        else report.worstcase.peak_activation_bytes


def stock_shortfall_bytes(report: Report) -> int:
    """How much more than stock reserved the worst step at long context needs (0: stock holds)."""
    adm = report.admission
    if adm.stock_oom_context_len is None:
        return 0
    if adm.stock_shortfall_bytes is not None:
        return adm.stock_shortfall_bytes
    worst = max((r.need_bytes for r in report.worstcase.context_curve), default=0)
    return max(0, worst - report.stock.need_bytes)


def build_view(report: Report) -> View:
    cfg, adm, wc, stock = report.config, report.admission, report.worstcase, report.stock
    limits = (f"max_model_len={fmt_tokens(cfg.max_model_len)} "
              f"max_num_batched_tokens={fmt_tokens(cfg.max_num_batched_tokens)} "
              f"max_num_seqs={cfg.max_num_seqs}")
    where = (f"{report.device.name}, vLLM {report.vllm_version} {report.runner.runner}, "
             f"{parallel_text(cfg)}")
    rows = [Row("peak activation (transient)", fmt_bytes(stock.peak_activation_bytes),
                fmt_bytes(wc.peak_activation_bytes),
                signed(wc.peak_activation_bytes - stock.peak_activation_bytes))]
    if wc.workspace_bytes or stock.workspace_bytes:
        rows.append(Row("workspace (all slots)", fmt_bytes(stock.workspace_bytes),
                        fmt_bytes(wc.workspace_bytes),
                        signed(wc.workspace_bytes - stock.workspace_bytes)))
        rows.append(Row("step need (peak + workspace)", fmt_bytes(stock.need_bytes),
                        fmt_bytes(wc.need_bytes), signed(wc.need_bytes - stock.need_bytes)))
    rows += [
        Row("KV cache bytes", fmt_bytes(adm.stock_kv_cache_bytes), fmt_bytes(adm.kv_cache_bytes),
            signed(adm.kv_cache_bytes - adm.stock_kv_cache_bytes)),
        Row("KV tokens", fmt_tokens(adm.kv_tokens_stock), fmt_tokens(adm.kv_tokens_worstcase),
            signed(adm.kv_tokens_worstcase - adm.kv_tokens_stock, fmt_tokens)),
    ]
    summary = (f"worst-case peak {fmt_bytes(wc.peak_activation_bytes)} vs stock peak "
               f"{fmt_bytes(stock.peak_activation_bytes)}; KV tokens "
               f"{fmt_tokens(adm.kv_tokens_worstcase)} (worst-case) vs "
               f"{fmt_tokens(adm.kv_tokens_stock)} (stock); {stock_detail(report).text}; worst "
               f"step {shape_text(wc.worst_shape)}.")
    return View(verdict=report.verdict, model=cfg.model, limits_text=limits, where_text=where,
                flag_bytes=adm.recommended_kv_cache_memory_bytes, flag_note=flag_note(report),
                flag_fits=budget_holds_one_request(report), rows=tuple(rows),
                details=tuple(details(report)), summary=summary,
                advice=build_advice_view(report), fit=build_fit_view(report))


def details(report: Report) -> list[Detail]:
    adm, wc = report.admission, report.worstcase
    out = [Detail("worst-step", f"worst step: {shape_text(wc.worst_shape)}; peak set in "
                                f"{wc.worst_op or 'unknown op'} (stock profiles "
                                f"{shape_text(report.stock.shape)})")]
    if wc.encoder_step is not None:
        out.append(Detail("encoder-step", encoder_line(wc.encoder_step)))
    for check in wc.check_steps:
        out.append(Detail("check-step", check_line(check, wc.peak_activation_bytes)))
    if wc.workspace_bytes or any(s.bytes_after for s in wc.workspace_slots):
        out.append(Detail("workspace", workspace_text(report)))
    warmup = f"cudagraphs {fmt_bytes(adm.cudagraph_bytes)}"
    if adm.warmup_source and adm.warmup_source != "none":
        warmup += f" (warm-up reserve: {warmup_source_text(report)})"
    out.append(Detail("budget", f"budget: requested {fmt_bytes(adm.requested_bytes)} - consumed "
                                f"{fmt_bytes(adm.consumed_bytes)} - worst peak "
                                f"{fmt_bytes(transient_bytes(report))} - {warmup} - margin "
                                f"{fmt_bytes(adm.margin_bytes)} = {fmt_bytes(adm.budget_bytes)}"))
    flag = (f"--kv-cache-memory-bytes {adm.recommended_kv_cache_memory_bytes}"
            if budget_holds_one_request(report) else "none")
    out.append(Detail("flag", f"recommended: {flag}  {flag_note(report)}",
                      INFO if budget_holds_one_request(report) else ERROR))
    out.append(stock_detail(report))
    out.append(Detail("coverage", coverage_text(report)))
    for skipped in wc.skipped_shapes:
        out.append(Detail("skipped", f"not run: {skipped}", WARN))
    if wc.stock_excluded:
        out.append(Detail("stock-excluded", f"stock step not in the worst case: "
                                            f"{wc.stock_excluded}"))
    if wc.pool_fit is not None:
        out.append(Detail("pool-fit", fit_text(wc.pool_fit, wc.worst_shape,
                                               wc.peak_activation_bytes)))
    if report.chunk_cap is not None:
        out.append(Detail("chunk-cap", chunk_cap_text(report.chunk_cap)))
    if wc.sweep_mode not in ("full", ""):
        out.append(Detail("sweep-mode", f"sweep mode: {wc.sweep_mode}"))
    proof = wc.cut_down_proof
    if proof is not None:
        out.append(Detail("cut-down-proof", proof_text(proof),
                          INFO if proof.verdict == "proven" else WARN))
    if wc.cache is not None and wc.cache.status != "off":
        out.append(Detail("cache", cache_text(wc.cache),
                          WARN if wc.cache.status == "stale" else INFO))
    if report.kv_audit is not None:
        a = report.kv_audit
        out.append(Detail("kv-audit", f"KV audit: allocated {fmt_bytes(a.allocated_bytes)} vs budget "
                                      f"{fmt_bytes(a.budget_bytes)} (allowed "
                                      f"{fmt_bytes(a.allowed_bytes)}), ratio {a.ratio:.3f}: "
                                      f"{a.verdict}{kv_groups_text(a)}",
                          INFO if a.verdict == "ok" else ERROR))
    if report.warmup_audit is not None and report.warmup_audit.verdict != "ok":
        out.append(Detail("warmup-audit", f"warm-up audit: {report.warmup_audit.message}", ERROR))
    elif report.warmup_audit is not None and report.warmup_audit.startup_transient_bytes is not None:
        out.append(Detail("warmup-audit", f"warm-up audit: {report.warmup_audit.message}"))
    for v in (report.validations or ([report.validation] if report.validation else [])):
        miss = missed(v)
        out.append(Detail("validation", validation_text(v, miss),
                          ERROR if fails(v)
                          else WARN if miss or replay_reached(v) is False else INFO))
    if report.advice is not None:
        out.append(Detail("advice", advice_headline(report.advice)))
    if report.fit is not None:
        out.append(Detail("fit", fit_headline(report.fit),
                          INFO if report.fit.recommended is not None else ERROR))
        if report.fit.applied_why:  # max_model_len: auto
            out.append(Detail("max-model-len", report.fit.applied_why,
                              INFO if report.fit.applied_max_model_len else ERROR))
    if report.ranks:
        out.append(Detail("ranks", ranks_text(report)))
    if report.startup_seconds:
        out.append(Detail("startup", startup_text(report.startup_seconds)))
    out.extend(Detail("warning", f"warning: {w}", WARN) for w in report.warnings)
    return out


def kv_groups_text(audit) -> str:
    """Each KV group against its own plan, the drafter's layers named: empty for a
    report from before groups carried a ratio."""
    parts = []
    for g in audit.groups:
        if g.ratio is None:
            continue
        extra = f", drafter {len(g.drafter_layers)} of {len(g.layers)} layers" \
            if g.drafter_layers else ""
        extra += f", {len(g.unplanned_layers)} unplanned" if g.unplanned_layers else ""
        parts.append(f"{g.name} x{g.ratio:.3f} of its plan{extra}")
    return f"; groups: {'; '.join(parts)}" if parts else ""


def warmup_source_text(report: Report) -> str:
    adm = report.admission
    graphs = adm.warmup_graphs_bytes or 0
    other = max(0, adm.cudagraph_bytes - graphs)
    where = {"vllm-estimate": "vLLM's CUDA-graph estimate",
             "rehearsal": "warm-up rehearsed on the provisional KV cache",
             "cache": "measured by an earlier start of this configuration"}.get(
                 adm.warmup_source or "", adm.warmup_source or "")
    parts = [f"graphs {fmt_bytes(graphs)}"] + ([f"other buffers {fmt_bytes(other)}"] if other else [])
    return f"{where}; {', '.join(parts)}"


def budget_holds_one_request(report: Report) -> bool:
    """The recommended value (the budget, whole MiB) holds one request at max_model_len besides
    the block vLLM's block pool holds back (admission.least_of)."""
    adm = report.admission
    return adm.recommended_kv_cache_memory_bytes > 0 and \
        adm.recommended_kv_cache_memory_bytes >= least_of(adm)


def flag_note(report: Report) -> str:
    adm = report.admission
    if not budget_holds_one_request(report):
        return no_fit_text(report)
    note = f"({fmt_bytes(adm.recommended_kv_cache_memory_bytes)})"
    explicit = adm.explicit_kv_cache_memory_bytes
    if explicit is not None:
        note += f"; explicit setting {fmt_bytes(explicit)}"
        if adm.one_request_bytes and explicit < least_of(adm):
            note += (f", less than the {fmt_bytes(least_of(adm))} one request at "
                     f"max_model_len needs (with vLLM's null block)")
        elif explicit > adm.budget_bytes:
            note += ", more than the worst-case budget"
    if report.chunk_cap is not None:  # the budget holds only with the cap enforcing its steps
        note += f"; only with chunk_cap {report.chunk_cap.plan.rows} in the plugin's settings"
    held = pool_hold_text(adm)
    if held is not None:
        note += f"; {held}: a larger pool holds wider steps"
    return note


def no_fit_text(report: Report) -> str:
    """Why no value is recommended: the budget against one request, and the cause when the
    margin alone is it."""
    adm, cfg = report.admission, report.config
    text = (f"(no value is safe: the budget, {fmt_bytes(adm.budget_bytes)}, does not hold one "
            f"request at max_model_len={fmt_tokens(cfg.max_model_len)}, "
            f"{fmt_bytes(adm.one_request_bytes)}{null_block_text(adm)}")
    if adm.margin_bytes and adm.budget_bytes + adm.margin_bytes >= least_of(adm):
        text += f"; the margin ({fmt_bytes(adm.margin_bytes)}, --margin) is the cause: lower it"
    else:
        text += "; lower --max-model-len or --max-num-batched-tokens, or give the engine more memory"
    return text + ")"


def stock_detail(report: Report) -> Detail:
    """Where stock admission runs out, why, and by how much against the margin."""
    adm, cfg = report.admission, report.config
    oom = adm.stock_oom_context_len
    if oom is None:
        return Detail("stock", f"stock holds up to max_model_len ({fmt_tokens(cfg.max_model_len)})")
    short = stock_shortfall_bytes(report)
    if not adm.margin_bytes:
        scale = "no margin"
    elif short < adm.margin_bytes:
        scale = f"{100 * short / adm.margin_bytes:.0f}% of our {fmt_bytes(adm.margin_bytes)} margin"
    else:
        scale = f"{short / adm.margin_bytes:.1f}x our {fmt_bytes(adm.margin_bytes)} margin"
    curve = report.worstcase.context_curve
    rows = curve[-1].shape.rows if curve else report.worstcase.worst_shape.rows
    if oom == 0:
        return Detail("stock", (
            f"stock is short at every context length: its profile step (rows="
            f"{fmt_tokens(report.stock.shape.rows)}, no KV, no attention metadata) needs less "
            f"than a rows={fmt_tokens(rows)} step already needs on an empty KV cache; at "
            f"max_model_len the shortfall is {fmt_bytes(short)} ({scale})"), WARN)
    return Detail("stock", (
        f"stock setting runs out at context length {fmt_tokens(oom)}: from there a step needs "
        f"more than stock reserved, up to {fmt_bytes(short)} more at max_model_len "
        f"{fmt_tokens(cfg.max_model_len)} ({scale})"), WARN)


def validation_text(v, missed: bool = False) -> str:
    """One validation in words; `missed`: a named step over its own reading but within its
    admitted figure (core/check_steps.missed), which warns instead of failing."""
    what = {"worst-step": " (worst step)",
            "quick": " (quick: the worst step's rows and requests, short context)",
            "multimodal": f" (multimodal step: {v.encoder_items} {v.modality} item(s) through "
                          f"the encoder, against the admitted figure)",
            "check-step": " (check step, against its own reading)",
            }.get(v.target, "")
    text = (f"validation{what}: measured {fmt_bytes(v.measured_peak_bytes)} vs predicted "
            f"{fmt_bytes(v.predicted_peak_bytes)}, ratio {v.ratio:.3f}")
    if v.shape is not None:
        text += f" at {shape_text(v.shape)}"
    if v.requests:
        text += f"; requests: {'; '.join(v.requests)}"
    if v.rank:
        text += f", rank {v.rank}"
    if v.note:
        text += f" ({v.note})"
    if v.target == "multimodal" and v.encoder_items_formed is not None:
        text += f"; the encoder ran on {v.encoder_items_formed} item(s) in one step"
    if (v.left_bytes or 0) > max(v.resolution_bytes, 1):
        text += (f"; the requests left {fmt_bytes(v.left_bytes)} allocated after they finished "
                 f"(taken off the measured transient as persistent; the admission did not count "
                 f"it)")
    if replay_reached(v) is False:
        text += (f"; NOT REACHED: the closest step the scheduler formed was "
                 f"{fmt_tokens(v.formed.rows)} rows over {v.formed.num_reqs} request(s) at context "
                 f"{fmt_tokens(v.formed.context_len)}, so this measured another step, not the "
                 f"{'check' if v.target == 'check-step' else 'worst'} one")
    if missed:
        over = fmt_bytes(v.measured_peak_bytes - v.predicted_peak_bytes)
        text += (f"; over its own reading by {over} but within the admitted figure: a reading "
                 f"that missed, not an engine at risk")
    elif v.predicted_peak_bytes < v.measured_peak_bytes and not validation_exceeded(v):
        text += (f" (over the prediction by {fmt_bytes(v.measured_peak_bytes - v.predicted_peak_bytes)}"
                 f", within the meter's {fmt_bytes(v.resolution_bytes)} resolution)")
    return text


def ranks_text(report: Report) -> str:
    """One entry per TP rank: each rank's own peak, KV budget and validation."""
    same = len({tuple(r.worstcase.plan_fingerprints) for r in report.ranks}) == 1

    def one(r: Report) -> str:
        text = (f"rank {r.rank}: worst peak {fmt_bytes(r.worstcase.peak_activation_bytes)}, KV "
                f"{fmt_bytes(r.admission.budget_bytes)}")
        if r.validation is not None:
            quick = " (quick)" if r.validation.target == "quick" else ""
            text += f", validation {r.validation.ratio:.3f}{quick}"
        return text

    kind = "TP" if report.config.pipeline_parallel_size == 1 else parallel_text(report.config)
    return (f"{kind} ranks: " + "; ".join(one(r) for r in report.ranks)
            + (" (identical sweep on every rank)" if same else " (SWEEPS DIFFER)"))


def startup_text(phases: dict[str, float]) -> str:
    """The profiler's start-up cost next to stock vLLM's own phases, largest first."""
    ours = profiler_phases(phases)
    stock = sum(v for k, v in phases.items() if k.startswith("vllm_"))
    top = ", ".join(f"{k} {v:.2f}s" for k, v in sorted(ours.items(), key=lambda kv: -kv[1])[:4])
    return (f"start-up: profiler {sum(ours.values()):.2f}s ({top}) on top of vLLM's own "
            f"profile, KV init and warm-up {stock:.2f}s")


def workspace_text(report: Report) -> str:
    wc = report.worstcase
    text = f"workspace: {fmt_bytes(wc.workspace_bytes)} persistent"
    if wc.workspace_locked:
        text += " (locked)"
    slots = wc.workspace_slots
    if slots:
        shown = "; ".join(f"ubatch {s.ubatch} lane {s.lane}: {fmt_bytes(s.bytes_before)} -> "
                          f"{fmt_bytes(s.bytes_after)}" for s in slots[:MAX_SLOTS_SHOWN])
        more = f"; +{len(slots) - MAX_SLOTS_SHOWN} more" if len(slots) > MAX_SLOTS_SHOWN else ""
        text += f"; per slot: {shown}{more}"
    return text


def coverage_text(report: Report) -> str:
    wc = report.worstcase
    cov = wc.coverage
    certified = certified_count(cov.segments, cov.executed_rows)
    return (f"rows coverage: {fmt_tokens(wc.rows_covered.min)}..{fmt_tokens(wc.rows_covered.max)}"
            f" by {cov.method}; {wc.shapes_executed} shapes executed; "
            f"{fmt_tokens(len(cov.executed_rows))} rows executed, "
            f"{fmt_tokens(certified)} certified by "
            f"chord (tolerance {fmt_bytes(cov.tolerance_bytes)}); sweep {wc.seconds:.1f}s"
            f"{' (when cached)' if wc.cache is not None and wc.cache.status == 'hit' else ''} vs "
            f"stock step {report.stock.seconds:.2f}s")


def cache_text(use) -> str:
    if use.status == "stored":
        return f"sweep cached at {use.path} (the next start with this config replays its worst step)"
    verb = "reused" if use.status == "hit" else "cache STALE, swept again"
    where = f" on the cut decoder ({use.replay_depth})" if use.replay_depth else ""
    return (f"sweep {verb}: cached worst step needs {fmt_bytes(use.replayed_need_bytes)}{where} "
            f"now vs {fmt_bytes(use.cached_need_bytes)} when cached {use.cached_at} (allowed drift "
            f"{fmt_bytes(use.allowed_drift_bytes)}; replay {use.replay_seconds:.1f}s"
            f"{TRUST_TEXT.get(use.trust, '')}"
            f"{'; ' + held if (held := held_moved_text(use.held_moved_bytes, use.held_kept)) else ''}"
            f"{raised_text(use.transient_raised_bytes)})")


def raised_text(raised: int | None) -> str:
    """A cached start's transient raised by its replay (core/sweep.reused), or "" where not."""
    return f"; transient raised {fmt_bytes(raised)} by the replay" if raised else ""


TRUST_TEXT = {**{trust: f"; {text}" for trust, text in TRUST_SKIPS_RECHECK.items()},
              "re-checked": "; the plan's heaviest shapes re-checked"}


def plan_steps(report: Report) -> list[StepResult]:
    """The steps of the plan the admission holds, in the order they ran: the sweep's, less the
    shapes a fit to the admitted pool dropped (that pool cannot form them), and the fit's own
    (worstcase.pool_fit). Without a fit, the sweep's steps."""
    wc = report.worstcase
    if wc.pool_fit is None:
        return list(wc.steps)
    dropped = set(wc.pool_fit.dropped)
    return [s for s in (*wc.steps, *wc.pool_fit.steps) if s.shape not in dropped]


def full_extent_prefill(report: Report) -> list[StepResult]:
    """The rows sweep: prefill chunks whose largest request ends exactly at max_model_len,
    one per rows value (the last measurement wins), sorted by rows; of the admitted plan's
    steps (`plan_steps`)."""
    mml = report.config.max_model_len
    by_rows: dict[int, StepResult] = {}
    for step in plan_steps(report):
        s = step.shape
        if s.kind != "prefill":
            continue
        largest = -(-s.rows // s.num_reqs)
        if s.context_len + largest == mml:
            by_rows[s.rows] = step
    return [by_rows[r] for r in sorted(by_rows)]


# --- the chunk advisor ------------------------------------------------------------------------

def _rate(tps: float | None) -> str:
    return "n/a" if not tps else f"{tps:,.0f} tok/s"


def _pct(new: float | None, old: float | None) -> str:
    if not new or not old:
        return ""
    return f"{100 * (new / old - 1):+.1f}%"


def advice_headline(advice) -> str:
    """One line: the knee against the configured chunk."""
    knee = advice.candidate(advice.knee_chunk)
    ref = advice.candidate(advice.configured_chunk)
    if knee is None:
        if not any(c.fits for c in advice.candidates):
            return "advice: no candidate chunk leaves room for one request at max_model_len"
        return "advice: no knee (no candidate chunk was timed)"
    best = max((c.prefill_tokens_per_s or 0) for c in advice.candidates if c.fits)
    share = f"{100 * (knee.prefill_tokens_per_s or 0) / best:.0f}%" if best else "n/a"
    if ref is None or knee.chunk == ref.chunk:
        return (f"advice: keep max_num_batched_tokens={fmt_tokens(knee.chunk)}: no other "
                f"candidate admits more KV while keeping prefill within "
                f"{advice.within:.0%} of the best ({_rate(knee.prefill_tokens_per_s)}, "
                f"{fmt_tokens(knee.kv_tokens)} KV tokens)")
    return (f"advice: --max-num-batched-tokens {knee.chunk} admits "
            f"{signed(knee.kv_tokens - ref.kv_tokens, fmt_tokens)} KV tokens "
            f"({signed(knee.kv_cache_bytes - ref.kv_cache_bytes)}) vs the configured "
            f"{fmt_tokens(ref.chunk)}, at {share} of the best prefill throughput "
            f"({_rate(knee.prefill_tokens_per_s)} vs {_rate(ref.prefill_tokens_per_s)} "
            f"configured); worst-case need {fmt_bytes(knee.need_bytes)} vs "
            f"{fmt_bytes(ref.need_bytes)}")


def build_advice_view(report: Report) -> AdviceView | None:
    advice = report.advice
    if advice is None:
        return None
    ref = advice.candidate(advice.configured_chunk)
    rows = []
    for c in advice.candidates:
        marks = []
        if c.chunk == advice.configured_chunk:
            marks.append("configured")
        if c.chunk == advice.knee_chunk:
            marks.append("knee")
        if not c.fits:
            marks.append("does not fit")
        same = ref is None or c.chunk == ref.chunk
        rows.append(AdviceRow(
            chunk=c.chunk, need=fmt_bytes(c.need_bytes), kv_bytes=fmt_bytes(c.kv_cache_bytes),
            kv_tokens=fmt_tokens(c.kv_tokens),
            kv_change="" if same else signed(c.kv_tokens - ref.kv_tokens, fmt_tokens),
            prefill=f"{c.prefill_tokens_per_s:,.0f}" if c.prefill_tokens_per_s else "n/a",
            prefill_change="" if same else _pct(c.prefill_tokens_per_s,
                                                 ref.prefill_tokens_per_s),
            mark=", ".join(marks), severity=INFO if c.fits else ERROR))
    notes = tuple(f"chunk {fmt_tokens(e.chunk)} left out: {e.reason}" for e in advice.excluded)
    timed = sum(1 for c in advice.candidates if c.prefill_seconds)
    notes += (f"measured for the advice in {advice.seconds:.1f}s: "
              f"{max(0, len(advice.steps) - timed)} step(s) the sweep had not run, and {timed} "
              f"timed prefill step(s) (each after an untimed run); every other step taken from "
              f"the sweep",)
    return AdviceView(rows=tuple(rows), headline=advice_headline(advice), rule=advice.rule,
                      notes=notes)


def chunk_cap_text(cap) -> str:
    """The chunk cap in one line: its levels, the KV it gained, the prefill it cost."""
    levels, prev = [], 0
    for lv in cap.plan.levels[:-1]:
        levels.append(f"{fmt_tokens(lv.rows)} rows up to ctx {fmt_tokens(lv.up_to_context)}")
        prev = lv.up_to_context
    levels.append(f"{fmt_tokens(cap.plan.levels[-1].rows)} beyond ctx {fmt_tokens(prev)}"
                  if len(cap.plan.levels) > 1 else f"{fmt_tokens(cap.plan.levels[-1].rows)} rows")
    lost = (f", prefill at long context {1 - cap.prefill_throughput_lost:.2f}x uncapped"
            if cap.prefill_throughput_lost is not None else "")
    static = (f"; the advisor's static chunk {fmt_tokens(cap.static_chunk)}"
              f" holds {fmt_tokens(cap.static_kv_tokens)} KV tokens"
              if cap.static_chunk is not None and cap.static_kv_tokens is not None else "")
    return (f"chunk cap: {', '.join(levels)}; KV {fmt_bytes(cap.budget_bytes)} "
            f"({fmt_tokens(cap.kv_tokens)} tokens) vs {fmt_bytes(cap.uncapped_budget_bytes)} "
            f"uncapped ({cap.gained_tokens:+,} tokens){lost}{static}")


# --- the fit ------------------------------------------------------------------------------------

MAX_FIT_ROWS = 12


def fit_headline(fit) -> str:
    """One line: what the recommendation holds, or that no candidate holds enough."""
    r = fit.recommended
    n = fit.min_concurrency
    if r is None:
        most = max(_fit_pool(fit), key=lambda c: (c.concurrency, c.max_model_len), default=None)
        best = "" if most is None else (
            f": the most any holds is {most.concurrency} (max_model_len "
            f"{fmt_tokens(most.max_model_len)}, chunk {fmt_tokens(most.max_num_batched_tokens)},"
            f" max_num_seqs {most.max_num_seqs})")
        where = "" if fit.objective == "context" else \
            f" at the swept max_model_len {fmt_tokens(fit.swept[0])}"
        return f"fit: no candidate holds {n} request(s) at full length at once{where}{best}"
    return (f"fit ({fit.objective}): {r.concurrency} request(s) of {fmt_tokens(r.max_model_len)} "
            f"tokens at once (at least {n} asked), chunk {fmt_tokens(r.max_num_batched_tokens)}, "
            f"max_num_seqs {r.max_num_seqs}; worst need {fmt_bytes(r.need_bytes)}, KV cache "
            f"{fmt_bytes(r.kv_cache_bytes)} ({fmt_tokens(r.kv_tokens)} tokens)"
            + (f", prefill {_rate(r.prefill_tokens_per_s)} at long context"
               if r.prefill_tokens_per_s else ""))


def _fit_pool(fit) -> list:
    """The candidates the objective chooses among: every one for context, those at the swept
    max_model_len for concurrency and throughput."""
    return [c for c in fit.candidates
            if fit.objective == "context" or c.max_model_len == fit.swept[0]]


def build_fit_view(report: Report) -> FitView | None:
    fit = report.fit
    if fit is None:
        return None
    shown = list(fit.frontier)
    if fit.recommended is None:  # the closest the objective came, then the frontier elsewhere
        closest = sorted(_fit_pool(fit), key=lambda c: (-c.concurrency, -c.max_model_len))
        shown = closest[:MAX_FIT_ROWS // 2] + [c for c in shown if c not in closest]
    left = max(0, len(shown) - MAX_FIT_ROWS)
    shown = sorted(shown[:MAX_FIT_ROWS], key=lambda c: (-c.max_model_len, -c.concurrency,
                                                        -(c.prefill_tokens_per_s or 0)))
    rows = []
    for c in shown:
        marks = []
        if fit.recommended is not None and c.limits == fit.recommended.limits:
            marks.append("recommended")
        if not c.fits:
            marks.append("does not fit")
        elif not c.feasible:
            marks.append(f"holds fewer than {fit.min_concurrency}")
        rows.append(FitRow(
            max_model_len=fmt_tokens(c.max_model_len), chunk=fmt_tokens(c.max_num_batched_tokens),
            seqs=str(c.max_num_seqs), need=fmt_bytes(c.need_bytes),
            kv_bytes=fmt_bytes(c.kv_cache_bytes), requests=str(c.concurrency),
            prefill=f"{c.prefill_tokens_per_s:,.0f}" if c.prefill_tokens_per_s else "n/a",
            share=f"{c.min_gpu_memory_utilization:.2f}"
            if c.min_gpu_memory_utilization is not None else "n/a",
            mark=", ".join(marks), severity=INFO if c.feasible else ERROR))
    model = short_model(report.config.model)
    flags = f"vllm serve {model} " + " ".join(fit.flags) if fit.flags else None
    notes = [f"measured for the fit in {fit.seconds:.1f}s: {len(fit.steps)} step(s) the sweep "
             f"and the advisor had not run; {len(fit.candidates)} candidate(s) weighed"]
    if left:
        notes.append(f"{left} more not shown: the report's fit section lists every candidate")
    notes += list(fit.notes)
    return FitView(flags=flags, headline=fit_headline(fit), rows=tuple(rows),
                   rule=f"rule: {fit.rule}", bound=f"bound: {fit.bound}", notes=tuple(notes),
                   points=fit_points(fit), staircase=fit_staircase(fit),
                   min_concurrency=fit.min_concurrency, chart_title=fit_chart_title(fit))


def fit_point_kind(fit, c) -> str:
    if fit.recommended is not None and c.limits == fit.recommended.limits:
        return "recommended"
    if c.frontier:
        return "frontier"
    return "feasible" if c.feasible else "infeasible"


def fit_points(fit) -> tuple[FitPoint, ...]:
    """Every candidate weighed, as the chart draws it: each frontier candidate (and the
    recommendation) its own labelled point; the rest one unlabelled point per (max_model_len,
    requests, kind), drawn under the frontier. Frontier candidates never share a position (one
    with more prefill at the same context and requests would beat the other)."""
    labelled, rest = [], {}
    for c in fit.candidates:
        kind = fit_point_kind(fit, c)
        if kind in ("recommended", "frontier"):
            rate = f"\n{_rate(c.prefill_tokens_per_s)} prefill" if c.prefill_tokens_per_s \
                else ""
            head = "recommended\n" if kind == "recommended" else ""
            labelled.append(FitPoint(
                c.max_model_len, c.concurrency, kind,
                f"{head}{fmt_tokens(c.max_model_len)} tokens × {c.concurrency} "
                f"request{'' if c.concurrency == 1 else 's'}\nchunk "
                f"{fmt_tokens(c.max_num_batched_tokens)}, seqs {c.max_num_seqs}{rate}"))
        else:
            rest.setdefault((c.max_model_len, c.concurrency, kind),
                            FitPoint(c.max_model_len, c.concurrency, kind))
    order = {"infeasible": 0, "feasible": 1}
    background = sorted(rest.values(), key=lambda p: (order[p.kind], p.max_model_len,
                                                      p.requests))
    return tuple(background) + tuple(sorted(labelled, key=lambda p: (p.max_model_len,
                                                                      p.requests)))


def fit_staircase(fit) -> tuple[tuple[int, int], ...]:
    """The frontier's outline: at each frontier max_model_len (shortest first) the most requests
    a frontier candidate of that max_model_len or longer holds: what a longer context costs."""
    best: dict[int, int] = {}
    for c in fit.frontier:
        best[c.max_model_len] = max(best.get(c.max_model_len, 0), c.concurrency)
    out, most = [], 0
    for length in sorted(best, reverse=True):
        most = max(most, best[length])
        out.append((length, most))
    return tuple(reversed(out))


def fit_chart_title(fit) -> str:
    what = f"{len(fit.frontier)} on the frontier of {len(fit.candidates)} candidate(s) weighed"
    return (f"fit ({fit.objective}): max_model_len against requests held at once at full "
            f"length, at least {fit.min_concurrency} asked; {what}")


def proof_text(proof) -> str:
    """The cut-down proof's line: a prove run's comparison, or auto's self-check (kept, or
    fallen back to the full sweep, with the sampled differences)."""
    name = "cut-down self-check" if proof.method == "self-check" else "cut-down proof"
    head = f"{name} ({proof.depth}): {proof.verdict}"
    if proof.method == "self-check":
        head += f"; full minus cut-down: {fmt_deltas(proof.deltas)}"
        if not proof.fell_back:
            return (head + f"; admitted {fmt_bytes(proof.cut_admitted_bytes)} from the cut-down "
                    f"sweep ({proof.cut_seconds:.1f}s)")
        head += (f"; fell back to the full sweep: admitted {fmt_bytes(proof.full_admitted_bytes)}"
                 f" (the cut-down sweep's {fmt_bytes(proof.cut_admitted_bytes)})")
    return (f"{head}; worst {proof.full_worst.label()} "
            f"{fmt_bytes(proof.full_peak_bytes)} full, {proof.cut_worst.label()} "
            f"{fmt_bytes(proof.confirmed_peak_bytes)} confirmed; sweep {proof.full_seconds:.1f}s "
            f"full, {proof.cut_seconds:.1f}s cut down")


def parallel_text(cfg) -> str:
    """"TP=2", or "TP=1 PP=2" where the engine runs pipeline stages."""
    pp = getattr(cfg, "pipeline_parallel_size", 1) or 1
    return f"TP={cfg.tensor_parallel_size}" + (f" PP={pp}" if pp > 1 else "")
