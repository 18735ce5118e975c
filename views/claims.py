"""Claims: does the paper hold on this model? One row per claim with the paper's statement, what the model shows
(estimates with 95 % bootstrap intervals over items) and a verdict (docs/METHOD.md section 5)."""

from pathlib import Path

import streamlit as st

from cwviz import CwvizError
from cwviz.analyses import claim_runs, claims, records
from cwviz.analyses.codecs.checks import CLAIMS
from cwviz.app import hosting, run_services
from cwviz.app.sidebar import sidebar
from cwviz.app.state import url_widget
from cwviz.charts import claims as charts_claims
from cwviz.core.defaults import CLAIMS_MAX_TOKENS, CONFIDENCE, RESAMPLES, SINK_ACTIVE

#: Items a run on this page may take (the CLI takes any number, resumably).
MAX_ITEMS = 10
#: What the page last ran (:class:`cwviz.app.run_services.Asked`); its records are the runner's.
ASKED = "_claims_asked"

sel = sidebar("Claims of the paper")
st.markdown(
    "Does the paper hold on this model? Each of its five claims gets a verdict from GSM8K items: **holds**, **fails** "
    "or **unresolved** (and, for claim 1's rows that cannot hold, **ties by construction**)."
)
with st.expander("How the claims are tested"):
    st.markdown(
        "Claim 1 by the faithfulness curves under each rank scope (query, token, layer) on the log-perplexity ratio, "
        "with random rankings as the control; under the query scope VW and VW/‖o‖ rank every query's keys alike, so "
        "those rows **tie by construction**: they cannot hold and are counted apart. Claim 2 by the sink against the "
        f"other keys; claim 3 on the sink-active heads (mean sink ratio ≥ {SINK_ACTIVE:g}); claim 4 by where the "
        "sink-active heads operate: their median sink ratio against the minimiser of a quadratic fit of their output "
        "norms (the U shape itself is nearly algebraic, so it is evidence); claim 5 as three verdicts with the sink's "
        "value removed: (a) the low-norm outputs' spread narrows, (b) they turn toward the semantic tokens' centroid, "
        "(c) perplexity rises more than when one other key of about the sink's attention mass loses its value (the "
        "control). A verdict is **holds** when the 95 % bootstrap interval over the items lies wholly on the paper's "
        "side of its line, **fails** when it lies wholly on the other, **unresolved** when it does not decide "
        "(protocol: docs/METHOD.md section 5). For many items run `cwviz claims --results DIR` (it resumes) and open "
        "its folder here."
    )
files = hosting.policy_from_env().server_files  # off in hosting mode: the server's files are not the users'
sources = (
    {"run": "run here (GSM8K sample)", "saved": "a results folder of cwviz claims"}
    if files
    else {"run": "run here (GSM8K sample)"}
)
source = url_widget(
    st.radio, "claims_source", "Claims from", "run", options=list(sources), format_func=sources.get, horizontal=True
)


def run_here() -> list[dict] | None:
    """The records of the first n GSM8K sample items on the sidebar's model, made as ``cwviz claims`` makes them
    (through the one runner: Stop keeps the finished items, Run with the same settings resumes)."""
    left, right = st.columns(2)
    with left:
        n = url_widget(
            st.number_input,
            "claims_n",
            "Items",
            claims.MIN_ITEMS,
            parse=int,
            valid=lambda v: 1 <= v <= MAX_ITEMS,
            min_value=1,
            max_value=MAX_ITEMS,
        )
    with right:
        cap = url_widget(
            st.number_input,
            "claims_cap",
            "Tokens per item (at most)",
            CLAIMS_MAX_TOKENS,
            parse=int,
            valid=lambda v: 3 <= v <= 512,
            min_value=3,
            max_value=512,
        )
    protocol = claim_runs.protocol(max_tokens=int(cap))
    asked = run_services.Asked((sel.model, sel.device, sel.dtype), tuple(claim_runs.gsm8k_items(int(n))), protocol)
    if st.button("Run", type="primary", key="claims_run"):  # True in the click's rerun, which has the widgets' values
        st.session_state[ASKED] = asked
        stop = st.empty()  # a click reruns the page, which interrupts the run: the finished items are kept
        stop.button("Stop", key="claims_stop", help="Stops the run; the finished items are kept, and Run resumes it.")
        run_services.run_claims(asked)
        stop.empty()
    if st.session_state.get(ASKED) != asked:
        st.caption(
            f"Run checks the claims on the first {int(n)} GSM8K items on {sel.model}: several forward passes an item, "
            "minutes each on a CPU. Its bar says which item runs and, from the items timed, how long is left; Stop "
            "keeps the finished items, and Run resumes."
        )
        return None
    made = run_services.finished(run_services.claims_plan(asked))
    if len(made) < len(asked.texts):
        st.caption(f"Stopped after {len(made)} of {len(asked.texts)} items: Run resumes.")
    return made or None


