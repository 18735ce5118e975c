"""The fair test of every attribution method (docs/METHOD.md section 7.3): knockouts against a masked forward built by
hand, the random control's expectation, rankings and their ties, verdicts on constructed records, and the command end to
end on a tiny model (resume, errors)."""

from __future__ import annotations

import functools
import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

import cwviz
from cwviz import cli
from cwviz.analyses import flow_faithfulness, flow_verdicts
from cwviz.analyses.claim_items import spearman
from cwviz.analyses.codecs.checks import FLOW_FAITHFULNESS
from cwviz.analyses.faithfulness import example_ids
from cwviz.analyses.records import RECORD_GLOB, read_records
from cwviz.cli import flow_faithfulness as command
from cwviz.core.method import attribution
from cwviz.core.method.knockout import last_logits
from tests.helpers import SWEEP_TEXTS as TEXTS
from tests.helpers import launch, make_tiny, run_here, save_tiny_model, write_jsonl


def _hand_masked_logits(bundle, ids, removed):
    """The last position's logits with the values of ``removed`` zeroed in every layer, by hand: a test-only hook on
    every v_proj sets those rows of its output (bias included) to 0, and the model runs as transformers runs it."""
    handles = []

    def zero(module, inputs, output):
        output = output.clone()
        output[:, list(removed)] = 0.0
        return output

    for attention in bundle.attention_modules:
        handles.append(attention.v_proj.register_forward_hook(zero))
    try:
        with torch.inference_mode():
            return bundle.model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1].float()
    finally:
        for handle in handles:
            handle.remove()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_knockout_effects_equal_a_masked_forward_built_by_hand(arch):
    bundle = make_tiny(arch)  # qwen2: value biases, so zeroing the value (not only x W_V) is what is checked
    ids = [5, 17, 3, 42, 8, 23, 11, 60, 7]
    sets = [(), (0,), (4,), (8,), (1, 2, 6), tuple(range(8))]
    ours = last_logits(bundle, ids, sets, batch_size=4)  # two batches, rows removing different tokens
    for row, removed in enumerate(sets):
        expected = _hand_masked_logits(bundle, ids, removed)
        assert torch.allclose(ours[row], expected, atol=1e-5, rtol=1e-4), removed
    assert not torch.allclose(ours[0], ours[2])  # a knockout changes the prediction
    with torch.inference_mode():
        clean = bundle.model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1].float()
    assert torch.allclose(ours[0], clean, atol=1e-5)
    assert all(not m._forward_hooks for m in bundle.model.modules())


def test_rankings_break_ties_by_position_and_count_with_the_ceiling():
    scores = np.array([0.5, 2.0, 0.5 + 1e-9, -1.0, 2.0, np.nan])
    # 0.5 and 0.5 + 1e-9 tie (within 1e-6 of the largest |score|): earlier first; NaN last
    assert flow_faithfulness.ranking(scores).tolist() == [1, 4, 0, 2, 3, 5]
    assert [flow_faithfulness.removed_count(10, r) for r in (10, 30, 1)] == [1, 3, 1]
    assert flow_faithfulness.removed_count(3, 10) == 1 and flow_faithfulness.removed_count(31, 30) == 10
    sets = flow_faithfulness.removal_sets(np.array([0.1, 0.9, 0.5, 0.3, 0.7, 0.2, 0.8, 0.0, 0.6, 0.4]))
    assert sets["comprehensiveness", 10.0] == (1,) and sets["sufficiency", 10.0] == (7,)
    assert sets["comprehensiveness", 30.0] == (1, 4, 6) and sets["sufficiency", 30.0] == (0, 5, 7)


