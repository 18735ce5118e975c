"""ALTI-Logit (docs/METHOD.md section 7.2): the routing against a 3-token case worked by hand, the attention parts by
source against the model's own modules, the logit difference it splits against the model's own logits, the registry
entry, and a run on each embedded decoder."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import cwviz
from cwviz.core.loading import architectures
from cwviz.core.method import attribution, baselines
from cwviz.core.method.alti_logit import alti_logit, route
from cwviz.core.method.flow import token_totals
from cwviz.core.util.errors import InputError
from tests.helpers import CharTokenizer, family_model, make_tiny

IDS = list(range(5, 15))


def test_routing_of_a_three_token_case_worked_by_hand():
    c0 = torch.tensor([[1.0, 0, 0], [0.5, 0.5, 0], [0.2, 0.3, 0.5]])
    c1 = torch.tensor([[1.0, 0, 0], [0.0, 1, 0], [0.0, 0.5, 0.5]])
    parts = np.array([[1.0, 2, 3], [0, 1, -2], [1, 0, 4]])  # d^0, d^1, d^2 by source
    # d^0 as it is; d^1 C^0 = [0.1, -0.1, -1]; C^1 C^0 rows [1,0,0], [.5,.5,0], [.35,.4,.25], so d^2 C^1 C^0 = [2.4,
    # 1.6, 1]
    np.testing.assert_allclose(route(parts, [c0, c1, torch.eye(3)]), [3.5, 3.5, 3.0])
    # the top layer's map is never read: it mixes after the last parts are written
    np.testing.assert_allclose(route(parts, [c0, c1, torch.full((3, 3), float("nan"))]), [3.5, 3.5, 3.0])
    # one layer: the parts themselves
    np.testing.assert_allclose(route(parts[:1], [torch.full((3, 3), float("nan"))]), parts[0])


def _own_difference(bundle, ids, position, target, foil):
    """The model's own logit difference at ``position``, before a final soft-cap (undone per logit)."""
    with torch.inference_mode():
        logits = bundle.model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, position].double()
    cap = getattr(bundle.model.config, "final_logit_softcapping", None)
    if cap:
        logits = cap * torch.atanh(logits / cap)
    return float(logits[target] - logits[foil])


@pytest.mark.parametrize("family", ["llama", "gemma3_text", "granite"])
def test_scores_and_the_unrouted_rest_add_up_to_the_models_logit_difference(family):
    # llama: pre-norm; Gemma 3: a sandwich norm on the attention output and a final soft-cap; Granite: a residual
    # multiplier and a logit divisor. ALTI's rows sum to 1, so routing keeps each layer's total.
    bundle = (
        make_tiny(family) if family == "llama" else cwviz.bundle_from_model(family_model(family), CharTokenizer(100))
    )
    analysis = cwviz.analyze(bundle, input_ids=IDS)
    result = alti_logit(analysis, 8, 11, 60)
    assert result.scores.shape == (len(IDS),) and np.isfinite(result.scores).all()
    own = _own_difference(bundle, IDS, 8, 11, 60)
    assert abs(result.scores.sum() + result.rest - own) < 1e-4 * max(1.0, abs(own))
    np.testing.assert_allclose(result.scores.sum(), result.parts.sum() + result.embedding, atol=1e-5)
    assert (result.parts[:, 9:] == 0).all() and (result.scores[9:] == 0).all()  # causal: no source after p
    # the routing is the explicit rollout of ALTI's maps below each layer, p's own embedding read directly added at p
    maps = baselines.alti_maps(analysis)
    explicit = (
        result.parts[0]
        + np.eye(len(IDS))[8] * result.embedding
        + sum(result.parts[layer] @ baselines.rollout(maps[:layer]).double().numpy() for layer in range(1, len(maps)))
    )
    np.testing.assert_allclose(result.scores, explicit, atol=1e-6)


