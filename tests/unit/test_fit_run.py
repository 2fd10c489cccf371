"""bench/fit_run.py's pure parts (issue 37 point 4's device script): the commands it builds for
fit, the fitted start and stock vLLM's auto-fit, the auto-fit length read from vLLM's log, the
per-model checks tests/gpu/test_fit_gpu.py asserts, the summary and the deadline. No engine."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import fit_run  # noqa: E402

GPU = fit_run.PRESETS["cuda"]
FIT_FLAGS = ["--max-model-len", "105984", "--max-num-batched-tokens", "4096", "--max-num-seqs",
             "256", "--gpu-memory-utilization", "0.5", "--kv-cache-memory-bytes", "55548166144"]


def _flag(argv: list[str], name: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == name]


def test_every_preset_names_a_model_that_is_here():
    for kind, presets in fit_run.PRESETS.items():
        for name, spec in presets.items():
            assert (Path(spec["model"]) / "config.json").exists(), (kind, name)
            assert 1 <= spec["n"], (kind, name)
        assert set(fit_run.DEFAULT_MODELS[kind].split(",")) <= set(presets)


@pytest.mark.parametrize("argv, drop, want", [
    (["--a", "1", "--b", "--c", "x"], {"--a"}, ["--b", "--c", "x"]),
    (["--a=1", "--b"], {"--a"}, ["--b"]),
    (["--b", "--a"], {"--a"}, ["--b"]),  # a flag without a value, last
    (["--e", "--a", "2"], {"--e"}, ["--a", "2"]),  # --enforce-eager style
    (["--x", '{"k": 1}', "--a", "-1"], {"--a"}, ["--x", '{"k": 1}']),  # -1 is a value
])
def test_drop_flags(argv, drop, want):
    assert fit_run.drop_flags(argv, drop) == want


def test_fit_command_asks_for_the_longest_context_holding_n(tmp_path):
    argv = fit_run.fit_argv(GPU["llama8b"], tmp_path, "llama8b")
    assert argv[:3] == ["fit", "--model", str(GPU["llama8b"]["model"])]
    assert _flag(argv, "--min-concurrency") == ["4"] and _flag(argv, "--objective") == ["context"]
    assert _flag(argv, "--max-model-len") == ["131072"]
    assert _flag(argv, "--max-num-batched-tokens") == ["8192"]
    assert _flag(argv, "--gpu-memory-utilization") == ["0.5"]
    assert "--enforce-eager" in argv and "--validate" not in argv  # fit refuses --validate
    assert _flag(argv, "--json") == [str(tmp_path / "fit-llama8b.json")]
    for f in ("--load-format", "--skip-tokenizer-init", "--seed"):
        assert f in argv


def test_fitted_command_takes_fits_flags_in_place_of_the_swept_limits(tmp_path):
    spec = GPU["qwen35"]
    argv = fit_run.fitted_argv(spec, FIT_FLAGS, tmp_path, "qwen35")
    for flag in ("--max-model-len", "--max-num-batched-tokens", "--max-num-seqs",
                 "--gpu-memory-utilization", "--kv-cache-memory-bytes"):
        assert _flag(argv, flag) == _flag(FIT_FLAGS, flag), flag  # once, fit's value
    assert _flag(argv, "--validate") == ["worst"]
    assert _flag(argv, "--json") == [str(tmp_path / "fitted-qwen35.json")]
    assert _flag(argv, "--additional-config") == ['{"gdn_prefill_backend": "triton"}']
    assert "--enforce-eager" in argv and argv[:2] == ["--model", str(spec["model"])]
    assert argv[0] != "fit"


def test_stock_command_is_vllms_auto_fit_without_the_profiler():
    argv = fit_run.stock_argv(GPU["qwen35"])
    assert _flag(argv, "--max-model-len") == ["auto"]
    assert _flag(argv, "--max-num-batched-tokens") == ["8192"]
    assert _flag(argv, "--gpu-memory-utilization") == ["0.5"]
    assert _flag(argv, "--additional-config") == ['{"gdn_prefill_backend": "triton"}']
    for f in ("--validate", "--json", "--min-concurrency", "--profiler", "fit"):
        assert f not in argv


def test_stock_command_parses_as_vllm_reads_it():
    """'auto' is what vLLM 0.32/0.33 read as -1 (human_readable_int_or_auto)."""
    pytest.importorskip("vllm")
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    p = FlexibleArgumentParser()
    EngineArgs.add_cli_args(p)
    ns = p.parse_args(fit_run.stock_argv(fit_run.PRESETS["cpu"]["tiny"]))
    assert ns.max_model_len == -1 and ns.kv_cache_memory_bytes == 8 << 20


REDUCED = ("(EngineCore pid=1) INFO 12-04 05:29:46 [kv_cache_utils.py:2477] Auto-fit "
           "max_model_len: reduced from 131072 to 105920 to fit in available KV cache memory "
           "(51.73 GiB GPU)")
FULL = ("INFO [kv_cache_planning.py:1396] Auto-fit max_model_len: full model context length "
        "262144 fits in available KV cache memory (49.20 GiB GPU)")
KV = ("INFO [kv_cache_utils.py:2327] GPU KV cache size: 423,792 tokens, Maximum concurrency for "
      "105,920 tokens per request: 4.00x")


def test_parse_auto_fit_reduced_and_full():
    got = fit_run.parse_auto_fit(f"noise\n{REDUCED}\nmore\n")
    assert got == {"from": 131072, "max_model_len": 105920, "reduced": True, "line": REDUCED}
    got = fit_run.parse_auto_fit(FULL)
    assert (got["from"], got["max_model_len"], got["reduced"]) == (262144, 262144, False)
    assert fit_run.parse_auto_fit("INFO nothing of the kind") is None


def test_parse_kv_line_takes_the_last():
    text = KV.replace("423,792", "1,000") + "\n" + KV
    got = fit_run.parse_kv_line(text)
    assert (got["device"], got["kv_tokens"], got["max_model_len"], got["concurrency"]) == \
        ("GPU", 423792, 105920, 4.0)
    assert fit_run.parse_kv_line("") is None


def test_stock_result_prefers_the_engines_own_config():
    text = f"{REDUCED}\n{KV}\n{fit_run.MARKER} " + json.dumps({"max_model_len": 105920,
                                                                "num_gpu_blocks": 26487})
    got = fit_run.stock_result(text)
    assert got["max_model_len"] == 105920 and got["num_gpu_blocks"] == 26487
    assert got["auto_fit"]["from"] == 131072 and got["kv_line"]["kv_tokens"] == 423792
    # without the marker (the engine died after logging): the log line's length
    assert fit_run.stock_result(REDUCED)["max_model_len"] == 105920


def _candidate(mml: int, conc: int, fits: bool = True, **kw) -> dict:
    return {"max_model_len": mml, "max_num_batched_tokens": 4096, "max_num_seqs": 256,
            "kv_cache_bytes": 55548166144, "kv_tokens": 423792, "one_request_bytes": mml * 131072,
            "concurrency": conc, "transient_bytes": 2 << 30, "workspace_bytes": 0,
            "budget_bytes": 55548192256, "fits": fits, "feasible": fits and conc >= 4, **kw}


def _fit_report() -> dict:
    rec = _candidate(105984, 4)
    return {"vllm_version": "0.33.0", "admission": {"kv_cache_bytes": 1, "fits": False},
            "fit": {"recommended": rec, "flags": FIT_FLAGS, "swept": [131072, 8192, 1024],
                    "min_concurrency": 4, "gpu_memory_utilization": 0.5, "steps": [], "notes": [],
                    "candidates": [_candidate(131072, 3), rec, _candidate(65536, 6),
                                   _candidate(262144, 0, fits=False)]}}


def _fitted_report(measured: int = 4_000_000_000, predicted: int = 4_001_000_000,
                   kv: int = 55548166144, tokens: int = 423792, transient: int = 2 << 30,
                   budget: int = 55548192256) -> dict:
    return {"vllm_version": "0.33.0",
            "config": {"max_model_len": 105984, "max_num_batched_tokens": 4096,
                       "max_num_seqs": 256},
            "admission": {"fits": True, "kv_cache_bytes": kv, "kv_tokens_worstcase": tokens,
                          "transient_bytes": transient, "budget_bytes": budget},
            "kv_audit": {"verdict": "ok", "ratio": 0.999},
            "worstcase": {"worst_shape": {"kind": "prefill", "rows": 4096}},
            "validations": [{"target": "traffic", "measured_peak_bytes": 1, "predicted_peak_bytes": 2,
                             "ratio": 0.5},
                            {"target": "worst-step", "measured_peak_bytes": measured,
                             "predicted_peak_bytes": predicted, "ratio": measured / predicted,
                             "resolution_bytes": 1 << 20}]}


def test_fit_result_keeps_the_recommendation_and_the_one_request_answer():
    got = fit_run.fit_result(_fit_report())
    assert got["recommended"]["max_model_len"] == 105984 and got["flags"] == FIT_FLAGS
    # what vLLM's auto-fit answers (one request, KV alone) from the same sweep's candidates
    assert got["longest_for_one_request"]["max_model_len"] == 131072
    assert got["candidates"] == 4
    assert fit_run.fit_result(None) == {"recommended": None, "flags": []}


def test_checks_hold_for_an_admitted_fit_within_its_prediction():
    fit = fit_run.fit_result(_fit_report())
    fitted = fit_run.fitted_result(_fitted_report(), 0, fit)
    assert fitted["admitted"] and fitted["kv_delta_bytes"] == 0
    assert fitted["worst_step"]["ratio"] == pytest.approx(4_000_000_000 / 4_001_000_000)
    got = fit_run.checks(fit, fitted)
    assert all(c["ok"] for c in got.values()), got
    assert set(got) == {"fit_recommended", "fitted_admitted", "kv_as_fit_said",
                        "own_budget_holds_fit_kv", "transient_within_fit_bound",
                        "worst_step_measured_le_predicted", "worst_step_within_1.02"}


@pytest.mark.parametrize("change, failed", [
    ({"measured": 4_002_000_000}, "worst_step_measured_le_predicted"),
    ({"predicted": 4_100_000_000}, "worst_step_within_1.02"),  # 1.025x: too loose
    ({"kv": 55548166144 - (2 << 20)}, "kv_as_fit_said"),  # two MiB below: beyond 1 MiB
    ({"tokens": 423776}, "kv_as_fit_said"),
    ({"transient": (2 << 30) + (1 << 20) + 1}, "transient_within_fit_bound"),
    # the start's own worst case left less than fit's pinned KV: fit was optimistic
    ({"budget": 55548166144 - (2 << 20)}, "own_budget_holds_fit_kv"),
])
def test_checks_fail_where_the_fit_did_not_hold(change, failed):
    fit = fit_run.fit_result(_fit_report())
    got = fit_run.checks(fit, fit_run.fitted_result(_fitted_report(**change), 1, fit))
    assert not got[failed]["ok"]
    assert [k for k, c in got.items() if not c["ok"]] == [failed]


def test_a_start_that_never_allocated_kv_is_not_admitted():
    fit = fit_run.fit_result(_fit_report())
    rep = _fitted_report()
    del rep["kv_audit"]
    assert not fit_run.checks(fit, fit_run.fitted_result(rep, 1, fit))["fitted_admitted"]["ok"]
    assert fit_run.fitted_result(None, 137, fit) == {"rc": 137, "admitted": False}


def test_the_cpu_checks_allow_the_meters_resolution_and_leave_the_ratio_unheld():
    fit = fit_run.fit_result(_fit_report())
    fitted = fit_run.fitted_result(_fitted_report(measured=4_001_500_000, predicted=4_001_000_000),
                                   1, fit)
    assert not fit_run.checks(fit, fitted)["worst_step_measured_le_predicted"]["ok"]
    cpu = fit_run.checks(fit, fitted, tight=False)
    assert cpu["worst_step_measured_le_predicted"]["ok"] and "worst_step_within_1.02" not in cpu
    slack = fit_run.fitted_result(_fitted_report(measured=3_000_000_000), 0, fit)
    assert all(c["ok"] for c in fit_run.checks(fit, slack, tight=False).values())
    # two sweeps' worst transients: a resolution each way on the CPU, one where tight
    for over, cpu_ok, tight_ok in ((1 << 20, True, True), (2 << 20, True, False),
                                   ((2 << 20) + 1, False, False)):
        got = fit_run.fitted_result(_fitted_report(transient=(2 << 30) + over), 1, fit)
        assert fit_run.checks(fit, got, tight=False)["transient_within_fit_bound"]["ok"] is cpu_ok
        assert fit_run.checks(fit, got)["transient_within_fit_bound"]["ok"] is tight_ok


def _model(steps: dict, checks: dict | None = None) -> dict:
    return {"spec": {}, "steps": steps, "checks": checks or {"x": {"ok": True, "detail": ""}},
            "comparison": {"model": "m"}}


def test_summary_is_all_ok_only_when_every_step_ran_and_held():
    ok = {s: {"status": "ok", "vllm_version": "0.33.0"} for s in ("fit", "fitted", "stock")}
    doc = fit_run.summary_doc({"out": "x"}, 1.0, {"m": _model(ok)}, 12.34)
    assert doc["kind"] == "fit_run" and doc["all_ok"] and doc["vllm_versions"] == ["0.33.0"]
    assert doc["comparison"] == [{"model": "m"}] and doc["wall_s"] == 12.3
    skipped = {**ok, "stock": {"status": "skipped", "why": "past the deadline"}}
    assert not fit_run.summary_doc({}, 1.0, {"m": _model(skipped)}, 1)["all_ok"]
    assert not fit_run.summary_doc({}, 1.0, {"m": _model({"fit": ok["fit"]})}, 1)["all_ok"]
    bad = _model(ok, {"x": {"ok": False, "detail": ""}})
    assert not fit_run.summary_doc({}, 1.0, {"m": bad}, 1)["all_ok"]
    assert not fit_run.summary_doc({}, 1.0, {}, 1)["all_ok"]
    json.dumps(doc)


def test_comparison_row_sets_the_three_answers_side_by_side():
    fit = fit_run.fit_result(_fit_report())
    fitted = fit_run.fitted_result(_fitted_report(), 0, fit)
    stock = fit_run.stock_result(f"{REDUCED}\n{KV}")
    row = fit_run.comparison_row("llama8b", GPU["llama8b"], fit, fitted, stock)
    assert (row["vllm_auto_max_model_len"], row["vllm_auto_upper_bound"],
            row["vllm_auto_kv_tokens"]) == (105920, 131072, 423792)
    assert (row["fit_one_request_max_model_len"], row["fit_max_model_len"],
            row["fit_concurrency"]) == (131072, 105984, 4)
    assert row["fitted_admitted"] is True and row["n"] == 4 and row["util"] == 0.5


def test_plan_orders():
    assert fit_run.plan(["a", "b"], "phases") == [
        ("a", "fit"), ("a", "fitted"), ("b", "fit"), ("b", "fitted"), ("a", "stock"),
        ("b", "stock")]
    assert fit_run.plan(["a"], "models") == [("a", "fit"), ("a", "fitted"), ("a", "stock")]


def test_budget_skips_what_would_not_finish_and_caps_the_rest():
    assert fit_run.budget("fit", 100.0, None, 170, 480) == (480, None)
    assert fit_run.budget("fit", 100.0, 1000.0, 170, 480) == (480, None)
    assert fit_run.budget("fit", 100.0, 400.0, 170, 480) == (300.0, None)
    timeout, why = fit_run.budget("fitted", 100.0, 200.0, 150, 420)
    assert timeout is None and "past the deadline" in why and "100 s left" in why


def test_an_unknown_model_is_refused_before_anything_runs(tmp_path, capsys):
    assert fit_run.main(["--out", str(tmp_path), "--models", "nope"]) == 2
    assert "unknown model" in capsys.readouterr().err
    assert not (tmp_path / "summary.json").exists()


def test_everything_past_the_deadline_is_skipped_and_the_summary_says_so(tmp_path, capsys):
    """A deadline already passed: no process starts, every step is recorded as skipped."""
    rc = fit_run.main(["--out", str(tmp_path), "--models", "llama8b", "--deadline", "1"])
    assert rc == 1
    doc = json.loads((tmp_path / "summary.json").read_text())
    steps = doc["models"]["llama8b"]["steps"]
    assert [steps[s]["status"] for s in ("fit", "fitted", "stock")] == ["skipped"] * 3
    assert not doc["all_ok"] and not list(tmp_path.glob("*.tmp"))
    assert "llama8b fit: skipped (past the deadline" in capsys.readouterr().out


def test_mirror_packs_all_but_the_summary_atomically(tmp_path):
    import tarfile

    out, dest = tmp_path / "out", tmp_path / "dest"
    out.mkdir()
    (out / "summary.json").write_text('{"kind": "fit_run"}')
    (out / "fit-m.json").write_text("{}")
    (out / "fit-m.log").write_text("log")
    (out / "half.json.tmp").write_text("{")
    fit_run.mirror(out, dest)
    assert json.loads((dest / "summary.json").read_text()) == {"kind": "fit_run"}
    with tarfile.open(dest / fit_run.PACK) as tar:
        assert sorted(tar.getnames()) == ["fit-m.json", "fit-m.log"]
    assert sorted(p.name for p in dest.iterdir()) == [fit_run.PACK, "summary.json"]
    fit_run.mirror(out, out)  # the same folder: nothing packed into itself
    assert not (out / fit_run.PACK).exists()


# ---------------------------------------------------------------------------- served (--serve)

REC = _candidate(105984, 4)


def test_serve_traffic_stays_within_fits_limits():
    t = fit_run.serve_traffic({**REC, "max_num_seqs": 64}, "cuda")
    assert t["chunk"] == 4096 and t["prefix"] % 256 == 0
    assert t["prefix"] + t["chunk"] + 4 <= 105984 < t["prefix"] + 256 + t["chunk"] + 8
    assert t["decodes"] == 16 and t["worst"] == 64
    assert t["decode_prompt"] + t["decode_tokens"] <= 105984
    cpu = fit_run.serve_traffic({"max_model_len": 2688, "max_num_batched_tokens": 256,
                                 "max_num_seqs": 4}, "cpu")
    assert cpu == {"prefix": 2304, "chunk": 256, "decodes": 4, "decode_prompt": 128,
                   "decode_tokens": 16, "worst": 4}
    few = fit_run.serve_traffic({"max_model_len": 4096, "max_num_batched_tokens": 8192,
                                 "max_num_seqs": 2}, "cuda")
    assert few["chunk"] <= 2044 and few["prefix"] + few["chunk"] + 4 <= 4096
    assert few["decodes"] == 2 and few["worst"] == 2  # never more than max_num_seqs
    tiny = fit_run.serve_traffic({"max_model_len": 200, "max_num_batched_tokens": 64,
                                  "max_num_seqs": 1}, "cpu")
    assert tiny["prefix"] >= 1 and tiny["prefix"] + tiny["chunk"] + 4 <= 200
    assert tiny["decode_prompt"] + tiny["decode_tokens"] <= 200


def test_served_command_passes_fits_flags_to_serve_run(tmp_path):
    """serve_run's own options carry the limits, utilization and eager; the rest (fit's
    max_num_seqs and KV bytes, the seed, the preset's JSON) one --extra that shlex splits back
    into the same arguments, so a JSON value with spaces survives."""
    import shlex

    spec = GPU["qwen35"]
    traffic = fit_run.serve_traffic(REC, "cuda")
    argv = fit_run.served_argv(spec, FIT_FLAGS, tmp_path, "qwen35", traffic, 400)
    assert _flag(argv, "--out") == [str(tmp_path / "served-qwen35")]
    assert _flag(argv, "--modes") == ["worstcase"] and _flag(argv, "--validate") == ["worst"]
    assert _flag(argv, "--max-model-len") == ["105984"]
    assert _flag(argv, "--max-num-batched-tokens") == ["4096"]
    assert _flag(argv, "--util") == ["0.5"] and "--eager" in argv
    assert _flag(argv, "--prefix") == [str(traffic["prefix"])]
    assert _flag(argv, "--worst") == [str(traffic["worst"])]
    assert _flag(argv, "--decode-prompt") == [str(traffic["decode_prompt"])]
    extra = [a for a in argv if a.startswith("--extra=")]
    assert len(extra) == 1
    got = shlex.split(extra[0].partition("=")[2])
    assert _flag(got, "--max-num-seqs") == ["256"]
    assert _flag(got, "--kv-cache-memory-bytes") == ["55548166144"]
    assert _flag(got, "--seed") == ["0"]
    assert _flag(got, "--additional-config") == ['{"gdn_prefill_backend": "triton"}']
    for f in fit_run.SERVE_OWN:
        assert f not in got, f
    plain = fit_run.served_argv(GPU["llama8b_graphs"], FIT_FLAGS, tmp_path, "g", traffic, 400)
    assert "--eager" not in plain  # CUDA graphs, as the preset


def test_served_command_parses_as_serve_run_reads_it(tmp_path):
    """serve_run's parser takes the argv, and its `vllm serve` line merges the preset's
    additional_config into the plugin's (vLLM keeps the last one given)."""
    import serve_run

    argv = fit_run.served_argv(GPU["qwen35"], FIT_FLAGS, tmp_path, "qwen35",
                               fit_run.serve_traffic(REC, "cuda"), 400)
    a = serve_run._parse(argv)
    assert (a.max_model_len, a.max_num_batched_tokens, a.util, a.eager, a.worst) == \
        (105984, 4096, 0.5, True, 256)
    cmd = serve_run.server_argv(a, "worstcase", 8000, tmp_path / "r.json")
    assert _flag(cmd, "--max-num-seqs") == ["256"] and _flag(cmd, "--seed") == ["0"]
    configs = _flag(cmd, "--additional-config")
    assert len(configs) == 1
    assert json.loads(configs[0]) == {"gdn_prefill_backend": "triton",
                                      "worstcase_profiler": {"validate_on_start": "worst"}}
    stock = serve_run.server_argv(a, "stock", 8000, tmp_path / "r.json")
    assert _flag(stock, "--additional-config") == ['{"gdn_prefill_backend": "triton"}']
    assert "--profiler" not in stock
    # the `--additional-config=...` form, with the operator's own profiler settings: merged key
    # by key with the mode's (the mode's win), not replaced
    import shlex

    a.extra = shlex.join(["--additional-config=" + json.dumps(
        {"x": 1, "worstcase_profiler": {"guard": "on"}})])
    got = json.loads(_flag(serve_run.server_argv(a, "worstcase", 8000, tmp_path / "r.json"),
                           "--additional-config")[0])
    assert got == {"x": 1, "worstcase_profiler": {"guard": "on", "validate_on_start": "worst"}}
    # stock gets the rest: profiler settings would turn the profiler on there
    assert _flag(serve_run.server_argv(a, "stock", 8000, tmp_path / "r.json"),
                 "--additional-config") == ['{"x": 1}']
    a.extra = "--additional-config '" + json.dumps({"worstcase_profiler": {"guard": "on"}}) + "'"
    assert "--additional-config" not in serve_run.server_argv(a, "stock", 8000, tmp_path / "r.json")
    a.extra = "--seed 0 --additional-config"
    with pytest.raises(SystemExit, match="has no value"):
        serve_run.server_argv(a, "worstcase", 8000, tmp_path / "r.json")


