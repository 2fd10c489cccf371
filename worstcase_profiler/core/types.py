"""The core's vocabulary: frozen values that flow one way, measure -> decide -> report.

The adapter measures and builds these; the core's pure functions (sweep, admission, the
start-up rules) combine them; report.py serves them as the public JSON schema's records, with
the field descriptions (`doc`) the schema shows. Nothing here imports vLLM, torch or pydantic.
A field renamed or retyped here is a schema change (report.SCHEMA_VERSION) and, for the values
the sweep cache keeps (core/codec.py), a cache layout change.
"""

from __future__ import annotations

import dataclasses
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from typing import Iterable, Literal

ShapeKind = Literal["stock", "prefill", "decode", "mixed"]


def doc(description: str, **kwargs):
    """A dataclass field with its meaning in the field's metadata: report.py serves these records
    as they are, and pydantic carries `description` into the report's JSON schema (docs/schema.md)
    without this module importing it. kwargs: dataclasses.field's (default, default_factory)."""
    return field(metadata={"description": description}, **kwargs)


@dataclass(frozen=True)
class Shape:
    """One synthetic step: `num_reqs` requests, `rows` new tokens in total, each request already
    holding `context_len` cached tokens (the KV extent the attention kernels read is
    context_len + its own query rows)."""

    kind: ShapeKind
    rows: int
    context_len: int
    num_reqs: int = 1

    def label(self) -> str:
        return f"{self.kind} rows={self.rows} ctx={self.context_len} reqs={self.num_reqs}"

    def with_context(self, context_len: int) -> "Shape":
        return dataclasses.replace(self, context_len=context_len)


@dataclass(frozen=True)
class StepResult:
    """What one step needed: its transient peak above the pre-step baseline, and the workspace
    it asked for (summed over slots), both agreed across ranks."""

    shape: Shape = doc("the synthetic step")
    peak_bytes: int = doc("transient peak above the pre-step baseline")
    seconds: float = doc("wall time of the step")
    top_op: str | None = doc("module during which the peak was reached", default=None)
    workspace_bytes: int = doc("WorkspaceManager bytes live after the step", default=0)

    @property
    def need_bytes(self) -> int:
        """Non-KV memory the step needs: its transient plus the workspace it asks for."""
        return self.peak_bytes + self.workspace_bytes


@dataclass(frozen=True)
class ProvisionalKV:
    """The KV cache the sweep ran on (one request at max_model_len), and what else vLLM allocated
    while initialising it (metadata builders, input buffers): memory stock admission leaves out."""

    num_blocks: int
    kv_bytes: int
    post_profile_bytes: int


@dataclass(frozen=True)
class CoveredSegment:
    """[lo, hi] inclusive. executed: every rows value in it ran; chord: certified by `probes`."""

    lo: int = doc("first rows value of the segment (inclusive)")
    hi: int = doc("last rows value of the segment (inclusive)")
    how: Literal["executed", "chord"] = doc(
        "executed: every rows value in [lo, hi] ran; chord: the interior probes lay on the chord "
        "between the ends (within tolerance), so the segment's peak is bounded by its ends plus "
        "the tolerance")
    probes: tuple[int, ...] = doc("interior rows values probed to certify a chord segment",
                                  default=())


@dataclass(frozen=True)
class RowsCoverage:
    """How every rows value 1..N is covered (core/coverage.py); `bound` is the proven upper
    bound on any rows value's need."""

    peak_table: tuple[tuple[int, int], ...]
    """(rows, need) of every executed rows value, ascending."""
    worst_rows: int
    worst_peak: int
    bound: int
    tolerance: int
    segments: tuple[CoveredSegment, ...]
    method: str
    argument: str

    @property
    def peaks(self) -> dict[int, int]:
        return dict(self.peak_table)

    @property
    def executed_rows(self) -> list[int]:
        return [rows for rows, _ in self.peak_table]

    @property
    def certified_rows(self) -> int:
        """Rows values covered by a chord certificate without being executed."""
        return certified_count(self.segments, self.executed_rows)


def certified_count(segments: Iterable, executed_rows: Iterable[int]) -> int:
    """Rows values inside chord segments that never ran (segments: anything with lo, hi and
    how, the core's or the report's); chord segments only share their (executed) ends."""
    executed = sorted(executed_rows)
    total = 0
    for seg in segments:
        if seg.how == "chord" and seg.hi - seg.lo > 1:
            ran_inside = bisect_left(executed, seg.hi) - bisect_right(executed, seg.lo)
            total += (seg.hi - seg.lo - 1) - ran_inside
    return total


@dataclass(frozen=True, kw_only=True)
class PoolFit:
    """The worst step fitted to the KV pool the admission leaves (core/pool_fit.py). The sweep
    plans for vLLM's own budget, an upper bound on the pool; where its worst shape has more
    requests than the admitted pool holds (a hybrid's recurrent state under speculative decoding
    holds blocks of every request), that step is never formed. The plan for the admitted pool
    replaces it: its new shapes measured on the full model, the largest shape it keeps admitted,
    and the pool allocated never above the plan's (more blocks would hold wider steps)."""

    planned_pool_tokens: int = doc("the KV pool the sweep planned for (vLLM's own budget, or a "
                                   "cached sweep's within a rounding step of it), in capacity "
                                   "tokens")
    pool_tokens: int = doc("the pool the fitted plan holds: what is allocated never exceeds it")
    swept_worst: Shape = doc("the sweep's worst shape, which that pool cannot hold")
    swept_peak_bytes: int = doc("the transient the sweep admitted for it")
    dropped: tuple[Shape, ...] = doc("the planned shapes that pool cannot hold (not counted)")
    steps: tuple[StepResult, ...] = doc("every step the fit counted, measured on the full model "
                                        "now or (`reused`) at an earlier start, in order: each "
                                        "round's shapes the sweep had not run (the fitted plan "
                                        "counts the ones it holds)")
    rounds: int = doc("plans fitted: the first for the pool the sweep's admission left, the "
                      "second where the pool a plan's transient leaves meets the pool it plans "
                      "for, a third where the second overshot")
    reused: int = doc("of `steps`, how many were read from a trusted sweep-cache entry "
                      "instead of measured (a restart: adapter/pool_fit.fit_to_pool); the worst "
                      "of them, where it is the admitted one, was measured again", default=0)
    held_bytes: int = doc("what the fit's steps left held, added to the consumed memory (a "
                          "start that read them from the cache counts the larger of its own and "
                          "what they left when measured)", default=0)
    cache_rejected: bool = doc("a trusted cache entry's readings were dropped: the one the "
                               "admitted transient is set by, measured again, no longer "
                               "matched, so every step was measured now", default=False)


