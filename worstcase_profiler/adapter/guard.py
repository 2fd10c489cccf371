"""The production guard: while `vllm serve --profiler worstcase` serves, every forward step's
transient is read from the allocator and held against the prediction the start-up admitted.

Worker side (`install`, called once warm-up is done): the worker's `execute_model` and
`sample_tokens` are replaced on that one worker object (an instance swap: other engines and a
disabled profiler are untouched) by thin wrappers. A step opens when execute_model is called
with scheduled tokens and closes when it returns an output or, the usual case, when the
sample_tokens that follows returns. Per step, on the host only (no device synchronisation):

  CUDA  reset_peak_memory_stats + the allocated bytes at the start, the peak and the current
        allocated bytes at the end (the caching allocator updates these counters when a kernel
        is launched, not when it runs, so they are exact without a sync);
  CPU   the process high-water mark reset through /proc/self/clear_refs and VmRSS at the start,
        VmHWM and VmRSS at the end (the CpuMeter's instrument, without its gc.collect).

The step's transient is peak - max(start, end), the sweep's definition (core/types.StepResult),
with both levels adjusted for the encoder cache on a multimodal model (entries the step left
in it were live at its peak; entries it freed were gone before: core/multimodal.
encoder_cache_change, from a snapshot of the cache's keys and sizes before and after the step).
The figures go into a core.guard.StepLedger; a step above the prediction is counted, and the
first one is logged once, with its shape read off the scheduler's output.

How the figures reach /metrics: vLLM V1 serves /metrics from the API server process, whose
registry is prometheus_client's global REGISTRY (one API server; vllm/v1/metrics/prometheus.py),
while the workers run in the engine-core process or in worker processes of their own. Each
worker writes its ledger into a 128-byte memory-mapped file (a few aligned int64 stores per
step: no system call, no lock, no socket), in a directory named after the engine's
vllm_config.instance_id, which every process of the engine shares. In the API server, vLLM's
own PrometheusStatLogger is created once the engine is up; wrapped (`install_metrics_export`),
it registers one custom collector on REGISTRY that reads those files when /metrics is scraped.
Nothing is added to the engine's step loop or to vLLM's stats messages, and a scrape costs one
small file read per rank.

Why not the alternatives: PROMETHEUS_MULTIPROC_DIR switches every vLLM metric to multiprocess
mode and must be set before prometheus_client is imported in each process (vLLM sets it only for
--api-server-count > 1); a vllm.stat_logger_plugins entry point is loaded whether the profiler is
on or not and turns stats logging on for every AsyncLLM; carrying the figures in SchedulerStats
would need patches in the scheduler, the engine core and the output processor. With
--api-server-count > 1 (multiprocess mode) the guard still runs and logs, but its series are not
exported (said once in the log).

Settings: `guard` auto (default: on under `vllm serve`, off in-process: LLM(...), wcprof and the
benchmarks read the allocator's peak themselves, which the per-step reset would disturb), on,
off. `WCPROF_GUARD_DIR` moves the files (default: the system temp directory).
"""

from __future__ import annotations

import atexit
import functools
import logging
import mmap
import os
import struct
import sys
import tempfile
from pathlib import Path

from ..core.guard import (ABOVE, HEADROOM, HELP, LARGEST_CTX, LARGEST_REQS, LARGEST_ROWS,
                          OBSERVED, OVER_CAP, PREDICTED, PREFIX, STEPS, StepLedger, StepShape,
                          cap_rows, cap_warning_text, warning_text)
from ..core.multimodal import encoder_cache_change
from ..core.readings import step_transient
from ..settings import ProfilerSettings, resolve
from .meters import CpuMeter

log = logging.getLogger("vllm.wcprof")

ENV_DIR = "WCPROF_GUARD_DIR"
GUARD_ATTR = "_wcprof_guard"  # the StepGuard kept on the worker it wraps

FIELDS = ("magic", "version", "pid", "rank", "engine", "predicted", "available", "tolerance",
          "steps", "above", "max_need", "max_rows", "max_reqs", "max_ctx", "over_cap")
SLOT = {name: i * 8 for i, name in enumerate(FIELDS)}
SIZE = 128
MAGIC = 0x47504357  # "WCPG"
VERSION = 1
_PUT = struct.Struct("<q").pack_into
_ALL = struct.Struct(f"<{len(FIELDS)}q")
assert _ALL.size <= SIZE


