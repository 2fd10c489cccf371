"""The terminal report: one screen that answers "is the stock KV setting safe, and what should I
pass instead?". Every size goes through sizes.fmt_bytes; the only raw int is the flag value,
so it can be pasted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from worstcase_profiler.coverage import certified_count
from worstcase_profiler.report import Report, Shape
from worstcase_profiler.sizes import fmt_bytes, fmt_tokens
from worstcase_profiler.timing import profiler_phases

VERDICT_STYLES = {
    "SAFE": "bold green",
    "STOCK UNSAFE": "bold yellow",
    "KV OVER-COMMIT": "bold red",
    "DOES NOT FIT": "bold white on red",
}
MAX_SLOTS_SHOWN = 4


class TerminalReporter:
    def __init__(self, width: int = 100):
        self.width = width

    def write(self, report: Report, dest: Any = None) -> None:
        """dest: None for stdout, a rich Console, an open text stream, or a path."""
        if isinstance(dest, Console):
            render(report, dest)
        elif dest is None or dest == "-":
            render(report, Console())
        elif hasattr(dest, "write"):
            render(report, Console(file=dest, width=self.width))
        else:
            with open(Path(dest), "w", encoding="utf-8") as fh:
                render(report, Console(file=fh, width=self.width))


def render(report: Report, console: Console) -> None:
    console.print(headline(report), soft_wrap=True, highlight=False)
    console.print(comparison_table(report))
    for line in detail_lines(report):
        console.print(line, soft_wrap=True, highlight=False)


def headline(report: Report) -> Text:
    cfg = report.config
    verdict = report.verdict
    text = Text(f" {verdict} ", style=VERDICT_STYLES.get(verdict, "bold"))
    text.append(f"  {cfg.model}  max_model_len={fmt_tokens(cfg.max_model_len)} "
                f"max_num_batched_tokens={fmt_tokens(cfg.max_num_batched_tokens)} "
                f"max_num_seqs={cfg.max_num_seqs}", style="bold")
    text.append(f"  ({report.device.name}, vLLM {report.vllm_version} {report.runner.runner}, "
                f"TP={cfg.tensor_parallel_size})", style="dim")
    return text


def shape_text(shape: Shape) -> str:
    return (f"{shape.kind} rows={fmt_tokens(shape.rows)} ctx={fmt_tokens(shape.context_len)} "
            f"reqs={shape.num_reqs}")


def comparison_table(report: Report) -> Table:
    adm, wc, stock = report.admission, report.worstcase, report.stock
    table = Table(title="stock vs worst-case", title_justify="left", expand=False)
    table.add_column("")
    table.add_column("stock", justify="right")
    table.add_column("worst-case", justify="right")
    table.add_column("difference", justify="right")
    table.add_row("peak activation", fmt_bytes(stock.peak_activation_bytes),
                  fmt_bytes(wc.peak_activation_bytes),
                  _signed_bytes(wc.peak_activation_bytes - stock.peak_activation_bytes))
    if wc.workspace_bytes or stock.workspace_bytes:
        table.add_row("workspace (all slots)", fmt_bytes(stock.workspace_bytes),
                      fmt_bytes(wc.workspace_bytes),
                      _signed_bytes(wc.workspace_bytes - stock.workspace_bytes))
    table.add_row("KV cache bytes", fmt_bytes(adm.stock_kv_cache_bytes),
                  fmt_bytes(adm.kv_cache_bytes),
                  _signed_bytes(adm.kv_cache_bytes - adm.stock_kv_cache_bytes))
    table.add_row("KV tokens", fmt_tokens(adm.kv_tokens_stock), fmt_tokens(adm.kv_tokens_worstcase),
                  _signed_tokens(adm.kv_tokens_worstcase - adm.kv_tokens_stock))
    return table


def detail_lines(report: Report) -> list[Text]:
    adm, wc, cfg = report.admission, report.worstcase, report.config
    lines = [Text(f"worst step: {shape_text(wc.worst_shape)}; peak set in "
                  f"{wc.worst_op or 'unknown op'} (stock profiles "
                  f"{shape_text(report.stock.shape)})")]
    if wc.workspace_slots or wc.workspace_bytes:
        lines.append(Text(workspace_line(report)))
    # The transient admission subtracted (the measured worst peak or a certified bound on it),
    # recovered from the admission itself so the line always adds up.
    transient = (adm.requested_bytes - adm.consumed_bytes - adm.cudagraph_bytes
                 - adm.margin_bytes - adm.budget_bytes)
    lines.append(Text(
        f"budget: requested {fmt_bytes(adm.requested_bytes)} - consumed "
        f"{fmt_bytes(adm.consumed_bytes)} - worst peak {fmt_bytes(transient)} - "
        f"cudagraphs {fmt_bytes(adm.cudagraph_bytes)} - margin {fmt_bytes(adm.margin_bytes)} = "
        f"{fmt_bytes(adm.budget_bytes)}"))
    flag = Text("recommended: ")
    flag.append(f"--kv-cache-memory-bytes {adm.recommended_kv_cache_memory_bytes}", style="bold")
    flag.append(f"  ({fmt_bytes(adm.recommended_kv_cache_memory_bytes)})")
    if adm.explicit_kv_cache_memory_bytes is not None:
        flag.append(f"; explicit setting {fmt_bytes(adm.explicit_kv_cache_memory_bytes)}")
    lines.append(flag)
    if adm.stock_oom_context_len is not None:
        stock_need = report.stock.need_bytes
        worst_need = max((r.need_bytes for r in report.worstcase.context_curve), default=0)
        lines.append(Text(f"stock setting runs out at context length "
                          f"{fmt_tokens(adm.stock_oom_context_len)}: from there a step needs more "
                          f"than stock reserved, up to {fmt_bytes(worst_need - stock_need)} more "
                          f"(max_model_len {fmt_tokens(cfg.max_model_len)})", style="yellow"))
    else:
        lines.append(Text(f"stock holds up to max_model_len ({fmt_tokens(cfg.max_model_len)})"))
    lines.append(Text(coverage_line(report)))
    if report.worstcase.cache is not None and report.worstcase.cache.status != "off":
        lines.append(Text(cache_line(report.worstcase.cache)))
    if report.kv_audit is not None:
        audit = report.kv_audit
        style = "" if audit.verdict == "ok" else "red"
        lines.append(Text(f"KV audit: allocated {fmt_bytes(audit.allocated_bytes)} vs budget "
                          f"{fmt_bytes(audit.budget_bytes)} (allowed "
                          f"{fmt_bytes(audit.allowed_bytes)}), ratio {audit.ratio:.3f}: "
                          f"{audit.verdict}", style=style))
    if report.warmup_audit is not None and report.warmup_audit.verdict != "ok":
        lines.append(Text(f"warm-up audit: {report.warmup_audit.message}", style="red"))
    if report.validation is not None:
        val = report.validation
        lines.append(Text(f"validation: measured {fmt_bytes(val.measured_peak_bytes)} vs "
                          f"predicted {fmt_bytes(val.predicted_peak_bytes)}, ratio "
                          f"{val.ratio:.3f} over {len(val.requests)} request(s)"))
    if report.ranks:
        lines.append(Text(ranks_line(report)))
    if report.startup_seconds:
        lines.append(Text(startup_line(report.startup_seconds)))
    lines.extend(Text(f"warning: {w}", style="yellow") for w in report.warnings)
    return lines


def ranks_line(report: Report) -> str:
    """One entry per TP rank: each rank's own peak, KV budget and validation."""
    same = len({tuple(r.worstcase.plan_fingerprints) for r in report.ranks}) == 1

    def one(r: Report) -> str:
        text = (f"rank {r.rank}: worst peak {fmt_bytes(r.worstcase.peak_activation_bytes)}, KV "
                f"{fmt_bytes(r.admission.budget_bytes)}")
        if r.validation is not None:
            text += f", validation {r.validation.ratio:.3f}"
        return text

    return ("TP ranks: " + "; ".join(one(r) for r in report.ranks)
            + (" (identical sweep on every rank)" if same else " (SWEEPS DIFFER)"))


