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


def to_svg(chart: alt.TopLevelMixin) -> bytes:
    return render_spec(chart.to_dict(), "svg")


#: What makes a spreadsheet read a cell as a formula (OWASP, "CSV Injection").
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def neutralise(value: object) -> object:
    """A text cell that starts like a formula, with a leading ``'`` so spreadsheets show it as text.

    The OWASP rule: a cell beginning with ``=``, ``+``, ``-``, ``@``, tab or carriage return is prefixed
    with a single quote. Only text is changed: numbers (negative ones too) stay numbers.
    """
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def csv_text(frame: pd.DataFrame, float_format: str | None = None) -> str:
    """CSV of ``frame`` (no index) with every text cell and column name passed through :func:`neutralise`: tokens are
    user text, and a token like ``=cmd|...`` must not run as a formula when the file is opened. The dashboard's
    downloads and every CSV file a command writes (:mod:`cwviz.cli.outputs`) come from here; ``float_format`` as
    pandas takes it (the commands write ``%.6g``)."""
    safe = frame.rename(columns=lambda c: neutralise(str(c)))
    text_columns = [c for c in safe.columns if safe[c].dtype == object or pd.api.types.is_string_dtype(safe[c])]
    safe[text_columns] = safe[text_columns].map(neutralise) if text_columns else safe[text_columns]
    # CRLF line ends (RFC 4180): with pandas' default "\n" a carriage return inside a token is left
    # unquoted and splits the row; with "\r\n" both characters make the cell quoted.
    return safe.to_csv(index=False, lineterminator="\r\n", float_format=float_format)


def to_csv(frame: pd.DataFrame) -> bytes:
    """:func:`csv_text` as UTF-8 bytes (a download)."""
    return csv_text(frame).encode("utf-8")
