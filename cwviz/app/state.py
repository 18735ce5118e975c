"""Session and URL state of the dashboard: one dict in ``st.session_state`` and the link that mirrors it.

The committed inputs (model, device, dtype, prompt, tokens to generate) and the selection (layer, head
or all heads, query) live in one dict (:func:`current`), so they survive page switches, and are mirrored
to the URL (``st.query_params``), so a link reproduces the view. Every other picker of every page is a
:func:`url_widget`: its value lives in session state and in the URL under its own parameter. A fresh
session reads the URL once; malformed values (``layer=999``, ``head=-1``, ``token=abc``, ``measure=x``)
are clamped or replaced by the default and explained in a warning.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import streamlit as st

EXAMPLES = Path(__file__).resolve().parent / "examples.json"
DEVICE_CHOICES = ("auto", "cpu", "cuda", "mps")
DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")
MAX_GENERATE = 64
_STATE = "_cwviz_state"
URL_KEYS = ("model", "device", "dtype", "gen", "layer", "head", "token", "prompt")


@dataclass(frozen=True)
class Example:
    name: str
    text: str


@functools.cache
def examples() -> tuple[Example, ...]:
    """Example prompts shipped in ``cwviz/app/examples.json`` (our own texts; package data)."""
    data = json.loads(EXAMPLES.read_text(encoding="utf-8"))
    return tuple(Example(item["name"], item["text"]) for item in data)


def defaults() -> dict:
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


def parse_url(params: dict[str, str], cur: dict) -> None:
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
        value = parse_int(params["gen"])
        if value is None or not 0 <= value <= MAX_GENERATE:
            notes.append(f"gen={params['gen']!r} in the link is not a number of tokens in 0..{MAX_GENERATE}; generating none")
        else:
            cur["generate"] = value
    for name in ("layer", "token"):
        if name in params:
            value = parse_int(params[name])
            if value is None:
                what = "the last token" if name == "token" else "the default layer"
                notes.append(f"{name}={params[name]!r} in the link is not a number; showing {what}")
            else:
                cur["query" if name == "token" else name] = value
                cur["from_url"][name] = value
    if "head" in params:
        raw = params["head"]
        value = parse_int(raw)
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


def parse_int(raw: str) -> int | None:
    try:
        return int(str(raw).strip())
    except ValueError:
        return None


def current() -> dict:
    if _STATE not in st.session_state:
        cur = defaults()
        parse_url({k: st.query_params.get(k) for k in URL_KEYS if k in st.query_params}, cur)
        st.session_state[_STATE] = cur
    return st.session_state[_STATE]


def commit() -> None:
    """The Analyze button: the drafts become the analysed inputs; the query returns to the last token."""
    cur = current()
    for name in ("model", "device", "dtype", "text", "generate"):
        cur[name] = cur[f"draft_{name}"]
    cur["model"] = (cur["model"] or "").strip()
    cur["query"] = None
    cur["example"] = next((e.name for e in examples() if e.text == cur["text"]), None)
    cur["notes"] = []
    cur["failed"] = None
    cur["from_url"] = {}


def pick_example() -> None:
    cur = current()
    chosen = next((e for e in examples() if e.name == cur["example"]), None)
    if chosen is not None:
        cur["draft_text"] = chosen.text
        commit()


def bound(
    widget: Callable,
    name: str,
    label: str,
    after: Callable[[], None] | None = None,
    to_widget: Callable[[Any], Any] = lambda v: v,
    from_widget: Callable[[Any], Any] = lambda v: v,
    **kwargs,
):
    """A widget whose value lives in the state dict (so it survives page switches and programmatic changes)."""
    cur = current()
    key = f"_cwviz_w_{name}"
    st.session_state[key] = to_widget(cur[name])

    def sync() -> None:
        cur[name] = from_widget(st.session_state[key])
        if after is not None:
            after()

    return widget(label, key=key, on_change=sync, **kwargs)


def clear_notes() -> None:
    current()["notes"] = []
    current()["from_url"] = {}


def select(layer: int | None = None, head: int | None | str = "keep", query: int | None = None) -> None:
    """Change the selection from a page (e.g. a head picked in a chart) and rerun."""
    cur = current()
    if layer is not None:
        cur["layer"] = int(layer)
    if head != "keep":
        cur["head"] = None if head is None else int(head)
    if query is not None:
        cur["query"] = int(query)
    clear_notes()
    st.rerun()


def clamp(cur: dict, analysis) -> None:
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


def write_url(cur: dict) -> None:
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
    for name, value in wanted.items():  # only the sidebar's keys: the pages' pickers keep theirs (url_widget)
        if value == "":
            if name in st.query_params:
                del st.query_params[name]
        elif st.query_params.get(name) != value:
            st.query_params[name] = value


# -- page pickers in the URL ------------------------------------------------------------------------------
#: Keyword arguments that set a widget's initial value; url_widget sets it through session state instead.
_VALUE_KWARGS = ("value", "index", "default")


def url_widget(
    widget: Callable,
    param: str,
    label: str,
    default: Any,
    *,
    key: str | None = None,
    parse: Callable[[str], Any] = str,
    show: Callable[[Any], str] = str,
    valid: Callable[[Any], bool] | None = None,
    **kwargs,
) -> Any:
    """A page widget whose value is also ``?param=`` in the link, so a link restores every picker.

    The value lives in ``st.session_state[key]`` (default ``_cwviz_p_<param>``). When the widget has no
    value yet in this session (a fresh session, or back on its page), it is read from the URL with
    ``parse``; a value that does not parse, is not among ``options`` or fails ``valid`` gives a warning and
    ``default``. After the widget is drawn its value is written back with ``show``. Lists (multiselect)
    travel as comma-separated items.

    Why not Streamlit's ``bind="query-params"`` (1.67): it names the parameter after the widget's key and, for a
    picker with ``format_func``, writes the shown label to the URL (``kind=Share of each head's output (intra)``
    where links made so far say ``kind=intra``), and it drops a malformed value without the warning this gives. A
    picker without those needs (the Tour's ``step``) is bound with ``bind``.
    """
    key = key or f"_cwviz_p_{param}"
    options = kwargs.get("options")
    for name in _VALUE_KWARGS:
        kwargs.pop(name, None)
    multi = isinstance(default, (list, tuple))
    if key not in st.session_state:
        value, raw = default, st.query_params.get(param)
        if raw is not None:
            try:
                value = [parse(item) for item in raw.split(",") if item != ""] if multi else parse(raw)
                items = value if multi else [value]
                ok = all(item in options for item in items) if options is not None else True
                ok = ok and (valid is None or valid(value))
            except (TypeError, ValueError):
                ok = False
            if not ok:
                st.warning(f"{param}={raw!r} in the link is not a valid choice for “{label}”; showing the default")
                value = default
        st.session_state[key] = list(value) if multi else value
    value = widget(label, key=key, **kwargs)
    shown = ",".join(show(item) for item in value) if multi else show(value)
    if st.query_params.get(param) != shown:
        st.query_params[param] = shown
    return value


def parse_bool(raw: str) -> bool:
    """``true``/``false`` (also 1/0, yes/no) from a link."""
    text = raw.strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise ValueError(raw)


def show_bool(value: bool) -> str:
    return "true" if value else "false"


#: The presenter-mode toggle's URL parameter and widget key: larger labels for a room (``?presenter=true``).
PRESENTER = "presenter"


def presenter_toggle() -> bool:
    """Presenter mode: every chart's labels at :data:`cwviz.charts.heatmaps.PRESENTER_LABEL_PX` and the maps
    fitted to a 1280 x 720 projector. Kept in the link, and across pages."""
    return url_widget(
        st.toggle,
        PRESENTER,
        "Presenter mode (large labels)",
        False,
        parse=parse_bool,
        show=show_bool,
        key=PRESENTER,
        help="Labels of at least 16 px for a projector; the heatmaps stay within a 1280 x 720 screen.",
    )


def presenter() -> bool:
    """Whether presenter mode is on in this session (False before the sidebar has drawn its toggle)."""
    if PRESENTER in st.session_state:
        return bool(st.session_state[PRESENTER])
    try:
        return parse_bool(st.query_params.get(PRESENTER, "false"))
    except ValueError:
        return False


#: A message for the next run of the page (:func:`show_toast`), left before a selection reruns it.
_TOAST = "_cwviz_toast"


def toast_next_run(message: str) -> None:
    """Say ``message`` in a toast on the next run (a toast shown just before ``st.rerun`` would be dropped)."""
    st.session_state[_TOAST] = message


def show_toast() -> None:
    """Show, once, the message left for this run by :func:`toast_next_run`."""
    message = st.session_state.pop(_TOAST, None)
    if message:
        st.toast(message)
