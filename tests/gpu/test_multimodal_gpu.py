"""Issue 36, from bench/gpu_suite.py's VLM cases (named only; run them by name):

  qwen25vl[_eager]   the Qwen2.5-VL-32B-Instruct layout (tests/gpu/models/qwen2.5-vl-32b-layout:
                     64 layers, 5120 wide, a 32-block vision tower; dummy weights, a local
                     tokenizer, the real processor config with max_pixels lowered to 4,096
                     tokens an image), graphs on and off, 131072 / 8192, two images a prompt, no
                     video, the V1 runner

Each result (the tests below check the VLM cases among the given results, nothing for the
others: tests/unit/test_committed_results.py allows no skip a manifest does not name): the encoder step ran on two 4,096-token images (what one step's 8,192-token encoder
budget runs) with their outputs held through the worst text step; `--validate worst` built that
step from a request with two real images behind a cached text prefix, the scheduler ran the
encoder on both in one measured step and formed the target chunk, measured <= predicted <= 1.02 x
measured against the admitted figure; the text worst step within 1.02 of the text sweep's; no
multimodal limit named unprofiled. The generic checks (test_wcprof_gpu.py) run on these cases
too."""

from __future__ import annotations

import pytest
from gpu_results import asked, report_of, within_two_percent, worst_step_within_two_percent

VLM = {"qwen25vl": False, "qwen25vl_eager": True}  # name -> --enforce-eager
IMAGES, IMAGE_TOKENS = 2, 4096  # bench/gpu_suite.py VLM_IMAGES, VLM_IMAGE_TOKENS
HIDDEN = 5120  # config.json hidden_size: the vision tower's out_hidden_size


@pytest.fixture
def vlm(case) -> tuple[str, dict] | None:
    """The VLM case among the results' cases (conftest parametrizes `case` over them); None for
    any other case, whose tests then check nothing here."""
    return (case["case"], case) if case["case"] in VLM else None


def test_vlm_case_started_first_time_as_asked(vlm):
    if vlm is None:
        return
    name, c = vlm
    assert c["rc"] == 0, (name, c.get("log_tail", [])[-20:])
    assert c.get("first_start") is None, c.get("first_start")
    assert "--skip-tokenizer-init" not in c["cli_argv"], c["cli_argv"]
    assert (asked(c, "--max-model-len"), asked(c, "--max-num-batched-tokens")) == (131072, 8192)
    r = report_of(c)
    assert r["config"]["enforce_eager"] is VLM[name], r["config"]
    assert r["runner"]["runner"] == "v1", r["runner"]


def test_the_encoder_step_is_measured(vlm):
    if vlm is None:
        return
    name, c = vlm
    wc = report_of(c)["worstcase"]
    enc = wc.get("encoder_step")
    assert enc is not None, f"{name}: no encoder step ({report_of(c).get('warnings')})"
    assert (enc["modality"], enc["items"], enc["tokens_per_item"]) == ("image", IMAGES,
                                                                       IMAGE_TOKENS), enc
    assert enc["held_bytes"] == IMAGES * IMAGE_TOKENS * HIDDEN * 2, enc  # outputs, bf16
    assert enc["peak_bytes"] >= enc["encoder_peak_bytes"] > 0, enc
    assert wc["peak_activation_bytes"] >= enc["peak_bytes"], (wc["peak_activation_bytes"], enc)


def test_the_multimodal_step_is_formed_from_image_requests_within_two_percent(vlm):
    if vlm is None:
        return
    name, c = vlm
    r = report_of(c)
    mm = [v for v in r.get("validations") or [] if v.get("target") == "multimodal"]
    assert mm, f"{name}: no multimodal validation ({r.get('warnings')})"
    for v in mm:
        assert v["modality"] == "image" and v["encoder_items"] == IMAGES, v
        assert v["encoder_items_formed"] >= IMAGES, v
        f, s = v["formed"], v["shape"]
        assert f["rows"] >= s["rows"] and f["num_reqs"] >= s["num_reqs"] and \
            f["context_len"] >= s["context_len"], v
        within_two_percent(v)
    assert r["validation"]["target"] == "multimodal", r["validation"]  # it gates


def test_the_text_worst_step_within_two_percent(vlm):
    if vlm is None:
        return
    name, c = vlm
    worst_step_within_two_percent(name, report_of(c))


def test_no_multimodal_limit_is_left_unprofiled(vlm):
    if vlm is None:
        return
    name, c = vlm
    warnings = report_of(c).get("warnings") or []
    assert not [w for w in warnings if w.startswith("multimodal steps")], warnings
    assert not [w for w in warnings if w.startswith("--validate")], warnings
