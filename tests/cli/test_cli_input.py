"""Input the audit found mishandled: invalid text, malformed results, wrong types and names at the API, a
folder or pipe where a file was expected, a reader that leaves early. Each gets one clear ``error:`` line
(status 2) in the CLI or a :class:`~cwviz.core.util.errors.CwvizError` at the API; tiny random models only."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
from argparse import Namespace
from pathlib import Path

import pandas as pd
import pytest

import cwviz
from cwviz.analyses import atlas, faithfulness, faithfulness_summary, sinks
from cwviz.analyses.tables import decomposition
from cwviz.cli import analyze as analyze_command
from cwviz.cli import common, main
from cwviz.cli import compare as compare_command
from cwviz.cli import faithfulness as faithfulness_command
from cwviz.cli import sinks as sinks_command
from cwviz.core import defaults
from cwviz.core.method.export import to_dict, to_json
from cwviz.core.util.errors import CwvizError, InputError, SelectionError
from cwviz.core.util.texts import read_standard_input, read_text_file
from tests.helpers import CharTokenizer, make_tiny, tiny_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def llama() -> cwviz.Bundle:
    return make_tiny("llama")


@pytest.fixture(scope="module")
def analysis(llama):
    return cwviz.analyze(llama, "hello there")


def no_model(_args):
    raise AssertionError("the input must be checked before the model is loaded")


def one_error(capsys) -> str:
    """stderr's one line, checked to be an error line without a traceback."""
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


# -- 1. text that is not valid (lone surrogates) ---------------------------------------------------------
def test_a_lone_surrogate_at_the_api_is_an_input_error_naming_its_position(llama):
    with pytest.raises(InputError, match=r"U\+D800\) at position 3"):
        cwviz.analyze(llama, "abc\ud800")
    with pytest.raises(InputError, match="position 0"):
        faithfulness.example_ids(llama, "\udcffabc", 16)
    with pytest.raises(InputError, match="position 2"):
        list(
            faithfulness.iter_examples(
                llama, ["ok text", "ab\ud800"], faithfulness.Protocol(rates=(50.0,), measures=("raw",))
            )
        )


@pytest.mark.parametrize(
    "argv",
    [
        ["analyze", "--text", "abc\udcff"],
        ["sinks", "--text", "abc\udcff"],
        ["faithfulness", "--text", "abc\udcff"],
        ["compare", "--text", "abc\udcff", "--text", "hello"],
    ],
)
def test_cli_text_that_was_not_utf8_is_one_error_line_before_the_model_loads(argv, capsys, monkeypatch):
    for command in (analyze_command, sinks_command, faithfulness_command, compare_command):
        monkeypatch.setattr(command, "load", no_model, raising=False)
    assert main(argv) == 2
    line = one_error(capsys)
    assert "--text holds a character that is not valid text" in line and "0xFF" in line and "position 3" in line


