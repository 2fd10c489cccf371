"""vLLM's own KV cache manager, on the CPU and without a model, leaves each request on a cached
prefix at least a block plus one token to compute when the drafter drops a hit's last block and
the model has one KV group (EAGLE-3 on a Llama: vLLM's unitary coordinator caps a hit at the
prompt's length minus one, then drops a block). So the fewest rows a hit leaves there is
Limits.prefix_hit_min_rows = block + 1 (adapter/facts.prefix_hit_rows), and every split prefill
the sweep plans under it is formed exactly by `--validate`'s prompts (core/requests_plan)."""

from __future__ import annotations

import pytest

from worstcase_profiler.core.requests_plan import plan_for, token_ids, validation_target
from worstcase_profiler.core.shapes import Limits, split_prefills

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")

BLOCK, VOCAB = 16, 32000
LIMITS = Limits(max_model_len=4096, max_num_batched_tokens=1024, max_num_seqs=128,
                num_speculative_tokens=3, block_size=BLOCK, prefix_caching=True,
                prefix_hit_min_rows=BLOCK + 1, prefix_hit_drop=BLOCK)


def _manager(use_eagle: bool, num_blocks: int = 4000):
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import init_none_hash
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    init_none_hash(sha256)
    group = KVCacheGroupSpec(["layer0", "layer1"], FullAttentionSpec(
        block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=torch.float32))
    cfg = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[group])
    return KVCacheManager(cfg, max_model_len=LIMITS.max_model_len, scheduler_block_size=BLOCK,
                          hash_block_size=BLOCK, enable_caching=True, use_eagle=use_eagle)


class _Requests:
    def __init__(self):
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher
        self.params = SamplingParams(max_tokens=1)
        self.hasher = get_request_block_hasher(BLOCK, sha256)
        self.n = 0

    def make(self, ids: list[int]):
        from vllm.v1.request import Request
        self.n += 1
        return Request(request_id=f"r{self.n}", prompt_token_ids=ids, sampling_params=self.params,
                       pooling_params=None, block_hasher=self.hasher)


def _cache(manager, req) -> None:
    """Compute the whole prompt (as a finished prefill does) and cache its full blocks."""
    blocks, hit, *_ = manager.get_computed_blocks(req)
    manager.allocate_slots(req, req.num_tokens - hit, hit, blocks)
    manager.cache_blocks(req, req.num_tokens)
    manager.free(req)


def _rows_left(manager, req) -> int:
    _, hit, *_ = manager.get_computed_blocks(req)
    return req.num_tokens - hit


@pytest.mark.parametrize("own", [1, 5, BLOCK, BLOCK + 3])
def test_a_hit_under_a_block_dropping_drafter_leaves_a_block_and_the_own_tokens(own):
    shared = 64 * BLOCK
    reqs, eagle, plain = _Requests(), _manager(True), _manager(False)
    prefix = [(7919 + 31 * i) % (VOCAB - 1) + 1 for i in range(shared)]
    for m in (eagle, plain):
        _cache(m, reqs.make(prefix + [1, 2, 3, 4]))
    tail = [(50000 + 13 * i) % (VOCAB - 1) + 1 for i in range(own)]
    assert _rows_left(eagle, reqs.make(prefix + tail)) == own + BLOCK >= LIMITS.prefix_hit_min_rows
    assert _rows_left(plain, reqs.make(prefix + tail)) == own  # no drafter: the hit is the prefix
    # the prompt that is the cached prefix itself: capped at its length - 1, then dropped
    assert _rows_left(eagle, reqs.make(prefix)) == 2 * BLOCK


def test_every_planned_split_prefill_hits_its_context_in_vllms_manager():
    """The plans `--validate` builds for the sweep's split prefills: after the warm batch, vLLM's
    manager leaves each measured prompt exactly its planned rows on the planned context."""
    rows = LIMITS.max_num_batched_tokens
    shapes = split_prefills(LIMITS, rows)
    widest = max(shapes, key=lambda s: s.num_reqs)  # one beyond the hits, on a short last chunk
    assert widest.num_reqs == 1 + (rows - 1) // (BLOCK + 1)
    assert validation_target(widest, 1, [(s, 1) for s in shapes], LIMITS).num_reqs == \
        rows // (BLOCK + 1)  # --validate builds the widest that prompts form instead
    for shape in shapes:
        if shape is widest:
            continue
        plan = plan_for(shape, LIMITS, prefix_caching=True)
        assert plan.exact, plan.note
        manager, reqs, salt = _manager(True), _Requests(), iter(range(1, 1 << 20))
        for batch in plan.batches[:-1]:
            for p in batch.prompts:
                _cache(manager, reqs.make(token_ids(p, VOCAB, next(salt))))
        rows = [_rows_left(manager, reqs.make(token_ids(p, VOCAB, next(salt))))
                for p in plan.batches[-1].prompts]
        assert sum(rows) == plan.target.rows == shape.rows, (shape, rows)
        assert all(r >= BLOCK + 1 for r in rows)
