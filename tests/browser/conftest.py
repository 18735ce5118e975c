"""What the real-browser tests share: one Streamlit server and one headless Chromium for every module here, so that
the server loads the embedded model and Chromium compiles the dashboard's JavaScript once, not once a module.
make test's workers keep the package together (tests/conftest.py, :func:`pytest_xdist_make_scheduler`); the test of a
fresh server's first page starts its own."""

from __future__ import annotations

import pytest

from tests.helpers.browser import _serve, open_browser


@pytest.fixture(scope="package")
def server():
    """The dashboard served by ``streamlit run app.py`` (tests/helpers/browser.py): its URL."""
    with _serve() as url:
        yield url


@pytest.fixture(scope="package")
def browser():
    """Headless Chromium as :class:`tests.helpers.browser.Tabs`; skips without playwright or Chromium."""
    with open_browser() as tabs:
        yield tabs
