"""One worker's start-up: the settings, what the worker is, and the phase results in order.

The adapter's three hooks each finish one phase (the profile, the KV audit, warm-up) and record
its frozen result here exactly once; nothing edits a result another part already returned. The
report is a projection of the session (report.build_report), written once per phase.
"""

from __future__ import annotations

from ..settings import ProfilerSettings
from .timing import PhaseTimer
from .types import EngineFacts, KVAudit, Phases, ProfileResult, Validation, WarmupResult


class StartupSession:
    def __init__(self, settings: ProfilerSettings, facts: EngineFacts, *, created_at: str = "",
                 clock: PhaseTimer | None = None) -> None:
        self.settings = settings
        self.facts = facts
        self.created_at = created_at
        self.clock = clock or PhaseTimer()
        self.phases = Phases()
        self.measurements: dict[str, int] = {}
        """Raw readings the adapter carries from one hook to the next (held bytes after KV
        initialisation, CUDA-graph bytes of warm-up); inputs of a later phase, not results."""

    def _set(self, name: str, value) -> None:
        if getattr(self.phases, name) not in (None, ()):
            raise RuntimeError(f"start-up phase {name!r} recorded twice")
        setattr(self.phases, name, value)

    def record_profile(self, result: ProfileResult) -> None:
        self._set("profile", result)

    def record_kv_audit(self, result: KVAudit) -> None:
        self._set("kv_audit", result)

    def record_warmup(self, result: WarmupResult) -> None:
        self._set("warmup", result)

    def record_validation(self, results: tuple[Validation, ...]) -> None:
        self._set("validation", tuple(results))

    def warn(self, message: str) -> None:
        """Warnings accumulate (they are not a phase result)."""
        self.phases.warnings = (*self.phases.warnings, message)

    @property
    def profile(self) -> ProfileResult | None:
        return self.phases.profile
