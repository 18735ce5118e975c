"""Attention sinks (docs/METHOD.md section 4): the split o = s ṽ_σ + (1 − s) m, the table and its summaries,
the analytic curve, and interventions that leave the model clean."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import cwviz
from cwviz import analyze
from cwviz.analyses import sink_interventions, sinks
from cwviz.charts import sinks as charts
from cwviz.core.method import row_block_sizes
from cwviz.core.method.interventions import KeepKeys, ScaleValues, batch_perplexity, logits
from cwviz.core.method.measures import expand_kv, head_output_norms, semantic_cone
from cwviz.core.util.errors import InputError, SelectionError
from cwviz.core.util.texts import read_texts
from tests.helpers import FAMILY_CONFIGS, TEXT, CharTokenizer, family_model, make_tiny
from tests.sink_reference import cosine, recorded_intervention, sink_split

GSM8K = Path(__file__).resolve().parents[2] / "data" / "gsm8k" / "sample.jsonl"  # shipped with cwviz


@pytest.fixture(scope="module")
def llama():
    bundle = make_tiny("llama")
    return bundle, analyze(bundle, TEXT)


def _o_proj_io(bundle, text):
    """The model's own o_proj input and output (minus bias) per layer, from a plain forward with hooks."""
    seen = {}
    handles = []
    for layer, proj in enumerate(bundle.out_projections):

        def hook(module, args, output, layer=layer):
            bias = getattr(module, "bias", None)
            seen[layer] = (output[0] - (bias if bias is not None else 0)).detach().float()  # (T, D)

        handles.append(proj.register_forward_hook(hook))
    try:
        ids = torch.tensor([bundle.tokenizer(text)["input_ids"]])
        with torch.inference_mode():
            bundle.model(input_ids=ids)
    finally:
        for handle in handles:
            handle.remove()
    return seen


# -- the split -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("sink", [0, 3])
def test_head_outputs_split_into_sink_and_rest(tiny, sink):
    """o_i^h = s ṽ_σ + (1 − s) m_i, and Σ_h o_i^h is the model's own o_proj output minus its bias."""
    analysis = analyze(tiny, TEXT)
    model_out = _o_proj_io(tiny, TEXT)
    for layer in range(analysis.num_layers):
        split = sink_split(analysis, layer, sink)
        s = split.sink_ratio[..., None]
        rest = torch.nan_to_num(split.rest_mean)  # NaN only where 1 − s = 0
        rebuilt = s * split.sink_value[:, None, :] + (1 - s) * rest  # (H, Q, D)
        scale = split.head_output.abs().max()
        torch.testing.assert_close(rebuilt, split.head_output, atol=1e-5 * scale, rtol=1e-4)
        torch.testing.assert_close(rebuilt.sum(0), model_out[layer], atol=1e-4 * scale, rtol=1e-4)


@pytest.mark.parametrize("sink", [0, 3])
def test_norms_in_head_space_equal_the_split_in_model_space(tiny, sink):
    """sink_norms (what the sinks table and the atlas read: d_head-wide products through G^h) gives the norms and the
    cosine of the reference split's d_model vectors (tests/sink_reference.py), NaN in the same places, on every
    architecture."""
    from cwviz.core.method.measures import expand_kv, head_grams

    analysis = analyze(tiny, TEXT)
    for layer in range(analysis.num_layers):
        split = sink_split(analysis, layer, sink)
        record = analysis.layer_record(layer)
        value = expand_kv(record.value.float(), analysis.num_heads)
        norms = sinks.sink_norms(
            analysis.attention_tensor(layer),
            value,
            head_grams(tiny.gram(layer), analysis.num_heads),
            sink,
            record.key_mask(),
        )
        expected = {
            "rest_norm": split.rest_mean.norm(dim=-1),
            "cos_sink_rest": cosine(split.sink_value[:, None, :], split.rest_mean),
            "sink_value_norm": split.sink_value.norm(dim=-1),
            "sink_ratio": split.sink_ratio,
        }
        for name, want in expected.items():
            torch.testing.assert_close(getattr(norms, name), want, rtol=1e-4, atol=1e-5, equal_nan=True, msg=name)
        assert torch.equal(norms.other_keys, split.other_keys) and torch.equal(norms.sees_sink, split.sees_sink)