@torch.no_grad()
def _parts_from_modules(bundle, analysis, position, target, foil) -> tuple[np.ndarray, float]:
    """(d^l_j = Σ_h α_pj^h ⟨W_O^h v_j^h, w⟩ [layer, key], ⟨x_p^0, w⟩) with w = g_F ⊙ r_F (U_t − U_f), the final RMSNorm
    frozen at p, from a Llama's own modules and states (no cwviz code but the attention probabilities)."""
    model, ids = bundle.model, analysis.input_ids
    layers = architectures.layer_modules(model, bundle.arch)
    states = model.model(input_ids=torch.tensor([ids]), use_cache=False, output_hidden_states=True).hidden_states
    inputs = [s[0] for s in states[: len(layers)]]  # layer l's input x^l [T, d_model]
    final = []
    handle = model.model.norm.register_forward_pre_hook(lambda m, a: final.append(a[0][0]))
    try:
        model.model(input_ids=torch.tensor([ids]), use_cache=False)
    finally:
        handle.remove()
    norm, unembed = model.model.norm, model.lm_head.weight.double()
    r = torch.rsqrt(final[0][position].double().pow(2).mean() + norm.variance_epsilon)
    w = norm.weight.double() * r * (unembed[target] - unembed[foil])  # (d_model,)
    config = model.config
    heads, kv, dh = (
        config.num_attention_heads,
        config.num_key_value_heads,
        config.hidden_size // config.num_attention_heads,
    )
    parts = np.zeros((len(layers), len(ids)))
    for layer, block in enumerate(layers):
        values = block.self_attn.v_proj(block.input_layernorm(inputs[layer])).double()  # (T, kv * dh)
        alpha = torch.from_numpy(analysis.attention(layer)).double()  # (head, query, key)
        w_o = block.self_attn.o_proj.weight.double()  # (d_model, heads * dh)
        for j in range(position + 1):
            for h in range(heads):
                g = h // (heads // kv)
                written = w_o[:, h * dh : (h + 1) * dh] @ values[j, g * dh : (g + 1) * dh]
                parts[layer, j] += float(alpha[h, position, j] * (written @ w))
    return parts, float(inputs[0][position].double() @ w)


def test_attention_parts_by_source_are_the_paper_decomposition_from_the_models_modules():
    bundle = make_tiny("llama")
    analysis = cwviz.analyze(bundle, input_ids=IDS)
    result = alti_logit(analysis, 8, 11, 60)
    parts, embedding = _parts_from_modules(bundle, analysis, 8, 11, 60)
    np.testing.assert_allclose(result.parts, parts, atol=1e-5)
    assert result.embedding == pytest.approx(embedding, abs=1e-5)


def test_the_registry_member_is_signed_answers_both_interventions_and_refuses_an_encoder():
    analysis = cwviz.analyze(make_tiny("llama"), input_ids=IDS)
    member = attribution.METHODS["alti_logit"]
    assert member.signed and member.answers == {attribution.RELAY, attribution.ORIGIN}
    asked = attribution.request(analysis, 8, 11, 60)
    answer = attribution.run(member, asked)
    np.testing.assert_allclose(answer.scores, alti_logit(analysis, 8, 11, 60).scores)
    assert answer.scores.dtype == np.float64 and answer.quantity == pytest.approx(
        asked.share_flow.frozen_logit_difference
    )
    # share_flow reads the same flow of the request (computed once), and its totals are section 6's
    kept = asked.share_flow
    shared = attribution.run(attribution.METHODS["share_flow"], asked)
    assert asked.share_flow is kept
    np.testing.assert_allclose(shared.scores, token_totals(analysis, 8, 11, 60), atol=1e-6)
    with pytest.raises(ValueError, match="foil 60"):  # another request's flow is not routed
        alti_logit(analysis, 8, 11, 61, kept)
    encoder = cwviz.analyze(make_tiny("bert"), input_ids=IDS)
    with pytest.raises(InputError, match="ALTI-Logit does not run on this model"):
        attribution.attribute(encoder, "alti_logit")


@pytest.mark.parametrize("model_id", ["embedded", "embedded-gemma"])
def test_runs_on_the_embedded_decoders(model_id, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    bundle = cwviz.load_model(model_id, device="cpu")
    ids = bundle.tokenizer("Natalia sold clips to 48 of her friends in April, and then she sold")["input_ids"]
    analysis = cwviz.analyze(bundle, input_ids=ids)
    with torch.inference_mode():
        target, foil = (
            bundle.model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1].topk(2).indices.tolist()
        )
    result = attribution.attribute(analysis, "alti_logit", target=target, foil=foil)
    assert result.scores.shape == (len(ids),) and np.isfinite(result.scores).all() and result.quantity > 0
    parts = alti_logit(analysis, len(ids) - 1, target, foil)
    own = _own_difference(bundle, ids, len(ids) - 1, target, foil)
    # seen: 3e-8 (SmolLM2), 7e-6 (Gemma 3)
    assert abs(parts.scores.sum() + parts.rest - own) < 1e-4 * max(1.0, abs(own))
