"""What a person waits for in a real browser (headless Chromium): the first visible words of a cold open (a fresh
server's first page), a layer, head or query change on the Heatmaps page at about 30 and 300 tokens, a λ change
on the Sinks page at about 30 and 300 tokens (the λ slider moved one step, then Apply λ), and the Flow page (issue 47:
:func:`bench_flow`): opened on about 300 tokens that Heatmaps has analysed, a target, foil or pruning share changed, and
opened on about 2,000 tokens, with the longest stall of the browser's main thread.

A wait is measured from the input (a key press on the layer slider, the Enter that takes a choice typed into the head or
query picker, an arrow key on the λ slider) to the moment the page has stopped running and the charts the change redraws
have been drawn anew: before the input each drawn chart's SVG is remembered, and the wait ends when that many charts
draw something else (Streamlit may redraw a chart in place) and Streamlit's status widget is gone. The baseline is the
first draw of the same page in the same browser (model already converted, analysis included), so each change's ratio to
it says how much of a fresh page it costs.

Needs the ``playwright`` package and ``/usr/bin/chromium`` (``apt-get install chromium``); it starts its own
server (``streamlit run app.py``) on a free port.
"""

from __future__ import annotations

import contextlib
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlencode

from cwviz.core.defaults import KEPT

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
CHART = '[data-testid="stVegaLiteChart"]'
DRAWN = f"{CHART} svg.marks"
VIEWPORT = {"width": 1600, "height": 1000}
#: Charts a layer, head or query change draws anew on the Heatmaps page: the two maps (the overview of every head
#: keeps its drawing and moves its outline).
MAPS = 2
#: The issues' targets (seconds): a selection change at about 30 and 300 tokens, a λ change at 30 and at 300 tokens
#: (issue 44: on a quiet machine), and a cold open's first visible words.
TARGETS = {
    30: 0.5,
    300: 1.0,
    "lambda": 1.5,
    "lambda300": 2.0,
    "cold": 1.0,
    "flow_open": 2.0,
    "flow_change": 1.0,
    "stall": 2.0,
}
#: Charts the Flow page draws (the graph, the totals, the head map).
FLOW_CHARTS = 3
#: Records the browser's long tasks (main-thread stalls over 50 ms), from the page's first script on.
LONG_TASKS_JS = """window.__cwvizLong = []; new PerformanceObserver(list => { for (const e of list.getEntries())
  window.__cwvizLong.push(e.duration); }).observe({entryTypes: ['longtask']});"""


@contextlib.contextmanager
def _server():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        "app.py",
        "--server.headless",
        "true",
        "--server.port",
        str(port),
    ]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2):
                    break
            time.sleep(0.5)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


@contextlib.contextmanager
def _chromium():
    """The dashboard's server (:func:`_server`) and headless Chromium, both closed when the block ends: (url,
    browser)."""
    from playwright.sync_api import sync_playwright

    with _server() as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            yield url, browser
        finally:
            browser.close()


def _tag(page) -> int:
    """Remember each drawn chart's SVG (Streamlit may redraw a chart in place, into the same element); their count."""
    return page.evaluate(
        f"() => (window.__cwvizOld = [...document.querySelectorAll('{DRAWN}')].map(e => e.innerHTML)).length"
    )


def _wait_redrawn(page, charts: int, timeout_s: float = 120) -> None:
    """Until ``charts`` charts draw something other than before :func:`_tag` and the script is not running."""
    page.wait_for_function(
        "([sel, n]) => { const old = window.__cwvizOld || []; const now = [...document.querySelectorAll(sel)].map(e "
        "=> e.innerHTML); return now.filter((h, i) => h !== old[i]).length >= n && "
        "!document.querySelector('[data-testid=\"stStatusWidget\"]'); }",
        arg=[DRAWN, charts],
        timeout=timeout_s * 1000,
        polling=50,
    )


def _timed_change(page, act, charts: int) -> float:
    """Seconds from ``act`` to ``charts`` charts drawn anew (the ones the change redraws) and the script done."""
    _tag(page)
    start = time.perf_counter()
    act()
    _wait_redrawn(page, charts)
    return time.perf_counter() - start


def _timed_text(page, act, text: str) -> float:
    """Seconds from ``act`` to ``text`` shown on the page and the script done."""
    start = time.perf_counter()
    act()
    page.get_by_text(text).first.wait_for(timeout=120_000)
    page.wait_for_function(
        "() => !document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=120_000, polling=50
    )
    return time.perf_counter() - start