def test_rest_is_undefined_exactly_where_the_query_sees_only_the_sink(tiny):
    analysis = analyze(tiny, TEXT)
    table = sinks.sink_table(analysis, 0)
    undefined = table["rest_norm"].isna()
    if tiny.arch.causal:
        assert set(table.loc[undefined, "query"]) == {0}
        assert (table.loc[table["query"] == 0, "sink_ratio"] == 1).all()
    else:
        assert not undefined.any()
    assert (undefined == (table["other_keys"] == 0)).all()
    assert table.loc[~undefined, ["rest_norm", "cos_sink_rest", "output_norm"]].notna().all().all()


def test_table_has_one_row_per_layer_head_and_query_that_sees_the_sink(llama):
    bundle, analysis = llama
    T, H, L = analysis.num_tokens, analysis.num_heads, analysis.num_layers
    table = sinks.sink_table(analysis, sink=3)
    assert list(table.columns) == list(sinks.TABLE_COLUMNS)
    assert len(table) == L * H * (T - 3)  # causal: queries 0..2 cannot see token 3
    assert table[["layer", "head", "query"]].duplicated().sum() == 0
    assert table["query"].min() == 3
    row = table[(table["layer"] == 1) & (table["head"] == 2) & (table["query"] == 7)].iloc[0]
    assert row.sink_ratio == pytest.approx(analysis.attention(1)[2, 7, 3])
    assert row.sink_contribution_share == pytest.approx(analysis.contributions(1, "intra")[2, 7, 3])
    assert row.other_keys == 7  # keys 0..7 except the sink


def test_table_norms_follow_the_convex_identity(llama):
    """‖o‖² = s²‖ṽ‖² + 2s(1 − s)‖ṽ‖‖m‖cos + (1 − s)²‖m‖² row by row."""
    _, analysis = llama
    table = sinks.sink_table(analysis).dropna()
    curve = sinks.SinkCurve(
        table.sink_value_norm.to_numpy(), table.rest_norm.to_numpy(), table.cos_sink_rest.to_numpy()
    )
    np.testing.assert_allclose(curve.norm(table.sink_ratio.to_numpy()), table.output_norm, rtol=1e-4, atol=1e-5)


def test_layer_summary_shares_equal_the_layer_level_scores(llama):
    """Attention share = head-averaged attention on the sink; contribution share = Σ_h C_iσ^h."""
    _, analysis = llama
    summary = sinks.sink_layer_summary(sinks.sink_table(analysis)).set_index("layer")
    for layer in range(analysis.num_layers):
        raw = analysis.layer_scores(layer, "raw")[1:, 0]  # query 0 sees only the sink: left out
        contribution = analysis.layer_scores(layer, "contribution_inter")[1:, 0]
        assert summary.loc[layer, "sink_attention_share"] == pytest.approx(raw.mean(), rel=1e-5)
        assert summary.loc[layer, "sink_contribution_share"] == pytest.approx(contribution.mean(), rel=1e-4, abs=1e-6)


def test_pooled_table_and_summaries(llama):
    bundle, analysis = llama
    other = analyze(bundle, "A second, shorter prompt.")
    pooled = sinks.pooled_sink_table([analysis, other])
    assert pooled["prompt"].tolist().count(1) == len(sinks.sink_table(other))
    summary = sinks.sink_layer_summary(pooled)
    assert len(summary) == analysis.num_layers
    heads = sinks.sink_head_summary(pooled)
    assert len(heads) == analysis.num_layers * analysis.num_heads
    assert heads["minimising_ratio"].between(0, 1).all()
    with pytest.raises(InputError):
        sinks.pooled_sink_table([])


# -- sink choice ---------------------------------------------------------------------------------------
def test_detect_sink_is_the_key_with_the_largest_mean_attention(tiny):
    analysis = analyze(tiny, TEXT)
    T = analysis.num_tokens
    received = np.zeros(T)
    seen = np.zeros(T)
    for layer in range(analysis.num_layers):
        alpha = analysis.attention(layer)
        for key in range(T):
            received[key] += alpha[:, :, key].sum()
            seen[key] += (alpha[:, :, key] > 0).sum()  # the queries that see it (causal, sliding window)
    assert sinks.detect_sink(analysis) == int(np.argmax(received / seen))
    assert sinks.resolve_sink(analysis, "auto") == sinks.detect_sink(analysis)