def _serve_doc(**mode) -> dict:
    t = {"long": {"ok": True, "s": 1.0, "completion_tokens": 1, "prompt_tokens": 104704},
         "cached": {"ok": True, "s": 1.0, "completion_tokens": 4, "prompt_tokens": 108800},
         "decodes": {"n": 4, "wall_s": 1.0, "tokens": 64, "ok": 4, "errors": []},
         "mixed": {"n": 4, "wall_s": 1.0, "long": {"ok": True}, "ok": 4, "errors": []},
         "worst": {"n": 4, "rows_each": 64, "context": 104704, "blocker": {"ok": True},
                   "ok": 4, "errors": [], "alive_after": True}}
    m = {"mode": "worstcase", "healthy_s": 90.5, "traffic": t, "alive_after_traffic": True,
         "guard_metrics": {"wcprof_guard_steps_total": 120.0,
                           "wcprof_guard_steps_above_prediction_total": 0.0,
                           "wcprof_guard_observed_need_bytes_max": 1.0},
         "wcprof_guard": {"rc": 0, "stdout": "the profile held over 120 steps: ...\n"},
         "shutdown": {"rc": 0, "stop_s": 2.5, "forced": False, "processes_left": False},
         "oom_lines": []}
    m.update(mode)
    return {"args": {"prefix": 104704, "chunk": 4096, "decodes": 4, "decode_prompt": 128,
                     "decode_tokens": 16, "worst": 4}, "modes": [m]}


