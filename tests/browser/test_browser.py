"""Real-browser tests: the dashboard served by ``streamlit run`` in headless Debian Chromium at 1600 x 1000,
on the embedded model. They check what is drawn, not only what is sent:

* every chart on every page (Heatmaps, Token, Sinks, Faithfulness after a small run): each plot area of
  each chart is at least :data:`MIN_PLOT_PX` tall, its marks span it (the union of the mark elements'
  boxes in Vega's SVG scenegraph, and coloured or dark pixels in an element screenshot of the plot area),
  and nothing is drawn past the right edge of the main area;
* the default prompt's heatmaps label every row and column ``"12 the"``; the selected query's row is
  outlined on both, and a click on a cell selects that query (the outline and the link follow);
* a link with every parameter, opened in a fresh browser context, shows every picker as the link says;
* no page error, no Vega warning and no console error (bertviz's CDN, unreachable offline, and Streamlit's
  probe of ``/<page>/_stcore/`` on a deep link are the only failed requests allowed); nothing but bertviz
  reaches beyond localhost.

Screenshots of every page go to ``tests/artifacts/<page>.png`` (git-ignored); with
``CWVIZ_UPDATE_SCREENSHOT=1`` the same run refreshes the README's ``assets/<page>.png``.

Skips when playwright or ``/usr/bin/chromium`` is missing, unless ``CWVIZ_REQUIRE_BROWSER=1`` (as in CI),
where it fails instead.
"""

from __future__ import annotations

import contextlib
import io
import os
import time
import urllib.request
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urljoin, urlparse

import pytest

from tests.helpers import PNG, save_first_layers
from tests.helpers.app import PAGES, SIDEBAR
from tests.helpers.browser import (
    ARTIFACTS,
    CHART,
    ERROR_SELECTORS,
    HEATMAP_LABELS_JS,
    PLOTS_JS,
    VIEWPORT,
    _assert_no_error_text,
    _labels_check,
    _overlapping,
    _serve,
    _settle,
)

ROOT = Path(__file__).resolve().parents[2]
ASSETS = ROOT / "assets"
LOCAL_HOSTS = {"localhost", "127.0.0.1"}
BERTVIZ_CDN = "cdnjs.cloudflare.com"
#: The least height of a plot area (the issue's bar: a chart a person can read).
MIN_PLOT_PX = 150
#: Marks must cover at least this share of their plot area's height, and of its width.
MIN_SPAN_HEIGHT, MIN_SPAN_WIDTH = 0.5, 0.25
#: Each page's URL path and the charts it draws.
PAGE_PATHS = {
    "heatmaps": "",
    "token": "token",
    "bertviz": "bertviz_view",
    "sinks": "sinks",
    "faithfulness": "faithfulness",
    "compare": "compare",
    "atlas": "atlas",
    "claims": "claims",
}

# The cells of the contribution map (the page's second chart): each cell's value (from its aria label, which holds
# the tooltip's fields) and its fill colour.
CONTRIBUTION_CELLS_JS = """
() => [...document.querySelectorAll('[data-testid="stVegaLiteChart"]')[1]
  .querySelectorAll('g.role-mark path[aria-label]')]
  .map(p => ({label: p.getAttribute('aria-label'), fill: p.getAttribute('fill')}))
  .filter(c => c.fill && c.fill !== 'none' && c.label.includes('contribution: '))
"""


@pytest.fixture(scope="module")
def default_labels(embedded) -> list[str]:
    """The default prompt's axis labels, as the library makes them (on the worker's one embedded model, which the
    modules after this one on the same worker use too)."""
    import cwviz
    from cwviz.analyses import tables
    from cwviz.app import state

    analysis = cwviz.analyze(embedded, state.examples()[0].text)
    return list(tables.position_labels(analysis.tokens))


class Watch:
    """What a page tells the console and the network: errors, Vega warnings, requests beyond localhost."""

    def __init__(self, page):
        self.console: list[str] = []
        self.page_errors: list[str] = []
        self.failed: list[str] = []
        self.outside: list[str] = []
        page.on(
            "console", lambda m: self.console.append(f"{m.type}: {m.text}") if m.type in ("error", "warning") else None
        )
        page.on("pageerror", lambda err: self.page_errors.append(str(err)))
        page.on("response", lambda r: self.failed.append(f"{r.status} {r.url}") if r.status >= 400 else None)
        page.on("requestfailed", lambda r: self.failed.append(f"failed {r.url}"))
        page.on(
            "request", lambda r: self.outside.append(r.url) if urlparse(r.url).hostname not in LOCAL_HOSTS else None
        )

    @staticmethod
    def _allowed_failure(entry: str) -> bool:
        url = entry.split(" ", 1)[1]
        parsed = urlparse(url)
        # Streamlit opened at /<page> first probes /<page>/_stcore/..., then the root: not an error of ours.
        probe = (
            parsed.hostname in LOCAL_HOSTS
            and parsed.path.rstrip("/").split("/")[-2:-1] == ["_stcore"]
            and parsed.path.count("/") >= 3
        )
        return parsed.hostname == BERTVIZ_CDN or probe

    def check(self) -> None:
        assert not self.page_errors, self.page_errors
        assert all(self._allowed_failure(f) for f in self.failed), self.failed
        vega = [m for m in self.console if "WARN" in m or "vega" in m.lower()]
        assert not vega, vega
        # The only console errors allowed are the browser's own lines about the allowed failed requests.
        unexplained = [
            m
            for m in self.console
            if m.startswith("error") and "Failed to load resource" not in m and BERTVIZ_CDN not in m
        ]
        unexplained = [m for m in unexplained if "require" not in m]  # bertviz's require.js, offline
        assert not unexplained, unexplained
        assert all(urlparse(u).hostname == BERTVIZ_CDN for u in self.outside), self.outside


def _url(server: str, page: str, params: dict | None = None) -> str:
    return f"{server}/{PAGE_PATHS[page]}" + (f"?{urlencode(params)}" if params else "")


def _drawn_rows(image, box) -> tuple[float, float]:
    """Share of the plot area's pixels that are marks (coloured or dark, not white or grey gridlines), and
    the share of its height between the first and last row holding such pixels (every second column read)."""
    import numpy as np

    crop = image.crop(
        (round(box["x"]), round(box["y"]), round(box["x"] + box["w"]), round(box["y"] + box["h"]))
    ).convert("RGB")
    pixels = np.asarray(crop, dtype=np.int16)[:, ::2]  # [height, columns read, rgb]
    top, bottom = pixels.max(-1), pixels.min(-1)
    marked = ((top - bottom) > 40) | (top < 140)
    rows = np.flatnonzero(marked.any(1))
    share = marked.sum() / max(1, marked.size)
    span = (rows[-1] - rows[0] + 1) / marked.shape[0] if len(rows) else 0.0
    return float(share), float(span)


@contextlib.contextmanager
def _tall(page):
    """Within the block, the viewport is as tall as the main area's content, so nothing is scrolled away (Streamlit
    scrolls its main area itself, and a screenshot shows only what is in the viewport); then :data:`VIEWPORT` again."""
    height = page.evaluate("() => document.querySelector('[data-testid=\"stMain\"]').scrollHeight")
    page.set_viewport_size({"width": VIEWPORT["width"], "height": min(max(height, VIEWPORT["height"]), 8000)})
    try:
        page.evaluate(STILL_JS, [CHART, STILL_MS])
        yield
    finally:
        page.set_viewport_size(VIEWPORT)


