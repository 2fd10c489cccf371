"""The report: pydantic models, the one contract between the engine-side sweep, the CLI, the
renderers and CI gates (`wcprof diff`). Every byte figure is an int of bytes; renderers format."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

SCHEMA_VERSION = "1.2"  # 1.1: worstcase.cache, warmup_audit; 1.2: startup_seconds, validation.rank

ShapeKind = Literal["stock", "prefill", "decode", "mixed"]


class Shape(BaseModel):
    """One synthetic step: `num_reqs` requests, `rows` new tokens in total, each request already
    holding `context_len` cached tokens (the KV extent the attention kernels read is
    context_len + its own query rows)."""

    kind: ShapeKind
    rows: int
    context_len: int
    num_reqs: int = 1

    def label(self) -> str:
        return f"{self.kind} rows={self.rows} ctx={self.context_len} reqs={self.num_reqs}"


class StepResult(BaseModel):
    shape: Shape
    peak_bytes: int = Field(description="transient peak above the pre-step baseline")
    seconds: float
    top_op: str | None = Field(None, description="module during which the peak was reached")
    workspace_bytes: int = Field(0, description="WorkspaceManager bytes live after the step")

    @property
    def need_bytes(self) -> int:
        """Non-KV memory the step needs: its transient plus the workspace it leaves live."""
        return self.peak_bytes + self.workspace_bytes


class StockFigures(BaseModel):
    """vLLM's own profile step (max_num_batched_tokens rows, empty KV, no attention metadata),
    measured by the same meter as the sweep."""

    peak_activation_bytes: int
    shape: Shape
    seconds: float
    workspace_bytes: int = Field(0, description="workspace the stock step left live")

    @property
    def need_bytes(self) -> int:
        """Non-KV memory stock's own step needs: its transient plus the workspace it left."""
        return self.peak_activation_bytes + self.workspace_bytes

    def as_step(self) -> StepResult:
        """The stock step among the synthetic ones (vLLM runs it: no worst case is below it)."""
        return StepResult(shape=self.shape, peak_bytes=self.peak_activation_bytes,
                          seconds=self.seconds, workspace_bytes=self.workspace_bytes)


class RowsCovered(BaseModel):
    min: int
    max: int


class Segment(BaseModel):
    lo: int
    hi: int
    how: Literal["executed", "chord"] = Field(
        description="executed: every rows value in [lo, hi] ran; chord: the interior probes lay "
        "on the chord between the ends (within tolerance), so the segment's peak is bounded by "
        "its ends plus the tolerance")
    probes: list[int] = []


class Coverage(BaseModel):
    method: str
    argument: str
    tolerance_bytes: int
    executed_rows: list[int]
    segments: list[Segment]


class WorkspaceSlot(BaseModel):
    ubatch: int
    lane: int
    bytes_before: int
    bytes_after: int


class CacheUse(BaseModel):
    """Whether this start ran the sweep or reused a cached one (cache.py), and the check that
    decided: the cached worst shape replayed now against what it needed when cached."""

    status: Literal["stored", "hit", "stale", "off"] = Field(
        description="stored: swept and written; hit: reused after the replay matched; stale: the "
        "replay drifted, so the sweep ran again and replaced the entry; off: no cache")
    key: str | None = None
    path: str | None = None
    cached_at: str | None = None
    cached_need_bytes: int | None = None
    replayed_need_bytes: int | None = None
    allowed_drift_bytes: int | None = None
    replay_seconds: float | None = None


class WorstCase(BaseModel):
    peak_activation_bytes: int = Field(description="largest transient over every executed shape")
    workspace_bytes: int = Field(description="persistent workspace after every slot was grown")
    post_profile_bytes: int = Field(
        0, description="buffers vLLM allocates after its profile (attention-metadata builders, "
        "input buffers), measured on the provisional KV cache")
    worst_shape: Shape
    worst_op: str | None = None
    rows_covered: RowsCovered
    shapes_executed: int
    coverage: Coverage
    context_curve: list[StepResult] = Field(
        default_factory=list, description="the worst rows value at growing KV extent")
    steps: list[StepResult]
    workspace_slots: list[WorkspaceSlot] = []
    workspace_locked: bool = False
    seconds: float
    plan_fingerprints: list[str] = Field(
        default_factory=list, description="plan_fingerprint of the executed step shapes (`steps` "
        "in order), one per rank of the world group, indexed by rank; every entry must be equal "
        "(tensor-parallel ranks run the same steps in the same order)")
    cache: CacheUse | None = Field(None, description="sweep cache use at this start")

    @property
    def need_bytes(self) -> int:
        """Non-KV memory the worst step needs: the worst transient plus the persistent workspace."""
        return self.peak_activation_bytes + self.workspace_bytes


