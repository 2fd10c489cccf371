"""Replay rules (core/replay_rules.py): when a validation fails and when a running replay stops
(which step a replay formed: test_guard.py; rank agreement: test_plan_identity.py)."""

from __future__ import annotations

from worstcase_profiler.core.replay_rules import replay_stops, validation_exceeded

MiB = 1024**2


def test_a_validation_fails_only_beyond_the_meters_resolution():
    from worstcase_profiler.core.types import Validation
    from worstcase_profiler.render.view import validation_text

    def v(measured, resolution):
        return Validation(measured_peak_bytes=measured, predicted_peak_bytes=100 * MiB,
                          ratio=measured / (100 * MiB), requests=("r",), seconds=1.0,
                          resolution_bytes=resolution)

    assert not validation_exceeded(v(100 * MiB, 0))
    assert validation_exceeded(v(100 * MiB + 1, 0))  # an exact meter: one byte over fails
    within = v(100 * MiB + 256 * 1024, 512 * 1024)
    assert not validation_exceeded(within)
    assert "within the meter's 512.0 KiB resolution" in validation_text(within)
    assert validation_exceeded(v(100 * MiB + 512 * 1024 + 1, 512 * 1024))
    assert "resolution" not in validation_text(v(90 * MiB, 512 * 1024))


def test_a_replay_stops_once_formed_and_one_finished_or_once_formed_when_told():
    assert replay_stops(True, 1, 4, "finished") and not replay_stops(True, 0, 4, "finished")
    assert replay_stops(True, 0, 4, "formed") and not replay_stops(False, 3, 4, "formed")
    assert not replay_stops(True, 4, 4, "formed")  # nothing left running to stop
