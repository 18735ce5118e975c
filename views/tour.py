"""Tour: eight steps that tell docs/METHOD.md's story on the sidebar's model and prompt, for a class.

Each step: one chart, a few plain sentences, Back/Next, and a link that opens the full page on the same view.
What each step shows is picked from the analysis (:mod:`cwviz.analyses.tour`), never fixed in advance.
"""

import streamlit as st

from cwviz import CwvizError
from cwviz.analyses import tour
from cwviz.app import flow_services, services, sink_services, widgets
from cwviz.app.links import page_url
from cwviz.app.sidebar import escape_markdown, sidebar
from cwviz.app.state import select
from cwviz.charts import flow as flow_charts
from cwviz.charts import heatmaps as heatmap_charts
from cwviz.charts import sinks as sink_charts
from cwviz.charts import token as token_charts

#: The steps, in order: (short name, title).
STEPS: tuple[tuple[str, str], ...] = (
    ("Attention", "Attention piles onto the first token"),
    ("Contribution", "…but it writes little"),
    ("Negative", "A key that writes against the output"),
    ("Factors", "Attention × norm ratio × cosine"),
    ("Anti-aligned", "The sink's value opposes the rest"),
    ("Removal", "Remove the sink's value (λ = 0)"),
    ("Encoder", "An encoder's [CLS] token"),
    ("Flow", "Where the answer came from"),
)
COUNT = len(STEPS)
GLOSSARY = """
- **Token**: a piece of the text (a word, part of a word, a sign) at one position.
- **Query**: the token whose new representation the attention layer is computing.
- **Key**: an earlier token (in an encoder, any token) the query can look at.
- **Attention weight**: how strongly the query selects a key; a query's weights are all positive and add up to 1.
- **Value vector**: what a key offers to be copied, one list of numbers per key and head.
- **Projected value**: the value vector mapped into the model's main stream by the head's output matrix: what the key
  would actually write there.
- **Contribution weight**: the share of the layer's output that comes from one key, counting its attention, the length
  of its projected value and its direction. A query's contributions add up to 1 too, but one can be negative.
- **Norm ratio**: how long a key's projected value is compared with the output it helps to make.
- **Cosine**: whether the projected value points along the output (+1), across it (0) or against it (−1).
- **Sink**: a token, usually the first, that receives much attention whatever the query is.
- **Semantic cone**: how much a head's outputs at different positions point the same way (their mean pairwise cosine);
  a narrower cone means the outputs look more alike.
- **Perplexity**: how surprised a language model is by each next token of the text, on average; lower is better.
- **Logit**: the model's score for one possible next token, before the scores become probabilities; higher is likelier.
- **Signed flow**: a next token's logit split over the input tokens, followed back through every layer; a token's
  share is negative when it pushes the model away from that token.
"""

sel = sidebar("A guided tour")
if not sel.ok:
    st.stop()

picker, back, forward, about = st.columns([7, 2, 2, 5], vertical_alignment="center")
with about.expander("What the tour shows · glossary"):
    st.markdown(
        "Eight steps through what attention weights hide, on the sidebar's model and prompt: change them, press Analyze, and every step follows."
    )
    st.markdown(GLOSSARY)


def move(delta: int) -> None:
    st.session_state["step"] = min(max(int(st.session_state.get("step") or 1) + delta, 1), COUNT)


with picker:
    step = st.segmented_control(
        "Step",
        options=list(range(1, COUNT + 1)),
        required=True,
        key="step",
        bind="query-params",
        persist_state="session",
        label_visibility="collapsed",
        help=" · ".join(f"{i} {name}" for i, (name, _) in enumerate(STEPS, start=1)),
    )
step = int(step or 1)
# Back and Next stay in one place on every step (a presenter clicks without looking for them).
back.button("← Back", on_click=move, args=(-1,), disabled=step == 1, key="tour_back", width="stretch")
forward.button("Next →", on_click=move, args=(1,), disabled=step == COUNT, key="tour_next", type="primary", width="stretch")
plan = sink_services.tour_plan(sel.request)
layer, head, neg, anti = plan.layer.layer, plan.head, plan.negative, plan.anti
query = neg.query if neg is not None else None
neg_head = neg.head if neg is not None else head  # the head of steps 3 and 4: the sink head, unless nothing there is negative
first = escape_markdown(repr(plan.sink_token))
SHORT = "type a prompt of two tokens or more in the sidebar and press Analyze."
#: Steps whose chart is too wide for the column beside the text: it goes below the text instead.
WIDE = (3, 4, 6)