class Admission(BaseModel):
    """KV budget = requested - consumed - worst transient - cudagraphs - margin, where consumed
    (weights + non-torch + workspace + post-profile buffers + everything else the process holds)
    is read after the sweep, the same way vLLM reads it."""

    requested_bytes: int
    weights_bytes: int
    non_torch_bytes: int
    consumed_bytes: int
    cudagraph_bytes: int = 0
    margin_bytes: int
    budget_bytes: int
    kv_cache_bytes: int = Field(description="the KV memory the engine is given")
    stock_kv_cache_bytes: int = Field(description="what stock admission would give")
    recommended_kv_cache_memory_bytes: int
    explicit_kv_cache_memory_bytes: int | None = None
    bytes_per_token: int
    kv_tokens_stock: int
    kv_tokens_worstcase: int
    stock_oom_context_len: int | None = Field(
        None, description="smallest measured KV extent at which the worst step outgrows the stock "
        "prediction plus the slack stock leaves; None = stock holds up to max_model_len")
    fits: bool


class KVAuditGroup(BaseModel):
    name: str
    layers: list[str]
    declared_bytes: int
    allocated_bytes: int


class KVAudit(BaseModel):
    budget_bytes: int
    allowed_bytes: int = Field(description="budget, or what num_gpu_blocks_override explains")
    allocated_bytes: int
    ratio: float
    delta_process_bytes: int | None = None
    groups: list[KVAuditGroup]
    verdict: Literal["ok", "over-budget"]
    message: str


class WarmupAudit(BaseModel):
    """What warm-up left resident after the KV budget was fixed — CUDA graphs above all (vLLM
    0.26's V2 runner estimates them as 0) — against what admission set aside for it."""

    resident_bytes: int = Field(description="device memory warm-up added and kept")
    accounted_bytes: int = Field(description="what admission subtracted for it (cudagraph_bytes)")
    outside_bytes: int = Field(description="resident - accounted: eats the worst step's headroom")
    allowed_bytes: int = Field(description="the margin; more than this fails the start")
    verdict: Literal["ok", "outside-budget"]
    message: str


class Validation(BaseModel):
    measured_peak_bytes: int
    predicted_peak_bytes: int
    ratio: float
    requests: list[str]
    seconds: float
    rank: int = Field(0, description="the rank measured (with TP, the rank of highest ratio)")


class DeviceInfo(BaseModel):
    kind: Literal["cpu", "cuda"]
    name: str
    total_bytes: int


class EngineConfig(BaseModel):
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


class RunnerInfo(BaseModel):
    runner: Literal["v1", "v2"]
    worker: str
    attention_backends: list[str] = []


class Report(BaseModel):
    schema_version: str = SCHEMA_VERSION
    tool_version: str
    vllm_version: str
    created_at: str
    rank: int = 0
    device: DeviceInfo
    config: EngineConfig
    runner: RunnerInfo
    stock: StockFigures
    worstcase: WorstCase
    admission: Admission
    kv_audit: KVAudit | None = None
    warmup_audit: WarmupAudit | None = None
    validation: Validation | None = None
    startup_seconds: dict[str, float] = Field(
        default_factory=dict,
        description="wall seconds of each start-up phase in this worker; 'vllm_*' phases are "
                    "stock vLLM's own work (its profile, KV init, warm-up), the rest is the "
                    "profiler's cost; 'a.b' phases are parts of 'a' (replay.worst_step, "
                    "measure_held.gc, ...)")
    ranks: list["Report"] = Field(default_factory=list, description="one entry per TP rank")
    warnings: list[str] = []

    @property
    def verdict(self) -> str:
        if not self.admission.fits:
            return "DOES NOT FIT"
        if self.kv_audit and self.kv_audit.verdict != "ok":
            return "KV OVER-COMMIT"
        if self.admission.stock_oom_context_len is not None:
            return "STOCK UNSAFE"
        return "SAFE"
