"""Compare (issue 16): the alignment, the maps' differences, per-head changes and log-probability changes on
tiny models (hand-made pairs, identical prompts), the chart builders, and ``cwviz compare``."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import transformers

import cwviz
from cwviz.analyses import compare, tables
from cwviz.analyses.schema import HEAD_METRICS
from cwviz.charts import compare as charts
from cwviz.cli.main import main
from cwviz.core.util.errors import InputError
from tests.helpers import CharTokenizer, make_tiny, map_views

A_TEXT = "the cat sat"
B_TEXT = "the big cat sat"  # 4 tokens more: a sequence alignment


@pytest.fixture(scope="module")
def llama() -> cwviz.Bundle:
    return make_tiny("llama")


# -- alignment ----------------------------------------------------------------------------------------
def test_equal_counts_are_aligned_by_position():
    alignment = compare.align_tokens([5, 6, 7], [5, 9, 7], ["a", "b", "c"], ["a", "x", "c"])
    assert alignment.method == compare.BY_POSITION
    assert alignment.pairs == ((0, 0), (1, 1), (2, 2))
    assert list(alignment.table["op"]) == ["equal", "replace", "equal"] and alignment.changed == 1


def test_different_counts_are_aligned_by_sequence_and_the_table_shows_it():
    # a b x c d against a b c d: the inserted x has no pair; an unequal replacement is a deletion and insertions
    alignment = compare.align_tokens([1, 2, 3, 4], [1, 2, 9, 3, 4])
    assert alignment.method == compare.BY_SEQUENCE
    assert alignment.pairs == ((0, 0), (1, 1), (2, 3), (3, 4))
    table = alignment.table
    assert list(table["op"]) == ["equal", "equal", "insert", "equal", "equal"]
    assert list(table["pair"]) == [0, 1, -1, 2, 3]
    assert table.loc[2, "position_b"] == 2 and pd.isna(table.loc[2, "position_a"]) and table.loc[2, "token_a"] == ""
    unequal = compare.align_tokens([1, 2, 3], [1, 7, 8, 3])
    assert list(unequal.table["op"]) == ["equal", "delete", "insert", "insert", "equal"]
    assert unequal.pairs == ((0, 0), (2, 3))


def test_the_first_tokens_the_sink_of_both_are_paired_however_the_prompts_start():
    """Unrelated prompts of different lengths: their first tokens still make the first pair (the sink column stays
    in the maps), and the rest is aligned after them."""
    alignment = compare.align_tokens([5, 1, 2, 3], [9, 8, 1, 2, 3])
    assert alignment.pairs[0] == (0, 0) and alignment.table["op"].iloc[0] == "replace"
    assert alignment.pairs == ((0, 0), (1, 2), (2, 3), (3, 4))
    assert list(alignment.table["op"]) == ["replace", "insert", "equal", "equal", "equal"]
    # difflib alone pairs A's 5 with B's later 5, leaving B's first token out; the sink pair takes precedence.
    moved = compare.align_tokens([5, 1], [7, 7, 5, 1])
    assert moved.pairs == ((0, 0), (1, 3))
    assert sorted(moved.table["position_b"].dropna().tolist()) == [0, 1, 2, 3]  # every token of B is still listed


# -- identical inputs ----------------------------------------------------------------------------------
@pytest.mark.parametrize("head", [None, 2])
@pytest.mark.parametrize("kind", ["inter", "intra"])
def test_identical_prompts_give_an_all_zero_difference(llama, head, kind):
    cmp = compare.compare(cwviz.analyze(llama, A_TEXT), cwviz.analyze(llama, A_TEXT))  # two forward passes
    assert cmp.alignment.method == compare.BY_POSITION and cmp.alignment.changed == 0
    cells = compare.map_cells(cmp, 1, head, kind)
    frame = cells.frame
    assert len(frame) == len(A_TEXT) * (len(A_TEXT) + 1) // 2  # the causal triangle of every aligned pair
    assert (frame["attention_diff"] == 0).all() and (frame["contribution_diff"] == 0).all()
    assert frame["attention_a"].gt(0).any()  # the maps themselves are not empty
    changes = compare.head_changes(cmp)
    assert len(changes) == llama.info.layers * llama.info.heads
    assert (changes[[f"{m}_change" for m in HEAD_METRICS]].to_numpy() == 0).all()
    logprobs = compare.logprob_changes(cmp)
    assert logprobs["change"].iloc[1:].eq(0).all() and np.isnan(logprobs["change"].iloc[0])


# -- a hand-made pair ---------------------------------------------------------------------------------
#: One token per character: " big" (4 tokens) is inserted after "the" (the longest common run is " cat sat"),
#: everything else pairs up. (A position, B position) of each pair.
EXPECTED = tuple((i, i) for i in range(3)) + tuple((i, i + 4) for i in range(3, len(A_TEXT)))


@pytest.fixture(scope="module")
def hand_made(llama):
    """A_TEXT and B_TEXT analysed and compared: (A, B, the comparison)."""
    a, b = cwviz.analyze(llama, A_TEXT), cwviz.analyze(llama, B_TEXT)
    return a, b, compare.compare(a, b)


def test_a_hand_made_pair_is_aligned_around_the_insertion(hand_made):
    _, _, cmp = hand_made
    assert cmp.alignment.method == compare.BY_SEQUENCE and cmp.pairs == EXPECTED
    assert list(cmp.alignment.table["op"]).count("insert") == 4 and cmp.alignment.changed == 4


def test_a_hand_made_pair_maps_b_minus_a_at_the_aligned_cells(hand_made):
    a, b, cmp = hand_made
    layer, head = 1, 3
    cells = compare.map_cells(cmp, layer, head, "intra")
    frame = cells.frame
    attention_a, attention_b = a.attention(layer)[head], b.attention(layer)[head]
    contribution_a, contribution_b = a.contributions(layer, "intra")[head], b.contributions(layer, "intra")[head]
    for row in frame.itertuples(index=False):
        (qa, qb), (ka, kb) = EXPECTED[row.query], EXPECTED[row.key]
        assert (row.query_a, row.query_b, row.key_a, row.key_b) == (qa, qb, ka, kb)
        assert row.attention_diff == pytest.approx(attention_b[qb, kb] - attention_a[qa, ka], abs=1e-6)
        assert row.contribution_diff == pytest.approx(contribution_b[qb, kb] - contribution_a[qa, ka], abs=1e-6)
    # A causal model reads the shared prefix "the" identically: no difference in its rows ...
    prefix = frame[frame["query"] < 3]
    assert (prefix["attention_diff"].abs() < 1e-6).all() and (prefix["contribution_diff"].abs() < 1e-6).all()
    # ... and the rows after the insertion do differ.
    assert frame.loc[frame["query"] >= 3, "attention_diff"].abs().max() > 1e-3
    assert cells.labels[4].startswith("4/8 ") and cells.labels[0] == f"0 {a.tokens[0]}"


def test_a_hand_made_pairs_head_changes_are_b_minus_a_of_each_heads_summary(hand_made):
    a, b, cmp = hand_made
    changes = compare.head_changes(cmp).set_index(["layer", "head"])
    summary_a = tables.head_summary(a).set_index(["layer", "head"])
    summary_b = tables.head_summary(b).set_index(["layer", "head"])
    for metric in HEAD_METRICS:
        np.testing.assert_allclose(changes[f"{metric}_change"], summary_b[metric] - summary_a[metric], atol=1e-7)


def test_the_largest_head_changes_are_ranked_first(hand_made):
    _, _, cmp = hand_made
    ranked = compare.rank_changes(compare.head_changes(cmp), "output_norm", top=3)
    assert list(ranked["rank"]) == [1, 2, 3] and ranked["output_norm_change"].abs().is_monotonic_decreasing


def test_a_hand_made_pairs_logprob_changes_pair_the_aligned_positions(hand_made):
    a, b, cmp = hand_made
    logprobs = compare.logprob_changes(cmp)
    assert len(logprobs) == len(EXPECTED)
    assert logprobs["change"].iloc[1:3].abs().max() < 1e-6  # the shared prefix predicts alike
    row = logprobs.iloc[4]  # "c": A's position 4, B's position 8
    assert row.logprob_a == pytest.approx(a.next_token_logprobs[3]) and row.logprob_b == pytest.approx(
        b.next_token_logprobs[7]
    )
    assert row.change == pytest.approx(b.next_token_logprobs[7] - a.next_token_logprobs[3])


def test_a_long_pair_is_windowed_around_the_query(llama):
    text = "abcdefghij" * 6
    cmp = compare.compare(cwviz.analyze(llama, text), cwviz.analyze(llama, text[:30] + "Z" + text[30:]))
    cells = compare.map_cells(cmp, 0, None, query=45, max_cells=300)
    assert "window" in cells.note and len(cells.frame) <= 300 + 30
    assert cells.query in set(cells.frame["query"]) and 0 in set(cells.frame["key"])  # the query's pair and the sink
    assert cmp.pairs[cells.query] == (45, 46)


# -- refusals -----------------------------------------------------------------------------------------
def test_models_that_do_not_share_a_tokenizer_or_a_shape_are_refused(llama):
    other = cwviz.bundle_from_model(llama.model, CharTokenizer(50), model_id="tiny-llama-other-tokenizer")
    with pytest.raises(InputError, match="tokenizers of .* differ"):
        compare.compare(cwviz.analyze(llama, A_TEXT), cwviz.analyze(other, A_TEXT))
    config = transformers.LlamaConfig(
        vocab_size=100,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    deeper = cwviz.bundle_from_model(
        transformers.AutoModelForCausalLM.from_config(config), CharTokenizer(100), model_id="tiny-3"
    )
    with pytest.raises(InputError, match="not shaped like"):
        compare.compare(cwviz.analyze(llama, A_TEXT), cwviz.analyze(deeper, A_TEXT))
    same = cwviz.bundle_from_model(llama.model, CharTokenizer(100), model_id="tiny-llama-again")
    assert compare.compare(cwviz.analyze(llama, A_TEXT), cwviz.analyze(same, A_TEXT)).alignment.changed == 0


# -- charts -------------------------------------------------------------------------------------------


def test_a_and_b_stand_side_by_side_up_to_32_keys_within_the_page():
    """docs/dashboard.md: three maps in a row up to 16 aligned keys, A and B above the difference up to 32, stacked
    beyond; each row fits its page (a 1,366 px window's under auto, a projector's in presenter mode, whose cells stay
    16 px or more)."""
    from cwviz.charts.heatmaps import PAIR_FITS

    assert [charts.per_row(keys) for keys in (1, 16, 17, 32, 33, 400)] == [3, 3, 2, 2, 1, 1]
    assert charts.per_row(5, "side") == 3 and charts.per_row(30, "side") == 2 and charts.per_row(5, "stacked") == 1
    for keys in (1, 16, 17, 22, 32, 40):
        rows = charts.per_row(keys)
        width, height = charts.map_size(keys, keys, rows, PAIR_FITS)
        assert charts.VIEW_EXTRA + rows * width + (rows - 1) * charts.GAP <= PAIR_FITS and width == height
        width, _ = charts.map_size(keys, keys, min(rows, 2), charts.PRESENTER_FITS, least_cell=16, label_room=200)
        assert width >= 16 * keys and (keys > 30 or 200 + 2 * width + charts.GAP <= charts.PRESENTER_FITS or rows == 1)
    with pytest.raises(ValueError, match="layout must be one of"):
        charts.per_row(5, "grid")


def test_charts_draw_a_b_and_the_difference_on_a_scale_centred_at_zero(llama):
    cmp = compare.compare(cwviz.analyze(llama, A_TEXT), cwviz.analyze(llama, B_TEXT))
    cells = compare.map_cells(cmp, 1, None)
    for layout, shape in (("side", "hconcat"), ("stacked", "vconcat"), ("auto", None)):
        spec = charts.compare_maps(cells, layout=layout).to_dict()
        assert shape is None or shape in spec
        legends = [view["layer"][0]["encoding"]["color"].get("legend", {}) for view in map_views(spec)]
        assert all(legend is None or legend.get("orient") == "bottom" for legend in legends)
        assert legends[1] is not None and legends[2] is not None  # B's (A's scale too) and the difference's
    for what in ("attention", "contribution"):
        spec = charts.compare_maps(cells, what, layout="side").to_dict()
        views = spec["hconcat"]
        assert len(views) == 3
        colours = [view["layer"][0]["encoding"]["color"] for view in views]
        assert [c["field"] for c in colours] == [f"{what}_a", f"{what}_b", f"{what}_diff"]
        assert colours[0]["scale"] == colours[1]["scale"]  # A and B on one scale
        diff = colours[2]["scale"]
        assert diff["domainMid"] == 0 and diff["domain"][0] == -diff["domain"][1]
    changes = compare.head_changes(cmp)
    grid = charts.head_change_grid(changes, "sink_attention", layer=1, head=2).to_dict()
    assert grid["layer"][0]["encoding"]["color"]["scale"]["domainMid"] == 0 and len(grid["layer"]) == 2
    bars = charts.logprob_change_chart(compare.logprob_changes(cmp), query=4).to_dict()
    assert bars["layer"][0]["mark"]["type"] == "bar" and len(bars["layer"]) == 3
    with pytest.raises(ValueError):
        charts.compare_maps(cells, "value")


# -- the command line ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "argv, message",
    [
        (["--text", "one prompt"], "needs two prompts"),
        (["--text", "a", "--text", "b", "--text", "c"], "needs two prompts"),
        (["--text", "a", "--text", "  "], "prompt B is empty"),
    ],
)
def test_the_cli_refuses_what_it_cannot_compare_before_loading_a_model(argv, message, capsys, monkeypatch):
    monkeypatch.setattr("cwviz.cli.compare.load_model", lambda *a, **k: pytest.fail("no model should load"))
    assert main(["compare", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0]


def test_the_cli_compares_two_prompts_and_writes_its_tables(embedded, tmp_path, capsys):
    prompt = tmp_path / "b.txt"
    prompt.write_text("The big dog sat on the mat.", encoding="utf-8")
    out = tmp_path / "out"
    status = main(
        [
            "compare",
            "--text",
            "The cat sat on the mat.",
            "--file",
            str(prompt),
            "--layer",
            "3",
            "--head",
            "1",
            "--out",
            str(out),
        ]
    )
    assert status == 0
    printed = capsys.readouterr().out
    assert "aligned by a sequence alignment" in printed and "insert" in printed and "layer 3, head 1" in printed
    assert "next-token log-probability" in printed
    heads = pd.read_csv(out / "heads.csv")
    assert len(heads) == embedded.info.layers * embedded.info.heads and "divergence_change" in heads
    assert {"attention_diff", "contribution_diff"} <= set(pd.read_csv(out / "maps.csv").columns)
    assert (out / "alignment.csv").is_file() and (out / "logprobs.csv").is_file()


def test_the_cli_refuses_two_models_with_different_tokenizers(embedded, capsys):
    status = main(["compare", "--text", "The cat sat.", "--model", "embedded", "--model-b", "embedded-encoder"])
    assert status == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "tokenizers of embedded and embedded-encoder differ" in err[0]


def test_the_notebook_api_draws_the_pages_charts(llama):
    from cwviz import plot
    from tests.helpers import assert_drawn_from

    a, b = cwviz.analyze(llama, A_TEXT), cwviz.analyze(llama, B_TEXT)
    cmp = compare.compare(a, b)
    assert_drawn_from(plot.compare_maps(a, b, 1, head=2, what="attention"), compare.map_cells(cmp, 1, 2).frame)
    assert_drawn_from(plot.compare_heads(a, b, "output_norm", layer=1, head=0), compare.head_changes(cmp))
    assert_drawn_from(plot.compare_logprobs(a, b), compare.logprob_changes(cmp).dropna(subset=["change"]))
    with pytest.raises(InputError):
        plot.compare_maps(a, b, 1, what="value")
