"""Faithfulness by causal intervention: mask what each measure ranks first (or last), watch ΔPPL.

A run goes example by example inside the script, through the sweep runner's records (the records the CLI's
``--results`` folder holds, :func:`cwviz.analyses.sweep.faithfulness_records`); every finished example's record is
kept in session state, so Stop (which reruns the page) keeps what was done, and so does any other widget change.
The summary is recomputed from the records, as the CLI's is.
"""

import json
import tempfile
from pathlib import Path

import streamlit as st

from cwviz import CwvizError
from cwviz.analyses import faithfulness as F
from cwviz.analyses import sweep
from cwviz.analyses.schema import area_span
from cwviz.app import hosting, services, widgets
from cwviz.app.sidebar import sidebar
from cwviz.app.state import parse_bool, url_widget
from cwviz.charts import faithfulness as charts
from cwviz.charts.export import to_csv

STATE = "_faithfulness_run"
SOURCES = {
    "prompt": "the sidebar prompt",
    "upload": "an uploaded file (.txt or .jsonl)",
    "path": "a file on this machine",
    "dataset": "a Hugging Face dataset (online)",
}
RATE_CHOICES = [1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 75.0, 100.0]

policy = hosting.policy_from_env()
if not policy.server_files:  # hosting mode: the server's files are not the users'
    SOURCES.pop("path")
MAX_CAP = services.app_max_tokens()

sel = sidebar("Faithfulness by causal intervention")
st.markdown("Remove the keys a measure ranks first (or last) and see how much worse the model predicts: the faithful measure hurts most.")
with st.expander("How to read this page"):
    st.markdown(
        "Each measure ranks the keys of every query. **Comprehensiveness** removes the top share of each "
        "query's keys, **sufficiency** the bottom share, and the change in perplexity "
        "ΔPPL = PPL(masked) − PPL(clean) says how much the model needed them: a faithful measure gives a large "
        "ΔPPL when its top keys go and a small one when its bottom keys go. Removing key *j* for query *i* "
        "takes its write α·ṽ out of the layer output in every head (attention is not renormalised). Default "
        "protocol: layer-level scores from the clean pass, masks in every layer at once, at least one key per "
        "query; `random` is the control."
    )
if sel.ok and not sel.analysis.info.causal:
    info = sel.analysis.info
    st.info(
        f"Faithfulness needs a causal language model: it measures how well the model predicts each next token "
        f"(perplexity), and {info.id} is an encoder ({info.architecture}), which predicts none. Pick a causal model in "
        "the sidebar, such as 'embedded'."
    )
    st.stop()


def read_texts(source: str, n: int, field: str | None, upload, path: str, dataset: str, split: str) -> list[str]:
    """The examples the user chose (raises CwvizError with a message naming the fix)."""
    if source == "prompt":
        if not sel.text.strip():
            raise CwvizError("the sidebar prompt is empty; type some text there")
        return [sel.text]
    if source == "upload":
        if upload is None:
            raise CwvizError("upload a .txt file (one example per paragraph) or a .jsonl file first")
        with tempfile.TemporaryDirectory() as folder:
            local = Path(folder) / Path(upload.name).name
            local.write_bytes(upload.getvalue())
            return F.read_examples(local, n=n, field=field)
    if source == "path":
        if not path.strip():
            raise CwvizError("type the path of a .txt or .jsonl file on this machine")
        policy.check_server_file(path)
        return F.read_examples(path.strip(), n=n, field=field)
    return F.dataset_texts(dataset.strip(), split=split, n=n, field=field)


def start() -> None:
    """The Run button: read the examples and queue them; errors are shown instead of a run.

    Reads the widgets' values from session state (a callback sees the values of the click's rerun).
    """
    value = st.session_state.get
    layer = value("mask_layer", "all")
    try:
        texts = read_texts(
            value("source", "prompt"),
            int(value("n", 5)),
            value("field") or None,
            value("faith_upload"),
            value("path", ""),
            value("dataset", ""),
            value("split", "test"),
        )
        protocol = F.Protocol(
            rates=tuple(value("rates", F.DEFAULT_RATES)),
            measures=tuple(value("measures", F.RANKED_MEASURES)),
            layer=None if layer == "all" else int(layer),
            per_head=bool(value("per_head", False)),
            rank_by=value("rank_by", "signed"),
            rank_scope=value("rank_scope", F.RANK_SCOPES[0]),
            seed=int(value("seed", 0)),
            max_tokens=int(value("cap", F.EXAMPLE_MAX_TOKENS)),
        )
    except CwvizError as err:
        st.session_state[STATE] = {"error": str(err), "records": [], "texts": [], "running": False}
        return
    st.session_state[STATE] = {
        "error": None,
        "texts": texts,
        "protocol": protocol,
        "records": [],
        "next": 0,
        "running": True,
        "model": (sel.model, sel.device, sel.dtype),
    }


