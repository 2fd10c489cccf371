"""`wcprof`: the report an operator runs before choosing --kv-cache-memory-bytes.

  wcprof [ENGINE ARGS] [--json P] [--html P] [--png P] [--validate]   profile (bundled tiny model
                                                                       when --model is absent)
  wcprof demo {tiny,scratch,overcommit,tile}                           bundled scenarios
  wcprof diff OLD.json NEW.json [--max-increase 5%]                    CI gate
  wcprof check REPORT.json --kv-cache-memory-bytes N                   is this flag value safe?

The engine boots in-process with the plugin enabled; the plugin writes the report, the CLI
renders it. Exit codes: 0 safe, 1 gate failed / unsafe, 2 bad input, 3 does not fit,
4 unsupported model, 5 KV over-commit.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from .core import cache
from .errors import ConfigError, WcprofError

BUNDLED = Path(__file__).parent / "data" / "tiny-llama"
TINY_DEFAULTS = {"max_model_len": 4096, "max_num_batched_tokens": 512, "max_num_seqs": 8,
                 "gpu_memory_utilization": 0.25}
CPU_KV_CAP = 512 << 20

OUR_FLAGS = ("json", "html", "png", "validate", "exhaustive", "margin", "kv_audit",
             "no_lock_workspace", "quiet", "kv_cap", "no_cache")


def _add_our_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("wcprof")
    g.add_argument("--json", metavar="PATH", help="write the report as JSON (atomically)")
    g.add_argument("--html", metavar="PATH", help="write a self-contained HTML picture")
    g.add_argument("--png", metavar="PATH", help="write the picture as PNG")
    g.add_argument("--validate", action="store_true",
                   help="replay real requests at the worst shapes and report the measured peak")
    g.add_argument("--exhaustive", action="store_true", help="execute every rows value")
    g.add_argument("--margin", metavar="SIZE", default=None, help="safety margin (default 64MiB)")
    g.add_argument("--kv-audit", choices=("error", "warn", "off"), default="error")
    g.add_argument("--no-lock-workspace", action="store_true")
    g.add_argument("--kv-cap", metavar="SIZE", default=None,
                   help="KV actually allocated by this run (default: full budget on GPU, "
                        "512MiB on CPU); the report always states the full budget")
    g.add_argument("--quiet", action="store_true", help="no vLLM logs, just the verdict")
    g.add_argument("--no-cache", action="store_true",
                   help="always run the full sweep (default: reuse a cached sweep of this exact "
                        "model/limits/kernels/device after replaying its worst step)")


def _engine_parser():
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    p = FlexibleArgumentParser(prog="wcprof", description=__doc__.split("\n\n")[0])
    EngineArgs.add_cli_args(p)
    _add_our_flags(p)
    return p


def _settings(ns, json_path: str, on_cpu: bool) -> dict:
    from .sizes import parse_size

    s = {"mode": "enforce", "json_path": json_path, "exhaustive": ns.exhaustive,
         "kv_audit": ns.kv_audit, "lock_workspace": not ns.no_lock_workspace}
    if ns.no_cache:
        s["cache_dir"] = cache.OFF
    try:
        if ns.margin is not None:
            s["margin_bytes"] = parse_size(ns.margin)
        cap = parse_size(ns.kv_cap) if ns.kv_cap else (CPU_KV_CAP if on_cpu else None)
    except ValueError as e:
        raise ConfigError(str(e)) from e
    if cap is not None:
        s["kv_cap_bytes"] = cap
    return s


def _quiet_logs() -> None:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


def build_engine_args(argv: list[str]):
    """Parse vLLM's own engine flags plus ours; fill the bundled tiny model when none is given."""
    parser = _engine_parser()
    ns = parser.parse_args(argv)
    from vllm.engine.arg_utils import EngineArgs

    if ns.model in (None, EngineArgs.model, "Qwen/Qwen3-0.6B") and "--model" not in " ".join(argv):
        ns.model = str(BUNDLED)
        ns.load_format = "dummy"
        ns.skip_tokenizer_init = True
        ns.enforce_eager = True
        for k, v in TINY_DEFAULTS.items():
            if f"--{k.replace('_', '-')}" not in " ".join(argv):
                setattr(ns, k, v)
    if getattr(ns, "profiler", None) == "default":
        raise ConfigError("wcprof always runs the worst-case profiler; drop --profiler default")
    engine_args = EngineArgs.from_cli_args(ns)
    return ns, engine_args


