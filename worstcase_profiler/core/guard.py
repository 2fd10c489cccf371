"""The production guard's bookkeeping and its read-back, independent of vLLM.

While serving, each forward step's transient (the allocator's peak above the step's own
baseline, read by the adapter: adapter/guard.py) is recorded in a `StepLedger` against the
prediction the start-up admitted. The adapter exports the ledger through vLLM's /metrics as the
gauges and counters named below; `wcprof guard URL` reads them back (`parse_metrics`) and says
whether the profile held (`verdict`).

Metric names (prefix `wcprof_guard_`, one series per rank, labels `rank` and `engine`):

  predicted_need_bytes          gauge    the transient the KV budget left room for (the sweep's
                                         worst peak; the workspace is held and locked, not part
                                         of a step's rise)
  kv_headroom_bytes             gauge    memory left free at the largest observed step: what
                                         the engine may use minus everything it holds (KV cache
                                         included) minus that step's transient; the margin plus
                                         whatever the prediction over-estimates
  observed_need_bytes_max       gauge    the largest transient of any served step
  largest_step_rows / _reqs / _context_tokens   gauges: that step's shape
  steps_total                   counter  forward steps observed
  steps_above_prediction_total  counter  steps whose transient exceeded the prediction
  steps_over_chunk_cap_total    counter  with the chunk_cap setting: steps holding more tokens
                                         than the cap allows at their longest request's context
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..sizes import fmt_bytes, fmt_tokens

PREFIX = "wcprof_guard_"
PREDICTED = PREFIX + "predicted_need_bytes"
HEADROOM = PREFIX + "kv_headroom_bytes"
OBSERVED = PREFIX + "observed_need_bytes_max"
LARGEST_ROWS = PREFIX + "largest_step_rows"
LARGEST_REQS = PREFIX + "largest_step_reqs"
LARGEST_CTX = PREFIX + "largest_step_context_tokens"
STEPS = PREFIX + "steps"  # a counter: exposed as ..._total
ABOVE = PREFIX + "steps_above_prediction"  # a counter: exposed as ..._total
OVER_CAP = PREFIX + "steps_over_chunk_cap"  # a counter: exposed as ..._total

HELP = {
    PREDICTED: "transient bytes the worst-case KV budget left room for (the sweep's worst peak)",
    HEADROOM: "bytes left free at the largest observed step: the margin plus what the "
              "prediction over-estimates (negative: the step used memory nobody set aside)",
    OBSERVED: "largest transient (allocator peak above the step's baseline) of any served step",
    LARGEST_ROWS: "rows (scheduled tokens) of the step with the largest transient",
    LARGEST_REQS: "requests in the step with the largest transient",
    LARGEST_CTX: "longest cached context among that step's requests (tokens)",
    STEPS: "forward steps the guard observed",
    ABOVE: "forward steps whose transient exceeded the prediction",
    OVER_CAP: "forward steps holding more tokens than the chunk cap allows at their longest "
              "request's context (only with the chunk_cap setting)",
}


@dataclass(frozen=True)
class StepShape:
    """A served step as the scheduler formed it."""

    rows: int
    reqs: int
    max_context: int = 0
    prefills: int = 0
    largest_chunk: int = 0

    def label(self) -> str:
        return (f"rows={self.rows} reqs={self.reqs} ({self.prefills} prefill, largest chunk "
                f"{self.largest_chunk}; {self.reqs - self.prefills} decode) max ctx="
                f"{self.max_context}")


def frontier_add(frontier: list[StepShape], step: StepShape) -> list[StepShape]:
    """The steps no other matches or exceeds in rows, requests and context at once (the Pareto
    frontier over the three), with `step` added. What a replay formed, kept small: a step that
    covers a target's rows, requests and context is on it, or dominated by one that is."""
    def covers(a: StepShape, b: StepShape) -> bool:
        return a.rows >= b.rows and a.reqs >= b.reqs and a.max_context >= b.max_context

    if any(covers(s, step) for s in frontier):
        return frontier
    return [s for s in frontier if not covers(step, s)] + [step]


@dataclass
class StepLedger:
    """One rank's running figures. `available` is what the engine may use minus everything it
    holds once the KV cache is allocated: the room a step's transient has. A step is above the
    prediction when its transient exceeds `predicted` + `tolerance` (the meter's noise: 0 for
    the CUDA allocator, which is exact)."""

    predicted: int
    available: int
    tolerance: int = 0
    steps: int = 0
    above: int = 0
    max_need: int = 0
    max_shape: StepShape | None = None
    first_above: tuple[int, StepShape] | None = None
    cap: tuple[tuple[int, int], ...] = ()
    """The chunk cap's levels ((up_to_context, rows), ...); empty without the cap."""
    over_cap: int = 0

    def record_cap(self, rows: int, longest_context: int) -> bool:
        """Count a step over the cap; True for the first one (the caller logs it)."""
        if not self.cap or rows <= cap_rows(self.cap, longest_context):
            return False
        self.over_cap += 1
        return self.over_cap == 1

    @property
    def headroom(self) -> int:
        return self.available - self.max_need

    def record(self, need: int) -> tuple[bool, bool]:
        """Count one step of transient `need`: (is it the largest so far, is it the first step
        above the prediction). The caller fills `max_shape` / `first_above` only then, so the
        shape is read off the scheduler's output at most on those steps."""
        self.steps += 1
        largest = need > self.max_need
        if largest:
            self.max_need = need
        first = False
        if need > self.predicted + self.tolerance:
            self.above += 1
            first = self.above == 1
        return largest, first

    def largest_was(self, shape: StepShape) -> StepShape:
        self.max_shape = shape
        return shape

    def first_above_was(self, need: int, shape: StepShape) -> StepShape:
        self.first_above = (need, shape)
        return shape


