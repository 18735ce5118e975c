"""The fair test's statistics and verdicts (docs/METHOD.md section 7.3), computed from its records alone with numpy
and pandas, no model (the records are :func:`cwviz.analyses.flow_faithfulness.item_payload`'s).

:func:`item_statistics` (per item, method and intervention: ρ of |score| with |Δ| with and without the first token, the
signed ρ and top-3 sign agreement of signed members, the drops and AOPC), :func:`method_table` (means and intervals),
:func:`verdict_table` (the pre-registered paired comparisons, each holds / fails / unresolved as ``cwviz claims``
judges: :mod:`cwviz.analyses.claims`) and :func:`item_table` (each item's primary ρ, the table docs/flow.md publishes).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields

import numpy as np
import pandas as pd

from ..core.method import attribution
from .claim_items import spearman
from .claims import MIN_ITEMS, UNRESOLVED, judge, mean_interval
from .flow_faithfulness import CONTROL, CURVES, FOCUS, INTERVENTIONS, RATES, ranking

#: The tokens whose largest |score| the sign agreement reads.
SIGN_TOP = 3
#: Per-item statistics: the primary ρ (|score| with |Δ|, tokens 1 .. p − 1), its sensitivity row with the first token,
#: the signed ρ and top-3 sign agreement (signed members), the drops at each rate and the two AOPCs.
PRIMARY = "rho"
STATISTICS = (
    PRIMARY,
    "rho_with_first",
    "rho_signed",
    "sign_agreement",
    *(f"{curve}@{rate:g}" for curve in CURVES for rate in RATES),
    "aopc_comprehensiveness",
    "aopc_sufficiency",
)
SIGNED_STATISTICS = frozenset({"rho_signed", "sign_agreement"})
#: Statistics where larger is more faithful (the others: sufficiency, smaller is).
LARGER_IS_BETTER = frozenset(
    {
        PRIMARY,
        "rho_with_first",
        "rho_signed",
        "sign_agreement",
        "aopc_comprehensiveness",
        *(f"comprehensiveness@{r:g}" for r in RATES),
    }
)
#: The statistics each comparison is judged on (the per-rate rows are in the methods table).
JUDGED = (PRIMARY, "rho_with_first", "aopc_comprehensiveness", "aopc_sufficiency", "rho_signed", "sign_agreement")
CSV_COLUMNS = [
    "intervention",
    "statistic",
    "first",
    "second",
    "primary",
    "verdict",
    "estimate",
    "ci_low",
    "ci_high",
    "n",
    "evidence",
]
METHOD_COLUMNS = ["intervention", "method", "statistic", "mean", "ci_low", "ci_high", "n", "signed", "answers"]


def sign_agreement(scores: np.ndarray, effects: np.ndarray, top: int = SIGN_TOP) -> float:
    """Among the ``top`` tokens with the largest |score| (ties: earlier first), the share whose score has the sign of
    its effect (an effect or score of exactly 0 disagrees); NaN with no tokens."""
    scores, effects = np.asarray(scores, np.float64), np.asarray(effects, np.float64)
    keep = np.isfinite(scores) & np.isfinite(effects)
    scores, effects = scores[keep], effects[keep]
    if not len(scores):
        return math.nan
    picked = ranking(np.abs(scores))[: min(top, len(scores))]
    return float(np.mean(np.sign(scores[picked]) * np.sign(effects[picked]) > 0))


def _rows(record: dict) -> dict[tuple[str, str], np.ndarray]:
    """Each method's scores over the input tokens 0 .. p − 1 (the control: its draws, stacked [draw, token])."""
    rows = {name: np.asarray(v, dtype=np.float64) for name, v in record["scores"].items()}
    rows[CONTROL] = np.asarray(record["random_scores"], dtype=np.float64)
    return rows


@dataclass(frozen=True)
class ItemStatistics:
    """One method's per-item statistics (:func:`per_item`); the field names are the item table's statistic columns
    (``rho`` is :data:`PRIMARY`). NaN where undefined (an unsigned method's signed readings)."""

    rho: float
    rho_with_first: float
    rho_signed: float = math.nan
    sign_agreement: float = math.nan

    @classmethod
    def mean(cls, draws: Sequence[ItemStatistics]) -> ItemStatistics:
        """The field-wise mean over the random control's draws, NaNs left out (all NaN: NaN)."""
        return cls(*(_nanmean([getattr(d, f.name) for d in draws]) for f in fields(cls)))


