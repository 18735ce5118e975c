"""Tidy tables behind the dashboard: shapes users rely on, the docs/METHOD.md identities surviving the
tables, and long prompts staying within the chart row limit."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import cwviz
from cwviz.analyses import tables
from cwviz.core.method import row_block_sizes, row_blocks
from tests.helpers import LONG_TEXT, TEXT, CharTokenizer, make_tiny, tiny_long_bundle


@pytest.fixture(scope="module")
def llama():
    return cwviz.analyze(make_tiny("llama"), TEXT)


@pytest.fixture(scope="module")
def bert():
    return cwviz.analyze(make_tiny("bert"), TEXT[:30])


@pytest.fixture(scope="module")
def long_analysis():
    """512 tokens on a tiny llama that allows them."""
    return cwviz.analyze(tiny_long_bundle(), LONG_TEXT)


def _row_sums(frame, column):
    return frame.groupby("query")[column].sum().to_numpy()


def test_full_heatmap_of_one_head_has_the_lower_triangle_and_rows_that_sum_to_one(llama):
    t = llama.num_tokens
    cells = tables.heatmap_cells(llama, layer=1, head=2, measure="contribution_intra", kind="intra", query=3)
    frame = cells.frame
    assert len(frame) == t * (t + 1) // 2
    assert (frame["key"] <= frame["query"]).all()  # the masked future has no rows: drawn empty, not 0
    np.testing.assert_allclose(_row_sums(frame, "attention"), 1, atol=1e-5)
    np.testing.assert_allclose(_row_sums(frame, "contribution"), 1, atol=1e-4)
    product = frame["attention"] * frame["norm_ratio"] * frame["cosine"]
    np.testing.assert_allclose(product, frame["contribution"], atol=1e-5)
    assert frame["query_token"].tolist() == [llama.tokens[q] for q in frame["query"]]
    assert frame["key_token"].tolist() == [llama.tokens[k] for k in frame["key"]]
    assert cells.labels == tuple(f"{i} {t}" for i, t in enumerate(llama.tokens)) and not cells.binned  # "12 the"


def test_all_heads_uses_the_layer_level_scores(llama):
    cells = tables.heatmap_cells(llama, 0, None, "contribution_inter", "inter")
    np.testing.assert_allclose(_row_sums(cells.frame, "contribution"), 1, atol=1e-4)  # Σ_h Σ_j C = 1
    np.testing.assert_allclose(_row_sums(cells.frame, "attention"), 1, atol=1e-5)  # mean over heads
    assert cells.frame["norm_ratio"].isna().all()  # per-head factors do not exist for all heads
    assert (cells.frame["head"] == "all heads").all()
    assert "all heads" in cells.note and "sum" in cells.note


def test_encoder_heatmap_has_every_pair(bert):
    cells = tables.heatmap_cells(bert, 0, 1, "raw", "inter")
    assert len(cells.frame) == bert.num_tokens**2
    windowed = tables.heatmap_cells(bert, 0, 1, "raw", "inter", query=0, max_cells=100)
    assert len(windowed.frame) <= 100 and (windowed.frame["key"] > windowed.frame["query"]).any()


@pytest.mark.parametrize("query", [0, 17, 300, 511])
def test_long_prompt_window_keeps_the_query_and_the_sink_under_the_limit(long_analysis, query):
    assert long_analysis.num_tokens == 512
    cells = tables.heatmap_cells(long_analysis, 1, 0, "contribution_inter", "inter", query=query, view="window")
    frame = cells.frame
    assert len(frame) <= tables.MAX_CELLS < 5000
    assert query in set(frame["query"])
    assert 0 in set(frame["key"])
    assert (frame["key"] <= frame["query"]).all()
    assert "window" in cells.note


def test_long_prompt_bins_keep_attention_rows_summing_to_one(long_analysis):
    cells = tables.heatmap_cells(long_analysis, 0, None, "contribution_inter", "inter", view="binned")
    frame = cells.frame
    assert len(frame) <= tables.MAX_CELLS
    assert cells.binned and "bins" in cells.note
    np.testing.assert_allclose(_row_sums(frame, "attention"), 1, atol=1e-4)
    np.testing.assert_allclose(_row_sums(frame, "contribution"), 1, atol=1e-3)
    assert len(cells.labels) == frame["query"].max() + 1


def test_bad_selections_raise_selection_errors(llama):
    with pytest.raises(cwviz.SelectionError):
        tables.heatmap_cells(llama, 99, None, "raw")
    with pytest.raises(cwviz.SelectionError):
        tables.heatmap_cells(llama, 0, 9, "raw")
    with pytest.raises(cwviz.SelectionError):
        tables.token_factors(llama, 0, llama.num_tokens, 0)


def test_measure_names_cover_every_measure():
    names = {tables.measure_name(f, k) for f in tables.FAMILIES for k in tables.KINDS}
    assert names == set(cwviz.MEASURES)


def test_head_summary_matches_its_definition(llama):
    summary = tables.head_summary(llama)
    assert len(summary) == llama.num_layers * llama.num_heads
    assert sorted(summary["rank"]) == list(range(1, len(summary) + 1))
    row = summary[(summary["layer"] == 1) & (summary["head"] == 3)].iloc[0]
    attention = llama.attention(1)[3, 1:]
    contribution = llama.contributions(1, "intra")[3, 1:]
    assert row.sink_attention == pytest.approx(attention[:, 0].mean(), abs=1e-6)
    assert row.sink_contribution == pytest.approx(contribution[:, 0].mean(), abs=1e-6)
    assert row.divergence == pytest.approx(0.5 * np.abs(attention - contribution).sum(-1).mean(), abs=1e-6)
    assert row.output_norm == pytest.approx(llama.output_norms(1)[0][3, 1:].mean(), rel=1e-5)
    ranking = tables.head_ranking(summary, top=5)
    assert len(ranking) == 5 and ranking["divergence"].is_monotonic_decreasing


def test_token_factors_multiply_to_the_contribution_sorted_with_the_sink(llama):
    query = llama.num_tokens - 1
    factors = tables.token_factors(llama, 1, query, 2, "inter", top=6)
    wide = factors.wide
    assert 0 in set(wide["key"]) and wide.loc[wide.key == 0, "is_sink"].all()
    assert len(wide) <= 7
    assert wide["contribution"].is_monotonic_decreasing
    np.testing.assert_allclose(wide["attention"] * wide["norm_ratio"] * wide["cosine"], wide["contribution"], atol=1e-5)
    assert len(factors.frame) == len(wide) * 4
    assert set(factors.frame["factor"]) == {"attention", "norm_ratio", "cosine", "contribution"}
    # the kept keys are the largest by magnitude
    full = llama.contributions(1, "inter")[2, query, : query + 1]
    kept = set(np.argsort(-np.abs(full), kind="stable")[:6])
    assert kept <= set(wide["key"])


def test_token_factors_for_all_heads_have_no_per_head_factors(llama):
    factors = tables.token_factors(llama, 0, 5, None, "inter")
    assert factors.factors == ("attention", "contribution")
    np.testing.assert_allclose(factors.wide["contribution"].sum(), 1, atol=1e-4)  # every key kept: 6 < top


def test_top_keys_across_layers_agree_with_the_full_layer(llama):
    query = 9
    top = tables.top_keys_across_layers(llama, query, None, "inter", k=3)
    assert len(top) == llama.num_layers * 3
    for layer, group in top.groupby("layer"):
        scores = llama.layer_scores(layer, "contribution_inter")[query, : query + 1]
        assert group.sort_values("rank")["key"].tolist() == np.argsort(-scores, kind="stable")[:3].tolist()
        np.testing.assert_allclose(group.sort_values("rank")["contribution"], np.sort(scores)[::-1][:3], atol=1e-5)


@pytest.mark.parametrize("arch", ["llama", "gpt2", "bert", "mistral"])
def test_one_query_rows_equal_the_full_layer_row(arch):
    analysis = cwviz.analyze(make_tiny(arch), TEXT)
    for layer in range(analysis.num_layers):
        for query in (0, 7, analysis.num_tokens - 1):
            row = analysis.rows(layer, query, query + 1)
            for name in cwviz.MEASURES:
                np.testing.assert_allclose(
                    row.per_head(name)[:, 0].numpy(), analysis.measure(layer, name)[:, query], atol=1e-5, rtol=1e-4
                )


@pytest.mark.parametrize("arch", ["llama", "gpt2", "bert", "mistral"])
def test_row_blocks_equal_the_whole_layer_across_block_edges(arch):
    """Analysis.rows (what windowed heatmaps and the token page compute) equals the whole layer's rows, for
    every measure, the norms and both aggregations; mistral's sliding window and bert's bidirectional mask
    included; so does attention_tensor's range of rows (the one attention reader). Blocks start and end on either side
    of the whole layer's own row blocks."""
    from cwviz.core.method.row_block_sizes import triangle_row_blocks

    analysis = cwviz.analyze(make_tiny(arch), LONG_TEXT[:90])
    t = analysis.num_tokens
    edges = sorted({e for _, e in triangle_row_blocks(t)} | {1, t // 3, t - 1})
    spans = [(0, t), (0, 1), (t - 1, t)] + [(max(0, e - 3), min(t, e + 4)) for e in edges]
    for layer in range(analysis.num_layers):
        whole = analysis.layer(layer)
        for start, stop in spans:
            rows = analysis.rows(layer, start, stop)
            for name in cwviz.MEASURES:
                np.testing.assert_allclose(
                    rows.per_head(name).numpy(), whole.per_head(name)[:, start:stop].numpy(), atol=1e-5, rtol=1e-4
                )
                np.testing.assert_allclose(
                    rows.layer_level(name).numpy(), whole.layer_level(name)[start:stop].numpy(), atol=1e-5, rtol=1e-4
                )
            np.testing.assert_allclose(rows.output_norm.numpy(), whole.output_norm[start:stop].numpy(), rtol=1e-5)
            alpha = analysis.attention_tensor(layer, start, stop)  # (H, rows, T)
            np.testing.assert_allclose(alpha.numpy(), whole.attention[:, start:stop].numpy(), atol=1e-6)
            np.testing.assert_allclose(
                rows.cosine("intra").numpy(), whole.cosine("intra")[:, start:stop].numpy(), atol=1e-5
            )


@pytest.mark.parametrize("arch", ["llama", "gpt2", "bert", "mistral"])
@pytest.mark.parametrize("cells", [7 * 90, 1 << 18])
def test_row_blocks_cover_every_row_and_every_visible_key(arch, cells, monkeypatch):
    """Analysis.row_blocks (what the head summary, the sink table and detect_sink stream) tiles the rows
    from ``start`` with no gap or overlap; a causal block holds keys 0..stop-1 (every key its rows can see:
    the whole layer's later keys are exactly 0), an encoder's all T; on those keys every measure equals the
    whole layer's. attention_row_blocks gives the same attention, head_outputs the whole layer's z."""
    monkeypatch.setattr(row_block_sizes, "ROW_BLOCK_CELLS", cells)
    analysis = cwviz.analyze(make_tiny(arch), LONG_TEXT[:90])
    t, causal = analysis.num_tokens, analysis.bundle.arch.causal
    for layer in range(analysis.num_layers):
        whole = analysis.layer(layer)
        for start in (0, 1, t // 2):
            blocks = list(analysis.row_blocks(layer, start))
            assert [b[0] for b in blocks] == [start] + [b[1] for b in blocks[:-1]] and blocks[-1][1] == t
            assert len(blocks) >= (2 if causal and start == 0 else 1)
            alphas = analysis.attention_row_blocks(layer, start)
            for (first, stop, m), (a_first, a_stop, alpha) in zip(blocks, alphas, strict=True):
                keys = m.attention.shape[-1]
                assert keys == (stop if causal else t) and (a_first, a_stop, alpha.shape[-1]) == (first, stop, keys)
                np.testing.assert_array_equal(whole.attention[:, first:stop, keys:].numpy(), 0)
                np.testing.assert_array_equal(whole.contributions[:, :, first:stop, keys:].numpy(), 0)
                np.testing.assert_allclose(alpha.numpy(), m.attention.numpy(), atol=1e-7)
                for name in cwviz.MEASURES:
                    expected = whole.per_head(name)[:, first:stop, :keys].numpy()
                    np.testing.assert_allclose(m.per_head(name).numpy(), expected, atol=1e-5, rtol=1e-4)
                np.testing.assert_allclose(m.value_norm.numpy(), whole.value_norm[:, :keys].numpy(), rtol=1e-5)
            for kind in ("intra", "inter"):  # one kind's blocks (the head overview reads intra only)
                for (first, stop, m), (*edges, one) in zip(
                    blocks, analysis.row_blocks(layer, start, kinds=(kind,)), strict=True
                ):
                    assert edges == [first, stop]
                    np.testing.assert_allclose(
                        one.contribution(kind).numpy(), m.contribution(kind).numpy(), atol=1e-7, rtol=1e-6
                    )
        np.testing.assert_allclose(analysis.head_outputs(layer).numpy(), whole.head_output.numpy(), atol=1e-5)


@pytest.mark.parametrize("head", [None, 1])
def test_a_windowed_heatmap_equals_the_whole_map_cut_to_the_window(long_analysis, head):
    """The window view computes only its rows; its cells equal the whole layer's at the same positions."""
    query = 300
    cells = tables.heatmap_cells(
        long_analysis, 1, head, "value_weighted_output_normalized_intra", "intra", query, "window"
    )
    frame = cells.frame
    q, k = frame["query"].to_numpy(), frame["key"].to_numpy()
    if head is None:
        expected = {
            "attention": long_analysis.layer_scores(1, "raw"),
            "value": long_analysis.layer_scores(1, "value_weighted_output_normalized_intra"),
            "contribution": long_analysis.layer_scores(1, "contribution_intra"),
        }
    else:
        expected = {
            "attention": long_analysis.attention(1)[head],
            "value": long_analysis.measure(1, "value_weighted_output_normalized_intra")[head],
            "contribution": long_analysis.contributions(1, "intra")[head],
        }
    assert query in set(q) and 0 in set(k)
    for name, matrix in expected.items():
        np.testing.assert_allclose(frame[name].to_numpy(), matrix[q, k], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("cells", [512 * 7, 512 * 64, 1 << 18])
def test_the_streamed_head_summary_equals_the_whole_map_definition(long_analysis, monkeypatch, cells):
    """Row blocks of 7, 64 and all 511 queries give the same summary as the whole layers' maps."""
    monkeypatch.setattr(row_block_sizes, "ROW_BLOCK_CELLS", cells)
    summary = tables.head_summary(long_analysis).set_index(["layer", "head"])
    for layer in range(long_analysis.num_layers):
        attention = long_analysis.attention(layer)[:, 1:]
        contribution = long_analysis.contributions(layer, "intra")[:, 1:]
        for head in range(long_analysis.num_heads):
            row = summary.loc[(layer, head)]
            assert row.sink_attention == pytest.approx(attention[head, :, 0].mean(), abs=1e-6)
            assert row.sink_contribution == pytest.approx(contribution[head, :, 0].mean(), abs=1e-6)
            divergence = 0.5 * np.abs(attention[head] - contribution[head]).sum(-1).mean()
            assert row.divergence == pytest.approx(divergence, abs=1e-5)


@pytest.mark.parametrize("row_cells", [512 * 8 * 3, 1 << 18])
@pytest.mark.parametrize("head", [None, 2])
def test_the_streamed_binned_view_equals_binning_the_whole_map(long_analysis, monkeypatch, row_cells, head):
    """Bins read a few query bins at a time equal the whole layer's maps binned: mean over a bin's queries
    of the sum over a bin's keys."""
    monkeypatch.setattr(row_block_sizes, "ROW_BLOCK_CELLS", row_cells)
    cells = tables.heatmap_cells(long_analysis, 1, head, "contribution_intra", "intra", 300, "binned")
    t = long_analysis.num_tokens
    width = int(cells.labels[0].split("–")[1]) + 1
    edges = np.arange(0, t, width)

    def binned(matrix):
        key_sums = np.add.reduceat(matrix, edges, axis=1)
        return np.add.reduceat(key_sums, edges, axis=0) / np.diff(np.append(edges, t))[:, None]

    whole = {
        "attention": long_analysis.layer_scores(1, "raw") if head is None else long_analysis.attention(1)[head],
        "contribution": long_analysis.layer_scores(1, "contribution_intra")
        if head is None
        else long_analysis.contributions(1, "intra")[head],
    }
    q, k = cells.frame["query"].to_numpy(), cells.frame["key"].to_numpy()
    for name, matrix in whole.items():
        np.testing.assert_allclose(cells.frame[name].to_numpy(), binned(matrix.astype(np.float64))[q, k], atol=1e-5)


@pytest.mark.parametrize(("tokens", "cells"), [(60, 7 * 60), (512, 1 << 18), (2048, 1 << 18), (100, 50), (33, 10_000)])
def test_the_one_pass_groups_its_row_blocks_in_order_within_a_dense_blocks_cells(tokens, cells):
    """row_block_groups, which the one pass keeps a group's α for: every block once and in order, a group's blocks
    together within the cells (one block alone may exceed them), and no group that the next block would still fit."""
    from cwviz.core.method.capture import LayerRecord

    empty = torch.empty(1, tokens, 1)
    blocks = list(row_blocks.record_row_blocks(LayerRecord(empty, empty, empty, None, 1.0, True, output=None)))
    groups = list(row_block_sizes.row_block_groups(iter(blocks), cells))
    assert [block for group in groups for block in group] == blocks

    def held(group):
        return sum((stop - first) * keys for first, stop, keys in group)

    assert all(held(group) <= cells or len(group) == 1 for group in groups)
    assert all(held(group) + held(following[:1]) > cells for group, following in zip(groups, groups[1:]))
    if tokens == 512:  # the embedded model's 512-token layer: one product for the query side, not eight
        assert len(blocks) == row_block_sizes.READ_MIN_ROW_BLOCKS and len(groups) == 1


#: Three heads a kv head, each held twice in the row blocks (cwviz.core.method.measures.kv_copies): 7-row blocks cut
#: into runs of 10.5 rows fall back to one copy a kv head, the last block's 4 rows do not.
HELD_TWICE = "llama, 3 heads a kv head held twice"


@pytest.mark.parametrize("family", ["llama", "gpt2", "bert", "mistral", "gemma2", "gpt_oss", HELD_TWICE])
@pytest.mark.parametrize("kinds", [("intra", "inter"), ("intra",)])
def test_one_pass_blocks_equal_the_recorded_analysis(family, kinds, monkeypatch):
    """analyze(each_row_block=...) hands every layer's row blocks to the reader during the pass: the same blocks
    and, to float32 rounding, the same measures as reading the returned Analysis afterwards (in the same blocks,
    and by rows, which hold each kv head once); the model's output (which then continues with cwviz's own α v
    instead of SDPA's) and the records match a plain analysis. GQA, GPT-2's biases, an encoder, sliding windows,
    soft-capping, learned sinks and kv heads held twice; small blocks (7 rows or so) so that every layer has
    several, the first few of a causal layer in one group (row_block_groups)."""
    from tests.helpers import family_model

    monkeypatch.setattr(row_block_sizes, "ROW_BLOCK_CELLS", 7 * 60)
    if family == HELD_TWICE:
        model = family_model("llama", hidden_size=96, num_attention_heads=6, num_key_value_heads=2)
        monkeypatch.setattr(row_blocks, "kv_copies", lambda kv_heads, heads, device: 2)
    else:
        model = family_model(family)
    bundle = cwviz.bundle_from_model(model, CharTokenizer(100), model_id=f"tiny-{family}")
    text = LONG_TEXT[:60]
    plain = cwviz.analyze(bundle, text)
    seen: list = []

    def keep(layer, first, stop, m):
        seen.append(
            (
                layer,
                first,
                stop,
                m.attention.clone(),
                {kind: m.contribution(kind).clone() for kind in kinds},
                m.head_output_norm.clone(),
            )
        )

    grouping, group_sizes = row_blocks.row_block_groups, []

    def counted(blocks, cells):
        for group in grouping(blocks, cells):
            group_sizes.append(len(group))
            yield group

    monkeypatch.setattr(row_blocks, "row_block_groups", counted)
    streamed = cwviz.analyze(bundle, text, each_row_block=keep, kinds=kinds)
    # blocks whose α is kept while their group's query side is made
    assert max(group_sizes) > 1 or not bundle.arch.causal
    expected = [(layer, *block) for layer in range(plain.num_layers) for block in plain.row_blocks(layer, kinds=kinds)]
    assert [s[:3] for s in seen] == [e[:3] for e in expected] and len({s[0] for s in seen}) == plain.num_layers
    assert max(stop - first for _, first, stop, *_ in seen) < plain.num_tokens  # several blocks a layer
    for (*_, alpha, contributions, norm), (layer, first, stop, m) in zip(seen, expected, strict=True):
        by_rows = plain.rows(layer, first, stop)
        keys = alpha.shape[-1]
        np.testing.assert_allclose(alpha.numpy(), m.attention.numpy(), atol=1e-6)
        np.testing.assert_allclose(alpha.numpy(), by_rows.attention[..., :keys].numpy(), atol=1e-6)
        np.testing.assert_allclose(norm.numpy(), m.head_output_norm.numpy(), rtol=1e-4, atol=1e-6)
        for kind in kinds:
            np.testing.assert_allclose(contributions[kind].numpy(), m.contribution(kind).numpy(), atol=1e-5, rtol=1e-4)
            np.testing.assert_allclose(
                contributions[kind].numpy(), by_rows.contribution(kind)[..., :keys].numpy(), atol=1e-5, rtol=1e-4
            )
    for layer in range(plain.num_layers):
        np.testing.assert_allclose(
            streamed.layer_record(layer).output.numpy(), plain.layer_record(layer).output.numpy(), atol=1e-5, rtol=1e-4
        )
    # the same input
    np.testing.assert_array_equal(streamed.layer_record(0).query.numpy(), plain.layer_record(0).query.numpy())
    if plain.bundle.arch.causal:
        np.testing.assert_allclose(streamed.next_token_logprobs, plain.next_token_logprobs, atol=1e-4)
    with pytest.raises(ValueError, match="kind must be 'inter' or 'intra'"):
        cwviz.analyze(bundle, text, each_row_block=keep, kinds=("both",))
