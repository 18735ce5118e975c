"""The library's input contract: an index is an integer (numpy integers and one-element integer tensors
included, bools and text not) and the error says so; token ids are a 1-D sequence of integers; every other
bad input raises a cwviz error (InputError or SelectionError) that names the fix, never a raw TypeError,
ValueError, IndexError or FileNotFoundError."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cwviz
from cwviz.analyses import faithfulness, sink_interventions, sinks
from cwviz.analyses.tables import decomposition
from cwviz.core.loading.inputs import integer_index, token_ids
from cwviz.core.method.export import to_json
from cwviz.core.method.interventions import batch_perplexity
from cwviz.core.util.errors import CwvizError, InputError, SelectionError
from tests.helpers import make_tiny

TEXT = "the quick brown fox jumps over"


@pytest.fixture(scope="module")
def llama():
    return make_tiny("llama")


@pytest.fixture(scope="module")
def analysis(llama):
    return cwviz.analyze(llama, TEXT)


NOT_INTEGERS = [
    "1",
    1.0,
    1.5,
    True,
    False,
    np.True_,
    None,
    [1],
    torch.tensor([1, 2]),
    torch.tensor(True),
    torch.tensor(1.0),
    1j,
]
INTEGERS = [1, np.int64(1), np.int32(1), np.uint8(1), torch.tensor(1)]


@pytest.mark.parametrize(
    "method, value",
    # head=None means all heads, so it is no bad head
    [
        (m, v)
        for m in ("attention", "contributions", "head", "token")
        for v in NOT_INTEGERS
        if not (m == "head" and v is None)
    ],
    ids=repr,
)
def test_an_index_that_is_not_an_integer_is_refused_saying_so(analysis, method, value):
    call = {
        "attention": lambda: analysis.attention(value),
        "contributions": lambda: analysis.contributions(value),
        "head": lambda: decomposition(analysis, 0, 3, value),
        "token": lambda: decomposition(analysis, 0, value),
    }[method]
    with pytest.raises(SelectionError, match="must be an integer") as err:
        call()
    assert "out of range" not in str(err.value)


@pytest.mark.parametrize("value", INTEGERS, ids=repr)
def test_integer_indices_of_every_integer_type_select_the_same_layer(analysis, value):
    assert np.array_equal(analysis.attention(value), analysis.attention(1))
    assert integer_index(value, "x") == 1 and type(integer_index(value, "x")) is int


def test_out_of_range_says_out_of_range(analysis):
    with pytest.raises(SelectionError, match=r"layer 2 is out of range; this model has layers 0\.\.1"):
        analysis.attention(2)
    with pytest.raises(SelectionError, match="head 9 is out of range"):
        decomposition(analysis, 0, 1, 9)
    last = analysis.num_tokens - 1
    for first, stop in ((3, last + 2), (3, 3), (-1, 2)):
        with pytest.raises(SelectionError, match=rf"rows {first}\.\.{stop - 1} are out of range; .* 0\.\.{last}"):
            analysis.attention_tensor(0, first, stop)


def test_what_the_pass_kept_is_fixed_at_construction(analysis):
    """An analysis is shared between threads (the dashboard's cache): the residual stream and the intervention its
    pass ran under are read-only, so no reader can swap them under another."""
    for name in ("stream", "intervention"):
        with pytest.raises(AttributeError):
            setattr(analysis, name, None)


@pytest.mark.parametrize("sink", [1.5, True, "x", None, "1.0"], ids=repr)
def test_sink_positions_are_integers_or_auto(analysis, sink):
    with pytest.raises((SelectionError, InputError), match="integer|token position"):
        sinks.sink_table(analysis, sink=sink)


def test_sink_positions_accepted(analysis):
    assert sinks.resolve_sink(analysis, " 2 ") == 2
    assert sinks.resolve_sink(analysis, np.int64(-1)) == analysis.num_tokens - 1


@pytest.mark.parametrize(
    "ids",
    [
        "123",
        "abc",
        5,
        [1.7, 2.2],
        [True, False],
        [[1, 2]],
        [1, None],
        np.array([[1, 2]]),
        torch.tensor([[1, 2]]),
        np.array([1.0, 2.0]),
    ],
    ids=repr,
)
def test_token_ids_must_be_a_1d_sequence_of_integers(llama, ids):
    with pytest.raises(InputError, match="input_ids"):
        cwviz.analyze(llama, input_ids=ids)


@pytest.mark.parametrize(
    "ids", [[1, 2, 3], (1, 2, 3), np.array([1, 2, 3]), torch.tensor([1, 2, 3]), [np.int64(1), 2, 3]], ids=repr
)
def test_token_ids_of_every_accepted_kind_give_the_same_analysis(llama, ids):
    assert cwviz.analyze(llama, input_ids=ids).input_ids == [1, 2, 3]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.one_of(
        st.lists(st.integers(0, 99), min_size=1, max_size=6),
        st.lists(st.one_of(st.floats(), st.booleans(), st.text(max_size=2), st.none()), min_size=1, max_size=4),
        st.text(max_size=5),
        st.integers(),
        st.floats(),
    )
)
def test_token_ids_property(value):
    """Lists of ints pass unchanged; anything holding a non-integer is refused with InputError."""
    ok = isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    if ok:
        assert token_ids(value) == value
    else:
        with pytest.raises(InputError):
            token_ids(value)


@settings(max_examples=60, deadline=None)
@given(st.one_of(st.integers(-5, 5), st.floats(allow_nan=True), st.booleans(), st.text(max_size=3), st.none()))
def test_integer_index_property(value):
    if isinstance(value, int) and not isinstance(value, bool):
        assert integer_index(value, "a layer") == value
    else:
        with pytest.raises(SelectionError, match="a layer must be an integer"):
            integer_index(value, "a layer")


def test_perplexity_checks_the_vocabulary_and_the_length(llama):
    with pytest.raises(InputError, match=r"0\.\.99"):
        batch_perplexity(llama, [1, 500])
    with pytest.raises(InputError, match="two tokens"):
        batch_perplexity(llama, [1])
    with pytest.raises(InputError, match="integer"):
        batch_perplexity(llama, torch.tensor([[1.0, 2.0]]))


def test_head_curve_out_of_range_says_so(analysis):
    table = sinks.sink_table(analysis, 0)
    with pytest.raises(SelectionError, match="layer 99 is out of range"):
        sinks.head_curve(table, layer=99, head=0)
    with pytest.raises(SelectionError, match="head 7 is out of range"):
        sinks.head_curve(table, layer=0, head=7)
    with pytest.raises(SelectionError, match="must be an integer"):
        sinks.head_curve(table, layer="0", head=0)


@pytest.mark.parametrize("factor", ["x", None, True, float("inf"), [0.5]], ids=repr)
def test_the_sink_factor_must_be_a_finite_number(analysis, factor):
    with pytest.raises(InputError, match="λ must be"):
        sink_interventions.intervene_on_sink(analysis, 0, factor)
    with pytest.raises(InputError, match="λ must be"):
        sink_interventions.removal_perplexity(analysis, [None], 0, factor)


def test_a_json_export_to_a_missing_folder_names_the_fix(analysis, tmp_path):
    with pytest.raises(InputError, match="folder that exists"):
        to_json(analysis, tmp_path / "missing" / "x.json")


def test_an_example_of_one_token_is_refused_with_a_cwviz_error(llama):
    with pytest.raises(CwvizError, match="two tokens"):
        faithfulness.run_example(llama, [1])


def test_the_decomposition_leaves_out_keys_outside_a_sliding_window():
    bundle = make_tiny("mistral")  # sliding_window=8
    analysis = cwviz.analyze(bundle, "abcdefghijklmnopqrst")
    query = 15
    table = decomposition(analysis, 0, query, 0, "intra")
    visible = analysis.key_mask(0)[query]
    assert list(table["key"]) == torch.nonzero(visible).flatten().tolist()
    assert len(table) < query + 1  # the window hides the far keys
    assert (table["attention"] > 0).all()  # every key listed is one the query attends to
    # Nothing is lost: the head's intra-head contributions over the listed keys still sum to 1.
    assert table["contribution"].sum() == pytest.approx(1.0, abs=1e-4)
