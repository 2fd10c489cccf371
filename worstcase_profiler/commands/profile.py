"""`wcprof [profile] [ENGINE ARGS] [--json P] [--html P] [--png P] [--validate]`: boot the engine
with the worst-case profiler and print the verdict (the bundled tiny model without --model).

Everything a user can get wrong before the engine starts (paths, output files, sizes, the
environment) is checked first by preflight.py, in about a second. The engine then boots
in-process with the plugin enabled (engine_boot.py); the plugin writes the report into a
temporary directory (removed on every exit), this command renders it. Its exit code follows the
report's verdict (exit_code).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path

from .. import interrupts
from ..errors import EXIT_INTERRUPTED, INTERRUPTED_LINE, ConfigError, WcprofError
from . import debugging
from .engine_boot import (TINY_DEFAULTS, build_engine_args, engine_help, engine_output,
                          one_line_tracebacks, quiet_env, start_engine)
from .profile_options import HELP_ENGINE, parse_ours, with_flag_value
from .usage import usage


CPU_KV_CAP = 512 << 20

LOG_TAIL_LINES = 40


def run(argv: list[str]) -> int:
    """boot the engine with the worst-case profiler and print the verdict"""
    if any(a in ("-h", "--help") for a in argv):
        sys.stdout.write(usage())
        return 0
    for i, a in enumerate(argv):
        if a == HELP_ENGINE and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            return engine_help(f"{a}={argv[i + 1]}")
        if a == HELP_ENGINE or a.startswith(HELP_ENGINE + "=") or a.startswith("--help="):
            return engine_help(a)
    argv, ours, sizes, advice = prepare(argv)
    # From here torch and vLLM import and the engine runs: Ctrl-C stops without raising into
    # them (interrupts.py says why), taking the engine's processes and the directory with it.
    with interrupts.exit_at_once(INTERRUPTED_LINE, EXIT_INTERRUPTED), \
            interrupts.temporary_directory("wcprof-") as tmp:
        return _profile(argv, ours, sizes, advice, tmp)


def prepare(argv: list[str]):
    """What every command that profiles checks before vLLM loads (preflight.py: paths, output
    files, sizes, weights, the picture's support, the advise flags) and the environment the
    engine starts in: (argv with --kv-cache-memory-bytes in bytes, wcprof's own flags,
    preflight's sizes, the advise settings)."""
    from .. import preflight

    ours = parse_ours(argv)
    sizes = preflight.check_profile(
        model=ours.model, outputs={"--json": ours.json, "--html": ours.html, "--png": ours.png},
        margin=ours.margin, kv_cap=ours.kv_cap, kv_cache_memory_bytes=ours.kv_cache_memory_bytes,
        additional_config=ours.additional_config)
    preflight.check_weights(ours.model, ours.load_format)
    if sizes["kv_cache_memory_bytes"] is not None:  # 6GiB as `wcprof check` reads it: bytes
        argv = with_flag_value(argv, "--kv-cache-memory-bytes",
                               str(sizes["kv_cache_memory_bytes"]))
    preflight.check_picture_support({"--html": ours.html, "--png": ours.png})
    advice = advise_settings(ours, ours.max_num_batched_tokens or (
        None if ours.model else TINY_DEFAULTS["max_num_batched_tokens"]))
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if ours.quiet:
        quiet_env()
    return argv, ours, sizes, advice


def status_of(ours):
    """A status line on stderr while `text`'s work runs (nothing under --quiet)."""
    from rich.console import Console

    err = Console(stderr=True)

    def status(text: str):
        return contextlib.nullcontext() if ours.quiet else err.status(text)

    return status


def start(argv: list[str], sizes: dict, section: dict, tmp: Path, status, tune=None):
    """Start the engine with the profiler: vLLM's flags and ours parsed (engine_boot), the
    profiler's section of --additional-config from wcprof's flags and `section` (more settings:
    profile's advise settings, fit's), checked by the loader the plugin reads it with; `tune`
    (engine_args, platform) may adjust vLLM's flags first. Returns (the parsed flags, the LLM,
    the report, the start's seconds). A start the profiler refuses raises its error after the
    report up to the refusal was written to tmp/report.json."""
    report_path = tmp / "report.json"
    with status("loading vLLM…"):
        ns, engine_args = build_engine_args(argv)
    one_line_tracebacks()
    from vllm.platforms import current_platform

    from ..settings import CONFIG_KEY, given_keys, load

    if tune is not None:
        tune(engine_args, current_platform)
    extra = dict(engine_args.additional_config or {})
    given = given_keys(extra)
    extra[CONFIG_KEY] = _settings(ns, str(report_path), current_platform.is_cpu(), sizes,
                                  section, given)
    load(additional_config=extra)  # what the engine's plugin will read: checked here
    engine_args.additional_config = extra

    t0 = time.perf_counter()
    llm = start_engine(engine_args)
    boot_s = time.perf_counter() - t0
    return ns, llm, _read_report(report_path, tmp), boot_s


def _profile(argv: list[str], ours, sizes: dict, advice: dict, tmp: Path) -> int:
    from rich.console import Console

    err = Console(stderr=True)
    quiet = ours.quiet
    log_path = tmp / "engine.log" if quiet else None
    report_path = tmp / "report.json"
    status = status_of(ours)

    try:
        with engine_output(log_path):
            ns, llm, report, boot_s = start(argv, sizes, advice, tmp, status)
            if ns.validate:
                with status("validating: the worst step from real requests, then generic "
                            "traffic…"):
                    report = with_validations(report, *validate(llm, report, ns.validate))
    except WcprofError:
        show_log_tail(log_path)
        if report_path.exists():  # the report up to the refusal: show what was seen
            from ..render.json_report import load_report

            _emit(load_report(report_path), ours)
        raise
    except BaseException:
        show_log_tail(log_path)
        raise
    _emit(report, ours)
    if not quiet:
        err.print(f"engine start with the sweep: {boot_s:.1f}s", highlight=False)
    return exit_code(report)


def _settings(ns, json_path: str, on_cpu: bool, sizes: dict, advice: dict,
              given: set[str] | frozenset = frozenset()) -> dict:
    """The profiler section of this run's --additional-config, in settings.py's precedence:
    the --additional-config section preflight checked (`sizes["section"]`), wcprof's flags on
    top (only those given: `sizes`: --margin and --kv-cap in bytes; `advice`: advise_settings),
    and wcprof's own run defaults (the guard off, the CPU's KV cap) only for keys that neither
    that section nor WCPROF_CONFIG set (`given`). The engine's plugin reads it back through the
    same loader (settings.load), on top of the environment."""
    from ..core import cache

    s = dict(sizes.get("section") or {})
    s["json_path"] = json_path
    s["max_model_len"] = None  # wcprof runs at --max-model-len, whatever WCPROF_CONFIG says
    if ns.exhaustive:
        s["exhaustive"] = True
    if ns.no_lock_workspace:
        s["lock_workspace"] = False
    for key in ("kv_audit", "sweep_depth"):
        if getattr(ns, key, None) is not None:
            s[key] = getattr(ns, key)
    if getattr(ns, "check_step", None):  # checked here: a bad step is exit 2 before the engine
        from ..core.check_steps import parse
        s["check_steps"] = [f"{r}@{c}" for r, c in parse(ns.check_step)]
    s.update(advice)
    if "guard" not in given:  # --validate reads the allocator's peak itself
        s["guard"] = "off"
    if ns.no_cache:
        s["cache_dir"] = cache.OFF
    if sizes.get("margin_bytes") is not None:
        s["margin_bytes"] = sizes["margin_bytes"]
    cap = sizes.get("kv_cap_bytes")
    if cap is None and on_cpu and "kv_cap_bytes" not in given:
        cap = CPU_KV_CAP
    if cap is not None:
        s["kv_cap_bytes"] = cap
    return s


def advise_settings(ns, max_num_batched_tokens=None) -> dict:
    """--advise, --advise-chunk, --advise-within as profiler settings; every value checked before
    the engine starts (ConfigError: one line, exit 2)."""
    from ..settings import parse_chunks, parse_within

    chunks = parse_chunks(getattr(ns, "advise_chunk", None) or (), "--advise-chunk")
    within = getattr(ns, "advise_within", None)
    if not (getattr(ns, "advise", False) or chunks or within is not None):
        return {}
    out = {"advise": True, "advise_chunks": list(chunks)}
    if within is not None:
        out["advise_within"] = parse_within(within, "--advise-within")
    if max_num_batched_tokens is not None:
        try:
            limit = int(str(max_num_batched_tokens))
        except ValueError:
            limit = None
        over = [c for c in chunks if limit is not None and c > limit]
        if over:
            raise ConfigError(f"--advise-chunk {over[0]} is above --max-num-batched-tokens "
                              f"{limit}: this engine's buffers and sweep stop there",
                              hint="profile with the larger --max-num-batched-tokens; smaller "
                                   "chunks are advised from that one run")
    return out


def show_log_tail(log_path: Path | None) -> None:
    if not (debugging() and log_path and log_path.exists()):
        return
    lines = log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-LOG_TAIL_LINES:]
    sys.stderr.write(f"--- last {len(lines)} lines of vLLM's log (--quiet) ---\n"
                     + "\n".join(lines) + "\n--- end of vLLM's log ---\n")


def validate(llm, report, which: str = "all") -> tuple[list, list[str]]:
    """--validate: the report's worst step from real requests (where an encoder step was
    measured, also that step from requests with images; each step named in check_steps too),
    then generic traffic, per rank; and a warning for each replay that could not be built,
    saying why."""
    from ..adapter.facts import limits_of
    from ..adapter.validation import validate_multimodal, validate_traffic, validate_worst_step
    from ..core.check_steps import admitted_transients, readings, with_admitted
    from ..core.multimodal import text_prediction
    from ..core.requests_plan import validation_target

    # the block the engine started with (vLLM lowers cache_config's after KV initialisation)
    limits = limits_of(llm.llm_engine.vllm_config, block_size=report.config.block_size)
    # text replays against the text sweep's figure, where an encoder step set the admitted one
    predicted = {r.rank: text_prediction(r.worstcase.peak_activation_bytes, r.worstcase.encoder_step)
                 for r in (report.ranks or [report])}
    w = report.worstcase.worst_shape  # the report's Shape is the core's
    steps = [(r.shape, r.peak_bytes) for r in report.worstcase.steps]
    target = validation_target(w, max((p for s, p in steps if s == w),
                                      default=report.worstcase.peak_activation_bytes),
                               steps, limits)
    found, skipped = [], []
    if which in ("all", "worst", "quick"):
        found += validate_worst_step(llm, predicted, limits, target,
                                     prefix_caching=limits.prefix_caching, quick=which == "quick")
    if which in ("all", "worst"):  # each named step against its own reading, per rank
        named = readings((r.rank, r.worstcase.check_steps) for r in (report.ranks or [report]))
        admitted = admitted_transients(report)
        for shape, own in named.items():
            # a rank without a report of its own gets no admitted figure: held strictly
            found += [with_admitted(v, own.get(v.rank, own.get(0, 0)), admitted[v.rank])
                      if v.rank in admitted else v
                      for v in validate_worst_step(llm, own, limits, shape, target="check-step",
                                                   prefix_caching=limits.prefix_caching)]
    encoder = report.worstcase.encoder_step
    if which in ("all", "worst") and encoder is not None:
        # the encoder step from requests with images, against the admitted figure it is in
        admitted = {r.rank: r.worstcase.peak_activation_bytes for r in (report.ranks or [report])}
        mm, why = validate_multimodal(llm, admitted, limits, encoder,
                                      prefix_caching=limits.prefix_caching, text_shape=w)
        found += mm
        if why:
            skipped.append(f"--validate: the multimodal step ({encoder.items} {encoder.modality} "
                           f"item(s) through the encoder, the admitted figure) was not built from "
                           f"requests: {why}; only the text worst step was validated, against "
                           f"the text sweep's figure")
    if which in ("all", "traffic"):
        found += validate_traffic(llm, predicted, limits)
    return found, skipped


def with_validations(report, validations, warnings=()):
    """The report (and each rank's) with the validations `--validate` measured, and its
    warnings about the replays it could not build."""
    from ..report import gating_validation, validation_model

    by_rank: dict[int, list] = {}
    for v in validations:
        by_rank.setdefault(v.rank, []).append(validation_model(v))

    def filled(rep):
        mine = by_rank.get(rep.rank, [])
        return rep.model_copy(update={"validations": mine, "validation": gating_validation(mine),
                                      "warnings": [*rep.warnings, *warnings]})

    every = [v for vs in by_rank.values() for v in vs]
    return report.model_copy(update={"ranks": [filled(r) for r in report.ranks],
                                     "validations": every, "validation": gating_validation(every),
                                     "warnings": [*report.warnings, *warnings]})


def _read_report(report_path: Path, tmp: Path):
    from ..render.json_report import load_report

    if not report_path.exists():
        raise WcprofError("the engine started but the profiler wrote no report",
                          hint="is the worstcase_profiler plugin installed in this environment? "
                               "(`pip show worstcase_profiler`; VLLM_PLUGINS must allow it)")
    report = load_report(report_path)
    others = sorted(tmp.glob("report.rank*.json"))
    if others:  # tensor/pipeline parallel: every rank measured its own budget
        report.ranks = [report.model_copy(deep=True)] + [load_report(p) for p in others]
    return report


def _emit(report, ns) -> None:
    from ..render import get_reporter

    get_reporter("terminal").write(report, sys.stdout)
    for fmt in ("json", "html", "png"):
        dest = getattr(ns, fmt, None)
        if dest:
            get_reporter(fmt).write(report, dest)
    sys.stdout.flush()


def exit_code(report) -> int:
    """profile's exit code for a finished run's report (EXIT_CODES): 0 for SAFE and STOCK UNSAFE
    (the recommended value is safe), 3 DOES NOT FIT (a start the plugin let through, in report
    mode), 1 a KV over-commit started anyway or a validation above its prediction (a named
    step's within its admitted figure only warns: core/check_steps.missed)."""
    from ..core.check_steps import fails
    from ..report import Verdict

    verdict = report.verdict
    if verdict == Verdict.DOES_NOT_FIT:
        return 3
    if verdict.severity >= 2 or any(fails(v) for v in report.validations):
        return 1
    return 0
