"""Ranking scopes (docs/METHOD.md section 3) and the claims check (section 5): each scope's masks on hand-made scores,
value-weighted and its output-normalised form parting under the token and layer scopes, each claim's verdict on
constructed records, and ``cwviz claims`` end to end on a tiny model."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from cwviz import cli
from cwviz.analyses import claims, faithfulness
from cwviz.analyses.schema import VERDICT_STATES
from cwviz.cli import claims as command
from tests.helpers import make_tiny, ordered, record, sinks

CAUSAL = torch.tril(torch.ones(4, 4, dtype=torch.bool))  # (query, key)


def masks(scores: torch.Tensor, scope: str, rate: float, curve: str, visible: torch.Tensor = CAUSAL) -> torch.Tensor:
    """The masked (query, key) pairs, bool [query, key], of layer-level ``scores`` [query, key]."""
    ranks, pool = faithfulness.scope_ranks(scores[None], visible, scope)
    keep = faithfulness.keep_mask(ranks, faithfulness.masked_counts(pool, rate), pool, curve, visible)
    return ~keep[0] & visible


SCORES = torch.tensor(
    [
        [1.0, 0.0, 0.0, 0.0],
        [0.2, 0.9, 0.0, 0.0],
        [0.5, 0.1, 0.3, 0.0],
        [0.6, 0.05, 0.25, 0.1],
    ]
)


def test_query_scope_masks_each_querys_own_top_share():
    masked = masks(SCORES, "query", 50, "comprehensiveness")
    # k_i = min(ceil(0.5 n_i), n_i - 1): 0, 1, 2, 2 keys, each query's own best (query 0 keeps its only key)
    assert masked.tolist() == [
        [False, False, False, False],
        [False, True, False, False],
        [True, False, True, False],
        [True, False, True, False],
    ]


def test_token_scope_masks_the_top_keys_in_every_row_that_sees_them():
    # mean over the queries that see each key: key 0 (1 + .2 + .5 + .6)/4 = .575, key 1 (.9 + .1 + .05)/3 = .35,
    # key 2 (.3 + .25)/2 = .275, key 3 .1; 50 % of 4 keys: keys 0 and 1, masked for every query
    masked = masks(SCORES, "token", 50, "comprehensiveness")
    assert masked[:, 0].all() and masked[1:, 1].all()
    assert masked.sum() == 4 + 3
    assert not masked[:, 2:].any()
    # sufficiency: the two lowest keys (2 and 3), wherever they are visible
    low = masks(SCORES, "token", 50, "sufficiency")
    assert low.tolist() == [[False] * 4, [False] * 4, [False, False, True, False], [False, False, True, True]]


def test_layer_scope_masks_exactly_the_top_share_of_all_visible_pairs():
    visible_pairs = int(CAUSAL.sum())  # 10
    for rate in (10, 30, 50):
        masked = masks(SCORES, "layer", rate, "comprehensiveness")
        k = int(np.ceil(rate / 100 * visible_pairs))
        assert int(masked.sum()) == k
        values = SCORES[CAUSAL]
        threshold = values.sort(descending=True).values[k - 1]
        assert (SCORES[masked] >= threshold).all() and (SCORES[CAUSAL & ~masked] <= threshold).all()
    # the layer's top 30 %: (0,0)=1, (1,1)=.9, (3,0)=.6; a query may lose several keys or none
    assert masks(SCORES, "layer", 30, "comprehensiveness").nonzero().tolist() == [[0, 0], [1, 1], [3, 0]]
    low = masks(SCORES, "layer", 30, "sufficiency")
    assert int(low.sum()) == 3 and set(map(tuple, low.nonzero().tolist())) == {(3, 1), (2, 1), (3, 3)}  # .05, .1, .1


def test_invisible_keys_are_never_masked_in_any_scope():
    window = CAUSAL & ~torch.tril(torch.ones(4, 4, dtype=torch.bool), diagonal=-2)  # a sliding window of 2
    for scope in faithfulness.RANK_SCOPES:
        for curve in faithfulness.CURVES:
            ranks, pool = faithfulness.scope_ranks(SCORES[None], window, scope)
            keep = faithfulness.keep_mask(ranks, faithfulness.masked_counts(pool, 50), pool, curve, window)
            assert keep[0][~window].all(), (scope, curve)


def normalised_pair():
    """Value-weighted scores and the same divided by each query's ‖o_i‖ (a row scale): query 1's keys are large in
    VW, but its output is long too, so after the division query 2's keys lead."""
    vw = torch.tensor([[1.0, 0.0, 0.0], [4.0, 3.0, 0.0], [1.5, 1.0, 2.0]])
    norms = torch.tensor([1.0, 10.0, 1.0])
    return vw, vw / norms[:, None]


