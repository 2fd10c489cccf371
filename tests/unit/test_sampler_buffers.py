"""adapter/sampler_buffers: the Triton top-k/top-p buffer vLLM keeps from its first top-k batch is
made before the baseline on CUDA, sized by the largest sampled batch; nothing happens where no
sampler runs or off CUDA. The CUDA path itself runs in tests/gpu (h100-run80)."""

from __future__ import annotations

from types import SimpleNamespace

from worstcase_profiler.adapter import sampler_buffers as sb


def test_the_largest_sampled_batch_counts_every_draft_token():
    assert sb.sampled_rows(256, 0) == 256
    assert sb.sampled_rows(4, 8) == 36  # four requests, each verifying eight drafts
    assert sb.sampled_rows(0, -1) == 1


def _worker(device_type: str, sampler=object()):
    return SimpleNamespace(model_runner=SimpleNamespace(sampler=sampler),
                           device=SimpleNamespace(type=device_type, index=0))


def test_nothing_is_made_off_cuda_or_where_nothing_samples():
    assert sb.make_topk_topp_buffer(_worker("cpu")) == 0
    assert sb.make_topk_topp_buffer(_worker("cuda", sampler=None)) == 0  # a pooling model
