"""Does the paper hold on this model? The five claims of Cunningham and Muça Cirone (ICML 2026), each checked on a
sweep's items with a bootstrap interval over the items and a verdict (docs/METHOD.md section 5, where the protocol is
written down: issue 45's, pre-registered).

Each item (one text) gives one record (:func:`cwviz.analyses.claim_runs.item_payload`, which runs the model): its
faithfulness runs under each rank scope (the per-example table of :func:`cwviz.analyses.faithfulness.run_example`, the
random control among the measures, as a faithfulness record's payload) and the numbers claims 2–5 are judged by
(:func:`cwviz.analyses.claim_items.sink_statistics`). :func:`claims_table` turns the records into one row per
statistic, each with its ``role``: ``verdict`` (the pre-registered test of a claim; claim 1 per scope, curve and rate;
claim 5 as three verdicts a, b, c), ``control`` (claim 1: each measure's gap to random) or ``evidence`` (the first
protocol's statistics, other thresholds, ΔPPL); this module computes no model, so it is tested on constructed records.

Verdicts: ``holds`` when the 95 % interval lies wholly on the paper's side of the row's ``line``, ``fails`` when it
lies wholly on the other, ``unresolved`` when it straddles the line (or every item ties exactly, or too few items);
a claim-1 row whose scope ranks two of its measures identically by construction is ``ties by construction``: it
cannot hold, and is counted apart, never as unresolved.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import partial

import numpy as np
import pandas as pd

from ..core.defaults import CONFIDENCE, RESAMPLES, SINK_ACTIVE, SINK_ACTIVE_THRESHOLDS
from . import claim_items
from .bootstrap import bootstrap_interval
from .codecs.checks import CLAIMS, SINK_STATS
from .schema import FAILS, HOLDS, TIES, UNRESOLVED

#: The sub-folder of ``--results DIR`` that holds the records (:data:`cwviz.analyses.codecs.checks.CLAIMS`) and
#: manifest.
RECORDS_FOLDER = CLAIMS.name
#: The file ``cwviz claims --results DIR`` writes (atomically): :data:`CSV_COLUMNS`.
CSV_NAME = "claims.csv"
VERDICT, CONTROL, EVIDENCE = "verdict", "control", "evidence"
#: The paper's statements, by claim number (docs/METHOD.md section 5).
STATEMENTS: dict[int, str] = {
    1: "Faithfulness rises raw attention < value-weighted < value-weighted output-normalised < contribution weights, "
    "for comprehensiveness and sufficiency alike",
    2: "The first token's (the sink's) contributions are driven by value geometry (norm ratio and cosine), not by "
    "attention",
    3: "Sink values are anti-aligned with the semantic tokens' (negative cosine)",
    4: "The output norm against the sink ratio is convex, its minimum at a sink ratio below 1",
    5: "Removing the sink's value collapses the low-norm head outputs into the semantic cone and raises perplexity",
}
#: Claim 1's measures in the paper's order (least to most faithful); each adjacent pair is tested.
ORDER: tuple[str, ...] = ("raw", "value_weighted", "value_weighted_output_normalized", "contribution_inter")
#: What ``cwviz claims`` ranks: :data:`ORDER` and the random control.
RANKINGS: tuple[str, ...] = (*ORDER, "random")
SHORT = {
    "raw": "raw",
    "value_weighted": "VW",
    "value_weighted_output_normalized": "VW/‖o‖",
    "contribution_inter": "CW",
    "random": "random",
}
#: What the verdict rows of claims 2–5 are called on the forest plot.
LABELS = {
    "2": "sink vs other keys",
    "3": "sink-active heads",
    "4": "operating near minimiser",
    "5a": "spread",
    "5b": "toward centroid",
    "5c": "perplexity, sink − control",
}
#: Claim 1: the adjacent pair each rank scope ranks identically whatever the data. VW/‖o‖ divides a query's VW row by
#: one positive number ‖o_i‖, so under the query scope (each query's keys ranked on their own) the two orders agree.
IDENTICAL_BY_CONSTRUCTION: dict[str, tuple[str, str]] = {
    "query": ("value_weighted", "value_weighted_output_normalized")
}
#: Claim 4: the share of heads must be above this.
MAJORITY = 0.5
#: Columns of ``claims.csv`` (and of :func:`claims_table`).
CSV_COLUMNS = [
    "claim",
    "part",
    "role",
    "scope",
    "curve",
    "rate",
    "verdict",
    "statistic",
    "estimate",
    "ci_low",
    "ci_high",
    "line",
    "n",
    "evidence",
    "statement",
]
#: Fewer items than this decide nothing: a bootstrap over one or two items has (nearly) no spread, so its interval
#: would look decisive while it measures nothing. Such a row is unresolved, its evidence saying why.
MIN_ITEMS = 5


# -- verdicts (torch-free) ------------------------------------------------------------------------------
def judge(low: float, high: float, positive: bool = True) -> str:
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
    low, high = bootstrap_interval(values, RESAMPLES, CONFIDENCE, seed, omit_nan=True)
    return np.nanmean(values, axis=0), low, high, len(values)


def _row(
    claim: int, role: str, statistic: str, estimate, low, high, n: int, evidence: str, line: float = 0.0, **keys
) -> dict:
    """One row of :data:`CSV_COLUMNS`; its verdict is the side of ``line`` its interval lies on (``positive``: the
    paper's side is above; NaN line: a descriptive row, no verdict)."""
    positive = keys.pop("positive", True)
    decided = keys.pop("verdict", None)
    if decided is None:
        decided = "" if not math.isfinite(line) else judge(float(low) - line, float(high) - line, positive)
    row = {"claim": claim, "part": "", "role": role, "scope": "", "curve": "", "rate": math.nan, "verdict": decided}
    row |= {
        "statistic": statistic,
        "estimate": float(estimate),
        "ci_low": float(low),
        "ci_high": float(high),
        "line": float(line),
    }
    return row | {"n": int(n), "evidence": evidence} | keys | {"statement": STATEMENTS[claim]}


def _interval(estimate: float, low: float, high: float, digits: int = 3) -> str:
    return f"{estimate:+.{digits}g} [{low:+.{digits}g}, {high:+.{digits}g}]"


def _pairs(frame: pd.DataFrame, curve: str, rate: float, have: list[str], seed: int):
    """The paired differences of each adjacent pair of ``have`` (> 0: the paper's order), their means and intervals."""
    values = frame[[(curve, rate, m) for m in have]].to_numpy(np.float64)  # (item, measure)
    sign = 1.0 if curve == "comprehensiveness" else -1.0
    diffs = sign * (values[:, 1:] - values[:, :-1])  # (item, pair)
    return (diffs, *mean_interval(diffs, seed))


def claim1_rows(records: Sequence[dict], seed: int = 0) -> list[dict]:
    """Claim 1 per scope, curve and rate (verdict rows), on the log-perplexity ratio: the paired difference of each
    adjacent pair of :data:`ORDER`, oriented so that > 0 is the paper's direction (comprehensiveness: later − earlier;
    sufficiency: earlier − later). ``holds`` when every pair's interval is above 0, ``fails`` when one pair's is below
    0, ``unresolved`` otherwise; a pair that ties on every item cannot hold. A row with a pair its scope ranks alike by
    construction (:data:`IDENTICAL_BY_CONSTRUCTION`) is ``ties by construction``, its other pairs in the evidence.
    The ΔPPL differences go into the evidence; each measure's gap to the random control is a ``control`` row."""
    scopes = list(dict.fromkeys(s for r in records if not r.get("skipped") for s in r["faithfulness"]))
    out = []
    for scope in scopes:
        frame, ppl = CLAIMS.decode(records, scope), CLAIMS.decode(records, scope, "delta_ppl")
        for curve, rate in dict.fromkeys((c, r) for c, r, _ in frame.columns):
            have = [m for m in ORDER if (curve, rate, m) in frame.columns]
            where = {"scope": scope, "curve": curve, "rate": float(rate)}
            if len(have) >= 2:
                diffs, mean, low, high, n = _pairs(frame, curve, rate, have, seed)
                _, pmean, plow, phigh, _ = _pairs(ppl, curve, rate, have, seed)
                pairs, verdicts = [], []
                for i, (a, b) in enumerate(zip(have, have[1:])):
                    tie = bool(np.all(diffs[:, i] == 0))
                    if IDENTICAL_BY_CONSTRUCTION.get(scope) == (a, b):
                        v, text = TIES, f"identical rankings under the {scope} scope"
                        low[i] = high[i] = np.nan  # never the deciding pair: its interval says nothing
                    else:
                        v = UNRESOLVED if tie else judge(low[i], high[i])
                        text = (
                            "tie on every item (same ranking)"
                            if tie
                            else f"log ratio {_interval(mean[i], low[i], high[i])}"
                        )
                    verdicts.append(v)
                    pairs.append(f"{SHORT[a]}→{SHORT[b]} {text} {v} (ΔPPL {_interval(pmean[i], plow[i], phigh[i])})")
                overall = (
                    TIES
                    if TIES in verdicts
                    else FAILS
                    if FAILS in verdicts
                    else HOLDS
                    if all(v == HOLDS for v in verdicts)
                    else UNRESOLVED
                )
                # the deciding pair: the failing one furthest below 0, else the one closest to (or below) 0
                pick = (
                    int(np.nanargmin(high))
                    if FAILS in verdicts
                    else int(np.nanargmin(low))
                    if np.isfinite(low).any()
                    else 0
                )
                statistic = (
                    f"paired log-perplexity ratio difference, {SHORT[have[pick]]}→{SHORT[have[pick + 1]]} (the "
                    "deciding pair; > 0: paper's order)"
                )
                evidence = "; ".join(pairs)
                out.append(
                    _row(
                        1, VERDICT, statistic, mean[pick], low[pick], high[pick], n, evidence, verdict=overall, **where
                    )
                )
            if (curve, rate, "random") in frame.columns:
                out += _control_rows(frame, ppl, curve, rate, where, seed)
    return out


def _control_rows(
    frame: pd.DataFrame, ppl: pd.DataFrame, curve: str, rate: float, where: dict, seed: int
) -> list[dict]:
    """Each measure's gap to the random control at one scope, curve and rate (> 0: better than chance)."""
    measures = [m for m in ORDER if (curve, rate, m) in frame.columns]
    sign = 1.0 if curve == "comprehensiveness" else -1.0
    gaps = sign * (
        frame[[(curve, rate, m) for m in measures]].to_numpy(np.float64)
        - frame[[(curve, rate, "random")]].to_numpy(np.float64)
    )
    mean, low, high, n = mean_interval(gaps, seed)
    rand, rlow, rhigh, _ = mean_interval(ppl[[(curve, rate, "random")]].to_numpy(np.float64), seed)
    rows = []
    for i, m in enumerate(measures):
        evidence = f"random's ΔPPL {_interval(rand[0], rlow[0], rhigh[0])} (mean over draws and items)"
        statistic = f"{SHORT[m]}: gap to random, log-perplexity ratio (> 0: better than chance)"
        rows.append(_row(1, CONTROL, statistic, mean[i], low[i], high[i], n, evidence, part=SHORT[m], **where))
    return rows


def _judged(claim: int, role: str, name: str, values, seed: int = 0, evidence: str = "", **keys) -> dict:
    """One row of a per-item statistic (claims 2–5): its mean over items, interval and verdict (:func:`_row`)."""
    (m,), (lo,), (hi,), n = mean_interval(np.asarray(values, np.float64)[:, None], seed)
    return _row(claim, role, name, m, lo, hi, n, evidence or _interval(m, lo, hi), **keys)


def _stats(records: Sequence[dict]) -> pd.DataFrame:
    items = [r["sinks"] for r in records if not r.get("skipped") and r.get("sinks")]
    return pd.DataFrame(items).reindex(columns=list(SINK_STATS)).astype(np.float64)


def sink_rows(records: Sequence[dict], seed: int = 0) -> list[dict]:
    """Claims 2–5 from the items' sink statistics (criteria in docs/METHOD.md section 5): verdict rows and evidence,
    claim by claim (:func:`claim_two_rows`, :func:`claim_three_rows`, :func:`claim_four_rows`, :func:`removal_rows`)."""
    stats = _stats(records)
    if not len(stats):
        return []
    steps = (claim_two_rows, claim_three_rows, claim_four_rows, removal_rows)
    return [row for step in steps for row in step(stats, seed)]


def claim_two_rows(stats: pd.DataFrame, seed: int = 0) -> list[dict]:
    """Claim 2: how much more the sink's contributions follow value geometry than attention (d_σ), judged against the
    same difference over every other key (d_other); both as evidence. ``stats``: one row per item (``SINK_STATS``)."""
    d_sink = stats["rho_geometry"] - stats["rho_attention"]
    d_other = stats["rho_geometry_other"] - stats["rho_attention_other"]
    lead = "d_σ − d_other: [ρ(c, geometry) − ρ(c, attention)] of the sink minus that of the other keys"
    rows = [
        (VERDICT, lead, d_sink - d_other),
        (EVIDENCE, "d_σ = ρ(c, geometry) − ρ(c, attention), the sink's rows (the first protocol)", d_sink),
        (EVIDENCE, "d_other, every other visible key", d_other),
    ]
    return [_judged(2, role, name, values, seed) for role, name, values in rows]


def claim_three_rows(stats: pd.DataFrame, seed: int = 0) -> list[dict]:
    """Claim 3: the sink's value against the semantic tokens' mean (cos(ṽ_σ, m) < 0: anti-aligned), judged on the
    sink-active heads (:data:`~cwviz.core.defaults.SINK_ACTIVE`); every head, the other thresholds and the mean
    weighted by the sink ratio as evidence."""
    others = [
        (EVIDENCE, f"mean cos(ṽ_σ, m), heads with mean sink ratio ≥ {t:g}", f"cos_active_{t:g}")
        for t in SINK_ACTIVE_THRESHOLDS
        if t != SINK_ACTIVE
    ]
    active = f"mean cos(ṽ_σ, m), sink-active heads (mean sink ratio ≥ {SINK_ACTIVE:g})"
    rows = [
        (VERDICT, active, f"cos_active_{SINK_ACTIVE:g}"),
        (EVIDENCE, "mean cos(ṽ_σ, m), every head (the first protocol)", "cos_sink_rest"),
        *others,
        (EVIDENCE, "mean cos(ṽ_σ, m) weighted by the sink ratio, every head", "cos_weighted"),
    ]
    return [_judged(3, role, name, stats[column], seed, positive=False) for role, name, column in rows]


#: Claim 4's evidence rows: (statistic, the per-item name, line: :data:`MAJORITY` to judge, NaN to describe).
CLAIM_FOUR_EVIDENCE: tuple[tuple[str, str, float], ...] = (
    (
        "share of fitted heads whose ‖o‖² against s is U-shaped (β2 > 0, minimiser inside (0, 1); issue 45's verdict, "
        "close to an algebraic consequence: METHOD.md section 5)",
        "u_shaped_share",
        MAJORITY,
    ),
    (
        "sink-active U-shaped heads: median operating ratio − s* (< 0: short of the minimum)",
        "operating_offset",
        math.nan,
    ),
    ("sink-active U-shaped heads per item", "operating_heads", math.nan),
    (
        "share of heads whose medians' curve has its minimiser inside (0, 1) (the first protocol)",
        "interior_minimum_share",
        MAJORITY,
    ),
    ("U-shaped heads: median minimiser s*", "fit_minimiser", math.nan),
    ("U-shaped heads: median operating sink ratio", "operating_ratio", math.nan),
    ("U-shaped heads: share operating above their minimiser", "above_minimum_share", math.nan),
    ("heads fitted per item", "fitted_heads", math.nan),
)


def claim_four_rows(stats: pd.DataFrame, seed: int = 0) -> list[dict]:
    """Claim 4 judged on its empirical part, the operating point: the sink-active U-shaped heads' median distance to
    their fitted minimiser s* below :data:`~cwviz.analyses.claim_items.NEAR_MINIMISER`; the fits' shares and medians
    as evidence (:data:`CLAIM_FOUR_EVIDENCE`)."""
    near = claim_items.NEAR_MINIMISER
    statistic = (
        "operating point (the empirical part): median |operating sink ratio − fitted minimiser s*| over the "
        f"sink-active U-shaped heads (< {near:g}: near their minimum)"
    )
    verdict = _judged(4, VERDICT, statistic, stats["operating_distance"], seed, line=near, positive=False)
    return [verdict] + [
        _judged(4, EVIDENCE, name, stats[column], seed, line=line) for name, column, line in CLAIM_FOUR_EVIDENCE
    ]


#: Claim 5's three statistics: (part, what it measures, the sink pass's per-item name; the control's is ``control_``
#: + that name).
REMOVAL_PARTS: tuple[tuple[str, str, str], ...] = (
    ("a", "spread narrows: mean pairwise cosine of the low-norm outputs, after − before", "low_cone_change"),
    (
        "b",
        "toward the semantic centroid: mean cos(o, c) of the low-norm outputs, after − before",
        "low_centroid_change",
    ),
    ("c", "perplexity rises: log(PPL(removed) / PPL(clean))", "log_ppl_ratio"),
)


def removal_rows(stats: pd.DataFrame, seed: int = 0) -> list[dict]:
    """Claim 5 beside its control (docs/METHOD.md section 5): (a) and (b) are judged on the sink's removal, with the
    paired difference sink − control as a ``control`` row; (c) is judged on that paired difference of log-perplexity
    ratios (the sink's removal raises perplexity more than the control's), the sink's own ratio as evidence.
    ``stats``: one row per item, the names of ``SINK_STATS``."""
    one = partial(_judged, seed=seed)
    out = []
    for part, what, name in REMOVAL_PARTS:
        sink, control = stats[name], stats[f"control_{name}"]
        if part == "c":
            out.append(one(5, VERDICT, f"({part}) {what}, sink − control (paired)", sink - control, part=part))
            out.append(one(5, EVIDENCE, f"({part}) {what}, the sink's removal alone (issue 45's verdict)", sink))
        else:
            out.append(one(5, VERDICT, f"({part}) {what}", sink, part=part))
            out.append(
                one(
                    5,
                    CONTROL,
                    f"({part}) sink − control (paired; > 0: the sink's removal moves more)",
                    sink - control,
                    part=part,
                )
            )
        out.append(one(5, EVIDENCE, f"({part}) {what}, the control's removal", control))
    mass, band = stats["control_mass_ratio"], stats["control_in_band_share"]
    out += [
        one(5, EVIDENCE, "control key's attention mass over the sink's, mean over layers", mass, line=math.nan),
        one(
            5,
            EVIDENCE,
            f"share of layers whose control key was within ±{claim_items.CONTROL_BAND:.0%} of the sink's mass",
            band,
            line=math.nan,
        ),
        one(
            5,
            EVIDENCE,
            "mean pairwise cosine of every output, after − before (the first protocol)",
            stats["cone_change"],
        ),
        one(5, EVIDENCE, "ΔPPL with the sink's value removed", stats["delta_ppl"]),
        one(5, EVIDENCE, "ΔPPL with the control's value removed", stats["control_delta_ppl"]),
    ]
    return out


def claims_table(records: Sequence[dict], seed: int = 0) -> pd.DataFrame:
    """Every row of ``claims.csv`` from the records of ``cwviz claims``: :data:`CSV_COLUMNS`."""
    rows = claim1_rows(records, seed) + sink_rows(records, seed)
    for row in rows:
        if row["n"] < MIN_ITEMS and row["verdict"] not in ("", TIES):  # a tie by construction needs no items
            row["verdict"] = UNRESOLVED
            row["evidence"] = f"too few items to decide ({row['n']} < {MIN_ITEMS}): " + row["evidence"]
    return pd.DataFrame(rows, columns=CSV_COLUMNS)


def verdict_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The verdict rows of :func:`claims_table` (the forest plot's), each with a ``label`` naming it."""
    rows = table[table["role"] == VERDICT].copy()
    rate = rows["rate"].map(lambda r: "" if pd.isna(r) else f" {r:g} %")
    where = rows["scope"].where(rows["scope"] == "", " " + rows["scope"] + " " + rows["curve"].str[:4] + ".")
    names = rows["claim"].astype(str) + rows["part"]
    rows["label"] = names + where + rate + names.map(lambda k: f" {LABELS[k]}" if k in LABELS else "")
    return rows.reset_index(drop=True)


def headline(verdicts: pd.Series) -> str:
    """Many rows' verdicts counted over the rows that can hold ("0 holds, 4 fails, 4 unresolved of 8 that can
    hold"), the rows that tie by construction named apart, never among the unresolved."""
    counts = verdicts.value_counts()
    judged = ", ".join(f"{counts.get(v, 0)} {v}" for v in (HOLDS, FAILS, UNRESOLVED))
    can_hold = int(sum(counts.get(v, 0) for v in (HOLDS, FAILS, UNRESOLVED)))
    ties = int(counts.get(TIES, 0))
    return f"{judged} of {can_hold} that can hold" + (f"; {ties} {TIES} (cannot hold)" if ties else "")


def overview(table: pd.DataFrame) -> pd.DataFrame:
    """One row per claim: its statement, the verdicts of its verdict rows (claim 1: counted over scopes, curves and
    rates; claim 5: a, b, c), and the evidence of a single-verdict claim (the page's and the report's first table)."""
    rows = []
    for claim, group in table[table["role"] == VERDICT].groupby("claim", sort=True):
        if len(group) == 1:
            shown, evidence = group["verdict"].iloc[0], f"{group['statistic'].iloc[0]}: {group['evidence'].iloc[0]}"
        elif (group["part"] != "").all():
            shown = "; ".join(f"{p}: {v}" for p, v in zip(group["part"], group["verdict"]))
            evidence = "; ".join(f"{s}: {e}" for s, e in zip(group["statistic"], group["evidence"]))
        else:
            shown = headline(group["verdict"])
            by_scope = group.groupby("scope", sort=False)["verdict"].agg(lambda v: "/".join(sorted(set(v))))
            evidence = "; ".join(f"{scope}: {v}" for scope, v in by_scope.items()) + " (per curve and rate below)"
        rows.append({"claim": int(claim), "statement": STATEMENTS[int(claim)], "verdict": shown, "evidence": evidence})
    return pd.DataFrame(rows, columns=["claim", "statement", "verdict", "evidence"])
