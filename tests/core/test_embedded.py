"""Integration on the embedded SmolLM2-135M-Instruct: offline load, cache, identities on a real prompt."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import cwviz
from cwviz.analyses.tables import decomposition
from cwviz.core.loading import checkpoints
from cwviz.core.method.export import to_dict, to_json
from cwviz.core.method.measures import expand_kv

PROMPT = "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May."


def test_embedded_loads_offline_from_the_cache(embedded, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def no_conversion():
        raise AssertionError("the second load must come from the safetensors cache, not the GGUF file")

    monkeypatch.setattr(checkpoints, "embedded_gguf", no_conversion)
    again = cwviz.load_model("embedded", device="cpu")
    assert list(checkpoints.embedded_dir().glob("*.safetensors"))
    assert again.info == embedded.info
    assert (again.info.architecture, again.info.layers, again.info.heads, again.info.kv_heads) == ("llama", 30, 9, 3)
    assert again.info.dtype == "float32" and again.info.device == "cpu"


def test_real_prompt_satisfies_the_identities(embedded):
    analysis = cwviz.analyze(embedded, PROMPT)
    assert analysis.num_tokens == len(analysis.tokens) == len(analysis.input_ids) > 10
    assert "".join(analysis.tokens).replace("␣", " ") == PROMPT
    for layer in (0, 14, 29):
        intra = analysis.contributions(layer, "intra")
        inter = analysis.contributions(layer, "inter")
        np.testing.assert_allclose(intra.sum(-1), 1, atol=1e-4)
        np.testing.assert_allclose(inter.sum((0, 2)), 1, atol=1e-4)
        # Destructive interference exists in a real model.
        assert inter.min() < 0
    assert np.isfinite(analysis.perplexity) and analysis.perplexity > 1


def test_real_prompt_matches_the_model_write(embedded):
    analysis = cwviz.analyze(embedded, PROMPT)
    layer = 20
    seen = {}
    proj = embedded.out_projections[layer]
    handle = proj.register_forward_pre_hook(lambda m, args: seen.setdefault("z", args[0][0].clone()))
    try:
        with torch.inference_mode():
            embedded.model(input_ids=torch.tensor([analysis.input_ids]))
    finally:
        handle.remove()
    alpha_v = analysis.attention_tensor(layer) @ analysis.values(layer)
    z = alpha_v.permute(1, 0, 2).reshape(analysis.num_tokens, -1)
    torch.testing.assert_close(z, seen["z"], rtol=1e-5, atol=1e-5)


def test_decomposition_multiplies_out(embedded):
    analysis = cwviz.analyze(embedded, PROMPT)
    table = decomposition(analysis, 12, query=10)
    assert list(table.columns) == [
        "layer",
        "head",
        "query",
        "key",
        "token",
        "attention",
        "value_norm",
        "output_norm",
        "norm_ratio",
        "cosine",
        "contribution",
    ]
    assert len(table) == analysis.num_heads * 11  # keys 0..10 for every head
    np.testing.assert_allclose(
        table.attention * table.norm_ratio * table.cosine, table.contribution, rtol=1e-4, atol=1e-7
    )
    np.testing.assert_allclose(table.contribution.sum(), 1, atol=1e-4)  # inter: over heads and keys
    intra = decomposition(analysis, 12, query=10, head=3, kind="intra")
    np.testing.assert_allclose(intra.contribution.sum(), 1, atol=1e-4)


def test_json_export_schema(embedded, tmp_path):
    import json

    analysis = cwviz.analyze(embedded, "The capital of France is")
    path = to_json(analysis, tmp_path / "a.json", layers=[0, 3])
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["schema"] == "cwviz.analysis" and data["tokens"] == analysis.tokens
    assert [l["layer"] for l in data["layers"]] == [0, 3]
    head = data["layers"][1]["heads"][2]
    assert [len(row) for row in head["attention"]] == list(range(1, analysis.num_tokens + 1))
    np.testing.assert_allclose(head["attention"][-1], analysis.attention(3)[2, -1], atol=1e-6)
    np.testing.assert_allclose(head["contribution_inter"][-1], analysis.contributions(3)[2, -1], atol=1e-6)
    total = sum(
        sum(h["contribution_inter"][-1])
        for h in to_dict(cwviz.analyze(embedded, "The capital of France is"), layers=[3])["layers"][0]["heads"]
    )
    assert total == pytest.approx(1, abs=1e-4)


def test_long_prompt_matches_eager_attention_and_the_model_write(embedded):
    """Past one causal row block (about 300 tokens: five blocks of 64 rows), attention equals that of
    transformers' own eager implementation on the recorded queries and keys, Σ_j α ṽ_j equals what o_proj
    receives, and both contribution kinds sum to one. (No ``output_attentions``: it would leave
    transformers' output-capturing hooks on the shared model.)"""
    from transformers.models.llama.modeling_llama import eager_attention_forward

    ids = embedded.tokenizer(" ".join([PROMPT] * 12))["input_ids"]
    tokens = len(ids)
    assert tokens > 256
    analysis = cwviz.analyze(embedded, input_ids=ids)
    layer = 9
    rec = analysis.layer_record(layer)
    causal_mask = torch.full((tokens, tokens), float("-inf")).triu(1)[None, None]
    _, eager = eager_attention_forward(
        embedded.attention_modules[layer], rec.query[None], rec.key[None], rec.value[None], causal_mask, rec.scaling
    )
    torch.testing.assert_close(analysis.attention_tensor(layer), eager[0], rtol=1e-5, atol=1e-6)
    seen = {}
    handle = embedded.out_projections[layer].register_forward_pre_hook(
        lambda m, args: seen.setdefault("z", args[0][0].clone())
    )
    try:
        with torch.inference_mode():
            embedded.model(input_ids=torch.tensor([ids]), use_cache=False)
    finally:
        handle.remove()
    alpha_v = analysis.attention_tensor(layer) @ expand_kv(rec.value.float(), analysis.num_heads)
    torch.testing.assert_close(alpha_v.permute(1, 0, 2).reshape(tokens, -1), seen["z"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(analysis.contributions(layer, "intra").sum(-1), 1, atol=1e-4)
    np.testing.assert_allclose(analysis.contributions(layer, "inter").sum((0, 2)), 1, atol=1e-4)
