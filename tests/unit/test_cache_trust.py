"""Cache trust (core/cache_trust.py): whether a cached sweep, replayed now, may stand in for a full
sweep, and the figures a cached start admits with. Round numbers, so each expectation can be
checked by hand."""

from __future__ import annotations

import pytest

from worstcase_profiler.core.cache_trust import (cache_verdict, reuse_consumed, reuse_transient,
                                                 still_worst)

GiB = 1024**3
MiB = 1024**2


@pytest.mark.parametrize("measured,valid", [
    (GiB, True),                      # same
    (GiB + GiB // 50, True),          # +2%: within the allowance
    (GiB + GiB // 50 + 1, False),     # just past it: needs a new sweep
    (GiB - GiB // 10, True),          # needing less is the safe direction
    (GiB - GiB // 10 - 1, False),     # far less: another build
])


def test_cache_verdict_bounds(measured, valid):
    ok, allowed = cache_verdict(GiB, measured, tolerance=MiB)
    assert ok is valid
    assert allowed == GiB // 50


def test_cache_verdict_allowance_is_at_least_the_meter_tolerance():
    ok, allowed = cache_verdict(10 * MiB, 10 * MiB + 3 * MiB, tolerance=4 * MiB)
    assert ok and allowed == 4 * MiB


def test_still_worst_catches_a_forged_small_worst_step():
    assert still_worst(GiB, [GiB // 2, GiB + MiB], allowed=MiB)
    assert not still_worst(GiB // 4, [GiB // 2], allowed=MiB)
    assert still_worst(GiB, [], allowed=0)


def test_reuse_transient_same_config_same_answer_else_the_larger():
    assert reuse_transient(GiB, GiB + MiB // 4, resolution=MiB // 2) == GiB
    assert reuse_transient(GiB, GiB - 50 * MiB, resolution=MiB // 2) == GiB
    assert reuse_transient(GiB, GiB + 5 * MiB, resolution=MiB // 2) == GiB + 5 * MiB


def test_reuse_consumed_keeps_the_cached_figure_when_the_baseline_matches():
    kw = dict(cached_baseline=10 * GiB, cached_consumed=10 * GiB + 300 * MiB,
              resolution=MiB // 2)
    assert reuse_consumed(baseline_now=10 * GiB, replay_residue=10 * MiB, **kw) \
        == (10 * GiB + 300 * MiB, True)


def test_a_baseline_a_little_below_the_cached_one_keeps_the_cached_figure():
    """Starts of one configuration read baselines a resolution or two apart: below, the cached
    (larger) figure stands, so the restart admits what the cold start did; far below, measured."""
    kw = dict(cached_baseline=10 * GiB, cached_consumed=10 * GiB + 300 * MiB,
              resolution=MiB // 2, replay_residue=10 * MiB)
    assert reuse_consumed(baseline_now=10 * GiB - 900 * 1024, **kw) == (10 * GiB + 300 * MiB, True)
    assert reuse_consumed(baseline_now=10 * GiB - 2 * MiB, **kw) == (10 * GiB + 300 * MiB, True)
    assert reuse_consumed(baseline_now=10 * GiB - 3 * MiB, **kw).bytes == 10 * GiB - 3 * MiB + 300 * MiB
    assert reuse_consumed(baseline_now=10 * GiB + MiB, **kw) == (10 * GiB + MiB + 300 * MiB, False)


def test_reuse_consumed_adds_the_sweeps_residue_to_a_moved_baseline():
    kw = dict(cached_baseline=10 * GiB, cached_consumed=10 * GiB + 300 * MiB,
              resolution=MiB // 2)
    # this node holds 1 GiB more before the replay: the residue rides on top of it
    assert reuse_consumed(baseline_now=11 * GiB, replay_residue=10 * MiB, **kw) \
        == (11 * GiB + 300 * MiB, False)
    # the replay itself left more than the sweep did: that is counted, never less
    assert reuse_consumed(baseline_now=10 * GiB, replay_residue=400 * MiB, **kw) \
        == (10 * GiB + 400 * MiB, False)


def test_a_replay_that_left_more_never_lowers_the_held_figure_below_the_cached_one():
    """A baseline within the window below the cached one and a replay that left a little more
    than the sweep did (past one resolution): own baseline plus that residue reads below the
    cached figure, which then stands; the cold start's admission is never beaten."""
    res = MiB // 2
    kw = dict(cached_baseline=10 * GiB, cached_consumed=10 * GiB + 300 * MiB, resolution=res)
    low = 10 * GiB - 4 * res
    got = reuse_consumed(baseline_now=low, replay_residue=300 * MiB + res + res // 10, **kw)
    assert got == (10 * GiB + 300 * MiB, False)
    # ...and where its own figure is above, that counts
    high = reuse_consumed(baseline_now=10 * GiB, replay_residue=300 * MiB + 2 * MiB, **kw)
    assert high == (10 * GiB + 302 * MiB, False)


def test_a_hits_line_says_how_far_its_held_memory_moved_and_what_was_counted():
    """The report's cache line (and the start-up log) name a moved held figure and whether the
    cached one stood, and say nothing where it did not move."""
    from worstcase_profiler.core.types import CacheUse
    from worstcase_profiler.render.view import cache_text

    hit = dict(status="hit", cached_at="then", cached_need_bytes=GiB, replayed_need_bytes=GiB,
               allowed_drift_bytes=MiB, replay_seconds=1.0, trust="signed")
    assert "than when cached" not in cache_text(CacheUse(**hit, held_moved_bytes=0, held_kept=True))
    assert "than when cached" not in cache_text(CacheUse(**hit))
    assert "held 300.0 KiB more than when cached (the cached held figure stands)" in \
        cache_text(CacheUse(**hit, held_moved_bytes=300 * 1024, held_kept=True))
    assert "held 560.0 KiB more than when cached (counted: this start's own held memory" in \
        cache_text(CacheUse(**hit, held_moved_bytes=560 * 1024, held_kept=False))
    assert "held 3.00 MiB less than when cached" in \
        cache_text(CacheUse(**hit, held_moved_bytes=-3 * MiB, held_kept=False))


def test_a_hits_line_says_when_the_replay_raised_the_transient():
    """A replayed step that read beyond the meter's tolerance raises the admitted transient
    (core/sweep.reused); the cache line says by how much, and nothing where it did not."""
    from worstcase_profiler.core.types import CacheUse
    from worstcase_profiler.render.view import cache_text

    hit = dict(status="hit", cached_at="then", cached_need_bytes=GiB, replayed_need_bytes=GiB,
               allowed_drift_bytes=MiB, replay_seconds=1.0, trust="signed")
    assert "transient raised" not in cache_text(CacheUse(**hit, transient_raised_bytes=0))
    assert "transient raised" not in cache_text(CacheUse(**hit))
    assert "transient raised 648.0 KiB by the replay" in \
        cache_text(CacheUse(**hit, transient_raised_bytes=648 * 1024))
