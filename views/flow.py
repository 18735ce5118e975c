"""Flow: where the model's prediction came from (docs/METHOD.md sections 6 and 7): one attribution method of the
registry (the picker; the test's choice by default) gives each input token a score, and, for a method with edges, the
route of edges on paths into the prediction (cwviz.analyses.route, the graph ``cwviz flow`` exports); one sentence says
how faithful the method was in the test; a check measures every token's knockout on this prompt; then each head's
direct part and what the selected head's write promotes."""

import pandas as pd
import streamlit as st

from cwviz import CwvizError
from cwviz.analyses import route
from cwviz.analyses.flow_text import describe
from cwviz.app import flow_services, widgets
from cwviz.app.links import page_url
from cwviz.app.sidebar import escape_markdown, sidebar
from cwviz.app.state import parse_bool, url_widget
from cwviz.charts import flow as charts
from cwviz.core.defaults import FLOW_METHOD, KEPT

MORE = (
    "**The graph: the route into the prediction.** A node is the residual stream at one position entering one layer "
    "(the top row is the final residual, where the prediction is read; the large dot is the prediction). An edge "
    "(layer l, token k) → (layer l + 1, token i) is layer l's attention moving token k's value into position i, "
    "weighted by the method (the effect flow: its first-order effect on the prediction). The grey vertical lines are "
    "the residual stream carrying a position up the layers. Only edges on a path into the prediction are drawn: the "
    "largest ones until the drawn edges carry the chosen fraction of the |effect| of all edges between tokens on such "
    "paths, and the paths that join the three tokens with the largest |score| to the prediction; at most "
    f"{route.ROUTE_CAP} edges and about {route.ROUTE_POSITIONS} positions (the largest). Red adds to the target (over "
    "the foil), blue subtracts; an edge's width is its |weight|. A token's value staying on its own position (a "
    "self-edge) is not drawn: it routes nothing. `cwviz flow --csv` writes the same edges.\n\n**The scores.** Each "
    "input token's score under the chosen method: for the effect flow, the first-order estimate of how much the "
    "prediction's logit (difference) drops when the token's value is taken away in every layer. **Check against "
    "knockouts** measures that drop for every token (one forward pass a batch) and prints how well the scores follow "
    "it. **The heads** (below): each head's direct part is what its write at the prediction's position adds to the "
    "logit difference; its vocabulary is that write read through the output layer. The methods: docs/METHOD.md "
    "sections 6 and 7; the test: docs/flow.md."
)


def _faithfulness(method: flow_services.MethodChoice, sel) -> None:
    """The first screen's sentence: how faithful the shown method was in the test on this model (docs/flow.md)."""
    models = (sel.request.model, sel.analysis.info.id)
    st.markdown(flow_services.faithfulness_sentence(flow_services.tested(), models, method, method.intervention))


def _graph_and_totals(shown, drawn: route.Route, method: flow_services.MethodChoice, result, sel) -> None:
    """The route (for a method with edges) beside every token's score, as wide as its labels need."""
    px = widgets.label_px()
    tokens = shown.tokens_table()
    graph_col, totals_col = st.columns([11, 8], gap="small")
    with graph_col:
        if method.has_edges:
            tables = charts.route_tables(drawn, shown.asked.token_strings)
            title = f"The route {describe(result)} (click a node)"
            widgets.node_graph(
                charts.route_graph(
                    tables,
                    sel.analysis.num_layers,
                    title,
                    label_px=px,
                    selected=(sel.layer, sel.query),
                    **charts.page_sizes(px),
                ),
                drawn.edges,
                f"cwviz-flow-route-{result.position}",
                key="flow_graph",
                layers=sel.analysis.num_layers,
            )
        else:
            st.info(
                f"The {method.label} gives each token a score but has no edges, so there is no route to draw: the "
                "effect flow and the share flow have one."
            )
    with totals_col:
        rows = charts.total_rows(tokens, "score", charts.total_row_count(px), keep=drawn.connected)
        some = "every token" if len(rows) == len(tokens) else f"the {len(rows)} largest of {len(tokens)},"
        widgets.chart(  # the subtitle on two lines: one would be cut at the bars' width in presenter mode
            charts.totals_bars(
                rows,
                "Each token's score",
                [some, f"{method.label}, in text order"],
                "score",
                label_px=px,
                width=charts.totals_width(px),
            ),
            tokens,
            f"cwviz-flow-scores-{result.position}",
            key="flow_totals",
        )


