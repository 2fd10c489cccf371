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


def test_the_kept_rows_follow_the_kernel_power_of_two_capped_at_the_sms():
    assert sb.kept_rows(1024, 132) == 132  # the busiest batch: one row per SM
    assert sb.kept_rows(36, 132) == 64
    assert sb.kept_rows(64, 132) == 64
    assert sb.kept_rows(1, 132) == 1
    assert sb.kept_rows(100, 78) == 78


def _worker(device_type: str, **runner):
    runner = {"sampler": object(), "is_last_pp_rank": True, **runner}
    return SimpleNamespace(model_runner=SimpleNamespace(**runner),
                           device=SimpleNamespace(type=device_type, index=0))


def test_nothing_is_made_off_cuda_or_where_this_rank_does_not_sample():
    assert sb.make_topk_topp_buffer(_worker("cpu")) == 0
    assert sb.make_topk_topp_buffer(_worker("cuda", sampler=None)) == 0  # V2: a pooling model
    # V1 builds a sampler for pooling models too; and a pipeline rank before the last
    assert sb.make_topk_topp_buffer(_worker("cuda", is_pooling_model=True)) == 0
    assert sb.make_topk_topp_buffer(_worker("cuda", is_last_pp_rank=False)) == 0