def test_query_scope_ranks_value_weighted_and_its_normalised_form_alike_and_the_others_do_not():
    vw, normalised = normalised_pair()
    visible = torch.tril(torch.ones(3, 3, dtype=torch.bool))
    same = {
        scope: torch.equal(
            faithfulness.scope_ranks(vw[None], visible, scope)[0],
            faithfulness.scope_ranks(normalised[None], visible, scope)[0],
        )
        for scope in faithfulness.RANK_SCOPES
    }
    assert same == {"query": True, "token": False, "layer": False}


def test_token_and_layer_scopes_part_the_two_on_a_model():
    """On a tiny model the VW and VW/‖o‖ runs give the same ΔPPL under the query scope, different ones otherwise."""
    bundle = make_tiny("llama")
    ids = list(range(3, 23))
    analysis = faithfulness.analyze(bundle, input_ids=ids)
    for scope, equal in (("query", True), ("token", False), ("layer", False)):
        protocol = faithfulness.Protocol(
            rates=(30.0,), measures=("value_weighted", "value_weighted_output_normalized"), rank_scope=scope
        )
        table = faithfulness.run_example(bundle, ids, protocol, analysis=analysis).set_index(["measure", "curve"])[
            "delta_ppl"
        ]
        same = np.allclose(table["value_weighted"], table["value_weighted_output_normalized"], rtol=0, atol=0)
        assert same == equal, scope


def test_a_resume_with_another_scope_is_refused(tmp_path):
    from cwviz.analyses.codecs.sweeps import FAITHFULNESS

    provenance = {"id": "m", "architecture": "a", "revision": None, "weights_sha256": "x", "dtype": "float32"}
    keys = {s: FAITHFULNESS.settings(faithfulness.Protocol(rank_scope=s), provenance) for s in faithfulness.RANK_SCOPES}
    assert len({json.dumps(k, sort_keys=True) for k in keys.values()}) == 3
    assert "rank_scope" not in keys["query"]["protocol"]  # a folder made before scopes existed still resumes


# -- verdicts on constructed records ---------------------------------------------------------------------


def verdicts(records) -> dict:
    table = claims.claims_table(records)
    rows = table[table.role == claims.VERDICT]
    return {(r.claim, r.part, r.curve): r.verdict for r in rows.itertuples()}


def test_claim_one_holds_fails_and_is_unresolved_where_the_answer_is_known():
    holds = [record(i, ordered(i, 1.0, noise=0.1)) for i in range(20)]
    assert verdicts(holds)[1, "", "comprehensiveness"] == "holds" and verdicts(holds)[1, "", "sufficiency"] == "holds"
    fails = [record(i, ordered(i, -1.0, noise=0.1)) for i in range(20)]
    assert set(verdicts(fails).values()) == {"fails"}
    noisy = [record(i, ordered(i, 0.0, noise=1.0)) for i in range(20)]
    assert set(verdicts(noisy).values()) == {"unresolved"}


def test_claim_one_is_judged_on_the_log_perplexity_ratio_with_delta_ppl_as_evidence():
    """Two models whose ΔPPL differ 10-fold in scale (clean PPL 50 here) give the same log-ratio verdicts; the
    evidence names both statistics."""
    table = claims.claims_table([record(i, ordered(i, 1.0, noise=0.1)) for i in range(20)])
    one = table[(table.claim == 1) & (table.role == claims.VERDICT)]
    assert one.statistic.str.contains("log-perplexity ratio").all()
    assert one.evidence.str.contains("ΔPPL").all() and one.evidence.str.contains("log ratio").all()


def test_the_random_control_gives_each_measure_its_gap_to_random():
    """A control row per measure: > 0 where the measure beats random (comprehensiveness: a larger log ratio;
    sufficiency: a smaller one), < 0 where it does worse."""
    made = []
    for i in range(20):
        ppl = ordered(i, 1.0, noise=0.05)
        ppl["comprehensiveness", "random"], ppl["sufficiency", "random"] = 2.5, 8.5  # between raw/VW and VW/‖o‖/CW
        made.append(record(i, ppl))
    table = claims.claims_table(made)
    control = table[table.role == claims.CONTROL].set_index(["curve", "part"])
    assert len(control) == 2 * len(claims.ORDER)
    for curve in faithfulness.CURVES:
        assert control.loc[(curve, "raw"), "verdict"] == "fails" and control.loc[(curve, "CW"), "verdict"] == "holds"
        assert control.loc[(curve, "CW"), "estimate"] > 0 > control.loc[(curve, "raw"), "estimate"]