def test_resolve_sink(llama):
    _, analysis = llama
    assert sinks.resolve_sink(analysis, 0) == 0
    assert sinks.resolve_sink(analysis, "4") == 4
    assert sinks.resolve_sink(analysis, -1) == analysis.num_tokens - 1
    with pytest.raises(SelectionError, match="out of range"):
        sinks.resolve_sink(analysis, analysis.num_tokens)
    with pytest.raises(InputError, match="'auto'"):
        sinks.resolve_sink(analysis, "first-ish")


# -- the analytic curve --------------------------------------------------------------------------------
vectors = st.lists(st.floats(-10, 10, allow_nan=False, allow_subnormal=False), min_size=6, max_size=6)


@settings(max_examples=200, deadline=None)
@given(vectors, vectors)
def test_curve_and_minimiser_against_brute_force(v_sink, m):
    v_sink, m = np.array(v_sink), np.array(m)
    a, b = np.linalg.norm(v_sink), np.linalg.norm(m)
    if a < 1e-3 or b < 1e-3:
        return
    curve = sinks.SinkCurve(a, b, float(v_sink @ m / (a * b)))
    s = np.linspace(0, 1, 20001)
    brute = np.linalg.norm(s[:, None] * v_sink + (1 - s[:, None]) * m, axis=1)
    np.testing.assert_allclose(curve.norm(s), brute, rtol=1e-7, atol=1e-7 * max(a, b))
    assert 0 <= curve.minimiser <= 1
    assert curve.minimum == pytest.approx(brute.min(), rel=1e-6, abs=1e-6 * max(a, b))
    assert curve.minimum <= brute.min() + 1e-9 * max(a, b)
    assert np.all(np.diff(curve.norm(s) ** 2, 2) >= -1e-9 * max(a, b) ** 2)  # convex in s
    if curve.cos < -1e-6:  # anti-aligned: the minimum lies strictly inside (0, 1)
        assert 0 < curve.minimiser < 1


def test_curve_minimiser_cases():
    assert sinks.SinkCurve(1.0, 1.0, -1.0).minimiser == pytest.approx(0.5)  # opposite: cancel at 1/2
    assert sinks.SinkCurve(1.0, 1.0, -1.0).minimum == pytest.approx(0.0, abs=1e-12)
    assert sinks.SinkCurve(1.0, 3.0, 1.0).minimiser == 1.0  # aligned, sink shorter: all on the sink
    assert sinks.SinkCurve(2.0, 2.0, 1.0).minimiser == 0.0  # identical vectors: flat
    assert math.isnan(sinks.SinkCurve(1.0, math.nan, 0.0).minimiser)
    table = sinks.SinkCurve(1.0, 2.0, -0.3).table(11)
    assert list(table.columns) == ["sink_ratio", "output_norm"] and len(table) == 11


def test_head_curve_uses_the_heads_medians(llama):
    _, analysis = llama
    table = sinks.sink_table(analysis)
    curve = sinks.head_curve(table, 1, 2)
    rows = table[(table["layer"] == 1) & (table["head"] == 2)].dropna()
    assert curve.rest_norm == pytest.approx(rows.rest_norm.median())
    assert curve.cos == pytest.approx(rows.cos_sink_rest.median())
    with pytest.raises(SelectionError):
        sinks.head_curve(table[table["query"] == 0], 1, 2)


# -- interventions -------------------------------------------------------------------------------------
def test_semantic_cone_is_the_mean_pairwise_cosine():
    """Made in each head's value space through G^h, it is the mean pairwise cosine of the outputs o_i^h = W_O^h z_i^h
    in d_model space (a zero output left out)."""
    torch.manual_seed(0)
    z = torch.randn(3, 7, 4)  # (H, Q, d_head)
    w = torch.randn(3, 6, 4)  # W_O^h, (H, d_model, d_head)
    z[1, 2] = 0  # a zero output is left out
    out = torch.einsum("hqd,hmd->hqm", z, w)
    grams = w.transpose(1, 2) @ w  # (H, d_head, d_head)
    positions = torch.tensor([False, True, True, True, True, True, True])
    cone = semantic_cone(z, grams, positions)
    np.testing.assert_allclose(head_output_norms(z, grams), out.norm(dim=-1), rtol=1e-5, atol=1e-6)
    for h in range(3):
        vecs = [out[h, i] for i in range(7) if positions[i] and out[h, i].norm() > 0]
        pairs = [torch.cosine_similarity(u, v, dim=0) for i, u in enumerate(vecs) for j, v in enumerate(vecs) if i != j]
        assert float(cone[h]) == pytest.approx(float(torch.stack(pairs).mean()), abs=1e-6)
    same = torch.ones(1, 4, 3)
    assert float(semantic_cone(same, torch.eye(3)[None], torch.ones(4, dtype=torch.bool))[0]) == pytest.approx(1.0)