@dataclass(frozen=True)
class SweepResult:
    """The worst-case sweep: the stock step, every executed step in order, and the admitted
    transient `peak_bytes` (the largest measured transient plus the chord certificate's slack)."""

    stock: StepResult
    steps: tuple[StepResult, ...]
    worst: StepResult
    worst_op: str | None
    peak_bytes: int
    coverage: RowsCoverage
    context_curve: tuple[StepResult, ...]
    rows_max: int
    post_profile_bytes: int
    seconds: float
    skipped: tuple[tuple[Shape, str], ...] = ()
    """Shapes the driver cannot build on this runner, and why (never silently)."""
    depth_delta: int = 0
    """A cut-down sweep's (core/sweep.run_cut_down): the largest full-model minus cut-down peak
    of any shape measured both ways, the stock step included; 0 after a full sweep."""
    confirmed: int = 0
    """A cut-down sweep's: how many of the last `steps` ran on the full model (its
    confirmations; the ones before ran on the cut decoder). 0 after a full sweep."""
    stock_excluded: str | None = None
    """Why the stock step is left out of `worst` and `peak_bytes` (shapes.stock_excluded_why:
    it never runs beside the KV cache); None where it counts. `stock` is measured either way."""
    pool_fit: PoolFit | None = None
    """The worst step fitted to the admitted pool (core/pool_fit.py): `worst` and `peak_bytes`
    are then the fitted plan's; None where the sweep's plan stands (the usual case)."""

    @property
    def cut_steps(self) -> tuple[StepResult, ...]:
        """After a cut-down sweep, the steps that ran on the cut decoder: all but the last
        `confirmed` (a sweep cached before that count existed: all of them)."""
        return self.steps[:len(self.steps) - self.confirmed]


@dataclass(frozen=True, kw_only=True)
class CutDownProof:
    """The evidence a cut-down sweep rests on, from this model. `method` "prove" (`--sweep-depth
    prove`): the cut-down sweep beside the full one on the same engine, the full one admitted;
    proven when the cut-down sweep's worst shape is the full sweep's (or needs the same on the
    full model within the resolution), its confirmed peak equals the full sweep's within the
    resolution, and it admits no less. `method` "self-check" (`--sweep-depth self-check`, auto on CUDA): the
    cut-down sweep, its worst shapes confirmed on the full model, and one sampled member of every
    shape class no confirmation covered measured on the full model too
    (sweep_depth.judge_self_check); proven when no sample's full-minus-cut difference exceeds
    the difference the confirmations measured (depth_delta) beyond the resolution, else the full
    sweep ran and is the one admitted (fell_back)."""

    # One start's comparison (core/sweep.prove_cut_down or run_self_checked), judged by
    # sweep_depth.judge_cut_down or judge_self_check; the report serves it as it is, so the fields
    # stand in the report's order.
    verdict: str = doc('"proven", or why not')
    depth: str = doc('what the cut kept, e.g. "1 of 32 layers"')
    full_worst: Shape | None = doc("the full sweep's worst shape (None: no full sweep ran, the "
                                   "self-check kept the cut-down sweep)")
    cut_worst: Shape
    full_peak_bytes: int | None = doc("the full sweep's worst step on the full model (None: no "
                                      "full sweep ran)")
    confirmed_peak_bytes: int = doc("the cut-down sweep's worst step, confirmed on the full model")
    full_admitted_bytes: int | None = doc("the full sweep's admitted transient (None: no full "
                                          "sweep ran)")
    cut_admitted_bytes: int
    resolution_bytes: int
    full_seconds: float | None = doc("the full sweep's time (None: no full sweep ran)")
    cut_seconds: float
    deltas: dict[str, int] = doc(
        "per step kind (stock included), the largest full-model minus cut-down peak over the "
        "shapes both sweeps measured (self-check: over the confirmations and the samples; "
        "decode steps under a drafter are the verify class; a self-check on a compiled "
        "forward: depth (full eager minus cut) plus what compiling added (full compiled minus "
        "full eager), each from 0; prove: full compiled minus cut, what the bound must cover)",
        default_factory=dict)
    depth_delta: int = doc("the difference the cut-down sweep measured and raised unconfirmed "
                           "shapes by (self-check: before the samples)", default=0)
    method: Literal["prove", "self-check"] = doc(
        '"prove": both sweeps compared (sweep_depth=prove); "self-check": the cut-down sweep '
        "checked by sampled full-model steps of every shape class (sweep_depth=self-check, auto on CUDA)",
        default="prove")
    sampled: tuple[Shape, ...] = doc("self-check: the shapes sampled on the full model, one per "
                                     "class no confirmation covered", default=())
    fell_back: bool = doc("self-check: the verdict was not proven, so the full sweep ran and "
                          "is the one admitted", default=False)
    unsampled_admitted_bytes: int | None = doc(
        "self-check: what the cut-down sweep admitted before its samples (sweep_depth=cut-down's "
        "figure); cut_admitted_bytes counts the samples too", default=None)
    seconds_split: dict[str, float] = doc(
        "self-check: where its sweeps' seconds went: cut_seconds as 'cut_decoder' (every step "
        "on the cut decoder), "
        "'full_model' (the stock step, confirmations and samples on the full model, with the "
        "bookkeeping between them) and, on a compiled forward, 'eager_rereads' (each full-model "
        "step read eagerly as well); after a fallback also 'full_sweep' (full_seconds, beside "
        "cut_seconds); wall seconds", default_factory=dict)

    @property
    def proven(self) -> bool:
        return self.verdict == "proven"


