"""Faithfulness by causal intervention: mask what each measure ranks first (or last), watch ΔPPL.

Run hands the examples to the one runner (:func:`cwviz.app.run_services.run_faithfulness`), which keeps each
finished example's record (the record the CLI's ``--results`` folder holds): Stop (or any widget) interrupts the
run and keeps what is finished, and Run with the same settings resumes it. The page remembers only what it last
ran, and shows that run's records; the summary is recomputed from them, as the CLI's is.
"""

import json
import tempfile
from pathlib import Path

import streamlit as st

from cwviz import CwvizError
from cwviz.analyses import examples, faithfulness, faithfulness_summary
from cwviz.analyses.codecs.sweeps import FAITHFULNESS
from cwviz.analyses.schema import area_span
from cwviz.app import hosting, run_services, services, widgets
from cwviz.app.sidebar import sidebar
from cwviz.app.state import parse_bool, url_widget
from cwviz.charts import faithfulness as charts
from cwviz.charts.export import to_csv
from cwviz.core import defaults

#: What the page last ran (:class:`cwviz.app.run_services.Asked`); its records are the runner's.
ASKED = "_faithfulness_asked"
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
st.markdown(
    "Remove the keys a measure ranks first (or last) and see how much worse the model predicts: the faithful "
    "measure hurts most."
)
with st.expander("How to read this page"):
    st.markdown(
        "Each measure ranks the keys of every query. **Comprehensiveness** removes the top share of each "
        "query's keys, **sufficiency** the bottom share, and the change in perplexity "
        "ΔPPL = PPL(masked) − PPL(clean) says how much the model needed them: a faithful measure gives a large "
        "ΔPPL when its top keys go and a small one when its bottom keys go. Removing key *j* for query *i* "
        "takes its write α·ṽ out of the layer output in every head (attention is not renormalised). Default "
        "protocol: layer-level scores from the clean pass, masks in every layer at once, no query loses every key "
        "(query 0, which sees only the first token, is never masked); `random` is the control (3 random rankings "
        "an example, averaged)."
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
            return examples.read_examples(local, n=n, field=field)
    if source == "path":
        if not path.strip():
            raise CwvizError("type the path of a .txt or .jsonl file on this machine")
        policy.check_server_file(path)
        return examples.read_examples(path.strip(), n=n, field=field)
    return examples.dataset_texts(dataset.strip(), split=split, n=n, field=field)


def asked() -> run_services.Asked:
    """What Run runs: the examples and the protocol the widgets name (CwvizError with the fix when they cannot be
    read)."""
    value = st.session_state.get
    layer = value("mask_layer", "all")
    texts = read_texts(
        value("source", "prompt"),
        int(value("n", 5)),
        value("field") or None,
        value("faith_upload"),
        value("path", ""),
        value("dataset", ""),
        value("split", "test"),
    )
    protocol = faithfulness.Protocol(
        rates=tuple(value("rates", defaults.DEFAULT_RATES)),
        measures=tuple(value("measures", defaults.RANKED_MEASURES)),
        layer=None if layer == "all" else int(layer),
        per_head=bool(value("per_head", False)),
        rank_by=value("rank_by", "signed"),
        rank_scope=value("rank_scope", faithfulness.RANK_SCOPES[0]),
        seed=int(value("seed", 0)),
        max_tokens=int(value("cap", defaults.EXAMPLE_MAX_TOKENS)),
    )
    return run_services.Asked((sel.model, sel.device, sel.dtype), tuple(texts), protocol)


def _mask_layer(raw: str):
    return raw if raw == "all" else int(raw)


# Every picker is in the link (url_widget), so a link reproduces the protocol; an upload must be chosen again.
with st.expander("Data and protocol", expanded=True):
    left, right = st.columns(2)
    with left:
        source = url_widget(
            st.radio, "source", "Examples from", "prompt", options=list(SOURCES), format_func=SOURCES.get
        )
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
            min(defaults.EXAMPLE_MAX_TOKENS, MAX_CAP),
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
            list(defaults.DEFAULT_RATES),
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
            faithfulness.RANK_BY[0],
            options=list(faithfulness.RANK_BY),
            horizontal=True,
            help="signed: negative contributions rank lowest; absolute: by magnitude",
        )
        url_widget(
            st.radio,
            "rank_scope",
            "Rank scope",
            faithfulness.RANK_SCOPES[0],
            options=list(faithfulness.RANK_SCOPES),
            horizontal=True,
            help="query: each query's keys ranked and masked per query; token: keys ranked by their mean score over "
            "the queries that see them, each masked for every query; layer: all (query, key) pairs of a layer ranked "
            "together. Under the query scope value-weighted and its output-normalised form rank alike (docs/METHOD.md "
            "section 3)",
        )
        url_widget(
            st.number_input,
            "seed",
            "Seed (random control, bootstrap)",
            0,
            parse=int,
            valid=lambda v: v >= 0,
            min_value=0,
        )
    # The whole width: in a column, a multiselect (and pills) cut the long measure names off at the edge.
    url_widget(
        st.pills,
        "measures",
        "Measures (the names of the results table and CSV)",
        list(defaults.RANKED_MEASURES),
        options=list(faithfulness.ALL_MEASURES),
        selection_mode="multi",
    )

