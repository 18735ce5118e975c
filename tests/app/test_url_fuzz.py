"""Fuzzing the URL-parameter parsing: any link gives a valid selection or an explanation, never a crash."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from cwviz.app import state
from tests.helpers.app import APP

values = st.one_of(
    st.text(max_size=12),
    st.integers(min_value=-(10**6), max_value=10**6).map(str),
    st.sampled_from(["all", "", " 3 ", "1e3", "0x10", "٣", "9" * 5000, "-0", "NaN", "<script>"]),
)
params = st.dictionaries(st.sampled_from(list(state.URL_KEYS)), values, max_size=len(state.URL_KEYS))


@settings(max_examples=300, deadline=None)
@given(params=params, layers=st.integers(1, 40), heads=st.integers(1, 32), tokens=st.integers(1, 600))
def test_any_link_gives_an_in_range_selection(params, layers, heads, tokens):
    cur = state.defaults()
    state.parse_url(params, cur)
    assert cur["device"] in state.DEVICE_CHOICES and cur["dtype"] in state.DTYPE_CHOICES
    assert 0 <= cur["generate"] <= state.MAX_GENERATE
    assert isinstance(cur["text"], str) and isinstance(cur["model"], str) and cur["model"]
    state.clamp(cur, SimpleNamespace(num_layers=layers, num_heads=heads, num_tokens=tokens))
    assert 0 <= cur["layer"] < layers
    assert cur["head"] is None or 0 <= cur["head"] < heads
    assert 0 <= cur["query"] < tokens
    for note in cur["notes"]:
        assert "in the link" in note
    # Every value that was given but could not be used as given is explained.
    for name in ("layer", "token"):
        if name in params and state.parse_int(params[name]) is None:
            assert any(note.startswith(f"{name}=") for note in cur["notes"])


def test_odd_prompts_in_the_app_analyse_without_errors():
    import json

    from streamlit.testing.v1 import AppTest

    from tests.helpers import ODD_PROMPTS

    for name in ("emoji", "rtl", "control", "html", "special", "one_token"):
        at = AppTest.from_file(APP, default_timeout=180)
        at.query_params["prompt"] = ODD_PROMPTS[name]
        at.run()
        assert not at.exception, (name, [e.value for e in at.exception])
        assert not at.error, (name, [e.value for e in at.error])
        specs = [json.loads(c.proto.spec) for c in at.get("vega_lite_chart")]
        assert specs, name
        at.switch_page("views/token.py").run()
        assert not at.exception and not at.error, name