@dataclass(frozen=True)
class WorkspaceSlot:
    ubatch: int
    lane: int
    bytes_before: int
    bytes_after: int


@dataclass(frozen=True)
class Workspace:
    """Every WorkspaceManager slot (ubatch x lane) after the sweep's worst was reserved in all of
    them; total_bytes is what they hold together."""

    slots: tuple[WorkspaceSlot, ...] = ()
    total_bytes: int = 0


CacheStatus = Literal["stored", "hit", "stale", "off"]


@dataclass(frozen=True)
class CacheUse:
    """Whether this start ran the sweep or reused a cached one, and the check that decided: the
    cached worst shape replayed now against what it needed when cached. status: stored (swept
    and written), hit (reused after the replay matched), stale (the replay drifted, so the sweep
    ran again and replaced the entry), off (no cache)."""

    status: CacheStatus
    key: str | None = None
    path: str | None = None
    cached_at: str | None = None
    cached_need_bytes: int | None = None
    replayed_need_bytes: int | None = None
    allowed_drift_bytes: int | None = None
    replay_seconds: float | None = None
    trust: str | None = None
    """How a reused entry was trusted besides its replay: "signed" (its MAC verified under
    $WCPROF_CACHE_SECRET, so the dominance re-check was skipped), "host" (written by a start on
    this machine: its host MAC verified, the re-check skipped) or "re-checked" (the plan's
    heaviest shapes ran and none beat its worst step)."""
    held_moved_bytes: int | None = doc(
        "a hit: this start's held memory before the replay minus the cached start's (positive: "
        "more held now)", default=None)
    held_kept: bool | None = doc(
        "a hit: whether the cached start's held figure stood (held_moved_bytes within "
        "BASELINE_BELOW resolutions below to one above, and the replay left no more than the "
        "sweep did, within one resolution: the same admission as the start that swept), or "
        "this start's own held memory plus the larger residue was counted "
        "(core/cache_trust.reuse_consumed)", default=None)
    transient_raised_bytes: int | None = doc(
        "a hit: how far the replay raised the admitted transient above the cached sweep's (0: "
        "the cached figure stood; above 0: a replayed step read more than the meter's tolerance "
        "above its cached figure, and the larger figure is admitted: core/sweep.reused)",
        default=None)
    planned_pool_tokens: int | None = doc(
        "a hit whose entry planned for another KV pool than this start's own, within one "
        "rounding step (core/cache.pool_reuse): the entry's pool, which the start planned with, "
        "in capacity tokens; None where the two are the same", default=None)
    start_pool_tokens: int | None = doc(
        "with planned_pool_tokens: this start's own pool (above the planned one: the KV cache "
        "held at most at the planned pool)", default=None)
    replay_depth: str | None = doc(
        "a hit or stale entry: what the cut decoder kept where the worst step replayed there "
        "(e.g. \"1 of 64 layers\"; cached_need_bytes and replayed_need_bytes are then that "
        "shape's cut-down readings, then and now: core/cache_trust.replays_on_cut); None: it "
        "replayed on the full model", default=None)


@dataclass(frozen=True)
class WarmupEstimate:
    """What warm-up will keep resident once the KV budget is fixed, as known before it is fixed:
    CUDA graphs and other buffers (samplers, kernel warm-ups), and where the figure came from."""

    graphs_bytes: int = 0
    other_bytes: int = 0
    source: Literal["none", "vllm-estimate", "rehearsal", "cache"] = "none"

    @property
    def total_bytes(self) -> int:
        return self.graphs_bytes + self.other_bytes


@dataclass(frozen=True)
class HeldMemory:
    """What the process holds once the sweep is done and every workspace slot reserved (weights,
    non-torch, workspace, buffers), and what the engine may use in all."""

    requested_bytes: int
    consumed_bytes: int
    weights_bytes: int
    non_torch_bytes: int
    residue_bytes: int = 0
    """Of consumed_bytes, what this start had not allocated yet when admission measured it: on
    a cached start, the full sweep's residue (buffers the engine creates lazily, which warm-up
    or serving then creates; cache_trust.reuse_consumed). 0 on a start that swept."""


