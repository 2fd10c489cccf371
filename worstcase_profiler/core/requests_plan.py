"""Real requests that make the scheduler form a given step: how `--validate` reaches the report's
own worst step instead of a generic workload.

The scheduler decides what a step holds; these plans steer it with what a client controls:
prompt lengths, shared prefixes, output lengths, and the order of submission. A plan is a list
of batches, each submitted and run to completion before the next; the peak is measured over the
batches marked `measured`. Pure: no vLLM.

  prefix caching on   a warm-up prompt puts the context in the prefix cache; the measured
                      prompts share it and add their own rows, so one step holds exactly the
                      shape's rows and requests on (block-aligned) that context. Decode and mixed
                      steps line requests up the same way.
  prefix caching off  one request's chunks line up on max_num_batched_tokens boundaries, so a
                      single-request prefill is reached with the context rounded down to a
                      multiple of the chunk; several requests each on a long context cannot be
                      lined up in one step, and the plan says so (`exact=False`, `note`).

A request's prompt plus its output never exceeds max_model_len (vLLM refuses a prompt of
max_model_len tokens), so the longest reachable KV extent is max_model_len - 1.
"""

from __future__ import annotations

from dataclasses import dataclass

from .shapes import Limits, split_rows
from .types import Shape


@dataclass(frozen=True)
class Prompt:
    """Token ids: `prefix_len` tokens shared by every prompt with the same `prefix_id`, then
    `suffix_len` tokens of its own."""

    prefix_id: int
    prefix_len: int
    suffix_len: int

    @property
    def length(self) -> int:
        return self.prefix_len + self.suffix_len


@dataclass(frozen=True)
class Batch:
    label: str
    prompts: tuple[Prompt, ...]
    max_tokens: int
    measured: bool


@dataclass(frozen=True)
class RequestPlan:
    target: Shape
    """The step the measured batches reach (its context as built: block- or chunk-aligned)."""
    batches: tuple[Batch, ...]
    exact: bool
    note: str | None = None


def plan_for(shape: Shape, limits: Limits, *, prefix_caching: bool) -> RequestPlan:
    """Requests that reach `shape` (a worst step of the sweep)."""
    if shape.kind == "stock":
        return _stock(shape, limits)
    if shape.kind == "prefill":
        return _prefill(shape, limits, prefix_caching)
    if shape.kind == "decode":
        return _decode(shape, limits, prefix_caching)
    return _mixed(shape, limits, prefix_caching)


