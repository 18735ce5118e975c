"""The real server under load, as a class would use it.

* 16 browser sessions (Chromium contexts) at once on ``cwviz app`` (how the README starts it), each with
  its own prompt: each shows its own tokens (every heatmap label) and its own numbers (a contribution read
  off a heatmap cell equals the library's), no error; the server answers its health check throughout.
  The time for all 16 and the server's peak resident memory are printed (``-s`` shows them) and written
  to ``tests/artifacts/load.txt``.
* 130 distinct prompts analysed one after another through the dashboard's services (what the pages call):
  resident memory stays under a bound that follows from the cache sizes (below).

Only the first is marked ``alone`` (run by itself after the rest): its health checks time the server. The second
measures its own process's resident size, which the tests beside it do not change.

Hosting mode's limit on analyses at once (the busy message, the rest served) is tested once, through the services
with threads (tests/app/test_hosting.py), not again through a server.
"""

from __future__ import annotations

import gc
import re
import threading
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlencode

import psutil
import pytest

from cwviz.charts.heatmaps import LABEL_PX
from tests.helpers.browser import (
    ARTIFACTS,
    CHART,
    ERROR_SELECTORS,
    HEATMAP_LABELS_JS,
    RENDERED,
    VIEWPORT,
    _labels_check,
    _serve,
)

SESSIONS = 16
#: Enough that each half overflows the ``st.cache_data`` tables (at most 64 entries a function, the largest of the
#: services called below): the leak check below compares the halves, both past the point where the caches stop
#: growing. One more than 64 a half is enough for that; each prompt more costs about 0.4 s.
CACHE_ENTRIES = 64
PROMPTS = 2 * (CACHE_ENTRIES + 1)
LAYER = 14


def _prompts(n: int, offset: int = 0, chars: int = 120) -> list[str]:
    """Distinct short prompts: the start of the shipped GSM8K sample's questions, numbered (about 30
    tokens: each heatmap shows the whole prompt, so every label can be checked)."""
    from cwviz.core.util.texts import gsm8k_path, read_texts

    questions = [text.split("\n")[0][:chars] for text in read_texts(gsm8k_path(), field="question")]
    return [f"Question {offset + k}: {questions[k % len(questions)]}" for k in range(n)]


def _peak_rss(process: psutil.Process) -> int:
    """Peak resident bytes (VmHWM) of ``process`` and its children (cwviz app runs streamlit as a child)."""
    total = 0
    for proc in [process, *process.children(recursive=True)]:
        try:
            status = Path(f"/proc/{proc.pid}/status").read_text()
        except OSError:
            continue
        match = re.search(r"VmHWM:\s+(\d+) kB", status)
        total = max(total, int(match.group(1)) * 1024) if match else total
    return total


class Health:
    """Polls the server's health endpoint every half second in a thread; records every failure."""

    def __init__(self, url: str):
        self.url, self.failures, self.checks = url, [], 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with urllib.request.urlopen(f"{self.url}/_stcore/health", timeout=5) as response:
                    if response.read().strip() != b"ok":
                        self.failures.append("not ok")
            except OSError as err:
                self.failures.append(str(err))
            self.checks += 1
            self._stop.wait(0.5)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


@pytest.fixture(scope="module")
def expected():
    """Each prompt's labels and the layer-level contribution of query 5 to key 0, from the library."""
    import cwviz
    from cwviz.analyses import tables

    bundle = cwviz.load_model("embedded")
    out = {}
    for text in _prompts(SESSIONS):
        analysis = cwviz.analyze(bundle, text)
        contribution = float(analysis.contributions(LAYER, "inter").sum(0)[5, 0])
        out[text] = (list(tables.position_labels(analysis.tokens)), contribution)
    return out


#: Switches off every CSS animation and transition of a page. The 16 browsers share the server's two cores here, where
#: a class's browsers run on their own machines; their spinners and placeholders, animated while each waits its turn,
#: cost the browser more than the pages' drawing (the 16 pages drew in 73 s animated, 50 s still; 2026-12-06).
STILL_CSS = """document.addEventListener("DOMContentLoaded", () => {
  const style = document.createElement("style");
  style.textContent = "*, *::before, *::after { animation: none !important; transition: none !important; }";
  document.head.appendChild(style);
});"""


def _open_all(browser, url: str, prompts: list[str]) -> list:
    """One fresh context a prompt, all navigated at once (none waits for another).

    Not tabs of one context (each would still be its own Streamlit session): there the 16 pages arrive as one burst,
    without the JavaScript compilation of each fresh context between them, and on these two cores, shared with the 16
    browsers, one health check of the server then went unanswered for 5 s (2026-12-06)."""
    pages = []
    for text in prompts:
        context = browser.new_context(viewport=VIEWPORT, reduced_motion="reduce")
        context.add_init_script(STILL_CSS)
        page = context.new_page()
        page.goto(f"{url}/?{urlencode({'prompt': text, 'layer': LAYER, 'token': 5})}", wait_until="commit")
        pages.append(page)
    return pages


