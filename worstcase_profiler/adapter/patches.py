"""Every monkeypatch worstcase_profiler applies to vLLM, documented like vllm-ascend's patch/
package: what is patched, why, and on which versions it was verified. Line numbers are in
docs/vllm-hooks.md. Worker patches are pass-through unless the profiler is enabled for that
engine (settings resolved per worker from additional_config and the environment), so a disabled
profiler changes nothing.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass
from typing import Callable

from ..errors import ConfigError
from ..settings import CONFIG_KEY, PROFILER_CHOICES, ProfilerSettings, resolve

log = logging.getLogger("vllm.wcprof")


@dataclass(frozen=True)
class Patch:
    name: str
    target: str
    what: str
    why: str
    versions: str


def settings_of(worker) -> ProfilerSettings:
    cached = getattr(worker, "_wcprof_settings", None)
    if cached is None:
        cached = resolve(getattr(worker.vllm_config, "additional_config", None))
        worker._wcprof_settings = cached
    return cached


def _wrap_method(cls, name: str, make: Callable) -> bool:
    orig = cls.__dict__.get(name)
    if orig is None or getattr(orig, "_wcprof_original", None) is not None:
        return False
    wrapped = make(orig)
    wrapped._wcprof_original = orig
    setattr(cls, name, wrapped)
    return True


def _budget_wrapper(orig):
    @functools.wraps(orig)
    def determine_available_memory(self):
        settings = settings_of(self)
        if not settings.enabled:
            return orig(self)
        from . import engine

        return engine.determine_available_memory(self, orig, settings)

    return determine_available_memory


def _init_wrapper(orig):
    @functools.wraps(orig)
    def initialize_from_config(self, kv_cache_config):
        settings = settings_of(self)
        if not settings.enabled:
            return orig(self, kv_cache_config)
        from . import engine

        return engine.initialize_from_config(self, orig, kv_cache_config, settings)

    return initialize_from_config


def _warmup_wrapper(orig):
    @functools.wraps(orig)
    def compile_or_warm_up_model(self, *a, **kw):
        t0 = time.perf_counter()
        out = orig(self, *a, **kw)
        settings = settings_of(self)
        if settings.enabled:
            from . import engine

            engine.after_warm_up(self, settings, time.perf_counter() - t0)
        return out

    return compile_or_warm_up_model


def _worker_classes():
    from vllm.platforms import current_platform

    from vllm.v1.worker.gpu_worker import Worker

    classes = [Worker]
    if current_platform.is_cpu():  # cpu_worker imports CPU-only ops: only import it there
        from vllm.v1.worker.cpu_worker import CPUWorker

        classes.append(CPUWorker)
    return classes


def _patch_workers() -> bool:
    changed = False
    for cls in _worker_classes():
        changed |= _wrap_method(cls, "determine_available_memory", _budget_wrapper)
        changed |= _wrap_method(cls, "initialize_from_config", _init_wrapper)
        changed |= _wrap_method(cls, "compile_or_warm_up_model", _warmup_wrapper)
    return changed


def _patch_cli() -> bool:
    from vllm.engine.arg_utils import EngineArgs

    if getattr(EngineArgs, "_wcprof_cli", False):
        return False
    orig_add = EngineArgs.add_cli_args
    orig_from = EngineArgs.__dict__["from_cli_args"].__func__

    def add_cli_args(parser, *a, **kw):
        parser = orig_add(parser, *a, **kw)
        if not any("--profiler" in act.option_strings for act in parser._actions):
            parser.add_argument(
                "--profiler", choices=PROFILER_CHOICES, default=None,
                help="KV-cache admission profile: 'worstcase' sizes the KV cache from synthetic "
                     "steps at max_model_len KV extent (worstcase_profiler plugin).")
            parser.add_argument(
                "--profiler-report", metavar="PATH", default=None,
                help="where worstcase_profiler writes its JSON report.")
        return parser

    def from_cli_args(cls, args):
        engine_args = orig_from(cls, args)
        choice = getattr(args, "profiler", None)
        path = getattr(args, "profiler_report", None)
        if choice is None and path is None:
            return engine_args
        if choice is None:
            raise ConfigError("--profiler-report needs --profiler worstcase")
        extra = dict(engine_args.additional_config or {})
        section = extra.get(CONFIG_KEY)
        section = {"profiler": section} if isinstance(section, str) else dict(section or {})
        section["profiler"] = choice
        if path:
            section["json_path"] = path
        extra[CONFIG_KEY] = section
        engine_args.additional_config = extra
        return engine_args

    EngineArgs.add_cli_args = staticmethod(add_cli_args)
    EngineArgs.from_cli_args = classmethod(from_cli_args)
    EngineArgs._wcprof_cli = True
    return True


# The registry is documentation that ships with the code (and what `apply_all` below installs).
PATCHES: tuple[Patch, ...] = (
    Patch(
        name="worker-budget",
        target="vllm.v1.worker.gpu_worker.Worker.determine_available_memory, "
               "vllm.v1.worker.cpu_worker.CPUWorker.determine_available_memory (overrides, no super)",
        what="calls the original (the stock figure), then runs the worst-case sweep and returns the "
             "worst-case budget; on CUDA the Python heap is frozen from before the original until "
             "the held-memory measurement (engine.profile_on_frozen_heap), so the full collections "
             "of vLLM's memory_profiling and of the profiler walk only new objects",
        why="the stock profile runs one max_num_batched_tokens step on an empty KV cache with no "
            "attention metadata, so context-scaled memory is never seen (seed 002); each full "
            "collection of a vLLM process costs 0.3-0.5 s of every start (H200 runs 9 and 10)",
        versions="0.26 (GPU), 0.32 (CPU) verified; 0.33 by reading. 0.26's V1 "
                 "profile_cudagraph_memory unfreezes the heap inside the original (_freeze_gc): "
                 "it is frozen again after it (unit-tested; not run on a GPU with V1 graphs)"),
    Patch(
        name="worker-kv-audit",
        target="vllm.v1.worker.gpu_worker.Worker.initialize_from_config (CPUWorker inherits it)",
        what="sums the storages KV initialisation actually allocated and compares with the budget",
        why="nothing checked that KV initialisation stays within its budget (seed 000: 8.5x)",
        versions="0.26, 0.32 verified; 0.33 by reading"),
    Patch(
        name="worker-workspace-lock",
        target="Worker.compile_or_warm_up_model, CPUWorker.compile_or_warm_up_model",
        what="after warm-up, audits what warm-up kept resident (CUDA graphs) against what admission "
             "set aside, caching the figure for the next start and failing this one beyond the "
             "margin; then locks the WorkspaceManager (all slots already grown to the worst case)",
        why="0.26's V2 runner estimates CUDA-graph memory as 0 (404 MiB on the H200 Llama, outside "
            "every budget); vLLM locks only when CUDA graphs are captured (never in eager mode, "
            "never on 0.26's V2 runner); unlocked growth takes memory promised to the KV cache",
        versions="0.26, 0.32 verified"),
    Patch(
        name="serve-profiler-flag",
        target="vllm.engine.arg_utils.EngineArgs.add_cli_args / from_cli_args",
        what="adds exact --profiler {default,worstcase} and --profiler-report PATH options and "
             "carries them to every process through additional_config",
        why="without an exact option argparse abbreviates --profiler to --profiler-config and fails",
        versions="0.26, 0.32 verified"),
)


def apply_all() -> None:
    """Idempotent; called from the vllm.general_plugins entry point in every process."""
    try:
        _patch_cli()
    except Exception:  # noqa: BLE001 - a CLI patch failure must not break a disabled engine
        log.exception("worstcase_profiler: could not add --profiler to vLLM's CLI")
    _patch_workers()
