"""core/readings and DriverBase._measured: a step's transient is its peak above max(start, end),
and a step that leaves more live than the meter resolves is measured again, so a buffer it
created after its peak (vLLM 0.33's DSpark draft metadata builders on a fresh KV cache) is in
the second reading's start level instead of being taken off the first reading. Fakes only."""

from __future__ import annotations

from worstcase_profiler.adapter import workspace as ws
from worstcase_profiler.adapter.runner import DriverBase
from worstcase_profiler.adapter import leftover
from worstcase_profiler.core.readings import leftover_sites, measure_again, step_transient
from worstcase_profiler.core.types import Shape

MiB = 1 << 20
SHAPE = Shape("prefill", 4096, 149760, 1)


def test_what_a_step_leaves_live_is_not_its_transient():
    assert step_transient(peak=110, start=100, end=100) == 10
    assert step_transient(peak=110, start=100, end=104) == 6
    assert step_transient(peak=110, start=100, end=96) == 10  # freed: its start level counts
    assert step_transient(peak=100, start=100, end=100) == 0


def test_only_a_step_that_left_more_than_the_resolution_is_measured_again():
    assert measure_again(9 * MiB, MiB)
    assert not measure_again(MiB, MiB)
    assert not measure_again(0, MiB)
    assert not measure_again(-4 * MiB, MiB)  # a step that freed memory


class Device:
    """Allocated bytes and a high-water mark, as CUDA's allocator counts them."""

    def __init__(self) -> None:
        self.level = self.hwm = 0

    def alloc(self, n: int) -> None:
        self.level += n
        self.hwm = max(self.hwm, self.level)


class Meter:
    resolution_bytes = MiB

    def __init__(self, dev: Device) -> None:
        self.dev, self.base = dev, 0

    def begin(self) -> None:
        self.dev.hwm = self.base = self.dev.level

    def peak(self) -> int:
        return self.dev.hwm - self.base

    def end(self, kept: int = 0, freed: int = 0) -> int:
        return step_transient(self.dev.hwm, self.base, self.dev.level, kept, freed)

    def left(self) -> int:
        return self.dev.level - self.base


class Driver(DriverBase):
    def __init__(self, dev: Device) -> None:
        self.meter, self._requests, self.dev, self.runs = Meter(dev), ws.RequestRecorder(), dev, 0
        self.builders = False

    def step(self, lazy_after_peak: int, grows_before_peak: int = 0) -> None:
        """A forward of 100 MiB; at the first call a persistent buffer created before the peak
        (a grown workspace) and one created after it (a builder's buffer at the first draft)."""
        self.runs += 1
        first = not self.builders
        if first:
            self.dev.alloc(grows_before_peak)
        self.dev.alloc(100 * MiB)
        self.dev.alloc(-100 * MiB)
        if first:
            self.dev.alloc(lazy_after_peak)
            self.builders = True


def test_a_buffer_created_after_the_peak_is_not_taken_off_the_reading():
    dev = Device()
    driver = Driver(dev)
    got = driver._measured(SHAPE, lambda: driver.step(lazy_after_peak=9 * MiB), attribute=False)
    assert driver.runs == 2  # the first reading (91 MiB) was taken again
    assert got.peak_bytes == 100 * MiB  # what a step reads in an engine that holds the buffer
    # a later step on the same cache leaves nothing: measured once
    again = driver._measured(SHAPE, lambda: driver.step(lazy_after_peak=9 * MiB), attribute=False)
    assert driver.runs == 3 and again.peak_bytes == 100 * MiB


def test_a_buffer_created_before_the_peak_reads_the_same_either_way():
    dev = Device()
    driver = Driver(dev)
    got = driver._measured(SHAPE, lambda: driver.step(0, grows_before_peak=16 * MiB),
                           attribute=False)
    assert driver.runs == 2 and got.peak_bytes == 100 * MiB


