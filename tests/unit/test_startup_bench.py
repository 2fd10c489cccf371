"""bench/startup_bench.py (issue 34's start-up benchmark): the order its starts run in, each
round on a sweep cache of its own, the family layouts it names, and the engine options merged
with the profiler's. Pure: nothing starts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import startup_bench  # noqa: E402


def test_rounds_interleave_every_mode_so_drift_hits_them_alike():
    """Each round a rotation of the modes, in turn, where its cached starts follow its cold one:
    stock is not always the round's first start (h100-run89's order effect)."""
    modes = ["stock", "worstcase-cold", "worstcase-warm"]
    order = startup_bench.start_order(modes, 3)
    assert [m for _, m in order] == [*modes, "worstcase-cold", "worstcase-warm", "stock", *modes]
    assert [r for r, _ in order] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert startup_bench.start_order(["stock"], 0) == [(0, "stock")]
    modes = ["stock", "worstcase-cold", "worstcase-warm", "worstcase-imported"]
    rounds = [[m for r, m in startup_bench.start_order(modes, 4) if r == rnd] for rnd in range(4)]
    assert len({tuple(r) for r in rounds}) > 1 and all(sorted(r) == sorted(modes) for r in rounds)
    for ran in rounds:  # every cached start after its round's cold one
        assert min(ran.index("worstcase-warm"), ran.index("worstcase-imported")) > \
            ran.index("worstcase-cold")
    # the rotation starting at the cold start always keeps the order
    assert [m for _, m in startup_bench.start_order(["worstcase-warm", "worstcase-cold"], 2)] \
        == ["worstcase-cold", "worstcase-warm"] * 2


def test_a_family_keeps_its_own_vllm_config_beside_the_profilers():
    fam = {"additional_config": {"gdn_prefill_backend": "triton"}, "max_num_seqs": 64}
    prof = {"worstcase_profiler": {"profiler": "worstcase"}}
    assert startup_bench.engine_kwargs(fam, prof) == {
        "max_num_seqs": 64, "additional_config": {"gdn_prefill_backend": "triton", **prof}}
    assert startup_bench.engine_kwargs(fam, None) == {
        "max_num_seqs": 64, "additional_config": {"gdn_prefill_backend": "triton"}}
    assert startup_bench.engine_kwargs({}, None) == {}


def test_the_families_are_the_issues_layouts_at_32_layers_or_more():
    """Issue 34: the 8B layout, a family the suite never ran, a GDN or Mamba hybrid, a sliding-
    window model, an MoE; 32+ layers each, and vocabularies of 128k+ (DEVELOPERS.md). The family
    outside the suite comes in two depths: 64 layers for an H200, 48 where 80 GB holds no more."""
    cfgs = {n: json.loads((d / "config.json").read_text())
            for n, (d, _) in startup_bench.FAMILIES.items()}
    assert len(cfgs) == 6 and cfgs["qwen2-14b"]["architectures"] == cfgs["qwen2-32b"]["architectures"]
    for name, c in cfgs.items():
        assert c["num_hidden_layers"] >= 32 and c["vocab_size"] >= 128_000, name
        assert c.get("max_position_embeddings", 0) >= 131072, name  # the bench's default context
        if "layer_types" in c:
            assert len(c["layer_types"]) == c["num_hidden_layers"], name
    kinds = {n: set(c.get("layer_types", ())) for n, c in cfgs.items()}
    assert any("linear_attention" in k for k in kinds.values())           # GDN hybrid
    assert any("sliding_attention" in k for k in kinds.values())          # sliding window
    assert any(c.get("num_experts", 0) > 1 for c in cfgs.values())        # MoE
    archs = {c["architectures"][0] for c in cfgs.values()}
    assert "LlamaForCausalLM" in archs, archs
    # a family whose architecture no GPU suite case runs
    import gpu_suite

    suite_archs = {json.loads((Path(case[0]) / "config.json").read_text())["architectures"][0]
                   for case in gpu_suite.CASES.values()
                   if (Path(case[0]) / "config.json").exists()}
    assert "LlamaForCausalLM" in suite_archs and archs - suite_archs, (archs, suite_archs)


class _Args:
    def __init__(self, **kw):
        self.order = ["stock", "worstcase-cold", "worstcase-warm"]
        self.repeat, self.prime, self.deadline, self.timeout_s = 2, False, None, 100.0
        self.prime_timeout_s = 300.0
        self.export_to = self.import_from = None
        self.fork = False
        self.__dict__.update(kw)


def _bench(monkeypatch, args, outcome):
    """bench_model over a fake run_mode: `outcome(mode, round)` gives each start's record."""
    made, timeouts = [], []

    def run_mode(a, model, mode, cache_dir, passthrough, engine=None, import_from=None,
                 timeout_s=None):
        made.append((mode, import_from or cache_dir))
        timeouts.append(timeout_s)
        return {"mode": mode, "wall_s": 10.0, **outcome(mode, len([m for m, _ in made
                                                                  if m == mode]) - 1)}

    monkeypatch.setattr(startup_bench, "run_mode", run_mode)
    results = {"models": {}}
    startup_bench.bench_model(args, "m", "/m", {}, [], results, lambda: None)
    args.timeouts = timeouts
    return made, results["models"]["m"]


