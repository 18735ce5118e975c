"""The sidebar every page shares, and small widgets pages reuse (chart + downloads).

:func:`sidebar` draws the inputs (model, device, dtype, prompt, tokens to generate, Analyze) and the
selection (layer, head or all heads, query token), runs the analysis through :mod:`cwviz.app.services`
and returns a frozen :class:`Selection`.

State: the committed inputs and the selection live in one dict in ``st.session_state`` (so they
survive page switches) and are mirrored to the URL (``st.query_params``), so a link reproduces the
view. A fresh session reads the URL once; malformed values (``layer=999``, ``head=-1``,
``token=abc``) are clamped and explained in a warning.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import streamlit as st

from ..core.analysis import Analysis
from ..core.errors import CwvizError, ModelLoadError
from . import hosting, services

log = logging.getLogger(__name__)

EXAMPLES = Path(__file__).resolve().parent / "examples.json"
DEVICE_CHOICES = ("auto", "cpu", "cuda", "mps")
DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")
MAX_GENERATE = 64
_STATE = "_cwviz_state"
_URL_KEYS = ("model", "device", "dtype", "gen", "layer", "head", "token", "prompt")

INTRO = (
    "**Contribution weights** measure how much each earlier token *k* (key) adds to what an attention "
    "layer writes for token *q* (query). Attention weights only say how strongly a key is selected; a "
    "contribution weight also accounts for the size of the key's projected value vector and for its "
    "direction relative to the layer's output: contribution = attention × (‖ṽ_k‖ / ‖o_q‖) × cos(o_q, ṽ_k). "
    "Each row sums to 1, but single contributions can be **negative**, when a value points against the "
    "output (destructive interference). Read each heatmap row by row: the row is the query token, the "
    "columns are the keys it can see. Attention uses a sequential scale (darker = more attention); "
    "contributions use a diverging scale centred at zero: **red is positive, blue is negative, white is "
    "zero**, and the empty upper triangle is the future, which a causal model cannot see."
)


@dataclass(frozen=True)
class Example:
    name: str
    text: str


def examples() -> tuple[Example, ...]:
    """Example prompts shipped in ``cwviz/app/examples.json`` (our own texts; package data)."""
    data = json.loads(EXAMPLES.read_text(encoding="utf-8"))
    return tuple(Example(item["name"], item["text"]) for item in data)


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

    def token_label(self, position: int) -> str:
        """``12 'fox'``: a position with its token, escaped for Markdown."""
        return escape_markdown(f"{position} {self.analysis.tokens[position]!r}") if self.ok else str(position)


def escape_markdown(text: str) -> str:
    """Backslash-escape Markdown and HTML punctuation so user text shows literally in ``st.markdown``."""
    return re.sub(r"([\\`*_{}\[\]()#+\-.!|<>~$&])", r"\\\1", text)


# -- state ------------------------------------------------------------------------------------------


def _defaults() -> dict:
    text = examples()[0].text
    return {
        "model": "embedded",
        "device": "auto",
        "dtype": "auto",
        "text": text,
        "generate": 0,
        "draft_model": "embedded",
        "draft_device": "auto",
        "draft_dtype": "auto",
        "draft_text": text,
        "draft_generate": 0,
        "example": examples()[0].name,
        "layer": None,
        "head": None,
        "query": None,
        "notes": [],
        "failed": None,
        "from_url": {},
    }


def _parse_url(params: dict[str, str], cur: dict) -> None:
    """Fill ``cur`` from the URL's query parameters, noting every value that cannot be used as given."""
    notes = cur["notes"]
    if "model" in params and params["model"].strip():
        cur["model"] = params["model"].strip()
    for name, allowed in (("device", DEVICE_CHOICES), ("dtype", DTYPE_CHOICES)):
        if name in params:
            if params[name] in allowed:
                cur[name] = params[name]
            else:
                notes.append(f"{name}={params[name]!r} in the link is not one of {', '.join(allowed)}; using auto")
    if "prompt" in params:
        cur["text"] = params["prompt"]
    if "gen" in params:
        value = _int(params["gen"])
        if value is None or not 0 <= value <= MAX_GENERATE:
            notes.append(f"gen={params['gen']!r} in the link is not a number of tokens in 0..{MAX_GENERATE}; generating none")
        else:
            cur["generate"] = value
    for name in ("layer", "token"):
        if name in params:
            value = _int(params[name])
            if value is None:
                what = "the last token" if name == "token" else "the default layer"
                notes.append(f"{name}={params[name]!r} in the link is not a number; showing {what}")
            else:
                cur["query" if name == "token" else name] = value
                cur["from_url"][name] = value
    if "head" in params:
        raw = params["head"]
        value = _int(raw)
        if raw.strip().lower() == "all":
            cur["head"] = None
        elif value is None:
            notes.append(f"head={raw!r} in the link is not a number or 'all'; showing all heads")
        else:
            cur["head"] = value
            cur["from_url"]["head"] = value
    for name in ("model", "device", "dtype", "text", "generate"):
        cur[f"draft_{name}"] = cur[name]
    cur["example"] = next((e.name for e in examples() if e.text == cur["text"]), None)


