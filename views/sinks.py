"""Attention sinks as active suppressors (docs/METHOD.md section 4): the sink ratio, anti-alignment, shares,
and what happens when the sink's value is scaled."""

import streamlit as st

from cwviz import CwvizError
from cwviz.app import hosting, widgets
from cwviz.app import sink_services as services
from cwviz.app.sidebar import sidebar
from cwviz.app.state import parse_bool, url_widget
from cwviz.charts import sinks as charts
from cwviz.charts.export import to_csv

SINK_CHOICES = {"first": "first token", "auto": "detected (most attention received)", "position": "a position"}

sel = sidebar("Attention sinks as active suppressors")
st.markdown(
    "A sink (by default the first token) soaks up attention; this page shows whether what it writes cancels what the "
    "other tokens write."
)
with st.expander("How to read this page"):
    st.markdown(
        "Each head's output splits into the sink's part and the rest, o = s·ṽ_sink + (1 − s)·m, where s is the "
        "attention on the sink, ṽ_sink its projected value and m the attention-weighted mean of the other keys' "
        "projected values; when ṽ_sink points against m (cosine below zero, blue in the map) the sink does not just "
        "store spare attention but cancels part of what the other tokens write, so the output norm is smallest at a "
        "sink ratio inside (0, 1) rather than at either end: where exactly depends on the head (the dashed line in "
        "(a)); the paper reports moderate ratios in real heads."
    )
st.caption(
    "The charts follow the sidebar: (a) shows the selected layer and head (ringed: the selected query), the map "
    "outlines the selected head (click a cell to select it), the share chart marks the selected layer, and the "
    "intervention can act on the selected layer."
)
if not sel.ok:
    st.stop()

causal = sel.analysis.info.causal
last = sel.analysis.num_tokens - 1
choices = dict(SINK_CHOICES)
if not causal:  # an encoder: every query sees every key, and its special tokens at both ends are the usual sinks
    tokens = sel.analysis.tokens
    ends = {"first": f"first token ({tokens[0]})", "last": f"last token ({tokens[last]})"}
    choices = ends | {k: v for k, v in choices.items() if k not in ends}
    st.info(
        f"{sel.analysis.info.id} is an encoder: every query attends to every key, and the special tokens "
        f"{tokens[0]!r} (first) and {tokens[last]!r} (last) are where sinks usually form; pick either as the sink. "
        "Perplexity needs a causal language model, so the intervention below reports head outputs only."
    )
if st.session_state.get("sink", "first") not in choices:  # "last" left by an encoder, now a causal model
    st.session_state["sink"] = "first"

left, middle, right = st.columns([3, 2, 3])
with left:
    choice = url_widget(
        st.radio, "sink", "Sink", "first", options=list(choices), format_func=choices.get, horizontal=True
    )
with middle:
    position = url_widget(
        st.number_input,
        "sink_pos",
        "Sink position",
        0,
        parse=int,
        valid=lambda v: 0 <= v <= last,
        min_value=0,
        max_value=last,
        step=1,
        disabled=choice != "position",
    )
pool_path, pool_n = "", 0
if hosting.policy_from_env().server_files:  # off in hosting mode: the server's files are not the users'
    with right.expander("Pool prompts from a JSONL file"):
        pool_path = st.text_input(
            "Path",
            placeholder="/path/to/test.jsonl",
            key="sinks_pool_path",
            help="One prompt a line: a 'text' field, or GSM8K's 'question' and 'answer'.",
        )
        pool_n = st.number_input(
            "First N prompts", min_value=0, max_value=services.MAX_POOLED, value=0, key="sinks_pool_n"
        )
sink = {"first": "0", "last": str(last), "auto": "auto", "position": str(position)}[choice]

stop = st.empty()
# a few forward passes a prompt: a Stop (its click reruns the page, interrupting the run) keeps the finished ones
if pool_n:
    stop.button(
        "Stop pooling",
        key="sinks_pool_stop",
        on_click=lambda: st.session_state.update(sinks_pool_n=0),
        help="Stops pooling; the prompts finished are kept, and asking for them again resumes.",
    )
