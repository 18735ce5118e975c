"""Streamlit caching for the Flow page and the tour's flow step: the signed flow (:func:`cwviz.core.method.flow.flow`)
of the sidebar's analysis, one :class:`~cwviz.core.method.flow_tables.Flow` per (request, position, target, foil).

What does not depend on the target (:func:`~cwviz.core.method.flow.flow_basis`: the residual stream's pass, the logits
at the position, each head's vocabulary) is kept per (request, position), so a new target or foil pays for its routing
alone, and the model's top next tokens are read from the same logits (no pass of their own).

A Flow holds every layer's largest edges, so pruning it to another kept fraction of the |mass| (the page's slider)
reads the cached Flow again and runs nothing; it is kept with ``st.cache_resource`` (read-only, shared by the
sessions, not copied on every rerun as ``st.cache_data`` would). The target and foil the user types are resolved here:
a string that is not one token gives the library's message and the default in its place, never a traceback.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import streamlit as st

from ..analyses import check, route
from ..analyses.predictions import next_tokens
from ..analyses.schema import FLOW_METHODS
from ..core.method import attribution
from ..core.method.flow import FlowBasis, flow, flow_basis
from ..core.method.flow_tables import Flow
from ..core.util.errors import ArgumentError
from ..core.util.progress import Progress
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
                problems.append(
                    f"{err}; showing the model's top next token {_token(request, position, None)!r} instead"
                )
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


# -- the registry's methods on the page (issue 54): one attribution per (request, position, target, foil, method) ------

#: Attributions kept (each holds up to ``EDGE_LIMIT`` edges a layer for a method with edges: a few MB).
ATTRIBUTION_ENTRIES = 8
#: Where the test's results are (docs/flow.md; a small torch-free table the page reads, committed with the runs).
TEST_RESULTS = Path(__file__).with_name("flow_test.csv")
#: The test's table's columns.
TEST_COLUMNS = ("model", "intervention", "method", "statistic", "mean", "ci_low", "ci_high", "n")


@dataclass(frozen=True)
class MethodChoice:
    """A registry member as the picker offers it: ``why_not``, None where it runs on the sidebar's model."""

    name: str
    label: str
    description: str
    signed: bool
    has_edges: bool
    why_not: str | None
    #: The intervention its scores are checked against (the first it answers, docs/METHOD.md 7.2).
    intervention: str


def methods(request: services.Request) -> tuple[MethodChoice, ...]:
    """The registry's members in report order (:data:`cwviz.analyses.schema.FLOW_METHODS`), each with whether it runs
    on the request's model."""
    bundle = services.get_analysis(request).analysis.bundle
    out = []
    for name in FLOW_METHODS:
        method = attribution.METHODS[name]
        why = method.available(bundle)
        if why is None and method.needs_logits and not bundle.has_logits:
            why = "it needs next-token logits; this model is an encoder"
        intervention = method.intervention
        out.append(
            MethodChoice(name, method.label, method.description, method.signed, method.has_edges, why, intervention)
        )
    return tuple(out)


@st.cache_resource(show_spinner=False, max_entries=ATTRIBUTION_ENTRIES, ttl=3600)
def get_request(request: services.Request, position: int, target: int | None, foil: int | None) -> attribution.Request:
    """The registry's request for the flow on screen (target and foil as the chosen flow resolved them): the methods
    asked of it share its backward pass, and the share flow reads the kept basis (no forward pass)."""
    analysis = services.get_analysis(request).analysis
    basis = _basis(request, position) if analysis.bundle.has_logits else None
    return attribution.request(analysis, position, target, foil, basis=basis)


@st.cache_resource(show_spinner="Attributing the prediction…", max_entries=ATTRIBUTION_ENTRIES, ttl=3600)
def get_attribution(
    request: services.Request, position: int, target: int | None, foil: int | None, method: str
) -> attribution.Attribution:
    """``method``'s attribution of the flow on screen (:func:`cwviz.core.method.attribution.run`). InputError where the
    method does not run on the model."""
    return attribution.run(attribution.check_method(method), get_request(request, position, target, foil))


@st.cache_resource(show_spinner=False, max_entries=2 * ATTRIBUTION_ENTRIES, ttl=3600)
def get_route(
    request: services.Request, position: int, target: int | None, foil: int | None, method: str, kept: float
) -> route.Route:
    """The route of :func:`get_attribution` at the kept fraction ``kept`` (:func:`cwviz.analyses.route.of`, the
    builder ``cwviz flow`` exports with), cached: a click on a node or a head reruns the page and draws it again
    without routing (about 0.1 s at 280 tokens)."""
    return route.of(get_attribution(request, position, target, foil, method), kept)


