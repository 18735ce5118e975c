"""Streamlit caching for the Flow page and the tour's flow step: the signed flow (:func:`cwviz.core.method.flow.flow`)
of the sidebar's analysis, one :class:`~cwviz.core.method.flow_tables.Flow` per (request, position, target, foil).

A Flow holds every layer's largest edges, so pruning it to another share of the |mass| (the page's slider) reads the
cached Flow again and runs nothing; it is kept with ``st.cache_resource`` (read-only, shared by the sessions, not
copied on every rerun as ``st.cache_data`` would). The target and foil the user types are resolved here: a string that
is not one token gives the library's message and the default in its place, never a traceback.
"""

from __future__ import annotations

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
    replaced by its default); ``predictions`` are the model's top next tokens at the position (empty for an encoder)."""

    flow: Flow
    predictions: pd.DataFrame
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
    a foil equal to the target) is replaced by its default, and the message says so."""
    top = predictions(request, position)
    if top.empty:  # an encoder: the flow into the position's representation
        return FlowChoice(get_flow(request, position, None, None), top)
    ids = [int(i) for i in top["token_id"]]
    wanted_target: int | str = target if target.strip() else ids[0]
    problems: list[str] = []
    # Foil candidates after the typed one: the top next tokens in order (the one equal to the target is refused below).
    foils: list[int | str | None] = [] if foil is None else ([foil] if foil.strip() else []) + ids
    wanted_foil = foils.pop(0) if foils else None
    while True:
        try:
            made = get_flow(request, position, wanted_target, wanted_foil)
            return FlowChoice(made, top, tuple(problems), (wanted_target, wanted_foil))
        except InputError as err:
            message = str(err)
            if message.startswith("the foil") and foils:
                if isinstance(wanted_foil, str):
                    problems.append(f"{message}; showing the foil {top.loc[top['token_id'] == foils[0], 'token'].iloc[0]!r} instead")
                wanted_foil = foils.pop(0)
            elif isinstance(wanted_target, str):
                problems.append(f"{message}; showing the model's top next token {top['token'].iloc[0]!r} instead")
                wanted_target = ids[0]
            else:
                raise
