"""The installed vLLM and what it offers. Hook lines per version: docs/vllm-hooks.md."""

from __future__ import annotations

import functools
import re


@functools.cache
def vllm_version() -> str:
    # vllm-touch: worker-config
    import vllm

    return getattr(vllm, "__version__", "unknown")


@functools.cache
def version_tuple() -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", vllm_version())
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def unsupported(hook: str, detail: str):
    """The error that refuses a start on a vLLM whose internals differ from what the adapter
    knows: it names the hook, the vLLM version, and how to start without the profiler."""
    from ..errors import UnsupportedModel

    return UnsupportedModel(
        f"vLLM {vllm_version()}: {detail} (hook: {hook})",
        hint="this vLLM's internals differ from those worstcase_profiler knows "
             "(docs/compatibility.md): start without the profiler (drop --profiler worstcase, "
             "unset WCPROF_PROFILER) or use a vLLM version listed there")
