"""Model families found by an audit of transformers 5.24 beyond the table's rows: each is analysed right (the same
identities as tests/core/test_architectures.py: attention equal to the model's eager attention, contributions summing to
1, the model's own logits) or refused with the reason. Tiny random models built from configs; no downloads."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

import cwviz
from cwviz.core.loading import architectures
from cwviz.core.loading.models import headless_encoder
from cwviz.core.method import memory
from cwviz.core.method.capture import forward_pass
from cwviz.core.util.errors import UnsupportedModelError
from tests.helpers import DECODER, ENCODER, CharTokenizer, save_with_tokenizer

TOKENS = 12
# tests/helpers' tiny shapes, with what these families' configs need besides (token ids, a head width, 2 layers).
_DECODER = dict(
    DECODER,
    vocab_size=100,
    num_hidden_layers=2,
    head_dim=16,
    max_position_embeddings=64,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
_ENCODER = dict(ENCODER, pad_token_id=1)


def tiny(model_type: str, auto: str, **kwargs):
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(model_type, **kwargs)
    return getattr(transformers, auto).from_config(config, dtype=torch.float32).eval()


def eager_outputs(model, ids):
    """The model's own eager attention maps (per layer, (1, H, T, T)) and its logits or last hidden states."""
    model.set_attn_implementation("eager")
    try:
        with torch.inference_mode():
            out = model(input_ids=ids, output_attentions=True)
    finally:
        model.set_attn_implementation("cwviz")
    return out.attentions, out.logits if hasattr(out, "logits") else out.last_hidden_state


