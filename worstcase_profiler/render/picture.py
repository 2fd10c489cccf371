"""The picture shared by the html and png reporters: where the card's memory goes under stock
admission and under the worst case, and the measured steps behind the difference.

Four panels, and two more with the advice or the fit, all from the report alone (no engine):
  card      the requested memory as two stacked bars, stock vs worst-case, to scale;
  non-KV    the same reservations without the KV cache, as a waterfall, so the small parts
            (workspace per slot, transient, CUDA graphs, margin) stay readable;
  rows      what each prefill chunk at full KV extent needs (transient + workspace) against its
            rows value, chord-certified segments shaded, the worst shape marked, stock's
            reservation as a horizontal line;
  context   the worst rows value at growing KV extent, where stock runs out;
  advice    (only with report.advice) KV tokens admitted and prefill throughput per candidate
            max_num_batched_tokens, the configured chunk and the knee marked;
  fit       (only with report.fit) the trade-off frontier: max_model_len against requests held
            at once, one labelled point per frontier candidate, the recommendation starred, the
            other candidates weighed under them (infeasible ones as red crosses), the
            recommended flags above it.

The bar arithmetic (`card_bars`) is pure Python so it is tested without drawing. Matplotlib is
imported lazily, through the object API (Figure + Agg canvas), never pyplot: no global state and
no display needed.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, field

from ..core.multimodal import need as encoder_need, standing
from ..errors import ConfigError
from ..report import Report, Shape, StepResult, Verdict
from ..sizes import GiB, MiB, fmt_bytes, fmt_tokens
from .view import (build_view, full_extent_prefill, parallel_text, plan_steps, shape_text,
                   short_model, signed, transient_bytes)

# category -> (colour, legend label). Colour-blind-safe (Okabe-Ito plus greys).
CATEGORIES: dict[str, tuple[str, str]] = {
    "weights": ("#0072B2", "weights"),
    "non_torch": ("#56B4E9", "non-torch"),
    "other": ("#999999", "other consumed"),
    "workspace": ("#CC79A7", "workspace"),
    "post_profile": ("#009E73", "post-profile buffers"),
    "transient": ("#D55E00", "step transient"),
    "cudagraph": ("#8C564B", "CUDA graphs"),
    "margin": ("#F0E442", "margin"),
    "kv": ("#B8E0B0", "KV cache"),
    "headroom": ("#FFFFFF", "headroom (budget unused)"),
}
WATERFALL_NAMES = {"post_profile": "post-profile\nbuffers", "other": "other\nconsumed",
                   "transient": "step\ntransient", "cudagraph": "CUDA\ngraphs"}
VERDICT_COLOURS = {Verdict.SAFE: "#1b7837", Verdict.STOCK_UNSAFE: "#b35806",
                   Verdict.KV_OVERCOMMIT: "#b2182b", Verdict.DOES_NOT_FIT: "#b2182b"}
# A card segment narrower than this share of the bar cannot be seen: it is left out of the
# card's legend (the waterfall below shows it to scale).
VISIBLE_SHARE = 0.004


@dataclass
class Segment:
    category: str
    label: str
    nbytes: int


@dataclass
class Bar:
    name: str
    segments: list[Segment]
    notes: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(s.nbytes for s in self.segments)

    def non_kv(self) -> list[Segment]:
        return [s for s in self.segments if s.category not in ("kv", "headroom")]


def _take(remaining: int, want: int) -> int:
    return max(0, min(remaining, want))


def _split_consumed(consumed: int, weights: int, non_torch: int,
                    parts: list[tuple[str, str, int]], notes: list[str],
                    whose: str) -> list[Segment]:
    """Split `consumed` bottom to top into weights, non-torch, other consumed (the rest), then
    `parts`. What wcprof measured itself (the workspace tensors, post-profile buffers) is taken
    first, then non-torch, then vLLM's weights figure, which can include load-time temporaries
    freed before the sweep (seen with fp8 weights); each is clamped to what is left, with a
    note, so the bar always adds up."""
    remaining = max(0, consumed)
    taken: list[Segment] = []
    for category, label, want in parts:
        got = _take(remaining, want)
        remaining -= got
        if got < want:
            notes.append(f"{whose} {label} ({fmt_bytes(want)}) exceeds what the consumed figure "
                         f"leaves; drawn as {fmt_bytes(got)}")
        taken.append(Segment(category, label, got))
    nt = _take(remaining, non_torch)
    remaining -= nt
    w = _take(remaining, weights)
    remaining -= w
    if w < weights:
        notes.append(f"vLLM reports {fmt_bytes(weights)} of weights, more than {whose} consumed "
                     f"memory leaves for them ({fmt_bytes(w)}; load-time temporaries?): drawn as "
                     f"{fmt_bytes(w)}")
    other = "other consumed" if weights else "process memory (weights, runtime)"
    return [Segment("weights", "weights", w), Segment("non_torch", "non-torch", nt),
            Segment("other", other, remaining), *taken]


def card_bars(report: Report) -> tuple[Bar, Bar]:
    """(stock, worst-case): the requested memory, bottom to top.

    worst-case: consumed (weights, non-torch, other, workspace per slot, post-profile buffers)
    + worst-case transient + CUDA graphs + margin + KV cache + headroom (budget the KV cache
    does not use). It sums to requested_bytes exactly, unless the KV cache exceeds the budget
    (an explicit --kv-cache-memory-bytes too large, or a budget below zero): then it overshoots
    requested, which is the point.

    stock: vLLM's own KV figure + its profile step (transient + the workspace it left) + CUDA
    graphs; the rest of requested is what stock counted as consumed, drawn with the same
    weights and non-torch as the worst-case bar, the remainder as other consumed. With an
    explicit --kv-cache-memory-bytes stock takes that size without a budget: its consumed is
    this process's (the worst-case bar's), and what the size leaves of requested is headroom."""
    adm, wc, stock = report.admission, report.worstcase, report.stock

    notes: list[str] = []
    slots = wc.workspace_slots
    if slots and sum(s.bytes_after for s in slots) == wc.workspace_bytes:
        ws_parts = [("workspace", f"workspace u{s.ubatch}/l{s.lane}", s.bytes_after)
                    for s in slots]
    else:
        ws_parts = [("workspace", "workspace", wc.workspace_bytes)]
    parts = [*ws_parts, ("post_profile", "post-profile buffers", wc.post_profile_bytes)]
    consumed = _split_consumed(adm.consumed_bytes, adm.weights_bytes, adm.non_torch_bytes,
                               parts, notes, "the")
    weights, non_torch = consumed[0].nbytes, consumed[1].nbytes
    worst_segments = consumed + [
        Segment("transient", "worst-case transient", max(0, transient_bytes(report))),
        Segment("cudagraph", "CUDA graphs", adm.cudagraph_bytes),
        Segment("margin", "margin", adm.margin_bytes),
        Segment("kv", "KV cache", adm.kv_cache_bytes),
        Segment("headroom", "headroom", max(0, adm.budget_bytes - adm.kv_cache_bytes)),
    ]
    if adm.kv_cache_bytes > adm.budget_bytes:
        notes.append(f"KV cache {fmt_bytes(adm.kv_cache_bytes)} exceeds the worst-case budget "
                     f"{fmt_bytes(adm.budget_bytes)} by "
                     f"{fmt_bytes(adm.kv_cache_bytes - adm.budget_bytes)}")
    worst = Bar("worst-case", [s for s in worst_segments if s.nbytes > 0], notes)

    snotes: list[str] = []
    explicit = adm.explicit_kv_cache_memory_bytes is not None
    stock_consumed = adm.consumed_bytes if explicit else (
        adm.requested_bytes - adm.stock_kv_cache_bytes - stock.peak_activation_bytes
        - adm.cudagraph_bytes)
    stock_segments = _split_consumed(
        stock_consumed, weights, non_torch,
        [("workspace", "workspace (stock step)", stock.workspace_bytes)], snotes, "stock's")
    stock_segments += [
        Segment("transient", "stock profile transient", stock.peak_activation_bytes),
        Segment("cudagraph", "CUDA graphs", adm.cudagraph_bytes),
        Segment("kv", "KV cache", adm.stock_kv_cache_bytes),
    ]
    if explicit:  # no budget: what the explicit size leaves of requested is unused
        stock_segments.append(Segment("headroom", "headroom", max(
            0, adm.requested_bytes - sum(seg.nbytes for seg in stock_segments))))
    return Bar("stock", [s for s in stock_segments if s.nbytes > 0], snotes), worst


# --------------------------------------------------------------------------- drawing

def _matplotlib():
    try:
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ConfigError("--html and --png need matplotlib",
                          hint="pip install 'worstcase_profiler[picture]' (make venv does this)"
                          ) from e
    return Figure


def _byte_axis(axis) -> None:
    """Ticks at round values of one unit (MiB below 4 GiB, else GiB), every label in that unit:
    0 / 256 / 512 MiB or 0 / 20 / 40 GiB, never 204.80 MiB."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    state = {"unit": MiB}

    class ByteLocator(MaxNLocator):
        def tick_values(self, vmin, vmax):
            top = max(abs(vmin), abs(vmax))
            unit = GiB if top >= 4 * GiB else MiB if top >= MiB else 1024
            state["unit"] = unit
            ticks = super().tick_values(vmin / unit, vmax / unit) * unit
            return ticks[ticks >= 0]  # sizes are never negative (the band below 0 is the strip)

    def label(v, _pos) -> str:
        unit = state["unit"]
        name = {GiB: "GiB", MiB: "MiB", 1024: "KiB"}[unit]
        n = v / unit
        return f"{n:.0f} {name}" if abs(n - round(n)) < 1e-6 else f"{n:.1f} {name}"

    axis.set_major_locator(ByteLocator(nbins=6, steps=[1, 2, 2.5, 4, 5, 10]))
    axis.set_major_formatter(FuncFormatter(label))


