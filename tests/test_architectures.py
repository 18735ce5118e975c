"""Invariants on tiny random models of every supported architecture (built from configs, no downloads)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import cwviz
from cwviz.core import architectures
from cwviz.core.analysis import next_token_logprobs
from cwviz.core.errors import UnsupportedModelError
from cwviz.core.interventions import KeepKeys, ScaleValues, logits
from cwviz.core.measures import expand_kv

from .conftest import TEXT


def model_writes(bundle, text):
    """The model's own attention writes, read with test-only hooks on the output projections.

    Returns per layer (o_proj input [T, heads * d_head], o_proj output minus b_O [T, d_model]).
    """
    seen = {}
    handles = []
    for layer, proj in enumerate(bundle.out_projections):

        def pre(module, args, layer=layer):
            seen.setdefault(layer, {})["z"] = args[0][0].detach().clone()

        def post(module, args, output, layer=layer):
            bias = architectures.out_proj_bias(module)
            out = output[0].detach().clone()
            seen[layer]["out"] = out - bias if bias is not None else out

        handles += [proj.register_forward_pre_hook(pre), proj.register_forward_hook(post)]
    try:
        analysis = cwviz.analyze(bundle, text)
    finally:
        for handle in handles:
            handle.remove()
    return analysis, seen


def test_identities_on_every_architecture(tiny):
    analysis, seen = model_writes(tiny, TEXT)
    heads, tokens = analysis.num_heads, analysis.num_tokens
    for layer in range(analysis.num_layers):
        m = analysis.layer(layer)
        # Σ_j α_ij^h v_j^h, from cwviz's attention and recorded values, is the model's own per-head
        # write (o_proj input) ...
        alpha_v = analysis.attention_tensor(layer) @ expand_kv(analysis.records[layer].value.float(), heads)
        z = alpha_v.permute(1, 0, 2).reshape(tokens, -1)
        torch.testing.assert_close(z, seen[layer]["z"], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(m.head_output, alpha_v, rtol=1e-5, atol=1e-5)
        # ... and Σ_h W_O^h z^h the o_proj output without its bias.
        output = torch.einsum("hqd,hmd->qm", alpha_v, analysis.w_heads(layer))
        torch.testing.assert_close(output, seen[layer]["out"], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(m.output_norm, seen[layer]["out"].norm(dim=-1), rtol=1e-5, atol=1e-5)
        # Contribution weights sum to one: per head (intra), over heads and keys (inter).
        np.testing.assert_allclose(analysis.contributions(layer, "intra").sum(-1), 1, atol=1e-5)
        np.testing.assert_allclose(analysis.contributions(layer, "inter").sum((0, 2)), 1, atol=1e-5)
        attention = analysis.attention(layer)
        np.testing.assert_allclose(attention.sum(-1), 1, atol=1e-5)
        if tiny.arch.causal:
            assert np.all(np.triu(attention, 1) == 0)
        assert attention.shape == (heads, tokens, tokens)


def test_capture_leaves_logits_unchanged(tiny):
    ids = torch.tensor([tiny.tokenizer(TEXT)["input_ids"]])
    with torch.inference_mode():
        captured = cwviz.analyze(tiny, TEXT)
        plain_cwviz = tiny.model(input_ids=ids).logits
        tiny.model.set_attn_implementation("eager")
        try:
            eager = tiny.model(input_ids=ids).logits
        finally:
            tiny.model.set_attn_implementation("cwviz")
    if tiny.arch.causal:
        logprobs = torch.log_softmax(eager[0, :-1], -1).gather(1, ids[0, 1:, None])[:, 0]
        np.testing.assert_allclose(captured.next_token_logprobs, logprobs.numpy(), rtol=1e-5, atol=1e-5)
        # Deferred output layer, a few rows at a time, gives the logits' log-probabilities.
        with torch.inference_mode():
            hidden = tiny.final_hidden(ids)[0]
            chunked = next_token_logprobs(hidden, tiny.model.get_output_embeddings(), ids[0], chunk=2)
        np.testing.assert_allclose(chunked.numpy(), logprobs.numpy(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(plain_cwviz, eager, rtol=1e-5, atol=1e-5)
    # The intervention path with nothing changed gives the clean logits too.
    keep_all = KeepKeys({}, default=torch.ones(1))
    torch.testing.assert_close(logits(tiny, ids, keep_all), eager, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits(tiny, ids, ScaleValues((0,), 1.0)), eager, rtol=1e-5, atol=1e-5)
    # And the model is clean afterwards.
    torch.testing.assert_close(logits(tiny, ids), eager, rtol=1e-5, atol=1e-5)


def test_unsupported_architecture_lists_the_supported_ones():
    import transformers

    config = transformers.MambaConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, state_size=4)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with pytest.raises(UnsupportedModelError, match="mamba.*llama"):
        cwviz.bundle_from_model(model, None)


def test_model_info_reports_geometry(tiny):
    info = tiny.info
    assert info.layers == 2 and info.heads == 4
    assert info.kv_heads == tiny.model.config.to_dict().get("num_key_value_heads", 4)
    assert info.d_model == 64
    assert info.d_head * info.heads == architectures.out_proj_weight(tiny.out_projections[0], tiny.arch).shape[1]
