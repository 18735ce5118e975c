"""A sweep's report as one self-contained HTML file: tables and a manifest in, an HTML string out. Pure.

Figures are inlined as SVG (rendered by vl-convert, :mod:`cwviz.charts.export`), with no script, style
sheet, font or image fetched from anywhere: the file opens offline, in any browser, and can be mailed or
archived as it is. Every text taken from the results (model ids, commands, measure names) is escaped.

Sections, each present when its data is: the manifest and how to rerun the run; the faithfulness curves
with their tables (mean ΔPPL and its interval per measure and rate, the area under each curve) and the
order check; accuracy under masking (multiple-choice tasks); the attention sinks (``cwviz sinks --results``).
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from dataclasses import dataclass

import altair as alt
import pandas as pd

from ..analyses.schema import area_span
from .export import to_svg
from .faithfulness import accuracy_chart, curve_chart
from .palette import FAINT, REPORT_CAPTION, REPORT_SHADE, REPORT_TEXT, VERDICT_COLOURS

STYLE = f"""
body {{ font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 1100px;
       color: {REPORT_TEXT}; }}
h1 {{ font-size: 1.6em; }} h2 {{ border-bottom: 1px solid {FAINT}; padding-bottom: .2em; margin-top: 2em; }}
table {{ border-collapse: collapse; margin: .8em 0; font-variant-numeric: tabular-nums; }}
th, td {{ border: 1px solid {FAINT}; padding: .25em .6em; text-align: right; }} th {{ background: {REPORT_SHADE}; }}
td:first-child, th:first-child {{ text-align: left; }}
figure {{ margin: 1em 0; overflow-x: auto; }} figcaption {{ color: {REPORT_CAPTION}; font-size: .9em; }}
pre {{ background: {REPORT_SHADE}; padding: .8em; overflow-x: auto; white-space: pre-wrap; word-break: break-all; }}
dl {{ display: grid; grid-template-columns: max-content 1fr; gap: .2em 1em; }}
dt {{ font-weight: 600; }} dd {{ margin: 0; }}
.holds {{ color: {VERDICT_COLOURS["holds"]}; }} .fails {{ color: {VERDICT_COLOURS["fails"]}; }}
.equal {{ color: {VERDICT_COLOURS["unresolved"]}; }}
"""


@dataclass(frozen=True)
class Section:
    """One part of the report: a heading and its HTML body."""

    title: str
    body: str
    anchor: str


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def svg_figure(chart: alt.TopLevelMixin, caption: str, name: str) -> str:
    """``chart`` as inline SVG in a ``<figure>``; its element ids get the prefix ``name`` so that several
    SVGs in one page never share an id (a clip path found in the wrong figure)."""
    svg = to_svg(chart).decode("utf-8")
    svg = re.sub(r"^<\?xml[^>]*>\s*", "", svg)
    svg = re.sub(r'\bid="([^"]+)"', rf'id="{name}-\1"', svg)
    svg = re.sub(r"url\(#([^)]+)\)", rf"url(#{name}-\1)", svg)
    svg = re.sub(r'href="#([^"]+)"', rf'href="#{name}-\1"', svg)
    svg = svg.replace("<svg ", f'<svg data-figure="{esc(name)}" role="img" aria-label="{esc(caption)}" ', 1)
    return f'<figure id="{esc(name)}">{svg}<figcaption>{esc(caption)}</figcaption></figure>'


def table_html(frame: pd.DataFrame, formats: dict[str, str] | None = None, name: str = "") -> str:
    """A table of ``frame`` (no index), numbers formatted by ``formats[column]`` (default ``{:.4g}``)."""
    formats = formats or {}

    def cell(column: str, value: object) -> str:
        if isinstance(value, float) and pd.isna(value):
            return ""
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return esc(formats.get(column, "{:.4g}").format(value))
        return esc(value)

    head = "".join(f"<th>{esc(c)}</th>" for c in frame.columns)
    rows = "".join(
        "<tr>" + "".join(f"<td>{cell(c, v)}</td>" for c, v in zip(frame.columns, row)) + "</tr>"
        for row in frame.itertuples(index=False)
    )
    return f'<table data-table="{esc(name)}"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>'


def wide(summary: pd.DataFrame, value: str, scale: float = 1.0, digits: str = "{:.4g}") -> pd.DataFrame:
    """One row per measure, one column per rate: ``value`` (×``scale``) with its interval in brackets."""
    low, high = ("accuracy_ci_low", "accuracy_ci_high") if value == "delta_accuracy" else ("ci_low", "ci_high")
    text = summary.assign(
        cell=[
            f"{digits.format(v * scale)} [{digits.format(a * scale)}, {digits.format(b * scale)}]"
            for v, a, b in zip(summary[value], summary[low], summary[high])
        ]
    )
    out = text.pivot(index="measure", columns="rate", values="cell")
    out = out.reindex(list(dict.fromkeys(summary["measure"])))
    out.columns = [f"{r:g}%" for r in out.columns]
    return out.reset_index()


# -- sections --------------------------------------------------------------------------------------------
def manifest_section(manifest: dict, title: str = "Run", anchor: str = "run", recorded: str | None = None) -> Section:
    """Model (id, revision, weight hash), dtype, device, seed, rates, measures, versions, command and date, and
    how to rerun it; ``recorded``: what the records hold (how many items were measured and how many skipped), so
    that the header and the tables' ``n`` count the same items."""
    model = manifest.get("model", {}) or {}
    versions = manifest.get("versions", {}) or {}
    rows = {
        "model": model.get("id"),
        "architecture": model.get("architecture"),
        "revision": model.get("revision") or "(none: not a hub checkout)",
        "weights sha256": model.get("weights_sha256"),
        "dtype": model.get("dtype"),
        "device": model.get("device"),
        "task": manifest.get("task"),
        "data": ", ".join(f"{k}: {v}" for k, v in (manifest.get("data") or {}).items()),
        "recorded": recorded,
        "seed": manifest.get("seed"),
        "rates (%)": ", ".join(f"{r:g}" for r in manifest.get("rates", [])),
        "measures": ", ".join(manifest.get("measures", [])),
        "protocol": ", ".join(f"{k}: {v}" for k, v in (manifest.get("protocol") or {}).items()),
        "processes": manifest.get("processes"),
        "versions": ", ".join(f"{k} {v}" for k, v in versions.items()),
        "fingerprint": manifest.get("fingerprint"),
        "date": manifest.get("date"),
    }
    rows = {k: v for k, v in rows.items() if v not in (None, "")}
    items = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in rows.items())
    pins = " ".join(
        f"{name}=={versions[key]}"
        for key, name in (("cwviz", "cwviz"), ("torch", "torch"), ("transformers", "transformers"))
        if key in versions
    )
    command = manifest.get("command", "")
    rerun = (
        "<p>To rerun it: install the same versions, then run the same command (a fresh <code>--results</code> folder "
        "starts over; the same folder with <code>--resume</code> continues it, and is refused if any setting, the "
        f"model's weights or the data differ):</p><pre>pip install {esc(pins)}\n{esc(command)}</pre>"
    )
    return Section(title, f'<dl data-manifest="{esc(anchor)}">{items}</dl>{rerun}', anchor)


