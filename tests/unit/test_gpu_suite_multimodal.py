"""bench/gpu_suite.py's issue-36 cases (qwen25vl, qwen25vl_eager: the Qwen2.5-VL-32B layout on
one H200): their argv keeps the tokenizer and carries the multimodal limits, their checks
(gpu_suite._check_multimodal) pass a report that shows what the issue asks and fail one that
misses it; with vLLM here, the argv goes through wcprof's own parser and vLLM's multimodal budget
sizes the encoder step the checks expect (in a subprocess: the CPU box has no torchvision, so the
processor loads behind the test stand-in WCP_FIXTURES_QWEN_VL_CPU, which the suite never sets)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import gpu_suite  # noqa: E402

NAMES = tuple(n for n in gpu_suite.MULTIMODAL_CASES if n.startswith("qwen25vl"))
DSV4VL = tuple(n for n in gpu_suite.MULTIMODAL_CASES if n.startswith("dsv4vl"))
MODEL = ROOT / "tests" / "gpu" / "models" / "qwen2.5-vl-32b-layout"
IMAGES, TOKENS = gpu_suite.VLM_IMAGES, gpu_suite.VLM_IMAGE_TOKENS


def _report(eager: bool = True) -> dict:
    shape = {"kind": "prefill", "rows": 8192, "context_len": 122688, "num_reqs": 1}
    mm = {"target": "multimodal", "modality": "image", "encoder_items": IMAGES,
          "encoder_items_formed": IMAGES, "shape": shape, "formed": dict(shape),
          "measured_peak_bytes": 99, "predicted_peak_bytes": 100, "ratio": 0.99,
          "requests": ["1 prompt(s) on a cached 122,688-token text prefix, each then 2 image "
                       "item(s) of 4,096 tokens"], "seconds": 30.0}
    worst = {"target": "worst-step", "measured_peak_bytes": 49, "predicted_peak_bytes": 49,
             "ratio": 1.0, "requests": [], "seconds": 20.0}
    return {
        "schema_version": "1.15",
        "config": {"enforce_eager": eager, "max_model_len": 131072},
        "runner": {"runner": "v1"},
        "stock": {"peak_activation_bytes": 1 << 30, "workspace_bytes": 0},
        "worstcase": {
            "peak_activation_bytes": 3 << 30, "workspace_bytes": 0,
            "rows_covered": {"min": 1, "max": 8192}, "steps": [],
            "encoder_step": {"modality": "image", "items": IMAGES, "tokens_per_item": TOKENS,
                             "peak_bytes": 3 << 30, "encoder_peak_bytes": 2 << 30,
                             "held_bytes": IMAGES * TOKENS * 5120 * 2,
                             "text_peak_bytes": 2 << 30, "sets_transient": True}},
        "validation": mm, "validations": [mm, worst], "warnings": [],
    }


def _failed(report: dict, name: str = "qwen25vl_eager") -> list[str]:
    return [k for k, v in gpu_suite._check(report, name, 0, "").items() if not v["ok"]]


def test_the_cases_keep_the_tokenizer_and_carry_the_multimodal_limits():
    for name in NAMES:
        argv = gpu_suite._cli_argv(name, Path("/tmp"))
        flags = dict(zip(argv, argv[1:]))
        assert "--skip-tokenizer-init" not in argv, argv
        assert argv.count("--gpu-memory-utilization") == 1 and \
            flags["--gpu-memory-utilization"] == "0.9", argv
        assert flags["--model"] == str(MODEL) and flags["--validate"] == "worst", argv
        assert (flags["--max-model-len"], flags["--max-num-batched-tokens"]) == ("131072", "8192")
        assert json.loads(flags["--limit-mm-per-prompt"]) == {"image": IMAGES, "video": 0}
        assert json.loads(flags["--mm-processor-kwargs"]) == {"max_pixels": TOKENS * 28 * 28}
        assert ("--enforce-eager" in argv) == ("_eager" in name), argv
        # expandable segments, as the profiler advises, but for the one case that keeps CUDA's
        # default allocator to check the report names what it kept reserved
        assert (gpu_suite._env(name).get("PYTORCH_CUDA_ALLOC_CONF") ==
                "expandable_segments:True") == (not name.endswith("_default_alloc")), name
        env = gpu_suite._env(name)
        assert env["VLLM_USE_V2_MODEL_RUNNER"] == "0" and env["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] == "1"
        assert "WCP_FIXTURES_QWEN_VL_CPU" not in gpu_suite.CASES[name][2]
        assert name in gpu_suite.NAMED_ONLY and name not in gpu_suite.DEFAULT_CASES


def test_seed_002s_vlm_cases_carry_its_limits_on_the_v1_runner():
    """dsv4vl_*: DeepSeek-V4 with its vision tower at 131,072 with seed 002's other limits,
    images whole in a step (vLLM forces it on CUDA), ten 387-token images a 4,096-token step,
    the V1 runner (the encoder step is not built on V2), with the tokenizer."""
    assert DSV4VL == ("dsv4vl_eager", "dsv4vl_graphs", "dsv4vl_dspark_eager")
    model = ROOT / "tests" / "gpu" / "models" / "dsv4-vision-4l"
    # seed 002's whole system: the images beside the DSpark drafter, on V2 at 262,144
    dspark = gpu_suite._cli_argv("dsv4vl_dspark_eager", Path("/tmp"))
    flags = dict(zip(dspark, dspark[1:]))
    assert flags["--max-model-len"] == "262144" and "dspark" in flags["--speculative-config"]
    assert "--disable-chunked-mm-input" in dspark and gpu_suite.CASES["dsv4vl_dspark_eager"][3] == "v2"
    assert "VLLM_USE_V2_MODEL_RUNNER" not in gpu_suite._env("dsv4vl_dspark_eager")
    assert "dsv4vl_dspark_eager" in gpu_suite.DSPARK_CASES
    for name in DSV4VL[:2]:
        argv = gpu_suite._cli_argv(name, Path("/tmp"))
        flags = dict(zip(argv, argv[1:]))
        assert flags["--model"] == str(model) and (model / "config.json").exists()
        assert "--skip-tokenizer-init" not in argv and flags["--validate"] == "worst", argv
        assert (flags["--max-model-len"], flags["--max-num-batched-tokens"],
                flags["--max-num-seqs"], flags["--kv-cache-dtype"], flags["--block-size"]) == (
            "131072", "4096", "4", "fp8_ds_mla", "256"), argv
        assert "--disable-chunked-mm-input" in argv and "--enable-prefix-caching" in argv
        assert json.loads(flags["--limit-mm-per-prompt"]) == {"image": 10}
        assert ("--enforce-eager" in argv) == name.endswith("_eager"), argv
        env = gpu_suite._env(name)
        assert env["VLLM_USE_V2_MODEL_RUNNER"] == "0" and gpu_suite.CASES[name][3] == "v1"
        assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
        assert gpu_suite.mm_expected(name) == (10, 387)
        assert name in gpu_suite.NAMED_ONLY and name not in gpu_suite.DEFAULT_CASES
    # the checks hold a DeepSeek-V4 report to its own images, not the Qwen case's
    r = _report()
    r["worstcase"]["encoder_step"].update(items=10, tokens_per_item=387)
    for v in r["validations"][:1]:
        v.update(encoder_items=10, encoder_items_formed=10)
    assert "encoder_step_measured" not in _failed(r, "dsv4vl_eager")
    assert "encoder_step_measured" in _failed(_report(), "dsv4vl_eager")


def test_the_other_cases_keep_the_common_flags():
    argv = gpu_suite._cli_argv("llama_v2", Path("/tmp"))
    assert "--skip-tokenizer-init" in argv
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.5"


def test_a_report_with_the_encoder_step_formed_from_images_passes():
    assert _failed(_report()) == []
    assert _failed(_report(eager=False), "qwen25vl") == []
    checks = gpu_suite._check(_report(), "qwen25vl_eager", 0, "")
    assert {"encoder_step_measured", "multimodal_items_formed", "multimodal_within_1.02",
            "multimodal_formed", "multimodal_within_prediction", "worst_step_within_1.02",
            "no_unprofiled_multimodal_limit", "runner_kind"} <= set(checks), checks


@pytest.mark.parametrize("edit, failed", [
    (lambda r: r["worstcase"].pop("encoder_step"), "encoder_step_measured"),
    (lambda r: r["worstcase"]["encoder_step"].update(items=1), "encoder_step_measured"),
    (lambda r: r["validations"][0].update(encoder_items_formed=1), "multimodal_items_formed"),
    (lambda r: r["validations"].pop(0), "multimodal_within_1.02"),
    (lambda r: r["validations"][0].update(measured_peak_bytes=90, ratio=0.9),
     "multimodal_within_1.02"),
    (lambda r: r["validations"][0].update(measured_peak_bytes=101, ratio=1.01),
     "multimodal_within_prediction"),
    (lambda r: r["validations"][1].update(measured_peak_bytes=40, ratio=0.8),
     "worst_step_within_1.02"),
    (lambda r: r["warnings"].append("multimodal steps are only partly in the worst case"),
     "no_unprofiled_multimodal_limit"),
    (lambda r: r["runner"].update(runner="v2"), "runner_kind"),
])
def test_a_report_that_misses_the_multimodal_step_fails(edit, failed):
    r = copy.deepcopy(_report())
    edit(r)
    assert failed in _failed(r)


def test_a_validation_over_its_prediction_fails_its_check_whatever_follows_it():
    """Each target's check holds every validation of it (ranks, named steps): a named step over
    its prediction is its own check's failure, and a later traffic validation that held does not
    overwrite it (check-step validations had been filed under traffic, the last one winning)."""
    def v(target, measured, rank=0):
        return {"target": target, "measured_peak_bytes": measured, "predicted_peak_bytes": 100,
                "ratio": measured / 100, "requests": [], "seconds": 1.0, "rank": rank}

    r = copy.deepcopy(_report())
    r["validations"] += [v("check-step", 101), v("traffic", 90), v("traffic", 90, rank=1)]
    assert "check_step_within_prediction" in _failed(r)
    assert "traffic_within_prediction" not in _failed(r)
    r["validations"] += [v("traffic", 101, rank=1), v("traffic", 90)]
    checks = gpu_suite._check(r, "qwen25vl_eager", 0, "")
    assert not checks["traffic_within_prediction"]["ok"], checks["traffic_within_prediction"]
    assert "rank 1" in checks["traffic_within_prediction"]["detail"]
    # and whether the scheduler formed the target: rank 0's miss is not hidden by rank 1's hit
    shape = {"kind": "prefill", "rows": 512, "context_len": 4096, "num_reqs": 1}
    short = {**shape, "context_len": 1024}
    r["validations"] = [{**v("worst-step", 50), "shape": shape, "formed": short},
                        {**v("worst-step", 50, rank=1), "shape": shape, "formed": dict(shape)}]
    assert "worst_step_formed" in _failed(r)


BUDGET = r"""
import json, os, sys
sys.path[:0] = [{bench!r}, {plugins!r}]
import gpu_suite
from wcp_fixtures import qwen_vl_cpu
qwen_vl_cpu.install()  # the CPU box only: no torchvision here (the suite never sets it)
from transformers import AutoProcessor, AutoTokenizer
from worstcase_profiler.adapter.multimodal import replay_items
from worstcase_profiler.commands import engine_boot, profile
from worstcase_profiler.core.multimodal import EncoderStep
from vllm.multimodal import MULTIMODAL_REGISTRY
from vllm.multimodal.encoder_budget import MultiModalBudget
tok = AutoTokenizer.from_pretrained({model!r})
proc = AutoProcessor.from_pretrained({model!r})
argv, _, _, _ = profile.prepare(gpu_suite._cli_argv({name!r}, gpu_suite.Path("/tmp")))
_, ea = engine_boot.build_engine_args(argv)
vc = ea.create_engine_config()
b = MultiModalBudget(vc, MULTIMODAL_REGISTRY, enable_cache=False)
enc = EncoderStep(modality="image", items=b.mm_max_items_per_batch["image"],
                  tokens_per_item=b.mm_max_toks_per_item["image"], peak_bytes=1, held_bytes=1,
                  encoder_peak_bytes=1, text_shape="-")