#: Resolves once the charts' boxes and drawn sizes have not changed for ``still`` ms (at most 5 s): a taller viewport
#: can drop the main area's scrollbar, widen it, and make each chart draw itself again at the new width.
STILL_JS = """async ([sel, still]) => {
  const boxes = () => JSON.stringify([...document.querySelectorAll(sel)].map((chart) => {
    const box = chart.getBoundingClientRect(), svg = chart.querySelector("svg.marks");
    return [box.x, box.y, box.width, box.height, svg && svg.getAttribute("width"), svg && svg.getAttribute("height")];
  }));
  const start = performance.now();
  let last = boxes(), since = start;
  while (performance.now() - since < still && performance.now() - start < 5000) {
    await new Promise((resolve) => setTimeout(resolve, 50));
    const now = boxes();
    if (now !== last) { last = now; since = performance.now(); }
  }
}"""
STILL_MS = 400


def _check_charts(page, where: str, save_as: str | None = None) -> int:
    """Every plot area of every chart on the page: tall enough, spanned by its marks, drawn, inside the page.
    ``save_as``: also keep the whole-page screenshot the check read, as :func:`_screenshot` does."""
    from PIL import Image

    with _tall(page):
        charts = page.evaluate(PLOTS_JS)
        png = page.screenshot()
    if save_as is not None:
        _save(png, save_as)
    image = Image.open(io.BytesIO(png))
    assert charts, f"{where}: no chart"
    for chart in charts:
        label = f"{where}, chart {chart['index']}"
        assert chart["plots"], f"{label}: no plot area with marks"
        assert chart["box"]["x"] + chart["box"]["w"] <= chart["mainRight"] + 1, (
            f"{label}: drawn past the right edge: {chart['box']}"
        )
        for plot in chart["plots"]:
            box, marks = plot["box"], plot["marks"]
            assert box["h"] >= MIN_PLOT_PX, f"{label} ({plot['name']}): plot area {box['h']:.0f} px tall"
            assert marks["h"] >= MIN_SPAN_HEIGHT * box["h"], (
                f"{label} ({plot['name']}): marks span {marks['h']:.0f} of {box['h']:.0f} px"
            )
            assert marks["w"] >= MIN_SPAN_WIDTH * box["w"], (
                f"{label} ({plot['name']}): marks span {marks['w']:.0f} of {box['w']:.0f} px wide"
            )
            share, span = _drawn_rows(image, box)
            assert share > 0.002, f"{label} ({plot['name']}): nothing visible drawn in the plot area ({share:.4f})"
            assert span >= MIN_SPAN_HEIGHT, (
                f"{label} ({plot['name']}): visible marks span {span:.0%} of the plot height"
            )
    return len(charts)


#: How much of a page's top the README's screenshot shows (px), where 1,400 would cut what the page is about.
README_CROP = {"compare": 2150}


def _screenshot(page, name: str) -> None:
    """The whole page (the viewport is made as tall as the main area's content) to tests/artifacts/<name>.png,
    and with CWVIZ_UPDATE_SCREENSHOT=1 to assets/<name>.png."""
    with _tall(page):
        png = page.screenshot()
    _save(png, name)


def _save(png: bytes, name: str) -> None:
    """A whole-page screenshot to tests/artifacts/<name>.png, and with CWVIZ_UPDATE_SCREENSHOT=1 the top of it to
    assets/<name>.png (one a page, for the README)."""
    path = ARTIFACTS / f"{name}.png"
    path.write_bytes(png)
    if os.environ.get("CWVIZ_UPDATE_SCREENSHOT") == "1" and name in PAGE_PATHS:  # one a page in the README
        from PIL import Image

        ASSETS.mkdir(exist_ok=True)
        with Image.open(path) as image:  # the README shows the top of each page (compare: down to its B − A map)
            height = README_CROP.get(name, 1400)
            image.crop((0, 0, image.width, min(image.height, height))).save(ASSETS / f"{name}.png", optimize=True)


def _walk_to(page, link: str, title: str, charts: int) -> None:
    """Follow the navigation link to a page, wait for its ``charts`` charts, check them, take its screenshot."""
    page.get_by_role("link", name=link).click()
    page.get_by_text(title).wait_for(timeout=60_000)
    _settle(page, charts)
    _assert_no_error_text(page)
    assert _check_charts(page, link, save_as=link.lower()) == charts


def test_every_chart_on_every_page_is_drawn(server, browser):
    page = browser.new_page(viewport=VIEWPORT)
    watch = Watch(page)
    try:
        page.goto(_url(server, "heatmaps"))
        _settle(page, 3)  # first load: the embedded model, once
        _assert_no_error_text(page)
        assert page.get_by_text("Contribution weights vs attention").count() == 1
        assert _check_charts(page, "Heatmaps", save_as="heatmaps") == 3  # the two maps and the all-heads overview

        _walk_to(page, "Token", "One query token", charts=2)
        _walk_to(page, "Sinks", "Attention sinks as active suppressors", charts=4)

        # A small run (two rates) on the sidebar prompt, as a user would start it.
        page.goto(_url(server, "faithfulness", {"rates": "10,50"}))
        page.get_by_text("Faithfulness by causal intervention").wait_for(timeout=60_000)
        _settle(page, 0)
        page.get_by_role("button", name="Run").click()
        # The results' caption (the progress bar says "1 of 1 examples" too while the run ends).
        page.get_by_text("1 of 1 examples; bands").wait_for(timeout=240_000)
        _settle(page, 2)
        _assert_no_error_text(page)
        assert page.get_by_test_id("stProgress").count() == 0  # no bar left once the run is drawn
        assert _check_charts(page, "Faithfulness", save_as="faithfulness") == 2

        page.get_by_role("link", name="bertviz").click()
        page.get_by_text("bertviz views").wait_for(timeout=60_000)
        frame = page.frame_locator("iframe").first
        # Offline (as in CI), the view says so; online, bertviz draws its SVG.
        frame.locator("#cwviz-bertviz-offline:visible, svg").first.wait_for(timeout=60_000)
        _assert_no_error_text(page)
        _screenshot(page, "bertviz")
    finally:
        page.close()
    watch.check()


def test_heatmaps_label_the_tokens_outline_the_query_and_pick_it_on_click(server, browser, default_labels):
    page = browser.new_page(viewport=VIEWPORT)
    watch = Watch(page)
    query, clicked = 12, 20
    try:
        page.goto(_url(server, "heatmaps", {"token": str(query)}))
        _settle(page, 3)
        views = page.evaluate(HEATMAP_LABELS_JS)
        _labels_check(views, 12, default_labels[query])
        for view in views:
            for axis in view["axes"]:
                assert {t["text"] for t in axis["labels"]} <= set(default_labels)
            # The outline frames the query's row: its vertical centre is that row label's.
            y_axis = next(a for a in view["axes"] if a["along"] == "y")
            row = next(t["box"] for t in y_axis["labels"] if t["text"] == default_labels[query])
            frame = view["outline"][0]
            assert abs((frame["y"] + frame["height"] / 2) - (row["y"] + row["height"] / 2)) < 4

        # A click on a cell of the query's row 20 selects query 20: the link and the outline follow.
        cell = (
            page.locator(CHART)
            .nth(1)
            .locator(f'path[aria-label^="key (position token): 3; query (position token): {clicked};"]')
        )
        assert cell.count() == 1, "one cell in the contribution map"
        cell.click()
        page.wait_for_url(lambda url: parse_qs(urlparse(url).query).get("token") == [str(clicked)], timeout=60_000)
        _settle(page, 3)
        for view in page.evaluate(HEATMAP_LABELS_JS):
            y_axis = next(a for a in view["axes"] if a["along"] == "y")
            row = next(t["box"] for t in y_axis["labels"] if t["text"] == default_labels[clicked])
            frame = view["outline"][0]
            assert abs((frame["y"] + frame["height"] / 2) - (row["y"] + row["height"] / 2)) < 4
        _assert_no_error_text(page)
    finally:
        page.close()
    watch.check()


