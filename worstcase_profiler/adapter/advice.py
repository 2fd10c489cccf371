"""The chunk advisor's measurements (the decisions are core/advise.py's).

After the sweep, on a provisional KV cache like the sweep's, this runs every step some candidate
max_num_batched_tokens forms that the sweep did not run (`core.advise.missing_shapes`), then one
timed prefill step per candidate at long context (chunk C on max_model_len - C cached tokens),
after one untimed run of the same step so that a lazily compiled kernel or a first-call
allocation is not what gets timed. Every step goes through the sweep's own StepDriver
(`driver.measure`), so it is measured, rank-agreed and workspace-recorded exactly like a sweep
step, and every rank runs the same steps in the same order (the list is a function of the
rank-agreed sweep).

From the start-up flow (adapter/startup.py): `advice.measure(driver, limits, sweep, settings,
clock)` after the sweep (None unless the `advise` setting is on); the advice itself is decided
with the admission (core/budget.decide, over core/advise.py). The measurement runs before the held
memory is read, so whatever a candidate's step grows stays inside the configured admission.
"""

from __future__ import annotations

import logging
import time

from ..core import advise as core
from ..core.shapes import Limits
from ..core.sweep import split_buildable
from ..core.timing import PhaseTimer
from ..core.types import AdviceMeasurements, SweepResult
from ..errors import WcprofError
from ..settings import ProfilerSettings
from ..sizes import fmt_tokens

log = logging.getLogger("vllm.wcprof")


def measure_candidates(driver, limits: Limits, sweep: SweepResult, candidates, *,
                       excluded=(), context_ladder: bool = True,
                       clock: PhaseTimer | None = None) -> AdviceMeasurements:
    """Run the steps the candidates need that the sweep did not run, then time one prefill step
    per candidate at long context (see the module docstring)."""
    clock = clock or PhaseTimer()
    chunks = tuple(candidates)
    missing = core.missing_shapes(limits, sweep, chunks, context_ladder=context_ladder)
    missing, skipped = split_buildable(driver, missing)
    t0 = time.perf_counter()
    with clock("advise"), driver.provisional_kv():
        steps = tuple(driver.measure(shape) for shape in missing)
        timings = []
        for chunk in chunks:
            shape = core.timing_shape(limits, chunk)
            driver.measure(shape)  # untimed: the timed run below finds its kernels ready
            timings.append(driver.measure(shape))
    seconds = time.perf_counter() - t0
    log.info("[wcprof] advice: %d candidate chunk(s) %s, %d step(s) the sweep had not run, %d "
             "timed in %.1fs", len(chunks), ", ".join(fmt_tokens(c) for c in chunks), len(steps),
             len(timings), seconds)
    return AdviceMeasurements(chunks=chunks, excluded=tuple(excluded), steps=steps,
                              timings=tuple(timings), seconds=seconds, skipped=skipped)


def measure(driver, limits: Limits, sweep: SweepResult, settings: ProfilerSettings,
            clock: PhaseTimer | None = None) -> AdviceMeasurements | None:
    """The advisor's measurements when the `advise` setting asks for them, else None."""
    if not settings.advise:
        return None
    chunks, excluded = core.candidate_chunks(limits.max_num_batched_tokens,
                                             settings.advise_chunks,
                                             max_num_seqs=limits.max_num_seqs)
    for chunk, why in excluded:
        log.warning("[wcprof] advice: chunk %s left out: %s", fmt_tokens(chunk), why)
    try:
        return measure_candidates(driver, limits, sweep, chunks, excluded=excluded,
                                  context_ladder=settings.context_ladder, clock=clock)
    except WcprofError:
        raise
    except Exception:  # noqa: BLE001 - the advice is optional: the start goes on without it
        log.warning("[wcprof] advice: measuring the candidate chunks failed; this start goes on "
                    "without advice", exc_info=True)
        return None