def _int(raw: str) -> int | None:
    try:
        return int(str(raw).strip())
    except ValueError:
        return None


def _state() -> dict:
    if _STATE not in st.session_state:
        cur = _defaults()
        _parse_url({k: st.query_params.get(k) for k in _URL_KEYS if k in st.query_params}, cur)
        st.session_state[_STATE] = cur
    return st.session_state[_STATE]


def _commit() -> None:
    """The Analyze button: the drafts become the analysed inputs; the query returns to the last token."""
    cur = _state()
    for name in ("model", "device", "dtype", "text", "generate"):
        cur[name] = cur[f"draft_{name}"]
    cur["model"] = (cur["model"] or "").strip()
    cur["query"] = None
    cur["example"] = next((e.name for e in examples() if e.text == cur["text"]), None)
    cur["notes"] = []
    cur["failed"] = None
    cur["from_url"] = {}


def _pick_example() -> None:
    cur = _state()
    chosen = next((e for e in examples() if e.name == cur["example"]), None)
    if chosen is not None:
        cur["draft_text"] = chosen.text
        _commit()


def _bound(
    widget: Callable,
    name: str,
    label: str,
    after: Callable[[], None] | None = None,
    to_widget: Callable[[Any], Any] = lambda v: v,
    from_widget: Callable[[Any], Any] = lambda v: v,
    **kwargs,
):
    """A widget whose value lives in the state dict (so it survives page switches and programmatic changes)."""
    cur = _state()
    key = f"_cwviz_w_{name}"
    st.session_state[key] = to_widget(cur[name])

    def sync() -> None:
        cur[name] = from_widget(st.session_state[key])
        if after is not None:
            after()

    return widget(label, key=key, on_change=sync, **kwargs)


def _clear_notes() -> None:
    _state()["notes"] = []
    _state()["from_url"] = {}


def select(layer: int | None = None, head: int | None | str = "keep", query: int | None = None) -> None:
    """Change the selection from a page (e.g. a head picked in a chart) and rerun."""
    cur = _state()
    if layer is not None:
        cur["layer"] = int(layer)
    if head != "keep":
        cur["head"] = None if head is None else int(head)
    if query is not None:
        cur["query"] = int(query)
    _clear_notes()
    st.rerun()


