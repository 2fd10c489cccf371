"""The serving validation's replays stop like wcprof --validate's (serve_validation.
_stop_once_formed, the async twin of validation._generate_to): once every rank's recorder
holds the target step and a request has finished, or, with WCPROF_REPLAY_STOP=formed, as soon
as the target formed; the requests still running are aborted."""

from __future__ import annotations

import asyncio

import pytest

from worstcase_profiler.core.types import Shape

TARGET = Shape("decode", 4, 70, 4)
FORMED = [{"rows": 4, "reqs": 4, "max_context": 70}]  # a recorder's frontier (core.guard)


class _Client:
    """Answers "formed" with the target after `forms_after` asks, once per rank; records
    aborts, which end the aborted requests' tasks as vLLM's final abort output does."""

    def __init__(self, forms_after: int | None, ranks: int = 2):
        self.forms_after, self.ranks, self.asked, self.aborted = forms_after, ranks, 0, []
        self.events: dict[str, asyncio.Event] = {}

    async def collective_rpc(self, method, args=()):
        assert (method, args) == ("wcprof_rpc", ("formed",))
        self.asked += 1
        formed = self.forms_after is not None and self.asked > self.forms_after
        return [FORMED if formed else [] for _ in range(self.ranks)]

    async def abort(self, rids):
        self.aborted.append(list(rids))
        for r in rids:
            self.events[r].set()


def _run(client, finish_after_s: dict[str, float | None], stop: str):
    from worstcase_profiler.adapter import serve_validation as sv

    async def drain(rid, after):
        ev = client.events[rid] = asyncio.Event()
        if after is None:
            await ev.wait()
        else:
            try:
                await asyncio.wait_for(ev.wait(), after)
            except asyncio.TimeoutError:
                pass

    async def main():
        rids = list(finish_after_s)
        tasks = [asyncio.ensure_future(drain(r, finish_after_s[r])) for r in rids]
        await asyncio.sleep(0)
        try:
            return await asyncio.wait_for(
                sv._stop_once_formed(client, tasks, rids, TARGET, stop, every_s=0.01), 5)
        finally:
            for t in tasks:
                t.cancel()

    return asyncio.run(main())


def test_a_serving_replay_stops_once_formed_and_one_finished():
    pytest.importorskip("vllm")
    client = _Client(forms_after=2)
    stopped = _run(client, {"a": 0.05, "b": None, "c": None}, "finished")
    assert stopped == 2 and client.aborted == [["b", "c"]]


def test_a_serving_replay_told_formed_does_not_wait_for_a_finish():
    pytest.importorskip("vllm")
    client = _Client(forms_after=2)
    stopped = _run(client, {"a": None, "b": None}, "formed")
    assert stopped == 2 and client.aborted == [["a", "b"]] and client.asked == 3


def test_a_serving_replay_whose_target_never_forms_runs_to_the_end():
    pytest.importorskip("vllm")
    client = _Client(forms_after=None)
    assert _run(client, {"a": 0.02, "b": 0.05}, "formed") == 0 and client.aborted == []
    client = _Client(forms_after=0)  # formed at the first ask, after every request finished
    assert _run(client, {"a": 0.002, "b": 0.002}, "finished") == 0 and client.aborted == []
    assert client.asked == 1


def test_an_aborted_request_that_stays_open_is_cancelled_not_waited_for():
    """A stream that does not end after its abort (an engine client that never sends the final
    output) is cancelled after the grace period: the server's start cannot hang on it."""
    pytest.importorskip("vllm")
    from worstcase_profiler.adapter import serve_validation as sv

    class Deaf(_Client):
        async def abort(self, rids):
            self.aborted.append(list(rids))  # and never ends the streams

    async def main():
        client = Deaf(forms_after=0)
        never = asyncio.Event()
        tasks = [asyncio.ensure_future(never.wait()) for _ in range(2)]
        n = await sv._stop_once_formed(client, tasks, ["a", "b"], TARGET, "formed",
                                       every_s=0.01, grace_s=0.05)
        return n, client.aborted, [t.cancelled() for t in tasks]

    assert asyncio.run(main()) == (2, [["a", "b"]], [True, True])