def faithfulness_section(
    summary: pd.DataFrame, areas: pd.DataFrame, by_area: pd.DataFrame, by_rate: pd.DataFrame
) -> Section:
    """Each curve's chart and its table of mean ΔPPL [95 % interval] per measure and rate, the areas, the order
    check."""
    parts = []
    n = int(summary["n"].max()) if len(summary) else 0
    for curve in dict.fromkeys(summary["curve"]):
        rows = summary[summary["curve"] == curve]
        parts.append(
            svg_figure(
                curve_chart(rows, curve),
                f"{curve}: mean ΔPPL over {n} example(s), 95% bootstrap band",
                f"curve-{curve}",
            )
        )
        parts.append(f"<h3>{esc(curve)}: mean ΔPPL [95% bootstrap interval]</h3>")
        parts.append(table_html(wide(rows, "delta_ppl"), name=f"delta-ppl-{curve}"))
    span = area_span(summary)
    if span:
        pivot = (
            areas.pivot(index="measure", columns="curve", values="area")
            .reindex(list(dict.fromkeys(areas["measure"])))
            .reset_index()
        )
        parts.append(
            f"<h3>Area under each curve (mean ΔPPL over the rate as a fraction, rates {span[0]:g}..{span[1]:g}, "
            "trapezoid rule)</h3>"
        )
        parts.append(table_html(pivot, name="areas"))
        parts.append(order_html(by_area, by_rate))
    else:  # one rate spans nothing: an area of 0 would read as a result (the CLI prints n/a)
        parts.append("<h3>Area under each curve</h3><p>n/a: this run has one removal rate, and an area needs two.</p>")
        parts.append(order_html(by_area, by_rate, with_area=False))
    return Section("Faithfulness", "".join(parts), "faithfulness")


def order_html(by_area: pd.DataFrame, by_rate: pd.DataFrame, with_area: bool = True) -> str:
    """The paper's order, pair by pair: by area (unless ``with_area`` is false: a run of one rate), and at each
    rate (holds / fails / equal)."""
    if by_area.empty:
        return "<h3>Order check</h3><p>Not enough of the paper's measures in this run to check their order.</p>"
    pairs = list(dict.fromkeys(zip(by_area["lower"], by_area["higher"])))
    rows = []
    for curve in dict.fromkeys(by_area["curve"]):
        area = by_area[by_area["curve"] == curve].set_index(["lower", "higher"])["relation"]
        if with_area:
            rows.append({"curve": curve, "by": "area", **{f"{a} < {b}": area.get((a, b), "") for a, b in pairs}})
        rated = by_rate[by_rate["curve"] == curve]
        for rate, group in rated.groupby("rate", sort=True):
            relation = group.set_index(["lower", "higher"])["relation"]
            rows.append(
                {"curve": curve, "by": f"{rate:g}%", **{f"{a} < {b}": relation.get((a, b), "") for a, b in pairs}}
            )
    frame = pd.DataFrame(rows)
    body = table_html(frame, name="order")
    body = re.sub(r"<td>(holds|fails|equal)</td>", r'<td class="\1">\1</td>', body)
    return (
        "<h3>Order check</h3><p>The paper's order, least to most faithful: raw attention &lt; value-weighted &lt; "
        "value-weighted output-normalised &lt; contribution weights. Comprehensiveness: the later measure should give "
        "the larger ΔPPL; sufficiency: the smaller.</p>" + body
    )


