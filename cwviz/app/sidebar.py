"""The sidebar every page shares: inputs (model, device, dtype, prompt, tokens to generate, Analyze) and
the selection (layer, head or all heads, query token). :func:`sidebar` runs the analysis through
:mod:`cwviz.app.services` and returns a frozen :class:`Selection`; the state behind it is :mod:`cwviz.app.state`.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field

import streamlit as st
from streamlit.delta_generator import DeltaGenerator

from ..core.loading.checkpoints import EMBEDDED, EMBEDDED_ENCODER, EMBEDDED_GEMMA, EMBEDDED_GEMMA_LICENCE, EMBEDDED_IDS
from ..core.method.analysis import Analysis
from ..core.util.errors import CwvizError, ModelLoadError
from . import hosting, services
from .state import (
    DEVICE_CHOICES,
    DTYPE_CHOICES,
    MAX_GENERATE,
    analyze_clicked,
    bound,
    clamp,
    clear_notes,
    current,
    examples,
    pick_example,
    presenter,
    presenter_toggle,
    show_toast,
    write_url,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Selection:
    """What the user asked for and the analysis it gave.

    ``head`` is None for all heads. ``analysis`` is None (and ``error`` says why) when the model or the
    prompt could not be analysed; layer, head and query are then the last requested values.
    ``prompt_tokens`` counts the prompt; later positions were generated greedily.
    """

    model: str
    device: str
    dtype: str
    text: str
    generate: int
    layer: int
    head: int | None
    query: int
    analysis: Analysis | None = None
    error: str | None = None
    prompt_tokens: int = 0
    notes: tuple[str, ...] = field(default=())

    @property
    def request(self) -> services.Request:
        return services.Request(self.model, self.device, self.dtype, self.text, self.generate)

    @property
    def ok(self) -> bool:
        return self.analysis is not None

    def token_label(self, position: int, markdown: bool = True) -> str:
        """``12 'fox'``: a position with its token, escaped for Markdown (``markdown=False``: as it is, for
        chart text, which Vega draws literally)."""
        if not self.ok:
            return str(position)
        label = f"{position} {self.analysis.tokens[position]!r}"
        return escape_markdown(label) if markdown else label


def escape_markdown(text: str) -> str:
    """Backslash-escape Markdown and HTML punctuation so user text shows literally in ``st.markdown``."""
    return re.sub(r"([\\`*_{}\[\]()#+\-.!|<>~$&])", r"\\\1", text)


def analyse(cur: dict) -> tuple[services.Analyzed | None, str | None]:
    request = services.Request(cur["model"], cur["device"], cur["dtype"], cur["text"], int(cur["generate"]))
    if cur["failed"] is not None and cur["failed"][0] == request:
        return None, cur["failed"][1]  # do not retry a failed load on every rerun; Analyze retries
    try:
        return services.get_analysis(request), None
    except ModelLoadError as err:
        error = f"The model {cur['model']!r} could not be loaded: {err}"
    except CwvizError as err:
        error = str(err)
    except Exception as err:  # a model transformers cannot run: show it instead of a traceback
        log.exception("analysis failed")
        error = f"Could not analyse with {cur['model']!r}: {type(err).__name__}: {err}"
    cur["failed"] = (request, error)
    return None, error


COMPACT_CSS = (
    '[data-testid="stMainBlockContainer"] {padding-top: 2rem;} '
    '[data-testid="stMainBlockContainer"] h1 {font-size: 2rem; padding-top: 0.25rem; padding-bottom: 0.5rem;}'
)
#: Presenter mode's text beside the charts: the main area's widget labels and captions (Streamlit's 14 px, where a
#: page's numbers are often stated) at 16 px, as the charts' labels are; the page's side margins trimmed to 1.5 rem
#: (Streamlit's 5 rem took 160 of a projector's 1,280 px; the heatmap pair side by side needs them,
#: :data:`cwviz.charts.heatmaps.PRESENTER_CONTENT_WIDTH`); and the header band made transparent.
PRESENTER_CSS = (
    '[data-testid="stMain"] [data-testid="stWidgetLabel"] p, [data-testid="stMain"] '
    '[data-testid="stCaptionContainer"], [data-testid="stMain"] [data-testid="stCaptionContainer"] p {font-size: '
    '1rem;} [data-testid="stMainBlockContainer"] {padding-left: 1.5rem; padding-right: 1.5rem; padding-top: 3.25rem;} '
    # Streamlit's header is a white band of 3.75 rem over the top of the page: scrolled to a map, it hid the map's
    # first rows. Transparent (its buttons stay, and take clicks), the window's whole height shows the page.
    '[data-testid="stHeader"] {background: transparent; pointer-events: none;} '
    '[data-testid="stHeader"] button, [data-testid="stHeader"] a {pointer-events: auto;}'
)


def model_label(name: str) -> str:
    """How the model picker shows a name: the embedded models with what they are."""
    return {
        EMBEDDED: f"{EMBEDDED} · SmolLM2",
        EMBEDDED_GEMMA: f"{EMBEDDED_GEMMA} · Gemma 3 (Gemma terms)",
        EMBEDDED_ENCODER: f"{EMBEDDED_ENCODER} · MiniLM",
    }.get(name, name)


def sidebar(title: str | None = None) -> Selection:
    """Draw the shared sidebar and return the current :class:`Selection` (call once, at the top of a page).

    ``title``, the page's, is drawn first in the main area, so that what the sidebar reports there (the analysis's
    progress, a note, an error such as an empty prompt) comes under it, not above it."""
    _page_frame(title)
    cur = current()
    with st.sidebar:
        picks = _input_widgets(cur)
    analyzed, error = _analysis_of_inputs(cur)
    if analyzed is not None:
        clamp(cur, analyzed.analysis)
        with picks:
            _selection_widgets(analyzed)
    for note in cur["notes"]:
        st.warning(note)
    if error:
        st.error(error)
    write_url(cur)
    return _selection_of(cur, analyzed, error)


def _page_frame(title: str | None) -> None:
    """The page's style, the sidebar's first state, a toast from the last run, and ``title``."""
    # The first screen is the product: Streamlit's 6 rem above the page and its 2.75 rem title would push the
    # Heatmaps page's maps below a 1280 x 720 window. Streamlit has no setting for either, so a style (sent
    # to the page's head, taking no room) trims them.
    st.html(f"<style>{COMPACT_CSS}{PRESENTER_CSS if presenter() else ''}</style>")
    # Presenter mode collapses the sidebar (its arrow opens it again): a projector's 1,280 px go to the maps. Streamlit
    # applies a changed initial state when the page config changes, so switching the mode on collapses it, off opens it.
    st.set_page_config(initial_sidebar_state="collapsed" if presenter() else "expanded")
    show_toast()
    if title is not None:
        st.title(title)


def _input_widgets(cur: dict) -> DeltaGenerator:
    """The sidebar's inputs (prompt, Analyze, example, model, device, dtype, tokens to generate); returns the empty
    container below Analyze where the selection goes once there is an analysis."""
    # The prompt comes first, with Analyze: a newcomer finds it on the first screen of a 1,280 x 720 window, below
    # the page list. The selection follows (layer, head, query), then the rest of the inputs.
    st.header("Input")
    bound(st.text_area, "draft_text", "Prompt", height=110)
    st.button("Analyze", type="primary", on_click=analyze_clicked, key="_cwviz_analyze", width="stretch")
    picks = st.container()
    st.header("Model and examples")
    names = [e.name for e in examples()]
    if cur["example"] not in names:
        cur["example"] = None
    bound(
        st.selectbox,
        "example",
        "Example prompt",
        options=names,
        index=None,
        placeholder="your own text",
        after=pick_example,
        help="Picking an example analyses it at once.",
    )
    _model_picker(cur)
    left, right = st.columns(2)
    with left:
        bound(st.selectbox, "draft_device", "Device", options=DEVICE_CHOICES)
    with right:
        bound(st.selectbox, "draft_dtype", "Dtype", options=DTYPE_CHOICES)
    bound(
        st.number_input,
        "draft_generate",
        "Tokens to generate",
        min_value=0,
        max_value=MAX_GENERATE,
        step=1,
        help="Greedily generate this many tokens after the prompt and analyse prompt plus continuation (causal "
        "language models only).",
    )
    return picks


def _model_picker(cur: dict) -> None:
    """The model: the server's models when hosted, else the embedded ones and any name the user types."""
    policy = hosting.policy_from_env()
    if policy.hosted:
        allowed = list(policy.allowed_models)
        if cur["draft_model"] not in allowed:
            cur["draft_model"] = allowed[0]
        bound(st.selectbox, "draft_model", "Model", options=allowed, help="the models this server offers")
        return
    # A picker of the embedded models that also takes a typed name (accept_new_options): a teacher finds
    # both offline models without knowing their names, a researcher types a hub id or a path.
    offered = list(EMBEDDED_IDS)
    if cur["draft_model"] and cur["draft_model"] not in offered:
        offered.append(cur["draft_model"])
    bound(
        st.selectbox,
        "draft_model",
        "Model",
        options=offered,
        accept_new_options=True,
        format_func=model_label,
        help=(
            "Three models ship with cwviz and work offline: embedded (SmolLM2-135M-Instruct, a causal language "
            "model), embedded-gemma (Gemma 3 270M, a causal language model with sliding-window layers; "
            f"{EMBEDDED_GEMMA_LICENCE}) and embedded-encoder (all-MiniLM-L6-v2, a BERT encoder). Or type a "
            "Hugging Face hub id, a local folder or a .gguf file, press Enter, then Analyze."
        ),
    )


