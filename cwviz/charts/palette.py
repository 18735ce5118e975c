"""The dashboard's colours, one meaning each on every page (docs/STYLE "one colour, one meaning").

Red adds, blue subtracts: the signed scale (contributions, changes, cosines) and nothing else. Attention has its own
sequential scale, green, wherever it is drawn (the heatmaps' left map, the head overview, Compare, the sinks' share
lines). Every other unsigned quantity and every other line gets hues that are neither red nor blue.
"""

from __future__ import annotations

#: Vega scheme of a signed quantity, reversed by its users so that red is positive and blue negative.
DIVERGING = "redblue"
#: The two ends of :data:`DIVERGING`: a bar or line that adds (red) or subtracts (blue).
POSITIVE, NEGATIVE = "#b2182b", "#2166ac"
#: Vega scheme of attention (and of the attention-like raw and value-weighted maps): light to dark green.
ATTENTION_SCHEME = "greens"
#: Attention drawn as a line or a bar: the dark end of :data:`ATTENTION_SCHEME`.
ATTENTION = "#238b45"
#: Vega scheme of any other unsigned quantity (a divergence, an atlas metric): neither red, blue nor green.
OTHER_SCHEME = "purples"
#: The sink (first token) in a bar chart of keys, and any other key.
SINK, KEY = "#7b4ea3", "#6f6f6f"
#: Lines and bars that are neither attention nor signed: a dark neutral and a gold accent.
NEUTRAL, ACCENT, MUTED = "#31333f", "#d08c00", "#bab0ac"
#: Categorical lines (the faithfulness page's measures): Dark2 without its orange-red, then neutrals.
CATEGORIES = ("#1b9e77", "#7570b3", "#d08c00", "#66a61e", "#a6761d", "#e7298a", "#666666", "#31333f")
#: What the colours mean, in the words of every signed legend and page sentence.
SIGNED_MEANING = "red adds, blue subtracts"


# -- The Claims page's verdicts (issue 56): one hue each, used for nothing else, and a mark shape each, so a verdict
# -- reads without its colour (printouts, colour-blind readers). Not red or blue (a sign), green (attention), purple
# -- (the sink) or gold (an accent).
#: Verdict -> colour. holds: teal, the interval wholly on the paper's side; fails: dark brown, wholly on the other
#: side; unresolved: mid grey, the interval straddles the line; ties by construction: light grey, a row that cannot
#: hold whatever the data (claim 1's query scope).
VERDICT_COLOURS = {"holds": "#00838f", "fails": "#5d4037", "unresolved": "#8d8d8d", "ties by construction": "#c2c2c2"}
#: Verdict -> Vega mark shape, in the order of :data:`VERDICT_COLOURS`: a circle holds, a cross fails, a diamond is
#: unresolved, a square ties by construction.
VERDICT_SHAPES = {"holds": "circle", "fails": "cross", "unresolved": "diamond", "ties by construction": "square"}
