"""The per-item numbers of claims 2–5 (docs/METHOD.md section 5) on constructed inputs: claim 2's Spearman
correlations, claim 3's sink-active heads, claim 4's per-head quadratic fit, claim 5's low-norm outputs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from cwviz.analyses import claim_items


def test_geometry_rhos_read_the_factorisation_c_equals_attention_times_geometry():
    """c = α × geometry: with the attention constant, ρ(c, geometry) = 1 and ρ(c, α) is undefined; with the geometry
    constant, the reverse. Rows with α = 0 are left out (c/α undefined)."""
    geometry = np.array([0.1, 0.5, -0.2, 0.9, 0.3])
    rho_geometry, rho_attention = claim_items.geometry_rhos(0.5 * geometry, np.full(5, 0.5))
    assert rho_geometry == pytest.approx(1.0) and np.isnan(rho_attention)
    alpha = np.array([0.125, 0.25, 0.5, 1.0, 0.0])  # powers of two: c / α is 0.5 exactly
    rho_geometry, rho_attention = claim_items.geometry_rhos(alpha * 0.5, alpha)
    assert np.isnan(rho_geometry) and rho_attention == pytest.approx(1.0)


def sink_rows(head: int, ratio: float, cos: float, queries: int = 4, layer: int = 0) -> list[dict]:
    return [
        {"layer": layer, "head": head, "query": q + 1, "other_keys": q + 1, "sink_ratio": ratio, "cos_sink_rest": cos}
        for q in range(queries)
    ]


def test_claim_three_averages_the_sink_active_heads_only():
    """Head 0 puts 0.6 of its attention on the sink and is anti-aligned; head 1 ignores the sink and is aligned: the
    mean over every head is about 0, over the sink-active heads (≥ 0.3) it is head 0's, and weighting by the sink
    ratio leans toward head 0. A threshold no head reaches gives NaN."""
    table = pd.DataFrame(sink_rows(0, 0.6, -0.2) + sink_rows(1, 0.05, 0.2))
    table.loc[len(table)] = {
        "layer": 0,
        "head": 0,
        "query": 0,
        "other_keys": 0,
        "sink_ratio": 1.0,
        "cos_sink_rest": np.nan,
    }
    out = claim_items.active_cosines(table, thresholds=(0.0, 0.3, 0.9))
    assert out["cos_active_0"] == pytest.approx(0.0)
    assert out["cos_active_0.3"] == pytest.approx(-0.2)
    assert np.isnan(out["cos_active_0.9"])
    assert out["cos_weighted"] == pytest.approx((0.6 * -0.2 + 0.05 * 0.2) / 0.65)


def curve_rows(head: int, norm, queries: int = 20, low: float = 0.0, high: float = 1.0) -> list[dict]:
    s = np.linspace(low, high, queries)
    return [
        {"layer": 1, "head": head, "query": q + 1, "other_keys": q + 1, "sink_ratio": s[q], "output_norm": norm(s[q])}
        for q in range(queries)
    ]


def test_claim_four_fits_each_heads_norms_and_finds_u_shapes_with_interior_minima():
    """U-shaped with its minimum at 0.4 (holds for the head); falling (minimum at the end); concave (β2 < 0); U-shaped
    but with its minimum past 1; too few queries, and too narrow a range of sink ratios (not fitted)."""
    table = pd.DataFrame(
        curve_rows(0, lambda s: np.sqrt(1 + 4 * (s - 0.4) ** 2))
        + curve_rows(1, lambda s: np.sqrt(2 - s))
        + curve_rows(2, lambda s: np.sqrt(2 - (s - 0.5) ** 2))
        + curve_rows(3, lambda s: np.sqrt(1 + (s - 1.5) ** 2))
        + curve_rows(4, lambda s: 1 + s, queries=claim_items.FIT_MIN_QUERIES - 1)
        + curve_rows(5, lambda s: 1 + s, low=0.5, high=0.52)
    )
    fits = claim_items.head_fits(table).set_index("head")
    assert fits.fitted.tolist() == [True, True, True, True, False, False]
    assert fits.u_shaped.tolist() == [True, False, False, False, False, False]
    assert fits.loc[0, "minimiser"] == pytest.approx(0.4) and fits.loc[0, "b2"] == pytest.approx(4.0)
    assert fits.loc[3, "minimiser"] == pytest.approx(1.5)
    assert fits.loc[0, "operating"] == pytest.approx(0.5)
    stats = claim_items.fit_statistics(fits.reset_index())
    assert stats["u_shaped_share"] == pytest.approx(1 / 4) and stats["fitted_heads"] == 4
    assert stats["fit_minimiser"] == pytest.approx(0.4) and stats["above_minimum_share"] == 1.0


def test_claim_four_operating_point_measures_the_distance_to_the_minimiser():
    """Three hand-built U-shaped heads, ‖o‖² exactly quadratic in s so the fit finds s* exactly: head 0 operates at its
    minimiser (queries' s from 0.3 to 0.5, median 0.4 = s*), head 1 short of it (median 0.4, s* = 0.7), head 2 also
    short (median 0.45, s* = 0.85) but head 3 is not sink-active (mean s 0.1 < 0.3) and is left out however far it
    operates. The median distance is head 1's 0.3 (median of 0, 0.3, 0.4), the signed offset −0.3."""
    table = pd.DataFrame(
        curve_rows(0, lambda s: np.sqrt(1 + 4 * (s - 0.4) ** 2), low=0.3, high=0.5)
        + curve_rows(1, lambda s: np.sqrt(1 + 4 * (s - 0.7) ** 2), low=0.2, high=0.6)
        + curve_rows(2, lambda s: np.sqrt(1 + 4 * (s - 0.85) ** 2), low=0.3, high=0.6)
        + curve_rows(3, lambda s: np.sqrt(1 + 4 * (s - 0.9) ** 2), low=0.0, high=0.2)
    )
    fits = claim_items.head_fits(table)
    assert fits.u_shaped.all() and fits.mean_ratio.tolist() == pytest.approx([0.4, 0.4, 0.45, 0.1])
    point = claim_items.operating_point(fits)
    assert point["operating_heads"] == 3
    assert point["operating_distance"] == pytest.approx(0.3) and point["operating_offset"] == pytest.approx(-0.3)
    # only head 0: it operates at its minimum, within the pre-registered line
    near = claim_items.operating_point(fits[fits["head"] == 0])
    assert near["operating_distance"] < 1e-6
    assert np.isnan(claim_items.operating_point(fits[fits["head"] == 3])["operating_distance"])


def test_claim_five_control_keys_come_from_the_mass_band_else_the_nearest():
    """Layer 0: keys 1 (mass 9) and 2 (12) are within ±25 % of the sink's 10, keys 3 and 4 are not: the draw is one of
    the two, seeded (the same item draws the same key; items differ). Layer 1: none is in the band, so the nearest
    (key 2, mass 6). Layer 2: the sink at position 2; keys 0 and 1 equally near, so the lower."""
    mass = np.array([[10.0, 9, 12, 2, 1], [10, 4, 6, 1, 0.5], [5, 15, 10, 2, 1]])
    draws = [claim_items.control_keys(mass[:2], 0, seed=0, example=e) for e in range(20)]
    assert {d.keys[0] for d in draws} == {1, 2} and {d.keys[1] for d in draws} == {2}
    assert draws[3] == claim_items.control_keys(mass[:2], 0, seed=0, example=3)
    assert draws[0].in_band == (True, False) and draws[0].mass_ratio[1] == pytest.approx(0.6)
    assert claim_items.control_keys(mass[2:], 2, seed=0, example=0).keys == (0,)


def test_the_control_removes_each_layers_own_key_and_nothing_else():
    """remove_values((1, 3)) zeroes the value of key 1 in layer 0 and of key 3 in layer 1, every other value kept."""
    removal = claim_items.remove_values((1, 3))
    value = torch.ones(1, 2, 4, 3)  # (B, H_kv, K, d)
    for layer, key in enumerate((1, 3)):
        out = removal.values(layer, value)
        assert (out[..., key, :] == 0).all() and out.sum() == value.sum() - 2 * 3


def test_claim_five_reads_only_the_low_norm_outputs():
    """Eight outputs of one head, the two shortest (the bottom quarter) at right angles to each other; the sink's
    removal turns those two onto the centroid's direction (spread narrows: their cosine 0 -> 1; toward the centroid:
    their mean cosine with it 0.5 -> 1) and leaves the long ones as they were. The long ones alone would show no
    change."""
    centroid = torch.tensor([[1.0, 1.0, 0.0]])  # (H, D)
    before = torch.tensor([[[1.0, 0, 0], [0, 1.0, 0]] + [[0, 0, 5.0 + q] for q in range(6)]])  # (1, 8, 3)
    after = before.clone()
    after[0, :2] = torch.tensor([1.0, 1.0, 0.0])
    everyone = torch.ones(8, dtype=torch.bool)
    spread, toward = claim_items.low_norm_shift(before, after, centroid, centroid, everyone)
    assert spread == pytest.approx(1.0)
    assert toward == pytest.approx(1 - np.sqrt(0.5))
    # positions outside the set are never read: with only the long outputs allowed, nothing changes
    long_only = torch.tensor([False, False] + [True] * 6)
    assert claim_items.low_norm_shift(before, after, centroid, centroid, long_only) == pytest.approx((0.0, 0.0))


def test_the_first_protocols_cone_change_is_the_removed_sinks_own_pass_against_the_clean_one():
    """The evidence row ``cone_change`` compares the pass with the sink's value removed against the clean pass: it
    equals the intervention's table on a tiny model and is not the zero a clean pass against itself would give."""
    import cwviz
    from cwviz.analyses import sink_interventions, sinks
    from cwviz.core.method.interventions import ScaleValues
    from tests.helpers import make_tiny

    bundle = make_tiny("llama")
    analysis = cwviz.analyze(bundle, "the cat sat on the mat and the dog sat on the rug")
    after = cwviz.analyze(bundle, input_ids=analysis.input_ids, intervention=ScaleValues(positions=(0,), factor=0.0))
    draw = claim_items.control_keys(claim_items.attention_mass(analysis), 0, seed=0, example=0)
    control = cwviz.analyze(bundle, input_ids=analysis.input_ids, intervention=claim_items.remove_values(draw.keys))
    stats = claim_items.sink_statistics(analysis, after, sinks.sink_table(analysis, 0), 0, control, draw)
    expected = float(np.nanmean(sink_interventions.intervene_on_sink(analysis, 0, factor=0.0).table["cone_change"]))
    assert stats["cone_change"] == pytest.approx(expected, abs=1e-6)
    assert abs(stats["cone_change"]) > 1e-4