def _done(page) -> str | None:
    """'charts' once the heatmaps are drawn, 'error' when an error shows, else None."""
    if page.locator(ERROR_SELECTORS).count():
        return "error"
    if page.locator(RENDERED).count() >= 2:
        return "charts"
    return None


def _wait_all(pages, timeout: float = 600) -> list[str]:
    deadline = time.monotonic() + timeout
    states: list[str | None] = [None] * len(pages)
    while None in states and time.monotonic() < deadline:
        for k, page in enumerate(pages):
            if states[k] is None:
                states[k] = _done(page)
        time.sleep(0.2)
    assert None not in states, f"{states.count(None)} session(s) showed nothing in {timeout:.0f} s"
    return states


@pytest.mark.alone
def test_sixteen_sessions_at_once_each_see_their_own_prompt(browser, expected):
    prompts = _prompts(SESSIONS)
    servers: list = []
    with _serve("load-server.log", via_cli=True, processes=servers) as url, Health(url) as health:
        # Warm: the embedded model is loaded once per server, before the class arrives.
        warm = browser.new_page(viewport=VIEWPORT)
        warm.goto(url)
        warm.wait_for_function(
            "([sel, n]) => document.querySelectorAll(sel).length >= n", arg=[RENDERED, 2], timeout=240_000
        )
        warm.close()
        start = time.monotonic()
        pages = _open_all(browser, url, prompts)
        states = _wait_all(pages)
        elapsed = time.monotonic() - start
        time.sleep(1.0)
        peak = _peak_rss(psutil.Process(servers[0].pid))
        for page, text, state in zip(pages, prompts, states):
            assert state == "charts", f"{text!r}: {page.locator(ERROR_SELECTORS).all_inner_texts()}"
            labels, contribution = expected[text]
            # This session's own tokens: every label drawn is one of its prompt's (thinned so none overlap; a long
            # one cut with an ellipsis at the axis' label limit).
            views = page.evaluate(HEATMAP_LABELS_JS)
            _labels_check(views, LABEL_PX)
            for view in views:
                for axis in view["axes"]:
                    for shown in (t["text"] for t in axis["labels"]):
                        assert any(label == shown or label.startswith(shown.removesuffix("…")) for label in labels), (
                            text,
                            shown,
                        )
            cell = (
                page.locator(CHART)
                .nth(1)
                .locator('path[aria-label^="key (position token): 0; query (position token): 5;"]')
                .first
            )
            shown = float(re.search(r"contribution: ([+-]\d+\.\d{4})", cell.get_attribute("aria-label")).group(1))
            assert shown == pytest.approx(contribution, abs=6e-5), text
            page.context.close()
    assert health.checks > 0 and not health.failures, health.failures
    report = (
        f"{SESSIONS} sessions at once, own prompt each: all drawn in {elapsed:.1f} s; server peak RSS {peak / 1e9:.2f} "
        "GB"
    )
    print(report)
    (ARTIFACTS / "load.txt").write_text(report + "\n")


def test_a_hundred_and_thirty_prompts_one_after_another_stay_under_the_cache_bound():
    """Bound: the resident size after the first prompt, plus what the caches may hold: ``get_analysis`` keeps
    at most 6 analyses (each at most :func:`cwviz.core.method.memory.estimate` of its tokens, which also counts
    the transient forward pass), the small ``st.cache_data`` tables at most 64 entries a function (a few
    hundred kB each at these lengths: 5 functions x 64 x 0.5 MB), and 150 MB of allocator slack."""
    from cwviz.app import services
    from cwviz.core.method import memory

    prompts = _prompts(PROMPTS, offset=1000)
    process = psutil.Process()
    rss = []
    longest = 0
    for k, text in enumerate(prompts):
        request = services.Request(text=text)
        analyzed = services.get_analysis(request)
        longest = max(longest, analyzed.analysis.num_tokens)
        services.heatmap_cells(request, LAYER, None, "contribution_inter", "inter", 5, "window")
        services.head_summary(request)
        services.token_factors(request, LAYER, 5, 0, "inter")
        services.top_keys(request, 5, None, "inter", 5)
        del analyzed
        if k == 0:
            gc.collect()
            baseline = process.memory_info().rss
        rss.append(process.memory_info().rss)
    bundle = services.get_bundle("embedded")
    per_analysis = memory.estimate(
        bundle.model.config, bundle.info, longest, stream=services.keeps_stream(bundle, longest)
    )["total"]
    bound = baseline + 6 * per_analysis + 5 * CACHE_ENTRIES * 500_000 + 150_000_000
    peak = max(rss)
    report = (
        f"{PROMPTS} prompts (up to {longest} tokens) through the services: RSS after the first {baseline / 1e6:.0f} "
        f"MB, peak {peak / 1e6:.0f} MB, last {rss[-1] / 1e6:.0f} MB; bound {bound / 1e6:.0f} MB"
    )
    print(report)
    with (ARTIFACTS / "load.txt").open("a") as out:
        out.write(report + "\n")
    assert peak <= bound, report
    # No leak: the second half of the prompts does not raise the resident size beyond what the caches hold.
    half = PROMPTS // 2
    assert max(rss[half:]) <= max(rss[:half]) + 6 * per_analysis + 50_000_000, report
