"""Renderers: the terminal screen carries the key facts; JSON round-trips and is written
atomically."""

from __future__ import annotations

import io
import json
import os

import pytest

from worstcase_profiler.errors import ConfigError
from worstcase_profiler.render import REPORTERS, Reporter, get_reporter, load_report
from worstcase_profiler.render.json_report import JsonReporter
from worstcase_profiler.render.terminal import TerminalReporter
from worstcase_profiler.sizes import fmt_bytes

GiB = 1024**3
MiB = 1024**2


def terminal_text(report) -> str:
    buf = io.StringIO()
    get_reporter("terminal").write(report, buf)
    return buf.getvalue()


def test_registry_and_protocol():
    assert {"terminal", "json"} <= set(REPORTERS)
    for fmt in ("terminal", "json"):
        assert isinstance(get_reporter(fmt), Reporter)
    assert isinstance(get_reporter("json"), JsonReporter)
    assert isinstance(get_reporter("terminal"), TerminalReporter)
    with pytest.raises(ConfigError) as err:
        get_reporter("pdf")
    assert "json" in err.value.hint and "terminal" in err.value.hint


def test_terminal_safe_report_has_the_key_facts(make_report):
    report = make_report()
    text = terminal_text(report)
    assert report.verdict == "SAFE"
    assert text.splitlines()[0].strip().startswith("SAFE")
    assert "\x1b[" not in text  # plain text when not a terminal
    for needle in ["stock vs worst-case", "peak activation", "KV cache bytes", "KV tokens",
                   fmt_bytes(3 * GiB), fmt_bytes(4 * GiB), "3,932,160", "3,891,200",
                   "prefill rows=2,049 ctx=2,047 reqs=1", "model.layers.0.self_attn",
                   "workspace: 64.00 MiB", "ubatch 0 lane 0", "stock holds up to max_model_len",
                   "rows coverage: 1..8,192", "9 shapes executed", "6 rows executed",
                   "certified by chord"]:
        assert needle in text, needle
    budget = report.admission.recommended_kv_cache_memory_bytes
    assert f"--kv-cache-memory-bytes {budget}" in text
    assert fmt_bytes(budget) in text
    assert "KV audit" not in text and "validation" not in text
    assert len(text.splitlines()) <= 30  # one screen


def test_terminal_counts_rows_certified_by_chord(make_report):
    # segments [1,2048] chord, [2048,2050] executed, [2050,4096] chord, [4096,8192] chord;
    # executed rows 1, 2048, 2049, 2050, 4096, 8192 -> 8192 - 6 certified
    assert "8,186 certified by chord" in terminal_text(make_report())


def test_terminal_never_prints_raw_byte_counts_except_the_flag(make_report):
    report = make_report()
    text = terminal_text(report)
    flag_value = str(report.admission.recommended_kv_cache_memory_bytes)
    for raw in [report.stock.peak_activation_bytes, report.worstcase.peak_activation_bytes,
                report.admission.stock_kv_cache_bytes, report.admission.requested_bytes]:
        assert str(raw) not in text.replace(flag_value, "")


def test_terminal_stock_unsafe_with_audit_and_validation(make_report):
    report = make_report(
        admission__stock_oom_context_len=12345,
        kv_audit={"budget_bytes": 100 * GiB, "allowed_bytes": 100 * GiB,
                  "allocated_bytes": 99 * GiB, "ratio": 0.99, "groups": [], "verdict": "ok",
                  "message": "fine"},
        validation={"measured_peak_bytes": 3 * GiB, "predicted_peak_bytes": 4 * GiB,
                    "ratio": 0.75, "requests": ["a", "b"], "seconds": 3.0},
        warnings=["attention backend fell back to TRITON"])
    text = terminal_text(report)
    assert text.splitlines()[0].strip().startswith("STOCK UNSAFE")
    assert "runs out at context length 12,345" in text
    assert f"KV audit: allocated {fmt_bytes(99 * GiB)} vs budget {fmt_bytes(100 * GiB)}" in text
    assert "ratio 0.990" in text
    assert f"validation: measured {fmt_bytes(3 * GiB)} vs predicted {fmt_bytes(4 * GiB)}" in text
    assert "ratio 0.750" in text
    assert "warning: attention backend fell back to TRITON" in text


