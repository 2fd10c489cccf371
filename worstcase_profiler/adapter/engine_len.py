"""max_model_len: auto, the engine core's side (the worker's is adapter/startup.py's budget hook,
which decides the length with the budget: core/budget.decide over core/fit.apply_longest).

vLLM 0.32's EngineCore._initialize_kv_caches asks the executor for every worker's KV budget
(`Executor.determine_available_memory`), then `get_kv_cache_configs` checks one request at
`vllm_config.model_config.max_model_len` against it and sizes the pool; the ready response
carries that field to the frontend (`min` of the two). The worker's choice reaches the engine
core only by RPC (the worker may be another process), so the executor's method is wrapped:

  measure  each worker's chosen length (Worker.wcprof_rpc "applied_max_model_len": its
           profile's fit.applied_max_model_len)
  decide   core/fit.agreed_max_model_len: the least, never above the configured one
  apply    that length set where vLLM's own auto-fit (`--max-model-len -1`,
           `_auto_fit_max_model_len`) sets it, in place, and sent to the workers with vLLM's own
           `update_max_model_len` (the engine core compares the field only around
           `get_kv_cache_configs`, after this call, so it would not send it itself)

Pass-through unless the profiler is enabled with max_model_len auto for that engine.
"""

from __future__ import annotations

import functools
import logging

from ..core.fit import agreed_max_model_len
from ..errors import DoesNotFit
from ..settings import resolve

log = logging.getLogger("vllm.wcprof")

RPC_OP = "applied_max_model_len"


def executor_wrapper(orig):
    @functools.wraps(orig)
    def determine_available_memory(self):
        # vllm-touch: engine-max-model-len
        budgets = orig(self)
        settings = resolve(getattr(self.vllm_config, "additional_config", None))
        if settings.auto_max_model_len:
            apply_chosen_length(self)
        return budgets

    return determine_available_memory


def apply_chosen_length(executor) -> int:
    """Ask every worker for its chosen length, agree, set it on the engine core's config and on
    every worker. Returns the length applied."""
    # vllm-touch: engine-max-model-len
    model_config = executor.vllm_config.model_config
    configured = int(model_config.max_model_len)
    chosen = executor.collective_rpc("wcprof_rpc", args=(RPC_OP,))
    try:
        length = agreed_max_model_len(configured, chosen)
    except ValueError as e:
        raise DoesNotFit(str(e), hint="the workers' log lines `[wcprof] max_model_len auto:` "
                                      "say why; pass --max-model-len N instead") from e
    if length != configured:
        model_config.max_model_len = length
        executor.collective_rpc("update_max_model_len", args=(length,))
    log.info("[wcprof] max_model_len auto: the engine starts with max_model_len %d (configured "
             "%d; chosen by the worker(s): %s)", length, configured,
             ", ".join(str(v) for v in chosen))
    return length


def worker_choice(worker) -> int | None:
    """A worker's answer to RPC_OP: the length its budget hook applied (None: none)."""
    from .startup import session_of

    session = session_of(worker)
    fit = session.profile.fit if session is not None and session.profile is not None else None
    return fit.applied_max_model_len if fit is not None else None
