"""The baselines of docs/METHOD.md section 6.5: attention rollout and ALTI against 3-token cases worked by hand, and
ALTI's transformed vectors against the model's own residual stream on tiny random models."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import cwviz
from cwviz.core.loading import architectures
from cwviz.core.method import baselines
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
        alpha, projected, residual, rows=slice(2, 3), norm_scale=torch.full((3, 2), 2.0), bias=torch.tensor([1.0, 0])
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


def _attention_writes(bundle, ids):
    """What each layer's attention block adds to the residual stream, from test-only hooks: the output projection's
    result, through the block's attention-output norm where it has one."""
    writes, handles = {}, []
    for layer, block in enumerate(architectures.layer_modules(bundle.model, bundle.arch)):
        norm = baselines.attention_output_norm(bundle, block)
        module = norm if norm is not None else bundle.attention_modules[layer]
        handles.append(
            module.register_forward_hook(lambda m, i, o, layer=layer: writes.__setitem__(layer, (o[0] if isinstance(o, tuple) else o)[0]))
        )
    try:
        with torch.inference_mode():
            bundle.model(input_ids=torch.tensor([ids]), use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return writes


@pytest.mark.parametrize("family", ["llama", "gemma3_text", "qwen2", "olmo2", "granite"])
def test_alti_resultant_is_the_residual_stream_after_attention(family):
    bundle = make_tiny(family) if family in ("llama", "qwen2") else cwviz.bundle_from_model(family_model(family), CharTokenizer(100))
    ids = list(range(3, 15))
    analysis = cwviz.analyze(bundle, input_ids=ids)
    writes = _attention_writes(bundle, ids)
    blocks = architectures.layer_modules(bundle.model, bundle.arch)
    assert (baselines.attention_output_norm(bundle, blocks[0]) is not None) == (family in ("gemma3_text", "olmo2"))
    maps = baselines.alti_maps(analysis)
    for layer, x in enumerate(baselines.residual_streams(analysis)):
        alpha, projected = analysis.attention_tensor(layer), baselines.projected_values(analysis, layer)
        bias = getattr(bundle.out_projections[layer], "bias", None)
        norm = baselines.attention_output_norm(bundle, blocks[layer])
        scale = None
        if norm is not None:
            scale = baselines.rms_scale(norm, torch.einsum("hij,hjd->id", alpha, projected))
        if baselines.residual_multiplier(bundle) != 1.0:
            scale = (
                torch.full_like(x, baselines.residual_multiplier(bundle))
                if scale is None
                else scale * baselines.residual_multiplier(bundle)
            )
        vectors, resultant = baselines.transformed_vectors(
            alpha, projected, x, norm_scale=scale, bias=None if bias is None else bias.detach()
        )
        assert torch.allclose(resultant, x + baselines.residual_multiplier(bundle) * writes[layer].float(), atol=1e-4, rtol=1e-4)
        assert torch.count_nonzero(torch.triu(vectors.abs().sum(-1), diagonal=1)) == 0  # causal: no future source
        assert torch.allclose(maps[layer].sum(-1), torch.ones(len(ids)), atol=1e-5)


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
