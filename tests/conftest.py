"""Shared fixtures: tiny random models of every supported architecture (no downloads), the embedded SmolLM2 for
integration tests and headless Chromium for the browser and load tests; the ``slow`` marker and the order of the
longest modules. What tests share besides fixtures is in tests/helpers (test modules never import conftest.py)."""

from __future__ import annotations

import os

import pytest
import torch

import cwviz
from tests.helpers import ARCHS, make_tiny

if os.environ.get("PYTEST_XDIST_WORKER") and os.environ.get("CWVIZ_TEST_SHARE_THREADS"):
    # make test-fast's workers share the cores: each takes its share of torch's threads. Two workers of two threads
    # each on two cores made the tiny models' tests (thread overhead, not arithmetic) take about twice as long. The
    # whole suite (make test) leaves torch its threads: there a worker's real model often has the cores to itself
    # while the other waits on a browser or a server, and the shared threads made a clean run slower (BENCHMARKS.md).
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))))


@pytest.fixture(params=ARCHS)
def tiny(request) -> cwviz.Bundle:
    """A tiny random model of each supported architecture."""
    return make_tiny(request.param)


@pytest.fixture(scope="session")
def embedded() -> cwviz.Bundle:
    """The embedded SmolLM2-135M-Instruct (converted once into the user cache)."""
    return cwviz.load_model("embedded", device="cpu")


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium (tests/helpers/browser.py); skips without playwright or Chromium."""
    from tests.helpers.browser import open_browser

    with open_browser() as tabs:
        yield tabs


# -- the slow marker ---------------------------------------------------------------------------------
#: Modules that serve the app or drive the browser in every test (AppTest modules are found by name).
SLOW_MODULES = {"test_browser", "test_browser_flow", "test_packaging", "test_interrupts", "test_load"}


#: What a test's own code names when it loads a real model, runs a page or starts a Python process (a fresh
#: interpreter imports torch and transformers: seconds before it does anything).
SLOW_WORDS = ("embedded", "AppTest", "sys.executable")


def _starts_slow_work(item) -> bool:
    import inspect

    function = getattr(item, "function", None)
    try:
        source = inspect.getsource(function) if function is not None else ""
    except (OSError, TypeError):
        return False
    return any(word in source for word in SLOW_WORDS)


#: The longest test modules, longest first. Their times beside the other worker, warm cache (2026-12-06, a timeline of
#: each worker's modules): the browser module 294 s, the 8,192-token memory test's module 185 s, the load module 60 s,
#: the sweeps 48 s, the packaging tests 32 s, embedded Gemma 26 s (about 45 s on a cold cache: its conversion). make
#: test hands whole modules to its workers in collection order (``--dist loadscope --no-loadscope-reorder``): these go
#: first, so that the last modules to start are short ones and no worker waits idle while another finishes a long one
#: (with packaging and Gemma among the last, one worker finished 22 s after the other).
LONGEST_FIRST = (
    "browser/test_browser.py",
    "browser/test_browser_flow.py",  # with the one before: one server and one Chromium (tests/browser/conftest.py)
    "core/test_long.py",
    "load/test_load.py",
    "analyses/test_sweep.py",
    "tests/test_packaging.py",
    "core/test_embedded_gemma.py",
)


#: The package whose modules share one server and one Chromium (package-scoped fixtures): one scope of make test's.
BROWSER_PACKAGE = "tests/browser/"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """make test's ``--dist loadscope`` (a module to a worker, so that a module's fixtures are made once), with
    tests/browser as one scope: its modules share one server and one Chromium (tests/browser/conftest.py), which two
    workers would each start (a server's start with its first page: about 10 s of CPU beside the other worker)."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class BrowserTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return BROWSER_PACKAGE if nodeid.startswith(BROWSER_PACKAGE) else super()._split_scope(nodeid)

    return BrowserTogether(config, log)


def _longest_first(item) -> int:
    path = item.path.as_posix()
    return next((rank for rank, tail in enumerate(LONGEST_FIRST) if path.endswith(tail)), len(LONGEST_FIRST))


def pytest_collection_modifyitems(config, items):
    """Mark ``slow`` every test that loads the embedded model, runs the app (AppTest), starts a Python process or
    drives the browser, so that ``make test-fast`` (``pytest -m "not slow"``) skips them without anyone having
    to remember the marker: derived from the fixtures a test uses, the module it lives in and the words of its own
    code (:data:`SLOW_WORDS`)."""
    for item in items:
        module = getattr(item, "module", None)
        name = module.__name__.rsplit(".", 1)[-1] if module is not None else ""
        if (
            any(f.startswith("embedded") for f in getattr(item, "fixturenames", ()))
            or name in SLOW_MODULES
            or hasattr(module, "AppTest")
        ):
            item.add_marker(pytest.mark.slow)
        elif _starts_slow_work(item):
            item.add_marker(pytest.mark.slow)
    items.sort(key=_longest_first)  # stable: each module keeps its own order
