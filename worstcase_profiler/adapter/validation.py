"""`wcprof --validate`: replay real requests at the worst shapes and read each rank's peak with
the same meter the sweep used.

The peak is read inside every worker through `collective_rpc` (vLLM 0.26 and 0.32: a callable is
cloudpickled and called with the worker wrapper), so it works the same in-process (TP=1,
UniProcExecutor) and across worker processes (TP>1, MultiprocExecutor), where the engine's
process holds no model and no workspace.
"""

from __future__ import annotations

import time

from ..report import Report, Validation

_METER_ATTR = "_wcprof_validation_meter"


def _begin(wrapper) -> None:
    """Worker side: reset this rank's high-water mark before the requests."""
    from ..meters import meter_for

    worker = getattr(wrapper, "worker", wrapper)
    meter = meter_for(getattr(worker, "device", "cpu"))
    setattr(worker, _METER_ATTR, meter)
    meter.begin()


def _end(wrapper) -> dict:
    """Worker side: this rank's transient since _begin, and its workspace bytes."""
    from . import workspace as ws
    from .engine_facts import world_rank

    worker = getattr(wrapper, "worker", wrapper)
    mgr = ws.manager()
    return {"rank": world_rank(), "transient": int(getattr(worker, _METER_ATTR).end()),
            "workspace": ws.total_bytes(mgr) if mgr is not None else 0}


def _prompts(llm, limits) -> list[tuple[str, list[list[int]], int]]:
    """(label, token-id prompts, max_tokens): one max_model_len prompt, chunked; then a decode
    batch of long prompts, as many as the KV pool holds (at most 4)."""
    mml = limits.max_model_len
    vocab = llm.llm_engine.model_config.get_vocab_size()
    ids = lambda n, s: [(s * 7919 + i * 31) % (vocab - 1) + 1 for i in range(n)]  # noqa: E731
    blocks = llm.llm_engine.vllm_config.cache_config.num_gpu_blocks or 0
    kv_tokens = int(blocks) * limits.block_size
    n_dec = max(1, min(limits.max_num_seqs, 4, kv_tokens // mml - 1))
    return [
        (f"1 prompt of {mml - 2} tokens (chunked by {limits.max_num_batched_tokens})",
         [ids(mml - 2, 1)], 2),
        (f"{n_dec} prompts of {mml - 8} tokens then decode",
         [ids(mml - 8, 10 + i) for i in range(n_dec)], 6),
    ]


def validate(llm, report: Report, limits) -> Validation:
    """Serve the workloads, then fill in every rank's Validation (report.ranks[i].validation
    when there are several) and return the one with the highest measured/predicted ratio."""
    from vllm import SamplingParams

    by_rank = {r.rank: r for r in (report.ranks or [report])}
    workloads = _prompts(llm, limits)
    t0 = time.perf_counter()
    worst: dict[int, int] = {}
    workspace: dict[int, int] = {}
    for _label, prompts, max_tokens in workloads:
        llm.collective_rpc(_begin)
        llm.generate([{"prompt_token_ids": p} for p in prompts],
                     SamplingParams(max_tokens=max_tokens, ignore_eos=True), use_tqdm=False)
        for out in llm.collective_rpc(_end):
            worst[out["rank"]] = max(worst.get(out["rank"], 0), out["transient"])
            workspace[out["rank"]] = out["workspace"]
    seconds = time.perf_counter() - t0
    results = []
    for rank, transient in sorted(worst.items()):
        rep = by_rank.get(rank, report)
        w = workspace[rank]
        predicted = rep.worstcase.peak_activation_bytes + w
        measured = transient + w
        rep.validation = Validation(
            measured_peak_bytes=measured, predicted_peak_bytes=predicted,
            ratio=measured / predicted if predicted else float("inf"),
            requests=[lbl for lbl, _, _ in workloads], seconds=seconds, rank=rank)
        results.append(rep.validation)
    return max(results, key=lambda v: v.ratio)
