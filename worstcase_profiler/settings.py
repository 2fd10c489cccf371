"""Profiler settings and where they come from: one loader (`load`) for `wcprof`, `vllm serve`
and the plugin inside every engine process, so the same inputs give the same settings and the
same errors everywhere.

Sources, lowest precedence first (a later one overrides an earlier one, key by key):
  1. the built-in defaults (ProfilerSettings; wcprof's own run defaults: guard off, and on the
     CPU kv_cap_bytes 512MiB, apply only to keys no source below sets)
  2. WCPROF_CONFIG='{"margin_bytes": "128MiB", ...}' (a JSON object of settings)
  3. WCPROF_PROFILER=worstcase|default (the switch alone)
  4. --additional-config '{"worstcase_profiler": {...}}' (or '{"worstcase_profiler": "worstcase"}')
  5. command-line flags: `vllm serve --profiler/--profiler-report`; `wcprof --margin, --kv-cap,
     --kv-audit, --sweep-depth, --exhaustive, --no-lock-workspace, --no-cache, --advise*`;
     `wcprof fit --min-concurrency, --objective` (settings fit_min_concurrency, fit_objective)
(not VLLM_-prefixed: vLLM warns about unknown VLLM_ variables). Every source is validated by
the same code (from_mapping): an unknown key or a bad value is a ConfigError naming the source,
under `wcprof` and `vllm serve` alike (exit 2). Disabled means the plugin changes nothing.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal, Mapping

from .errors import ConfigError
from .sizes import parse_size

CONFIG_KEY = "worstcase_profiler"
ENV_SWITCH = "WCPROF_PROFILER"
ENV_CONFIG = "WCPROF_CONFIG"
PROFILER_CHOICES = ("default", "worstcase")

Mode = Literal["off", "enforce", "report"]


@dataclass(frozen=True)
class ProfilerSettings:
    mode: Mode = "off"
    """enforce: the worst-case budget is what the engine gets. report: measure and report, but
    return vLLM's own figure (used by tests that compare both on one engine)."""
    json_path: str | None = None
    margin_bytes: int = 64 << 20
    tolerance_bytes: int | None = None
    """Chord tolerance for rows coverage; None = the meter's resolution."""
    exhaustive: bool = False
    lock_workspace: bool = True
    kv_audit: Literal["error", "warn", "off"] = "error"
    context_ladder: bool = True
    attribute_ops: bool = True
    kv_cap_bytes: int | None = None
    """Give the engine at most this much KV (the report still states the full budget). wcprof
    uses it so a report run does not fill a CPU host with a KV cache nobody will use."""
    sweep_depth: Literal["auto", "full", "cut-down", "self-check", "prove"] = "auto"
    """cut-down: every shape on one decoder layer of each kind, the worst confirmed on the full
    model; full: every shape on the whole model; auto: cut-down, self-checked on this model (a
    full-model sample of every shape class; the full sweep where one disagrees beyond the
    meter's resolution: core/sweep.run_self_checked) on CUDA, full elsewhere; self-check: that
    self-checked sweep on any device whose meter resolution is known (the CPU too); prove:
    both, the full one admitted, and the report says whether the cut-down one agreed."""
    progress: bool = True
    cache_dir: str | None = None
    """Where sweeps are cached across starts (cache.py); None: $WCPROF_CACHE_DIR or
    ~/.cache/worstcase_profiler; "off": always sweep."""
    advise: bool = False
    """Run the chunk advisor after the sweep (core/advise.py): the worst case, KV and prefill
    throughput of other max_num_batched_tokens values (wcprof --advise)."""
    advise_chunks: tuple[int, ...] = ()
    """Candidate chunks beyond the powers of two from 256 up to the configured one."""
    advise_within: float = 0.05
    """The knee rule's X: prefill throughput within this fraction of the best candidate's."""
    chunk_cap: int | None = None
    """Opt-in context-aware chunk cap (core/chunk_cap.py): at long context a step holds at most
    this many tokens (a chunk an engine could be started with: at least max_num_seqs, below
    max_num_batched_tokens), while at the measured contexts where the full chunk needs no more
    than that engine's worst step the full max_num_batched_tokens stays. The admission uses the
    capped worst step (more KV), the scheduler clamps every step to the cap at its longest
    request's context, the guard counts steps above it. None (default): no cap, nothing
    changes."""
    fit: bool = False
    """Weigh the configurations this sweep bounds (core/fit.py, `wcprof fit`): max_model_len,
    max_num_batched_tokens and max_num_seqs up to the engine's, each candidate's worst step, KV
    and concurrency, the recommendation and the frontier (the report's `fit` section)."""
    fit_min_concurrency: int = 1
    """The fit's constraint: requests at full length the KV cache must hold at once."""
    fit_objective: Literal["context", "concurrency", "throughput"] = "context"
    """What the fit recommends: the longest max_model_len (context), the most requests at the
    engine's max_model_len (concurrency), or the fastest prefill there (throughput)."""
    max_model_len: Literal["auto"] | None = None
    """auto: the engine's max_model_len (--max-model-len, else the model's own) is an upper
    bound, not the length served: the start sweeps at it, weighs the fit over max_model_len only
    (the engine's max_num_batched_tokens and max_num_seqs, fit_min_concurrency requests at full
    length: core/fit.apply_longest) and starts the engine at the longest max_model_len in whole
    KV blocks whose worst step fits and whose KV cache holds them, logging why; no length fits:
    the start is refused, naming what would. None: the engine's max_model_len, as given.
    Under `vllm serve` and LLM(...) only: wcprof profiles at --max-model-len (`wcprof fit`
    answers the same question, with the other limits too)."""
    guard: Literal["auto", "on", "off"] = "auto"
    """The production guard (adapter/guard.py): each served step's allocator peak against the
    prediction, exported on /metrics. auto: on under `vllm serve`, off in-process (LLM(...),
    wcprof, benchmarks), where callers read the allocator's peak themselves."""
    validate_on_start: Literal["off", "worst", "all"] = "off"
    """Under `vllm serve`: before the server accepts traffic, build the report's worst step from
    real requests (worst; all: and generic traffic) and refuse to start when it needs more than
    predicted (adapter/serve_validation.py). Its replays stop as --validate's do (replay_stop)."""
    check_steps: tuple[tuple[int, int], ...] = ()
    """Steps to measure on their own and validate (core/check_steps.py): (rows, context) pairs,
    one request of `rows` new tokens on `context` cached ones, e.g. the step an engine died on.
    Given as ["4096@149760"] or "4096@149760,2048@8192"; each must fit the engine's limits."""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def enabled(self) -> bool:
        return self.mode != "off"

    @property
    def auto_max_model_len(self) -> bool:
        """max_model_len: auto, on an enabled profiler."""
        return self.enabled and self.max_model_len == MAX_MODEL_LEN_AUTO