@pytest.mark.parametrize("overrides,verdict", [
    ({"admission__fits": False}, "DOES NOT FIT"),
    ({"kv_audit": {"budget_bytes": GiB, "allowed_bytes": GiB, "allocated_bytes": 2 * GiB,
                   "ratio": 2.0, "groups": [], "verdict": "over-budget", "message": "x"}},
     "KV OVER-COMMIT"),
])
def test_terminal_verdicts(make_report, overrides, verdict):
    assert terminal_text(make_report(**overrides)).splitlines()[0].strip().startswith(verdict)


def test_terminal_to_a_path_and_with_ranks(make_report, tmp_path):
    rank1 = make_report(rank=1, worstcase__peak_activation_bytes=5 * GiB)
    report = make_report(ranks=[make_report(), rank1])
    dest = tmp_path / "report.txt"
    TerminalReporter().write(report, dest)
    text = dest.read_text()
    assert f"rank 1: worst peak {fmt_bytes(5 * GiB)}" in text


def test_terminal_without_workspace(make_report):
    text = terminal_text(make_report(worstcase__workspace_bytes=0, worstcase__workspace_slots=[]))
    assert "workspace" not in text


def test_json_round_trips(make_report, tmp_path):
    report = make_report(admission__stock_oom_context_len=777)
    dest = tmp_path / "sub" / "report.json"
    get_reporter("json").write(report, dest)
    assert load_report(dest) == report
    assert json.loads(dest.read_text())["schema_version"] == report.schema_version
    assert oct(dest.stat().st_mode & 0o777) == oct(0o644)
    assert os.listdir(dest.parent) == ["report.json"]


def test_json_to_a_stream(make_report):
    buf = io.StringIO()
    JsonReporter().write(make_report(), buf)
    assert json.loads(buf.getvalue())["config"]["model"] == "tiny-llama"


def test_failed_json_write_leaves_no_partial_file(make_report, tmp_path, monkeypatch):
    dest = tmp_path / "report.json"

    def broken_fsync(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError):
        JsonReporter().write(make_report(), dest)
    assert list(tmp_path.iterdir()) == []


def test_failed_json_write_keeps_the_previous_report(make_report, tmp_path, monkeypatch):
    dest = tmp_path / "report.json"
    JsonReporter().write(make_report(), dest)
    before = dest.read_text()
    monkeypatch.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(OSError("boom")))
    with pytest.raises(OSError):
        JsonReporter().write(make_report(admission__fits=False), dest)
    assert dest.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]


def test_load_report_rejects_what_is_not_a_report(tmp_path):
    cases = {"missing.json": None, "garbage.json": "{not json", "list.json": "[1, 2]",
             "other.json": json.dumps({"hello": "world"}),
             "broken.json": json.dumps({"schema_version": "1.0", "rank": 0})}
    for name, content in cases.items():
        path = tmp_path / name
        if content is not None:
            path.write_text(content)
        with pytest.raises(ConfigError) as err:
            load_report(path)
        assert str(path) in err.value.message and err.value.hint, name


def test_load_report_rejects_another_major_schema(make_report, tmp_path):
    data = json.loads(make_report().model_dump_json())
    data["schema_version"] = "2.0"
    path = tmp_path / "future.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError) as err:
        load_report(path)
    assert "2.0" in err.value.message
    data["schema_version"] = "1.7"  # same major: accepted
    path.write_text(json.dumps(data))
    assert load_report(path).schema_version == "1.7"


def test_budget_line_adds_up(make_report):
    text = terminal_text(make_report())
    assert (f"budget: requested {fmt_bytes(126 * GiB)} - consumed {fmt_bytes(3 * GiB)} - worst "
            f"peak {fmt_bytes(4 * GiB)} - cudagraphs {fmt_bytes(0)} - margin "
            f"{fmt_bytes(GiB // 4)} = {fmt_bytes(118 * GiB + 3 * GiB // 4)}") in text