def _token_axis(axis, xmax: int) -> None:
    """Ticks at quarters of xmax when that is a whole number (powers of two stay powers of
    two: 2,048 / 4,096 rather than 1,500 / 3,000)."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator, MultipleLocator

    if xmax >= 4 and xmax % 4 == 0:
        axis.set_major_locator(MultipleLocator(xmax // 4))
    else:
        axis.set_major_locator(MaxNLocator(nbins=6, integer=True, min_n_ticks=3))
    axis.set_major_formatter(FuncFormatter(lambda v, _pos: fmt_tokens(int(round(v)))))


def build_figure(report: Report):
    """The matplotlib Figure (no pyplot)."""
    Figure = _matplotlib()
    view = build_view(report)  # the value to paste, as the terminal and HTML show it
    advice = report.advice is not None and bool(report.advice.candidates)
    fit = view.fit is not None and bool(view.fit.points)
    ratios = [1.0, 1.9, 2.1] + ([1.8] if advice else []) + ([2.0] if fit else [])
    fig = Figure(figsize=(14, (18 if advice else 13.5) + (5.5 if fit else 0)), dpi=100,
                 layout="constrained")
    grid = fig.add_gridspec(len(ratios), 2, height_ratios=ratios)
    if advice:
        _draw_advice(fig.add_subplot(grid[3, :]), report)
    if fit:
        _draw_fit(fig.add_subplot(grid[len(ratios) - 1, :]), view.fit)
    ax_card = fig.add_subplot(grid[0, :])
    ax_fall = fig.add_subplot(grid[1, :])
    ax_rows = fig.add_subplot(grid[2, 0])
    ax_ctx = fig.add_subplot(grid[2, 1])

    cfg = report.config
    verdict = report.verdict
    import textwrap

    # bold 15 pt runs about 0.62 em a character: wrap the long line to the figure's width
    width = max(40, int(fig.get_figwidth() * 72 / (15 * 0.62)))
    fig.suptitle(f"{verdict}  —  {short_model(cfg.model)}   "
                 f"max_model_len={fmt_tokens(cfg.max_model_len)}"
                 f"  max_num_batched_tokens={fmt_tokens(cfg.max_num_batched_tokens)}"
                 f"  max_num_seqs={cfg.max_num_seqs}\n"
                 + textwrap.fill(f"recommended: {view.flag}  {view.flag_note}", width,
                                 break_on_hyphens=False, break_long_words=False),
                 fontsize=15, fontweight="bold", color=VERDICT_COLOURS[verdict])
    stock_bar, worst_bar = card_bars(report)
    _draw_card(ax_card, report, stock_bar, worst_bar)
    _draw_waterfall(ax_fall, report, stock_bar, worst_bar)
    _draw_rows(ax_rows, report)
    _draw_context(ax_ctx, report)
    notes = worst_bar.notes + stock_bar.notes
    foot = (f"{report.device.name} · vLLM {report.vllm_version} "
            f"({report.runner.runner} runner) · {parallel_text(cfg)} · "
            f"wcprof {report.tool_version} · {report.created_at}")
    if notes:
        foot = "note: " + "; ".join(notes) + "\n" + foot
    fig.text(0.5, -0.005, foot, ha="center", va="top", fontsize=8.5, color="#555555", wrap=True)
    return fig


# A 9-point character's share of the card's width (about 0.075 in of 12 in): a label longer than
# its segment would run over the next one and the axis labels (the legend names it anyway).
LABEL_FRACTION_PER_CHAR = 0.0065


def _draw_card(ax, report: Report, stock_bar: Bar, worst_bar: Bar) -> None:
    adm = report.admission
    total = max(adm.requested_bytes, stock_bar.total, worst_bar.total)
    bars = [(1, stock_bar, adm.kv_tokens_stock), (0, worst_bar, adm.kv_tokens_worstcase)]
    for y, bar, tokens in bars:
        left = 0
        for seg in bar.segments:
            colour = CATEGORIES[seg.category][0]
            hatch = "//" if seg.category == "headroom" else None
            ax.barh(y, seg.nbytes, left=left, height=0.62, color=colour, edgecolor="#333333",
                    linewidth=0.6, hatch=hatch)
            frac = seg.nbytes / total if total else 0
            if seg.category == "kv" and frac > 0.25:
                ax.text(left + seg.nbytes / 2, y, f"KV cache {fmt_bytes(seg.nbytes)}\n"
                        f"{fmt_tokens(tokens)} tokens", ha="center", va="center", fontsize=10.5,
                        fontweight="bold")
            elif frac > max(0.12, LABEL_FRACTION_PER_CHAR * len(seg.label)):  # inside it only
                ax.text(left + seg.nbytes / 2, y, f"{seg.label}\n{fmt_bytes(seg.nbytes)}",
                        ha="center", va="center", fontsize=9)
            left += seg.nbytes
        non_kv = sum(s.nbytes for s in bar.non_kv())
        ax.text(0.003 * total, y - 0.42, f"non-KV total {fmt_bytes(non_kv)} (all but the KV "
                f"cache and headroom; parts in the waterfall below)", ha="left", va="top",
                fontsize=8.5, color="#333333")
    ax.axvline(adm.requested_bytes, color="black", linestyle="--", linewidth=1)
    ax.text(adm.requested_bytes, 1.47, f"requested {fmt_bytes(adm.requested_bytes)}",
            ha="right", va="bottom", fontsize=9)
    from matplotlib.patches import Patch

    visible = {s.category: (s.label if s.category == "other" else CATEGORIES[s.category][1])
               for bar in (stock_bar, worst_bar) for s in bar.segments
               if total and s.nbytes / total >= VISIBLE_SHARE}
    ax.legend(handles=[Patch(facecolor=c, edgecolor="#333333", hatch="//" if k == "headroom"
                             else None, label=visible[k])
                       for k, (c, _lbl) in CATEGORIES.items() if k in visible],
              loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=10, fontsize=9,
              frameon=False)
    ax.set_yticks([1, 0], ["stock", "worst-case"], fontsize=11)
    ax.set_ylim(-0.75, 1.75)
    ax.set_xlim(0, total * 1.005)
    _byte_axis(ax.xaxis)
    ax.set_title("the card: where requested memory goes (to scale)", loc="left", fontsize=12)
    ax.spines[["top", "right"]].set_visible(False)


def _draw_waterfall(ax, report: Report, stock_bar: Bar, worst_bar: Bar) -> None:
    """Non-KV reservations as a waterfall: one slot per category, stock (left, hatched) and
    worst-case (right) side by side, each step floating on its bar's running total, the total
    at the end. Several segments of one category (workspace slots) stack inside one slot."""
    from matplotlib.patches import Patch

    present = {s.category for bar in (stock_bar, worst_bar) for s in bar.non_kv()}
    order = [c for c in CATEGORIES if c in present]
    width = 0.38
    top = 0
    for offset, bar in ((-width / 2, stock_bar), (width / 2, worst_bar)):
        is_stock = bar is stock_bar
        running = 0
        for i, cat in enumerate(order):
            segs = [s for s in bar.non_kv() if s.category == cat]
            if not segs:
                continue
            for j, seg in enumerate(segs):
                ax.bar(i + offset, seg.nbytes, bottom=running, width=width * 0.95,
                       color=CATEGORIES[cat][0], edgecolor="#333333", linewidth=0.6,
                       hatch="xx" if is_stock else ("\\\\" if j % 2 else None),
                       alpha=0.55 if is_stock else 1)
                running += seg.nbytes
            # one figure a bar, as wide as the bar: several segments (the workspace slots, told
            # apart by their hatching and counted in the slot's name) are labelled with their
            # sum; each slot's size is in the report's workspace line
            ax.text(i + offset, running,
                    fmt_bytes(sum(seg.nbytes for seg in segs)).replace(" ", "\n"),
                    ha="center", va="bottom", fontsize=8)
        n = len(order)
        ax.bar(n + offset, running, width=width * 0.95,
               color="#bbbbbb" if is_stock else "#444444", edgecolor="#333333", linewidth=0.6,
               hatch="xx" if is_stock else None)
        ax.text(n + offset, running, fmt_bytes(running).replace(" ", "\n"), ha="center",
                va="bottom", fontsize=9, fontweight="bold")
        top = max(top, running)
    names = []
    for cat in order:
        name = WATERFALL_NAMES.get(cat, CATEGORIES[cat][1])
        slots = sum(1 for s in worst_bar.non_kv() if s.category == cat)
        if cat == "workspace" and slots > 1:
            name += f"\n({slots} slots)"
        names.append(name)
    ax.set_xticks(range(len(order) + 1), names + ["non-KV\ntotal"], fontsize=9.5)
    ax.set_ylim(0, top * 1.18 if top else 1)
    _byte_axis(ax.yaxis)
    ax.grid(axis="y", color="#e5e5e5", linewidth=0.8)
    ax.set_axisbelow(True)
    ax.legend(handles=[Patch(facecolor="#dddddd", edgecolor="#333333", hatch="xx",
                             label="stock (left of each pair)"),
                       Patch(facecolor="#777777", edgecolor="#333333",
                             label="worst-case (right of each pair)")],
              loc="best", fontsize=9, frameon=False)
    adm = report.admission
    ax.set_title(f"everything but the KV cache (waterfall): worst-case transient "
                 f"{fmt_bytes(transient_bytes(report))} vs stock "
                 f"{fmt_bytes(report.stock.peak_activation_bytes)}; worst-case KV "
                 f"{signed(adm.kv_cache_bytes - adm.stock_kv_cache_bytes)} vs stock",
                 loc="left", fontsize=12)
    ax.spines[["top", "right"]].set_visible(False)


def _draw_reference_lines(ax, report: Report) -> None:
    ax.axhline(report.stock.need_bytes, color="#b2182b", linestyle="--", linewidth=1.4,
               label=f"stock reserves {fmt_bytes(report.stock.need_bytes)} (profile peak + workspace)")
    ax.axhline(report.worstcase.need_bytes, color="#1b7837", linestyle=":", linewidth=1.6,
               label=f"worst-case reserves {fmt_bytes(report.worstcase.need_bytes)} (peak + workspace)")


def _draw_rows(ax, report: Report) -> None:
    wc = report.worstcase
    sweep = full_extent_prefill(report)
    strip = _coverage_strip(ax, report)
    if sweep:
        xs = [s.shape.rows for s in sweep]
        ax.plot(xs, [s.peak_bytes for s in sweep], color="#fdae6b", linewidth=1,
                label="transient only")
        ax.plot(xs, [s.need_bytes for s in sweep], color="#D55E00", linewidth=1.6, marker="o",
                markersize=3, label=f"need = transient + workspace ({len(sweep)} rows executed)")
    markers = {"decode": ("s", "#6a3d9a"), "mixed": ("D", "#1f78b4")}
    steps = plan_steps(report)
    for step in steps:
        if step.shape.kind in markers:
            m, c = markers[step.shape.kind]
            label = (f"{step.shape.kind}: {step.shape.num_reqs} reqs at ctx "
                     f"{fmt_tokens(step.shape.context_len)}")
            ax.plot([step.shape.rows], [step.need_bytes], marker=m, color=c, linestyle="none",
                    markersize=6, zorder=6, label=label)
            markers.pop(step.shape.kind)
    encoder = encoder_mark(report)
    if encoder is not None:
        rows, need, label = encoder
        ax.plot([rows], [need], marker="P", color="#e7298a", markersize=10, linestyle="none",
                zorder=7, label=label)
    _draw_reference_lines(ax, report)
    worst = _find_step(steps, wc.worst_shape)
    if worst is not None:
        ax.plot([worst.shape.rows], [worst.need_bytes], marker="*", color="black", markersize=16,
                linestyle="none", zorder=5, label=f"worst: {shape_text(worst.shape)}")
    ax.set_xlim(0, report.config.max_num_batched_tokens * 1.02)
    _finish_step_axes(ax, report, "rows in the step (prefill chunk at full KV extent)",
                      report.config.max_num_batched_tokens, strip)
    ax.set_title("what a step needs vs its rows value", loc="left", fontsize=12)


def encoder_mark(report: Report) -> tuple[int, int, str] | None:
    """(rows, need, legend label) of the encoder step on the rows panel (core/multimodal.
    EncoderStep: its items through the encoder, then the worst text step with their outputs
    held), and which multimodal limits the report says were not profiled; None without one."""
    wc = report.worstcase
    enc = wc.encoder_step
    if enc is None:
        return None
    verdict = standing(enc)
    missing = any(w.startswith("multimodal steps") for w in report.warnings)
    label = (f"encoder step: {enc.items} {enc.modality} item(s) of {fmt_tokens(enc.tokens_per_item)}"
             f" tokens,\nthen {enc.text_shape} ({verdict}"
             + ("; other multimodal limits not profiled: warnings)" if missing else
                "; every multimodal limit profiled)"))
    return wc.worst_shape.rows, encoder_need(enc) + wc.workspace_bytes, label


def _coverage_strip(ax, report: Report) -> list:
    """A strip along the bottom of the rows axes: chord-certified segments in alternating
    blues (so each segment's ends show), fully executed segments in orange."""
    from matplotlib.patches import Patch

    cov = report.worstcase.coverage
    chord, executed = [], []
    for seg in cov.segments:
        (chord if seg.how == "chord" else executed).append((seg.lo, max(seg.hi - seg.lo, 1)))
    band = ax.get_xaxis_transform()  # x in data, y in axes fraction
    if chord:
        ax.broken_barh(chord[0::2], (0, 0.045), transform=band, color="#6baed6", linewidth=0)
        ax.broken_barh(chord[1::2], (0, 0.045), transform=band, color="#c6dbef", linewidth=0)
    if executed:
        ax.broken_barh(executed, (0, 0.045), transform=band, color="#e6550d", linewidth=0)
    return [Patch(color="#6baed6", label=f"strip: {len(chord)} segments certified by chord "
                  f"(tolerance {fmt_bytes(cov.tolerance_bytes)})"),
            Patch(color="#e6550d", label="strip: every rows value executed")]


def _draw_context(ax, report: Report) -> None:
    wc, adm = report.worstcase, report.admission
    curve = sorted(wc.context_curve, key=lambda s: s.shape.context_len)
    if curve:
        rows = curve[-1].shape.rows
        ax.plot([s.shape.context_len for s in curve], [s.need_bytes for s in curve],
                color="#D55E00", linewidth=1.8, marker="o", markersize=5,
                label=f"need at rows={fmt_tokens(rows)}")
        ax.plot([s.shape.context_len for s in curve], [s.peak_bytes for s in curve],
                color="#fdae6b", linewidth=1, label="transient only")
        worst = next((s for s in curve if s.shape == wc.worst_shape), None)
        if worst is not None:
            ax.plot([worst.shape.context_len], [worst.need_bytes], marker="*", color="black",
                    markersize=16, linestyle="none", label="worst shape")
    else:
        ax.text(0.5, 0.5, "no context curve in this report", transform=ax.transAxes,
                ha="center", va="center", color="#555555")
    if wc.check_steps:  # the steps named (check_steps), each at its own context
        ax.plot([c.shape.context_len for c in wc.check_steps],
                [c.need_bytes for c in wc.check_steps], marker="D", color="#0072B2",
                markersize=8, linestyle="none", label="check steps (named, rows@context)")
        for c in wc.check_steps:
            ax.annotate(f"{c.shape.rows}@{c.shape.context_len}",
                        xy=(c.shape.context_len, c.need_bytes), xytext=(6, -12),
                        textcoords="offset points", color="#0072B2", fontsize=8.5)
    _draw_reference_lines(ax, report)
    if adm.stock_oom_context_len == 0:
        ax.text(0.02, 0.93, "stock is short at every context length, even an empty KV cache",
                transform=ax.transAxes, ha="left", va="top", color="#b2182b", fontsize=9.5,
                fontweight="bold")
    elif adm.stock_oom_context_len is not None:
        ax.axvline(adm.stock_oom_context_len, color="#b2182b", linewidth=1.2)
        ax.annotate(f"stock runs out at ctx {fmt_tokens(adm.stock_oom_context_len)}",
                    xy=(adm.stock_oom_context_len, report.stock.need_bytes), xytext=(8, 10),
                    textcoords="offset points", color="#b2182b", fontsize=9.5,
                    fontweight="bold")
    else:
        ax.text(0.98, 0.04, f"stock holds up to max_model_len "
                f"{fmt_tokens(report.config.max_model_len)}", transform=ax.transAxes,
                ha="right", va="bottom", color="#1b7837", fontsize=9.5)
    ax.set_xlim(-0.01 * report.config.max_model_len, report.config.max_model_len * 1.02)
    _finish_step_axes(ax, report, "KV extent already cached (tokens)",
                      report.config.max_model_len)
    ax.set_title("what the worst rows value needs as the context grows", loc="left",
                 fontsize=12)


def _finish_step_axes(ax, report: Report, xlabel: str, xmax: int, extra=()) -> None:
    lo, hi = ax.get_ylim()
    top = max(hi, report.worstcase.need_bytes, report.stock.need_bytes) * 1.12
    # a band below zero for the rows coverage strip, so it never hides a measurement
    ax.set_ylim(-0.07 * top if extra else 0, top)
    _byte_axis(ax.yaxis)
    _token_axis(ax.xaxis, xmax)
    ax.set_xlabel(xlabel)
    ax.grid(axis="y", color="#e5e5e5", linewidth=0.8)
    ax.set_axisbelow(True)
    handles, _labels = ax.get_legend_handles_labels()
    ax.legend(handles=[*handles, *extra], loc="upper left", bbox_to_anchor=(0.0, -0.13),
              fontsize=8.5, frameon=False, ncol=1)
    ax.spines[["top", "right"]].set_visible(False)


def _draw_advice(ax, report: Report) -> None:
    """KV tokens admitted per candidate chunk (left axis) against prefill tokens per second at
    long context (right axis), both scaled to their own range so small differences show; the
    configured chunk and the knee marked, each point labelled with its worst-case need."""
    from matplotlib.ticker import FuncFormatter

    from .view import advice_headline

    advice = report.advice
    cands = advice.candidates
    xs = list(range(len(cands)))
    kv = [c.kv_tokens for c in cands]
    ax.plot(xs, kv, color="#1b7837", marker="s", markersize=7, linewidth=1.8,
            label="KV tokens admitted (left)")
    for x, c in zip(xs, cands):
        if not c.fits:
            ax.plot([x], [c.kv_tokens], marker="x", color="#b2182b", markersize=12,
                    linestyle="none")
        ax.annotate(f"{fmt_tokens(c.kv_tokens)}\nneed {fmt_bytes(c.need_bytes)}",
                    (x, c.kv_tokens), xytext=(0, 9), textcoords="offset points", ha="center",
                    va="bottom", fontsize=8.5, color="#1b7837")
    lo, hi = min(kv), max(kv)
    pad = (hi - lo) * 0.35 or max(hi * 0.05, 1)
    ax.set_ylim(lo - pad, hi + pad * 1.6)
    ax.set_xticks(xs, [fmt_tokens(c.chunk) + ("\n(configured)" if c.chunk ==
                                               advice.configured_chunk else "")
                       for c in cands], fontsize=9.5)
    ax.set_xlim(-0.5, len(cands) - 0.5)
    ax.set_xlabel("max_num_batched_tokens (candidate chunk)")
    ax.set_ylabel("KV tokens admitted", color="#1b7837")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _p: fmt_tokens(int(round(v)))))
    rate = ax.twinx()
    timed = [(x, c.prefill_tokens_per_s) for x, c in zip(xs, cands) if c.prefill_tokens_per_s]
    if timed:
        rate.plot([t[0] for t in timed], [t[1] for t in timed], color="#0072B2", marker="o",
                  linewidth=1.8, label="prefill tokens/s at long context (right)")
        best = max(t[1] for t in timed)
        rate.axhline(best * (1 - advice.within), color="#0072B2", linestyle=":", linewidth=1,
                     label=f"{advice.within:.0%} below the best throughput")
        rate.set_ylim(0, best * 1.3)
    rate.set_ylabel("prefill tokens / s", color="#0072B2")
    rate.yaxis.set_major_formatter(FuncFormatter(lambda v, _p: fmt_tokens(int(round(v)))))
    knee = advice.candidate(advice.knee_chunk)
    if knee is not None:
        ax.axvline(cands.index(knee), color="black", linewidth=1.2, linestyle="--",
                   label=f"knee: {fmt_tokens(knee.chunk)}")
    chunks = [c.chunk for c in cands]
    if advice.configured_chunk in chunks:
        at = chunks.index(advice.configured_chunk)
        ax.axvspan(at - 0.4, at + 0.4, color="#eeeeee", zorder=0)
    handles = ax.get_legend_handles_labels()[0] + rate.get_legend_handles_labels()[0]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(0.0, -0.16), ncol=4,
              fontsize=8.5, frameon=False)
    ax.set_title(advice_headline(advice), loc="left", fontsize=11, wrap=True)
    ax.spines[["top"]].set_visible(False)
    rate.spines[["top"]].set_visible(False)