_BOOL_KEYS = {"exhaustive", "lock_workspace", "context_ladder", "attribute_ops", "progress",
              "advise", "fit"}
FIT_OBJECTIVES = ("context", "concurrency", "throughput")
GUARD_CHOICES = ("auto", "on", "off")
MAX_MODEL_LEN_AUTO = "auto"


def parse_chunks(value: Any, what: str = f"{CONFIG_KEY}.advise_chunks") -> tuple[int, ...]:
    """Positive token counts from a list, a tuple, one int or a comma-separated string."""
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else value
    if isinstance(items, (int, float)) and not isinstance(items, bool):
        items = [items]
    out = []
    for item in items:
        text = str(item).strip()
        if not text:
            continue
        try:
            n = int(text)
        except ValueError:
            n = 0
        if isinstance(item, bool) or n < 1 or (isinstance(item, float) and item != n):
            raise ConfigError(f"{what}: {item!r} is not a positive whole number of tokens",
                              hint="pass chunk sizes such as 1024 or 3072")
        out.append(n)
    return tuple(dict.fromkeys(out))


def parse_within(value: Any, what: str = f"{CONFIG_KEY}.advise_within") -> float:
    """'5%' -> 0.05; a number is a fraction (0.05), so 5 is refused rather than read as 500%."""
    raw = str(value).strip()
    pct = raw.endswith("%")
    try:
        number = float(raw[:-1] if pct else raw)
    except ValueError:
        number = float("nan")
    fraction = number / 100 if pct else number
    if not (0 <= fraction < 1):
        raise ConfigError(f"{what}: {value!r} is not a share in [0%, 100%)",
                          hint="pass a percentage such as 5% (or a fraction such as 0.05)")
    return fraction