def _served(doc=None, report=None, rc=0, fit=None):
    fit = fit or fit_run.fit_result(_fit_report())
    return fit_run.served_result(doc or _serve_doc(), report or _fitted_report(), rc, fit), fit


def test_served_checks_hold_for_a_server_at_fits_limits():
    served, fit = _served()
    assert served["admitted"] and served["config"] == served["fit_config"]
    assert served["guard"]["steps_total"] == 120 and served["traffic_args"]["prefix"] == 104704
    got = fit_run.served_checks(fit, served)
    assert all(c["ok"] for c in got.values()), got
    assert set(got) == {"served_healthy_and_clean", "served_admitted_at_fit_limits",
                        "served_kv_as_fit_said", "served_own_budget_holds_fit_kv",
                        "served_transient_within_fit_bound",
                        "served_worst_step_measured_le_predicted",
                        "served_worst_step_within_1.02", "served_traffic_served",
                        "served_guard_held"}
    assert "worst 4/4, blocker ok, alive after True" in got["served_traffic_served"]["detail"]
    cpu = fit_run.served_checks(fit, served, tight=False)
    assert "served_worst_step_within_1.02" not in cpu and all(c["ok"] for c in cpu.values())


def _broken_traffic() -> dict:
    doc = _serve_doc()
    doc["modes"][0]["traffic"]["worst"].update(ok=3, errors=["HTTPError: 500"],
                                              alive_after=False)
    return doc