def test_the_random_controls_expectation_on_an_additive_case():
    """Where a set's drop is the sum of its tokens' effects, a random ranking's comprehensiveness at k of n tokens has
    expectation k/n of the total, as does its sufficiency, and its ρ with the effects has expectation 0."""
    effects = np.array([3.0, -1.0, 0.5, 2.0, 0.0, 1.5, -0.5, 4.0, 1.0, 0.25])
    n, total = len(effects), effects.sum()
    draws = flow_faithfulness.random_scores(seed=0, example=3, draws=4000, n=n)
    assert np.array_equal(draws[0], flow_faithfulness.random_scores(0, 3, 1, n)[0])  # seeded by (seed, example, draw)
    assert not np.array_equal(draws[0], flow_faithfulness.random_scores(0, 4, 1, n)[0])
    for rate in flow_faithfulness.RATES:
        k = flow_faithfulness.removed_count(n, rate)
        for curve in flow_faithfulness.CURVES:
            mean = np.mean([effects[list(flow_faithfulness.removal_sets(d)[curve, rate])].sum() for d in draws])
            assert math.isclose(mean, k / n * total, abs_tol=0.05 * abs(total)), (curve, rate)
    rhos = [spearman(d, effects) for d in draws]
    assert abs(np.mean(rhos)) < 0.02


METHODS = ("effect", "alti", "share_flow")


def _record(example, scores, effects, drops=None, skipped=False, signed=("effect", "share_flow")):
    """A constructed record over input tokens 0 .. n − 1: ``scores`` by method, the same effects under both
    interventions, every curve's drops from ``drops[method]`` (default 0)."""
    if skipped:
        return {"example": example, "skipped": True, "why": "fewer than 4 tokens", "tokens": 2}
    n = len(effects)
    drops = drops or {}
    methods = (*scores, "random")
    curves = {
        m: {
            c: {f"{r:g}": float(drops.get(m, {}).get(c, 0.0)) for r in flow_faithfulness.RATES}
            for c in flow_faithfulness.CURVES
        }
        for m in methods
    }
    both = dict.fromkeys(flow_faithfulness.INTERVENTIONS)
    return {
        "example": example,
        "skipped": False,
        "tokens": n + 1,
        "full_drop": {i: 2.0 for i in both},
        "effects": {i: list(effects) for i in both},
        "logp_effects": {i: list(effects) for i in both},
        "scores": {name: list(v) for name, v in scores.items()},
        "signed": list(signed),
        "random_scores": [list(np.random.default_rng(example).random(n))],
        "curves": {i: curves for i in both},
    }


def _row(table, first, second, statistic, intervention="relay"):
    picked = (table["first"] == first) & (table["second"] == second) & (table["statistic"] == statistic)
    return table[picked & (table["intervention"] == intervention)].iloc[0]


