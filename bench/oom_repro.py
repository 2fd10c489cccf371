#!/usr/bin/env python3
"""Seed 002 on a real GPU: a card held to its budget, long-context chunked prefill with prefix-cache
hits. Stock admission dies with a CUDA OOM; `--profiler worstcase` serves the same traffic.

  python3 bench/oom_repro.py --model tests/gpu/models/dsv32-8l-dense --kv-cache-dtype fp8 \
      --mode stock|worstcase --soak 200 --out DIR/case.json

The card is held the way production holds it: a ballast allocation (made in this process before the
engine starts) leaves free exactly `requested + slack` bytes, where requested is what
--gpu-memory-utilization asks for. vLLM then fills `requested` with weights + KV + what its profile
predicted; whatever a real step needs beyond the prediction must fit in `slack` or the step dies.

Traffic (token ids, dummy weights): one prompt of --prefix tokens (chunked prefill from 0 to the
prefix), then --soak requests that hit the prefix cache and add a new chunk of ~max_num_batched_tokens
rows on top of it (a different suffix length each, so rows values vary), sent in batches of
--batch. Then, with --replay-worst (worst-case runs), the worst shape of the engine's own report
made from real requests: its n requests share one cached prefix of about the shape's context
length (whole blocks, a block shorter where a prompt would reach max_model_len) and each adds its
share of the shape's rows, submitted together so the scheduler puts them in one step. One JSON per run: boot seconds, served count, the error line if
any, and the runtime peak (torch allocator, above the post-boot baseline) next to the prediction,
for the soak and for the replay separately.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

from common import error_line, worstcase_config, write_json


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--mode", choices=("stock", "worstcase"), required=True)
    p.add_argument("--util", type=float, default=0.5)
    p.add_argument("--slack-mib", type=int, default=256)
    p.add_argument("--max-model-len", type=int, default=131072)
    p.add_argument("--mnbt", type=int, default=8192)
    p.add_argument("--prefix", type=int, default=120000)
    p.add_argument("--soak", type=int, default=200)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--runner", choices=("default", "v1", "v2"), default="default",
                   help="VLLM_USE_V2_MODEL_RUNNER: unset, 0 or 1")
    p.add_argument("--graphs", action="store_true", help="CUDA graphs (default: enforce_eager)")
    p.add_argument("--replay-worst", action="store_true",
                   help="after the soak, replay the report's worst shape with real requests")
    p.add_argument("--out", required=True)
    return p.parse_args()


def _hold_card(torch, a, result: dict):
    """The ballast: leaves free exactly what --util requests plus --slack-mib."""
    free, total = torch.cuda.mem_get_info()
    requested = int(total * a.util) + 1
    ballast_bytes = free - requested - (a.slack_mib << 20)
    ballast = torch.empty(ballast_bytes, dtype=torch.uint8, device="cuda")
    result.update(total_bytes=total, requested_bytes=requested, ballast_bytes=ballast_bytes,
                  free_after_ballast=torch.cuda.mem_get_info()[0])
    return ballast


def _start_engine(a, report_path: str, result: dict):
    """The engine on the held card (None when it did not start: the error is in result)."""
    from vllm import LLM

    extra = {"additional_config": worstcase_config(report_path)} if a.mode == "worstcase" else {}
    t0 = time.perf_counter()
    try:
        llm = LLM(model=a.model, load_format="dummy", skip_tokenizer_init=True, enforce_eager=not a.graphs,
                  max_model_len=a.max_model_len, max_num_batched_tokens=a.mnbt,
                  gpu_memory_utilization=a.util, kv_cache_dtype=a.kv_cache_dtype, seed=0,
                  enable_prefix_caching=True, **extra)
    except Exception as e:  # noqa: BLE001
        result["error"] = f"engine start: {error_line(e)}"
        result["error_full"] = "".join(traceback.format_exception_only(type(e), e))[-2000:]
        return None
    result["boot_s"] = time.perf_counter() - t0
    worker = llm.llm_engine.model_executor.driver_worker.worker
    result["predicted_peak_bytes"] = int(worker.peak_activation_memory)
    result["kv_tokens"] = int(worker.model_runner.kv_cache_config.num_blocks) * int(
        llm.llm_engine.vllm_config.cache_config.block_size)
    return llm


def _soak_batch(prefix: list[int], start: int, a, vocab: int) -> list[dict]:
    """Requests start.. of the soak: the prefix plus a new chunk of rows near the chunk size."""
    room = a.max_model_len - a.prefix - 4
    batch = []
    for i in range(start, min(a.soak, start + a.batch)):
        n = max(1, min(room, a.mnbt - (i * 37) % 512))  # rows vary near the chunk size
        batch.append({"prompt_token_ids": prefix + [(i * 131 + j) % (vocab - 1) + 1 for j in range(n)]})
    return batch


def _soak(llm, a, result: dict, dump) -> int:
    """The traffic (see the module docstring); the soak's peak above the post-boot baseline.
    Returns that baseline."""
    import torch
    from vllm import SamplingParams

    vocab = llm.llm_engine.model_config.get_vocab_size()
    prefix = [(i * 7919) % (vocab - 1) + 1 for i in range(a.prefix)]
    params = SamplingParams(max_tokens=2, ignore_eos=True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    result["free_at_traffic_start"] = torch.cuda.mem_get_info()[0]
    dump()
    t1 = time.perf_counter()
    try:
        llm.generate([{"prompt_token_ids": prefix + [1] * 64}], params, use_tqdm=False)
        result["served"] = 1
        for start in range(0, a.soak, a.batch):
            batch = _soak_batch(prefix, start, a, vocab)
            llm.generate(batch, params, use_tqdm=False)
            result["served"] += len(batch)
            result["traffic_s"] = time.perf_counter() - t1
            if start % (a.batch * 5) == 0:
                dump()
    except Exception as e:  # noqa: BLE001
        lines = [l for l in traceback.format_exception_only(type(e), e)[-1].splitlines() if l.strip()]
        result["error"] = f"{type(e).__name__}: {lines[0][:500] if lines else ''}"
    torch.cuda.synchronize()
    result["traffic_s"] = time.perf_counter() - t1
    result["measured_peak_bytes"] = int(torch.cuda.max_memory_allocated() - base)
    result["soak_peak_bytes"] = result["measured_peak_bytes"]
    return base


def _from_report(result: dict, report_path: str) -> None:
    """The worst-case report's prediction, stock figure, sweep time, cache and worst shape."""
    if not os.path.exists(report_path):
        return
    rep = json.load(open(report_path))
    wc = rep["worstcase"]
    result.update(predicted_peak_bytes=wc["peak_activation_bytes"], workspace_bytes=wc["workspace_bytes"],
                  stock_peak_bytes=rep["stock"]["peak_activation_bytes"], sweep_s=wc["seconds"],
                  cache=wc.get("cache"), worst_shape=wc["worst_shape"])


