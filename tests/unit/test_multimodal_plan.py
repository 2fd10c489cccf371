"""The multimodal replay (`--validate worst` on a model with an encoder step): which requests
carry how many images where, on which context (core/requests_plan.multimodal_plan), whether a
replay reached its step (replay_rules.replay_reached with encoder items), which validation gates
(report.gating_validation), and the prompts the adapter builds from a plan
(adapter/validation.multimodal_workload). No vLLM."""

from __future__ import annotations

import dataclasses

import pytest

from worstcase_profiler.core.replay_rules import replay_reached
from worstcase_profiler.core.requests_plan import ItemSpec, multimodal_plan, token_ids
from worstcase_profiler.core.shapes import Limits
from worstcase_profiler.core.types import Shape, Validation

# the CPU test's engine: tests/cpu/test_multimodal_cpu.py (Idefics3 layout, one image of 2,913
# prompt tokens, its first placeholder at offset 0, 2 a prompt, the encoder runs 1 a step)
LIMITS = Limits(max_model_len=8192, max_num_batched_tokens=512, max_num_seqs=4, block_size=128,
                prefix_caching=True)
IDEFICS = ItemSpec("image", items=1, item_len=2913, limit_per_prompt=2)
TEXT = Shape("prefill", 512, 7680, 1)  # the encoder step's text step


def _measured(plan):
    (batch,) = [b for b in plan.batches if b.measured]
    return batch


def _fits(plan, limits=LIMITS):
    for b in plan.batches:
        for p in b.prompts:
            assert p.length + b.max_tokens <= limits.max_model_len, (b.label, p)


def test_one_image_behind_a_cached_text_prefix_on_the_longest_context_it_leaves():
    plan, why = multimodal_plan(IDEFICS, LIMITS, prefix_caching=True, text=TEXT)
    assert not why and plan.exact and plan.items == 1
    warm, measured = plan.batches
    assert not warm.measured and [p.items for p in warm.prompts] == [0]  # text only
    (p,) = measured.prompts
    assert (p.prefix_len, p.suffix_len, p.items, p.item_len, p.tail_len) == (5248, 0, 1, 2913, 0)
    assert warm.prompts[0].prefix_len == p.prefix_len  # the measured prompt hits all of it
    # 8191 - 2913 = 5278, down to the 128-token block: the chunk after the hit starts the image
    assert plan.target == Shape("prefill", 512, 5248, 1)
    assert "context 5,248" in plan.note and "7,680" in plan.note  # shorter than the text step's
    assert "1 image item(s) of 2,913 tokens" in measured.label
    _fits(plan)


def test_without_prefix_caching_the_image_starts_on_a_chunk_boundary():
    limits = dataclasses.replace(LIMITS, prefix_caching=False)
    plan, _ = multimodal_plan(IDEFICS, limits, prefix_caching=False)
    (batch,) = plan.batches
    (p,) = batch.prompts
    assert p.suffix_len % 512 == 0 and p.suffix_len == 5120 and p.items == 1
    assert plan.target == Shape("prefill", 512, 5120, 1) and plan.exact
    _fits(plan, limits)


def test_small_images_fill_prompts_to_the_limit_and_the_chunk_with_a_text_tail():
    """Five items of 100 tokens, 2 a prompt: three requests (2, 2, 1 images) on one cached
    prefix; every item's first token inside the 512-row chunk after the hit, the last prompt's
    text tail making up the chunk."""
    spec = ItemSpec("image", items=5, item_len=100, limit_per_prompt=2)
    plan, _ = multimodal_plan(spec, LIMITS, prefix_caching=True, text=TEXT)
    m = _measured(plan)
    assert [p.items for p in m.prompts] == [2, 2, 1] and plan.items == 5 and plan.exact
    assert [p.tail_len for p in m.prompts] == [0, 0, 12]
    assert sum(p.length - p.prefix_len for p in m.prompts) == 512
    assert len({p.prefix_len for p in m.prompts}) == 1
    assert plan.target.num_reqs == 3 and plan.target.rows == 512
    _fits(plan)


