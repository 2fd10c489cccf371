"""For every test session: the sweep cache lives in a temporary directory, never in the user's
~/.cache/worstcase_profiler. Set in os.environ, so every subprocess a test starts (wcprof, vLLM
engines, their workers) inherits it; a test that wants its own cache passes its own
WCPROF_CACHE_DIR (tests/cpu/conftest.engine_env defaults it to "off").

XDG_CACHE_HOME moves too (the cache's fallback when WCPROF_CACHE_DIR is unset), while the
caches other tools find through it (Hugging Face, vLLM) stay where they were. A session that
wants its sweeps kept across runs (a GPU box) names a directory in WCPROF_TEST_CACHE_DIR."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

_KEYS = ("WCPROF_CACHE_DIR", "XDG_CACHE_HOME", "HF_HOME", "VLLM_CACHE_ROOT")


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
