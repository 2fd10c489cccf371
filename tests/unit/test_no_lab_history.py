"""The package states contracts, not lab history (issue 35 point 6): no source file under
worstcase_profiler/ names the GPU host a figure came from (H200), an investigation run
("run 19", "runs 21-25", "h200-run37") or an incident seed ("seed 002", "seed-000"). The
evidence for a constant or rule lives in docs/ (docs/sweep.md, docs/vllm-hooks.md,
docs/results/); the code says the mechanism.

WCPROF_LAB_SCAN_ROOT points the scan at another checkout's package (to check that the test
catches what it should on an older tree)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path(os.environ.get("WCPROF_LAB_SCAN_ROOT", ROOT)) / "worstcase_profiler"

# A count after "run(s)" that is a quantity, not a run's number: "runs 2 steps", "run 8 requests".
_COUNTED = (r"steps?|times?|requests?|shapes?|rows?|layers?|tokens?|prompts?|sequences?|"
            r"iterations?|replays?|chunks?|blocks?|graphs?|passes|more|of|x)\b")

LAB = (
    ("a lab host", re.compile(r"(?<![A-Za-z0-9])h200(?![0-9])", re.IGNORECASE)),
    ("an investigation run", re.compile(
        r"\bruns?\s+\d+(?:\s*[-\u2013,]\s*\d+)*\b(?!\s*[.,]?\d)(?!\s*[+*/\u00d7])"
        r"(?!\s+(?:" + _COUNTED + r")",
        re.IGNORECASE)),
    ("an investigation run", re.compile(r"\brun\d+\b", re.IGNORECASE)),
    ("an incident seed", re.compile(r"\bseeds?[\s_-]*0\d\d?\b", re.IGNORECASE)),
)


def lab_references(text: str) -> list[tuple[int, str, str]]:
    """(line, what, matched text) for every lab reference in `text`."""
    found = []
    for what, pattern in LAB:
        for m in pattern.finditer(text):
            found.append((text.count("\n", 0, m.start()) + 1, what, " ".join(m.group().split())))
    return sorted(found)


def test_no_source_file_carries_lab_history():
    files = sorted(PACKAGE.rglob("*.py"))
    assert files, PACKAGE
    hits = [f"{path.relative_to(PACKAGE.parent)}:{line}: {what}: {matched!r}"
            for path in files
            for line, what, matched in lab_references(path.read_text(encoding="utf-8"))]
    assert not hits, ("lab history in the package (say the mechanism; the evidence belongs in "
                      "docs/):\n" + "\n".join(hits))


@pytest.mark.parametrize("text", [
    "short by 76 MiB on the H200", "RUN = '0.26 (CUDA, h200)'", "(Qwen3.5 + MTP, run 19)",
    "runs 21-25, no compile", "(run 19-20)", "which H200 run\n    23 saw", "h200-run37: 225",
    "see run37", "(seed 002)", "seed 000's 6 GiB", "seed-000", "Seed 002: a second lane",
])
def test_the_scan_finds_each_kind_of_lab_reference(text):
    assert lab_references(text), text


@pytest.mark.parametrize("text", [
    "run_s", "runs_compiled", "a dry run", "runs every shape", "run_cut_down's figure",
    "the sampler runs 2 steps", "run 8 requests at once", "runs 1 + k rows", "def ids(seed: int)",
    "seeds=seeds", "each seed segment", "0.32 (CUDA)", "run missing_shapes first",
    "for run in range(3)", "(running and waiting)",
])
def test_ordinary_words_and_identifiers_are_not_lab_references(text):
    assert lab_references(text) == [], text
