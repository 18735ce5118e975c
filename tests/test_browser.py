"""One real-browser test: the dashboard served by ``streamlit run`` in headless Debian Chromium.

It waits for the heatmaps (main page) and the bars (token page) to render on the embedded model,
checks that no error text and no page errors appear, that nothing but bertviz reaches beyond
localhost, and that the bertviz page explains a missing CDN. A second test clicks a cell of the all-heads
chart and checks that the link and the outline follow the picked layer and head. Screenshots go to ``tests/artifacts/``
(git-ignored); ``CWVIZ_UPDATE_SCREENSHOT=1`` also refreshes the README's ``assets/screenshot.png``.

Skips when playwright or ``/usr/bin/chromium`` is missing, unless ``CWVIZ_REQUIRE_BROWSER=1``
(as in CI), where it fails instead.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

import pytest

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "tests" / "artifacts"
CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
LOCAL_HOSTS = {"localhost", "127.0.0.1"}
BERTVIZ_CDN = "cdnjs.cloudflare.com"
CHART = '[data-testid="stVegaLiteChart"]'
RENDERED = f"{CHART} canvas, {CHART} svg.marks"
ERROR_SELECTORS = '[data-testid="stException"], [data-testid="stAlertContentError"]'


def _require_browser():
    """playwright's sync API, or skip (fail under CWVIZ_REQUIRE_BROWSER=1)."""
    required = os.environ.get("CWVIZ_REQUIRE_BROWSER") == "1"
    missing = []
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
        missing.append("the playwright package (pip install playwright)")
    if not Path(CHROMIUM).is_file():
        missing.append(f"{CHROMIUM} (apt-get install chromium)")
    if missing:
        message = "browser test needs " + " and ".join(missing)
        if required:
            pytest.fail(message + "; CWVIZ_REQUIRE_BROWSER=1 makes this a failure")
        pytest.skip(message)
    return sync_playwright


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    port = _free_port()
    log = ARTIFACTS / "server.log"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        "app.py",
        "--server.headless=true",
        f"--server.port={port}",
        "--server.address=127.0.0.1",
        "--server.fileWatcherType=none",  # the rest from .streamlit/config.toml
    ]
    with log.open("w") as out:
        process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as response:
                    if response.read().strip() == b"ok":
                        break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"streamlit did not start; see {log}:\n{log.read_text()[-2000:]}")
            time.sleep(0.5)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()


def _wait_for_charts(page, count: int, timeout_ms: int) -> None:
    page.wait_for_function("([sel, n]) => document.querySelectorAll(sel).length >= n", arg=[RENDERED, count], timeout=timeout_ms)


def _assert_no_error_text(page) -> None:
    assert page.locator(ERROR_SELECTORS).count() == 0, page.locator(ERROR_SELECTORS).all_inner_texts()
    body = page.inner_text("body")
    assert "Traceback" not in body and "Error:" not in body


def test_dashboard_renders_in_chromium(server):
    sync_playwright = _require_browser()
    page_errors: list[str] = []
    outside: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.on("pageerror", lambda err: page_errors.append(str(err)))
            page.on("request", lambda req: outside.append(req.url) if urlparse(req.url).hostname not in LOCAL_HOSTS else None)

            page.goto(server)
            _wait_for_charts(page, 2, timeout_ms=240_000)  # first load: the embedded model, once
            page.get_by_text("Every head").wait_for()
            time.sleep(1.0)
            _assert_no_error_text(page)
            assert page.get_by_text("Contribution weights vs attention").count() == 1
            page.screenshot(path=str(ARTIFACTS / "heatmaps.png"))
            if os.environ.get("CWVIZ_UPDATE_SCREENSHOT") == "1":
                shutil.copyfile(ARTIFACTS / "heatmaps.png", ROOT / "assets" / "screenshot.png")

            page.get_by_role("link", name="Token").click()
            page.get_by_text("One query token").wait_for(timeout=60_000)
            _wait_for_charts(page, 2, timeout_ms=120_000)  # factor bars, top keys across layers
            time.sleep(1.0)
            _assert_no_error_text(page)
            page.screenshot(path=str(ARTIFACTS / "token.png"))

            before_bertviz = list(outside)
            page.get_by_role("link", name="bertviz").click()
            page.get_by_text("bertviz views").wait_for(timeout=60_000)
            frame = page.frame_locator("iframe").first
            # Offline (as in CI), the view says so; online, bertviz draws its SVG.
            frame.locator("#cwviz-bertviz-offline:visible, svg").first.wait_for(timeout=60_000)
            _assert_no_error_text(page)
            page.screenshot(path=str(ARTIFACTS / "bertviz.png"))
        finally:
            browser.close()
    assert not page_errors, page_errors
    assert not before_bertviz, f"only bertviz may use the network: {before_bertviz}"
    assert all(urlparse(u).hostname == BERTVIZ_CDN for u in outside), outside


def test_clicking_a_head_in_the_overview_selects_it(server):
    """A click on a cell of the all-heads chart selects that layer and head: the link and the heatmap
    follow. Vega labels each SVG cell (aria-label "head: H; layer: L; …"), which finds the cell."""
    sync_playwright = _require_browser()
    layer, head = 17, 5
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.goto(f"{server}/?layer=0&head=0")
            _wait_for_charts(page, 2, timeout_ms=240_000)
            page.get_by_text("Every head").wait_for()
            cell = page.locator(CHART).nth(1).locator(f'path[aria-label^="head: {head}; layer: {layer};"]')
            assert cell.count() == 1, f"no single cell for layer {layer}, head {head} in the all-heads chart"
            cell.click()
            page.wait_for_url(lambda url: f"layer={layer}" in url and f"head={head}" in url, timeout=60_000)
            _wait_for_charts(page, 2, timeout_ms=60_000)
            time.sleep(1.0)
            _assert_no_error_text(page)
            # The selected cell is outlined: the outline mark sits on the picked head.
            outline = page.locator(CHART).nth(1).locator(f'path[aria-label="head: {head}; layer: {layer}"]')
            assert outline.count() == 1
            page.screenshot(path=str(ARTIFACTS / "picked_head.png"))
        finally:
            browser.close()
