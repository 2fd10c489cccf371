"""The fit's frontier in the HTML and PNG pictures: the view model's chart points (render/view.py
FitPoint, from a report whose fit section the core computed over test_fit.py's fake engine), the
HTML's serve line, table and chart, the PNG's panel; a report without a fit draws as before."""

from __future__ import annotations

import dataclasses
import io
import json
import re

import pytest

pytest.importorskip("matplotlib")

from test_fit import BPT, _fit  # noqa: E402
from worstcase_profiler.render import get_reporter, picture  # noqa: E402
from worstcase_profiler.render.html import render_html  # noqa: E402
from worstcase_profiler.render.view import build_view  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FRONTIER_BLUE = (0x00, 0x72, 0xB2)
INFEASIBLE_RED = (0xB2, 0x18, 0x2B)


def _report(make_report, n=3, **kw):
    f, _, _ = _fit(n=n, explicit_kv=8192 * BPT, **kw)
    return make_report(fit=json.loads(json.dumps(dataclasses.asdict(f)))), f


def test_the_view_gives_one_labelled_point_per_frontier_candidate_the_recommended_marked(
        make_report):
    report, f = _report(make_report)
    view = build_view(report).fit
    labelled = [p for p in view.points if p.label]
    assert sorted((p.max_model_len, p.requests) for p in labelled) == \
        sorted((c.max_model_len, c.concurrency) for c in f.frontier)
    assert [p.kind for p in labelled].count("recommended") == 1
    rec = next(p for p in view.points if p.kind == "recommended")
    assert (rec.max_model_len, rec.requests) == (2720, 3) == \
        (f.recommended.max_model_len, f.recommended.concurrency)
    assert rec.label.startswith("recommended\n2,720 tokens × 3 requests\nchunk 1,024, seqs 8")
    # the swept max_model_len holds one request only: weighed, infeasible, drawn apart
    assert any(p.kind == "infeasible" and (p.max_model_len, p.requests) == (4096, 1)
               for p in view.points)
    assert all(not p.label for p in view.points if p.kind in ("feasible", "infeasible"))
    # the rest: one point per position and kind, drawn beneath the frontier's
    rest = [(p.max_model_len, p.requests, p.kind) for p in view.points if not p.label]
    assert len(rest) == len(set(rest)) and view.points[:len(rest)] == \
        tuple(p for p in view.points if not p.label)
    # the staircase: the most requests at that context or longer, shortest first
    assert view.staircase == ((512, 8), (1024, 7), (2720, 3))
    assert view.min_concurrency == 3 and "3 on the frontier of 28" in view.chart_title


def test_without_a_recommendation_no_point_is_starred_and_the_closest_are_infeasible(
        make_report):
    report, f = _report(make_report, n=2, objective="concurrency")
    assert f.recommended is None
    view = build_view(report).fit
    assert not any(p.kind == "recommended" for p in view.points)
    assert sum(p.kind == "frontier" for p in view.points) == len(f.frontier) == 4
    assert any(p.kind == "infeasible" and p.max_model_len == 4096 for p in view.points)
    assert view.flags is None


def test_the_html_carries_the_serve_line_the_table_and_the_chart(make_report):
    report, f = _report(make_report)
    page = render_html(report)
    visible = re.sub(r"<svg.*</svg>", "", page, flags=re.S)
    serve = "vllm serve tiny-llama " + " ".join(f.flags)
    assert f'<code id="fit-flags">{serve}</code>' in visible
    table = visible[visible.index('<table id="fit">'):]
    table = table[:table.index("</table>")]
    rows = re.findall(r'<tr class="([^"]*)">(.*?)</tr>', table)
    assert len(rows) == len(f.frontier)
    marked = [cells for cls, cells in rows if "recommended" in cls.split()]
    assert len(marked) == 1 and marked[0].startswith("<td>2,720</td><td>1,024</td><td>8</td>")
    assert "tr.recommended td" in page  # styled as the advisor's knee
    # the frontier is in the figure: its title, every frontier point, the star's label
    svg = page[page.index("<svg"):page.index("</svg>")]
    assert "on the frontier of 28 candidate(s) weighed" in svg
    assert "2,720 tokens × 3 requests" in svg
    assert "1,024 tokens × 7 requests" in svg and "512 tokens × 8 requests" in svg
    assert visible.index('id="fit-flags"') < visible.index('<table id="fit">') < \
        visible.index('<ul class="details">')


def test_the_html_without_a_recommendation_says_why_in_red(make_report):
    report, _ = _report(make_report, n=2, objective="concurrency")
    page = render_html(report)
    assert 'id="fit-flags"' not in page
    assert '<p id="fit-line" class="error"><strong>fit: no candidate holds 2' in page
    assert "Fit: the candidates closest to it, then the frontier" in page


def test_a_report_without_a_fit_renders_as_before(make_report):
    report = make_report()
    page = render_html(report)
    assert 'id="fit' not in page and "tr.recommended" not in page and "Fit:" not in page
    fig = picture.build_figure(report)
    assert tuple(fig.get_size_inches()) == (14, 13.5) and len(fig.axes) == 4
    with_fit, _ = _report(make_report)
    fig = picture.build_figure(with_fit)
    assert tuple(fig.get_size_inches()) == (14, 19) and len(fig.axes) == 5


def _pixels(data: bytes):
    from matplotlib.image import imread

    return (imread(io.BytesIO(data), format="png")[..., :3] * 255).round().astype(int)


def _count(img, colour) -> int:
    import numpy as np

    return int((np.abs(img - np.array(colour)).max(axis=-1) <= 6).sum())


def test_the_png_draws_the_frontier_below_the_profile(make_report, tmp_path):
    report, _ = _report(make_report)
    dest = tmp_path / "fit.png"
    get_reporter("png").write(report, dest)
    data = dest.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 50_000
    plain = io.BytesIO()
    get_reporter("png").write(make_report(), plain)
    height = int.from_bytes(data[20:24], "big")
    plain_height = int.from_bytes(plain.getvalue()[20:24], "big")
    assert int.from_bytes(data[16:20], "big") >= 1200 and height >= plain_height + 400
    img, before = _pixels(data), _pixels(plain.getvalue())
    panel = img[plain_height - 100:]  # the band the frontier's panel adds at the bottom
    assert _count(panel, FRONTIER_BLUE) > 200  # the frontier's points and staircase
    assert _count(panel, INFEASIBLE_RED) > 50  # the infeasible cross, the requests asked
    assert _count(before[-300:], FRONTIER_BLUE) < 20  # nothing of it without a fit


def test_the_png_without_a_recommendation_still_draws_the_frontier(make_report):
    report, _ = _report(make_report, n=9)
    assert report.fit.recommended is None and not report.fit.frontier
    fig = picture.build_figure(report)
    title = fig.axes[0].get_title(loc="left")  # the fit's panel is added first
    assert title.startswith("fit: no candidate holds 9 request(s)")
    buf = io.BytesIO()
    get_reporter("png").write(report, buf)
    assert buf.getvalue().startswith(PNG_MAGIC)
