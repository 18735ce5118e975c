"""Faithfulness by causal intervention: masks and rankings on hand-made tensors, masking identities on tiny
random models, summaries on hand-made tables, and one integration check on the embedded model."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import cwviz
from cwviz.analyses import examples, faithfulness, faithfulness_summary, masks
from cwviz.core import defaults
from cwviz.core.method.interventions import KeepKeys, logits
from cwviz.core.util.errors import InputError, UnsupportedModelError
from tests.helpers import make_tiny

NAN = float("nan")


def causal(n: int) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool).tril()


# -- masks and rankings on hand-made tensors -------------------------------------------------------------
def test_masked_counts_take_the_ceiling_with_at_least_one_key():
    n = torch.arange(1, 11)
    # min(ceil(r n), n - 1): a pool of one loses nothing, and no pool loses every member (the sufficiency rule)
    assert faithfulness.masked_counts(n, 30).tolist() == [0, 1, 1, 2, 2, 2, 3, 3, 3, 3]
    assert faithfulness.masked_counts(n, 1).tolist() == [0] + [1] * 9
    assert faithfulness.masked_counts(n, 50).tolist() == [0, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    assert faithfulness.masked_counts(n, 100).tolist() == (n - 1).tolist()
    assert faithfulness.masked_counts(n, 0).tolist() == [0] * 10


def test_ranks_and_masks_of_hand_made_scores():
    scores = torch.tensor([[5.0, 9.0, 9.0], [1.0, 3.0, 9.0], [2.0, -1.0, 4.0]])  # (Q, K); 9 = future keys
    visible = causal(3)
    ranks = masks.rank_keys(scores, visible)
    assert ranks.tolist() == [[0, 1, 2], [1, 0, 2], [1, 2, 0]]  # future keys rank last, whatever their score
    n = visible.sum(-1)
    one = torch.ones(3, dtype=torch.long)
    # comprehensiveness removes each query's best key, sufficiency its worst (query 0 has only key 0)
    assert faithfulness.keep_mask(ranks, one, n, "comprehensiveness").tolist() == [
        [False, True, True],
        [True, False, True],
        [True, True, False],
    ]
    assert faithfulness.keep_mask(ranks, one, n, "sufficiency").tolist() == [
        [False, True, True],
        [False, True, True],
        [True, False, True],
    ]
    # masking nothing keeps every key
    zero = torch.zeros(3, dtype=torch.long)
    for curve in faithfulness.CURVES:
        assert faithfulness.keep_mask(ranks, zero, n, curve).all()


def test_ties_keep_key_order_and_nan_ranks_last():
    visible = torch.ones(1, 4, dtype=torch.bool)
    assert masks.rank_keys(torch.tensor([[1.0, 2.0, 2.0, 1.0]]), visible).tolist() == [[2, 0, 1, 3]]
    assert masks.rank_keys(torch.tensor([[NAN, -5.0, 0.0, 1.0]]), visible).tolist() == [[3, 2, 1, 0]]


def test_sliding_window_counts_only_visible_keys():
    # keys 0..i within a window of two: query 3 sees keys 2 and 3 only
    visible = causal(4) & ~causal(4).tril(-2)
    ranks = masks.rank_keys(torch.tensor([[0.0, 0, 0, 0], [9, 1, 0, 0], [9, 9, 1, 0], [9, 9, 1, 2]]), visible)
    n = visible.sum(-1)
    assert n.tolist() == [1, 2, 2, 2]
    keep = faithfulness.keep_mask(ranks, faithfulness.masked_counts(n, 50), n, "comprehensiveness")
    assert keep[3].tolist() == [True, True, True, False]  # the invisible key 0 (score 9) is never "top"


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    num=st.integers(1, 12),
    heads=st.sampled_from([1, 3]),
    rate=st.sampled_from([1.0, 10.0, 33.0, 50.0, 90.0, 100.0]),
)
def test_masks_remove_exactly_the_top_or_bottom_share(seed, num, heads, rate):
    torch.manual_seed(seed)
    scores = torch.randn(heads, num, num)
    visible = causal(num)
    ranks = masks.rank_keys(scores, visible)
    n = visible.sum(-1)
    k = faithfulness.masked_counts(n, rate)
    comp = ~faithfulness.keep_mask(ranks, k, n, "comprehensiveness")
    suff = ~faithfulness.keep_mask(ranks, k, n, "sufficiency")
    for mask in (comp, suff):
        assert not (mask & ~visible).any()  # never a future key
        assert torch.equal(mask.sum(-1), k.expand(heads, num))  # exactly k_i keys per query
    for h in range(heads):
        for i in range(num):
            seen = scores[h, i, : i + 1]
            removed, kept = scores[h, i][comp[h, i]], seen[~comp[h, i, : i + 1]]
            assert len(kept) >= 1  # no query loses every key (the sufficiency rule)
            if len(removed):
                assert removed.min() >= kept.max()  # comprehensiveness removes the highest scores
            removed, kept = scores[h, i][suff[h, i]], seen[~suff[h, i, : i + 1]]
            if len(removed):
                assert removed.max() <= kept.min()  # sufficiency removes the lowest


def test_protocol_rejects_bad_settings_with_a_fix():
    with pytest.raises(InputError, match="0..100"):
        faithfulness.Protocol(rates=(150,))
    with pytest.raises(InputError, match="choose from"):
        faithfulness.Protocol(measures=("attention",))
    with pytest.raises(InputError, match="at least 2"):
        faithfulness.Protocol(max_tokens=1)
    assert faithfulness.Protocol(rates=(50, 10, 10)).rates == (10.0, 50.0)


# -- masking identities on tiny random models ---------------------------------------------------------------
@pytest.fixture(scope="module")
def llama():
    return make_tiny("llama")


IDS = [5, 17, 3, 42, 8, 99, 23, 61, 7, 12, 30, 4]


def test_masking_nothing_reproduces_the_clean_logits(llama):
    analysis = cwviz.analyze(llama, input_ids=IDS)
    ranked = faithfulness.rankings(analysis, faithfulness.Protocol(per_head=True))
    masks = {}
    for layer, n in ranked.num_visible.items():
        masks[layer] = torch.stack(
            [
                faithfulness.keep_mask(ranked.ranks["contribution_inter", 0][layer], torch.zeros_like(n), n, c)
                for c in faithfulness.CURVES
            ]
        )  # (2, H, Q, K)
    ids = torch.tensor([IDS, IDS])
    clean = logits(llama, ids)
    masked = logits(llama, ids, KeepKeys(masks))
    torch.testing.assert_close(masked, clean, atol=1e-5, rtol=1e-5)


def test_rate_zero_gives_zero_delta_ppl_and_full_removal_keeps_one_key_a_query(llama):
    table = faithfulness.run_example(llama, IDS, faithfulness.Protocol(rates=(0, 100), batch_size=5))
    assert set(table.columns) == set(faithfulness.EXAMPLE_COLUMNS)
    assert len(table) == (len(defaults.RANKED_MEASURES) - 1 + faithfulness.Protocol().draws) * 2 * 2
    zero = table[table.rate == 0]
    np.testing.assert_allclose(zero.delta_ppl, 0, atol=1e-4 * zero.ppl_clean.iloc[0])
    np.testing.assert_allclose(zero.log_ppl_ratio, 0, atol=1e-4)
    # at 100 % every query keeps one key (the sufficiency rule): comprehensiveness keeps its lowest-ranked, sufficiency
    # its highest-ranked, so the two curves differ for a measure
    full = table[(table.rate == 100) & (table.measure == "raw")].set_index("curve")
    assert abs(full.delta_ppl["comprehensiveness"] - full.delta_ppl["sufficiency"]) > 1e-6


def test_masks_change_the_model_and_batching_does_not(llama):
    protocol = faithfulness.Protocol(rates=(10, 50), measures=("raw", "contribution_inter", "random"))
    one = faithfulness.run_example(llama, IDS, faithfulness.Protocol(**{**vars(protocol), "batch_size": 1}))
    many = faithfulness.run_example(llama, IDS, faithfulness.Protocol(**{**vars(protocol), "batch_size": 7}))
    np.testing.assert_allclose(one.ppl_masked, many.ppl_masked, rtol=1e-4)
    assert (one.delta_ppl.abs() > 0).all()


def test_one_chosen_layer_masks_less_than_every_layer(llama):
    protocol = dict(rates=(50,), measures=("raw",))
    every = faithfulness.run_example(llama, IDS, faithfulness.Protocol(**protocol))
    one = faithfulness.run_example(llama, IDS, faithfulness.Protocol(layer=1, **protocol))
    assert not np.allclose(every.ppl_masked, one.ppl_masked)
    ranked = faithfulness.rankings(cwviz.analyze(llama, input_ids=IDS), faithfulness.Protocol(layer=1, **protocol))
    assert list(ranked.num_visible) == [1]
    with pytest.raises(InputError, match="layers 0..1"):
        faithfulness.run_example(llama, IDS, faithfulness.Protocol(layer=5, **protocol))


def test_rankings_per_head_and_random_control(llama):
    analysis = cwviz.analyze(llama, input_ids=IDS)
    layer_level = faithfulness.rankings(analysis, faithfulness.Protocol())
    per_head = faithfulness.rankings(analysis, faithfulness.Protocol(per_head=True))
    assert layer_level.ranks["raw", 0][0].shape == (1, len(IDS), len(IDS))
    assert per_head.ranks["raw", 0][0].shape == (llama.info.heads, len(IDS), len(IDS))
    again = faithfulness.rankings(analysis, faithfulness.Protocol(), example=0)
    other = faithfulness.rankings(analysis, faithfulness.Protocol(), example=1)
    assert torch.equal(layer_level.ranks["random", 0][0], again.ranks["random", 0][0])  # seeded
    assert not torch.equal(layer_level.ranks["random", 0][0], other.ranks["random", 0][0])  # fresh per example
    assert not torch.equal(layer_level.ranks["random", 0][0], layer_level.ranks["random", 1][0])  # fresh per draw


def test_output_normalisation_by_the_layer_norm_ranks_as_value_weighted(llama):
    # ‖o_i‖ divides a whole query row by one number, so the rankings (and the masked runs) coincide
    analysis = cwviz.analyze(llama, input_ids=IDS)
    ranked = faithfulness.rankings(
        analysis, faithfulness.Protocol(measures=("value_weighted", "value_weighted_output_normalized"))
    )
    for layer in range(llama.info.layers):
        assert torch.equal(
            ranked.ranks["value_weighted", 0][layer], ranked.ranks["value_weighted_output_normalized", 0][layer]
        )


def test_token_cap_and_encoders(llama):
    assert len(faithfulness.example_ids(llama, "x" * 50, max_tokens=20)) == 20
    assert faithfulness.example_ids(llama, "x", max_tokens=20) is None
    with pytest.raises(UnsupportedModelError, match="causal"):
        faithfulness.run_example(make_tiny("bert"), IDS, faithfulness.Protocol())


def test_iter_examples_yields_one_pair_per_text_and_skips_too_short_ones(llama):
    out = list(
        faithfulness.iter_examples(
            llama, ["abcdef", "a", "ghijkl"], faithfulness.Protocol(rates=(50,), measures=("raw",))
        )
    )
    assert [i for i, _ in out] == [0, 1, 2]
    assert out[1][1] is None
    assert set(out[2][1]["example"]) == {2}


# -- summaries on hand-made tables ---------------------------------------------------------------------------
def _table(values: dict[tuple[str, str, float], list[float]]) -> pd.DataFrame:
    rows = [
        {"example": i, "measure": m, "curve": c, "rate": r, "delta_ppl": v}
        for (m, c, r), vs in values.items()
        for i, v in enumerate(vs)
    ]
    return pd.DataFrame(rows)


def test_summary_means_intervals_and_areas():
    table = _table(
        {
            ("random", "comprehensiveness", 50.0): [1.0, 1.0],
            ("raw", "comprehensiveness", 0.0): [0.0, 0.0],
            ("raw", "comprehensiveness", 50.0): [1.0, 3.0],
            ("raw", "comprehensiveness", 100.0): [2.0, 2.0],
        }
    )
    summary = faithfulness_summary.summarize(table)
    assert list(summary.columns) == faithfulness_summary.SUMMARY_COLUMNS
    assert summary.measure.tolist() == ["raw", "raw", "raw", "random"]  # measures in the paper's order
    row = summary[(summary.measure == "raw") & (summary.rate == 50)].iloc[0]
    assert row.delta_ppl == 2.0 and row.n == 2
    assert 1.0 <= row.ci_low <= 2.0 <= row.ci_high <= 3.0
    assert faithfulness_summary.summarize(table).equals(summary)  # seeded
    areas = faithfulness_summary.curve_areas(summary).set_index("measure")["area"]
    assert areas["raw"] == pytest.approx(0.5 * 1.0 + 0.5 * 2.0)  # trapezoids over 0..0.5..1
    assert areas["random"] == 0.0  # one rate: no area


def test_bootstrap_interval_of_one_value_has_zero_width():
    assert faithfulness_summary.bootstrap_ci(np.array([3.5])) == (3.5, 3.5)
    low, high = faithfulness_summary.bootstrap_ci(np.random.default_rng(0).normal(10, 1, 200))
    assert low < 10 < high and high - low < 0.5


def test_order_check_reads_sufficiency_in_reverse_and_names_ties():
    areas = pd.DataFrame(
        {
            "measure": ["raw", "value_weighted", "value_weighted_output_normalized"] * 2,
            "curve": ["comprehensiveness"] * 3 + ["sufficiency"] * 3,
            "area": [1.0, 2.0, 2.0, 1.0, 2.0, 0.5],
        }
    )
    checks = faithfulness_summary.order_check(areas)
    assert checks.relation.tolist() == ["holds", "equal", "fails", "holds"]
    per_rate = faithfulness_summary.order_check(areas.assign(rate=10.0), value="area")
    assert per_rate.rate.tolist() == [10.0] * 4


def test_text_files_split_into_paragraphs():
    assert examples.split_paragraphs("one\nline two\n\n  \n\nthree\n") == ["one\nline two", "three"]


def test_a_dataset_name_without_datasets_names_the_fix():
    try:
        import datasets  # noqa: F401
    except ImportError:
        with pytest.raises(InputError, match="pip install datasets.*--jsonl"):
            examples.dataset_texts("openai/gsm8k:main")
    else:
        pytest.skip("`datasets` is installed; this checks the offline message")


# -- the embedded model ----------------------------------------------------------------------------------------
def test_removing_the_top_half_of_keys_hurts_the_embedded_model(embedded):
    ids = faithfulness.example_ids(
        embedded, "Natalia sold clips to 48 of her friends in April, and then half as many in May.", 32
    )
    table = faithfulness.run_example(
        embedded, ids, faithfulness.Protocol(rates=(50,), measures=("contribution_inter", "random"))
    )
    comp = table[table.curve == "comprehensiveness"].set_index("measure")["delta_ppl"]
    assert (comp > 0).all()


def test_curve_chart_draws_a_line_and_a_band_per_measure_in_summary_order():
    from cwviz.charts.faithfulness import curve_chart

    table = _table(
        {(m, c, r): [1.0, 2.0] for m in ("raw", "random") for c in faithfulness.CURVES for r in (10.0, 50.0)}
    )
    summary = faithfulness_summary.summarize(table)
    spec = curve_chart(summary, "sufficiency", scale="symlog").to_dict()
    band, line = spec["layer"]
    assert band["mark"]["type"] == "area" and band["encoding"]["y2"]["field"] == "ci_high"
    assert line["encoding"]["y"]["field"] == "delta_ppl" and line["encoding"]["y"]["scale"]["type"] == "symlog"
    assert line["encoding"]["color"]["sort"] == ["raw", "random"]
    assert len(next(iter(spec["datasets"].values()))) == 4  # this curve's rows only
    with pytest.raises(ValueError, match="scale"):
        curve_chart(summary, "sufficiency", scale="log")


def test_a_symlog_axis_labels_its_decades_on_each_side_the_values_reach():
    from cwviz.charts.faithfulness import curve_chart, symlog_ticks

    assert symlog_ticks([0.0, 3.0, 40_000.0]) == [0.0, 1.0, 10.0, 100.0, 1_000.0, 10_000.0]
    assert symlog_ticks([-5.0, 250.0, float("nan")]) == [-1.0, 0.0, 1.0, 10.0, 100.0]
    assert symlog_ticks([0.2]) == [0.0, 1.0]  # never 0 alone
    table = _table(
        {(m, c, r): [-20.0, 3_000.0] for m in ("raw", "random") for c in faithfulness.CURVES for r in (10.0, 50.0)}
    )
    band = curve_chart(faithfulness_summary.summarize(table), "comprehensiveness", scale="symlog").to_dict()["layer"][0]
    assert band["encoding"]["y"]["axis"]["values"] == [-10.0, -1.0, 0.0, 1.0, 10.0, 100.0, 1_000.0]
    linear = curve_chart(faithfulness_summary.summarize(table), "comprehensiveness").to_dict()["layer"][0]
    assert "values" not in linear["encoding"]["y"].get("axis", {})


def test_iter_examples_resumes_at_start_and_enters_the_guard_around_each_example(llama):
    import contextlib

    entered = []

    @contextlib.contextmanager
    def guard():
        entered.append(len(entered))
        yield

    protocol = faithfulness.Protocol(rates=(50,), measures=("raw",))
    out = list(faithfulness.iter_examples(llama, ["abcdef", "a", "ghijkl"], protocol, start=3, guard=guard))
    assert [index for index, _ in out] == [3, 4, 5]
    assert entered == [0, 1]  # the too-short text runs nothing
    assert set(out[0][1]["example"]) == {3} and set(out[2][1]["example"]) == {5}


def test_each_example_reports_its_forward_passes_from_the_clean_one_to_the_last_batch(llama):
    """``progress(done, total)`` counts an example's clean pass and its batches of distinct masked runs, afresh for
    each example: 2 rankings (raw, one random draw) x 2 curves x 2 rates = 8 distinct runs in batches of 3 is 1 + 3
    passes."""
    calls = []
    protocol = faithfulness.Protocol(rates=(10, 50), measures=("raw", "random"), batch_size=3, draws=1)
    out = list(
        faithfulness.iter_examples(
            llama, ["abcdefghij", "klmnopqrst"], protocol, progress=lambda done, total: calls.append((done, total))
        )
    )
    assert len(out) == 2
    assert calls == [(1, 4), (2, 4), (3, 4), (4, 4)] * 2


def test_batch_size_auto_fits_memory_and_gives_the_same_numbers(llama, monkeypatch):
    protocol = dict(rates=(10, 50), measures=("raw", "random"))
    auto = faithfulness.Protocol(batch_size=faithfulness.AUTO_BATCH, **protocol)
    # a CPU: at most the default
    assert faithfulness.batch_size_for(llama, len(IDS), auto, runs=20) == defaults.DEFAULT_BATCH_SIZE
    assert faithfulness.batch_size_for(llama, len(IDS), auto, runs=3) == 3
    assert faithfulness.batch_size_for(llama, len(IDS), faithfulness.Protocol(batch_size=2, **protocol), runs=20) == 2
    one_run = faithfulness.masked_run_bytes(llama, len(IDS))
    logits = 256 * llama.model.config.vocab_size * 8  # the chunk of logits the estimate keeps aside
    monkeypatch.setattr("cwviz.core.method.memory.available", lambda device: int((logits + 2.5 * one_run) / 0.8))
    assert faithfulness.batch_size_for(llama, len(IDS), auto, runs=20) == 2  # room for two and a half runs
    np.testing.assert_allclose(
        faithfulness.run_example(llama, IDS, auto).ppl_masked,
        faithfulness.run_example(llama, IDS, faithfulness.Protocol(batch_size=1, **protocol)).ppl_masked,
        rtol=1e-4,
    )
    from cwviz.cli.options import parse_batch_size

    assert parse_batch_size("auto") == faithfulness.AUTO_BATCH and parse_batch_size("4") == 4
    with pytest.raises(Exception, match="positive integer or auto"):
        parse_batch_size("0")
