"""The report: the public JSON schema (pydantic), the one contract between a profiling run, the
CLI, the renderers and CI gates (`wcprof diff`), and `build_report`, its projection from a
start-up session's phase results. Every byte figure is an int of bytes; renderers format.

The core never imports this module: it decides in its own frozen values (core/types.py), and
the report serves those records as they are (one definition per record: their fields and
descriptions are the schema's). A field added to one appears in the report; renaming or
retyping one changes the schema (SCHEMA_VERSION) and, for a record the sweep cache keeps, the
cache's layout. The report's own models are its envelope and two projections (StockFigures,
Coverage), which tests/unit/test_report_records.py checks against their core records.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

# The records are the core's own frozen dataclasses, served as they are: pydantic validates and
# serialises them like its models, and the descriptions in their fields' metadata (core.types.doc)
# go into the JSON schema.
from .core.types import (Admission, Advice, CacheUse, ChunkCap, CoveredSegment,  # noqa: E402
                         CutDownProof, DeviceInfo, EngineConfig, Fit, KVAudit, PoolFit, Shape,
                         StepResult, Validation, WarmupAudit, WorkspaceSlot)
from .core.multimodal import EncoderStep  # noqa: E402
from .core.check_steps import CheckStep  # noqa: E402

if TYPE_CHECKING:  # the projection's input
    from .core.session import StartupSession

SCHEMA_VERSION = "1.25"
# 1.1: worstcase.cache, warmup_audit; 1.2: startup_seconds, validation.rank; 1.3: admission's
# transient, stock shortfall, one-request and warm-up figures, warm-up graphs, validation targets,
# sweep mode; 1.4: advice (the chunk advisor, `wcprof --advise`); 1.5: worstcase.cut_down_proof;
# 1.6: validation.formed (the largest step the scheduler formed during the replay); 1.7: the
# "quick" validation target (`--validate quick`); 1.8: kv_audit.groups' drafter_layers,
# unplanned_layers, ratio and verdict (each KV group against its own plan); ChunkAdvice's derived
# need_bytes and kv_cache_bytes no longer required; $defs Segment named CoveredSegment; 1.9:
# cut_down_proof also carries the self-check (sweep_depth=self-check; method, sampled,
# fell_back; the full_* figures null when no full sweep ran); 1.10: fit (`wcprof fit`: the
# candidates weighed, the recommendation and the frontier); 1.11: worstcase.encoder_step (a
# model with a multimodal encoder: the encoder step measured beside the sweep); 1.12: admission's
# least_kv_cache_bytes and pool_block_bytes (fits holds back vLLM's null block, as vLLM does);
# 1.13: worstcase.stock_excluded (why the stock step is left out of the worst case); chunk_cap
# (the context-aware chunk cap: its levels, the KV gained, the throughput lost);
# fit.applied_max_model_len and fit.applied_why (the setting max_model_len: auto); 1.14: the
# "multimodal" validation target (the encoder step from requests with images) and validation's
# modality, encoder_items, encoder_items_formed; it gates before the worst-step one; 1.15:
# worstcase.pool_fit (the worst step fitted to the admitted KV pool, core/pool_fit.py) and
# admission.pool_ceiling_bytes (the KV cache and recommended flag held at the planned pool);
# 1.16: warmup_audit's startup_peak_bytes, startup_transient_bytes and
# startup_peak_before_capture_bytes (vLLM's own warm-up metered beside the KV cache); 1.17:
# warmup_audit's startup_peak_after_capture_bytes (the mark when graph capture ended); 1.18:
# config.pipeline_parallel_size; 1.19: worstcase.check_steps and the "check-step" validation
# target (steps an operator names, measured beside the sweep and validated on their own reading).
# 1.20: worstcase.cache.held_moved_bytes (a cached start's held memory against the cached one's).
# 1.21: worstcase.cache.transient_raised_bytes (how far a cached start's replay raised the
# admitted transient above the cached sweep's); validations' admitted_peak_bytes (a named step's
# admitted figure: within it, over its own reading only warns). 1.22: worstcase.encoder_step's
# cache_rest_bytes (the encoder cache's other tokens, in the encoder step's need). 1.23:
# validations' left_bytes (what the measured requests left allocated after they finished).
# 1.24: cut_down_proof.seconds_split (where a cut-down sweep's seconds went);
# worstcase.cache's planned_pool_tokens and start_pool_tokens (a hit planned for a moved pool).
# 1.25: worstcase.cache.replay_depth (a hit's worst step replayed on the cut decoder; its
# cached_need_bytes and replayed_need_bytes are then cut-down readings).

class StockFigures(BaseModel):
    """vLLM's own profile step (max_num_batched_tokens rows, empty KV, no attention metadata),
    measured by the same meter as the sweep. A projection of core.types.StepResult: a field on
    neither side's mapping fails tests/unit/test_report_records.py, and one the report does not
    know fails to load (extra="forbid")."""

    model_config = ConfigDict(extra="forbid")

    peak_activation_bytes: int
    shape: Shape
    seconds: float
    workspace_bytes: int = Field(0, description="workspace the stock step left live")

    @property
    def need_bytes(self) -> int:
        """Non-KV memory stock's own step needs: its transient plus the workspace it left."""
        return self.peak_activation_bytes + self.workspace_bytes