@dataclass(frozen=True, kw_only=True)
class Admission:
    """KV budget = requested - consumed - worst transient - warm-up reserve - margin, where
    consumed (weights + non-torch + workspace + post-profile buffers + everything else the process
    holds) is read after the sweep, the same way vLLM reads it."""

    # The report serves this record as it is (its docstring and descriptions are the schema's);
    # the defaults are what a report of an older schema lacks. warmup_graphs_bytes and
    # warmup_source are the profile's WarmupEstimate, joined when the report is built
    # (report.build_report): compute_admission leaves them None.
    requested_bytes: int = doc(
        "memory the engine may use (vLLM's requested memory: gpu_memory_utilization x device "
        "memory)")
    weights_bytes: int = doc("vLLM's figure for the model weights (model_memory_usage)")
    non_torch_bytes: int = doc("CUDA: consumed minus what torch reserved; 0 on the CPU")
    consumed_bytes: int = doc(
        "what the process holds after the sweep (CUDA: free memory at worker start minus free "
        "now; CPU: RSS), plus the post-profile buffers")
    transient_bytes: int | None = doc(
        "the worst transient subtracted (worstcase.peak_activation_bytes)", default=None)
    cudagraph_bytes: int = doc(
        "what warm-up keeps once the budget is fixed (CUDA graphs and other buffers), reserved "
        "up front", default=0)
    warmup_graphs_bytes: int | None = doc("of cudagraph_bytes: CUDA graphs", default=None)
    warmup_source: str | None = doc(
        "where the warm-up reserve came from: vllm-estimate, rehearsal (warm-up run on the "
        "provisional KV cache), cache (measured by an earlier start), none", default=None)
    margin_bytes: int = doc("safety margin (setting margin_bytes, default 64 MiB)")
    budget_bytes: int = doc(
        "requested - consumed - worst transient - cudagraphs - margin; may be negative")
    kv_cache_bytes: int = doc("the KV memory the engine is given")
    stock_kv_cache_bytes: int = doc("what stock admission would give")
    recommended_kv_cache_memory_bytes: int = doc(
        "the budget rounded down to a whole MiB (0 if negative): the value to pass as "
        "--kv-cache-memory-bytes")
    explicit_kv_cache_memory_bytes: int | None = doc(
        "--kv-cache-memory-bytes when one was given", default=None)
    bytes_per_token: int = doc("KV bytes one token costs across every attention layer")
    kv_tokens_stock: int = doc("tokens stock's KV cache holds (whole blocks)")
    kv_tokens_worstcase: int = doc("tokens kv_cache_bytes holds (whole blocks)")
    stock_oom_context_len: int | None = doc(
        "smallest measured KV extent at which the worst step outgrows the stock prediction plus "
        "the slack stock leaves; None = stock holds up to max_model_len", default=None)
    stock_shortfall_bytes: int | None = doc(
        "how much more than stock reserved the worst step at long context needs (0 when stock "
        "holds)", default=None)
    one_request_bytes: int | None = doc("KV one request at max_model_len needs", default=None)
    least_kv_cache_bytes: int | None = doc(
        "the smallest KV cache vLLM starts with: one request at max_model_len in whole blocks "
        "plus the block vLLM's block pool holds back (its null block)", default=None)
    pool_block_bytes: int | None = doc(
        "one block of vLLM's KV pool (what its block pool holds back as the null block)",
        default=None)
    fits: bool = doc(
        "the KV cache given (the budget, or an explicit --kv-cache-memory-bytes within it) holds "
        "one request at max_model_len besides vLLM's null block (least_kv_cache_bytes or more)")
    pool_ceiling_bytes: int | None = doc(
        "the largest KV cache the measured plan covers, where it is below the budget (the pool "
        "the sweep planned for, or the one the worst step was fitted to: a larger cache holds "
        "wider steps than any measured); kv_cache_bytes and the recommended flag are held at "
        "it. None where the budget is the bound", default=None)


@dataclass(frozen=True)
class BudgetDecision:
    """The KV bytes handed to vLLM, why, and the error that refuses the start (None: start)."""

    budget_bytes: int
    reason: str
    error: Exception | None = None


@dataclass(frozen=True)
class KVAuditGroup:
    name: str
    layers: tuple[str, ...]
    declared_bytes: int
    allocated_bytes: int
    # of `layers`, those of the speculative drafter's own model (EAGLE-3, DFlash, MTP): a draft
    # layer of the target's spec shares the target's group, one of another spec has its own
    drafter_layers: tuple[str, ...] = ()
    # holders outside every group whose KV buffers have this group's per-layer shape and dtype:
    # one buffer per real layer that the plan, listing one placeholder per group, never counted;
    # their bytes are in allocated_bytes
    unplanned_layers: tuple[str, ...] = ()
    # allocated / declared, and that against the group's own plan (audits.kv_audit_verdict);
    # None for `outside the plan` and for a group whose layers view the whole pool
    ratio: float | None = None
    verdict: Literal["ok", "over-budget"] | None = None


@dataclass(frozen=True, kw_only=True)
class KVAudit:
    """What KV initialisation allocated, against the budget the worker returned
    (core/audits.kv_audit_verdict)."""

    budget_bytes: int = doc("the KV budget the worker returned")
    allowed_bytes: int = doc("budget, or what num_gpu_blocks_override explains")
    allocated_bytes: int = doc("distinct storage KV initialisation allocated, all groups")
    ratio: float = doc("allocated / allowed")
    delta_process_bytes: int | None = doc("process memory growth across KV initialisation",
                                          default=None)
    groups: tuple[KVAuditGroup, ...] = doc(
        "per KV cache group, plus `outside the plan` for anything unlisted")
    verdict: Literal["ok", "over-budget"] = doc(
        "`over-budget` when allocated exceeds allowed, or a group its own plan, by more than 1%")
    message: str = doc("one line for the operator")