def per_item(scores: np.ndarray, effects: np.ndarray, signed: bool) -> ItemStatistics:
    """The per-item statistics of one method's (or one random draw's) scores [p] against the effects [p] over the input
    tokens 0 .. p − 1 (a pair with a NaN side is left out): ρ(|score|, |Δ|) over 1 .. p − 1 (:data:`PRIMARY`) and
    over 0 .. p − 1, and for a signed method the signed ρ and the top-3 sign agreement over 1 .. p − 1."""
    scores, effects = np.asarray(scores, np.float64), np.asarray(effects, np.float64)
    ranked = slice(1, None)
    rho = spearman(np.abs(scores[ranked]), np.abs(effects[ranked]))
    with_first = spearman(np.abs(scores), np.abs(effects))
    if not signed:
        return ItemStatistics(rho, with_first)
    return ItemStatistics(
        rho, with_first, spearman(scores[ranked], effects[ranked]), sign_agreement(scores[ranked], effects[ranked])
    )


def item_statistics(records: Sequence[dict], effect: str = "effects") -> pd.DataFrame:
    """One row per finished item (index: its example number), columns (intervention, method, statistic).
    ``effect``: ``"effects"`` (Δ LD, primary) or ``"logp_effects"`` (Δ log p of the target, secondary: the ρ rows
    only; the drops are always of LD). The control's ρ is the mean of its draws' (its signed reading: scores − ½)."""
    rows, methods = {}, []
    for record in records:
        if record.get("skipped"):
            continue
        signed = set(record["signed"])
        row = {}
        for intervention in INTERVENTIONS:
            effects = np.asarray(record[effect][intervention], dtype=np.float64)
            for name, scores in _rows(record).items():
                if name == CONTROL:
                    draws = [per_item(draw - 0.5, effects, True) for draw in scores]
                    stats = ItemStatistics.mean(draws) if draws else None
                else:
                    stats = per_item(scores, effects, name in signed)
                for key, value in (asdict(stats) if stats else {}).items():
                    row[intervention, name, key] = value
                curves = record["curves"][intervention][name]
                for curve in CURVES:
                    values = [float(curves[curve][f"{rate:g}"]) for rate in RATES]
                    for rate, value in zip(RATES, values):
                        row[intervention, name, f"{curve}@{rate:g}"] = value
                    row[intervention, name, f"aopc_{curve}"] = float(np.mean(values))
        methods.extend(m for m in _rows(record) if m not in methods)
        rows[record["example"]] = row
    columns = pd.MultiIndex.from_product(
        [INTERVENTIONS, methods, STATISTICS], names=["intervention", "method", "statistic"]
    )
    return pd.DataFrame.from_dict(rows, orient="index").reindex(columns=columns).sort_index()


def _nanmean(values: Sequence[float]) -> float:
    values = np.asarray(values, np.float64)
    return float(np.nanmean(values)) if np.isfinite(values).any() else math.nan


def _methods_of(stats: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(stats.columns.get_level_values("method")))


def _answers() -> dict[str, str]:
    """Each member's declared interventions, as text (the control answers both)."""
    out = {CONTROL: ", ".join(INTERVENTIONS)}
    for name, method in attribution.METHODS.items():
        out[name] = ", ".join(i for i in INTERVENTIONS if i in method.answers)
    return out


def full_drop(records: Sequence[dict], intervention: str = attribution.RELAY) -> float:
    """D, the mean over finished items of LD(clean) − LD(every input token taken away)."""
    values = [r["full_drop"][intervention] for r in records if not r.get("skipped")]
    return float(np.mean(values)) if values else math.nan


def method_table(records: Sequence[dict], seed: int = 0, effect: str = "effects") -> pd.DataFrame:
    """Each (intervention, method)'s mean of each statistic over the items, its 95 % bootstrap interval and n."""
    stats = item_statistics(records, effect)
    signed = {name for r in records if not r.get("skipped") for name in r["signed"]}
    answers = _answers()
    methods = _methods_of(stats)
    stats = stats.sort_index(axis=1)  # a lexsorted column index: each (intervention, method) read without a scan
    rows = []
    for intervention in INTERVENTIONS:
        for method in methods:
            values = (
                stats[intervention, method].reindex(columns=list(STATISTICS)).to_numpy(np.float64)
                if len(stats)
                else np.zeros((0, len(STATISTICS)))
            )
            for i, statistic in enumerate(STATISTICS):
                column = values[:, i]
                column = column[np.isfinite(column)]
                if len(column):
                    (m,), (lo,), (hi,), n = mean_interval(column[:, None], seed)
                else:
                    m = lo = hi = math.nan
                    n = 0
                rows.append(
                    {
                        "intervention": intervention,
                        "method": method,
                        "statistic": statistic,
                        "mean": float(m),
                        "ci_low": float(lo),
                        "ci_high": float(hi),
                        "n": int(n),
                        "signed": method in signed or method == CONTROL,
                        "answers": answers.get(method, ""),
                    }
                )
    return pd.DataFrame(rows, columns=METHOD_COLUMNS)