def test_verdicts_hold_fail_and_stay_unresolved_where_constructed():
    rng = np.random.default_rng(0)
    records = []
    for item in range(12):
        effects = rng.normal(size=9)
        noise = rng.normal(size=9)
        # the effect flow is the effects themselves; ALTI ranks the sizes backwards; the share flow has their sizes
        # with every sign flipped (so it ties with the effect flow on the size and loses on the sign)
        drops = {
            "effect": {"comprehensiveness": 2.0, "sufficiency": 0.1},
            "alti": {"comprehensiveness": 1.0, "sufficiency": 0.5},
        }
        drops["share_flow"] = {"comprehensiveness": 2.0 + (0.5 if item % 2 else -0.5), "sufficiency": 0.1}
        scores = {"effect": effects, "alti": 1 / (np.abs(effects) + 0.1) + 1e-3 * noise, "share_flow": -effects}
        records.append(_record(item, scores, effects, drops))
    records.append(_record(12, {}, [], skipped=True))
    table = flow_verdicts.verdict_table(records)
    assert list(table.columns) == flow_verdicts.CSV_COLUMNS
    assert _row(table, "effect", "alti", "rho").verdict == "holds"
    assert _row(table, "effect", "alti", "rho", "origin").verdict == "holds"
    assert _row(table, "effect", "alti", "aopc_comprehensiveness").verdict == "holds"
    assert _row(table, "effect", "alti", "aopc_sufficiency").verdict == "holds"  # a smaller sufficiency drop wins
    assert _row(table, "alti", "random", "aopc_comprehensiveness").verdict == "holds"
    assert _row(table, "alti", "random", "rho").verdict == "fails"
    assert _row(table, "alti", "random", "aopc_sufficiency").verdict == "fails"
    # on size the two flows tie on every item; on sign the effect flow wins; ALTI has no sign to compare
    size = _row(table, "effect", "share_flow", "rho")
    assert size.verdict == "unresolved" and size.evidence == "tie on every item"
    assert _row(table, "effect", "share_flow", "sign_agreement").verdict == "holds"
    assert _row(table, "effect", "share_flow", "rho_signed").verdict == "holds"
    assert not ((table["second"] == "alti") & table["statistic"].isin(["rho_signed", "sign_agreement"])).any()
    assert _row(table, "effect", "share_flow", "aopc_comprehensiveness").verdict == "unresolved"  # ±0.5 around 0
    assert set(table.n) == {12}
    assert flow_verdicts.skipped_counts(records) == {"fewer than 4 tokens": 1}
    assert set(table[table.primary].statistic) == {"rho"}
    methods = flow_verdicts.method_table(records)
    effect = methods[(methods.method == "effect") & (methods.statistic == "aopc_comprehensiveness")].iloc[0]
    assert effect["mean"] == pytest.approx(2.0)
    sign = methods[(methods.method == "effect") & (methods.statistic == "sign_agreement")].iloc[0]
    assert sign["mean"] == pytest.approx(1.0)
    assert methods[(methods.method == "alti") & (methods.statistic == "sign_agreement")]["mean"].isna().all()
    # four items decide nothing, however clear
    few = flow_verdicts.verdict_table(records[:4])
    assert set(few.verdict) == {"unresolved"} and few.evidence.str.startswith("too few items").all()


def test_the_first_token_and_the_position_are_left_out_of_the_primary_rho():
    """The primary ρ reads tokens 1 .. p − 1; the sensitivity row includes the first token, here the only
    disagreement."""
    effects = np.array([10.0, 1.0, 2.0, 3.0, 4.0, 5.0])
    scores = np.array([0.0, 1.0, 2.0, 3.0, 4.0, 5.0])  # right on every token but the first
    stats = flow_verdicts.per_item(scores, effects, signed=True)
    assert stats.rho == pytest.approx(1.0) and stats.rho_with_first < 0.9
    assert flow_verdicts.sign_agreement(
        np.array([3.0, -2.0, 1.0, 0.1]), np.array([1.0, 1.0, 1.0, -1.0])
    ) == pytest.approx(2 / 3)


def _oracle(bundle) -> attribution.Method:
    """A registry member that knows the answer: each input token's own relay knockout effect."""

    def compute(request):
        ids = request.analysis.input_ids
        logits = last_logits(bundle, ids, [()] + [(k,) for k in range(request.position)])
        ld = (logits[:, request.target] - logits[:, request.foil]).double().numpy()
        return attribution.Attribution("effect", np.append(ld[0] - ld[1:], 0.0))

    return attribution.Method("effect", "oracle", "the knockouts themselves", True, frozenset({"relay"}), compute)