def saved() -> list[dict] | None:
    folder = url_widget(
        st.text_input,
        "claims_dir",
        "Results folder (the --results DIR of cwviz claims)",
        "",
        placeholder="/path/to/DIR",
    )
    if not folder.strip():
        st.info("Give the folder that `cwviz claims --results DIR` wrote.")
        return None
    return records.read_records(Path(folder.strip()).expanduser() / claims.RECORDS_FOLDER, CLAIMS)


if source == "run" and not sel.ok:
    st.stop()
try:
    made = saved() if source == "saved" else run_here()
except CwvizError as err:
    st.error(str(err))
    st.stop()
if made is None:
    st.stop()
finished = [r for r in made if not r.get("skipped")]
if not finished:
    st.error("no item had three or more tokens; nothing to judge")
    st.stop()
table = claims.claims_table(made)
st.caption(
    f"{len(finished)} item(s); {CONFIDENCE * 100:.0f} % percentile bootstrap intervals over the items "
    f"({RESAMPLES:,} resamples, paired within an item)."
)
rows = claims.verdict_rows(table)
st.subheader("Every verdict: estimate and 95 % interval against its line")
st.altair_chart(charts_claims.forest(rows), width="content")
st.caption(
    "Magenta circle: holds (the interval lies wholly on the paper's side of the dark tick); black cross: fails (wholly "
    "on the other side); grey diamond: unresolved; light grey square, in a panel of its own: ties by construction "
    "(cannot hold, not counted). Each claim has its own scale: its statistic's unit differs."
)
st.caption(
    f"Judged on {len(finished)} item(s). Verdicts on few items may differ from the 50-item runs in docs/claims.md; "
    f"with fewer than {claims.MIN_ITEMS} items every verdict is unresolved by rule."
)
st.dataframe(
    rows[["label", "verdict", "statistic", "estimate", "ci_low", "ci_high", "line", "n", "evidence"]].set_index(
        "label"
    ),
    width="stretch",
)
st.subheader("One row per claim")
st.dataframe(claims.overview(table).set_index("claim"), width="stretch")
st.subheader("The random control: each measure's gap to random")
st.caption(
    "Log-perplexity ratio of the measure minus that of random rankings (comprehensiveness; the reverse for "
    "sufficiency): > 0 means the measure finds the keys the model needs better than chance."
)
control = table[(table.role == claims.CONTROL) & (table.claim == 1)]
st.dataframe(
    control[["scope", "curve", "rate", "part", "estimate", "ci_low", "ci_high", "verdict", "n", "evidence"]]
    .rename(columns={"part": "measure", "estimate": "gap"})
    .reset_index(drop=True),
    width="stretch",
)
st.subheader("Evidence, and claim 5's control beside (a) and (b)")
evidence = table[(table.role == claims.EVIDENCE) | ((table.role == claims.CONTROL) & (table.claim == 5))]
st.dataframe(
    evidence[["claim", "role", "statistic", "estimate", "ci_low", "ci_high", "line", "verdict", "n"]].set_index(
        "claim"
    ),
    width="stretch",
)
st.download_button(
    "claims.csv",
    table.to_csv(index=False, float_format="%.6g"),
    file_name="claims.csv",
    mime="text/csv",
    key="claims_csv",
)
