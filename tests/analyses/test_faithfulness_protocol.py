"""Issue 45's faithfulness protocol (docs/METHOD.md section 3): the random control against its exact expectation on a
tiny model, ties within the tolerance ranking alike in float32 and float64, and the sufficiency rule on a 1-key
query."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
import torch

import cwviz
from cwviz.analyses import faithfulness, faithfulness_summary, masks
from cwviz.core.method.interventions import KeepKeys, batch_perplexity
from tests.helpers import make_tiny

IDS = [5, 17, 9, 30]


def test_random_control_mean_matches_its_expectation_on_a_constructed_model():
    """Masking layer 0 of a 4-token text at 30 %: query 1 loses one of its 2 keys, query 2 one of 3, query 3 two of 4
    (query 0, with one key, loses none), each set equally likely under a random ranking. The mean ΔPPL over every one
    of those 2 × 3 × 6 masks is the control's expectation; 400 random draws land within four standard errors of it."""
    bundle = make_tiny("llama")
    clean = cwviz.analyze(bundle, input_ids=IDS).perplexity
    choices = [[()]] + [list(itertools.combinations(range(q + 1), k)) for q, k in ((1, 1), (2, 1), (3, 2))]
    keeps = []
    for picked in itertools.product(*choices):
        keep = torch.ones(4, 4, dtype=torch.bool)
        for query, keys in enumerate(picked):
            keep[query, list(keys)] = False
        keeps.append(keep)
    batch = torch.stack(keeps)[:, None]  # (masks, 1, Q, K)
    ppl = batch_perplexity(bundle, torch.tensor([IDS] * len(keeps)), KeepKeys({0: batch}))
    expected, spread = float((ppl - clean).mean()), float((ppl - clean).std())
    assert spread > 0
    draws = 400
    protocol = faithfulness.Protocol(rates=(30.0,), measures=("random",), layer=0, draws=draws, batch_size=64)
    table = faithfulness.run_example(bundle, IDS, protocol)
    assert sorted(table.draw.unique()) == list(range(draws))
    means = faithfulness_summary.per_example_means(table)
    assert len(means) == 2  # one row a curve: the draws averaged within the example
    for curve in faithfulness.CURVES:  # at 30 % of these queries both curves mask a uniformly random set
        got = float(means.loc[means.curve == curve, "delta_ppl"].iloc[0])
        assert abs(got - expected) < 4 * spread / np.sqrt(draws), curve
    summary = faithfulness_summary.summarize(table)
    assert (summary.n == 1).all()  # n counts examples, not draws


def test_a_tie_within_the_tolerance_ranks_alike_in_float32_and_float64():
    """Scores 1e-8 apart round to one float32 number: without the tolerance float64 puts the later key first and float32
    keeps key order; within it both keep key order (the fixed rule). A gap above the tolerance still orders."""
    visible = torch.ones(1, 4, dtype=torch.bool)
    scores = torch.tensor([[0.3 + 1e-8, 0.3 + 2e-8, 0.1, 0.2]], dtype=torch.float64)
    exact64, exact32 = (
        masks.rank_keys(scores, visible, tolerance=0.0),
        masks.rank_keys(scores.float(), visible, tolerance=0.0),
    )
    assert not torch.equal(exact64, exact32)
    assert (
        masks.rank_keys(scores, visible).tolist() == masks.rank_keys(scores.float(), visible).tolist() == [[0, 1, 3, 2]]
    )
    apart = torch.tensor([[0.3, 0.3 + 1e-3, 0.1, 0.2]])
    assert masks.rank_keys(apart, visible).tolist() == [[1, 0, 3, 2]]


def test_a_chain_of_near_ties_is_one_group_and_nan_and_invisible_keys_rank_last():
    visible = torch.tensor([[True, True, True, True, False]])
    step = 0.6 * masks.TIE_TOLERANCE  # each within the tolerance of the next, the ends not
    scores = torch.tensor([[1.0 - 2 * step, float("nan"), 1.0, 1.0 - step, 5.0]], dtype=torch.float64)
    assert masks.rank_keys(scores, visible).tolist() == [[0, 3, 1, 2, 4]]


def test_a_query_that_sees_one_key_is_never_masked_and_none_loses_every_key():
    """The sufficiency rule: query 0 sees only the sink, so no curve, scope or rate masks it; under the query scope
    every other query keeps at least one key, even at 100 %."""
    visible = torch.ones(4, 4, dtype=torch.bool).tril()
    maskable = masks.maskable(visible)
    assert not maskable[0].any() and torch.equal(maskable[1:], visible[1:])
    assert masks.masked_counts(torch.tensor([1, 2, 3, 10]), 50).tolist() == [0, 1, 2, 5]
    assert masks.masked_counts(torch.tensor([1, 2, 3, 10]), 100).tolist() == [0, 1, 2, 9]
    scores = torch.rand(1, 4, 4, generator=torch.Generator().manual_seed(0))
    for scope in faithfulness.RANK_SCOPES:
        ranks, pool = masks.scope_ranks(scores, maskable, scope)
        for curve, rate in itertools.product(faithfulness.CURVES, (1, 50, 100)):
            keep = masks.keep_mask(ranks, masks.masked_counts(pool, rate), pool, curve, maskable)[0]
            assert keep[0].all(), (scope, curve, rate)
            if scope == "query":
                assert (keep & visible).sum(-1).min() >= 1


def test_the_rule_holds_on_a_model_in_every_layer():
    bundle = make_tiny("llama")
    analysis = cwviz.analyze(bundle, input_ids=IDS)
    ranked = faithfulness.rankings(analysis, faithfulness.Protocol(measures=("raw", "random"), rank_scope="layer"))
    for layer, pool in ranked.num_visible.items():
        ranks = ranked.ranks["raw", 0][layer]  # raw attention's (0, 0) = 1 would rank first if it were in the pool
        keep = masks.keep_mask(ranks, masks.masked_counts(pool, 10), pool, "comprehensiveness", ranked.visible[layer])
        assert keep[0, 0, 0] and not keep.all()


def test_the_log_ratio_and_the_gap_to_random_are_scale_free():
    """Two tables whose perplexities differ by a factor of 10 give the same log ratios and gaps to random."""
    rows = []
    for example in range(6):
        for measure, factor in (("raw", 2.0), ("contribution_inter", 4.0), ("random", 1.5)):
            for curve in faithfulness.CURVES:
                f = factor if curve == "comprehensiveness" else 1 + 1 / factor
                rows.append(
                    {
                        "example": example,
                        "measure": measure,
                        "curve": curve,
                        "rate": 10.0,
                        "draw": 0,
                        "ppl_clean": 5.0,
                        "ppl_masked": 5.0 * f,
                    }
                )
    small = pd.DataFrame(rows).assign(delta_ppl=lambda t: t.ppl_masked - t.ppl_clean)
    large = small.assign(
        ppl_clean=small.ppl_clean * 10, ppl_masked=small.ppl_masked * 10, delta_ppl=small.delta_ppl * 10
    )
    gaps = [faithfulness_summary.random_gaps(t).set_index(["measure", "curve"]).gap for t in (small, large)]
    pd.testing.assert_series_equal(gaps[0], gaps[1])
    assert gaps[0]["contribution_inter", "comprehensiveness"] == pytest.approx(np.log(4.0 / 1.5))
    assert gaps[0]["raw", "sufficiency"] == pytest.approx(np.log(1 + 1 / 1.5) - np.log(1.5))
