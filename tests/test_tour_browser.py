"""The Tour in headless Chromium (issue 30): every step draws its chart (tall enough, spanned by its marks, inside the
page, as tests/test_browser.py checks every page) and its *Open in …* link opens the full page on the step's view in a
new tab. The server, the browser and the checks are tests/test_browser.py's (a server of its own here, module-scoped:
folded into that module, the test would share its server)."""

from __future__ import annotations

import os
from urllib.parse import parse_qs, urlparse

import pytest

from tests.test_browser import (  # noqa: F401  (browser and server are fixtures)
    ARTIFACTS,
    ASSETS,
    VIEWPORT,
    _assert_no_error_text,
    _check_charts,
    _settle,
    browser,
    server,
)

pytestmark = pytest.mark.slow  # a browser test (conftest marks tests/test_browser.py by its name)
STEPS = 7
#: The step the README shows: attention against contribution, per layer.
README_STEP = 2
#: Steps whose link is followed, and the title of the page it opens.
FOLLOWED = {3: "Contribution weights vs attention", 4: "One query token", 6: "Attention sinks as active suppressors", 7: "Attention sinks"}


def test_every_tour_step_draws_its_chart_and_its_link_opens_its_view(server, browser):
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    try:
        page.goto(f"{server}/tour")
        _settle(page, 1)
        for step in range(1, STEPS + 1):
            page.locator("h3", has_text=f"{step}. ").wait_for(timeout=60_000)
            _settle(page, 1)
            _assert_no_error_text(page)
            assert _check_charts(page, f"tour step {step}") == 1
            page.screenshot(path=str(ARTIFACTS / f"tour-step{step}.png"))
            if step == README_STEP and os.environ.get("CWVIZ_UPDATE_SCREENSHOT") == "1":
                page.screenshot(path=str(ASSETS / "tour.png"))  # the README's, as tests/test_browser.py refreshes the others
            opens = page.locator('a[data-testid^="stBaseLinkButton"]:visible', has_text="Open in")
            assert opens.count() == 1
            if step in FOLLOWED:
                wanted = parse_qs(urlparse(opens.get_attribute("href")).query)
                assert opens.get_attribute("target") == "_blank"
                with context.expect_page() as opened:
                    opens.click()
                full = opened.value
                full.get_by_text(FOLLOWED[step]).first.wait_for(timeout=120_000)
                _settle(full, 1)
                _assert_no_error_text(full)
                got = parse_qs(urlparse(full.url).query)
                for name in ("model", "layer", "head", "prompt"):
                    assert got[name] == wanted[name], (step, name)
                slider = full.locator('[data-testid="stSidebar"] [data-testid="stSliderThumbValue"]').first
                assert slider.text_content() == wanted["layer"][0]
                full.screenshot(path=str(ARTIFACTS / f"tour-link{step}.png"))
                full.close()
            if step < STEPS:
                page.get_by_role("button", name="Next →").click()
    finally:
        context.close()