class RowsCovered(BaseModel):
    min: int
    max: int


class Coverage(BaseModel):
    """A projection of core.types.RowsCoverage (tests/unit/test_report_records.py maps it field
    by field); a field the report does not know fails to load (extra="forbid")."""

    model_config = ConfigDict(extra="forbid")

    method: str
    argument: str
    tolerance_bytes: int
    executed_rows: list[int]
    segments: list[CoveredSegment]


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
    sweep_mode: str = Field("full", description="full: every shape ran on the whole model")
    skipped_shapes: list[str] = Field(
        default_factory=list, description="shapes this runner cannot build, each with why")
    stock_excluded: str | None = Field(
        None, description="why the stock step (vLLM's profile shape) is left out of worst_shape "
        "and peak_activation_bytes: it runs only before the KV cache exists and the pool holds "
        "fewer requests at once than it has; null where it counts (the usual case)")
    cut_down_proof: CutDownProof | None = Field(
        None, description="--sweep-depth prove: the cut-down sweep compared with the full one; "
        "--sweep-depth self-check (auto on CUDA): the cut-down sweep's self-check (kept, or fell "
        "back to the full sweep), also on a start that reused it from the sweep cache")
    encoder_step: EncoderStep | None = Field(
        None, description="a model with a multimodal encoder: the encoder forward on vLLM's own "
        "dummy items (as many as one step's encoder budget runs) then the worst text step with "
        "their outputs held, measured on every start beside the sweep; `peak_activation_bytes` "
        "holds it (`sets_transient`). null for a text-only model, or where it was not built "
        "(the report's warnings say why and which multimodal limits were not profiled)")
    check_steps: list[CheckStep] = Field(
        default_factory=list, description="the steps named in the check_steps setting "
        "(`wcprof --check-step ROWS@CONTEXT`), each measured on the full model beside the sweep "
        "on every start; `peak_activation_bytes` holds them like any step")
    pool_fit: PoolFit | None = Field(
        None, description="the sweep's worst step had more requests than the admitted KV pool "
        "holds: the plan for that pool, its new shapes measured, is what worst_shape and "
        "peak_activation_bytes hold, and the pool allocated is held at it; null where the "
        "sweep's plan stands")

    @property
    def need_bytes(self) -> int:
        """Non-KV memory the worst step needs: the worst transient plus the persistent workspace."""
        return self.peak_activation_bytes + self.workspace_bytes


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
    validation: Validation | None = Field(
        None, description="the check that gates: the multimodal validation when one ran (the "
                          "encoder step from requests with images, against the admitted "
                          "figure), else the worst-step one, else the quick one, else generic "
                          "traffic (with TP, the rank of highest ratio)")
    validations: list[Validation] = Field(
        default_factory=list, description="every validation run: worst-step, multimodal, quick, "
                                          "traffic and check-step")
    startup_seconds: dict[str, float] = Field(
        default_factory=dict,
        description="wall seconds of each start-up phase in this worker; 'vllm_*' phases are "
                    "stock vLLM's own work (its profile, KV init, warm-up), the rest is the "
                    "profiler's cost; 'a.b' phases are parts of 'a' (replay.worst_step, "
                    "measure_held.gc, ...)")
    ranks: list["Report"] = Field(default_factory=list, description="one entry per TP rank")
    warnings: list[str] = []
    advice: Advice | None = Field(
        None, description="the chunk advisor's table, when the start ran it (`wcprof --advise`, "
                          "setting advise)")
    fit: Fit | None = Field(
        None, description="the configurations this sweep bounds, the recommendation and the "
                          "frontier, when the start weighed them (`wcprof fit`, setting fit)")
    chunk_cap: ChunkCap | None = Field(
        None, description="the context-aware chunk cap, when the start ran it (setting "
                          "chunk_cap): rows allowed per context, the KV gained and the prefill "
                          "throughput lost at long context, beside the advisor's static choice; "
                          "`admission` is then the capped one")

    @property
    def verdict(self) -> "Verdict":
        """DOES NOT FIT, else KV OVER-COMMIT, else STOCK UNSAFE, else SAFE."""
        if not self.admission.fits:
            return Verdict.DOES_NOT_FIT
        if self.kv_audit and self.kv_audit.verdict != "ok":
            return Verdict.KV_OVERCOMMIT
        if self.admission.stock_oom_context_len is not None:
            return Verdict.STOCK_UNSAFE
        return Verdict.SAFE