def _clean_logits(bundle, analysis):
    return logits(bundle, torch.tensor([analysis.input_ids]))


def test_factor_one_changes_nothing_and_the_model_stays_clean(llama):
    """λ = 1: a change of exactly 0 and the analysis's perplexity. Exact, not to a tolerance: the before side reduces
    the z the analysis's pass recorded and the after side the z of a pass run the same way with nothing changed
    (ScaleValues at λ = 1 returns the values as they are), through one reduction (sink_interventions._layer_stats) on
    the same layout, so the arithmetic is the same to the bit; a difference would mean the record is not what the model
    continued with."""
    bundle, analysis = llama
    before = _clean_logits(bundle, analysis)
    result = sink_interventions.intervene_on_sink(analysis, factor=1.0)
    assert result.delta_ppl == 0.0
    assert (result.table["output_norm_change"] == 0).all()
    assert (result.table["cone_change"] == 0).all()
    assert torch.equal(_clean_logits(bundle, analysis), before)


class _Passes:
    """Counts the forward passes of ``bundle`` in the block: every pass runs layer 0's attention once (a forward
    pre-hook, always removed)."""

    def __init__(self, bundle):
        self.module, self.count = bundle.attention_modules[0], 0

    def __enter__(self):
        self.handle = self.module.register_forward_pre_hook(lambda *_: setattr(self, "count", self.count + 1))
        return self

    def __exit__(self, *_):
        self.handle.remove()


def test_head_output_stats_runs_no_forward_pass_and_a_factor_runs_one(llama):
    """The clean side is the analysis's records reduced: no pass of the model; a λ without it given costs one pass."""
    bundle, analysis = llama
    with _Passes(bundle) as passes:
        stats = sink_interventions.head_output_stats(analysis, 0)
    assert passes.count == 0 and len(stats) == analysis.num_layers
    with _Passes(bundle) as passes:
        sink_interventions.intervene_on_sink(analysis, 0, 0.0)
    assert passes.count == 1


def _without_key(tokens: int, key: int, layer: int) -> KeepKeys:
    keep = torch.ones(1, 1, tokens, tokens)
    keep[..., key] = 0
    return KeepKeys({layer: keep})


#: Interventions an analysis is made under, by the number of tokens: the sink's value removed in layer 0 (what
#: λ = 0 there does), and key 2's write removed in layer 1 (a keep weight, which λ's ScaleValues does not have).
UNDER = {
    "sink removed": lambda tokens: ScaleValues(positions=(0,), factor=0.0, layers=frozenset({0})),
    "key removed": lambda tokens: _without_key(tokens, 2, 1),
}


def test_head_output_stats_of_an_intervened_analysis_are_its_own_pass(llama):
    """An analysis made under the sink intervention gets its own numbers (not the clean model's): those of the
    intervened pass as intervene_on_sink reduces it, to the bit (one reduction, the same z)."""
    bundle, analysis = llama
    removed = analyze(bundle, input_ids=analysis.input_ids, intervention=ScaleValues(positions=(0,), factor=0.0))
    own, clean = sink_interventions.head_output_stats(removed, 0), sink_interventions.head_output_stats(analysis, 0)
    assert (own["cone"] - clean["cone"]).abs().max() > 1e-3
    assert (own["output_norm"] - clean["output_norm"]).abs().max() > 1e-3
    after = sink_interventions.intervene_on_sink(analysis, 0, 0.0).table
    np.testing.assert_array_equal(own["output_norm"], after["output_norm_after"])
    np.testing.assert_array_equal(own["cone"], after["cone_after"])


