"""`wcprof fit`'s screen, its JSON section and its exit codes, from a report whose fit section the
core computed over the fake engine (test_fit.py): no engine, milliseconds."""

from __future__ import annotations

import dataclasses
import io
import json

import pytest

from test_fit import BPT, _fit
from worstcase_profiler.cli import main
from worstcase_profiler.commands import fit as fit_command
from worstcase_profiler.core import fit as fit_core
from worstcase_profiler.errors import DoesNotFit
from worstcase_profiler.render import get_reporter
from worstcase_profiler.render.json_report import load_report
from worstcase_profiler.render.terminal import render_fit
from worstcase_profiler.render.view import build_view


def _report(make_report, n=3, **kw):
    f, _, _ = _fit(n=n, explicit_kv=8192 * BPT, **kw)
    return make_report(fit=json.loads(json.dumps(dataclasses.asdict(f)))), f


def _screen(report) -> str:
    from rich.console import Console

    buf = io.StringIO()
    render_fit(report, Console(file=buf, width=120))
    return buf.getvalue()


def test_the_screen_puts_the_recommended_flags_first_then_the_frontier(make_report):
    report, f = _report(make_report)
    text = _screen(report)
    first = text.index("recommended: vllm serve tiny-llama --max-model-len 2720")
    assert first < text.index("fit: the frontier") < text.index("rule:")
    assert "recommended" in text.split("fit: the frontier")[1]
    assert "--kv-cache-memory-bytes 33554432" in text and "bound:" in text
    view = build_view(report).fit
    assert view.rows and len(view.rows) == len(f.frontier)
    assert "…" not in text.split("fit: the frontier")[1].split("rule:")[0]  # nothing truncated


@pytest.mark.parametrize("kind, share, expected", [
    ("cpu", 0.92, "--max-num-seqs 8 --kv-cache-memory-bytes 33554432"),
    ("cuda", 0.92, "--max-num-seqs 8 --kv-cache-memory-bytes 33554432"),
    ("cuda", 0.5, "--max-num-seqs 8 --gpu-memory-utilization 0.5 --kv-cache-memory-bytes 33554432"),
])
def test_the_printed_serve_line_carries_only_flags_that_take_effect(make_report, kind, share,
                                                                    expected):
    """With --kv-cache-memory-bytes vLLM sizes the KV cache from it alone: the utilization is
    printed beside it only on CUDA below vLLM's default, where it still gates the start."""
    f, facts, _ = _fit(n=3, explicit_kv=8192 * BPT)
    f = fit_core.fit(dataclasses.replace(facts, gpu_memory_utilization=share),
                     min_concurrency=3)
    report = make_report(fit=json.loads(json.dumps(dataclasses.asdict(f))))
    line = next(ln for ln in _screen(report).splitlines() if "recommended: vllm serve" in ln)
    assert line.rstrip().endswith(expected)
    assert ("--gpu-memory-utilization" in line) == (kind == "cuda" and share < 0.92)


def test_the_report_carries_the_fit_section_through_json(make_report, tmp_path):
    report, f = _report(make_report)
    path = tmp_path / "r.json"
    get_reporter("json").write(report, path)
    back = load_report(path)
    assert back.fit == report.fit and back.fit.recommended.max_model_len == 2720
    assert json.loads(path.read_text())["fit"]["flags"][:2] == ["--max-model-len", "2720"]
    buf = io.StringIO()
    get_reporter("terminal").write(back, buf)  # `wcprof render` shows it too
    assert "fit: the frontier" in buf.getvalue() and "fit (context)" in buf.getvalue()


def test_no_recommendation_is_exit_3_naming_the_most_any_holds(make_report, capsys):
    # two requests of 4,096 tokens do not fit in 8,192 beside the block vLLM holds back: at the
    # swept context, none holds them
    report, f = _report(make_report, n=2, objective="concurrency")
    assert f.recommended is None
    with pytest.raises(DoesNotFit) as e:
        fit_command._emit(report, type("Ours", (), {"json": None, "html": None, "png": None})(), 2)
    assert e.value.exit_code == 3 and "the most any holds is" in e.value.message
    assert "at the swept max_model_len 4,096" in e.value.message
    assert "--objective context" in e.value.hint
    out = capsys.readouterr().out
    assert "fit: the candidates closest to it" in out and "holds fewer than 2" in out
    assert "the most any holds is 1 (max_model_len 4,096" in e.value.message


@pytest.mark.parametrize("argv, needle", [
    (["fit", "--min-concurrency", "0"], "--min-concurrency"),
    (["fit", "--min-concurrency", "two"], "not a whole number"),
    (["fit", "--objective", "speed"], "invalid choice"),
    (["fit", "--validate"], "validates nothing"),
])
def test_bad_fit_flags_are_exit_2_before_anything_loads(argv, needle, capsys):
    assert main(argv) == 2
    assert needle in capsys.readouterr().err


def test_fit_help_is_its_own():
    assert main(["fit", "--help"]) == 0


def test_a_swept_configuration_refused_after_the_profile_still_yields_its_fit(make_report,
                                                                                tmp_path,
                                                                                monkeypatch, capsys):
    """vLLM refusing the swept max_model_len (one request does not fit its KV cache) happens
    after the profile wrote the report with the fit: the fit is what the operator asked for."""
    from worstcase_profiler.commands import profile
    from worstcase_profiler.errors import ConfigError

    report, _ = _report(make_report)

    def refused(argv, sizes, section, tmp, status, tune=None):
        get_reporter("json").write(report, tmp / "report.json")
        raise ConfigError("vLLM refused the configuration: To serve at least one request ...")

    monkeypatch.setattr(profile, "start", refused)
    ours = type("Ours", (), {"quiet": False})()
    got = fit_command._fit([], ours, {}, {}, tmp_path, None)
    assert got.fit == report.fit
    assert "the swept configuration itself did not start" in capsys.readouterr().err

    def early(argv, sizes, section, tmp, status, tune=None):  # no report yet: the error stands
        raise ConfigError("bad flag")

    monkeypatch.setattr(profile, "start", early)
    with pytest.raises(ConfigError, match="bad flag"):
        fit_command._fit([], ours, {}, {}, tmp_path / "none", None)