def test_fewer_images_than_asked_say_why():
    # two images of 2,913 tokens: one chunk of 512 holds the first token of one only
    two = dataclasses.replace(IDEFICS, items=2)
    plan, _ = multimodal_plan(two, LIMITS, prefix_caching=True)
    assert plan.items == 1 and not plan.exact and "at most 1 item(s)" in plan.note
    # without prefix caching one prompt: the per-prompt limit caps it
    small = ItemSpec("image", items=5, item_len=100, limit_per_prompt=2)
    limits = dataclasses.replace(LIMITS, prefix_caching=False)
    plan, _ = multimodal_plan(small, limits, prefix_caching=False)
    assert plan.items == 2 and not plan.exact and "without prefix caching" in plan.note
    # more items than max_num_seqs prompts hold
    many = ItemSpec("image", items=9, item_len=10, limit_per_prompt=2)
    plan, _ = multimodal_plan(many, LIMITS, prefix_caching=True)
    assert plan.items == 8 and "4 prompts of at most 2" in plan.note


@pytest.mark.parametrize("spec, why", [
    (dataclasses.replace(IDEFICS, chunked=False), "--disable-chunked-mm-input"),
    (dataclasses.replace(IDEFICS, item_len=9000), "more than max_model_len"),
    (dataclasses.replace(IDEFICS, items=0), "no image item reaches the encoder"),
])
def test_no_plan_where_no_request_forms_the_step_and_the_reason(spec, why):
    plan, reason = multimodal_plan(spec, LIMITS, prefix_caching=True)
    assert plan is None and why in reason


def test_a_multimodal_replay_reached_only_with_its_encoder_items():
    shape = Shape("prefill", 512, 5248, 1)
    v = Validation(measured_peak_bytes=1, predicted_peak_bytes=2, ratio=0.5, requests=("r",),
                   seconds=0.0, target="multimodal", shape=shape, formed=shape,
                   modality="image", encoder_items=1, encoder_items_formed=1)
    assert replay_reached(v) is True
    assert replay_reached(dataclasses.replace(v, encoder_items_formed=0)) is False
    assert replay_reached(dataclasses.replace(v, encoder_items_formed=None)) is False
    text = dataclasses.replace(v, target="worst-step", encoder_items=0, encoder_items_formed=None)
    assert replay_reached(text) is True  # text replays as before


def test_the_multimodal_validation_gates_and_the_report_names_it():
    from worstcase_profiler.render.view import validation_text
    from worstcase_profiler.report import gating_validation

    shape = Shape("prefill", 512, 5248, 1)
    text = Validation(measured_peak_bytes=1, predicted_peak_bytes=2, ratio=0.9, requests=("t",),
                      seconds=0.0, target="worst-step")
    mm = Validation(measured_peak_bytes=5, predicted_peak_bytes=10, ratio=0.5, requests=("m",),
                    seconds=0.0, target="multimodal", shape=shape, formed=shape,
                    modality="image", encoder_items=1, encoder_items_formed=1)
    assert gating_validation([text, mm]) is mm
    assert gating_validation([text]) is text
    line = validation_text(mm)
    assert "multimodal step: 1 image item(s) through the encoder, against the admitted" in line
    assert "the encoder ran on 1 item(s) in one step" in line


def test_the_workload_puts_placeholder_ids_and_distinct_images_behind_the_shared_text():
    pytest.importorskip("PIL")
    from worstcase_profiler.adapter.multimodal import ReplayItems
    from worstcase_profiler.adapter.validation import multimodal_workload
    from PIL import Image

    spec = ItemSpec("image", items=3, item_len=100, limit_per_prompt=2)
    plan, _ = multimodal_plan(spec, LIMITS, prefix_caching=True)
    allowed = tuple(range(50, 300))
    items = ReplayItems(spec, unit=(4,), allowed=allowed, sample=Image.new("RGB", (8, 8)),
                        embed_tokens=90)
    work = multimodal_workload(plan, items)
    assert work.target == "multimodal" and work.encoder_items == 3 and work.modality == "image"
    (warm, _, m1), (measured, _, m2) = work.batches
    assert not m1 and m2 and all(isinstance(p, list) for p in warm)
    prefix = plan.batches[0].prompts[0].prefix_len
    images = []
    for prompt, planned in zip(measured, _measured(plan).prompts):
        ids = prompt["prompt_token_ids"]
        assert ids[:prefix] == warm[0][:prefix]  # the cached text prefix, exactly
        assert all(i in allowed for i in ids[:prefix])
        assert ids[prefix:prefix + planned.items] == [4] * planned.items
        assert len(ids) == prefix + planned.items + planned.tail_len
        images += prompt["multi_modal_data"]["image"]
    assert len(images) == 3 and len({im.getpixel((0, 0)) for im in images}) == 3
    assert token_ids  # the text ids are core.requests_plan.token_ids, mapped into `allowed`


