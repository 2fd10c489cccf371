"""The advisor's section of the report: projection from the core's Advice, the terminal table,
HTML, the picture panel, `wcprof advise REPORT.json` and the CLI's --advise flags (no engine)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from pydantic import TypeAdapter

from unit_helpers import GiB, MiB, build_session
from worstcase_profiler.cli import main
from worstcase_profiler.commands.profile import advise_settings
from worstcase_profiler.commands.profile_options import parse_ours
from worstcase_profiler.core.types import (Advice, ChunkAdvice, ExcludedChunk, ProfileResult, Shape,
                                           StepResult)
from worstcase_profiler.render import get_reporter
from worstcase_profiler.render.view import build_view
from worstcase_profiler.report import build_report


def core_advice(knee=4096) -> Advice:
    def row(chunk, kv_tokens, tps, fits=True, need=None):
        need = need or (1 * GiB + chunk * 256 * 1024)
        return ChunkAdvice(chunk=chunk, transient_bytes=need - 64 * MiB, workspace_bytes=64 * MiB,
                           worst_shape=Shape("prefill", chunk, 4096 - chunk),
                           budget_bytes=kv_tokens * 32768, kv_tokens=kv_tokens, fits=fits,
                           prefill_seconds=chunk / tps, reused_steps=7, measured_steps=3)

    rows = (row(256, 3_990_000, 20_000.0), row(2048, 3_960_000, 70_000.0),
            row(4096, 3_930_000, 78_000.0), row(8192, 3_891_200, 80_000.0))
    return Advice(configured_chunk=8192, candidates=rows, knee_chunk=knee, within=0.05,
                  rule="knee: ... within 5% of the best candidate's",
                  excluded=(ExcludedChunk(16384,
                                          "above the configured max_num_batched_tokens=8192"),),
                  steps=(StepResult(Shape("mixed", 256, 3900, 8), 5 * MiB, 0.01),), seconds=3.5)


def advice_dict(**kw) -> dict:
    return json.loads(TypeAdapter(Advice).dump_json(core_advice(**kw)))


def test_build_report_projects_the_profiles_advice_when_present(tmp_path):
    session = build_session()
    assert build_report(session, created_at="t").advice is None

    prof = session.phases.profile
    if "advice" in {f.name for f in dataclasses.fields(ProfileResult)}:
        session.phases.profile = dataclasses.replace(prof, advice=core_advice())
    else:  # before the start-up hook gives ProfileResult its `advice` field
        @dataclasses.dataclass(frozen=True)
        class WithAdvice(ProfileResult):
            advice: Advice | None = None

        session.phases.profile = WithAdvice(**{f.name: getattr(prof, f.name)
                                               for f in dataclasses.fields(prof)},
                                            advice=core_advice())
    report = build_report(session, created_at="t")
    a = report.advice
    assert a.configured_chunk == 8192 and a.knee_chunk == 4096
    assert [c.chunk for c in a.candidates] == [256, 2048, 4096, 8192]
    c = a.candidate(4096)
    assert c.need_bytes == c.transient_bytes + c.workspace_bytes
    assert c.prefill_tokens_per_s == pytest.approx(78_000.0)
    assert a.excluded[0].chunk == 16384 and a.steps[0].shape.kind == "mixed"
    path = tmp_path / "r.json"
    get_reporter("json").write(report, path)
    assert json.loads(path.read_text())["advice"]["knee_chunk"] == 4096


def test_view_and_terminal_show_the_table_and_the_knee(make_report):
    report = make_report(advice=advice_dict())
    view = build_view(report)
    rows = {r.chunk: r for r in view.advice.rows}
    assert rows[8192].mark == "configured" and rows[4096].mark == "knee"
    assert rows[4096].kv_change == "+38,800" and rows[4096].prefill_change == "-2.5%"
    assert view.advice.headline.startswith("advice: --max-num-batched-tokens 4096 admits +38,800 "
                                           "KV tokens")
    assert "98% of the best prefill throughput" in view.advice.headline
    assert any(d.kind == "advice" for d in view.details)
    import io

    buf = io.StringIO()
    get_reporter("terminal").write(report, buf)
    text = buf.getvalue()
    assert "chunk advice" in text and "78,000" in text and "knee" in text
    assert "configured, knee" not in text and "configured" in text
    assert "…" not in text.split("chunk advice")[1].split("worst step")[0]  # fits 100 columns


def test_headline_when_the_configured_chunk_is_the_knee_or_nothing_fits(make_report):
    view = build_view(make_report(advice=advice_dict(knee=8192)))
    assert view.advice.headline.startswith("advice: keep max_num_batched_tokens=8,192")
    data = advice_dict(knee=None)
    for c in data["candidates"]:
        c["fits"] = False
    assert "no candidate chunk leaves room" in build_view(make_report(advice=data)).advice.headline


def test_html_and_png_carry_the_advice(make_report, tmp_path):
    pytest.importorskip("matplotlib")
    report = make_report(advice=advice_dict())
    html = tmp_path / "r.html"
    get_reporter("html").write(report, html)
    page = html.read_text()
    assert 'id="advice"' in page and "advice: --max-num-batched-tokens 4096" in page
    png = tmp_path / "r.png"
    get_reporter("png").write(report, png)
    from PIL import Image  # matplotlib's own dependency

    with Image.open(png) as im:
        tall = im.size[1]
    get_reporter("png").write(make_report(), png)
    with Image.open(png) as im:
        assert tall > im.size[1]  # the advice panel is a row of its own


def test_wcprof_advise_prints_the_table_and_can_move_the_knee(make_report, tmp_path, capsys):
    path = tmp_path / "r.json"
    get_reporter("json").write(make_report(advice=advice_dict()), path)
    assert main(["advise", str(path)]) == 0
    out = capsys.readouterr().out
    assert "chunk advice" in out and "--max-num-batched-tokens 4096 admits" in out
    assert main(["advise", str(path), "--within", "15%"]) == 0
    assert "--max-num-batched-tokens 2048 admits" in capsys.readouterr().out
    bare = tmp_path / "bare.json"
    get_reporter("json").write(make_report(), bare)
    assert main(["advise", str(bare)]) == 2
    assert "has no advice section" in capsys.readouterr().err


def test_profile_flags_are_checked_before_the_engine_starts(capsys):
    assert advise_settings(parse_ours([])) == {}
    got = advise_settings(parse_ours(["--advise-chunk", "384", "--advise-chunk=768"]), 1024)
    assert got == {"advise": True, "advise_chunks": [384, 768]}
    assert advise_settings(parse_ours(["--advise", "--advise-within", "10%"]))["advise_within"] \
        == pytest.approx(0.1)
    for argv, needle in ((["--advise-chunk", "-5"], "--advise-chunk"),
                         (["--advise-chunk", "abc"], "not a positive whole number"),
                         (["--advise-within", "200%"], "--advise-within"),
                         (["--advise-chunk", "1024"], "above --max-num-batched-tokens 512")):
        assert main(argv) == 2, argv
        assert needle in capsys.readouterr().err, argv


def test_wcprof_advise_against_engines_started_with_an_advised_chunk(make_report, tmp_path,
                                                                     capsys):
    path = tmp_path / "r.json"
    get_reporter("json").write(make_report(advice=advice_dict()), path)
    said = core_advice().candidate(2048).budget_bytes
    close, far = tmp_path / "close.json", tmp_path / "far.json"
    get_reporter("json").write(make_report(config__max_num_batched_tokens=2048,
                                           admission__budget_bytes=int(said * 1.004)), close)
    get_reporter("json").write(make_report(config__max_num_batched_tokens=2048,
                                           admission__budget_bytes=int(said * 0.97)), far)
    assert main(["advise", str(path), "--against", str(close)]) == 0
    assert "chunk 2,048: advised KV budget" in capsys.readouterr().out
    assert main(["advise", str(path), "--against", str(close), str(far)]) == 1
    assert "OFF by more than 1%" in capsys.readouterr().out
    assert main(["advise", str(path), "--against", str(far), "--tolerance", "5%"]) == 0
    other = tmp_path / "other.json"
    get_reporter("json").write(make_report(config__max_num_batched_tokens=1000), other)
    assert main(["advise", str(path), "--against", str(other)]) == 2


def test_wcprof_advise_against_under_one_explicit_kv_size_compares_what_was_admitted(
        make_report, tmp_path, capsys):
    """Both started with the same --kv-cache-memory-bytes: the engine admits that size, so the
    check is the tokens and the fit, exactly; the room (which on the CPU follows resident
    memory, so another process on the host moves it) is shown, not held to --tolerance."""
    explicit = 64 << 30
    rows = advice_dict()
    said = next(c for c in rows["candidates"] if c["chunk"] == 2048)
    path = tmp_path / "r.json"
    get_reporter("json").write(make_report(advice=rows,
                                           admission__explicit_kv_cache_memory_bytes=explicit),
                               path)
    same = dict(config__max_num_batched_tokens=2048,
                admission__explicit_kv_cache_memory_bytes=explicit,
                admission__budget_bytes=int(said["budget_bytes"] * 0.9),  # room moved 10%
                admission__fits=said["fits"])
    agrees, differs = tmp_path / "agrees.json", tmp_path / "differs.json"
    get_reporter("json").write(make_report(**same,
                                           admission__kv_tokens_worstcase=said["kv_tokens"]),
                               agrees)
    get_reporter("json").write(make_report(**same,
                                           admission__kv_tokens_worstcase=said["kv_tokens"] - 16),
                               differs)
    assert main(["advise", str(path), "--against", str(agrees)]) == 0
    out = capsys.readouterr().out
    assert f"under the same --kv-cache-memory-bytes {explicit}" in out and ": ok (" in out
    assert main(["advise", str(path), "--against", str(differs)]) == 1
    assert ": OFF (" in capsys.readouterr().out
    # another explicit size (or none) on one side: the budgets are compared, as before
    other = tmp_path / "other.json"
    get_reporter("json").write(make_report(**{**same,
                                              "admission__explicit_kv_cache_memory_bytes": None}),
                               other)
    assert main(["advise", str(path), "--against", str(other)]) == 1
    assert "OFF by more than 1%" in capsys.readouterr().out
