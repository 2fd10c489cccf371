"""For every test session: the sweep cache lives in a temporary directory, never in the user's
~/.cache/worstcase_profiler. Set in os.environ, so every subprocess a test starts (wcprof, vLLM
engines, their workers) inherits it; a test that wants its own cache passes its own
WCPROF_CACHE_DIR (tests/cpu/conftest.engine_env defaults it to "off").

XDG_CACHE_HOME moves too (the cache's fallback when WCPROF_CACHE_DIR is unset), while the
caches other tools find through it (Hugging Face, vLLM) stay where they were. A session that
wants its sweeps kept across runs (a GPU box) names a directory in WCPROF_TEST_CACHE_DIR.

WCPROF_TEST_FULL=1 (`make test`, whose venv has vLLM, torch and every extra): a test skipped
because an import failed (pytest.importorskip) fails instead, so a missing dependency there
cannot pass as a skip. `make test-unit`'s light venv leaves it unset: there the vLLM and torch
tests skip, each naming the import.

Under pytest-xdist (`make test` runs `-n 2 --dist loadfile`) each worker binds the vLLM CPU
engines it starts to a CPU of its own through VLLM_CPU_OMP_THREADS_BIND (gw0 -> the first CPU
this process may use, gw1 -> the second, ...): vLLM's "auto" binding puts every engine on CPU 0,
so two workers' engines would share one core. Set in os.environ at import, before any engine
subprocess starts, so they all inherit it; a binding the caller set is kept.

With that binding, OMP_NUM_THREADS=1 too (unless the caller set it): an engine bound to one CPU
serves on one thread anyway (vLLM drops torch to 1 thread once the model is loaded), but until
then torch's pool has a thread per host CPU, and on a 2-core host the two workers' pools spin-wait
against each other: a tiny-model `wcprof` took 21 s beside another start and 14 s alone; with
OMP_NUM_THREADS=1, 13.8 s beside another."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

_KEYS = ("WCPROF_CACHE_DIR", "XDG_CACHE_HOME", "HF_HOME", "VLLM_CACHE_ROOT")


def _worker_cpu_bind() -> str | None:
    """This xdist worker's own CPU for VLLM_CPU_OMP_THREADS_BIND, or None outside xdist (or on
    a single-CPU host, where there is nothing to split)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw") or not worker[2:].isdigit():
        return None
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    return str(cpus[int(worker[2:]) % len(cpus)])


if "VLLM_CPU_OMP_THREADS_BIND" not in os.environ and (_bind := _worker_cpu_bind()) is not None:
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = _bind
    os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory):
    saved = {k: os.environ.get(k) for k in _KEYS}
    home_cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    os.environ.setdefault("HF_HOME", str(home_cache / "huggingface"))
    os.environ.setdefault("VLLM_CACHE_ROOT", str(home_cache / "vllm"))
    root = tmp_path_factory.mktemp("wcprof-test-cache")
    # WCPROF_TEST_CACHE_DIR: a cache kept across test sessions (a GPU box reusing its sweeps)
    os.environ["WCPROF_CACHE_DIR"] = (os.environ.get("WCPROF_TEST_CACHE_DIR")
                                      or str(root / "worstcase_profiler"))
    os.environ["XDG_CACHE_HOME"] = str(root / "xdg")
    yield root
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _import_skip(report) -> str | None:
    """The reason of a skip that pytest.importorskip raised, else None."""
    if not report.skipped or os.environ.get("WCPROF_TEST_FULL") != "1":
        return None
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason if "could not import" in reason else None


def _fail_import_skip(report) -> None:
    reason = _import_skip(report)
    if reason is not None:
        report.outcome = "failed"
        report.longrepr = (f"WCPROF_TEST_FULL=1 (make test): skipped on a failed import, which "
                           f"this venv must have: {reason}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail_import_skip(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _fail_import_skip(outcome.get_result())


# `make test` runs -n 2 --dist loadfile --no-loadscope-reorder: xdist hands whole files to the
# two workers in collection order, each file to whichever worker runs out of work first. So the
# longest files go first and the unit tests (many short files) last, where they even out the two
# workers' ends (with xdist's own order, by test count, the unit files went first and a long
# engine file could start last). Seconds per file on the 2-core host under -n 2 beside them; the
# tile start pair (shared_pair, under a file lock) is test_sweep_cache.py's, so
# test_seed_failures.py comes three files later and finds it done instead of waiting on it.
LONGEST_FIRST = (
    "tests/cpu/test_profiler_end_to_end.py",  # 145
    "tests/cpu/test_sweep_cache.py",  # 105
    "tests/cpu/test_bad_input.py",  # 89
    "tests/cpu/test_ci_gate_engine.py",  # 85
    "tests/cpu/test_seed_failures.py",  # 101
    "tests/cpu/test_max_model_len_auto_engine.py",  # 72
    "tests/cpu/test_user_errors.py",  # 58
    "tests/cpu/test_install.py",  # 52
    "tests/cpu/test_drafter_kv_groups.py",  # 46
    "tests/cpu/test_validate_reaches_worst.py",  # 40
    "tests/cpu/test_guard_serve.py",  # 38
    "tests/cpu/test_fixture_models.py",  # 38
    "tests/cpu/test_multimodal_cpu.py",  # 37
    "tests/cpu/test_qwen25vl_cpu.py",  # 35
    "tests/cpu/test_dsv4_cpu.py",  # 35
    "tests/cpu/test_tensor_parallel.py",  # 33
    "tests/cpu/test_context_end_repro.py",  # 32
)  # then the other tests/cpu files (25 s or less each), then tests/unit


def pytest_collection_modifyitems(config, items):
    missing = [p for p in LONGEST_FIRST if not (config.rootpath / p).is_file()]
    if missing:
        raise pytest.UsageError(f"tests/conftest.py LONGEST_FIRST names no such file: {missing}")
    first = {path: i for i, path in enumerate(LONGEST_FIRST)}

    def rank(item) -> tuple[int, int]:
        path = item.nodeid.split("::", 1)[0]
        if path in first:
            return 0, first[path]
        return (1 if path.startswith("tests/cpu/") else 2), 0

    items.sort(key=rank)  # stable: each file's tests stay together and in their order


@pytest.fixture
def read_only_dir(tmp_path) -> Path:
    """A directory this process cannot create files in (root ignores mode bits: /sys then)."""
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o555)
    for candidate in (d, Path("/sys")):
        try:
            fd, probe = tempfile.mkstemp(dir=candidate)
        except OSError:
            return candidate
        os.close(fd)
        os.unlink(probe)
    pytest.skip("no read-only directory available to this user")