class Verdict(str, enum.Enum):
    """The report's verdict; its value is the label every renderer shows. `severity`: 0 fine,
    1 the configuration is safe here but stock admission is not, 2 this start is refused."""

    SAFE = "SAFE"
    STOCK_UNSAFE = "STOCK UNSAFE"
    KV_OVERCOMMIT = "KV OVER-COMMIT"
    DOES_NOT_FIT = "DOES NOT FIT"

    @property
    def severity(self) -> int:
        return {"SAFE": 0, "STOCK UNSAFE": 1}.get(self.value, 2)

    def __str__(self) -> str:
        return self.value


# --- the projection: a start-up session's phase results onto the schema ----------------------

def coverage_model(c) -> Coverage:
    return Coverage(method=c.method, argument=c.argument, tolerance_bytes=c.tolerance,
                    executed_rows=list(c.executed_rows),
                    segments=list(c.segments))


_VALIDATION = TypeAdapter(Validation)


def validation_model(v) -> Validation:
    """A Validation from a core record (returned as it is: the CLI's --validate fills reports it
    read back) or from a report's JSON object (validated, as the report validates it)."""
    return _VALIDATION.validate_python(v)


def stock_figures(stock) -> StockFigures:
    return StockFigures(peak_activation_bytes=stock.peak_bytes, shape=stock.shape,
                        seconds=stock.seconds, workspace_bytes=stock.workspace_bytes)


def build_report(session: "StartupSession", *, created_at: str) -> Report:
    """The report of a session whose profile phase ran: a pure function of its phase results,
    its settings-independent facts and its phase timings."""
    facts, phases = session.facts, session.phases
    prof = phases.profile
    if prof is None:
        raise ValueError("no profile phase recorded: nothing to report")
    sweep, adm, ws = prof.sweep, prof.admission, prof.workspace
    warm = phases.warmup
    wc = WorstCase(
        peak_activation_bytes=sweep.peak_bytes, workspace_bytes=ws.total_bytes,
        post_profile_bytes=sweep.post_profile_bytes, worst_shape=sweep.worst.shape,
        worst_op=sweep.worst_op, rows_covered=RowsCovered(min=1, max=sweep.rows_max),
        shapes_executed=len(sweep.steps), coverage=coverage_model(sweep.coverage),
        context_curve=list(sweep.context_curve), steps=list(sweep.steps),
        workspace_slots=list(ws.slots),
        workspace_locked=bool(warm and warm.workspace_locked), seconds=sweep.seconds,
        plan_fingerprints=list(prof.plan_fingerprints),
        cache=prof.cache,
        sweep_mode=prof.sweep_mode,
        skipped_shapes=[f"{sh.label()}: {why}" for sh, why in sweep.skipped],
        stock_excluded=sweep.stock_excluded,
        cut_down_proof=prof.cut_down_proof, encoder_step=getattr(prof, "encoder", None),
        check_steps=list(getattr(prof, "check_steps", ())), pool_fit=sweep.pool_fit)
    # the core Admission with what warm-up was expected to keep, and where that figure came from
    admission = dataclasses.replace(adm, warmup_graphs_bytes=prof.warmup.graphs_bytes,
                                    warmup_source=prof.warmup.source)
    validations = list(phases.validation)
    cfg, dev = facts.config, facts.device
    return Report(
        tool_version=facts.tool_version, vllm_version=facts.vllm_version, created_at=created_at,
        rank=facts.rank,
        device=dev, config=cfg,
        runner=RunnerInfo(runner=facts.runner, worker=facts.worker,
                          attention_backends=list(facts.attention_backends)),
        stock=stock_figures(sweep.stock), worstcase=wc, admission=admission,
        kv_audit=phases.kv_audit, warmup_audit=warm.audit if warm is not None else None,
        validation=gating_validation(validations),
        validations=validations, startup_seconds=dict(session.clock.seconds),
        warnings=list(phases.warnings), advice=getattr(prof, "advice", None),
        fit=getattr(prof, "fit", None), chunk_cap=getattr(prof, "chunk_cap", None))


def gating_validation(validations: list[Validation]) -> Validation | None:
    """The validation that gates: the multimodal one of highest ratio when any ran (it holds the
    admitted figure, which the encoder step set or is in), else the worst-step one, else the
    quick one, else the traffic one of highest ratio. A check-step one never gates here (it is
    held against its own step's reading, not the admitted figure); `wcprof --validate` still
    fails on any validation that exceeded its prediction."""
    worst = ([v for v in validations if v.target == "multimodal"]
             or [v for v in validations if v.target == "worst-step"])
    quick = [v for v in validations if v.target == "quick"]
    pool = worst or quick or validations
    return max(pool, key=lambda v: v.ratio) if pool else None
