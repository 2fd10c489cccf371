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
    client = _Client(forms_after=0)  # formed, but every request finished first: nothing to stop
    assert _run(client, {"a": 0.0, "b": 0.0}, "finished") == 0 and client.aborted == []


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