def test_the_priming_start_has_a_timeout_of_its_own(monkeypatch):
    """h100-run85: a fresh host's priming start of the Qwen3.5 hybrid took over --timeout-s's
    100 s (its GDN kernels' compiles), so the counted stock start paid them (32.12 s against
    8.86 s once compiled). The prime waits --prime-timeout-s; counted starts --timeout-s."""
    args = _Args(prime=True, repeat=1)
    made, _ = _bench(monkeypatch, args, lambda mode, i: {"boot_s": 1.0, "cache": "stored"})
    assert [m for m, _ in made] == ["worstcase-cold", "stock", "worstcase-cold", "worstcase-warm"]
    assert args.timeouts == [300.0, None, None, None]
    import time

    late = _Args(prime=True, prime_timeout_s=300.0, deadline=time.time() + 120)
    assert 100 <= startup_bench.prime_timeout(late) <= 120  # never past the deadline


def test_the_prime_is_a_worst_case_start_on_a_cache_of_its_own_or_else_a_stock_one(monkeypatch):
    """h100-run85/87: a first start after a stock prime compiled what only the profiler's steps
    run (the top-k sampler's Triton kernel 2-4 s, the fused-MoE kernel at the sweep's batch
    sizes about 0.5 s each), which a host with warm caches has compiled already. The prime is a
    worst-case start, on a sweep cache no counted start reads; refused, a stock one instead."""
    args = _Args(prime=True, repeat=1)
    made, _ = _bench(monkeypatch, args, lambda mode, i: {"boot_s": 1.0, "cache": "stored"})
    assert made[0][0] == "worstcase-cold" and "wcprof-startup-prime-" in made[0][1]
    assert made[0][1] not in {cache for _, cache in made[1:]}
    refused = _Args(prime=True, repeat=1)
    results = {"models": {}}
    made = []

    def run_mode(a, model, mode, cache_dir, passthrough, engine=None, import_from=None,
                 timeout_s=None):
        made.append(mode)
        return {"mode": mode, "wall_s": 5.0,
                **({"error": "rc=1"} if mode == "worstcase-cold" and len(made) == 1 else
                   {"boot_s": 2.0, "cache": "stored"})}

    monkeypatch.setattr(startup_bench, "run_mode", run_mode)
    startup_bench.bench_model(refused, "m", "/m", {}, [], results, lambda: None)
    assert made[:2] == ["worstcase-cold", "stock"]
    assert results["primed"]["m"] == {"mode": "stock", "boot_s": 2.0, "wall_s": 5.0}
    # a prime that timed out is not made again as a stock one (its time would be spent twice)
    made.clear()
    monkeypatch.setattr(startup_bench, "run_mode", lambda a, model, mode, *r, **k: (
        made.append(mode) or {"mode": mode, "wall_s": 300.0, "error": "timed out after 300s",
                              "timed_out": True}))
    assert startup_bench.prime(refused, "/m", [], {}, {"models": {}})["mode"] == "worstcase-cold"
    assert made == ["worstcase-cold"]


