"""Faithfulness summaries (docs/METHOD.md section 3): the per-example tables of
:func:`cwviz.analyses.faithfulness.run_example` (or a task's items) in, statistics over the examples out.

* **ΔPPL** = PPL(masked) − PPL(clean), and the scale-free **log-perplexity ratio** log(PPL(masked) / PPL(clean))
  (:func:`log_ratio`); each measure's gap to the random control in the latter (:func:`random_gaps`).
* **Summary**: mean ΔPPL over examples with a seeded percentile-bootstrap 95 % interval (:func:`summarize`), the
  random control's draws averaged within each example first (:func:`per_example_means`); the area under each curve
  by the trapezoid rule over the rates given as fractions (:func:`curve_areas`); the paper's order of the measures
  (:func:`order_check`).

Apart from :mod:`cwviz.analyses.faithfulness` because it needs no model: a saved run's records are summarised again
(:mod:`cwviz.analyses.codecs`, ``cwviz report``) without a forward pass.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from ..core.defaults import CONFIDENCE, RESAMPLES, SEED
from ..core.util.errors import InputError
from .bootstrap import bootstrap_interval
from .masks import CURVES
from .schema import ALL_MEASURES

#: Columns of :func:`summarize` (and of the CLI's CSV).
SUMMARY_COLUMNS = [
    "measure",
    "curve",
    "rate",
    "delta_ppl",
    "ci_low",
    "ci_high",
    "n",
    "log_ppl_ratio",
    "log_ci_low",
    "log_ci_high",
]
#: Columns of :func:`random_gaps`: each measure's gap to the random control (> 0: better than chance).
GAP_COLUMNS = ["measure", "curve", "rate", "gap", "ci_low", "ci_high", "n"]
#: Columns :func:`summarize` adds for a multiple-choice task (accuracies as fractions of the examples).
ACCURACY_COLUMNS = ["accuracy_clean", "accuracy_masked", "delta_accuracy", "accuracy_ci_low", "accuracy_ci_high"]
#: The order the paper reports for comprehensiveness (least to most faithful).
PAPER_ORDER: tuple[str, ...] = ("raw", "value_weighted", "value_weighted_output_normalized", "contribution_inter")


def log_ratio(masked, clean):
    """The scale-free statistic (docs/METHOD.md section 3): log(PPL(masked) / PPL(clean)), the change of the mean
    next-token negative log-likelihood in nats per token."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(np.asarray(masked, dtype=np.float64)) - np.log(np.asarray(clean, dtype=np.float64))


