"""Flow: where the model's prediction came from, signed, through every layer (docs/METHOD.md section 6): the pruned
graph beside the input tokens' totals, then each head's direct part and what the selected head's write promotes."""

import streamlit as st

from cwviz import CwvizError
from cwviz.analyses.schema import FLOW_SHARE
from cwviz.app import flow_services, widgets
from cwviz.app.links import page_url
from cwviz.app.sidebar import escape_markdown, sidebar
from cwviz.app.state import parse_bool, url_widget
from cwviz.charts import flow as charts

MORE = (
    "**The graph.** A node is the residual stream at one position entering one layer (the top row is the final "
    "residual, where the prediction is read); its value is the part of the logit difference that passes through it. "
    "An edge (layer l, token j) → (layer l + 1, token i) is the part of i's value that came from j through layer l's "
    "attention (j = i: the token's own residual). Red adds to the target (over the foil), blue subtracts; an edge's "
    "width is its |weight|. Each layer keeps its largest edges until they hold the chosen share of that layer's |mass|; "
    f"at most {charts.EDGE_CAP} edges and {charts.PAGE_POSITIONS} positions are drawn (the largest). MLPs act on each "
    "position alone: they pass a position's composition through unchanged.\n\n"
    "**The totals.** Each input token's signed total is its share of the logit difference, routed down every layer: "
    "with the biases' part they sum to the logit difference (through the final norm frozen at its value; its "
    "linearisation error is printed beside it). **The heads.** Each head's direct part is what its write at the "
    "prediction's position adds to the logit difference; its vocabulary is that write read through the output layer. "
    "The method: docs/METHOD.md section 6; whether it is faithful: docs/flow.md."
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

at_col, target_col, foil_col, share_col = st.columns([3, 3, 3, 3], vertical_alignment="bottom")
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
            f"{'the last' if causal else 'the first'}: {default}: {tokens[default]}" if i is None else f"{i}: {tokens[i]}"
        ),
    )
    position = default if picked_at is None else picked_at
with share_col:
    share = url_widget(
        st.slider,
        "share",
        "Edges kept",
        FLOW_SHARE,  # the library's and the CLI's default too: one graph whoever draws it
        parse=float,
        valid=lambda v: 0.05 <= v <= 1.0,
        min_value=0.05,
        max_value=1.0,
        step=0.05,
        help="Each layer keeps its largest edges until they hold this share of its |mass| (Σ |weight|).",
    )
target, foil = "", None
if causal:
    with target_col:
        target = url_widget(
            st.text_input,
            "target",
            "Target token",
            "",
            placeholder="empty: the top next token",
            help="One token of the model's vocabulary, with its leading space if it has one; empty: the model's top next token.",
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
            help="The flow of logit(target) − logit(foil): what favours the target over this token. Empty: the next most likely token.",
        )
        foil = foil_text if foil_on else None

try:
    choice = flow_services.choose(sel.request, position, target, foil)
except CwvizError as err:  # a model whose block layout the flow does not know (a derived row), say
    st.error(f"The flow cannot be computed for {analysis.info.id}: {err}")
    st.stop()
for problem in choice.problems:
    st.warning(problem)
result = choice.flow
value = "total" if not result.encoder else "share"
graph = charts.graph_tables(result.node_table, result.edges(share), result.tokens, float(result.edge_mass.sum()), result.position)
where = f"{result.position} {result.token_strings[result.position]!r}"
if result.encoder:
    what = f"into {where}'s final representation"
    summary = f"the tokens' shares and the biases' {result.bias_total:+.3f} sum to 1"
else:
    over = "" if result.foil is None else f" over {result.foil_token!r}"
    what = f"toward {result.target_token!r}{over} after {where}"
    summary = (
        f"logit{' difference' if result.foil is not None else ''} {result.frozen_logit_difference:+.3f} "
        f"(the model's own, after any soft-cap, {result.logit_difference:+.3f}; frozen-norm error {result.norm_error:+.1e}): the tokens' "
        f"totals and the biases' {result.bias_total:+.3f} sum to it"
    )
px = widgets.label_px()
graph_col, totals_col = st.columns([13, 6], gap="small")
with graph_col:
    title = f"{'Signed flow' if not result.encoder else 'Signed composition'} {what} (click a node)"
    widgets.node_graph(
        charts.route_graph(graph, analysis.num_layers, title, label_px=px, selected=(sel.layer, sel.query), **charts.page_sizes(px)),
        graph.edges,
        f"cwviz-flow-graph-{result.position}",
        key="flow_graph",
        layers=analysis.num_layers,
    )
with totals_col:
    rows = charts.total_rows(result.tokens, value, charts.total_row_count(px))
    some = "every token" if len(rows) == len(result.tokens) else f"the {len(rows)} largest of {len(result.tokens)},"
    widgets.chart(  # the subtitle on two lines: one would be cut at the bars' width in presenter mode
        charts.totals_bars(rows, f"Each token's {value}", [some, "in text order"], value, label_px=px),
        result.tokens,
        f"cwviz-flow-totals-{result.position}",
        key="flow_totals",
    )

drawn = f"{len(graph.edges)} of the {graph.pruned} edges kept at {share:.0%} of each layer's |mass|"
drawn += f" ({graph.drawn_mass / graph.mass:.0%} of all |mass|)" if graph.mass > 0 else ""
complete = result.edges_complete(share)
st.caption(
    f"The flow {escape_markdown(what)}: {summary}. Drawn: {drawn}"
    + ("" if not graph.capped else f", the largest (at most {charts.EDGE_CAP} edges, {charts.PAGE_POSITIONS} positions)")
    + ("" if complete else "; some layers' edges stop short of the share (the flow keeps the largest 20,000 a layer)")
    + "."
    + (
        ""
        if result.encoder
        else " The model's most likely next tokens: "
        + ", ".join(
            f"{t!r} {p:.0%}"
            for t, p in flow_services.predictions(sel.request, result.position)[["token", "probability"]].itertuples(index=False)
        )
        + "."
    )
)

links = st.container(horizontal=True, gap="small")
query_label = sel.token_label(sel.query, markdown=False)
links.link_button(
    f"Heatmaps at layer {sel.layer}, query {query_label} ↗",
    page_url("heatmaps", sel.request, sel.layer, sel.head, sel.query),
    help="The sidebar's layer and query token (a click on a node sets them), in a new tab.",
)
links.link_button(f"Token at layer {sel.layer}, query {query_label} ↗", page_url("token", sel.request, sel.layer, sel.head, sel.query))


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
            direction: vocab[vocab["direction"] == direction].sort_values("rank")[["token", "logit"]].reset_index(drop=True)
            for direction in ("promoted", "suppressed")
        }
        up, down = st.columns(2)
        up.dataframe(table["promoted"].rename(columns={"token": "promoted"}), hide_index=True, key="flow_promoted")
        down.dataframe(table["suppressed"].rename(columns={"token": "suppressed"}), hide_index=True, key="flow_suppressed")