def test_a_forked_start_reports_its_output_exit_code_and_timeout():
    """common.run_forked: what the child printed, its exit code, and a child past its timeout
    killed with everything in its session (None)."""
    import os
    import subprocess
    import sys
    import time

    from common import run_forked

    def prints(argv):
        print("STARTUP " + argv[0], flush=True)
        print("to stderr", file=sys.stderr, flush=True)
        return 3

    rc, out = run_forked(prints, ["{}"], 30)
    assert rc == 3 and "STARTUP {}" in out and "to stderr" in out

    def raises(argv):
        raise ValueError("boom")

    rc, out = run_forked(raises, [], 30)
    assert rc == 1 and "ValueError: boom" in out
    rc, out = run_forked(lambda argv: sys.exit("refused: why"), [], 30)
    assert rc == 1 and "refused: why" in out  # as the interpreter prints sys.exit("...")
    assert run_forked(lambda argv: None, [], 30)[0] == 0  # a script's end

    def hangs(argv):
        helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        print(f"HELPER {helper.pid}", flush=True)
        time.sleep(60)
        return 0

    t0 = time.monotonic()
    rc, out = run_forked(hangs, [], 2)
    assert rc is None and time.monotonic() - t0 < 10
    helper = int(out.split("HELPER ")[1].split()[0])
    time.sleep(0.2)
    try:
        os.kill(helper, 0)
        state = open(f"/proc/{helper}/stat").read().split()[2]
        assert state == "Z", "the helper outlived its start"  # a zombie until init reaps it
    except (ProcessLookupError, FileNotFoundError):  # reaped already
        pass


def test_each_round_restarts_from_its_own_first_start(monkeypatch):
    """Round r's cold start sweeps into a cache of its own and round r's warm start reuses that
    one; a round whose first start stored nothing has no restart (not run, with why)."""
    def outcome(mode, i):
        if mode == "worstcase-cold":
            return {"boot_s": 12.0, "cache": "stored"} if i == 0 else {"error": "rc=1"}
        return {"boot_s": 10.0, "cache": "hit" if mode == "worstcase-warm" else None}

    made, entry = _bench(monkeypatch, _Args(), outcome)
    caches = {}
    for mode, cache in made:
        caches.setdefault(mode, []).append(cache)
    assert caches["worstcase-cold"][0] == caches["worstcase-warm"][0]
    assert caches["worstcase-cold"][0] != caches["worstcase-cold"][1]
    assert len(caches["worstcase-warm"]) == 1  # round 1's cold start failed: no restart
    skipped = [r for r in entry["runs"] if "not_run" in r]
    assert [(r["mode"], r["round"]) for r in skipped] == [("worstcase-warm", 1)]
    assert "stored no sweep" in skipped[0]["not_run"]


def test_a_start_the_deadline_leaves_no_room_for_is_not_made(monkeypatch):
    import time

    made, entry = _bench(monkeypatch, _Args(deadline=time.time() + 50, prime=True),
                         lambda mode, i: {"boot_s": 1.0})
    assert made == []  # nothing ran: not even the prime (a start takes ~100 s, 50 s left)
    assert all("before the deadline" in r["not_run"] for r in entry["runs"])
    assert len(entry["runs"]) == 6


def test_the_reports_stock_figure_is_compared_with_the_stock_starts():
    """Issue 34: vLLM's profile now captures every graph on a first start and is handed back its
    own figure; the bench says whether the reports' stock KV equals what stock starts got."""
    entry = {"runs": [{"mode": "stock", "boot_s": 10.0, "kv_tokens": 4096, "block_size": 16},
                      {"mode": "worstcase-cold", "boot_s": 12.0, "kv_tokens_stock": 4090,
                       "cache": "stored", "kv_tokens": 2048, "kv_groups": 1},
                      {"mode": "worstcase-warm", "boot_s": 10.5, "kv_tokens_stock": 4096,
                       "cache": "hit", "kv_groups": 1},
                      {"mode": "stock", "not_run": "deadline"}]}
    startup_bench._ratios(entry)
    assert entry["stock_kv_tokens"] == {"stock_starts": [4096], "reports": [4090, 4096],
                                        "agree": True, "kv_groups": 1}  # within a block
    assert entry["runs"][1]["boot_ratio_to_stock"] == 1.2
    entry["runs"][1]["kv_tokens_stock"] = 4000
    startup_bench._ratios(entry)
    assert entry["stock_kv_tokens"]["agree"] is False
    assert entry["stock_kv_tokens"]["reports"] == [4000, 4096]
    entry["runs"][1]["kv_groups"] = 2  # a hybrid or sliding-window model: tokens not one measure
    startup_bench._ratios(entry)
    assert entry["stock_kv_tokens"]["agree"] is None