def test_a_step_within_the_resolution_is_measured_once():
    dev = Device()
    driver = Driver(dev)
    got = driver._measured(SHAPE, lambda: driver.step(lazy_after_peak=MiB // 2), attribute=False)
    assert driver.runs == 1 and got.peak_bytes == 100 * MiB - MiB // 2


def test_ranks_decide_alike_on_the_largest_left_live():
    dev = Device()
    driver = Driver(dev)
    driver._agree = lambda v: max(v, 9 * MiB)  # another rank's step left 9 MiB live
    driver._measured(SHAPE, lambda: driver.step(lazy_after_peak=0), attribute=False)
    assert driver.runs == 2


def test_a_second_reading_below_the_first_does_not_lower_the_figure():
    dev = Device()
    driver = Driver(dev)
    peaks = iter([100 * MiB, 97 * MiB])  # the same step, read 3 MiB apart (noise)

    def step():
        dev.alloc(2 * MiB)  # left live every time: measured again
        p = next(peaks)
        dev.alloc(p)
        dev.alloc(-p)

    got = driver._measured(SHAPE, step, attribute=False)
    assert got.peak_bytes == 100 * MiB


def test_a_step_read_once_by_design_is_not_measured_again():
    """The encoder step (measure_after) reads above its start level itself; the stock step on
    the CPU is read three times: neither is measured again."""
    dev = Device()
    driver = Driver(dev)
    got = driver._measured(SHAPE, lambda: driver.step(lazy_after_peak=9 * MiB), attribute=False,
                           again=False)
    assert driver.runs == 1 and got.peak_bytes == 91 * MiB


def test_the_reading_that_counts_keeps_its_own_runs_figures():
    dev = Device()
    driver = Driver(dev)
    peaks = iter([100 * MiB, 97 * MiB])

    def step():
        dev.alloc(2 * MiB)
        p = next(peaks)
        dev.alloc(p)
        dev.alloc(-p)
        driver._requests.per_slot[0] = p  # the workspace this run asked for

    got = driver._measured(SHAPE, step, attribute=False)
    assert (got.peak_bytes, got.workspace_bytes) == (100 * MiB, 100 * MiB)


def _alloc(addr, size, *frames):
    return {"action": "alloc", "addr": addr, "size": size,
            "frames": [{"filename": f, "line": 1, "name": "f"} for f in frames]}


def test_leftover_sites_sums_what_no_free_follows_by_call_site():
    events = [_alloc(1, 100, "/x/torch/nn/module.py", "/x/vllm/a.py"),
              _alloc(2, 50, "/x/vllm/a.py"),
              {"action": "free_requested", "addr": 2},
              {"action": "free_completed", "addr": 2},
              _alloc(2, 30, "/x/fla/b.py"),
              _alloc(3, 7, "/x/vllm/a.py")]
    out = leftover_sites(events)
    assert out["bytes"] == 137 and out["count"] == 3
    # torch's own frames are dropped, so the two vllm/a.py allocations share a site
    assert out["sites"][0] == {"bytes": 107, "count": 2, "frames": ["/x/vllm/a.py:1 f"]}
    assert out["sites"][1]["frames"] == ["/x/fla/b.py:1 f"]


def test_leftover_sites_of_a_batch_that_freed_everything_is_empty():
    events = [_alloc(1, 100, "/x/vllm/a.py"), {"action": "free_completed", "addr": 1}]
    assert leftover_sites(events) == {"bytes": 0, "count": 0, "sites": []}


def test_the_history_diagnostic_is_off_unless_named_and_never_on_cpu(monkeypatch, tmp_path):
    assert leftover.history_dir({}) is None
    assert leftover.history_dir({leftover.HISTORY_ENV: " "}) is None
    assert leftover.history_dir({leftover.HISTORY_ENV: str(tmp_path)}) == tmp_path
    monkeypatch.setenv(leftover.HISTORY_ENV, str(tmp_path))
    assert leftover.start("cpu") is False