def test_the_target_must_have_formed_on_every_rank():
    pytest.importorskip("vllm")
    from worstcase_profiler.adapter.validation import formed_on_every_rank

    assert formed_on_every_rank(TARGET, [FORMED, FORMED])
    assert not formed_on_every_rank(TARGET, [FORMED, []])  # TP: one rank has not formed it
    assert not formed_on_every_rank(TARGET, [])


class _Engine:
    """An AsyncLLM stand-in for serve_validation._measure: each request yields a token every
    10 ms for up to 1,000 tokens; the request ending in -0 finishes after 5, one ending in -1
    fails after 2 when `fail` is set. Its ranks report the target formed from the
    `forms_at`th ask."""

    def __init__(self, fail=False, forms_at=3):
        from types import SimpleNamespace

        self.fail, self.forms_at, self.asked, self.aborted, self.live = fail, forms_at, 0, [], set()
        self.vllm_config = SimpleNamespace(device_config=SimpleNamespace(device_type="cpu"))
        self.output_processor = SimpleNamespace(get_num_unfinished_requests=lambda: len(self.live))

    async def pause_generation(self, mode, clear_cache):
        pass

    async def resume_generation(self):
        pass

    async def collective_rpc(self, method, args=()):
        op = args[0]
        if op == "formed":
            self.asked += 1
            return [FORMED if self.asked >= self.forms_at else []]
        if op == "end":
            return [{"rank": 0, "transient": 100, "workspace": 0, "resolution": 1,
                     "formed": FORMED}]
        return [None]

    async def abort(self, rids):
        self.aborted.append(list(rids))
        self.live -= set(rids)

    async def generate(self, prompt, params, rid):
        from types import SimpleNamespace

        self.live.add(rid)
        for i in range(1000):
            await asyncio.sleep(0.01)
            if rid not in self.live:  # aborted: vLLM's final output
                yield SimpleNamespace(finished=True)
                return
            if self.fail and rid.endswith("-1") and i == 2:
                raise RuntimeError("engine failed")
            yield SimpleNamespace(finished=False)
            if rid.endswith("-0") and i == 4:
                break
        self.live.discard(rid)


def _serve_measure(engine):
    from vllm import SamplingParams  # noqa: F401  (imported before the clock starts)

    from worstcase_profiler.adapter import serve_validation as sv
    from worstcase_profiler.adapter.validation import Workload

    work = Workload("worst-step", (([[1] * 8] * 3, 1000, True),), ("3 prompts",), shape=TARGET)
    return asyncio.run(asyncio.wait_for(sv._measure(engine, work, {0: 1000}, 1000), 5))


def test_the_serving_measure_stops_its_replay_and_says_so(monkeypatch):
    """serve_validation._measure watches a measured batch with a target: once formed (3rd ask)
    and one request finished, the other two are aborted, and the note says so."""
    pytest.importorskip("vllm")
    monkeypatch.delenv("WCPROF_REPLAY_STOP", raising=False)
    engine = _Engine()
    (found,) = _serve_measure(engine)
    assert engine.aborted == [["wcprof-worst-step-1", "wcprof-worst-step-2"]]
    assert found.note == "stopped 2 request(s) once the target step had formed and one had finished"
    assert found.seconds < 2


def test_a_failed_serving_request_fails_the_validation_at_once():
    """A request that fails raises from _measure without waiting for the others to decode
    their 1,000 tokens (10 s here) when nothing else stops them (the target never forms)."""
    pytest.importorskip("vllm")
    import time

    engine = _Engine(fail=True, forms_at=10**9)
    _serve_measure(_Engine())  # imports done
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="engine failed"):
        _serve_measure(engine)
    assert time.monotonic() - t0 < 2


# -- the serving validation's verdict -----------------------------------------------------------