def _settle(page) -> None:
    """Let the page finish (no status widget for half a second)."""
    quiet = 0
    while quiet < 5:
        quiet = 0 if page.locator('[data-testid="stStatusWidget"]').count() else quiet + 1
        time.sleep(0.1)


def _typed(page, label: str, text: str) -> None:
    """Type ``text`` into the sidebar picker labelled ``label`` (its list filtered to the match, not yet chosen)."""
    box = page.locator('[data-testid="stSidebar"] [data-testid="stSelectbox"]', has_text=label).locator("input")
    box.click()
    box.fill(text)


def _heatmaps(page, url: str, prompt: str, repeats: int) -> tuple[float, dict[str, float]]:
    page.goto(f"{url}/?{urlencode({'prompt': prompt, 'layer': 14})}")
    start = time.perf_counter()
    page.wait_for_function("([sel, n]) => document.querySelectorAll(sel).length >= n", arg=[DRAWN, 3], timeout=600_000)
    first = time.perf_counter() - start
    _settle(page)
    thumb = page.locator('[data-testid="stSidebar"] [data-testid="stSlider"] input').first
    waits: dict[str, list[float]] = {"layer": [], "head": [], "query": []}
    for i in range(repeats):
        thumb.focus()
        waits["layer"].append(
            _timed_change(page, lambda: page.keyboard.press("ArrowRight" if i % 2 == 0 else "ArrowLeft"), MAPS)
        )
        _settle(page)
        # A picker's wait starts at the Enter that takes the match: the typing before it is the person's, not a wait.
        _typed(page, "Head", str(2 + i))
        waits["head"].append(_timed_change(page, lambda: page.keyboard.press("Enter"), MAPS))
        _settle(page)
        _typed(page, "Query token", f"{10 + i}:")
        waits["query"].append(_timed_change(page, lambda: page.keyboard.press("Enter"), MAPS))
        _settle(page)
    return first, {name: statistics.median(times) for name, times in waits.items()}


def _sinks(page, url: str, prompt: str, repeats: int) -> tuple[float, float]:
    page.goto(f"{url}/sinks?{urlencode({'prompt': prompt})}")
    start = time.perf_counter()
    page.wait_for_function("([sel, n]) => document.querySelectorAll(sel).length >= n", arg=[DRAWN, 3], timeout=600_000)
    first = time.perf_counter() - start
    _settle(page)
    thumb = page.locator('[data-testid="stMain"] [data-testid="stSlider"] input[type="range"]').first  # λ, in its form
    apply = page.get_by_role("button", name="Apply λ")
    times = []
    for _ in range(repeats):
        thumb.focus()
        page.keyboard.press("ArrowRight")  # a value not yet computed (λ is cached per value); nothing runs yet
        times.append(_timed_change(page, apply.click, 1))
        _settle(page)
    return first, statistics.median(times)


def _cold_open(page, url: str) -> float:
    """Seconds from a fresh server's first page arriving (its HTML loaded) to the first words in its main area."""
    page.goto(url, wait_until="domcontentloaded")
    start = time.perf_counter()
    page.wait_for_function(
        "() => (document.querySelector('[data-testid=\"stMain\"]')?.innerText || '').trim().length > 0",
        timeout=600_000,
        polling=50,
    )
    return time.perf_counter() - start