def tied(scope: str, n: int = 20) -> list[dict]:
    """Records in the paper's order except that VW and VW/‖o‖ give the same log ratio on every item, under ``scope``."""
    made = []
    for i in range(n):
        ppl = ordered(i, 1.0, noise=0.1)
        for curve in faithfulness.CURVES:
            ppl[curve, "value_weighted_output_normalized"] = ppl[curve, "value_weighted"]
        made.append(record(i, ppl, scope=scope))
    return made


def test_a_tie_by_construction_is_its_own_state_never_unresolved():
    """Under the query scope VW and VW/‖o‖ rank alike by construction: the row is "ties by construction", whatever
    the other pairs show and however few the items, and a headline counts it apart from the rows that can hold. The
    same tie under the token scope is the data's: unresolved, never holds."""
    for n in (20, claims.MIN_ITEMS - 1):
        table = claims.claims_table(tied("query", n))
        one = table[(table.claim == 1) & (table.role == claims.VERDICT)]
        assert set(one.verdict) == {claims.TIES}
        assert one.evidence.str.contains("identical rankings under the query scope").all()
    token = claims.claims_table(tied("token"))
    token = token[(token.claim == 1) & (token.role == claims.VERDICT)]
    assert set(token.verdict) == {"unresolved"} and token.evidence.str.contains("tie on every item").all()
    both = claims.claims_table(tied("query") + [{**r, "example": r["example"] + 100} for r in tied("token")])
    assert claims.overview(both).set_index("claim").loc[1, "verdict"] == (
        "0 holds, 0 fails, 2 unresolved of 2 that can hold; 2 ties by construction (cannot hold)"
    )


def test_too_few_items_decide_nothing_however_clear_they_look():
    """Below MIN_ITEMS a bootstrap interval has (nearly) no spread: every verdict is unresolved and says why; at
    MIN_ITEMS the same clear data decide."""
    few = [record(i, ordered(i, 1.0, noise=0.1), sinks(i)) for i in range(claims.MIN_ITEMS - 1)]
    table = claims.claims_table(few)
    judged = table[table.verdict != ""]
    assert set(table.claim) == {1, 2, 3, 4, 5} and set(judged.verdict) == {"unresolved"}
    assert judged.evidence.str.startswith(
        f"too few items to decide ({claims.MIN_ITEMS - 1} < {claims.MIN_ITEMS})"
    ).all()
    last = claims.MIN_ITEMS - 1
    enough = few + [record(last, ordered(last, 1.0, noise=0.1), sinks(last))]
    assert set(verdicts(enough).values()) == {"holds"}


def sink_verdicts(noise: float = 0.01, **values) -> dict:
    records = [record(i, ordered(i, 1.0), sinks(i, noise=noise, **values)) for i in range(20)]
    return {(claim, part): v for (claim, part, _), v in verdicts(records).items() if claim > 1}


def test_claims_two_to_five_hold_fail_or_stay_unresolved_as_constructed():
    parts = [(2, ""), (3, ""), (4, ""), (5, "a"), (5, "b"), (5, "c")]
    assert sink_verdicts(d=0.3, cos=-0.3, near=0.05, spread=0.1, toward=0.1, ppl=0.5) == dict.fromkeys(parts, "holds")
    assert sink_verdicts(d=-0.3, cos=0.3, near=0.3, spread=-0.1, toward=-0.1, ppl=-0.5) == dict.fromkeys(parts, "fails")
    noisy = sink_verdicts(d=0.0, cos=0.0, near=0.1, spread=0.0, toward=0.0, ppl=0.0, noise=1.0)
    assert noisy == dict.fromkeys(parts, "unresolved")


def test_claim_four_is_judged_on_the_operating_point_not_the_u_shape():
    """Every head U-shaped (the near-algebraic share, now evidence) yet operating 0.3 from its minimiser: claim 4
    fails, its U-shape evidence row still above 0.5."""
    table = claims.claims_table([record(i, ordered(i, 1.0), sinks(i, shape=1.0, near=0.3)) for i in range(20)])
    four = table[table.claim == 4]
    assert four[four.role == claims.VERDICT].verdict.tolist() == ["fails"]
    shape = four[four.statistic.str.startswith("share of fitted heads whose ‖o‖²")]
    assert shape.role.tolist() == [claims.EVIDENCE] and shape.verdict.tolist() == ["holds"]


