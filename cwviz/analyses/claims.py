"""Does the paper hold on this model? The five claims of Cunningham and Muça Cirone (ICML 2026), each checked on a
sweep's items with a bootstrap interval over the items and a verdict (docs/METHOD.md section 5, where the criteria
are written down).

Each item (one text) gives one record (:func:`item_payload`, run through the sweep runner
:mod:`cwviz.analyses.sweep` by ``cwviz claims``): its faithfulness runs under each rank scope (the per-example table
of :func:`cwviz.analyses.faithfulness.run_example`, as a faithfulness record's payload) and a few numbers per item
from its sink table, head curves and sink intervention (:func:`sink_statistics`). :func:`claims_table` turns the
records into one row per claim (claim 1: per scope, curve and rate) with the estimate, its interval and the
verdict; it and everything below it are torch-free, so they are tested on constructed records.

Verdicts: ``holds`` when the 95 % interval lies wholly on the paper's side, ``fails`` when it lies wholly on the
other, ``unresolved`` when it straddles the line (or every item ties exactly).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pandas as pd

from .bootstrap import bootstrap_interval
from .records import CLAIMS

#: The record kind of ``cwviz claims`` (``cwviz.claims.record``), and the sub-folder of ``--results DIR`` that holds
#: its records and manifest (:data:`cwviz.analyses.records.CLAIMS`).
RECORDS_FOLDER = CLAIMS
#: The file ``cwviz claims --results DIR`` writes (atomically): :data:`CSV_COLUMNS`.
CSV_NAME = "claims.csv"
HOLDS, FAILS, UNRESOLVED = "holds", "fails", "unresolved"
#: The paper's statements, by claim number (docs/METHOD.md section 5).
STATEMENTS: dict[int, str] = {
    1: "Faithfulness rises raw attention < value-weighted < value-weighted output-normalised < contribution weights, "
    "for comprehensiveness and sufficiency alike",
    2: "The first token's (the sink's) contributions are driven by value geometry (norm ratio and cosine), not by attention",
    3: "Sink values are anti-aligned with the semantic tokens' (negative cosine)",
    4: "The output norm against the sink ratio is convex, its minimum at a sink ratio below 1",
    5: "Removing the sink's value collapses the heads' outputs into a semantic cone and raises perplexity",
}
#: Claim 1's measures in the paper's order (least to most faithful); each adjacent pair is tested.
ORDER: tuple[str, ...] = ("raw", "value_weighted", "value_weighted_output_normalized", "contribution_inter")
SHORT = {"raw": "raw", "value_weighted": "VW", "value_weighted_output_normalized": "VW/‖o‖", "contribution_inter": "CW"}
DEFAULT_RATES: tuple[float, ...] = (10.0, 30.0)
DEFAULT_MAX_TOKENS = 128
#: Claim 4: the share of heads whose curve has its minimum inside (0, 1) must be above this.
MAJORITY = 0.5
#: Columns of ``claims.csv`` (and of :func:`claims_table`).
CSV_COLUMNS = [
    "claim",
    "scope",
    "curve",
    "rate",
    "verdict",
    "statistic",
    "estimate",
    "ci_low",
    "ci_high",
    "n",
    "evidence",
    "statement",
]
#: The per-item numbers of :func:`sink_statistics`.
SINK_STATS = ("rho_geometry", "rho_attention", "cos_sink_rest", "interior_minimum_share", "median_minimiser", "cone_change", "delta_ppl")
LEVEL, RESAMPLES = 0.95, 2000
#: Fewer items than this decide nothing: a bootstrap over one or two items has (nearly) no spread, so its interval
#: would look decisive while it measures nothing. Such a row is unresolved, its evidence saying why.
MIN_ITEMS = 5


# -- one item (torch: imported when called) ----------------------------------------------------------------
def item_payload(bundle, text: str, protocol, scopes: Sequence[str], sink=0, example: int = 0) -> dict:
    """One item's claims record payload: ``{"skipped", "tokens", "faithfulness": {scope: faithfulness payload},
    "sinks": {name: float for SINK_STATS}}``. One clean pass is shared by every scope's masked runs, the sink table and
    the intervention (the sink's value removed in every layer, attention kept: one more pass)."""
    from ..core.method.analysis import analyze
    from . import faithfulness as F
    from . import records as R
    from . import sinks as S

    ids = F.example_ids(bundle, text, protocol.max_tokens)
    if ids is None or len(ids) < 3:  # the sink statistics need a query that sees the sink and another key
        return {"skipped": True, "tokens": 0 if ids is None else len(ids), "faithfulness": {}, "sinks": {}}
    analysis = analyze(bundle, input_ids=ids)
    faithful = {}
    for scope in scopes:
        table = F.run_example(bundle, ids, replace(protocol, rank_scope=scope), example=example, analysis=analysis)
        faithful[scope] = R.example_payload("text", table)
    table = S.sink_table(analysis, sink)
    heads = S.sink_head_summary(table)
    after = S.intervene_on_sink(analysis, sink, 0.0)
    stats = sink_statistics(table, heads, after.table, after.delta_ppl)
    return {"skipped": False, "tokens": len(ids), "faithfulness": faithful, "sinks": stats}


def gsm8k_items(n: int) -> list[str]:
    """The first ``n`` GSM8K items ``--gsm8k`` reads (the shipped sample, or ``$CWVIZ_GSM8K``): the page's run."""
    from ..core.util.texts import gsm8k_path, read_texts

    return read_texts(gsm8k_path(), n=n)


# -- per-item numbers (torch-free) ----------------------------------------------------------------------
def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation (average ranks for ties); NaN with fewer than 3 pairs or a constant side."""
    frame = pd.DataFrame({"a": a, "b": b}).dropna()
    if len(frame) < 3:
        return math.nan
    ra, rb = frame["a"].rank().to_numpy(), frame["b"].rank().to_numpy()
    if ra.std() == 0 or rb.std() == 0:
        return math.nan
    return float(np.corrcoef(ra, rb)[0, 1])


def sink_statistics(table: pd.DataFrame, heads: pd.DataFrame, intervention: pd.DataFrame, delta_ppl: float) -> dict:
    """The per-item numbers claims 2–5 are judged by (docs/METHOD.md section 5).

    ``table``: :func:`cwviz.analyses.sinks.sink_table`; ``heads``: :func:`~cwviz.analyses.sinks.sink_head_summary`
    (its ``minimising_ratio``: the minimiser of each head's typical curve); ``intervention``: the per-layer table of
    :func:`~cwviz.analyses.sinks.intervene_on_sink` with λ = 0 in every layer; ``delta_ppl``: its ΔPPL.

    * ``rho_geometry``, ``rho_attention``: over the rows (layer, head, query) whose query sees another key and puts
      attention on the sink, Spearman's correlation of the sink's contribution c = α × (‖ṽ_σ‖/‖o‖) × cos with its
      geometric factor c / α, and with its attention α;
    * ``cos_sink_rest``: the mean of cos(ṽ_σ, m) over those rows;
    * ``interior_minimum_share``, ``median_minimiser``: the share of heads whose curve's minimiser s* lies inside
      (0, 1), and the median s*;
    * ``cone_change``: the semantic cone's change (after − before), averaged over layers; ``delta_ppl``.
    """
    rows = table[(table["other_keys"] > 0) & (table["sink_ratio"] > 0)]
    c, alpha = rows["sink_contribution_share"].to_numpy(np.float64), rows["sink_ratio"].to_numpy(np.float64)
    minimiser = heads["minimising_ratio"].to_numpy(np.float64)
    minimiser = minimiser[np.isfinite(minimiser)]
    return {
        "rho_geometry": spearman(c, c / alpha),
        "rho_attention": spearman(c, alpha),
        "cos_sink_rest": float(rows["cos_sink_rest"].mean()) if len(rows) else math.nan,
        "interior_minimum_share": float(((minimiser > 0) & (minimiser < 1)).mean()) if len(minimiser) else math.nan,
        "median_minimiser": float(np.median(minimiser)) if len(minimiser) else math.nan,
        "cone_change": float(np.nanmean(intervention["cone_change"])) if intervention["cone_change"].notna().any() else math.nan,
        "delta_ppl": float(delta_ppl),
    }


# -- verdicts (torch-free) ------------------------------------------------------------------------------
def verdict(low: float, high: float, positive: bool = True) -> str:
    """``holds`` when the interval [low, high] lies wholly above 0 (below 0 with ``positive=False``), ``fails`` when
    wholly on the other side, ``unresolved`` otherwise (it contains 0, or is NaN)."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return UNRESOLVED
    if not positive:
        low, high = -high, -low
    return HOLDS if low > 0 else FAILS if high < 0 else UNRESOLVED


def mean_interval(values: np.ndarray, seed: int = 0) -> tuple[float, np.ndarray, np.ndarray, int]:
    """Mean over items (the first axis; NaN items left out), its percentile bootstrap interval (paired across the
    columns: one draw matrix, :func:`cwviz.analyses.bootstrap.bootstrap_interval`), and the number of items."""
    values = np.asarray(values, dtype=np.float64)
    keep = ~np.isnan(values.reshape(len(values), -1)).all(axis=1)
    values = values[keep]
    if not len(values):
        nan = np.full(values.shape[1:], np.nan)
        return nan, nan, nan, 0
    low, high = bootstrap_interval(values, RESAMPLES, LEVEL, seed, omit_nan=True)
    return np.nanmean(values, axis=0), low, high, len(values)


def _row(claim: int, verdict_: str, statistic: str, estimate, low, high, n: int, evidence: str, **keys) -> dict:
    row = {"claim": claim, "scope": "n/a", "curve": "", "rate": math.nan, "verdict": verdict_, "statistic": statistic}
    row |= {"estimate": float(estimate), "ci_low": float(low), "ci_high": float(high), "n": int(n), "evidence": evidence}
    return row | keys | {"statement": STATEMENTS[claim]}


def _interval(estimate: float, low: float, high: float, digits: int = 3) -> str:
    return f"{estimate:+.{digits}g} [{low:+.{digits}g}, {high:+.{digits}g}]"


def faithfulness_frame(records: Sequence[dict], scope: str) -> pd.DataFrame:
    """ΔPPL of each item under ``scope``: rows item, columns (curve, rate, measure)."""
    rows = [
        (record["example"], run["curve"], run["rate"], run["measure"], run["delta_ppl"])
        for record in records
        if not record.get("skipped")
        for run in record["faithfulness"].get(scope, {}).get("runs", [])
    ]
    frame = pd.DataFrame(rows, columns=["example", "curve", "rate", "measure", "delta_ppl"])
    return frame.pivot_table(index="example", columns=["curve", "rate", "measure"], values="delta_ppl", aggfunc="first")


def claim1_rows(records: Sequence[dict], seed: int = 0) -> list[dict]:
    """Claim 1 per scope, curve and rate: the paired difference of each adjacent pair of :data:`ORDER`, oriented so
    that > 0 is the paper's direction (comprehensiveness: later − earlier ΔPPL; sufficiency: earlier − later).
    ``holds`` when every pair's interval is above 0, ``fails`` when one pair's is below 0, ``unresolved`` otherwise;
    a pair that ties on every item (the same ranking, e.g. VW and VW/‖o‖ under the query scope) cannot hold."""
    scopes = list(dict.fromkeys(s for r in records if not r.get("skipped") for s in r["faithfulness"]))
    out = []
    for scope in scopes:
        frame = faithfulness_frame(records, scope)
        for curve, rate in dict.fromkeys((c, r) for c, r, _ in frame.columns):
            have = [m for m in ORDER if (curve, rate, m) in frame.columns]
            if len(have) < 2:
                continue
            values = frame[[(curve, rate, m) for m in have]].to_numpy(np.float64)  # (item, measure)
            sign = 1.0 if curve == "comprehensiveness" else -1.0
            diffs = sign * (values[:, 1:] - values[:, :-1])  # (item, pair): > 0 is the paper's direction
            mean, low, high, n = mean_interval(diffs, seed)
            pairs, verdicts = [], []
            for i, (a, b) in enumerate(zip(have, have[1:])):
                tie = bool(np.all(diffs[:, i] == 0))
                v = UNRESOLVED if tie else verdict(low[i], high[i])
                verdicts.append(v)
                text = "tie on every item (same ranking)" if tie else _interval(mean[i], low[i], high[i])
                pairs.append(f"{SHORT[a]}→{SHORT[b]} {text} {v}")
            overall = FAILS if FAILS in verdicts else HOLDS if all(v == HOLDS for v in verdicts) else UNRESOLVED
            # the deciding pair: the failing one furthest below 0, else the one closest to (or below) 0
            pick = int(np.nanargmin(high)) if overall == FAILS else int(np.nanargmin(low)) if np.isfinite(low).any() else 0
            statistic = f"paired ΔPPL difference, {SHORT[have[pick]]}→{SHORT[have[pick + 1]]} (the deciding pair; > 0: paper's order)"
            out.append(
                _row(
                    1,
                    overall,
                    statistic,
                    mean[pick],
                    low[pick],
                    high[pick],
                    n,
                    "; ".join(pairs),
                    scope=scope,
                    curve=curve,
                    rate=float(rate),
                )
            )
    return out


def sink_rows(records: Sequence[dict], seed: int = 0) -> list[dict]:
    """Claims 2–5 from the items' :func:`sink_statistics` (criteria in docs/METHOD.md section 5)."""
    items = [r["sinks"] for r in records if not r.get("skipped") and r.get("sinks")]
    if not items:
        return []
    stats = pd.DataFrame(items).reindex(columns=list(SINK_STATS)).astype(np.float64)
    out = []
    # 2: the sink's contribution follows its geometric factor more than its attention
    diff = (stats["rho_geometry"] - stats["rho_attention"]).to_numpy()[:, None]
    both = stats[["rho_geometry", "rho_attention"]].to_numpy()
    (m,), (lo,), (hi,), n = mean_interval(diff, seed)
    mb, lb, hb, _ = mean_interval(both, seed)
    evidence = f"ρ(c, geometry) {_interval(mb[0], lb[0], hb[0])}; ρ(c, attention) {_interval(mb[1], lb[1], hb[1])}"
    out.append(_row(2, verdict(lo, hi), "ρ(c, norm ratio × cos) − ρ(c, attention), the sink's rows", m, lo, hi, n, evidence))
    # 3: negative cosine
    (m,), (lo,), (hi,), n = mean_interval(stats[["cos_sink_rest"]].to_numpy(), seed)
    out.append(
        _row(
            3, verdict(lo, hi, positive=False), "mean cos(ṽ_σ, m) over heads and queries", m, lo, hi, n, f"mean cos {_interval(m, lo, hi)}"
        )
    )
    # 4: most heads' curves have an interior minimum
    values = stats[["interior_minimum_share", "median_minimiser"]].to_numpy()
    mm, ll, hh, n = mean_interval(values, seed)
    evidence = f"share of heads with 0 < s* < 1: {_interval(mm[0], ll[0], hh[0])}; median s*: {_interval(mm[1], ll[1], hh[1])}"
    out.append(
        _row(
            4,
            verdict(ll[0] - MAJORITY, hh[0] - MAJORITY),
            "share of heads whose curve's minimum lies inside (0, 1)",
            mm[0],
            ll[0],
            hh[0],
            n,
            evidence,
        )
    )
    # 5: the cone narrows (mean pairwise cosine rises) and perplexity rises
    mm, ll, hh, n = mean_interval(stats[["cone_change", "delta_ppl"]].to_numpy(), seed)
    parts = [verdict(ll[0], hh[0]), verdict(ll[1], hh[1])]
    overall = FAILS if FAILS in parts else HOLDS if parts == [HOLDS, HOLDS] else UNRESOLVED
    evidence = f"cone change {_interval(mm[0], ll[0], hh[0])} {parts[0]}; ΔPPL {_interval(mm[1], ll[1], hh[1])} {parts[1]}"
    pick = 1 if parts[1] != HOLDS and parts[0] == HOLDS else 0
    names = ("semantic cone change (mean pairwise cosine, after − before), mean over layers", "ΔPPL with the sink's value removed")
    out.append(_row(5, overall, names[pick], mm[pick], ll[pick], hh[pick], n, evidence))
    return out


def claims_table(records: Sequence[dict], seed: int = 0) -> pd.DataFrame:
    """One row per claim (claim 1: per scope, curve and rate) from the records of ``cwviz claims``: :data:`CSV_COLUMNS`."""
    rows = claim1_rows(records, seed) + sink_rows(records, seed)
    for row in rows:
        if row["n"] < MIN_ITEMS:
            row["verdict"] = UNRESOLVED
            row["evidence"] = f"too few items to decide ({row['n']} < {MIN_ITEMS}): " + row["evidence"]
    return pd.DataFrame(rows, columns=CSV_COLUMNS)


def overview(table: pd.DataFrame) -> pd.DataFrame:
    """One row per claim: its statement, the verdicts of its rows (claim 1: counted over scopes, curves and rates),
    and the evidence of a single-row claim (the page's and the report's first table)."""
    rows = []
    for claim, group in table.groupby("claim", sort=True):
        counts = group["verdict"].value_counts()
        if len(group) == 1:
            shown, evidence = group["verdict"].iloc[0], group["evidence"].iloc[0]
        else:
            shown = ", ".join(f"{counts.get(v, 0)} {v}" for v in (HOLDS, FAILS, UNRESOLVED))
            by_scope = group.groupby("scope", sort=False)["verdict"].agg(lambda v: "/".join(sorted(set(v))))
            evidence = "; ".join(f"{scope}: {v}" for scope, v in by_scope.items()) + " (per curve and rate below)"
        rows.append({"claim": int(claim), "statement": STATEMENTS[int(claim)], "verdict": shown, "evidence": evidence})
    return pd.DataFrame(rows, columns=["claim", "statement", "verdict", "evidence"])