def _analysis_of_inputs(cur: dict) -> tuple[services.Analyzed | None, str | None]:
    """The analysis of the last analysed inputs (:func:`analyse`), saying meanwhile that a model is loading and, when
    the inputs were edited since, that Analyze shows them."""
    edited = any(cur[f"draft_{name}"] != cur[name] for name in ("model", "device", "dtype", "text", "generate"))
    if edited:
        st.info(
            "The inputs were edited: press **Analyze** to show them; the maps below are of the last analysed input."
        )
    waiting = st.empty()
    if not services.bundle_loaded(cur["model"], cur["device"], cur["dtype"]):
        waiting.info(
            f"Loading {model_label(cur['model'])}… A model is loaded once per server; the embedded models are "
            "converted once on a machine's first use (15 to 30 s), later starts take seconds."
        )
    analyzed, error = analyse(cur)
    waiting.empty()
    return analyzed, error


def _selection_widgets(analyzed: services.Analyzed) -> None:
    """The selection in an analysis: layer, head (or all heads), query token; presenter mode; what was analysed."""
    analysis = analyzed.analysis
    st.header("Selection")
    bound(st.slider, "layer", "Layer", min_value=0, max_value=analysis.num_layers - 1, after=clear_notes)
    bound(
        st.selectbox,
        "head",
        "Head",
        options=["all", *range(analysis.num_heads)],
        format_func=lambda h: "all heads" if h == "all" else f"head {h}",
        after=clear_notes,
        to_widget=lambda h: "all" if h is None else h,
        from_widget=lambda h: None if h == "all" else int(h),
    )
    tokens, prompt_tokens = analysis.tokens, analyzed.prompt_tokens
    bound(
        st.selectbox,
        "query",
        "Query token",
        options=list(range(analysis.num_tokens)),
        format_func=lambda i: f"{i}: {tokens[i]}" + (" (generated)" if i >= prompt_tokens else ""),
        after=clear_notes,
        help="The token whose attention row is examined. Type its position or part of its text to find it.",
    )
    presenter_toggle()
    info = analysis.info
    generated = analysis.num_tokens - prompt_tokens
    st.caption(
        f"{info.id} · {info.layers} layers × {info.heads} heads ({info.kv_heads} kv) · {info.device} {info.dtype} · "
        f"{analysis.num_tokens} tokens" + (f" ({generated} generated)" if generated else "")
    )


def _selection_of(cur: dict, analyzed: services.Analyzed | None, error: str | None) -> Selection:
    """The :class:`Selection` the page gets: the inputs analysed, the selection in them, and the analysis or why there
    is none."""
    layer = cur["layer"] if cur["layer"] is not None else 0
    query = cur["query"] if cur["query"] is not None else 0
    return Selection(
        model=cur["model"],
        device=cur["device"],
        dtype=cur["dtype"],
        text=cur["text"],
        generate=int(cur["generate"]),
        layer=int(layer),
        head=cur["head"],
        query=int(query),
        analysis=analyzed.analysis if analyzed is not None else None,
        error=error,
        prompt_tokens=analyzed.prompt_tokens if analyzed is not None else 0,
        notes=tuple(cur["notes"]),
    )
