#!/usr/bin/env python3
"""The GPU suite: `wcprof --validate` on each test engine, one subprocess per engine, in one driver.

  python3 bench/gpu_suite.py --out DIR [CASE ...] [--budget-s 540] [--case-timeout-s 340]
                             [--no-prespawn]

Cases (models under tests/gpu/models/, config.json only, dummy weights, token-id prompts):
  llama_v2      Llama 8L/2048, FA3, default runner (V2 on vLLM 0.26), eager
  dsv32_fp8     DeepSeek-V3.2-style sparse MLA + indexer, 8 dense layers, kv fp8 (fp8_ds_mla)
  llama_v1      as llama_v2 with VLLM_USE_V2_MODEL_RUNNER=0
  dsv32_bf16    as dsv32_fp8 with kv_cache_dtype auto (bf16)
  llama_graphs  as llama_v2 without --enforce-eager (torch.compile + CUDA graphs)
  llama_v1_graphs, dsv32_fp8_graphs, dsv32_bf16_graphs
                as llama_v1, dsv32_fp8, dsv32_bf16 with graphs (named only; the scratch fixture
                is eager-only: torch.compile cannot trace its Python-side workspace calls)
  scratch       plugins/wcp_fixtures' context-scaled-workspace model (seed 002's scratch that
                grows with rows x KV extent), eager, max_model_len 8192, max_num_batched_tokens 2048
  dsv32_fp8_tp2, dsv32_bf16_tp2
                as dsv32_fp8 / dsv32_bf16 at tensor_parallel_size 2 (2 GPUs; named only: the
                default list is the single-GPU cases): every rank sweeps, the same steps in the
                same order, and is validated in its own worker
  dsv4_dspark_eager, dsv4_dspark_graphs
                issue 32, seed 002's system on one H200 (TP=1; named only): DeepSeek-V4 (the
                4-layer bf16 layout with its DSpark fields) with the DSpark drafter, k=3, at the
                seed's limits: max_model_len 262144, 4 sequences, 4096-token steps, fp8_ds_mla KV,
                block 256, prefix caching; eager, and FULL_AND_PIECEWISE CUDA graphs. Needs the
                extra piece (TileLang) on the 0.32 stack (docs/gpu.md)
  qwen25vl, qwen25vl_eager
                issue 36, a common VLM (named only): the Qwen2.5-VL-32B-Instruct layout (64 layers,
                5120 wide, 32-block vision tower; tests/gpu/models/qwen2.5-vl-32b-layout: dummy
                weights, a local tokenizer, the real processor config), graphs on and off, at
                131072 / 8192 with its tokenizer (no --skip-tokenizer-init), two images of up to
                4,096 tokens a prompt, no video, the V1 runner (the encoder step is not built on
                V2 yet), gpu_memory_utilization 0.9 (~62 GiB of weights); needs torchvision
The others at max_model_len 131072, max_num_batched_tokens 8192; all at gpu_memory_utilization 0.5
(but the VLM cases).

Writes DIR/<case>.json (wcprof's report), DIR/<case>.log, and, after every case, DIR/summary.json
(each case's rc, timings, checks and full report) and DIR/summary.md. Exit code 0 iff every
requested case passed its checks. The driver itself imports neither torch nor vLLM.

Time: `import vllm` costs 17-29 s on the H200 host, so the next case's process is started while
the current one runs and waits, imports done, for a "go" on stdin (--no-prespawn turns this off).
A waiting process has imported vLLM but created no engine; it only ever adds memory, so the
running engine's "free memory went up during profiling" assertion cannot fire because of it.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from common import ROOT, engine_env, gib, md_table, plugin_problem, write_json

MODELS = ROOT / "tests" / "gpu" / "models"
LLAMA, DSV32 = MODELS / "llama-8l-2048", MODELS / "dsv32-8l-dense"
LLAMA8B = MODELS / "llama-3.1-8b-layout"
QWEN35, DSV4 = MODELS / "qwen35-8l-mtp", MODELS / "dsv4-4l-mtp"
QWEN35_32L = MODELS / "qwen35-32l-layout"  # issue 34's hybrid: the 8-layer layout at 32 layers
DSV4_FP8 = MODELS / "dsv4-4l-mtp-fp8"  # the real checkpoint's FP8 block: 0.26's O projection is FP8-only
DSV4_026 = ["--enforce-eager", "--kv-cache-dtype", "fp8", "--load-format", "dummy-finalized",
            "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 1}']
GDN_TRITON = ["--additional-config", '{"gdn_prefill_backend": "triton"}']
CUT = ["--sweep-depth", "cut-down"]
PROVE = ["--sweep-depth", "prove"]  # both sweeps on one engine: issue 20's proof, no validation
# issue 33: drafters with their own models (dummy weights, config.json only)
LLAMA8B_EAGLE3 = MODELS / "llama-3.1-8b-eagle3"  # EAGLE-3 for the 8B layout, 1 layer
QWEN35_DFLASH = MODELS / "qwen35-dflash-5l"  # seed 000's draft: 5 layers, 4 KV heads, head_dim 256
EAGLE3_K, DFLASH_K = 3, 8
EAGLE3 = ["--speculative-config", json.dumps({"method": "eagle3", "model": str(LLAMA8B_EAGLE3),
                                               "num_speculative_tokens": EAGLE3_K})]
DFLASH = ["--speculative-config", json.dumps({"method": "dflash", "model": str(QWEN35_DFLASH),
                                               "num_speculative_tokens": DFLASH_K})]
# seed 000's launch: 32k context, 32 sequences, a 6 GiB KV flag held against the worst case
SEED000 = ["--max-model-len", "32768", "--max-num-batched-tokens", "8192", "--max-num-seqs", "32",
           "--kv-cache-memory-bytes", str(6 << 30), "--no-enable-prefix-caching"]
# issue 32: seed 002's launch, TP=1. DSpark (k=3, the seed's) drafts from the target's own
# checkpoint (no "model"): 3 SWA-only draft layers (n_mtp_layers absent -> 3, nvidia/dspark.py).
# fp8_ds_mla is what 0.32 forces for this layout anyway (auto -> fp8 -> fp8_ds_mla in
# models/deepseek_v4/attention.py _resolve_dsv4_kv_cache_dtype); the flag is the seed's own.
# Block 256 is the only kernel block size DSv4's sparse MLA and indexer backends take
# (models/deepseek_v4/sparse_mla.py, v1/attention/backends/mla/indexer.py); the SWA caches keep
# their own 64-token blocks, the compressor states 4 and 8.
DSPARK_K, DSPARK_DRAFT_LAYERS = 3, 3
DSPARK = ["--speculative-config", json.dumps({"method": "dspark", "num_speculative_tokens": DSPARK_K})]
# the seed's failing step, measured on its own and built from requests (--check-step): a
# 4,096-token chunk on 149,760 cached tokens
SEED002_STEP = {"kind": "prefill", "rows": 4096, "context_len": 149760, "num_reqs": 1}
SEED002_STEP_FLAG = f"{SEED002_STEP['rows']}@{SEED002_STEP['context_len']}"
SEED002 = ["--max-model-len", "262144", "--max-num-seqs", "4", "--max-num-batched-tokens", "4096",
           "--kv-cache-dtype", "fp8_ds_mla", "--block-size", "256", "--enable-prefix-caching",
           "--check-step", SEED002_STEP_FLAG]
FULL_AND_PIECEWISE = ["--compilation-config", json.dumps({"cudagraph_mode": "FULL_AND_PIECEWISE"})]
# issue 36: a common VLM at its real geometry. Two images of at most 4,096 tokens (max_pixels
# 4096 x 28 x 28: 1792x1792) fill the 8,192-token encoder budget in one step, as the CPU test's two
# 256-token images fill its 512 (tests/cpu/test_qwen25vl_cpu.py); no video: the encoder step picks
# the modality with the most tokens per item and its replay builds images only. ~62 GiB of bf16
# weights leave no room at 0.5 of the card for one 131,072-token request (64 layers x 8 KV heads x
# 128 x 2 x 2 B = 256 KiB a token, 32 GiB), hence 0.9. The config's 128,000 positions need vLLM's
# long-length override for 131,072. The V1 runner, where the encoder step has run (on V2 it has
# not run on a GPU: adapter/multimodal.encoder_step). The processor is transformers' own (torchvision on the host):
# no WCP_FIXTURES_QWEN_VL_CPU here.
QWEN25VL = MODELS / "qwen2.5-vl-32b-layout"
VLM_IMAGES, VLM_IMAGE_TOKENS = 2, 4096
VLM = ["--limit-mm-per-prompt", json.dumps({"image": VLM_IMAGES, "video": 0}),
       "--mm-processor-kwargs", json.dumps({"max_pixels": VLM_IMAGE_TOKENS * 28 * 28}),
       "--gpu-memory-utilization", "0.9"]
# Expandable segments, as the profiler advises: without them the V1 runner's sweep on 0.33 left
# 32 GiB reserved in torch's allocator beyond its live tensors (consistent with a freed
# provisional KV cache's segment it could not release), and the start was refused
# (docs/results/h200-run62)
VLM_ENV = {"VLLM_USE_V2_MODEL_RUNNER": "0", "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
# vLLM logs every workspace resize and the lock (issue 32, point 2: none after the lock)
WORKSPACE_DEBUG = {"VLLM_DEBUG_WORKSPACE": "1"}
# issue 36: seed 002's own VLM, DeepSeek-V4 with its vision tower (DeepseekV4ForConditionalGeneration;
# tests/gpu/models/dsv4-vision-4l/README.md), at 131,072 with the seed's other limits. vLLM budgets
# 387 tokens an image (384 + up to 3 alignment pads), so one 4,096-token step encodes 10 of them;
# on CUDA vLLM forces --disable-chunked-mm-input for this model (the seed's build did too). The V1
# runner for the first two (the encoder step's proven path); DSpark needs V2, whose encoder runner
# the encoder step drives but has not run on a GPU: dsv4vl_dspark_eager is seed 002's whole
# system, images and drafter, at its own 262,144.
DSV4VL = MODELS / "dsv4-vision-4l"
DSV4VL_IMAGES, DSV4VL_IMAGE_TOKENS = 10, 387
DSV4VL_FLAGS = ["--max-model-len", "131072", "--max-num-seqs", "4", "--max-num-batched-tokens",
                "4096", "--kv-cache-dtype", "fp8_ds_mla", "--block-size", "256",
                "--enable-prefix-caching", "--disable-chunked-mm-input",
                "--limit-mm-per-prompt", json.dumps({"image": DSV4VL_IMAGES})]
DSV4VL_ENV = {"VLLM_USE_V2_MODEL_RUNNER": "0", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
              "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", **WORKSPACE_DEBUG}
FIXTURES = ROOT / "plugins" / "wcp_fixtures"
SCRATCH = FIXTURES / "wcp_fixtures" / "configs" / "scratch"
COMMON = ["--load-format", "dummy", "--skip-tokenizer-init", "--gpu-memory-utilization", "0.5",
          "--seed", "0", "--validate"]
LONG = ["--max-model-len", "131072", "--max-num-batched-tokens", "8192"]
SHORT = ["--max-model-len", "8192", "--max-num-batched-tokens", "2048"]
TP2 = ["--tensor-parallel-size", "2", "--distributed-executor-backend", "mp"]
# Shared hosts: NVLink multicast stays off (it can take a host's GPUs out of service).
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                "NVSHMEM_DISABLE_NVLS": "1"}
# name -> (model, extra CLI args, extra env, expected runner or None)
CASES: dict[str, tuple[Path, list[str], dict[str, str], str | None]] = {
    "llama_v2": (LLAMA, [*LONG, "--enforce-eager"], {}, "v2"),
    "dsv32_fp8": (DSV32, [*LONG, "--enforce-eager", "--kv-cache-dtype", "fp8"], {}, None),
    "llama_v1": (LLAMA, [*LONG, "--enforce-eager"], {"VLLM_USE_V2_MODEL_RUNNER": "0"}, "v1"),
    "dsv32_bf16": (DSV32, [*LONG, "--enforce-eager", "--kv-cache-dtype", "auto"], {}, None),
    "llama_graphs": (LLAMA, LONG, {}, "v2"),
    "scratch": (SCRATCH, [*SHORT, "--enforce-eager"], {}, None),
    # vLLM 0.32: the Llama-3.1-8B layout (32 layers, 128k vocabulary), graphs on and off; the
    # cut-down sweep beside the full one; sparse MLA with graphs; the seeds' own families.
    "llama8b_graphs": (LLAMA8B, LONG, {}, "v2"),
    "llama8b_eager": (LLAMA8B, [*LONG, "--enforce-eager", "--sweep-depth", "full"], {}, "v2"),
    "llama8b_cut": (LLAMA8B, [*LONG, "--enforce-eager", *CUT], {}, "v2"),
    # the same configuration again: the sweep cache's restart (run right after llama8b_eager)
    "llama8b_eager_restart": (LLAMA8B, [*LONG, "--enforce-eager", "--sweep-depth", "full"], {},
                              "v2"),
    "dsv32_fp8_graphs": (DSV32, [*LONG, "--kv-cache-dtype", "fp8"], {}, None),
    # every default case with graphs on as well (llama_graphs is llama_v2's)
    "llama_v1_graphs": (LLAMA, LONG, {"VLLM_USE_V2_MODEL_RUNNER": "0"}, "v1"),
    "dsv32_bf16_graphs": (DSV32, [*LONG, "--kv-cache-dtype", "auto"], {}, None),
    # (no scratch_graphs: the scratch fixture is eager-only by construction, h200-run23)
    "dsv32_fp8_cut": (DSV32, [*LONG, "--enforce-eager", "--kv-cache-dtype", "fp8", *CUT], {}, None),
    # the Qwen3.5 hybrid without a drafter: vLLM 0.32's hybrid case, graphs off and on
    "qwen35_eager": (QWEN35, [*LONG, "--enforce-eager", *GDN_TRITON], {}, None),
    "qwen35_graphs": (QWEN35, [*LONG, *GDN_TRITON], {}, None),
    "qwen35_mtp": (QWEN35, [*LONG, *GDN_TRITON, "--speculative-config",
                            '{"method": "mtp", "num_speculative_tokens": 2}'], {}, None),
    "qwen35_mtp_eager": (QWEN35, [*LONG, "--enforce-eager", *GDN_TRITON, "--speculative-config",
                                  '{"method": "mtp", "num_speculative_tokens": 2}'], {}, None),
    "dsv4_mtp": (DSV4, [*LONG, "--enforce-eager", "--speculative-config",
                        '{"method": "mtp", "num_speculative_tokens": 1}'], {}, None),
    # the same with vLLM's default CUDA graphs (issue 31 asks for both; not run yet)
    "dsv4_mtp_graphs": (DSV4, [*LONG, "--speculative-config",
                               '{"method": "mtp", "num_speculative_tokens": 1}'], {}, None),
    # vLLM 0.26: FP8 weights (MXFP4 experts) and the fp8_ds_mla cache, which 0.26 does not pick
    # itself; staged with .stage-dsv4 (tilelang, CuTe-DSL, _moe_C: staging/dsv4_026/README.md)
    # 0.26's dummy loader skips DSv4's mHC finalisation (wcp_fixtures/loaders.py)
    "dsv4_mtp_fp8": (DSV4_FP8, [*LONG, *DSV4_026], {"WCP_FIXTURES_LOADERS": "1"}, None),
    # the same at 8k context and 2k chunks: fewer token counts, so fewer TileLang compiles on a
    # cold host (h200-run29 timed out compiling them at 131k / 8k)
    "dsv4_mtp_fp8_short": (DSV4_FP8, [*SHORT, *DSV4_026], {"WCP_FIXTURES_LOADERS": "1"}, None),
    # the same engine, validated with --validate quick (its sweep-cache entry is the same)
    "dsv4_mtp_fp8_short_quick": (DSV4_FP8, [*SHORT, *DSV4_026], {"WCP_FIXTURES_LOADERS": "1"},
                                 None),
    # the cut-down proof (sweep_depth.CUT_DOWN_PROVEN): every eager suite configuration of a family
    "llama_v2_prove": (LLAMA, [*LONG, "--enforce-eager", *PROVE], {}, "v2"),
    "llama_v1_prove": (LLAMA, [*LONG, "--enforce-eager", *PROVE],
                       {"VLLM_USE_V2_MODEL_RUNNER": "0"}, "v1"),
    "llama8b_prove": (LLAMA8B, [*LONG, "--enforce-eager", *PROVE], {}, "v2"),
    "dsv32_fp8_prove": (DSV32, [*LONG, "--enforce-eager", "--kv-cache-dtype", "fp8", *PROVE], {},
                        None),
    "dsv32_bf16_prove": (DSV32, [*LONG, "--enforce-eager", "--kv-cache-dtype", "auto", *PROVE],
                         {}, None),
    "qwen35_prove": (QWEN35, [*LONG, "--enforce-eager", *GDN_TRITON, *PROVE], {}, None),
    # graphs on: the cut steps bypass the compiled graph (eager), the confirmations run compiled
    "llama_graphs_prove": (LLAMA, [*LONG, *PROVE], {}, "v2"),
    "llama8b_graphs_prove": (LLAMA8B, [*LONG, *PROVE], {}, "v2"),
    "qwen35_graphs_prove": (QWEN35, [*LONG, *GDN_TRITON, *PROVE], {}, None),
    "qwen35_32l_graphs_prove": (QWEN35_32L, [*LONG, *GDN_TRITON, *PROVE], {}, None),
    "qwen35_mtp_prove": (QWEN35, [*LONG, "--enforce-eager", *GDN_TRITON, *PROVE,
                                  "--speculative-config",
                                  '{"method": "mtp", "num_speculative_tokens": 2}'], {}, None),
    # issue 33: a drafter with its own model. EAGLE-3 on the 8B layout (k=3), graphs on and off;
    # DFlash on the Qwen3.5 hybrid at seed 000's draft geometry (k=8), at the seed's launch
    # (32k, 32 sequences, 6 GiB) and at 131k with default concurrency, graphs on and off
    "llama8b_eagle3": (LLAMA8B, [*LONG, *EAGLE3], {}, "v2"),
    "llama8b_eagle3_eager": (LLAMA8B, [*LONG, "--enforce-eager", *EAGLE3], {}, "v2"),
    "qwen35_dflash": (QWEN35, [*SEED000, *GDN_TRITON, *DFLASH], {}, None),
    "qwen35_dflash_eager": (QWEN35, [*SEED000, "--enforce-eager", *GDN_TRITON, *DFLASH], {}, None),
    "qwen35_dflash_long": (QWEN35, [*LONG, *GDN_TRITON, *DFLASH], {}, None),
    "qwen35_dflash_long_eager": (QWEN35, [*LONG, "--enforce-eager", *GDN_TRITON, *DFLASH], {},
                                 None),
    # issue 32: seed 002's system on one H200, eager and with FULL_AND_PIECEWISE graphs (V2 only:
    # V1 refuses DSpark, config/vllm.py)
    "dsv4_dspark_eager": (DSV4, [*SEED002, "--enforce-eager", *DSPARK], WORKSPACE_DEBUG, "v2"),
    "dsv4_dspark_graphs": (DSV4, [*SEED002, *FULL_AND_PIECEWISE, *DSPARK], WORKSPACE_DEBUG, "v2"),
    # issue 36: the VLM, graphs on and off, with its tokenizer (_cli_argv drops
    # --skip-tokenizer-init)
    "qwen25vl": (QWEN25VL, [*LONG, *VLM], VLM_ENV, "v1"),
    "qwen25vl_eager": (QWEN25VL, [*LONG, "--enforce-eager", *VLM], VLM_ENV, "v1"),
    # the same on CUDA's default allocator (no expandable segments), where h200-run62's sweep
    # left 32 GiB reserved in torch's allocator and the start was refused: the report's
    # allocator note should now name it
    "qwen25vl_eager_default_alloc": (
        QWEN25VL, [*LONG, "--enforce-eager", *VLM],
        {k: v for k, v in VLM_ENV.items() if k != "PYTORCH_CUDA_ALLOC_CONF"}, "v1"),
    # issue 36: seed 002's VLM (above), eager and with FULL_AND_PIECEWISE graphs
    "dsv4vl_eager": (DSV4VL, [*DSV4VL_FLAGS, "--enforce-eager"], DSV4VL_ENV, "v1"),
    "dsv4vl_graphs": (DSV4VL, [*DSV4VL_FLAGS, *FULL_AND_PIECEWISE], DSV4VL_ENV, "v1"),
    "dsv4vl_dspark_eager": (
        DSV4VL, [*SEED002, "--disable-chunked-mm-input", "--limit-mm-per-prompt",
                 json.dumps({"image": DSV4VL_IMAGES}), "--enforce-eager", *DSPARK],
        {k: v for k, v in DSV4VL_ENV.items() if k != "VLLM_USE_V2_MODEL_RUNNER"}, "v2"),
    "dsv32_fp8_tp2": (DSV32, [*LONG, "--enforce-eager", "--kv-cache-dtype", "fp8", *TP2], {}, None),
    "dsv32_bf16_tp2": (DSV32, [*LONG, "--enforce-eager", "--kv-cache-dtype", "auto", *TP2], {}, None),
}
DRAFTER_CASES = ("llama8b_eagle3", "llama8b_eagle3_eager", "qwen35_dflash", "qwen35_dflash_eager",
                 "qwen35_dflash_long", "qwen35_dflash_long_eager")
DSPARK_CASES = ("dsv4_dspark_eager", "dsv4_dspark_graphs", "dsv4vl_dspark_eager")
MULTIMODAL_CASES = ("qwen25vl", "qwen25vl_eager", "qwen25vl_eager_default_alloc", "dsv4vl_eager",
                    "dsv4vl_graphs", "dsv4vl_dspark_eager")


def mm_expected(name: str) -> tuple[int, int]:
    """(images, tokens per image) one encoder step of the multimodal case `name` runs."""
    return (DSV4VL_IMAGES, DSV4VL_IMAGE_TOKENS) if name.startswith("dsv4vl") \
        else (VLM_IMAGES, VLM_IMAGE_TOKENS)

NAMED_ONLY = ("llama8b_graphs", "llama8b_eager", "llama8b_eager_restart", "llama8b_cut",
              "dsv32_fp8_graphs", "dsv32_fp8_cut", "qwen35_eager", "qwen35_graphs", "qwen35_mtp",
              "qwen35_mtp_eager", "dsv4_mtp", "dsv4_mtp_graphs", "dsv4_mtp_fp8",
              "dsv4_mtp_fp8_short", "dsv4_mtp_fp8_short_quick",
              "llama_v1_graphs", "dsv32_bf16_graphs", *(n for n in CASES if n.endswith("_prove")),
              *DRAFTER_CASES, *DSPARK_CASES, *MULTIMODAL_CASES)
DEFAULT_CASES = [n for n in CASES if "--tensor-parallel-size" not in CASES[n][1]
                 and n not in NAMED_ONLY]
V2_EVIDENCE = "[wcprof] V2 context injected"
RESTART_HINT = "start again with the same config"


def _cli_argv(name: str, out: Path) -> list[str]:
    model, extra, _, _ = CASES[name]
    common = list(COMMON)
    if name in MULTIMODAL_CASES:  # a VLM's prompts need its tokenizer and processor
        common.remove("--skip-tokenizer-init")
    if "--gpu-memory-utilization" in extra:  # the case's own share replaces COMMON's
        at = common.index("--gpu-memory-utilization")
        del common[at:at + 2]
    if proves(name):  # the proof compares two sweeps; the admitted one is validated elsewhere
        common.remove("--validate")
    elif name in NAMED_ONLY:  # the report's own worst step, built from real requests
        which = "quick" if name.endswith("_quick") else "worst"  # or its rows and requests
        common[common.index("--validate") + 1:common.index("--validate") + 1] = [which]
    return ["--model", str(model), *common, *extra, "--json", str(out / f"{name}.json")]


def proves(name: str) -> bool:
    return "prove" in CASES[name][1]


def _env(name: str) -> dict[str, str]:
    env = engine_env(**NO_MULTICAST)
    env.pop("VLLM_USE_V2_MODEL_RUNNER", None)  # "default" means default
    env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(FIXTURES),
                                         *filter(None, [env.get("PYTHONPATH")])])
    env.update(CASES[name][2])
    return env


def child(argv: list[str]) -> int:
    """Import everything, wait for "go" on stdin, then run the CLI in this process."""
    t0 = time.time()
    import torch
    import vllm
    import vllm.entrypoints.llm  # noqa: F401  (the LLM class: the bulk of the import time)

    import worstcase_profiler.cli as cli

    # A CUDA context made while waiting would hold device memory during the running case.
    print(f"[suite] imported vllm {vllm.__version__} in {time.time() - t0:.1f}s "
          f"(cuda initialized: {torch.cuda.is_initialized()}); waiting", flush=True)
    words = sys.stdin.readline().split()
    if not words or words[0] != "go":
        return 98
    if len(words) > 1:  # the case's deadline (Run.go): every thread's stack shortly before it
        faulthandler.dump_traceback_later(max(1.0, float(words[1]) - time.time() - DUMP_BEFORE_S))
    print(f"[suite] go: wcprof {' '.join(argv)}", flush=True)
    return cli.main(argv)


DUMP_BEFORE_S = 10.0
"""A case still running this long before its limit writes every thread's stack into its log."""