FIRST_SCREENS = [{"width": 1280, "height": 720}, {"width": 1600, "height": 1000}]


@pytest.mark.parametrize("screen", FIRST_SCREENS, ids=lambda s: f"{s['width']}x{s['height']}")
@pytest.mark.parametrize("presenter", [False, True], ids=["", "presenter"])
def test_the_first_screen_shows_both_maps_side_by_side(server, browser, screen, presenter):
    """With the sidebar open and the default prompt, the attention and contribution maps stand side by side and
    wholly inside the window, without scrolling, and the sidebar's prompt box and Analyze button are on the first screen
    too; labels are at least 12 px. In presenter mode (16 px labels) the
    sidebar is collapsed and the maps stand side by side, both whole on one screen (scrolled to them), with cells of
    16 px or more and every token labelled."""
    if presenter and screen["width"] != 1280:
        pytest.skip("presenter mode is for a 1280 x 720 projector")
    page = browser.new_page(viewport=screen)
    watch = Watch(page)
    try:
        page.goto(_url(server, "heatmaps", {"presenter": "true"} if presenter else None))
        _settle(page, 3)
        _assert_no_error_text(page)
        if presenter:  # for a room: the sidebar collapsed, the maps side by side, both whole once scrolled to
            assert _sidebar_collapsed(page), "presenter mode collapses the sidebar"
            page.locator(CHART).first.scroll_into_view_if_needed()
            page.evaluate(f"() => document.querySelectorAll('{CHART}')[0].scrollIntoView({{block: 'start'}})")
            page.wait_for_timeout(300)
        else:
            assert page.locator('[data-testid="stSidebar"]').first.is_visible()
            # A newcomer finds the prompt box and Analyze on the first screen, below the page list (issue 56: 1,227 px
            # down).
            prompt = page.get_by_role("textbox", name="Prompt", exact=True).bounding_box()
            for box in (prompt, page.get_by_role("button", name="Analyze").bounding_box()):
                assert box is not None and box["y"] + box["height"] <= screen["height"], box
        maps = page.evaluate(PLOTS_JS)[:2]
        boxes = [plot["box"] for chart in maps for plot in chart["plots"]]
        assert len(boxes) == 2, boxes
        if presenter:
            left, right = boxes
            assert left["x"] + left["w"] < right["x"] and abs(left["y"] - right["y"]) < 2, "the maps stand side by side"
            for chart in maps:  # each chart whole (title, legend, labels) in the one screen
                assert chart["box"]["y"] >= -1 and chart["box"]["y"] + chart["box"]["h"] <= screen["height"] + 1, chart[
                    "box"
                ]
            cells = page.evaluate(CELL_SIZES_JS)
            assert cells and min(min(w, h) for w, h in cells) >= 16, "cells of 16 px or more"
            _assert_projector_text(page, "heatmaps")
        else:
            for box in boxes:
                assert box["y"] >= 0 and box["y"] + box["h"] <= screen["height"], (
                    f"a map's plot box {box} is not on the first screen"
                )
                assert box["x"] + box["w"] <= screen["width"] and box["h"] >= MIN_PLOT_PX
            left, right = boxes
            assert left["x"] + left["w"] < right["x"] and abs(left["y"] - right["y"]) < 2, "the maps stand side by side"
            for chart in maps:  # the legends too
                assert chart["box"]["y"] + chart["box"]["h"] <= screen["height"], (
                    "a map's legend or labels are below the fold"
                )
        views = page.evaluate(HEATMAP_LABELS_JS)
        if presenter:  # the right map's rows are the left map's: it labels its keys only; the left one every row
            rows = next(a for a in views[0]["axes"] if a["along"] == "y")["labels"]
            assert len(rows) == 30 and all(t["px"] >= 16 for t in rows), len(rows)
            assert not _overlapping(rows, "y"), _overlapping(rows, "y")[:3]
        else:
            _labels_check(views, 12)
        name = f"first-screen-{screen['width']}x{screen['height']}" + ("-presenter" if presenter else "")
        page.screenshot(path=str(ARTIFACTS / f"{name}.png"))
    finally:
        page.close()
    watch.check()


def _rgb(fill: str) -> tuple[int, int, int]:
    """An SVG fill (``#rrggbb`` or ``rgb(r, g, b)``) as three integers."""
    if fill.startswith("#"):
        return tuple(int(fill[i : i + 2], 16) for i in (1, 3, 5))
    return tuple(int(float(v)) for v in fill[fill.index("(") + 1 : fill.index(")")].split(",")[:3])


def test_negative_contributions_are_drawn_clearly_blue(server, browser):
    """Layer 14, head 3, intra-head: most contributions are negative beside the sink's +1. Every cell of -0.03 or
    less is clearly blue (its blue channel at least 40 above its red); no cell within ±0.001 of zero is."""
    page = browser.new_page(viewport=FIRST_SCREENS[0])
    watch = Watch(page)
    try:
        page.goto(_url(server, "heatmaps", {"layer": "14", "head": "3", "kind": "intra"}))
        _settle(page, 3)
        cells = page.evaluate(CONTRIBUTION_CELLS_JS)
        assert len(cells) >= 400, len(cells)
        values = []
        for cell in cells:
            # Vega's minus sign
            value = float(cell["label"].split("contribution: ")[1].split(";")[0].replace("\u2212", "-"))
            r, _, b = _rgb(cell["fill"])
            values.append((value, b - r))
        strong = [blue for value, blue in values if value <= -0.03]
        faint = [blue for value, blue in values if abs(value) <= 0.001]
        assert strong and faint, (len(strong), len(faint))
        assert min(strong) >= 40, f"a contribution of -0.03 or less is drawn with blue - red = {min(strong)}"
        assert max(abs(blue) for blue in faint) < 25, "a contribution near zero is drawn coloured"
        page.screenshot(path=str(ARTIFACTS / "negative-contributions.png"))
    finally:
        page.close()
    watch.check()


