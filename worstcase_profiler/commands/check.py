"""`wcprof check REPORT.json --kv-cache-memory-bytes N`: is this value safe for the engine the
report describes? It reads the report only (no engine, no vLLM, no torch).

Exit codes: 0 the value is safe (the least KV cache vLLM starts with, one request at
max_model_len plus the null block its block pool holds back, <= value <= the worst-case budget);
1 the value is over the budget, below that least size, the configuration
does not fit at all, or the report's KV audit found the engine allocating more KV than it is
given (the flag alone then bounds nothing); 2 bad input: a missing file, a file that is not a
wcprof report, a bad size (errors.ConfigError).
"""

from __future__ import annotations

from rich.console import Console

from ..core.admission import bytes_for_one_request, pool_block
from ..errors import ArgParser
from ..report import Report
from ..sizes import fmt_bytes, fmt_tokens
from .diff import load


def one_request_bytes(report: Report) -> int:
    """The least KV cache one request at max_model_len needs to start: the admission's
    least_kv_cache_bytes (whole blocks plus the block vLLM's block pool holds back, its null
    block); for a report without it (schema 1.11 or older), the request's whole blocks from
    its bytes per token, as the admission then computed it."""
    adm, cfg = report.admission, report.config
    if adm.least_kv_cache_bytes is not None:
        return adm.least_kv_cache_bytes
    return bytes_for_one_request(adm.bytes_per_token, cfg.block_size or 1, cfg.max_model_len)


def parser() -> ArgParser:
    """`wcprof check`'s flags."""
    p = ArgParser(prog="wcprof check",
                  description="is this --kv-cache-memory-bytes value safe for the engine the "
                              "report describes?")
    p.add_argument("report", metavar="REPORT.json")
    p.add_argument("--kv-cache-memory-bytes", "--kv-cache-memory", dest="kv", required=True,
                   metavar="N", help="bytes, vLLM's notation (4G = 4 GiB, 4g = 4e9), or a "
                                     "size such as 60GiB")
    return p


def run(argv: list[str]) -> int:
    """wcprof check REPORT.json --kv-cache-memory-bytes N   (or --kv-cache-memory 60GiB)

    Safe (exit 0) when the least KV cache vLLM starts with (one_request_bytes) <= N <= the
    report's worst-case budget (admission.budget_bytes, held where the plan covers less at
    the largest size whose whole pool blocks are admission.pool_ceiling_bytes': vLLM drops a
    fraction of a block, so any N below the ceiling plus one block holds the planned pool).
    Otherwise exit 1, saying by how much N is off and what to pass instead (a range that is
    never empty). Exit 2: bad input."""
    ns = parser().parse_args(argv)
    from ..preflight import kv_bytes_as_vllm_reads

    value = kv_bytes_as_vllm_reads(ns.kv)
    report = load(ns.report)
    adm, cfg = report.admission, report.config
    budget, recommended = adm.budget_bytes, adm.recommended_kv_cache_memory_bytes
    ceiling = None
    if adm.pool_ceiling_bytes is not None:  # one block more holds steps the plan never measured
        block = pool_block(adm.bytes_per_token, cfg.block_size, adm.pool_block_bytes)
        ceiling = adm.pool_ceiling_bytes + block - 1
        budget = min(budget, ceiling)
    need_one = one_request_bytes(report)
    # the largest value to suggest: the admission's whole-MiB figure, unless rounding it down
    # to a MiB would put it under one request (a budget < 1 MiB above it): then the budget itself
    upper = recommended if recommended >= need_one else budget
    console = Console(soft_wrap=True, highlight=False)
    shown = f"--kv-cache-memory-bytes {value} ({fmt_bytes(value)})"
    mml = f"max_model_len={fmt_tokens(cfg.max_model_len)}"
    where = (f"report: {cfg.model}, {mml}, "
             f"max_num_batched_tokens={fmt_tokens(cfg.max_num_batched_tokens)}")

    if budget < need_one:
        console.print(f"[bold red]unsafe[/]: {shown}: nothing fits. After the worst-case step the "
                      f"KV budget is {fmt_bytes(budget)}; one request at {mml} needs "
                      f"{fmt_bytes(need_one)}. Lower --max-model-len or --max-num-batched-tokens, "
                      f"or give the engine more memory ({where}).")
        return 1
    if report.kv_audit is not None and report.kv_audit.verdict != "ok":
        console.print(f"[bold red]unsafe[/]: the report's KV audit found the engine allocating "
                      f"{fmt_bytes(report.kv_audit.allocated_bytes)} of KV for a budget of "
                      f"{fmt_bytes(report.kv_audit.budget_bytes)} (x{report.kv_audit.ratio:.2f}), "
                      f"so {shown} does not bound what it allocates: "
                      f"{report.kv_audit.message}")
        return 1
    if value > budget:
        what = ("KV pool the measured plan covers (a larger one holds wider steps than any "
                "measured)" if budget == ceiling else "worst-case budget")
        console.print(f"[bold red]unsafe[/]: {shown} is {fmt_bytes(value - budget)} over the "
                      f"{what} {fmt_bytes(budget)}; use --kv-cache-memory-bytes "
                      f"{upper} ({fmt_bytes(upper)}) or less, at least {need_one} ({where}).")
        return 1
    if value < need_one:
        console.print(f"[bold red]unsafe[/]: {shown} is {fmt_bytes(need_one - value)} short of one "
                      f"request at {mml} with vLLM's null block ({fmt_bytes(need_one)}); use at least "
                      f"--kv-cache-memory-bytes {need_one}, at most {upper} ({where}).")
        return 1
    capped = (f" That budget holds only with the chunk cap: set chunk_cap "
              f"{report.chunk_cap.plan.rows} in the plugin's settings."
              if report.chunk_cap is not None else "")
    console.print(f"[bold green]safe[/]: {shown} is within the worst-case budget "
                  f"{fmt_bytes(budget)} ({fmt_bytes(budget - value)} to spare) and holds one "
                  f"request at {mml} ({fmt_bytes(need_one)}); {where}.{capped}")
    return 0