class Run:
    def __init__(self, name: str, out: Path, python: str, prespawn: bool):
        self.name, self.t_spawn, self.t_go = name, time.time(), None
        self.log_path = out / f"{name}.log"
        self.log = open(self.log_path, "w")
        argv = _cli_argv(name, out)
        cmd = ([python, str(Path(__file__).resolve()), "--child", json.dumps(argv)] if prespawn
               else [python, "-m", "worstcase_profiler.cli", *argv])
        self.prespawn = prespawn
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(name), stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True,
                                     stdin=subprocess.PIPE if prespawn else subprocess.DEVNULL, text=True)
        if not prespawn:
            self.t_go = self.t_spawn

    def go(self, limit_s: float | None = None) -> None:
        """Start the prespawned case; with `limit_s`, its stacks go to its log DUMP_BEFORE_S
        before that limit, counted from now (the child may still be importing: it gets the
        deadline, not the length). faulthandler's own timer thread writes them: a signal sent at
        the timeout wrote nothing from an engine's process (h200-run48's qwen35_mtp)."""
        self.t_go = time.time()
        if self.prespawn and self.proc.poll() is None:
            try:
                self.proc.stdin.write("go\n" if limit_s is None
                                      else f"go {self.t_go + limit_s:.1f}\n")
                self.proc.stdin.close()
            except BrokenPipeError:
                pass

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # our own session: the child and its kids
            except ProcessLookupError:
                pass
            self.proc.wait()

    def wait(self, timeout: float) -> int:
        try:
            rc = self.proc.wait(timeout=max(1.0, timeout))
        except subprocess.TimeoutExpired:
            self.kill()
            rc = 124
        self.log.close()
        return rc