@pytest.mark.parametrize("name", list(UNDER))
def test_intervening_on_an_intervened_analysis_changes_it_on_top_of_its_own(llama, name):
    """intervene_on_sink of an analysis made under an intervention compares against that analysis (its records and its
    perplexity), and its after side repeats the analysis's intervention with λ on top: λ = 1 changes nothing (exactly,
    as for a plain analysis), and the sink removed in layer 1 on top of layer 0 is the analysis of both layers
    removed."""
    bundle, analysis = llama
    under = analyze(bundle, input_ids=analysis.input_ids, intervention=UNDER[name](analysis.num_tokens))
    one = sink_interventions.intervene_on_sink(under, 0, 1.0)
    assert one.perplexity_clean == under.perplexity != analysis.perplexity
    assert one.perplexity == under.perplexity
    assert (one.table["output_norm_change"] == 0).all() and (one.table["cone_change"] == 0).all()
    np.testing.assert_array_equal(one.table["cone_before"], sink_interventions.head_output_stats(under, 0)["cone"])
    if name == "sink removed":
        on_top = sink_interventions.intervene_on_sink(under, 0, 0.0, layers=[1])
        both = analyze(bundle, input_ids=analysis.input_ids, intervention=ScaleValues((0,), 0.0, frozenset({0, 1})))
        expected = sink_interventions.head_output_stats(both, 0)
        np.testing.assert_array_equal(on_top.table["output_norm_after"], expected["output_norm"])
        np.testing.assert_array_equal(on_top.table["cone_after"], expected["cone"])
        assert on_top.perplexity == both.perplexity


def test_factor_zero_equals_explicit_removal_of_the_sinks_write(llama):
    """λ = 0 in layer 0 equals dropping α_iσ ṽ_σ from every head output there (KeepKeys), measured in
    perplexity and in the head outputs of both layers; the model is clean afterwards."""
    bundle, analysis = llama
    before = _clean_logits(bundle, analysis)
    sink = 2
    result = sink_interventions.intervene_on_sink(analysis, sink=sink, factor=0.0, layers=[0])
    assert torch.equal(_clean_logits(bundle, analysis), before)

    T = analysis.num_tokens
    keep = torch.ones(1, 1, T, T)
    keep[..., sink] = 0
    explicit = KeepKeys({0: keep})
    ids = torch.tensor([analysis.input_ids])
    assert result.perplexity == pytest.approx(float(batch_perplexity(bundle, ids, explicit)[0]), rel=1e-5)
    assert result.perplexity_clean == pytest.approx(analysis.perplexity, rel=1e-6)

    from cwviz.core.method.attention import attention_probabilities
    from cwviz.core.method.capture import forward_pass

    with torch.inference_mode(), forward_pass(bundle.attention_modules, record=True, intervention=explicit) as records:
        bundle.model(input_ids=ids, use_cache=False)
    assert torch.equal(_clean_logits(bundle, analysis), before)
    for layer in range(analysis.num_layers):
        rec = records[layer]
        alpha = attention_probabilities(rec.query.float(), rec.key.float(), rec.scaling, rec.mask, rec.causal)[None]
        if layer == 0:
            alpha = alpha * keep
        z = alpha[0] @ expand_kv(rec.value.float(), analysis.num_heads)
        out = torch.einsum("hqd,hmd->hqm", z, analysis.w_heads(layer).detach())
        expected = out.norm(dim=-1)[:, sink:].mean()  # queries that see the sink and another key
        row = result.table.set_index("layer").loc[layer]
        assert row.output_norm_after == pytest.approx(float(expected), rel=1e-5)
        assert bool(row.intervened) == (layer == 0)


def test_batched_removal_matches_single_interventions(llama):
    bundle, analysis = llama
    before = _clean_logits(bundle, analysis)
    tokens = 2 * analysis.num_tokens
    batched = sink_interventions.removal_perplexity(
        analysis, [[0], [1], None], sink=0, factor=0.25, max_batch_tokens=tokens
    )
    single = [sink_interventions.intervene_on_sink(analysis, 0, 0.25, layers).perplexity for layers in ([0], [1], None)]
    np.testing.assert_allclose(batched, single, rtol=1e-5)
    layerwise = sink_interventions.layerwise_removal(analysis)
    assert list(layerwise["layer"]) == list(range(analysis.num_layers))
    np.testing.assert_allclose(layerwise["delta_ppl"], layerwise["perplexity"] - analysis.perplexity)
    assert torch.equal(_clean_logits(bundle, analysis), before)