def test_an_item_with_an_oracle_method_correlates_perfectly_and_skips_short_items():
    bundle = make_tiny("llama")
    text = "Tom has three apples and buys four more."
    methods = {"effect": _oracle(bundle), "alti": attribution.METHODS["alti"]}
    payload = flow_faithfulness.item_payload(bundle, text, example=0, max_tokens=12, methods=methods, batch_size=5)
    assert not payload["skipped"] and payload["tokens"] == 12 and len(payload["effects"]["relay"]) == 11
    assert np.allclose(payload["scores"]["effect"], payload["effects"]["relay"], atol=1e-6)
    stats = flow_verdicts.item_statistics([payload | {"example": 0}])
    assert stats["relay", "effect", "rho"].iloc[0] == pytest.approx(1.0)
    assert stats["relay", "effect", "sign_agreement"].iloc[0] == pytest.approx(1.0)
    # comprehensiveness at 10 % of the 10 ranked tokens (1 .. 10) removes the oracle's largest |effect| among them
    ranked = np.abs(np.asarray(payload["effects"]["relay"])[1:])
    best = (int(np.argmax(ranked)) + 1,)
    logits = last_logits(bundle, example_ids(bundle, text, 12), [(), best])
    target, foil = payload["target"], payload["foil"]
    drop = float((logits[0, target] - logits[0, foil]) - (logits[1, target] - logits[1, foil]))
    assert payload["curves"]["relay"]["effect"]["comprehensiveness"]["10"] == pytest.approx(drop, abs=1e-5)
    assert flow_faithfulness.item_payload(bundle, "abc", methods=methods)["skipped"]


def test_command_end_to_end_resumes_and_refuses_other_settings(tmp_path, monkeypatch, capsys):
    bundle = make_tiny("llama")
    monkeypatch.setattr(command, "load", lambda _args: bundle)
    methods = {"effect": _oracle(bundle), "alti": attribution.METHODS["alti"]}
    monkeypatch.setattr(
        flow_faithfulness, "item_payload", functools.partial(flow_faithfulness.item_payload, methods=methods)
    )
    data = tmp_path / "items.jsonl"
    texts = [
        "Tom has three apples and buys four more.",
        "The river flows past the old mill.",
        "ab",
        "A cat sat on a warm mat.",
    ]
    data.write_text("\n".join(json.dumps({"text": t}) for t in texts) + "\n", encoding="utf-8")
    folder = tmp_path / "run"
    args = [
        "flow-faithfulness",
        "--jsonl",
        str(data),
        "--n",
        "4",
        "--results",
        str(folder),
        "--max-tokens",
        "10",
        "--draws",
        "2",
    ]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert "skipped: 1 fewer than 4 tokens" in out and "relay: rho: effect vs random:" in out
    table = pd.read_csv(folder / flow_faithfulness.CSV_NAME)
    assert list(table.columns) == flow_verdicts.CSV_COLUMNS and set(table.n) == {3}
    assert set(table.verdict) == {"unresolved"}  # 3 items < MIN_ITEMS
    means = pd.read_csv(folder / flow_faithfulness.METHODS_CSV_NAME)
    assert set(means.method) == {"effect", "alti", "random"}
    assert means[(means.method == "effect") & (means.statistic == "rho") & (means.intervention == "relay")][
        "mean"
    ].iloc[0] == pytest.approx(1.0)
    items = pd.read_csv(folder / flow_faithfulness.ITEMS_CSV_NAME)
    assert len(items) == 3 * 2 * 3 and set(items.columns) == {
        "example",
        "intervention",
        "method",
        "rho",
        "rho_signed",
        "sign_agreement",
    }
    assert cli.main(args) == 2  # a folder with records needs --resume
    assert "--resume" in capsys.readouterr().err
    assert cli.main([*args, "--resume"]) == 0
    assert cli.main([*args, "--resume", "--draws", "3"]) == 2  # other settings are refused
    assert "other settings" in capsys.readouterr().err
    lines = sum(
        len(p.read_text().splitlines()) for p in (folder / flow_faithfulness.RECORDS_FOLDER).glob("records-*.jsonl")
    )
    assert lines == 4
    # the codec reads them back, checked
    made = read_records(folder / flow_faithfulness.RECORDS_FOLDER, FLOW_FAITHFULNESS)
    assert [r["skipped"] for r in made] == [False, False, True, False]
    knockouts = FLOW_FAITHFULNESS.decode(made)
    assert len(knockouts) == sum(r["tokens"] - 1 for r in made if not r["skipped"])
    assert {"example", "position", "effect_relay", "effect_origin", "effect", "alti"} <= set(knockouts.columns)