def check_identities(bundle):
    """cwviz's attention is the model's eager attention, contributions sum to 1, and the logits (a causal LM's
    log-probabilities) are the model's own, through cwviz's attention as through eager attention."""
    ids = torch.arange(3, 3 + TOKENS)[None]  # (1, T)
    analysis = cwviz.analyze(bundle, input_ids=ids[0].tolist())
    attentions, expected = eager_outputs(bundle.model, ids)
    assert analysis.num_layers == len(attentions) == bundle.model.config.num_hidden_layers
    for layer in range(analysis.num_layers):
        np.testing.assert_allclose(analysis.attention(layer), attentions[layer][0].numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(analysis.contributions(layer, "intra").sum(-1), 1, atol=1e-5)
        np.testing.assert_allclose(analysis.contributions(layer, "inter").sum((0, 2)), 1, atol=1e-5)
    with torch.inference_mode():
        out = bundle.model(input_ids=ids)
    torch.testing.assert_close(
        out.logits if hasattr(out, "logits") else out.last_hidden_state, expected, rtol=1e-5, atol=1e-5
    )
    if bundle.arch.causal:
        logprobs = torch.log_softmax(expected[0, :-1], -1).gather(1, ids[0, 1:, None])[:, 0]
        np.testing.assert_allclose(analysis.next_token_logprobs, logprobs.numpy(), rtol=1e-5, atol=1e-5)
    return analysis


# -- one attention module run several times a pass (ALBERT) ---------------------------------------------------
def albert():
    return tiny("albert", "AutoModelForMaskedLM", **_ENCODER, embedding_size=32)  # one shared layer, run twice


def test_albert_is_refused_with_the_reason():
    with pytest.raises(UnsupportedModelError, match="'albert'.*one shared layer num_hidden_layers times"):
        cwviz.bundle_from_model(albert(), CharTokenizer(100))


def test_a_model_whose_attention_module_runs_twice_a_pass_is_refused(monkeypatch):
    monkeypatch.delitem(architectures.REFUSED, "albert")  # the derive probe's own detection, for any such model
    with pytest.raises(UnsupportedModelError, match="'albert'.*1 attention module.*ran 2 times in one forward pass"):
        cwviz.bundle_from_model(albert(), CharTokenizer(100))


def test_a_recording_pass_refuses_a_second_call_of_one_attention_module():
    model = albert()
    model.set_attn_implementation("cwviz")
    shared = model.albert.encoder.albert_layer_groups[0].albert_layers[0].attention
    with pytest.raises(UnsupportedModelError, match="layer 0 ran more than once in one forward pass"):
        with torch.inference_mode(), forward_pass([shared]):
            model(input_ids=torch.arange(3, 3 + TOKENS)[None])


# -- encoders whose attention module sets no is_causal (Splinter, LayoutLM, MarkupLM) ---------------------------
@pytest.mark.parametrize(
    ("model_type", "architectures", "causal"),
    [
        ("splinter", None, False),  # an encoder family transformers knows
        ("llama", None, True),  # a decoder-only family
        ("bert", None, False),  # a masked LM class, though a causal one exists too
        ("my-remote-decoder", ["MyForCausalLM"], True),  # remote code: its config names the class
        ("my-remote-gpt", ["MyLMHeadModel"], True),
        ("my-remote-encoder", ["MyForMaskedLM"], False),
        ("my-remote-model", None, True),  # nothing to go by: transformers' own default
    ],
)
def test_the_causality_of_an_attention_module_that_does_not_say_comes_from_its_config(
    model_type, architectures, causal
):
    from types import SimpleNamespace

    from cwviz.core.method.capture import _config_causal

    assert (
        _config_causal(SimpleNamespace(model_type=model_type, architectures=architectures, is_decoder=False)) is causal
    )
    assert _config_causal(SimpleNamespace(model_type="splinter", architectures=None, is_decoder=True)) is True


@pytest.mark.parametrize(
    ("model_type", "auto"), [("splinter", "AutoModel"), ("layoutlm", "AutoModelForMaskedLM"), ("markuplm", "AutoModel")]
)
def test_an_encoder_whose_attention_sets_no_is_causal_stays_bidirectional(model_type, auto):
    model = tiny(model_type, auto, **_ENCODER)
    bundle = cwviz.bundle_from_model(model, CharTokenizer(100))
    assert bundle.arch.derived and not bundle.arch.causal and not bundle.info.causal and not bundle.has_logits
    analysis = check_identities(bundle)
    # sees later keys
    assert all(np.triu(analysis.attention(layer), 1).sum() > 1 for layer in range(analysis.num_layers))


def test_a_derived_row_whose_attention_differs_from_eager_attention_is_refused():
    model = tiny("camembert", "AutoModel", **_ENCODER)
    for layer in model.encoder.layer:  # a wrong causality: cwviz's SDPA masks later keys, eager attention does not
        layer.attention.self.is_causal = True
    with pytest.raises(UnsupportedModelError, match="'camembert'.*differ from those of its own eager attention"):
        cwviz.bundle_from_model(model, CharTokenizer(100))


# -- checkpoints whose class name has a head but no "For" (CTRL) -----------------------------------------------
def test_a_ctrl_checkpoint_loads_with_its_lm_head(tmp_path):
    model = tiny("ctrl", "AutoModelForCausalLM", vocab_size=100, n_embd=64, n_layer=2, n_head=4, n_positions=64, dff=96)
    assert not headless_encoder(model.config, None)  # architectures: ["CTRLLMHeadModel"]
    bundle = cwviz.load_model(save_with_tokenizer(model, tmp_path), device="cpu")
    assert type(bundle.model).__name__ == "CTRLLMHeadModel" and bundle.has_logits
    analysis = check_identities(bundle)
    assert np.isfinite(analysis.perplexity)


def test_a_checkpoint_without_a_head_is_still_loaded_bare():
    config = transformers.AutoConfig.for_model("camembert", architectures=["CamembertModel"])
    assert headless_encoder(config, None)


# -- refused from the config -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("model_type", "reason"),
    [
        ("zaya", "mixes token j's and token j-1's states"),
        ("qwen3_5_text", "hybrid of attention and .* linear-attention"),
        ("qwen3_5_moe_text", "hybrid"),
        ("qwen3_5", "hybrid"),
        ("qwen3_5_moe", "hybrid"),
        ("lfm3", "hybrid"),
    ],
)
def test_families_cwviz_cannot_analyse_are_refused_from_the_config(model_type, reason, tmp_path):
    transformers.AutoConfig.for_model(model_type).save_pretrained(tmp_path)
    with pytest.raises(UnsupportedModelError, match=f"{model_type!r} is not supported: it is .*{reason}"):
        cwviz.load_model(str(tmp_path), device="cpu")  # no weights in the folder: refused before they load


