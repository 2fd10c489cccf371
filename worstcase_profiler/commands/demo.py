"""`wcprof demo NAME`: the bundled scenarios, each a real engine, so the failure is caught on
screen rather than described.

  tiny        the bundled tiny Llama: a correct model, audits at ratio <= 1.01
  scratch     attention scratch from the WorkspaceManager sized rows x KV extent on two lanes
              (a context-scaled workspace); the stock step sees a 16 KiB slot, runtime needs tens of MiB per lane
  overcommit  a KV over-commit: one placeholder layer per KV group, one buffer per real layer, recurrent
              state outside the budget; the audit refuses to start (then starts with kv_audit=warn)
  tile        scratch that is a non-monotone step function of rows: the worst rows value is
              neither a power of two nor max_num_batched_tokens
  decode      scratch only on pure-decode steps, sized by the KV they read: the worst step is
              the widest full-context decode batch, and --validate builds it from real requests
  wide        scratch per prefill request over every prefill request's KV: the worst step is a
              prefill spread over all requests, each on a long context
"""

from __future__ import annotations

from ..errors import ConfigError


COMMON = ["--load-format", "dummy", "--skip-tokenizer-init", "--enforce-eager",
          "--gpu-memory-utilization", "0.25"]

SCENARIOS: dict[str, tuple[str | None, list[str], str]] = {
    "tiny": (None, [], "a correct model: KV audit ratio <= 1.01"),
    "scratch": ("scratch", ["--max-model-len", "2048", "--max-num-batched-tokens", "256",
                            "--max-num-seqs", "4", "--validate"],
                "context-scaled workspace on two lanes"),
    "overcommit": ("overcommit", ["--max-model-len", "2048", "--max-num-batched-tokens", "256",
                                  "--max-num-seqs", "4"],
                   "KV over-commit: placeholder divisor + recurrent state"),
    "tile": ("tile", ["--max-model-len", "2048", "--max-num-batched-tokens", "512",
                      "--max-num-seqs", "4"],
             "tile-rounded scratch peaking at an odd rows value"),
    "decode": ("decode", ["--max-model-len", "2048", "--max-num-batched-tokens", "256",
                          "--max-num-seqs", "4", "--validate"],
               "worst step: the widest full-context decode batch"),
    "wide": ("wide", ["--max-model-len", "2048", "--max-num-batched-tokens", "256",
                      "--max-num-seqs", "4", "--validate"],
             "worst step: a prefill spread over every request"),
}


def demo_help() -> str:
    """The --help text: one short line per scenario (fits 80 columns)."""
    lines = ["usage: wcprof demo NAME [wcprof options]", "",
             "Bundled scenarios, each a real engine: the failure is caught on screen.", ""]
    lines += [f"  {name:<11} {desc}" for name, (_, _, desc) in SCENARIOS.items()]
    return "\n".join(lines)


def fixture_dir(name: str) -> str:
    """The fixture model's directory. The fixture plugins (their model classes are registered
    with vLLM as a general plugin) live in the source tree, plugins/wcp_fixtures, not in this
    package's wheel: an install from the wheel has only `demo tiny` (the bundled model)."""
    try:
        import wcp_fixtures
    except ImportError as e:
        needs = ", ".join(n for n, (fixture, _, _) in SCENARIOS.items() if fixture)
        raise ConfigError(
            f"demo {name!r} needs the fixture plugins (wcp_fixtures), which are not installed: "
            f"they come with the source tree, not with the wheel ({needs} need them; "
            "`wcprof demo tiny` needs none)",
            hint="from a clone: pip install plugins/wcp_fixtures into this environment "
                 "(`make demo` does)") from e
    return str(wcp_fixtures.model_dir(name))


def scenario_args(name: str) -> list[str]:
    if name not in SCENARIOS:
        raise ConfigError(f"unknown demo {name!r}", hint=f"choose one of: {', '.join(SCENARIOS)}")
    fixture, args, _ = SCENARIOS[name]
    if fixture is None:
        return list(args)
    return ["--model", fixture_dir(fixture), *COMMON, *args]


def run(argv: list[str]) -> int:
    from rich.console import Console

    from . import profile

    if not argv or argv[0] in ("-h", "--help"):
        print(demo_help())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    args = scenario_args(name)  # an unknown name or missing fixtures: one error line, no banner
    Console().rule(f"wcprof demo {name}: {SCENARIOS[name][2]}")
    return profile.run(args + rest)