def test_on_the_cpu_the_stock_figure_is_recorded_not_compared():
    entry = {"runs": [{"mode": "stock", "boot_s": 5.0, "kv_tokens": 5495424, "device": "cpu"},
                      {"mode": "worstcase-cold", "boot_s": 7.0, "kv_tokens_stock": 5492608,
                       "device": "cpu"}]}
    startup_bench._ratios(entry)
    assert entry["stock_kv_tokens"]["agree"] is None


def test_a_cached_start_says_whether_its_entry_was_signed_or_re_checked():
    """An unsigned restart re-checks the plan's heaviest shapes and a signed one does not
    (docs/cache.md): its median's cache label says which, so a table is not read as the other."""
    warm = [{"mode": "worstcase-warm", "boot_s": 9.0, "cache": "hit", "trust": "re-checked"}]
    assert startup_bench._mode_medians(warm, 6.0)["cache"] == "hit/re-checked"
    warm[0]["trust"] = "signed"
    assert startup_bench._mode_medians(warm, 6.0)["cache"] == "hit/signed"
    warm[0]["trust"] = "host"
    assert startup_bench._mode_medians(warm, 6.0)["cache"] == "hit/host"
    cold = [{"mode": "worstcase-cold", "boot_s": 12.0, "cache": "stored"}]
    assert startup_bench._mode_medians(cold, 6.0)["cache"] == "stored"
    assert startup_bench._mode_medians([{"boot_s": 6.0}], 6.0)["cache"] is None


def test_an_imported_start_without_a_source_imports_its_rounds_own_entry(monkeypatch):
    """worstcase-imported after worstcase-cold, no --import-from: the round's cold entry is
    exported and imported into an empty cache (another host's path), beside the warm restart
    on the same host, in one run."""
    exported = []
    monkeypatch.setattr(startup_bench, "wcprof_cache",
                        lambda verb, directory, cache_dir: exported.append((verb, cache_dir)) or "")

    def outcome(mode, i):
        return {"boot_s": 12.0, "cache": "stored"} if mode == "worstcase-cold" else \
            {"boot_s": 10.0, "cache": None if mode == "stock" else "hit"}

    made, entry = _bench(monkeypatch, _Args(repeat=1, order=["stock", "worstcase-cold",
                                                             "worstcase-warm",
                                                             "worstcase-imported"]), outcome)
    cold = next(c for m, c in made if m == "worstcase-cold")
    source = next(c for m, c in made if m == "worstcase-imported")
    assert exported == [("export", cold)] and source != cold  # the round's cache, exported
    assert not [r for r in entry["runs"] if "not_run" in r or "error" in r]


def test_the_slowest_steps_name_where_a_first_starts_sweep_went():
    """startup_bench keeps the report's slowest measured steps, the pool fit's included, so a
    first start's sweep time is attributed to its full-model steps in the benchmark's JSON."""
    def step(kind, rows, ctx, reqs, s):
        return {"shape": {"kind": kind, "rows": rows, "context_len": ctx, "num_reqs": reqs},
                "seconds": s}

    wc = {"steps": [step("prefill", 1, 131071, 1, 0.01) for _ in range(30)]
          + [step("decode", 1024, 131071, 1024, 3.55), step("mixed", 8192, 123903, 1024, 3.88)],
          "pool_fit": {"steps": [step("prefill", 8192, 1547, 392, 0.6)]}}
    out = startup_bench.slowest_steps(wc)
    assert len(out) == startup_bench.SLOWEST
    assert out[:3] == [{"shape": "mixed rows=8192 ctx=123903 reqs=1024", "seconds": 3.88},
                       {"shape": "decode rows=1024 ctx=131071 reqs=1024", "seconds": 3.55},
                       {"shape": "prefill rows=8192 ctx=1547 reqs=392", "seconds": 0.6}]
    assert startup_bench.slowest_steps({"steps": [], "pool_fit": None}) == []