items, why = replay_items(vc.model_config, vc.scheduler_config, enc)
print("RESULT", json.dumps({{
    "ids": tok.convert_tokens_to_ids(["<|endoftext|>", "<|vision_start|>", "<|image_pad|>",
                                      "<|video_pad|>"]),
    "processor": type(proc).__name__, "max_model_len": vc.model_config.max_model_len,
    "vocab": vc.model_config.get_vocab_size(), "skip_tokenizer_init": ea.skip_tokenizer_init,
    "tokens": b.mm_max_toks_per_item, "per_batch": b.mm_max_items_per_batch,
    "budget": b.encoder_compute_budget, "cache": b.encoder_cache_size, "why": why,
    "item_len": items.spec.item_len if items else None,
    "sample": list(items.sample.size) if items else None}}))
"""


@pytest.mark.parametrize("name", NAMES)
def test_the_case_parses_and_vllm_sizes_its_encoder_step(name):
    """wcprof's preflight and parser take the case's argv; vLLM's config loads the layout at
    131072 (the config's 128,000 positions: VLLM_ALLOW_LONG_MAX_MODEL_LEN from the case's env);
    the tokenizer has the real special ids; vLLM's budget runs two 4,096-token images a step
    (the checks' IMAGES x TOKENS), and the replay builds its items from vLLM's processor."""
    pytest.importorskip("vllm")
    env = {**os.environ, **gpu_suite.CASES[name][2], "WCP_FIXTURES_QWEN_VL_CPU": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    code = BUDGET.format(bench=str(ROOT / "bench"), plugins=str(ROOT / "plugins" / "wcp_fixtures"),
                         model=str(MODEL), name=name)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       cwd=ROOT, timeout=300)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    assert p.returncode == 0 and lines, (p.stdout + p.stderr)[-4000:]
    got = json.loads(lines[-1][7:])
    assert got["ids"] == [151643, 151652, 151655, 151656], got
    assert got["processor"] == "Qwen2_5_VLProcessor" and got["skip_tokenizer_init"] is False, got
    assert (got["max_model_len"], got["vocab"]) == (131072, 152064), got
    assert got["tokens"] == {"image": TOKENS} and got["per_batch"] == {"image": IMAGES}, got
    assert got["budget"] == got["cache"] == IMAGES * TOKENS == 8192, got
    assert got["why"] == "" and got["item_len"] == TOKENS and got["sample"] == [1792, 1792], got