@dataclass(frozen=True, kw_only=True)
class WarmupAudit:
    """What warm-up left resident after the KV budget was fixed — CUDA graphs above all (vLLM
    0.26's V2 runner estimates them as 0) — against what admission set aside for it
    (core/audits.warmup_verdict)."""

    resident_bytes: int = doc("device memory warm-up added and kept")
    graphs_bytes: int | None = doc("of resident_bytes: CUDA graph capture (None: a report "
                                   "written before schema 1.3)", default=None)
    accounted_bytes: int = doc("what admission subtracted for it (cudagraph_bytes)")
    outside_bytes: int = doc("resident - accounted: eats the worst step's headroom")
    allowed_bytes: int = doc("the margin; more than this fails the start")
    verdict: Literal["ok", "outside-budget"]
    message: str
    startup_peak_bytes: int | None = doc(
        "the high-water mark of vLLM's own warm-up (compile and kernel warm-ups, graph capture), "
        "run beside the allocated KV cache, above what the process held when it began (what it "
        "kept included); None where not measured (a report written before schema 1.16, or a "
        "start whose warm-up the plugin did not wrap)", default=None)
    startup_transient_bytes: int | None = doc(
        "of startup_peak_bytes, what lay above what the warm-up left live: the transient those "
        "steps needed beside the KV cache, comparable with the worst step's predicted peak",
        default=None)
    startup_peak_before_capture_bytes: int | None = doc(
        "the high-water mark the warm-ups before graph capture reached (None: no capture ran); "
        "below startup_peak_bytes, graph capture or what followed it set the mark",
        default=None)
    startup_peak_after_capture_bytes: int | None = doc(
        "the high-water mark when the last graph capture returned (None: no capture ran, or a "
        "report before schema 1.17); below startup_peak_bytes, a warm-up after capture (the V1 "
        "runner's sampler warm-up) set the mark", default=None)


@dataclass(frozen=True)
class Validation:
    """Real requests replayed after the start, measured against the prediction (in-process:
    adapter/validation.py; before serving: adapter/serve_validation.py)."""

    measured_peak_bytes: int = doc("transient peak + workspace measured while real requests ran")
    predicted_peak_bytes: int = doc("worst-case peak + workspace")
    ratio: float = doc("measured / predicted (at most 1 means the prediction held)")
    requests: tuple[str, ...] = doc("the requests replayed")
    seconds: float = doc("wall time of the replay")
    rank: int = doc("the rank measured (with TP, the rank of highest ratio)", default=0)
    target: Literal["worst-step", "quick", "traffic", "multimodal", "check-step"] = doc(
        "worst-step: the report's own worst shape built from real requests (its rows, request "
        "count and context); on a model with an encoder step, held against the text sweep's own "
        "figure (text requests never run the encoder); quick: its "
        "rows over its requests at the shortest context, formed within a few steps (`--validate "
        "quick`); traffic: generic requests; multimodal: the encoder step (worstcase."
        "encoder_step) built from requests with items (images) behind a text prefix, held "
        "against the admitted figure; check-step: a step named in check_steps (worstcase."
        "check_steps) built from requests, held against its own reading (within "
        "admitted_peak_bytes it warns instead of failing)", default="traffic")
    shape: Shape | None = doc("the step the requests were built to reach", default=None)
    note: str | None = doc("why a shape could not be built exactly, if so", default=None)
    resolution_bytes: int = doc(
        "the meter's resolution on this device: measured may exceed predicted by this much "
        "before the validation fails (0: exact)", default=0)
    admitted_peak_bytes: int | None = doc(
        "check-step: the admitted transient (what the KV budget subtracted) plus the same "
        "workspace. Over its own reading but within this (at the meter's resolution), the step "
        "is a reading that missed, not an engine at risk: `wcprof` and `vllm serve` warn and go "
        "on (core/check_steps.missed); beyond it the run fails", default=None)
    formed: Shape | None = doc(
        "a step the scheduler formed while the measured requests ran (context_len: the longest "
        "context a request of it held): the smallest covering the target's rows, requests and "
        "context, else the closest; without a target, the one of most rows "
        "(replay_rules.formed_for). A worst-step replay reached its target only if this covers "
        "it (replay_rules.replay_reached); None where no step was recorded", default=None)
    modality: str | None = doc("multimodal: the modality of the items the requests carry",
                               default=None)
    encoder_items: int = doc(
        "multimodal: the items the requests put through the encoder in one step (the encoder "
        "step's count, or fewer where the note says why); 0 for text requests", default=0)
    encoder_items_formed: int | None = doc(
        "multimodal: the most items the scheduler sent through the encoder in one step while the "
        "measured requests ran (its scheduled_encoder_inputs); a multimodal replay reached its "
        "target only if this is at least encoder_items; None where not recorded", default=None)
    left_bytes: int | None = doc(
        "what the measured requests left allocated above their batch's start once they had "
        "finished (the batch the measured transient is from): persistent to the meter, so "
        "taken off the transient (core/readings.step_transient). Memory the engine holds after "
        "serving that the admission counted nowhere; what holds it is not told here. None where "
        "not read (a report before schema 1.23)",
        default=None)


@dataclass(frozen=True)
class DeviceInfo:
    kind: Literal["cpu", "cuda"]
    name: str
    total_bytes: int


@dataclass(frozen=True)
class EngineConfig:
    model: str
    max_model_len: int
    max_num_batched_tokens: int
    max_num_seqs: int
    num_speculative_tokens: int = 0
    block_size: int | None = None
    kv_cache_dtype: str = "auto"
    enforce_eager: bool = True
    gpu_memory_utilization: float | None = None
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = doc("vLLM's pipeline_parallel_size: every stage runs the sweep "
                                      "on its own layers, each step's peak the largest over the "
                                      "ranks; each rank reports its own budget", default=1)