def test_the_sweeps_split_is_a_median_phase_of_its_own():
    """A first start's sweep split (cut decoder, full model, eager re-reads) is reported beside
    the report's phases, each the median over the mode's starts."""
    runs = [{"boot_s": b, "startup_seconds": {"sweep": s}, "profiler_s": s,
             "sweep_split": {"cut_decoder": 0.4, "full_model": f, "eager_rereads": e}}
            for b, s, f, e in ((60.0, 24.0, 12.0, 11.6), (62.0, 22.0, 10.0, 11.0))]
    phases = dict(startup_bench._mode_medians(runs, 30.0)["phases"])
    assert phases["sweep.eager_rereads"] == 11.3 and phases["sweep.full_model"] == 11.0
    assert phases["sweep"] == 23.0 and phases["sweep.cut_decoder"] == 0.4


REPORT = ROOT / "docs/results/h200-run46/serve/report-worstcase.json"
"""A first start's report as the plugin wrote it on the H200 (a self-checked cut-down sweep)."""


def test_a_first_start_keeps_its_proof_its_admission_terms_and_where_its_sweep_went():
    written = json.loads(REPORT.read_text())
    rec = startup_bench.report_record(written)
    adm = written["admission"]
    assert rec["kv_cache_bytes"] == adm["kv_cache_bytes"]
    assert rec["budget_terms"] == {k: adm[k] for k in startup_bench.BUDGET_TERMS}
    assert rec["budget_terms"]["transient_bytes"] > 0
    assert {"consumed_bytes", "cudagraph_bytes", "warmup_graphs_bytes"} <= set(rec["budget_terms"])
    assert rec["sweep_s"] == written["worstcase"]["seconds"]
    proof = rec["proof"]
    assert proof["verdict"] == written["worstcase"]["cut_down_proof"]["verdict"]
    assert proof["cut_worst"] == "prefill rows=8192 ctx=131056 reqs=512"  # the shape, as a label
    assert proof["full_worst"] is None  # a self-check runs no full sweep
    assert "seconds_split" not in proof and rec["slowest_steps"]


def test_a_cached_start_carries_no_proof_or_sweep_times_of_its_first_start():
    """A restart reuses the cold start's sweep (and its report's proof): it ran no sweep, so
    its record keeps none of the first start's sweep figures, only its own replay and terms."""
    written = json.loads(REPORT.read_text())
    written["worstcase"]["cache"] = {"status": "hit", "trust": "host", "replay_seconds": 1.5,
                                     "held_moved_bytes": -172032,
                                     "replay_depth": "1 of 32 layers, run eagerly"}
    rec = startup_bench.report_record(written)
    assert rec["proof"] is None and rec["slowest_steps"] == [] and rec["sweep_split"] == {}
    assert rec["sweep_s"] is None
    assert (rec["cache"], rec["trust"], rec["replay_s"]) == ("hit", "host", 1.5)
    assert rec["replay_depth"] == "1 of 32 layers, run eagerly"  # where its worst step replayed
    assert rec["held_moved_bytes"] == -172032


def test_a_prove_start_asks_for_the_prove_depth_and_a_cut_start_for_cut_down():
    assert startup_bench.MODE_SETTINGS["worstcase-prove"] == {"sweep_depth": "prove"}
    assert startup_bench.MODE_SETTINGS["worstcase-cut"] == {"sweep_depth": "cut-down"}
    assert "worstcase-cold" not in startup_bench.MODE_SETTINGS  # auto: the plugin's default
    assert set(startup_bench.MODE_SETTINGS) < set(startup_bench.MODES)
    assert startup_bench.proof_summary(None) is None
    odd = startup_bench.proof_summary({"verdict": "proven", "cut_worst": {"kind": "prefill"}})
    assert odd["cut_worst"] == {"kind": "prefill"}  # kept as written, never a crash