# --- where the files live -----------------------------------------------------------------

def base_dir() -> Path:
    return Path(os.environ.get(ENV_DIR) or tempfile.gettempdir())


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in str(text)) or "engine"


def channel_dir(instance_id: str, base: Path | None = None) -> Path:
    """One directory per engine instance (data-parallel engines add `_dp<N>` to the id)."""
    return (base or base_dir()) / f"wcprof-guard-{os.getuid()}-{_safe(instance_id)}"


def instance_dirs(instance_id: str, base: Path | None = None) -> list[Path]:
    root = channel_dir(instance_id, base)
    return [root, *sorted(root.parent.glob(root.name + "_dp*"))]


class Channel:
    """Worker side: the ledger's figures in a small memory-mapped file (aligned int64 stores)."""

    def __init__(self, path: Path, **static: int) -> None:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, SIZE)
            self._mm = mmap.mmap(fd, SIZE)
        finally:
            os.close(fd)
        self.path = path
        for name, value in static.items():
            self.put(name, value)
        self.put("version", VERSION)
        self.put("magic", MAGIC)  # last: a reader skips a file until it is complete

    def put(self, name: str, value: int) -> None:
        _PUT(self._mm, SLOT[name], int(value))

    def close(self, unlink: bool = True) -> None:
        try:
            self._mm.close()
        except (BufferError, ValueError):
            pass
        if unlink:
            try:
                self.path.unlink()
                self.path.parent.rmdir()
            except OSError:
                pass


def read_channel(path: Path) -> dict[str, int] | None:
    """One worker's figures, or None for a file that is not (yet) a complete guard file."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(SIZE)
    except OSError:
        return None
    if len(data) < _ALL.size:
        return None
    values = dict(zip(FIELDS, _ALL.unpack_from(data)))
    if values["magic"] != MAGIC or values["version"] != VERSION:
        return None
    return values


# --- per-step probes ------------------------------------------------------------------------

class CudaProbe:
    """The caching allocator's host-side counters: no synchronisation."""

    tolerance = 0  # the allocator's counters are exact

    def __init__(self, device) -> None:
        import torch

        self._index = device.index if getattr(device, "index", None) is not None \
            else torch.cuda.current_device()
        self._reset = torch.cuda.reset_peak_memory_stats
        self._stats = torch.cuda.memory_stats_as_nested_dict
        self._base = 0

    def start(self) -> None:
        self._reset(self._index)
        self._base = self._stats(self._index)["allocated_bytes"]["all"]["current"]

    def end(self, kept: int = 0, freed: int = 0) -> int:
        a = self._stats(self._index)["allocated_bytes"]["all"]
        return step_transient(a["peak"], self._base, a["current"], kept, freed)


class CpuProbe:
    """The process high-water mark (VmHWM, reset through /proc/self/clear_refs) and VmRSS, read
    through file descriptors kept open (its cost per step has not been measured)."""

    tolerance = CpuMeter.resolution_bytes  # heap reuse below the mmap threshold

    def __init__(self) -> None:
        self._clear = os.open("/proc/self/clear_refs", os.O_WRONLY)
        self._status = os.open("/proc/self/status", os.O_RDONLY)
        self._base = 0

    def _read(self) -> tuple[int, int]:
        data = os.pread(self._status, 8192, 0)
        hwm = data.index(b"VmHWM:")
        rss = data.index(b"VmRSS:")
        return (int(data[hwm + 6:data.index(b"kB", hwm)]) << 10,
                int(data[rss + 6:data.index(b"kB", rss)]) << 10)

    def start(self) -> None:
        os.write(self._clear, b"5")
        self._base = self._read()[1]

    def end(self, kept: int = 0, freed: int = 0) -> int:
        hwm, rss = self._read()
        return step_transient(hwm, self._base, rss, kept, freed)


def make_probe(device):
    """The probe for the worker's device, or None where none works (logged)."""
    kind = getattr(device, "type", str(device))
    try:
        if kind == "cuda":
            return CudaProbe(device)
        if kind == "cpu":
            return CpuProbe()
    except (OSError, ImportError, RuntimeError) as e:
        log.warning("[wcprof] guard: no per-step memory probe on %s (%s): the guard is off", kind, e)
        return None
    log.warning("[wcprof] guard: no per-step memory probe for device %r: the guard is off", kind)
    return None


# --- the step wrapper -------------------------------------------------------------------------