def test_the_codec_refuses_a_record_out_of_range():
    both = ("relay", "origin")
    good = {"skipped": False, "tokens": 5, "target": 1, "foil": 2, "ld_clean": 1.0, "logp_clean": -1.0}
    good |= {"full_drop": dict.fromkeys(both, 0.5), "effects": dict.fromkeys(both, [0.1] * 4)}
    good |= {"logp_effects": dict.fromkeys(both, [0.0] * 4), "scores": {"effect": [1.0] * 4}, "signed": ["effect"]}
    good |= {"random_scores": [[0.5] * 4], "curves": {}}
    assert FLOW_FAITHFULNESS.encode(good) == good
    for bad in (
        {"foil": 1},
        {"effects": dict.fromkeys(both, [0.1] * 3)},
        {"tokens": 3},
        {"scores": {"alti": [1.0] * 4}},
        {"effects": "many"},
        {"full_drop": 0.5},
    ):
        with pytest.raises(cwviz.InputError):
            FLOW_FAITHFULNESS.encode(good | bad)


def test_bad_arguments_are_one_error_line_before_any_model_loads(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(command, "load", lambda _args: pytest.fail("no model may load"))
    data = tmp_path / "items.jsonl"
    data.write_text('{"text": "one two three four"}\n', encoding="utf-8")
    base = ["flow-faithfulness", "--jsonl", str(data), "--results", str(tmp_path / "run")]
    for extra, words in (
        (["--n", "0"], "--n must be at least 1"),
        (["--max-tokens", "3"], "--max-tokens must be at least 4"),
        (["--draws", "0"], "--draws must be at least 1"),
        (["--batch-size", "0"], "--batch-size must be at least 1"),
    ):
        assert cli.main([*base, *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error:") and words in err[0], err
    assert (
        cli.main(["flow-faithfulness", "--jsonl", str(tmp_path / "missing.jsonl"), "--results", str(tmp_path / "r")])
        == 2
    )
    assert capsys.readouterr().err.startswith("error:")
    assert cli.main([*base[:3], "--results", str(tmp_path / "no" / "run")]) == 2
    assert "create it first" in capsys.readouterr().err


def test_embedded_analysis_is_not_needed_for_the_tables():
    """The tables and verdicts are torch-free: they read records alone (an empty list gives empty tables)."""
    assert flow_verdicts.verdict_table([]).verdict.eq("unresolved").all()
    assert flow_verdicts.item_statistics([]).empty
    assert cwviz  # the package imports without the flow


@pytest.mark.slow
def test_two_processes_under_torchrun_give_exactly_the_single_process_records(tmp_path):
    """Every registry member (no stand-in) on a saved tiny model, one process and two under torchrun."""
    model = save_tiny_model(tmp_path / "model")
    data = write_jsonl(tmp_path / "items.jsonl", TEXTS[:4])
    single, double = tmp_path / "single", tmp_path / "double"
    argv = ["flow-faithfulness", "--jsonl", str(data), "--examples", "4", "--model", str(model), "--device", "cpu"]
    argv += ["--max-tokens", "12", "--draws", "2"]
    run_here([*argv, "--results", str(single)])
    launch([*argv, "--results", str(double)], processes=2)
    folder = double / flow_faithfulness.RECORDS_FOLDER
    assert sorted(p.name for p in folder.glob(RECORD_GLOB)) == ["records-00000.jsonl", "records-00001.jsonl"]
    records = read_records(folder, FLOW_FAITHFULNESS)
    assert records == read_records(single / flow_faithfulness.RECORDS_FOLDER, FLOW_FAITHFULNESS)
    assert (double / flow_faithfulness.CSV_NAME).read_text() == (single / flow_faithfulness.CSV_NAME).read_text()
    finished = [r for r in records if not r["skipped"]]
    assert finished and all(len(r["scores"]["effect"]) == r["tokens"] - 1 for r in finished)
