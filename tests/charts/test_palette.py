"""One meaning per colour (cwviz.charts.palette): every colour the dashboard draws is a palette constant listed with its
one meaning, red and blue only for signed quantities, green only for attention, purple only for the sink; and no chart,
page or app module writes a colour of its own."""

from __future__ import annotations

import colorsys
import io
import re
import tokenize
from pathlib import Path

import pytest

from cwviz.charts import palette

ROOT = Path(__file__).resolve().parents[2]
#: Where colours are drawn: the chart builders, the app's widgets and services, the pages and the notebook plots.
DRAWING = [
    *sorted((ROOT / "cwviz" / "charts").glob("*.py")),
    *sorted((ROOT / "cwviz" / "app").glob("*.py")),
    *sorted((ROOT / "views").glob("*.py")),
]
DRAWING += [ROOT / "cwviz" / "plot.py", ROOT / "app.py"]
#: Files whose colours another change owns, with why: their literals must still be palette colours.
OWNED_ELSEWHERE = {"cwviz/charts/flow.py": "the Flow page is being rewritten apart from issue 56"}
HEX = re.compile(r"#(?:[0-9a-fA-F]{6}|[0-9a-fA-F]{3})\b")
#: A string token: its prefix, its quotes and what they hold.
QUOTED = re.compile(r"[rRbBuUfF]*('''|\"\"\"|'|\")(.*)\1", re.S)
#: CSS colour names and Vega colour schemes a string might name (the ones a chart would plausibly write).
NAMES = {
    "black", "white", "gray", "grey", "red", "blue", "green", "purple", "orange", "gold", "yellow", "brown", "pink",
    "magenta", "cyan", "teal", "navy", "maroon", "olive", "lime", "steelblue", "crimson", "darkgray", "darkgrey",
    "lightgray", "lightgrey", "silver", "firebrick", "tomato", "coral", "indigo", "violet", "darkblue", "darkred",
    "greens", "blues", "reds", "purples", "oranges", "greys", "redblue", "blueorange", "viridis", "plasma", "tableau10",
    "category10", "dark2", "set1", "set2", "set3", "browns", "teals", "warmgreys", "goldgreen", "purpleorange",
}  # fmt: skip


def _strings(path: Path) -> list[tuple[int, str]]:
    """The string literals of a Python file (their text, f-string parts included), with their line numbers."""
    out = []
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline)
    for token in tokens:
        if token.type == tokenize.STRING or token.type == getattr(tokenize, "FSTRING_MIDDLE", -1):
            out.append((token.start[0], token.string))
    return out


def colour_literals(path: Path) -> list[tuple[int, str]]:
    """Every colour a file's string literals write: a hex colour anywhere in a string, or a string that is a colour's
    or a colour scheme's name (``"black"``, ``'greens'``)."""
    found = []
    for line, text in _strings(path):
        found += [(line, match) for match in HEX.findall(text)]
        quoted = QUOTED.fullmatch(text)
        bare = (quoted.group(2) if quoted else text).strip().lower()
        if bare in NAMES:
            found.append((line, bare))
    return found


def _palette_values() -> dict[str, str]:
    """Every colour or scheme listed in :data:`cwviz.charts.palette.MEANINGS`, with its meaning."""
    return {value.lower(): meaning for value, meaning in palette.MEANINGS}


def test_every_palette_colour_is_listed_once_with_one_meaning():
    values = [value.lower() for value, _ in palette.MEANINGS]
    assert len(values) == len(set(values)), sorted(v for v in values if values.count(v) > 1)
    # Every colour constant of the module is in the list; the Claims page's verdict block lists its own; SIGNS are the
    # words of the sign scale (its domain), not colours.
    words = ("MEANINGS", "SIGNED_MEANING", "SIGNS")
    constants = {
        name: value
        for name, value in vars(palette).items()
        if name.isupper() and not name.startswith("VERDICT") and name not in words
    }
    for name, value in constants.items():
        for colour in value if isinstance(value, tuple) else (value,):
            assert isinstance(colour, str) and colour.lower() in values, (
                f"palette.{name} = {colour!r} has no meaning listed"
            )


def _hue(colour: str) -> str | None:
    """The hue family of a ``#rrggbb`` colour that carries one (red, blue, green, purple), None for the others and
    greys."""
    r, g, b = (int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5))
    hue, lightness, saturation = colorsys.rgb_to_hls(r, g, b)
    if saturation < 0.25 or lightness < 0.08 or lightness > 0.95:
        return None
    degrees = hue * 360
    if degrees < 15 or degrees >= 345:
        return "red"
    if 85 <= degrees < 165:
        return "green"
    if 195 <= degrees < 250:
        return "blue"
    if 250 <= degrees < 290:
        return "purple"
    return None


#: Which meanings may use each reserved hue: red and blue a sign, green attention, purple the sink.
RESERVED = {"red": "signed", "blue": "signed", "green": "attention", "purple": "the sink"}


@pytest.mark.parametrize(("value", "meaning"), palette.MEANINGS, ids=[value for value, _ in palette.MEANINGS])
def test_red_and_blue_mean_a_sign_green_attention_and_purple_the_sink(value, meaning):
    hue = _hue(value) if value.startswith("#") else None
    if hue is not None:
        assert RESERVED[hue] in meaning, f"{value} is {hue}, which means {RESERVED[hue]} only, not {meaning!r}"
    schemes = {palette.DIVERGING: "signed", palette.ATTENTION_SCHEME: "attention"}
    if value in schemes:
        assert schemes[value] in meaning


def test_the_hue_check_tells_the_reserved_hues_apart():
    """The check above can fail: the palette's own sign, attention and sink colours are told apart, a grey is none."""
    assert _hue(palette.POSITIVE) == "red" and _hue(palette.NEGATIVE) == "blue"
    assert _hue(palette.ATTENTION) == "green" and _hue(palette.SINK) == "purple"
    assert _hue(palette.KEY) is None and _hue(palette.ACCENT) is None


def test_no_chart_page_or_app_module_writes_a_colour_outside_the_palette():
    """A colour literal anywhere the dashboard draws, outside palette.py, fails: it names a palette constant instead.
    A file another change owns (:data:`OWNED_ELSEWHERE`) may still write one, if it is a palette colour."""
    listed = _palette_values()
    outside = []
    for path in DRAWING:
        name = path.relative_to(ROOT).as_posix()
        if name == "cwviz/charts/palette.py":
            continue
        for line, colour in colour_literals(path):
            if name in OWNED_ELSEWHERE and colour.lower() in listed:
                continue
            outside.append(f"{name}:{line}: {colour}")
    assert not outside, outside


def test_the_literal_check_finds_a_colour(tmp_path):
    """The check above can fail: a hex colour in a string, and a colour's name as a string, are both found."""
    source = tmp_path / "chart.py"
    source.write_text(
        'a = "#ff0000"\nb = alt.value("black")\nc = f"fill: {x} #abc"\n# "#123456" in a comment\n', encoding="utf-8"
    )
    assert [colour for _, colour in colour_literals(source)] == ["#ff0000", "black", "#abc"]