@pytest.mark.parametrize("doc, report, rc, failed", [
    (_serve_doc(healthy_s=None, traffic=None, alive_after_traffic=None), None, 1,
     {"served_healthy_and_clean", "served_traffic_served"}),
    (_serve_doc(shutdown={"rc": 0, "stop_s": 90, "forced": True, "processes_left": False}),
     None, 1, {"served_healthy_and_clean"}),
    (None, _fitted_report(kv=55548166144 - (2 << 20)), 0, {"served_kv_as_fit_said"}),
    (None, _fitted_report(measured=4_002_000_000), 0, {"served_worst_step_measured_le_predicted"}),
    (None, _fitted_report(budget=55548166144 - (2 << 20)), 0, {"served_own_budget_holds_fit_kv"}),
    (None, _fitted_report(transient=(2 << 30) + (1 << 20) + 1), 0,
     {"served_transient_within_fit_bound"}),
    (None, _fitted_report(predicted=4_100_000_000), 0, {"served_worst_step_within_1.02"}),
    (_broken_traffic(), None, 0, {"served_traffic_served"}),
    (_serve_doc(guard_metrics={"wcprof_guard_steps_total": 9.0,
                               "wcprof_guard_steps_above_prediction_total": 1.0},
                wcprof_guard={"rc": 1, "stdout": "a step exceeded"}), None, 0,
     {"served_guard_held"}),
])
def test_served_checks_fail_where_the_server_did_not_hold(doc, report, rc, failed):
    served, fit = _served(doc, report, rc)
    got = fit_run.served_checks(fit, served)
    assert {k for k, c in got.items() if not c["ok"]} == failed, got


