"""`wcprof gate`: profile a list of engine configurations and fail CI when one got worse than its
accepted baseline. The logic behind .github/workflows/wcprof-gate.yml and the composite action
.github/actions/wcprof-gate; both only install the plugin, run this and upload OUT.

  wcprof gate CONFIGS --baseline DIR [--out DIR] [--max-increase 5%] [--metric NAME]...
              [--require-baseline] [--accept] [--timeout S]

CONFIGS, plain text: one `wcprof` argument line per configuration, optionally prefixed by
`name:`; blank lines and `#` comments are ignored. An unnamed line is named after its --model
(the bundled tiny model when there is none).

    tiny:                                     # no arguments: wcprof's bundled tiny model
    llama-8b: --model meta-llama/Llama-3.1-8B --max-model-len 131072 --max-num-batched-tokens 8192

or YAML (a .yml/.yaml file): a list of {name, args}, args a string or a list of strings, either
at the top level or under a `configs:` key.

For each configuration the gate runs `wcprof ARGS --json OUT/NAME.json --html OUT/NAME.html
--quiet` in a subprocess (its output goes to OUT/NAME.log) and compares the report with
BASELINE/NAME.json exactly as `wcprof diff` does (diff.judge): a gated
metric that got worse by more than --max-increase fails the configuration. It writes a markdown
table to OUT/summary.md, and appends it to $GITHUB_STEP_SUMMARY when that is set. Every file is
written to a temporary name first and renamed (atomic_write.py), so OUT never holds a
half-written file.

Per configuration: PASS, FAIL (a gated metric got worse by more than the threshold), NEW (no
baseline yet; passes unless --require-baseline) or ERROR (wcprof exited non-zero -- it found the
configuration unsafe, or could not profile it -- or wrote no readable report).

--accept copies every new report that profiled cleanly (PASS, FAIL, NEW) into BASELINE: the way to
accept a new baseline. Accepted regressions do not fail the run; ERROR still does.

Exit codes: 0 every configuration passed; 1 a regression, a profile that failed, or a missing
baseline under --require-baseline; 2 bad input (no or empty CONFIGS, bad YAML, a duplicate or
invalid name, an unreadable baseline, an unwritable OUT, a bad threshold or metric), raised as
errors.ConfigError before anything is profiled.

Pure Python: no vLLM or torch here; the engines run in the subprocesses.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal

from ..atomic_write import write_atomically
from ..errors import ArgParser, ConfigError
from ..report import Report
from ..sizes import fmt_bytes, fmt_tokens
from .diff import (DEFAULT_GATED, METRICS, config_differences, judge, load, parse_metrics,
                   parse_threshold, worsening)


GateVerdict = Literal["PASS", "FAIL", "NEW", "ERROR"]

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")


# `name:` at the start of a line, followed by whitespace or the end of the line. Arguments always
# start with `-`, so a first token that does not and ends in ':' can only be a name.
_PREFIX_RE = re.compile(r"\s*([^\s-][^\s:]*(?:\s+[^\s:]+)*):(?=\s|$)")

_SET_BY_GATE = ("--json", "--html")

WCPROF_EXIT = {1: "measured unsafe: a validation above its prediction, or a KV over-commit "
                  "started anyway", 2: "bad input", 3: "does not fit", 4: "unsupported model",
               5: "KV over-commit", 70: "internal error", 130: "interrupted"}
"""Short labels of errors.EXIT_CODES (docs/faq.md#exit-codes), for a profile that failed."""


@dataclass(frozen=True)
class GateConfig:
    name: str
    args: tuple[str, ...]
    where: str  # "configs.txt:3", for messages


@dataclass
class RunResult:
    """What a runner reports. returncode None: it timed out. message: one line that says why a
    run failed (the default runner takes the last line of the log)."""

    returncode: int | None
    seconds: float = 0.0
    message: str = ""


# runner(config, json_path, html_path, log_path) -> RunResult; it must write the report to
# json_path (and may write html_path and log_path). Injectable: tests pass a fake.
Runner = Callable[[GateConfig, Path, Path, Path], RunResult]


@dataclass
class Outcome:
    config: GateConfig
    gate: GateVerdict
    new: Report | None = None
    old: Report | None = None
    failed: list[str] = field(default_factory=list)  # gated metrics over the threshold
    worst: tuple[str, float] | None = None  # (gated metric, worsening) with the largest worsening
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    accepted: bool = False


def _derive_name(args: list[str]) -> str:
    model = None
    for i, a in enumerate(args):
        if a == "--model" and i + 1 < len(args):
            model = args[i + 1]
        elif a.startswith("--model="):
            model = a.split("=", 1)[1]
    if not model:
        return "tiny"
    base = model.rstrip("/").rsplit("/", 1)[-1] or "model"
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", base).strip("-.") or "model"
    return slug if slug[0].isalnum() else f"m{slug}"


def _check_args(args: list[str], where: str) -> None:
    from . import COMMANDS

    if args and args[0] in COMMANDS and args[0] != "profile":  # profile is what the gate runs
        raise ConfigError(f"{where}: `{args[0]}` is a wcprof subcommand; a config line holds the "
                          f"arguments of one profile run (engine flags such as --model)")
    for a in args:
        if a.split("=", 1)[0] in _SET_BY_GATE:
            raise ConfigError(f"{where}: drop {a.split('=', 1)[0]}: the gate writes "
                              f"OUT/NAME.json and OUT/NAME.html itself")


def _parse_text(text: str, source: str) -> list[tuple[str | None, list[str], str]]:
    out = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        where = f"{source}:{lineno}"
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        name, rest = None, raw
        m = _PREFIX_RE.match(raw)
        if m:
            name, rest = m.group(1).strip(), raw[m.end():]
        try:
            args = shlex.split(rest, comments=True)
        except ValueError as e:
            raise ConfigError(f"{where}: cannot split the arguments: {e}") from None
        out.append((name, args, where))
    return out


def _parse_yaml(text: str, source: str) -> list[tuple[str | None, list[str], str]]:
    try:
        import yaml
    except ImportError:
        raise ConfigError(f"{source}: YAML configs need PyYAML (pip install pyyaml)",
                          hint="or write the configs as plain text, one `name: ARGS` per line"
                          ) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{source}: bad YAML{at}: {problem}") from None
    if isinstance(data, dict) and set(data) == {"configs"}:
        data = data["configs"]
    if data is None:
        return []
    if not isinstance(data, list):
        raise ConfigError(f"{source}: expected a list of {{name, args}} (or `configs:` holding "
                          f"one), found a {type(data).__name__}")
    out = []
    for i, item in enumerate(data, 1):
        where = f"{source}: config {i}"
        if not isinstance(item, dict) or not set(item) <= {"name", "args"}:
            keys = sorted(item) if isinstance(item, dict) else type(item).__name__
            raise ConfigError(f"{where}: expected a mapping with keys name and args, found {keys}")
        name, args = item.get("name"), item.get("args")
        if name is not None:
            name = str(name)
            where = f"{source}: {name}"
        if args is None:
            args = []
        elif isinstance(args, str):
            try:
                args = shlex.split(args, comments=True)
            except ValueError as e:
                raise ConfigError(f"{where}: cannot split args: {e}") from None
        elif isinstance(args, list) and all(isinstance(a, (str, int, float)) for a in args):
            args = [str(a) for a in args]
        else:
            raise ConfigError(f"{where}: args must be a string or a list of strings")
        out.append((name, args, where))
    return out


def load_configs(path: str | Path) -> list[GateConfig]:
    """Read a configs file (plain text, or YAML by its .yml/.yaml suffix). ConfigError when it is
    missing, empty, malformed, or names a configuration twice."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"configs file {path} not found",
                          hint="pass a file with one `name: WCPROF ARGS` line per configuration"
                          ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read configs file {path}: {getattr(e, 'strerror', None) or e}"
                          ) from None
    yaml_file = path.suffix.lower() in (".yml", ".yaml")
    entries = (_parse_yaml if yaml_file else _parse_text)(text, path.name)
    if not entries:
        raise ConfigError(f"configs file {path} holds no configuration",
                          hint="one `name: WCPROF ARGS` line per configuration; `tiny:` alone "
                               "profiles the bundled tiny model")
    configs: list[GateConfig] = []
    seen: dict[str, str] = {}
    for name, args, where in entries:
        derived = name is None
        name = _derive_name(args) if derived else name
        if not NAME_RE.match(name):
            raise ConfigError(f"{where}: bad config name {name!r}",
                              hint="use letters, digits, '.', '_' and '-' (it names "
                                   "OUT/NAME.json and BASELINE/NAME.json)")
        if name in seen:
            raise ConfigError(f"{where}: duplicate config name {name!r} (also {seen[name]})"
                              + (" -- named after its --model" if derived else ""),
                              hint="give each configuration its own name: prefix the line with "
                                   "`name:`" if not yaml_file else "give each its own name")
        seen[name] = where
        _check_args(args, where)
        configs.append(GateConfig(name, tuple(args), where))
    return configs


def _prepare_dir(path: Path, what: str) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".wcprof-gate-probe.")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise ConfigError(f"cannot write to the {what} {path}: {e.strerror or e}") from None


def _last_line(log_path: Path) -> str:
    try:
        lines = log_path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    ansi = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
    for line in reversed(lines):
        line = ansi.sub("", line).strip()
        if line:
            return line[:300]
    return ""


def run_process_group(cmd: list[str], log, env: dict[str, str], timeout: float | None
                      ) -> int | None:
    """Run cmd in its own session, output into the open file `log`. On a timeout or an
    interrupt the whole process group is killed, not just wcprof: an engine's worker processes
    (tensor parallel) would otherwise keep the GPU memory. Returns the exit status (negative: the
    signal that killed it), None on a timeout."""
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=env, start_new_session=True)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        return None
    except BaseException:
        _kill_group(proc)
        raise


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    proc.wait()


def subprocess_runner(timeout: float | None = None) -> Runner:
    """The default runner: `python -m worstcase_profiler.cli ARGS --json J --html H --quiet` with
    this interpreter (so the plugin and vLLM of this environment), its output into the log.
    --html only where matplotlib is installed."""

    # --html draws with matplotlib (the `picture` extra): without it, JSON only rather than a
    # refusal of every configuration.
    html = importlib.util.find_spec("matplotlib") is not None

    def run(config: GateConfig, json_path: Path, html_path: Path, log_path: Path) -> RunResult:
        cmd = [sys.executable, "-m", "worstcase_profiler.cli", *config.args,
               "--json", str(json_path), *(["--html", str(html_path)] if html else []), "--quiet"]
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        env.setdefault("COLUMNS", "120")
        t0 = time.perf_counter()
        with open(log_path, "w", encoding="utf-8") as log:
            log.write(f"$ {shlex.join(cmd)}\n")
            if not html:
                log.write("(no --html: matplotlib is not installed; "
                          "pip install 'worstcase_profiler[picture]')\n")
            log.flush()
            rc = run_process_group(cmd, log, env, timeout)
        seconds = time.perf_counter() - t0
        message = f"timed out after {timeout:g}s" if rc is None else _last_line(log_path)
        return RunResult(rc, seconds, message)

    return run


def _profile(config: GateConfig, out: Path, runner: Runner) -> tuple[RunResult, Report | None,
                                                                     str | None]:
    """Run one config in a scratch directory under OUT, then move its files into place. Returns
    the run, the report (None when unreadable or absent) and why it is unreadable."""
    finals = {ext: out / f"{config.name}.{ext}" for ext in ("json", "html", "log")}
    for stale in finals.values():  # an old run's report must not pass for this one's
        stale.unlink(missing_ok=True)
    work = Path(tempfile.mkdtemp(dir=out, prefix=f".{config.name}.tmp-"))
    try:
        tmp = {ext: work / f"{config.name}.{ext}" for ext in finals}
        try:
            result = runner(config, tmp["json"], tmp["html"], tmp["log"])
        except OSError as e:
            result = RunResult(127, 0.0, f"could not run wcprof: {e.strerror or e}")
        for ext, src in tmp.items():
            if src.exists():
                os.replace(src, finals[ext])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report, problem = None, None
    if finals["json"].exists():
        try:
            report = load(str(finals["json"]))
        except ConfigError as e:
            problem = e.message
    else:
        problem = "wcprof wrote no report"
    return result, report, problem


def _compare(outcome: Outcome, gated: list[str], threshold: float) -> None:
    old, new = outcome.old, outcome.new
    assert old is not None and new is not None
    outcome.failed, outcome.worst = judge(old, new, gated, threshold)
    outcome.gate = "FAIL" if outcome.failed else "PASS"
    for line in config_differences(old, new):
        outcome.notes.append(f"the reports differ in {line}")


def _gate_one(config: GateConfig, baseline: Report | None, out: Path, runner: Runner,
              gated: list[str], threshold: float) -> Outcome:
    result, report, problem = _profile(config, out, runner)
    outcome = Outcome(config, "ERROR", new=report, old=baseline, seconds=result.seconds)
    if result.returncode != 0:
        if result.returncode is None:
            why = result.message or "timed out"
        elif result.returncode < 0:
            why = f"wcprof was killed by signal {-result.returncode}"
            try:
                why += f" ({signal.Signals(-result.returncode).name}"
                why += ": out of host memory?)" if result.returncode == -signal.SIGKILL else ")"
            except ValueError:
                pass
        else:
            meaning = WCPROF_EXIT.get(result.returncode)
            why = f"wcprof exited {result.returncode}" + (f" ({meaning})" if meaning else "")
            if result.message:
                why += f": {result.message}"
        outcome.notes.append(f"{why}; see {config.name}.log")
        return outcome
    if report is None:
        outcome.notes.append(f"{problem}; see {config.name}.log")
        return outcome
    if baseline is None:
        outcome.gate = "NEW"
        return outcome
    _compare(outcome, gated, threshold)
    return outcome


def _pct(fraction: float) -> str:
    """+12.34% (worse), -1.20% (better), 0.00%."""
    if fraction == float("inf"):
        return "+inf%"
    text = f"{100 * fraction:+.2f}%"
    return "0.00%" if text in ("+0.00%", "-0.00%") else text


def _fmt_value(metric, value: int | None) -> str:
    if value is None:
        return "n/a"
    return fmt_tokens(value) if metric.unit == "tokens" else fmt_bytes(value)


def _old_new(old: str | None, new: str | None) -> str:
    if old is None and new is None:
        return "—"
    if old is None:
        return str(new)
    if new is None:
        return f"{old} → —"
    return f"{old} → {new}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _row(o: Outcome) -> str:
    def read(report: Report | None, name: str) -> str | None:
        return None if report is None else fmt_bytes(METRICS[name].read(report))

    verdict_old = o.old.verdict if o.old is not None else None
    verdict_new = o.new.verdict if o.new is not None else None
    if verdict_old == verdict_new:
        verdict_old = None
    change = "—"
    if o.worst is not None:
        change = f"{_pct(o.worst[1])} {o.worst[0]}"
    gate = o.gate if o.gate in ("PASS", "NEW") else f"**{o.gate}**"
    if o.accepted:
        gate += " (accepted)"
    cells = [o.config.name, _old_new(verdict_old, verdict_new),
             _old_new(read(o.old, "need"), read(o.new, "need")),
             _old_new(read(o.old, "kv_flag"), read(o.new, "kv_flag")), change, gate]
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def render_summary(outcomes: list[Outcome], *, threshold: float, gated: list[str],
                   baseline_dir: str, exit_code: int, require_baseline: bool = False,
                   accept: bool = False) -> str:
    """The markdown job summary: one row per configuration, then why each non-PASS row is so."""
    gate_rule = (f"a configuration fails when a gated metric ({', '.join(gated)}) got worse than "
                 f"its baseline in `{baseline_dir}` by more than {100 * threshold:g}%")
    lines = ["## wcprof gate", "",
             f"Gate: {gate_rule}. *change*: the gated metric that got most worse, relative to "
             f"the baseline (+ is worse, for every metric).", "",
             "| config | verdict | need (old → new) | KV flag (old → new) | change | gate |",
             "|---|---|---:|---:|---:|---|"]
    lines += [_row(o) for o in outcomes]
    lines.append("")
    for o in outcomes:
        details: list[str] = []
        if o.gate == "FAIL":
            for name in o.failed:
                m = METRICS[name]
                a, b = m.read(o.old), m.read(o.new)
                details.append(f"{name} ({m.title}) {_fmt_value(m, a)} → {_fmt_value(m, b)}, "
                               f"{_pct(worsening(m, a, b))} worse")
        if o.gate == "NEW":
            details.append("no baseline yet" + (" (--require-baseline: fails)"
                                                if require_baseline and not o.accepted else ""))
        details += o.notes
        if details:
            lines.append(f"- **{o.config.name}** {o.gate}: " + "; ".join(details))
    devices = sorted({f"{o.new.device.name} ({o.new.device.kind}), vLLM {o.new.vllm_version}, "
                      f"wcprof {o.new.tool_version}" for o in outcomes if o.new is not None})
    if devices:
        lines.append(f"- profiled on {'; '.join(devices)}")
    if accept:
        n = sum(o.accepted for o in outcomes)
        lines.append(f"- --accept: {n} report(s) copied into `{baseline_dir}`")
    counts = {v: sum(o.gate == v for o in outcomes) for v in ("PASS", "FAIL", "NEW", "ERROR")}
    tally = ", ".join(f"{n} {v}" for v, n in counts.items() if n)
    lines += ["", f"**Result: {'PASS' if exit_code == 0 else 'FAIL'}** ({tally}; exit {exit_code})",
              ""]
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    """`wcprof gate`'s flags."""
    p = ArgParser(prog="wcprof gate",
                description="profile each configuration of CONFIGS and fail when one got worse "
                            "than its baseline report")
    p.add_argument("configs", metavar="CONFIGS",
                   help="text file, one `[name:] WCPROF ARGS` line per configuration "
                        "(or YAML: a list of {name, args})")
    p.add_argument("--baseline", required=True, metavar="DIR",
                   help="directory of accepted reports, NAME.json")
    p.add_argument("--out", default="wcprof-gate", metavar="DIR",
                   help="where the reports, logs and summary.md go (default ./wcprof-gate)")
    p.add_argument("--max-increase", "--threshold", dest="max_increase", default="5%",
                   metavar="PCT", help="largest tolerated worsening, relative to the baseline "
                                       "(default 5%%)")
    p.add_argument("--metric", action="append", metavar="NAME",
                   help=f"metric(s) to gate, repeatable or comma-separated: {', '.join(METRICS)}, "
                        f"all (default: {', '.join(DEFAULT_GATED)})")
    p.add_argument("--require-baseline", action="store_true",
                   help="a configuration without a baseline fails (default: NEW, passes)")
    p.add_argument("--accept", action="store_true",
                   help="copy the new reports into --baseline (accept them as the new baseline)")
    p.add_argument("--timeout", type=float, default=3600.0, metavar="S",
                   help="seconds one profile run may take (default 3600)")
    return p


def _directories(ns: argparse.Namespace) -> tuple[Path, Path]:
    """OUT and BASELINE, checked and made writable before anything is profiled; OUT loses the
    last run's summary (a run that dies must not leave it)."""
    out, baseline_dir = Path(ns.out), Path(ns.baseline)
    if baseline_dir.exists() and not baseline_dir.is_dir():
        raise ConfigError(f"--baseline {baseline_dir} is not a directory")
    if out.resolve() == baseline_dir.resolve():
        raise ConfigError("--out and --baseline are the same directory",
                          hint="the gate would overwrite the baselines it compares against; "
                               "use --accept to update them")
    _prepare_dir(out, "output directory")
    (out / "summary.md").unlink(missing_ok=True)
    if ns.accept:
        _prepare_dir(baseline_dir, "baseline directory")
    return out, baseline_dir


def _progress(i: int, n: int, o: Outcome) -> str:
    """One configuration's line on stderr, as soon as it is gated."""
    detail = ""
    if o.new is not None:
        need_old = fmt_bytes(METRICS["need"].read(o.old)) + " → " if o.old is not None else ""
        detail = f" need {need_old}{fmt_bytes(METRICS['need'].read(o.new))}"
    if o.worst is not None:
        detail += f", worst change {_pct(o.worst[1])} {o.worst[0]}"
    if o.gate == "ERROR" and o.notes:
        detail += f" -- {o.notes[0]}"
    return f"wcprof gate [{i}/{n}] {o.config.name}: {o.gate} in {o.seconds:.0f}s{detail}"


def _accept(outcomes: list[Outcome], out: Path, baseline_dir: Path) -> None:
    """--accept: every report that profiled cleanly becomes its configuration's baseline."""
    for o in outcomes:
        if o.gate != "ERROR":
            data = (out / f"{o.config.name}.json").read_bytes()
            write_atomically(baseline_dir / f"{o.config.name}.json", data)
            o.accepted = True


def _publish(summary: str, out: Path) -> None:
    """OUT/summary.md, and the job summary when $GITHUB_STEP_SUMMARY names one."""
    write_atomically(out / "summary.md", summary)
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary:
        try:
            with open(step_summary, "a", encoding="utf-8") as f:
                f.write(summary + "\n")
        except OSError as e:
            print(f"wcprof gate: could not append to $GITHUB_STEP_SUMMARY: {e.strerror or e}",
                  file=sys.stderr)


def run(argv: list[str] | None = None, *, runner: Runner | None = None) -> int:
    """Run the gate. `runner` replaces the subprocess that runs wcprof (tests inject a fake).
    Bad input raises ConfigError (cli.main prints it and exits 2)."""
    ns = parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    threshold = parse_threshold(ns.max_increase)
    gated = parse_metrics(ns.metric)
    if ns.timeout <= 0:
        raise ConfigError(f"bad --timeout {ns.timeout:g}: use a positive number of seconds")
    configs = load_configs(ns.configs)
    out, baseline_dir = _directories(ns)
    baselines: dict[str, Report | None] = {}
    for c in configs:  # every baseline is read before the first (long) profile run
        path = baseline_dir / f"{c.name}.json"
        baselines[c.name] = load(str(path)) if path.exists() else None
    runner = runner or subprocess_runner(ns.timeout)

    outcomes: list[Outcome] = []
    for i, config in enumerate(configs, 1):
        outcomes.append(_gate_one(config, baselines[config.name], out, runner, gated, threshold))
        print(_progress(i, len(configs), outcomes[-1]), file=sys.stderr, flush=True)
    if ns.accept:
        _accept(outcomes, out, baseline_dir)
    failing = [o for o in outcomes
               if o.gate == "ERROR"
               or (o.gate == "FAIL" and not o.accepted)
               or (o.gate == "NEW" and ns.require_baseline and not o.accepted)]
    code = 1 if failing else 0
    _publish(render_summary(outcomes, threshold=threshold, gated=gated,
                            baseline_dir=str(baseline_dir), exit_code=code,
                            require_baseline=ns.require_baseline, accept=ns.accept), out)
    verdict = "PASS" if code == 0 else "FAIL"
    print(f"wcprof gate: {verdict}: " + ", ".join(f"{o.config.name} {o.gate}" for o in outcomes)
          + f"; summary in {out / 'summary.md'}", file=sys.stderr, flush=True)
    return code
