"""`wcprof diff OLD.json NEW.json [--max-increase 5%] [--metric NAME]...`: did worst-case memory
get worse between two reports? The gated metrics (METRICS) and their rule (judge) are also
`wcprof gate`'s.

Reads reports only (no engine, no vLLM, no torch), so it runs anywhere CI does.

Exit codes: 0 no gated metric got worse by more than the threshold; 1 at least one did; 2 bad
input: a missing file, a file that is not a wcprof report, a bad threshold or metric (raised as
errors.ConfigError; cli.main prints the one-line message).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable, Literal

from rich.console import Console
from rich.table import Table

from ..core.admission import pool_hold_text
from ..errors import ArgParser, ConfigError
from ..report import Report
from ..sizes import fmt_bytes, fmt_tokens


Better = Literal["lower", "higher"]


@dataclass(frozen=True)
class Metric:
    name: str
    title: str
    better: Better  # which direction is an improvement
    unit: Literal["bytes", "tokens", "flag"]
    read: Callable[[Report], int | None]
    gated_by_default: bool = True


def _need(r: Report) -> int:
    return r.worstcase.need_bytes


def _stock_oom(r: Report) -> int:
    """The context length at which stock runs out; None (stock holds) reads as max_model_len,
    so 'stock became unsafe' is a decrease like any other."""
    oom = r.admission.stock_oom_context_len
    return r.config.max_model_len if oom is None else oom


METRICS: dict[str, Metric] = {m.name: m for m in [
    Metric("peak", "worst-case peak", "lower", "bytes",
           lambda r: r.worstcase.peak_activation_bytes),
    Metric("workspace", "workspace, all slots", "lower", "bytes",
           lambda r: r.worstcase.workspace_bytes),
    Metric("need", "peak + workspace", "lower", "bytes", _need),
    Metric("kv_flag", "recommended KV flag", "higher", "flag",
           lambda r: r.admission.recommended_kv_cache_memory_bytes),
    Metric("kv_tokens", "worst-case KV tokens", "higher", "tokens",
           lambda r: r.admission.kv_tokens_worstcase),
    Metric("stock_oom", "stock runs out at ctx", "higher", "tokens", _stock_oom,
           gated_by_default=False),
]}


DEFAULT_GATED = [m.name for m in METRICS.values() if m.gated_by_default]


def parse_threshold(text: str) -> float:
    """'5%' or '5' -> 0.05 (a fraction of the old value). Negative or not a number: ConfigError."""
    raw = str(text).strip()
    number = raw[:-1].strip() if raw.endswith("%") else raw
    try:
        value = float(number)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"bad --max-increase {text!r}: use a non-negative percentage such as 5%")
    return value / 100.0


def parse_metrics(values: list[str] | None) -> list[str]:
    if not values:
        return list(DEFAULT_GATED)
    names: list[str] = []
    for value in values:
        for name in (v.strip() for v in value.split(",")):
            if not name:
                continue
            if name == "all":
                names.extend(METRICS)
            elif name in METRICS:
                names.append(name)
            else:
                raise ConfigError(f"unknown metric {name!r}",
                                  hint=f"use one or more of: {', '.join(METRICS)}, all")
    return list(dict.fromkeys(names))


def worsening(metric: Metric, old: int, new: int) -> float:
    """How much worse `new` is than `old`, as a fraction of old (<= 0: not worse). From zero,
    any worsening is infinite."""
    delta = (new - old) if metric.better == "lower" else (old - new)
    if delta <= 0:
        return delta / old if old else 0.0
    return delta / old if old else math.inf


def judge(old: Report, new: Report, gated: list[str],
          threshold: float) -> tuple[list[str], tuple[str, float] | None]:
    """(the gated metrics that got worse by more than `threshold`, the gated metric with the
    largest worsening and its worsening), in METRICS order: the rule of `wcprof diff` and
    `wcprof gate` alike."""
    failed: list[str] = []
    worst: tuple[str, float] | None = None
    for metric in METRICS.values():
        if metric.name not in gated:
            continue
        w = worsening(metric, metric.read(old), metric.read(new))
        if worst is None or w > worst[1]:
            worst = (metric.name, w)
        if w > threshold:
            failed.append(metric.name)
    return failed, worst


def _fmt(metric: Metric, value: int | None) -> str:
    if value is None:
        return "n/a"
    if metric.unit == "bytes":
        return fmt_bytes(value)
    if metric.unit == "flag":
        return str(value)  # pasteable; the change column says it in GiB
    return fmt_tokens(value)


def _show(metric: Metric, report: Report, value: int | None) -> str:
    if metric.name == "stock_oom" and report.admission.stock_oom_context_len is None:
        return f"never (≤ {fmt_tokens(value)})"
    return _fmt(metric, value)


def held_flag_notes(old: Report, new: Report) -> list[str]:
    """A line for each report whose recommended flag is held at the KV pool its measured plan
    covers (core.admission.pool_hold_text): there the flag is the plan's limit, so a smaller
    flag is not memory the profile lost to a larger peak."""
    held = ((which, pool_hold_text(r.admission)) for which, r in (("old", old), ("new", new)))
    return [f"the {which} report's kv_flag is {text}" for which, text in held if text]


def _fmt_change(metric: Metric, old: int, new: int) -> str:
    delta = new - old
    sign = "+" if delta > 0 else ""
    absolute = (sign + fmt_bytes(delta)) if metric.unit in ("bytes", "flag") \
        else (sign + fmt_tokens(delta))
    if old:
        return f"{absolute} ({sign}{100.0 * delta / old:.2f}%)"
    return absolute if delta else "0"


def load(path: str) -> Report:
    """A saved report (ConfigError, exit 2, when it is missing or not a wcprof report)."""
    from ..render.json_report import load_report

    return load_report(path)


def config_differences(old: Report, new: Report) -> list[str]:
    keys = ("model", "max_model_len", "max_num_batched_tokens", "max_num_seqs", "kv_cache_dtype",
            "tensor_parallel_size", "pipeline_parallel_size")
    a, b = dataclasses.asdict(old.config), dataclasses.asdict(new.config)
    out = [f"{k}: {a[k]} -> {b[k]}" for k in keys if a[k] != b[k]]
    if old.device.name != new.device.name:
        out.append(f"device: {old.device.name} -> {new.device.name}")
    return out


def parser() -> ArgParser:
    """`wcprof diff`'s flags."""
    p = ArgParser(prog="wcprof diff",
                  description="fail CI when worst-case memory got worse between two reports")
    p.add_argument("old", metavar="OLD.json")
    p.add_argument("new", metavar="NEW.json")
    p.add_argument("--max-increase", default="5%", metavar="PCT",
                   help="largest tolerated worsening, relative to OLD (default 5%%)")
    p.add_argument("--metric", action="append", metavar="NAME",
                   help=f"metric(s) to gate, repeatable or comma-separated: "
                        f"{', '.join(METRICS)}, all (default: {', '.join(DEFAULT_GATED)})")
    return p