# Two pages in the browser (the sidebar, the Heatmaps pickers above the maps, a page slider): every page's pickers
# are restored from a link through AppTest (tests/app/test_links.py); what only a browser does is the binding's
# write-back to the address bar.
@pytest.mark.parametrize("name", ["heatmaps", "sinks"])
def test_a_link_opened_in_a_fresh_context_restores_every_picker(server, browser, name):
    """A link with the parameter names and values links have had restores the view without a warning. After one
    click (presenter mode off), the address bar holds every other picker, in the form Streamlit's binding writes;
    that address, opened in a fresh context, restores the same view, and keeps it in the address bar."""
    params, _ = PAGES[f"views/{name}.py"]
    link = {**SIDEBAR, **params}

    def opened(url: str):
        context = browser.new_context(viewport=VIEWPORT)
        page = context.new_page()
        watch = Watch(page)
        page.goto(url)
        _settle(page, 3 if name == "heatmaps" else 2)
        _assert_no_error_text(page)
        warnings = page.locator('[data-testid="stAlertContentWarning"]')
        assert warnings.count() == 0, warnings.all_inner_texts()
        assert (
            page.locator('[data-testid="stSidebar"] [data-testid="stSlider"] input[type="range"]').first.input_value()
            == SIDEBAR["layer"]
        )
        # the pickers above the maps show the link's choices (the popover's radios are not drawn)
        if name == "heatmaps":
            boxes = page.locator('[data-testid="stMain"] [data-testid="stSelectbox"]')
            shown_text = " ".join(
                boxes.all_inner_texts() + boxes.locator("input").evaluate_all("inputs => inputs.map(i => i.value)")
            )
            for choice in (
                "Right map: value-weighted attention",
                "Share of each head's output (intra)",
                "Colours: full range",
            ):
                assert choice in shown_text, choice
            checked = page.locator('[data-testid="stMain"] [role="radiogroup"] input:checked').evaluate_all(
                "inputs => inputs.map(i => i.closest('label').innerText.trim())"
            )
            assert checked == ["sink share under contribution (intra-head)"]
        return context, page, watch

    def address(page) -> dict[str, list[str]]:
        return parse_qs(urlparse(page.url).query, keep_blank_values=True)

    context, page, watch = opened(_url(server, name, link))
    try:
        _open_sidebar(page)  # presenter mode collapsed it
        page.locator('[data-testid="stSidebar"] [data-testid="stCheckbox"]').filter(has_text="Presenter mode").locator(
            "label"
        ).click()
        page.wait_for_function("() => !new URLSearchParams(location.search).has('presenter')", timeout=60_000)
        _settle(page, 3 if name == "heatmaps" else 2)
        written = address(page)
        assert set(link) - {"presenter"} <= set(written), sorted(set(link) - set(written))
    finally:
        context.close()
    watch.check()
    context, page, watch = opened(_url(server, name, None) + "?" + urlencode(written, doseq=True))
    try:
        assert address(page) == written
    finally:
        context.close()
    watch.check()


def test_the_embedded_encoder_draws_square_heatmaps_and_its_sinks(server, browser):
    """all-MiniLM-L6-v2 (``model=embedded-encoder``): both heatmaps are square (every query sees every key), with
    [CLS] first and [SEP] last labelled on both axes, and the Sinks page draws its four charts with no perplexity."""
    page = browser.new_page(viewport=VIEWPORT)
    watch = Watch(page)
    try:
        page.goto(_url(server, "heatmaps", {"model": "embedded-encoder"}))
        _settle(page, 3)
        _assert_no_error_text(page)
        assert page.get_by_text("is an encoder: attention is bidirectional").count() == 1
        assert _check_charts(page, "Heatmaps (encoder)", save_as="encoder-heatmaps") == 3
        views = page.evaluate(HEATMAP_LABELS_JS)
        _labels_check(views, 12)
        for view in views:  # square maps: the same labels on both axes, [CLS] first, [SEP] (the query) last
            x, y = ([t["text"] for t in axis["labels"]] for axis in sorted(view["axes"], key=lambda a: a["along"]))
            assert (
                "0 [CLS]" in x
                and "0 [CLS]" in y
                and any(t.endswith(" [SEP]") for t in x)
                and any(t.endswith(" [SEP]") for t in y)
            )
        page.get_by_role("link", name="Sinks").click()  # not _walk_to: its screenshot would be the README's
        page.get_by_text("Attention sinks as active suppressors").wait_for(timeout=60_000)
        _settle(page, 4)
        _assert_no_error_text(page)
        assert _check_charts(page, "Sinks (encoder)", save_as="encoder-sinks") == 4
        assert page.get_by_text("last token ([SEP])").count() == 1
    finally:
        page.close()
    watch.check()


#: A laptop's window (the narrowest common one): the automatic layouts keep every chart inside its page.
LAPTOP = {"width": 1366, "height": 768}
#: The right edge of the page's content (the main block, without its padding), and every chart's right edge.
CHART_EDGES_JS = """
() => {
  const block = document.querySelector('[data-testid="stMainBlockContainer"]');
  const r = block.getBoundingClientRect(), pad = parseFloat(getComputedStyle(block).paddingRight);
  return {content: r.right - pad, charts: [...document.querySelectorAll('[data-testid="stVegaLiteChart"] svg.marks')]
    .map(svg => svg.getBoundingClientRect().right)};
}
"""


@contextlib.contextmanager
def _settled_page(browser, server: str, name: str, charts: int, viewport: dict, params: dict | None = None):
    """Page ``name`` (with URL ``params``) in a new tab at ``viewport``, drawn (``charts`` charts) and free of error
    text; closed, and its console checked, after the block."""
    page = browser.new_page(viewport=viewport)
    watch = Watch(page)
    try:
        page.goto(_url(server, name, params))
        _settle(page, charts)
        _assert_no_error_text(page)
        yield page
    finally:
        page.close()
    watch.check()


@pytest.mark.parametrize("name, charts", [("heatmaps", 3), ("token", 2), ("compare", 3)])
def test_at_a_laptops_width_every_chart_stays_inside_the_page(server, browser, name, charts):
    """At 1,366 x 768 with the sidebar open, the default prompt's heatmap pair, the token page's factor panels and
    the compare page's maps lie inside the page's content column: nothing a user must scroll sideways to find."""
    with _settled_page(browser, server, name, charts, LAPTOP) as page:
        edges = page.evaluate(CHART_EDGES_JS)
        assert len(edges["charts"]) >= charts
        assert max(edges["charts"]) <= edges["content"] + 1, (
            f"{name}: a chart ends at {max(edges['charts']):.0f} px, the page at {edges['content']:.0f}"
        )
        page.screenshot(path=str(ARTIFACTS / f"laptop-{name}.png"))


def test_clicking_a_head_in_the_overview_selects_it(server, browser):
    """A click on a cell of the all-heads chart selects that layer and head: the link and the heatmap
    follow. Vega labels each SVG cell (aria-label "head: H; layer: L; …"), which finds the cell."""
    layer, head = 17, 5
    page = browser.new_page(viewport=VIEWPORT)
    try:
        page.goto(_url(server, "heatmaps", {"layer": "0", "head": "0"}))
        _settle(page, 3)
        page.get_by_text("Every head").wait_for()
        cell = page.locator(CHART).nth(2).locator(f'path[aria-label^="head: {head}; layer: {layer};"]')
        assert cell.count() == 1, f"no single cell for layer {layer}, head {head} in the all-heads chart"
        cell.click()
        page.wait_for_url(lambda url: f"layer={layer}" in url and f"head={head}" in url, timeout=60_000)
        _settle(page, 3)
        _assert_no_error_text(page)
        # The selected cell is outlined: the outline mark sits on the picked head.
        outline = page.locator(CHART).nth(2).locator(f'path[aria-label="head: {head}; layer: {layer}"]')
        assert outline.count() == 1
        page.screenshot(path=str(ARTIFACTS / "picked_head.png"))
    finally:
        page.close()


