"""The picture as one self-contained HTML file: inline CSS, the figure as inline SVG (its text
stays text), no script and no external resource, so it opens offline and in a mail client. The
key numbers are also plain HTML text (verdict, the flag to paste, stock vs worst-case peak, KV
tokens), so they can be searched and copied. Written atomically."""

from __future__ import annotations

import re
from html import escape
from typing import Any

from ..report import Report
from .json_report import emit_text
from .picture import VERDICT_COLOURS, figure_bytes
from .view import build_view

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
li.error { color: #b2182b; font-weight: bold; }
tr.knee td { font-weight: bold; background: #eef6ec; }
tr.error td { color: #b2182b; }
h2 { font-size: 1.15em; margin: 1em 0 .2em 0; }
figure { margin: 1em 0; }
figure svg { width: 100%; height: auto; }
footer { color: #777; font-size: .85em; margin-top: 1.5em; }
"""
FIT_CSS = """tr.recommended td { font-weight: bold; background: #eef6ec; }
table#fit td { white-space: nowrap; }
table#fit caption { caption-side: top; text-align: left; color: #555; font-size: .9em;
                    padding-bottom: .3em; }
p.error { color: #b2182b; }
"""
"""Added only to a page with a fit section, so one without renders as it did."""
SEVERITY_CLASSES = ("info", "warn", "error")


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


def _table(table_id: str, head, rows, notes, caption: str = "") -> str:
    """One table of view rows: `rows` are (css classes, cells) pairs; the notes beneath it."""
    body = "\n".join(f'<tr class="{cls}">' + "".join(f"<td>{escape(str(c))}</td>" for c in cells)
                     + "</tr>" for cls, cells in rows)
    items = "".join(f"<li>{escape(n)}</li>" for n in notes)
    caption = f"<caption>{caption}</caption>\n" if caption else ""
    return f"""<table id="{table_id}">
{caption}<thead><tr>{"".join(f"<th>{escape(h)}</th>" for h in head)}</tr></thead>
<tbody>
{body}
</tbody>
</table>
<ul class="details">{items}</ul>
"""


def advice_html(view) -> str:
    """The chunk advisor's table and line (empty without report.advice)."""
    a = view.advice
    if a is None:
        return ""
    head = ("max_num_batched_tokens", "worst-case need", "KV cache", "KV tokens",
            "KV tokens vs configured", "prefill tokens/s", "prefill vs configured", "")
    rows = [(SEVERITY_CLASSES[r.severity] + (" knee" if "knee" in r.mark else ""),
             (f"{r.chunk:,}", r.need, r.kv_bytes, r.kv_tokens, r.kv_change, r.prefill,
              r.prefill_change, r.mark)) for r in a.rows]
    return (f'<h2>Chunk advice</h2>\n<p id="advice-line"><strong>{escape(a.headline)}</strong>'
            f"</p>\n" + _table("advice", head, rows, (a.rule, *a.notes)))


def fit_html(view) -> str:
    """The fit's recommended serve line, its line, the trade-off table, the rule, bound and
    notes (empty without report.fit); the frontier is drawn in the figure below."""
    f = view.fit
    if f is None:
        return ""
    head = ("context", "chunk", "seqs", "worst need", "KV cache", "requests", "tok/s",
            "min util", "")
    rows = [(SEVERITY_CLASSES[r.severity] + (" recommended" if "recommended" in r.mark else ""),
             (r.max_model_len, r.chunk, r.seqs, r.need, r.kv_bytes, r.requests, r.prefill,
              r.share, r.mark)) for r in f.rows]
    flags = (f'<div>recommended by the fit:</div>\n<div class="flag"><code id="fit-flags">'
             f"{escape(f.flags)}</code></div>\n" if f.flags else "")
    line = (f'<p id="fit-line"><strong>{escape(f.headline)}</strong></p>' if f.flags else
            f'<p id="fit-line" class="error"><strong>{escape(f.headline)}</strong></p>')
    title = ("the frontier" if f.flags else "the candidates closest to it, then the frontier")
    caption = ("context: --max-model-len, chunk: --max-num-batched-tokens, seqs: --max-num-seqs;\n"
               "requests: at full length at once; tok/s: prefill at the swept context; min util: "
               "the least\n--gpu-memory-utilization that still holds them")
    return (f"<h2>Fit: {title}</h2>\n{flags}{line}\n"
            + _table("fit", head, rows, (f.rule, f.bound, *f.notes), caption))


def render_html(report: Report) -> str:
    view = build_view(report)
    cfg = report.config
    colour = VERDICT_COLOURS[view.verdict]
    title = f"wcprof {view.verdict}: {cfg.model}"
    table = "\n".join(
        "<tr>" + "".join(f"<td>{escape(c)}</td>" for c in (r.label, r.stock, r.worst, r.difference))
        + "</tr>" for r in view.rows)
    details = "\n".join(
        f'<li class="{SEVERITY_CLASSES[d.severity]}">' + escape(d.text) + "</li>"
        for d in view.details)
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="wcprof {escape(report.tool_version)}">
<title>{escape(title)}</title>
<style>{CSS}{FIT_CSS if view.fit is not None else ""}</style>
</head>
<body>
<h1><span class="verdict" id="verdict" style="background:{colour}">{escape(str(view.verdict))}</span>
 {escape(cfg.model)}</h1>
<p class="sub">{escape(view.limits_text)} · {escape(view.where_text)}</p>
<div>recommended:</div>
<div class="flag"><code id="flag">{escape(view.flag)}</code> {escape(view.flag_note)}</div>
<p id="summary">{escape(view.summary)}</p>
<table id="comparison">
<thead><tr><th></th><th>stock</th><th>worst-case</th><th>difference</th></tr></thead>
<tbody>
{table}
</tbody>
</table>
{fit_html(view)}{advice_html(view)}<ul class="details">
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