def test_a_prompt_whose_items_expand_short_is_topped_up_to_its_plan():
    """Where vLLM expands a prompt's items to fewer tokens than the plan counts them at (the most
    one item takes at any position: DeepSeek-V4 pads each image block to where it starts), the
    tail takes the difference, so the prompt is as long as planned and the step forms with the
    plan's rows; where they expand to more, the workload says so."""
    pytest.importorskip("PIL")
    from worstcase_profiler.adapter.multimodal import ReplayItems
    from worstcase_profiler.adapter.validation import multimodal_workload
    from PIL import Image

    spec = ItemSpec("image", items=3, item_len=100, limit_per_prompt=2)
    plan, _ = multimodal_plan(spec, LIMITS, prefix_caching=True)
    made = lambda by: ReplayItems(  # noqa: E731 - each item expands to item_len - by
        spec, unit=(4,), allowed=tuple(range(50, 300)), sample=Image.new("RGB", (8, 8)),
        embed_tokens=90, expanded_len=lambda ids, data: len(ids) + (99 - by) * len(data))
    plain = multimodal_workload(plan, made(0))
    short = multimodal_workload(plan, made(2))
    for (a, _, _), (b, _, _), planned in zip(plain.batches, short.batches, plan.batches):
        for pa, pb, p in zip(a, b, planned.prompts):
            if not p.items:
                assert pa == pb  # the warm-up's text, untouched
                continue
            ids, was = pb["prompt_token_ids"], pa["prompt_token_ids"]
            head = len(was) - p.tail_len  # the text and the items' placeholders stay put
            assert ids[:head] == was[:head] and ids[head - p.items:head] == [4] * p.items
            assert len(ids) == len(was) + 2 * p.items  # 2 short an item: the tail takes them
            assert all(i in range(50, 300) for i in ids[head:])
    assert short.note == plain.note
    # the prompt of two items came out 4 tokens long: nothing to take away, and said
    assert "4 token(s) more than planned" in multimodal_workload(plan, made(-2)).note
    broken = dataclasses.replace(made(0), expanded_len=lambda ids, data: 1 // 0)
    unknown = multimodal_workload(plan, broken)
    ids = lambda work: [[q["prompt_token_ids"] if isinstance(q, dict) else q  # noqa: E731
                         for q in prompts] for prompts, _, _ in work.batches]
    assert ids(unknown) == ids(plain)  # as planned, untouched
    assert "expanded length is unknown" in unknown.note and "ZeroDivisionError" in unknown.note


def test_lookahead_hashes_make_a_cached_prefix_plan_approximate():
    """vLLM 0.33's lookahead block hashes: the measured prompts' tokens after the cached text are
    item placeholders, the warm-up's are not, so each may hit a block short; the plan says so.
    Without prefix caching nothing is cached, and the plan stays as it was."""
    plain, _ = multimodal_plan(IDEFICS, LIMITS, prefix_caching=True, text=TEXT)
    plan, _ = multimodal_plan(IDEFICS, LIMITS, prefix_caching=True, text=TEXT, hash_lookahead=1)
    assert plain.exact and not plan.exact and "a block short" in plan.note
    assert (plan.target, plan.batches) == (plain.target, plain.batches)
    limits = dataclasses.replace(LIMITS, prefix_caching=False)
    assert multimodal_plan(IDEFICS, limits, prefix_caching=False, hash_lookahead=1) == \
        multimodal_plan(IDEFICS, limits, prefix_caching=False)


# the H200 case of docs/results/h200-run62 (Qwen2.5-VL-32B layout, eager, V1): vLLM's profile
# step, 8,192 rows over 1,024 fresh requests, is the encoder step's text step; two images of
# 4,096 image tokens (plus vision start and end) run through the encoder in one step
WIDE = Limits(max_model_len=131072, max_num_batched_tokens=8192, max_num_seqs=1024, block_size=16,
              prefix_caching=True)
QWEN = ItemSpec("image", items=2, item_len=4098, limit_per_prompt=2, start=1)
PROFILE_STEP = Shape("stock", 8192, 0, 1024)


def _first_step(plan, limits, spec=QWEN, hit_unit=1):
    """(rows, requests, items encoded, context) of the measured batch's first step, scheduled as
    vLLM's V1 scheduler does for waiting requests: in submission order, each prompt past its
    cached prefix for min(what it has left, the budget left). A warmed prefix is hit whole but
    for the block a drafter drops (hit_drop), and only where the prompt's first `lookahead`
    tokens after it are the warm-up's (0.33's lookahead block hashes: else a block short). An
    item is encoded where its first embedding token (`spec.start`) is scheduled; with chunked
    multimodal input off a request stops before an item it cannot take whole. A hit is a
    multiple of `hit_unit` tokens (the KV groups' common block: 256 on DeepSeek-V4)."""
    cached = {p.prefix_id: p for b in plan.batches if not b.measured for p in b.prompts}
    budget, rows, reqs, items, ctx = limits.max_num_batched_tokens, 0, 0, 0, 0
    for p in _measured(plan).prompts:
        if budget <= 0 or reqs == limits.max_num_seqs:
            break
        hit = _hit(p, cached, limits, hit_unit)
        new, encoded = _take(p, hit, min(p.length - hit, budget), spec)
        items += encoded
        rows, reqs, budget, ctx = rows + new, reqs + 1, budget - new, max(ctx, hit)
    return rows, reqs, items, ctx


def _hit(p, cached, limits, hit_unit):
    """The tokens prompt `p` hits of its warmed prefix (`cached`: prefix id -> warm-up prompt):
    whole hit units, less a drafter's dropped block, and a block short where its lookahead
    tokens are not the warm-up's."""
    warm = cached.get(p.prefix_id)
    if not p.prefix_len or warm is None:
        return 0
    hit = min(p.prefix_len, warm.prefix_len) // hit_unit * hit_unit - limits.hit_drop
    if p.lookahead < warm.lookahead:
        hit -= max(limits.block_size, hit_unit)
    return hit


def _take(p, at, new, spec):
    """(tokens scheduled, items encoded) where prompt `p`, computed up to `at`, is given `new`
    more: with chunked multimodal input off vLLM rolls a partial item back; an item is encoded
    in the step that schedules its first embedding token (`spec.start`)."""
    first = p.prefix_len + p.branch_len + p.suffix_len  # the first item's first token
    encoded = 0
    for i in range(p.items):
        start = first + i * p.item_len
        if not spec.chunked and start < at + new < start + p.item_len:
            return start - at, encoded
        if at <= start + spec.start < at + new:
            encoded += 1
    return new, encoded


def test_a_wide_text_step_is_formed_with_the_items_inside_it():
    """The encoder step held its outputs through vLLM's profile step: the replay forms that
    step's 1,024 requests over 8,192 rows (1,023 text prompts, then one prompt of two images
    that the budget cuts one token into the second), so the scheduler encodes both images in the
    same step. One long request at long context (the plan before) read 0.679 of the prediction
    on the H200: it left out the 1,024 requests' logits."""
    plan, why = multimodal_plan(QWEN, WIDE, prefix_caching=True, text=PROFILE_STEP)
    assert not why and plan.exact and plan.items == 2
    assert plan.target == Shape("prefill", 8192, 0, 1024)
    (measured,) = plan.batches  # fresh prompts: nothing to warm
    assert [p.items for p in measured.prompts] == [0] * 1023 + [2]
    assert _first_step(plan, WIDE) == (8192, 1024, 2, 0)
    assert "cut by the step's budget one token into its last item" in measured.label
    _fits(plan, WIDE)


def test_one_image_a_prompt_puts_the_first_whole_and_cuts_the_last():
    one = dataclasses.replace(QWEN, limit_per_prompt=1)
    plan, _ = multimodal_plan(one, WIDE, prefix_caching=True, text=PROFILE_STEP)
    (measured,) = plan.batches
    assert [p.items for p in measured.prompts[-3:]] == [0, 1, 1] and plan.exact
    assert _first_step(plan, WIDE) == (8192, 1024, 2, 0)


def test_without_chunked_multimodal_input_every_item_is_whole_and_fewer_fit():
    """--disable-chunked-mm-input: no request is cut inside an item, so two whole images (8,196
    rows) do not fit beside 1,023 other requests in 8,192; one does, and the note says why."""
    whole = dataclasses.replace(QWEN, chunked=False)
    plan, _ = multimodal_plan(whole, WIDE, prefix_caching=True, text=PROFILE_STEP)
    assert plan.items == 1 and not plan.exact and "1 of 2 items" in plan.note
    assert _first_step(plan, WIDE, whole) == (8192, 1024, 1, 0)


def test_a_wide_prefill_on_a_long_context_shares_a_cached_prefix_that_leaves_the_items_room():
    text = Shape("prefill", 8192, 131031, 64)
    plan, _ = multimodal_plan(QWEN, WIDE, prefix_caching=True, text=text)
    warm, measured = plan.batches
    shared = warm.prompts[0].prefix_len
    assert shared % 16 == 0 and shared + 2 * 4098 <= 131071
    assert {p.prefix_len for p in measured.prompts} == {shared}
    assert plan.target == Shape("prefill", 8192, shared, 64) and not plan.exact
    assert "131,031" in plan.note
    assert _first_step(plan, WIDE) == (8192, 64, 2, shared)
    _fits(plan, WIDE)


def test_where_no_item_fits_the_wide_step_the_one_request_plan_says_so():
    """Whole images of 4,098 tokens beside 8,000 requests of a row each do not fit 8,192 rows:
    the one-request plan, not exact, names the text step it did not form."""
    limits = dataclasses.replace(WIDE, max_num_seqs=8192)
    whole = dataclasses.replace(QWEN, chunked=False)
    plan, _ = multimodal_plan(whole, limits, prefix_caching=True, text=Shape("stock", 8192, 0, 8000))
    assert plan.target.num_reqs == 1 and not plan.exact
    assert "text step (stock rows=8192 ctx=0 reqs=8000) not formed with items" in plan.note


def test_a_wide_mixed_text_step_is_formed_as_a_prefill_of_its_rows_and_requests():
    text = Shape("mixed", 512, 3711, 128)
    limits = Limits(max_model_len=4096, max_num_batched_tokens=512, max_num_seqs=128,
                    block_size=16, prefix_caching=True)
    spec = ItemSpec("image", items=2, item_len=258, limit_per_prompt=2, start=1)
    plan, _ = multimodal_plan(spec, limits, prefix_caching=True, text=text)
    ctx = plan.target.context_len
    assert plan.target == Shape("prefill", 512, ctx, 128) and ctx % 16 == 0
    assert ctx + 2 * 258 <= 4095 and "formed as a prefill" in plan.note and not plan.exact
    assert _first_step(plan, limits, spec) == (512, 128, 2, ctx)
    _fits(plan, limits)


@pytest.mark.parametrize("text, limits", [
    (Shape("prefill", 8192, 126975, 2), WIDE),  # 2 requests: the text one takes ~4,000 rows
    (Shape("stock", 8192, 0, 2), dataclasses.replace(WIDE, max_model_len=4096)),
])
def test_no_prompt_of_a_wide_plan_outgrows_max_model_len(text, limits):
    small = dataclasses.replace(QWEN, item_len=258)
    plan, why = multimodal_plan(small, limits, prefix_caching=True, text=text)
    if plan is None:
        assert "max_model_len" in why
        return
    _fits(plan, limits)
    if text.context_len:
        assert plan.target.context_len < text.context_len and "must fit behind it" in plan.note


def test_lookahead_hashes_and_a_drafters_dropped_block_still_encode_every_item():
    """Under 0.33's lookahead block hashes the item prompts start with the tokens the warm-up's
    block hashes cover beyond the prefix, as the text prompts do, so each hits the whole prefix;
    a drafter's dropped block is computed again by every prompt. The budget still cuts the last
    prompt one token into its last item."""
    limits = dataclasses.replace(WIDE, prefix_hit_drop=16, prefix_hit_min_rows=17)
    text = Shape("prefill", 8192, 120000, 64)
    plan, _ = multimodal_plan(QWEN, limits, prefix_caching=True, text=text, hash_lookahead=1)
    ctx = plan.target.context_len
    assert _first_step(plan, limits) == (8192, 64, 2, ctx)
    assert "a block short" not in (plan.note or "")
    _fits(plan, limits)


def test_a_decode_text_step_or_no_prefix_caching_on_a_context_falls_back_and_says_so():
    for text, caching in ((Shape("decode", 1024, 120000, 1024), True),
                          (Shape("prefill", 8192, 50000, 64), False)):
        limits = dataclasses.replace(WIDE, prefix_caching=caching)
        plan, _ = multimodal_plan(QWEN, limits, prefix_caching=caching, text=text)
        assert plan.target.num_reqs == 1 and not plan.exact
        assert f"text step ({text.label()}) not formed with items" in plan.note


def test_an_item_whose_range_opens_with_tokens_that_take_no_embedding_is_cut_after_them():
    """Idefics3's range opens with tile markers: the encoder runs in the step that schedules the
    first embedding token (`start`), so the cut lands one token past it."""
    marked = dataclasses.replace(QWEN, start=7)
    plan, _ = multimodal_plan(marked, WIDE, prefix_caching=True, text=PROFILE_STEP)
    assert _first_step(plan, WIDE, marked) == (8192, 1024, 2, 0)
    assert _first_step(plan, WIDE, dataclasses.replace(marked, start=9))[2] == 1


def test_a_multimodal_context_is_aligned_to_the_pool_hit_unit_not_the_smallest_block():
    """h100-run74's dsv4vl cases (DeepSeek-V4 vision layout, block 256, 10 whole images of 382
    tokens beside 3 text requests in 4,096 rows): planned on the engine's limits (block 4 once
    the KV cache exists) the shared prefix was 127,248 tokens, which the scheduler hits at
    127,232; every request then computed 16 tokens more, and the tenth image no longer fit the
    step (3,762 rows, 9 images). With the pool's hit unit the prefix is a multiple of 256 and
    the step forms whole."""
    from worstcase_profiler.core.requests_plan import Pool

    limits = Limits(max_model_len=131072, max_num_batched_tokens=4096, max_num_seqs=4,
                    block_size=4, prefix_caching=True)
    spec = ItemSpec("image", items=10, item_len=382, limit_per_prompt=10, chunked=False)
    text = Shape("prefill", 4096, 130048, 4)
    wrong, _ = multimodal_plan(spec, limits, prefix_caching=True, text=text)
    assert wrong.target.context_len % 256 and \
        _first_step(wrong, limits, spec, hit_unit=256)[2] < 10  # what the H100 formed
    plan, why = multimodal_plan(spec, limits, prefix_caching=True, text=text,
                                pool=Pool(10**6, 7, 7, hit_unit=256))
    ctx = plan.target.context_len
    assert not why and ctx % 256 == 0 and plan.target == Shape("prefill", 4096, ctx, 4)
    assert _first_step(plan, limits, spec, hit_unit=256) == (4096, 4, 10, ctx)
    _fits(plan, limits)


def _mixed_step(plan, limits, spec, hit_unit=1):
    """(rows, requests, items encoded, the chunk's context) of the measured batch's second step,
    as vLLM's V1 scheduler runs it: in the first step each prompt computes past its hit for
    min(what it has left, the budget left) (as _first_step); in the second, a prompt that
    finished its prefill decodes 1 + k rows, one still prefilling takes what the budget leaves,
    rolled back before an item it cannot take whole (chunked multimodal input off). Hits as
    _first_step's: a block short where the prompt's lookahead tokens are not the warm-up's, less
    a drafter's dropped block."""
    cached = {p.prefix_id: p for b in plan.batches if not b.measured for p in b.prompts}
    done = []
    budget = limits.max_num_batched_tokens
    for p in _measured(plan).prompts:
        hit = _hit(p, cached, limits, hit_unit)
        new, _ = _take(p, hit, min(p.length - hit, budget), spec)
        budget -= new
        done.append((p, hit + new))
    budget, rows, reqs, items, ctx = limits.max_num_batched_tokens, 0, 0, 0, 0
    for p, at in done:
        if at >= p.length:
            new = limits.rows_per_decode
        else:
            new, encoded = _take(p, at, min(p.length - at, budget), spec)
            items, ctx = items + encoded, max(ctx, at)
        rows, reqs, budget = rows + new, reqs + 1, budget - new
    return rows, reqs, items, ctx


def test_a_mixed_text_step_is_formed_as_a_mixed_step_with_the_items_in_its_chunk():
    """h100-run75's `vllm serve` of the DeepSeek-V4 vision layout at max_model_len 262,144: the
    encoder step's text step was mixed (a decode beside a 4,095-row chunk), and its replay formed
    a prefill of 4,096 rows over 2 requests with the 10 images instead, which the indexer runs
    for less (0.9694 of the prediction). Now the decode runs beside the long prompt's second
    chunk, which ends in the 10 whole images: the step the sweep measured, with them in it."""
    from worstcase_profiler.core.requests_plan import Pool

    limits = Limits(max_model_len=262144, max_num_batched_tokens=4096, max_num_seqs=4,
                    block_size=4, prefix_caching=True)
    spec = ItemSpec("image", items=10, item_len=382, limit_per_prompt=10, chunked=False)
    text = Shape("mixed", 4096, 258049, 2)
    plan, why = multimodal_plan(spec, limits, prefix_caching=True, text=text,
                                pool=Pool(10**6, 7, 7, hit_unit=256))
    assert not why and plan.items == 10 and not plan.exact
    assert plan.target.kind == "mixed" and plan.target.rows == 4096
    assert plan.target.num_reqs == 2
    decode, long = _measured(plan).prompts
    assert (decode.items, long.items, long.item_len) == (0, 10, 382)
    rows, reqs, items, ctx = _mixed_step(plan, limits, spec, hit_unit=256)
    assert (rows, reqs, items) == (4096, 2, 10)
    assert ctx == plan.target.context_len and ctx > 250_000  # the chunk near the context's end
    assert "ending in 10 image item(s) of 382 tokens" in _measured(plan).label
    # every prompt within max_model_len (vLLM stops a request's output there, as for the text
    # replay's mixed step, whose long prompt leaves no room for its few decode tokens)
    assert all(p.length <= limits.max_model_len - 1 for b in plan.batches for p in b.prompts)
    # where the chunk cannot hold every item whole, the prefill formation, which the note says
    many = dataclasses.replace(spec, items=11)
    plan, _ = multimodal_plan(many, limits, prefix_caching=True, text=text,
                              pool=Pool(10**6, 7, 7, hit_unit=256))
    assert plan.target.kind == "prefill" and "holds 10 whole 382-token image item(s) of 11" \
        in plan.note


def test_a_mixed_multimodal_step_shares_lookahead_tokens_and_leaves_a_drafters_hits_alone():
    """Under 0.33's lookahead block hashes every prompt on a cached prefix starts its suffix with
    the warm-up's tokens (as plan_for's mixed plan), so each hits its whole prefix and the long
    prompt's second chunk still ends in the 10 images; where a drafter recomputes each hit's last
    block the long prompt's end moves off that chunk, and the prefill formation (which counts
    the dropped block) forms the step instead."""
    from worstcase_profiler.core.requests_plan import Pool

    limits = Limits(max_model_len=262144, max_num_batched_tokens=4096, max_num_seqs=4,
                    block_size=4, prefix_caching=True)
    spec = ItemSpec("image", items=10, item_len=382, limit_per_prompt=10, chunked=False)
    text, pool = Shape("mixed", 4096, 258049, 2), Pool(10**6, 7, 7, hit_unit=256)
    plan, _ = multimodal_plan(spec, limits, prefix_caching=True, text=text, pool=pool,
                              hash_lookahead=1)
    assert plan.target.kind == "mixed"
    assert all(p.lookahead == 1 for b in plan.batches for p in b.prompts if p.prefix_len)
    assert _mixed_step(plan, limits, spec, hit_unit=256)[:3] == (4096, 2, 10)
    unshared = dataclasses.replace(plan, batches=tuple(
        dataclasses.replace(b, prompts=tuple(dataclasses.replace(p, lookahead=0)
                                             for p in b.prompts)) if b.measured else b
        for b in plan.batches))
    assert _mixed_step(unshared, limits, spec, hit_unit=256)[2] < 10  # what sharing prevents
    drafter = dataclasses.replace(limits, prefix_hit_drop=256, prefix_hit_min_rows=257)
    plan, _ = multimodal_plan(spec, drafter, prefix_caching=True, text=text, pool=pool)
    assert plan.target.kind == "prefill" and "a drafter recomputes" in plan.note
