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
    assert rec.label.startswith("recommended: 2,720 tokens × 3 requests\nchunk 1,024, seqs 8")
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
