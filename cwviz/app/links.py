"""Links to a dashboard page on a given selection: the URL parameters each page reads, as a relative URL.

A link opened in a new tab starts a fresh session, which reads the sidebar's parameters
(:data:`cwviz.app.state.URL_KEYS`) and each page picker's own (``measure``, ``kind`` on Heatmaps; ``flow_at``,
``target``, ``foil_on``, ``foil``, ``kept`` on Flow; ``token_kind`` on Token; ``sink``, ``lambda``, ``scope`` on Sinks):
so a link restores the whole view. The URL is relative to the page showing it, so it works under any server base path.
"""

from __future__ import annotations

from urllib.parse import urlencode

from . import prompt_store
from .services import Request
from .state import PRESENTER, presenter

#: Each page's URL path, relative to the page showing the link: ``st.Page`` infers it from the script's name, and
#: serves the default page (Heatmaps, in app.py) at the app's root only ("heatmaps" gives "Page not found").
PAGES = {"heatmaps": "./", "token": "token", "sinks": "sinks", "flow": "flow"}


def selection_params(request: Request, layer: int, head: int | None, query: int | None) -> dict[str, str]:
    """The sidebar's parameters for ``request`` and a selection, as :func:`cwviz.app.state.write_url` writes them."""
    params = {
        "model": request.model,
        "device": request.device,
        "dtype": request.dtype,
        "gen": str(request.generate),
        "layer": str(layer),
        "head": "all" if head is None else str(head),
    }
    if query is not None:
        params["token"] = str(query)
    params |= prompt_store.link_params(request.text)  # a long prompt by its hash (links stay under 8 kB)
    if presenter():  # presenter mode goes with every link
        params[PRESENTER] = "true"
    return params


def page_url(page: str, request: Request, layer: int, head: int | None, query: int | None = None, **extra: str) -> str:
    """The relative URL of ``page`` (a key of :data:`PAGES`) showing ``request`` with this selection, plus the
    page's own parameters ``extra`` (``measure="contribution"``)."""
    if page not in PAGES:
        raise ValueError(f"page must be one of {', '.join(PAGES)}, not {page!r}")
    params = selection_params(request, layer, head, query) | {name: str(value) for name, value in extra.items()}
    return f"{PAGES[page]}?{urlencode(params)}"