def test_compare_draws_a_b_and_their_difference_and_picks_a_head(server, browser):
    """The Compare page on its default minimal pair: three charts drawn (the maps A, B and B − A, the change
    in every head, the log-probability changes), each view's marks spanning its plot; a sequence-aligned pair
    shows its alignment; a click on a head of the change grid selects it (the maps' title and the link follow)."""
    page = browser.new_page(viewport=VIEWPORT)
    watch = Watch(page)
    try:
        page.goto(_url(server, "compare", {"layer": "3", "head": "all"}))  # the default layout
        _settle(page, 3)
        _assert_no_error_text(page)
        assert page.get_by_text("Compare two inputs").count() == 1
        assert _check_charts(page, "Compare", save_as="compare") == 3
        maps = page.evaluate(PLOTS_JS)[0]
        assert len(maps["plots"]) == 3, maps["plots"]  # A, B and B − A, each with its cells
        # docs/dashboard.md: A and B side by side above the difference up to 32 aligned positions (here 30), at 1600 px.
        a, b, difference = (plot["box"] for plot in maps["plots"])
        assert a["x"] + a["w"] < b["x"] and abs(a["y"] - b["y"]) < 2 and difference["y"] > a["y"] + a["h"], (
            a,
            b,
            difference,
        )
        assert b["x"] + b["w"] <= maps["mainRight"], "A and B inside the page"

        layer, head = 20, 4
        cell = page.locator(CHART).nth(1).locator(f'path[aria-label^="head: {head}; layer: {layer};"]')
        assert cell.count() == 1, f"no single cell for layer {layer}, head {head} in the change grid"
        cell.click()
        page.wait_for_url(lambda url: f"layer={layer}" in url and f"head={head}" in url, timeout=60_000)
        _settle(page, 3)
        _assert_no_error_text(page)
        assert page.locator(CHART).first.locator(f'text:has-text("layer {layer}, head {head}")').count() >= 1

        # Two prompts of different lengths: aligned by sequence, the alignment table shown, the maps still drawn.
        longer = "The old lighthouse keeper slowly climbed the long spiral stairs every evening."
        page.goto(_url(server, "compare", {"prompt_b": longer}))
        _settle(page, 3)
        _assert_no_error_text(page)
        assert page.get_by_text("aligned by a sequence alignment").count() >= 1
        assert page.locator('[data-testid="stDataFrame"]').first.is_visible()
        assert _check_charts(page, "Compare, sequence-aligned", save_as="compare-sequence") == 3
    finally:
        page.close()
    watch.check()


def test_atlas_runs_draws_its_map_and_links_a_prompt_to_its_heatmaps(server, browser):
    """The Atlas page on two prompts of the GSM8K sample: Run shows its progress, then the layer x head map (drawn,
    spanning its plot) and the picked head's prompts; the link a prompt's row holds opens the Heatmaps page
    on that prompt with the head selected."""
    from cwviz.app import atlas_services, services
    from cwviz.core.util.texts import gsm8k_path, read_texts

    page = browser.new_page(viewport=VIEWPORT)
    watch = Watch(page)
    try:
        page.goto(_url(server, "atlas", {"atlas_n": "2", "layer": "19", "head": "3"}))
        page.get_by_text("Atlas of heads").wait_for(timeout=60_000)
        _settle(page, 0)
        page.get_by_role("button", name="Run").click()
        _settle(page, 1)
        _assert_no_error_text(page)
        assert page.get_by_text("2 prompt(s) on").count() == 1
        assert _check_charts(page, "Atlas", save_as="atlas") == 1
        assert page.get_by_text("Layer 19, head 3: the prompts with the lowest").count() == 1
        assert page.locator('[data-testid="stDataFrame"]').first.is_visible()

        text = read_texts(gsm8k_path(), n=1)[0]
        link = atlas_services.heatmaps_link(services.Request(device="auto", dtype="auto"), text, 19, 3)
        page.goto(urljoin(server + "/", link))  # a relative link, as the page writes it
        _settle(page, 3)
        _assert_no_error_text(page)
        assert page.get_by_text("layer 19, head 3;").count() >= 1  # the maps' caption
    finally:
        page.close()
    watch.check()


#: Layers of the embedded model the Claims run uses (of 30).
CLAIMS_LAYERS = 4


@pytest.fixture(scope="module")
def first_layers(tmp_path_factory) -> str:
    """The embedded model's first :data:`CLAIMS_LAYERS` layers, saved to a folder the server loads as any model a link
    names."""
    return save_first_layers(tmp_path_factory.mktemp("first-layers"), CLAIMS_LAYERS)


def test_claims_runs_and_shows_a_verdict_for_each_claim(server, browser, first_layers):
    """The Claims page on five GSM8K items (the fewest that decide) of 12 tokens: Run shows its progress, then the
    forest plot of every verdict, its table, one row per claim, the random control, the evidence and the CSV download;
    no bar is left behind (at 8 tokens, the whole embedded model's claim 4, its fit of each head's norms against its
    sink ratios, was made on no item and its row was NaN). What is drawn is this test's property, not the verdicts (that
    the page's records are those ``cwviz claims`` writes is tests/app/test_claims_page.py's): the run is on the embedded
    model's first :data:`CLAIMS_LAYERS` layers, whose heads have sinks (a tiny random model's have none: claims 3 and 4
    would be NaN, and Vega warns that it cannot place them), and which take half the time (``cwviz claims --gsm8k --n 5
    --max-tokens 12``: 32 s against 61 s; the output layer over the 49,152-token vocabulary is most of what is left)."""
    page = browser.new_page(viewport=VIEWPORT)
    watch = Watch(page)
    try:
        page.goto(_url(server, "claims", {"claims_n": "5", "claims_cap": "12", "model": first_layers}))
        page.get_by_text("Claims of the paper").first.wait_for(timeout=60_000)
        _settle(page, 0)
        page.get_by_role("button", name="Run").click()
        page.get_by_text("One row per claim").wait_for(timeout=240_000)
        _settle(page, 0)
        _assert_no_error_text(page)
        assert page.get_by_test_id("stProgress").count() == 0
        assert page.get_by_text("5 item(s); 95 % percentile bootstrap").count() == 1
        # The forest plot above its table of verdicts, then one row per claim, the random control and the evidence.
        assert page.get_by_text("Every verdict: estimate and 95 % interval against its line").count() == 1
        assert page.locator("[data-testid='stVegaLiteChart']").count() == 1
        assert page.get_by_text("The random control: each measure's gap to random").count() == 1
        # A table mounts after its text (its grid is a component of its own, loaded on first use): wait for the four,
        # then count them (a clean CI run at 3b2cc3a counted 0 while they were loading).
        page.wait_for_function(
            "() => document.querySelectorAll('[data-testid=\"stDataFrame\"]').length >= 4", timeout=60_000
        )
        assert page.locator('[data-testid="stDataFrame"]').count() == 4
        assert page.get_by_role("button", name="claims.csv").count() == 1
        _screenshot(page, "claims")
    finally:
        page.close()
    watch.check()


@pytest.mark.parametrize("view", ["window", "binned"])
def test_a_long_prompt_keeps_readable_labels_with_the_query_and_the_first_token(server, browser, view):
    """The long example (about 500 tokens): the window view labels every position it shows, the selected query
    on both axes and the first token (the sink) among the keys; the binned view labels its bins. No two
    labels overlap."""
    from cwviz.app import state

    text = next(e.text for e in state.examples() if e.name.startswith("Long"))
    query = 300
    page = browser.new_page(viewport=VIEWPORT)
    watch = Watch(page)
    try:
        page.goto(_url(server, "heatmaps", {"prompt": text, "token": str(query), "view": view}))
        _settle(page, 3)
        _assert_no_error_text(page)
        _check_charts(page, f"Heatmaps, long prompt, {view}", save_as=f"heatmaps-long-{view}")
        views = page.evaluate(HEATMAP_LABELS_JS)
        assert len(views) == 2
        for heatmap in views:
            for axis in heatmap["axes"]:
                texts = [t["text"] for t in axis["labels"]]
                assert len(texts) >= 10, f"only {len(texts)} labels"
                assert not _overlapping(axis["labels"], axis["along"]), _overlapping(axis["labels"], axis["along"])[:3]
                if view == "window":  # the query on both axes; the first token (the sink) among the keys
                    starts = {t.split(" ", 1)[0] for t in texts}
                    wanted = {"0", str(query)} if axis["along"] == "x" else {str(query)}
                    assert wanted <= starts, sorted(starts, key=int)[:5]
            assert len(heatmap["outline"]) == 1, "the query's row (or its bin) is outlined"
    finally:
        page.close()
    watch.check()


