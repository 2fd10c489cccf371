"""The picture as one self-contained HTML file: inline CSS, the figure as inline SVG (its text
stays text), no script and no external resource, so it opens offline and in a mail client. The
key numbers are also plain HTML text (verdict, the flag to paste, stock vs worst-case peak, KV
tokens), so they can be searched and copied. Written atomically."""

from __future__ import annotations

import re
from html import escape
from typing import Any

from worstcase_profiler.render.json_report import emit_text
from worstcase_profiler.render.picture import VERDICT_COLOURS, figure_bytes, shape_text
from worstcase_profiler.report import Report
from worstcase_profiler.sizes import fmt_bytes, fmt_tokens

CSS = """
body { font-family: "DejaVu Sans", "Liberation Sans", Arial, sans-serif; margin: 1.5em auto;
       max-width: 1400px; color: #222; padding: 0 1em; }
h1 { font-size: 1.45em; margin: 0 0 .3em 0; }
.verdict { color: #fff; padding: .1em .5em; border-radius: .25em; }
.sub { color: #555; margin: 0 0 1em 0; }
.flag { font-size: 1.15em; background: #f4f4f4; border: 1px solid #ccc; padding: .5em .8em;
        display: inline-block; margin: .3em 0 1em 0; }
table { border-collapse: collapse; margin: .5em 0 1em 0; }
th, td { border-bottom: 1px solid #ddd; padding: .3em .9em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
ul.details { padding-left: 1.2em; line-height: 1.45; }
li.warn { color: #8a4b00; }
figure { margin: 1em 0; }
figure svg { width: 100%; height: auto; }
footer { color: #777; font-size: .85em; margin-top: 1.5em; }
"""


class HtmlReporter:
    def write(self, report: Report, dest: Any) -> None:
        """dest: a path (written atomically), an open text stream, or None / "-" for stdout."""
        emit_text(render_html(report), dest)


def inline_svg(report: Report) -> str:
    """The figure's <svg> element alone (no XML prolog or DOCTYPE, which would point at w3.org),
    scaled to the page width."""
    svg = figure_bytes(report, "svg").decode("utf-8")
    svg = svg[svg.index("<svg"):]
    head_end = svg.index(">")
    head = re.sub(r'\s(width|height)="[^"]*"', "", svg[:head_end])
    return head + ' role="img" aria-label="wcprof memory picture"' + svg[head_end:]


def _signed(n: int, fmt=fmt_bytes) -> str:
    return ("+" if n > 0 else "") + fmt(n)


def key_rows(report: Report) -> list[tuple[str, str, str, str]]:
    """(what, stock, worst-case, difference) rows, the terminal's comparison table plus need."""
    adm, wc, stock = report.admission, report.worstcase, report.stock
    rows = [("peak activation (transient)", fmt_bytes(stock.peak_activation_bytes),
             fmt_bytes(wc.peak_activation_bytes),
             _signed(wc.peak_activation_bytes - stock.peak_activation_bytes))]
    if wc.workspace_bytes or stock.workspace_bytes:
        rows.append(("workspace (all slots)", fmt_bytes(stock.workspace_bytes),
                     fmt_bytes(wc.workspace_bytes),
                     _signed(wc.workspace_bytes - stock.workspace_bytes)))
    rows += [
        ("step need (peak + workspace)", fmt_bytes(stock.need_bytes), fmt_bytes(wc.need_bytes),
         _signed(wc.need_bytes - stock.need_bytes)),
        ("KV cache bytes", fmt_bytes(adm.stock_kv_cache_bytes), fmt_bytes(adm.kv_cache_bytes),
         _signed(adm.kv_cache_bytes - adm.stock_kv_cache_bytes)),
        ("KV tokens", fmt_tokens(adm.kv_tokens_stock), fmt_tokens(adm.kv_tokens_worstcase),
         _signed(adm.kv_tokens_worstcase - adm.kv_tokens_stock, fmt_tokens)),
    ]
    return rows


def detail_sentences(report: Report) -> list[tuple[str, bool]]:
    """The terminal report's detail lines as plain text (same wording), flagged when they are
    warnings."""
    from worstcase_profiler.render.terminal import detail_lines

    out = []
    for line in detail_lines(report):
        text = line.plain
        out.append((text, text.startswith("warning:") or "runs out" in text
                    or str(line.style) in ("yellow", "red")))
    return out


def render_html(report: Report) -> str:
    adm, cfg = report.admission, report.config
    verdict = report.verdict
    colour = VERDICT_COLOURS.get(verdict, "#333")
    flag = adm.recommended_kv_cache_memory_bytes
    title = f"wcprof {verdict}: {cfg.model}"
    table = "\n".join(
        "<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>"
        for row in key_rows(report))
    details = "\n".join(
        ('<li class="warn">' if warn else "<li>") + escape(text) + "</li>"
        for text, warn in detail_sentences(report))
    stock_oom = (f"stock runs out at context length {fmt_tokens(adm.stock_oom_context_len)}"
                 if adm.stock_oom_context_len is not None
                 else f"stock holds up to max_model_len ({fmt_tokens(cfg.max_model_len)})")
    summary = (f"worst-case peak {fmt_bytes(report.worstcase.peak_activation_bytes)} vs stock peak "
               f"{fmt_bytes(report.stock.peak_activation_bytes)}; KV tokens "
               f"{fmt_tokens(adm.kv_tokens_worstcase)} (worst-case) vs "
               f"{fmt_tokens(adm.kv_tokens_stock)} (stock); {stock_oom}; worst step "
               f"{shape_text(report.worstcase.worst_shape)}.")
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="wcprof {escape(report.tool_version)}">
<title>{escape(title)}</title>
<style>{CSS}</style>
</head>
<body>
<h1><span class="verdict" id="verdict" style="background:{colour}">{escape(verdict)}</span>
 {escape(cfg.model)}</h1>
<p class="sub">max_model_len={fmt_tokens(cfg.max_model_len)} ·
max_num_batched_tokens={fmt_tokens(cfg.max_num_batched_tokens)} ·
max_num_seqs={cfg.max_num_seqs} · TP={cfg.tensor_parallel_size} ·
{escape(report.device.name)} · vLLM {escape(report.vllm_version)}
({escape(report.runner.runner)} runner)</p>
<div>recommended:</div>
<div class="flag"><code id="flag">--kv-cache-memory-bytes {flag}</code> ({fmt_bytes(flag)})</div>
<p id="summary">{escape(summary)}</p>
<table id="comparison">
<thead><tr><th></th><th>stock</th><th>worst-case</th><th>difference</th></tr></thead>
<tbody>
{table}
</tbody>
</table>
<ul class="details">
{details}
</ul>
<figure>
{inline_svg(report)}
<figcaption>How to read this picture: docs/picture.md in the worstcase_profiler source.</figcaption>
</figure>
<footer>wcprof {escape(report.tool_version)} · report schema {escape(report.schema_version)} ·
created {escape(report.created_at)} · rank {report.rank}</footer>
</body>
</html>
"""
