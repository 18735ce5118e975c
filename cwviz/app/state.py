"""Session and URL state of the dashboard: one dict in ``st.session_state`` and the link that mirrors it.

The committed inputs (model, device, dtype, prompt, tokens to generate) and the selection (layer, head
or all heads, query) live in one dict (:func:`current`), so they survive page switches, and are mirrored
to the URL (``st.query_params``) by :func:`write_url`, so a link reproduces the view: not through ``bind``, because
the URL names what was analysed (the prompt the Analyze button committed, the selection clamped to the model), not
what a widget holds while it is edited. Every other picker of every page is a :func:`url_widget`, bound to the URL
by Streamlit (``bind="query-params"``) under its own parameter. A fresh session reads the URL once; malformed
values (``layer=999``, ``head=-1``, ``token=abc``, ``measure=x``) are clamped or replaced by the default and
explained in a warning.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import streamlit as st

from ..core.defaults import DEVICE, DTYPE, MODEL
from ..core.vocabulary import KINDS
from . import prompt_store

EXAMPLES = Path(__file__).resolve().parent / "examples.json"
DEVICE_CHOICES = ("auto", "cpu", "cuda", "mps")
DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")
MAX_GENERATE = 64
_STATE = "_cwviz_state"
URL_KEYS = ("model", "device", "dtype", "gen", "layer", "head", "token", "prompt")
#: The parameter that names a long prompt kept on the server instead of the prompt itself
#: (:mod:`cwviz.app.prompt_store`).
PROMPT_SHA = "prompt_sha"


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
        "model": MODEL,
        "device": DEVICE,
        "dtype": DTYPE,
        "text": text,
        "generate": 0,
        "draft_model": MODEL,
        "draft_device": DEVICE,
        "draft_dtype": DTYPE,
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
    elif PROMPT_SHA in params:
        kept = prompt_store.find(params[PROMPT_SHA])
        if kept is None:
            notes.append(
                f"{PROMPT_SHA}={params[PROMPT_SHA][:12]}… in the link names a long prompt this server does not have "
                "(it keeps the long prompts of its links for a while, on the server that made them); showing the "
                "example prompt instead: paste the prompt into the sidebar"
            )
        else:
            cur["text"] = kept
    if "gen" in params:
        value = parse_int(params["gen"])
        if value is None or not 0 <= value <= MAX_GENERATE:
            notes.append(
                f"gen={params['gen']!r} in the link is not a number of tokens in 0..{MAX_GENERATE}; generating none"
            )
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
        parse_url({k: st.query_params.get(k) for k in (*URL_KEYS, PROMPT_SHA) if k in st.query_params}, cur)
        st.session_state[_STATE] = cur
    return st.session_state[_STATE]


def analyze_clicked() -> None:
    """The Analyze button's callback: each draft read from its widget (:func:`bound`'s key), whose value Streamlit has
    set before any callback of the run (the button stands above some inputs in the sidebar, and its callback may run
    before theirs), then :func:`commit`."""
    cur = current()
    for name in ("model", "device", "dtype", "text", "generate"):
        key = f"_cwviz_w_draft_{name}"
        if key in st.session_state:
            cur[f"draft_{name}"] = st.session_state[key]
    commit()


def commit() -> None:
    """The drafts become the analysed inputs (Analyze, or an example picked); the query returns to the last token."""
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
                f"layer={from_url.pop('layer')} in the link is out of range (this model has layers 0..{last_layer}); "
                f"showing layer {clamped}"
            )
        cur["layer"] = clamped
    if cur["head"] is not None and not 0 <= cur["head"] <= last_head:
        if "head" in from_url:
            notes.append(
                f"head={from_url.pop('head')} in the link is not a head of this model (0..{last_head}); "
                "showing all heads"
            )
        cur["head"] = None
    if cur["query"] is None:
        cur["query"] = last_token
    elif not 0 <= cur["query"] <= last_token:
        if "token" in from_url:
            notes.append(
                f"token={from_url.pop('token')} in the link is out of range (the input has tokens 0..{last_token}); "
                "showing the last token"
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
        "prompt": "",
        PROMPT_SHA: "",
    } | prompt_store.link_params(cur["text"])  # a long prompt by its hash: links stay under 8 kB
    for name, value in wanted.items():  # only the sidebar's keys: the pages' pickers keep theirs (url_widget)
        if value == "":
            if name in st.query_params:
                del st.query_params[name]
        elif st.query_params.get(name) != value:
            st.query_params[name] = value


# -- page pickers in the URL ------------------------------------------------------------------------------
#: Values a link gave in the form links had before the pickers were bound (``kind=intra``, ``rates=10,50``,
#: ``per_head=yes``), {widget key: value}: set again on the widget's next run, when Streamlit writes a value set
#: through session state to the URL (on a session's first run it does not).
_FROM_OLD_LINKS = "_cwviz_old_link_values"
#: :func:`_from_link`'s answer when the URL's value is already in Streamlit's form (or is dropped by it).
_STREAMLIT = object()


def url_widget(
    widget: Callable,
    param: str,
    label: str,
    default: Any,
    *,
    parse: Callable[[str], Any] = str,
    valid: Callable[[Any], bool] | None = None,
    formerly: tuple[str, ...] = (),
    **kwargs,
) -> Any:
    """A page picker kept in the link as ``?param=``: Streamlit's ``bind="query-params"``, with ``param`` as the
    widget's key (what ``bind`` names the parameter after). ``formerly``: the names the parameter had before it was
    renamed (docs/METHOD.md, "Glossary"); a link that uses one opens as if it used ``param``
    (:func:`renamed_in_link`).

    Streamlit seeds the widget from a fresh session's URL, writes every change back (a value equal to
    ``default`` leaves the URL) and keeps the value across page switches. It writes a picker's shown label
    (``kind=Share of each head's output (intra)``) and a list as repeated parameters. Two things are added here,
    for a widget not yet drawn in this session whose parameter is in the URL:

    * A value in the form links had before (the option itself, ``kind=intra``; a comma-separated list,
      ``rates=10,50``; ``yes``/``no``/``1``/``0``), read with ``parse``, is set through session state: links made
      before keep working. Streamlit drops it from the URL on this first run, and writes it in its own form on
      the next run of the page (any click), when it is set again unless the user changed it.
    * A value that is neither (``measure=x``, ``n=-3``, one that fails ``valid``) gives a warning; Streamlit drops it
      and the widget shows ``default``.
    """
    options = kwargs.get("options")
    multi = isinstance(default, (list, tuple))
    if options is None:
        kwargs["value"] = default
    elif multi:
        kwargs["default"] = list(default)
    else:
        kwargs["index"] = list(options).index(default)
    moved = renamed_in_link(param, formerly)
    old = st.session_state.setdefault(_FROM_OLD_LINKS, {})
    if param in old:  # the next run: set again (unless changed), which Streamlit now writes to the URL
        value = old.pop(param)
        if st.session_state.get(param) == value:
            st.session_state[param] = value
    elif param not in st.session_state and param in st.query_params:
        value = _from_link(widget, param, label, options, multi, parse, valid, kwargs.get("format_func", str), moved)
        if value is not _STREAMLIT:
            st.session_state[param] = value
            old[param] = value
    return widget(label, key=param, bind="query-params", **kwargs)


def renamed_in_link(param: str, formerly: tuple[str, ...]) -> bool:
    """The one way a renamed URL parameter keeps old links working: an old name's values move to ``param`` (unless
    the link has ``param`` itself), and the old name leaves the URL, so the view's link shows only the new one.
    Whether a value moved: Streamlit seeds a bound widget from the URL the session opened with, so a moved value is
    set through session state as an old-form value is (:func:`url_widget`)."""
    moved = False
    for old_name in formerly:
        if old_name not in st.query_params:
            continue
        if param not in st.query_params:
            st.query_params[param] = st.query_params.get_all(old_name)
            moved = True
        del st.query_params[old_name]
    return moved


def _from_link(widget, param, label, options, multi, parse, valid, format_func, moved: bool = False) -> Any:
    """The value an old-form link gives ``param``, or :data:`_STREAMLIT` where Streamlit reads the URL itself (a
    value in its form, or a malformed one, which is dropped after a warning here). ``moved``: the value came under a
    renamed parameter's old name, which Streamlit never reads, so it is returned even in Streamlit's form."""
    raw = st.query_params.get_all(param)
    items = [item for item in raw if item != ""]
    try:
        if options is not None:
            shown = {str(format_func(option)): option for option in options}
            if items and all(item in shown for item in items):  # Streamlit's form
                new = [shown[item] for item in items]
                value, streamlit = (new if multi else new[-1]), True
            else:
                old = (
                    [parse(part) for item in items for part in item.split(",") if part != ""]
                    if multi
                    else parse(raw[-1])
                )
                if not all(item in options for item in (old if multi else [old])):
                    raise ValueError(raw)
                value, streamlit = old, False
        else:
            value = parse(raw[-1])
            # Streamlit reads booleans as true/false only, and numbers in their plain form: parse_bool's yes/1 are old.
            streamlit = widget not in (st.toggle, st.checkbox) or raw[-1].strip().lower() in ("true", "false")
        if valid is not None and not valid(value):
            raise ValueError(raw)
    except (TypeError, ValueError):
        shown_raw = ",".join(raw)
        st.warning(f"{param}={shown_raw!r} in the link is not a valid choice for “{label}”; showing the default")
        return _STREAMLIT
    return _STREAMLIT if streamlit and not moved else value


def parse_kind(raw: str) -> str:
    """A contribution kind from a link: the kind itself (``kind=intra``) or the label of a kind picker, today's
    (:data:`cwviz.core.vocabulary.KIND_LABELS`) or one an earlier link holds
    (``token_kind=head output ‖o_q^h‖ (intra)``): each ends with the kind in brackets."""
    text = raw.strip()
    for kind in KINDS:
        if text == kind or text.endswith(f"({kind})"):
            return kind
    raise ValueError(raw)


def parse_bool(raw: str) -> bool:
    """``true``/``false`` (also 1/0, yes/no) from a link."""
    text = raw.strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise ValueError(raw)


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
