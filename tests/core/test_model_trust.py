"""A model an analysis can trust (issue 48): a model folder without its tokenizer files is refused with the fix named
(the CLI and the dashboard's shared loader alike); an analysis whose model was freed, moved or changed after it was
made raises ModelChangedError from every method that reads it; text and input_ids that disagree, special tokens
included, are refused. Tiny random models only."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import transformers

import cwviz
from cwviz.cli import main
from cwviz.core.util.errors import InputError, ModelChangedError, ModelLoadError
from tests.helpers import family_model, make_tiny, save_with_tokenizer

SPECIAL = "<|im_start|>"


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    """A tiny llama saved with a tokenizer: a folder that loads."""
    return Path(save_with_tokenizer(family_model("llama"), tmp_path_factory.mktemp("good")))


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("CWVIZ_CACHE", str(tmp_path / "cache"))


def one_error(code: int, capsys) -> str:
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


# -- the tokenizer files -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("missing", ["every tokenizer file", "tokenizer.json only"])
def test_a_folder_without_its_tokenizer_files_is_refused_with_the_fix(good, tmp_path, capsys, missing):
    folder = tmp_path / "model"
    shutil.copytree(good, folder)
    for name in (
        ("tokenizer.json",) if missing == "tokenizer.json only" else ("tokenizer.json", "tokenizer_config.json")
    ):
        (folder / name).unlink()
    with pytest.raises(ModelLoadError, match="has no tokenizer files.*tokenizer.save_pretrained"):
        cwviz.load_model(str(folder), device="cpu")  # what the dashboard's loader calls, too
    line = one_error(main(["analyze", "--model", str(folder), "--text", "hi there", "--device", "cpu"]), capsys)
    assert str(folder) in line and "no tokenizer files" in line


def test_a_folder_with_its_tokenizer_loads_and_keeps_the_words(good):
    bundle = cwviz.load_model(str(good), device="cpu")
    assert cwviz.analyze(bundle, "hi there").tokens[:2] == ["h", "i"]  # never [UNK]


def test_a_file_that_is_not_a_model_says_so(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("not a model")
    with pytest.raises(ModelLoadError, match="is a file, not a model"):
        cwviz.load_model(str(path))


@pytest.mark.parametrize("name", [123, None, ["embedded"]])
def test_a_model_name_that_is_not_text_names_its_type(name):
    with pytest.raises(ModelLoadError, match=f"must be text.*not {type(name).__name__}"):
        cwviz.load_model(name)


# -- the model's state -------------------------------------------------------------------------------------------
READERS = {
    "perplexity": lambda a: a.perplexity,
    "next_token_logprobs": lambda a: a.next_token_logprobs,
    "contributions": lambda a: a.contributions(0),
    "attention": lambda a: a.attention(1),
    "measure": lambda a: a.measure(0, "raw"),
    "layer_scores": lambda a: a.layer_scores(0, "raw"),
    "output_norms": lambda a: a.output_norms(0),
    "rows": lambda a: a.rows(0, 0, 2),
    "row_blocks": lambda a: a.row_blocks(0),  # refused at the call, before any block is read
    "attention_row_blocks": lambda a: a.attention_row_blocks(0),
    "attention_tensor": lambda a: a.attention_tensor(0, 1, 3),
    "values": lambda a: a.values(0),
    "head_outputs": lambda a: a.head_outputs(0),
    "w_heads": lambda a: a.w_heads(0),
    "key_mask": lambda a: a.key_mask(0),
    "layer_record": lambda a: a.layer_record(0),
    "learned_sink_attention": lambda a: a.learned_sink_attention(0),
    "to_dict": lambda a: cwviz.to_dict(a),
}


def _moved(bundle):
    bundle.model.to("meta")  # freed: its weights are gone


def _half(bundle):
    bundle.model.to(torch.float16)


def _edited(bundle):
    with torch.no_grad():
        bundle.out_projections[1].weight.mul_(2.0)  # a fine-tune's weights copied in, an edit


@pytest.mark.parametrize(
    "change", [_moved, _half, _edited], ids=["freed (meta)", "another dtype", "weights edited in place"]
)
@pytest.mark.parametrize("reader", READERS)
def test_an_analysis_of_a_model_changed_since_raises_model_changed_error(change, reader):
    bundle = make_tiny("llama")
    analysis = cwviz.analyze(bundle, "hello there world")
    READERS[reader](analysis)  # fine while the model is as it was
    change(bundle)
    with pytest.raises(ModelChangedError, match="was freed, moved.*run analyze again"):
        READERS[reader](analysis)
    assert issubclass(ModelChangedError, cwviz.CwvizError)


def test_a_model_edited_in_place_gets_new_measures_on_a_new_analysis():
    bundle, fresh = make_tiny("llama"), make_tiny("llama")
    cwviz.analyze(bundle, "hello there").contributions(1)  # the Gram matrix of layer 1 is cached
    with torch.no_grad():
        for model in (bundle.model, fresh.model):
            model.model.layers[1].self_attn.o_proj.weight.mul_(3.0)
    again = cwviz.analyze(bundle, "hello there")
    expected = cwviz.analyze(fresh, "hello there")
    assert torch.allclose(
        torch.from_numpy(again.contributions(1)), torch.from_numpy(expected.contributions(1)), atol=1e-6
    )
    assert again.perplexity == pytest.approx(expected.perplexity, rel=1e-5)


# -- text and input_ids ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def chat_bundle():
    """A tiny llama whose tokenizer has one special token, ``<|im_start|>``, as a chat model's has."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0} | {chr(i): i - 31 for i in range(32, 127)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", additional_special_tokens=[SPECIAL]
    )
    config = transformers.LlamaConfig(
        vocab_size=len(fast),
        hidden_size=32,
        intermediate_size=48,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
    )
    torch.manual_seed(0)
    return cwviz.bundle_from_model(transformers.AutoModelForCausalLM.from_config(config), fast, model_id="tiny-chat")


def test_text_with_a_special_token_its_ids_lack_is_refused(chat_bundle):
    ids = chat_bundle.tokenizer("hello world")["input_ids"]
    with pytest.raises(InputError, match="differ in their special tokens"):
        cwviz.analyze(chat_bundle, SPECIAL + "hello world", input_ids=ids)


def test_ids_with_a_special_token_the_text_writes_out_are_accepted(chat_bundle):
    text = SPECIAL + "hello world"
    ids = chat_bundle.tokenizer(text)["input_ids"]
    analysis = cwviz.analyze(chat_bundle, text, input_ids=ids)
    assert analysis.text == text and analysis.tokens[0] == SPECIAL
    assert (
        cwviz.analyze(
            chat_bundle, "hello world", input_ids=chat_bundle.tokenizer("hello world")["input_ids"]
        ).num_tokens
        == 11
    )


def test_text_and_ids_of_another_text_are_refused(chat_bundle):
    with pytest.raises(InputError, match="not of the text given"):
        cwviz.analyze(chat_bundle, "hello world", input_ids=chat_bundle.tokenizer("goodbye")["input_ids"])
