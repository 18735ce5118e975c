"""Invariants on tiny random models of every supported architecture (built from configs, no downloads).

Every family of the table and a few that run through a derived row (tests/helpers FAMILY_CONFIGS) is
checked against transformers' own eager attention and logits; soft-capping, learned sinks and alternating
windows are also checked against a hand computation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest
import torch

import cwviz
from cwviz.analyses import sinks as sinks_analyses
from cwviz.analyses.tables import decomposition
from cwviz.core.loading import architectures
from cwviz.core.method.export import to_dict
from cwviz.core.method.interventions import KeepKeys, ScaleValues, batch_perplexity, logits
from cwviz.core.method.logprobs import logprobs_from_hidden
from cwviz.core.method.measures import expand_kv
from cwviz.core.util.errors import UnsupportedModelError
from tests.helpers import DERIVED_FAMILIES, FAMILY_CONFIGS, TEXT, CharTokenizer, family_model, window


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
            bias = getattr(module, "bias", None)  # b_O: not any token's contribution (docs/METHOD.md section 1)
            out = output[0].detach().clone()
            seen[layer]["out"] = out - bias if bias is not None else out

        handles += [proj.register_forward_pre_hook(pre), proj.register_forward_hook(post)]
    try:
        analysis = cwviz.analyze(bundle, text)
    finally:
        for handle in handles:
            handle.remove()
    return analysis, seen


@dataclass(frozen=True)
class Run:
    """One tiny model of a family, analysed once, with what transformers' eager attention gives."""

    bundle: cwviz.Bundle
    analysis: cwviz.Analysis
    seen: dict  # per layer: the output projection's input and output (minus b_O)
    ids: torch.Tensor  # (1, T)
    eager_attention: tuple  # per layer (1, H, T, T)
    eager_logits: torch.Tensor  # (1, T, vocab) or the encoder's output
    plain_logits: torch.Tensor  # the same through cwviz's attention outside an analysis


def _outputs(model, ids, **kwargs):
    out = model(input_ids=ids, **kwargs)
    return out.logits if hasattr(out, "logits") else out[0]


@pytest.fixture(scope="module", params=list(FAMILY_CONFIGS))
def run(request) -> Run:
    """Each family's tiny model (:data:`tests.helpers.FAMILY_CONFIGS`), built and analysed once for the module."""
    model = family_model(request.param)
    bundle = cwviz.bundle_from_model(model, CharTokenizer(100), model_id=f"tiny-{request.param}")
    analysis, seen = model_writes(bundle, TEXT)
    ids = torch.tensor([analysis.input_ids])
    with torch.inference_mode():
        plain = _outputs(model, ids)
        model.set_attn_implementation("eager")
        try:
            eager = model(input_ids=ids, output_attentions=True)
        finally:
            model.set_attn_implementation("cwviz")
    logits = eager.logits if hasattr(eager, "logits") else eager[0]
    return Run(bundle, analysis, seen, ids, tuple(eager.attentions), logits, plain)


def test_attention_equals_transformers_eager_attention(run):
    analysis = run.analysis
    assert len(run.eager_attention) == analysis.num_layers
    for layer in range(analysis.num_layers):
        np.testing.assert_allclose(
            analysis.attention(layer), run.eager_attention[layer][0].numpy(), rtol=1e-5, atol=1e-6
        )
        if run.bundle.arch.causal:
            assert np.all(np.triu(analysis.attention(layer), 1) == 0)


def test_contributions_sum_to_one(run):
    analysis = run.analysis
    for layer in range(analysis.num_layers):
        np.testing.assert_allclose(analysis.contributions(layer, "intra").sum(-1), 1, atol=1e-5)
        np.testing.assert_allclose(analysis.contributions(layer, "inter").sum((0, 2)), 1, atol=1e-5)
        attention = analysis.attention(layer).sum(-1)
        if run.bundle.model.config.model_type == "gpt_oss":  # learned sinks take the rest of every row
            assert np.all(attention < 1 - 1e-4)
            np.testing.assert_allclose(attention + analysis.learned_sink_attention(layer), 1, atol=1e-5)
        else:
            np.testing.assert_allclose(attention, 1, atol=1e-5)
            assert np.all(analysis.learned_sink_attention(layer) == 0)


