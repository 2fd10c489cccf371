"""`vllm serve --profiler worstcase` with `validate_on_start`: before the HTTP server accepts
traffic, the report's own worst step is built from real requests (core/requests_plan.py) and
measured on every rank, like `wcprof --validate worst`, and so is each step named in check_steps,
against its own reading. Needing more than predicted refuses the start; a named step over its
own reading but within the admitted figure is a warning (the engine is not at risk). Each result
goes into each rank's report and one log line.

vLLM builds its engine client in `build_async_engine_client_from_engine_args` (an async context
manager) and starts the HTTP server inside it; the wrap runs the requests between the two. The
workers are asked through vLLM's own collective_rpc by method name (Worker.wcprof_rpc), so only
plain data crosses processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging

from ..core import codec
from ..core.check_steps import CheckStep, fails, missed, readings, with_admitted
from ..core.requests_plan import Pool, plan_for
from ..core.shapes import Limits
from ..core.replay_rules import replay_reached, replay_stops
from ..core.types import Shape, Validation
from ..errors import WcprofError
from ..settings import resolve
from ..sizes import fmt_bytes
from .validation import (Workload, device_type_of, formed_on_every_rank, kv_tokens_of, measure,
                         multimodal_replay, pool_from, replay_sampling, traffic_workload,
                         vllm_prompt, worst_step_workload)

log = logging.getLogger("vllm.wcprof")

MODULES = ("vllm.entrypoints.launchers.api_server.entry",  # 0.32+
           "vllm.entrypoints.openai.api_server")           # 0.26-0.31
NAME = "build_async_engine_client_from_engine_args"


def install() -> bool:
    """Wrap the engine-client builder where this vLLM defines it (idempotent)."""
    # vllm-touch: serve-validate
    import importlib

    for name in MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        original = module.__dict__.get(NAME)
        if original is None:
            continue
        if getattr(original, "_wcprof_original", None) is not None:
            return False
        wrapped = _wrap(original)
        wrapped._wcprof_original = original
        setattr(module, NAME, wrapped)
        return True
    return False


def _wrap(original):
    @contextlib.asynccontextmanager
    async def build_async_engine_client_from_engine_args(engine_args, *args, **kwargs):
        async with original(engine_args, *args, **kwargs) as client:
            settings = resolve(getattr(engine_args, "additional_config", None))
            if settings.enabled and settings.validate_on_start != "off":
                await validate_before_serving(client, settings.validate_on_start)
            yield client

    return build_async_engine_client_from_engine_args


async def validate_before_serving(client, which: str) -> list[Validation]:
    """Build the worst step (and each step named in check_steps) from requests on `client` (an
    AsyncLLM), measure every rank, record the results in each rank's report; WcprofError when a
    rank needed more than predicted (a named step: more than the admitted figure, core/
    check_steps.missed). which="all" also serves generic traffic
    (validation.traffic_workload), like --validate."""
    from .facts import hash_lookahead_tokens, limits_of, sibling_hits_serialize

    # vllm-touch: worker-config
    summaries = await ask(client, "summary")
    # the block the engine started with: vLLM lowers the front end's after KV initialisation
    block = next((s["block"] for s in summaries if s.get("block")), None)
    limits: Limits = limits_of(client.vllm_config, block_size=block)
    worst = next((s["worst"] for s in summaries if s.get("worst")), None)
    if worst is None:
        log.warning("[wcprof] serving validation skipped: no profile was recorded")
        return []
    predicted = {s["rank"]: int(s["peak"]) for s in summaries}
    # rank -> what its KV budget subtracted: a named step within it warns (core/check_steps.missed)
    subtracted = {s["rank"]: int(s.get("subtracted", s["peak"])) for s in summaries}
    pool = pool_from(await ask(client, "pool"))
    plan = functools.partial(plan_for, limits=limits, prefix_caching=limits.prefix_caching,
                             distinct_hits=sibling_hits_serialize(client.vllm_config), pool=pool,
                             hash_lookahead=hash_lookahead_tokens(client.vllm_config))
    vocab = int(client.model_config.get_vocab_size())
    results = await _measure(client, worst_step_workload(plan(codec.decode(Shape, worst)), vocab),
                             predicted, vocab)
    named = readings((s["rank"], codec.decode(tuple[CheckStep, ...], s.get("checks") or []))
                     for s in summaries)
    for shape, own in named.items():  # built as near as requests reach
        if set(own) != set(predicted):  # every rank measured the same named steps at its start
            raise WcprofError(
                f"serving validation: the named step {shape.label()} has a reading on rank(s) "
                f"{sorted(own)} only, of {sorted(predicted)}; the server does not start",
                hint="report it with the profiler report; start without validate_on_start to "
                     "serve anyway")
        found = await _measure(client, worst_step_workload(plan(shape), vocab, "check-step"),
                               own, vocab)
        results += [with_admitted(v, own[v.rank], subtracted[v.rank]) for v in found]
    results += await _multimodal(client, summaries, limits, codec.decode(Shape, worst), vocab,
                                 pool)
    if which == "all":
        work = traffic_workload(limits, vocab,
                                kv_tokens_of(client.vllm_config, limits.block_size, pool))
        results += await _measure(client, work, predicted, vocab)
    await ask(client, "record", [codec.encode(v) for v in results])
    for v in results:
        log.info("[wcprof] serving validation, rank %d: %s needed %s of predicted %s (%.4f)%s",
                 v.rank, _what(v), fmt_bytes(v.measured_peak_bytes),
                 fmt_bytes(v.predicted_peak_bytes), v.ratio, f"; {v.note}" if v.note else "")
        if replay_reached(v) is False:
            log.warning("[wcprof] serving validation, rank %d: the requests did not form %s "
                        "(the closest step formed: %s); its ratio is about another step",
                        v.rank, v.shape.label(), v.formed.label())
    for v in filter(missed, results):
        log.warning("[wcprof] serving validation, rank %d: %s needed %s, more than its own "
                    "reading (%s predicted) but within the admitted figure: the start goes on; "
                    "report it with the profiler report", v.rank, _what(v),
                    fmt_bytes(v.measured_peak_bytes), fmt_bytes(v.predicted_peak_bytes))
    over = [v for v in results if fails(v)]
    if over:
        v = over[0]
        # a named step fails only beyond its admitted figure: that is the difference that counts
        held = v.admitted_peak_bytes if v.admitted_peak_bytes is not None else v.predicted_peak_bytes
        raise WcprofError(
            f"serving validation: on rank {v.rank} {_what(v)} needed "
            f"{fmt_bytes(v.measured_peak_bytes)}, more than the {fmt_bytes(held)} "
            f"{'admitted' if v.admitted_peak_bytes is not None else 'predicted'}; the server "
            f"does not start",
            hint="report it with the profiler report; start without validate_on_start to serve "
                 "anyway, or lower --kv-cache-memory-bytes by the difference")
    return results


async def _multimodal(client, summaries, limits: Limits, text_shape: Shape,
                      vocab: int, pool: Pool | None) -> list[Validation]:
    """Where an encoder step was measured: that step built from requests with items
    (validation.multimodal_replay), against the admitted transient; where it cannot be
    built, a warning saying why (the text replay above is held against the text figure)."""
    from ..core.multimodal import EncoderStep
    from .facts import hash_lookahead_tokens, sibling_hits_serialize

    encoded = next((s["encoder"] for s in summaries if s.get("encoder")), None)
    if encoded is None:
        return []
    # vllm-touch: worker-config
    work, why = multimodal_replay(client.model_config, client.vllm_config.scheduler_config,
                                  codec.decode(EncoderStep, encoded), limits,
                                  prefix_caching=limits.prefix_caching, text_shape=text_shape,
                                  hash_lookahead=hash_lookahead_tokens(client.vllm_config),
                                  pool=pool,
                                  distinct_hits=sibling_hits_serialize(client.vllm_config))
    if work is None:
        log.warning("[wcprof] serving validation: the multimodal step (the encoder step, which "
                    "the admitted figure holds) was not built from requests: %s; only the text "
                    "worst step was validated, against the text sweep's figure", why)
        return []
    return await _measure(client, work, _admitted(summaries), vocab)


def _admitted(summaries) -> dict[int, int]:
    """rank -> the admitted transient its summary gives (its text prediction where it has none)."""
    return {s["rank"]: int(s.get("admitted", s["peak"])) for s in summaries}


async def ask(client, op: str, *payload) -> list:
    """Every rank's answer to worker_rpc's `op` (Worker.wcprof_rpc, by name: plain data only)."""
    return await client.collective_rpc("wcprof_rpc", args=(op, *payload))


class Serving:
    """ReplayClient over an AsyncLLM (validation.measure's serving side): worker ops through
    Worker.wcprof_rpc by name, a batch's requests sent together (_together) and, with a target,
    watched and stopped like validation._generate_to (_stop_once_formed)."""

    def __init__(self, client, vocab: int, tag: str):
        self.client, self.vocab, self.tag = client, vocab, tag
        self._ids = iter(range(1 << 30))

    async def ask(self, op: str) -> list:
        return await ask(self.client, op)

    async def prepare(self, prompts):
        """As they are: the API server's process renders them, not the engine core's, whose
        worker the meter reads."""
        return prompts

    async def run(self, prompts, max_tokens, target, stop) -> int:
        params = replay_sampling(max_tokens, self.vocab, device_type_of(self.client.vllm_config))
        rids = [f"wcprof-{self.tag}-{next(self._ids)}" for _ in prompts]
        watch = functools.partial(_stop_once_formed, self.client, rids=rids, target=target,
                                  stop=stop) if target is not None else None
        return await _together(self.client, [_drain(self.client, vllm_prompt(p), params, r)
                                             for p, r in zip(prompts, rids)], watch)


async def _measure(client, work: Workload, predicted: dict[int, int],
                   vocab: int) -> list[Validation]:
    """validation.measure on the engine client."""
    return await measure(Serving(client, vocab, work.target), work, predicted)


async def _stop_once_formed(client, tasks: list, rids: list[str], target: Shape, stop: str,
                            every_s: float = 0.1, grace_s: float = 30.0) -> int:
    """While a measured batch runs, ask every rank's recorder every `every_s` whether the
    scheduler formed `target`; once it has and a request has finished (stop="formed": once it
    has), abort the requests still running, as validation._generate_to does in-process.
    Returns how many it aborted (0: they all finished, the target never formed, or a request
    failed, which _together then raises without waiting for the rest). An aborted
    request's stream ends with vLLM's final abort output; one still open `grace_s` later is
    cancelled (which aborts it too), so that the server's start cannot hang on it."""
    formed = False
    while not all(t.done() for t in tasks):
        await asyncio.sleep(every_s)
        if any(t.done() and not t.cancelled() and t.exception() is not None for t in tasks):
            return 0  # a request failed: _together raises it now, not after the rest
        if not formed:
            formed = formed_on_every_rank(
                target, await ask(client, "formed"))
        if replay_stops(formed, sum(t.done() for t in tasks), len(tasks), stop):
            left = [r for r, t in zip(rids, tasks) if not t.done()]
            await client.abort(left)  # each drain then ends with its aborted output
            _, pending = await asyncio.wait(tasks, timeout=grace_s)
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
                log.warning("[wcprof] serving validation: %d aborted request(s) still open after "
                            "%.0f s were cancelled", len(pending), grace_s)
            return len(left)
    return 0


def _what(v: Validation) -> str:
    if v.shape is None:
        return "generic traffic"
    if v.target == "multimodal":
        return (f"the multimodal step ({v.encoder_items} {v.modality} item(s) through the "
                f"encoder, {v.shape.label()}) built from real requests")
    if v.target == "check-step":
        return f"the check step ({v.shape.label()}) built from real requests"
    return f"the worst step ({v.shape.label()}) built from real requests"


async def _together(client, drains: list, watch=None) -> int:
    """Run a batch's requests so that the scheduler sees all of them before it forms a step, as
    LLM.generate does: the scheduler is paused (requests kept, cache kept) while they are added,
    then resumed. Sent as they come, the engine's loop formed its first step with 7 of 8
    (tests/cpu/test_guard_serve.py), and the replay measured another step. Where this vLLM has
    no pause, or it fails, they are sent as they come. `watch(tasks)`, when given, runs while
    they do (_stop_once_formed); returns what it returns, else 0."""
    # vllm-touch: worker-config
    paused, tasks = False, []
    try:
        await client.pause_generation(mode="keep", clear_cache=False)
        paused = True
    except Exception as e:  # noqa: BLE001 - an older vLLM or another engine client
        log.debug("[wcprof] serving validation: no scheduler pause (%s)", e)
        paused = await _paused_anyway(client)  # a pause that failed half-way: resume it below
    try:
        counter = getattr(getattr(client, "output_processor", None),
                          "get_num_unfinished_requests", None)
        base = counter() if paused and counter else 0
        tasks = [asyncio.ensure_future(d) for d in drains]
        if paused and counter:
            loop = asyncio.get_running_loop()
            until = loop.time() + 30
            while counter() < base + len(tasks) and loop.time() < until and \
                    not any(t.done() for t in tasks):
                await asyncio.sleep(0.005)
            await asyncio.sleep(0.05)  # each request's send follows its count by one await
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    finally:
        if paused:
            await client.resume_generation()
    stopped = 0
    try:
        if watch is not None:
            stopped = await watch(tasks)
        # the first request to fail raises at once; one the watch cancelled was stopped
        await asyncio.gather(*(t for t in tasks if not t.cancelled()))
    except BaseException:
        for t in tasks:
            t.cancel()  # cancelling a request's stream aborts it in vLLM
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    return stopped


async def _paused_anyway(client) -> bool:
    try:
        return bool(await client.is_paused())
    except Exception:  # noqa: BLE001 - no way to tell: nothing to resume
        return False


async def _drain(client, prompt: dict, params, request_id: str) -> None:
    async for _ in client.generate(prompt, params, request_id):
        pass