def test_a_server_at_other_limits_or_without_kv_is_not_admitted():
    rep = _fitted_report()
    rep["config"]["max_num_seqs"] = 1024
    served, fit = _served(report=rep)
    assert not fit_run.served_checks(fit, served)["served_admitted_at_fit_limits"]["ok"]
    del rep["kv_audit"]
    served, fit = _served(report=rep)
    assert not served["admitted"]
    nothing = fit_run.served_result(None, None, 124, fit)
    got = fit_run.served_checks(fit, nothing)
    assert got and not any(c["ok"] for c in got.values())
    json.dumps(got)


def test_plan_with_the_served_step_and_skips():
    assert fit_run.plan(["a", "b"], "phases", serve=True) == [
        ("a", "fit"), ("a", "fitted"), ("a", "served"), ("b", "fit"), ("b", "fitted"),
        ("b", "served"), ("a", "stock"), ("b", "stock")]
    assert fit_run.plan(["a"], "models", serve=True) == [
        ("a", "fit"), ("a", "fitted"), ("a", "served"), ("a", "stock")]
    assert fit_run.plan(["a"], "phases", True, ("fitted", "stock")) == [("a", "fit"),
                                                                       ("a", "served")]
    assert fit_run.plan(["a"], "models", skip=("stock",)) == [("a", "fit"), ("a", "fitted")]


