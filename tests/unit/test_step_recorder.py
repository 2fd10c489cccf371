"""adapter.validation.StepRecorder names the step that set a measured batch's high-water mark,
not the largest step the batch formed (what the traffic check printed before: h200-run50)."""
from types import SimpleNamespace

from tests.unit.test_guard import sched
from worstcase_profiler.adapter.validation import StepRecorder


class Meter:
    """peak(): the high-water mark so far (the fake worker raises it per step shape)."""

    def __init__(self):
        self.high = 0

    def peak(self):
        return self.high


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
    worker.execute_model(sched(8192, (0,)))
    worker.execute_model(sched(4097, (131000, 32000), new=False))
    worker.execute_model(sched(1, (131068,), new=False))
    rec.remove()
    assert rec.peak_step["rows"] == 4097 and rec.peak_step["max_context"] == 131000
    assert rec.peak_step["peak_bytes"] == 150
    assert max(s.rows for s in rec.frontier) == 8192


def test_memory_taken_after_a_step_returned_is_charged_to_it():
    meter = Meter()
    worker = _worker(meter, {8192: 100, 16: 0})
    rec = StepRecorder(worker, meter)
    worker.execute_model(sched(16, (500,)))
    meter.high = 120  # the 16-row step's sampling, between its return and the next step
    worker.execute_model(sched(8192, (0,)))
    rec.remove()
    assert rec.peak_step["rows"] == 16 and rec.peak_step["peak_bytes"] == 120


def test_without_a_meter_nothing_is_named_and_the_frontier_still_kept():
    worker = _worker(Meter(), {8: 1})
    rec = StepRecorder(worker)
    worker.execute_model(sched(8, (0,)))
    assert rec.remove() and rec.peak_step is None
