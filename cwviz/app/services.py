"""What the dashboard pages call: the only module that uses Streamlit caching.

Three levels, so that changing layer, head or token never reruns the model:

* :func:`get_bundle` — ``st.cache_resource``: one model per (model, device, dtype), shared by every
  session. A :class:`~cwviz.Bundle` is immutable, and cwviz records a forward pass per thread
  (:mod:`cwviz.core.method.capture`), so two sessions analysing different prompts at once each get their own numbers.
* :func:`get_analysis` — ``st.cache_resource`` with ``max_entries``: the immutable
  :class:`~cwviz.Analysis` of one :class:`Request` (model, device, dtype, prompt, generated tokens),
  shared read-only between sessions.
* ``st.cache_data`` functions returning small pandas tables per (request, layer, head, ...), computed by
  :mod:`cwviz.analyses.tables`.

Failed loads and analyses raise :class:`~cwviz.core.util.errors.CwvizError` and are not cached.

Long steps show ``st.progress`` with the layers done (:func:`progress_bar`). The bar is drawn by the cached
function itself, where the chart it precedes will go, and removed when the step ends: Streamlit replays
a cached function's elements on every cache hit, so what it replays is a bar that ends empty, never a
stale one, and the bar takes the place of the previous prompt's chart while a new prompt is analysed.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import streamlit as st

from ..analyses import tables, tour
from ..core.defaults import DEVICE, DTYPE, MODEL
from ..core.loading.generate import greedy_continuation
from ..core.loading.inputs import max_tokens, tokenize
from ..core.loading.models import Bundle, load_model
from ..core.method import export, memory
from ..core.method.analysis import Analysis, analyze
from ..core.method.residual import check_flow_supported
from ..core.util.errors import InputError, UnsupportedModelError
from ..core.util.heap import trim_heap
from ..core.util.progress import Progress, items_left_text
from ..core.util.settings import env_int
from ..core.util.texts import read_texts
from . import hosting

#: Longest input (prompt plus generated tokens) the dashboard analyses by default, on a CPU (the embedded model's
#: context) and on a GPU; never more than the model's positions (:func:`cwviz.max_tokens`) and the memory check.
DEFAULT_APP_MAX_TOKENS = 8192
DEFAULT_APP_MAX_TOKENS_GPU = 32_768
#: Largest JSON export offered for the whole analysis; beyond it the export covers the selected layer.
JSON_EXPORT_LIMIT = 40_000_000
#: The most bytes of residual stream (:func:`~cwviz.core.method.memory.stream_bytes`) an analysis keeps for the Flow
#: page (``analyze(stream=True)``; SmolLM2-135M up to about 970 tokens): the flow into the last token then runs no pass.
STREAM_BYTES = 64 * 2**20


@dataclass(frozen=True)
class Request:
    """Everything that determines one forward pass (and so one :class:`~cwviz.Analysis`)."""

    model: str = MODEL
    device: str = DEVICE
    dtype: str = DTYPE
    text: str = ""
    generate: int = 0


@dataclass(frozen=True)
class Analyzed:
    """An analysis and how many of its tokens are the prompt (the rest were generated greedily)."""

    analysis: Analysis
    prompt_tokens: int


def app_max_tokens(bundle: Bundle | None = None) -> int:
    """``$CWVIZ_APP_MAX_TOKENS`` (default :data:`DEFAULT_APP_MAX_TOKENS`, or :data:`DEFAULT_APP_MAX_TOKENS_GPU` for a
    model on a GPU; hosting mode's own default when hosted), never more than the core limit :func:`cwviz.max_tokens`."""
    policy = hosting.policy_from_env()
    on_gpu = bundle is not None and bundle.input_device.type != "cpu"
    default = policy.max_tokens if policy.hosted else DEFAULT_APP_MAX_TOKENS_GPU if on_gpu else DEFAULT_APP_MAX_TOKENS
    return min(env_int("CWVIZ_APP_MAX_TOKENS", default), max_tokens(bundle))


#: A step shows its bar only once it has run this long, and redraws it at most this often (seconds).
PROGRESS_AFTER_S = 0.5
PROGRESS_EVERY_S = 0.25


@contextlib.contextmanager
def progress_bar(label: str, unit: str = "layers") -> Iterator[Progress]:
    """A :data:`~cwviz.core.util.progress.Progress` callback that shows ``st.progress`` ("label: 12 of 30 layers").

    Steps that end within :data:`PROGRESS_AFTER_S` draw nothing; the bar is removed when the block ends
    (also when the step raises). Its placeholder (``st.empty``, which draws nothing) is made here, before the
    step: made from inside a recording forward pass (the callback runs in the attention function), Streamlit's
    objects would keep each layer's queries, keys and values alive until a garbage collection after the pass,
    so the pass's peak would grow by a layer's records a layer.
    """
    start = time.monotonic()
    shown: dict = {"bar": st.empty(), "drawn": False, "at": 0.0}

    def update(done: int, total: int) -> None:
        now = time.monotonic()
        if total <= 0 or now - start < PROGRESS_AFTER_S or (now - shown["at"] < PROGRESS_EVERY_S and done < total):
            return
        shown["bar"].progress(min(done / total, 1.0), text=f"{label}: {done} of {total} {unit}")
        shown["drawn"], shown["at"] = True, now

    try:
        yield update
    finally:
        if shown["drawn"]:
            shown["bar"].empty()


@contextlib.contextmanager
def item_bar(label: str, total: int, done: int = 0, unit: str = "item", per_item: int = 0) -> Iterator[Progress]:
    """A :data:`~cwviz.core.util.progress.Progress` callback for a run over ``total`` items (``done`` of them finished
    before), drawn at once: "label: item 3 of 5, about 4 min left" (:func:`cwviz.core.util.progress.items_left_text`,
    from the measured times of the items finished in this run). The callback gets this run's items done, as
    :func:`cwviz.analyses.sweep.run` reports them; or, with ``per_item``, the steps done of all ``total`` items
    (``per_item`` steps an item, finished items included), as :func:`cwviz.analyses.atlas.run` reports them. Removed
    when the block ends."""
    bar = st.empty()
    seconds: list[float] = []  # each finished item's time in this run
    shown = {"items": done, "at": time.monotonic(), "drawn": 0.0}

    def draw(value: float, items: int) -> None:
        bar.progress(min(value, 1.0), text=f"{label}: {items_left_text(items, total, seconds, unit)}")
        shown["drawn"] = time.monotonic()

    def update(count: int, count_total: int) -> None:
        items = count // per_item if per_item else done + count
        now = time.monotonic()
        if items > shown["items"]:
            finished = items - shown["items"]
            seconds.extend([(now - shown["at"]) / finished] * finished)
            shown["items"], shown["at"] = items, now
            draw(items / total, items)
        elif per_item and count_total and now - shown["drawn"] >= PROGRESS_EVERY_S:
            draw(count / count_total, items)

    draw(done / total if total else 0.0, done)
    try:
        yield update
    finally:
        bar.empty()


def get_bundle(model: str, device: str = "auto", dtype: str = "auto") -> Bundle:
    """The loaded model, shared by all sessions. Raises ModelLoadError with a message naming the fix.

    In hosting mode (:mod:`cwviz.app.hosting`) only allow-listed models load; trust_remote_code is never on.
    The cache is keyed by all three arguments as given, so they are always passed in full: ``get_bundle(m)``
    and ``get_bundle(m, "auto", "auto")`` share one model instead of loading it twice.
    """
    return _bundle(model, device, dtype)


#: The (model, device, dtype) this server process has loaded: the sidebar says "Loading…" on the page only
#: before a model's first load, not on every rerun.
_LOADED: set[tuple[str, str, str]] = set()


def bundle_loaded(model: str, device: str = "auto", dtype: str = "auto") -> bool:
    """Whether :func:`get_bundle` has already loaded this model in this server process."""
    return (model, device, dtype) in _LOADED


@st.cache_resource(show_spinner=False, max_entries=3)
def _bundle(model: str, device: str, dtype: str) -> Bundle:
    hosting.policy_from_env().check_model(model)
    bundle = load_model(model, device=device, dtype=dtype)
    _LOADED.add((model, device, dtype))
    return bundle


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


def pooled_prompts(bundle: Bundle, path: str | Path, n: int, limit: int) -> list[str]:
    """The first ``n`` prompts (at most ``limit``) of a JSONL file, for a page that pools prompts (Sinks, Atlas),
    each checked against the dashboard's length limit, so a long prompt is refused (its number said) before any
    forward pass. The caller checks a user's path against the hosting policy (the shipped sample needs none)."""
    texts = read_texts(Path(str(path).strip()), n=min(max(int(n), 1), limit))
    for number, text in enumerate(texts, start=1):
        try:
            check_dashboard_length(bundle, len(tokenize(bundle, text)), 0)
        except InputError as err:
            raise InputError(f"prompt {number}: {err}") from None
    return texts


@st.cache_resource(show_spinner=False, max_entries=6, ttl=3600)
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
    ids, text = prompt_ids, request.text
    if request.generate > 0:
        with progress_bar("Generating", "tokens") as progress:
            ids = greedy_continuation(bundle, prompt_ids, request.generate, progress=progress)
        # The text of the tokens analysed (prompt and continuation decoded together, as analyze checks it:
        # cwviz.core.loading.inputs.check_agree); decoding the continuation alone can drop its first space.
        text = bundle.tokenizer.decode(ids, skip_special_tokens=True)
    with progress_bar("Analysing the prompt") as progress:
        analysis = analyze(bundle, text, input_ids=ids, progress=progress, stream=keeps_stream(bundle, len(ids)))
    # the server lives on between prompts: what the pass freed goes back to the system (cwviz.core.util.heap)
    trim_heap()
    return Analyzed(analysis, len(prompt_ids))


def keeps_stream(bundle: Bundle, tokens: int) -> bool:
    """Whether the dashboard's analysis of ``tokens`` tokens keeps its residual stream (:data:`STREAM_BYTES`; never
    for a model whose block the flow does not know, a derived row)."""
    try:
        check_flow_supported(bundle)
    except UnsupportedModelError:
        return False
    return memory.stream_bytes(bundle.info, tokens) <= STREAM_BYTES


@st.cache_data(max_entries=64, show_spinner=False)
def heatmap_cells(
    request: Request, layer: int, head: int | None, measure: str, kind: str, query: int, view: str
) -> tables.HeatmapCells:
    """Tidy heatmap cells of one layer (see :func:`cwviz.analyses.tables.heatmap_cells`)."""
    analysis = get_analysis(request).analysis
    with progress_bar(f"Binning layer {layer}", "query rows") as progress:
        cells = tables.screen_cells(analysis.info.causal)
        return tables.heatmap_cells(
            analysis, layer, head, measure, kind, query, view, max_cells=cells, progress=progress
        )


@st.cache_data(max_entries=16, show_spinner=False)
def head_summary(request: Request) -> pd.DataFrame:
    """One row per (layer, head): sink shares and attention/contribution divergence."""
    analysis = get_analysis(request).analysis
    with progress_bar("Summarising every head") as progress:
        return tables.head_summary(analysis, progress=progress)


@st.cache_data(max_entries=64, show_spinner=False)
def token_factors(
    request: Request, layer: int, query: int, head: int | None, kind: str, also: int | None = None
) -> tables.TokenFactors:
    """The factors of each key's contribution to one query, the key ``also`` among them (see
    :func:`cwviz.analyses.tables.token_factors`)."""
    return tables.token_factors(get_analysis(request).analysis, layer, query, head, kind, also=also)


@st.cache_data(max_entries=16, show_spinner=False)
def subtracting_key(request: Request, layer: int, kind: str) -> tour.NegativeKey | None:
    """The most negative single head's ``kind`` contribution of ``layer`` (:func:`cwviz.analyses.tour.negative_key`):
    where the map of all heads summed shows no blue, the cell a page points to so that "blue subtracts" is seen."""
    return tour.negative_key(get_analysis(request).analysis, layer, None, kind)


@st.cache_data(max_entries=64, show_spinner=False)
def top_keys(request: Request, query: int, head: int | None, kind: str, k: int = 5) -> pd.DataFrame:
    """The query's top keys in every layer (see :func:`cwviz.analyses.tables.top_keys_across_layers`)."""
    analysis = get_analysis(request).analysis
    with progress_bar("Ranking keys in every layer") as progress:
        return tables.top_keys_across_layers(analysis, query, head, kind, k, progress=progress)


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
    """The CLI's JSON export (:func:`cwviz.core.method.export.to_dict`) as UTF-8 bytes."""
    analysis = get_analysis(request).analysis
    data = export.to_dict(analysis, layers=None if layers is None else list(layers))
    return json.dumps(data, ensure_ascii=False).encode("utf-8")
