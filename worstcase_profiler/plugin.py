"""The vllm.general_plugins entry point. vLLM calls it in every process (API server, engine core,
each worker) before the worker class is resolved, so class-level patches reach every worker."""

from __future__ import annotations

import logging

log = logging.getLogger("vllm.wcprof")


def register() -> None:
    """Install the patches, then check the profiler's environment (WCPROF_PROFILER,
    WCPROF_CONFIG): under `vllm serve` a bad value is one line and exit 2 before the engine
    starts; in Python (LLM(...)) it raises ConfigError from the engine's construction."""
    from . import preflight
    from .adapter.guard import vllm_cli_command
    from .adapter.patches import apply_all
    from .errors import ConfigError

    apply_all()
    try:
        preflight.check_env()
    except ConfigError as e:
        if vllm_cli_command() is not None:
            preflight.die(e)
        raise
