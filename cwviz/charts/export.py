"""Chart and table export: PNG and SVG through vl-convert (no browser, no network), CSV through pandas."""

from __future__ import annotations

import altair as alt
import pandas as pd

FORMATS = ("png", "svg")


def render_spec(spec: dict, fmt: str, scale: float = 2.0) -> bytes:
    """A Vega-Lite spec as PNG or SVG bytes."""
    import vl_convert as vlc

    if fmt == "png":
        return vlc.vegalite_to_png(spec, scale=scale)
    if fmt == "svg":
        return vlc.vegalite_to_svg(spec).encode("utf-8")
    raise ValueError(f"format must be one of {', '.join(FORMATS)}, not {fmt!r}")


def to_png(chart: alt.TopLevelMixin, scale: float = 2.0) -> bytes:
    return render_spec(chart.to_dict(), "png", scale)


def to_svg(chart: alt.TopLevelMixin) -> bytes:
    return render_spec(chart.to_dict(), "svg")


def to_csv(frame: pd.DataFrame) -> bytes:
    return frame.to_csv(index=False).encode("utf-8")
