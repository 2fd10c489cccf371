"""What the measurement tools in bench/ share: the repository root, the environment of an engine
subprocess, the profiler's additional_config, JSON written atomically, error lines, medians,
byte formatting and markdown tables. Imports neither torch nor vLLM (the GPU suite's driver
must not)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MiB = 1 << 20
GiB = 1 << 30


def engine_env(**extra: str) -> dict[str, str]:
    """This process's environment for an engine subprocess: the engine core in-process (its
    worker's objects are reachable) and unbuffered output, plus `extra`."""
    return {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "PYTHONUNBUFFERED": "1", **extra}


def run_child(cmd: list[str], marker: str, *, timeout_s: float, log_match: str | tuple[str, ...],
              log_key: str, log_lines: int, forked=None) -> dict:
    """Run an engine subprocess (engine_env, from the repository root) that prints its result as
    one line `MARKER {json}`: that JSON plus wall_s and, under log_key, up to log_lines output
    lines holding log_match (or any of a tuple of them; where more do, the first half and the
    last); or {"error", "wall_s", "tail"} when it failed or printed no such line, with
    "timed_out": True as well where it ran past timeout_s.
    `forked`: a function of an argv (cmd[2:], cmd being [python, script, *argv]) returning an exit
    code, run in a fork of this process instead of a fresh interpreter (run_forked)."""
    t0 = time.perf_counter()
    if forked is not None:
        rc, out = run_forked(forked, cmd[2:], timeout_s)
        err = ""
    else:
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, env=engine_env(), cwd=ROOT,
                               timeout=timeout_s)
            rc, out, err = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired as e:
            rc, err = None, ""
            out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
    wall = time.perf_counter() - t0
    if rc is None:
        return {"error": f"timed out after {timeout_s:.0f}s", "timed_out": True, "wall_s": wall,
                "tail": out.splitlines()[-30:]}
    lines = [ln for ln in out.splitlines() if ln.startswith(marker + " ")]
    if rc != 0 or not lines:
        return {"error": f"rc={rc}", "wall_s": wall, "tail": (out + err).splitlines()[-30:]}
    matches = (log_match,) if isinstance(log_match, str) else log_match
    logged = [ln for ln in (out + err).splitlines() if any(m in ln for m in matches)]
    if len(logged) > log_lines:  # the first lines and the last (the audits come last)
        head = log_lines // 2
        logged = [*logged[:head], f"... {len(logged) - log_lines} line(s) left out ...",
                  *logged[head - log_lines:]]
    return {**json.loads(lines[-1][len(marker) + 1:]), "wall_s": wall, log_key: logged}


def run_forked(fn, argv: list[str], timeout_s: float) -> tuple[int | None, str]:
    """`fn(argv)` in a fork of this process: (its exit code, or None past timeout_s; its stdout
    and stderr as one text). The child runs in a session of its own, from the repository root,
    with engine_env's variables, and leaves by os._exit once fn returns (no interpreter
    teardown); then, or at the timeout, everything in its session is killed (SIGKILL), so no
    helper it started (a compile worker) outlives it. What a fork saves is the interpreter's
    start and its imports, made once in this process: a benchmark that forks must import only
    what every start imports anyway, and must not have initialised CUDA (a forked child cannot
    use a context its parent made)."""
    import select
    import signal
    import sys
    import traceback

    sys.stdout.flush()  # else what this process had buffered is written again by the child
    sys.stderr.flush()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        rc = 1
        try:
            os.setsid()
            os.dup2(w, 1)
            os.dup2(w, 2)
            os.close(r)
            os.close(w)
            sys.stdout = open(1, "w", buffering=1, closefd=False)  # the fds, whatever this
            sys.stderr = open(2, "w", buffering=1, closefd=False)  # process had bound them to
            os.chdir(ROOT)
            os.environ.update(engine_env())
            rc = fn(argv)
            rc = 0 if rc is None else rc  # as an interpreter exits from a script's end
        except SystemExit as e:  # as the interpreter exits on sys.exit(code)
            rc = 0 if e.code is None else e.code
            if not isinstance(rc, int):
                print(rc, file=sys.stderr)  # sys.exit("why"): printed, exit code 1
                rc = 1
        except BaseException:  # noqa: BLE001 - the child reports every failure as its output
            traceback.print_exc()
        finally:
            try:
                for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
                    if stream is not None:  # the originals: what a log handler bound at import
                        stream.flush()
            finally:
                os._exit(rc if isinstance(rc, int) else 1)
    os.close(w)
    chunks: list[bytes] = []
    deadline, status = time.monotonic() + timeout_s, None
    try:
        while status is None and time.monotonic() < deadline:
            ready, _, _ = select.select([r], [], [], max(0.0, min(0.5, deadline - time.monotonic())))
            if ready and (data := os.read(r, 1 << 16)):
                chunks.append(data)
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status = st
        if status is None:  # one last look: a child that ended at the deadline is no timeout
            done, st = os.waitpid(pid, os.WNOHANG)
            status = st if done else None
    finally:
        try:
            os.killpg(pid, signal.SIGKILL)  # the child at a timeout, its helpers always
        except ProcessLookupError:
            pass
        if status is None:
            status = os.waitpid(pid, 0)[1]
            timed_out = True
        else:
            timed_out = False
        os.set_blocking(r, False)  # what is left in the pipe, not waiting on a writer that
        try:  # escaped the session
            while data := os.read(r, 1 << 16):
                chunks.append(data)
        except BlockingIOError:
            pass
        os.close(r)
    text = b"".join(chunks).decode(errors="replace")
    return (None if timed_out else os.waitstatus_to_exitcode(status)), text