def _import_info(log_text: str) -> tuple[float | None, bool | None]:
    """(import seconds, whether CUDA was initialised while the child waited) from its log."""
    m = re.search(r"\[suite\] imported vllm \S+ in ([0-9.]+)s \(cuda initialized: (\w+)\)", log_text)
    return (float(m.group(1)), m.group(2) == "True") if m else (None, None)


def _check(report: dict | None, name: str, rc: int, log_text: str) -> dict:
    checks: dict[str, dict] = {}

    def put(key: str, ok: bool, detail: str) -> None:
        checks[key] = {"ok": bool(ok), "detail": detail}

    put("exit_code_0", rc == 0, f"rc={rc}")
    if report is None:
        put("report_written", False, "no report JSON")
        return checks
    _check_report(report, name, put)
    if name in DSPARK_CASES:
        _check_dspark(report, name, log_text, put)
    if name in MULTIMODAL_CASES:
        _check_multimodal(report, name, put)
    tp = tp_size(name)
    if tp > 1:
        _check_ranks(report, tp, put)
    _check_v2_context(report, log_text, put)
    return checks


def _check_report(report: dict, name: str, put) -> None:
    """The case's own report: worst >= stock, validated within the prediction, every rows value
    covered, the fixture's scratch found, the runner and eager mode asked for."""
    wc, st, val = report["worstcase"], report["stock"], report.get("validation")
    excluded = wc.get("stock_excluded")  # vLLM's profile step never runs beside the KV cache
    put("worst_ge_stock", bool(excluded)
        or wc["peak_activation_bytes"] >= st["peak_activation_bytes"],
        f"worst {wc['peak_activation_bytes']} vs stock {st['peak_activation_bytes']}"
        + (f" (stock left out: {excluded})" if excluded else ""))
    if proves(name):
        proof = wc.get("cut_down_proof") or {}
        put("cut_down_proven", proof.get("verdict") == "proven",
            f"{proof.get('verdict', 'no proof in the report')} ({proof.get('depth')}; peak "
            f"{proof.get('full_peak_bytes')} full, {proof.get('confirmed_peak_bytes')} confirmed)")
    elif val is None:
        put("validation_within_prediction", False, "no validation section")
    else:
        put("validation_within_prediction", val["measured_peak_bytes"] <= val["predicted_peak_bytes"],
            f"measured {val['measured_peak_bytes']} vs predicted {val['predicted_peak_bytes']}")
    within: dict[str, tuple[bool, str]] = {}

    def put_all(key: str, ok: bool, detail: str) -> None:
        """One check over every validation of a target (ranks, named steps): any one failing
        fails it (a later one passing used to overwrite it)."""
        if key in within:
            ok, detail = ok and within[key][0], f"{within[key][1]}; {detail}"
        within[key] = (ok, detail)
        put(key, ok, detail)

    for v in report.get("validations") or []:
        key = {"worst-step": "worst_step", "quick": "quick", "multimodal": "multimodal",
               "check-step": "check_step"}.get(v.get("target"), "traffic")
        put_all(f"{key}_within_prediction", v["measured_peak_bytes"] <= v["predicted_peak_bytes"],
                f"ratio {v['ratio']:.4f} ({v.get('note') or 'exact'})"
                + (f" rank {v['rank']}" if v.get("rank") else ""))
        if key in ("worst_step", "quick", "multimodal") and v.get("shape") and \
                tuple(map(int, str(report.get("schema_version", "0")).split("."))) >= (1, 6):
            from worstcase_profiler.core.replay_rules import replay_reached
            from worstcase_profiler.report import validation_model

            put_all(f"{key}_formed", replay_reached(validation_model(v)) is True,
                    f"the closest step the scheduler formed: {v.get('formed')} (target "
                    f"{v['shape']})" + (f" rank {v['rank']}" if v.get("rank") else ""))
    warm = report.get("warmup_audit") or {}
    if warm.get("startup_transient_bytes") is not None:  # schema 1.16+
        got, want = warm["startup_transient_bytes"], report["admission"]["transient_bytes"]
        put("startup_within_prediction", got <= want + (1 << 20),
            f"vLLM's own warm-up beside the KV cache: {got} above what it kept vs the worst "
            f"step's {want} ({got / want:.4f}); high-water mark {warm['startup_peak_bytes']}, "
            f"before graph capture {warm.get('startup_peak_before_capture_bytes')}, after it "
            f"{warm.get('startup_peak_after_capture_bytes')}")
    rows = {"min": 1, "max": flag_value(name, "--max-num-batched-tokens")}
    put("rows_covered", wc["rows_covered"] == rows, json.dumps(wc["rows_covered"]))
    if name == "scratch":  # seed 002: the scratch grows with KV extent, which stock never runs
        put("stock_misses_the_scratch", st["workspace_bytes"] < wc["workspace_bytes"],
            f"workspace stock {st['workspace_bytes']} vs worst-case {wc['workspace_bytes']}")
    if name in DRAFTER_CASES:
        _check_drafter(report, name, put)
    runner, want = report["runner"]["runner"], CASES[name][3]
    if want is not None:
        put("runner_kind", runner == want, f"{runner} (want {want})")
    put("eager_as_asked", report["config"]["enforce_eager"] == ("--enforce-eager" in CASES[name][1]),
        f"enforce_eager={report['config']['enforce_eager']}")


