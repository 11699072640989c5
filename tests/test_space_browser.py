"""The Space in a real browser: headless Debian chromium driven by playwright.

Loads the page (placeholder recorded results, as in test_space.py), measures how
long until it is interactive, runs both tabs' recorded flow, checks a plot image
and the table are drawn, that bad input shows a warning (not a traceback), and
saves a screenshot of each tab to env ``PM_SCREENSHOT_DIR`` (default: pytest's
tmp dir). Never runs ``playwright install``: it uses /usr/bin/chromium.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from test_space import PLACEHOLDER_GPU, start_app, stop_app, write_placeholders

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(),
                                reason="needs Debian's chromium at /usr/bin/chromium (apt-get install -y chromium)")
sync_api = pytest.importorskip("playwright.sync_api", reason="needs the playwright Python package")


@pytest.fixture(scope="module")
def space(tmp_path_factory):
    directory = write_placeholders(tmp_path_factory.mktemp("recorded"))
    start = time.monotonic()
    proc, url, ready_s = start_app(directory, tmp_path_factory.mktemp("log") / "app.log")
    yield url, start, ready_s
    stop_app(proc)


@pytest.fixture(scope="module")
def screenshot_dir(tmp_path_factory) -> Path:
    directory = Path(os.environ.get("PM_SCREENSHOT_DIR") or tmp_path_factory.mktemp("screenshots"))
    directory.mkdir(parents=True, exist_ok=True)
    return directory


@pytest.fixture(scope="module")
def page(space):
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(30_000)
        yield page
        browser.close()


def _status(page, elem_id: str, text: str):
    """Wait until the Markdown ``elem_id`` contains ``text``; returns its text."""
    locator = page.locator(f"#{elem_id}")
    sync_api.expect(locator).to_contain_text(text, timeout=30_000)
    return locator.inner_text()


def test_page_becomes_interactive(space, page):
    url, server_start, ready_s = space
    start = time.monotonic()
    page.goto(url)
    button = page.locator("#run-benchmark")
    sync_api.expect(button).to_be_enabled()
    sync_api.expect(page.locator("#benchmark-plot img")).to_be_visible()
    load_s = time.monotonic() - start
    print(f"\npage interactive {load_s:.2f} s after navigation; API ready {ready_s:.1f} s after process start; "
          f"{time.monotonic() - server_start:.1f} s from process start to interactive page")
    assert "Recorded-only mode" in page.locator("#header").inner_text()


def test_benchmark_tab(page, screenshot_dir):
    page.locator("#run-benchmark").click()
    text = _status(page, "benchmark-status", "Cannot run live")
    assert PLACEHOLDER_GPU in text
    img = page.locator("#benchmark-plot img")
    sync_api.expect(img).to_be_visible()
    assert img.evaluate("el => el.naturalWidth") > 200
    table = page.locator("#benchmark-table")
    sync_api.expect(table).to_contain_text("persistent")
    sync_api.expect(table).to_contain_text("cuBLAS")
    page.screenshot(path=str(screenshot_dir / "benchmark.png"), full_page=True)


def test_benchmark_bad_input_shows_warning(page):
    page.get_by_role("combobox", name="Shapes").click()
    page.get_by_role("option", name="custom").click()
    page.locator("#custom-shapes textarea").fill("0x16x16")
    page.locator("#run-benchmark").click()
    text = _status(page, "benchmark-status", "⚠️")
    assert "must be at least 1" in text and "Traceback" not in page.content()


def test_timeline_tab(page, screenshot_dir):
    page.get_by_role("tab", name="Timeline").click()
    page.locator("#run-timeline").click()
    text = _status(page, "timeline-status", "Cannot run live")
    assert "Recorded timeline" in text
    img = page.locator("#timeline-plot img")
    sync_api.expect(img).to_be_visible()
    assert img.evaluate("el => el.naturalWidth") > 200
    sync_api.expect(page.locator("#timeline-summary table")).to_contain_text("persistent")
    page.screenshot(path=str(screenshot_dir / "timeline.png"), full_page=True)
    page.locator("#timeline-m textarea").fill("abc")
    page.locator("#run-timeline").click()
    assert "is not a number" in _status(page, "timeline-status", "⚠️")
