"""A model with a multimodal encoder: its limits as vLLM sizes them (MultiModalBudget), whether
vLLM's own profile ran the encoder at this start, and the encoder step measured in the sweep.
The core decides what the report says about them (core/multimodal.py)."""

from __future__ import annotations

import contextlib
import logging

from ..core.multimodal import ModalityBudget, MultimodalFacts

log = logging.getLogger("vllm.wcprof")


def has_encoder(vllm_config) -> bool:
    """Whether the model takes multimodal inputs through an encoder of its own (vLLM's
    ModelConfig.supports_multimodal_inputs; is_multimodal_model before it existed)."""
    # vllm-touch: mm-budget
    model = vllm_config.model_config
    for name in ("supports_multimodal_inputs", "is_multimodal_model"):
        value = getattr(model, name, None)
        if value is not None:
            return bool(value() if callable(value) else value)
    return False


def _budget(runner, vllm_config):
    """vLLM's MultiModalBudget for this engine: the V1 runner's own (`mm_budget`, built at its
    init), else one built as the V2 runner's profile_run builds it."""
    # vllm-touch: mm-budget
    budget = getattr(runner, "mm_budget", None)
    if budget is not None:
        return budget
    from vllm.multimodal import MULTIMODAL_REGISTRY
    from vllm.multimodal.encoder_budget import MultiModalBudget

    return MultiModalBudget(vllm_config, MULTIMODAL_REGISTRY, enable_cache=False)


def facts_of(worker, stock_encoder_calls: int = 0) -> MultimodalFacts | None:
    """The multimodal limits of this engine (core/multimodal.MultimodalFacts), None for a model
    without a multimodal encoder. Where vLLM's budget cannot be read, each modality the config
    names is still listed (its token figures 0), so the report never drops the warning."""
    # vllm-touch: mm-budget
    vllm_config = worker.vllm_config
    if not has_encoder(vllm_config):
        return None
    mm_config = getattr(vllm_config.model_config, "multimodal_config", None)
    scheduler = vllm_config.scheduler_config
    common = dict(chunked_mm_input=not bool(getattr(scheduler, "disable_chunked_mm_input", False)),
                  skip_mm_profiling=bool(getattr(mm_config, "skip_mm_profiling", False)),
                  stock_encoder_calls=int(stock_encoder_calls))
    try:
        b = _budget(worker.model_runner, vllm_config)
        limits = dict(getattr(b, "mm_limits", {}) or {})
        toks = dict(getattr(b, "mm_max_toks_per_item", {}) or {})
        per_prompt = dict(getattr(b, "mm_max_items_per_prompt", {}) or {})
        per_batch = dict(getattr(b, "mm_max_items_per_batch", {}) or {})
        modalities = tuple(
            ModalityBudget(modality=m, limit_per_prompt=int(limits.get(m, 0) or 0),
                           max_tokens_per_item=int(t), max_items_per_prompt=int(per_prompt.get(m, 0)),
                           max_items_per_batch=int(per_batch.get(m, 0)))
            for m, t in sorted(toks.items()))
        return MultimodalFacts(modalities=modalities,
                               encoder_compute_budget=int(getattr(b, "encoder_compute_budget", 0)),
                               encoder_cache_size=int(getattr(b, "encoder_cache_size", 0)),
                               **common)
    except Exception as e:  # noqa: BLE001 - unreadable budget: still say what is not profiled
        log.warning("[wcprof] cannot read vLLM's multimodal budget (%s): the report lists the "
                    "configured modalities without their token figures", e)
        names = sorted((getattr(mm_config, "limit_per_prompt", None) or {}).keys()) or ["image"]
        return MultimodalFacts(
            modalities=tuple(ModalityBudget(m, int(mm_config.get_limit_per_prompt(m))
                                            if mm_config is not None else 0, 0, 0, 0)
                             for m in names),
            encoder_compute_budget=int(getattr(scheduler, "max_num_encoder_input_tokens", 0) or 0),
            encoder_cache_size=int(getattr(scheduler, "encoder_cache_size", 0) or 0), **common)


class EncoderCalls:
    """How many times the model's encoder ran (model.embed_multimodal) while counting."""

    def __init__(self) -> None:
        self.calls = 0

    def hit(self) -> None:
        self.calls += 1


@contextlib.contextmanager
def counting_encoder(runner):
    """Count the encoder forwards vLLM's own profile runs (its profile_run calls
    model.embed_multimodal once on its dummy items; the CPU worker in eager mode runs none):
    the model's embed_multimodal is swapped on the instance for the duration, then removed."""
    # vllm-touch: mm-stock-encoder
    model = getattr(runner, "model", None)
    seen = EncoderCalls()
    original = getattr(model, "embed_multimodal", None)
    if model is None or original is None:
        yield seen
        return
    had = "embed_multimodal" in vars(model)

    def embed_multimodal(*args, **kwargs):
        seen.hit()
        return original(*args, **kwargs)

    model.embed_multimodal = embed_multimodal
    try:
        yield seen
    finally:
        if had:
            model.embed_multimodal = original
        else:
            del model.embed_multimodal