def parse_concurrency(value: Any, what: str = f"{CONFIG_KEY}.fit_min_concurrency") -> int:
    """A whole number of requests, at least 1 (3, "3"; not 0, 2.5, 3.0 or true)."""
    text = str(value).strip()
    n = int(text) if text.isdigit() else 0
    if isinstance(value, bool) or n < 1:
        raise ConfigError(f"{what}: {value!r} is not a whole number of requests >= 1",
                          hint="pass how many requests at full length must fit at once, e.g. 4")
    return n


def parse_cap(value: Any, what: str = f"{CONFIG_KEY}.chunk_cap") -> int:
    """The chunk cap's rows at long context: a whole number of tokens >= 1 (256, "256")."""
    text = str(value).strip()
    n = int(text) if text.isdigit() else 0
    if isinstance(value, bool) or n < 1:
        raise ConfigError(f"{what}: {value!r} is not a whole number of tokens >= 1",
                          hint="pass the rows a step may hold at long context, e.g. 1024")
    return n


def _coerce(key: str, value: Any) -> Any:
    if key in ("margin_bytes", "tolerance_bytes", "kv_cap_bytes"):
        try:
            return None if value is None else parse_size(value)
        except ValueError as e:
            raise ConfigError(f"{CONFIG_KEY}.{key}: {e}") from e
    if key in _BOOL_KEYS:
        if isinstance(value, str):
            if value.lower() not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                raise ConfigError(f"{CONFIG_KEY}.{key} must be true/false, got {value!r}")
            return value.lower() in ("1", "true", "yes", "on")
        return bool(value)
    if key == "mode":
        if value not in ("off", "enforce", "report"):
            raise ConfigError(f"{CONFIG_KEY}.mode must be off, enforce or report, got {value!r}")
    if key == "advise_chunks":
        return parse_chunks(value)
    if key == "advise_within":
        return parse_within(value)
    if key == "fit_min_concurrency":
        return parse_concurrency(value)
    if key == "chunk_cap":
        return None if value is None else parse_cap(value)
    if key == "check_steps":
        from .core.check_steps import parse
        return parse(value)
    if key == "fit_objective" and value not in FIT_OBJECTIVES:
        raise ConfigError(f"{CONFIG_KEY}.fit_objective must be context, concurrency or "
                          f"throughput, got {value!r}")
    if key == "max_model_len" and value not in (None, MAX_MODEL_LEN_AUTO):
        raise ConfigError(f"{CONFIG_KEY}.max_model_len must be \"auto\" (or null), got {value!r}",
                          hint="a fixed length is vLLM's own flag: pass --max-model-len N and "
                               "drop max_model_len from the profiler's settings")
    if key == "guard":
        if isinstance(value, bool):
            return "on" if value else "off"
        if value not in GUARD_CHOICES:
            raise ConfigError(f"{CONFIG_KEY}.guard must be auto, on or off, got {value!r}")
    if key == "kv_audit" and value not in ("error", "warn", "off"):
        raise ConfigError(f"{CONFIG_KEY}.kv_audit must be error, warn or off, got {value!r}")
    if key == "validate_on_start" and value not in ("off", "worst", "all"):
        raise ConfigError(f"{CONFIG_KEY}.validate_on_start must be off, worst or all, got {value!r}")
    if key == "sweep_depth" and value not in ("auto", "full", "cut-down", "self-check", "prove"):
        raise ConfigError(f"{CONFIG_KEY}.sweep_depth must be auto, full, cut-down, self-check or prove, got "
                          f"{value!r}")
    return value


def from_mapping(raw: Any, base: ProfilerSettings | None = None) -> ProfilerSettings:
    """Settings from the `worstcase_profiler` value: a profiler name or a dict of fields."""
    base = base or ProfilerSettings()
    if raw is None:
        return base
    if isinstance(raw, str):
        return replace(base, mode=profiler_choice_to_mode(raw))
    if not isinstance(raw, dict):
        raise ConfigError(f"{CONFIG_KEY} must be a profiler name or an object, got {type(raw).__name__}")
    known = {f.name for f in fields(ProfilerSettings)} - {"extra"}
    unknown = sorted(set(raw) - known - {"profiler"})
    if unknown:
        raise ConfigError(f"unknown {CONFIG_KEY} setting(s): {', '.join(unknown)}",
                          hint=f"valid settings: {', '.join(sorted(known))}")
    values = {k: _coerce(k, v) for k, v in raw.items() if k != "profiler"}
    if "profiler" in raw:
        values.setdefault("mode", profiler_choice_to_mode(raw["profiler"]))
    elif "mode" not in values and base.mode == "off":
        values["mode"] = "enforce"  # giving settings at all means "on"
    return replace(base, **values)


