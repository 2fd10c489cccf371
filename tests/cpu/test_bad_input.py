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
    run = run_wcprof(["--kv-cache-memory-bytes", "1MiB", "--max-model-len", "8192"],
                     tmp_path, timeout=300)
    assert run.rc == 3, run.text[-3000:]
    _clean(run)
    assert "max_model_len=8192" in run.err
    # issue 39: 1MiB is read as `wcprof check` reads it, and the error names the flag's value as
    # the cause (it said "the KV budget is 2.14 GiB ... lower --max-model-len")
    assert "--kv-cache-memory-bytes 1048576 (1.00 MiB) holds less than one request" in run.err
    assert "KV budget is" not in run.err


@pytest.mark.engine
@pytest.mark.parametrize("args,words", [(["--max-num-batched-tokens", "0"],
                                         "--max-num-batched-tokens 0: Input should be"),
                                        (["--max-model-len", "-5"], "--max-model-len -5: ")])
def test_vllms_refusal_names_the_flag(tmp_path, args, words):
    """Issue 39: vLLM's own refusals said "Input should be greater than or equal to 1" without
    the flag."""
    run = run_wcprof(args, tmp_path, timeout=300)
    assert run.rc == 2, run.text[-3000:]
    _clean(run)
    assert words in run.err


@pytest.mark.engine
def test_an_unknown_architecture_is_exit_4_in_one_short_line(tmp_path):
    """Issue 39: vLLM's ~400 supported names were printed, with exit 2; the README says 4."""
    import json
    import shutil

    from conftest import TINY

    model = tmp_path / "m"
    shutil.copytree(TINY, model)
    config = json.loads((model / "config.json").read_text())
    config["architectures"] = ["FooBarForCausalLM"]
    (model / "config.json").write_text(json.dumps(config))
    run = run_wcprof(["--model", str(model), "--load-format", "dummy", "--skip-tokenizer-init",
                      "--enforce-eager", "--max-model-len", "512"], tmp_path, timeout=300)
    assert run.rc == 4, run.text[-3000:]
    _clean(run)
    assert "['FooBarForCausalLM']" in run.err and "LlamaForCausalLM" not in run.err
    assert len(run.err) < 600


@pytest.mark.engine
def test_the_additional_config_section_is_honoured_and_degradations_are_in_the_verdict(tmp_path):
    """Issue 39: wcprof dropped --additional-config's worstcase_profiler section (vllm serve
    honoured it); an unwritable WCPROF_CACHE_DIR was only in vLLM's log; on the CPU nothing said
    that the budget follows the host's free memory. One run: the section's margin is the
    report's, and both warnings are in report.warnings and on the verdict screen."""
    from conftest import engine_env

    cache = "/sys/wcprof-cache-test"  # root ignores mode bits; /sys takes no new directory
    run = run_wcprof(["--quiet", "--additional-config",
                      '{"worstcase_profiler": {"margin_bytes": "96MiB"}}'], tmp_path,
                     timeout=600, env=engine_env(WCPROF_CACHE_DIR=cache))
    assert run.rc == 0, run.text[-3000:]
    assert run.report["admission"]["margin_bytes"] == 96 << 20
    warnings = run.report["warnings"]
    unwritable = [w for w in warnings if "sweep cache could not be written" in w]
    assert unwritable and cache in unwritable[0] and "WCPROF_CACHE_DIR" in unwritable[0]
    memory = [w for w in warnings if "free memory" in w]
    assert memory and "--kv-cache-memory-bytes " in memory[0]
    screen = " ".join(run.out.split())
    assert f"warning: {unwritable[0]}" in screen and f"warning: {memory[0]}" in screen