def speculative(name: str) -> dict | None:
    """The case's --speculative-config, parsed (None without one)."""
    extra = CASES[name][1]
    return json.loads(extra[extra.index("--speculative-config") + 1]) \
        if "--speculative-config" in extra else None


def _drafter_steps_and_groups(report: dict, k: int, draft_layers: int, whose: str, put) -> list:
    """The checks every drafter case shares: k as configured, decode/verify steps of 1 + k
    tokens per request, the KV audit ok with every planned group within its plan, and the
    draft's `draft_layers` layers named in the groups. Returns the planned groups."""
    put("num_speculative_tokens", report["config"].get("num_speculative_tokens") == k,
        f"{report['config'].get('num_speculative_tokens')} (want {k})")
    decodes = [s["shape"] for s in report["worstcase"]["steps"] if s["shape"]["kind"] == "decode"]
    put("decode_steps_one_plus_k", bool(decodes) and all(
        s["rows"] == s["num_reqs"] * (1 + k) for s in decodes),
        f"{len(decodes)} decode steps; rows/reqs {sorted({(s['rows'], s['num_reqs']) for s in decodes})[:4]}")
    audit = report.get("kv_audit") or {}
    planned = [g for g in audit.get("groups") or [] if g.get("declared_bytes", 0) > 0]
    put("kv_audit_ok", audit.get("verdict") == "ok", str(audit.get("message"))[:400])
    put("every_group_within_its_plan", bool(planned) and all(
        g.get("ratio") is not None and g["ratio"] <= 1.0 for g in planned),
        "; ".join(f"{g['name']} x{g.get('ratio')}" for g in planned))
    named = sum(len(g.get("drafter_layers") or []) for g in planned)
    put("drafter_layers_audited", named == draft_layers,
        f"{named} drafter layer(s) in the audit ({whose} {draft_layers})")
    return planned