@dataclass(frozen=True)
class EngineFacts:
    """What the worker is: fixed before the first phase runs."""

    tool_version: str
    vllm_version: str
    rank: int
    device: DeviceInfo
    config: EngineConfig
    runner: str
    worker: str
    attention_backends: tuple[str, ...] = ()


@dataclass(frozen=True)
class ProfileResult:
    """Everything determine_available_memory measured and decided, in one value."""

    sweep: SweepResult
    cache: CacheUse
    workspace: Workspace
    warmup: WarmupEstimate
    held: HeldMemory
    admission: Admission
    budget: BudgetDecision
    plan_fingerprints: tuple[str, ...] = ()
    sweep_mode: str = "full"
    advice: "Advice | None" = None
    cut_down_proof: CutDownProof | None = None
    fit: "Fit | None" = None
    encoder: "EncoderStep | None" = None  # core/multimodal.EncoderStep (it imports this module)
    """A model with a multimodal encoder: the encoder step measured beside the sweep
    (core/multimodal.py)."""
    chunk_cap: "ChunkCap | None" = None
    """The context-aware chunk cap (setting chunk_cap): `admission` is then the capped one."""
    check_steps: "tuple[CheckStep, ...]" = ()  # core/check_steps.CheckStep (it imports this module)
    """The steps named in check_steps, measured beside the sweep."""


@dataclass(frozen=True)
class WarmupResult:
    audit: WarmupAudit | None
    workspace_locked: bool = False
    workspace_grown_bytes: int = 0


@dataclass
class Phases:
    """The phase results of one start, each set once (StartupSession enforces it)."""

    profile: ProfileResult | None = None
    kv_audit: KVAudit | None = None
    warmup: WarmupResult | None = None
    validation: tuple[Validation, ...] = ()
    warnings: tuple[str, ...] = field(default_factory=tuple)


# --- the chunk advisor (core/advise.py) ------------------------------------------------------

@dataclass(frozen=True)
class AdviceMeasurements:
    """What the adapter measured for the chunk advisor on a provisional KV cache: the steps the
    candidates need that the sweep did not run (`steps`, in the order run), and one timed prefill
    step per candidate at long context (`timings`, chunk C on max_model_len - C cached tokens,
    in `chunks` order)."""

    chunks: tuple[int, ...]
    excluded: tuple[tuple[int, str], ...] = ()
    steps: tuple[StepResult, ...] = ()
    timings: tuple[StepResult, ...] = ()
    seconds: float = 0.0
    skipped: tuple[tuple[Shape, str], ...] = ()
    """Shapes a candidate forms that this runner cannot build (the driver's cannot_build), and
    why: left out as the sweep leaves them out, and said so."""


@dataclass(frozen=True, kw_only=True)
class ChunkAdvice:
    """One candidate max_num_batched_tokens: what an engine started with it needs at its worst,
    the KV it would admit, and its prefill throughput at long context on this device."""

    # The report serves this record as it is, so the fields stand in the report's order, and the
    # three derived columns (need_bytes, kv_cache_bytes, prefill_tokens_per_s) are fields that
    # __post_init__ always computes from the others: whatever is passed for them (a report's
    # JSON, dataclasses.replace) is recomputed, so they never disagree with what they derive from.
    chunk: int = doc("the candidate max_num_batched_tokens")
    need_bytes: int = doc("transient_bytes + workspace_bytes: what the worst step of an engine "
                          "with this chunk needs besides the KV cache (derived: recomputed from "
                          "them when read)", default=0)
    transient_bytes: int = doc(
        "largest peak over every step this chunk can form (rows 1..chunk from the sweep's "
        "coverage, chord slack included; its own stock step, split prefills, decode batches, "
        "mixed step and context ladder)")
    workspace_bytes: int = doc("workspace an engine with this chunk holds (every slot grown to "
                               "the largest its steps ask)")
    worst_shape: Shape = doc("the step of largest need for this chunk")
    budget_bytes: int = doc("the KV budget an engine with this chunk gets: requested - consumed - "
                            "transient - warm-up reserve - margin")
    kv_cache_bytes: int = doc("max(budget_bytes, 0) (derived: recomputed when read)", default=0)
    kv_tokens: int = doc("tokens that KV cache holds (whole blocks)")
    fits: bool = doc("the budget holds one request at max_model_len")
    prefill_seconds: float | None = doc(
        "wall time of one prefill chunk of this size on max_model_len - chunk cached tokens "
        "(after one untimed run of it)", default=None)
    prefill_tokens_per_s: float | None = doc("chunk / prefill_seconds (derived: recomputed when "
                                             "read)", default=None)
    reused_steps: int = doc("steps taken from the sweep (same shape)", default=0)
    measured_steps: int = doc("steps run for this chunk: the sweep had not", default=0)
    note: str | None = doc("what the operator should know about this row", default=None)

    def __post_init__(self) -> None:
        rate = (None if not self.prefill_seconds or self.prefill_seconds <= 0
                else self.chunk / self.prefill_seconds)
        object.__setattr__(self, "need_bytes", self.transient_bytes + self.workspace_bytes)
        object.__setattr__(self, "kv_cache_bytes", max(self.budget_bytes, 0))
        object.__setattr__(self, "prefill_tokens_per_s", rate)


@dataclass(frozen=True)
class ExcludedChunk:
    chunk: int = doc("a chunk asked for (--advise-chunk)")
    reason: str = doc("why it was not measured")