try:
    tables = services.sink_tables(sel.request, sink, pool_path, int(pool_n))
    view = services.head_view(sel.request, sink, pool_path, int(pool_n), sel.layer, sel.head)
except CwvizError as err:
    st.error(str(err))
    st.stop()
stop.empty()
pooled = (
    f" pooled over {tables.prompts} prompts (the sidebar prompt and {tables.prompts - 1} from the file)"
    if tables.prompts > 1
    else ""
)
st.caption(
    f"Sink: position {tables.sink} {tables.sink_token!r}{pooled}. Means over heads and the queries that see a "
    "key besides the sink."
)
learned = tables.layers["learned_sink_share"] if "learned_sink_share" in tables.layers else None
if learned is not None and (learned > 0).any():
    here = tables.layers.loc[tables.layers["layer"] == sel.layer, "learned_sink_share"]
    st.info(
        f"This model has learned attention sinks (one logit per head that joins the softmax and writes nothing): "
        f"the learned sink takes {learned.mean():.1%} of the attention on average"
        + (f", {here.iloc[0]:.1%} in layer {sel.layer}" if len(here) else "")
        + ". Attention on the real keys sums to less than 1; their contributions still sum to 1."
    )

st.subheader("(a) Sink ratio against head output norm")
which = (
    f"head {view.head}"
    if sel.head is not None
    else f"head {view.head}, the most anti-aligned of layer {view.layer} (pick a head in the sidebar)"
)
st.caption(
    f"Layer {view.layer}, {which}. Points: queries. Curve: ‖s·ṽ_sink + (1 − s)·m‖ with the head's median ‖ṽ_sink‖, "
    f"‖m‖ and cos (= {view.cos:+.2f}, a median over queries: the anti-alignment map below shows means); dashed: the "
    "ratio where it is smallest."
)
widgets.chart(
    charts.ratio_norm_chart(view.points, view.curve, view.minimiser, query=sel.query),
    view.points,
    f"cwviz-sink-ratio-layer{view.layer}-head{view.head}",
    key="sinks_ratio",
)

left, right = st.columns(2)
with left:
    st.subheader("(b) Anti-alignment")
    widgets.head_grid(
        charts.anti_alignment_map(tables.heads, sel.layer, sel.head),
        tables.heads,
        "cwviz-sink-anti-alignment",
        key="sinks_map",
    )
with right:
    st.subheader("(c) Attention vs contribution share")
    st.caption("Attention averaged over heads; contribution: the layer-level (inter-head) weight, summed over heads.")
    # Half the page: at 1,280 px with the sidebar open a half column is about 420 px, labels and legend included.
    share = charts.share_chart(tables.layers, sel.layer, width=charts.HALF_WIDTH)
    widgets.chart(share, tables.layers, "cwviz-sink-shares", key="sinks_shares")


def intervention_choice() -> tuple[float, tuple[int, ...] | None]:
    """λ (applied with its form's button) and the layers it scales the sink's value in (None: every layer)."""
    left, right = st.columns(2)
    # In a form: λ applies once, with Apply (or Enter), whatever the slider passed through on the way (each
    # value is a forward pass; ten arrow presses were ten of them).
    with left, st.form("sinks_lambda_form", border=False, enter_to_submit=True):
        factor = url_widget(
            st.slider,
            "lambda",
            "λ",
            0.0,
            parse=float,
            valid=lambda v: 0.0 <= v <= 2.0,
            min_value=0.0,
            max_value=2.0,
            step=0.05,
            help="Move it, then Apply: each value is one forward pass with the sink's value scaled.",
        )
        st.form_submit_button("Apply λ", key="sinks_lambda_apply")
    with right:
        scope = url_widget(
            st.radio,
            "scope",
            "In",
            "all",
            options=["all", "selected", "chosen"],
            horizontal=True,
            format_func={
                "all": "every layer",
                "selected": f"layer {sel.layer} (sidebar)",
                "chosen": "chosen layers",
            }.get,
        )
    if scope == "selected":
        return float(factor), (sel.layer,)
    if scope == "chosen":
        with right:
            chosen = url_widget(
                st.multiselect,
                "layers",
                "Layers",
                [sel.layer],
                parse=int,
                options=list(range(sel.analysis.num_layers)),
            )
        return float(factor), tuple(chosen)
    return float(factor), None