def test_summary_is_all_ok_over_the_planned_steps():
    ok = {"status": "ok"}
    m = {**_model({"fit": ok, "served": ok}), "planned": ["fit", "served"]}
    assert fit_run.summary_doc({}, 1.0, {"m": m}, 1)["all_ok"]
    m = {**_model({"fit": ok, "fitted": ok, "stock": ok}), "planned": ["fit", "fitted", "served",
                                                                        "stock"]}
    assert not fit_run.summary_doc({}, 1.0, {"m": m}, 1)["all_ok"]  # served never ran


def _summary_with_fit(spec: dict) -> dict:
    fit = fit_run.fit_result(_fit_report())
    return {"kind": "fit_run", "started": 5.0, "models": {"llama8b": {
        "spec": {**spec, "model": "/elsewhere/" + Path(spec["model"]).name},
        "steps": {"fit": {"status": "ok", "result": fit, "cmd": ["wcprof", "fit"],
                          "vllm_version": "0.32.0"}}}}}


def test_a_fit_is_taken_from_an_earlier_summary_with_where_it_came_from():
    spec = GPU["llama8b"]
    got = fit_run.reused_fit(_summary_with_fit(spec), "llama8b", spec, "run61/summary.json")
    assert got["status"] == "ok" and got["fit_from"] == "run61/summary.json"
    assert got["fit_from_started"] == 5.0 and got["result"]["flags"] == FIT_FLAGS
    assert got["vllm_version"] == "0.32.0"
    other = fit_run.reused_fit(_summary_with_fit({**spec, "util": 0.6}), "llama8b", spec, "s")
    assert other["status"] == "failed" and "util (0.6, here 0.5)" in other["why"]
    gone = fit_run.reused_fit(_summary_with_fit(spec), "qwen35", GPU["qwen35"], "s")
    assert gone["status"] == "failed" and "no fit_run result for qwen35" in gone["why"]
    assert fit_run.reused_fit(None, "llama8b", spec, "s")["status"] == "failed"


