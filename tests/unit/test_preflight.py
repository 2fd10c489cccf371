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
                     "kv_cache_memory_bytes": 4 * GiB, "section": {}}
    # a bad size is reported before a missing model
    assert "--margin" in _fails(preflight.check_profile, model="/nope", outputs={},
                                margin="-1", environ={}).message


def test_die_prints_one_line_and_exits(capsys):
    with pytest.raises(SystemExit) as info:
        preflight.die(ConfigError("bad thing", hint="do this"))
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err == "worstcase_profiler: error: bad thing\n  -> do this\n"


# -- one settings loader: wcprof, vllm serve and the plugin (issue 39) ------------------------

BAD_SECTIONS = [({"bogus": 1}, "unknown worstcase_profiler setting(s): bogus"),
                ({"margin_bytes": "lots"}, "cannot read size"),
                ({"kv_audit": "maybe"}, "kv_audit must be error, warn or off"),
                ({"guard": "sometimes"}, "guard must be auto, on or off")]


@pytest.mark.parametrize("section,words", BAD_SECTIONS)
def test_wcprof_refuses_the_additional_config_section_vllm_serve_refuses(section, words):
    """wcprof used to drop the --additional-config section silently (its own settings replaced
    it), while `vllm serve --profiler worstcase` refused it: the same section is now refused by
    both, with the same message."""
    text = json.dumps({"worstcase_profiler": section})
    served = _fails(preflight.check_serve_args, "worstcase", None, json.loads(text), {})
    profiled = _fails(preflight.check_profile, model=None, outputs={}, additional_config=text,
                      environ={})
    assert served.message == profiled.message
    assert profiled.message.startswith("--additional-config: ") and words in profiled.message


def test_wcprof_reads_a_valid_additional_config_section():
    sizes = preflight.check_profile(
        model=None, outputs={}, environ={},
        additional_config='{"worstcase_profiler": {"margin_bytes": "96MiB"}, "other": 1}')
    assert sizes["section"] == {"margin_bytes": "96MiB"}
    assert preflight.check_profile(model=None, outputs={}, environ={},
                                   additional_config='{"other": 1}')["section"] == {}


@pytest.mark.parametrize("text,words", [("{bad", "--additional-config is not valid JSON"),
                                        ("[1, 2]", "must be a JSON object")])
def test_additional_config_that_is_not_a_json_object(text, words):
    """Issue 39: invalid JSON in --additional-config ended in exit 70 ("please report it")."""
    e = _fails(preflight.check_profile, model=None, outputs={}, additional_config=text,
               environ={})
    assert words in e.message and "JSON object" in e.hint


@pytest.mark.parametrize("section,words", [("default", "switches the profiler off"),
                                           ({"mode": "off"}, "switches the profiler off"),
                                           ({"json_path": "/tmp/r.json"}, "--json")])
def test_wcprof_refuses_a_section_that_overrides_what_it_decides(section, words):
    e = _fails(preflight.check_profile, model=None, outputs={}, environ={},
               additional_config=json.dumps({"worstcase_profiler": section}))
    assert words in e.message + e.hint


def test_every_source_in_its_stated_precedence():
    """defaults < WCPROF_CONFIG < WCPROF_PROFILER < --additional-config < flags, key by key."""
    from worstcase_profiler.settings import load

    env = {"WCPROF_CONFIG": '{"margin_bytes": "1MiB", "kv_audit": "warn"}'}
    block = {"worstcase_profiler": {"margin_bytes": "2MiB"}}
    assert load(environ={}).margin_bytes == 64 << 20
    assert load(environ=env).margin_bytes == 1 << 20
    got = load(additional_config=block, environ=env)
    assert (got.margin_bytes, got.kv_audit) == (2 << 20, "warn")
    got = load(additional_config=block, flags={"margin_bytes": "3MiB"}, environ=env)
    assert (got.margin_bytes, got.kv_audit) == (3 << 20, "warn")
    # the switch: WCPROF_PROFILER over WCPROF_CONFIG, --additional-config over both
    off = dict(env, WCPROF_PROFILER="default")
    assert not load(environ=off).enabled
    assert load(additional_config={"worstcase_profiler": "worstcase"}, environ=off).enabled
    # the plugin's resolve is the same loader
    from worstcase_profiler.settings import resolve

    assert resolve(block, env) == load(additional_config=block, environ=env)