def _clamp(cur: dict, analysis) -> None:
    """Bring layer, head and query into range, explaining values that came from the link."""
    notes, from_url = cur["notes"], cur["from_url"]
    last_layer, last_head, last_token = analysis.num_layers - 1, analysis.num_heads - 1, analysis.num_tokens - 1
    if cur["layer"] is None:
        cur["layer"] = last_layer // 2
    elif not 0 <= cur["layer"] <= last_layer:
        clamped = min(max(cur["layer"], 0), last_layer)
        if "layer" in from_url:
            notes.append(
                f"layer={from_url.pop('layer')} in the link is out of range (this model has layers 0..{last_layer}); showing layer {clamped}"
            )
        cur["layer"] = clamped
    if cur["head"] is not None and not 0 <= cur["head"] <= last_head:
        if "head" in from_url:
            notes.append(f"head={from_url.pop('head')} in the link is not a head of this model (0..{last_head}); showing all heads")
        cur["head"] = None
    if cur["query"] is None:
        cur["query"] = last_token
    elif not 0 <= cur["query"] <= last_token:
        if "token" in from_url:
            notes.append(
                f"token={from_url.pop('token')} in the link is out of range (the input has tokens 0..{last_token}); showing the last token"
            )
        cur["query"] = last_token


def _write_url(cur: dict) -> None:
    wanted = {
        "model": cur["model"],
        "device": cur["device"],
        "dtype": cur["dtype"],
        "gen": str(cur["generate"]),
        "layer": "" if cur["layer"] is None else str(cur["layer"]),
        "head": "all" if cur["head"] is None else str(cur["head"]),
        "token": "" if cur["query"] is None else str(cur["query"]),
        "prompt": cur["text"],
    }
    wanted = {k: v for k, v in wanted.items() if v != ""}
    if {k: st.query_params.get(k) for k in st.query_params} != wanted:
        st.query_params.from_dict(wanted)


def _analyse(cur: dict) -> tuple[services.Analyzed | None, str | None]:
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


# -- the sidebar --------------------------------------------------------------------------------------


def sidebar() -> Selection:
    """Draw the shared sidebar and return the current :class:`Selection` (call once, at the top of a page)."""
    cur = _state()
    names = [e.name for e in examples()]
    with st.sidebar:
        st.header("Input")
        if cur["example"] not in names:
            cur["example"] = None
        _bound(
            st.selectbox,
            "example",
            "Example prompt",
            options=names,
            index=None,
            placeholder="your own text",
            after=_pick_example,
            help="Picking an example analyses it at once.",
        )
        policy = hosting.policy_from_env()
        if policy.hosted:
            allowed = list(policy.allowed_models)
            if cur["draft_model"] not in allowed:
                cur["draft_model"] = allowed[0]
            _bound(st.selectbox, "draft_model", "Model", options=allowed, help="the models this server offers")
        else:
            _bound(
                st.text_input,
                "draft_model",
                "Model",
                help="embedded (ships with cwviz, works offline), a Hugging Face hub id, or a local folder / .gguf file",
            )
        left, right = st.columns(2)
        with left:
            _bound(st.selectbox, "draft_device", "Device", options=DEVICE_CHOICES)
        with right:
            _bound(st.selectbox, "draft_dtype", "Dtype", options=DTYPE_CHOICES)
        _bound(st.text_area, "draft_text", "Prompt", height=140)
        _bound(
            st.number_input,
            "draft_generate",
            "Tokens to generate",
            min_value=0,
            max_value=MAX_GENERATE,
            step=1,
            help="Greedily generate this many tokens after the prompt and analyse prompt plus continuation.",
        )
        st.button("Analyze", type="primary", on_click=_commit, key="_cwviz_analyze", width="stretch")

    analyzed, error = _analyse(cur)
    analysis = analyzed.analysis if analyzed is not None else None
    if analysis is not None:
        _clamp(cur, analysis)
        with st.sidebar:
            st.header("Selection")
            _bound(st.slider, "layer", "Layer", min_value=0, max_value=analysis.num_layers - 1, after=_clear_notes)
            _bound(
                st.selectbox,
                "head",
                "Head",
                options=["all", *range(analysis.num_heads)],
                format_func=lambda h: "all heads" if h == "all" else f"head {h}",
                after=_clear_notes,
                to_widget=lambda h: "all" if h is None else h,
                from_widget=lambda h: None if h == "all" else int(h),
            )
            tokens, prompt_tokens = analysis.tokens, analyzed.prompt_tokens
            _bound(
                st.selectbox,
                "query",
                "Query token",
                options=list(range(analysis.num_tokens)),
                format_func=lambda i: f"{i}: {tokens[i]}" + (" (generated)" if i >= prompt_tokens else ""),
                after=_clear_notes,
                help="The token whose attention row is examined (position: token).",
            )
            info = analysis.info
            generated = analysis.num_tokens - analyzed.prompt_tokens
            st.caption(
                f"{info.id} · {info.layers} layers × {info.heads} heads ({info.kv_heads} kv) · {info.device} {info.dtype} · "
                f"{analysis.num_tokens} tokens" + (f" ({generated} generated)" if generated else "")
            )
    for note in cur["notes"]:
        st.warning(note)
    if error:
        st.error(error)
    _write_url(cur)
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
        analysis=analysis,
        error=error,
        prompt_tokens=analyzed.prompt_tokens if analyzed is not None else 0,
        notes=tuple(cur["notes"]),
    )


