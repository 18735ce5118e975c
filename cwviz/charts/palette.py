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
#: A verdict (the Claims page's forest plot): holds, fails, unresolved. Purple and orange (the ends of ColorBrewer's
#: PuOr, readable with red-green colour blindness) and grey: not red or blue (a sign), not green (attention).
VERDICT_COLOURS = {"holds": "#5e3c99", "fails": "#e66101", "unresolved": "#9e9e9e"}
#: What the colours mean, in the words of every signed legend and page sentence.
SIGNED_MEANING = "red adds, blue subtracts"
