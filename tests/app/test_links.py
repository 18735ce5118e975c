"""A link restores every picker: for each page, a URL with every parameter set to a value other than its
default opens with each widget showing that value, the sidebar included, and the URL keeps them.

The browser test (tests/browser/test_browser.py) checks the same in Chromium for a fresh browser context.
"""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from cwviz.app import state
from tests.helpers.app import APP, LINK_TEXT, PAGES, SIDEBAR, TIMEOUT, assert_clean, widget


def _value(at: AppTest, key: str):
    for kind in (
        "radio",
        "selectbox",
        "multiselect",
        "button_group",
        "slider",
        "number_input",
        "text_input",
        "text_area",
        "checkbox",
        "toggle",
    ):
        found = [w for w in at.get(kind) if getattr(w, "key", None) == key]
        if found:
            return found[0].value
    raise AssertionError(f"no widget with key {key!r} on the page")


def _open(page: str, params: dict) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    for name, value in params.items():
        at.query_params[name] = value
    at.switch_page(page)
    at.run()
    assert_clean(at)
    assert not at.warning, [w.value for w in at.warning]
    assert widget(at, "slider", "Layer").value == 3
    assert widget(at, "selectbox", "Head").value == 2
    assert widget(at, "selectbox", "Query token").value == 4
    assert _value(at, state.PRESENTER) is True
    assert widget(at, "text_area", "Prompt").value == LINK_TEXT
    assert widget(at, "selectbox", "Dtype").value == "float32"
    assert widget(at, "selectbox", "Device").value == "cpu"
    return at


@pytest.mark.parametrize("page", list(PAGES))
def test_a_link_with_every_parameter_restores_every_picker(page):
    """A link written with the parameter names and values links have had (``kind=intra``, ``rates=10,50``) restores
    every picker. From the next run on (any click), the URL holds each picker's value in the form Streamlit's
    binding writes (the shown label, repeated parameters), and that URL, opened in turn, restores the same view."""
    params, expected = PAGES[page]
    at = _open(page, {**SIDEBAR, **params})
    assert {key: _value(at, key) for key in expected} == expected
    at.run()
    assert {key: _value(at, key) for key in expected} == expected
    url = dict(at.query_params)
    # Streamlit leaves a value equal to the widget's default out of the URL: claims_source=run is the default.
    assert set(params) - {"claims_source"} <= set(url), sorted(set(params) - set(url))
    again = _open(page, url)
    assert {key: _value(again, key) for key in expected} == expected


def test_a_malformed_picker_value_in_a_link_is_explained_and_the_default_shown():
    """Each kind of picker: an unknown option, a number out of range, a list with an unknown item, a boolean that is
    none. Each gets one warning naming it, the picker shows its default, and the URL drops the value."""
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    bad = {"kind": "sideways", "top_k": "99", "layerwise": "maybe", "measures": "raw,nonsense"}
    for name, value in bad.items():
        at.query_params[name] = value
    at.switch_page("views/heatmaps.py").run()
    assert_clean(at)
    assert _value(at, "kind") == "inter"
    assert [w.value for w in at.warning] == [
        "kind='sideways' in the link is not a valid choice for “Normalise by”; showing the default"
    ]
    assert "kind" not in at.query_params
    for page, key, default in (
        ("token", "top_k", 5),
        ("sinks", "layerwise", False),
        ("faithfulness", "measures", None),
    ):
        at = AppTest.from_file(APP, default_timeout=TIMEOUT)
        at.query_params[key] = bad[key]
        at.switch_page(f"views/{page}.py").run()
        assert_clean(at)
        assert [w.value for w in at.warning if f"{key}=" in w.value], (page, [w.value for w in at.warning])
        if default is not None:
            assert _value(at, key) == default
        assert key not in at.query_params, (key, at.query_params)


def test_a_link_with_a_kind_pickers_earlier_label_still_picks_that_kind():
    """Every kind picker shows one label (:data:`cwviz.core.vocabulary.KIND_LABELS`); a link that holds the label the
    Token or Compare page showed before, in the form Streamlit's binding wrote it, still picks that kind, with no
    warning."""
    assert state.parse_kind("head output ‖o_i^h‖ (intra)") == "intra" and state.parse_kind(" inter ") == "inter"
    with pytest.raises(ValueError):
        state.parse_kind("sideways")
    at = _open("views/token.py", {**SIDEBAR, "token_kind": "head output ‖o_q^h‖ (intra)"})
    assert _value(at, "token_kind") == "intra"


def test_a_long_prompt_goes_into_the_link_by_its_hash_and_an_unknown_hash_is_said(monkeypatch, tmp_path):
    """A prompt of 20,000 words made a 111 kB link: it is kept on the server and the link names its sha256, so links
    stay under 8 kB; a link whose prompt this server does not have says so, rather than show another prompt."""
    from urllib.parse import urlencode

    from cwviz.app import prompt_store

    monkeypatch.setenv("CWVIZ_CACHE", str(tmp_path))
    long = " ".join(f"word{i}" for i in range(20_000))
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params["prompt"] = "short one"
    at.run()
    cur = at.session_state["_cwviz_state"]
    cur["text"] = cur["draft_text"] = long
    at.run()
    url = dict(at.query_params)
    assert "prompt" not in url and len(urlencode(url)) < 8000
    assert prompt_store.find(url[state.PROMPT_SHA]) == long

    cur = state.defaults()
    state.parse_url({state.PROMPT_SHA: url[state.PROMPT_SHA]}, cur)
    assert cur["text"] == long and not cur["notes"]
    cur = state.defaults()
    state.parse_url({state.PROMPT_SHA: "0" * 64}, cur)
    assert cur["text"] == state.defaults()["text"] and "does not have" in cur["notes"][0]


def test_every_link_to_a_page_keeps_presenter_mode_and_a_short_prompt():
    from cwviz.app import links, services

    request = services.Request("embedded", text="a cat")
    at = AppTest.from_string(
        "import streamlit as st\nfrom cwviz.app import links, services, state\n"
        "state.presenter_toggle()\n"
        "st.write(links.page_url('sinks', services.Request('embedded', text='a cat'), 1, 2))"
    )
    at.query_params[state.PRESENTER] = "true"
    at.run()
    assert "presenter=true" in at.markdown[0].value and "prompt=a+cat" in at.markdown[0].value
    assert "presenter" not in links.page_url("sinks", request, 1, 2)  # off (no session): not in the link