def _flow_page(page, url: str, prompt: str, repeats: int) -> dict[str, float]:
    """Heatmaps on ``prompt`` (its analysis, not timed), then the Flow page from the navigation (timed to its three
    charts), then ``repeats`` target, foil and share changes (medians). Each target is a token not asked before, so
    each change computes a new flow, as a user's first choice of it does; the foil is turned on with it."""
    page.goto(f"{url}/?{urlencode({'prompt': prompt})}")
    page.wait_for_function("([sel, n]) => document.querySelectorAll(sel).length >= n", arg=[DRAWN, 3], timeout=900_000)
    _settle(page)
    page.evaluate("() => { window.__cwvizLong = []; }")
    start = time.perf_counter()
    page.get_by_role("link", name="Flow").click()
    page.get_by_text("Where the prediction came from").wait_for(timeout=900_000)
    # The first screen (the graph and the totals, the page's first two charts) is drawn before the heads' map below it.
    page.wait_for_function(
        "(sel) => [...document.querySelectorAll(sel)].filter(e => /The route|Each token's/.test(e.textContent)).length "
        ">= 2",
        arg=DRAWN,
        timeout=900_000,
        polling=50,
    )
    first_screen = time.perf_counter() - start
    page.wait_for_function(
        "([sel, n]) => document.querySelectorAll(sel).length >= n && "
        "!document.querySelector('[data-testid=\"stStatusWidget\"]')",
        arg=[DRAWN, FLOW_CHARTS],
        timeout=900_000,
        polling=50,
    )
    waits: dict[str, list[float]] = {
        "open": [time.perf_counter() - start],
        "first": [first_screen],
        "target": [],
        "foil": [],
        "share": [],
    }
    _settle(page)
    target = page.locator('[data-testid="stMain"] [data-testid="stTextInput"]', has_text="Target token").locator(
        "input"
    )
    foil = page.locator('[data-testid="stMain"] [data-testid="stCheckbox"]', has_text="Against a foil")
    share = page.locator('[data-testid="stMain"] [data-testid="stSlider"] input[type="range"]').first
    for i, token in zip(range(repeats), (" the", " a", " it", " one", " and")):
        target.fill(token)
        waits["target"].append(_timed_change(page, lambda: page.keyboard.press("Enter"), 2))
        _settle(page)
        waits["foil"].append(_timed_change(page, foil.click, 2))  # on with this target: a new flow; off: cached
        _settle(page)
        share.focus()
        # A share past the cap draws the same 300 edges: the wait ends when the caption states the new share.
        kept = f"asked: {KEPT - 0.05:.0%}" if i % 2 == 0 else f"asked: {KEPT:.0%}"
        waits["share"].append(
            _timed_text(page, lambda: page.keyboard.press("ArrowLeft" if i % 2 == 0 else "ArrowRight"), kept)
        )
        _settle(page)
    result = {name: statistics.median(times) for name, times in waits.items()}
    result["stall"] = max(page.evaluate("() => window.__cwvizLong"), default=0.0) / 1000
    return result


def _flow_clicks(page, url: str, repeats: int) -> dict[str, float]:
    """The Flow page on the default prompt (30 tokens), settled; then ``repeats`` each of: the *Effect drawn* setting
    moved (to the caption's new share), a click on a node of the route (to the sidebar's token in the address bar and
    the script done) and a click on a head of the map (to the head's line below it). Medians (s)."""
    page.goto(f"{url}/flow")
    page.wait_for_function(
        "([sel, n]) => document.querySelectorAll(sel).length >= n", arg=[DRAWN, FLOW_CHARTS], timeout=900_000
    )
    _settle(page)
    idle = "() => !document.querySelector('[data-testid=\"stStatusWidget\"]')"
    waits: dict[str, list[float]] = {"share": [], "node": [], "head": []}
    share = page.locator('[data-testid="stMain"] [data-testid="stSlider"] input[type="range"]').first
    for i in range(repeats):
        share.focus()
        shown = f"asked: {KEPT - 0.05:.0%}" if i % 2 == 0 else f"asked: {KEPT:.0%}"
        waits["share"].append(
            _timed_text(page, lambda: page.keyboard.press("ArrowLeft" if i % 2 == 0 else "ArrowRight"), shown)
        )
        _settle(page)
        node = page.locator(CHART).first.locator('g.mark-symbol.role-mark > path[aria-label*="role: passes"]').nth(i)
        position = dict(part.split(": ", 1) for part in node.get_attribute("aria-label").split("; "))["position"]
        start = time.perf_counter()
        node.click()
        page.wait_for_url(lambda u, p=position: f"token={p}" in u, timeout=120_000)
        page.wait_for_function(idle, timeout=120_000, polling=50)
        waits["node"].append(time.perf_counter() - start)
        _settle(page)
        cell = page.locator(CHART).nth(2).locator('g.mark-rect path[aria-label*="head: "]').nth(3 + i)
        fields = dict(part.split(": ", 1) for part in cell.get_attribute("aria-label").split("; "))
        waits["head"].append(_timed_text(page, cell.click, f"Layer {fields['layer']}, head {fields['head']}"))
        _settle(page)
    return {name: statistics.median(times) for name, times in waits.items()}


