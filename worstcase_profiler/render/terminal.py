"""The terminal report: one screen that answers "is the stock KV setting safe, and what should I
pass instead?". It lays out the view model (render/view.py) and styles it by severity; the only
raw int is the flag value, so it can be pasted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..report import Report, Verdict
from .view import AdviceView, FitView, View, build_view

VERDICT_STYLES = {
    Verdict.SAFE: "bold green",
    Verdict.STOCK_UNSAFE: "bold yellow",
    Verdict.KV_OVERCOMMIT: "bold red",
    Verdict.DOES_NOT_FIT: "bold white on red",
}
SEVERITY_STYLES = ("", "yellow", "red")


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
    view = build_view(report)
    console.print(headline(view), soft_wrap=True, highlight=False)
    console.print(comparison_table(view))
    if view.advice is not None:
        console.print(advice_table(view.advice))
    if view.fit is not None:
        console.print(fit_table(view.fit))
    for line in detail_lines(view):
        console.print(line, soft_wrap=True, highlight=False)


def render_advice(report: Report, console: Console) -> None:
    """`wcprof advise`: the advisor's table, its line and notes, nothing else."""
    view = build_view(report)
    console.print(headline(view), soft_wrap=True, highlight=False)
    if view.advice is None:
        return
    console.print(advice_table(view.advice))
    console.print(Text(view.advice.headline, style="bold"), soft_wrap=True, highlight=False)
    for note in (view.advice.rule, *view.advice.notes):
        console.print(Text(note, style="dim"), soft_wrap=True, highlight=False)


def render_fit(report: Report, console: Console) -> None:
    """`wcprof fit`: the recommended flags first, then the trade-off table, the rule and notes."""
    view = build_view(report)
    text = Text(" FIT ", style="bold green" if view.fit.flags else "bold white on red")
    text.append(f"  {view.model}  swept {view.limits_text}", style="bold")
    text.append(f"  ({view.where_text})", style="dim")
    console.print(text, soft_wrap=True, highlight=False)
    fit = view.fit
    if fit.flags:
        line = Text("recommended: ")
        line.append(fit.flags, style="bold")
        console.print(line, soft_wrap=True, highlight=False)
    console.print(Text(fit.headline, style="" if fit.flags else "red"), soft_wrap=True,
                  highlight=False)
    console.print(fit_table(fit))
    for note in (fit.rule, fit.bound, *fit.notes):
        console.print(Text(note, style="dim"), soft_wrap=True, highlight=False)


FIT_COLUMNS = ("context", "chunk", "seqs", "worst need", "KV cache", "requests", "tok/s",
               "min util", "")


def fit_table(fit: FitView) -> Table:
    title = ("fit: the frontier" if fit.flags else
             "fit: the candidates closest to it, then the frontier") + \
        (" (context: --max-model-len, chunk: --max-num-batched-tokens, seqs: --max-num-seqs; "
         "requests: at full length at once; tok/s: prefill at the swept context; min util: the "
         "least --gpu-memory-utilization that still holds them)")
    table = Table(title=title, title_justify="left", expand=False)
    for name in FIT_COLUMNS:
        table.add_column(name, justify="left" if name == "" else "right", no_wrap=True)
    for r in fit.rows:
        table.add_row(r.max_model_len, r.chunk, r.seqs, r.need, r.kv_bytes, r.requests,
                      r.prefill, r.share, r.mark,
                      style=("bold" if "recommended" in r.mark else SEVERITY_STYLES[r.severity])
                      or None)
    return table


ADVICE_COLUMNS = ("chunk", "worst need", "KV cache", "KV tokens", "Δ tokens", "tok/s", "Δ tok/s",
                  "")


def advice_table(advice: AdviceView) -> Table:
    table = Table(title="chunk advice: max_num_batched_tokens by KV tokens admitted and prefill "
                        "tok/s at long context (Δ: against the configured chunk)",
                  title_justify="left", expand=False)
    for name in ADVICE_COLUMNS:
        table.add_column(name, justify="left" if name == "" else "right", no_wrap=True)
    for r in advice.rows:
        table.add_row(f"{r.chunk:,}", r.need, r.kv_bytes, r.kv_tokens, r.kv_change, r.prefill,
                      r.prefill_change, r.mark,
                      style=("bold" if "knee" in r.mark else SEVERITY_STYLES[r.severity]) or None)
    return table


def headline(view: View) -> Text:
    text = Text(f" {view.verdict} ", style=VERDICT_STYLES[view.verdict])
    text.append(f"  {view.model}  {view.limits_text}", style="bold")
    text.append(f"  ({view.where_text})", style="dim")
    return text


def comparison_table(view: View) -> Table:
    table = Table(title="stock vs worst-case", title_justify="left", expand=False)
    table.add_column("")
    for name in ("stock", "worst-case", "difference"):
        table.add_column(name, justify="right")
    for row in view.rows:
        table.add_row(row.label, row.stock, row.worst, row.difference)
    return table


def detail_lines(view: View) -> list[Text]:
    lines = []
    for d in view.details:
        if d.kind == "flag":
            text = Text("recommended: ")
            text.append(view.flag, style="bold")
            text.append(f"  {view.flag_note}")
            lines.append(text)
        else:
            lines.append(Text(d.text, style=SEVERITY_STYLES[d.severity]))
    return lines