def longest_context(scheduler_output) -> int:
    """The longest cached context (num_computed_tokens) among the step's requests."""
    # vllm-touch: guard-step-hook
    ctx = [int(r.num_computed_tokens) for r in scheduler_output.scheduled_new_reqs]
    ctx += [int(c) for c in scheduler_output.scheduled_cached_reqs.num_computed_tokens]
    return max(ctx, default=0)


def step_shape(scheduler_output) -> StepShape:
    """The step as the scheduler formed it (read only for the largest step and the first step
    above the prediction)."""
    # vllm-touch: guard-step-hook
    counts = dict(scheduler_output.num_scheduled_tokens)
    spec = scheduler_output.scheduled_spec_decode_tokens or {}
    ctx = [int(r.num_computed_tokens) for r in scheduler_output.scheduled_new_reqs]
    ctx += [int(c) for c in scheduler_output.scheduled_cached_reqs.num_computed_tokens]
    prefills = sum(1 for req, n in counts.items() if n > 1 + len(spec.get(req, ())))
    return StepShape(rows=int(scheduler_output.total_num_scheduled_tokens), reqs=len(counts),
                     max_context=max(ctx, default=0), prefills=prefills,
                     largest_chunk=max(counts.values(), default=0))


class StepGuard:
    """The wrappers installed on one worker, and what they keep between the two calls."""

    def __init__(self, execute, sample, probe, ledger: StepLedger, channel: Channel | None,
                 rank: int = 0, encoder_cache=None) -> None:
        self._execute = execute
        self._sample = sample
        self._probe = probe
        self._encoder_cache = encoder_cache
        """() -> the encoder cache's {key: bytes}, or None (adapter/multimodal.
        encoder_cache_snapshot); None for a text model: nothing read per step."""
        self._cache_before = None
        self.ledger = ledger
        self._channel = channel
        self._rank = rank
        self._open = None
        self._broken = False
        self.paused = False
        """Set while someone else reads the same counters over several steps (the serving
        validation's meter): the probe resets them at every step, so it stays out meanwhile."""

    def execute_model(self, scheduler_output, *args, **kwargs):
        # vllm-touch: guard-step-hook
        if self._open is not None:
            self._close()
        if self._broken or self.paused or not scheduler_output.total_num_scheduled_tokens:
            return self._execute(scheduler_output, *args, **kwargs)
        try:
            self._probe.start()
            if self._encoder_cache is not None:
                self._cache_before = self._encoder_cache()
        except Exception:  # noqa: BLE001 - the guard must never stop serving
            self._stop()
            return self._execute(scheduler_output, *args, **kwargs)
        self._open = scheduler_output
        try:
            out = self._execute(scheduler_output, *args, **kwargs)
        except BaseException:
            self._open = None
            raise
        if out is not None:
            self._close()
        return out

    def sample_tokens(self, *args, **kwargs):
        out = self._sample(*args, **kwargs)
        if self._open is not None:
            self._close()
        return out

    def _close(self) -> None:
        so, self._open = self._open, None
        try:
            kept, freed = (0, 0) if self._encoder_cache is None else encoder_cache_change(
                self._cache_before, self._encoder_cache())
            need = self._probe.end(kept, freed)
            ledger = self.ledger
            above_before = ledger.above
            largest, first = ledger.record(need)
            ch = self._channel
            if ch is not None:
                ch.put("steps", ledger.steps)
                if ledger.above != above_before:
                    ch.put("above", ledger.above)
            if largest:
                shape = ledger.largest_was(step_shape(so))
                if ch is not None:
                    ch.put("max_rows", shape.rows)
                    ch.put("max_reqs", shape.reqs)
                    ch.put("max_ctx", shape.max_context)
                    ch.put("max_need", need)
            if first:
                shape = ledger.first_above_was(need, ledger.max_shape if largest
                                               else step_shape(so))
                log.warning(warning_text(need, ledger.predicted, shape, self._rank))
            if ledger.cap:
                self._check_cap(so)
        except Exception:  # noqa: BLE001 - the guard must never stop serving
            self._stop()

    def _check_cap(self, so) -> None:
        # vllm-touch: guard-step-hook
        ledger, rows, ctx = self.ledger, int(so.total_num_scheduled_tokens), longest_context(so)
        if ledger.record_cap(rows, ctx):
            log.warning(cap_warning_text(rows, ctx, cap_rows(ledger.cap, ctx), self._rank))
        if ledger.over_cap and self._channel is not None:
            self._channel.put("over_cap", ledger.over_cap)

    def _stop(self) -> None:
        self._broken = True
        log.exception("[wcprof] guard: reading a step failed; the guard stops here (serving "
                      "goes on)")

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()


