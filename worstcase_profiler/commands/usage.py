"""`wcprof --help` (and `wcprof profile --help`): the commands from the command table, the
profile options, the most used engine options and the exit codes, without importing vLLM.
"""

from __future__ import annotations

import argparse
import textwrap

from ..errors import EXIT_CODES
from . import COMMANDS
from .engine_boot import TINY_DEFAULTS
from .profile_options import HELP_ENGINE, add_profile_flags


def usage() -> str:
    """`wcprof --help`: wcprof's own usage, without importing vLLM."""
    width = 100
    commands = []
    for name, command in COMMANDS.items():
        lines = textwrap.wrap(command.summary, width - 14)
        commands.append(f"  {name:<10}  {lines[0] if lines else ''}")
        commands.extend(f"{'':14}{line}" for line in lines[1:])
    p = argparse.ArgumentParser(
        prog="wcprof", add_help=False, allow_abbrev=False,
        usage="wcprof [COMMAND] [OPTIONS]      (COMMAND defaults to profile)",
        formatter_class=lambda prog: argparse.RawDescriptionHelpFormatter(
            prog, max_help_position=30, width=width),
        description="Profile a vLLM engine configuration at its worst case (every step at "
                    "max_model_len KV extent)\nand say which --kv-cache-memory-bytes is safe.\n\n"
                    "commands:\n" + "\n".join(commands)
                    + "\n  `wcprof COMMAND --help` shows a command's own options.",
        epilog=_ENGINE_EPILOG.replace("{exit_codes}", _exit_code_lines(width)))
    g = p.add_argument_group("help")
    g.add_argument("-h", "--help", action="store_true", help="this message (imports nothing heavy)")
    g.add_argument(HELP_ENGINE, metavar="=WORD", nargs="?",
                   help="vLLM's engine flags: all of them, or those matching WORD (imports vLLM: "
                        "several seconds)")
    add_profile_flags(p, "profile options (wcprof's own)")
    return p.format_help()


_ENGINE_EPILOG = f"""engine options: every `vllm serve` engine flag is accepted (`wcprof --help-engine`); most used:
  --model M                   model directory or Hugging Face id (default: the bundled tiny
                              Llama with dummy weights, max_model_len {TINY_DEFAULTS['max_model_len']},
                              max_num_batched_tokens {TINY_DEFAULTS['max_num_batched_tokens']}, max_num_seqs {TINY_DEFAULTS['max_num_seqs']})
  --max-model-len N           the longest request: the sweep runs at this KV extent
  --max-num-batched-tokens N  the largest step: every rows value 1..N is covered
  --max-num-seqs N            the largest decode batch
  --kv-cache-memory-bytes N   a KV size to hold against the worst case: bytes, 4G or 6GiB
                              (exit 3 when it leaves no room for the worst step or holds less
                              than one request; `wcprof check` does it from a report)
  --gpu-memory-utilization F  the share of device memory the engine may use
  --tensor-parallel-size N    every rank sweeps and reports its own budget

exit codes (docs/faq.md: what to do for each):
{{exit_codes}}

examples:
  wcprof                                   the bundled tiny model (no download, no GPU needed)
  wcprof --model M --max-model-len 131072 --max-num-batched-tokens 8192 --json r.json --quiet
  wcprof render r.json --html r.html       the picture from a saved report
  wcprof check r.json --kv-cache-memory-bytes 60GiB
  wcprof fit --model M --max-model-len 131072 --min-concurrency 8   the longest context for 8
"""


def _exit_code_lines(width: int) -> str:
    lines = []
    for code, meaning in EXIT_CODES.items():
        wrapped = textwrap.wrap(meaning, width - 8)
        lines.append(f"  {code:>3}  {wrapped[0]}")
        lines.extend(f"{'':7}{line}" for line in wrapped[1:])
    return "\n".join(lines)