def _caption(shown, drawn: route.Route, method: flow_services.MethodChoice, result, sel, default_target: str) -> None:
    """What the graph and the bars hold, in numbers: the quantity, the route's kept fraction, the top next tokens."""
    said = f"The {method.label} {describe(result)}"
    if pd.notna(shown.quantity):
        said += f": the quantity explained is {shown.quantity:+.3f}"
    if method.has_edges:
        said += (
            f". Drawn: {len(drawn.edges)} edges on paths into the prediction, carrying {drawn.carried:.0%} of the "
            f"|effect| of the edges between tokens on such paths (asked: {drawn.kept:.0%}"
            + (f"; the largest {route.ROUTE_CAP} edges or {route.ROUTE_POSITIONS} positions" if drawn.capped else "")
            + ")"
        )
        if drawn.mass > 0:
            said += f"; {drawn.self_mass / drawn.mass:.0%} of all |effect| stays on a token's own position (not drawn)"
        if drawn.connected:
            joined = ", ".join(repr(shown.asked.token_strings[k]) for k in drawn.connected)
            said += f"; joined to the prediction: {joined} (the largest |score|)"
    said += "."
    if not result.encoder:
        top = flow_services.predictions(sel.request, result.position)
        said += " The model's most likely next tokens: " + ", ".join(
            f"{t!r} {p:.0%}" for t, p in top[["token", "probability"]].itertuples(index=False)
        )
        said += (
            "."
            if not default_target or top["token"].iloc[0] == default_target
            else (f"; the first that is a word, {default_target!r}, is the default target.")
        )
    st.caption(escape_markdown(said))


def _check(asked: tuple, method: flow_services.MethodChoice, shown) -> None:
    """Check against knockouts: every input token taken away in turn (batched, with progress and a Stop), kept per
    prompt, position, target, foil and intervention; the method's scores against the measured effects."""
    if asked[2] is None:  # an encoder: no next-token prediction to knock out
        return
    measured = flow_services.measured(*asked, method.intervention)
    row = st.container(horizontal=True, gap="small", vertical_alignment="center")
    run = row.button(
        "Check against knockouts",
        key="flow_check",
        help="Take every input token away in turn (its value "
        "zeroed in every layer, or its embedding replaced by the mean one, as the method answers) and measure "
        "the change in the logit (difference): one forward pass a batch.",
    )
    if run:
        row.button("Stop", key="flow_check_stop", help="Stop after the current pass: what is measured is kept.")
        bar = st.progress(0.0, text="Knockouts: starting…")
        measured = flow_services.measure(
            *asked,
            method.intervention,
            progress=lambda done, total: bar.progress(done / total, text=f"Knockouts: pass {done} of {total}"),
        )
        bar.empty()
    if measured is None:
        row.caption("measures every token's effect on this prompt and compares it with the scores above.")
        return
    result = flow_services.checked(*asked, method.name, method.intervention, measured.effects)
    st.markdown(f"**Check on this prompt** ({method.label}): {escape_markdown(result.sentence())}.")
    frame = shown.tokens_table().iloc[: len(result.effects)].assign(effect=result.effects).dropna()
    widgets.chart(
        charts.check_scatter(
            frame, "Each token: the method's score against the measured effect", label_px=widgets.label_px()
        ),
        frame,
        f"cwviz-flow-check-{asked[1]}",
        key="flow_check_chart",
    )


sel = sidebar("Where the prediction came from")
if not sel.ok:
    st.stop()
analysis = sel.analysis
causal = analysis.info.causal
last = analysis.num_tokens - 1
tokens = analysis.tokens

st.markdown(
    "Which input tokens carried the model's next-token prediction through the layers, and which worked against it: "
    "**red adds** to the target, **blue subtracts**; click a node to select its layer and token."
    if causal
    else f"{analysis.info.id} is an encoder and predicts no next token: this is what one position's final "
    "representation is made of ([CLS] unless you choose another); **red adds**, **blue subtracts**."
)

at_col, method_col, target_col, foil_col, kept_col = st.columns([3, 3, 3, 3, 3], vertical_alignment="bottom")
default = last if causal else 0  # the prediction after the last token; an encoder's [CLS]
with at_col:
    # None is "the default position" (not a number), so that a new prompt's flow is again of its last token.
    picked_at = url_widget(
        st.selectbox,
        "flow_at",
        "Prediction after token" if causal else "Into the representation of",
        None,
        parse=int,
        options=[None, *range(analysis.num_tokens)],
        format_func=lambda i: (
            f"{'the last' if causal else 'the first'}: {default}: {tokens[default]}"
            if i is None
            else f"{i}: {tokens[i]}"
        ),
    )
    position = default if picked_at is None else picked_at
with kept_col:
    kept = url_widget(
        st.slider,
        "kept",
        "Effect drawn",
        KEPT,  # the CLI's default too: one route whoever draws it
        parse=float,
        valid=lambda v: 0.05 <= v <= 1.0,
        min_value=0.05,
        max_value=1.0,
        step=0.05,
        formerly=("share",),
        help="The drawn edges carry at least this fraction of the |effect| of the edges between tokens that lie on "
        "paths into the prediction (the largest first); the three tokens with the largest |score| are always joined to "
        "it.",
    )