def _check_drafter(report: dict, name: str, put) -> None:
    """Issue 33: a drafter with its own model. Its decode/verify steps carry 1 + k tokens per
    request; the KV audit lists every group, the drafter's layers named, each within its own
    plan (ratio <= 1.000); a hybrid's GDN state group is there; an explicit KV flag is held;
    the worst step built from real requests is within 1.02 of the prediction."""
    spec = speculative(name)
    draft_layers = json.loads((Path(spec["model"]) / "config.json").read_text())["num_hidden_layers"]
    planned = _drafter_steps_and_groups(report, spec["num_speculative_tokens"], draft_layers,
                                        "the draft has", put)
    if spec["method"] == "dflash":
        put("gdn_state_group", any("Mamba" in g["name"] for g in planned),
            ", ".join(g["name"] for g in planned))
    explicit = flag_value(name, "--kv-cache-memory-bytes", 0) or None
    if explicit is not None:
        adm = report["admission"]
        put("explicit_kv_held", adm.get("explicit_kv_cache_memory_bytes") == explicit
            and adm.get("fits") is True and adm["budget_bytes"] >= explicit,
            f"explicit {adm.get('explicit_kv_cache_memory_bytes')} fits={adm.get('fits')} "
            f"budget {adm['budget_bytes']}")
    _within_two_percent(put, "worst_step_within_1.02", [
        v for v in report.get("validations") or [] if v.get("target") == "worst-step"], "worst-step")


