"""The baselines of docs/METHOD.md section 6.5: attention rollout and ALTI against 3-token cases worked by hand, and
ALTI's transformed vectors against the model's own residual stream on tiny random models."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import cwviz
from cwviz.core.loading import architectures
from cwviz.core.method import baselines, residual
from cwviz.core.method.frozen_norm import FrozenNorm
from cwviz.core.method.mixing import mixing
from tests.helpers import CharTokenizer, family_model, make_tiny


def test_rollout_of_a_three_token_case_worked_by_hand():
    # layer 1: two heads whose mean is [[1,0,0],[.5,.5,0],[.2,.3,.5]]; layer 2: one head
    head_a = torch.tensor([[1.0, 0, 0], [1.0, 0, 0], [0.4, 0.6, 0]])
    head_b = torch.tensor([[1.0, 0, 0], [0.0, 1, 0], [0.0, 0, 1]])
    first = baselines.residual_attention(torch.stack([head_a, head_b]))
    # ½ mean + ½ I, by hand
    assert torch.allclose(first, torch.tensor([[1.0, 0, 0], [0.25, 0.75, 0], [0.1, 0.15, 0.75]]))
    second = baselines.residual_attention(torch.tensor([[[1.0, 0, 0], [1.0, 0, 0], [0.0, 0.5, 0.5]]]))
    assert torch.allclose(second, torch.tensor([[1.0, 0, 0], [0.5, 0.5, 0], [0, 0.25, 0.75]]))
    # R = A² A¹: row 2 = 0.25 · [.25, .75, 0] + 0.75 · [.1, .15, .75]
    expected = torch.tensor([[1.0, 0, 0], [0.625, 0.375, 0], [0.1375, 0.3, 0.5625]])
    assert torch.allclose(baselines.rollout([first, second]), expected)


def test_rollout_rows_are_renormalised_when_attention_rows_sum_below_one():
    # a learned sink takes 0.5 of the last row: ½ (0.5 mean) + ½ I is divided by its sum 0.75
    alpha = torch.tensor([[[1.0, 0], [0.25, 0.25]]])
    assert torch.allclose(baselines.residual_attention(alpha), torch.tensor([[1.0, 0], [0.125 / 0.75, 0.625 / 0.75]]))


def test_alti_transformed_vectors_of_a_three_token_case_worked_by_hand():
    alpha = torch.tensor([[[1.0, 0, 0], [0.5, 0.5, 0], [0.5, 0.25, 0.25]]])  # (head, query, key)
    projected = torch.tensor([[[2.0, 0], [0.0, 2], [-2.0, 0]]])  # ṽ (head, key, d_model)
    residual = torch.tensor([[1.0, 1], [1.0, 0], [0.0, 1]])  # x
    vectors, resultant = baselines.transformed_vectors(alpha, projected, residual)
    # query 2: T(x0) = .5·[2,0]; T(x1) = .25·[0,2]; T(x2) = .25·[-2,0] + x2
    assert torch.allclose(vectors[2], torch.tensor([[1.0, 0], [0.0, 0.5], [-0.5, 1]]))
    assert torch.allclose(resultant[2], torch.tensor([0.5, 1.5]))
    # query 0 sees only itself: T(x0) = ṽ0 + x0
    assert torch.allclose(vectors[0], torch.tensor([[3.0, 1], [0, 0], [0, 0]]))
    # a frozen norm scale of 2 and an output bias [1, 0]: every attention write doubled, the residual not; N(b) = [2, 0]
    vectors, resultant = baselines.transformed_vectors(
        alpha, projected, residual, slice(2, 3), landing=FrozenNorm(torch.full((3,), 2.0)), bias=torch.tensor([1.0, 0])
    )
    assert torch.allclose(vectors[0], torch.tensor([[2.0, 0], [0.0, 1], [-1.0, 1]]))
    assert torch.allclose(resultant[0], torch.tensor([3.0, 2]))


def test_alti_contributions_of_a_three_token_case_worked_by_hand():
    vectors = torch.tensor(
        [
            [[3.0, 4], [0, 0], [0, 0]],  # y = [3, 4]: all of it from token 0
            [[1.0, 0], [0, 1], [0, 0]],  # y = [1, 1]: c = 2 - 1 for tokens 0 and 1, 2 - 2 = 0 for token 2
            [[2.0, 0], [1, 1], [-1, 0]],  # y = [2, 1], |y| = 3: c = 3 - 1, 3 - 1, and 3 - 4 < 0 clipped to 0
        ]
    )
    expected = torch.tensor([[1.0, 0, 0], [0.5, 0.5, 0], [0.5, 0.5, 0]])
    assert torch.allclose(baselines.alti_contributions(vectors, vectors.sum(1)), expected)


def _model_states(bundle, ids):
    """Per layer, from test-only hooks: the layer's input x, what its attention adds to the residual stream (the output
    projection's result, through the attention norm where the layout has one) and the input of the norm before the
    MLP (h in a pre_norm layout; x in a parallel one)."""
    arch = bundle.arch
    layout = architectures.layout_of(bundle.model.config, arch)
    inputs, writes, mids, handles = {}, {}, {}, []

    def keep(into, layer, take):
        return lambda module, args, output: into.__setitem__(layer, take(args, output)[0])

    for layer, module in enumerate(architectures.layer_modules(bundle.model, arch)):
        written = architectures.submodule(module, arch.attention_norm if layout == "sandwich" else arch.out_proj)
        handles.append(module.register_forward_hook(keep(inputs, layer, lambda a, o: a[0]), prepend=True))
        main = lambda a, o: o[0] if isinstance(o, tuple) else o  # noqa: E731
        handles.append(written.register_forward_hook(keep(writes, layer, main)))
        if arch.mid:
            mid = architectures.submodule(module, arch.mid)
            handles.append(mid.register_forward_hook(keep(mids, layer, lambda a, o: a[0])))
    try:
        with torch.inference_mode():
            bundle.model(input_ids=torch.tensor([ids]), use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return inputs, writes, mids


@pytest.mark.parametrize("family", ["llama", "gemma3_text", "qwen2", "olmo2", "granite"])
def test_alti_resultant_is_the_residual_stream_after_attention(family):
    bundle = (
        make_tiny(family)
        if family in ("llama", "qwen2")
        else cwviz.bundle_from_model(family_model(family), CharTokenizer(100))
    )
    ids = list(range(3, 15))
    analysis = cwviz.analyze(bundle, input_ids=ids)
    inputs, writes, _ = _model_states(bundle, ids)
    layout = architectures.layout_of(bundle.model.config, bundle.arch)
    assert (layout == "sandwich") == (family in ("gemma3_text", "olmo2"))
    arch = bundle.arch
    multiplier = getattr(bundle.model.config, arch.residual_multiplier, 1.0) if arch.residual_multiplier else 1.0
    maps = baselines.alti_maps(analysis)
    for layer, part in enumerate(baselines.alti_layers(analysis)):
        alpha, projected = analysis.attention_tensor(layer), baselines.projected_values(analysis, layer)
        bias = getattr(bundle.out_projections[layer], "bias", None)
        vectors, resultant = baselines.transformed_vectors(
            alpha, projected, part.residual, landing=part.landing, bias=None if bias is None else bias.detach()
        )
        x = inputs[layer].float()
        assert torch.allclose(part.residual, x)  # the residual entering the layer, the model's own
        assert torch.allclose(resultant, x + multiplier * writes[layer].float(), atol=1e-4, rtol=1e-4)
        assert torch.count_nonzero(torch.triu(vectors.abs().sum(-1), diagonal=1)) == 0  # causal: no future source
        assert torch.allclose(maps[layer].sum(-1), torch.ones(len(ids)), atol=1e-5)


@pytest.mark.parametrize("parallel", [True, False])
def test_alti_and_the_recorder_read_the_layout_that_layout_of_gives(parallel):
    """GPT-NeoX with and without ``use_parallel_residual``: one row, two layouts. The recorder reads the one
    :func:`layout_of` gives (its h makes every row of M sum to 1; a parallel layer read as pre_norm would take the MLP
    norm's input x for h), and ALTI's resultant is the model's own x + (a + b_O), in a pre_norm layer the MLP norm's
    input h."""
    model = family_model("gpt_neox", use_parallel_residual=parallel).eval()
    bundle = cwviz.bundle_from_model(model, CharTokenizer(100))
    ids = list(range(3, 12))
    layout = architectures.layout_of(model.config, bundle.arch)
    assert layout == ("parallel" if parallel else "pre_norm")
    analysis = cwviz.analyze(bundle, input_ids=ids, stream=True)
    assert analysis.stream.layout == layout and residual.layout_for(bundle).name == layout
    inputs, writes, mids = _model_states(bundle, ids)
    for layer, part in enumerate(baselines.alti_layers(analysis)):
        np.testing.assert_allclose(mixing(analysis, layer).sum(1), 1, atol=1e-5)
        with torch.inference_mode():
            alpha, projected = analysis.attention_tensor(layer), baselines.projected_values(analysis, layer)
            bias = bundle.out_projections[layer].bias
            _, resultant = baselines.transformed_vectors(alpha, projected, part.residual, None, part.landing, bias)
        assert torch.allclose(resultant, inputs[layer] + writes[layer], atol=1e-5)
        if parallel:  # the MLP reads x: its norm's input is no post-attention state
            assert torch.allclose(mids[layer], inputs[layer])
        else:
            assert torch.allclose(resultant, mids[layer], atol=1e-5)
    for row in baselines.alti_maps(analysis):
        assert torch.allclose(row.sum(-1), torch.ones(len(ids)), atol=1e-5)


def test_scores_of_the_three_baselines_on_a_tiny_model():
    bundle = make_tiny("llama")
    analysis = cwviz.analyze(bundle, input_ids=list(range(5, 15)))
    t = 9
    raw = baselines.raw_attention(analysis, t)
    assert np.allclose(raw, analysis.attention(analysis.num_layers - 1)[:, t].mean(0))
    for name, method in baselines.BASELINES.items():
        scores = method(analysis, t)
        assert scores.shape == (10,) and scores.dtype == np.float32, name
        assert np.isclose(scores.sum(), 1.0, atol=1e-5) and (scores >= 0).all(), name  # rows of every map sum to 1
    only = cwviz.analyze(bundle, input_ids=list(range(5, 15))[:3])
    assert np.allclose(baselines.alti(only, 0), [1, 0, 0])  # the first token sees only itself