def accuracy_section(summary: pd.DataFrame) -> Section:
    """Accuracy under masking: the chart of the change and its table, in points [paired bootstrap interval]."""
    clean = float(summary["accuracy_clean"].iloc[0])
    n = int(summary["n"].max())
    parts = [
        f"<p>Clean accuracy {clean:.1%} over {n} item(s). Change in points, masked − clean, with a paired "
        "bootstrap 95% interval.</p>"
    ]
    for curve in dict.fromkeys(summary["curve"]):
        rows = summary[summary["curve"] == curve]
        parts.append(
            svg_figure(
                accuracy_chart(rows, curve),
                f"{curve}: accuracy change (points) against the removal rate",
                f"accuracy-{curve}",
            )
        )
        parts.append(f"<h3>{esc(curve)}: Δaccuracy in points [95% paired bootstrap interval]</h3>")
        parts.append(table_html(wide(rows, "delta_accuracy", scale=100, digits="{:+.1f}"), name=f"accuracy-{curve}"))
    return Section("Accuracy under masking", "".join(parts), "accuracy")


def sinks_section(manifest: dict, layers: pd.DataFrame, heads: pd.DataFrame | None) -> Section:
    """The sinks CLI's per-layer table and its charts (shares, anti-alignment map)."""
    from .sinks import anti_alignment_map, share_chart

    parts = [
        f"<p>Sink: {esc(manifest.get('sink', ''))}; prompts: {esc(manifest.get('prompts', ''))}; "
        f"ΔPPL with the sink's value ×{esc(manifest.get('factor', ''))} in that layer only.</p>"
    ]
    parts.append(
        svg_figure(
            share_chart(layers),
            "the sink's share of the layer output under attention and contribution weights",
            "sinks-share",
        )
    )
    if heads is not None and len(heads):
        chart = anti_alignment_map(heads).properties(  # no click on paper
            title=alt.TitleParams("Anti-alignment per head", subtitle="mean cos(ṽ_sink, m), blue: anti-aligned")
        )
        parts.append(svg_figure(chart, "mean cos(ṽ_sink, m) per layer and head (blue: anti-aligned)", "sinks-cos"))
    parts.append("<h3>Per layer</h3>" + table_html(layers, formats={"layer": "{:.0f}"}, name="sinks-layers"))
    body = "".join(parts) + "<h3>How it was run</h3>" + manifest_section(manifest, anchor="sinks-run").body
    return Section("Attention sinks", body, "sinks")


def claims_section(manifest: dict, overview: pd.DataFrame, table: pd.DataFrame) -> Section:
    """``cwviz claims``: ``overview``, one row per claim (statement, verdicts, evidence:
    :func:`cwviz.analyses.claims.overview`), then every row of ``claims.csv`` ``table`` (claim 1 per rank scope, curve
    and rate) with its estimate and 95 % bootstrap interval over the items."""
    parts = [
        "<p>Verdicts (docs/METHOD.md section 5): <b>holds</b>: the 95 % bootstrap interval over the items lies wholly "
        "on the paper's side; <b>fails</b>: wholly on the other side; <b>unresolved</b>: the interval does not "
        "decide.</p>",
        table_html(overview, name="claims-overview"),
        "<h3>Every row</h3>",
        table_html(
            table.drop(columns=["statement"]),
            formats={"claim": "{:.0f}", "rate": "{:g}", "n": "{:.0f}"},
            name="claims-rows",
        ),
        "<h3>How it was run</h3>" + manifest_section(manifest, anchor="claims-run").body,
    ]
    return Section("Claims of the paper", "".join(parts), "claims")


def page(sections: Sequence[Section], title: str = "cwviz report", generated: str = "") -> str:
    """The whole report: one HTML document, no external resource."""
    toc = "".join(f'<li><a href="#{esc(s.anchor)}">{esc(s.title)}</a></li>' for s in sections)
    body = "".join(f'<section id="{esc(s.anchor)}"><h2>{esc(s.title)}</h2>{s.body}</section>' for s in sections)
    note = (
        f"<p>Generated {esc(generated)} by cwviz. Self-contained: it loads nothing from the network.</p>"
        if generated
        else ""
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; img-src "
        'data:">'
        f"<title>{esc(title)}</title><style>{STYLE}</style></head>"
        f"<body><h1>{esc(title)}</h1>{note}<ul>{toc}</ul>{body}</body></html>\n"
    )