def test_startup_line_separates_the_profilers_cost_from_vllms_own(make_report):
    report = make_report(startup_seconds={"vllm_profile": 1.5, "vllm_kv_init": 0.25, "replay": 0.8,
                                          "replay.worst_step": 0.5, "measure_held": 0.3,
                                          "measure_held.gc": 0.2,
                                          "cache_lookup": 0.01})
    text = terminal_text(report)
    assert "start-up: profiler 1.11s (replay 0.80s, measure_held 0.30s, cache_lookup 0.01s)" in text
    assert "on top of vLLM's own profile, KV init and warm-up 1.75s" in text


def test_tp_ranks_line_carries_each_ranks_validation(make_report):
    val = {"measured_peak_bytes": 3 * GiB, "predicted_peak_bytes": 4 * GiB, "ratio": 0.75,
           "requests": ["a"], "seconds": 1.0}
    report = make_report(ranks=[make_report(validation=val), make_report(rank=1)])
    text = terminal_text(report)
    assert "TP ranks: rank 0: worst peak" in text and "validation 0.750; rank 1" in text
    assert "(identical sweep on every rank)" in text


def test_no_fit_recommends_none_and_names_the_margin(make_report):
    """Issue 39: --margin 100GiB printed "budget -97.79 GiB" and "recommended:
    --kv-cache-memory-bytes 0" without naming the margin. No value is recommended then, and the
    margin is named as the cause."""
    budget = 126 * GiB - 3 * GiB - 4 * GiB - 100 * GiB
    text = terminal_text(make_report(admission__margin_bytes=100 * GiB,
                                     admission__budget_bytes=budget,
                                     admission__kv_cache_bytes=0,
                                     admission__recommended_kv_cache_memory_bytes=0,
                                     admission__one_request_bytes=128 << 20,
                                     admission__fits=False))
    assert "--kv-cache-memory-bytes 0" not in text
    line = next(ln for ln in text.splitlines() if ln.startswith("recommended:"))
    assert line.startswith("recommended: none") and "no value is safe" in line
    assert "the margin (100.00 GiB, --margin) is the cause" in text


def test_an_explicit_size_below_one_request_is_named_on_the_flag_line(make_report):
    text = terminal_text(make_report(admission__explicit_kv_cache_memory_bytes=1 << 20,
                                     admission__one_request_bytes=4 << 20,
                                     admission__fits=False))
    assert "explicit setting 1.00 MiB, less than the 4.00 MiB one request at max_model_len " \
           "needs" in text


def test_a_fitted_report_draws_the_plan_it_admits_and_says_so(make_report):
    """A worst step fitted to the admitted pool (worstcase.pool_fit): the shapes it dropped are
    no step of that pool, so the rows curve and the markers leave them out (a dropped 8,192-row
    split at full extent read above the fitted reserve), the fit's own steps are drawn, and the
    terminal names the fit."""
    from worstcase_profiler.render.view import full_extent_prefill, plan_steps

    GiB = 1 << 30

    def _step(kind, rows, ctx, peak, reqs):
        return {"shape": {"kind": kind, "rows": rows, "context_len": ctx, "num_reqs": reqs},
                "peak_bytes": peak, "seconds": 0.05, "top_op": None}

    dropped = _step("prefill", 8192, 4096 - 16, 9 * GiB, 512)
    fitted = _step("prefill", 8192, 4096 - 20, 4 * GiB, 410)
    report = make_report(**{
        "worstcase__steps": [*make_report().worstcase.model_dump()["steps"], dropped],
        "worstcase__pool_fit": {
            "planned_pool_tokens": 9000, "pool_tokens": 8000,
            "swept_worst": dropped["shape"], "swept_peak_bytes": 9 * GiB,
            "dropped": [dropped["shape"]], "steps": [fitted], "rounds": 1}})
    counts = {s.shape.num_reqs for s in plan_steps(report)}
    assert 512 not in counts and 410 in counts
    assert [s.shape.num_reqs for s in full_extent_prefill(report) if s.shape.rows == 8192] == [410]
    assert "worst step fitted to the KV pool" in terminal_text(report)