def vllm_cli_command(argv: list[str] | None = None) -> str | None:
    """The subcommand when this process is vLLM's command line: the `vllm` console script, or
    `python -m vllm.entrypoints.cli.main` (argv[0] is then that module's path), where no console
    script is installed (a PYTHONPATH install such as an air-gapped host's); else None."""
    argv = sys.argv if argv is None else argv
    if not argv:
        return None
    first = argv[0].replace(os.sep, "/")
    if os.path.basename(first) == "vllm" or first.endswith("vllm/entrypoints/cli/main.py"):
        return argv[1] if len(argv) > 1 else ""
    return None


def under_api_server(argv: list[str] | None = None) -> bool:
    """`vllm serve ...` (vllm_cli_command) or vLLM's OpenAI api_server module (child processes
    keep the parent's argv: multiprocessing restores it when it spawns, and a fork inherits it)."""
    argv = sys.argv if argv is None else argv
    if not argv:
        return False
    if vllm_cli_command(argv) == "serve":
        return True
    return "entrypoints/openai/api_server" in argv[0].replace(os.sep, "/") or \
        "vllm.entrypoints.openai.api_server" in argv


def active(settings: ProfilerSettings, argv: list[str] | None = None) -> bool:
    if not settings.enabled or settings.guard == "off":
        return False
    return settings.guard == "on" or under_api_server(argv)


def install(worker, session, settings: ProfilerSettings) -> StepGuard | None:
    """Wrap this worker's execute_model / sample_tokens (see the module docstring); None when
    the guard is off, the profile phase did not run, or the device has no probe."""
    if session is None or session.profile is None or not active(settings):
        return None
    # vllm-touch: worker-config
    if getattr(worker, GUARD_ATTR, None) is not None:
        return getattr(worker, GUARD_ATTR)
    probe = make_probe(getattr(worker, "device", "cpu"))
    if probe is None:
        return None
    prof = session.profile
    adm = prof.admission
    kv = session.phases.kv_audit.allocated_bytes if session.phases.kv_audit is not None \
        else prof.budget.budget_bytes
    cap = getattr(prof, "chunk_cap", None)
    predicted = cap.plan.transient_bytes if cap is not None else prof.sweep.peak_bytes
    ledger = StepLedger(predicted=predicted, tolerance=probe.tolerance,
                        available=adm.requested_bytes - adm.consumed_bytes
                        - adm.cudagraph_bytes - kv,
                        cap=tuple((lv.up_to_context, lv.rows) for lv in cap.plan.levels)
                        if cap is not None else ())
    rank = session.facts.rank
    vllm_config = worker.vllm_config
    engine = int(getattr(vllm_config.parallel_config, "data_parallel_rank", 0) or 0)
    channel = None
    try:
        path = channel_dir(str(vllm_config.instance_id)) / f"rank{rank}-pid{os.getpid()}.bin"
        channel = Channel(path, pid=os.getpid(), rank=rank, engine=engine,
                          predicted=ledger.predicted, available=ledger.available,
                          tolerance=ledger.tolerance)
        atexit.register(channel.close)
    except OSError as e:
        log.warning("[wcprof] guard: cannot write its figures under %s (%s): it still checks "
                    "every step and logs, but /metrics will not show it", base_dir(), e)
    from . import multimodal as mm

    config = getattr(worker, "vllm_config", None)
    cache = (functools.partial(mm.encoder_cache_snapshot, worker)
             if config is not None and mm.has_encoder(config)
             and mm.encoder_cache_snapshot(worker) is not None else None)
    guard = StepGuard(worker.execute_model, worker.sample_tokens, probe, ledger, channel, rank,
                      encoder_cache=cache)
    # vllm-touch: guard-step-hook
    worker.execute_model = guard.execute_model
    worker.sample_tokens = guard.sample_tokens
    setattr(worker, GUARD_ATTR, guard)
    log.info("[wcprof] guard on: every served step's transient is held against the predicted "
             "%d bytes (exported on /metrics as %s*)", ledger.predicted, PREFIX)
    return guard


# --- the API server side: one collector on prometheus_client's REGISTRY ---------------------

