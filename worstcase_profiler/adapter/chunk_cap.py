"""The context-aware chunk cap's measurements, its carriage to the scheduler, and the scheduler
hook (the decision is core/chunk_cap.py's).

Worker side (the budget hook, adapter/startup.py), when the `chunk_cap` setting is on:
  `measure`           after the sweep and the advisor, on a provisional KV cache through the
                      sweep's own StepDriver: the steps the cap's bound needs that the sweep did
                      not run, and the two timed prefill steps at long context (an untimed run
                      first, as the advisor's); then core.chunk_cap.decide;
  `size_workspace`    every WorkspaceManager slot sized to what the capped steps ask (scaled as
                      the advisor scales it), before the held memory is read: the admission
                      then counts the capped workspace, and the lock after warm-up turns any
                      step asking more into a loud error;
  `publish`           rank 0 writes the levels to a small file named after the engine's
                      vllm_config.instance_id (the guard's directory scheme).

Engine-core side: vLLM's Scheduler runs in the engine-core process (the worker runs there too
with one rank, in worker processes otherwise). It is built after the KV cache is initialised, so
after the budget hook published the cap: the wrapped `Scheduler.__init__` reads the file (the
profiler on with chunk_cap and no file is an error: scheduling uncapped would run steps the KV
budget did not leave room for). The wrapped `Scheduler._reserve_prefill_lookahead` (vLLM calls
it for every request it schedules, running and waiting, with the request's num_computed_tokens
and the tokens it is about to schedule, just before allocating its blocks) clamps the tokens so
that the step holds at most rows(ctx) tokens in all for the longest ctx among its requests.
Tokens a request is granted and then not scheduled still count: the clamp can only be stricter.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

from ..core import chunk_cap as core
from ..core.shapes import Limits
from ..core.sweep import split_buildable
from ..core.timing import PhaseTimer
from ..core.types import ChunkCapMeasurements, ChunkCapPlan, SweepResult, Workspace
from ..errors import ConfigError, WcprofError
from ..settings import ProfilerSettings, resolve
from . import workspace as ws
from .guard import _safe, base_dir

log = logging.getLogger("vllm.wcprof")

CAP_ATTR = "_wcprof_chunk_cap"  # the levels kept on the Scheduler object


def check_supported(settings: ProfilerSettings, vllm_config=None, *, cuda: bool = False) -> None:
    """Refuse a start with the cap, naming why, wherever the budget would assume a cap nobody
    enforces or steps it does not bound run:

    * vLLM's Scheduler._reserve_prefill_lookahead is absent (vLLM 0.32 and 0.33 have it);
    * CUDA: vLLM's warm-ups after the KV cache exists (a compiled model's at
      max_num_batched_tokens, FlashInfer's autotune) run full-chunk steps the capped admission
      does not hold, and regrow the workspace slots the cap shrank; not run on a GPU;
    * chunked prefill off: vLLM schedules a prompt whole, and the clamp would split it;
    * a Mamba hybrid in "align" mode (prefix caching): its chunks must end on a block boundary,
      which the clamp, applied after vLLM's alignment, does not keep;
    * data parallelism: the cap reaches each engine core through rank 0's file only."""
    if settings.chunk_cap is None:
        return
    why = None
    if cuda:
        why = ("on CUDA vLLM's warm-ups after the KV cache exists run full-chunk steps the "
               "capped admission does not hold (not run on a GPU)")
    elif vllm_config is not None:
        # vllm-touch: worker-config
        sched, cache = vllm_config.scheduler_config, vllm_config.cache_config
        if not getattr(sched, "enable_chunked_prefill", True):
            why = "chunked prefill is off: vLLM schedules each prompt whole"
        elif getattr(cache, "mamba_cache_mode", None) == "align" and \
                getattr(vllm_config.model_config, "is_hybrid", False):
            why = ("this hybrid's recurrent state caches in 'align' mode, whose chunks must end "
                   "on a block boundary the clamp does not keep")
        elif int(getattr(vllm_config.parallel_config, "data_parallel_size", 1) or 1) > 1:
            why = "data parallelism: only rank 0 hands the cap to its engine core"
    if why is not None:
        raise ConfigError(f"chunk_cap is set, but {why}",
                          hint="unset chunk_cap (the static --max-num-batched-tokens the advisor "
                               "names bounds the worst step everywhere)")
    # vllm-touch: scheduler-chunk-cap
    from vllm.v1.core.sched.scheduler import Scheduler

    if getattr(Scheduler._reserve_prefill_lookahead, "_wcprof_original", None) is None:
        raise ConfigError("chunk_cap is set but this vLLM's scheduler has no "
                          "_reserve_prefill_lookahead to clamp (vLLM 0.32 and 0.33 have it)",
                          hint="unset chunk_cap, or use vLLM 0.32")


def measure(driver, limits: Limits, sweep: SweepResult, settings: ProfilerSettings,
            clock: PhaseTimer | None = None) -> ChunkCapMeasurements | None:
    """The cap's measurements when the `chunk_cap` setting asks for them, else None."""
    rows = settings.chunk_cap
    if rows is None:
        return None
    try:
        core.check_rows(limits, rows)
    except ValueError as e:
        raise ConfigError(str(e), hint="pass a chunk_cap between max_num_seqs and "
                                       "max_num_batched_tokens - 1") from e
    clock = clock or PhaseTimer()
    missing = core.missing_shapes(limits, sweep, rows, context_ladder=settings.context_ladder)
    missing, skipped = split_buildable(driver, missing)
    t0 = time.perf_counter()
    with clock("chunk_cap"), driver.provisional_kv():
        steps = tuple(driver.measure(shape) for shape in missing)
        timings = []
        for shape in core.timing_shapes(limits, rows):
            driver.measure(shape)  # untimed: the timed run below finds its kernels ready
            timings.append(driver.measure(shape))
    seconds = time.perf_counter() - t0
    log.info("[wcprof] chunk cap %d: %d step(s) the sweep had not run, 2 timed, in %.1fs",
             rows, len(steps), seconds)
    return ChunkCapMeasurements(rows=rows, steps=steps, timings=tuple(timings), seconds=seconds,
                                skipped=skipped)


