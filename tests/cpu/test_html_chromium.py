"""The HTML report in a real browser: headless Chromium opens the file offline (no network, no
extensions), and the key numbers must be in the rendered DOM and the screenshot must show the
page (verdict badge colour, figure) rather than a blank or an error page.

Needs Debian's `chromium` package (`apt-get install -y chromium`); skipped with that reason when
it is absent. The report is a real one: tests/unit/data/h200_dsv32_fp8.json (H200, vLLM 0.26)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from worstcase_profiler.render import get_reporter, load_report  # noqa: E402
from worstcase_profiler.render.picture import VERDICT_COLOURS  # noqa: E402
from worstcase_profiler.sizes import fmt_bytes, fmt_tokens  # noqa: E402

REPORT = Path(__file__).resolve().parents[1] / "unit" / "data" / "h200_dsv32_fp8.json"
CHROMIUM = next((p for p in (shutil.which("chromium"), shutil.which("chromium-browser"),
                             "/usr/bin/chromium") if p and os.access(p, os.X_OK)), None)
WINDOW = (1400, 2600)

pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="chromium is not installed: the HTML report is checked in a real browser "
           "(Debian: apt-get install -y chromium)")


def chromium(user_data: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
           "--no-first-run", "--disable-background-networking", "--disable-component-update",
           "--disable-sync", f"--user-data-dir={user_data}", "--hide-scrollbars", *args]
    env = dict(os.environ, HOME=str(user_data))
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("html")
    report = load_report(REPORT)
    page = tmp / "report.html"
    get_reporter("html").write(report, page)
    url = page.as_uri()
    dom = chromium(tmp / "profile-dom", "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    shot = tmp / "screenshot.png"
    run = chromium(tmp / "profile-shot", f"--window-size={WINDOW[0]},{WINDOW[1]}",
                   f"--screenshot={shot}", url)
    assert run.returncode == 0 and shot.exists(), run.stderr[-2000:]
    return report, dom.stdout, shot


def test_key_numbers_in_the_rendered_dom(rendered):
    report, dom, _ = rendered
    adm, wc = report.admission, report.worstcase
    assert report.verdict == "STOCK UNSAFE"
    for needle in [
        'id="verdict"', "STOCK UNSAFE",
        f"--kv-cache-memory-bytes {adm.recommended_kv_cache_memory_bytes}",
        f"worst-case peak {fmt_bytes(wc.peak_activation_bytes)} vs stock peak "
        f"{fmt_bytes(report.stock.peak_activation_bytes)}",
        fmt_tokens(adm.kv_tokens_worstcase), fmt_tokens(adm.kv_tokens_stock),
        "stock is short at every context length",  # this report's stock runs out at ctx 0
    ]:
        assert needle in dom, needle
    # the inline SVG figure made it into the DOM with its text as text
    assert "<svg" in dom and "</svg>" in dom
    for needle in ["the card: where requested memory goes",
                   f"KV cache {fmt_bytes(adm.kv_cache_bytes)}",
                   "what a step needs vs its rows value",
                   "stock is short at every context length, even an empty KV cache"]:
        assert needle in dom, needle


def test_screenshot_shows_the_page(rendered):
    Image = pytest.importorskip("PIL.Image")
    _, _, shot = rendered
    assert shot.stat().st_size > 50_000
    with Image.open(shot) as img:
        rgb = img.convert("RGB")
        assert rgb.size == WINDOW
        counts = rgb.getcolors(maxcolors=WINDOW[0] * WINDOW[1])  # [(count, (r, g, b)), ...]
    colours = {c for _, c in counts}
    non_white = sum(n for n, c in counts if sum(c) < 3 * 245) / (WINDOW[0] * WINDOW[1])
    assert non_white > 0.05, f"page looks blank: {non_white:.1%} non-white"
    assert len(colours) > 200, f"only {len(colours)} colours: no figure drawn?"
    badge = VERDICT_COLOURS["STOCK UNSAFE"].lstrip("#")
    assert tuple(int(badge[i:i + 2], 16) for i in (0, 2, 4)) in colours, "verdict badge missing"
    # the figure's KV-cache green (render/picture.py CATEGORIES["kv"]) is on screen
    assert (0xB8, 0xE0, 0xB0) in colours