with method_col:
    offered = flow_services.methods(sel.request)
    method = url_widget(
        st.selectbox,
        "method",
        "Method",
        FLOW_METHOD,  # the test's choice (docs/METHOD.md 7.3), set where the test's results are
        options=[m.name for m in offered],
        format_func=lambda name: next(m.label for m in offered if m.name == name),
        help="The attribution method (docs/METHOD.md 7.2). The effect flow and the share flow have edges (the graph); "
        "the others give each token a score only.",
    )
target, foil = "", None
if causal:
    with target_col:
        target = url_widget(
            st.text_input,
            "target",
            "Target token",
            "",
            placeholder="empty: the most likely next word",
            help="One token of the model's vocabulary, with its leading space if it has one; empty: the model's most "
            "likely next token that is a word (not a line break or punctuation).",
        )
    with foil_col:
        foil_on = url_widget(st.toggle, "foil_on", "Against a foil", False, parse=parse_bool)
        foil_text = url_widget(
            st.text_input,
            "foil",
            "Foil token",
            "",
            placeholder="empty: the next most likely",
            label_visibility="collapsed",
            disabled=not foil_on,
            help="The flow of logit(target) − logit(foil): what favours the target over this token. Empty: the next "
            "most likely token.",
        )
        foil = foil_text if foil_on else None

default_target = "" if target.strip() or not causal else flow_services.default_target(sel.request, position)
try:
    choice = flow_services.choose(sel.request, position, target or default_target, foil)
except CwvizError as err:  # a model whose block layout the flow does not know (a derived row), say
    st.error(f"The flow cannot be computed for {analysis.info.id}: {err}")
    st.stop()
for problem in choice.problems:
    st.warning(problem)
result = choice.flow
picked_method = next(m for m in offered if m.name == method)
if picked_method.why_not is not None:
    st.warning(
        f"The {picked_method.label} does not run on this model: {picked_method.why_not}. Showing the "
        f"{offered[0].label}."
    )
    picked_method = next(m for m in offered if m.why_not is None)
asked = (sel.request, result.position, result.target, result.foil)
shown = flow_services.get_attribution(*asked, picked_method.name)
drawn = flow_services.get_route(*asked, picked_method.name, kept)
_faithfulness(picked_method, sel)
_graph_and_totals(shown, drawn, picked_method, result, sel)
_caption(shown, drawn, picked_method, result, sel, default_target)
_check(asked, picked_method, shown)

links = st.container(horizontal=True, gap="small")
query_label = sel.token_label(sel.query, markdown=False)
links.link_button(
    f"Heatmaps at layer {sel.layer}, query {query_label} ↗",
    page_url("heatmaps", sel.request, sel.layer, sel.head, sel.query),
    help="The sidebar's layer and query token (a click on a node sets them), in a new tab.",
)
links.link_button(
    f"Token at layer {sel.layer}, query {query_label} ↗", page_url("token", sel.request, sel.layer, sel.head, sel.query)
)


with st.expander("How to read the graph"):
    st.markdown(MORE)

st.subheader("Every head")
heads = flow_services.heads(sel.request, result.position, *choice.asked)
head_value = "direct" if not result.encoder else "routed"
picked = sel.head
if picked is None:  # all heads in the sidebar: the layer's head with the largest |part|
    in_layer = heads[heads["layer"] == sel.layer]
    picked = int(in_layer.loc[in_layer[head_value].abs().idxmax(), "head"])
map_col, vocab_col = st.columns([3, 2], gap="medium")
with map_col:
    what_heads = "direct part of the logit difference" if not result.encoder else "part of the routed share"
    widgets.head_grid(
        charts.head_pick_map(heads, head_value, sel.layer, picked, f"Each head's {what_heads} (click a head)"),
        heads,
        f"cwviz-flow-heads-{result.position}",
        key="flow_heads",
    )
with vocab_col:
    row = heads[(heads["layer"] == sel.layer) & (heads["head"] == picked)].iloc[0]
    chosen = "" if sel.head is not None else " (the layer's largest; pick another in the sidebar or on the map)"
    st.markdown(f"**Layer {sel.layer}, head {picked}**{chosen}: {head_value} part {row[head_value]:+.4f}.")
    if result.encoder:
        st.caption("An encoder has no output layer over a vocabulary: no tokens to promote or suppress.")
    else:
        vocab = result.vocabulary_table
        vocab = vocab[(vocab["layer"] == sel.layer) & (vocab["head"] == picked)]
        st.caption("What its write at the prediction's position pushes up and down (logits through the output layer).")
        table = {
            direction: vocab[vocab["direction"] == direction]
            .sort_values("rank")[["token", "logit"]]
            .reset_index(drop=True)
            for direction in ("promoted", "suppressed")
        }
        up, down = st.columns(2)
        up.dataframe(table["promoted"].rename(columns={"token": "promoted"}), hide_index=True, key="flow_promoted")
        down.dataframe(
            table["suppressed"].rename(columns={"token": "suppressed"}), hide_index=True, key="flow_suppressed"
        )
