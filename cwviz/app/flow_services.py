"""Streamlit caching for the Flow page and the tour's flow step: the signed flow (:func:`cwviz.core.method.flow.flow`)
of the sidebar's analysis, one :class:`~cwviz.core.method.flow_tables.Flow` per (request, position, target, foil).

A Flow holds every layer's largest edges, so pruning it to another share of the |mass| (the page's slider) reads the
cached Flow again and runs nothing; it is kept with ``st.cache_resource`` (read-only, shared by the sessions, not
copied on every rerun as ``st.cache_data`` would). The target and foil the user types are resolved here: a string that
is not one token gives the library's message and the default in its place, never a traceback.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pandas as pd
import streamlit as st

from ..analyses.predictions import next_tokens
from ..core.method.flow import flow
from ..core.method.flow_tables import Flow
from ..core.util.errors import InputError
from . import services

#: Flows kept (each holds up to ``flow.EDGE_LIMIT`` edges a layer: a few MB).
FLOW_ENTRIES = 8


@dataclass(frozen=True)
class FlowChoice:
    """The flow the page shows and why: ``problems`` says what of the typed target or foil could not be used (each
    replaced by its default)."""

    flow: Flow
    problems: tuple[str, ...] = ()
    #: The target and foil as :func:`get_flow` was called with them (its cache key, for :func:`heads`).
    asked: tuple[int | str | None, int | str | None] = (None, None)


@st.cache_resource(show_spinner="Following the prediction through every layer…", max_entries=FLOW_ENTRIES, ttl=3600)
def get_flow(request: services.Request, position: int, target: int | str | None, foil: int | str | None) -> Flow:
    """The signed flow of the request's analysis into ``position`` toward ``target`` over ``foil`` (ids or one-token
    strings). Raises :class:`~cwviz.core.util.errors.InputError` for a target or foil that is not one token (not
    cached: it is checked before any work)."""
    return flow(services.get_analysis(request).analysis, position, target, foil)


@st.cache_data(max_entries=16, show_spinner=False)
def heads(request: services.Request, position: int, target: int | str | None, foil: int | str | None) -> pd.DataFrame:
    """``Flow.heads`` of :func:`get_flow` (the target and foil as ``FlowChoice.asked`` holds them, its cache key): the
    layer x head table with each head's vocabulary, made once a flow rather than on every rerun of the page."""
    return get_flow(request, position, target, foil).heads


@st.cache_data(max_entries=32, show_spinner=False)
def predictions(request: services.Request, position: int) -> pd.DataFrame:
    """The model's top next tokens after ``position`` (:func:`cwviz.analyses.predictions.next_tokens`)."""
    return next_tokens(services.get_analysis(request).analysis, position)


def choose(request: services.Request, position: int, target: str = "", foil: str | None = None) -> FlowChoice:
    """The flow for what the pickers hold: ``target`` typed ("" = the model's top next token), ``foil`` typed ("" = the
    most likely next token other than the target; None = no foil). A typed token the model cannot use as one token (or
    a foil equal to the target) is replaced by its default, and the message says so. The model's top next tokens
    (:func:`predictions`, a forward pass of the prefix) are read only where a default foil or a message needs them."""
    if not services.get_analysis(request).analysis.bundle.has_logits:  # an encoder: the flow into the representation
        return FlowChoice(get_flow(request, position, None, None))
    wanted_target: str | None = target if target.strip() else None  # None: the flow's own default, the top next token
    foils = _foils(request, position, foil)
    wanted_foil = next(foils, None)
    problems: list[str] = []
    while True:
        try:
            made = get_flow(request, position, wanted_target, wanted_foil)
            return FlowChoice(made, tuple(problems), (wanted_target, wanted_foil))
        except InputError as err:
            message = str(err)
            if message.startswith("the foil") and (following := next(foils, None)) is not None:
                if isinstance(wanted_foil, str):
                    shown = _token(request, position, following)
                    problems.append(f"{message}; showing the foil {shown!r} instead")
                wanted_foil = following
            elif isinstance(wanted_target, str):
                problems.append(f"{message}; showing the model's top next token {_token(request, position, None)!r} instead")
                wanted_target = None
            else:
                raise


def _foils(request: services.Request, position: int, foil: str | None) -> Iterator[int | str]:
    """The foils to try in turn: the typed one, then the model's top next tokens (the one equal to the target is
    refused by the flow, and the next is tried)."""
    if foil is None:
        return
    if foil.strip():
        yield foil
    yield from (int(i) for i in predictions(request, position)["token_id"])


def _token(request: services.Request, position: int, token_id: int | None) -> str:
    """A top next token's text (``None``: the top one)."""
    top = predictions(request, position)
    return str(top["token"].iloc[0] if token_id is None else top.loc[top["token_id"] == token_id, "token"].iloc[0])
