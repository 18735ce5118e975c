"""The effect flow (docs/METHOD.md section 7.1) and the registry of attribution methods (7.2): the totals are ∂LD/∂m_k
by an independent autograd path on a tiny random model of every family, the edges and the heads sum to them, the
embedding readings are their definitions, a finite difference on the embedded model agrees, and every member answers
in one shape."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import cwviz
from cwviz.analyses.schema import FLOW_METHODS
from cwviz.core.loading import architectures
from cwviz.core.method import attribution, effect
from cwviz.core.method.capture import forward_pass
from cwviz.core.method.interventions import KeepKeys
from cwviz.core.util.errors import InputError
from tests.helpers import DERIVED_FAMILIES, FAMILY_CONFIGS, CharTokenizer, family_model, no_hooks

FAMILIES = [family for family in FAMILY_CONFIGS if family not in DERIVED_FAMILIES]
IDS = [3, 17, 5, 42, 9, 11, 23]


def family_analysis(family: str, ids=IDS, dtype=torch.float32):
    model = family_model(family).eval().to(dtype)
    bundle = cwviz.bundle_from_model(model, CharTokenizer(100), model_id=f"tiny-{family}")
    return cwviz.analyze(bundle, input_ids=list(ids))


def independent_totals(analysis, position: int, target: int | None, foil: int | None, eps: float = 1e-2) -> np.ndarray:
    """∂LD/∂m_k by another path than the effect flow's: central differences (a float64 model; the attention code keeps
    some float32 steps, about 1e-7 of LD, hence a step of 1e-2, whose O(ε²) error is smaller), with m as keep weights on
    the attention probabilities of key column k (α_ik m_k v_k = α_ik (m_k v_k)) through the knockouts' weighted-values
    code, and LD from the model's own forward (its logits; an encoder's last hidden state read along its own clean
    direction)."""
    bundle = analysis.bundle
    ids = torch.tensor([analysis.input_ids])
    tokens = len(analysis.input_ids)

    def quantity(scale: torch.Tensor, direction=None) -> tuple[float, torch.Tensor]:
        keep = KeepKeys({}, default=scale[None, None, None].double())
        with torch.inference_mode(), forward_pass(bundle.attention_modules, record=False, intervention=keep):
            if bundle.has_logits:
                logits = bundle.model(input_ids=ids, use_cache=False).logits[0, position]
                return float(logits[target] - (0 if foil is None else logits[foil])), None
            hidden = architectures.base_model(bundle.model)(input_ids=ids).last_hidden_state[0, position]
            direction = hidden / hidden.norm() if direction is None else direction
            return float(hidden @ direction), direction

    _, direction = quantity(torch.ones(tokens, dtype=torch.float64))
    out = np.zeros(tokens)
    for k in range(tokens):
        up, down = torch.ones(tokens, dtype=torch.float64), torch.ones(tokens, dtype=torch.float64)
        up[k], down[k] = 1 + eps, 1 - eps
        out[k] = (quantity(up, direction)[0] - quantity(down, direction)[0]) / (2 * eps)
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_totals_are_the_derivative_of_the_quantity_in_each_tokens_value_scale_on_every_family(family):
    experts = any("experts" in key for key in FAMILY_CONFIGS[family])  # torch's grouped matmul has no float64
    analysis = family_analysis(family, dtype=torch.float32 if experts else torch.float64)
    causal = analysis.bundle.has_logits
    position = 5 if causal else 0
    target, foil = (11, 60) if causal else (None, None)
    grads = effect.gradients(analysis, position, target, foil)
    # a mixture of experts routes by top-k: a step of 1e-2 can switch an expert, so it takes a smaller one (in float32)
    expected = independent_totals(analysis, position, target, foil, eps=1e-3 if experts else 1e-2)
    tolerance = (2e-3 if experts else 2e-4) * max(1.0, np.abs(expected).max())
    np.testing.assert_allclose(grads.totals, expected, rtol=2e-3, atol=tolerance)
    assert np.abs(grads.totals).max() > 0  # the property is not met by zeros
    # each layer's edges, summed over queries, and each head's part, give back the totals (section 7.1)
    from_edges = np.zeros(analysis.num_tokens)
    for layer in range(analysis.num_layers):
        for _first, _stop, weights in effect.edges_of_layer(analysis, grads, layer):
            from_edges[: weights.shape[1]] += weights.sum(0).numpy()
    np.testing.assert_allclose(from_edges, grads.totals, rtol=1e-4, atol=1e-5 * max(1.0, np.abs(expected).max()))
    assert abs(effect.head_parts(analysis, grads).sum() - grads.totals.sum()) < 1e-4 * max(
        1.0, np.abs(grads.totals).sum()
    )
    if causal:  # nothing after the position reaches the prediction
        np.testing.assert_array_equal(grads.totals[position + 1 :], 0)
    assert no_hooks(analysis.bundle.model)
    assert all(p.grad is None for p in analysis.bundle.model.parameters())


def test_the_embedding_readings_are_their_definitions():
    """origin = ⟨e_k − ē, ∂LD/∂e_k⟩ and input × gradient = ⟨e_k, ∂LD/∂e_k⟩, with ∂LD/∂e from the model's own forward
    on inputs_embeds and ē the plain mean of the embedding module's outputs over the vocabulary."""
    analysis = family_analysis("gemma3_text")  # a scaled embedding (√d): ē must carry the scale
    bundle = analysis.bundle
    embed = bundle.model.get_input_embeddings()
    with torch.enable_grad():
        e = embed(torch.tensor([IDS])).detach().requires_grad_(True)
        logits = bundle.model(inputs_embeds=e, use_cache=False).logits[0, 6].float()
        (grad,) = torch.autograd.grad(logits[11] - logits[60], e)
    mean = embed(torch.arange(100)).mean(0).detach()
    grads = effect.gradients(analysis, 6, 11, 60)
    np.testing.assert_allclose(grads.input_x_gradient, (e[0] * grad[0]).sum(-1).detach().numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(grads.origin, ((e[0] - mean) * grad[0]).sum(-1).detach().numpy(), rtol=1e-4, atol=1e-5)
    assert abs(grads.quantity - float((logits[11] - logits[60]).detach())) < 1e-4


def test_the_origin_intervention_replaces_the_embedding_by_the_mean_one():
    """knockout's ORIGIN rows equal the model run by hand on embeddings whose removed rows are ē."""
    from cwviz.core.method.knockout import ORIGIN, last_logits

    analysis = family_analysis("llama")
    bundle = analysis.bundle
    embed = bundle.model.get_input_embeddings()
    sets = [(), (0,), (2, 4)]
    ours = last_logits(bundle, IDS, sets, batch_size=2, intervention=ORIGIN)
    mean = embed(torch.arange(100)).mean(0)
    for row, removed in enumerate(sets):
        with torch.inference_mode():
            e = embed(torch.tensor([IDS])).clone()
            e[0, list(removed)] = mean
            expected = bundle.model(inputs_embeds=e, use_cache=False).logits[0, -1].float()
        assert torch.allclose(ours[row], expected, atol=1e-5), removed
    assert not torch.allclose(ours[0], ours[1])


def test_a_finite_difference_in_one_tokens_value_scale_agrees_on_the_embedded_model(embedded):
    analysis = cwviz.analyze(embedded, "The capital of France is")
    position = analysis.num_tokens - 1
    grads = effect.gradients(analysis, position, embedded.tokenizer(" Paris")["input_ids"][0], None)

    def quantity(scale: torch.Tensor) -> float:
        with (
            torch.inference_mode(),
            forward_pass(embedded.attention_modules, record=False, intervention=effect.ScaleValueColumns(scale)),
        ):
            hidden = embedded.final_hidden(torch.tensor([analysis.input_ids]))
            return float(effect.quantity(embedded, hidden, position, grads.target, None)[0])

    eps = 1e-2
    for k in (0, 3):
        up, down = torch.ones(analysis.num_tokens), torch.ones(analysis.num_tokens)
        up[k], down[k] = 1 + eps, 1 - eps
        difference = (quantity(up) - quantity(down)) / (2 * eps)
        assert abs(difference - grads.totals[k]) < 2e-2 * max(1.0, abs(difference)), k


def test_the_registry_lists_every_method_the_parsers_offer_and_each_answers_one_score_per_token():
    assert tuple(attribution.METHODS) == FLOW_METHODS
    analysis = family_analysis("llama")
    asked = attribution.request(analysis, 5, 11, 60)
    for name, method in attribution.METHODS.items():
        result = attribution.run(method, asked)
        assert (
            result.method == name and result.scores.shape == (analysis.num_tokens,) and np.isfinite(result.scores).all()
        ), name
        assert (result.edges is not None) == method.has_edges, name
        assert result.asked.target == 11 and result.asked.foil == 60 and result.asked.position == 5
        assert len(result.tokens_table()) == analysis.num_tokens
        assert method.answers <= set(attribution.INTERVENTIONS) and method.answers
    effect_result = attribution.run(attribution.METHODS["effect"], asked)
    np.testing.assert_allclose(effect_result.scores, asked.gradients.totals, rtol=1e-6)
    by_key = np.zeros(analysis.num_tokens)  # every kept edge (all of them on a tiny model), summed by its key
    for edges in effect_result.edges:
        # every edge that weighs something is kept on a tiny model, largest first; none from a later key (causal)
        # and none into a query after the position (which no gradient reaches)
        (_, _, full), *_ = effect.edges_of_layer(analysis, asked.gradients, edges.layer)
        assert len(edges.weights) == int((full != 0).sum()) > 0
        assert (np.diff(np.abs(edges.weights)) <= 0).all()
        assert (edges.keys <= edges.queries).all() and (edges.queries <= 5).all()
        np.add.at(by_key, edges.keys, edges.weights)
        assert edges.mass == pytest.approx(np.abs(edges.weights).sum(), rel=1e-5)
    np.testing.assert_allclose(by_key, effect_result.scores, atol=1e-4)


def test_the_registry_refuses_what_it_cannot_answer():
    analysis = family_analysis("llama")
    with pytest.raises(InputError, match="no attribution method 'nope'"):
        attribution.attribute(analysis, "nope")
    with pytest.raises(InputError, match="foil is the target"):
        attribution.attribute(analysis, "effect", 5, 11, 11)
    with pytest.raises(InputError, match="outside the vocabulary"):
        attribution.attribute(analysis, "effect", 5, 1000)
    encoder = family_analysis("bert")
    with pytest.raises(InputError, match="encoder"):
        attribution.attribute(encoder, "alti")
    with pytest.raises(InputError, match="encoder"):
        attribution.attribute(encoder, "effect", 0, 5)
    result = attribution.attribute(encoder, "effect", 0)  # an encoder's quantity: its representation's own direction
    assert result.asked.target is None and np.isfinite(result.scores).all()