def intervention_result(result, factor: float) -> None:
    """The perplexities before and after, the semantic cone's mean change, and the per-layer chart of ``result``."""
    a, b, c = st.columns(3)
    if causal:
        a.metric("PPL clean", f"{result.perplexity_clean:.3f}")
        # The change in grey: Streamlit's red and green arrows would give red a meaning besides a sign and green one
        # besides attention (cwviz.charts.palette); the number says which way it went.
        b.metric("PPL intervened", f"{result.perplexity:.3f}", delta=f"{result.delta_ppl:+.3f}", delta_color="off")
    else:
        a.metric(
            "PPL",
            "n/a",
            help="Perplexity measures next-token prediction: it needs a causal language model, not an encoder.",
        )
    c.metric(
        "Semantic cone, mean change",
        f"{result.table['cone_change'].mean():+.4f}",
        help="Mean pairwise cosine of each head's outputs across positions, after minus before, averaged over layers "
        "and heads.",
    )
    if factor == 1.0:
        st.info(
            "λ = 1 keeps the sink's value as it is: the intervention changes nothing. Pick another λ to see its effect."
        )
    else:
        widgets.chart(
            charts.intervention_chart(result.table), result.table, "cwviz-sink-intervention", key="sinks_intervention"
        )


def layerwise_section(factor: float) -> None:
    """ΔPPL with λ in one layer at a time, behind a toggle (a pass a few layers), with Stop; a stopped run resumes."""
    done = services.layerwise_done(sel.request, tables.sink, factor)
    if not url_widget(
        st.toggle,
        "layerwise",
        "ΔPPL with the sink's value scaled by λ in one layer at a time",
        False,
        parse=parse_bool,
        help="One forward pass per layer (batched, a few layers a pass): slow on a CPU; Stop keeps the finished "
        "layers.",
    ):
        if 0 < len(done) < sel.analysis.num_layers:
            st.caption(f"Stopped after {len(done)} of {sel.analysis.num_layers} layers: turn the toggle on to resume.")
        return
    # a click reruns the fragment, which interrupts the passes between two: the finished layers are kept
    stop = st.empty()
    stop.button(
        "Stop",
        key="sinks_layerwise_stop",
        on_click=lambda: st.session_state.update(layerwise=False),
        help="Stops the passes; the finished layers are kept, and turning the toggle on again resumes.",
    )
    per_layer = services.layerwise(sel.request, tables.sink, factor)
    stop.empty()
    st.dataframe(
        per_layer,
        hide_index=True,
        column_config={
            "perplexity": st.column_config.NumberColumn(format="%.3f"),
            "delta_ppl": st.column_config.NumberColumn("ΔPPL", format="%+.3f"),
        },
    )


# A fragment: moving λ (or the scope, or the per-layer toggle) reruns this section only, not the sidebar and the
# three charts above, whose data do not depend on it; a change in the sidebar still reruns the whole page.
@st.fragment
def intervention_section() -> None:
    st.subheader("Intervention: scale the sink's value")
    st.caption(
        "v_sink ← λ·v_sink (so ṽ_sink in every head), attention kept; λ = 0 removes the sink's write. Only this "
        "forward pass is changed: the shared model is untouched."
    )
    factor, layers = intervention_choice()
    try:
        result = services.intervention(sel.request, tables.sink, factor, layers)
    except CwvizError as err:
        st.error(str(err))
        return
    intervention_result(result, factor)
    if causal:
        layerwise_section(factor)


intervention_section()

with st.expander("Per-layer table"):
    st.dataframe(
        tables.layers,
        hide_index=True,
        column_config={c: st.column_config.NumberColumn(format="%.3f") for c in tables.layers.columns if c != "layer"},
    )
    st.download_button(
        "Full table (CSV)",
        data=lambda: to_csv(tables.table),
        file_name="cwviz-sinks.csv",
        mime="text/csv",
        key="sinks_csv",
        on_click="ignore",
    )
