"""Helpers the unit tests import by name. (Not in conftest.py: tests/cpu has a conftest too, and
`from conftest import` resolves to whichever was imported first when both directories run.)"""

from __future__ import annotations

GiB = 1024**3
MiB = 1024**2


def build_session(json_path=None, mode: str = "enforce", fingerprints=("f",), cache_path=None,
                  cache_status: str = "stored", residue: int = 0, **admission_overrides):
    """A StartupSession whose profile phase is recorded (core values only, no engine)."""
    import dataclasses as dc

    from worstcase_profiler.core.admission import compute_admission
    from worstcase_profiler.core.coverage import cover_rows
    from worstcase_profiler.core.admission import decide_budget
    from worstcase_profiler.core.session import StartupSession
    from worstcase_profiler.core.types import (CacheUse, DeviceInfo, EngineConfig, EngineFacts,
                                               HeldMemory, ProfileResult, Shape, StepResult,
                                               SweepResult, WarmupEstimate, Workspace,
                                               WorkspaceSlot)
    from worstcase_profiler.settings import ProfilerSettings

    stock = StepResult(Shape("stock", 512, 0, 8), peak_bytes=100 * MiB, seconds=0.1)
    worst = StepResult(Shape("prefill", 512, 3584, 1), peak_bytes=300 * MiB, seconds=0.2,
                       top_op="layers.0.attn", workspace_bytes=16 * MiB)
    sweep = SweepResult(stock=stock, steps=(worst,), worst=worst, worst_op="layers.0.attn",
                        peak_bytes=300 * MiB, coverage=cover_rows(lambda r: r, 1, 4, tolerance=1),
                        context_curve=(worst,), rows_max=512, post_profile_bytes=MiB, seconds=2.0)
    args = dict(requested=40 * GiB, consumed=10 * GiB, weights=8 * GiB, non_torch=GiB // 2,
                worst_transient=300 * MiB, stock_need=100 * MiB, stock_kv=29 * GiB, cudagraph=0,
                margin=64 * MiB, bytes_per_token=32768, block_size=16, max_model_len=4096)
    args.update(admission_overrides)
    adm = compute_admission(**args)
    settings = ProfilerSettings(mode=mode, json_path=json_path)
    facts = EngineFacts(tool_version="0.1.0", vllm_version="0.32.0", rank=0,
                        device=DeviceInfo("cuda", "NVIDIA H200", 140 * GiB),
                        config=EngineConfig(model="m", max_model_len=4096,
                                            max_num_batched_tokens=512, max_num_seqs=8),
                        runner="v2", worker="Worker")
    session = StartupSession(settings, facts, created_at="2026-01-01T00:00:00+00:00")
    use = CacheUse(status=cache_status, key="k", path=cache_path) if cache_path else CacheUse("off")
    session.record_profile(ProfileResult(
        sweep=sweep, cache=use,
        workspace=Workspace(slots=(WorkspaceSlot(0, 0, 0, 16 * MiB),), total_bytes=16 * MiB),
        warmup=WarmupEstimate(), held=HeldMemory(40 * GiB, 10 * GiB, 8 * GiB, GiB // 2, residue),
        admission=adm, budget=decide_budget(adm, mode=mode, kv_cap=None,
                                            worst_label=worst.shape.label(), max_model_len=4096),
        plan_fingerprints=tuple(fingerprints)))
    return session
