from worstcase_profiler.timing import PhaseTimer


def test_phases_accumulate_and_overhead_excludes_stocks_own_work():
    clock = PhaseTimer()
    with clock("sweep"):
        pass
    clock.add("vllm_profile", 2.0)
    clock.add("measure_held", 0.25)
    clock.add("measure_held", 0.25)
    assert clock.seconds["measure_held"] == 0.5
    assert set(clock.seconds) == {"sweep", "vllm_profile", "measure_held"}
    assert clock.overhead(exclude=("vllm_profile",)) == clock.seconds["sweep"] + 0.5


def test_a_phase_that_raises_is_still_timed():
    clock = PhaseTimer()
    try:
        with clock("replay"):
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert "replay" in clock.seconds