def _ratios(result: dict) -> None:
    pred = result.get("predicted_peak_bytes")
    if not pred:
        return
    result["ratio_measured_over_predicted"] = result["measured_peak_bytes"] / pred
    if result.get("replay_peak_bytes"):
        result["ratio_predicted_over_replay"] = pred / result["replay_peak_bytes"]


def _replay_after_soak(llm, a, result: dict, base: int, report_path: str) -> None:
    replay_worst(llm, json.load(open(report_path)), llm.llm_engine.model_config.get_vocab_size(),
                 result, base, a)
    result["measured_peak_bytes"] = max(result["soak_peak_bytes"], result.get("replay_peak_bytes") or 0)


def main() -> int:
    a = _parse()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if a.runner != "default":
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1" if a.runner == "v2" else "0"
    import torch

    result: dict = {"mode": a.mode, "model": os.path.basename(a.model.rstrip("/")),
                    "kv_cache_dtype": a.kv_cache_dtype, "util": a.util, "slack_bytes": a.slack_mib << 20,
                    "served": 0, "error": None, "command": " ".join(sys.argv),
                    "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
                    "runner_env": a.runner, "graphs": a.graphs}

    def dump() -> None:
        write_json(a.out, result, indent=2)

    ballast = _hold_card(torch, a, result)
    report_path = a.out.replace(".json", ".report.json")
    llm = _start_engine(a, report_path, result)
    if llm is None:
        dump()
        return 1
    base = _soak(llm, a, result, dump)
    if a.replay_worst and result["error"] is None and os.path.exists(report_path):
        _replay_after_soak(llm, a, result, base, report_path)
    result["reserved_unallocated_at_end"] = int(torch.cuda.memory_reserved() - torch.cuda.memory_allocated())
    _from_report(result, report_path)
    _ratios(result)
    del ballast
    dump()
    print(json.dumps({k: v for k, v in result.items() if k != "command"}))
    return 0 if result["error"] is None else 1


