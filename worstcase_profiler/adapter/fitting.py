"""The fit's measurements (the decisions are core/fit.py's).

After the sweep and the chunk advisor's steps, on a provisional KV cache like the sweep's, this
runs one step per shape family some fit candidate forms that neither measured
(`core.fit.missing_shapes`: at the swept max_model_len, the most requests first, so that one step
covers its family's shorter and smaller members). Every step goes through the sweep's own
StepDriver (`driver.measure`): measured, rank-agreed and workspace-recorded exactly like a sweep
step, in the same order on every rank (the list is a function of the rank-agreed sweep and
advice).

From the start-up flow (adapter/startup.py): `fitting.measure(driver, limits, sweep, advice,
settings, clock)` after the advisor's measurements (None unless the `fit` setting is on); the fit
itself is decided with the admission (core/budget.decide, over core/fit.py). It runs before the
held memory is read, so whatever its steps grow stays inside the configured admission.
"""

from __future__ import annotations

import logging
import time

from ..core import advise as core_advise
from ..core import fit as core
from ..core.shapes import Limits
from ..core.sweep import split_buildable
from ..core.timing import PhaseTimer
from ..core.types import AdviceMeasurements, FitMeasurements, SweepResult
from ..errors import WcprofError
from ..settings import MAX_MODEL_LEN_AUTO, ProfilerSettings

log = logging.getLogger("vllm.wcprof")


def measure_fit(driver, limits: Limits, sweep: SweepResult, chunks, seqs, *,
                advice: AdviceMeasurements | None = None,
                clock: PhaseTimer | None = None) -> FitMeasurements:
    """Run the steps the fit's candidates need that the sweep and the advisor did not run."""
    clock = clock or PhaseTimer()
    chunks, seqs = tuple(chunks), tuple(seqs)
    known = [sweep.stock, *sweep.steps, *sweep.context_curve]
    if advice is not None:
        known += [*advice.steps, *advice.timings]
    missing = core.missing_shapes(limits, sweep, known, chunks, seqs)
    missing, skipped = split_buildable(driver, missing)
    t0 = time.perf_counter()
    with clock("fit"), driver.provisional_kv():
        steps = tuple(driver.measure(shape) for shape in missing)
    seconds = time.perf_counter() - t0
    log.info("[wcprof] fit: chunks %s x max_num_seqs %s, %d step(s) the sweep and the advisor had "
             "not run, in %.1fs", ", ".join(map(str, chunks)), ", ".join(map(str, seqs)),
             len(steps), seconds)
    return FitMeasurements(chunks=chunks, seqs=seqs, steps=steps, seconds=seconds,
                           skipped=skipped)


def measure(driver, limits: Limits, sweep: SweepResult, advice: AdviceMeasurements | None,
            settings: ProfilerSettings, clock: PhaseTimer | None = None
            ) -> FitMeasurements | None:
    """The fit's measurements when the `fit` setting asks for them, else None. Its chunks are
    the advisor's (when it ran), else the same candidates the advisor would weigh. With
    max_model_len auto alone (no `fit`): the engine's own chunk and max_num_seqs, the only ones
    the choice of a max_model_len weighs (core/fit.apply_longest)."""
    if not settings.fit:
        if settings.max_model_len != MAX_MODEL_LEN_AUTO:
            return None
        chunks, seqs = (limits.max_num_batched_tokens,), (limits.max_num_seqs,)
    else:
        chunks = advice.chunks if advice is not None else core_advise.candidate_chunks(
            limits.max_num_batched_tokens, settings.advise_chunks,
            max_num_seqs=limits.max_num_seqs)[0]
        seqs = core.seqs_candidates(limits.max_num_seqs, settings.fit_min_concurrency)
    try:
        return measure_fit(driver, limits, sweep, chunks, seqs, advice=advice, clock=clock)
    except WcprofError:
        raise
    except Exception:  # noqa: BLE001 - the fit is optional for the start: it goes on without it
        log.warning("[wcprof] fit: measuring the candidates failed; %s",
                    "max_model_len auto has no length to choose: the start is refused"
                    if settings.max_model_len == MAX_MODEL_LEN_AUTO
                    else "this start goes on without a fit", exc_info=True)
        return None