def _assert_same_intervention(analysis, sink, factor, layers, rtol=1e-5, atol=1e-6):
    """intervene_on_sink (one pass that records nothing) against the recorded way (tests/sink_reference.py)."""
    result = sink_interventions.intervene_on_sink(analysis, sink, factor, layers)
    before, after, perplexity = recorded_intervention(analysis, sink, factor, layers)
    table = result.table
    for column, expected in (("before", before), ("after", after)):
        np.testing.assert_allclose(table[f"output_norm_{column}"], expected["output_norm"], rtol=rtol, atol=atol)
        np.testing.assert_allclose(table[f"cone_{column}"], expected["cone"], rtol=rtol, atol=atol, equal_nan=True)
    np.testing.assert_allclose(result.perplexity, perplexity, rtol=rtol, equal_nan=True)
    assert result.perplexity_clean == analysis.perplexity or math.isnan(analysis.perplexity)


@pytest.mark.parametrize("family", list(FAMILY_CONFIGS))
def test_the_one_pass_intervention_equals_the_recorded_one_in_every_family(family):
    """Every row of the architecture table and the derived ones (sliding windows, soft-capping, learned sinks,
    encoders): the intervention reduced during a pass that records nothing gives the numbers of a whole recorded
    analysis of the intervened pass, in every layer and in the perplexity."""
    bundle = cwviz.bundle_from_model(family_model(family), CharTokenizer(100), model_id=f"tiny-{family}")
    analysis = analyze(bundle, TEXT)
    _assert_same_intervention(analysis, 0, 0.0, None)
    _assert_same_intervention(analysis, 3, 0.5, (1,))


def test_the_one_pass_intervention_equals_the_recorded_one_on_the_embedded_model(embedded):
    analysis = analyze(
        embedded, "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May."
    )
    _assert_same_intervention(analysis, 0, 0.0, None, rtol=1e-4, atol=1e-5)
    _assert_same_intervention(analysis, 0, 1.5, (3, 4), rtol=1e-4, atol=1e-5)


def test_intervention_input_errors(llama):
    _, analysis = llama
    with pytest.raises(InputError, match="finite"):
        sink_interventions.intervene_on_sink(analysis, factor=math.nan)
    with pytest.raises(SelectionError, match="at least one layer"):
        sink_interventions.intervene_on_sink(analysis, layers=[])
    with pytest.raises(SelectionError):
        sink_interventions.intervene_on_sink(analysis, layers=[99])


def test_encoder_interventions_report_no_perplexity():
    bundle = make_tiny("bert")
    analysis = analyze(bundle, TEXT)
    result = sink_interventions.intervene_on_sink(analysis, factor=0.0)
    assert math.isnan(result.delta_ppl)
    assert np.isfinite(result.table[["output_norm_change", "cone_after"]].to_numpy()).all()
    assert np.isnan(sink_interventions.removal_perplexity(analysis, [None])).all()


# -- charts (pure) -------------------------------------------------------------------------------------
def test_each_sinks_chart_is_a_valid_spec_drawn_from_its_table(llama):
    from tests.helpers import assert_drawn_from, datasets

    _, analysis = llama
    table = sinks.sink_table(analysis)
    curve = sinks.head_curve(table, 1, 0)
    points = table[(table["layer"] == 1) & (table["head"] == 0)]
    heads, layers = sinks.sink_head_summary(table), sinks.sink_layer_summary(table)
    intervention = sink_interventions.intervene_on_sink(analysis).table
    built = [
        (charts.ratio_norm_chart(points, curve.table(), curve.minimiser, "layer 1, head 0"), points),
        (charts.anti_alignment_map(heads, layer=1, head=0), heads),
        (charts.intervention_chart(intervention), intervention),
    ]
    for chart, drawn in built:
        chart.to_dict()  # validates against the Vega-Lite schema (raises otherwise)
        assert_drawn_from(chart, drawn)
    share = charts.share_chart(layers, layer=1)
    share.to_dict()
    rows = datasets(share)[0]  # the summary in long form: one bar per layer and measure
    drawn = {(r["layer"], r["measure"]): r["share"] for r in rows}
    assert {k: v for (k, m), v in drawn.items() if m == "attention"} == pytest.approx(
        dict(zip(layers["layer"], layers["sink_ratio"]))
    )
    assert {m for _, m in drawn} == {"attention", "contribution weight"} and len(rows) == 2 * len(layers)