def test_claim_five_c_is_decided_by_the_control_each_way():
    """The sink's removal raises perplexity (log ratio 0.5) in both runs; the control's removal raises it less (0.2)
    in one, more (0.8) in the other: (c) holds and fails on the paired difference, while the sink's ratio alone (issue
    45's verdict, now evidence) holds in both. (a) and (b) get the paired difference as a control row."""
    for control, expected in ((0.2, "holds"), (0.8, "fails")):
        table = claims.claims_table([record(i, ordered(i, 1.0), sinks(i, ppl=0.5, control=control)) for i in range(20)])
        five = table[table.claim == 5]
        c = five[(five.role == claims.VERDICT) & (five.part == "c")].iloc[0]
        assert c.verdict == expected and c.estimate == pytest.approx(0.5 - control, abs=0.01)
        alone = five[five.statistic.str.contains("the sink's removal alone")].iloc[0]
        assert alone.role == claims.EVIDENCE and alone.verdict == "holds"
        assert set(five[five.role == claims.CONTROL].part) == {"a", "b"}


def test_claim_five_is_three_verdicts_each_on_its_own():
    """(a) the spread may narrow while (b) the outputs turn away from the centroid; (c) perplexity decides alone."""
    five = sink_verdicts(spread=0.1, toward=-0.1, ppl=-0.5)
    assert (five[5, "a"], five[5, "b"], five[5, "c"]) == ("holds", "fails", "fails")


def test_claim_two_with_the_sink_like_the_other_keys_is_unresolved():
    """The sink follows geometry more than attention (d_σ > 0, the first protocol's statistic, holds), but no more
    than the other keys do (d_σ = d_other): the paired test is unresolved, never holds."""
    records = [record(i, ordered(i, 1.0), sinks(i, d=0.0, d_other=0.3, noise=0.02)) for i in range(20)]
    table = claims.claims_table(records)
    two = table[table.claim == 2].set_index("role", append=True)
    verdict_row = table[(table.claim == 2) & (table.role == claims.VERDICT)].iloc[0]
    first = table[(table.claim == 2) & table.statistic.str.contains("the first protocol")].iloc[0]
    assert verdict_row.verdict == "unresolved" and first.verdict == "holds"
    assert len(two) == 3


# -- the command -------------------------------------------------------------------------------------
def test_cwviz_claims_end_to_end_on_a_tiny_model_resumes_and_refuses_other_settings(tmp_path, monkeypatch, capsys):
    bundle = make_tiny("llama")
    monkeypatch.setattr(command, "load", lambda _args: bundle)
    data = tmp_path / "items.jsonl"
    rows = [
        {"text": "Tom has three apples and buys four more of them."},
        {"text": "The river flows past the old mill."},
    ]
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    folder = tmp_path / "run"
    args = ["claims", "--jsonl", str(data), "--n", "2", "--results", str(folder), "--max-tokens", "16", "--rates", "30"]
    assert cli.main(args) == 0
    table = pd.read_csv(folder / claims.CSV_NAME)
    assert set(claims.CSV_COLUMNS) == set(table.columns)
    assert set(table.claim) == {1, 2, 3, 4, 5}
    assert set(table[table.claim == 1].scope) == set(faithfulness.RANK_SCOPES)
    assert set(table.role) == {"verdict", "control", "evidence"}
    assert set(table[table.role == "verdict"].verdict) <= set(VERDICT_STATES)
    assert set(table[(table.role == "verdict") & (table.scope == "query")].verdict) == {claims.TIES}
    # two items (a row with fewer: a statistic some item had none of, e.g. no sink-active head)
    assert table.n.max() == 2
    out = capsys.readouterr().out
    assert "claim 5a:" in out and "claim 5c:" in out
    # a second run without --resume is refused; with it nothing reruns; another scope list is refused
    assert cli.main(args) == 2
    assert cli.main([*args, "--resume"]) == 0
    assert cli.main([*args, "--resume", "--scopes", "query"]) == 2
    assert "other settings" in capsys.readouterr().err
    # the report gains a claims section, recomputed from the records
    assert cli.main(["report", "--results", str(folder), "--out", str(tmp_path / "report.html")]) == 0
    html = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert "Claims of the paper" in html and 'data-table="claims-overview"' in html


def test_bad_scopes_or_rates_are_one_error_line_before_any_model_loads(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(command, "load", lambda _args: pytest.fail("no model may load"))
    base = ["claims", "--gsm8k", "--n", "1", "--results", str(tmp_path / "run")]
    for extra, words in (
        (["--scopes", "row"], "--scopes takes"),
        (["--rates", "x"], "--rates takes"),
    ):
        assert cli.main([*base, *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error:") and words in err[0]
