"""The dashboard's colours, one meaning each on every page (docs/STYLE "one colour, one meaning").

Red adds, blue subtracts: the signed scale (contributions, changes, cosines) and nothing else. Attention has its own
sequential scale, green, wherever it is drawn (the heatmaps' left map, the head overview, Compare, the sinks' share
lines), and green means nothing else. Purple is the sink (the first token) and nothing else. Every other quantity gets
a hue that is none of these: gold for the sink's value scaled by an intervention, greys for any other magnitude, and
the Faithfulness page's measures hues used for nothing else.

Every colour the charts, the pages and the app draw is a constant of this module, listed in :data:`MEANINGS` with its
one meaning; tests/charts/test_palette.py fails on a colour literal anywhere else.
"""

from __future__ import annotations

#: Vega scheme of a signed quantity, reversed by its users so that red is positive and blue negative.
DIVERGING = "redblue"
#: The two ends of :data:`DIVERGING`: a bar or line that adds (red) or subtracts (blue).
POSITIVE, NEGATIVE = "#b2182b", "#2166ac"
#: The sign scale of a mark that adds or subtracts (the flow's edges, bars and points): its two values as a legend
#: says them, and their colours.
SIGNS = ("adds", "subtracts")
SIGN_COLOURS = (POSITIVE, NEGATIVE)
#: Vega scheme of attention (and of the attention-like raw attention map): light to dark green.
ATTENTION_SCHEME = "greens"
#: Attention drawn as a line or a bar: the dark end of :data:`ATTENTION_SCHEME`.
ATTENTION = "#238b45"
#: Vega scheme of any other unsigned magnitude (a divergence, an atlas metric, value-weighted attention, a rank):
#: neither red, blue, green nor purple.
OTHER_SCHEME = "greys"
#: The sink (first token) in a bar chart of keys, and any other key.
SINK, KEY = "#7b4ea3", "#6f6f6f"
#: Lines and bars that are neither attention nor signed: a dark neutral and a gold accent (the sink's value scaled by
#: an intervention: "scaled in this layer", "intervened", the analytic curve of the sink ratio).
NEUTRAL, ACCENT, MUTED = "#525252", "#d08c00", "#bab0ac"
#: The Faithfulness page's measures, one colour a measure in :data:`cwviz.analyses.schema.ALL_MEASURES`' order (raw,
#: value-weighted, output-normalised inter and intra, contribution inter and intra, random): hues used for nothing else
#: (not red or blue, a sign; not green, attention; not purple, the sink; not gold, an intervention), a kind's inter and
#: intra variants light and dark of one hue, random keys grey.
CATEGORIES = ("#e7298a", "#8c510a", "#9a9a00", "#5c5c00", "#1fa6a8", "#05595b", "#808080")
#: What the colours mean, in the words of every signed legend and page sentence.
SIGNED_MEANING = "red adds, blue subtracts"
#: Text and axis labels; text on a dark cell; a selected cell's or row's outline; the ring around the cell a sentence
#: names.
INK, PAPER, OUTLINE, RING = "#31333f", "white", "black", "#111111"
#: A reference rule (zero, or the layer a sentence names), and the grid lines of a table in the HTML report.
RULE, FAINT = "gray", "#dddddd"
#: The Flow page's spine: the residual carrying a position up the layers (faint: not an edge of the route).
SPINE = "#c8c9cf"
#: The HTML report's page: its text, a caption's and a table header's background.
REPORT_TEXT, REPORT_CAPTION, REPORT_SHADE = "#222222", "#555555", "#f5f5f5"

#: Every colour above with its one meaning: (colour or Vega scheme, meaning). The verdicts' colours are the Claims
#: page's own (:data:`VERDICT_COLOURS`), which it lists with their meanings.
MEANINGS: tuple[tuple[str, str], ...] = (
    (DIVERGING, "signed quantity: red adds, blue subtracts"),
    (POSITIVE, "signed quantity: adds"),
    (NEGATIVE, "signed quantity: subtracts"),
    (ATTENTION_SCHEME, "attention weight (a map)"),
    (ATTENTION, "attention (a line or bar)"),
    (OTHER_SCHEME, "a magnitude that is neither signed nor attention (divergence, atlas metric, value-weighted, rank)"),
    (SINK, "the sink (first token)"),
    (KEY, "a key that is not the sink"),
    (NEUTRAL, "a line that is neither attention nor signed (a contribution share)"),
    (ACCENT, "the sink's value scaled by an intervention"),
    (MUTED, "unchanged, clean or a whole output: the background a part is read against"),
    (CATEGORIES[0], "Faithfulness measure: raw attention"),
    (CATEGORIES[1], "Faithfulness measure: value-weighted attention"),
    (CATEGORIES[2], "Faithfulness measure: value-weighted, output-normalised (inter-head)"),
    (CATEGORIES[3], "Faithfulness measure: value-weighted, output-normalised (intra-head)"),
    (CATEGORIES[4], "Faithfulness measure: contribution weight (inter-head)"),
    (CATEGORIES[5], "Faithfulness measure: contribution weight (intra-head)"),
    (CATEGORIES[6], "Faithfulness measure: random keys, the baseline"),
    (INK, "text and axis labels"),
    (PAPER, "text on a dark cell"),
    (OUTLINE, "the selected head's or query's outline"),
    (RING, "the ring around the cell a sentence names"),
    (RULE, "a reference rule: zero, or the layer a sentence names"),
    (FAINT, "the grid lines of a table in the HTML report"),
    (SPINE, "the residual carrying a position up the layers (the Flow page's route)"),
    (REPORT_TEXT, "the HTML report's text"),
    (REPORT_CAPTION, "the HTML report's captions"),
    (REPORT_SHADE, "the HTML report's table headers and code"),
)


# -- The Claims page's verdicts (issues 56 and 59): a colour each that no other meaning uses, and a mark shape each, so
# -- a verdict reads without its colour (printouts, colour-blind readers). Red, blue, green and purple are reserved
# -- (a sign, attention, the sink), and gold, brown, olive, teal and pink are taken above, so holds is the one hue
# -- family left (magenta, about 312°) and the others are greys told apart by lightness and shape.
#: Verdict -> colour. holds: magenta, the interval wholly on the paper's side of the line; fails: near-black, wholly on
#: the other side; unresolved: mid grey, the interval straddles the line; ties by construction: light grey, a claim-1
#: row that cannot hold whatever the data (the query scope ranks VW and VW/‖o‖ alike).
VERDICT_COLOURS = {"holds": "#a6368f", "fails": "#262626", "unresolved": "#8d8d8d", "ties by construction": "#c2c2c2"}
#: Verdict -> Vega mark shape: a circle holds, a cross fails, a diamond is unresolved, a square ties by construction.
VERDICT_SHAPES = {"holds": "circle", "fails": "cross", "unresolved": "diamond", "ties by construction": "square"}