def test_cli_bytes_that_are_not_utf8_from_a_real_command_line():
    done = subprocess.run(
        [sys.executable, "-m", "cwviz", "analyze", "--text", b"abc\xff"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("error: --text holds a character that is not valid text")


# -- 2. a malformed sinks table in a results folder ---------------------------------------------------------
LAYERS_CSV = "layer,sink_attention_share,sink_contribution_share\n0,0.5,0.4\n1,0.6,0.3\n"


@pytest.mark.parametrize(
    "layers, heads, message",
    [
        (
            "a,b\n",
            None,
            "layers.csv is not a cwviz sinks table (missing layer, sink_attention_share, sink_contribution_share)",
        ),
        ("", None, "layers.csv is not a cwviz sinks table (it is empty)"),
        ('a,"b\n1,2\n', None, "layers.csv is not a cwviz sinks table (it is not CSV)"),
        ("layer,sink_attention_share,sink_contribution_share\nx,y,z\n", None, "hold(s) text, not numbers"),
        (LAYERS_CSV, "layer,head\n0,0\n", "heads.csv is not a cwviz sinks table (missing cos_sink_rest)"),
    ],
)
def test_report_on_a_malformed_sinks_table_names_the_file_and_the_rerun(tmp_path, capsys, layers, heads, message):
    results = tmp_path / "results"
    (results / "sinks").mkdir(parents=True)
    (results / "sinks" / "layers.csv").write_text(layers, encoding="utf-8")
    if heads is not None:
        (results / "sinks" / "heads.csv").write_text(heads, encoding="utf-8")
    assert main(["report", "--results", str(results), "--out", str(tmp_path / "r.html")]) == 2
    line = one_error(capsys)
    assert message in line and f"rerun cwviz sinks --results {results}" in line
    assert not (tmp_path / "r.html").exists()


def test_report_of_a_well_formed_sinks_table_is_written(tmp_path, capsys):
    results = tmp_path / "results"
    (results / "sinks").mkdir(parents=True)
    (results / "sinks" / "layers.csv").write_text(LAYERS_CSV, encoding="utf-8")
    assert main(["report", "--results", str(results), "--out", str(tmp_path / "r.html")]) == 0
    assert "sinks-layers" in (tmp_path / "r.html").read_text(encoding="utf-8")


# -- 3. unknown names at the API are CwvizErrors ------------------------------------------------------------
def test_unknown_names_raise_input_error_not_a_plain_value_error(llama, analysis):
    calls = [
        lambda: analysis.contributions(1, kind="both"),
        lambda: analysis.measure(1, "contribution"),
        lambda: analysis.layer_scores(1, "nope"),
        lambda: decomposition(analysis, 1, 0, kind="both"),
        lambda: next(analysis.row_blocks(1, kinds=("x",))),
        lambda: cwviz.analyze(llama, "hi", kinds=("nope",)),
        lambda: atlas.strongest("nope"),
    ]
    for call in calls:
        with pytest.raises(InputError):
            call()


def test_atlas_top_prompts_with_an_unknown_metric(llama):
    result = atlas.run(llama, ["hello there", "a cat sat"], bootstrap=10)
    with pytest.raises(InputError, match="metric must be one of"):
        result.top_prompts(0, 0, metric="nope")


# -- 4. one string where a list of prompts is expected ---------------------------------------------------------
def test_one_string_for_a_list_of_prompts_is_refused(llama):
    with pytest.raises(InputError, match="give a list of prompts, not one string"):
        list(faithfulness.iter_examples(llama, "hello there", faithfulness.Protocol(rates=(50.0,), measures=("raw",))))
    with pytest.raises(InputError, match="give a list of prompts, not one string"):
        atlas.run(llama, "hello")


# -- 5. a prompt the tokenizer keeps nothing of ---------------------------------------------------------------
class DroppingTokenizer(CharTokenizer):
    """A BERT-like tokenizer whose normaliser drops zero-width characters: [CLS] text [SEP]."""

    all_special_ids = [1, 2]

    def __call__(self, text, add_special_tokens=True, **_):
        ids = [3 + ord(c) % 90 for c in text if c not in "\u200b\u200d"]
        return {"input_ids": [1, *ids, 2] if add_special_tokens else ids}


def test_a_prompt_of_which_the_tokenizer_keeps_only_its_special_tokens_is_refused():
    import transformers

    model = transformers.AutoModelForMaskedLM.from_config(tiny_config("bert"))
    bundle = cwviz.bundle_from_model(model, DroppingTokenizer(), model_id="tiny-bert")
    with pytest.raises(InputError, match="no text the model's tokenizer keeps"):
        cwviz.analyze(bundle, "\u200d\u200b")
    assert cwviz.analyze(bundle, "a\u200b").num_tokens == 3  # [CLS] a [SEP]


# -- 6. a negative sink out of range ------------------------------------------------------------------------------
@pytest.mark.parametrize("sink", [-12, "-12", 11])
def test_a_sink_out_of_range_names_the_value_given(analysis, sink):
    with pytest.raises(
        SelectionError, match=f"token {int(sink)} is out of range; the prompt has tokens 0..10 \\(or -11..-1"
    ):
        sinks.resolve_sink(analysis, sink)
    assert sinks.resolve_sink(analysis, -11) == 0 and sinks.resolve_sink(analysis, -1) == 10


# -- 7. --out naming a folder -----------------------------------------------------------------------------------
def test_faithfulness_out_as_a_folder_is_refused_before_the_model_loads(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(faithfulness_command, "load", no_model)
    (tmp_path / "adir").mkdir()
    assert main(["faithfulness", "--text", "hello there", "--out", str(tmp_path / "adir")]) == 2
    line = one_error(capsys)
    assert "--out" in line and "is a folder" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir"]


def test_write_csv_leaves_no_temporary_file_when_it_fails(tmp_path):
    (tmp_path / "adir").mkdir()
    with pytest.raises(InputError, match="adir"):  # named in one line (cwviz.cli.outputs.write)
        faithfulness_command.write_csv(pd.DataFrame({"a": [1]}), tmp_path / "adir")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir"]


def test_report_out_as_a_folder_is_refused(tmp_path, capsys):
    results = tmp_path / "results"
    (results / "sinks").mkdir(parents=True)
    (results / "sinks" / "layers.csv").write_text(LAYERS_CSV, encoding="utf-8")
    (tmp_path / "adir").mkdir()
    assert main(["report", "--results", str(results), "--out", str(tmp_path / "adir")]) == 2
    line = one_error(capsys)
    assert "--out" in line and "is a folder" in line
    assert not (tmp_path / "adir.tmp").exists()


# -- 8. sinks --csv checked first, written before printing; a reader that leaves early ----------------------------
@pytest.mark.parametrize("where, message", [("nodir/x.csv", "no folder"), ("adir", "is a folder")])
def test_sinks_csv_is_checked_before_the_model_loads(tmp_path, capsys, monkeypatch, where, message):
    monkeypatch.setattr(sinks_command, "load", no_model)
    (tmp_path / "adir").mkdir()
    assert main(["sinks", "--text", "hello there", "--csv", str(tmp_path / where)]) == 2
    line = one_error(capsys)
    assert message in line and "--csv" in line


class BrokenPipe(io.StringIO):
    """A standard output whose reader has left (`| head -2` after its lines)."""

    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")


def test_a_broken_pipe_ends_quietly_and_the_csv_is_written(tmp_path, capsys, monkeypatch, llama):
    monkeypatch.setattr(sinks_command, "load", lambda _args: llama)
    monkeypatch.setattr(sys, "stdout", BrokenPipe())
    csv = tmp_path / "s.csv"
    assert main(["sinks", "--text", "hello there", "--no-ppl", "--csv", str(csv)]) == 141
    assert "error" not in capsys.readouterr().err
    assert len(pd.read_csv(csv)) > 0


# -- 9. help text -------------------------------------------------------------------------------------------------
def test_faithfulness_help_shows_one_percent_sign(capsys):
    with pytest.raises(SystemExit) as done:
        main(["faithfulness", "--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and "95% bootstrap" in " ".join(out.split()) and "%%" not in out


# -- 10. --file that is not a regular file --------------------------------------------------------------------------
def test_file_that_is_a_folder_says_so(tmp_path, capsys):
    with pytest.raises(InputError, match="is a folder, not a file"):
        read_text_file(tmp_path)
    assert main(["analyze", "--file", str(tmp_path)]) == 2
    assert "is a folder, not a file" in one_error(capsys)


def test_file_that_is_a_fifo_or_dev_null_is_read_as_a_stream(tmp_path, capsys):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_bytes(b"from a pipe\n"), daemon=True)  # never blocks the exit
    writer.start()
    assert read_text_file(fifo) == "from a pipe\n"
    writer.join()
    assert main(["analyze", "--file", os.devnull]) == 2
    assert one_error(capsys) == f"error: the prompt is empty ({os.devnull} holds no text); give some text to analyse"


# -- 11. standard input less one final newline -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "data, text",
    [(b"hi there\n", "hi there"), (b"hi there\r\n", "hi there"), (b"hi\n\n", "hi\n"), (b"hi", "hi"), (b"\n", "")],
)
def test_standard_input_drops_one_final_newline(monkeypatch, data, text):
    assert read_standard_input(io.BytesIO(data)) == text
    monkeypatch.setattr(sys, "stdin", Namespace(buffer=io.BytesIO(data)))
    if text.strip():
        assert common.read_text(Namespace(text="-", file=None)) == text
    monkeypatch.setattr(sys, "stdin", Namespace(buffer=io.BytesIO(data)))
    if text.strip():
        assert compare_command.read_inputs(Namespace(inputs=[("text", "-"), ("text", "b")], model_b=None))[0] == text


# -- 12. one-token prompts
# ----------------------------------------------------------------------------------------------
def test_one_token_prompts_say_what_perplexity_needs(capsys, monkeypatch, llama):
    monkeypatch.setattr(sinks_command, "load", lambda _args: llama)
    monkeypatch.setattr(analyze_command, "load", lambda _args: llama)
    assert main(["sinks", "--text", "a"]) == 2
    line = one_error(capsys)
    assert "perplexity needs at least two tokens" in line and "--no-ppl" in line
    assert main(["analyze", "--text", "a"]) == 0
    assert "perplexity: n/a (needs at least two tokens)" in capsys.readouterr().out


# -- 13. API odds
# ----------------------------------------------------------------------------------------------------------
def test_export_takes_one_layer_as_an_int_and_each_layer_once(analysis, tmp_path):
    path = to_json(analysis, tmp_path / "one.json", layers=1, heads=2)
    data = json.loads(path.read_text(encoding="utf-8"))
    assert [layer["layer"] for layer in data["layers"]] == [1] and [h["head"] for h in data["layers"][0]["heads"]] == [
        2
    ]
    assert [layer["layer"] for layer in to_dict(analysis, layers=[1, 1, 0])["layers"]] == [1, 0]
    with pytest.raises(SelectionError, match="'1'"):
        to_dict(analysis, layers="1")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"rates": "10,50"}, "sequence of percentages"),
        ({"rates": (10, "50")}, "numbers"),
        ({"seed": "x"}, "seed must be an integer"),
        ({"seed": -1}, "non-negative"),
        ({"batch_size": 2.5}, "batch_size must be an integer"),
        ({"max_tokens": None}, "max_tokens must be an integer"),
    ],
)
def test_protocol_refuses_values_of_the_wrong_type(kwargs, message):
    with pytest.raises(InputError, match=message):
        faithfulness.Protocol(**kwargs)


