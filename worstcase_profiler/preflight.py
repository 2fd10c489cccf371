"""Checks that run before any model loads, so a mistake costs a second, not an engine start.

Pure: no vLLM, no torch (huggingface_hub is imported only to look a repo id up in the local
cache). Every failure raises errors.ConfigError whose message says what is wrong and whose hint
says what to do; `wcprof` prints it as one line and exits 2.

  check_model(model)                 a local path exists and holds a readable config.json; a
                                     Hugging Face repo id is reachable (offline: cached)
  check_output(path, flag)           a report destination is a file name in a writable directory
  check_outputs({flag: path})        the same for several, and no two the same file
  check_picture_support({flag: path}) --html/--png need matplotlib
  check_size / check_engine_bytes    our --margin/--kv-cap, vLLM's --kv-cache-memory-bytes
  check_env(environ)                 WCPROF_PROFILER, WCPROF_CONFIG (settings.from_env)
  check_profile(...)                 everything `wcprof` (profile) needs, in that order, and
                                     WCPROF_REPLAY_STOP (settings.replay_stop: --validate's)
  check_serve(settings)              `vllm serve --profiler worstcase`: the report path
  check_serve_args(profiler, report, additional_config)
                                     the serve flags + environment, resolved, then check_serve
  die(error)                         one line on stderr and exit (for callers outside `wcprof`)
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any, Mapping, NoReturn
from urllib.parse import urlparse

from .errors import ConfigError, WcprofError
from .settings import (CONFIG_KEY, PROFILER_CHOICES, ProfilerSettings, from_env, from_mapping,
                       load, parse_additional_config, replay_stop, section_of)
from .sizes import parse_size

_TRUE = ("1", "true", "yes", "on")
# A Hugging Face repo id: "name" or "namespace/name" (letters, digits, - _ .), at most 96 chars.
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")
# vLLM's human_readable_int: 4G = 4 GiB, 4g = 4e9; plain integers.
_VLLM_INT = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")
_VLLM_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_VLLM_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
NETWORK_TIMEOUT_S = 3.0


# --------------------------------------------------------------------------------------------
# the model
# --------------------------------------------------------------------------------------------

def check_model(model: str | os.PathLike | None, environ: Mapping[str, str] | None = None) -> None:
    """A local model directory with a valid config.json, a .gguf file, or a Hugging Face repo id
    that can be fetched (in the local cache when HF_HUB_OFFLINE is set, else a reachable hub).
    None (the bundled model) and URIs (s3://...) are left to vLLM."""
    if model is None:
        return
    env = os.environ if environ is None else environ
    text = str(model).strip()
    if not text:
        raise ConfigError("--model is empty", hint="pass a model directory or a Hugging Face id")
    if "://" in text:
        return
    path = Path(text).expanduser()
    if path.exists():
        if path.is_dir():
            _check_model_dir(path)
        elif path.suffix.lower() != ".gguf":
            raise ConfigError(f"--model {text} is a file, not a model directory",
                              hint="pass the directory that holds the model's config.json "
                                   "(or a .gguf file)")
        return
    if looks_like_repo_id(text) and not text.startswith(("~", ".")):
        _check_hub(text, env)
        return
    if ":" in text and looks_like_repo_id(text.split(":", 1)[0]):
        return  # repo:quantisation (GGUF on the hub): vLLM's own syntax
    raise ConfigError(f"--model {text}: no such file or directory",
                      hint="pass a local model directory (the one holding config.json) or a "
                           "Hugging Face repo id such as Qwen/Qwen3-0.6B; without --model wcprof "
                           "profiles its bundled tiny model")


# --load-format values that read weight files from the model directory (the others: dummy,
# loaders of their own such as runai_streamer, tensorizer, bitsandbytes, are left to vLLM).
_FILE_FORMATS = (None, "auto", "safetensors", "pt", "fastsafetensors", "npcache")
_WEIGHT_GLOBS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf")


def check_weights(model: str | os.PathLike | None, load_format: str | None) -> None:
    """A local model directory loaded from its files (no --load-format dummy) holds weight files
    (*.safetensors, *.bin, *.pt): without them vLLM fails after seconds of start-up with an
    error that reads as internal. None (the bundled model), hub ids and files pass."""
    if model is None or load_format not in _FILE_FORMATS:
        return
    path = Path(str(model).strip()).expanduser()
    if not path.is_dir():
        return
    if any(next(path.glob(g), None) is not None for g in _WEIGHT_GLOBS):
        return
    raise ConfigError(f"--model {model}: no weight files (*.safetensors, *.bin, *.pt) in this "
                      f"directory",
                      hint="pass the directory that holds the weights, or profile without them "
                           "with --load-format dummy (random weights: the memory figures are "
                           "the same)")


def looks_like_repo_id(text: str) -> bool:
    return (len(text) <= 96 and _REPO_ID.fullmatch(text) is not None
            and "--" not in text and ".." not in text)


def _check_model_dir(path: Path) -> None:
    config = path / "config.json"
    if not config.is_file():
        if (path / "params.json").is_file():
            return  # Mistral format (--config-format mistral)
        raise ConfigError(f"--model {path}: no config.json in this directory",
                          hint="pass the directory that holds the model's config.json (for a "
                               "Hugging Face cache: .../snapshots/<revision>)")
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"cannot read {config}: {e.strerror or e}",
                          hint="check the file's permissions") from e
    except UnicodeDecodeError as e:
        raise ConfigError(f"{config} is not valid JSON (not UTF-8 text)",
                          hint="repair or re-download the model's config.json") from e
    except json.JSONDecodeError as e:
        raise ConfigError(f"{config} is not valid JSON ({e.msg} at line {e.lineno} column "
                          f"{e.colno})",
                          hint="repair or re-download the model's config.json") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{config} is not a model config (a JSON {type(data).__name__}, "
                          f"not an object)", hint="repair or re-download the model's config.json")
    if not data.get("model_type") and not data.get("architectures"):
        raise ConfigError(f"{config} names neither model_type nor architectures",
                          hint="a Hugging Face config.json says which model it is; repair or "
                               "re-download it")


