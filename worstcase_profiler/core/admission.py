"""The admission arithmetic: how much KV cache is safe once the worst step is known.

Stock vLLM gives the KV cache requested - consumed - (its own profile peak) - cudagraphs. We
subtract the worst transient over every step the scheduler can form instead, plus what warm-up
will keep (CUDA graphs and other buffers) and a margin, and report both so the difference is
visible; decide_budget turns the admission into the KV bytes handed to vLLM (or the error that
refuses the start). Pure integer arithmetic; no vLLM, no torch.
"""

from __future__ import annotations

from typing import Iterable

from ..errors import DoesNotFit
from ..sizes import MiB, fmt_bytes
from .types import Admission, BudgetDecision


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


def pool_block(bytes_per_token: int, block_size: int, pool_block_bytes: int | None = None) -> int:
    """The bytes of one block of vLLM's KV pool: `pool_block_bytes` when the adapter read it from
    vLLM's own plan (vLLM's _pool_bytes_per_block: the largest KV group's bytes per block, every
    group drawing its blocks from the one pool), else one block of every attention layer
    (bytes_per_token x block_size: exact with one KV group, a whole block per group with several,
    which holds back more than vLLM does: the safe direction). 0: no per-token KV."""
    if pool_block_bytes is not None and pool_block_bytes > 0:
        return pool_block_bytes
    return bytes_per_token * block_size


