from worstcase_profiler.core.timing import PhaseTimer, profiler_phases


def test_phases_accumulate_and_the_profilers_own_exclude_stock_work_and_parts():
    clock = PhaseTimer()
    with clock("sweep"):
        pass
    clock.add("vllm_profile", 2.0)
    clock.add("measure_held", 0.25)
    clock.add("measure_held", 0.25)
    clock.add("measure_held.gc", 0.2)
    assert clock.seconds["measure_held"] == 0.5
    assert set(clock.seconds) == {"sweep", "vllm_profile", "measure_held", "measure_held.gc"}
    ours = profiler_phases(clock.seconds)
    assert ours == {"sweep": clock.seconds["sweep"], "measure_held": 0.5}
    assert sum(ours.values()) == clock.seconds["sweep"] + 0.5


def test_a_phase_that_raises_is_still_timed():
    clock = PhaseTimer()
    try:
        with clock("replay"):
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert "replay" in clock.seconds
