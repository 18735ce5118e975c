"""Streamlit caching for the Compare page: cached wrappers around :mod:`cwviz.analyses.compare`.

Input A is the sidebar's request; input B is a second :class:`~cwviz.app.services.Request` (another prompt,
or the same prompt on another model). Both analyses come from :func:`cwviz.app.services.get_analysis`
(shared with every page); the per-head summaries from :func:`cwviz.app.services.head_summary`, so a prompt
analysed on another page is not summarised again. What is cached here are the small tables per
(request A, request B, selection).
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from ..analyses import compare
from ..analyses.schema import CompareCells
from ..core.util.errors import CwvizError
from . import services
from .state import examples

#: Prompt B while the sidebar shows the first example: that example with one word changed (a minimal pair).
DEFAULT_PROMPT_B = examples()[0].text.replace("every evening", "every morning")


def default_prompt_b(text_a: str) -> str:
    """Prompt B until the user types one: the minimal pair of the first example when A is that example, else A's own
    prompt, to edit (never an example compared with the user's prompt without a word)."""
    return DEFAULT_PROMPT_B if text_a == examples()[0].text else text_a


def request_b(request_a: services.Request, text: str, model: str = "") -> services.Request:
    """Input B: ``text`` on ``model`` (empty: A's model), with A's device, dtype and tokens to generate."""
    return services.Request(
        model.strip() or request_a.model, request_a.device, request_a.dtype, text, request_a.generate
    )


@st.cache_resource(show_spinner=False, max_entries=6, ttl=3600)
def comparison(request_a: services.Request, request_b: services.Request) -> compare.Comparison:
    """Both analyses and their alignment. B's errors (empty or over-long prompt, a model that does not load
    or does not share A's tokenizer) are raised as the same error type, with "Input B: " in front."""
    a = services.get_analysis(request_a).analysis
    try:
        b = services.get_analysis(request_b).analysis
        return compare.compare(a, b)
    except CwvizError as err:
        raise type(err)(f"Input B: {err}") from None


@st.cache_data(max_entries=16, show_spinner=False)
def alignment(request_a: services.Request, request_b: services.Request) -> tuple[str, pd.DataFrame]:
    """(what the alignment is, its table) (:class:`cwviz.analyses.compare.Alignment`)."""
    cmp = comparison(request_a, request_b)
    return cmp.alignment.describe(cmp.a.num_tokens, cmp.b.num_tokens), cmp.alignment.table


@st.cache_data(max_entries=64, show_spinner=False)
def map_cells(
    request_a: services.Request, request_b: services.Request, layer: int, head: int | None, kind: str, query: int
) -> CompareCells:
    """The compared maps of one layer (:func:`cwviz.analyses.compare.map_cells`)."""
    return compare.map_cells(comparison(request_a, request_b), layer, head, kind, query)


@st.cache_data(max_entries=16, show_spinner=False)
def head_changes(request_a: services.Request, request_b: services.Request) -> pd.DataFrame:
    """Per-head summaries of A and B and their changes (:func:`cwviz.analyses.compare.summary_changes`)."""
    comparison(request_a, request_b)  # refuses inputs that cannot be compared head by head
    return compare.summary_changes(services.head_summary(request_a), services.head_summary(request_b))


@st.cache_data(max_entries=16, show_spinner=False)
def logprob_changes(request_a: services.Request, request_b: services.Request) -> pd.DataFrame:
    """Next-token log-probabilities of A and B at each aligned position
    (:func:`cwviz.analyses.compare.logprob_changes`)."""
    return compare.logprob_changes(comparison(request_a, request_b))