@dataclass(frozen=True, kw_only=True)
class Advice:
    """The chunk advisor (`wcprof --advise`, core/advise.py): KV tokens against prefill tokens
    per second for candidate max_num_batched_tokens values, and the knee."""

    # The report serves this record as it is: the fields stand in the report's order.
    configured_chunk: int = doc("the max_num_batched_tokens this engine runs with; its row is "
                                "this start's own admission")
    knee_chunk: int | None = doc("the advised chunk (see rule); null when no candidate fits or "
                                 "none was timed", default=None)
    within: float = doc("the knee rule's X, a fraction of the best throughput (0.05: within 5% "
                        "of the best prefill throughput)")
    rule: str = doc("how the knee is chosen")
    candidates: tuple[ChunkAdvice, ...] = doc("ascending by chunk")
    excluded: tuple[ExcludedChunk, ...] = doc("chunks asked for but not measurable here",
                                              default=())
    steps: tuple[StepResult, ...] = doc("the steps run for the advice, timing steps included "
                                        "(the sweep's are in worstcase.steps)", default=())
    seconds: float = doc("wall time of the advice's steps", default=0.0)

    def candidate(self, chunk: int | None) -> ChunkAdvice | None:
        return next((c for c in self.candidates if c.chunk == chunk), None)


# --- the fit (core/fit.py, `wcprof fit`) -----------------------------------------------------

FitObjective = Literal["context", "concurrency", "throughput"]


@dataclass(frozen=True)
class FitMeasurements:
    """What the adapter measured for the fit beyond the sweep and the advisor: one step per
    shape family some candidate forms that no measurement covered (core/fit.missing_shapes),
    each at the longest context and the most requests any candidate needs of it."""

    chunks: tuple[int, ...]
    seqs: tuple[int, ...]
    steps: tuple[StepResult, ...] = ()
    seconds: float = 0.0
    skipped: tuple[tuple[Shape, str], ...] = ()
    """Shapes a candidate forms that this runner cannot build (the driver's cannot_build), and
    why: left out as the sweep leaves them out, and said so on the candidate."""


@dataclass(frozen=True, kw_only=True)
class FitCandidate:
    """One configuration fit weighed: its limits, what its worst step needs (bounded from the
    sweep's measurements: core/fit.py says how), the KV it admits and how many requests at full
    length that holds at once."""

    # The report serves this record as it is, so the fields stand in the report's order; need_bytes
    # is derived in __post_init__ (recomputed from the others whatever is passed for it).
    max_model_len: int = doc("the candidate --max-model-len")
    max_num_batched_tokens: int = doc("the candidate --max-num-batched-tokens")
    max_num_seqs: int = doc("the candidate --max-num-seqs")
    need_bytes: int = doc("transient_bytes + workspace_bytes (derived: recomputed when read)",
                          default=0)
    transient_bytes: int = doc(
        "bound on the worst transient of every step the candidate forms: rows 1..chunk from the "
        "sweep's coverage at the swept max_model_len (chord slack included), every other shape "
        "from the measurement of its family at the next context (and request count) at or "
        "above its own, never below one measured under it; the meter's allocator slack added")
    workspace_bytes: int = doc("workspace the candidate holds (every slot grown to the largest "
                               "its steps ask)")
    worst_shape: Shape = doc("the candidate's own step whose bound is the largest")
    bounded_by: Shape | None = doc(
        "the measured step that set worst_shape's bound, where it is not worst_shape itself: the "
        "next measured point above it (a longer context, more requests), or one under it that "
        "read more; null when it is", default=None)
    budget_bytes: int = doc("requested - consumed - transient - warm-up reserve - margin at this "
                            "candidate")
    kv_cache_bytes: int = doc("the KV cache it is given: --kv-cache-memory-bytes when given, "
                              "else the budget rounded down to a whole MiB (0 if negative)")
    kv_tokens: int = doc("tokens that KV cache holds (whole blocks)")
    one_request_bytes: int = doc("KV one request at this max_model_len needs (whole blocks, "
                                 "plus any per-request state the swept one needed)")
    concurrency: int = doc("requests at this max_model_len the KV cache holds at once (less the "
                           "block vLLM's block pool holds back), at most max_num_seqs")
    fits: bool = doc("the budget holds one request at max_model_len (beside the block vLLM "
                     "holds back), and an explicit --kv-cache-memory-bytes is within it")
    feasible: bool = doc("fits, and concurrency is at least the fit's min_concurrency")
    min_gpu_memory_utilization: float | None = doc(
        "the smallest --gpu-memory-utilization (hundredths, rounded up) at which this candidate "
        "still holds min_concurrency requests at full length (an explicit KV size: holds it); "
        "null when the device size is unknown", default=None)
    prefill_tokens_per_s: float | None = doc(
        "the chunk's prefill throughput at the swept context (the advisor's timed step: chunk C "
        "on swept max_model_len - C cached tokens); null when not timed", default=None)
    frontier: bool = doc("on the trade-off frontier: no other feasible candidate has at least "
                         "its max_model_len, concurrency and prefill throughput, and more of one",
                         default=False)
    note: str | None = doc("what the operator should know about this candidate", default=None)

    def __post_init__(self) -> None:
        object.__setattr__(self, "need_bytes", self.transient_bytes + self.workspace_bytes)

    @property
    def limits(self) -> tuple[int, int, int]:
        return (self.max_model_len, self.max_num_batched_tokens, self.max_num_seqs)