def test_summarize_of_a_table_without_the_columns_names_them():
    with pytest.raises(InputError, match="measure, curve, rate, delta_ppl"):
        faithfulness_summary.summarize(pd.DataFrame())
    with pytest.raises(CwvizError, match="delta_ppl"):
        faithfulness_summary.summarize(pd.DataFrame({"measure": ["raw"], "curve": ["sufficiency"], "rate": [10.0]}))


# -- 14. areas
# ---------------------------------------------------------------------------------------------------------------
def _summary(rates: tuple[float, ...]) -> pd.DataFrame:
    rows = [
        {"example": 0, "measure": "raw", "curve": c, "rate": r, "delta_ppl": 1.0}
        for c in faithfulness.CURVES
        for r in rates
    ]
    return faithfulness_summary.summarize(pd.DataFrame(rows))


def test_one_rate_prints_no_area_and_two_name_the_span():
    one = faithfulness_command.format_table(_summary((10.0,)))
    assert "area n/a (needs two rates)" in one and one.splitlines()[2].split()[-1] == "n/a"
    two = faithfulness_command.format_table(_summary(defaults.DEFAULT_RATES))
    assert "area over rates 0.01..0.5" in two and two.splitlines()[2].split()[-1] == "0.49"  # constant ΔPPL of 1
