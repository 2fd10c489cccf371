"""Wall time of the profiler's start-up phases in one worker, so its cost at every engine start
can be read phase by phase (report.startup_seconds) rather than guessed from the total."""

from __future__ import annotations

import time
from contextlib import contextmanager


class PhaseTimer:
    """Accumulates seconds per named phase; `with timer("sweep"): ...`."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - t0)

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = round(self.seconds.get(name, 0.0) + seconds, 4)


def profiler_phases(phases: dict[str, float]) -> dict[str, float]:
    """The profiler's own top-level phases: not stock vLLM's (`vllm_*`) and not the parts of
    another phase (`a.b` is part of `a`). Their sum is what the profiler added to a start."""
    return {k: v for k, v in phases.items() if not k.startswith("vllm_") and "." not in k}
