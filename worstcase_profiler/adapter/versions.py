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

