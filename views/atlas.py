"""Atlas: every head's behaviour pooled over many prompts, with bootstrap intervals."""

import streamlit as st

from cwviz import CwvizError
from cwviz.analyses import schema
from cwviz.app import atlas_services as services
from cwviz.app import hosting, widgets
from cwviz.app.sidebar import sidebar
from cwviz.app.state import url_widget
from cwviz.charts import atlas as charts
from cwviz.core.defaults import ATLAS_CONFIDENCE

sel = sidebar("Atlas of heads")
st.markdown("Every head's sink and suppression statistics over many prompts, to find the heads worth a closer look.")
with st.expander("How to read this page"):
    st.markdown(
        "Each head's statistics on many prompts (one forward pass each, on the sidebar's model), each prompt's "
        "value a mean over its queries 1..T-1, then the mean over prompts with a 95% bootstrap interval over "
        "prompts (in the tooltips): the sink's (first token's) share under attention and under contribution, "
        "cos(ṽ_sink, m) (below zero: the sink cancels what the other tokens write), the divergence of attention and "
        "contribution rows, the share of negative contribution mass and the head output norm. Pick a head (a click "
        "on the map, or the sidebar) to list the prompts where it shows the statistic most strongly."
    )
if not sel.ok:
    st.stop()

files = hosting.policy_from_env().server_files  # off in hosting mode
sources = services.SOURCES if files else {"gsm8k": services.SOURCES["gsm8k"]}
left, middle, right = st.columns([2, 3, 1])
with left:
    source = url_widget(
        st.radio, "atlas_source", "Prompts from", "gsm8k", options=list(sources), format_func=sources.get
    )
path = out = folder = ""
with middle:
    if source == "path":
        path = url_widget(st.text_input, "atlas_path", "JSONL file", "", placeholder="/path/to/test.jsonl")
    if source == "saved":
        folder = url_widget(st.text_input, "atlas_dir", "Results folder", "", placeholder="/path/to/atlas")
    elif files:
        out = url_widget(st.text_input, "atlas_out", "Save results in (optional)", "", placeholder="/path/to/atlas")
with right:
    n = url_widget(
        st.number_input,
        "atlas_n",
        "Number of prompts",
        8,
        parse=int,
        valid=lambda v: 1 <= v <= services.MAX_PROMPTS,
        min_value=1,
        max_value=services.MAX_PROMPTS,
        step=1,
        disabled=source == "saved",
    )

try:
    if source == "saved":
        if not folder.strip():
            st.info("Give the folder that `cwviz atlas --out` (or this page) wrote.")
            st.stop()
        result = services.load_atlas(folder.strip(), services.stamp(folder))
    else:
        asked = (sel.model, sel.device, sel.dtype, source, path, int(n), out)
        st.button("Run", type="primary", key="atlas_run", on_click=lambda: st.session_state.update(_atlas_ran=asked))
        if st.session_state.get("_atlas_ran") != asked:
            st.caption(
                f"Run pools the first {int(n)} prompts on {sel.model} (one forward pass each), then shows every head's "
                "statistics; Stop keeps the prompts finished, and Run resumes."
            )
            st.stop()
        # while the run goes: a click reruns the page, which interrupts the run (finished prompts kept)
        stop = st.empty()
        stop.button("Stop", key="atlas_stop", on_click=lambda: st.session_state.pop("_atlas_ran", None))
        result = services.run_atlas(*asked)
        stop.empty()
except CwvizError as err:
    st.error(str(err))
    st.stop()

manifest = result.manifest
st.caption(
    f"{len(result.prompts)} prompt(s) on {manifest.get('model')}; {manifest.get('bootstrap')} bootstrap resamples "
    f"({manifest.get('confidence', ATLAS_CONFIDENCE):.0%} intervals, seed {manifest.get('seed')})."
)
metric = url_widget(
    st.radio,
    "atlas_metric",
    "Colour by",
    "cos_sink_rest",
    options=list(schema.ATLAS_METRICS),
    format_func=schema.ATLAS_METRICS.get,
    horizontal=True,
)
widgets.head_grid(
    charts.atlas_map(result.pooled, metric, sel.layer, sel.head), result.pooled, "cwviz-atlas", key="atlas_map"
)
st.download_button(
    "Per-prompt statistics (CSV)",
    data=lambda: result.per_prompt.to_csv(index=False),
    file_name="cwviz-atlas-per-prompt.csv",
    key="atlas_csv",
    on_click="ignore",
)

if sel.head is None:
    st.info(
        "Pick a head (click the map, or the sidebar) to list the prompts where it shows this statistic most strongly."
    )
else:
    end = "lowest" if metric == "cos_sink_rest" else "highest"
    st.subheader(f"Layer {sel.layer}, head {sel.head}: the prompts with the {end} {schema.ATLAS_METRICS[metric]}")
    top = result.top_prompts(sel.layer, sel.head, metric)
    top["heatmaps"] = [services.heatmaps_link(sel.request, text, sel.layer, sel.head) for text in top["text"]]
    st.dataframe(
        top,
        hide_index=True,
        key="atlas_top",
        column_config={
            "value": st.column_config.NumberColumn(format="%+.4f"),
            "heatmaps": st.column_config.LinkColumn(
                "heatmaps", display_text="open heatmaps", help="this prompt's heatmaps, this head selected"
            ),
        },
    )