def _replay_layout(shape: dict, block: int, max_model_len: int) -> tuple[list[int], int]:
    """Each request's new tokens (the shape's own split, shapes.request_layout) and the shared
    prefix. Prefix hits come in whole blocks, and a prompt plus its one output token must stay
    within max_model_len: the shared prefix is the shape's context rounded down to blocks, one
    block shorter where needed, so every request computes exactly its share of the shape's rows."""
    n, rows, ctx = int(shape["num_reqs"]), int(shape["rows"]), int(shape["context_len"])
    each, extra = divmod(rows, n)
    new_tokens = [each + (1 if i < extra else 0) for i in range(n)]
    prefix_len = ctx - ctx % block
    while prefix_len > 0 and prefix_len + max(new_tokens) >= max_model_len:
        prefix_len -= block
    return new_tokens, prefix_len


def _replay_step(llm, prefix: list[int], new_tokens: list[int], vocab: int, result: dict, base: int) -> None:
    """Cache the prefix, then the shape's requests together: the step's transient above what is
    allocated just before it (CudaMeter.begin's base)."""
    import torch
    from vllm import SamplingParams

    one = SamplingParams(max_tokens=1, ignore_eos=True)
    llm.generate([{"prompt_token_ids": prefix + [3]}], one, use_tqdm=False)  # cache the prefix
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    result["replay"]["allocated_drift_since_traffic_start"] = int(before - base)
    prompts = [{"prompt_token_ids": prefix + [(r * 7 + j) % (vocab - 1) + 1 for j in range(k)]}
               for r, k in enumerate(new_tokens)]
    outs = llm.generate(prompts, one, use_tqdm=False)
    torch.cuda.synchronize()
    result["replay_peak_bytes"] = int(torch.cuda.max_memory_allocated() - before)
    hits = [getattr(o, "num_cached_tokens", None) for o in outs]
    result["replay"]["prefix_hits_min"] = min((h for h in hits if h is not None), default=None)
    result["replay"]["served"] = len(outs)


def replay_worst(llm, report: dict, vocab: int, result: dict, base: int, a) -> None:
    """The report's worst shape, from real requests (see the module docstring)."""
    shape = report["worstcase"]["worst_shape"]
    new_tokens, prefix_len = _replay_layout(shape, int(report["config"]["block_size"]), a.max_model_len)
    result["replay"] = {"worst_shape": shape, "requests": len(new_tokens), "prefix": prefix_len,
                        "new_tokens_each": int(shape["rows"]) // len(new_tokens), "rows": sum(new_tokens), "kind": shape["kind"]}
    if shape["kind"] not in ("prefill", "decode") or prefix_len + max(new_tokens) >= a.max_model_len:
        result["replay"]["skipped"] = f"{shape['kind']} shape not replayable this way"
        return
    prefix = [(i * 104729 + 17) % (vocab - 1) + 1 for i in range(prefix_len)]
    t0 = time.perf_counter()
    try:
        _replay_step(llm, prefix, new_tokens, vocab, result, base)
    except Exception as e:  # noqa: BLE001
        result["replay"]["error"] = error_line(e)
    result["replay"]["seconds"] = time.perf_counter() - t0


if __name__ == "__main__":
    sys.exit(main())