def profile(argv: list[str]) -> int:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if "--quiet" in argv:
        _quiet_logs()
    from rich.console import Console

    err = Console(stderr=True)
    with err.status("loading vLLM…"):
        ns, engine_args = build_engine_args(argv)
    from vllm.platforms import current_platform

    on_cpu = current_platform.is_cpu()
    tmpdir = tempfile.mkdtemp(prefix="wcprof-")
    report_path = os.path.join(tmpdir, "report.json")
    extra = dict(engine_args.additional_config or {})
    extra["worstcase_profiler"] = _settings(ns, report_path, on_cpu)
    engine_args.additional_config = extra

    from vllm import LLM

    from .adapter.facts import limits_of
    from .adapter.validation import validate_traffic, validate_worst_step
    from .render.json_report import load_report

    t0 = time.perf_counter()
    try:
        llm = LLM(**{f: getattr(engine_args, f) for f in engine_args.__dataclass_fields__})
    except Exception as e:  # the plugin's own errors may arrive wrapped by the engine: unwrap
        cause = e
        while cause is not None and not isinstance(cause, WcprofError):
            cause = cause.__cause__ or cause.__context__
        if cause is not None:
            if os.path.exists(report_path):  # the report up to the refusal: show what was seen
                _emit(load_report(report_path), ns)
            raise cause from None
        if isinstance(e, (ValueError, TypeError)):  # vLLM's own config validation
            raise ConfigError(f"vLLM refused the configuration: {e}") from None
        raise
    boot_s = time.perf_counter() - t0
    if not os.path.exists(report_path):
        raise WcprofError("the engine started but the profiler wrote no report",
                          hint="is the worstcase_profiler plugin installed in this environment? "
                               "(`pip show worstcase_profiler`; VLLM_PLUGINS must allow it)")
    report = load_report(report_path)
    others = sorted(Path(tmpdir).glob("report.rank*.json"))
    if others:  # tensor/pipeline parallel: every rank measured its own budget
        report.ranks = [report.model_copy(deep=True)] + [load_report(p) for p in others]
    if ns.validate:
        limits = limits_of(llm.llm_engine.vllm_config)
        predicted = {r.rank: r.worstcase.peak_activation_bytes for r in (report.ranks or [report])}
        w = report.worstcase.worst_shape
        from .core.types import Shape

        with err.status("validating: the worst step from real requests, then generic traffic…"):
            found = validate_worst_step(llm, predicted, limits,
                                        Shape(w.kind, w.rows, w.context_len, w.num_reqs),
                                        prefix_caching=limits.prefix_caching)
            found += validate_traffic(llm, predicted, limits)
        report = with_validations(report, found)
    _emit(report, ns)
    err.print(f"engine start with the sweep: {boot_s:.1f}s", highlight=False)
    code = 0 if report.admission.fits and (report.kv_audit is None or report.kv_audit.verdict == "ok") else 1
    if any(v.measured_peak_bytes > v.predicted_peak_bytes for v in report.validations):
        code = 1
    return code


def with_validations(report, validations):
    """The report (and each rank's) with the validations measured by `wcprof --validate`."""
    from .report import gating_validation, validation_model

    by_rank: dict[int, list] = {}
    for v in validations:
        by_rank.setdefault(v.rank, []).append(validation_model(v))

    def filled(rep):
        mine = by_rank.get(rep.rank, [])
        return rep.model_copy(update={"validations": mine, "validation": gating_validation(mine)})

    ranks = [filled(r) for r in report.ranks]
    every = [v for vs in by_rank.values() for v in vs]
    return report.model_copy(update={"ranks": ranks, "validations": every,
                                     "validation": gating_validation(every)})


def _emit(report, ns) -> None:
    from .render import get_reporter

    get_reporter("terminal").write(report, sys.stdout)
    for fmt in ("json", "html", "png"):
        dest = getattr(ns, fmt, None)
        if dest:
            get_reporter(fmt).write(report, dest)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] in SUBCOMMANDS:
            return SUBCOMMANDS[argv[0]](argv[1:])
        return profile(argv)
    except WcprofError as e:
        from rich.console import Console

        Console(stderr=True, soft_wrap=True).print(
            f"[bold red]wcprof: error:[/] {e.message}" +
            (f"\n  [yellow]->[/] {e.hint}" if e.hint else ""), markup=True, highlight=False)
        return e.exit_code
    except KeyboardInterrupt:
        return 130


def _demo(argv: list[str]) -> int:
    from .demos import run_demo

    return run_demo(argv)


def _diff(argv: list[str]) -> int:
    from .gates import diff_main

    return diff_main(argv)


def _check(argv: list[str]) -> int:
    from .gates import check_main

    return check_main(argv)


SUBCOMMANDS = {"demo": _demo, "diff": _diff, "check": _check}

if __name__ == "__main__":
    sys.exit(main())