def test_a_binary_upload_gets_a_message_and_the_server_keeps_serving(server, browser, tmp_path):
    """A PNG uploaded as examples on the Faithfulness page: the page says what is wrong, and the server still
    answers its health check and serves the next page."""
    upload = tmp_path / "examples.txt"
    upload.write_bytes(PNG)
    page = browser.new_page(viewport=VIEWPORT)
    watch = Watch(page)
    try:
        page.goto(_url(server, "faithfulness", {"source": "upload"}))
        page.get_by_text("Faithfulness by causal intervention").wait_for(timeout=240_000)
        _settle(page, 0)
        page.locator('[data-testid="stFileUploader"] input[type="file"]').set_input_files(str(upload))
        _settle(page, 0)
        page.get_by_role("button", name="Run").click()
        error = page.locator('[data-testid="stAlertContentError"]')
        error.wait_for(timeout=60_000)
        assert "binary" in error.inner_text()
        with urllib.request.urlopen(f"{server}/_stcore/health", timeout=5) as response:
            assert response.read().strip() == b"ok"
        page.get_by_role("link", name="Heatmaps").click()
        _settle(page, 2)
        assert page.locator(ERROR_SELECTORS).count() == 0
    finally:
        page.close()
    watch.check()


TOUR_STEPS = 8
#: The tour step the README shows: attention against contribution, per layer.
TOUR_README_STEP = 2
#: Tour steps whose link is followed, and the title of the page it opens.
TOUR_FOLLOWED = {
    3: "Contribution weights vs attention",
    4: "One query token",
    6: "Attention sinks as active suppressors",
    7: "Attention sinks",
    8: "Where the prediction came from",
}


def test_every_tour_step_draws_its_chart_and_its_link_opens_its_view(server, browser):
    """The Tour: every step's chart drawn (the checks of every page) and its *Open in …* link opens the full page on
    the step's view in a new tab. The same walk, at 1,600 x 1,000 on the default (short) prompt, is the back row's case
    of :func:`test_every_tour_step_marks_what_its_sentences_name_and_reads_from_the_back_row` (one walk, not two)."""
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    watch = Watch(page)
    try:
        page.goto(f"{server}/tour")
        _settle(page, 1)
        for step in range(1, TOUR_STEPS + 1):
            page.locator("h3", has_text=f"{step}. ").wait_for(timeout=60_000)
            _settle(page, 1)
            _assert_no_error_text(page)
            _check_tour_step_marks(page, step, VIEWPORT, presenter_short=False)
            page.screenshot(path=str(ARTIFACTS / f"tour-1600-short-step{step}.png"), full_page=True)
            # One chart a step; step 3 also draws the absolute scale under a sentence that reconciles two pictures.
            scale = step == 3 and "Both pictures are true" in page.inner_text('[data-testid="stMain"]')
            assert _check_charts(page, f"tour step {step}") == 1 + scale
            page.screenshot(path=str(ARTIFACTS / f"tour-step{step}.png"))
            if step == TOUR_README_STEP and os.environ.get("CWVIZ_UPDATE_SCREENSHOT") == "1":
                # the README's, as tests/browser/test_browser.py refreshes the others
                page.screenshot(path=str(ASSETS / "tour.png"))
            opens = page.locator('a[data-testid^="stBaseLinkButton"]:visible', has_text="Open in")
            assert opens.count() == 1
            if step in TOUR_FOLLOWED:
                wanted = parse_qs(urlparse(opens.get_attribute("href")).query)
                assert opens.get_attribute("target") == "_blank"
                with context.expect_page() as opened:
                    opens.click()
                full = opened.value
                full.get_by_text(TOUR_FOLLOWED[step]).first.wait_for(timeout=120_000)
                _settle(full, 1)
                _assert_no_error_text(full)
                got = parse_qs(urlparse(full.url).query)
                for name in ("model", "layer", "head", "prompt"):
                    assert got[name] == wanted[name], (step, name)
                slider = full.locator('[data-testid="stSidebar"] [data-testid="stSliderThumbValue"]').first
                assert slider.text_content() == wanted["layer"][0]
                full.screenshot(path=str(ARTIFACTS / f"tour-link{step}.png"))
                full.close()
            if step < TOUR_STEPS:
                page.get_by_role("button", name="Next →").click()
    finally:
        context.close()
    watch.check()


# Issue 44: the tour in front of a class, at a projector's 1,280 x 720 and a researcher's 1,600 x 1,000.
PROJECTOR = {"width": 1280, "height": 720}
#: Every chart's SVG and every button, with their right edges and whether a button's label is cut ("P." for "PNG").
EDGES_JS = """
() => ({
  charts: [...document.querySelectorAll('[data-testid="stVegaLiteChart"] svg.marks')]
    .map(s => s.getBoundingClientRect().right),
  buttons: [...document
    .querySelectorAll('[data-testid="stMain"] button, [data-testid="stMain"] a[data-testid^="stBaseLinkButton"]')]
    .filter(b => b.offsetParent !== null)
    .map(b => ({text: b.innerText, right: b.getBoundingClientRect().right,
                cut: [...b.querySelectorAll('p, div')].some(e => e.scrollWidth > e.clientWidth + 1)})),
})
"""


#: Every chart title and subtitle line on the page, as drawn (Vega ends a line cut at its limit with "…").
TITLES_JS = """
() => [...document.querySelectorAll('[data-testid="stVegaLiteChart"] svg.marks g.role-title text')]
  .map(t => t.textContent).filter(t => t !== '')
"""


def _assert_no_cut_title(page, where) -> None:
    """No chart's title or subtitle is cut short: each says what its chart shows, whole."""
    cut = [title for title in page.evaluate(TITLES_JS) if title.endswith("…")]
    assert not cut, (where, cut)


#: Every text a chart draws (titles, axis and legend labels, numbers on marks): its text, font size and right edge;
#: the content column's right edge; and every element of the main block that reaches past it.
PROJECTOR_TEXT_JS = """
() => {
  const block = document.querySelector('[data-testid="stMainBlockContainer"]');
  const r = block.getBoundingClientRect(), column = r.right - parseFloat(getComputedStyle(block).paddingRight);
  const texts = [...document.querySelectorAll('[data-testid="stVegaLiteChart"] svg text')]
    .filter(t => t.textContent !== '')
    .map(t => ({text: t.textContent, px: parseFloat(getComputedStyle(t).fontSize)}));
  // A data grid clips what it scrolls: its frame is checked, not the rows and scrollers inside it.
  const clipped = e => e.parentElement && e.parentElement.closest('[data-testid="stDataFrameResizable"]');
  const past = [...block.querySelectorAll('*')].filter(e => e.offsetParent !== null
    && e.getBoundingClientRect().width > 0 && !clipped(e))
    .filter(e => e.getBoundingClientRect().right > column + 1).map(e => e.tagName + '.'
      + (e.getAttribute('data-testid') || e.getAttribute('class') || '').slice(0, 40) + ' '
      + Math.round(e.getBoundingClientRect().right) + ' in ' + ((e.parentElement.closest('[data-testid]')
        || {}).dataset || {}).testid);
  return {texts, past: past.slice(0, 5), column};
}
"""
#: The drawn width and height of the cells of every heatmap on the page (each cell's rect path, up to 200 a map).
CELL_SIZES_JS = """
() => [...document.querySelectorAll('[data-testid="stVegaLiteChart"] svg.marks g.role-mark path[aria-label*="query"]')]
  .slice(0, 400).map(p => { const b = p.getBoundingClientRect(); return [b.width, b.height]; })
    .filter(([w, h]) => w > 0 && h > 0)
"""


