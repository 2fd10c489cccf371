"""The production guard without an engine: the ledger, the step wrapper's open/close rules, the
memory-mapped channel, the /metrics collector and its read-back (`wcprof guard`)."""

from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from types import SimpleNamespace

import pytest

from worstcase_profiler.adapter import guard as g
from worstcase_profiler.cli import main
from worstcase_profiler.core.guard import (ABOVE, OBSERVED, PREDICTED, STEPS, StepLedger, StepShape,
                                           parse_metrics, verdict)
from worstcase_profiler.settings import ProfilerSettings
from worstcase_profiler.core.types import Shape

MiB = 1 << 20


def test_ledger_counts_steps_largest_and_the_first_step_above():
    led = StepLedger(predicted=10 * MiB, available=100 * MiB, tolerance=MiB // 2)
    assert led.record(5 * MiB) == (True, False)
    assert led.record(4 * MiB) == (False, False)
    assert led.record(10 * MiB + MiB // 2) == (True, False)  # within the meter's noise
    assert led.record(12 * MiB) == (True, True)
    assert led.record(11 * MiB) == (False, False)  # above again, but not the first
    assert (led.steps, led.above, led.max_need) == (5, 2, 12 * MiB)
    assert led.headroom == 88 * MiB


class FakeProbe:
    tolerance = 0

    def __init__(self, needs):
        self.needs = list(needs)
        self.started = 0

        self.adjusted = []

    def start(self):
        self.started += 1

    def end(self, kept=0, freed=0):
        self.adjusted.append((kept, freed))
        return self.needs.pop(0)


def sched(rows, contexts=(0,), new=True):
    reqs = {f"r{i}": n for i, n in enumerate(_split(rows, len(contexts)))}
    new_reqs = [SimpleNamespace(num_computed_tokens=c) for c in contexts] if new else []
    cached = SimpleNamespace(num_computed_tokens=[] if new else list(contexts))
    return SimpleNamespace(total_num_scheduled_tokens=rows, num_scheduled_tokens=reqs,
                           scheduled_spec_decode_tokens={}, scheduled_new_reqs=new_reqs,
                           scheduled_cached_reqs=cached)


def _split(rows, n):
    base, extra = divmod(rows, n)
    return [base + (1 if i < extra else 0) for i in range(n)]


def _guard(needs, predicted=10 * MiB, channel=None, returns=None):
    calls = []

    def execute(so):
        calls.append(("execute", so.total_num_scheduled_tokens))
        return returns

    def sample(grammar):
        calls.append(("sample", grammar))
        return "output"

    led = StepLedger(predicted=predicted, available=50 * MiB)
    return g.StepGuard(execute, sample, FakeProbe(needs), led, channel), calls


def test_a_step_is_execute_then_sample_and_empty_steps_are_not_counted():
    guard, calls = _guard([MiB, 2 * MiB])
    assert guard.execute_model(sched(64)) is None
    assert guard.ledger.steps == 0  # still open: sampling is part of the step
    assert guard.sample_tokens("gm") == "output"
    assert guard.ledger.steps == 1
    guard.execute_model(sched(0))  # nothing scheduled: not a forward step
    guard.sample_tokens(None)
    assert guard.ledger.steps == 1 and guard._probe.started == 1
    guard.execute_model(sched(8, (100, 200, 300, 4000)))
    guard.execute_model(sched(0))  # a new execute closes the open step first
    assert guard.ledger.steps == 2 and guard.ledger.max_need == 2 * MiB
    assert guard.ledger.max_shape.max_context == 4000 and guard.ledger.max_shape.reqs == 4
    assert calls[0] == ("execute", 64)


def test_an_execute_that_returns_the_output_closes_the_step():
    guard, _ = _guard([MiB], returns="pooled")
    assert guard.execute_model(sched(16)) == "pooled"
    assert guard.ledger.steps == 1


def test_the_first_step_above_the_prediction_is_logged_once_with_its_shape(caplog):
    guard, _ = _guard([11 * MiB, 12 * MiB, MiB])
    with caplog.at_level(logging.WARNING, logger="vllm.wcprof"):
        for rows in (300, 200, 5):
            guard.execute_model(sched(rows, (1000, 2000)))
            guard.sample_tokens(None)
    warnings = [r.getMessage() for r in caplog.records if "guard" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "rows=300 reqs=2" in warnings[0] and "max ctx=2000" in warnings[0]
    assert "1.00 MiB above" in warnings[0]
    assert guard.ledger.above == 2 and guard.ledger.first_above[0] == 11 * MiB


def test_a_failing_probe_never_stops_serving(caplog):
    class Broken(FakeProbe):
        def end(self):
            raise RuntimeError("boom")

    guard, calls = _guard([])
    guard._probe = Broken([])
    with caplog.at_level(logging.ERROR, logger="vllm.wcprof"):
        guard.execute_model(sched(4))
        assert guard.sample_tokens(None) == "output"
        guard.execute_model(sched(4))
        guard.sample_tokens(None)
    assert guard._broken and len(calls) == 4
    assert guard._probe.started == 1  # pass-through after the failure


def test_a_probe_that_cannot_start_never_stops_serving(caplog):
    class NoStart(FakeProbe):
        def start(self):
            raise RuntimeError("no allocator")

    guard, calls = _guard([])
    guard._probe = NoStart([])
    with caplog.at_level(logging.ERROR, logger="vllm.wcprof"):
        assert guard.execute_model(sched(4)) is None
        assert guard.sample_tokens(None) == "output"
    assert guard._broken and len(calls) == 2 and guard.ledger.steps == 0


def test_channel_round_trip_and_collector_exposition(tmp_path):
    from prometheus_client import CollectorRegistry, generate_latest

    directory = g.channel_dir("12345", tmp_path)
    ch0 = g.Channel(directory / "rank0-pid1.bin", pid=1, rank=0, engine=0, predicted=10 * MiB,
                    available=80 * MiB, tolerance=0)
    ch1 = g.Channel(directory / "rank1-pid2.bin", pid=2, rank=1, engine=0, predicted=10 * MiB,
                    available=70 * MiB, tolerance=0)
    guard, _ = _guard([3 * MiB, 9 * MiB], channel=ch0)
    for rows in (64, 512):
        guard.execute_model(sched(rows, (100, 3000)))
        guard.sample_tokens(None)
    ch1.put("steps", 2)
    (directory / "rank9-pid9.bin").write_bytes(b"\0" * 16)  # incomplete: skipped
    assert g.read_channel(directory / "rank0-pid1.bin")["max_need"] == 9 * MiB

    registry = CollectorRegistry()
    registry.register(g.GuardCollector("12345", tmp_path))
    text = generate_latest(registry).decode()
    figures = parse_metrics(text)
    assert [f.rank for f in figures] == ["0", "1"]
    f0 = figures[0]
    assert f0.steps == 2 and f0.above == 0 and f0.observed == 9 * MiB
    assert f0.predicted == 10 * MiB and f0.headroom == 71 * MiB
    assert f0.get("wcprof_guard_largest_step_rows") == 512
    held, line = verdict(figures)
    assert held and line.startswith("the profile held over 2 steps: largest step 9.00 MiB of "
                                    "predicted 10.00 MiB")
    ch0.close()
    ch1.close()
    assert not (directory / "rank0-pid1.bin").exists()


def test_collector_says_nothing_without_workers(tmp_path):
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    registry.register(g.GuardCollector("none", tmp_path))
    assert b"wcprof_guard" not in generate_latest(registry)


def test_verdict_when_a_step_exceeded():
    text = "\n".join([
        f'{PREDICTED}{{rank="0",engine="0"}} 1.048576e+07',
        f'{OBSERVED}{{rank="0",engine="0"}} 1.2582912e+07',
        f'{STEPS}_total{{rank="0",engine="0"}} 200.0',
        f'{STEPS}_created{{rank="0",engine="0"}} 1.7e9',
        f'{ABOVE}_total{{rank="0",engine="0"}} 3.0',
        'vllm:num_requests_running{model_name="m",engine="0"} 0.0'])
    held, line = verdict(parse_metrics(text))
    assert not held
    assert line.startswith("the profile did NOT hold: 3 step(s) above the prediction over 200 "
                           "steps; largest step 12.00 MiB of predicted 10.00 MiB (120.0%)")
    assert verdict([]) == (True, "no wcprof guard metrics found")


def test_cpu_probe_sees_an_allocation_inside_the_step():
    probe = g.CpuProbe()
    probe.start()
    block = bytearray(64 * MiB)  # touched: resident
    del block
    assert probe.end() >= 60 * MiB
    probe.start()
    assert probe.end() < 8 * MiB


def test_a_step_is_read_against_the_encoder_caches_change():
    """What a step leaves in the encoder cache was live at its peak, and what it freed from it
    was gone before: the probe's two levels are adjusted by both (core/multimodal.
    encoder_cache_change); a text model's guard reads no cache."""
    probe = g.CpuProbe()
    probe.start()
    kept = bytearray(64 * MiB)  # touched and kept, as the encoder cache keeps its outputs
    assert probe.end() < 8 * MiB and probe.end(kept=64 * MiB) >= 60 * MiB
    del kept
    snapshots = iter([{}, {"img-a": 5 * MiB}, {"img-a": 5 * MiB}, {"img-b": 3 * MiB}])
    guard, _ = _guard([MiB, 2 * MiB])
    guard._encoder_cache = lambda: next(snapshots)
    for _ in range(2):
        guard.execute_model(sched(64))
        guard.sample_tokens(None)
    assert guard._probe.adjusted == [(5 * MiB, 0), (3 * MiB, 5 * MiB)]
    text, _ = _guard([MiB])
    text.execute_model(sched(64))
    text.sample_tokens(None)
    assert text._probe.adjusted == [(0, 0)]


def test_the_encoder_caches_change_is_what_it_gained_and_lost():
    from worstcase_profiler.core.multimodal import encoder_cache_change

    assert encoder_cache_change({"a": 1, "b": 2}, {"b": 2, "c": 4}) == (4, 1)
    assert encoder_cache_change(None, {"c": 4}) == (0, 0) == encoder_cache_change({}, None)


def test_a_validation_batch_keeps_the_encoder_outputs_it_left_in_the_cache():
    """validation._begin/_end on a worker whose encoder cache gains an entry during the batch:
    the entry counts in the batch's transient (it was live at the forward that read it)."""
    torch = pytest.importorskip("torch")
    from worstcase_profiler.adapter import validation as v

    cache: dict = {}
    held = []

    def execute(so):
        cache["img"] = torch.ones(16 * MiB, dtype=torch.float32)  # 64 MiB, touched
        held.append(torch.ones(8 * MiB, dtype=torch.float32))  # 32 MiB left live otherwise
        return "out"

    worker = SimpleNamespace(device="cpu", execute_model=execute,
                             model_runner=SimpleNamespace(encoder_cache=cache))
    v._begin(worker)
    worker.execute_model(sched(64))
    out = v._end(worker)
    assert 60 * MiB <= out["transient"] < 80 * MiB  # the cache's 64 MiB, not the other 32


def test_the_guard_is_on_under_vllm_serve_only_unless_forced():
    on = ProfilerSettings(mode="enforce")
    assert g.active(on, ["/x/bin/vllm", "serve", "m"])
    assert not g.active(on, ["/x/bin/wcprof", "--model", "m"])
    assert not g.active(on, ["-c"])
    assert g.active(ProfilerSettings(mode="enforce", guard="on"), ["-c"])
    assert not g.active(ProfilerSettings(mode="enforce", guard="off"), ["vllm", "serve"])
    assert not g.active(ProfilerSettings(), ["vllm", "serve"])  # profiler off: nothing
    assert g.under_api_server(["python", "-m", "vllm.entrypoints.openai.api_server"])
    # `python -m vllm.entrypoints.cli.main serve` (no console script: argv[0] is the module's path)
    main_py = "/site/vllm/entrypoints/cli/main.py"
    assert g.active(on, [main_py, "serve", "m"])
    assert not g.active(on, [main_py, "bench", "m"])
    assert g.vllm_cli_command([main_py, "serve"]) == "serve"
    assert g.vllm_cli_command(["/x/bin/wcprof", "serve"]) is None


def _fake_worker_and_session(predicted=10 * MiB):
    """The attributes install() reads off a vLLM worker and a StartupSession."""
    calls = []
    worker = SimpleNamespace(
        device="cpu",
        vllm_config=SimpleNamespace(instance_id="inst-1",
                                    parallel_config=SimpleNamespace(data_parallel_rank=0)),
        execute_model=lambda so: calls.append(so) or None,
        sample_tokens=lambda gm: "out")
    adm = SimpleNamespace(requested_bytes=1000 * MiB, consumed_bytes=300 * MiB,
                          cudagraph_bytes=0)
    profile = SimpleNamespace(sweep=SimpleNamespace(peak_bytes=predicted), admission=adm,
                              budget=SimpleNamespace(budget_bytes=500 * MiB))
    session = SimpleNamespace(profile=profile,
                              phases=SimpleNamespace(kv_audit=SimpleNamespace(
                                  allocated_bytes=600 * MiB)),
                              facts=SimpleNamespace(rank=0))
    return worker, session, calls


def test_install_swaps_the_workers_methods_and_exports_its_figures(tmp_path, monkeypatch):
    monkeypatch.setenv(g.ENV_DIR, str(tmp_path))
    worker, session, calls = _fake_worker_and_session()
    assert g.install(worker, session, ProfilerSettings(mode="enforce", guard="off")) is None
    guard = g.install(worker, session, ProfilerSettings(mode="enforce", guard="on"))
    assert guard is not None and g.install(worker, session,
                                           ProfilerSettings(mode="enforce", guard="on")) is guard
    worker.execute_model(sched(32))
    assert worker.sample_tokens(None) == "out"
    assert len(calls) == 1 and guard.ledger.steps == 1
    assert guard.ledger.available == (1000 - 300 - 600) * MiB  # what the KV cache left
    figures = parse_metrics(_exposition(g.GuardCollector("inst-1")))
    assert figures[0].steps == 1 and figures[0].predicted == 10 * MiB
    guard.close()


def _exposition(collector) -> str:
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    registry.register(collector)
    return generate_latest(registry).decode()


class _Metrics(BaseHTTPRequestHandler):
    body = b""

    def do_GET(self):  # noqa: N802 - http.server's name
        if self.path != "/metrics":
            self.send_response(404)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


@pytest.fixture
def metrics_server():
    server = HTTPServer(("127.0.0.1", 0), _Metrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_wcprof_guard_reads_a_server(metrics_server, capsys):
    url = f"http://127.0.0.1:{metrics_server.server_port}"
    lines = [f'{PREDICTED}{{rank="0",engine="0"}} 100.0', f'{OBSERVED}{{rank="0",engine="0"}} 90.0',
             f'{STEPS}_total{{rank="0",engine="0"}} 7.0', f'{ABOVE}_total{{rank="0",engine="0"}} 0.0']
    _Metrics.body = "\n".join(lines).encode()
    assert main(["guard", url]) == 0
    assert "the profile held over 7 steps: largest step 90 B of predicted 100 B" in capsys.readouterr().out
    _Metrics.body = _Metrics.body.replace(b"_total{rank=\"0\",engine=\"0\"} 0.0",
                                          b"_total{rank=\"0\",engine=\"0\"} 1.0")
    assert main(["guard", url + "/metrics"]) == 1
    _Metrics.body = b"vllm:other 1.0\n"
    assert main(["guard", url]) == 2
    assert "exports no wcprof_guard_* metrics" in capsys.readouterr().err
    metrics_server.shutdown()
    assert main(["guard", "http://127.0.0.1:9", "--timeout", "2"]) == 2


def test_the_serving_validation_sees_a_batchs_worst_step_while_the_guard_runs():
    """The guard resets the high-water mark at every step; the serving validation reads it over
    a whole batch. With the guard installed, the validation must still see the batch's largest
    step, not only its last one (the guard stays out between begin and end)."""
    from worstcase_profiler.adapter import validation as v

    sizes = iter([64 * MiB, MiB, MiB])

    def execute(so):
        block = bytearray(next(sizes))  # touched: resident for the step
        del block

    guard = g.StepGuard(execute, lambda grammar: "output", g.CpuProbe(),
                        StepLedger(predicted=10 * MiB, available=50 * MiB), None)
    worker = SimpleNamespace(device="cpu")
    setattr(worker, g.GUARD_ATTR, guard)
    v._begin(worker)
    for rows in (64, 8):  # the large step first, then a small one
        guard.execute_model(sched(rows))
        guard.sample_tokens(None)
    out = v._end(worker)
    assert out["transient"] >= 60 * MiB, out
    assert guard.ledger.steps == 0  # the guard stayed out of the validation's steps
    guard.execute_model(sched(8))
    guard.sample_tokens(None)
    assert guard.ledger.steps == 1  # and is back afterwards


def test_a_replay_records_the_largest_step_the_scheduler_formed_and_unwraps():
    """validation._begin/_end: the worker's execute_model is wrapped only between them; the
    answer names the largest step formed (most rows, then most requests), and a guard wrapper
    that was there before is put back."""
    from worstcase_profiler.adapter import validation as v

    seen = []
    worker = SimpleNamespace(device="cpu", execute_model=lambda so: seen.append(so) or "out")
    original = worker.execute_model
    v._begin(worker)
    assert worker.execute_model != original
    for so in (sched(64, contexts=(100, 200)), sched(64, contexts=(1, 2, 3, 4)), sched(8)):
        assert worker.execute_model(so) == "out"
    out = v._end(worker)
    assert len(seen) == 3 and worker.execute_model == original
    # the frontier over rows, requests and context: (64, 4, ctx 4) covers (8, 1, 0) only
    assert [(f["rows"], f["reqs"], f["max_context"]) for f in out["formed"]] == [
        (64, 2, 200), (64, 4, 4)]
    v._begin(worker)
    for so in (sched(256, contexts=(0, 0, 0)), sched(4, contexts=(2046,) * 4, new=False)):
        worker.execute_model(so)
    second = v._end(worker)
    assert [(f["rows"], f["reqs"]) for f in second["formed"]] == [(256, 3), (4, 4)]
    peaks = v.RankPeaks()
    peaks.add([out, second])
    from worstcase_profiler.core.replay_rules import formed_for
    frontier = peaks.formed[0]
    assert formed_for(Shape("decode", 4, 2046, 4), frontier) == Shape("decode", 4, 2046, 4)
    assert formed_for(Shape("decode", 4, 2046, 5), frontier).num_reqs == 4  # the closest
    assert formed_for(None, frontier).rows == 256
    # a target on no context (a stock-like prefill) is covered by any step of its rows and requests
    flat = [StepShape(4096, 2, 0, 2), StepShape(8192, 1, 0, 1)]
    assert formed_for(Shape("prefill", 4096, 0, 2), flat) == Shape("prefill", 4096, 0, 2)


def test_a_replay_that_did_not_form_its_target_says_so():
    from worstcase_profiler.core.replay_rules import replay_reached
    from worstcase_profiler.core.types import Validation
    from worstcase_profiler.render.view import validation_text

    target = Shape("prefill", 2048, 8190, 1024)
    v = Validation(measured_peak_bytes=820 * MiB, predicted_peak_bytes=4000 * MiB, ratio=0.2,
                   requests=("1024 prompts",), seconds=1.0, target="worst-step", shape=target,
                   formed=Shape("mixed", 2048, 8188, 9))
    assert replay_reached(v) is False
    assert "NOT REACHED" in validation_text(v) and "9 request(s) at context 8,188" in validation_text(v)
    done = Validation(**{**v.__dict__, "formed": Shape("prefill", 2048, 8190, 1024)})
    assert replay_reached(done) is True and "NOT REACHED" not in validation_text(done)
    assert replay_reached(Validation(**{**v.__dict__, "formed": None})) is None


def test_replay_requests_sample_as_the_profile_does_except_on_the_cpu():
    pytest.importorskip("vllm")
    from worstcase_profiler.adapter.validation import replay_sampling

    gpu = replay_sampling(3, 1000)
    assert (gpu.temperature, gpu.top_p, gpu.top_k, gpu.max_tokens) == (0.5, 0.9, 999, 3)
    cpu = replay_sampling(3, 1000, "cpu")
    assert cpu.top_k in (0, -1) and cpu.top_p == 1.0 and cpu.ignore_eos


class _FakeEngine:
    """An engine whose scheduler prefills `n` requests one step each, then decodes them all
    together (one row each) at a growing context, until `max_tokens` or an abort."""

    def __init__(self, worker, n, prompt):
        self.worker, self.n, self.prompt = worker, n, prompt
        self.vllm_config = SimpleNamespace(device_config=SimpleNamespace(device_type="cpu"))
        self.model_config = SimpleNamespace(get_vocab_size=lambda: 1000)
        self.reqs, self.steps, self.aborted = {}, 0, []

    def add_request(self, rid, prompt, params):
        self.reqs[rid + "-x"] = {"made": 0, "max": params.max_tokens, "done": False}
        return rid + "-x"

    def has_unfinished_requests(self):
        return any(not r["done"] for r in self.reqs.values())

    def abort_request(self, ids, internal=False):
        self.aborted.append((list(ids), internal))
        for i in ids:
            self.reqs[i]["done"] = True

    def step(self):
        self.steps += 1
        live = [k for k, r in self.reqs.items() if not r["done"]]
        pending = [k for k in live if self.reqs[k]["made"] == 0]
        if pending:  # one prompt a step, the earlier ones decode alongside
            decoding = [k for k in live if self.reqs[k]["made"]]
            so = sched(self.prompt + len(decoding), contexts=(0,) + (self.prompt,) * len(decoding))
            step = [pending[0], *decoding]
        else:
            ctx = max(self.prompt + self.reqs[k]["made"] for k in live)
            so = sched(len(live), contexts=(ctx,) * len(live), new=False)
            step = live
        self.worker.execute_model(so)
        out = []
        for k in step:
            r = self.reqs[k]
            r["made"] += 1
            r["done"] = r["made"] >= r["max"]
            out.append(SimpleNamespace(request_id=k, finished=r["done"],
                                       outputs=[SimpleNamespace(token_ids=[7])]))
        return out


def test_a_replay_stops_once_its_target_step_formed_and_a_request_finished():
    """validation._generate_to: a decode plan's requests carry output for the slowest case; the
    replay stops the rest once the scheduler formed the target (asked of the workers'
    recorders) and the first request finished (the longest context any reaches; every later
    step has fewer requests), and says how many it stopped. A target that never forms runs
    the requests to the end, as llm.generate would. A request the engine refuses takes the
    ones already added with it."""
    pytest.importorskip("vllm")
    from worstcase_profiler.adapter import validation as v

    made = []

    def run(target, refuse_at=None):
        worker = SimpleNamespace(device="cpu", execute_model=lambda so: None)
        engine = _FakeEngine(worker, 4, 64)
        made.append(engine)
        if refuse_at is not None:
            add = engine.add_request

            def add_request(rid, prompt, params):
                if rid.endswith(f"-{refuse_at}"):
                    raise ValueError("prompt refused")
                return add(rid, prompt, params)

            engine.add_request = add_request
        llm = SimpleNamespace(llm_engine=engine, collective_rpc=lambda fn: [fn(worker)])
        v._begin(worker)
        stopped = v._generate_to(llm, [[1] * 64] * 4, 50, target)
        return engine, stopped, v._end(worker)

    engine, stopped, out = run(Shape("decode", 4, 70, 4))
    # 4 prefill steps (one prompt each), then all decode; the first request (prefilled first)
    # finishes after 50 tokens while the other 3 have 1-3 left: those are stopped
    assert stopped == 3 and engine.steps == 50, (stopped, engine.steps)
    assert engine.aborted and all(internal for _, internal in engine.aborted)
    assert {i for ids, _ in engine.aborted for i in ids} == set(engine.reqs)
    assert any(f["rows"] == 4 and f["reqs"] == 4 and f["max_context"] >= 70 for f in out["formed"])

    engine, stopped, _ = run(Shape("decode", 8, 70, 8))  # more requests than the batch has
    assert stopped == 0 and not engine.aborted and engine.steps == 53

    with pytest.raises(ValueError, match="refused"):
        run(Shape("decode", 4, 70, 4), refuse_at=2)
    assert made[-1].aborted == [(list(made[-1].reqs), True)] and len(made[-1].reqs) == 2


def test_a_replay_told_to_stop_once_formed_does_not_wait_for_a_request_to_finish():
    """WCPROF_REPLAY_STOP=formed (an engine that fails as its requests near max_model_len,
    h200-run33): the replay stops every request as soon as the target formed, long before the
    first would finish (a value it does not know: tests/unit/test_preflight.py)."""
    pytest.importorskip("vllm")
    from worstcase_profiler.adapter import validation as v

    from worstcase_profiler.settings import replay_stop

    assert replay_stop({}) == "finished"
    assert replay_stop({"WCPROF_REPLAY_STOP": "Formed"}) == "formed"

    worker = SimpleNamespace(device="cpu", execute_model=lambda so: None)
    engine = _FakeEngine(worker, 4, 64)
    llm = SimpleNamespace(llm_engine=engine, collective_rpc=lambda fn: [fn(worker)])
    v._begin(worker)
    stopped = v._generate_to(llm, [[1] * 64] * 4, 50, Shape("decode", 4, 70, 4), "formed")
    out = v._end(worker)
    # 4 prefill steps, then all 4 decode; context 70 forms a few steps later, nothing finished
    assert stopped == 4 and engine.steps < 15, (stopped, engine.steps)
    assert any(f["rows"] == 4 and f["reqs"] == 4 and f["max_context"] >= 70 for f in out["formed"])


def test_measure_reads_the_replay_stop_and_names_it(monkeypatch):
    """validation._measure passes WCPROF_REPLAY_STOP to every measured replay and says in the
    validation's note how the replay stopped; with "formed", a target that never forms still
    runs the requests to the end (nothing to stop at), as llm.generate would."""
    pytest.importorskip("vllm")
    from worstcase_profiler.adapter import validation as v

    def measure(target):
        worker = SimpleNamespace(device="cpu", execute_model=lambda so: None)
        engine = _FakeEngine(worker, 4, 64)
        llm = SimpleNamespace(llm_engine=engine, collective_rpc=lambda fn: [fn(worker)])
        work = v.Workload("worst-step", (([[1] * 64] * 4, 50, True),), ("4 prompts",),
                          shape=target)
        return engine, v._measure(llm, work, {0: 1 << 20})

    monkeypatch.setenv("WCPROF_REPLAY_STOP", "formed")
    engine, (found,) = measure(Shape("decode", 4, 70, 4))
    assert engine.steps < 15 and found.note.endswith(
        "stopped 4 request(s) once the target step had formed (WCPROF_REPLAY_STOP=formed)")
    engine, (found,) = measure(Shape("decode", 8, 70, 8))  # never formed
    assert engine.steps == 53 and not engine.aborted and found.note is None

    monkeypatch.delenv("WCPROF_REPLAY_STOP")
    engine, (found,) = measure(Shape("decode", 4, 70, 4))
    assert engine.steps == 50 and found.note.endswith(
        "stopped 3 request(s) once the target step had formed and one had finished")


def test_verdict_before_any_measurable_step_says_so():
    """Issue 39: short steps on the CPU read 0 B and the verdict said "largest step 0 B of
    predicted ... (0.0%)" until a long prompt arrived."""
    text = "\n".join([f'{PREDICTED}{{rank="0",engine="0"}} 1.048576e+07',
                      f'{OBSERVED}{{rank="0",engine="0"}} 0.0',
                      f'{STEPS}_total{{rank="0",engine="0"}} 12.0',
                      f'{ABOVE}_total{{rank="0",engine="0"}} 0.0'])
    held, line = verdict(parse_metrics(text))
    assert held and "largest step 0 B" not in line and "(0.0%)" not in line
    assert line.startswith("the profile held over 12 steps: no step yet needed memory above its "
                           "start that the meter resolves (predicted 10.00 MiB")


def test_the_in_process_replay_runs_inside_a_running_event_loop():
    """validation.run_now drives InProcess's never-suspending coroutine without a loop, so a
    --validate replay from a notebook (a loop already running) works where asyncio.run refuses."""
    import asyncio

    from worstcase_profiler.adapter.validation import run_now

    async def answer():
        return 42

    async def inside_a_loop():
        return run_now(answer())

    assert run_now(answer()) == 42
    assert asyncio.run(inside_a_loop()) == 42

    async def suspends():
        await asyncio.sleep(0)

    with pytest.raises(RuntimeError, match="suspends"):
        run_now(suspends())