def bootstrap_ci(
    values: np.ndarray, level: float = CONFIDENCE, resamples: int = RESAMPLES, seed: int = SEED
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``values`` (seeded; one value gives a zero-width one)."""
    values = np.asarray(values, dtype=np.float64)
    if len(values) == 0:
        return math.nan, math.nan
    low, high = bootstrap_interval(values, resamples, level, seed)
    return float(low), float(high)


def per_example_means(per_example: pd.DataFrame) -> pd.DataFrame:
    """One row per (example, measure, curve, rate): the random control's draws averaged within each example (so a
    mean over examples counts examples, not draws), and ``log_ppl_ratio`` derived where a table predates it."""
    frame = per_example
    if "log_ppl_ratio" not in frame and {"ppl_masked", "ppl_clean"} <= set(frame.columns):
        frame = frame.assign(log_ppl_ratio=log_ratio(frame["ppl_masked"], frame["ppl_clean"]))
    if "draw" not in frame or "example" not in frame or not (frame["draw"] > 0).any():
        return frame
    keys = ["example", "measure", "curve", "rate"]
    numbers = [c for c in frame.columns if c not in keys and c != "draw" and pd.api.types.is_numeric_dtype(frame[c])]
    return frame.groupby(keys, sort=False, as_index=False)[numbers].mean()


def _mean_ci(values: np.ndarray, level: float, resamples: int, seed: int) -> tuple[float, float, float, int]:
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]  # the values the mean is of; n counts them
    low, high = bootstrap_ci(values, level, resamples, seed)
    return (float(values.mean()) if len(values) else math.nan), low, high, len(values)


def summarize(
    per_example: pd.DataFrame, level: float = CONFIDENCE, resamples: int = RESAMPLES, seed: int = SEED
) -> pd.DataFrame:
    """Mean ΔPPL and mean log-perplexity ratio over examples per (measure, curve, rate), each with its bootstrap
    interval: :data:`SUMMARY_COLUMNS` (the random control's draws averaged within an example first).

    For a multiple-choice task (``per_example`` has ``correct_clean`` and ``correct_masked``), also
    :data:`ACCURACY_COLUMNS`: clean and masked accuracy, their difference and its paired bootstrap interval
    (the examples are resampled, each keeping its clean and masked answer together).

    The mean and its interval are over the finite ΔPPL values only, and ``n`` counts exactly those: an example whose
    masked perplexity is NaN or infinite (an overflow) is left out of the mean and of ``n`` alike.
    """
    missing = [c for c in ("measure", "curve", "rate", "delta_ppl") if c not in per_example]
    if missing:
        raise InputError(
            f"the per-example table has no column(s) {', '.join(missing)}; give the rows of run_example "
            "or iter_examples"
        )
    per_example = per_example_means(per_example)
    accuracy = "correct_masked" in per_example and per_example["correct_masked"].notna().all()
    rows = []
    for (measure, curve, rate), group in per_example.groupby(["measure", "curve", "rate"], sort=False):
        row = (measure, curve, rate, *_mean_ci(group["delta_ppl"], level, resamples, seed))
        ratio = group["log_ppl_ratio"] if "log_ppl_ratio" in group else np.full(len(group), np.nan)
        mean, low, high, _ = _mean_ci(ratio, level, resamples, seed)
        row += (mean, low, high)
        if accuracy:
            clean, masked = group["correct_clean"].to_numpy(float), group["correct_masked"].to_numpy(float)
            row += (
                clean.mean(),
                masked.mean(),
                (masked - clean).mean(),
                *bootstrap_ci(masked - clean, level, resamples, seed),
            )
        rows.append(row)
    summary = pd.DataFrame(rows, columns=SUMMARY_COLUMNS + (ACCURACY_COLUMNS if accuracy else []))
    return _ordered(summary)


def random_gaps(
    per_example: pd.DataFrame, level: float = CONFIDENCE, resamples: int = RESAMPLES, seed: int = SEED
) -> pd.DataFrame:
    """Each measure's gap to the random control (docs/METHOD.md section 3), paired per example: the log-perplexity
    ratio L(measure) − L(random) under comprehensiveness, L(random) − L(measure) under sufficiency, so > 0 is better
    than chance; mean over examples with its bootstrap interval (:data:`GAP_COLUMNS`). Empty without a random run."""
    frame = per_example_means(per_example)
    if "random" not in set(frame.get("measure", ())) or "log_ppl_ratio" not in frame:
        return pd.DataFrame(columns=GAP_COLUMNS)
    wide = frame.pivot_table(
        index="example", columns=["curve", "rate", "measure"], values="log_ppl_ratio", aggfunc="first"
    )
    rows = []
    for curve, rate, measure in wide.columns:
        if measure == "random":
            continue
        gap = wide[curve, rate, measure] - wide[curve, rate, "random"]
        gap = gap if curve == "comprehensiveness" else -gap
        rows.append((measure, curve, rate, *_mean_ci(gap.to_numpy(), level, resamples, seed)))
    return _ordered(pd.DataFrame(rows, columns=GAP_COLUMNS))


def curve_areas(summary: pd.DataFrame) -> pd.DataFrame:
    """Area under each (measure, curve) of mean ΔPPL, trapezoid rule over the rates given, as fractions
    (rate / 100), from the first rate to the last: with the default rates (1..50 %) a constant ΔPPL of 1 has
    area 0.49. The area starts at 0 only when rate 0 is among the rates (there ΔPPL is 0 exactly: nothing
    is masked). One rate gives area 0 (a curve of one point has no width; the CLI prints n/a).
    Returns columns ``measure, curve, area``.
    """
    rows = [
        (measure, curve, float(np.trapezoid(group["delta_ppl"], group["rate"] / 100.0)))
        for (measure, curve), group in summary.sort_values("rate").groupby(["measure", "curve"], sort=False)
    ]
    return _ordered(pd.DataFrame(rows, columns=["measure", "curve", "area"]))


def order_check(table: pd.DataFrame, order: Sequence[str] = PAPER_ORDER, value: str = "area") -> pd.DataFrame:
    """Does each adjacent pair of ``order`` keep the paper's order? One row per curve (and rate) and pair.

    ``table``: :func:`curve_areas` (``value="area"``) or :func:`summarize` (``value="delta_ppl"``, one
    check per rate). Comprehensiveness: the later measure should score higher; sufficiency: lower.
    Columns ``curve, [rate,] lower, higher, relation`` with relation ``holds``, ``fails`` or ``equal``
    (equal values, e.g. measures that rank alike); pairs with a missing measure are left out.
    """
    by = ["curve"] + (["rate"] if "rate" in table else [])
    rows = []
    for keys, group in table.groupby(by, sort=False):
        scores = dict(zip(group["measure"], group[value]))
        for first, second in zip(order, order[1:]):
            if first in scores and second in scores:
                a, b = scores[first], scores[second]
                better = a < b if group["curve"].iloc[0] == "comprehensiveness" else a > b
                relation = "equal" if a == b else "holds" if better else "fails"
                rows.append((*keys, first, second, relation))
    return pd.DataFrame(rows, columns=[*by, "lower", "higher", "relation"])


def _ordered(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows by curve, then measure in :data:`ALL_MEASURES` order, then rate."""
    keys = {"_curve": frame["curve"].map(CURVES.index), "_measure": frame["measure"].map(ALL_MEASURES.index)}
    by = list(keys) + (["rate"] if "rate" in frame else [])
    return frame.assign(**keys).sort_values(by, kind="stable").drop(columns=list(keys)).reset_index(drop=True)