# -- attention that bypasses the interface, through load_model -------------------------------------------------
@pytest.mark.parametrize(
    ("model_type", "kwargs", "reason"),
    [
        (
            "gpt_neo",
            dict(num_layers=2, hidden_size=64, num_heads=4, attention_types=[[["global", "local"], 1]], window_size=4),
            "its attention does not go through transformers' AttentionInterface",
        ),
        (
            "mpt",
            dict(d_model=64, n_heads=4, n_layers=2, max_seq_len=64, expansion_ratio=2),
            "no module of the base model calls transformers' AttentionInterface",
        ),
    ],
)
def test_a_saved_model_whose_attention_bypasses_the_interface_is_refused(model_type, kwargs, reason, tmp_path):
    model = tiny(model_type, "AutoModelForCausalLM", vocab_size=100, max_position_embeddings=64, **kwargs)
    with pytest.raises(UnsupportedModelError, match=f"{model_type!r}.*{reason}"):
        cwviz.load_model(save_with_tokenizer(model, tmp_path), device="cpu")


# -- families that are analysed ------------------------------------------------------------------------------------
def test_gemma3n_text_with_a_width_per_layer_is_analysed():
    model = tiny(
        "gemma3n_text",
        "AutoModelForCausalLM",
        **dict(_DECODER, intermediate_size=[96, 96]),
        vocab_size_per_layer_input=100,
        hidden_size_per_layer_input=8,
        sliding_window=4,
        layer_types=["sliding_attention", "full_attention"],
        num_kv_shared_layers=0,
        altup_num_inputs=2,
        laurel_rank=8,
        activation_sparsity_pattern=[0.0, 0.0],
    )
    bundle = cwviz.bundle_from_model(model, CharTokenizer(100))
    flat = memory.estimate(model.config, bundle.info, 100)["forward"]
    assert (
        flat
        == memory.estimate(transformers.PretrainedConfig(vocab_size=100, intermediate_size=96), bundle.info, 100)[
            "forward"
        ]
    )
    check_identities(bundle)


def test_llama4_text_is_analysed_through_its_decoder():
    model = tiny(
        "llama4_text",
        "AutoModelForCausalLM",
        **_DECODER,
        intermediate_size_mlp=96,
        num_local_experts=2,
        num_experts_per_tok=1,
        interleave_moe_layer_step=1,
        attention_chunk_size=4,
        no_rope_layers=[1, 0],
    )
    # base_model_prefix "language_model"
    assert model.base_model is model and architectures.base_model(model) is model.model
    bundle = cwviz.bundle_from_model(model, CharTokenizer(100))
    assert bundle.arch.derived and bundle.arch.causal and bundle.info.layers == 2
    check_identities(bundle)


def test_a_derived_bfloat16_model_is_checked_against_eager_attention_at_its_own_tolerance():
    """The eager comparison takes the model's dtype's tolerance: bfloat16 SDPA and eager attention differ by more than
    float32 rounding, and a bfloat16 model of a derived row must load (its float32 twin is held to 1e-4)."""
    model = tiny("olmo", "AutoModelForCausalLM", **_DECODER).to(torch.bfloat16)
    assert architectures.architecture_for("olmo") is None  # a derived row
    bundle = cwviz.bundle_from_model(model, CharTokenizer(100), model_id="tiny-olmo-bf16")
    assert bundle.arch.derived and bundle.arch.causal
    analysis = cwviz.analyze(bundle, "abcdefghij")
    sums = analysis.contributions(1, "inter").sum(axis=(0, 2))
    assert np.allclose(sums, 1.0, atol=2e-2)