def _within_two_percent(put, key: str, vals: list[dict], what: str) -> None:
    """measured <= predicted <= 1.02 x measured for every validation in `vals` (none: fails)."""
    put(key, bool(vals) and all(
        v["measured_peak_bytes"] <= v["predicted_peak_bytes"]
        and v["predicted_peak_bytes"] <= 1.02 * v["measured_peak_bytes"] for v in vals),
        "; ".join(f"{v['ratio']:.4f}" for v in vals) or f"no {what} validation")


def _check_multimodal(report: dict, name: str, put) -> None:
    """Issue 36: a VLM. The encoder step ran (the case's images of their tokens, mm_expected: what
    one step's encoder budget runs) with its outputs held through the worst text step; `--validate
    worst` built that step from requests with real images (its encoder on every planned item in
    one measured step, the target step formed) within 1.02 of the admitted figure; the text worst
    step within 1.02 of the text sweep's; no multimodal limit left unprofiled in the warnings."""
    images, tokens = mm_expected(name)
    enc = report["worstcase"].get("encoder_step") or {}
    put("encoder_step_measured", (enc.get("modality"), enc.get("items"), enc.get("tokens_per_item"))
        == ("image", images, tokens) and enc.get("peak_bytes", 0) > 0,
        json.dumps({k: enc.get(k) for k in ("modality", "items", "tokens_per_item", "peak_bytes",
                                            "held_bytes", "text_peak_bytes", "sets_transient")})
        if enc else "no worstcase.encoder_step in the report")
    mm = [v for v in report.get("validations") or [] if v.get("target") == "multimodal"]
    put("multimodal_items_formed", bool(mm) and all(
        v.get("modality") == "image" and v.get("encoder_items") == images
        and (v.get("encoder_items_formed") or 0) >= images for v in mm),
        "; ".join(f"{v.get('encoder_items_formed')} of {v.get('encoder_items')} {v.get('modality')} "
                  f"item(s) through the encoder; formed {v.get('formed')} (target {v.get('shape')})"
                  for v in mm) or "no multimodal validation: " + "; ".join(
            w for w in report.get("warnings") or [] if "multimodal" in w or "--validate" in w)[:600])
    _within_two_percent(put, "multimodal_within_1.02", mm, "multimodal")
    _within_two_percent(put, "worst_step_within_1.02", [
        v for v in report.get("validations") or [] if v.get("target") == "worst-step"], "worst-step")
    left = [w for w in report.get("warnings") or [] if w.startswith("multimodal steps")]
    put("no_unprofiled_multimodal_limit", not left, left[0][:600] if left else "none")


RESIZED, LOCKED = "[WORKSPACE DEBUG] Resized workspace", "[WORKSPACE DEBUG] Workspace locked"
_PROCESS = re.compile(r"^\((?:[^()]*?) pid=(\d+)\)")


def resizes_after_lock(log_text: str) -> tuple[bool, list[str]]:
    """vLLM's workspace debug log (VLLM_DEBUG_WORKSPACE=1): (whether any process logged the lock,
    the resize lines each process logged after its own lock, and every resize line of a process
    that resized and never locked). Lines are grouped by their "(Name pid=N)" prefix (under
    `vllm serve` and TP each worker logs its own lock); lines without one are one process (an
    in-process engine)."""
    lines: dict[str, list[str]] = {}
    for ln in log_text.splitlines():
        if LOCKED in ln or RESIZED in ln:
            m = _PROCESS.match(ln)
            lines.setdefault(m.group(1) if m else "", []).append(ln)
    locked, late = False, []
    for own in lines.values():
        at = next((i for i, ln in enumerate(own) if LOCKED in ln), None)
        if at is not None:
            locked = True
        late += [ln for ln in own[at or 0:] if RESIZED in ln]  # never locked: every resize
    return locked, late


def _check_dspark(report: dict, name: str, log_text: str, put) -> None:
    """Issue 32: DeepSeek-V4 + DSpark at seed 002's limits. The drafter's verify steps carry 1 + k
    tokens per request; max_model_len at least 262,144; the KV audit within budget, every group
    within its plan, the 3 draft layers named; both workspace lanes (lane 1: the drafter's) in
    every ubatch reserved to the same worst size and locked, and vLLM's workspace debug log shows
    no resize after the lock; the worst step from real requests within 1.02 of the prediction,
    and the seed's own step (SEED002_STEP: --check-step 4096@149760) within 1.02 of its own
    reading."""
    cfg = report["config"]
    put("max_model_len_ge_262144", cfg.get("max_model_len", 0) >= 262144, str(cfg.get("max_model_len")))
    _drafter_steps_and_groups(report, DSPARK_K, DSPARK_DRAFT_LAYERS, "DSpark builds", put)
    slots = report["worstcase"].get("workspace_slots") or []
    top = max((s["bytes_after"] for s in slots), default=0)
    put("both_lanes_reserved", {s["lane"] for s in slots} >= {0, 1} and top > 0
        and all(s["bytes_after"] == top for s in slots),
        "; ".join(f"u{s['ubatch']}/l{s['lane']}: {s['bytes_before']} -> {s['bytes_after']}" for s in slots)
        or "no workspace slots")
    put("workspace_locked", report["worstcase"].get("workspace_locked") is True,
        str(report["worstcase"].get("workspace_locked")))
    locked, late = resizes_after_lock(log_text)
    put("no_workspace_resize_after_lock", locked and not late,
        "no lock line in the log (VLLM_DEBUG_WORKSPACE unset?)" if not locked
        else (late[0][:300] if late else "no resize after the lock"))
    _within_two_percent(put, "worst_step_within_1.02", [
        v for v in report.get("validations") or [] if v.get("target") == "worst-step"], "worst-step")
    _within_two_percent(put, "seed_step_within_1.02", [
        v for v in report.get("validations") or []
        if v.get("target") == "check-step" and v.get("shape") == SEED002_STEP],
        f"check-step of the seed's step ({SEED002_STEP_FLAG})")