FIT_STYLES = {  # kind -> marker, colour, size, legend label
    "infeasible": ("x", "#b2182b", 8, "weighed: does not fit, or holds fewer than asked"),
    "feasible": ("o", "#bbbbbb", 6, "weighed: feasible, off the frontier"),
    "frontier": ("o", "#0072B2", 9, "on the frontier"),
    "recommended": ("*", "black", 18, "recommended"),
}


def _shell_lines(line: str, width: int = 120) -> str:
    """A serve line broken between flags (a flag stays with its value), each break a shell
    continuation, so a long one wraps where it can still be pasted."""
    words, out, current = line.split(" "), [], ""
    groups = []
    for w in words:
        if groups and not w.startswith("--") and groups[-1].startswith("--") \
                and " " not in groups[-1]:
            groups[-1] += " " + w
        else:
            groups.append(w)
    for g in groups:
        if current and len(current) + 1 + len(g) > width:
            out.append(current + " \\")
            current = "    " + g
        else:
            current = f"{current} {g}" if current else g
    return "\n".join(out + [current])


def _draw_fit(ax, fit) -> None:
    """The fit's frontier (view.FitView): max_model_len (log 2) against the requests at full
    length held at once, the frontier's staircase, its candidates labelled (chunk, max_num_seqs,
    prefill rate), the recommendation starred, the others weighed beneath, the requests asked as
    a dashed line; the recommended serve line (or why there is none) in the title."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    if fit.staircase:
        ax.step([p[0] for p in fit.staircase], [p[1] for p in fit.staircase], where="pre",
                color="#0072B2", linewidth=1.4, alpha=0.6, zorder=2,
                label="frontier: the most requests at that context or longer")
    shown = set()
    for p in fit.points:
        marker, colour, size, label = FIT_STYLES[p.kind]
        ax.plot([p.max_model_len], [p.requests], marker=marker, color=colour,
                markersize=size, linestyle="none", markeredgewidth=1.8 if marker == "x" else 1,
                zorder={"infeasible": 3, "feasible": 3, "frontier": 4}.get(p.kind, 5),
                label=None if p.kind in shown else label)
        shown.add(p.kind)
    ax.axhline(fit.min_concurrency, color="#b2182b", linestyle="--", linewidth=1.2, zorder=1,
               label=f"requests asked: at least {fit.min_concurrency} (--min-concurrency)")
    lengths = sorted({p.max_model_len for p in fit.points})
    ax.set_xscale("log", base=2)
    # room right of the longest for its label: a fifth of the axis, at least 0.68 octave
    left = lengths[0] / 1.25
    right = lengths[-1] * 2 ** max(0.68, math.log2(lengths[-1] / left) / 4)
    ax.set_xlim(left, right)
    ticks = [2 ** k for k in range(lengths[0].bit_length() - 1, lengths[-1].bit_length() + 1)
             if left <= 2 ** k <= right]
    ax.xaxis.set_major_locator(FixedLocator(sorted(set(ticks) | {lengths[-1]})))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _p: fmt_tokens(int(round(v)))))
    # labels above and right of their point, clear of the staircase (which runs right of a
    # point at the next one's height, lower)
    for p in fit.points:
        if p.label:
            ax.annotate(p.label, (p.max_model_len, p.requests), xytext=(8, 7),
                        textcoords="offset points", ha="left", va="bottom", fontsize=8.5,
                        color="black" if p.kind == "recommended" else "#0072B2",
                        fontweight="bold" if p.kind == "recommended" else "normal", zorder=6,
                        bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.85,
                              "pad": 1.5})
    top = max([p.requests for p in fit.points] + [fit.min_concurrency])
    ax.set_ylim(0, top * 1.3 + 1)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _p: fmt_tokens(int(round(v)))))
    ax.set_xlabel("max_model_len (tokens, log scale)")
    ax.set_ylabel("requests at full length at once")
    ax.grid(color="#e5e5e5", linewidth=0.8)
    ax.set_axisbelow(True)
    ax.legend(loc="upper left", bbox_to_anchor=(0.0, -0.16), ncol=3, fontsize=8.5,
              frameon=False)
    line = _shell_lines(f"recommended: {fit.flags}") if fit.flags else fit.headline
    ax.set_title(f"{line}\n{fit.chart_title}", loc="left", fontsize=11, wrap=True,
                 color="black" if fit.flags else "#b2182b")
    ax.spines[["top", "right"]].set_visible(False)


def _find_step(steps: list[StepResult], shape: Shape) -> StepResult | None:
    found = [s for s in steps if s.shape == shape]
    return max(found, key=lambda s: s.need_bytes) if found else None


def figure_bytes(report: Report, fmt: str) -> bytes:
    """Render to 'png' or 'svg' bytes. SVG keeps its text as text (searchable, selectable) and
    carries no date, so the same report gives the same file."""
    import matplotlib

    fig = build_figure(report)
    buf = io.BytesIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "wcprof"}):
        if fmt == "png":
            fig.savefig(buf, format="png", dpi=100, metadata={"Software": None},
                        bbox_inches="tight", pad_inches=0.25, facecolor="white")
        else:
            fig.savefig(buf, format=fmt, metadata={"Date": None}, bbox_inches="tight",
                        pad_inches=0.25, facecolor="white")
    return buf.getvalue()