def stop() -> None:
    st.session_state[STATE]["running"] = False


def _mask_layer(raw: str):
    return raw if raw == "all" else int(raw)


# Every picker is in the link (url_widget), so a link reproduces the protocol; an upload must be chosen again.
with st.expander("Data and protocol", expanded=True):
    left, right = st.columns(2)
    with left:
        source = url_widget(st.radio, "source", "Examples from", "prompt", options=list(SOURCES), format_func=SOURCES.get)
        if source == "upload":
            st.file_uploader("File", type=["txt", "jsonl", "json"], key="faith_upload")
        elif source == "path":
            url_widget(st.text_input, "path", "Path", "", placeholder="/path/to/test.jsonl")
        elif source == "dataset":
            url_widget(st.text_input, "dataset", "Dataset NAME or NAME:CONFIG", "openai/gsm8k:main")
            url_widget(st.text_input, "split", "Split", "test")
            st.caption("Needs the `datasets` package and network access; offline, use a local file.")
        if source == "prompt":
            st.caption("One example: the sidebar prompt.")
        else:
            url_widget(st.text_input, "field", "JSONL field (blank: text, or GSM8K question + answer)", "")
            url_widget(
                st.number_input,
                "n",
                "Examples (N)",
                5,
                parse=int,
                valid=lambda v: 1 <= v <= 10_000,
                min_value=1,
                max_value=10_000,
            )
        url_widget(
            st.number_input,
            "cap",
            "Token cap per example",
            min(F.EXAMPLE_MAX_TOKENS, MAX_CAP),
            parse=int,
            valid=lambda v: 2 <= v <= MAX_CAP,
            min_value=2,
            max_value=MAX_CAP,
            help="Longer examples are cut to this many tokens.",
        )
    with right:
        url_widget(
            st.multiselect,
            "rates",
            "Removal rates (% of each query's keys)",
            list(F.DEFAULT_RATES),
            parse=float,
            options=RATE_CHOICES,
            format_func=lambda r: f"{r:g} %",
        )
        url_widget(
            st.selectbox,
            "mask_layer",
            "Mask in",
            "all",
            parse=_mask_layer,
            options=["all", *range(sel.analysis.num_layers if sel.ok else 0)],
            format_func=lambda v: "every layer at once" if v == "all" else f"layer {v} only",
        )
        url_widget(
            st.checkbox,
            "per_head",
            "Rank per head (default: layer-level scores)",
            False,
            parse=parse_bool,
        )
        url_widget(
            st.radio,
            "rank_by",
            "Rank by",
            F.RANK_BY[0],
            options=list(F.RANK_BY),
            horizontal=True,
            help="signed: negative contributions rank lowest; absolute: by magnitude",
        )
        url_widget(
            st.radio,
            "rank_scope",
            "Rank scope",
            F.RANK_SCOPES[0],
            options=list(F.RANK_SCOPES),
            horizontal=True,
            help="query: each query's keys ranked and masked per query; token: keys ranked by their mean score over the "
            "queries that see them, each masked for every query; layer: all (query, key) pairs of a layer ranked together. "
            "Under the query scope value-weighted and its output-normalised form rank alike (docs/METHOD.md section 3)",
        )
        url_widget(st.number_input, "seed", "Seed (random control, bootstrap)", 0, parse=int, valid=lambda v: v >= 0, min_value=0)
    # The whole width: in a column, a multiselect (and pills) cut the long measure names off at the edge.
    url_widget(
        st.pills,
        "measures",
        "Measures (the names of the results table and CSV)",
        list(F.RANKED_MEASURES),
        options=list(F.ALL_MEASURES),
        selection_mode="multi",
    )

run = st.session_state.get(STATE)
running = bool(run and run["running"])
st.button("Run", type="primary", on_click=start, key="faith_run", disabled=running)