# -- the embedded model --------------------------------------------------------------------------------
def test_embedded_gsm8k_item_table_charts_and_intervention(embedded):
    (text,) = read_texts(GSM8K, n=1)
    analysis = analyze(embedded, text)
    table = sinks.sink_table(analysis, sink="auto")
    assert len(table) == analysis.num_layers * analysis.num_heads * analysis.num_tokens
    defined = table[table.other_keys > 0]
    numeric = [
        "sink_ratio",
        "output_norm",
        "sink_value_norm",
        "rest_norm",
        "cos_sink_rest",
        "sink_attention_share",
        "sink_contribution_share",
        "sink_contribution_inter",
    ]
    assert np.isfinite(defined[numeric].to_numpy()).all()
    layers = sinks.sink_layer_summary(table)
    heads = sinks.sink_head_summary(table)
    assert np.isfinite(layers.drop(columns="layer").to_numpy()).all()
    curve = sinks.head_curve(table, 15, 0)
    points = table[(table["layer"] == 15) & (table["head"] == 0)]
    for chart in (
        charts.ratio_norm_chart(points, curve.table(), curve.minimiser),
        charts.anti_alignment_map(heads, 15, 0),
        charts.share_chart(layers, 15),
    ):
        chart.to_dict()
    result = sink_interventions.intervene_on_sink(analysis, sink="auto", factor=0.0, layers=[3, 4])
    assert math.isfinite(result.delta_ppl)
    assert np.isfinite(result.table.drop(columns=["layer", "intervened"]).to_numpy()).all()
    spec = charts.intervention_chart(result.table).to_dict()
    # The legend says which layers' sink value was scaled, in words, and the bars follow the intervention's layers.
    bars = next(chart for chart in spec["vconcat"] if chart["mark"]["type"] == "bar")
    assert bars["encoding"]["color"]["field"] == "sink_value"
    assert bars["encoding"]["color"]["scale"]["domain"] == [charts.SCALED, charts.UNCHANGED]
    (label,) = [step["calculate"] for step in bars["transform"] if step.get("as") == "sink_value"]
    assert label == f"datum.intervened ? '{charts.SCALED}' : '{charts.UNCHANGED}'"
    rows = spec["datasets"][bars["data"]["name"]]
    assert {row["layer"] for row in rows if row["intervened"]} == {3, 4}


@pytest.mark.parametrize("arch", ["llama", "mistral", "bert"])
def test_the_table_read_in_row_blocks_equals_the_whole_layer_table(arch, monkeypatch):
    """Blocks of 5 query rows (across the causal row blocks, a sliding window, an encoder) give the table
    that one block of every row gives."""
    from tests.helpers import LONG_TEXT

    analysis = analyze(make_tiny(arch), LONG_TEXT[:60])
    whole = sinks.sink_table(analysis, 0)
    monkeypatch.setattr(row_block_sizes, "ROW_BLOCK_CELLS", 5 * analysis.num_tokens)
    blocked = sinks.sink_table(analysis, 0)
    pd.testing.assert_frame_equal(blocked, whole, check_exact=False, atol=1e-5, rtol=1e-4)


def test_cli_shows_the_learned_sink_share_for_a_model_with_learned_sinks(monkeypatch, capsys):
    from cwviz.cli import main
    from cwviz.cli import sinks as command

    for model_type, shown in (("gpt_oss", True), ("llama", False)):
        bundle = cwviz.bundle_from_model(family_model(model_type), CharTokenizer(100), model_id=f"tiny-{model_type}")
        monkeypatch.setattr(command, "load", lambda _args, bundle=bundle: bundle)
        assert main(["sinks", "--text", "The quick brown fox jumps.", "--no-ppl"]) == 0
        out = capsys.readouterr().out
        assert ("learned_sink" in out) == shown
        if shown:
            header = next(line.split() for line in out.splitlines() if line.split()[:1] == ["layer"])
            rows = [line.split() for line in out.splitlines() if line.split()[:1] in (["0"], ["1"])]
            column = header.index("learned_sink")
            assert all(0 < float(row[column]) < 1 for row in rows)
