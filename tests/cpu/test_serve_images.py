"""Issue 36, the operator's path: a VLM under `vllm serve --profiler worstcase` (the engine core
and its worker in processes of their own), validated before it serves, then real image requests
over HTTP (bench/serve_run.py --images: a chat prompt of about 3,000 text tokens, cached, then
the same text with two distinct images after it: one step computes both images' tokens, the
encoder included, on the cached text, as seed 002's request carried images deep in its context).

The tiny Qwen2.5-VL layout of tests/cpu/test_qwen25vl_cpu.py. Under `vllm serve` the worker
receives a step's processed items (pixel values) from the engine core while the step runs; on the
CPU that is the meter's memory, so the encoder step counts the items' bytes
(EncoderStep.inputs_bytes): without them the served multimodal step read 26.20 MiB against
23.07 MiB predicted and the server refused to start."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import CPU_RESOLUTION, ROOT, engine_env

pytestmark = pytest.mark.engine

MODEL = ROOT / "tests" / "models" / "qwen2_5-vl-tiny"
IMAGES, TOKENS, BLOCK = 2, 256, 16


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    out = tmp_path_factory.mktemp("serve_images")
    env = engine_env(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", WCP_FIXTURES_QWEN_VL_CPU="1",
                     WCPROF_CACHE_DIR=str(out / "cache"))
    p = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "serve_run.py"), "--out", str(out),
         "--model", str(MODEL), "--modes", "worstcase", "--max-model-len", "4096",
         "--max-num-batched-tokens", "512", "--prefix", "3000", "--chunk", "256",
         "--decodes", "2", "--decode-prompt", "64", "--decode-tokens", "8",
         "--images", str(IMAGES), "--eager", "--start-timeout-s", "400",
         "--extra", "--max-num-seqs 4 --kv-cache-memory-bytes 67108864 "
                    "--limit-mm-per-prompt '{\"image\": 2, \"video\": 0}'"],
        capture_output=True, text=True, env=env, timeout=900, cwd=ROOT)
    log = (out / "serve-worstcase.log").read_text(errors="replace") \
        if (out / "serve-worstcase.log").exists() else ""
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:] + log[-4000:]
    mode = json.loads((out / "serve.json").read_text())["modes"][0]
    return mode, json.loads((out / "report-worstcase.json").read_text()), log


def test_the_served_image_step_is_validated_within_the_prediction_before_serving(served):
    mode, report, _ = served
    assert mode["healthy_s"] is not None and mode["shutdown"]["rc"] == 0, mode["shutdown"]
    enc = report["worstcase"]["encoder_step"]
    assert (enc["items"], enc["tokens_per_item"]) == (IMAGES, TOKENS), enc
    assert enc["inputs_bytes"] > 0, enc  # the CPU counts the items the worker receives
    mm = [v for v in report["validations"] if v["target"] == "multimodal"]
    assert len(mm) == 1 and mm[0]["encoder_items_formed"] == IMAGES, mm
    v = mm[0]
    assert v["resolution_bytes"] == CPU_RESOLUTION, v
    assert v["measured_peak_bytes"] <= v["predicted_peak_bytes"] + v["resolution_bytes"], v
    assert v["measured_peak_bytes"] > v["predicted_peak_bytes"] // 2, v  # an image step


def test_image_requests_on_a_cached_text_prefix_are_served_within_the_guard(served):
    mode, _, log = served
    images = mode["traffic"]["images"]
    assert images["cached"]["ok"] and images["request"]["ok"], images
    assert images["image_tokens"] >= IMAGES * TOKENS, images
    # the text was cached: the image request hit all of it but its last few blocks (the text's
    # tail tokenizes differently before the images' separator: 2,944 of 2,991 here)
    assert images["prefix_cache_hit_tokens"] >= images["text_tokens"] - 4 * BLOCK, images
    assert images["alive_after"], images
    assert mode["wcprof_guard"]["rc"] == 0, mode["wcprof_guard"]
    assert mode["guard_metrics"]["wcprof_guard_steps_above_prediction_total"] == 0, mode
    assert "held over" in mode["wcprof_guard"]["stdout"], mode["wcprof_guard"]
    assert "--chat-template" in mode["cmd"] and "--skip-tokenizer-init" not in mode["cmd"]
    assert "[wcprof] serving validation" in log, log[-3000:]