def _check_v2_context(report: dict, log_text: str, put) -> None:
    """vLLM 0.26's V2 runner: the log shows that the sweep's steps carried KV context."""
    if report["runner"]["runner"] != "v2" or not str(report.get("vllm_version", "")).startswith("0.26"):
        return
    seen = V2_EVIDENCE in log_text
    put("v2_context_injected", seen,
        "log line present" if seen else f"no '{V2_EVIDENCE}' in the log (context not injected?)")


def flag_value(name: str, flag: str, default: int | None = None) -> int:
    """The integer a case passes for `flag` (default when it does not pass it)."""
    extra = CASES[name][1]
    return int(extra[extra.index(flag) + 1]) if flag in extra or default is None else default


def tp_size(name: str) -> int:
    return flag_value(name, "--tensor-parallel-size", 1)


def _check_ranks(report: dict, tp: int, put) -> None:
    """Tensor parallel: one report per rank, every rank ran the same steps in the same order
    (their plan fingerprints, all-gathered at start-up, agree), each rank's own budget held and
    its own measured peak stayed within its own prediction."""
    ranks = report.get("ranks") or []
    put("one_report_per_rank", sorted(r["rank"] for r in ranks) == list(range(tp)),
        f"ranks {[r['rank'] for r in ranks]} (want 0..{tp - 1})")
    if not ranks:
        return
    for key, check in (("same_steps_on_every_rank", _same_steps), ("plan_fingerprints_agree", _fingerprints),
                       ("every_rank_validated", _ranks_validated), ("every_rank_kv_audit_ok", _ranks_kv_ok)):
        put(key, *check(ranks, tp))


def _same_steps(ranks: list[dict], tp: int) -> tuple[bool, str]:
    steps = {r["rank"]: [s["shape"] for s in r["worstcase"]["steps"]] for r in ranks}
    return len({json.dumps(v) for v in steps.values()}) == 1, f"{ {k: len(v) for k, v in steps.items()} } steps"


def _fingerprints(ranks: list[dict], tp: int) -> tuple[bool, str]:
    """Every rank saw tp equal fingerprints, and every rank saw the same ones."""
    prints = {r["rank"]: r["worstcase"]["plan_fingerprints"] for r in ranks}
    each = all(len(set(p)) == 1 and len(p) == tp for p in prints.values())
    return each and len({tuple(p) for p in prints.values()}) == 1, json.dumps(prints)


def _ranks_validated(ranks: list[dict], tp: int) -> tuple[bool, str]:
    vals = {r["rank"]: r.get("validation") for r in ranks}
    ok = all(v is not None and v["measured_peak_bytes"] <= v["predicted_peak_bytes"] for v in vals.values())
    return ok, "; ".join(f"rank {k}: " + (f"{v['measured_peak_bytes']}/{v['predicted_peak_bytes']}" if v else "none")
                         for k, v in vals.items())


def _ranks_kv_ok(ranks: list[dict], tp: int) -> tuple[bool, str]:
    verdicts = [(r["rank"], (r.get("kv_audit") or {}).get("verdict")) for r in ranks]
    return all(v == "ok" for _, v in verdicts), "; ".join(f"rank {k}: {v}" for k, v in verdicts)


SUMMARY_HEADERS = ["case", "status", "rc", "runner", "backends", "stock peak GiB", "worst peak GiB",
                   "worst shape (kind rows/ctx)", "validation measured / predicted GiB",
                   "post-profile GiB", "steps", "import s", "run s", "failed checks"]
RANK_HEADERS = ["case", "rank", "stock peak GiB", "worst peak GiB", "KV budget GiB",
                "validation measured / predicted GiB", "ratio", "plan fingerprint"]


def _gib_or_dash(b) -> str:
    return gib(b) if isinstance(b, int) else "-"


def _summary_cells(c: dict) -> list:
    r = c.get("report") or {}
    wc, st = r.get("worstcase") or {}, r.get("stock") or {}
    runner = r.get("runner") or {}
    return [c["case"], c["status"], c.get("rc"), runner.get("runner", "-"),
            ",".join(runner.get("attention_backends", [])) or "-",
            _gib_or_dash(st.get("peak_activation_bytes")), _gib_or_dash(wc.get("peak_activation_bytes")),
            _shape_cell(wc.get("worst_shape") or {}), _validation_cell(r.get("validation") or {}),
            _gib_or_dash(wc.get("post_profile_bytes")), wc.get("shapes_executed", "-"),
            c.get("import_s", "-"), c.get("run_s", "-"),
            ", ".join(_failed(c.get("checks", {}))) or "-"]


def _failed(checks: dict) -> list[str]:
    return [k for k, v in checks.items() if not v["ok"]]


def _shape_cell(shape: dict) -> str:
    return f"{shape.get('kind', '-')} {shape.get('rows', '')}/{shape.get('context_len', '')}"


def _validation_cell(val: dict) -> str:
    return f"{_gib_or_dash(val.get('measured_peak_bytes'))} / {_gib_or_dash(val.get('predicted_peak_bytes'))}"


def _rank_cells(name: str, r: dict) -> list:
    v, fps = r.get("validation") or {}, r["worstcase"]["plan_fingerprints"]
    return [name, r["rank"], gib(r["stock"]["peak_activation_bytes"]),
            gib(r["worstcase"]["peak_activation_bytes"]), gib(r["admission"]["budget_bytes"]),
            f"{gib(v.get('measured_peak_bytes', 0))} / {gib(v.get('predicted_peak_bytes', 0))}",
            f"{v.get('ratio', float('nan')):.3f}", fps[r["rank"]] if r["rank"] < len(fps) else "-"]


def _write_summary(out: Path, summary: dict, mirror: Path | None = None) -> None:
    for d in filter(None, (out, mirror)):
        _write_summary_to(d, summary)