def _assert_projector_text(page, where) -> None:
    """Presenter mode's promises for a room: every text a chart draws is 16 px or more and none is cut with "…", and
    nothing on the page reaches past the content column."""
    drawn = page.evaluate(PROJECTOR_TEXT_JS)
    small = [f"{t['text']} ({t['px']:g} px)" for t in drawn["texts"] if t["px"] < 16]
    cut = [t["text"] for t in drawn["texts"] if t["text"].endswith("…")]
    assert not small, (where, small[:8])
    assert not cut, (where, cut[:8])
    assert not drawn["past"], (where, drawn["column"], drawn["past"])


def _open_sidebar(page) -> None:
    """Open the sidebar where presenter mode has collapsed it (its arrow, top left)."""
    if _sidebar_collapsed(page):
        page.locator(
            '[data-testid="stExpandSidebarButton"], [data-testid="stSidebarCollapsedControl"] button'
        ).first.click()
        page.wait_for_function(
            "() => document.querySelector('[data-testid=\"stSidebar\"]').getBoundingClientRect().right > 1"
        )


def _sidebar_collapsed(page) -> bool:
    """Whether the sidebar is closed: no part of it lies inside the window."""
    box = page.locator('[data-testid="stSidebar"]').first.bounding_box()
    return box is None or box["x"] + box["width"] <= 1


@pytest.mark.parametrize(
    "name, charts",
    [
        ("heatmaps", 3),
        ("token", 2),
        ("sinks", 4),
        ("compare", 3),
        ("faithfulness", 0),
        ("atlas", 0),
        ("claims", 0),
        ("bertviz", 0),
    ],
)
def test_at_a_projectors_width_every_chart_and_button_lies_inside_the_window(server, browser, name, charts):
    """At 1,280 x 720 in presenter mode, on every page (the Tour's steps in their own test; the Flow page's in
    tests/browser/test_browser_flow.py): the sidebar is collapsed, every chart and every button ends inside the
    content column, nothing else reaches past it, no button's label is cut short (the Sinks page's downloads read
    "P.", "S.", "C." in a half column), every text a chart draws is 16 px or more and none is cut with "…" (the
    anti-alignment map's subtitle was 12 px, titles read "click a h…", labels "lightho…")."""
    with _settled_page(browser, server, name, charts, PROJECTOR, {"presenter": "true"}) as page:
        assert _sidebar_collapsed(page), "presenter mode collapses the sidebar"
        _assert_projector_text(page, name)
        if name == "compare":  # A and B side by side (30 aligned positions), both whole on one screen once scrolled to
            page.evaluate(f"() => document.querySelectorAll('{CHART}')[0].scrollIntoView({{block: 'start'}})")
            page.wait_for_timeout(300)
            a, b = page.evaluate(PLOTS_JS)[0]["plots"][:2]
            assert a["box"]["x"] + a["box"]["w"] < b["box"]["x"] and abs(a["box"]["y"] - b["box"]["y"]) < 2, (
                "A and B side by side"
            )
            assert all(
                -1 <= p["box"]["y"] and p["box"]["y"] + p["box"]["h"] <= PROJECTOR["height"] + 1 for p in (a, b)
            ), (
                a["box"],
                b["box"],
            )
            page.screenshot(path=str(ARTIFACTS / "projector-compare-maps.png"))
        edges = page.evaluate(EDGES_JS)
        assert len(edges["charts"]) >= charts
        assert all(right <= PROJECTOR["width"] for right in edges["charts"]), (name, edges["charts"])
        outside = [b["text"] for b in edges["buttons"] if b["right"] > PROJECTOR["width"]]
        cut = [b["text"] for b in edges["buttons"] if b["cut"]]
        assert not outside and not cut, (name, outside, cut)
        _assert_no_cut_title(page, name)
        page.screenshot(path=str(ARTIFACTS / f"projector-{name}.png"), full_page=True)


def _researcher_prompt() -> str:
    """About 300 tokens of a researcher's own text (the first two examples, four times over)."""
    from cwviz.app import state

    texts = [example.text for example in state.examples()[:2]]
    return " ".join(texts * 4)


#: The ring around the step's key on a map (:data:`cwviz.charts.heatmaps.RING`), the query row's outline, the cells: of
#: the page's maps (the charts with heatmap cells; the absolute scale, where drawn, stands under the sentence).
TOUR_MAPS_JS = """
() => [...document.querySelectorAll('[data-testid="stVegaLiteChart"] svg.marks')]
  .filter(svg => svg.querySelector('g.role-mark path[aria-label*="contribution: "][aria-label*="query"]')).map(svg => ({
  box: svg.getBoundingClientRect().toJSON(),
  ring: [...svg.querySelectorAll('g.role-mark path[stroke="#111111"]')].map(p => p.getBoundingClientRect().toJSON()),
  cells: [...svg.querySelectorAll('g.role-mark path[aria-label*="contribution: "]')].slice(0, 3)
    .map(p => p.getBoundingClientRect().toJSON()),
  labels: [...svg.querySelectorAll('g.role-axis-label text')].filter(t => t.textContent !== '')
    .map(t => ({text: t.textContent, px: parseFloat(getComputedStyle(t).fontSize)})),
}))
"""


#: The top of the step's sentences (its first paragraph under the step's title).
SENTENCE_TOP_JS = """() => document.querySelector('[data-testid="stMain"] h3').parentElement
  .closest('[data-testid="stVerticalBlock"]')
  .querySelector('[data-testid="stMarkdownContainer"] p').getBoundingClientRect().top"""


def _check_tour_step_marks(page, step: int, screen: dict, presenter_short: bool, presenter: bool = False) -> None:
    """A settled tour step, as the back row reads it: its charts lie inside the window; step 3 rings the key its
    sentence names on its contribution map and step 4 marks its bars (▶); where step 3 says why two pictures seem to
    disagree, the absolute scale that reconciles them is drawn (step 4 does not repeat it). ``presenter``: every chart's
    text 16 px or more and uncut, nothing past the content column, the sidebar collapsed, and step 3's ringed cell on
    the first screen with its sentence. ``presenter_short``: presenter mode on the short prompt, every token labelled in
    16 px labels, cells 16 px or more."""
    edges = page.evaluate(EDGES_JS)
    assert all(right <= screen["width"] for right in edges["charts"]), (step, edges["charts"])
    _assert_no_cut_title(page, f"tour step {step}")
    if presenter:
        assert _sidebar_collapsed(page), "presenter mode collapses the sidebar"
        _assert_projector_text(page, f"tour step {step}")
    text = page.inner_text('[data-testid="stMain"]')
    if step == 3:
        maps = page.evaluate(TOUR_MAPS_JS)
        assert len(maps) == 1 and len(maps[0]["ring"]) == 1, "the step's key is ringed on its map"
        assert "(ringed)" in text
        if presenter:  # the first screen, unscrolled: the ringed cell and the sentence that names it
            ring = maps[0]["ring"][0]
            assert 0 <= ring["y"] and ring["y"] + ring["height"] <= screen["height"], (
                f"the ring is below the first screen: {ring}"
            )
            assert page.evaluate(SENTENCE_TOP_JS) < screen["height"] - 100, "the sentence starts on the first screen"
        if presenter_short:
            (m,) = maps
            assert all(label["px"] >= 16 for label in m["labels"])
            # Every row labelled with its token; the keys by position (a row names each position's token), every
            # other one at least.
            assert len(m["labels"]) >= 30 + 15, f"every row and every other key labelled: {len(m['labels'])}"
            cell = m["cells"][0]
            assert cell["width"] >= 16 and cell["height"] >= 16, cell
    if step == 4:
        assert page.locator(f"{CHART} text", has_text="▶").count() >= 1, "the step's key is marked on the bars"
        assert "Both pictures are true" not in text, "step 4 does not repeat step 3's paragraph"
    if step == 3 and "Both pictures are true" in text:
        assert "Step 2's" in text and "over all heads and queries" in text
        # The absolute scale under the sentence: the head's and the layer's output lengths, drawn as bars.
        assert page.locator(f"{CHART} text", has_text="‖o‖ = ").count() == 2, "the absolute scale is drawn"


