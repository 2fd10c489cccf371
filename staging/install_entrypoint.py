#!/usr/bin/env python3
"""Register worstcase_profiler's entry points for a checkout used through PYTHONPATH.

vLLM loads general plugins with importlib.metadata.entry_points(group="vllm.general_plugins")
(vllm/plugins/__init__.py, identical in 0.26 / 0.32 / 0.33). On the air-gapped GPU host the
project cannot be pip-installed (no wheels, no build backend there), so it runs from the checkout
via PYTHONPATH=$PWD, and nothing advertises the entry point: the plugin would silently not load.
This writes a metadata-only distribution, worstcase_profiler-<version>.dist-info (METADATA,
entry_points.txt taken from pyproject.toml, INSTALLER), into --target, a directory on sys.path
(e.g. /tmp/site, which .stage/env.sh puts on PYTHONPATH). importlib.metadata scans every sys.path
entry for *.dist-info, so every Python process with --target on its path then finds the plugin.

  python3 staging/install_entrypoint.py --target /tmp/site      # write, then verify in a subprocess
  python3 staging/install_entrypoint.py --target /tmp/site --remove
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAME = "worstcase_profiler"
FIXTURES = ROOT / "plugins" / "wcp_fixtures"  # --fixtures: also the fixture models' plugin


def _pyproject(root: Path = ROOT) -> dict:
    text = (root / "pyproject.toml").read_text()
    try:
        import tomllib
    except ImportError:  # Python < 3.11: the few fields we need, by hand
        version = re.search(r'^version\s*=\s*"([^"]+)"', text, re.M).group(1)
        name = re.search(r'^name\s*=\s*"([^"]+)"', text, re.M).group(1)
        plug = re.search(rf'^{name}\s*=\s*"([^"]+)"', text.split("vllm.general_plugins")[1], re.M)
        script = re.search(r'^wcprof\s*=\s*"([^"]+)"', text, re.M)
        return {"name": name, "version": version,
                "entry-points": {"vllm.general_plugins": {name: plug.group(1)}},
                **({"scripts": {"wcprof": script.group(1)}} if script else {})}
    return tomllib.loads(text)["project"]


def entry_points_txt(project: dict) -> str:
    groups = dict(project.get("entry-points", {}))
    if project.get("scripts"):
        groups["console_scripts"] = project["scripts"]
    out = []
    for group, eps in sorted(groups.items()):
        out.append(f"[{group}]")
        out += [f"{k} = {v}" for k, v in sorted(eps.items())]
        out.append("")
    return "\n".join(out)


def install(target: Path, root: Path = ROOT) -> Path:
    project = _pyproject(root)
    name = project["name"]
    target.mkdir(parents=True, exist_ok=True)
    for old in target.glob(f"{name}-*.dist-info"):
        shutil.rmtree(old)
    info = target / f"{name}-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {project['version']}\n"
        f"Summary: entry points only; the package imports from {root} via PYTHONPATH\n")
    (info / "entry_points.txt").write_text(entry_points_txt(project))
    (info / "top_level.txt").write_text(f"{name}\n")
    (info / "INSTALLER").write_text("staging/install_entrypoint.py\n")
    return info


def verify(target: Path) -> str:
    """In a fresh interpreter with target and the checkout on sys.path: the entry point exists
    and resolves to this checkout's register()."""
    code = ("import sys; from importlib.metadata import entry_points; "
            f"eps=[e for e in entry_points(group='vllm.general_plugins') if e.name=={NAME!r}]; "
            "assert eps, 'entry point not found'; f=eps[0].load(); import inspect; "
            "print(eps[0].value, '->', inspect.getsourcefile(f))")
    env_path = [str(target), str(ROOT)]
    import os

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(env_path + [os.environ.get("PYTHONPATH", "")]))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    if res.returncode != 0:
        raise SystemExit(f"entry point check failed:\n{res.stderr.strip()[-2000:]}")
    where = res.stdout.strip()
    if str(ROOT) not in where:
        raise SystemExit(f"entry point resolves outside this checkout: {where}")
    return where


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", type=Path, required=True, help="a directory on PYTHONPATH")
    p.add_argument("--remove", action="store_true")
    p.add_argument("--no-verify", action="store_true")
    p.add_argument("--fixtures", action="store_true",
                   help=f"also register {FIXTURES.relative_to(ROOT)} (put it on PYTHONPATH too)")
    a = p.parse_args()
    if a.remove:
        for old in a.target.glob(f"{NAME}-*.dist-info"):
            shutil.rmtree(old)
            print(f"removed {old}")
        return 0
    info = install(a.target)
    print(f"wrote {info}")
    if a.fixtures:
        print(f"wrote {install(a.target, FIXTURES)}")
    if not a.no_verify:
        print(f"vllm.general_plugins: {verify(a.target)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
