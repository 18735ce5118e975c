"""Token-page chart builders: the factors of one query's contributions, and its top keys across layers. Pure."""

from __future__ import annotations

import altair as alt
import pandas as pd

from ..analyses.schema import TokenFactors
from .heatmaps import PAIR_FITS, SYMLOG_CONSTANT, TITLE_PX_PER_CHAR, contribution_scale, label_expr, wrap
from .palette import KEY, NEGATIVE, POSITIVE, SINK

FACTOR_TITLES = {
    "attention": "attention α",
    "norm_ratio": "norm ratio ‖ṽ_k‖ / ‖o_q‖",
    "cosine": "cosine cos(o_q, ṽ_k)",
    "contribution": "contribution = product",
}
#: Bar colours of the attention, norm ratio and cosine panels: outside the maps' red and blue, which the
#: contribution panel uses for its sign (the sink purple, other keys dark grey; gridlines are light grey).
SINK_COLOUR, KEY_COLOUR = SINK, KEY
#: The contribution panel's bars: the ends of the maps' diverging scale, so a bar's colour says its sign.
POSITIVE_COLOUR, NEGATIVE_COLOUR = POSITIVE, NEGATIVE
#: Pixels the key labels of a token chart take; the narrowest column a layer gets in the top keys chart (its rank,
#: two digits, still fits).
KEY_LABELS, MIN_LAYER_STEP = 160, 16
#: Pixels of a factor's panel: four panels and the key labels fit the page of a 1,366 px window.
PANEL_WIDTH = 160


def _labels(keys: pd.Series, tokens: pd.Series) -> list[str]:
    """Labels indexed by position (positions not shown get an empty label)."""
    labels = [""] * (int(keys.max()) + 1 if len(keys) else 1)
    for key, token in zip(keys, tokens):
        labels[int(key)] = f"{token} ({int(key)})"
    return labels


#: How the key a page's sentence names is labelled on the factor bars' key axis (its bars are outlined too).
MARKED = "▶ "


def factor_bars(factors: TokenFactors, mark: int | None = None) -> alt.HConcatChart:
    """One panel of horizontal bars per factor, keys sorted by contribution (largest on top), the sink in purple.

    The panels share one dataset (``factors.frame``, one row per key and factor). ``mark``: a key whose bars are
    outlined in black and whose label starts with :data:`MARKED` (the key a page's sentence names).
    """
    frame = factors.frame
    order = factors.wide["key"].astype(int).tolist()
    labels = _labels(factors.wide["key"], factors.wide["token"])
    if mark is not None and 0 <= mark < len(labels) and labels[mark]:
        labels[mark] = MARKED + labels[mark]
    outlined = {"stroke": alt.condition(alt.datum.key == mark, alt.value("black"), alt.value(None)), "strokeWidth": alt.value(2)}
    height = max(120, 18 * len(order))
    colour = alt.condition("datum.is_sink", alt.value(SINK_COLOUR), alt.value(KEY_COLOUR))
    tooltip = [
        alt.Tooltip("key:O", title="key"),
        alt.Tooltip("token:N", title="key token"),
        alt.Tooltip("factor:N"),
        alt.Tooltip("value:Q", format="+.4f"),
        alt.Tooltip("is_sink:N", title="sink (first token)"),
    ]
    titles = dict(FACTOR_TITLES)
    if "norm_ratio" not in factors.factors:
        titles["contribution"] = "contribution (all heads)"
    # The contribution panel's bars are red (adds) or blue (subtracts), at full strength whatever their length, on a
    # symmetric-log axis: beside the sink's +1, a key's -0.003 is a bar a reader sees, not a hairline.
    contributions = factors.wide["contribution"]
    panels = []
    for i, name in enumerate(factors.factors):
        axis = alt.Axis(labelExpr=label_expr(labels), labelLimit=140, labelOverlap=False) if i == 0 else None
        x = alt.X("value:Q", title=titles.get(name, name))
        fill = colour
        if name == "contribution":
            bound = float(contributions.abs().max()) if len(contributions) else 1.0
            # The axis is linear up to the typical key's |contribution| and logarithmic beyond: a typical key's bar
            # is a tenth of the sink's, however small both are.
            typical = contributions[~factors.wide["is_sink"]].abs().median()
            constant = float(typical) if len(contributions) > 1 and typical > 0 else SYMLOG_CONSTANT
            x = alt.X(
                "value:Q",
                title=f"{titles.get(name, name)} (symlog)",
                scale=alt.Scale(type="symlog", constant=constant, domain=[-bound, bound], nice=False),
            )
            fill = alt.condition("datum.value < 0", alt.value(NEGATIVE_COLOUR), alt.value(POSITIVE_COLOUR))
        panels.append(
            alt.Chart(frame)
            .transform_filter(alt.datum.factor == name)
            .mark_bar()
            .encode(
                y=alt.Y("key:O", sort=order, title="key" if i == 0 else None, axis=axis),
                x=x,
                color=fill,
                tooltip=tooltip,
                **(outlined if mark is not None else {}),
            )
            .properties(width=PANEL_WIDTH, height=height, title=titles.get(name, name))
        )
    width = len(panels) * (PANEL_WIDTH + 8) + KEY_LABELS
    lines = wrap(
        factors.note + "; the sink (first token) in purple; contributions red (adds) or blue (subtracts) on a symmetric-log axis",
        width // TITLE_PX_PER_CHAR,
    )
    return alt.hconcat(*panels, data=frame, spacing=8).properties(title=alt.TitleParams(lines, anchor="start", fontSize=13))


def top_keys_chart(frame: pd.DataFrame, note: str) -> alt.LayerChart:
    """Layers (x) against the keys that rank in the query's top k anywhere (y), coloured by contribution,
    each cell marked with its rank in that layer."""
    labels = _labels(frame["key"], frame["token"])
    y = alt.Y("key:O", title="key", sort="ascending", axis=alt.Axis(labelExpr=label_expr(labels), labelLimit=140, labelOverlap=False))
    base = alt.Chart(frame).encode(
        x=alt.X("layer:O", title="layer"),
        y=y,
        tooltip=[
            alt.Tooltip("layer:O"),
            alt.Tooltip("rank:O"),
            alt.Tooltip("key:O"),
            alt.Tooltip("token:N", title="key token"),
            alt.Tooltip("contribution:Q", format="+.4f"),
            alt.Tooltip("attention:Q", format=".4f"),
        ],
    )
    scale, rule = contribution_scale(frame["contribution"], frame["key"] == 0)
    legend = alt.Legend(orient="bottom", direction="horizontal", title=f"contribution ({', '.join(rule)})", titleLimit=400)
    rects = base.mark_rect().encode(color=alt.Color("contribution:Q", scale=scale, legend=legend))
    ranks = base.mark_text(fontSize=11).encode(text="rank:O")
    # A step per row and column (not a total height): every key row is 24 px, however few there are; a layer's
    # column is narrower for a deep model, so that the layers fit the page (its legend lies below).
    layers = max(1, frame["layer"].nunique())
    return alt.layer(rects, ranks, data=frame).properties(
        width=alt.Step(max(MIN_LAYER_STEP, min(24, (PAIR_FITS - KEY_LABELS) // layers))),
        height=alt.Step(24),
        title=alt.TitleParams(note, anchor="start", fontSize=13),
    )
