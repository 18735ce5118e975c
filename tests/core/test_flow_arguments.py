"""The flow API's argument contract (issue 58, :mod:`cwviz.core.method.flow_arguments`), each case of the issue replayed
on a tiny random llama: a target or foil is an int, a str or a one-element integer tensor, never a bool, anything else
an ArgumentError naming the argument; shares and vocabulary counts are checked at the call, in every method that takes
them; a message quotes at most about 80 characters of what was given. And a pass whose outputs no working model gives
(NaN, infinities, absurd log-probabilities) is refused naming the model, never returned as results."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import cwviz
from cwviz.analyses import route
from cwviz.core.method.flow import flow, flow_basis
from cwviz.core.util.errors import ArgumentError, ModelLoadError
from tests.helpers import CharTokenizer, family_model

IDS = [3, 17, 5, 42, 9, 11, 23]


@pytest.fixture(scope="module")
def analysis():
    model = family_model("llama").eval()
    return cwviz.analyze(cwviz.bundle_from_model(model, CharTokenizer(100), model_id="tiny-llama"), input_ids=IDS)


@pytest.fixture(scope="module")
def made(analysis):
    return flow(analysis, target=11)


@pytest.mark.parametrize("name", ["target", "foil"])
@pytest.mark.parametrize(
    "value, words",
    [
        (True, "is a bool"),
        (False, "is a bool"),
        (np.bool_(True), "is a bool"),
        (3.0, "not a float"),
        ([11], "not a list"),
        (b"a", "not a bytes"),
        (torch.tensor([1.5]), "tensor of torch.float32"),
        (torch.tensor([11, 12]), "not a Tensor"),
        (torch.tensor(True), "tensor of torch.bool"),
    ],
    ids=["True", "False", "np.bool_", "float", "list", "bytes", "float-tensor", "two-element-tensor", "bool-tensor"],
)
def test_a_target_or_foil_of_another_type_is_an_argument_error_naming_it(analysis, name, value, words):
    """The issue's ``cwviz.flow(a, target=True)`` used token id 1; a float, tensor, list or bytes got transformers'
    error."""
    other = {"target": 11} if name == "foil" else {}
    with pytest.raises(ArgumentError, match=words) as raised:
        flow(analysis, **other, **{name: value}, vocabulary=0)
    assert raised.value.argument == name and f"the {name}" in str(raised.value)


@pytest.mark.parametrize(
    "value", [torch.tensor(11), torch.tensor([11]), np.int64(11)], ids=["0-d", "1-element", "numpy"]
)
def test_a_one_element_integer_tensor_is_its_token_id(analysis, made, value):
    assert np.array_equal(flow(analysis, target=value).totals, made.totals)


def test_a_long_target_is_quoted_in_at_most_about_80_characters(analysis):
    """A 100,000-character target was echoed whole (about 400 KB on one line)."""
    with pytest.raises(ArgumentError) as raised:
        flow(analysis, target="x" * 100_000)
    message = str(raised.value)
    assert raised.value.argument == "target" and "100,000 characters" in message and len(message) < 400, message
    with pytest.raises(ArgumentError) as raised:
        flow(analysis, target=["x" * 5_000])
    assert len(str(raised.value)) < 300


BAD_KEPT = [0, -1, 2, math.nan, math.inf, "0.5", None, True]


@pytest.mark.parametrize("kept", BAD_KEPT, ids=[repr(s) for s in BAD_KEPT])
def test_edges_edges_complete_and_the_route_refuse_the_same_kept_fractions(made, kept):
    """``edges_complete`` answered for kept fractions that ``edges`` refused (0, -1, 2, NaN, inf); ``edges("0.5")``
    and ``edges(None)`` raised a raw TypeError. The route the page and ``cwviz flow`` draw takes the same rule."""
    drawn = lambda value: route.route((), 0, np.zeros(len(IDS)), ["x"] * len(IDS), value)  # noqa: E731
    for method in (made.edges, made.edges_complete, drawn):
        with pytest.raises(ArgumentError) as raised:
            method(kept)
        assert raised.value.argument == "kept"


def test_a_good_kept_fraction_is_taken_by_both(made):
    assert len(made.edges(0.5)) > 0 and made.edges_complete(np.float32(0.5)) in (True, False)


@pytest.mark.parametrize("count", [-1, 10**7, 2.5, True, "5"], ids=repr)
def test_a_vocabulary_count_out_of_range_or_of_another_type_is_refused_before_any_pass(analysis, count, monkeypatch):
    """``vocabulary=-1 / 10**7 / 2.5`` was refused only later, as a torch error."""
    from cwviz.core.method import flow as flow_module

    def no_pass(*_args, **_kwargs):
        raise AssertionError("the vocabulary count must be refused before the pass")

    monkeypatch.setattr(flow_module, "replayed_stream", no_pass)
    for call in (lambda: flow(analysis, target=11, vocabulary=count), lambda: flow_basis(analysis, vocabulary=count)):
        with pytest.raises(ArgumentError) as raised:
            call()
        assert raised.value.argument == "vocabulary"


def test_an_argument_error_is_pickled_with_its_field():
    import pickle

    error = pickle.loads(pickle.dumps(ArgumentError("foil", "the foil is the target")))
    assert error.argument == "foil" and str(error) == "the foil is the target"


# -- outputs no working model gives -------------------------------------------------------------------------------
def _damaged_bundle(change) -> cwviz.Bundle:
    model = family_model("llama").eval()
    with torch.no_grad():
        change(model)
    return cwviz.bundle_from_model(model, CharTokenizer(100), model_id="tiny-damaged")


def test_a_pass_with_non_finite_outputs_is_refused_naming_the_model():
    """NaN weights (flipped bytes in a cache): one error naming the model, never a table of NaN."""
    bundle = _damaged_bundle(lambda model: model.model.norm.weight.fill_(math.nan))
    with pytest.raises(ModelLoadError, match="tiny-damaged gave hidden states that are not finite"):
        cwviz.analyze(bundle, input_ids=IDS)


def test_absurd_log_probabilities_are_refused_naming_the_model():
    """Finite but absurd logits (the issue's OverflowError in the perplexity): refused when first read."""
    bundle = _damaged_bundle(lambda model: model.model.norm.weight.fill_(1e30))
    analysis = cwviz.analyze(bundle, input_ids=IDS)
    with pytest.raises(ModelLoadError, match="tiny-damaged gave a mean next-token log-probability"):
        analysis.perplexity  # noqa: B018