def plugin_problem(entry_points=None, environ=None) -> str | None:
    """Why vLLM started from this Python would not load worstcase_profiler from this checkout,
    or None: it must import from ROOT, have its vllm.general_plugins entry point (the project
    on PYTHONPATH alone has none; staging/install_entrypoint.py writes one), and not be left
    out by $VLLM_PLUGINS. Without the plugin `vllm serve` reads --profiler as its own
    --profiler-config. `entry_points`/`environ`: the group's entries and the environment
    (default: importlib.metadata's, as vLLM reads them, and os.environ)."""
    import sys
    from importlib.util import find_spec

    env = os.environ if environ is None else environ
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))  # the children get it through PYTHONPATH
    spec = find_spec("worstcase_profiler")
    if spec is None or not str(spec.origin).startswith(str(ROOT)):
        return (f"worstcase_profiler does not import from {ROOT} "
                f"(PYTHONPATH={env.get('PYTHONPATH')})")
    if entry_points is None:
        from importlib.metadata import entry_points as found
        entry_points = found(group="vllm.general_plugins")
    if not any(ep.name == "worstcase_profiler" for ep in entry_points):
        return ("no vllm.general_plugins entry point 'worstcase_profiler', so vLLM would not "
                "load the plugin (`vllm serve` would read --profiler as its own "
                "--profiler-config): pip install the project, or on a staged site run "
                "`python3 staging/install_entrypoint.py --target <a dir on PYTHONPATH>` first")
    allowed = env.get("VLLM_PLUGINS")
    if allowed is not None and "worstcase_profiler" not in [p.strip() for p in allowed.split(",")]:
        return f"VLLM_PLUGINS={allowed!r} leaves worstcase_profiler out: vLLM would not load it"
    return None


def worstcase_config(json_path: str, **extra) -> dict:
    """vLLM's additional_config that turns the profiler on and writes its report to json_path."""
    return {"worstcase_profiler": {"profiler": "worstcase", "json_path": json_path, **extra}}


def merged_config(base: dict, more: dict) -> dict:
    """Two vLLM additional_configs as one: base with more's keys, a "worstcase_profiler" dict in
    both merged key by key (more's settings win), so one's profiler settings join the other's
    instead of replacing them."""
    out = {**base, **more}
    wp_base, wp_more = base.get("worstcase_profiler"), more.get("worstcase_profiler")
    if isinstance(wp_base, dict) and isinstance(wp_more, dict):
        out["worstcase_profiler"] = {**wp_base, **wp_more}
    return out


def write_json(path: str | Path, obj, indent: int = 1) -> None:
    """Write obj as JSON through a temporary file, so a reader never sees half of it."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=indent)
    os.replace(tmp, path)


def read_json(path: Path, default=None):
    return json.loads(path.read_text()) if path.exists() else default


def model_vocab(model: str | Path) -> int:
    """vocab_size of a local model directory's config.json (or of its text_config: a VLM's)."""
    cfg = json.loads((Path(model) / "config.json").read_text())
    return int(cfg.get("vocab_size") or cfg["text_config"]["vocab_size"])


def error_line(e: BaseException, limit: int = 400) -> str:
    """`Type: first line of the message` (at most `limit` characters of it)."""
    lines = str(e).splitlines()
    return f"{type(e).__name__}: {lines[0][:limit] if lines else ''}"


def median(values: list) -> float | None:
    return statistics.median(values) if values else None


def fmt(value, spec: str = "{:.3f}", missing: str = "-") -> str:
    return missing if value is None else spec.format(value)


def gib(n, missing: str = "n/a") -> str:
    return missing if n is None else f"{n / GiB:.3f}"


def mib(n, missing: str = "-") -> str:
    return missing if n is None else f"{n / MiB:.2f}"


def md_row(*cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def md_table(headers: list[str], rows: list) -> str:
    """A markdown table: a header row, its rule, then one row per item of rows (cell lists)."""
    return "\n".join([md_row(*headers), "|" + "---|" * len(headers), *(md_row(*r) for r in rows)])