def both_true(neg: tour.NegativeKey) -> str:
    """The sentence that reconciles a head's picture with step 2's, from the plan's numbers (:class:`~cwviz.analyses.tour.HeadScale`):
    the sink can be nearly all of a head's output and still a small part of the layer's."""
    scale = neg.scale
    if scale is None:
        return ""
    if not scale.sink_dominates:
        return (
            f" Here the first token's contribution is {scale.sink_intra:+.2f} of this head's output for the query, and "
            f"{scale.sink_inter:+.2f} of the layer's."
        )
    why = (
        f"this head's output is short (‖o‖ = {scale.head_norm:.1f} against the layer's {scale.layer_norm:.1f}, "
        f"{scale.head_fraction:.0%} of it)"
        if scale.small_head
        else "this head's output points largely away from the layer's"
    )
    part = "nearly all of it" if scale.sink_intra >= 0.9 else "the largest part"
    return (
        f" Both pictures are true: the first token's contribution to this head's output is {scale.sink_intra:+.2f}, {part} "
        f"(its red column and bar), but {why}, so it adds only {scale.sink_inter:.0%} of the layer's output, as step 2 says."
    )


def scale_aside(neg: tour.NegativeKey) -> tuple | None:
    """Steps 3 and 4's absolute scale, drawn beside the sentence where the head's picture and step 2's disagree
    (:attr:`~cwviz.analyses.tour.HeadScale.sink_dominates`): the head's output and the layer's as bars of their length,
    each with the first token's part (:func:`cwviz.charts.sinks.scale_bars`); None elsewhere."""
    scale = neg.scale
    if scale is None or not scale.sink_dominates:
        return None
    table = scale.table(layer, neg.head)
    return sink_charts.scale_bars(table, f"Lengths for query {sel.token_label(neg.query)}"), table


def sync(layer: int, head: int | None, query: int | None) -> None:
    """On entering a step, point the sidebar's selection (and so the other pages) at what the step shows, once."""
    entered = (sel.request, step)
    if st.session_state.get("_tour_entered") == entered:
        return
    st.session_state["_tour_entered"] = entered
    if (sel.layer, sel.head, sel.query) != (layer, head, sel.query if query is None else query):
        select(layer=layer, head=head, query=query)


def show(text: str, link: str | None, page: str, chart=None, data=None, draw=widgets.chart, aside=None) -> None:
    """The step: its title, the sentences and the link to the full page, then its chart (beside the text, or below
    it for a wide chart). ``chart`` None: the step has nothing to draw on this prompt (``text`` says why).
    ``draw``: the widget that shows it (:func:`cwviz.app.widgets.chart`; ``head_grid`` and ``query_heatmaps`` make a
    click select the head or the query in the sidebar, as those charts' titles say). ``aside``: a small chart and its
    rows drawn beside the sentences (:func:`scale_aside`)."""
    wide = step in WIDE or chart is None
    left, right = (st.container(), st.container()) if wide else st.columns([1, 2], gap="medium")
    if aside is not None:
        left, beside = left.columns([3, 2], gap="medium")
        with beside:
            widgets.chart(*aside, f"cwviz-tour-step{step}-scale", key=f"tour_scale_{step}")
    with left:
        st.subheader(f"{step}. {STEPS[step - 1][1]}")
        (st.markdown if chart is not None else st.info)(text)
        if link is not None:
            st.link_button(f"Open in {page} ↗", link, help="The full page on this view, in a new tab.")
    if chart is not None:
        with right:
            draw(chart, data, f"cwviz-tour-step{step}", key=f"tour_chart_{step}")


if step == 1:
    sync(layer, head, query)
    summary = services.head_summary(sel.request)
    show(
        f"Each cell is one head of one layer, coloured by the share of its attention that goes to the first token, "
        f"{first}. In layer {layer} the heads give it {plan.layer.attention_share:.0%} of their attention on average, "
        f"and head {head} (outlined) gives it {plan.head_sink_attention:.0%}. Judged by attention alone, this token would "
        "be the most important one in the text.",
        page_url("heatmaps", sel.request, layer, head, query, colour="sink_attention"),
        "Heatmaps",
        heatmap_charts.head_overview(summary, "sink_attention", layer, head),
        summary,
        widgets.head_grid,
    )