def _down(n: int, to: int) -> int:
    return max(0, n // to * to)


def _warm(prefix_id: int, length: int, limits: Limits | None = None) -> Batch:
    """One prompt of `length` shared tokens plus 1 + k of its own (k speculative tokens: vLLM
    leaves a drafter's last k - 1 tokens uncached): every full block of the shared part lands in
    the prefix cache."""
    own = 1
    if limits is not None:  # within max_model_len with its one output token
        own = max(1, min(1 + limits.num_speculative_tokens, limits.max_model_len - 1 - length))
    return Batch(f"warm the prefix cache with {length} tokens", (Prompt(prefix_id, length, own),),
                 max_tokens=1, measured=False)


def _stock(shape: Shape, limits: Limits) -> RequestPlan:
    n = min(shape.num_reqs, limits.max_num_seqs, shape.rows)
    prompts = tuple(Prompt(100 + i, 0, r) for i, r in enumerate(split_rows(shape.rows, n)))
    return RequestPlan(target=Shape("stock", shape.rows, 0, n),
                       batches=(Batch(f"{n} fresh prompts of {shape.rows} tokens together",
                                      prompts, 1, True),), exact=n == shape.num_reqs)


def _prefill(shape: Shape, limits: Limits, prefix_caching: bool) -> RequestPlan:
    n, rows, mml = shape.num_reqs, shape.rows, limits.max_model_len
    largest = -(-rows // n)
    reachable = min(shape.context_len, mml - 1 - largest)
    dropped = limits.hit_drop
    if prefix_caching and rows // n > dropped:
        # A drafter that drops a hit's last block (dropped > 0) leaves each prompt computing
        # that block again: the shared prefix is one block longer and each tail one block
        # shorter, so the step still holds `rows` on `ctx`.
        ctx = _down(reachable, limits.block_size)
        shared = ctx + dropped
        prompts = tuple(Prompt(1, shared, r - dropped) for r in split_rows(rows, n))
        return RequestPlan(
            target=Shape("prefill", rows, ctx, n),
            batches=(_warm(1, shared, limits),
                     Batch(f"{n} prompt(s) on a cached {shared}-token prefix, "
                           f"{rows - n * dropped} new tokens in all", prompts, 1, True)),
            exact=shape.context_len - ctx <= limits.block_size,
            note=None if ctx == shape.context_len else
            f"context {ctx}: the longest block-aligned one a real request reaches")
    if n > 1:
        why = (f"a prefix-cache hit leaves each request {limits.prefix_hit_min_rows} rows to "
               f"compute (the drafter drops the hit's last block), more than this step's "
               f"{rows // n}" if prefix_caching else
               "without prefix caching several requests each on a long context cannot be "
               "lined up in one step")
        return RequestPlan(
            target=Shape("prefill", rows, 0, n),
            batches=(Batch(f"{n} fresh prompts of {rows} tokens together",
                           tuple(Prompt(100 + i, 0, r) for i, r in enumerate(split_rows(rows, n))),
                           1, True),),
            exact=False, note=f"{why}: measured on an empty context")
    ctx = _down(reachable, limits.max_num_batched_tokens)
    return RequestPlan(
        target=Shape("prefill", rows, ctx, 1),
        batches=(Batch(f"1 prompt of {ctx + rows} tokens, its last chunk {rows} tokens",
                       (Prompt(1, 0, ctx + rows),), 1, True),),
        exact=ctx == shape.context_len,
        note=None if ctx == shape.context_len else
        f"context {ctx}: without prefix caching chunks start at multiples of "
        f"max_num_batched_tokens={limits.max_num_batched_tokens}")


DECODE_STEPS = 4


def _decode(shape: Shape, limits: Limits, prefix_caching: bool) -> RequestPlan:
    n, mml = shape.num_reqs, limits.max_model_len
    n = min(n, limits.max_num_seqs)
    per_req = limits.rows_per_decode
    steps = DECODE_STEPS + limits.num_speculative_tokens
    if prefix_caching:
        # Each prompt tops the block-aligned shared prefix up with its own tail (at most a block),
        # so the batch decodes at max_model_len - 1. The tails may need several prefill steps;
        # the output is long enough that every request still decodes in the same last steps.
        # (plus the block a drafter's hit drops: hit_drop).
        tail = limits.block_size + limits.hit_drop
        steps += -(-n * tail // limits.max_num_batched_tokens)
        prompt = mml - 1 - steps
        ctx = _down(prompt - 1, limits.block_size)
        prompts = tuple(Prompt(1, ctx, prompt - ctx) for _ in range(n))
        return RequestPlan(
            target=Shape("decode", n * per_req, prompt + steps - 1 - per_req, n),
            batches=(_warm(1, ctx, limits),
                     Batch(f"{n} prompts of {prompt} tokens sharing a cached {ctx}-token prefix, "
                           f"decoding {steps} tokens together", prompts, steps, True)),
            exact=n == shape.num_reqs,
            note=None if n == shape.num_reqs else f"{n} requests: max_num_seqs")
    prompt = mml - 1 - steps
    prompts = tuple(Prompt(10 + i, 0, prompt) for i in range(n))
    return RequestPlan(
        target=Shape("decode", n * per_req, prompt, n),
        batches=(Batch(f"{n} prompts of {prompt} tokens, then decode", prompts, steps, True),),
        exact=False,
        note="without prefix caching the prompts prefill one after another, so fewer of them "
             "decode together at full context than the step holds")


def _mixed(shape: Shape, limits: Limits, prefix_caching: bool) -> RequestPlan:
    decodes = shape.num_reqs - 1
    per_req = limits.rows_per_decode
    mnbt, mml, block = limits.max_num_batched_tokens, limits.max_model_len, limits.block_size
    chunk = shape.rows - decodes * per_req
    if not prefix_caching or decodes < 1:
        return _prefill(Shape("prefill", chunk, shape.context_len, 1), limits, prefix_caching)
    steps = DECODE_STEPS + limits.num_speculative_tokens
    decode_ctx = _down(mml - 1 - steps - 1, block)
    # The long prompt's first chunk shares step 1 with the decodes' one-token prefills; its
    # second chunk (the measured one) shares step 2 with their first decode.
    first = mnbt - decodes
    long_ctx = _down(mml - 1 - chunk - first, block)
    prompts = tuple(Prompt(1, decode_ctx, 1) for _ in range(decodes)) + \
        (Prompt(2, long_ctx, first + chunk),)
    return RequestPlan(
        target=Shape("mixed", decodes * per_req + chunk, long_ctx + first, shape.num_reqs),
        batches=(_warm(1, decode_ctx), _warm(2, long_ctx),
                 Batch(f"{decodes} decodes on a cached {decode_ctx}-token prefix beside a "
                       f"{first + chunk}-token prompt on a cached {long_ctx}-token prefix",
                       prompts, steps, True)),
        exact=False,
        note="the decodes and the chunk share a step when the scheduler runs them together; "
             "the chunk's context is block-aligned")


def token_ids(prompt: Prompt, vocab: int, salt: int) -> list[int]:
    """Deterministic ids: the shared prefix depends only on prefix_id, the suffix on salt."""
    def ids(seed: int, n: int) -> list[int]:
        return [(seed * 7919 + i * 31) % (vocab - 1) + 1 for i in range(n)]
    return ids(1000 + prompt.prefix_id, prompt.prefix_len) + ids(50000 + salt, prompt.suffix_len)
