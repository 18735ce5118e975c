"""What the real-browser tests share (tests/browser, tests/load): the dashboard served by ``streamlit run`` on a free
port, headless Debian Chromium, the selectors of a drawn chart and the check of the heatmaps' axis labels."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
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


VIEWPORT = {"width": 1600, "height": 1000}


CHART = '[data-testid="stVegaLiteChart"]'


RENDERED = f"{CHART} svg.marks"


ERROR_SELECTORS = '[data-testid="stException"], [data-testid="stAlertContentError"]'


# Axis labels of the Heatmaps page's two maps (each a chart of its own, the first two on the page): their text,
# box and font size (px), and the query row's outline.
HEATMAP_LABELS_JS = """
() => [...document.querySelectorAll('[data-testid="stVegaLiteChart"] svg.marks')].slice(0, 2).map(svg => {
  const axes = [...svg.querySelectorAll('g.role-axis')].map(a => ({
    along: (a.getAttribute('aria-label') || '').startsWith('Y') ? 'y' : 'x',
    labels: [...a.querySelectorAll('g.role-axis-label text')].filter(t => t.textContent !== '').map(t => ({
      text: t.textContent, box: t.getBoundingClientRect().toJSON(), px: parseFloat(getComputedStyle(t).fontSize)})),
  }));
  const outline = [...svg.querySelectorAll('g.role-mark path[stroke="black"]')]
    .map(p => p.getBoundingClientRect().toJSON());
  return {axes, outline};
})
"""


# The plot areas of every chart on the page, from Vega's SVG scenegraph: a plot area is a group (the root
# frame or a view's scope) with a non-empty background that is not a legend, axis, title or line-series
# group; its marks are the role-mark elements whose nearest plot area it is.
PLOTS_JS = """
() => {
  const box = e => { const r = e.getBoundingClientRect(); return {x: r.x, y: r.y, w: r.width, h: r.height}; };
  const decoration = e => e.closest('.role-legend, .role-axis, .role-title');
  const main = document.querySelector('[data-testid="stMain"]').getBoundingClientRect();
  return [...document.querySelectorAll('[data-testid="stVegaLiteChart"]')].map((el, index) => {
    const svg = el.querySelector('svg.marks');
    const plotOf = new Map();
    const plots = [];
    for (const g of svg.querySelectorAll('g.mark-group')) {
      if (decoration(g) || /pathgroup/.test(g.getAttribute('class'))) continue;
      const bg = g.querySelector(':scope > g > path.background');
      if (!bg) continue;
      const b = box(bg);
      if (b.w < 1 || b.h < 1) continue;
      plotOf.set(g, plots.length);
      plots.push({box: b, marks: null, name: g.getAttribute('class')});
    }
    for (const m of svg.querySelectorAll('g.role-mark')) {
      if (decoration(m)) continue;
      let g = m.parentElement;
      while (g && !plotOf.has(g)) g = g.parentElement;
      if (!g) continue;
      for (const shape of m.children) {
        const b = box(shape);
        if (b.w <= 0 && b.h <= 0) continue;
        const plot = plots[plotOf.get(g)];
        const u = plot.marks;
        plot.marks = u === null ? b : (() => {
          const x = Math.min(u.x, b.x), y = Math.min(u.y, b.y);
          return {x, y, w: Math.max(u.x + u.w, b.x + b.w) - x, h: Math.max(u.y + u.h, b.y + b.h) - y};
        })();
      }
    }
    return {index, box: box(svg), plots: plots.filter(p => p.marks !== null), mainRight: main.right};
  });
}
"""

#: Whether the page has drawn ``n`` charts and its script has not run for ``quiet`` ms: Streamlit marks its root with
#: the script's run state (``data-test-script-state``, what Streamlit's own browser tests wait on), set the moment a
#: run starts or ends, where the status widget it shows is drawn late and is missing from short runs.
SETTLED_JS = """([sel, n, quiet]) => {
  const app = document.querySelector('[data-testid="stApp"]');
  const idle = app !== null && app.dataset.testConnectionState === "CONNECTED"
    && app.dataset.testScriptState === "notRunning"
    && document.querySelector('[data-testid="stSpinner"]') === null && document.querySelectorAll(sel).length >= n;
  if (!idle) { window.cwvizIdleSince = undefined; return false; }
  window.cwvizIdleSince ??= performance.now();
  return performance.now() - window.cwvizIdleSince >= quiet;
}"""
#: How long the script must stay idle: a rerun that a drawn chart or a changed widget asks for starts well within it.
QUIET_MS = 500


def _settle(page, charts: int, timeout_ms: int = 240_000) -> None:
    """Wait until ``charts`` charts are drawn and the script has stayed idle for :data:`QUIET_MS`."""
    try:
        page.evaluate("() => { window.cwvizIdleSince = undefined; }")  # a quiet time of an earlier wait does not count
        page.wait_for_function(SETTLED_JS, arg=[RENDERED, charts, QUIET_MS], polling=100, timeout=timeout_ms)
    except Exception:
        page.screenshot(path=str(ARTIFACTS / "timeout.png"))  # what the page showed instead
        raise


def _assert_no_error_text(page) -> None:
    assert page.locator(ERROR_SELECTORS).count() == 0, page.locator(ERROR_SELECTORS).all_inner_texts()
    body = page.inner_text("body")
    assert "Traceback" not in body and "Error:" not in body


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


@contextlib.contextmanager
def _serve(log_name: str = "server.log", env: dict | None = None, via_cli: bool = False, processes: list | None = None):
    """``streamlit run app.py`` (or, with ``via_cli``, ``cwviz app`` as the README starts it) on a free port,
    until the block ends; yields its URL. ``env`` is added to the environment; ``processes`` receives the
    server's Popen."""
    port = _free_port()
    log = ARTIFACTS / log_name
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    server_flags = ["--server.headless=true", f"--server.port={port}", "--server.address=127.0.0.1"]
    if via_cli:
        command = [sys.executable, "-m", "cwviz", "app", *server_flags]
    else:  # the rest from .streamlit/config.toml
        command = [sys.executable, "-m", "streamlit", "run", "app.py", *server_flags, "--server.fileWatcherType=none"]
    with log.open("w") as out:
        process = subprocess.Popen(
            command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
    if processes is not None:
        processes.append(process)
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


class Tabs:
    """Chromium, with ``new_page`` opening a tab of one shared context (``new_context`` still gives a fresh one).

    Each tab is its own Streamlit session (its own websocket), as a student's browser is; the tabs share the
    context's cache, so Chromium compiles the dashboard's JavaScript once, not once a page (this module ran in
    313 s instead of 418 s: benchmarks/history.md). The load test keeps a fresh context a session (tests/load)."""

    def __init__(self, chromium):
        self.chromium = chromium
        self.context = chromium.new_context()

    def new_page(self, viewport: dict):
        page = self.context.new_page()
        page.set_viewport_size(viewport)
        return page

    def new_context(self, **kwargs):
        return self.chromium.new_context(**kwargs)


@contextlib.contextmanager
def open_browser():
    """Headless Chromium as :class:`Tabs`, closed when the block ends (the ``browser`` fixtures of tests/conftest.py and
    tests/browser/conftest.py)."""
    sync_playwright = _require_browser()
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield Tabs(chromium)
        finally:
            chromium.close()


def _labels_check(views: list[dict], least_px: float, query_label: str | None = None) -> None:
    """Each map labels both axes with 12 px (or ``least_px``) labels that never overlap, the first token and the
    query among them, and outlines the query's row."""
    assert len(views) == 2, "two maps"
    for view in views:
        assert len(view["axes"]) == 2
        for axis in view["axes"]:
            texts = [t["text"] for t in axis["labels"]]
            assert len(texts) >= 10, texts
            assert all(t["px"] >= least_px for t in axis["labels"]), {t["px"] for t in axis["labels"]}
            assert not _overlapping(axis["labels"], axis["along"]), _overlapping(axis["labels"], axis["along"])[:3]
            assert any(t.startswith("0 ") for t in texts), texts[:3]
            if query_label is not None:
                assert query_label in texts
        assert len(view["outline"]) == 1, view["outline"]


def _overlapping(labels: list[dict], along: str) -> list[tuple[str, str]]:
    """Neighbouring labels of one axis whose boxes overlap along the axis (``along``: "x" or "y") by more
    than 2 px (a text box holds the font's whole line height, about 3 px more than the glyphs of a 10 px font)."""
    size = "width" if along == "x" else "height"
    ordered = sorted(labels, key=lambda t: t["box"][along])
    return [
        (a["text"], b["text"])
        for a, b in zip(ordered, ordered[1:])
        if a["box"][along] + a["box"][size] > b["box"][along] + 2
    ]
