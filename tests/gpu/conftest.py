"""GPU tests: `wcprof --validate` on real engines (vLLM 0.26 on an H200), through bench/gpu_suite.py.

  pytest tests/gpu --results DIR   read DIR/summary.json written by the suite on the GPU host
                                   (staging/device_run.sh packs it into $OUT) and DIR/oom.json
                                   (staging/oom_suite.sh's soaks) if present; runs anywhere.
                                   Repeatable: a later DIR replaces the cases it re-ran.
  pytest tests/gpu                 run the suite here (needs CUDA and vLLM; ~6-9 min), then check

Without --results every test is skipped unless torch.cuda.is_available() and vllm is importable.
The suite runs each engine in its own process (isolation) from one driver (import-time overlap);
the tests only read its summary (helpers: gpu_results.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from gpu_results import CASES, HERE, gpu_available, load_results, load_summary, run_suite


def pytest_addoption(parser):
    parser.addoption("--allowed-gap", action="append", default=None, metavar="NAME",
                     help="a known gap named in a manifest's not_run (e.g. <case>_worst_step)")
    parser.addoption("--allowed-over", action="append", default=None, metavar="CASE=BYTES",
                     help="a case a manifest's exceeded names: its validation measured exactly "
                          "BYTES above the prediction (recorded, with why)")
    parser.addoption("--known-failure", action="append", default=None, metavar="CASE",
                     help="a case a manifest's failed names (a recorded failure, with why): its "
                          "failing tests are expected failures (xfail, not strict)")
    parser.addoption("--results", action="append", default=None, metavar="DIR",
                     help="directory holding bench/gpu_suite.py's summary.json (read, not run); "
                          "repeat it: later directories replace the cases they re-ran")
    parser.addoption("--serve", action="append", default=None, metavar="DIR",
                     help="a bench/serve_run.py folder (DIR/serve.json): test_serve_gpu.py checks "
                          "its `--profiler worstcase` server; repeat it")


def pytest_collection_modifyitems(config, items):
    """test_serve_gpu.py reads served folders only: without --serve it is deselected, with it it
    runs anywhere. The suite's tests need --results or a GPU with vLLM, else they are skipped."""
    served = [i for i in items if Path(str(i.fspath)).name == "test_serve_gpu.py"]
    if served and not config.getoption("--serve"):
        config.hook.pytest_deselected(items=served)
        items[:] = [i for i in items if i not in served]
    if config.getoption("--results") or gpu_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA and vLLM, or --results DIR from bench/gpu_suite.py")
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents and item not in served:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def allowed_over(request) -> dict[str, int]:
    """CASE -> the exact excess a manifest's exceeded records for it."""
    pairs = (a.rsplit("=", 1) for a in request.config.getoption("--allowed-over") or [])
    return {case: int(n) for case, n in pairs}


@pytest.fixture(scope="session")
def suite(request, tmp_path_factory) -> dict:
    given = request.config.getoption("--results")
    if given:
        return load_results([Path(g) for g in given])
    out = tmp_path_factory.mktemp("gpu-suite")
    run_suite(out)
    return load_summary(out)


def pytest_generate_tests(metafunc):
    """`case` runs over the cases the given results hold (a configuration's own suite), or over
    the default suite when it runs here."""
    if "case" not in metafunc.fixturenames:
        return
    given = metafunc.config.getoption("--results")
    if given:  # the --sweep-depth prove cases validate nothing: test_cut_down_gpu.py reads them
        found = load_results([Path(g) for g in given])["by_case"]
        names = sorted(n for n, c in found.items() if "prove" not in (c.get("cli_argv") or []))
    else:
        names = list(CASES)
    metafunc.parametrize("case", names, indirect=True)


FIRST_START_TESTS = ("test_first_start_is_admitted", "test_drafter_case_started_first_time",
                     "test_vlm_case_started_first_time_as_asked")
BOUND_TESTS = ("test_worst_step_from_real_requests_is_within_two_percent",)


@pytest.fixture
def case(request, suite) -> dict:
    name = request.param
    if suite.get("error"):
        pytest.fail(f"the suite did not run: {suite['error']}")
    c = suite["by_case"].get(name)
    if c is None:
        pytest.fail(f"{name} is not in the suite's results (was it requested?)")
    if c["status"] == "skipped":
        pytest.fail(f"{name} was skipped by the suite: {c.get('detail')}")
    # a case that passed only on its restart (its first start refused) fails its first-start
    # tests alone: those are the expected failures; its other tests must pass. One the suite
    # passed on its first start fails a bound only these tests hold (BOUND_TESTS: ratio >= 0.98)
    first = c.get("first_start") is None
    test = request.node.originalname
    restarted = c["status"] == "pass" and not first and test in FIRST_START_TESTS
    over_bound = c["status"] == "pass" and first and test in BOUND_TESTS
    if name in (request.config.getoption("--known-failure") or []) and \
            (c["status"] in ("fail", "timeout") or restarted or over_bound):
        request.node.add_marker(pytest.mark.xfail(
            reason=f"{name}: a failure its manifest records (failed)", strict=False))
    return c
