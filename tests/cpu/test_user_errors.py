"""What a user can get wrong, named after what they did. Each ends in one `wcprof: error:` line
(and its `->` hint) and the right exit code, never a traceback or a page of usage.

The preflight cases run with a `vllm` (and `torch`) on PYTHONPATH that refuses to import: they
prove that the mistake is caught before vLLM loads, in about a second. Only the last few tests
boot an engine (one tiny-model run shared by the quiet and temp-directory checks)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from conftest import BIN, ROOT, TINY, engine_env

REPORT = ROOT / "tests" / "unit" / "data" / "h200_dsv32_fp8.json"


@pytest.fixture(scope="module")
def no_vllm(tmp_path_factory) -> dict[str, str]:
    """An environment in which importing vllm or torch fails loudly."""
    stubs = tmp_path_factory.mktemp("no-vllm")
    for name in ("vllm", "torch"):
        (stubs / name).mkdir()
        (stubs / name / "__init__.py").write_text(
            f"raise ImportError('{name} imported before preflight finished')\n")
    # in front of the caller's PYTHONPATH (a worktree's checkout), not instead of it
    return engine_env(PYTHONPATH=os.pathsep.join(
        p for p in (str(stubs), os.environ.get("PYTHONPATH", "")) if p))


def wcprof(args: list[str], env: dict[str, str], cwd: Path, timeout: int = 60):
    t0 = time.perf_counter()
    p = subprocess.run([str(BIN / "wcprof"), *args], capture_output=True, text=True, env=env,
                       cwd=cwd, timeout=timeout)
    p.seconds = time.perf_counter() - t0  # type: ignore[attr-defined]
    return p


def one_error(p, code: int = 2, *words: str) -> str:
    """Exit `code`, nothing on stdout, stderr = one error line (+ its hint), no traceback."""
    text = p.stdout + p.stderr
    assert p.returncode == code, text[-3000:]
    assert "Traceback" not in text and "usage:" not in text, text[-3000:]
    lines = p.stderr.strip().splitlines()
    assert lines and lines[0].startswith("wcprof: error: "), p.stderr
    assert len(lines) <= 2 and all(l.startswith("  -> ") for l in lines[1:]), p.stderr
    for w in words:
        assert w in p.stderr, p.stderr
    return p.stderr




# -- the model ---------------------------------------------------------------------------------

def test_model_path_that_does_not_exist(no_vllm, tmp_path):
    p = wcprof(["--model", "/nonexistent/model"], no_vllm, tmp_path)
    one_error(p, 2, "/nonexistent/model", "no such file")


def test_model_relative_path_that_does_not_exist(no_vllm, tmp_path):
    one_error(wcprof(["--model", "./models/llama"], no_vllm, tmp_path), 2, "no such file")


def test_config_json_that_is_not_json(no_vllm, tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text('{"model_type": "llama",\n')
    p = wcprof(["--model", "m"], no_vllm, tmp_path)
    one_error(p, 2, "config.json is not valid JSON", "re-download")


def test_model_directory_without_config_json(no_vllm, tmp_path):
    (tmp_path / "m").mkdir()
    one_error(wcprof(["--model", "m"], no_vllm, tmp_path), 2, "no config.json")


def test_config_json_that_names_no_model(no_vllm, tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text('{"hidden_size": 64}')
    one_error(wcprof(["--model", "m"], no_vllm, tmp_path), 2, "model_type")


def test_model_that_is_a_weights_file(no_vllm, tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 8)
    one_error(wcprof(["--model", "model.safetensors"], no_vllm, tmp_path), 2, "is a file")


def test_hub_model_while_offline(no_vllm, tmp_path):
    env = dict(no_vllm, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tmp_path / "hf"))
    one_error(wcprof(["--model", "org/never-downloaded"], env, tmp_path), 2, "HF_HUB_OFFLINE",
              "hf download")


# -- outputs -----------------------------------------------------------------------------------

def test_json_into_read_only_directory(no_vllm, tmp_path, read_only_dir):
    ro = read_only_dir
    p = wcprof(["--json", str(ro / "report.json")], no_vllm, tmp_path)
    one_error(p, 2, "--json", "cannot write in")
    assert p.seconds < 30  # before any sweep (a sweep alone takes longer than preflight)


def test_html_path_that_is_a_directory(no_vllm, tmp_path):
    one_error(wcprof(["--html", str(tmp_path)], no_vllm, tmp_path), 2, "is a directory",
              "report.html")


def test_png_under_a_regular_file(no_vllm, tmp_path):
    (tmp_path / "out").write_text("x")
    one_error(wcprof(["--png", "out/pic.png"], no_vllm, tmp_path), 2, "not a directory")


def test_json_and_html_into_the_same_file(no_vllm, tmp_path):
    one_error(wcprof(["--json", "r", "--html", "r"], no_vllm, tmp_path), 2, "same file")


# -- sizes and flags ---------------------------------------------------------------------------

def test_negative_kv_cache_memory_bytes(no_vllm, tmp_path):
    p = wcprof(["--kv-cache-memory-bytes", "-1"], no_vllm, tmp_path)
    one_error(p, 2, "--kv-cache-memory-bytes -1", "positive")
    assert not (Path(no_vllm["WCPROF_CACHE_DIR"]).exists()
                and any(Path(no_vllm["WCPROF_CACHE_DIR"]).iterdir()))


@pytest.mark.parametrize("value,words", [("0", "positive"), ("6.5G", "no decimals"),
                                         ("lots", "not a number")])
def test_other_bad_kv_cache_memory_bytes(no_vllm, tmp_path, value, words):
    one_error(wcprof(["--kv-cache-memory-bytes", value], no_vllm, tmp_path), 2, words)


@pytest.mark.parametrize("args,words", [(["--margin", "-5MiB"], "cannot be negative"),
                                        (["--margin", "lots"], "512MiB"),
                                        (["--kv-cap", "0"], "more than 0"),
                                        (["--kv-audit", "maybe"], "invalid choice"),
                                        (["--json"], "expected one argument")])
def test_other_bad_wcprof_flags(no_vllm, tmp_path, args, words):
    one_error(wcprof(args, no_vllm, tmp_path), 2, words)


def test_profiler_default_is_rejected(no_vllm, tmp_path):
    one_error(wcprof(["--profiler", "default"], no_vllm, tmp_path), 2,
              "always runs the worst-case profiler")


def test_profiler_report_is_a_vllm_serve_flag(no_vllm, tmp_path):
    one_error(wcprof(["--profiler-report", "r.json"], no_vllm, tmp_path), 2, "--json r.json")


@pytest.mark.parametrize("env,words", [({"WCPROF_PROFILER": "garbage"}, "WCPROF_PROFILER"),
                                       ({"WCPROF_CONFIG": "notjson"}, "not valid JSON"),
                                       ({"WCPROF_CONFIG": '{"margin": 1}'}, "unknown")])
def test_bad_settings_in_the_environment(no_vllm, tmp_path, env, words):
    one_error(wcprof([], dict(no_vllm, **env), tmp_path), 2, words)


@pytest.mark.parametrize("config,words", [
    ('{"worstcase_profiler": {"bogus": 1}}', "unknown worstcase_profiler setting(s): bogus"),
    ('{"worstcase_profiler": {"margin_bytes": "lots"}}', "cannot read size"),
    ('{"worstcase_profiler": {"json_path": "r.json"}}', "--json PATH"),
    ('{bad', "--additional-config is not valid JSON")])
def test_bad_additional_config(no_vllm, tmp_path, config, words):
    """Issue 39: wcprof ignored the worstcase_profiler section of --additional-config (vllm serve
    refused it) and read invalid JSON as an internal error: now refused before vLLM loads."""
    one_error(wcprof(["--additional-config", config], no_vllm, tmp_path), 2, words)


def test_model_directory_without_weights(no_vllm, tmp_path):
    """Issue 39: config.json and no weights ended in exit 70 after vLLM's start-up."""
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(
        json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    one_error(wcprof(["--model", "m"], no_vllm, tmp_path), 2, "no weight files",
              "--load-format dummy")


def test_unknown_subcommand(no_vllm, tmp_path):
    p = wcprof(["frobnicate"], no_vllm, tmp_path)
    err = one_error(p, 2, "unknown command 'frobnicate'", "render")
    assert len(err.strip().splitlines()) == 1


def test_model_given_as_a_command(no_vllm, tmp_path):
    one_error(wcprof(["org/model"], no_vllm, tmp_path), 2, "--model org/model")


def test_debug_shows_the_traceback(no_vllm, tmp_path):
    for args, env in ((["--debug", "--model", "/nope"], no_vllm),
                      (["--model", "/nope"], dict(no_vllm, WCPROF_DEBUG="1"))):
        p = wcprof(args, env, tmp_path)
        assert p.returncode == 2 and "Traceback" in p.stderr and "wcprof: error:" in p.stderr


# -- help --------------------------------------------------------------------------------------

def test_help_is_fast_and_lists_subcommands(no_vllm, tmp_path):
    from worstcase_profiler.commands import COMMANDS

    for flag in ("--help", "-h", "help"):
        p = wcprof([flag], no_vllm, tmp_path)  # vllm cannot even be imported here
        assert p.returncode == 0, p.stderr
        assert p.seconds < 2.0, p.seconds
        out = p.stdout
        for name in COMMANDS:
            assert f"\n  {name} " in out, name
        for words in ("--help-engine", "--kv-audit", "--no-lock-workspace", "default: 64MiB",
                      "--quiet", "--debug", "exit codes", "70  internal error"):
            assert words in out, words
        assert "(default: None)" not in out and "Traceback" not in out
        assert "--enable-prefix-caching" not in out  # vLLM's flags live behind --help-engine


def test_subcommand_help(no_vllm, tmp_path):
    from worstcase_profiler.commands.demo import SCENARIOS

    for cmd in ("render", "check", "diff", "profile", "demo"):
        p = wcprof([cmd, "--help"], no_vllm, tmp_path)
        assert p.returncode == 0 and "usage:" in p.stdout, (cmd, p.stderr)
    top = wcprof(["--help"], no_vllm, tmp_path).stdout
    demo = wcprof(["demo", "--help"], no_vllm, tmp_path).stdout
    for name in SCENARIOS:  # both help screens name every bundled scenario
        assert f"\n  {name} " in demo and name in top.split("\n  demo", 1)[1].split("\n  check")[0]


def test_help_engine_lists_vllm_flags(tmp_path):
    p = wcprof(["--help-engine=kv-cache-memory"], engine_env(), tmp_path, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "--kv-cache-memory-bytes" in p.stdout


# -- render ------------------------------------------------------------------------------------

def test_render_a_saved_report(no_vllm, tmp_path):
    p = wcprof(["render", str(REPORT)], no_vllm, tmp_path)
    assert p.returncode == 0, p.stderr
    assert "recommended: --kv-cache-memory-bytes" in p.stdout
    out = tmp_path / "again.json"
    p = wcprof(["render", str(REPORT), "--json", str(out), "--html", "r.html", "--png", "r.png"],
               no_vllm, tmp_path, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout == ""  # files asked for: no terminal screen unless --terminal
    assert json.loads(out.read_text())["schema_version"]
    assert (tmp_path / "r.html").read_text().lstrip().lower().startswith("<!doctype html")
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"


def test_render_a_missing_report(no_vllm, tmp_path):
    one_error(wcprof(["render", "nope.json"], no_vllm, tmp_path), 2, "cannot read report")


def test_render_a_file_that_is_not_a_report(no_vllm, tmp_path):
    (tmp_path / "x.json").write_text('{"hello": 1}')
    one_error(wcprof(["render", "x.json"], no_vllm, tmp_path), 2, "not a wcprof report")


def test_render_into_a_read_only_directory(no_vllm, tmp_path, read_only_dir):
    ro = read_only_dir
    one_error(wcprof(["render", str(REPORT), "--html", str(ro / "r.html")], no_vllm, tmp_path),
              2, "cannot write in")


# -- internal errors and interrupts, in-process ------------------------------------------------

def test_internal_error_is_one_line_and_not_unsafe(monkeypatch, capsys):
    from worstcase_profiler import cli
    from worstcase_profiler.commands import profile

    def boom(argv):
        raise RuntimeError("something inside broke\nsecond line")

    monkeypatch.setattr(profile, "run", boom)
    monkeypatch.delenv("WCPROF_DEBUG", raising=False)
    assert cli.main(["profile"]) == cli.EXIT_INTERNAL == 70
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "wcprof: error: RuntimeError: something inside broke" in err and "--debug" in err
    assert "second line" not in err
    assert cli.main(["profile", "--debug"]) == 70
    assert "Traceback" in capsys.readouterr().err


def test_ctrl_c_in_process(monkeypatch, capsys):
    from worstcase_profiler import cli
    from worstcase_profiler.commands import profile

    def interrupted(argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(profile, "run", interrupted)
    assert cli.main(["profile"]) == 130
    assert capsys.readouterr().err.strip() == "wcprof: interrupted"


# -- with an engine ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def quiet_run(tmp_path_factory):
    """One tiny-model run with --quiet and its own TMPDIR."""
    base = tmp_path_factory.mktemp("quiet")
    tmpdir = base / "tmp"
    tmpdir.mkdir()
    env = engine_env(TMPDIR=str(tmpdir), WCPROF_CACHE_DIR=str(base / "cache"))
    p = wcprof(["--quiet", "--json", str(base / "r.json")], env, base, timeout=600)
    return p, tmpdir, base, env


@pytest.mark.engine
def test_quiet_prints_only_the_verdict(quiet_run):
    p, _tmp, base, _env = quiet_run
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]  # SAFE or STOCK UNSAFE: exit 0
    assert p.stderr == "", p.stderr[-3000:]
    lines = p.stdout.splitlines()
    assert lines[0].split()[0] in ("SAFE", "STOCK", "KV", "DOES"), lines[:3]
    assert "recommended: --kv-cache-memory-bytes" in p.stdout
    for noise in ("WARNING", "INFO", "Traceback", "Chat template", "Triton", "NUMA",
                  "FutureWarning", "engine start"):
        assert noise not in p.stdout, noise
    assert json.loads((base / "r.json").read_text())["config"]["model"] == str(TINY)


@pytest.mark.engine
def test_no_temp_dir_left_behind(quiet_run):
    p, tmpdir, _base, _env = quiet_run
    assert p.returncode == 0
    assert not [d.name for d in tmpdir.iterdir() if d.name.startswith("wcprof-")]


@pytest.mark.engine
def test_logs_without_quiet_carry_no_traceback(quiet_run):
    """Without --quiet vLLM's logs show, but its chat-template warm-up traceback (no tokenizer
    with --skip-tokenizer-init) is one line. The cached sweep from the quiet run makes it fast."""
    _p, tmpdir, base, env = quiet_run
    p = wcprof([], env, base, timeout=600)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    assert "Traceback" not in p.stdout + p.stderr
    assert "Chat template warmup failed: ValueError" in p.stdout + p.stderr
    assert not [d.name for d in tmpdir.iterdir() if d.name.startswith("wcprof-")]


@pytest.mark.engine
def test_vllm_refusal_leaves_no_temp_dir(tmp_path):
    """vLLM itself refuses (after its import, the temporary directory exists): with --quiet
    still exactly the error line, and the directory is gone."""
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    p = wcprof(["--quiet", "--max-model-len", "100000"], engine_env(TMPDIR=str(tmpdir)),
               tmp_path, timeout=300)
    one_error(p, 2, "vLLM refused the configuration", "max_model_len")
    assert not list(tmpdir.glob("wcprof-*"))


@pytest.mark.engine
@pytest.mark.parametrize("delay,quiet", [(0.0, False), (0.5, True), (1.0, False), (3.0, True)])
def test_ctrl_c_during_start_up_cleans_up(tmp_path, delay, quiet):
    """Ctrl-C at several moments of torch's import and the engine's start: always exit 130 with
    one line and no temporary directory. A KeyboardInterrupt raised there was once swallowed by
    torch's C++ (the run went on to exit 0) and once aborted the process (-6, in CI)."""
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    # As from a terminal: a test run started in the background (`make test &`, nohup) has
    # SIGINT ignored, the child inherits that, and Python then installs no KeyboardInterrupt.
    proc = subprocess.Popen([str(BIN / "wcprof"), *(["--quiet"] if quiet else [])],
                            env=engine_env(TMPDIR=str(tmpdir)),
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 120
        while not list(tmpdir.glob("wcprof-*")) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert list(tmpdir.glob("wcprof-*")), "wcprof never made its temporary directory"
        time.sleep(delay)  # inside torch's and vLLM's import / the engine's start
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err[-3000:]
    assert err.strip().splitlines()[-1] == "wcprof: interrupted"
    if quiet:
        assert err == "wcprof: interrupted\n"
    assert "Traceback" not in out + err
    assert not list(tmpdir.glob("wcprof-*"))


def _raised_from(inner: BaseException, outer: BaseException) -> BaseException:
    """`outer` as the engine raises it: `raise outer from inner`, caught."""
    try:
        try:
            raise inner
        except BaseException as e:
            raise outer from e
    except BaseException as wrapped:
        return wrapped


def test_a_ctrl_c_wrapped_in_another_error_still_exits_as_interrupted(monkeypatch, capsys):
    """A Ctrl-C landing in a class body's __set_name__ during an import reaches main as
    RuntimeError("Error calling __set_name__ ...") caused by the KeyboardInterrupt (a fresh
    clone's run of the test above read exit 70): still exit 130, one line, no traceback. An
    error with no interrupt in its chain stays an internal error."""
    from worstcase_profiler import cli

    def raising(error):
        def dispatch(argv):
            raise error
        return dispatch

    monkeypatch.setattr(cli, "_dispatch", raising(_raised_from(
        KeyboardInterrupt(), RuntimeError("Error calling __set_name__ on 'cached_property'"))))
    assert cli.main([]) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == "wcprof: interrupted"
    monkeypatch.setattr(cli, "_dispatch", raising(RuntimeError("shared memory exhausted")))
    assert cli.main([]) == 70


def test_engine_failures_are_classified():
    """What LLM(...) raises: our own errors unwrapped, vLLM's config checks and the hub's refusals
    are bad input (exit 2), a torch.compile trace failure says to run eager (exit 4), anything
    else stays itself (exit 70 in main)."""
    from worstcase_profiler.commands.engine_boot import engine_failure as _engine_failure
    from worstcase_profiler.errors import ConfigError, DoesNotFit, UnsupportedModel

    inner = DoesNotFit("no room")
    assert _engine_failure(_raised_from(inner, RuntimeError("engine core failed"))) is inner
    assert isinstance(_engine_failure(ValueError("bad max_model_len")), ConfigError)

    hub_error = type("RepositoryNotFoundError", (OSError,),
                     {"__module__": "huggingface_hub.errors"})
    found = _engine_failure(_raised_from(hub_error("404 Client Error: Repository Not Found for url"),
                                         OSError("Repo id must be in the form 'repo_name'")))
    assert isinstance(found, ConfigError) and "Repository Not Found" in found.message
    unsupported = type("Unsupported", (RuntimeError,), {"__module__": "torch._dynamo.exc"})
    found = _engine_failure(_raised_from(unsupported("Attempted to call function marked as skipped"),
                                         RuntimeError("engine core initialization failed")))
    assert isinstance(found, UnsupportedModel) and "--enforce-eager" in found.hint
    assert "marked as skipped" in found.message and found.exit_code == 4
    compile_failed = type("BackendCompilerFailed", (RuntimeError,),
                          {"__module__": "torch._dynamo.exc"})
    oom = _raised_from(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"),
                       compile_failed("backend='inductor' raised: OutOfMemoryError"))
    assert _engine_failure(oom) is oom  # not a trace failure: stays itself
    other = RuntimeError("shared memory exhausted")
    assert _engine_failure(other) is other


def test_engine_flags_are_recognised_as_given_in_either_spelling():
    """The bundled model's defaults fill only what the user did not pass: --max_model_len is
    --max-model-len, and --model-impl is not --model."""
    from worstcase_profiler.commands.engine_boot import BUNDLED, build_engine_args

    ns, _ = build_engine_args(["--max_model_len", "1024"])
    assert ns.max_model_len == 1024 and ns.model == str(BUNDLED)
    ns, _ = build_engine_args(["--model-impl", "transformers"])
    assert ns.model == str(BUNDLED)