def cap_rows(levels, context: int) -> int:
    """rows(ctx) of the chunk cap (core/chunk_cap.rows_at)."""
    from .chunk_cap import rows_at

    return rows_at(levels, context)


def cap_warning_text(rows: int, context: int, allowed: int, rank: int = 0) -> str:
    return (f"[wcprof] guard: a served step held {rows} tokens with a request at {context} "
            f"cached tokens, where the chunk cap allows {allowed}, rank {rank}; later ones are "
            f"counted in {OVER_CAP}_total, not logged")


def warning_text(need: int, predicted: int, shape: StepShape | None, rank: int = 0) -> str:
    where = f" ({shape.label()})" if shape is not None else ""
    return (f"[wcprof] guard: a served step needed {fmt_bytes(need)} of transient memory, "
            f"{fmt_bytes(need - predicted)} above the {fmt_bytes(predicted)} the KV budget left "
            f"room for{where}, rank {rank}; later ones are counted in "
            f"{ABOVE}_total, not logged")


# --- read-back: /metrics text -> figures -> one verdict line ---------------------------------

@dataclass
class GuardFigures:
    """One rank's guard series as scraped."""

    rank: str
    engine: str = "0"
    values: dict[str, float] = field(default_factory=dict)

    def get(self, name: str) -> int:
        return int(self.values.get(name, 0))

    @property
    def predicted(self) -> int:
        return self.get(PREDICTED)

    @property
    def observed(self) -> int:
        return self.get(OBSERVED)

    @property
    def steps(self) -> int:
        return self.get(STEPS + "_total")

    @property
    def above(self) -> int:
        return self.get(ABOVE + "_total")

    @property
    def headroom(self) -> int:
        return self.get(HEADROOM)

    @property
    def over_cap(self) -> int:
        return self.get(OVER_CAP + "_total")

    @property
    def ratio(self) -> float:
        return self.observed / self.predicted if self.predicted else 0.0


_SAMPLE = re.compile(r'^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+'
                     r'(?P<value>[-+0-9.eE]+|NaN|[-+]?Inf)(?:\s+\d+)?\s*$')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> list[GuardFigures]:
    """The guard's series in a Prometheus text exposition, one entry per (engine, rank),
    ordered. Other metrics are ignored."""
    found: dict[tuple[str, str], GuardFigures] = {}
    for line in text.splitlines():
        if not line.startswith(PREFIX):
            continue
        m = _SAMPLE.match(line.strip())
        if m is None or m["name"].endswith("_created"):
            continue
        labels = dict(_LABEL.findall(m["labels"] or ""))
        key = (labels.get("engine", "0"), labels.get("rank", "0"))
        figs = found.setdefault(key, GuardFigures(rank=key[1], engine=key[0]))
        try:
            figs.values[m["name"]] = float(m["value"])
        except ValueError:
            continue
    return [found[k] for k in sorted(found, key=lambda k: (_num(k[0]), _num(k[1])))]


def _num(text: str) -> tuple[int, str]:
    return (int(text), "") if text.isdigit() else (1 << 30, text)


def verdict(figures: list[GuardFigures]) -> tuple[bool, str]:
    """(held, one line): held when no step of any rank exceeded its prediction."""
    if not figures:
        return True, "no wcprof guard metrics found"
    steps = max(f.steps for f in figures)
    above = sum(f.above for f in figures)
    top = max(figures, key=lambda f: (f.ratio, f.observed))
    ranks = f" (rank {top.rank}{'' if top.engine == '0' else f', engine {top.engine}'})" \
        if len(figures) > 1 else ""
    largest = (f"largest step {fmt_bytes(top.observed)} of predicted {fmt_bytes(top.predicted)}"
               f" ({top.ratio:.1%}){ranks}")
    if top.observed == 0:  # short steps on the CPU: nothing above the meter's noise yet
        largest = (f"no step yet needed memory above its start that the meter resolves "
                   f"(predicted {fmt_bytes(top.predicted)}; long prompts will)")
    shape = ""
    if top.get(LARGEST_ROWS):
        shape = (f" at rows={fmt_tokens(top.get(LARGEST_ROWS))} reqs={top.get(LARGEST_REQS)} "
                 f"ctx={fmt_tokens(top.get(LARGEST_CTX))}")
    if steps == 0:
        return True, "the guard has observed no steps yet"
    over = sum(f.over_cap for f in figures)
    if over:
        return False, (f"the chunk cap did NOT hold: {over} step(s) over the cap over {steps} "
                       f"steps; {largest}{shape}")
    if above:
        return False, (f"the profile did NOT hold: {above} step(s) above the prediction over "
                       f"{steps} steps; {largest}{shape}")
    return True, (f"the profile held over {steps} steps: {largest}{shape}; KV headroom "
                  f"{fmt_bytes(min(f.headroom for f in figures))}")