def profiler_choice_to_mode(choice: str) -> Mode:
    if choice not in PROFILER_CHOICES:
        raise ConfigError(f"unknown profiler {choice!r}",
                          hint=f"use --profiler {' or --profiler '.join(PROFILER_CHOICES)}")
    return "enforce" if choice == "worstcase" else "off"


def from_env(environ: Mapping[str, str] | None = None) -> ProfilerSettings:
    """WCPROF_CONFIG (a JSON object of settings), then WCPROF_PROFILER on top; every error names
    the variable and says what to set it to."""
    env = os.environ if environ is None else environ
    settings = ProfilerSettings()
    raw = env.get(ENV_CONFIG)
    if raw:
        data = _json(raw, ENV_CONFIG, hint=f"set it to a JSON object such as {ENV_CONFIG}="
                                           "'{\"json_path\": \"/var/log/wcprof/report.json\"}', "
                                           "or unset it")
        try:
            settings = from_mapping(data, settings)
        except ConfigError as e:
            raise ConfigError(f"{ENV_CONFIG}: {e.message}",
                              hint=e.hint or f"fix or unset {ENV_CONFIG}") from e
        except ValueError as e:  # a size this module could not read
            raise ConfigError(f"{ENV_CONFIG}: {e}", hint=f"fix or unset {ENV_CONFIG}") from e
    choice = env.get(ENV_SWITCH)
    if choice:
        try:
            mode = profiler_choice_to_mode(choice)
        except ConfigError as e:
            raise ConfigError(f"{ENV_SWITCH}={choice!r} is not a profiler",
                              hint=f"set {ENV_SWITCH}=worstcase (or default), or unset it") from e
        settings = replace(settings, mode=mode)
    return settings


def _json(text: str, source: str, *, hint: str) -> Any:
    """`text` parsed as JSON, or a ConfigError naming `source` (a variable or a flag), where
    the text stops parsing, and what to pass instead."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        shown = text if len(text) <= 60 else text[:57] + "..."
        raise ConfigError(f"{source} is not valid JSON ({e.msg} at column {e.colno}): {shown!r}",
                          hint=hint) from e


REPLAY_STOP_ENV = "WCPROF_REPLAY_STOP"
REPLAY_STOPS = ("finished", "formed")


def replay_stop(environ: Mapping[str, str] | None = None) -> str:
    """When a measured replay (--validate) stops, from WCPROF_REPLAY_STOP: "finished" (the
    default), once its target step formed and a request finished, the first to finish holding
    the longest context any reaches; "formed", as soon as its target formed, for an engine that
    fails late in a long replay (one whose requests fail as they near max_model_len): the
    measured contexts then end at the plan's target, short of the worst step's. Read by
    wcprof's --validate and the serving validation (validate_on_start)."""
    env = os.environ if environ is None else environ
    raw = env.get(REPLAY_STOP_ENV) or ""
    stop = raw.strip().lower() or "finished"
    if stop not in REPLAY_STOPS:
        raise ConfigError(f"{REPLAY_STOP_ENV}={raw!r} is not a replay stop",
                          hint=f"set {REPLAY_STOP_ENV}={' or '.join(REPLAY_STOPS)}, or unset it")
    return stop


def with_engine_config(additional_config: Any, settings: ProfilerSettings) -> ProfilerSettings:
    """The engine's --additional-config section on top of `settings`."""
    raw = section_of(additional_config)
    return from_mapping(raw, settings) if raw is not None else settings


def section_of(additional_config: Any) -> Any:
    """The `worstcase_profiler` value of an --additional-config object (None: not there)."""
    return additional_config.get(CONFIG_KEY) if isinstance(additional_config, dict) else None


ADDITIONAL_CONFIG = "--additional-config"


