"""preflight.py: every check a user can fail before a model loads, each a ConfigError that says
what is wrong and what to do. Pure: no vLLM, no torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from worstcase_profiler import preflight
from worstcase_profiler.errors import ConfigError

TINY = Path(preflight.__file__).parent / "data" / "tiny-llama"
GiB = 1 << 30


def _fails(fn, *args, **kwargs) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        fn(*args, **kwargs)
    assert info.value.exit_code == 2
    return info.value


def _model_dir(tmp_path: Path, config: str | None, name: str = "m") -> Path:
    d = tmp_path / name
    d.mkdir()
    if config is not None:
        (d / "config.json").write_text(config)
    return d




def test_import_is_pure():
    code = ("import sys, worstcase_profiler.preflight; "
            "bad = [m for m in ('vllm', 'torch') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


# -- the model ---------------------------------------------------------------------------------

def test_bundled_model_and_none_pass():
    preflight.check_model(None)
    preflight.check_model(str(TINY))


def test_missing_path():
    e = _fails(preflight.check_model, "/nonexistent/model")
    assert "/nonexistent/model" in e.message and "no such file" in e.message
    assert "config.json" in e.hint


@pytest.mark.parametrize("path", ["./not-here", "../not/here", "~/not-here", "a/b/c"])
def test_other_missing_paths_are_not_taken_for_repo_ids(path, monkeypatch):
    monkeypatch.setattr(preflight, "_check_hub", lambda *a: pytest.fail("looked up the hub"))
    assert "no such file" in _fails(preflight.check_model, path).message


def test_directory_without_config_json(tmp_path):
    e = _fails(preflight.check_model, str(_model_dir(tmp_path, None)))
    assert "no config.json" in e.message and "snapshots" in e.hint


def test_mistral_params_json_is_enough(tmp_path):
    d = _model_dir(tmp_path, None)
    (d / "params.json").write_text("{}")
    preflight.check_model(str(d))


def test_config_json_not_json(tmp_path):
    e = _fails(preflight.check_model, str(_model_dir(tmp_path, '{"model_type": "llama",')))
    assert "not valid JSON" in e.message and "line" in e.message
    assert "re-download" in e.hint


def test_config_json_not_utf8(tmp_path):
    d = _model_dir(tmp_path, None)
    (d / "config.json").write_bytes(b"\xff\xfe\x00garbage")
    assert "not valid JSON" in _fails(preflight.check_model, str(d)).message


def test_config_json_not_an_object(tmp_path):
    assert "not a model config" in _fails(
        preflight.check_model, str(_model_dir(tmp_path, "[1, 2]"))).message


def test_config_json_without_model_type(tmp_path):
    e = _fails(preflight.check_model, str(_model_dir(tmp_path, json.dumps({"hidden_size": 8}))))
    assert "model_type" in e.message and "architectures" in e.message


def test_config_json_with_architectures_only(tmp_path):
    preflight.check_model(str(_model_dir(tmp_path, json.dumps({"architectures": ["X"]}))))


def test_model_is_a_plain_file(tmp_path):
    f = tmp_path / "weights.bin"
    f.write_text("x")
    assert "is a file" in _fails(preflight.check_model, str(f)).message


def test_gguf_file_passes(tmp_path):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    preflight.check_model(str(f))


def test_empty_model_and_uris():
    _fails(preflight.check_model, "  ")
    preflight.check_model("s3://bucket/model")


@pytest.mark.parametrize("text,ok", [("Qwen/Qwen3-0.6B", True), ("gpt2", True),
                                     ("/abs/path", False), ("a/b/c", False), ("a--b/c", False),
                                     ("a/../b", False), ("x" * 97, False)])
def test_repo_id_shape(text, ok):
    assert preflight.looks_like_repo_id(text) is ok


def test_repo_id_offline_and_not_cached(monkeypatch):
    monkeypatch.setattr(preflight, "_in_hf_cache", lambda repo, env: False)
    e = _fails(preflight.check_model, "org/model", {"HF_HUB_OFFLINE": "1"})
    assert "HF_HUB_OFFLINE" in e.message and "hf download org/model" in e.hint


def test_repo_id_offline_but_cached(monkeypatch):
    monkeypatch.setattr(preflight, "_in_hf_cache", lambda repo, env: True)
    preflight.check_model("org/model", {"HF_HUB_OFFLINE": "1"})


def test_repo_id_offline_with_an_empty_real_cache(tmp_path):
    e = _fails(preflight.check_model, "org/not-cached",
               {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path)})
    assert "not in the Hugging Face cache" in e.message


def test_repo_id_without_network(monkeypatch):
    monkeypatch.setattr(preflight, "_in_hf_cache", lambda repo, env: False)
    monkeypatch.setattr(preflight, "_hub_reachable", lambda env: (False, "huggingface.co"))
    e = _fails(preflight.check_model, "org/model", {})
    assert "huggingface.co cannot be reached" in e.message


def test_repo_id_with_network_is_left_to_vllm(monkeypatch):
    monkeypatch.setattr(preflight, "_in_hf_cache", lambda repo, env: False)
    monkeypatch.setattr(preflight, "_hub_reachable", lambda env: (True, "huggingface.co"))
    preflight.check_model("org/model", {})


def test_hub_reachability_trusts_a_proxy_and_reads_the_endpoint(monkeypatch):
    def no_connection(*a, **kw):
        raise OSError("unreachable")

    monkeypatch.setattr(preflight.socket, "create_connection", no_connection)
    assert preflight._hub_reachable({"HTTPS_PROXY": "http://proxy:3128"})[0] is True
    assert preflight._hub_reachable({"HF_ENDPOINT": "https://hub.example:8443"}) == \
        (False, "hub.example")


# -- outputs -----------------------------------------------------------------------------------

def test_writable_output_leaves_nothing_behind(tmp_path):
    assert preflight.check_output(str(tmp_path / "r.json"), "--json") == tmp_path / "r.json"
    assert list(tmp_path.iterdir()) == []


def test_missing_parents_are_created_for_the_probe_and_removed(tmp_path):
    preflight.check_output(str(tmp_path / "a" / "b" / "r.json"), "--json")
    assert not (tmp_path / "a").exists()


def test_output_is_a_directory(tmp_path):
    e = _fails(preflight.check_output, str(tmp_path), "--html")
    assert "is a directory" in e.message and "report.html" in e.hint


def test_output_under_a_file(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    assert "is a file, not a directory" in _fails(
        preflight.check_output, str(f / "r.json"), "--json").message


def test_output_in_read_only_directory(tmp_path, read_only_dir):
    ro = read_only_dir
    e = _fails(preflight.check_output, str(ro / "r.json"), "--json")
    assert "cannot write in" in e.message and "writable directory" in e.hint


def test_output_stdout_and_empty():
    preflight.check_output("-", "--json")
    _fails(preflight.check_output, "", "--json")


def test_two_outputs_same_file(tmp_path):
    e = _fails(preflight.check_outputs, {"--json": str(tmp_path / "x"), "--html": None,
                                         "--png": str(tmp_path / "." / "x")})
    assert "--json and --png" in e.message


def test_picture_needs_matplotlib(monkeypatch):
    monkeypatch.setattr(preflight.importlib.util, "find_spec", lambda name: None)
    preflight.check_picture_support({"--html": None, "--png": None})
    e = _fails(preflight.check_picture_support, {"--html": "r.html", "--png": None})
    assert "matplotlib" in e.message and "picture" in e.hint


# -- sizes -------------------------------------------------------------------------------------

def test_our_sizes():
    assert preflight.check_size(None, "--margin") is None
    assert preflight.check_size("64MiB", "--margin") == 64 << 20
    assert preflight.check_size("0", "--margin") == 0
    assert "cannot be negative" in _fails(preflight.check_size, "-1", "--margin").message
    assert "512MiB" in _fails(preflight.check_size, "lots", "--margin").message
    assert "more than 0" in _fails(preflight.check_size, "0", "--kv-cap",
                                   allow_zero=False).message


@pytest.mark.parametrize("text,value", [("4G", 4 * GiB), ("4g", 4 * 10**9), ("123", 123),
                                        ("1.5g", 1_500_000_000), (" 2K ", 2048)])
def test_engine_bytes_read_like_vllm(text, value):
    assert preflight.check_engine_bytes(text) == value


@pytest.mark.parametrize("text,words", [("-1", "positive"), ("0", "positive"),
                                        ("6GiB", "6442450944"), ("1.5G", "decimals"),
                                        ("abc", "not a number"), ("1e9", "not a number")])
def test_engine_bytes_refused(text, words):
    e = _fails(preflight.check_engine_bytes, text)
    assert words in (e.message + (e.hint or ""))


# -- the environment and the serve side --------------------------------------------------------

def test_clean_environment_is_off():
    assert not preflight.check_env({}).enabled


def test_env_switch_garbage():
    e = _fails(preflight.check_env, {"WCPROF_PROFILER": "garbage"})
    assert "WCPROF_PROFILER='garbage'" in e.message and "worstcase" in e.hint


def test_env_replay_stop_garbage():
    """A WCPROF_REPLAY_STOP typo fails in wcprof's preflight, before an engine start and its
    sweep, as typed; `vllm serve` (check_env) does not read it."""
    e = _fails(preflight.check_profile, model=None, outputs={},
               environ={"WCPROF_REPLAY_STOP": " Soon"})
    assert "WCPROF_REPLAY_STOP=' Soon'" in e.message and "finished or formed" in e.hint
    assert not preflight.check_env({"WCPROF_REPLAY_STOP": "soon"}).enabled
    preflight.check_profile(model=None, outputs={}, environ={"WCPROF_REPLAY_STOP": "Formed"})


def test_env_config_not_json():
    e = _fails(preflight.check_env, {"WCPROF_CONFIG": "notjson"})
    assert "WCPROF_CONFIG is not valid JSON" in e.message and "unset" in e.hint


@pytest.mark.parametrize("config,words", [('{"foo": 1}', "unknown"),
                                          ('{"margin_bytes": "lots"}', "cannot read size"),
                                          ('{"kv_audit": "maybe"}', "kv_audit"),
                                          ('[1]', "object")])
def test_env_config_bad_settings(config, words):
    e = _fails(preflight.check_env, {"WCPROF_CONFIG": config})
    assert e.message.startswith("WCPROF_CONFIG") and words in e.message


def test_env_config_good():
    s = preflight.check_env({"WCPROF_CONFIG": '{"json_path": "/x/r.json"}',
                             "WCPROF_PROFILER": "worstcase"})
    assert s.enabled and s.json_path == "/x/r.json"


def test_serve_disabled_checks_nothing():
    from worstcase_profiler.settings import ProfilerSettings

    preflight.check_serve(ProfilerSettings(json_path="/sys/r.json"))


def test_serve_unwritable_report(tmp_path, read_only_dir):
    from worstcase_profiler.settings import ProfilerSettings

    ro = read_only_dir
    e = _fails(preflight.check_serve, ProfilerSettings(mode="enforce",
                                                       json_path=str(ro / "r.json")))
    assert e.message.startswith("--profiler-report")


def test_serve_args_check_the_replay_stop_only_for_a_serving_validation():
    """vllm serve reads WCPROF_REPLAY_STOP only when validate_on_start replays requests: a typo
    then fails before the engine starts; otherwise it is not read."""
    bad = {"WCPROF_REPLAY_STOP": "soon"}
    on = {"worstcase_profiler": {"validate_on_start": "worst"}}
    e = _fails(preflight.check_serve_args, "worstcase", None, on, bad)
    assert "WCPROF_REPLAY_STOP='soon'" in e.message
    assert preflight.check_serve_args("worstcase", None, None, bad).enabled
    assert not preflight.check_serve_args(None, None, None, bad).enabled


def test_serve_args_report_without_profiler(tmp_path):
    e = _fails(preflight.check_serve_args, None, str(tmp_path / "r.json"), None, {})
    assert "needs --profiler worstcase" in e.message
    e = _fails(preflight.check_serve_args, "default", str(tmp_path / "r.json"), None, {})
    assert "writes no report" in e.message
    assert "unknown --profiler" in _fails(preflight.check_serve_args, "best", None, None,
                                          {}).message


def test_serve_args_resolve_like_the_workers(tmp_path):
    assert not preflight.check_serve_args(None, None, None, {}).enabled
    s = preflight.check_serve_args("worstcase", str(tmp_path / "r.json"),
                                   {"worstcase_profiler": {"margin_bytes": "1GiB"}}, {})
    assert s.enabled and s.json_path == str(tmp_path / "r.json") and s.margin_bytes == GiB
    # the profiler switched on from the environment, its report path a directory
    e = _fails(preflight.check_serve_args, None, None, None,
               {"WCPROF_PROFILER": "worstcase",
                "WCPROF_CONFIG": json.dumps({"json_path": str(tmp_path)})})
    assert "is a directory" in e.message and "json_path" in e.message


def test_serve_args_bad_environment_and_additional_config(tmp_path):
    assert "WCPROF_PROFILER" in _fails(preflight.check_serve_args, None, None, None,
                                       {"WCPROF_PROFILER": "garbage"}).message
    assert "WCPROF_CONFIG" in _fails(preflight.check_serve_args, "worstcase", None, None,
                                     {"WCPROF_CONFIG": "notjson"}).message
    e = _fails(preflight.check_serve_args, "worstcase", None, {"worstcase_profiler": {"x": 1}}, {})
    assert e.message.startswith("--additional-config") and "valid settings" in e.hint


def test_profile_order_and_sizes(tmp_path):
    sizes = preflight.check_profile(model=None, outputs={"--json": str(tmp_path / "r.json")},
                                    margin="1MiB", kv_cap="512MiB", kv_cache_memory_bytes="4G",
                                    environ={})
    assert sizes == {"margin_bytes": 1 << 20, "kv_cap_bytes": 512 << 20,
                     "kv_cache_memory_bytes": 4 * GiB}
    # a bad size is reported before a missing model
    assert "--margin" in _fails(preflight.check_profile, model="/nope", outputs={},
                                margin="-1", environ={}).message


def test_die_prints_one_line_and_exits(capsys):
    with pytest.raises(SystemExit) as info:
        preflight.die(ConfigError("bad thing", hint="do this"))
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err == "worstcase_profiler: error: bad thing\n  -> do this\n"