elif step == 2:
    sync(layer, head, query)
    link = page_url("sinks", sel.request, layer, head, query, sink="first")
    if neg is None:
        show(f"With one token there is nothing but the first token to attend to: {SHORT}", link, "Sinks")
        st.stop()
    tables = sink_services.sink_tables(sel.request, sink_services.TOUR_SINK)
    show(
        "A contribution weight measures how much of what the layer writes comes from a token: attention × the length "
        f"of the token's projected value × its direction. In layer {layer} (dashed line) the first token gets "
        f"{plan.layer.attention_share:.0%} of the attention but makes {'only ' if plan.layer.writes_little else ''}"
        f"{plan.layer.contribution_share:.0%} of the layer's output: the gap between the two lines is how far attention "
        "overstates it.",
        link,
        "Sinks",
        sink_charts.share_chart(tables.layers, layer),
        tables.layers,
    )
elif step == 3:
    sync(layer, neg_head, query)
    link = page_url("heatmaps", sel.request, layer, neg_head, query, measure="contribution", kind="intra")
    if neg is None:
        show(f"A key can write against the output only when the query sees two keys or more: {SHORT}", link, "Heatmaps")
        st.stop()
    key = sel.token_label(neg.key)
    if neg.contribution < 0:
        text = (
            f"Head {neg_head} of layer {layer}, query {sel.token_label(neg.query)} (outlined row)"
            + ("" if neg_head == head else f"; head {head} has no negative contribution here")
            + f". Key {key} gets "
            f"{neg.attention:.1%} of the attention, yet its contribution is **{neg.contribution:+.3f}** (ringed): its value "
            "points against the head's output and takes something away from it (blue subtracts, red adds)." + both_true(neg)
        )
    else:
        text = (
            f"Layer {layer}: no key writes against its heads' outputs on this prompt; the smallest "
            f"contribution is key {key}'s (ringed), {neg.contribution:+.3f}, for query {sel.token_label(neg.query)}. Try a "
            "longer prompt, or another head on the Heatmaps page." + both_true(neg)
        )
    cells = services.heatmap_cells(sel.request, layer, neg_head, "contribution_intra", tour.KIND, neg.query, "window")
    show(
        text,
        link,
        "Heatmaps",
        cells,
        cells.frame,
        # The Heatmaps page's two maps, each as wide as its column; a click selects the query as there.
        lambda cells, _data, name, key: widgets.query_heatmaps(cells, neg.query, name, key, key_mark=neg.key),
        aside=scale_aside(neg),
    )
elif step == 4:
    sync(layer, neg_head, query)
    link = page_url("token", sel.request, layer, neg_head, query, token_kind="intra")
    if neg is None:
        show(f"With one key, its contribution is the whole output: {SHORT}", link, "Token")
        st.stop()
    factors = services.token_factors(sel.request, layer, neg.query, neg_head, tour.KIND, also=neg.key)
    show(
        f"Every contribution is the product of three numbers, drawn here for query {sel.token_label(neg.query)} in "
        f"head {neg_head} of layer {layer}: the attention, the norm ratio (how long the key's projected value is compared "
        f"with the head's output) and the cosine (its direction). For key {sel.token_label(neg.key)}: "
        f"{neg.attention:.3f} × {neg.norm_ratio:.2f} × {neg.cosine:+.2f} = {neg.contribution:+.3f} (▶, outlined). Only the "
        "cosine can be negative, so it alone decides the sign; the first token's bars are purple." + both_true(neg),
        link,
        "Token",
        token_charts.factor_bars(factors, mark=neg.key),
        factors.wide,
        aside=scale_aside(neg),
    )
elif step == 5:
    target = (anti.layer, anti.head) if anti is not None else (layer, head)
    sync(*target, None)
    link = page_url("sinks", sel.request, *target, sel.query, sink="first")
    if anti is None:
        show(f"No query sees a key besides the sink, so its value has nothing to point against: {SHORT}", link, "Sinks")
        st.stop()
    tables = sink_services.sink_tables(sel.request, sink_services.TOUR_SINK)
    against = anti.cos < 0
    show(
        "A head's output mixes the sink's projected value with the mean of the other keys' values. In blue heads "
        "they point in opposite directions: the sink cancels part of what the others write. The most "
        f"{'anti-' if against else ''}aligned of the heads that attend to it most is head {anti.head} of layer "
        f"{anti.layer} (outlined, cosine {anti.cos:+.2f}); its output is shortest when the sink takes about "
        f"{anti.minimising_ratio:.0%} of its attention."
        + ("" if against else " On this prompt no such head points against the rest on average."),
        link,
        "Sinks",
        sink_charts.anti_alignment_map(tables.heads, *target),
        tables.heads,
    )
