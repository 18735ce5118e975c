"""Streamlit caching for the Flow page and the tour's flow step: the signed flow (:func:`cwviz.core.method.flow.flow`)
of the sidebar's analysis, one :class:`~cwviz.core.method.flow_tables.Flow` per (request, position, target, foil).

What does not depend on the target (:func:`~cwviz.core.method.flow.flow_basis`: the residual stream's pass, the logits
at the position, each head's vocabulary) is kept per (request, position), so a new target or foil pays for its routing
alone, and the model's top next tokens are read from the same logits (no pass of their own).

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
from ..core.method.flow import FlowBasis, flow, flow_basis
from ..core.method.flow_tables import Flow
from ..core.util.errors import ArgumentError
from . import services

#: Flows kept (each holds up to ``flow.EDGE_LIMIT`` edges a layer: a few MB).
FLOW_ENTRIES = 8
#: Flow bases kept (:func:`get_basis`).
BASIS_ENTRIES = 2


@dataclass(frozen=True)
class FlowChoice:
    """The flow the page shows and why: ``problems`` says what of the typed target or foil could not be used (each
    replaced by its default)."""

    flow: Flow
    problems: tuple[str, ...] = ()
    #: The target and foil as :func:`get_flow` was called with them (its cache key, for :func:`heads`).
    asked: tuple[int | str | None, int | str | None] = (None, None)


@st.cache_resource(show_spinner="Reading the residual stream…", max_entries=BASIS_ENTRIES, ttl=3600)
def get_basis(request: services.Request, position: int) -> FlowBasis:
    """The target-independent part of the flow into ``position`` (:func:`~cwviz.core.method.flow.flow_basis`): one
    forward pass. It holds layers x T x d_model floats (300 tokens of SmolLM2-135M: 21 MB; 2,000: 138 MB), so only the
    latest :data:`BASIS_ENTRIES` are kept: the prompt and position on screen, and the one before."""
    return flow_basis(services.get_analysis(request).analysis, position)


@st.cache_resource(show_spinner="Following the prediction through every layer…", max_entries=FLOW_ENTRIES, ttl=3600)
def get_flow(request: services.Request, position: int, target: int | str | None, foil: int | str | None) -> Flow:
    """The signed flow of the request's analysis into ``position`` toward ``target`` over ``foil`` (ids or one-token
    strings), from :func:`get_basis`. Raises :class:`~cwviz.core.util.errors.InputError` for a target or foil that is
    not one token (not cached: it is checked before any work)."""
    return flow(services.get_analysis(request).analysis, position, target, foil, basis=_basis(request, position))


def _basis(request: services.Request, position: int) -> FlowBasis:
    """:func:`get_basis`, made again when the analysis it was made from is no longer the request's (the analysis cache
    let it go and made it again since: the flow refuses a basis of another analysis)."""
    basis = get_basis(request, position)
    if basis.source() is not services.get_analysis(request).analysis:
        get_basis.clear(request, position)
        basis = get_basis(request, position)
    return basis


@st.cache_data(max_entries=16, show_spinner=False)
def heads(request: services.Request, position: int, target: int | str | None, foil: int | str | None) -> pd.DataFrame:
    """``Flow.heads`` of :func:`get_flow` (the target and foil as ``FlowChoice.asked`` holds them, its cache key): the
    layer x head table with each head's vocabulary, made once a flow rather than on every rerun of the page."""
    return get_flow(request, position, target, foil).heads


@st.cache_data(max_entries=32, show_spinner=False)
def predictions(request: services.Request, position: int) -> pd.DataFrame:
    """The model's top next tokens after ``position`` (:func:`cwviz.analyses.predictions.next_tokens`), read from the
    logits of :func:`get_basis`."""
    return next_tokens(services.get_analysis(request).analysis, position, logits=_basis(request, position).logits)


def choose(request: services.Request, position: int, target: str = "", foil: str | None = None) -> FlowChoice:
    """The flow for what the pickers hold: ``target`` typed ("" = the model's top next token), ``foil`` typed ("" = the
    most likely next token other than the target; None = no foil). A typed token the model cannot use as one token (or
    a foil equal to the target, or to the model's top token when that is the target) is replaced by its default, and the
    message names the token drawn in its place. Which argument was refused is read from the error's ``argument``
    (:class:`~cwviz.core.util.errors.ArgumentError`), never from its message."""
    if not services.get_analysis(request).analysis.bundle.has_logits:  # an encoder: the flow into the representation
        return FlowChoice(get_flow(request, position, None, None))
    wanted_target: str | None = target if target.strip() else None  # None: the flow's own default, the top next token
    foils = _foils(request, position, foil)
    wanted_foil = next(foils, None)
    problems: list[str] = []
    foil_refused: str | None = None  # why the typed foil was not used; said once the foil drawn instead is known
    while True:
        try:
            made = get_flow(request, position, wanted_target, wanted_foil)
        except ArgumentError as err:
            if err.argument == "foil" and (following := next(foils, None)) is not None:
                if isinstance(wanted_foil, str):
                    foil_refused = str(err)
                wanted_foil = following  # the next top token; one equal to the target is refused in turn
            elif err.argument == "target" and isinstance(wanted_target, str):
                problems.append(f"{err}; showing the model's top next token {_token(request, position, None)!r} instead")
                wanted_target = None
            else:
                raise
            continue
        if foil_refused is not None:
            problems.append(f"{foil_refused}; showing the foil {made.foil_token!r} instead")
        return FlowChoice(made, tuple(problems), (wanted_target, wanted_foil))


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
