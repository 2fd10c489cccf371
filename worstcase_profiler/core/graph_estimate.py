"""vLLM's V2 CUDA-graph estimate, recomputed from what its profile captured, and the line that
says so in the engine log. Pure: the adapter (adapter/warmup.py) reads the figures.

vLLM 0.32 and 0.33 (v1/worker/gpu/cudagraph_utils.profile_cudagraph_memory) capture every
PIECEWISE graph and the `_FULL_GRAPH_PROFILING_SAMPLES` (2) largest FULL graphs, take
`measured` (the free memory runner.capture_model(profile_only=True) took) and one sample per
FULL capture (free memory just before `torch.cuda.graph(...)` minus just after it), and return

    max(measured - sum(samples) + first + (n_full - 1) * max(second, 1 MiB), 0)

(`_extrapolate_full_graph_memory`). `torch.cuda.graph.__enter__` empties the allocator's cache
inside each sample's window, so a sample is the graph's pool growth minus whatever the cache
held: the blocks the eager warm-up forward of that descriptor (`forward_fn(NONE)`, just before)
had taken. Subtracting the samples (`- sum(samples)`) therefore adds one warm-up's cache back
per sampled FULL graph: `measured - sum(samples)` grows with the number of samples while the
extrapolation (first + (n-1) * second) does not. Sampling every FULL graph (what the profiler
once made vLLM's own profile do) therefore raised vLLM's figure by about one warm-up cache per
extra graph: 7.47 GiB against stock's 0.92 GiB for the Llama-3.1-8B layout (51 FULL graphs),
on 0.32 and 0.33 alike (docs/vllm-hooks.md, section 7).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..sizes import fmt_bytes

MIN_PER_GRAPH_BYTES = 1 << 20
"""vLLM's `_MIN_PER_GRAPH_BYTES`: the floor of the extrapolated per-graph cost."""


@dataclass(frozen=True)
class GraphProfile:
    """What one run of vLLM's V2 estimator captured (figures vLLM itself measured)."""

    measured_bytes: int                # runner.capture_model's return: the whole capture
    full_samples: tuple[int, ...]      # one per FULL graph captured, largest first
    full_graphs: int                   # the FULL graphs the real capture makes


def v2_estimate(p: GraphProfile, min_per_graph: int = MIN_PER_GRAPH_BYTES) -> int:
    """vLLM 0.32/0.33's figure from these samples (profile_cudagraph_memory's return)."""
    s = p.full_samples
    full = 0
    if s:
        per_graph = max(s[1], min_per_graph) if len(s) > 1 else 0
        full = s[0] + (p.full_graphs - 1) * per_graph
    return max(p.measured_bytes - sum(s) + full, 0)


def describe(p: GraphProfile, vllm_bytes: int | None = None) -> str:
    """The figures of one estimator run, for the log: the next device session compares them."""
    s = p.full_samples
    first = fmt_bytes(s[0]) if s else "-"
    second = fmt_bytes(s[1]) if len(s) > 1 else "-"
    text = (f"capture took {fmt_bytes(p.measured_bytes)}, {len(s)} FULL sample(s) of "
            f"{p.full_graphs} graph(s): first {first}, second {second}")
    if len(s) > 2:
        text += f", the other {len(s) - 2} sum to {fmt_bytes(sum(s[2:]))}"
    text += f"; the 0.32/0.33 formula reads {fmt_bytes(v2_estimate(p))}"
    if vllm_bytes is not None and vllm_bytes != v2_estimate(p):
        text += (f", vLLM returned {fmt_bytes(vllm_bytes)}: its formula is not the one read "
                 f"from 0.32/0.33")
    return text


def stock_from_one_capture(measured: int, end_free: int, free_after_stock: int | None,
                           samples: tuple[int, ...], full_graphs: int, stock_samples: int,
                           extrapolate) -> tuple[GraphProfile, int, int]:
    """vLLM's own figure, as its estimator would have given it capturing `stock_samples` FULL
    graphs, from one capture of every FULL graph (adapter/warmup.one_capture_profile).

    The capture runs PIECEWISE graphs, then FULL graphs largest first; up to the stock_samples-th
    FULL graph it is stock's capture, step for step. `free_after_stock`: the device's free memory
    read just after that graph (None: there were no more FULL graphs, the capture was stock's);
    `end_free`: read just after the whole capture; `measured`: what the capture returned (free
    memory at its start minus `end_free`). With nothing captured after the FULL graphs (no
    speculator, no inner graphs: the caller checks), stock's capture would have ended at
    `free_after_stock`, so stock's measured is `measured + end_free - free_after_stock`.
    `extrapolate(samples, n)`: vLLM's own `_extrapolate_full_graph_memory`.

    Returns (stock's profile, stock's figure, the `measured` to hand vLLM's formula
    `max(measured - sum(samples) + extrapolate(samples, n), 0)` over all the samples so that it
    returns stock's figure)."""
    k = stock_samples
    s = tuple(int(x) for x in samples)
    stock_measured = int(measured) if free_after_stock is None else \
        int(measured) + int(end_free) - int(free_after_stock)
    figure = max(stock_measured - sum(s[:k]) + int(extrapolate(list(s[:k]), full_graphs)), 0)
    handed = figure + sum(s) - int(extrapolate(list(s), full_graphs))
    return GraphProfile(stock_measured, s[:k], full_graphs), figure, handed