elif step == 6:
    target = (anti.layer, anti.head) if anti is not None else (layer, head)
    sync(*target, None)
    link = page_url("sinks", sel.request, *target, sel.query, sink="first", **{"lambda": "0", "scope": "all"})
    if neg is None:
        show(f"With one token, removing the first token's value leaves nothing to compare: {SHORT}", link, "Sinks")
        st.stop()
    result = sink_services.intervention(sel.request, plan.sink, 0.0, None)
    table = result.table
    norm, cone = table["output_norm_change"].mean(), table["cone_change"].mean()
    if plan.causal:
        effect = f"Perplexity on this prompt goes from {result.perplexity_clean:.1f} to {result.perplexity:.1f}" + (
            " (the model predicts the text worse). " if result.delta_ppl > 0 else ". "
        )
    else:
        effect = f"Perplexity needs a causal language model, and {sel.analysis.info.id} is an encoder: only its head outputs are compared. "
    show(
        f"Here the first token's value is set to zero in every layer (λ = 0), its attention left as it was. {effect}"
        f"Head outputs change length by {norm:+.2f} on average, and their mean pairwise cosine by {cone:+.3f}: "
        + (
            "they crowd into a narrower semantic cone."
            if cone > 0
            else "on this prompt they spread out rather than crowd into a narrower cone."
        ),
        link,
        "Sinks",
        sink_charts.intervention_chart(table),
        table,
    )
elif step == 7:
    encoder = sink_services.tour_encoder(sel.request)
    if encoder.error is not None or encoder.layer is None:
        why = encoder.error or "no query sees a key besides the first token: type a longer prompt"
        show(f"This step analyses the prompt with an encoder, which could not be done here: {why}", None, "Sinks")
        st.stop()
    if encoder.own_model:
        sync(encoder.layer.layer, None, None)
    what = "This model is an encoder" if encoder.own_model else f"The same prompt in {encoder.request.model}, a BERT encoder"
    show(
        f"{what}: every token sees every other, and the first is the special token "
        f"{escape_markdown(repr(encoder.tables.sink_token))}. In layer {encoder.layer.layer} it takes "
        f"{encoder.layer.attention_share:.0%} of the attention, yet it makes only {encoder.layer.contribution_share:.0%} "
        "of the layer's output: a sink again, looked at a lot and writing almost nothing.",
        page_url("sinks", encoder.request, encoder.layer.layer, None, sink="first"),
        "Sinks",
        sink_charts.share_chart(encoder.tables.layers, encoder.layer.layer),
        encoder.tables.layers,
    )
else:
    position = sel.analysis.num_tokens - 1 if plan.causal else 0
    link = page_url("flow", sel.request, sel.layer, sel.head, position)
    if sel.analysis.num_tokens < 2:
        show(f"With one token there is nothing to trace the prediction back to: {SHORT}", link, "Flow")
        st.stop()
    sync(sel.layer, sel.head, position)
    try:
        # the Flow page's default target: the most likely next word (a demo that starts on a word, issue 55)
        result = flow_services.choose(sel.request, position, flow_services.default_target(sel.request, position)).flow
    except CwvizError as err:  # a model whose block layout the flow does not know (a derived row)
        show(f"The flow cannot be computed for this model: {err}", None, "Flow")
        st.stop()
    story = tour.flow_story(result)
    layers = sel.analysis.num_layers
    support = f"Token {sel.token_label(story.support[0])} adds the most ({story.support[2]:+.2f})"
    if story.against is None:
        against = "; on this prompt no token works against it."
    else:
        against = f", and {sel.token_label(story.against[0])} works most against it ({story.against[2]:+.2f}, blue)."
    if plan.causal:
        first = (
            f"Followed back through all {layers} layers, the logit of the model's most likely next word here, "
            f"{escape_markdown(repr(story.target))}, {story.logit:+.2f}, splits into a signed share from every input token "
            "(the biases take the rest): red adds, blue subtracts."
        )
    else:
        first = (
            f"An encoder predicts no next token, so here the final representation of {sel.token_label(0)} is followed back "
            f"through all {layers} layers and split into a signed share from every input token (with the biases they add up to 1)."
        )
    keep = [story.support[0]] + ([] if story.against is None else [story.against[0]])
    value = "share" if result.encoder else "total"  # an encoder's totals are shares of its representation (sum to 1)
    tokens = result.tokens[["position", "token", "total"]].rename(columns={"total": value})
    rows = flow_charts.total_rows(tokens, value, keep=keep)
    show(
        f"{first} {support}{against}",
        link,
        "Flow",
        flow_charts.totals_bars(rows, f"Each input token's {value}", "red adds, blue subtracts", value, label_px=widgets.label_px()),
        tokens,
    )