def test_wcprof_flags_override_the_section_and_its_defaults_only_fill_gaps():
    """wcprof's section for the engine: --additional-config's keys, its flags on top, and its
    own run defaults (guard off, the CPU's 512 MiB KV cap) only where no source set them; a
    flag left at its default (--kv-audit) does not override WCPROF_CONFIG's kv_audit."""
    from worstcase_profiler.commands.profile import _settings
    from worstcase_profiler.commands.profile_options import parse_ours
    from worstcase_profiler.settings import given_keys, load

    ns = parse_ours([])
    env = {"WCPROF_CONFIG": '{"kv_audit": "warn", "kv_cap_bytes": "256MiB"}'}
    extra = {"worstcase_profiler": {"margin_bytes": "96MiB"}}
    sizes = {"margin_bytes": None, "kv_cap_bytes": None, "section": {"margin_bytes": "96MiB"}}
    s = _settings(ns, "/t/r.json", True, sizes, {}, given_keys(extra, env))
    got = load(additional_config={"worstcase_profiler": s}, environ=env)
    assert (got.margin_bytes, got.kv_audit, got.kv_cap_bytes, got.guard) == \
        (96 << 20, "warn", 256 << 20, "off")
    ns = parse_ours(["--margin", "8MiB", "--kv-audit", "off"])
    s = _settings(ns, "/t/r.json", True, dict(sizes, margin_bytes=8 << 20), {}, set())
    got = load(additional_config={"worstcase_profiler": s}, environ=env)
    assert (got.margin_bytes, got.kv_audit, got.kv_cap_bytes) == (8 << 20, "off", 512 << 20)


# -- weights and sizes -------------------------------------------------------------------------

def test_a_model_directory_without_weights_is_refused_unless_dummy(tmp_path):
    """Issue 39: a directory with config.json and no weights ended in exit 70 after vLLM's
    start-up; without --load-format dummy it is now refused before the engine."""
    d = _model_dir(tmp_path, '{"model_type": "llama"}')
    e = _fails(preflight.check_weights, str(d), None)
    assert "no weight files" in e.message and "--load-format dummy" in e.hint
    _fails(preflight.check_weights, str(d), "auto")
    preflight.check_weights(str(d), "dummy")
    preflight.check_weights(None, None)  # the bundled model
    (d / "model.safetensors").write_bytes(b"")
    preflight.check_weights(str(d), None)


@pytest.mark.parametrize("value,expected", [("6GiB", 6 * GiB), ("6G", 6 * GiB),
                                            ("6442450944", 6 * GiB), ("512MiB", 512 << 20)])
def test_profile_takes_the_kv_cache_size_in_the_units_check_takes(value, expected):
    """Issue 39: `wcprof check` read --kv-cache-memory-bytes 6GiB, profile refused it."""
    from worstcase_profiler.commands.profile_options import with_flag_value

    sizes = preflight.check_profile(model=None, outputs={}, kv_cache_memory_bytes=value,
                                    environ={})
    assert sizes["kv_cache_memory_bytes"] == expected
    argv = ["--max_model_len", "8", f"--kv_cache_memory_bytes={value}"]
    assert with_flag_value(argv, "--kv-cache-memory-bytes", str(expected)) == \
        ["--max-model-len", "8", f"--kv-cache-memory-bytes={expected}"]
    assert with_flag_value(["--kv-cache-memory-bytes", value], "--kv-cache-memory-bytes",
                           str(expected)) == ["--kv-cache-memory-bytes", str(expected)]