def startup_line(phases: dict[str, float]) -> str:
    """The profiler's start-up cost next to stock vLLM's own phases, largest first."""
    ours = profiler_phases(phases)
    stock = sum(v for k, v in phases.items() if k.startswith("vllm_"))
    top = ", ".join(f"{k} {v:.2f}s" for k, v in sorted(ours.items(), key=lambda kv: -kv[1])[:4])
    return (f"start-up: profiler {sum(ours.values()):.2f}s ({top}) on top of vLLM's own "
            f"profile, KV init and warm-up {stock:.2f}s")


def workspace_line(report: Report) -> str:
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


def coverage_line(report: Report) -> str:
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


def cache_line(use) -> str:
    if use.status == "stored":
        return f"sweep cached at {use.path} (the next start with this config replays its worst step)"
    verb = "reused" if use.status == "hit" else "cache STALE, swept again"
    return (f"sweep {verb}: cached worst step needs {fmt_bytes(use.replayed_need_bytes)} now vs "
            f"{fmt_bytes(use.cached_need_bytes)} when cached {use.cached_at} (allowed drift "
            f"{fmt_bytes(use.allowed_drift_bytes)}; replay {use.replay_seconds:.1f}s)")


def _signed_bytes(n: int) -> str:
    return ("+" if n > 0 else "") + fmt_bytes(n)


def _signed_tokens(n: int) -> str:
    return ("+" if n > 0 else "") + fmt_tokens(n)
