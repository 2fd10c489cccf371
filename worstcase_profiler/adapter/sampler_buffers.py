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


def kept_rows(rows: int, sms: int) -> int:
    """The rows of the kept buffer for a batch of `rows` sampled rows on `sms` SMs:
    min(next_power_of_2(min(sms, rows)), sms), as the kernel sizes it."""
    programs = max(1, min(sms, rows))
    return min(1 << (programs - 1).bit_length(), sms)


def _samples_here(runner) -> bool:
    """Whether this rank's runner samples: a generative model's last pipeline rank."""
    # vllm-touch: sampler-topk-buffer
    if getattr(runner, "sampler", True) is None or getattr(runner, "is_pooling_model", False):
        return False
    last = getattr(runner, "is_last_pp_rank", None)
    if last is None:
        try:
            from vllm.distributed import get_pp_group

            last = get_pp_group().is_last_rank
        except Exception:  # no pipeline group (a test double, a CPU build): one rank
            last = True
    return bool(last)


def make_topk_topp_buffer(worker) -> int:
    """Run vLLM's own top-k masking once on as many rows as its largest sampled batch (capped at
    the SM count, past which its buffer stops growing), and its top-p split path once (which
    keeps a small workspace of its own), so that what they keep exists at full size; the bytes
    that stay allocated. 0 where this rank does not sample (a pooling model, a pipeline rank
    before the last), off CUDA, or where the kernel is not Triton's. A failure is logged as a
    warning naming the bytes left out of the admission, and the start goes on as it did before
    this was made ahead: the same kernel would fail at the first such request anyway. On a
    host whose Triton cache lacks the kernel, its compile (about 1.2-1.6 s on an H100) moves
    here from the first request that asks for top-k."""
    # vllm-touch: sampler-topk-buffer
    runner = worker.model_runner
    device = getattr(worker, "device", None)
    if getattr(device, "type", "cpu") != "cuda" or not _samples_here(runner):
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
    sms = num_compute_units(device.index or 0)
    rows = min(sampled_rows(cfg.scheduler_config.max_num_seqs, drafts), sms)
    vocab = int(getattr(runner, "vocab_size", 0) or cfg.model_config.get_vocab_size())
    before = torch.cuda.memory_allocated(device)
    try:
        logits = torch.randn(rows, vocab, device=device, dtype=torch.float32)
        k = torch.full((rows,), max(1, vocab - 1), device=device, dtype=torch.int32)
        apply_top_k_top_p(logits, k, None)
        small = min(rows, 64)  # the top-p split path's batches (its workspace, about 1 MiB)
        p = torch.full((small,), 0.9, device=device, dtype=torch.float32)
        apply_top_k_top_p(logits[:small], None, p)
        del logits, k, p
        torch.cuda.synchronize(device)
    except Exception as e:  # noqa: BLE001 - the start goes on, and says what it left out
        log.warning("[wcprof] the sampler's top-k/top-p buffer could not be made ahead (%s: %s): "
                    "the admission does not hold the %.2f MiB vLLM keeps from the first batch "
                    "that asks for top-k or top-p", type(e).__name__, e,
                    kept_rows(rows, sms) * vocab * 4 / (1 << 20))
        return 0
    made = max(0, torch.cuda.memory_allocated(device) - before)
    log.info("[wcprof] the sampler's top-k/top-p buffers made ahead: %d rows of the %d-entry "
             "vocabulary, %.2f MiB kept (vLLM makes them at the first batch that asks for top-k "
             "or top-p, and its profile asks for neither)", rows, vocab, made / (1 << 20))
    return made