def _serve_verdict(monkeypatch, check_measured: int, worst_measured: int = 90):
    """validate_before_serving on fakes: one rank whose summary names a worst step and one named
    step (reading 40, admitted sweep 100, the budget subtracted 100), each measured as given
    against a workspace of 10; returns (the recorded validations or the error, the log)."""
    import logging

    from worstcase_profiler.adapter import facts, serve_validation as sv
    from worstcase_profiler.core import codec
    from worstcase_profiler.core.check_steps import CheckStep
    from worstcase_profiler.core.types import Validation

    check = CheckStep(shape=Shape("prefill", 8, 16, 1), peak_bytes=40, predicted_bytes=40,
                      need_bytes=50)
    summary = {"rank": 0, "peak": 100, "admitted": 100, "subtracted": 100, "block": 256,
               "worst": codec.encode(Shape("prefill", 8, 64, 1)), "encoder": None,
               "checks": codec.encode((check,))}
    recorded = []

    async def ask(client, op, *payload):
        if op == "record":
            recorded.extend(payload[0])
        return {"summary": [summary], "pool": [None], "record": [1]}[op]

    async def measure(client, work, predicted, vocab):
        got = check_measured if work == "check-step" else worst_measured
        return [Validation(measured_peak_bytes=got + 10, predicted_peak_bytes=predicted[0] + 10,
                           ratio=(got + 10) / (predicted[0] + 10), requests=(), seconds=0.1,
                           target=work, resolution_bytes=0)]

    class Client:
        vllm_config = object()
        model_config = type("M", (), {"get_vocab_size": lambda self: 32})()

    monkeypatch.setattr(sv, "ask", ask)
    monkeypatch.setattr(sv, "_measure", measure)
    monkeypatch.setattr(sv, "worst_step_workload", lambda plan, vocab, target="worst-step": target)
    monkeypatch.setattr(sv, "plan_for", lambda shape, **kw: shape)
    monkeypatch.setattr(sv, "pool_from", lambda answers: None)
    def limits_of(cfg, block_size=None):  # the block the engine started with, from its ranks
        assert block_size == 256, block_size
        return type("L", (), {"prefix_caching": True})()

    monkeypatch.setattr(facts, "limits_of", limits_of)
    monkeypatch.setattr(facts, "hash_lookahead_tokens", lambda cfg: 0)
    monkeypatch.setattr(facts, "sibling_hits_serialize", lambda cfg: False)
    records = []
    handler = logging.Handler()
    handler.emit = lambda r: records.append(r.getMessage())
    logging.getLogger("vllm.wcprof").addHandler(handler)
    try:
        out = asyncio.run(sv.validate_before_serving(Client(), "worst"))
    except Exception as e:  # noqa: BLE001 - the refusal is the result under test
        out = e
    finally:
        logging.getLogger("vllm.wcprof").removeHandler(handler)
    return out, recorded, records


def test_a_named_step_over_its_reading_but_within_what_was_subtracted_warns_and_serves(
        monkeypatch):
    """Under vllm serve a named step over its own reading (40) but within what the budget
    subtracted (100, plus the same workspace) warns and the server starts, its validation
    recorded with that figure; beyond it the server refuses, naming the admitted figure; the
    worst step over its prediction refuses whatever the named step read."""
    from worstcase_profiler.errors import WcprofError

    out, recorded, log = _serve_verdict(monkeypatch, check_measured=60)
    assert not isinstance(out, Exception), out
    (check,) = [v for v in out if v.target == "check-step"]
    assert check.admitted_peak_bytes == 110 and len(recorded) == 2
    assert any("more than its own reading" in m for m in log), log
    out, _, _ = _serve_verdict(monkeypatch, check_measured=101)
    assert isinstance(out, WcprofError) and "more than the 110 B admitted" in str(out), out
    out, _, _ = _serve_verdict(monkeypatch, check_measured=30, worst_measured=101)
    assert isinstance(out, WcprofError) and "110 B predicted" in str(out), out