def test_the_committed_h200_fit_can_be_reused():
    doc = json.loads((ROOT / "docs/results/h200-run61/summary.json").read_text())
    got = fit_run.reused_fit(doc, "llama8b", GPU["llama8b"], "h200-run61")
    assert got["status"] == "ok", got.get("why")
    argv = fit_run.served_argv(GPU["llama8b"], got["result"]["flags"], Path("/o"), "llama8b",
                               fit_run.serve_traffic(got["result"]["recommended"], "cuda"), 400)
    assert _flag(argv, "--max-model-len") == ["109008"]


def test_fit_from_skips_what_has_no_fit_and_records_the_source(tmp_path, capsys):
    """--fit-from a summary that swept another utilization: nothing runs, the fit step says
    why, fitted/served are skipped for it."""
    src = tmp_path / "old.json"
    src.write_text(json.dumps(_summary_with_fit({**GPU["llama8b"], "util": 0.9})))
    rc = fit_run.main(["--out", str(tmp_path / "o"), "--models", "llama8b", "--serve",
                       "--fit-from", str(src), "--skip", "stock"])
    assert rc == 1
    doc = json.loads((tmp_path / "o/summary.json").read_text())
    m = doc["models"]["llama8b"]
    assert m["planned"] == ["fit", "fitted", "served"] and doc["args"]["fit_from"] == str(src)
    assert m["steps"]["fit"]["status"] == "failed" and m["steps"]["fit"]["fit_from"] == str(src)
    assert m["steps"]["served"]["status"] == "skipped" and "util" in m["steps"]["served"]["why"]
    assert fit_run.main(["--out", str(tmp_path / "o"), "--fit-from", str(tmp_path / "no")]) == 2
    with pytest.raises(SystemExit):
        fit_run.main(["--out", str(tmp_path / "o"), "--skip", "fit"])


def test_mirror_packs_the_served_folder(tmp_path):
    import tarfile

    out, dest = tmp_path / "out", tmp_path / "dest"
    (out / "served-m").mkdir(parents=True)
    (out / "summary.json").write_text("{}")
    (out / "served-m" / "serve.json").write_text("{}")
    (out / "served-m" / "serve.json.tmp").write_text("{")
    fit_run.mirror(out, dest)
    with tarfile.open(dest / fit_run.PACK) as tar:
        assert sorted(tar.getnames()) == ["served-m", "served-m/serve.json"]