# -- shared page pieces -------------------------------------------------------------------------------


def chart(chart_obj, data, name: str, key: str, on_select: str | None = None, selection_mode=None):
    """Show an Altair chart with PNG, SVG and CSV downloads (rendered only when clicked).

    Returns the selection state when ``on_select`` is given.
    """
    from ..charts.export import to_csv, to_png, to_svg

    kwargs = {} if on_select is None else {"on_select": on_select, "selection_mode": selection_mode}
    event = st.altair_chart(chart_obj, key=key, **kwargs)
    cols = st.columns([1, 1, 1, 5])
    cols[0].download_button(
        "PNG", data=lambda: to_png(chart_obj), file_name=f"{name}.png", mime="image/png", key=f"{key}_png", on_click="ignore"
    )
    cols[1].download_button(
        "SVG", data=lambda: to_svg(chart_obj), file_name=f"{name}.svg", mime="image/svg+xml", key=f"{key}_svg", on_click="ignore"
    )
    cols[2].download_button("CSV", data=lambda: to_csv(data), file_name=f"{name}.csv", mime="text/csv", key=f"{key}_csv", on_click="ignore")
    return event


def head_grid(chart_obj, data, name: str, key: str) -> None:
    """Show a layer x head grid (:func:`chart`) whose clicked cell selects that layer and head.

    Streamlit keeps returning the last pick on later reruns, so a pick is acted on once: when it differs
    from the one remembered under this chart's key.
    """
    from ..charts.heatmaps import PICK

    event = chart(chart_obj, data, name, key, on_select="rerun", selection_mode=PICK)
    picked = (event.selection.get(PICK) or [None])[0] if event is not None else None
    if picked and picked != st.session_state.get(f"_{key}_last_pick"):
        st.session_state[f"_{key}_last_pick"] = picked
        select(layer=picked["layer"], head=picked["head"])


def analysis_download(sel: Selection, key: str = "json") -> None:
    """Download the whole analysis as JSON (the CLI's schema); the selected layer only when it would be huge."""
    if not sel.ok:
        return
    request = sel.request
    if services.json_export_size(sel.analysis) <= services.JSON_EXPORT_LIMIT:
        layers, label, name = None, "Analysis as JSON (all layers)", "cwviz-analysis.json"
    else:
        layers, label, name = (
            (sel.layer,),
            f"Analysis as JSON (layer {sel.layer}; all layers would be too large)",
            f"cwviz-analysis-layer{sel.layer}.json",
        )
    st.download_button(
        label,
        data=lambda: services.analysis_json(request, layers),
        file_name=name,
        mime="application/json",
        key=key,
        on_click="ignore",
        help="The same schema as `python -m cwviz analyze --json` (Analysis.to_dict).",
    )