def parse_additional_config(value: Any) -> dict | None:
    """--additional-config as vLLM reads it: a JSON object (a dict passes as it is). Invalid JSON
    or another JSON type is a ConfigError naming the flag, not vLLM's internal error."""
    if value is None or isinstance(value, dict):
        return value
    data = _json(str(value), ADDITIONAL_CONFIG,
                 hint=f"pass a JSON object, e.g. {ADDITIONAL_CONFIG} "
                      f"'{{\"{CONFIG_KEY}\": {{\"margin_bytes\": \"128MiB\"}}}}' "
                      "(single quotes around it in a shell)")
    if not isinstance(data, dict):
        raise ConfigError(f"{ADDITIONAL_CONFIG} must be a JSON object, got a JSON "
                          f"{type(data).__name__}",
                          hint=f"pass a JSON object, e.g. {ADDITIONAL_CONFIG} "
                               f"'{{\"{CONFIG_KEY}\": \"worstcase\"}}'")
    return data


def load(*, additional_config: Any = None, flags: Mapping[str, Any] | None = None,
         environ: Mapping[str, str] | None = None) -> ProfilerSettings:
    """The settings from every source, in the precedence the module docstring states: the
    environment (WCPROF_CONFIG, then WCPROF_PROFILER), then --additional-config's section, then
    the command-line flags (`flags`: settings keys, e.g. {"profiler": "worstcase", "json_path":
    ...} from `vllm serve`, {"margin_bytes": ...} from wcprof). Each error names its source."""
    settings = from_env(environ)
    try:
        settings = with_engine_config(parse_additional_config(additional_config), settings)
    except ConfigError as e:
        if e.message.startswith(ADDITIONAL_CONFIG):
            raise
        raise ConfigError(f"{ADDITIONAL_CONFIG}: {e.message}", hint=e.hint) from e
    if flags:
        settings = from_mapping(dict(flags), settings)
    check_together(settings)
    return settings


def check_together(settings: ProfilerSettings) -> None:
    """Settings each valid alone that contradict each other: max_model_len auto chooses the
    length for the KV cache the start admits, which kv_cap_bytes would then cut, and chunk_cap's
    levels are weighed at the swept length only."""
    if settings.max_model_len == MAX_MODEL_LEN_AUTO and settings.kv_cap_bytes is not None:
        raise ConfigError(f"{CONFIG_KEY}: max_model_len auto with kv_cap_bytes: the cap would "
                          "give the engine less KV cache than its max_model_len was chosen for",
                          hint="drop kv_cap_bytes (pin the KV cache with "
                               "--kv-cache-memory-bytes instead), or max_model_len")
    if settings.max_model_len == MAX_MODEL_LEN_AUTO and settings.mode == "report":
        raise ConfigError(f"{CONFIG_KEY}: max_model_len auto in report mode: report mode "
                          "measures and reports only, and auto would change the length served",
                          hint="use mode enforce with max_model_len auto, or drop max_model_len "
                               "(`wcprof fit` reports the length without starting at it)")
    if settings.max_model_len == MAX_MODEL_LEN_AUTO and settings.chunk_cap is not None:
        raise ConfigError(f"{CONFIG_KEY}: max_model_len auto with chunk_cap: the cap's levels "
                          "and the KV it gains are weighed at the swept max_model_len, not at "
                          "the length auto would choose",
                          hint="drop one of them: choose the length first (`wcprof fit`), then "
                               "pass it as --max-model-len beside chunk_cap")


def given_keys(additional_config: Any = None,
               environ: Mapping[str, str] | None = None) -> set[str]:
    """The settings keys WCPROF_CONFIG or --additional-config's section set (already validated
    by `load`): a caller's own defaults (wcprof's kv_cap on the CPU) apply only to the others."""
    env = os.environ if environ is None else environ
    keys: set[str] = set()
    raw = env.get(ENV_CONFIG)
    if raw:
        try:
            data = json.loads(raw)
        except json.JSONDecodeError:
            data = None
        if isinstance(data, dict):
            keys |= set(data)
    section = section_of(parse_additional_config(additional_config))
    if isinstance(section, dict):
        keys |= set(section)
    return keys


def resolve(additional_config: Any, environ: Mapping[str, str] | None = None) -> ProfilerSettings:
    """The plugin's settings inside an engine: `load` without flags (vllm serve's and wcprof's
    flags arrive already folded into the --additional-config section, on top of its keys)."""
    return load(additional_config=additional_config, environ=environ)