if run and run["error"]:
    st.error(run["error"])
if run and run["running"]:
    st.button("Stop", on_click=stop, key="faith_stop", help="Stops after the example in progress; finished examples are kept.")
    try:
        bundle = services.get_bundle(*run["model"])
    except CwvizError as err:
        run.update(running=False, error=str(err))
        st.error(str(err))
        st.stop()
    total = len(run["texts"])
    progress = st.progress(run["next"] / total, text=f"{run['next']} of {total} examples")

    def passes(done: int, of: int) -> None:
        """The example in progress: its clean pass, then each batch of masked runs."""
        progress.progress(
            min(1.0, (run["next"] + done / of) / total),
            text=f"{run['next']} of {total} examples; example {run['next'] + 1}: {done} of {of} forward passes",
        )

    try:
        records = sweep.faithfulness_records(
            bundle,
            run["texts"],
            run["protocol"],
            start=run["next"],
            guard=lambda: hosting.analysis_slot(policy),  # a shared server runs at most CWVIZ_MAX_CONCURRENT at once
            progress=passes,
        )
        for record in records:
            run["records"].append(record)
            run["next"] = record["example"] + 1
            progress.progress(run["next"] / total, text=f"{run['next']} of {total} examples")
    except CwvizError as err:
        run.update(running=False, error=str(err))
        st.error(str(err))
    run["running"] = False
    st.rerun()

finished = [r for r in run["records"] if not r["skipped"]] if run else []
if finished:
    summary = sweep.faithfulness_summary(run["records"], seed=run["protocol"].seed)
    done, total = len(finished), len(run["texts"])
    st.caption(
        f"{done} of {total} examples"
        + ("" if run["next"] >= total else " (stopped early)")
        + "; bands: 95 % bootstrap intervals of the mean ΔPPL."
    )
    protocol = run["protocol"]
    if {"value_weighted", "value_weighted_output_normalized"} <= set(protocol.measures) and protocol.rank_scope == "query":
        st.caption(
            "Value-weighted attention and its inter-head output-normalised form rank every query's keys alike (the "
            "same ‖o_i‖ divides each key's score), so their curves coincide: one line hides the other. The intra-head "
            "form (divided by each head's ‖o_i^h‖) ranks differently."
        )
    scale = url_widget(
        st.radio,
        "scale",
        "ΔPPL axis",
        charts.SCALES[0],
        options=list(charts.SCALES),
        horizontal=True,
        format_func=lambda s: "linear" if s == "linear" else "symmetric log (keeps 0 and negatives)",
    )
    for curve in F.CURVES:
        widgets.chart(charts.curve_chart(summary, curve, scale), summary[summary.curve == curve], f"cwviz-{curve}", key=f"faith_{curve}")
    span = area_span(summary)
    table = summary.pivot(index="measure", columns=["curve", "rate"], values="delta_ppl")
    table.columns = [f"{curve[:4]}. {rate:g}%" for curve, rate in table.columns]
    if span:
        st.markdown(
            f"**Mean ΔPPL per rate**, and the area under each curve (trapezoids over the rate as a fraction, from "
            f"{span[0]:g} to {span[1]:g})"
        )
        areas = F.curve_areas(summary).pivot(index="measure", columns="curve", values="area")
        table = areas.add_prefix("area ").join(table)  # the areas first: the table's right part scrolls out of view
    else:  # one rate spans nothing: an area of 0 would read as a result
        st.markdown("**Mean ΔPPL per rate** (no area under the curves: that needs two rates or more)")
    st.dataframe(
        table.loc[[m for m in F.ALL_MEASURES if m in table.index]],
        column_config={"_index": st.column_config.TextColumn("measure", width="large")}  # the longest name whole
        | {c: st.column_config.NumberColumn(format="%.4g") for c in table.columns},
    )
    st.download_button(
        "Results CSV",
        data=to_csv(summary),
        file_name="cwviz-faithfulness.csv",
        mime="text/csv",
        key="faith_csv",
    )
    st.download_button(
        "Records (JSON Lines)",
        data="".join(json.dumps(record) + "\n" for record in run["records"]),
        file_name="cwviz-faithfulness-records.jsonl",
        mime="application/jsonl",
        key="faith_records",
        help="One line per example, as `cwviz faithfulness --results DIR` writes them (records-00000.jsonl there).",
    )