@pytest.mark.parametrize(
    "screen, presenter, prompt",
    [(PROJECTOR, True, "short"), (PROJECTOR, False, "long"), (VIEWPORT, True, "long")],
    ids=["1280-presenter-short", "1280-long", "1600-presenter-long"],
)
def test_every_tour_step_marks_what_its_sentences_name_and_reads_from_the_back_row(
    server, browser, screen, presenter, prompt
):
    """Each tour step on a short (30 tokens) and a long (~300 tokens) prompt: its chart lies inside the window; step 3
    rings the key its sentence names on its contribution map and step 4 marks its bars (▶); step 3 says why the head's
    red sink column and step 2's "writes little" are both true where they seem to disagree, and draws the absolute scale
    that reconciles them (the head's and the layer's output lengths, and the sink's part of each); in presenter mode
    (the sidebar collapsed) step 3's ringed cell is on the first screen with its sentence, every chart's text is 16 px
    or more and uncut, nothing reaches past the content column, and on the short prompt every row is labelled with its
    token in 16 px labels, cells 16 px or more. The fourth case, 1,600 x 1,000 on the short prompt without presenter
    mode, is the walk of :func:`test_every_tour_step_draws_its_chart_and_its_link_opens_its_view`, which makes the same
    checks at each step."""
    params = {"presenter": "true"} if presenter else {}
    if prompt == "long":
        params["prompt"] = _researcher_prompt()
    name = f"tour-{screen['width']}" + ("-presenter" if presenter else "") + f"-{prompt}"
    page = browser.new_page(viewport=screen)
    watch = Watch(page)
    try:
        page.goto(f"{server}/tour" + (f"?{urlencode(params)}" if params else ""))
        _settle(page, 1)
        for step in range(1, TOUR_STEPS + 1):
            page.locator("h3", has_text=f"{step}. ").wait_for(timeout=120_000)
            _settle(page, 1)
            _assert_no_error_text(page)
            _check_tour_step_marks(page, step, screen, presenter and prompt == "short", presenter)
            page.screenshot(path=str(ARTIFACTS / f"{name}-step{step}.png"), full_page=True)
            if step < TOUR_STEPS:
                page.get_by_role("button", name="Next →").click()
    finally:
        page.close()
    watch.check()


#: Counts the runs of the page's script from now on (Streamlit marks its root with the run state as it changes).
COUNT_RUNS_JS = """() => { window.cwvizRuns = 0; const app = document.querySelector('[data-testid="stApp"]');
  new MutationObserver(() => { if (app.dataset.testScriptState === "running") window.cwvizRuns += 1; })
    .observe(app, {attributes: true, attributeFilter: ["data-test-script-state"]}); }"""


def test_lambda_applies_once_per_chosen_value_not_per_key_press(server, browser):
    """Ten arrow presses on the λ slider were ten forward passes (95 s): in its form they run nothing, and Apply
    runs the page once with the value chosen, which the link then holds."""
    page = browser.new_page(viewport=VIEWPORT)
    watch = Watch(page)
    try:
        page.goto(_url(server, "sinks"))
        _settle(page, 4)
        before = page.locator('[data-testid="stMetric"]', has_text="PPL intervened").inner_text()
        page.evaluate(COUNT_RUNS_JS)
        thumb = page.locator('[data-testid="stMain"] [data-testid="stSlider"] input[type="range"]').first
        thumb.focus()
        for _ in range(4):
            page.keyboard.press("ArrowRight")
        page.wait_for_timeout(1500)
        assert page.evaluate("() => window.cwvizRuns") == 0, "an arrow press on λ ran the page"
        page.get_by_role("button", name="Apply λ").click()
        page.wait_for_function("() => window.cwvizRuns >= 1", timeout=30_000)
        _settle(page, 4)
        _assert_no_error_text(page)
        assert page.evaluate("() => window.cwvizRuns") == 1
        assert parse_qs(urlparse(page.url).query)["lambda"] == ["0.2"]
        after = page.locator('[data-testid="stMetric"]', has_text="PPL intervened").inner_text()
        assert after != before
        page.screenshot(path=str(ARTIFACTS / "sinks-lambda-applied.png"))
    finally:
        page.close()
    watch.check()


def test_a_page_link_opened_first_on_a_fresh_server_shows_its_frame_at_once_and_runs_through_the_navigation(browser):
    """A fresh server's first page was a blank white page for about 12 s: now its page list and a loading message
    show within a second or two of the page's arrival, and the message is gone once the page is drawn. That page, a
    page's link opened first, runs through app.py's navigation (its page names, the wide layout): the scripts live in
    ``views/``, not in a ``pages/`` folder, which Streamlit would run as its legacy multipage app (file names as
    navigation, no page config). One fresh server for both: each is a property of its first page, and a server's start
    (PyTorch imported and the model loaded in its first run) is most of either's time."""
    with _serve("fresh-server.log") as url:
        page = browser.new_page(viewport=VIEWPORT)
        watch = Watch(page)
        try:
            page.goto(f"{url}/sinks?lambda=0.5&layer=3", wait_until="domcontentloaded")
            start = time.monotonic()
            page.get_by_text("Starting cwviz").wait_for(timeout=10_000)
            waited = time.monotonic() - start
            assert page.locator('[data-testid="stSidebarNav"] a').count() == 10
            page.screenshot(path=str(ARTIFACTS / "cold-open.png"))
            _settle(page, 3)
            _assert_no_error_text(page)
            assert page.get_by_text("Starting cwviz").count() == 0
            assert waited < 5, f"the first words took {waited:.1f} s"
            assert page.locator("h1").first.inner_text() == "Attention sinks as active suppressors"
            nav = page.locator('[data-testid="stSidebarNav"] a').all_inner_texts()
            assert [n.strip() for n in nav] == [
                "Heatmaps",
                "Flow",
                "Tour",
                "Token",
                "bertviz",
                "Sinks",
                "Faithfulness",
                "Claims",
                "Compare",
                "Atlas",
            ]
            main = page.locator('[data-testid="stMainBlockContainer"]').bounding_box()
            assert main["width"] > 1000, f"not the wide layout of app.py: {main['width']:.0f} px"
            query = parse_qs(urlparse(page.url).query)
            assert query["lambda"] == ["0.5"] and query["layer"] == ["3"]
        finally:
            page.close()
        watch.check()
