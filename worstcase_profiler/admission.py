"""The admission arithmetic: how much KV cache is safe once the worst step is known.

Stock vLLM gives the KV cache requested - consumed - (its own profile peak) - cudagraphs. We
subtract the worst transient over every step the scheduler can form instead, plus a margin,
and report both so the difference is visible. Pure integer arithmetic; no vLLM, no torch.
"""

from __future__ import annotations

from typing import Iterable

from worstcase_profiler.report import Admission
from worstcase_profiler.sizes import MiB


def kv_tokens(num_bytes: int, bytes_per_token: int, block_size: int) -> int:
    """Tokens the KV cache holds in `num_bytes`: whole blocks only, as the allocator does.
    bytes_per_token == 0 (a model without KV cache) holds no tokens to count: 0."""
    _check_positive(block_size=block_size)
    _check_non_negative(bytes_per_token=bytes_per_token)
    if num_bytes <= 0 or bytes_per_token == 0:
        return 0
    return (num_bytes // (bytes_per_token * block_size)) * block_size


def bytes_for_one_request(bytes_per_token: int, block_size: int, max_model_len: int) -> int:
    """KV bytes one request at max_model_len needs: whole blocks, rounded up."""
    blocks = -(-max_model_len // block_size)
    return blocks * block_size * bytes_per_token


def stock_oom_context_len(context_curve: Iterable[tuple[int, int]], *, stock_peak: int,
                          slack: int) -> int | None:
    """Smallest KV extent whose measured peak outgrows what stock admission reserved (its own
    profile peak plus the bytes that block rounding left unused); None if none does."""
    limit = stock_peak + slack
    over = [ctx for ctx, peak in context_curve if peak > limit]
    return min(over) if over else None


def compute_admission(*, requested: int, consumed: int, weights: int, non_torch: int,
                      worst_peak: int, stock_peak: int, cudagraph: int = 0, margin: int,
                      bytes_per_token: int, block_size: int, max_model_len: int,
                      explicit_kv: int | None = None,
                      context_curve: Iterable[tuple[int, int]] = ()) -> Admission:
    """budget = requested - consumed - worst_peak - cudagraph - margin (may go negative).

    The configuration fits when the budget holds one request at max_model_len (in whole
    blocks) and, with an explicit --kv-cache-memory-bytes, when that explicit size is within
    the budget and itself holds one such request."""
    _check_positive(block_size=block_size, max_model_len=max_model_len)
    _check_non_negative(bytes_per_token=bytes_per_token)
    budget = requested - consumed - worst_peak - cudagraph - margin
    stock_kv = max(0, requested - consumed - stock_peak - cudagraph)
    kv_cache = explicit_kv if explicit_kv is not None else max(budget, 0)
    recommended = (max(budget, 0) // MiB) * MiB
    one_request = bytes_for_one_request(bytes_per_token, block_size, max_model_len)
    fits = budget >= one_request and kv_cache >= one_request
    if explicit_kv is not None:
        fits = fits and explicit_kv <= budget
    block_bytes = bytes_per_token * block_size
    oom_ctx = stock_oom_context_len(context_curve, stock_peak=stock_peak,
                                    slack=stock_kv % block_bytes if block_bytes else 0)
    return Admission(
        requested_bytes=requested, weights_bytes=weights, non_torch_bytes=non_torch,
        consumed_bytes=consumed, cudagraph_bytes=cudagraph, margin_bytes=margin,
        budget_bytes=budget, kv_cache_bytes=kv_cache, stock_kv_cache_bytes=stock_kv,
        recommended_kv_cache_memory_bytes=recommended, explicit_kv_cache_memory_bytes=explicit_kv,
        bytes_per_token=bytes_per_token,
        kv_tokens_stock=kv_tokens(stock_kv, bytes_per_token, block_size),
        kv_tokens_worstcase=kv_tokens(kv_cache, bytes_per_token, block_size),
        stock_oom_context_len=oom_ctx, fits=fits)


def _check_non_negative(**values: int) -> None:
    for name, value in values.items():
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if value <= 0:
            raise ValueError(f"{name} must be positive, got {value}")