@dataclass(frozen=True, kw_only=True)
class Fit:
    """`wcprof fit` (core/fit.py): configurations whose worst step fits and whose KV holds at
    least min_concurrency requests at full length, derived from one sweep at the largest limits
    allowed; the recommendation under the objective, and the trade-off frontier."""

    # The report serves this record as it is: the fields stand in the report's order.
    objective: FitObjective = doc(
        "context: the longest max_model_len; concurrency: the most requests at the swept "
        "max_model_len; throughput: the fastest prefill at the swept max_model_len")
    min_concurrency: int = doc("requests at full length the KV cache must hold at once")
    swept: tuple[int, int, int] = doc("(max_model_len, max_num_batched_tokens, max_num_seqs) the "
                                      "sweep ran at: the largest any candidate has")
    gpu_memory_utilization: float | None = doc(
        "the share of device memory the sweep's engine ran with, which every candidate's budget "
        "is computed at (the recommended flag)", default=None)
    recommended: FitCandidate | None = doc("the candidate the objective picks; null when none "
                                           "is feasible", default=None)
    flags: tuple[str, ...] = doc("the recommended engine flags, in order (empty when none)",
                                 default=())
    rule: str = doc("how the recommendation is chosen")
    bound: str = doc("how a figure between measured points is bounded")
    candidates: tuple[FitCandidate, ...] = doc(
        "every candidate weighed, by max_model_len, chunk and max_num_seqs, descending")
    notes: tuple[str, ...] = doc("what the fit left out, and why", default=())
    steps: tuple[StepResult, ...] = doc("the steps run for the fit beyond the sweep's and the "
                                        "advisor's", default=())
    seconds: float = doc("wall time of the fit's own steps", default=0.0)
    applied_max_model_len: int | None = doc(
        "the setting max_model_len: auto (vllm serve): the max_model_len this start was given, "
        "the longest candidate at the engine's max_num_batched_tokens and max_num_seqs that is "
        "feasible (core/fit.apply_longest); null when the setting is off or no length fits",
        default=None)
    applied_why: str | None = doc(
        "max_model_len: auto: why that length (the line the start logged), or why none fits "
        "(the refusal); null when the setting is off", default=None)

    @property
    def frontier(self) -> tuple[FitCandidate, ...]:
        return tuple(c for c in self.candidates if c.frontier)


# --- the context-aware chunk cap (core/chunk_cap.py, setting chunk_cap) ----------------------

@dataclass(frozen=True)
class ChunkCapMeasurements:
    """What the adapter measured for the chunk cap on a provisional KV cache: the steps the
    capped plan needs that the sweep did not run (`steps`), and one timed prefill step at the
    capped rows and one at the full chunk, each on max_model_len - rows cached tokens
    (`timings`: capped, then full)."""

    rows: int
    steps: tuple[StepResult, ...] = ()
    timings: tuple[StepResult, ...] = ()
    seconds: float = 0.0
    skipped: tuple[tuple[Shape, str], ...] = ()


@dataclass(frozen=True, kw_only=True)
class CapLevel:
    """One step of the cap: a step whose longest request has at most `up_to_context` cached
    tokens (and more than the previous level's) holds at most `rows` tokens in all."""

    up_to_context: int = doc("the longest cached context (num_computed_tokens) this level covers")
    rows: int = doc("the most tokens a step at that context holds, every request's together")
    need_bytes: int = doc("the largest need (transient + workspace) measured at this level's "
                          "steps: at up_to_context for a full-chunk level, the capped chunk's "
                          "whole worst case for the last")


@dataclass(frozen=True, kw_only=True)
class ChunkCapPlan:
    """The cap as decided from the measurements, before the admission (the adapter sizes the
    workspace from it)."""

    rows: int = doc("the rows allowed at long context (setting chunk_cap)")
    levels: tuple[CapLevel, ...] = doc("ascending by context; the last level also covers every "
                                       "longer context, up to max_model_len")
    transient_bytes: int = doc("the largest transient any step the cap allows needs (allocator "
                               "slack included)")
    workspace_bytes: int = doc("the workspace the capped engine holds (every slot sized to the "
                               "largest its allowed steps ask, scaled as the advisor scales it)")
    uncapped_transient_bytes: int = doc("the sweep's admitted transient, without the cap")
    uncapped_workspace_bytes: int = doc("the workspace the sweep grew, without the cap")
    worst_shape: Shape = doc("the allowed step of largest need")
    bound: str = doc("how a context between measured points is bounded")


@dataclass(frozen=True, kw_only=True)
class ChunkCap:
    """The context-aware chunk cap's record: the cap, the KV it gains and the prefill throughput
    it costs at long context, both from this start's measurements, beside the advisor's static
    choice."""

    plan: ChunkCapPlan = doc("the cap and what the steps it allows need")
    budget_bytes: int = doc("the KV budget with the cap (this start's admission)")
    uncapped_budget_bytes: int = doc("the KV budget the same sweep gives without the cap")
    kv_tokens: int = doc("tokens the capped budget holds (whole blocks)")
    uncapped_kv_tokens: int = doc("tokens the uncapped budget holds (whole blocks)")
    gained_bytes: int = doc("budget_bytes - uncapped_budget_bytes")
    gained_tokens: int = doc("kv_tokens - uncapped_kv_tokens")
    capped_prefill_tokens_per_s: float | None = doc(
        "prefill throughput at long context at the capped rows (rows on max_model_len - rows "
        "cached tokens, one timed step after an untimed one)", default=None)
    uncapped_prefill_tokens_per_s: float | None = doc(
        "the same at the full chunk", default=None)
    prefill_throughput_lost: float | None = doc(
        "1 - capped / uncapped prefill throughput at long context", default=None)
    static_chunk: int | None = doc("the advisor's static choice (its knee), when it ran",
                                   default=None)
    static_kv_tokens: int | None = doc("KV tokens at that chunk, from the advisor", default=None)
    static_prefill_tokens_per_s: float | None = doc("its prefill throughput at long context",
                                                    default=None)
    steps: tuple[StepResult, ...] = doc("the steps run for the cap (timings last)", default=())
    seconds: float = doc("wall time of the cap's steps", default=0.0)
