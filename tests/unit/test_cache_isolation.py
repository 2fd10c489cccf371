"""tests/conftest.py: no test, and no process a test starts, writes the user's sweep cache."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from worstcase_profiler.core.cache import cache_dir


def test_sweep_cache_is_not_the_users():
    user = Path.home() / ".cache" / "worstcase_profiler"
    chosen = cache_dir(None)
    assert chosen is not None and chosen != user
    assert Path(os.environ["XDG_CACHE_HOME"]) != Path.home() / ".cache"


def test_subprocesses_inherit_it():
    code = "from worstcase_profiler.core.cache import cache_dir; print(cache_dir(None))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == str(cache_dir(None))
    assert out != str(Path.home() / ".cache" / "worstcase_profiler")