def default_target(request: services.Request, position: int) -> str:
    """The target the page draws when none is typed: the model's most likely next token that is a word (holds a letter
    or a digit: not a line break, a space or punctuation) among its top next tokens, as exactly one token; else the
    top next token. The demo then starts on a word (issue 55). "" for an encoder."""
    analysis = services.get_analysis(request).analysis
    if not analysis.bundle.has_logits:
        return ""
    top = predictions(request, position)
    tokenizer = analysis.bundle.tokenizer
    for token_id, token in zip(top["token_id"], top["token"], strict=True):
        one = list(tokenizer(token, add_special_tokens=False)["input_ids"]) == [int(token_id)]
        if one and any(c.isalnum() for c in str(token)):
            return str(token)
    return ""


def read_test(path: Path | None = None) -> pd.DataFrame:
    """The test's results (:data:`TEST_COLUMNS`, one row per model, intervention, method and statistic) from ``path``
    (default :data:`TEST_RESULTS`); empty where the file is not there yet."""
    path = TEST_RESULTS if path is None else path
    if not path.is_file():
        return pd.DataFrame(columns=list(TEST_COLUMNS))
    table = pd.read_csv(path)
    missing = set(TEST_COLUMNS) - set(table.columns)
    if missing:
        raise ValueError(f"{path} lacks the columns {sorted(missing)}: it needs {', '.join(TEST_COLUMNS)}")
    return table


def faithfulness_sentence(table: pd.DataFrame, models: tuple[str, ...], method: MethodChoice, intervention: str) -> str:
    """One sentence, one line at 1280 px: how faithful ``method`` was in the test on this model (``models``: the names a
    row may give it, the dashboard's and the model's id), on ``intervention``: its primary ρ (|score| against |effect|,
    1 a perfect ranking, 0 none) with the interval, and for a signed method the share of its top-3 tokens whose sign
    was the knockout's. A model or method without a row: a plain sentence saying it was not tested."""
    rows = table[
        table["model"].isin(models) & (table["method"] == method.name) & (table["intervention"] == intervention)
    ]
    stat = {row.statistic: row for row in rows.itertuples(index=False)}
    if "rho" not in stat:
        return (
            f"This method ({method.label}) was not tested on this model (docs/flow.md: the test ran on SmolLM2 and "
            "Gemma 3)."
        )
    rho = stat["rho"]
    # one line at 1280 px (the first screen holds it, the graph and the totals): the words are few on purpose
    said = (
        f"Tested on {int(rho.n)} GSM8K items: ρ {rho.mean:.2f} [{rho.ci_low:.2f}, {rho.ci_high:.2f}] against the "
        f"{intervention} knockouts' size"
    )
    if method.signed and "sign_agreement" in stat:
        said += f"; top-3 signs right {stat['sign_agreement'].mean:.0%}"
    return said + "."


@st.cache_data(show_spinner=False, ttl=3600)
def tested() -> pd.DataFrame:
    """:func:`read_test` of the committed file, read once."""
    return read_test()


# -- the check against knockouts (issue 54): measured once per prompt, position, target, foil and intervention -------

#: Checks kept (each: p effects).
CHECK_ENTRIES = 16


@dataclass(frozen=True)
class Measured:
    """The knockout effects of one request and intervention ([p], NaN where not measured) and whether all were."""

    effects: np.ndarray
    complete: bool


@st.cache_resource(show_spinner=False)
def _measured_store() -> tuple[dict, threading.Lock]:
    """The measured effects by (request, position, target, foil, intervention), the latest :data:`CHECK_ENTRIES`
    (shared: a knockout of a prompt is the same for every session)."""
    return {}, threading.Lock()


def measured(
    request: services.Request, position: int, target: int | None, foil: int | None, intervention: str
) -> Measured | None:
    """The effects already measured for this flow and intervention (a partial set after a Stop), or None."""
    store, lock = _measured_store()
    with lock:
        return store.get((request, position, target, foil, intervention))


def measure(
    request: services.Request,
    position: int,
    target: int | None,
    foil: int | None,
    intervention: str,
    progress: Progress | None = None,
) -> Measured:
    """Every input token's knockout effect (:func:`cwviz.analyses.check.effects`), ``progress(done, total)`` after each
    pass; what is finished is kept after every pass, so a run the page interrupts (its Stop) keeps it."""
    store, lock = _measured_store()
    key = (request, position, target, foil, intervention)

    def keep(effects: np.ndarray, complete: bool = False) -> None:
        with lock:
            store.pop(key, None)
            store[key] = Measured(effects, complete)
            while len(store) > CHECK_ENTRIES:
                store.pop(next(iter(store)))

    effects, complete = check.effects(
        get_request(request, position, target, foil), intervention, progress=progress, keep=keep
    )
    keep(effects, complete)
    return Measured(effects, complete)


@st.cache_data(show_spinner=False, max_entries=CHECK_ENTRIES, ttl=3600)
def checked(
    request: services.Request,
    position: int,
    target: int | None,
    foil: int | None,
    method: str,
    intervention: str,
    effects: np.ndarray,
) -> check.Check:
    """``method``'s scores against ``effects`` (the test's statistics: :func:`cwviz.analyses.check.check`)."""
    return check.check(get_request(request, position, target, foil), method, intervention, measured=effects)