def run(argv: list[str]) -> int:
    """wcprof diff OLD.json NEW.json [--max-increase 5%] [--metric NAME[,NAME]]...

    Compares the worst-case figures of two reports. A gated metric fails when it got worse by
    more than --max-increase, relative to OLD: peak, workspace and need fail when they grow;
    kv_flag, kv_tokens and stock_oom fail when they shrink. Exit 0: nothing gated got worse by
    more than the threshold; 1: something did; 2: bad input (see the module docstring)."""
    ns = parser().parse_args(argv)
    threshold = parse_threshold(ns.max_increase)
    gated = parse_metrics(ns.metric)
    old, new = load(ns.old), load(ns.new)

    table = Table(title=f"wcprof diff (gate: worse by more than {100 * threshold:g}%)",
                  title_justify="left")
    for col, justify in (("metric", "left"), ("", "left"), ("old", "right"), ("new", "right"),
                         ("change", "right"), ("gate", "left")):
        table.add_column(col, justify=justify)
    failed, _ = judge(old, new, gated, threshold)
    for metric in METRICS.values():
        a, b = metric.read(old), metric.read(new)
        if metric.name not in gated:
            verdict = "[dim]not gated[/]"
        elif metric.name in failed:
            verdict = "[bold red]FAIL[/]"
        else:
            verdict = "[green]ok[/]"
        table.add_row(metric.name, metric.title, _show(metric, old, a), _show(metric, new, b),
                      _fmt_change(metric, a, b), verdict)
    console = Console(soft_wrap=True, highlight=False)
    console.print(table)
    for line in config_differences(old, new):
        console.print(f"[yellow]note: the reports differ in {line}[/]")
    if "kv_flag" in gated:
        for line in held_flag_notes(old, new):
            console.print(f"note: {line}")
    if old.verdict != new.verdict:
        console.print(f"verdict: {old.verdict} -> {new.verdict}")
    if failed:
        console.print(f"[bold red]FAIL[/]: {', '.join(failed)} got worse by more than "
                      f"{100 * threshold:g}%")
        return 1
    console.print(f"[green]ok[/]: no gated metric got worse by more than {100 * threshold:g}%")
    return 0
