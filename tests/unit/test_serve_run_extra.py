"""bench/serve_run.py's --extra: JSON-valued vLLM flags must reach `vllm serve` as JSON. A value
that lost its quotes stops serve_run before anything starts (h200-run70's call 26 lost a device
call to `{method:dspark,...}`), and staging/serve_dsv4.sh's own flags pass the check."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import serve_run  # noqa: E402


def test_a_quoted_json_value_stays_one_parsed_argument():
    args = serve_run.checked_extra("""--max-num-seqs 4 --speculative-config '{"method":"dspark"}'""")
    assert args == ["--max-num-seqs", "4", "--speculative-config", '{"method":"dspark"}']
    assert json.loads(args[-1]) == {"method": "dspark"}


@pytest.mark.parametrize("extra", [
    '--speculative-config {"method":"dspark","num_speculative_tokens":3}',   # quotes eaten by shlex
    "-sc {method:dspark}",                                                    # vLLM's alias
    "--compilation-config={cudagraph_mode:FULL}",
    "--speculative_config {method:mtp}",                                      # vLLM's underscore form
])
def test_a_json_value_whose_keys_lost_their_quotes_is_refused_with_the_fix(extra):
    with pytest.raises(SystemExit, match="lost the quotes around its keys; quote the JSON"):
        serve_run.checked_extra(extra)


@pytest.mark.parametrize("extra", [
    """--kv-transfer-config '{"cpu_bytes_to_use": 80m}'""",   # vLLM's human-readable numbers
    "--hf-overrides some_string --limit-mm-per-prompt.image 2 --seed 0",
    "--compilation-config 3",
])
def test_values_vllm_parses_its_own_way_pass(extra):
    assert serve_run.checked_extra(extra)


@pytest.mark.parametrize("extra,why", [
    ("--seed 0 --additional-config", "has no value"),
    ("--additional-config --seed 0", "has no value"),
    ("--additional-config 3", "is not a JSON object"),
    ("--additional-config='[1]'", "is not a JSON object"),
    ("--additional_config null", "is not a JSON object"),
])
def test_the_additional_config_serve_run_merges_must_be_a_json_object(extra, why):
    with pytest.raises(SystemExit, match=why):
        serve_run.checked_extra(extra)


def test_main_refuses_before_a_ballast_or_a_server_starts(tmp_path, monkeypatch):
    def started(*_a, **_k):
        raise AssertionError("started before --extra was checked")

    monkeypatch.setattr(serve_run, "Ballast", started)
    monkeypatch.setattr(serve_run, "Server", started)
    with pytest.raises(SystemExit, match="lost the quotes"):
        serve_run.main(["--out", str(tmp_path), "--hold-slack-mib", "256",
                        "--extra", '--speculative-config {"method":"dspark"}'])
    assert not (tmp_path / "serve.json").exists()


def _script_extra(eager: str) -> str:
    """The --extra staging/serve_dsv4.sh builds, read by running its own lines from EXTRA= to
    the line before its `exec`."""
    lines = (ROOT / "staging" / "serve_dsv4.sh").read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("EXTRA="))
    end = next(i for i, ln in enumerate(lines) if ln.startswith("exec "))
    body = "\n".join(lines[start:end]) + '\nprintf %s "$EXTRA"'
    return subprocess.run(["bash", "-c", body], env={"EAGER": eager, "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, check=True).stdout


@pytest.mark.parametrize("eager", ["0", "1"])
def test_serve_dsv4_passes_its_drafter_and_graph_configs_as_json(eager):
    args = serve_run.checked_extra(_script_extra(eager))
    spec = json.loads(args[args.index("--speculative-config") + 1])
    assert spec == {"method": "dspark", "num_speculative_tokens": 3}
    if eager == "0":
        cc = json.loads(args[args.index("--compilation-config") + 1])
        assert cc == {"cudagraph_mode": "FULL_AND_PIECEWISE"}
    else:
        assert "--compilation-config" not in args


def test_a_missing_or_excluded_plugin_is_named_before_a_server_starts():
    """Without the plugin's entry point `vllm serve --profiler worstcase` dies in argparse
    (--profiler read as --profiler-config, h100-run82's first server); VLLM_PLUGINS can leave it
    out too. common.plugin_problem names either (serve_run and gpu_suite stop on it)."""
    from types import SimpleNamespace

    import common

    lora = SimpleNamespace(name="lora_filesystem_resolver", value="vllm.plugins.lora:register")
    ours = SimpleNamespace(name="worstcase_profiler", value="worstcase_profiler.plugin:register")
    assert "install_entrypoint.py" in common.plugin_problem([lora], environ={})
    assert common.plugin_problem([lora, ours], environ={}) is None
    assert "leaves worstcase_profiler out" in common.plugin_problem(
        [lora, ours], environ={"VLLM_PLUGINS": "lora_filesystem_resolver"})
    assert common.plugin_problem([ours], environ={"VLLM_PLUGINS": "a, worstcase_profiler"}) is None