def size_workspace(workspace: Workspace, plan: ChunkCapPlan) -> Workspace:
    """Every slot sized to the capped workspace (the grown slots scaled by plan.workspace_bytes
    against what they hold now); unchanged where there is no manager or nothing to shrink."""
    mgr = ws.manager()
    if mgr is None or not workspace.total_bytes or plan.workspace_bytes >= workspace.total_bytes:
        return workspace
    sizes = ws.slot_sizes(mgr)
    top = max(sizes, default=0)
    target = -(-top * plan.workspace_bytes // workspace.total_bytes)
    slots = ws.resize_all_slots(mgr, target)
    return Workspace(slots=tuple(slots), total_bytes=ws.total_bytes(mgr))


# --- carrying the levels to the scheduler ----------------------------------------------------

def cap_path(instance_id: str, base: Path | None = None) -> Path:
    return (base or base_dir()) / f"wcprof-cap-{os.getuid()}-{_safe(instance_id)}.json"


def publish(vllm_config, levels: tuple[tuple[int, int], ...], rank: int) -> None:
    """Rank 0 writes the levels where the engine core's scheduler reads them."""
    if rank != 0:
        return
    # vllm-touch: worker-config
    path = cap_path(str(vllm_config.instance_id))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"levels": [list(lv) for lv in levels]}))
    os.replace(tmp, path)
    log.info("[wcprof] chunk cap: %s", describe(levels))


def load(vllm_config) -> tuple[tuple[int, int], ...]:
    path = cap_path(str(vllm_config.instance_id))
    try:
        data = json.loads(path.read_text())
        levels = tuple((int(c), int(r)) for c, r in data["levels"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise WcprofError(f"chunk_cap is set but the cap this engine's workers decided could not "
                          f"be read from {path} ({e}): refusing to schedule without it, since "
                          "the KV budget was admitted for capped steps",
                          hint="unset chunk_cap, or keep the profiler's temporary directory "
                               "(WCPROF_GUARD_DIR) shared by the engine's processes") from e
    if not levels:
        raise WcprofError(f"chunk_cap: {path} holds no levels")
    return levels


def describe(levels) -> str:
    parts, lo = [], 0
    for up_to, rows in levels:
        parts.append(f"ctx {lo}..{up_to}: {rows} tokens")
        lo = up_to + 1
    return "; ".join(parts) + " (a step, at its longest request's context)"


# --- the scheduler hook ----------------------------------------------------------------------

class StepBudget:
    """One step's running figures: the step it belongs to, the tokens granted so far and the
    tightest cap among the contexts seen."""

    __slots__ = ("step", "used", "limit")

    def __init__(self, step: int, limit: int) -> None:
        self.step, self.used, self.limit = step, 0, limit


def clamp(levels, limit: int, used: int, context: int, tokens: int) -> tuple[int, int]:
    """(the step's tightest cap with this request's, the tokens a request at `context` may add
    to a step already holding `used`): at most that cap less what the step holds."""
    limit = min(limit, core.rows_at(levels, context))
    return limit, max(0, min(tokens, limit - used))


def _init_wrapper(orig):
    def __init__(self, vllm_config, *args, **kwargs):
        orig(self, vllm_config, *args, **kwargs)
        settings = resolve(getattr(vllm_config, "additional_config", None))
        levels = None
        if settings.enabled and settings.chunk_cap is not None:
            levels = load(vllm_config)
            log.info("[wcprof] scheduler: chunk cap on: %s", describe(levels))
        # vllm-touch: scheduler-chunk-cap
        setattr(self, CAP_ATTR, levels)
        self._wcprof_step_budget = None

    return __init__


def _lookahead_wrapper(orig):
    def _reserve_prefill_lookahead(self, request, num_computed_tokens, num_new_tokens):
        levels = getattr(self, CAP_ATTR, None)
        if not levels:
            return orig(self, request, num_computed_tokens, num_new_tokens)
        # vllm-touch: scheduler-chunk-cap
        step = self.current_step
        state = self._wcprof_step_budget
        if state is None or state.step != step:
            state = self._wcprof_step_budget = StepBudget(step, self.max_num_scheduled_tokens)
        state.limit, allowed = clamp(levels, state.limit, state.used, int(num_computed_tokens),
                                     int(num_new_tokens))
        granted = orig(self, request, num_computed_tokens, allowed) if allowed else 0
        state.used += granted
        return granted

    return _reserve_prefill_lookahead


def install() -> bool:
    """Wrap the Scheduler's __init__ and _reserve_prefill_lookahead (pass-through unless the
    profiler and chunk_cap are on for that engine). False where already done or absent."""
    # vllm-touch: scheduler-chunk-cap
    try:
        from vllm.v1.core.sched.scheduler import Scheduler
    except ImportError:
        return False
    if "_reserve_prefill_lookahead" not in Scheduler.__dict__ \
            or getattr(Scheduler.__init__, "_wcprof_original", None) is not None:
        return False
    for name, make in (("__init__", _init_wrapper),
                       ("_reserve_prefill_lookahead", _lookahead_wrapper)):
        orig = Scheduler.__dict__[name]
        wrapped = make(orig)
        wrapped.__name__, wrapped.__doc__ = orig.__name__, orig.__doc__
        wrapped._wcprof_original = orig
        setattr(Scheduler, name, wrapped)
    return True
