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


def leftover_sites(events, top: int = 20, depth: int = 8) -> dict:
    """The allocations an allocator history still holds live at its end, summed by call site: a
    history is torch's trace of events (dicts with action, addr, size, frames), recorded from a
    batch's begin, so every live allocation in it was made inside the batch. An allocation is
    live when no free of its address follows it. A call site is the innermost `depth` frames
    outside torch's own files, as "file:line name". Answers {"bytes", "count", "sites": the
    `top` largest [{"bytes", "count", "frames"}]}."""
    live: dict[int, dict] = {}
    for e in events:
        action = e.get("action")
        if action == "alloc":
            live[e["addr"]] = e
        elif action in ("free_requested", "free_completed"):
            live.pop(e.get("addr"), None)
    sites: dict[tuple, list] = {}
    for e in live.values():
        frames = tuple(f"{f.get('filename', '?')}:{f.get('line', '?')} {f.get('name', '?')}"
                       for f in e.get("frames") or ()
                       if "/torch/" not in str(f.get("filename", "")))[:depth]
        site = sites.setdefault(frames, [0, 0])
        site[0] += int(e.get("size", 0))
        site[1] += 1
    ranked = sorted(sites.items(), key=lambda kv: -kv[1][0])[:top]
    return {"bytes": sum(v[0] for v in sites.values()),
            "count": sum(v[1] for v in sites.values()),
            "sites": [{"bytes": b, "count": c, "frames": list(f)} for f, (b, c) in ranked]}
