"""Bad input: a clear message and a non-zero exit, never a traceback."""

from __future__ import annotations

import pytest

from conftest import run_wcprof


def _clean(run):
    assert "Traceback" not in run.text, run.text[-3000:]
    assert "wcprof: error:" in run.err or "error:" in run.err


def test_unknown_flag(tmp_path):
    run = run_wcprof(["--no-such-flag"], tmp_path, timeout=120)
    assert run.rc == 2
    assert "--no-such-flag" in run.err and "Traceback" not in run.text


def test_bad_size(tmp_path):
    run = run_wcprof(["--margin", "lots"], tmp_path, timeout=120)
    assert run.rc == 2
    _clean(run)
    assert "512MiB" in run.err  # says which forms are accepted


@pytest.mark.engine
def test_max_model_len_beyond_the_model(tmp_path):
    run = run_wcprof(["--max-model-len", "100000"], tmp_path, timeout=300)
    assert run.rc == 2
    _clean(run)
    assert "max_model_len" in run.err.lower() or "max-model-len" in run.err.lower()


@pytest.mark.engine
def test_explicit_kv_too_large_for_the_worst_case(tmp_path):
    """A --kv-cache-memory-bytes that leaves no room for the worst step: refused, with the value
    that would fit."""
    run = run_wcprof(["--kv-cache-memory-bytes", str(6 << 30), "--gpu-memory-utilization", "0.25"],
                     tmp_path, timeout=300)
    assert run.rc == 3, run.text[-3000:]
    _clean(run)
    assert "--kv-cache-memory-bytes" in run.err


@pytest.mark.engine
def test_one_request_cannot_fit(tmp_path):
    """A KV budget smaller than one max_model_len request (8192 tokens x 1 KiB on the tiny model)."""
    run = run_wcprof(["--kv-cache-memory-bytes", "1048576", "--max-model-len", "8192"],
                     tmp_path, timeout=300)
    assert run.rc == 3, run.text[-3000:]
    _clean(run)
    assert "max_model_len=8192" in run.err
