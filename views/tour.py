"""Tour: eight steps that tell docs/METHOD.md's story on the sidebar's model and prompt, for a class.

Each step: one chart, a few plain sentences, Back/Next, and a link that opens the full page on the same view.
What each step shows is picked from the analysis (:mod:`cwviz.analyses.tour`), never fixed in advance, and its
sentences are written from those picks (:mod:`cwviz.analyses.tour_story`).
"""

import streamlit as st

from cwviz import CwvizError
from cwviz.analyses import tour, tour_story
from cwviz.app import flow_services, services, sink_services, widgets
from cwviz.app.links import page_url
from cwviz.app.sidebar import escape_markdown, sidebar
from cwviz.app.state import presenter, select
from cwviz.charts import flow as flow_charts
from cwviz.charts import head_grid
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

# In presenter mode the step's own title heads the page: the page's would push step 3's ringed cell, in a map of 16 px
# rows beside its sentence, below a 720 px projector's first screen.
sel = sidebar(None if presenter() else "A guided tour")
if not sel.ok:
    st.stop()

picker, back, forward, about = st.columns([7, 2, 2, 5], vertical_alignment="center")
with about.expander("What the tour shows · glossary"):
    st.markdown(
        "Eight steps through what attention weights hide, on the sidebar's model and prompt: change them, press "
        "Analyze, and every step follows."
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
forward.button(
    "Next →", on_click=move, args=(1,), disabled=step == COUNT, key="tour_next", type="primary", width="stretch"
)
plan = sink_services.tour_plan(sel.request)
layer, head, neg, anti = plan.layer.layer, plan.head, plan.negative, plan.anti
query = neg.query if neg is not None else None
# the head of steps 3 and 4: the sink head, unless nothing there is negative
neg_head = neg.head if neg is not None else head


def quote(token: str) -> str:
    """A token as the sentences show it: its repr, escaped for Markdown."""
    return escape_markdown(repr(token))


SHORT = "type a prompt of two tokens or more in the sidebar and press Analyze."
#: Steps whose chart is too wide for the column beside the text: it goes below the text instead.
WIDE = (4, 6)
#: The text's and the chart's shares of the width where they differ from 1 : 2: step 3's map, whose ringed cell must
#: stand beside its sentence on a 1,280 x 720 projector's first screen, takes the cells of 16 px it needs.
COLUMNS = {3: [5, 7]}


def scale_aside(neg: tour.NegativeKey) -> tuple | None:
    """Step 3's absolute scale, drawn under the sentence where the head's picture and step 2's seem to disagree
    (:attr:`~cwviz.analyses.tour.HeadScale.sink_dominates`): the head's output and the layer's as bars of their length,
    each with the first token's part (:func:`cwviz.charts.sinks.scale_bars`); None elsewhere."""
    scale = neg.scale
    if scale is None or not scale.sink_dominates:
        return None
    table = tour_story.scale_table(scale, layer, neg.head)
    return sink_charts.scale_bars(table, f"Lengths for query {sel.token_label(neg.query, markdown=False)}"), table


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
    ``draw``: the widget that shows it (:func:`cwviz.app.widgets.chart`; ``head_grid`` and ``query_map`` make a
    click select the head or the query in the sidebar, as those charts' titles say). ``aside``: a small chart and its
    rows drawn under the sentences (:func:`scale_aside`)."""
    wide = step in WIDE or chart is None
    left, right = (st.container(), st.container()) if wide else st.columns(COLUMNS.get(step, [1, 2]), gap="medium")
    with left:
        st.subheader(f"{step}. {STEPS[step - 1][1]}")
        (st.markdown if chart is not None else st.info)(text)
        if link is not None:
            st.link_button(f"Open in {page} ↗", link, help="The full page on this view, in a new tab.")
        if aside is not None:
            widgets.chart(*aside, f"cwviz-tour-step{step}-scale", key=f"tour_scale_{step}")
    if chart is not None:
        with right:
            draw(chart, data, f"cwviz-tour-step{step}", key=f"tour_chart_{step}")


if step == 1:
    sync(layer, head, query)
    summary = services.head_summary(sel.request)
    show(
        tour_story.step1(plan).text,
        page_url("heatmaps", sel.request, layer, head, query, colour="sink_attention"),
        "Heatmaps",
        head_grid.head_overview(summary, "sink_attention", layer, head),
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
    show(tour_story.step2(plan).text, link, "Sinks", sink_charts.share_chart(tables.layers, layer), tables.layers)
elif step == 3:
    sync(layer, neg_head, query)
    link = page_url("heatmaps", sel.request, layer, neg_head, query, measure="contribution", kind="intra", range="full")
    if neg is None:
        show(f"A key can write against the output only when the query sees two keys or more: {SHORT}", link, "Heatmaps")
        st.stop()
    cells = services.heatmap_cells(sel.request, layer, neg_head, "contribution_intra", tour.KIND, neg.query, "window")
    show(
        tour_story.step3(plan, sel.token_label).text,
        link,
        "Heatmaps",
        cells,
        cells.frame,
        # The contribution map alone, beside the sentence (step 1 showed attention): its colour range is the largest
        # value's, so the first token's +1 is drawn darker than a +0.01 cell; a click selects the query as there.
        lambda cells, _data, name, key: widgets.query_map(
            cells, "measure", neg.query, name, key, colour_range="full", key_mark=neg.key
        ),
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
        tour_story.step4(plan, sel.token_label).text,
        link,
        "Token",
        token_charts.factor_bars(factors, mark=neg.key),
        factors.wide,
    )
elif step == 5:
    target = (anti.layer, anti.head) if anti is not None else (layer, head)
    sync(*target, None)
    link = page_url("sinks", sel.request, *target, sel.query, sink="first")
    if anti is None:
        show(f"No query sees a key besides the sink, so its value has nothing to point against: {SHORT}", link, "Sinks")
        st.stop()
    tables = sink_services.sink_tables(sel.request, sink_services.TOUR_SINK)
    show(
        tour_story.step5(plan).text, link, "Sinks", sink_charts.anti_alignment_map(tables.heads, *target), tables.heads
    )
elif step == 6:
    target = (anti.layer, anti.head) if anti is not None else (layer, head)
    sync(*target, None)
    link = page_url("sinks", sel.request, *target, sel.query, sink="first", **{"lambda": "0", "scope": "all"})
    if neg is None:
        show(f"With one token, removing the first token's value leaves nothing to compare: {SHORT}", link, "Sinks")
        st.stop()
    result = sink_services.intervention(sel.request, plan.sink, 0.0, None)
    removal = tour.Removal.of(sel.analysis.info.id, plan.causal, result)
    show(tour_story.step6(removal).text, link, "Sinks", sink_charts.intervention_chart(result.table), result.table)
elif step == 7:
    encoder = sink_services.tour_encoder(sel.request)
    if encoder.error is not None or encoder.layer is None:
        why = encoder.error or "no query sees a key besides the first token: type a longer prompt"
        show(f"This step analyses the prompt with an encoder, which could not be done here: {why}", None, "Sinks")
        st.stop()
    if encoder.own_model:
        sync(encoder.layer.layer, None, None)
    shown = tour.Encoder(encoder.request.model, encoder.own_model, encoder.tables.sink_token, encoder.layer)
    show(
        tour_story.step7(shown, quote).text,
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
    keep = [story.support[0], plan.sink] + ([] if story.against is None else [story.against[0]])
    value = "share" if result.encoder else "total"  # an encoder's totals are shares of its representation (sum to 1)
    tokens = result.tokens[["position", "token", "total"]].rename(columns={"total": value})
    rows = flow_charts.total_rows(tokens, value, keep=keep)
    show(
        tour_story.step8(plan, story, sel.analysis.num_layers, sel.token_label, quote).text,
        link,
        "Flow",
        flow_charts.totals_bars(
            rows, f"Each input token's {value}", "red adds, blue subtracts", value, label_px=widgets.label_px()
        ),
        tokens,
    )