def usable_kv_bytes(num_bytes: int, *, bytes_per_token: int, block_size: int,
                    pool_block_bytes: int | None = None) -> int:
    """What requests can hold of a KV cache of `num_bytes`: whole pool blocks, less the one
    vLLM's BlockPool keeps as its null block (vLLM 0.32 get_kv_cache_configs and
    check_enough_kv_cache_memory check one request against available memory minus one pool
    block; allocation still uses it all). No per-token KV (bytes_per_token 0): all of it."""
    block = pool_block(bytes_per_token, block_size, pool_block_bytes)
    if block <= 0:
        return max(0, num_bytes)
    return max(0, num_bytes // block - 1) * block


def least_kv_cache_bytes(one_request: int, *, bytes_per_token: int, block_size: int,
                         pool_block_bytes: int | None = None) -> int:
    """The smallest KV cache vLLM starts with: the whole pool blocks that hold `one_request`
    (one request at max_model_len) plus the null block (usable_kv_bytes' inverse)."""
    block = pool_block(bytes_per_token, block_size, pool_block_bytes)
    if block <= 0:
        return one_request
    return (-(-one_request // block) + 1) * block


def stock_oom_context_len(context_curve: Iterable[tuple[int, int]], *, stock_need: int,
                          slack: int) -> int | None:
    """Smallest KV extent whose measured need outgrows what stock admission reserved (its own
    profile step's need plus the bytes that block rounding left unused); None if none does."""
    limit = stock_need + slack
    over = [ctx for ctx, need in context_curve if need > limit]
    return min(over) if over else None


def compute_admission(*, requested: int, consumed: int, weights: int, non_torch: int,
                      worst_transient: int, stock_need: int, stock_kv: int, cudagraph: int = 0,
                      margin: int, bytes_per_token: int, block_size: int, max_model_len: int,
                      one_request: int | None = None, explicit_kv: int | None = None,
                      noise: int = 0, pool_block_bytes: int | None = None,
                      context_curve: Iterable[tuple[int, int]] = ()) -> Admission:
    """budget = requested - consumed - worst_transient - cudagraph - margin (may go negative).

    `stock_kv` is what vLLM's own profile would give the KV cache. `cudagraph` is what warm-up
    will keep once the budget is fixed (graphs and other buffers). `one_request` is the KV one
    request at max_model_len needs (default: from bytes_per_token, in whole blocks).

    The configuration fits when the KV cache it gives vLLM (the budget, or the explicit
    --kv-cache-memory-bytes, which must then be within the budget) holds one request at
    max_model_len besides the block vLLM's block pool holds back (usable_kv_bytes: vLLM's own
    check, which refuses the start otherwise); `least_kv_cache_bytes` is that smallest size.
    `pool_block_bytes`: one block of vLLM's pool, as its plan lays it out (default: one block
    of every attention layer). The stock shortfall is how much more than stock reserved the worst
    step at long context needs (0 when stock holds up to max_model_len)."""
    _check_positive(block_size=block_size, max_model_len=max_model_len)
    _check_non_negative(bytes_per_token=bytes_per_token)
    budget = requested - consumed - worst_transient - cudagraph - margin
    kv_cache = explicit_kv if explicit_kv is not None else max(budget, 0)
    recommended = (max(budget, 0) // MiB) * MiB
    if one_request is None:
        one_request = bytes_for_one_request(bytes_per_token, block_size, max_model_len)
    blocks = dict(bytes_per_token=bytes_per_token, block_size=block_size,
                  pool_block_bytes=pool_block_bytes)
    least = least_kv_cache_bytes(one_request, **blocks)
    fits = budget >= least and usable_kv_bytes(kv_cache, **blocks) >= one_request
    if explicit_kv is not None:
        fits = fits and explicit_kv <= budget
    block_bytes = bytes_per_token * block_size
    curve = list(context_curve)
    # The bytes stock's own reconstruction of its budget leaves unused in its last block.
    stock_slack = max(0, requested - consumed - stock_need - cudagraph)
    oom_ctx = stock_oom_context_len(
        curve, stock_need=stock_need,
        slack=(stock_slack % block_bytes if block_bytes else 0) + max(0, noise))
    shortfall = 0
    if oom_ctx is not None:
        shortfall = max(need for _, need in curve) - stock_need
    return Admission(
        requested_bytes=requested, weights_bytes=weights, non_torch_bytes=non_torch,
        consumed_bytes=consumed, transient_bytes=worst_transient, cudagraph_bytes=cudagraph,
        margin_bytes=margin, budget_bytes=budget, kv_cache_bytes=kv_cache,
        stock_kv_cache_bytes=stock_kv, recommended_kv_cache_memory_bytes=recommended,
        explicit_kv_cache_memory_bytes=explicit_kv, bytes_per_token=bytes_per_token,
        kv_tokens_stock=kv_tokens(stock_kv, bytes_per_token, block_size),
        kv_tokens_worstcase=kv_tokens(kv_cache, bytes_per_token, block_size),
        stock_oom_context_len=oom_ctx, stock_shortfall_bytes=shortfall,
        one_request_bytes=one_request, least_kv_cache_bytes=least,
        pool_block_bytes=pool_block(bytes_per_token, block_size, pool_block_bytes), fits=fits)


def decide_budget(adm: Admission, *, mode: str, kv_cap: int | None, worst_label: str,
                  max_model_len: int, pool_ceiling: int | None = None) -> BudgetDecision:
    """enforce: the worst-case budget (or the explicit --kv-cache-memory-bytes when it fits);
    report: vLLM's own figure, measured and reported only. kv_cap limits what is allocated
    (never below one request at max_model_len and vLLM's null block). A configuration that does not fit is refused
    in enforce mode, with the flag value that would fit when an explicit one is too large.
    `pool_ceiling`: the KV pool the sweep planned its shapes for; what is allocated never
    exceeds it (more blocks would let the scheduler form wider steps than were measured)."""
    error = None
    least = least_of(adm)
    if not adm.fits and mode == "enforce":
        explicit = adm.explicit_kv_cache_memory_bytes
        worst = f"{fmt_bytes(adm.transient_bytes)} at {worst_label}"
        if explicit is not None and explicit > max(adm.budget_bytes, 0) \
                and adm.budget_bytes >= least:
            error = DoesNotFit(
                f"--kv-cache-memory-bytes {explicit} ({fmt_bytes(explicit)}) leaves no room for "
                f"the worst-case step ({worst})",
                hint=f"use --kv-cache-memory-bytes {adm.recommended_kv_cache_memory_bytes} or less")
        elif explicit is not None and explicit < least and adm.budget_bytes >= least:
            error = DoesNotFit(
                f"--kv-cache-memory-bytes {explicit} ({fmt_bytes(explicit)}) holds less than one "
                f"request at max_model_len={max_model_len}, which needs "
                f"{fmt_bytes(adm.one_request_bytes)} of KV cache{null_block_text(adm)}",
                hint=f"use --kv-cache-memory-bytes {least} or more, up to "
                     f"{adm.recommended_kv_cache_memory_bytes} (the worst-case budget), or lower "
                     f"--max-model-len")
        elif adm.margin_bytes and adm.budget_bytes + adm.margin_bytes >= least:
            room = adm.budget_bytes + adm.margin_bytes - least
            error = DoesNotFit(
                f"the margin ({fmt_bytes(adm.margin_bytes)}, --margin / margin_bytes) leaves a "
                f"KV budget of {fmt_bytes(adm.budget_bytes)}; without it "
                f"{fmt_bytes(adm.budget_bytes + adm.margin_bytes)} remain after the worst-case "
                f"step ({worst}), and one request at max_model_len={max_model_len} needs "
                f"{fmt_bytes(adm.one_request_bytes)}{null_block_text(adm)}",
                hint=f"lower the margin to at most {fmt_bytes(room)} (--margin {room})")
        else:
            error = DoesNotFit(
                f"after the worst-case step ({worst}) the KV budget is "
                f"{fmt_bytes(adm.budget_bytes)}; one request at max_model_len={max_model_len} "
                f"needs {fmt_bytes(adm.one_request_bytes)}{null_block_text(adm)}",
                hint="lower --max-model-len or --max-num-batched-tokens, or give the engine more "
                     "memory")
    if mode == "report":
        budget, reason = adm.stock_kv_cache_bytes, "report mode: vLLM's own figure"
    elif adm.explicit_kv_cache_memory_bytes is not None:
        budget, reason = adm.explicit_kv_cache_memory_bytes, "explicit --kv-cache-memory-bytes"
    else:
        budget, reason = max(0, adm.budget_bytes), "worst-case budget"
    if kv_cap is not None and budget > max(kv_cap, least):
        budget, reason = max(kv_cap, least), f"{reason}, capped by kv_cap"
    if pool_ceiling is not None and budget > max(pool_ceiling, least):
        budget, reason = max(pool_ceiling, least), f"{reason}, held at the KV pool the sweep planned"
    return BudgetDecision(budget_bytes=int(budget), reason=reason, error=error)


def least_of(adm: Admission) -> int:
    """The admission's least_kv_cache_bytes; for a record without one (a report of schema 1.11
    or older, which knew no null block), its one-request figure."""
    if adm.least_kv_cache_bytes is not None:
        return adm.least_kv_cache_bytes
    return adm.one_request_bytes or 0


def null_block_text(adm: Admission) -> str:
    """', plus the block vLLM's block pool holds back (X): Y in all', where there is one."""
    least = least_of(adm)
    one = adm.one_request_bytes or 0
    if least <= one:
        return ""
    return (f" in whole blocks plus the one vLLM's block pool holds back (its null block), "
            f"{fmt_bytes(least)} in all")


def pool_hold_text(adm: Admission) -> str | None:
    """'held at the KV pool the measured plan covers (X), below the budget's Y', where the
    recommended flag and KV cache are held there (Admission.pool_ceiling_bytes, set only below
    the budget: budget.held_at_pool); None elsewhere. The report's flag note and `wcprof diff`
    say it in these words."""
    if adm.pool_ceiling_bytes is None:
        return None
    return (f"held at the KV pool the measured plan covers ({fmt_bytes(adm.pool_ceiling_bytes)}), "
            f"below the budget's {fmt_bytes(adm.budget_bytes)}")


def host_memory_note(*, device_kind: str, explicit_kv: int | None,
                     admission: Admission) -> str | None:
    """On the CPU, without --kv-cache-memory-bytes, the budget is vLLM's share of the host's
    memory less this process's resident memory, which moves with what else the host runs (the
    same configuration read 3.14 GB on a quiet host and 2.30 GB beside other work): say so, and
    how to get a stable answer. None where the budget does not follow the host (an explicit
    size; CUDA, where vLLM checks free device memory itself)."""
    if device_kind == "cuda" or explicit_kv is not None:
        return None
    flag = f"--kv-cache-memory-bytes {admission.recommended_kv_cache_memory_bytes}" \
        if admission.fits else "--kv-cache-memory-bytes N"
    return (f"on the CPU this budget depends on the host's free memory at start (vLLM's share "
            f"of host memory, {fmt_bytes(admission.requested_bytes)}, less this process's "
            f"resident memory, {fmt_bytes(admission.consumed_bytes)}, which other work on the "
            f"host moves): another start can get another figure; for a stable answer pin the "
            f"KV cache with {flag}")


KEPT_FREE_NOTE_BYTES = 1 << 30
"""Free memory kept inside torch's allocator worth naming in allocator_note."""


def allocator_note(*, device_kind: str, alloc_conf: str | None, kept_free: int = 0) -> str | None:
    """On CUDA, where the caching allocator runs without expandable segments: the admission
    bounds the bytes each step allocates, and on a card held to its budget a step can still fail
    to find one free block that large among segments holding other tensors (fragmentation,
    which no step's peak measures). Say so, and the setting that removes it. `alloc_conf`:
    PYTORCH_CUDA_ALLOC_CONF (or PYTORCH_ALLOC_CONF) as the engine's process saw it. `kept_free`:
    what the allocator kept reserved beyond its live tensors when the held memory was read;
    from KEPT_FREE_NOTE_BYTES on, the note says that it counted as held (a freed tensor's
    segment that a live one still shares cannot be released; expandable segments can). None
    elsewhere, and where expandable segments are on."""
    if device_kind != "cuda":
        return None
    pairs = dict(item.split(":", 1) for item in (alloc_conf or "").replace(" ", "").split(",")
                 if ":" in item)
    if pairs.get("expandable_segments", "").lower() == "true":
        return None
    return ("CUDA's caching allocator runs without expandable segments "
            f"(PYTORCH_CUDA_ALLOC_CONF={alloc_conf or 'unset'}): the admission bounds what each "
            "step allocates, but on a card held to its budget a step can still fail to find one "
            "free block as large as it asks for among segments that hold other tensors "
            "(fragmentation, which no step's peak measures)"
            + (f"; here {fmt_bytes(kept_free)} that the allocator kept reserved beyond its live "
               f"tensors (segments it could not release) counted as held memory, and the KV "
               f"budget is that much smaller" if kept_free >= KEPT_FREE_NOTE_BYTES else "")
            + "; set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True where the engine starts")


def _check_non_negative(**values: int) -> None:
    for name, value in values.items():
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if value <= 0:
            raise ValueError(f"{name} must be positive, got {value}")
