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
    "--compilation-config={cudagraph_mode:FULL}",
    "--speculative-config",                                                  # no value at all
])
def test_a_json_flag_whose_value_is_not_json_is_refused_with_the_fix(extra):
    with pytest.raises(SystemExit, match="is not JSON; quote it inside --extra"):
        serve_run.checked_extra(extra)


def _script_extra(eager: str) -> str:
    """The --extra staging/serve_dsv4.sh builds, read by running its own lines (EXTRA= .. fi)."""
    lines = (ROOT / "staging" / "serve_dsv4.sh").read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("EXTRA="))
    end = next(i for i, ln in enumerate(lines) if i > start and ln.strip() == "fi")
    body = "\n".join(lines[start:end + 1]) + '\nprintf %s "$EXTRA"'
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
