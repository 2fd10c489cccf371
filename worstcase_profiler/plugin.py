"""The vllm.general_plugins entry point. vLLM calls it in every process (API server, engine core,
each worker) before the worker class is resolved, so class-level patches reach every worker."""

from __future__ import annotations

import logging

log = logging.getLogger("vllm.wcprof")


def register() -> None:
    from .adapter.patches import apply_all

    apply_all()