if st.button("Run", type="primary", key="faith_run"):  # True in the click's rerun, which has the widgets' values
    st.session_state.pop(ASKED, None)
    try:
        st.session_state[ASKED] = asked()
        stop = st.empty()  # a click reruns the page, which interrupts the run: the finished examples are kept
        stop.button("Stop", key="faith_stop", help="Stops the run; the finished examples are kept, and Run resumes it.")
        run_services.run_faithfulness(st.session_state[ASKED])
        stop.empty()
    except CwvizError as err:
        st.error(str(err))
run = st.session_state.get(ASKED)
try:
    records = run_services.finished(run_services.faithfulness_plan(run)) if run else []
except CwvizError as err:  # the model no longer loads
    st.error(str(err))
    st.stop()
finished = [r for r in records if not r["skipped"]]
if finished:
    protocol = run.protocol
    summary = FAITHFULNESS.summary(records, seed=protocol.seed)
    total = len(run.texts)
    st.caption(
        f"{len(finished)} of {total} examples"
        + ("" if len(records) >= total else " (stopped early: Run resumes)")
        + "; bands: 95 % bootstrap intervals of the mean ΔPPL."
    )
    if {"value_weighted", "value_weighted_output_normalized"} <= set(
        protocol.measures
    ) and protocol.rank_scope == "query":
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
    for curve in faithfulness.CURVES:
        widgets.chart(
            charts.curve_chart(summary, curve, scale),
            summary[summary.curve == curve],
            f"cwviz-{curve}",
            key=f"faith_{curve}",
        )
    span = area_span(summary)
    table = summary.pivot(index="measure", columns=["curve", "rate"], values="delta_ppl")
    table.columns = [f"{curve[:4]}. {rate:g}%" for curve, rate in table.columns]
    if span:
        st.markdown(
            f"**Mean ΔPPL per rate**, and the area under each curve (trapezoids over the rate as a fraction, from "
            f"{span[0]:g} to {span[1]:g})"
        )
        areas = faithfulness_summary.curve_areas(summary).pivot(index="measure", columns="curve", values="area")
        table = areas.add_prefix("area ").join(table)  # the areas first: the table's right part scrolls out of view
    else:  # one rate spans nothing: an area of 0 would read as a result
        st.markdown("**Mean ΔPPL per rate** (no area under the curves: that needs two rates or more)")
    st.dataframe(
        table.loc[[m for m in faithfulness.ALL_MEASURES if m in table.index]],
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
        data="".join(json.dumps(record) + "\n" for record in records),
        file_name="cwviz-faithfulness-records.jsonl",
        mime="application/jsonl",
        key="faith_records",
        help="One line per example, as `cwviz faithfulness --results DIR` writes them (records-00000.jsonl there).",
    )
