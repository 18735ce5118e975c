"""What the dashboard pages call: the only module that uses Streamlit caching.

Three levels, so that changing layer, head or token never reruns the model:

* :func:`get_bundle` — ``st.cache_resource``: one model per (model, device, dtype), shared by every
  session. A :class:`~cwviz.Bundle` is immutable, and cwviz records a forward pass per thread
  (:mod:`cwviz.core.capture`), so two sessions analysing different prompts at once each get their own numbers.
* :func:`get_analysis` — ``st.cache_resource`` with ``max_entries``: the immutable
  :class:`~cwviz.Analysis` of one :class:`Request` (model, device, dtype, prompt, generated tokens),
  shared read-only between sessions.
* ``st.cache_data`` functions returning small pandas tables per (request, layer, head, ...), computed by
  :mod:`cwviz.analyses.tables`.

Failed loads and analyses raise :class:`~cwviz.core.errors.CwvizError` and are not cached.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pandas as pd
import streamlit as st

from ..analyses import tables
from ..core.analysis import Analysis, analyze, max_tokens, tokenize
from ..core.errors import InputError
from ..core.generate import greedy_continuation
from ..core.models import Bundle, load_model
from ..core.settings import env_int
from . import hosting

#: Longest input (prompt plus generated tokens) the dashboard analyses; the CLI and API allow more.
DEFAULT_APP_MAX_TOKENS = 1024
#: Largest JSON export offered for the whole analysis; beyond it the export covers the selected layer.
JSON_EXPORT_LIMIT = 40_000_000


@dataclass(frozen=True)
class Request:
    """Everything that determines one forward pass (and so one :class:`~cwviz.Analysis`)."""

    model: str = "embedded"
    device: str = "auto"
    dtype: str = "auto"
    text: str = ""
    generate: int = 0


@dataclass(frozen=True)
class Analyzed:
    """An analysis and how many of its tokens are the prompt (the rest were generated greedily)."""

    analysis: Analysis
    prompt_tokens: int


def app_max_tokens(bundle: Bundle | None = None) -> int:
    """``$CWVIZ_APP_MAX_TOKENS`` (default 1024), never more than the core limit :func:`cwviz.max_tokens`."""
    policy = hosting.policy_from_env()
    default = policy.max_tokens if policy.hosted else DEFAULT_APP_MAX_TOKENS
    return min(env_int("CWVIZ_APP_MAX_TOKENS", default), max_tokens(bundle))


@st.cache_resource(show_spinner="Loading the model (once per model, device and dtype)…", max_entries=3)
def get_bundle(model: str, device: str = "auto", dtype: str = "auto") -> Bundle:
    """The loaded model, shared by all sessions. Raises ModelLoadError with a message naming the fix.

    In hosting mode (:mod:`cwviz.app.hosting`) only allow-listed models load; trust_remote_code is never on.
    """
    hosting.policy_from_env().check_model(model)
    return load_model(model, device=device, dtype=dtype)


def check_dashboard_length(bundle: Bundle, prompt_tokens: int, generate: int) -> None:
    """Refuse inputs longer than the dashboard limit with a message that says what to do."""
    limit = app_max_tokens(bundle)
    total = prompt_tokens + generate
    if total > limit:
        what = f"prompt has {prompt_tokens:,} tokens" + (f" plus {generate} to generate" if generate else "")
        raise InputError(
            f"{what}; the dashboard's limit is {limit:,} tokens. Shorten the prompt, set CWVIZ_APP_MAX_TOKENS "
            f"to raise the limit, or use the CLI or Python API (limit {max_tokens(bundle):,})."
        )


@st.cache_resource(show_spinner="Analysing the prompt…", max_entries=6, ttl=3600)
def get_analysis(request: Request) -> Analyzed:
    """Run the model once on the request's prompt (plus ``generate`` greedy tokens) and keep the result.

    At most ``CWVIZ_MAX_CONCURRENT`` analyses run at once (:func:`cwviz.app.hosting.analysis_slot`).
    """
    with hosting.analysis_slot(hosting.policy_from_env()):
        return _analyse(request)


def _analyse(request: Request) -> Analyzed:
    bundle = get_bundle(request.model, request.device, request.dtype)
    prompt_ids = tokenize(bundle, request.text)
    check_dashboard_length(bundle, len(prompt_ids), request.generate)
    if request.generate > 0:
        ids = greedy_continuation(bundle, prompt_ids, request.generate)
        text = request.text + bundle.tokenizer.decode(ids[len(prompt_ids) :])
        return Analyzed(analyze(bundle, text, input_ids=ids), len(prompt_ids))
    return Analyzed(analyze(bundle, request.text), len(prompt_ids))


@st.cache_data(max_entries=64, show_spinner=False)
def heatmap_cells(request: Request, layer: int, head: int | None, measure: str, kind: str, query: int, view: str) -> tables.HeatmapCells:
    """Tidy heatmap cells of one layer (see :func:`cwviz.analyses.tables.heatmap_cells`)."""
    return tables.heatmap_cells(get_analysis(request).analysis, layer, head, measure, kind, query, view)


@st.cache_data(max_entries=16, show_spinner="Summarising every head…")
def head_summary(request: Request) -> pd.DataFrame:
    """One row per (layer, head): sink shares and attention/contribution divergence."""
    return tables.head_summary(get_analysis(request).analysis)


@st.cache_data(max_entries=64, show_spinner=False)
def token_factors(request: Request, layer: int, query: int, head: int | None, kind: str) -> tables.TokenFactors:
    """The factors of each key's contribution to one query (see :func:`cwviz.analyses.tables.token_factors`)."""
    return tables.token_factors(get_analysis(request).analysis, layer, query, head, kind)


@st.cache_data(max_entries=64, show_spinner="Ranking keys in every layer…")
def top_keys(request: Request, query: int, head: int | None, kind: str, k: int = 5) -> pd.DataFrame:
    """The query's top keys in every layer (see :func:`cwviz.analyses.tables.top_keys_across_layers`)."""
    return tables.top_keys_across_layers(get_analysis(request).analysis, query, head, kind, k)


@st.cache_data(max_entries=16, show_spinner="Rendering bertviz…")
def bertviz_html(request: Request, view: str, weights: str, layer: int) -> str:
    """bertviz HTML (head or model view) for attention or contribution weights."""
    from ..analyses.bertviz import render

    return render(get_analysis(request).analysis, view=view, weights=weights, layer=layer)


def json_export_size(analysis: Analysis) -> int:
    """Rough size in bytes of the whole-analysis JSON (two triangular matrices per layer and head)."""
    t = analysis.num_tokens
    return analysis.num_layers * analysis.num_heads * t * (t + 1) * 11


@st.cache_data(max_entries=4, show_spinner=False)
def analysis_json(request: Request, layers: tuple[int, ...] | None) -> bytes:
    """The CLI's JSON export (:meth:`cwviz.Analysis.to_dict`) as UTF-8 bytes."""
    analysis = get_analysis(request).analysis
    data = analysis.to_dict(layers=None if layers is None else list(layers))
    return json.dumps(data, ensure_ascii=False).encode("utf-8")