def bench_flow_clicks(repeats: int = 3) -> list[str]:
    """Issue 55's rows at 30 tokens: the edge setting, a node click and a head click on the Flow page."""
    with _chromium() as (url, browser):
        page = browser.new_page(viewport=VIEWPORT)
        got = _flow_clicks(page, url, repeats)
        page.close()
    rows = [
        "| prompt | effect drawn / node click / head click, median (s) | targets |",
        "|---|---|---|",
        f"| Flow, 30 tokens (the default prompt) | {got['share']:.2f} / {got['node']:.2f} / {got['head']:.2f} | each ≤ "
        "0.5 s |",
    ]
    print("\n".join(rows), flush=True)
    return rows


def bench_flow(repeats: int = 3) -> list[str]:
    """The Flow page's rows (issue 47): on about 300 tokens, opened after Heatmaps analysed them and each change; on
    about 2,000 tokens, opened the same way. ``stall``: the longest long task of the browser's main thread meanwhile."""
    import cwviz
    from cwviz.app import state
    from cwviz.core.loading.inputs import tokenize

    bundle = cwviz.load_model("embedded")
    words = " ".join(e.text for e in state.examples()).split()
    prompts = {"300": " ".join(words[:230]), "2000": " ".join((words * 8)[:1550])}
    rows = [
        "| prompt | opened after Heatmaps: first screen / whole page (s) | target / foil / share change, median (s) "
        "| longest browser stall (s) | targets |",
        "|---|---|---|---|---|",
    ]
    with _chromium() as (url, browser):
        for name, prompt in prompts.items():
            page = browser.new_page(viewport=VIEWPORT)
            page.add_init_script(LONG_TASKS_JS)
            got = _flow_page(page, url, prompt, repeats if name == "300" else 1)
            page.close()
            rows.append(
                f"| Flow, {len(tokenize(bundle, prompt))} tokens | {got['first']:.2f} / {got['open']:.2f} | "
                f"{got['target']:.2f} / {got['foil']:.2f} / {got['share']:.2f} | {got['stall']:.2f} | open ≤ "
                f"{TARGETS['flow_open']} s, change ≤ {TARGETS['flow_change']} s, stall ≤ {TARGETS['stall']} s |"
            )
    print("\n".join(rows), flush=True)
    return rows


def bench(repeats: int = 3) -> list[str]:
    import cwviz
    from cwviz.app import state
    from cwviz.core.loading.inputs import tokenize

    bundle = cwviz.load_model("embedded")
    examples = [e.text for e in state.examples()]
    short = examples[0]  # the default prompt, about 30 tokens
    long = " ".join(" ".join(examples).split()[:230])  # the shipped examples' first words: about 300 tokens
    rows = [
        "| page, prompt | first draw (s, baseline) | change | median wait (s) | ratio to first draw | target |",
        "|---|---|---|---|---|---|",
    ]
    with _chromium() as (url, browser):
        warm = browser.new_page(viewport=VIEWPORT)  # the model's load and first conversion are not a change's wait
        cold = _cold_open(warm, url)
        warm.wait_for_selector(DRAWN, timeout=600_000)
        warm.close()
        rows.append(f"| Cold open (fresh server), first words | {cold:.2f} | — | — | — | ≤ {TARGETS['cold']} s |")
        for name, prompt, target in (("short", short, TARGETS[30]), ("long", long, TARGETS[300])):
            page = browser.new_page(viewport=VIEWPORT)
            first, waits = _heatmaps(page, url, prompt, repeats)
            page.close()
            label = f"Heatmaps, {name} prompt ({len(tokenize(bundle, prompt))} tokens)"
            for change, wait in waits.items():
                rows.append(f"| {label} | {first:.2f} | {change} | {wait:.2f} | {wait / first:.2f} | ≤ {target} s |")
        for name, prompt, target in (("short", short, TARGETS["lambda"]), ("long", long, TARGETS["lambda300"])):
            page = browser.new_page(viewport=VIEWPORT)
            first, wait = _sinks(page, url, prompt, repeats)
            page.close()
            label = f"Sinks, {name} prompt ({len(tokenize(bundle, prompt))} tokens)"
            rows.append(f"| {label} | {first:.2f} | λ (Apply) | {wait:.2f} | {wait / first:.2f} | ≤ {target} s |")
    print("\n".join(rows), flush=True)
    return rows