def _text(estimate: float, low: float, high: float) -> str:
    return f"{estimate:+.3g} [{low:+.3g}, {high:+.3g}]"


def comparisons(methods: Sequence[str], signed: set[str]) -> list[tuple[str, str, str]]:
    """The pre-registered comparisons (first, second, statistic) of section 7.3: :data:`FOCUS` against every other
    member and every member against the control, on each judged statistic (the signed ones among signed members)."""
    pairs = [(FOCUS, m) for m in methods if m != FOCUS] + [(m, CONTROL) for m in methods if m not in (CONTROL, FOCUS)]
    out = []
    for first, second in pairs:
        for statistic in JUDGED:
            if statistic in SIGNED_STATISTICS and not ({first, second} <= signed | {CONTROL}):
                continue
            out.append((first, second, statistic))
    return out


def verdict_table(records: Sequence[dict], seed: int = 0, effect: str = "effects") -> pd.DataFrame:
    """One row per intervention and pre-registered comparison (:func:`comparisons`): the paired difference per item
    oriented so that > 0 means ``first`` is more faithful, its mean over the items that give both, the 95 % paired
    bootstrap interval, and the verdict: holds above 0, fails below, unresolved when the interval contains 0, when the
    two tie on every item, or with fewer than :data:`cwviz.analyses.claims.MIN_ITEMS` items. ``primary``: the primary
    ρ row."""
    stats = item_statistics(records, effect)
    signed = {name for r in records if not r.get("skipped") for name in r["signed"]}
    methods = _methods_of(stats) if len(stats) else []
    stats = stats.sort_index(axis=1)
    rows = []
    for intervention in INTERVENTIONS:
        for first, second, statistic in comparisons(methods, signed):
            a = stats[intervention, first, statistic].to_numpy(np.float64) if len(stats) else np.zeros(0)
            b = stats[intervention, second, statistic].to_numpy(np.float64) if len(stats) else np.zeros(0)
            sign = 1.0 if statistic in LARGER_IS_BETTER else -1.0
            diff = sign * (a - b)
            diff = diff[np.isfinite(diff)]
            if len(diff):
                (m,), (lo,), (hi,), n = mean_interval(diff[:, None], seed)
            else:
                m = lo = hi = math.nan
                n = 0
            if n < MIN_ITEMS:
                result, evidence = UNRESOLVED, f"too few items to decide ({n} < {MIN_ITEMS})"
            elif np.all(diff == 0):
                result, evidence = UNRESOLVED, "tie on every item"
            else:
                result = judge(lo, hi)
                evidence = (
                    f"{first} − {second} {_text(m, lo, hi)}" if sign > 0 else f"{second} − {first} {_text(m, lo, hi)}"
                )
            rows.append(
                {
                    "intervention": intervention,
                    "statistic": statistic,
                    "first": first,
                    "second": second,
                    "primary": statistic == PRIMARY,
                    "verdict": result,
                    "estimate": float(m),
                    "ci_low": float(lo),
                    "ci_high": float(hi),
                    "n": int(n),
                    "evidence": evidence,
                }
            )
    return pd.DataFrame(rows, columns=CSV_COLUMNS)


def item_table(records: Sequence[dict]) -> pd.DataFrame:
    """The per-item primary ρ: one row per finished item, intervention and method (example, intervention, method,
    rho, rho_signed, sign_agreement): the table docs/flow.md publishes beside its means."""
    stats = item_statistics(records)
    rows = []
    for example, row in stats.iterrows():
        for intervention in INTERVENTIONS:
            for method in _methods_of(stats):
                rows.append(
                    {
                        "example": int(example),
                        "intervention": intervention,
                        "method": method,
                        **{
                            key: float(row[intervention, method, key])
                            for key in (PRIMARY, "rho_signed", "sign_agreement")
                        },
                    }
                )
    return pd.DataFrame(rows, columns=["example", "intervention", "method", PRIMARY, "rho_signed", "sign_agreement"])


def skipped_counts(records: Sequence[dict]) -> dict[str, int]:
    """How many items were skipped, by reason."""
    counts: dict[str, int] = {}
    for record in records:
        if record.get("skipped"):
            counts[record.get("why", "skipped")] = counts.get(record.get("why", "skipped"), 0) + 1
    return counts


def format_verdicts(table: pd.DataFrame, primary_only: bool = True) -> str:
    """The verdicts, one line per row (the primary rows only by default)."""
    shown = table[table["primary"]] if primary_only else table
    return "\n".join(
        f"{row.intervention}: {row.statistic}: {row.first} vs {row.second}: {row.verdict.upper()}: {row.evidence} "
        f"(n={row.n})"
        for row in shown.itertuples(index=False)
    )
