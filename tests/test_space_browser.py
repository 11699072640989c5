"""The Space in a real browser: headless Debian chromium driven by playwright.

Loads the page (placeholder recorded results, as in test_space.py), measures how
long until it is interactive (and holds it to INTERACTIVE_BUDGET_S), runs both
tabs' recorded flow, checks a plot image and the table are drawn, that bad input
shows a warning (not a traceback), plays the replay, pauses it, moves its time
slider and switches shapes and pairs, checking that the frame changes each time,
makes the replay's GIF, and saves a screenshot of each tab to env
``PM_SCREENSHOT_DIR`` (default: pytest's tmp dir). Never runs ``playwright
install``: it uses /usr/bin/chromium.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from test_space import PLACEHOLDER_GPU, start_app, stop_app, write_placeholders

CHROMIUM = Path("/usr/bin/chromium")
INTERACTIVE_BUDGET_S = 3.0  # from navigation to a page whose controls answer
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
    assert load_s <= INTERACTIVE_BUDGET_S, f"the page took {load_s:.2f} s to become interactive"


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
    sync_api.expect(table).to_contain_text("host µs/call")
    sync_api.expect(page.locator("#benchmark-headline")).to_contain_text("the speed of tiled")
    page.screenshot(path=str(screenshot_dir / "benchmark-tab.png"), full_page=True)


def test_benchmark_bad_input_shows_warning(page):
    page.get_by_role("combobox", name="Shapes").click()
    page.get_by_role("option", name="custom").click()
    page.locator("#custom-shapes textarea").fill("0x16x16")
    page.locator("#run-benchmark").click()
    text = _status(page, "benchmark-status", "⚠️")
    assert "must be at least 1" in text and "Traceback" not in page.content()


def _frame_src(page) -> str:
    return page.locator("#replay-frame img").get_attribute("src") or ""


def _wait_for_new_frame(page, old: str) -> str:
    """Wait until the replay shows a frame other than ``old``; returns the new one's src.
    On a timeout the failure says where the slider stood, which tells a dropped
    slider event from a slider value overwritten before it was sent."""
    try:
        page.wait_for_function("old => { const img = document.querySelector('#replay-frame img');"
                               " return img && img.src && img.src !== old; }", arg=old, timeout=30_000)
    except sync_api.TimeoutError:
        raise AssertionError(f"no new replay frame within 30 s; the slider reads {_slider_value(page)}") from None
    return _frame_src(page)


def _slider_value(page) -> float:
    return float(page.locator("#replay-slider input[type=number]").input_value())


def _wait_until_still(page, quiet_ms: int = 1500, timeout_s: float = 15.0) -> tuple[float, str]:
    """Wait until slider and frame have not changed for ``quiet_ms``; returns them.
    After Pause, the tick that was running still lands, however slow the machine."""
    deadline = time.monotonic() + timeout_s
    last = (_slider_value(page), _frame_src(page))
    while time.monotonic() < deadline:
        page.wait_for_timeout(quiet_ms)
        now = (_slider_value(page), _frame_src(page))
        if now == last:
            return now
        last = now
    raise AssertionError(f"the replay did not come to rest within {timeout_s:g} s")


def _choose(page, label: str, option: str) -> None:
    page.get_by_role("combobox", name=label).click()
    page.get_by_role("option", name=option).click()


def test_timeline_tab(page, screenshot_dir):
    page.get_by_role("tab", name="Timeline").click()
    page.locator("#run-timeline").click()
    text = _status(page, "timeline-status", "Cannot run live")
    assert "Recorded timeline" in text
    img = page.locator("#timeline-plot img")
    sync_api.expect(img).to_be_visible()
    assert img.evaluate("el => el.naturalWidth") > 200
    sync_api.expect(page.locator("#timeline-summary table")).to_contain_text("persistent")
    sync_api.expect(page.locator("#replay-frame img")).to_be_visible()


def test_replay_plays_pauses_and_follows_the_slider(page):
    first = _frame_src(page)
    start = time.monotonic()
    page.locator("#replay-play").click()
    playing = _wait_for_new_frame(page, first)
    playing = _wait_for_new_frame(page, playing)  # a second tick: it keeps going
    print(f"\ntwo replay frames {time.monotonic() - start:.2f} s after Play")
    page.locator("#replay-pause").click()
    paused_at, paused = _wait_until_still(page)  # a tick already under way may still land
    assert paused_at > 0
    page.wait_for_timeout(2000)
    assert _frame_src(page) == paused and _slider_value(page) == paused_at, "the replay went on after Pause"
    number = page.locator("#replay-slider input[type=number]")
    number.fill("0.5")
    number.press("Tab")  # leaving the box releases the slider
    moved = _wait_for_new_frame(page, paused)
    number.fill(str(paused_at))
    number.press("Tab")
    assert _wait_for_new_frame(page, moved) == paused, "the same time drew a different frame"


def test_switching_shape_and_pair_changes_the_frame(page, screenshot_dir):
    # Each frame to wait past is read before the action that replaces it: read
    # after, it may already be the new one (the replay is paused, so no other
    # frame would follow).
    number = page.locator("#replay-slider input[type=number]")
    at_start = _frame_src(page)
    number.fill("2")
    number.press("Tab")
    before = _wait_for_new_frame(page, at_start)
    _choose(page, "Shape", "aligned: 4096x4096x4096")
    sync_api.expect(page.locator("#timeline-summary")).to_contain_text("4096x4096x4096")
    other_shape = _wait_for_new_frame(page, before)
    assert _slider_value(page) == 0  # a new run starts at its beginning
    _choose(page, "Kernels", "wgmma vs wgmma_persistent")
    sync_api.expect(page.locator("#timeline-summary")).to_contain_text("wgmma_persistent")
    other_pair = _wait_for_new_frame(page, other_shape)
    _choose(page, "Shape", "ragged waves: 3000x3000x3000")
    sync_api.expect(page.locator("#timeline-summary")).to_contain_text("4 (8)")  # split tail: 4 tiles in 8 parts
    ragged = _wait_for_new_frame(page, other_pair)
    # The switch also sets the slider back to 0; a value typed before the page
    # has settled can be overwritten by it and never be sent.
    assert _wait_until_still(page)[0] == 0
    number.fill("3")  # within the wgmma pair's 4 µs
    number.press("Tab")
    _wait_for_new_frame(page, ragged)
    page.locator("#replay-gif-button").click()
    sync_api.expect(page.locator("#replay-gif")).to_contain_text(".gif", timeout=60_000)
    page.screenshot(path=str(screenshot_dir / "timeline-tab.png"), full_page=True)
    _choose(page, "Shape", "decode: 16x4096x4096")
    assert "No timeline to show" in _status(page, "timeline-status", "No timeline to show")


def test_timeline_bad_input_shows_warning(page):
    # M is typed before the shape is picked: picking it shows the recorded view of the
    # custom shape (select_timeline), on a queue of its own, so with a valid M a slow
    # answer to it could land after the button's warning and replace it. With "abc"
    # both events answer with the warning, in either order.
    page.locator("#timeline-m textarea").fill("abc")
    _choose(page, "Shape", "custom (M, N, K below)")
    page.locator("#run-timeline").click()
    assert "is not a number" in _status(page, "timeline-status", "⚠️")
    assert "Traceback" not in page.content()
