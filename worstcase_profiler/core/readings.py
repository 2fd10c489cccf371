"""How one measured step is read. Pure: the meters (adapter/meters.py) and the serving probe
(adapter/guard.py) take the levels; this says what they mean.

A step's transient is its high-water mark above max(start, end): what it leaves live is
persistent (a grown workspace, a buffer created at first use), counted once in the held
memory, not again as transient. That holds where the step created it before its peak. A buffer
created after the peak was never live at it, yet taking it off the end level reads the step low
by its size: vLLM 0.33's DSpark draft metadata builders create theirs (3 MiB each at a
4,096-token budget) at the first draft, after the target forward's peak, on every fresh KV
cache, so a step measured first on one read 9 MiB below the same step built from requests.
Such a step is measured again (`measure_again`): the buffer is then in its start
level, as it is in a serving engine's. The larger of its two readings counts, so a second
reading cannot lower a figure."""

from __future__ import annotations


def step_transient(peak: int, start: int, end: int, kept: int = 0, freed: int = 0) -> int:
    """A step's transient (core/types.StepResult): its high-water mark above max(start, end),
    what it leaves live being persistent; with the encoder cache's change
    (core/multimodal.encoder_cache_change) the levels adjusted, above max(start - freed,
    end - kept). Every meter and probe reads it so (adapter/meters, adapter/guard)."""
    return max(0, peak - max(start - freed, end - kept))


def measure_again(left_bytes: int, resolution_bytes: int) -> bool:
    """Whether a step that left `left_bytes` live above its start (every rank's largest, so the
    ranks decide alike) is measured once more before its reading counts: when that is more than
    the meter resolves. Its second reading starts with whatever it created, wherever in the step
    that happened, so it reads the step as an engine that already holds them runs it; a step
    that leaves nothing is measured once."""
    return left_bytes > resolution_bytes