def test_weighted_values_are_the_output_projection_input(run):
    analysis, seen = run.analysis, run.seen
    heads, tokens = analysis.num_heads, analysis.num_tokens
    for layer in range(analysis.num_layers):
        m = analysis.layer(layer)
        # Σ_j α_ij^h v_j^h, from cwviz's attention and recorded values, is the model's own per-head
        # write (o_proj input) ...
        alpha_v = analysis.attention_tensor(layer) @ expand_kv(analysis.layer_record(layer).value.float(), heads)
        z = alpha_v.permute(1, 0, 2).reshape(tokens, -1)
        torch.testing.assert_close(z, seen[layer]["z"], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(m.head_output, alpha_v, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(analysis.head_outputs(layer), alpha_v, rtol=1e-5, atol=1e-5)
        # ... and Σ_h W_O^h z^h the o_proj output without its bias.
        output = torch.einsum("hqd,hmd->qm", alpha_v, analysis.w_heads(layer))
        torch.testing.assert_close(output, seen[layer]["out"], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(m.output_norm, seen[layer]["out"].norm(dim=-1), rtol=1e-5, atol=1e-5)


def test_capture_leaves_logits_unchanged(run):
    bundle, ids, eager = run.bundle, run.ids, run.eager_logits
    torch.testing.assert_close(run.plain_logits, eager, rtol=1e-5, atol=1e-5)
    with torch.inference_mode():
        torch.testing.assert_close(_outputs(bundle.model, ids), eager, rtol=1e-5, atol=1e-5)  # clean after analyses
    if not bundle.arch.causal:
        return
    # The intervention path with nothing changed gives the clean logits too.
    keep_all = KeepKeys({}, default=torch.ones(1))
    torch.testing.assert_close(logits(bundle, ids, keep_all), eager, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits(bundle, ids, ScaleValues((0,), 1.0)), eager, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits(bundle, ids), eager, rtol=1e-5, atol=1e-5)


def test_logprobs_are_the_logits_log_softmax(run):
    bundle, ids = run.bundle, run.ids
    if not bundle.arch.causal:
        assert run.analysis.next_token_logprobs.size == 0 and not bundle.has_logits
        return
    expected = torch.log_softmax(run.eager_logits[0, :-1], -1).gather(1, ids[0, 1:, None])[:, 0]
    np.testing.assert_allclose(run.analysis.next_token_logprobs, expected.numpy(), rtol=1e-5, atol=1e-5)
    with torch.inference_mode():
        hidden = bundle.final_hidden(ids)[0]
        torch.testing.assert_close(bundle.output_logits(hidden), run.eager_logits[0], rtol=1e-5, atol=1e-5)
        # Deferred output layer, a few rows at a time, gives the logits' log-probabilities.
        chunked = logprobs_from_hidden(hidden, bundle.output_logits, ids[0], chunk=2)
    np.testing.assert_allclose(chunked.numpy(), expected.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(batch_perplexity(bundle, ids[0].tolist()), [run.analysis.perplexity], rtol=1e-5)


def test_rows_are_derived_only_for_model_types_not_in_the_table(run):
    model_type = run.bundle.model.config.model_type
    assert run.bundle.arch.derived == (model_type in DERIVED_FAMILIES)
    assert (model_type in architectures.ARCHITECTURES) != (model_type in DERIVED_FAMILIES)
    record, info = run.analysis.layer_record(0), run.bundle.info
    assert (info.heads, info.kv_heads, info.d_head) == (
        record.query.shape[0],
        record.key.shape[0],
        record.value.shape[-1],
    )


def test_model_info_reports_geometry(tiny):
    info = tiny.info
    assert info.layers == 2 and info.heads == 4
    assert info.kv_heads == tiny.model.config.to_dict().get("num_key_value_heads", 4)
    assert info.d_model == 64
    assert info.d_head * info.heads == architectures.out_proj_weight(tiny.out_projections[0], tiny.arch).shape[1]


# -- refusals and derived rows -------------------------------------------------------------------------
def test_state_space_and_encoder_decoder_models_are_refused_with_the_reason():
    import transformers

    mamba = transformers.AutoModelForCausalLM.from_config(
        transformers.MambaConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, state_size=4)
    )
    with pytest.raises(UnsupportedModelError, match="'mamba'.*state-space.*no attention.*llama"):
        cwviz.bundle_from_model(mamba, None)
    t5 = transformers.AutoModelForSeq2SeqLM.from_config(
        transformers.T5Config(vocab_size=50, d_model=16, d_kv=4, d_ff=16, num_layers=1, num_heads=2)
    )
    with pytest.raises(UnsupportedModelError, match="'t5'.*encoder-decoder.*cross-attention"):
        cwviz.bundle_from_model(t5, None)


def test_a_refused_model_is_refused_before_its_weights_load(tmp_path):
    import transformers

    transformers.MambaConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, state_size=4).save_pretrained(tmp_path)
    with pytest.raises(UnsupportedModelError, match="state-space"):
        cwviz.load_model(str(tmp_path), device="cpu")  # the folder has no weights: refused from the config alone


def test_a_derived_row_whose_probe_fails_is_refused():
    model = family_model("phi")
    # Something between the heads and W_O (here: doubling the projection's input in layer 1) means the layer's
    # write is no longer the heads' weighted values; the load-time probe sees it.
    handle = model.model.layers[1].self_attn.dense.register_forward_pre_hook(lambda module, args: (args[0] * 2,))
    try:
        with pytest.raises(UnsupportedModelError, match="'phi'.*probe failed.*layer 1.*self_attn.dense"):
            cwviz.bundle_from_model(model, CharTokenizer(100))
    finally:
        handle.remove()
    assert cwviz.bundle_from_model(model, CharTokenizer(100)).arch.derived


def test_a_model_type_without_a_named_output_projection_is_refused(monkeypatch):
    from cwviz.core.loading import derive

    monkeypatch.setattr(derive, "PROJECTION_NAMES", ("no_such_projection",))
    with pytest.raises(UnsupportedModelError, match="'opt'.*no output projection named no_such_projection"):
        cwviz.bundle_from_model(family_model("opt"), CharTokenizer(100))


# -- soft-capping, learned sinks and per-layer windows against a hand computation ---------------------


def by_hand(record, visible: np.ndarray, softcap: float | None = None, learned_sinks: np.ndarray | None = None):
    """α [head, query, key] and the learned sink's share [head, query], in float64 from the recorded q and k."""
    query = record.query.double().numpy()
    key = expand_kv(record.key.double(), query.shape[0]).numpy()
    scores = query @ key.transpose(0, 2, 1) * record.scaling  # (H, Q, K)
    if softcap is not None:
        scores = softcap * np.tanh(scores / softcap)
    scores = np.where(visible, scores, -np.inf)
    sink = (
        np.full(scores.shape[:2], -np.inf)
        if learned_sinks is None
        else np.broadcast_to(learned_sinks[:, None], scores.shape[:2])
    )
    peak = np.maximum(scores.max(-1), sink)
    weights, sink_weight = np.exp(scores - peak[..., None]), np.exp(sink - peak)
    total = weights.sum(-1) + sink_weight
    return weights / total[..., None], sink_weight / total


def test_soft_capping_is_the_softmax_of_the_capped_scores():
    bundle = cwviz.bundle_from_model(family_model("gemma2"), CharTokenizer(100))
    analysis = cwviz.analyze(bundle, TEXT[:14])
    config, t = bundle.model.config, analysis.num_tokens
    for layer, size in ((0, config.sliding_window), (1, None)):  # Gemma 2 alternates sliding and global layers
        record = analysis.layer_record(layer)
        assert record.softcap == config.attn_logit_softcapping and record.scaling == pytest.approx(
            config.query_pre_attn_scalar**-0.5
        )
        expected, _ = by_hand(record, window(t, size), softcap=record.softcap)
        np.testing.assert_allclose(analysis.attention(layer), expected, atol=1e-6)
        uncapped, _ = by_hand(record, window(t, size))
        assert np.abs(uncapped - expected).max() > 1e-2  # the cap matters in this model
        np.testing.assert_allclose(analysis.contributions(layer, "intra").sum(-1), 1, atol=1e-5)


def test_learned_sinks_take_their_share_and_write_nothing():
    bundle = cwviz.bundle_from_model(family_model("gpt_oss"), CharTokenizer(100))
    analysis = cwviz.analyze(bundle, TEXT[:14])
    t = analysis.num_tokens
    assert analysis.has_learned_sinks
    for layer, size in ((0, bundle.model.config.sliding_window), (1, None)):  # sliding and global layers
        sinks = bundle.model.model.layers[layer].self_attn.sinks.detach().double().numpy()
        expected, share = by_hand(analysis.layer_record(layer), window(t, size), learned_sinks=sinks)
        np.testing.assert_allclose(analysis.attention(layer), expected, atol=1e-6)
        np.testing.assert_allclose(analysis.learned_sink_attention(layer), share, atol=1e-6)
        assert np.all(analysis.attention(layer).sum(-1) < 1) and share.min() > 1e-3
        # The learned sink writes nothing: the real keys' contributions sum to 1.
        np.testing.assert_allclose(analysis.contributions(layer, "intra").sum(-1), 1, atol=1e-5)
        np.testing.assert_allclose(analysis.contributions(layer, "inter").sum((0, 2)), 1, atol=1e-5)
    table = sinks_analyses.sink_table(analysis)
    for layer in range(analysis.num_layers):
        rows = table[table["layer"] == layer]
        share = analysis.learned_sink_attention(layer)[rows["head"].to_numpy(), rows["query"].to_numpy()]
        np.testing.assert_allclose(rows["learned_sink_share"], share, atol=1e-6)
    summary = sinks_analyses.sink_layer_summary(table)
    assert (summary["learned_sink_share"] > 0).all()
    # The JSON export carries the share beside the attention rows: together they sum to 1.
    for entry in json.loads(json.dumps(to_dict(analysis)))["layers"]:
        for head in entry["heads"]:
            shown = np.array(head["learned_sink_attention"])
            np.testing.assert_allclose(shown, analysis.learned_sink_attention(entry["layer"])[head["head"]], rtol=1e-5)
            np.testing.assert_allclose([sum(row) for row in head["attention"]] + shown, 1, atol=1e-5)
    plain = cwviz.analyze(cwviz.bundle_from_model(family_model("llama"), CharTokenizer(100)), TEXT[:14])
    assert not plain.has_learned_sinks and (sinks_analyses.sink_table(plain)["learned_sink_share"] == 0).all()
    assert all("learned_sink_attention" not in head for entry in to_dict(plain)["layers"] for head in entry["heads"])


@pytest.mark.parametrize(
    ("model_type", "windows", "overrides"),
    [
        ("gemma3_text", (4, None), {}),  # layer_types: sliding, full
        ("gpt_oss", (4, None), {}),
        ("mistral", (8, 8), {}),
        # windows from layer 1 on
        ("qwen2", (None, 5), dict(use_sliding_window=True, sliding_window=5, max_window_layers=1)),
        ("modernbert", (None, 4), {}),  # global every 2 layers from layer 0; local: 2 keys each side
    ],
)
def test_each_layer_attends_within_its_own_window(model_type, windows, overrides):
    bundle = cwviz.bundle_from_model(family_model(model_type, **overrides), CharTokenizer(100))
    analysis = cwviz.analyze(bundle, TEXT[:20])
    t, causal = analysis.num_tokens, bundle.arch.causal
    for layer, size in enumerate(windows):
        record = analysis.layer_record(layer)
        visible = window(t, size, causal)
        np.testing.assert_array_equal(record.key_mask().numpy(), visible)
        expected, _ = by_hand(
            record,
            visible,
            learned_sinks=None if record.learned_sinks is None else record.learned_sinks.double().numpy(),
        )
        np.testing.assert_allclose(analysis.attention(layer), expected, atol=1e-6)
        assert np.all(analysis.attention(layer)[:, ~visible] == 0)
        keys = set(decomposition(analysis, layer, t - 1)["key"])
        assert keys == set(np.flatnonzero(visible[t - 1]))


def test_scaled_attention_is_the_models_own_scaling():
    granite = cwviz.bundle_from_model(family_model("granite"), CharTokenizer(100))
    analysis = cwviz.analyze(granite, TEXT[:10])
    assert [analysis.layer_record(layer).scaling for layer in range(analysis.num_layers)] == pytest.approx(
        [granite.model.config.attention_multiplier] * analysis.num_layers
    )


@pytest.mark.parametrize("model_type", ["gpt_oss", "gemma2", "llama"])
def test_weighted_values_in_row_blocks_are_the_whole_computation(model_type, monkeypatch):
    from cwviz.core.method import row_block_sizes

    bundle = cwviz.bundle_from_model(family_model(model_type), CharTokenizer(100))
    ids = torch.tensor([bundle.tokenizer(TEXT[:20])["input_ids"]])
    t = ids.shape[1]
    keep = KeepKeys({0: (torch.rand(t, t, generator=torch.Generator().manual_seed(0)) > 0.3).float()})
    whole = logits(bundle, ids), logits(bundle, ids, keep)
    monkeypatch.setattr(row_block_sizes, "WEIGHTED_ROW_BLOCK_CELLS", 1)  # one query row a block
    blocked = logits(bundle, ids), logits(bundle, ids, keep)
    for a, b in zip(whole, blocked):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(whole[0], whole[1])  # the mask changed something


def test_a_model_type_without_a_row_loads_with_the_head_its_checkpoint_names():
    import transformers

    from cwviz.core.loading.models import auto_class_name

    def config(model_type, **kwargs):
        return transformers.AutoConfig.for_model(model_type, **kwargs)

    assert auto_class_name(config("phi"), None) == "AutoModelForCausalLM"
    assert auto_class_name(config("camembert"), None) == "AutoModelForMaskedLM"  # an encoder with a decoder variant
    assert auto_class_name(config("camembert", is_decoder=True), None) == "AutoModelForCausalLM"
    assert auto_class_name(config("camembert", architectures=["CamembertForCausalLM"]), None) == "AutoModelForCausalLM"
    assert auto_class_name(config("llama"), architectures.ARCHITECTURES["llama"]) == "AutoModelForCausalLM"
    assert auto_class_name(config("bert"), architectures.ARCHITECTURES["bert"]) == "AutoModelForMaskedLM"


def test_a_model_type_whose_attention_bypasses_the_interface_is_refused():
    import transformers

    config = transformers.AutoConfig.for_model("bloom", vocab_size=100, hidden_size=32, n_head=4, n_layer=2)
    with pytest.raises(
        UnsupportedModelError, match="'bloom'.*no module of the base model calls transformers' AttentionInterface"
    ):
        cwviz.bundle_from_model(transformers.AutoModelForCausalLM.from_config(config), CharTokenizer(100))


@pytest.mark.parametrize("model_type", ["granite", "cohere", "gemma2", "gpt_oss"])
def test_a_derived_row_equals_the_table_row(model_type, monkeypatch):
    """Without its row, a family's derived row finds the same layout and the logit scaling its config names."""
    row = architectures.ARCHITECTURES[model_type]
    monkeypatch.delitem(architectures.ARCHITECTURES, model_type)
    bundle = cwviz.bundle_from_model(family_model(model_type), CharTokenizer(100))
    assert bundle.arch.derived
    fields = ("layers", "attention", "out_proj", "conv1d", "causal", "logit_scale", "logit_divisor", "logit_softcap")
    assert [getattr(bundle.arch, f) for f in fields] == [getattr(row, f) for f in fields]
    analysis = cwviz.analyze(bundle, TEXT[:16])
    ids = torch.tensor([analysis.input_ids])
    with torch.inference_mode():
        expected = torch.log_softmax(bundle.model(input_ids=ids).logits[0, :-1], -1).gather(1, ids[0, 1:, None])[:, 0]
    np.testing.assert_allclose(analysis.next_token_logprobs, expected.numpy(), rtol=1e-5, atol=1e-5)


def test_a_derived_row_whose_logits_are_not_its_output_layers_is_refused():
    model = family_model("phi")
    model.config.logit_scale = 3.0  # a scaling the config names and the model does not apply
    with pytest.raises(UnsupportedModelError, match="'phi'.*logits are not its output layer"):
        cwviz.bundle_from_model(model, CharTokenizer(100))
