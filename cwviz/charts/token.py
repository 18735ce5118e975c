"""Token-page chart builders: the factors of one query's contributions, and its top keys across layers. Pure."""

from __future__ import annotations

import altair as alt
import pandas as pd

from ..analyses.schema import TokenFactors
from .heatmaps import PAIR_FITS, TITLE_PX_PER_CHAR, label_expr, wrap
from .palette import INK, KEY, NEGATIVE, OTHER_SCHEME, OUTLINE, PAPER, POSITIVE, SINK

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
    outlined = {
        "stroke": alt.condition(alt.datum.key == mark, alt.value(OUTLINE), alt.value(None)),
        "strokeWidth": alt.value(2),
    }
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
    # Every panel is linear, each bar with its value written beside it: a class compares the bars' lengths, and a
    # symmetric-log axis made a key's -0.033 look like -0.6 beside the sink's +1.03. A small bar is read by its number;
    # the contribution panel's bars are red (adds) or blue (subtracts).
    panels = []
    for i, name in enumerate(factors.factors):
        axis = alt.Axis(labelExpr=label_expr(labels), labelLimit=140, labelOverlap=False) if i == 0 else None
        values = factors.wide[name] if name in factors.wide else pd.Series(dtype=float)
        low, high = (
            min(0.0, float(values.min()) if len(values) else 0.0),
            max(0.0, float(values.max()) if len(values) else 1.0),
        )
        # Room beyond the longest bars for their numbers (about a fifth of the panel each side where bars point there).
        pad = 0.35 * max(high - low, 1e-9)
        scale = alt.Scale(
            domain=[low - (pad if low < 0 else 0.0), high + (pad if high > 0 else 0.0)], nice=False, zero=True
        )
        x = alt.X("value:Q", title=titles.get(name, name), scale=scale, axis=alt.Axis(tickCount=3))
        fill = colour
        if name == "contribution":
            fill = alt.condition("datum.value < 0", alt.value(NEGATIVE_COLOUR), alt.value(POSITIVE_COLOUR))
        base = (
            alt.Chart(frame)
            .transform_filter(alt.datum.factor == name)
            .encode(y=alt.Y("key:O", sort=order, title="key" if i == 0 else None, axis=axis))
        )
        bars = base.mark_bar().encode(x=x, color=fill, tooltip=tooltip, **(outlined if mark is not None else {}))
        numbers = (
            base.transform_calculate(text=f"format(datum.value, '{VALUE_FORMATS.get(name, '+.3f')}')")
            .mark_text(
                align={"expr": "datum.value < 0 ? 'right' : 'left'"}, dx={"expr": "datum.value < 0 ? -3 : 3"}, color=INK
            )
            .encode(x=alt.X("value:Q", scale=scale), text="text:N")
        )
        panels.append(
            alt.layer(bars, numbers).properties(width=PANEL_WIDTH, height=height, title=titles.get(name, name))
        )
    width = len(panels) * (PANEL_WIDTH + 8) + KEY_LABELS
    lines = wrap(
        factors.note
        + "; the sink (first token) in purple; contributions red (adds) or blue (subtracts); linear axes, each bar's "
        "value beside it",
        width // TITLE_PX_PER_CHAR,
    )
    return alt.hconcat(*panels, data=frame, spacing=8).properties(
        title=alt.TitleParams(lines, anchor="start", fontSize=13)
    )


#: How each factor's number is written beside its bar (the tour's sentences print them alike:
#: :data:`cwviz.analyses.tour_story.FACTS`).
VALUE_FORMATS = {"attention": ".3f", "norm_ratio": ".2f", "cosine": "+.2f", "contribution": "+.3f"}


def top_keys_chart(frame: pd.DataFrame, note: str) -> alt.LayerChart:
    """Layers (x) against the keys that rank in the query's top k anywhere (y), each cell marked with its rank in that
    layer and shaded by it (greys, darker: higher; the contribution itself in the tooltip)."""
    labels = _labels(frame["key"], frame["token"])
    y = alt.Y(
        "key:O",
        title="key",
        sort="ascending",
        axis=alt.Axis(labelExpr=label_expr(labels), labelLimit=140, labelOverlap=False),
    )
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
    # The cells are coloured by rank (greys: darker, higher), not by the contribution's red: a rank is no sign, and a
    # reader took the red shades for the rank. The contribution is in the tooltip and on the factor bars above.
    ranks = int(frame["rank"].max()) if len(frame) else 1
    legend = alt.Legend(
        orient="bottom", direction="horizontal", title="rank in the layer (1: the largest contribution)", titleLimit=400
    )
    scale = alt.Scale(scheme=OTHER_SCHEME, reverse=True, domain=[1, max(ranks, 2)])
    rects = base.mark_rect().encode(color=alt.Color("rank:Q", scale=scale, legend=legend))
    text = base.mark_text(fontSize=11).encode(
        text="rank:O", color=alt.condition(f"datum.rank <= {max(1, ranks // 2)}", alt.value(PAPER), alt.value(INK))
    )
    # A step per row and column (not a total height): every key row is 24 px, however few there are; a layer's
    # column is narrower for a deep model, so that the layers fit the page (its legend lies below).
    layers = max(1, frame["layer"].nunique())
    return alt.layer(rects, text, data=frame).properties(
        width=alt.Step(max(MIN_LAYER_STEP, min(24, (PAIR_FITS - KEY_LABELS) // layers))),
        height=alt.Step(24),
        title=alt.TitleParams(note, anchor="start", fontSize=13),
    )