def _offline(env: Mapping[str, str]) -> bool:
    return any(str(env.get(k, "")).strip().lower() in _TRUE
               for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _in_hf_cache(repo_id: str, env: Mapping[str, str]) -> bool | None:
    """True/False: config.json of repo_id is / is not in the local HF cache; None: cannot tell."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        found = try_to_load_from_cache(repo_id, "config.json",
                                       cache_dir=env.get("HF_HUB_CACHE") or None)
    except Exception:  # noqa: BLE001 - an unreadable cache is vLLM's to report
        return None
    return isinstance(found, str)


def _hub_reachable(env: Mapping[str, str]) -> tuple[bool, str]:
    endpoint = env.get("HF_ENDPOINT") or "https://huggingface.co"
    url = urlparse(endpoint)
    host = url.hostname or "huggingface.co"
    if any(env.get(k) for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True, host  # through a proxy: a direct connection says nothing
    port = url.port or (80 if url.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=NETWORK_TIMEOUT_S).close()
    except OSError:
        return False, host
    return True, host


def _check_hub(repo_id: str, env: Mapping[str, str]) -> None:
    if any(str(env.get(k, "")).strip().lower() in _TRUE for k in ("VLLM_USE_MODELSCOPE",)):
        return
    cached = _in_hf_cache(repo_id, env)
    if cached:
        return
    fetch = (f"download it where the network reaches (`hf download {repo_id} --local-dir DIR`) "
             f"and pass --model DIR")
    if _offline(env):
        raise ConfigError(f"--model {repo_id} is not a local path and HF_HUB_OFFLINE is set, "
                          f"but it is not in the Hugging Face cache",
                          hint=f"check the path, unset HF_HUB_OFFLINE, or {fetch}")
    ok, host = _hub_reachable(env)
    if not ok:
        raise ConfigError(f"--model {repo_id} is not a local path and {host} cannot be reached "
                          f"to download it", hint=f"check the path, or {fetch}")


# --------------------------------------------------------------------------------------------
# output destinations
# --------------------------------------------------------------------------------------------

def check_output(path: str | os.PathLike, flag: str) -> Path:
    """`path` can be written: not a directory, in a directory that exists or can be created and
    accepts a new file (tried: a probe file is created and removed; directories created for the
    probe are removed again). "-" (stdout) passes. Returns the path."""
    text = str(path)
    if text == "-":
        return Path(text)
    if not text.strip():
        raise ConfigError(f"{flag} needs a file name", hint=f"e.g. {flag} report{_ext(flag)}")
    p = Path(text).expanduser()
    if p.is_dir():
        raise ConfigError(f"{flag} {text} is a directory",
                          hint=f"give a file name, e.g. {flag} {p / ('report' + _ext(flag))}")
    parent = Path(os.path.abspath(p)).parent
    missing: list[Path] = []
    existing = parent
    while not existing.exists() and existing != existing.parent:
        missing.append(existing)
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"{flag} {text}: {existing} is a file, not a directory",
                          hint="choose a path inside a directory")
    created: list[Path] = []
    where = existing
    try:
        for d in reversed(missing):
            where = d
            d.mkdir()
            created.append(d)
        where = parent
        fd, probe = tempfile.mkstemp(dir=parent, prefix=".wcprof-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise ConfigError(f"{flag} {text}: cannot write in {where}: {e.strerror or e}",
                          hint="choose a writable directory (check its permissions, free space "
                               "and whether it is a read-only mount)") from e
    finally:
        for d in reversed(created):
            try:
                d.rmdir()
            except OSError:
                pass
    return p


def _ext(flag: str) -> str:
    for ext in ("json", "html", "png"):
        if ext in flag:
            return "." + ext
    return ".json"


def check_outputs(destinations: Mapping[str, Any]) -> None:
    """{flag: path or None}: each writable, no two the same file."""
    seen: dict[str, str] = {}
    for flag, path in destinations.items():
        if path is None:
            continue
        check_output(path, flag)
        if str(path) == "-":
            continue
        key = os.path.realpath(os.path.expanduser(str(path)))
        if key in seen:
            raise ConfigError(f"{seen[key]} and {flag} name the same file {path}",
                              hint="give each output its own file name")
        seen[key] = flag


def check_picture_support(destinations: Mapping[str, Any]) -> None:
    """--html/--png draw with matplotlib (the `picture` extra): say so before the engine runs."""
    wanted = [flag for flag, path in destinations.items() if path]
    if wanted and importlib.util.find_spec("matplotlib") is None:
        raise ConfigError(f"{' and '.join(wanted)} need matplotlib, which is not installed",
                          hint="pip install 'worstcase_profiler[picture]' (make demo and make "
                               "test install it)")


# --------------------------------------------------------------------------------------------
# sizes
# --------------------------------------------------------------------------------------------

def check_size(value: Any, flag: str, *, allow_zero: bool = True) -> int | None:
    """Our sizes (--margin, --kv-cap): bytes or a unit (512MiB, 4GiB, 8G). None passes."""
    if value is None:
        return None
    text = str(value).strip()
    if text.startswith("-"):
        raise ConfigError(f"{flag} {text}: a size cannot be negative",
                          hint=f"use bytes or a unit, e.g. {flag} 512MiB")
    try:
        size = parse_size(text)
    except ValueError as e:
        raise ConfigError(f"bad {flag}: {e}") from e
    if size == 0 and not allow_zero:
        raise ConfigError(f"{flag} {text}: must be more than 0 bytes",
                          hint=f"use bytes or a unit, e.g. {flag} 512MiB")
    return size


def check_engine_bytes(value: Any, flag: str = "--kv-cache-memory-bytes") -> int | None:
    """vLLM's --kv-cache-memory-bytes: a positive integer in vLLM's own notation
    (human_readable_int: 4294967296, 4G = 4 GiB, 4g = 4e9; no "GiB"). None passes. Returns the
    bytes."""
    if value is None:
        return None
    text = str(value).strip()
    hint = (f"pass a positive number of bytes, e.g. {flag} 4G (vLLM reads G as GiB and g as "
            f"10^9) or {flag} 4294967296; leave it out to size the KV cache from "
            f"--gpu-memory-utilization")
    if text.startswith("-"):
        raise ConfigError(f"{flag} {text}: must be a positive number of bytes", hint=hint)
    m = _VLLM_INT.fullmatch(text)
    if m:
        number, suffix = m.groups()
        if suffix in _VLLM_BINARY and "." in number:
            raise ConfigError(f"{flag} {text}: vLLM takes no decimals with the binary suffix "
                              f"{suffix}", hint=f"use {number}{suffix.lower()} (decimal) or whole "
                                                f"{suffix}")
        size = int(float(number) * (_VLLM_BINARY.get(suffix) or _VLLM_DECIMAL[suffix]))
    elif text.isdigit():
        size = int(text)
    else:
        try:
            ours = parse_size(text)
        except ValueError:
            ours = None
        if ours:
            raise ConfigError(f"{flag} {text}: vLLM does not read this unit",
                              hint=f"write it as {flag} {ours} (bytes), or with vLLM's suffixes: "
                                   f"K/M/G/T = KiB/MiB/GiB/TiB, k/m/g/t = 10^3..10^12")
        raise ConfigError(f"{flag} {text}: not a number of bytes", hint=hint)
    if size <= 0:
        raise ConfigError(f"{flag} {text}: must be a positive number of bytes", hint=hint)
    return size


def kv_bytes_as_vllm_reads(value: Any, flag: str = "--kv-cache-memory-bytes") -> int:
    """A --kv-cache-memory-bytes value copied from a vLLM command line means what vLLM reads
    (4G = 4 GiB, 4g = 4e9); our own units (60GiB) are accepted too where vLLM has none."""
    text = str(value).strip()
    if text.isdigit() or _VLLM_INT.fullmatch(text):
        return check_engine_bytes(text, flag)
    return check_size(text, flag)


def profile_kv_bytes(value: Any, flag: str = "--kv-cache-memory-bytes") -> int | None:
    """wcprof's --kv-cache-memory-bytes: vLLM's notation (4G = 4 GiB, 4g = 4e9, bytes), and our
    units where vLLM has none (6GiB, 512MiB), as `wcprof check` reads it; wcprof hands vLLM the
    bytes. Anything else is refused as check_engine_bytes refuses it. None passes."""
    if value is None:
        return None
    text = str(value).strip()
    if not (text.isdigit() or _VLLM_INT.fullmatch(text) or text.startswith("-")):
        try:
            ours = parse_size(text)
        except ValueError:
            ours = 0
        if ours > 0:
            return ours
    return check_engine_bytes(text, flag)


# --------------------------------------------------------------------------------------------
# settings from the environment, and the serve side
# --------------------------------------------------------------------------------------------

def check_env(environ: Mapping[str, str] | None = None) -> ProfilerSettings:
    """WCPROF_CONFIG then WCPROF_PROFILER (settings.from_env, whose errors name the variable).
    Returns the settings."""
    return from_env(environ)


def check_serve(settings: ProfilerSettings, source: str = "--profiler-report") -> None:
    """What `vllm serve` with the profiler on needs before the engine starts: the report path
    (settings.json_path, from --profiler-report, --additional-config or WCPROF_CONFIG) is a
    writable file name. Nothing to check when the profiler is off."""
    if not settings.enabled:
        return
    if settings.json_path:
        check_output(settings.json_path, source)


def check_serve_args(profiler: str | None, profiler_report: str | None,
                     additional_config: Any = None,
                     environ: Mapping[str, str] | None = None) -> ProfilerSettings:
    """`vllm serve`'s --profiler / --profiler-report with the environment and
    --additional-config, checked and resolved the way the workers will resolve them; then
    check_serve. Returns the settings (mode "off" when nothing switches the profiler on)."""
    env = os.environ if environ is None else environ
    from_environment = check_env(env)
    if profiler is not None and profiler not in PROFILER_CHOICES:
        raise ConfigError(f"unknown --profiler {profiler!r}",
                          hint=f"use --profiler {' or --profiler '.join(PROFILER_CHOICES)}")
    if profiler_report is not None and profiler != "worstcase":
        raise ConfigError("--profiler-report needs --profiler worstcase"
                          + (" (--profiler default writes no report)" if profiler else ""),
                          hint="add --profiler worstcase, or drop --profiler-report")
    del from_environment  # load reads it again, in its place in the precedence
    try:
        settings = load(additional_config=additional_config, environ=env)
    except ValueError as e:  # a size settings.py could not read
        raise ConfigError(f"--additional-config: {e}",
                          hint="sizes are bytes or a unit such as 512MiB") from e
    if profiler is not None:
        section: dict[str, Any] = {"profiler": profiler}
        if profiler_report:
            section["json_path"] = profiler_report
        settings = from_mapping(section, settings)
    source = "--profiler-report" if profiler_report else "the report path (json_path)"
    check_serve(settings, source)
    if settings.enabled and settings.validate_on_start != "off":
        replay_stop(env)  # the serving validation's replays read it
    return settings


# --------------------------------------------------------------------------------------------
# `wcprof` (profile): everything before the engine
# --------------------------------------------------------------------------------------------

# What wcprof itself decides in the --additional-config section, and what to use instead.
WCPROF_OWNS = {"json_path": "wcprof writes the report with --json PATH",
               "max_model_len": "wcprof profiles at --max-model-len; `wcprof fit` finds the "
                                "longest that fits (max_model_len auto is vllm serve's)"}


def check_wcprof_section(additional_config: Any,
                         environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """wcprof's --additional-config: valid JSON whose `worstcase_profiler` section passes the same
    loader as the plugin's and `vllm serve`'s (settings.load: unknown keys, bad values and the
    environment alike), and switches nothing wcprof decides itself (the profiler off, the report
    path). Returns the section as settings keys ({} when there is none)."""
    parsed = parse_additional_config(additional_config)
    try:
        load(additional_config=parsed, environ=environ)
    except ValueError as e:  # a size settings.py could not read
        raise ConfigError(f"--additional-config: {e}",
                          hint="sizes are bytes or a unit such as 512MiB") from e
    section = section_of(parsed)
    if section is None:
        return {}
    if isinstance(section, str):
        section = {"profiler": section}
    off = section.get("profiler") == "default" or section.get("mode") == "off"
    if off:
        raise ConfigError(f"--additional-config: {CONFIG_KEY} switches the profiler off, and "
                          "wcprof always runs it",
                          hint="drop \"profiler\"/\"mode\" from the section; the report's "
                               "'stock' column is vLLM's default profile, measured in the same run")
    for key, instead in WCPROF_OWNS.items():
        if key in section:
            raise ConfigError(f"--additional-config: {CONFIG_KEY}.{key} is not read by wcprof",
                              hint=instead)
    return {k: v for k, v in section.items() if k != "profiler"}


def check_profile(*, model: str | None, outputs: Mapping[str, Any], margin: Any = None,
                  kv_cap: Any = None, kv_cache_memory_bytes: Any = None,
                  additional_config: Any = None,
                  environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Sizes first (instant), then the environment (WCPROF_REPLAY_STOP too) and
    --additional-config (check_wcprof_section), outputs, and the model (may touch the network).
    Returns the parsed sizes: margin_bytes, kv_cap_bytes, kv_cache_memory_bytes, and `section`,
    the --additional-config section's settings."""
    sizes: dict[str, Any] = {
        "margin_bytes": check_size(margin, "--margin"),
        "kv_cap_bytes": check_size(kv_cap, "--kv-cap", allow_zero=False),
        "kv_cache_memory_bytes": profile_kv_bytes(kv_cache_memory_bytes)}
    check_env(environ)
    replay_stop(environ)  # read by --validate's replays
    sizes["section"] = check_wcprof_section(additional_config, environ)
    check_outputs(outputs)
    check_model(model, environ)
    return sizes


def format_error(error: WcprofError, prog: str = "wcprof") -> str:
    return f"{prog}: error: {error.message}" + (f"\n  -> {error.hint}" if error.hint else "")


def die(error: WcprofError, prog: str = "worstcase_profiler") -> NoReturn:
    """Print the error (one line, and its hint) on stderr and exit with its code: for callers
    outside `wcprof`, such as vllm serve's argument handling, where a raised error would end in
    a traceback."""
    sys.stderr.write(format_error(error, prog) + "\n")
    sys.stderr.flush()
    raise SystemExit(error.exit_code)


__all__ = ["check_model", "check_weights", "check_wcprof_section", "check_output", "check_outputs", "check_picture_support", "check_size",
           "check_engine_bytes",
           "check_env", "check_serve", "check_serve_args", "check_profile", "die",
           "format_error", "looks_like_repo_id"]
