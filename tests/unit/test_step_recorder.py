"""adapter.validation.StepRecorder names the step that set a measured batch's high-water mark,
not the largest step the batch formed (what the traffic check printed before: h200-run50)."""
from types import SimpleNamespace

from worstcase_profiler.adapter.validation import StepRecorder


def sched(chunks: dict, contexts: dict, new=True):
    """A SchedulerOutput: request id -> rows scheduled, request id -> computed tokens."""
    reqs = [SimpleNamespace(req_id=r, num_computed_tokens=contexts[r]) for r in chunks] if new \
        else []
    cached = SimpleNamespace(req_ids=[] if new else list(chunks),
                             num_computed_tokens=[] if new else [contexts[r] for r in chunks])
    return SimpleNamespace(total_num_scheduled_tokens=sum(chunks.values()),
                           num_scheduled_tokens=dict(chunks), scheduled_spec_decode_tokens={},
                           scheduled_new_reqs=reqs, scheduled_cached_reqs=cached)


class Meter:
    """peak(): the high-water mark so far (the fake worker raises it per step shape)."""

    def __init__(self):
        self.high = 0
        self.held = 40  # what the process holds (in_use)

    def peak(self):
        return self.high

    def in_use(self):
        return self.held


def _worker(meter, costs):
    def execute_model(scheduler_output):
        meter.high = max(meter.high, costs[scheduler_output.total_num_scheduled_tokens])
    return SimpleNamespace(execute_model=execute_model)


def test_the_step_that_raised_the_mark_is_named_not_the_largest():
    meter = Meter()
    # 8,192 rows at context 0 is the largest step; a 4,097-row chunk beside a decode at a long
    # context costs more.
    worker = _worker(meter, {8192: 100, 4097: 150, 1: 10})
    rec = StepRecorder(worker, meter)
    worker.execute_model(sched({"a": 8192}, {"a": 0}))
    worker.execute_model(sched({"d": 1, "c": 4096}, {"d": 131068, "c": 32772}, new=False))
    worker.execute_model(sched({"d": 1}, {"d": 131069}, new=False))
    rec.remove()
    assert rec.peak_step["rows"] == 4097 and rec.peak_step["peak_bytes"] == 150
    # the decode's context is the step's longest; the chunk runs on its own
    assert rec.peak_step["max_context"] == 131068 and rec.peak_step["chunk_context"] == 32772
    assert rec.peak_step["largest_chunk"] == 4096
    assert max(s.rows for s in rec.frontier) == 8192


def test_memory_taken_after_a_step_returned_is_charged_to_it():
    meter = Meter()
    worker = _worker(meter, {8192: 100, 16: 0})
    rec = StepRecorder(worker, meter)
    worker.execute_model(sched({"a": 16}, {"a": 500}))
    meter.high = 120  # the 16-row step's sampling, between its return and the next step
    worker.execute_model(sched({"b": 8192}, {"b": 0}))
    rec.remove()
    assert rec.peak_step["rows"] == 16 and rec.peak_step["peak_bytes"] == 120


def test_a_meter_that_raises_drops_the_naming_and_keeps_the_replay_and_frontier():
    class Broken(Meter):
        def peak(self):
            raise RuntimeError("no stats")

    meter = Broken()
    ran = []
    worker = SimpleNamespace(execute_model=lambda so: ran.append(so.total_num_scheduled_tokens))
    rec = StepRecorder(worker, meter)
    worker.execute_model(sched({"a": 8}, {"a": 0}))
    worker.execute_model(sched({"b": 16}, {"b": 0}))
    assert ran == [8, 16] and not rec.failed
    assert [s["rows"] for s in rec.remove()] == [16] and rec.peak_step is None


def test_the_step_is_named_in_the_ranks_answer(monkeypatch):
    from worstcase_profiler.adapter import validation, workspace

    meter = Meter()
    worker = _worker(meter, {64: 7})
    monkeypatch.setattr(validation, "_pause_guard", lambda w, p: None)
    monkeypatch.setattr(workspace, "manager", lambda: None)
    meter.end = lambda kept=0, freed=0: meter.high
    meter.left = lambda: 3  # what the batch left allocated above its start
    meter.resolution_bytes = 1
    setattr(worker, validation._METER_ATTR, meter)
    setattr(worker, validation._FORMED_ATTR, StepRecorder(worker, meter))
    worker.execute_model(sched({"a": 64}, {"a": 300}))
    out = validation._end(worker)
    assert out["peak_step"] == dict(rows=64, reqs=1, max_context=300, prefills=1,
                                    largest_chunk=64, chunk_context=300, start_bytes=0,
                                    peak_bytes=7)
    assert out["left"] == 3


def test_what_the_requests_left_allocated_is_reported_and_said():
    """A batch that leaves memory allocated once its requests finished (the meter takes it off
    the transient as persistent) says so in the validation and in its words: what the batch
    whose transient is reported left, not another batch's."""
    from worstcase_profiler.adapter.validation import RankPeaks
    from worstcase_profiler.render.view import validation_text

    peaks = RankPeaks()
    answer = dict(rank=0, workspace=0, resolution=1 << 20, formed=[])
    peaks.add([dict(answer, transient=100, left=7 << 30),  # a smaller batch's leftover
               dict(answer, transient=4_170_704_384, left=131_899_904),
               dict(answer, transient=100, left=0)])
    (v,) = peaks.results({0: 4_305_750_016}, ["356 fresh prompts"], 1.0, target="worst-step")
    assert (v.measured_peak_bytes, v.left_bytes) == (4_170_704_384, 131_899_904)
    assert "left 125.79 MiB allocated after they finished" in validation_text(v)
    quiet = RankPeaks()
    quiet.add([dict(answer, transient=100, left=4096)])  # under the resolution: not said
    (q,) = quiet.results({0: 200}, [], 1.0, target="worst-step")
    assert "allocated after" not in validation_text(q)


def test_what_earlier_steps_left_live_is_told_apart_from_the_steps_own():
    """A step that begins above the batch's start carries what earlier steps left live: the
    record says how far above, so a mark above the prediction can be told apart from a step
    that needed more (the traffic check's +2 MiB on dsv32_bf16)."""
    meter = Meter()
    worker = _worker(meter, {8192: 100, 8193: 105})
    rec = StepRecorder(worker, meter)
    worker.execute_model(sched({"a": 8192}, {"a": 0}))
    meter.held += 6  # the first step's outputs, still live when the next one begins
    worker.execute_model(sched({"d": 1, "c": 8192}, {"d": 131066, "c": 24581}, new=False))
    rec.remove()
    assert rec.peak_step["rows"] == 8193 and rec.peak_step["start_bytes"] == 6


def test_a_meter_without_in_use_still_names_the_step():
    class Bare:
        high = 0

        def peak(self):
            return self.high

    meter = Bare()
    worker = _worker(meter, {64: 7})
    rec = StepRecorder(worker, meter)
    worker.execute_model(sched({"a": 64}, {"a": 0}))
    rec.remove()
    assert rec.peak_step["peak_bytes"] == 7 and rec.peak_step["start_bytes"] is None
