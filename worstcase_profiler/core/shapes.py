"""Which synthetic steps the scheduler can form: a pure function of the engine limits.

Every tensor-parallel rank derives the same plan from the same limits, and `plan_fingerprint`
lets the ranks prove it before any step runs (a mismatch would deadlock the collectives).
Worst case within a step means the longest KV extent each request can have: a request never
grows past max_model_len, so a chunk of R rows sits on max_model_len - R cached tokens.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, fields
from typing import Iterable

from ..errors import ConfigError
from .types import Shape


@dataclass(frozen=True)
class Limits:
    """The scheduler limits that bound a step. kv_capacity_tokens, when known, caps how many
    full-length requests can be resident at once — unless prefix caching is on: then requests
    that share one cached prefix each sit at the full extent while the pool holds the prefix
    once plus one block per request (long-context chunked prefill on a shared prefix), so the pool bounds
    the request count, not each request's context.

    kv_capacity_tokens is the pool in bytes_per_token units (a token in every attention layer).
    A max_model_len request costs its block-rounded length in that unit unless some KV groups
    keep only a trailing window of it (full_request_tokens): every count derived here is an
    upper bound on what the scheduler can form, never below vLLM's own max concurrency."""

    max_model_len: int
    max_num_batched_tokens: int
    max_num_seqs: int
    num_speculative_tokens: int = 0
    block_size: int = 16
    kv_capacity_tokens: int | None = None
    prefix_caching: bool = False
    prefix_hit_min_rows: int = 1
    """With prefix caching, the fewest prompt tokens a request that hits the cache still computes
    in its step: 1; under a drafter (EAGLE, MTP; DFlash, DSpark up to vLLM 0.32; none where
    0.33's lookahead block hashes are on) that makes vLLM drop the last matched block
    (`use_eagle_block_drop`), that block (prefix_hit_drop) plus the one token a
    single KV group's hit always leaves (vLLM caps it at the prompt's length minus one), or the
    block alone where several groups let a block-aligned, fully cached prompt hit at its length
    minus one block. Requests on a long shared context share a prefill step only through such
    hits, so at most rows // prefix_hit_min_rows of them do. The adapter leaves it at 1 wherever
    another route exists (adapter/facts.py)."""
    prefix_hit_drop: int = 0
    """The rows a prefix-cache hit gives back to compute under such a drafter: the dropped block
    (the cache's hit unit); 0 without one. Never more than prefix_hit_min_rows."""
    prefix_request_tokens: int | None = None
    """With prefix caching, the KV capacity (in kv_capacity_tokens' unit) each request beyond the
    first on one shared full-length prefix takes: one block when None. Where requests share a
    step only on cached hits of their own (a Mamba hybrid in "align" mode on vLLM 0.32,
    adapter/facts.sibling_hits_serialize), each holds its own cached last block and a new block
    in every KV group (adapter/kv.prefix_request_tokens), which bounds how many fit at once."""
    full_request_tokens: int | None = None
    """The fewest KV capacity tokens (kv_capacity_tokens' unit) one request at max_model_len
    holds, where KV groups that keep only a trailing window of it (sliding window beside full
    attention: Gemma 2/3, gpt-oss, Mistral; chunked local attention) make that less than its
    block-rounded length: `request_capacity_tokens` computes it from vLLM's KV groups
    (adapter/kv.full_request_tokens). None: every group holds the whole request.
    `tokens_per_full_request` takes the smaller of the two, so it never lowers a count."""
    state_request_tokens: int = 0
    """KV capacity tokens (kv_capacity_tokens' unit) a request holds whatever its length: each
    Mamba group's recurrent state, 1 + k blocks of the pool per request (its running state's
    block, and under speculative decoding the k speculative blocks vLLM's MambaManager
    allocates with the request and keeps: its `max_num_reqs * (num_spec + 1)` slots), from
    adapter/kv.state_request_tokens. 0 without a Mamba group. Added to every request's cost, so
    fewer requests sit at the full extent at once; a request at extent E still costs at least E
    * tokens_per_full_request / rounded_model_len (the fixed blocks cost no less when shorter)."""

    draft_slots: int = 0
    """Input slots each scheduled request takes from max_num_batched_tokens beyond its own rows:
    vLLM's scheduler charges every request it schedules `num_new_tokens + draft_slots`
    (speculative_config.max_num_new_slots_for_drafting: DFlash k, DSpark and parallel EAGLE
    k - 1, a draft model 1, EAGLE/MTP/n-gram 0), so a step of n prefill requests holds at most
    max_num_batched_tokens - n * draft_slots rows (`rows_for`: the split prefills and the fresh
    prefill batch). Decode and mixed steps keep counting 1 + k rows a request and nothing more:
    a verifying request may carry fewer drafts than k (the last one of a step, structured
    output), and is then charged less, so more of them fit than (1 + k + draft_slots) allows.
    0 where vLLM has no such charge (before 0.32) or no drafter: then every count is as before."""
    stock_reruns_with_kv: bool = True
    """Whether vLLM runs its own profile step (stock_shape) again once the KV cache exists, so
    that it shares the device with the pool. On vLLM 0.32's GPU worker the V1 runner does (its
    sampler warm-up over min(max_num_seqs, max_num_batched_tokens) requests), and so do a V2
    runner's compile warm-up where its sizes include one, FlashInfer's autotune, elastic EP and
    adaptive verification; otherwise a V2 runner's kernel warm-up caps its requests at what the
    pool holds, and the CPU worker warms up before the KV cache only
    (adapter/facts.stock_rerun_why). True unless the adapter knows otherwise: where it is
    False and the pool holds fewer requests at once than stock's, no step vLLM or its
    scheduler runs beside the KV cache has stock's shape (stock_excluded_why)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if (value is None and f.name in ("kv_capacity_tokens", "prefix_request_tokens",
                                             "full_request_tokens")) \
                    or f.name in ("prefix_caching", "stock_reruns_with_kv"):
                continue
            floor = 0 if f.name in ("num_speculative_tokens", "state_request_tokens",
                                    "prefix_hit_drop", "draft_slots") else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < floor:
                raise ConfigError(
                    f"{f.name} must be an integer >= {floor}, got {value!r}",
                    hint=f"pass a {'non-negative' if floor == 0 else 'positive'} --"
                         f"{f.name.replace('_', '-')} (or fix the engine config)")
        if self.prefix_hit_drop > self.prefix_hit_min_rows:
            raise ConfigError(
                f"prefix_hit_drop {self.prefix_hit_drop} exceeds prefix_hit_min_rows "
                f"{self.prefix_hit_min_rows}: a hit that gives back a block leaves at least it",
                hint="derive both from one config (adapter/facts.prefix_hit_rows)")

    @property
    def hit_drop(self) -> int:
        """Rows a prefix-cache hit gives back to compute: the dropped block
        (prefix_hit_drop) under such a drafter, else 0."""
        return self.prefix_hit_drop

    @property
    def rows_per_decode(self) -> int:
        """A decode request schedules its next token plus every speculative token."""
        return self.num_speculative_tokens + 1

    @property
    def max_prefill_requests(self) -> int:
        """The most prefill requests one step holds: each takes a row and its drafting slots."""
        return self.max_num_batched_tokens // (1 + self.draft_slots)

    def rows_for(self, num_reqs: int, rows: int | None = None) -> int:
        """The most rows a step of `num_reqs` requests holds: `rows` (default
        max_num_batched_tokens), less each request's drafting slots; at least one a request."""
        rows = self.max_num_batched_tokens if rows is None else rows
        return max(num_reqs, min(rows, self.max_num_batched_tokens - num_reqs * self.draft_slots))

    @property
    def rounded_model_len(self) -> int:
        """max_model_len rounded up to whole blocks."""
        return -(-self.max_model_len // self.block_size) * self.block_size

    @property
    def tokens_per_full_request(self) -> int:
        """KV capacity tokens one request at max_model_len occupies: its length rounded up to
        whole blocks, or full_request_tokens where windowed KV groups make it less, plus
        state_request_tokens (a recurrent state's 1 + k blocks in each Mamba group). A request at
        extent E <= max_model_len then costs at least E * tokens_per_full_request /
        rounded_model_len (`request_capacity_tokens`' contract), which `_extent_for` inverts."""
        rounded = self.rounded_model_len
        if self.full_request_tokens is not None:
            rounded = min(rounded, self.full_request_tokens)
        return rounded + self.state_request_tokens

    @property
    def max_resident_requests(self) -> int | None:
        """How many max_model_len requests the KV cache holds at once; None when capacity is
        unknown. Each costs tokens_per_full_request: where KV groups keep only a window, vLLM's
        pool gives each group its own blocks, so this counts pool blocks per group the way
        vLLM's get_max_concurrency_for_kv_cache_config does (and is never below it: a window
        group is charged the window a decoding request keeps, not vLLM's admission cap). With
        prefix caching they share one full-length prefix and each own one block per group
        (decoding siblings hold one block per group at most: the floor stays one block, which
        is block_size capacity tokens over all groups together), plus their recurrent state's
        blocks (state_request_tokens: a Mamba group's 1 + k, which no sibling shares)."""
        return self._resident(self.sibling_tokens)

    @property
    def max_distinct_hit_requests(self) -> int | None:
        """max_resident_requests for a prefill step whose requests each hit a cached block of
        their own (prefix_request_tokens each, or sibling_tokens where that is more: both are
        lower bounds on what such a request holds); only split prefills use it."""
        return self._resident(max(self.prefix_request_tokens or 0, self.sibling_tokens))

    @property
    def max_concurrent_requests(self) -> int | None:
        """How many requests of any length the KV cache holds at once; None when capacity is
        unknown. Each holds at least sibling_tokens (a block of its own and its recurrent
        state's blocks), so this is an upper bound on any step's requests: where a state's 1 + k
        blocks a Mamba group make it fewer than max_num_seqs, wider steps are
        never formed."""
        if self.kv_capacity_tokens is None:
            return None
        return max(1, self.kv_capacity_tokens // self.sibling_tokens)

    @property
    def sibling_tokens(self) -> int:
        """The fewest capacity tokens a request beside others on one cached prefix holds: a
        block of its own, and its recurrent state's blocks (1 + k a Mamba group)."""
        return self.block_size + self.state_request_tokens

    def _resident(self, own: int) -> int | None:
        if self.kv_capacity_tokens is None:
            return None
        if self.prefix_caching:
            spare = self.kv_capacity_tokens - self.tokens_per_full_request
            return spare // own + 1 if spare >= 0 else 0
        return self.kv_capacity_tokens // self.tokens_per_full_request


def request_capacity_tokens(*, max_model_len: int, block_size: int, pool_block_bytes: int,
                            bytes_per_token: int,
                            groups: Iterable[tuple[int, int, int | None]]) -> int | None:
    """Limits.full_request_tokens: the fewest KV capacity tokens one request at max_model_len
    holds in vLLM's pool, or None when no KV group keeps only a window (then every group holds
    the whole request and the block-rounded max_model_len stays the cost, bit for bit).

    The pool, as vLLM lays it out: num_blocks blocks of `pool_block_bytes`, each serving one KV
    group at a time (every group draws from the one pool). A capacity token is
    `bytes_per_token` bytes (kv_capacity_tokens = pool bytes // bytes_per_token). `groups` has,
    per KV group on the device pool:
      (block_size, reserved_blocks, kept_tokens)
      - block_size: tokens per block of that group;
      - reserved_blocks: the blocks vLLM counts for one max_model_len request there,
        cdiv(spec.max_memory_usage_bytes, spec.page_size_bytes), the terms
        get_max_concurrency_for_kv_cache_config sums;
      - kept_tokens: for a group that frees what falls behind a trailing window, the fewest
        trailing tokens a decoding request keeps there (sliding window: the window, since a
        decode step keeps window - 1 computed tokens plus the new one; chunked local
        attention: 1, a request just past a chunk boundary); None for any other group.
    A windowed group holds min(reserved, cdiv(min(kept, max_model_len), block)) blocks of the
    request, any other group its reserved blocks. The sum, in capacity tokens, is scaled by
    R / X (R = max_model_len rounded to `block_size`, X = the largest rounding over R and the
    groups' blocks: R when every group has `block_size`) and rounded down.

    Guarantees (the plan's counts are upper bounds on what the scheduler forms):
      - every term is at most vLLM's own (its window groups reserve the admission cap, window
        plus in-flight tokens plus one), so kv_capacity_tokens // result >= vLLM's
        max concurrency for the same pool;
      - a request at extent E <= max_model_len costs at least E * result / R capacity tokens
        (each group's blocks over E never fall below their value at max_model_len over X),
        which is what `_extent_for` inverts."""
    groups = list(groups)
    if not any(kept is not None for _, _, kept in groups):
        return None
    held = 0
    widest = -(-max_model_len // block_size) * block_size
    rounded = widest
    for group_block, reserved, kept in groups:
        if kept is not None:
            reserved = min(reserved, -(-min(kept, max_model_len) // group_block))
        held += reserved
        widest = max(widest, -(-max_model_len // group_block) * group_block)
    return max(1, held * pool_block_bytes * rounded // (bytes_per_token * widest))


_UNKNOWN = 1 << 62


def agreed(limits: Limits, agree_max) -> Limits:
    """The limits every rank plans with, from each rank's own KV arithmetic: the largest pool and
    the cheapest request any rank computed (`agree_max`: the max of an int over every rank, a
    collective every rank calls in the same order). Pipeline-parallel ranks hold different layers,
    so their figures differ; a different plan per rank would hang the sweep's collectives. The
    largest request counts are the safe direction. None (unknown) stays None when any rank has it
    for the pool, or every rank for a request's cost."""
    def most(v):
        out = agree_max(_UNKNOWN if v is None else int(v))
        return None if out >= _UNKNOWN else out

    def fewest(v):
        out = -agree_max(-(_UNKNOWN if v is None else int(v)))
        return None if out >= _UNKNOWN else out

    return dataclasses.replace(limits, kv_capacity_tokens=most(limits.kv_capacity_tokens),
                               full_request_tokens=fewest(limits.full_request_tokens),
                               prefix_request_tokens=fewest(limits.prefix_request_tokens),
                               state_request_tokens=fewest(limits.state_request_tokens))


def stock_shape(limits: Limits) -> Shape:
    """vLLM's own profile step: max_num_batched_tokens rows spread over up to max_num_seqs
    requests, no KV."""
    rows = limits.max_num_batched_tokens
    return Shape(kind="stock", rows=rows, context_len=0, num_reqs=min(limits.max_num_seqs, rows))


def stock_excluded_why(limits: Limits) -> str | None:
    """Why the worst case need not hold vLLM's own profile step, or None where it must.

    The stock step always runs once, in vLLM's profile, before the KV cache exists. Beside the
    pool it can only come back two ways: vLLM runs it again after allocating the KV cache
    (limits.stock_reruns_with_kv), or the scheduler forms it from real requests, which needs
    stock's request count resident at once. Where neither can happen (a pool of fewer requests
    than stock's, e.g. a recurrent state holding 1 + k blocks of each request in each Mamba
    group), the figure vLLM's profile read is not a step of serving; the stock step is still
    measured and reported, and its verdict compared, as before."""
    cap, reqs = limits.max_concurrent_requests, stock_shape(limits).num_reqs
    if limits.stock_reruns_with_kv or cap is None or reqs <= cap:
        return None
    return (f"vLLM's profile step ({stock_shape(limits).label()}) runs only before the KV "
            f"cache exists, and the KV pool the sweep planned "
            f"({limits.kv_capacity_tokens:,} tokens) holds at most {cap} requests at once, so "
            f"neither vLLM nor its scheduler runs a step of {reqs} requests beside it")


def fresh_prefill_batch(limits: Limits) -> Shape | None:
    """Where the stock step leaves the worst case (stock_excluded_why), the step that stands
    in for it: max_num_batched_tokens rows (less each request's drafting slots,
    Limits.rows_for) of fresh prompts (no cached context) over as many requests as the pool
    holds at once (max_concurrent_requests, at most max_num_seqs, and at most as many as the
    budget gives a row and its drafting slots). Its
    per-request costs (sampling, a drafter's 1 + k rows each) are what made stock's the largest
    step, and no other shape spreads a full budget over that many requests: split_prefills
    stops where prefix hits stop lining requests up on a long context. None where stock
    counts (it has at least as many requests on the same rows) or the step is one request
    (the context ladder's empty rung). A batch of short fresh prompts over the whole pool can
    need more than every swept step (docs/sweep.md has the measured case)."""
    if stock_excluded_why(limits) is None:
        return None
    budget = limits.max_num_batched_tokens
    n = min(limits.max_num_seqs, limits.max_prefill_requests,
            limits.max_concurrent_requests or budget)
    return Shape(kind="prefill", rows=limits.rows_for(n), context_len=0,
                 num_reqs=n) if n > 1 else None


def most_fresh_requests(limits: Limits) -> int:
    """The most requests one step of the sweep's own plan holds on no cached context (the fresh
    prefill batch, a split prefill whose requests' extent is their chunk), at least 1. The
    sweep's stock step is not counted: the sweep runs it as vLLM's profile does, with no
    attention metadata (measure_stock), so it gives no state slots; a stock-kind shape built
    through `measure` (the advisor's and the fit's candidates at another chunk or max_num_seqs)
    does, and so do those candidates' fresh batches and split prefills, which this count does
    not cover: a driver refuses those beyond its pool (`state_slots_beyond_pool`). A driver
    whose dummy steps give such requests' recurrent states slots 1..n of the KV pool (vLLM's
    V2 runner: valid_dummy_state_slots; with a context the ids wrap around the pool instead)
    needs a provisional pool of at least n + 1 blocks."""
    found = [fresh_prefill_batch(limits), *split_prefills(limits, limits.max_num_batched_tokens)]
    return max([1, *(s.num_reqs for s in found if s is not None and s.context_len == 0)])


def most_requests(limits: Limits) -> int:
    """The most requests any step beside the rows curve holds (the split prefills at the full
    budget, the decode batches, the mixed steps, the fresh prefill batch), at least 1: the
    recurrent-state slots a driver whose every request needs one of its own (vLLM 0.32's CPU
    GDN kernels: one conv-state row per request) gives a provisional pool."""
    found = [*split_prefills(limits, limits.max_num_batched_tokens),
             *extra_steps(limits, limits.max_num_batched_tokens)]
    return max([1, *(s.num_reqs for s in found)])


def state_slots_beyond_pool(shape: Shape, pool_blocks: int) -> str | None:
    """Why a driver that gives a dummy step's requests on no cached context the recurrent-state
    slots 1..n of its provisional KV pool (vLLM's V2 runner with valid_dummy_state_slots, on a
    hybrid model) cannot build `shape` on a pool of `pool_blocks` blocks, or None where it can:
    n + 1 blocks are needed (slot 0 is the null block), or the state gather reads past the pool
    (a CUDA bounds-check failure that kills the engine). A step on a context has its block ids
    wrap around the pool (set_dummy_context) and is never refused here."""
    if shape.context_len > 0 or shape.kind == "mixed":
        return None
    if shape.num_reqs + 1 <= pool_blocks:
        return None
    return (f"{shape.num_reqs} requests on no context need {shape.num_reqs + 1} recurrent-state "
            f"slots; the provisional KV pool holds {pool_blocks} blocks")


def prefill_chunk(limits: Limits, rows: int) -> Shape:
    """R new tokens for one request on top of max_model_len - R cached tokens. R beyond
    max_model_len cannot belong to one request, so it is split as evenly as possible over
    ceil(R / max_model_len) requests, the largest of which ends exactly at max_model_len
    (see `request_layout`). The request count is not capped by max_num_seqs: a step the
    scheduler cannot form only over-estimates, which is the safe direction. The chunk keeps the
    full budget under a drafter with drafting slots (one request's slots beyond what the
    scheduler forms): that is not slack to trim. V1's drafter dummy run takes the step's rows,
    while real parallel drafters run on rows + n * draft_slots, up to the full budget; this
    chunk is the step that measures the drafter at the full budget."""
    _check_rows(limits, rows)
    num_reqs = -(-rows // limits.max_model_len)
    largest = -(-rows // num_reqs)
    return Shape(kind="prefill", rows=rows, context_len=limits.max_model_len - largest,
                 num_reqs=num_reqs)


def split_prefills(limits: Limits, rows: int) -> list[Shape]:
    """The same R rows (less n requests' drafting slots where a drafter takes input slots of
    its own, Limits.rows_for) spread over n = 2, 4, 8, ... prefill requests (up to max_num_seqs
    and max_concurrent_requests), each ending at max_model_len: the scheduler forms these when one
    request's last chunk and the next one's first share a step. Per-request metadata and kernel
    splits scale with n. With prefix caching, n stops at rows // prefix_hit_min_rows: each
    request on the shared context reached it through a cache hit, which leaves that many rows to
    compute (without it the shapes stay, over-estimates, since nothing else lines long requests
    up). When the KV pool holds fewer full-length requests on the shared prefix than the largest
    n, that count is a shape too: the most requests that can sit at the full extent at once.

    The largest n itself is always a shape, not only the powers of two below it: a cap that is
    not a power of two (the pool's concurrency, the rows a hit leaves) would otherwise leave the
    widest reachable step unswept. With prefix caching, that n is 1 + (R - 1) // m (m =
    prefix_hit_min_rows): the hits' requests plus one more whose prompt's last chunk is shorter
    than m; R // m, where every request is on the shared context through a hit (the widest step
    `--validate`'s prompts form), is a shape too."""
    _check_rows(limits, rows)
    most = min(limits.max_num_seqs, rows, limits.max_prefill_requests,
               limits.max_concurrent_requests or rows)
    formable = None
    if limits.prefix_caching:
        formable = rows // limits.prefix_hit_min_rows
        most = min(most, 1 + (rows - 1) // limits.prefix_hit_min_rows)
    counts = []
    n = 2
    while n <= most:
        counts.append(n)
        n *= 2
    resident = limits.max_distinct_hit_requests if limits.prefix_caching else None
    for extra in (most, formable if formable is not None and formable < most else None,
                  resident if resident is not None and resident < most else None):
        if extra is not None and extra >= 2 and extra not in counts:
            counts = sorted([*counts, extra])
    out = []
    for n in counts:
        n_rows = limits.rows_for(n, rows)  # each request's drafting slots come out of the budget
        largest = -(-n_rows // n)
        extent = _extent_for(limits, n)
        if largest <= extent:
            out.append(Shape(kind="prefill", rows=n_rows, context_len=extent - largest,
                             num_reqs=n))
    return out


def _extent_for(limits: Limits, num_reqs: int) -> int:
    """The longest sequence each of `num_reqs` requests can have at once: max_model_len, or what
    the KV capacity lets that many hold when that is smaller. An upper bound (the safe
    direction): a request at extent E costs at least E * B / R + S capacity tokens (S =
    state_request_tokens, a recurrent state's blocks, held whatever E is; B =
    tokens_per_full_request - S; R = rounded_model_len; B = R without windowed groups), so
    without prefix caching E <= (capacity - n * S) * R / (n * B), capacity // n when B = R and
    S = 0.

    With prefix caching the requests can share one cached prefix and each own at least one
    block per group beyond it and their state (sibling_tokens), so E * B / R + S + (n - 1) *
    sibling_tokens <= capacity: max_model_len while the pool holds the shared full-length
    prefix plus a block per request (n <= max_resident_requests), and above that count still
    far more than capacity // n, which would plan those steps too short. The state is not
    scaled down with E: many short requests under speculative decoding are planned at the
    extent such a pool leaves them, which requests on one cached prefix then reach."""
    if limits.kv_capacity_tokens is None:
        return limits.max_model_len
    resident = limits.max_resident_requests
    if limits.prefix_caching and resident is not None and num_reqs <= resident:
        return limits.max_model_len
    rounded, state = limits.rounded_model_len, limits.state_request_tokens
    body = limits.tokens_per_full_request - state
    cap = limits.kv_capacity_tokens
    extent = max(0, cap - num_reqs * state) * rounded // (num_reqs * body)
    if limits.prefix_caching:  # never below the private bound (both bound the same steps)
        shared = cap - (num_reqs - 1) * limits.sibling_tokens - state
        extent = max(extent, shared * rounded // body)
    return max(1, min(limits.max_model_len, extent))


def wide_decode_batch(limits: Limits) -> Shape | None:
    """As many decode requests as max_num_seqs and the token budget allow, each as long as the
    KV capacity lets that many be at once: more sampler rows and metadata than the full-context
    batch, which the capacity caps. None when it is the same shape as decode_batch."""
    per_req = limits.rows_per_decode
    n = max(1, min(limits.max_num_seqs, limits.max_num_batched_tokens // per_req,
                   limits.max_concurrent_requests or limits.max_num_seqs))
    shape = Shape(kind="decode", rows=n * per_req,
                  context_len=max(0, _extent_for(limits, n) - per_req), num_reqs=n)
    return None if shape == decode_batch(limits) else shape


def decode_batch(limits: Limits) -> Shape:
    """As many decode requests as the limits allow, each scheduling 1 + k speculative rows on
    a full-length context."""
    per_req = limits.rows_per_decode
    candidates = [limits.max_num_seqs, limits.max_num_batched_tokens // per_req]
    if limits.max_resident_requests is not None:
        candidates.append(limits.max_resident_requests)
    n = max(1, min(candidates))
    return Shape(kind="decode", rows=n * per_req,
                 context_len=max(0, limits.max_model_len - per_req), num_reqs=n)


def mixed_step(limits: Limits) -> Shape | None:
    """Full-context decodes (at most max_num_seqs - 1, leaving at least one row) plus one
    prefill chunk filling the remaining rows, capped at max_model_len. num_reqs - 1 requests
    are decodes; the shape's context_len is the prefill's. None when no decode fits (that is
    a pure prefill) or the prefill part is no bigger than a decode (a pure decode batch)."""
    per_req = limits.rows_per_decode
    n_budget = limits.max_num_batched_tokens
    candidates = [limits.max_num_seqs - 1, (n_budget - 1) // per_req]
    if limits.max_resident_requests is not None:
        candidates.append(limits.max_resident_requests - 1)
    decodes = min(candidates)
    if decodes <= 0:
        return None
    prefill_rows = min(n_budget - decodes * per_req, limits.max_model_len)
    if prefill_rows <= per_req:
        return None
    return Shape(kind="mixed", rows=decodes * per_req + prefill_rows,
                 context_len=limits.max_model_len - prefill_rows, num_reqs=decodes + 1)


def mixed_pair(limits: Limits) -> Shape | None:
    """One full-context decode beside the largest prefill chunk (the budget less the decode's
    rows, capped at max_model_len) at the longest context that chunk reaches: the mixed step
    whose prefill side is the largest, where mixed_step's decode side is. Real traffic forms it
    whenever a long prompt's chunk is scheduled while another long request decodes; per-decode
    buffers (a sparse indexer's logits row, drafting slots) then sit on top of a full chunk's,
    which neither the chunk alone nor mixed_step (its chunk shortened by every decode, or absent
    where the decodes take the whole budget) measures. None where two requests cannot be
    resident at once (max_num_seqs, the pool), the chunk would be no bigger than a decode, or
    mixed_step is this very shape."""
    per_req = limits.rows_per_decode
    if limits.max_num_seqs < 2 or (limits.max_resident_requests is not None
                                   and limits.max_resident_requests < 2):
        return None
    prefill_rows = min(limits.max_num_batched_tokens - per_req, limits.max_model_len)
    if prefill_rows <= per_req:
        return None
    shape = Shape(kind="mixed", rows=per_req + prefill_rows,
                  context_len=limits.max_model_len - prefill_rows, num_reqs=2)
    return None if shape == mixed_step(limits) else shape


def extra_steps(limits: Limits, worst_rows: int) -> list[Shape]:
    """The shapes measured beside the rows curve and the context ladder, in the order a sweep
    runs them: the worst rows split over more requests (split_prefills), the decode batches,
    the mixed steps and the fresh prefill batch, each where it exists."""
    found = [*split_prefills(limits, worst_rows), decode_batch(limits), wide_decode_batch(limits),
             mixed_step(limits), mixed_pair(limits), fresh_prefill_batch(limits)]
    return [s for s in found if s is not None]


def request_layout(limits: Limits, shape: Shape) -> list[tuple[int, int]]:
    """(query_len, context_len) per request: how the adapter should build `shape`.

    prefill/stock: rows split evenly over num_reqs (the first rows % num_reqs get one more),
    each on shape.context_len. decode: num_reqs x (k+1) rows on shape.context_len. mixed:
    num_reqs - 1 full-context decodes, then the prefill chunk on shape.context_len."""
    if shape.kind == "mixed":
        per_req = limits.rows_per_decode
        decodes = shape.num_reqs - 1
        decode_ctx = max(0, limits.max_model_len - per_req)
        prefill_rows = shape.rows - decodes * per_req
        return [(per_req, decode_ctx)] * decodes + [(prefill_rows, shape.context_len)]
    return [(rows, shape.context_len) for rows in split_rows(shape.rows, shape.num_reqs)]


def split_rows(rows: int, n: int) -> list[int]:
    """`rows` spread as evenly as possible over `n` requests, the first rows % n one larger."""
    base, extra = divmod(rows, n)
    return [base + (1 if i < extra else 0) for i in range(n)]


def context_ladder(limits: Limits, rows: int) -> list[int]:
    """KV extents at which a chunk of `rows` is re-run: empty, 1/8, 1/4, 1/2 and full length,
    and one token past every power of two of the KV length the chunk reads (context + rows)
    that is above both the chunk's rows and mml / 16: attention and sparse-indexer kernels pick
    splits and buffer sizes by powers of two of it, so a chunk that reads just past one can
    need more than the coarse rungs around it (a 131k DSv3.2 engine's traffic set its mark with
    a chunk reading 32,772 tokens, 5 MiB above every coarse rung; whether the boundary is the
    cause is not measured yet). The top rung is the prefill chunk's own context (max_model_len
    - rows for one request)."""
    top = prefill_chunk(limits, rows).context_len
    mml = limits.max_model_len
    rungs = {0, mml // 8, mml // 4, mml // 2, top}
    power = 1 << max(max(1, rows).bit_length(), (mml // 16).bit_length())
    while power - rows + 1 <= top:
        rungs.add(power - rows + 1)
        power <<= 1
    return sorted(c for c in rungs if 0 <= c <= top)


def plan_fingerprint(shapes: Iterable[Shape]) -> str:
    """16 hex chars of sha256 over the ordered (kind, rows, context_len, num_reqs) tuples; ranks
    compare it before running anything. It depends on the core Shape only, not on how a report
    spells it."""
    canonical = json.dumps([[s.kind, s.rows, s.context_len, s.num_reqs] for s in shapes],
                           separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _check_rows(limits: Limits, rows: int) -> None:
    if not (1 <= rows <= limits.max_num_batched_tokens):
        raise ValueError(
            f"rows must be in 1..max_num_batched_tokens={limits.max_num_batched_tokens}, "
            f"got {rows}")
