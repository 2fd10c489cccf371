"""Multimodal steps: what a model with a multimodal encoder (a vision tower) allows per step, and
which of those limits the worst case covers. Pure: the adapter reads the facts from vLLM's
config and its MultiModalBudget (adapter/multimodal.py); this decides what the report says.

A step of such a model can carry more than the text steps the sweep runs (docs/sweep.md,
"Multimodal steps"): the encoder forward of every item whose first placeholder token is scheduled
in it (up to `max_items_per_batch` items of up to `max_tokens_per_item` tokens each, within the
encoder compute budget), the encoder cache holding those items' outputs until their tokens are
consumed, and the decoder's chunk reading those embeddings. On the CPU engine a step carrying one
image of the tiny Idefics3 layout measured 26x the sweep's worst text step
(tests/cpu/test_multimodal_cpu.py). A limit the worst case does not cover is never silent: the
report lists it (`unprofiled_note`)."""

from __future__ import annotations

from dataclasses import dataclass

from ..sizes import fmt_bytes


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
    """The encoder forward measured as a sweep step (adapter/multimodal.measure_encoder): vLLM's
    own dummy items of `modality`, `items` of them of `tokens_per_item` tokens each, run through
    the encoder on the provisional KV cache, then the sweep's worst text step with their outputs
    held, as the encoder cache holds them while a chunk reads them."""

    modality: str
    items: int
    tokens_per_item: int
    peak_bytes: int
    """Transient peak over the encoder forward and the text step after it, above the baseline."""
    held_bytes: int
    """What the encoder's outputs hold while they are cached (the encoder cache's resident
    bytes for these items)."""
    encoder_peak_bytes: int
    """Transient peak of the encoder forward alone."""
    text_shape: str
    """The text step run with the outputs held (the sweep's worst shape's label)."""
    seconds: float = 0.0


def _n(v: int) -> str:
    return f"{v:,}"


def unprofiled_limits(facts: MultimodalFacts, encoder: EncoderStep | None = None
                      ) -> tuple[str, ...]:
    """The multimodal limits the worst case does not cover, one phrase each, for the report.
    Without a measured encoder step (`encoder` None) that is every limit of every modality: the
    sweep's steps are text steps. With one, the encoder forward of `encoder.items` items of the
    profiled modality at its largest size and their outputs held through the worst text step
    are covered; other modalities, more items per prompt than one step runs, and a cache holding
    items of earlier steps beside them are not."""
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
    if facts.encoder_cache_size > cached_in_step:
        out.append(f"the encoder cache ({_n(facts.encoder_cache_size)} tokens of encoder outputs "
                   f"resident across steps" + (f"; {_n(cached_in_step)} held in the measured step"
                                               if encoder is not None else "") + ")")
    if encoder is None:
        out.append("a prefill chunk reading an item's embeddings at max_model_len ("
                   + ("chunked multimodal input on: an item's tokens may span chunks"
                      if facts.chunked_mm_input else
                      "--disable-chunked-mm-input: each item's tokens in one chunk") + ")")
    return tuple(out)


def unprofiled_note(facts: MultimodalFacts | None, encoder: EncoderStep | None = None
                    ) -> str | None:
    """The report's warning for a model with a multimodal encoder: which of its limits the
    admitted transient does not cover, and whether vLLM's own profile ran the encoder at this
    start. None for a text-only model (or one whose every tower modality is limited to 0), and
    when every limit is covered."""
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
                 f" {big.modality} item(s) of {_n(big.max_tokens_per_item)} tokens), but its "
                 f"figure is not in this budget")
    else:
        stock = "vLLM's own profile did not run the encoder at this start either"
    head = ("multimodal steps are only partly in the worst case" if encoder is not None else
            "multimodal steps are not in the worst case: the sweep ran text steps only")
    measured = (f"; the encoder step measured {fmt_bytes(encoder.peak_bytes)} "
                f"({_n(encoder.items)} {encoder.modality} item(s) of "
                f"{_n(encoder.tokens_per_item)} tokens, then {encoder.text_shape})"
                if encoder is not None else "")
    return (f"{head}{measured}. Not profiled: " + "; ".join(missing) + f". {stock}. A multimodal "
            f"step can need more than the admitted transient: measure one, or lower "
            f"limit_mm_per_prompt and the encoder budget, before relying on the recommended "
            f"figure (docs/sweep.md, \"Multimodal steps\")")