class GuardCollector:
    """Reads every worker file of one engine instance when /metrics is scraped."""

    def __init__(self, instance_id: str, base: Path | None = None) -> None:
        self.instance_id = instance_id
        self.base = base

    def describe(self):
        return []  # no names up front: the registry then never calls collect() to find them

    def records(self) -> list[dict[str, int]]:
        out = []
        for directory in instance_dirs(self.instance_id, self.base):
            for path in sorted(directory.glob("rank*.bin")):
                values = read_channel(path)
                if values is not None:
                    out.append(values)
        return sorted(out, key=lambda v: (v["engine"], v["rank"], v["pid"]))

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        records = self.records()
        if not records:
            return
        labels = ["rank", "engine"]
        gauges = {name: GaugeMetricFamily(name, HELP[name], labels=labels)
                  for name in (PREDICTED, HEADROOM, OBSERVED, LARGEST_ROWS, LARGEST_REQS,
                               LARGEST_CTX)}
        counters = {name: CounterMetricFamily(name, HELP[name], labels=labels)
                    for name in (STEPS, ABOVE, OVER_CAP)}
        for v in records:
            lv = [str(v["rank"]), str(v["engine"])]
            gauges[PREDICTED].add_metric(lv, v["predicted"])
            gauges[HEADROOM].add_metric(lv, v["available"] - v["max_need"])
            gauges[OBSERVED].add_metric(lv, v["max_need"])
            gauges[LARGEST_ROWS].add_metric(lv, v["max_rows"])
            gauges[LARGEST_REQS].add_metric(lv, v["max_reqs"])
            gauges[LARGEST_CTX].add_metric(lv, v["max_ctx"])
            counters[STEPS].add_metric(lv, v["steps"])
            counters[ABOVE].add_metric(lv, v["above"])
            counters[OVER_CAP].add_metric(lv, v["over_cap"])
        yield from gauges.values()
        yield from counters.values()


_EXPORTED: dict[str, object] = {}


def export_for(vllm_config) -> GuardCollector | None:
    """In the API server: register the collector for this engine instance (once; a new
    PrometheusStatLogger for the same engine replaces it)."""
    settings = resolve(getattr(vllm_config, "additional_config", None))
    if not settings.enabled or settings.guard == "off":
        return None
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        log.warning("[wcprof] guard: Prometheus multiprocess mode (--api-server-count > 1): the "
                    "guard checks every step and logs, but its series are not exported")
        return None
    from prometheus_client import REGISTRY

    instance = str(vllm_config.instance_id)
    old = _EXPORTED.pop("collector", None)
    if old is not None:
        try:
            REGISTRY.unregister(old)
        except KeyError:
            pass
    collector = GuardCollector(instance)
    REGISTRY.register(collector)
    _EXPORTED["collector"] = collector
    if not _EXPORTED.get("cleanup"):
        atexit.register(_remove_dirs, collector)
        _EXPORTED["cleanup"] = True
    log.info("[wcprof] guard: /metrics exports %s* for engine %s", PREFIX, instance)
    return collector


def _remove_dirs(collector: GuardCollector) -> None:
    import shutil

    for directory in instance_dirs(collector.instance_id, collector.base):
        shutil.rmtree(directory, ignore_errors=True)


def install_metrics_export() -> bool:
    """Wrap vllm.v1.metrics.loggers.PrometheusStatLogger.__init__ (idempotent): after vLLM
    builds its Prometheus metrics in the API server, register the guard's collector. A no-op
    for engines whose profiler or guard is off."""
    # vllm-touch: guard-metrics-export
    try:
        from vllm.v1.metrics.loggers import PrometheusStatLogger
    except Exception:  # noqa: BLE001 - no V1 metrics here: the guard still checks and logs
        log.debug("[wcprof] guard: vllm.v1.metrics.loggers not importable", exc_info=True)
        return False
    orig = PrometheusStatLogger.__dict__.get("__init__")
    if orig is None or getattr(orig, "_wcprof_original", None) is not None:
        return False

    @functools.wraps(orig)
    def __init__(self, vllm_config, *args, **kwargs):
        orig(self, vllm_config, *args, **kwargs)
        try:
            export_for(vllm_config)
        except Exception:  # noqa: BLE001 - metrics must never stop the server
            log.exception("[wcprof] guard: could not register its /metrics collector")

    __init__._wcprof_original = orig
    setattr(PrometheusStatLogger, "__init__", __init__)
    return True