def test_a_prove_or_cut_start_sweeps_into_a_cache_of_its_own(monkeypatch, tmp_path):
    """A cut-down or prove start never reads or writes the round's cache (its cold start's and
    warm start's): each gets an empty one, so it sweeps and stores nothing the restart reuses."""
    dirs = {}

    def run_child(cmd, marker, **kw):
        dirs[cmd[cmd.index("--mode") + 1]] = cmd[cmd.index("--cache-dir") + 1]
        return {"boot_s": 1.0}

    monkeypatch.setattr(startup_bench, "run_child", run_child)
    made = iter(range(10))
    monkeypatch.setattr(startup_bench.tempfile, "mkdtemp",
                        lambda prefix="": str(tmp_path / f"{prefix}{next(made)}"))
    for mode in ("worstcase-cold", "worstcase-cut", "worstcase-prove"):
        startup_bench.run_mode(_Args(), "/m", mode, "/round-cache", [])
    assert dirs["worstcase-cold"] == "/round-cache"
    assert "/round-cache" not in (dirs["worstcase-cut"], dirs["worstcase-prove"])
    assert dirs["worstcase-cut"] != dirs["worstcase-prove"]


def test_a_start_keeps_its_pool_fits_pools_and_what_its_entry_gave():
    """h100-run88: the hybrid's restart with graphs measured its fit again; the record says how
    many of the fit's steps a cached entry gave, and for which pool."""
    written = json.loads(REPORT.read_text())
    assert startup_bench.report_record(written)["pool_fit"] is None  # its plan stood
    fit = {"planned_pool_tokens": 1376256, "pool_tokens": 1190896, "rounds": 2,
           "steps": [{"shape": {"kind": "decode"}, "seconds": 0.5}] * 10, "reused": 0,
           "dropped": []}
    written["worstcase"]["pool_fit"] = fit
    assert startup_bench.report_record(written)["pool_fit"] == {
        "planned_pool_tokens": 1376256, "pool_tokens": 1190896, "rounds": 2, "steps": 10,
        "reused": 0}


def test_a_worst_case_prime_that_ended_is_the_next_starts_estimate_never_above_the_timeout():
    """h100-run88: Gemma with graphs primed in 104 s, then skipped its stock, first and cached
    starts with 135 s left, on the 150 s timeout's estimate. A stock prime is no estimate."""
    results = {"models": {"m": {"runs": []}},
               "primed": {"m": {"mode": "worstcase-cold", "boot_s": 103.0, "wall_s": 104.0}}}
    assert startup_bench.expected_start_s(results, 150.0) == 104.0
    results["primed"]["m"]["mode"] = "stock"
    assert startup_bench.expected_start_s(results, 150.0) == 150.0
    results["primed"]["m"]["mode"] = "worstcase-cold"
    results["primed"]["m"]["wall_s"] = 192.0  # a fresh host's compile: capped
    assert startup_bench.expected_start_s(results, 150.0) == 150.0
    results["primed"]["m"] = {"mode": "stock", "error": "rc=1", "wall_s": 5.0}  # refused: no estimate
    assert startup_bench.expected_start_s(results, 150.0) == 150.0
    results["models"]["m"]["runs"] = [{"wall_s": 30.0}]
    assert startup_bench.expected_start_s(results, 150.0) == 30.0


def test_startup_costs_splits_a_first_starts_extra_time_into_its_named_parts(capsys):
    """bench/startup_costs.py on a committed run (h100-run89's Llama with graphs): first minus
    stock split into the report's parts, and against the restart what they leave unnamed."""
    import startup_costs

    path = ROOT / "docs/results/h100-run89/startup-llama8b-graphs.json"
    [(fam, forward, stock, first, restart)] = startup_costs.starts(str(path))
    assert (fam, forward) == ("llama8b", "graphs")
    parts = startup_costs.named_parts(first, restart)
    assert parts["eager"] == first["sweep_split"]["eager_rereads"] > 0
    assert startup_costs.main([str(path)]) == 0
    out = capsys.readouterr().out
    extra = first["boot_s"] - stock["boot_s"]
    assert f"| {extra:.2f} |" in out and f"| {extra - sum(parts.values()):.2f} |" in out
    gap = first["boot_s"] - restart["boot_s"]
    unnamed = gap - sum(parts.values()) + restart["profiler_s"]
    assert out.rstrip().endswith(f"| {unnamed:.2f} |")
    assert startup_costs.main([]) == 2