def _write_summary_to(out: Path, summary: dict) -> None:
    write_json(out / "summary.json", summary)  # the suite may be killed by its time budget
    lines = [f"# wcprof GPU suite ({summary.get('vllm_version', '?')}, wall {summary['wall_s']:.0f}s"
             f" of {summary['budget_s']:.0f}s budget)", "",
             md_table(SUMMARY_HEADERS, [_summary_cells(c) for c in summary["cases"]])]
    rank_rows = [_rank_cells(c["case"], r) for c in summary["cases"]
                 for r in ((c.get("report") or {}).get("ranks") or [])]
    if rank_rows:
        lines += ["", md_table(RANK_HEADERS, rank_rows)]
    if summary.get("error"):
        lines += ["", f"**error:** {summary['error']}"]
    (out / "summary.md").write_text("\n".join(lines) + "\n")


@dataclass
class Attempt:
    """One start of a case, finished: its process, exit code, end time and log."""
    run: Run
    rc: int
    t_end: float
    log_text: str

    @classmethod
    def wait(cls, run: Run, timeout: float) -> Attempt:
        rc = run.wait(timeout)
        return cls(run, rc, time.time(), run.log_path.read_text(errors="replace"))


def _case_record(name: str, out: Path, att: Attempt, first_start: dict | None) -> dict:
    """summary.json's entry for a case that ran: its checks, timings and full report."""
    rpath = out / f"{name}.json"
    report = json.loads(rpath.read_text()) if rpath.exists() and att.rc != 124 else None
    checks = _check(report, name, att.rc, att.log_text)
    ok = all(c["ok"] for c in checks.values())
    import_s, cuda_initialized = _import_info(att.log_text)
    case = {"case": name, "status": "pass" if ok else ("timeout" if att.rc == 124 else "fail"),
            "rc": att.rc, "cli_argv": _cli_argv(name, out), "env": CASES[name][2],
            "import_s": import_s, "run_s": round(att.t_end - att.run.t_go, 1),
            "cuda_initialized_at_import": cuda_initialized, "checks": checks,
            "first_start": first_start,
            "v2_injection_lines": [ln for ln in att.log_text.splitlines() if V2_EVIDENCE in ln][:3],
            "report": report}
    if not ok:
        case["log_tail"] = att.log_text.splitlines()[-80:]
    return case


class Suite:
    """The requested cases one after the other within the budget; while one runs, the next
    case's process is started and waits, imports done (unless --no-prespawn)."""

    def __init__(self, a: argparse.Namespace):
        self.a = a
        self.t_start = time.time()
        self.deadline = self.t_start + a.budget_s
        self.summary = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                        "budget_s": a.budget_s, "prespawn": not a.no_prespawn, "python": a.python,
                        "cases": [], "wall_s": 0.0}
        self.pending: Run | None = None

    def left(self) -> float:
        return self.deadline - time.time()

    def write(self) -> None:
        _write_summary(self.a.out, self.summary, self.a.mirror)

    def spawn(self, name: str, prespawn: bool) -> Run:
        return Run(name, self.a.out, self.a.python, prespawn)

    def run(self) -> int:
        problem = plugin_problem()
        if problem:
            self.summary.update(error=problem, all_passed=False)
            self.write()
            print(f"[suite] {problem}", flush=True)
            return 2
        for i, name in enumerate(self.a.names):
            left = self.left()
            if left < self.a.min_case_s:
                self.skip(name, left)
            else:
                self.record(self.run_case(i, name, left))
        if self.pending is not None:
            self.pending.kill()
        cases = self.summary["cases"]
        self.summary["wall_s"] = time.time() - self.t_start
        self.summary["all_passed"] = bool(cases) and all(c["status"] == "pass" for c in cases)
        self.write()
        print((self.a.out / "summary.md").read_text(), flush=True)
        return 0 if self.summary["all_passed"] else 1

    def skip(self, name: str, left: float) -> None:
        if self.pending is not None and self.pending.name == name:
            self.pending.kill()
            self.pending = None
        self.summary["cases"].append({"case": name, "status": "skipped", "rc": None, "checks": {},
                                      "detail": f"only {left:.0f}s of the budget left"})
        print(f"[suite] {name}: skipped, {left:.0f}s left", flush=True)

    def start(self, i: int, name: str, limit_s: float | None = None) -> Run:
        """The case's process (the prespawned one if any) gets its go; the next case's starts."""
        run = self.pending if self.pending is not None else self.spawn(name, not self.a.no_prespawn)
        self.pending = None
        run.go(limit_s)
        if not self.a.no_prespawn and i + 1 < len(self.a.names):
            self.pending = self.spawn(self.a.names[i + 1], True)
        return run

    def run_case(self, i: int, name: str, left: float) -> dict:
        limit = min(self.a.case_timeout_s, left)
        run = self.start(i, name, limit)
        print(f"[suite] {name}: started (limit {limit:.0f}s)", flush=True)
        att = Attempt.wait(run, limit)
        first_start = None
        if att.rc == 3 and RESTART_HINT in att.log_text and self.left() > self.a.min_case_s:
            first_start = {"rc": att.rc, "log_tail": att.log_text.splitlines()[-15:]}
            att = self.restart(name, run)
        return _case_record(name, self.a.out, att, first_start)

    def restart(self, name: str, run: Run) -> Attempt:
        """The warm-up audit failed the start and cached what warm-up kept (CUDA graphs on a
        runner that estimates them as 0): a restart with the same config subtracts it."""
        print(f"[suite] {name}: warm-up audit failed the first start; restarting", flush=True)
        run.log_path.rename(run.log_path.with_suffix(".first.log"))
        again = self.spawn(name, False)
        again.go()
        return Attempt.wait(again, min(self.a.case_timeout_s, self.left()))

    def record(self, case: dict) -> None:
        self.summary["cases"].append(case)
        if case["report"] and "vllm_version" not in self.summary:
            self.summary["vllm_version"] = case["report"].get("vllm_version")
        self.summary["wall_s"] = time.time() - self.t_start
        self.write()
        print(f"[suite] {case['case']}: {case['status']} rc={case['rc']} in {case['run_s']}s "
              f"(import {case['import_s'] or '?'}s) {_failed(case['checks'])}", flush=True)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("cases", nargs="*", help=f"default: {' '.join(DEFAULT_CASES)}; also: "
                                          f"{' '.join(n for n in CASES if n not in DEFAULT_CASES)}")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--budget-s", type=float, default=540.0, help="the whole suite's wall budget")
    p.add_argument("--case-timeout-s", type=float, default=340.0)
    p.add_argument("--min-case-s", type=float, default=60.0, help="don't start a case with less left")
    p.add_argument("--no-prespawn", action="store_true")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--mirror", type=Path, default=None,
                   help="also write summary.json/.md here after every case (e.g. $OUT)")
    a = p.parse_args(argv)
    a.names = a.cases or list(DEFAULT_CASES)
    unknown = [n for n in a.names if n not in CASES]
    if unknown:
        p.error(f"unknown case(s) {unknown}; known: {list(CASES)}")
    return a


def main(argv: list[str] | None = None) -> int:
    a = _parse(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    return Suite(a).run()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        sys.exit(child(json.loads(sys.argv[2])))
    sys.exit(main())
