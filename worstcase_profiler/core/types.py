"""The core's vocabulary: frozen values that flow one way, measure -> decide -> report.

The adapter measures and builds these; the core's pure functions (sweep, admission, policy)
combine them; report.py projects them onto the public JSON schema. Nothing here imports vLLM,
torch or pydantic, so the schema can change without touching a decision, and a fingerprint or a
cache key computed from these values does not move when a report field is renamed.
"""

from __future__ import annotations

import dataclasses
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from typing import Iterable, Literal

ShapeKind = Literal["stock", "prefill", "decode", "mixed"]


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

    shape: Shape
    peak_bytes: int
    seconds: float
    top_op: str | None = None
    workspace_bytes: int = 0

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

    lo: int
    hi: int
    how: Literal["executed", "chord"]
    probes: tuple[int, ...] = ()


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

    @property
    def cut_steps(self) -> tuple[StepResult, ...]:
        """After a cut-down sweep, the steps that ran on the cut decoder: all but the last
        `confirmed` (a sweep cached before that count existed: all of them)."""
        return self.steps[:len(self.steps) - self.confirmed]


@dataclass(frozen=True)
class CutDownProof:
    """One start's comparison of the cut-down sweep with the full sweep on the same engine
    (sweep_depth=prove; core/sweep.prove_cut_down, judged by policy.judge_cut_down). The full
    sweep is the one admitted; this says whether the cut-down one would have admitted the same.

    `deltas`: per step kind, the largest full-model minus cut-down peak over the shapes both
    passes measured (how much depth adds where the cut-down pass alone would have counted)."""

    full_worst: Shape
    cut_worst: Shape
    full_peak_bytes: int
    """The full sweep's worst step, measured on the full model."""
    confirmed_peak_bytes: int
    """The cut-down sweep's worst step, confirmed on the full model."""
    full_admitted_bytes: int
    cut_admitted_bytes: int
    resolution_bytes: int
    full_seconds: float
    cut_seconds: float
    depth: str
    """What the cut kept, e.g. "1 of 32 layers"."""
    deltas: tuple[tuple[str, int], ...] = ()
    depth_delta: int = 0
    """The full-minus-cut difference the cut-down sweep measured and raised shapes by."""
    verdict: str = ""
    """"proven", or why not."""

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
    $WCPROF_CACHE_SECRET, so the dominance re-check was skipped) or "re-checked" (the plan's
    heaviest shapes ran and none beat its worst step)."""


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
    or serving then creates; policy.reuse_consumed). 0 on a start that swept."""


@dataclass(frozen=True)
class Admission:
    """KV budget = requested - consumed - worst transient - warm-up reserve - margin."""

    requested_bytes: int
    weights_bytes: int
    non_torch_bytes: int
    consumed_bytes: int
    transient_bytes: int
    cudagraph_bytes: int
    margin_bytes: int
    budget_bytes: int
    kv_cache_bytes: int
    stock_kv_cache_bytes: int
    recommended_kv_cache_memory_bytes: int
    explicit_kv_cache_memory_bytes: int | None
    bytes_per_token: int
    kv_tokens_stock: int
    kv_tokens_worstcase: int
    stock_oom_context_len: int | None
    stock_shortfall_bytes: int
    one_request_bytes: int
    fits: bool


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
    # one buffer per real layer that the plan, listing one placeholder per group, never counted
    # (seed 000); their bytes are in allocated_bytes
    unplanned_layers: tuple[str, ...] = ()
    # allocated / declared, and that against the group's own plan (policy.kv_audit_verdict);
    # None for `outside the plan` and for a group whose layers view the whole pool
    ratio: float | None = None
    verdict: Literal["ok", "over-budget"] | None = None


@dataclass(frozen=True)
class KVAuditResult:
    budget_bytes: int
    allowed_bytes: int
    allocated_bytes: int
    ratio: float
    delta_process_bytes: int | None
    groups: tuple[KVAuditGroup, ...]
    verdict: Literal["ok", "over-budget"]
    message: str


@dataclass(frozen=True)
class WarmupAuditResult:
    resident_bytes: int
    graphs_bytes: int
    accounted_bytes: int
    outside_bytes: int
    allowed_bytes: int
    verdict: Literal["ok", "outside-budget"]
    message: str


@dataclass(frozen=True)
class Validation:
    measured_peak_bytes: int
    predicted_peak_bytes: int
    ratio: float
    requests: tuple[str, ...]
    seconds: float
    rank: int = 0
    target: str = "traffic"
    shape: Shape | None = None
    note: str | None = None
    resolution_bytes: int = 0
    formed: Shape | None = None
    """A step the scheduler formed while the measured requests ran (context_len: the longest
    context a request of it held): the smallest one covering the target's rows, requests and
    context, else the one closest to it; without a target, the one of most rows
    (policy.formed_for). None where no step was recorded. A worst-step replay reached its
    target only if this covers it (policy.replay_reached)."""


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


@dataclass(frozen=True)
class WarmupResult:
    audit: WarmupAuditResult | None
    workspace_locked: bool = False
    workspace_grown_bytes: int = 0


@dataclass
class Phases:
    """The phase results of one start, each set once (StartupSession enforces it)."""

    profile: ProfileResult | None = None
    kv_audit: KVAuditResult | None = None
    warmup: WarmupResult | None = None
    validation: tuple[Validation, ...] = ()
    warnings: tuple[str, ...] = field(default_factory=tuple)


# --- the chunk advisor (core/advise.py, issue 18) ---------------------------------------------

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


@dataclass(frozen=True)
class ChunkAdvice:
    """One candidate max_num_batched_tokens C: the worst case an engine started with C needs,
    the KV it would admit, and its prefill throughput at long context on this device."""

    chunk: int
    transient_bytes: int
    """The admitted transient: the largest peak over every step C can form (chord slack
    included), the stock step at C among them."""
    workspace_bytes: int
    """The workspace an engine with C holds (every slot grown to the largest C's steps ask)."""
    worst_shape: Shape
    budget_bytes: int
    kv_tokens: int
    fits: bool
    prefill_seconds: float | None = None
    reused_steps: int = 0
    """Steps taken from the sweep (same shape), not run again."""
    measured_steps: int = 0
    """Steps run for this candidate because the sweep had not run them."""
    note: str | None = None

    @property
    def need_bytes(self) -> int:
        return self.transient_bytes + self.workspace_bytes

    @property
    def kv_cache_bytes(self) -> int:
        return max(self.budget_bytes, 0)

    @property
    def prefill_tokens_per_s(self) -> float | None:
        if not self.prefill_seconds or self.prefill_seconds <= 0:
            return None
        return self.chunk / self.prefill_seconds


@dataclass(frozen=True)
class Advice:
    """The chunk advisor's answer: every candidate, the configured one among them, and the
    knee (None when no candidate fits or none was timed)."""

    configured_chunk: int
    candidates: tuple[ChunkAdvice, ...]
    knee_chunk: int | None
    within: float
    """X of the knee rule, a fraction (0.05: within 5% of the best prefill throughput)."""
    rule: str
    excluded: tuple[tuple[int, str], ...] = ()
    steps: tuple[StepResult, ...] = ()
    """The steps run for the advice (not the sweep's), timing steps included."""
    seconds: float = 0.0

    def candidate(self, chunk: int) -> ChunkAdvice | None:
        return next((c for c in self.candidates if c.chunk == chunk), None)
