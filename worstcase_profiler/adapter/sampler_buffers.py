"""The sampler's buffers that outlive a step, made before the profiler reads what the engine holds.

vLLM's Triton top-k/top-p kernel (v1/sample/ops/topk_topp_triton.apply_top_k_top_p_triton) keeps
one scratch row per program in a module-level cache: min(next_power_of_2(P), SMs) rows of the
vocabulary in fp32, P = min(SMs, the rows sampled). It is created at the first sampled batch that
asks for top-k or top-p and held for the engine's life. The V2 runner's profile samples a dummy
batch whose requests ask for neither, so neither vLLM's profile nor the sweep makes it, and a
served engine grows by it at its first such batch, after the KV cache took the rest: 125 MiB for
a 248,320-entry vocabulary on 132 SMs (docs/vllm-hooks.md, "The sampler's kept buffer"). Made
here first, it is in every held reading the admission subtracts."""

from __future__ import annotations

import logging

log = logging.getLogger("vllm.wcprof")


def sampled_rows(max_num_reqs: int, num_speculative_tokens: int) -> int:
    """The most logits rows one step samples: every request with its draft tokens."""
    return max(1, int(max_num_reqs)) * (1 + max(0, int(num_speculative_tokens)))


def make_topk_topp_buffer(worker) -> int:
    """Run vLLM's own top-k masking once on as many rows as its largest sampled batch (capped at
    the SM count, past which its buffer stops growing), so that its kept buffer exists at full
    size; the bytes that stay allocated. 0 where nothing samples (a pooling model), off CUDA, or
    where the kernel is not Triton's."""
    # vllm-touch: sampler-topk-buffer
    runner = worker.model_runner
    if getattr(runner, "sampler", True) is None or getattr(worker, "device", None) is None \
            or getattr(worker.device, "type", "cpu") != "cuda":
        return 0
    import torch

    try:
        from vllm.triton_utils import HAS_TRITON
        from vllm.utils.platform_utils import num_compute_units
        from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p
    except ImportError as e:  # a vLLM without the Triton sampler: nothing of it to make
        log.info("[wcprof] the sampler's top-k/top-p buffer is not made ahead (%s)", e)
        return 0
    if not HAS_TRITON:
        return 0
    cfg = worker.vllm_config
    spec = getattr(cfg, "speculative_config", None)
    drafts = (getattr(spec, "num_speculative_tokens", 0) or 0) if spec is not None else 0
    rows = min(sampled_rows(cfg.scheduler_config.max_num_seqs, drafts),
               num_compute_units(worker.device.index or 0))
    vocab = int(getattr(runner, "vocab_size", 0) or cfg.model_config.get_vocab_size())
    before = torch.cuda.memory_allocated(worker.device)
    logits = torch.randn(rows, vocab, device=worker.device, dtype=torch.float32)
    k = torch.full((rows,), max(1, vocab - 1), device=worker.device, dtype=torch.int32)
    apply_top_k_top_p(logits, k, None)
    del logits, k
    torch.cuda.synchronize(worker.device)
    made = max(0, torch.cuda.memory_allocated(worker.device) - before)
    log.info("[wcprof] the sampler's top-k/top-p buffer made ahead: %d rows of the %d-entry "
             "vocabulary, %.2f MiB kept (vLLM makes it at the first batch that asks for top-k "
             "or top-p, and its profile asks for neither)", rows, vocab, made / (1 << 20))
    return made
