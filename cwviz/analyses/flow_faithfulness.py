"""Is the signed flow faithful? The causal test pre-registered in docs/METHOD.md section 6.6.

Per item (a text cut to ``max_tokens``; t its last position), one record (:func:`item_payload`, run through the sweep
runner :mod:`cwviz.analyses.sweep` by ``cwviz flow-faithfulness``): the target (the top next token at t) and foil (the
second), the logit difference LD = logit(target) − logit(foil), every input token's knockout effect
Δ_k = LD(clean) − LD(token k removed) (k = 0 .. t − 1; removal: :mod:`cwviz.core.method.knockout`), each method's scores
of the input tokens, and the comprehensiveness and sufficiency drops of each method's ranking.

From the records, torch-free: :func:`item_statistics` (per item and method: Spearman's ρ with the effects, the drops,
AOPC), :func:`method_table` (means, intervals, normalised AOPC) and :func:`verdict_table` (the pre-registered
paired comparisons, each holds / fails / unresolved as ``cwviz claims`` judges: :mod:`cwviz.analyses.claims`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from fractions import Fraction

import numpy as np
import pandas as pd
import torch

from ..core.method import baselines
from ..core.method.analysis import analyze
from ..core.method.flow import token_totals
from ..core.method.knockout import last_logits
from .claim_items import spearman
from .claims import MIN_ITEMS, UNRESOLVED, mean_interval, verdict
from .codecs import FLOW_FAITHFULNESS
from .faithfulness import example_ids
from .schema import FLOW_BATCH_SIZE, FLOW_DRAWS, FLOW_MAX_TOKENS, FLOW_MIN_TOKENS

#: The sub-folder of ``--results DIR`` holding the records (of :data:`cwviz.analyses.codecs.FLOW_FAITHFULNESS`).
RECORDS_FOLDER = FLOW_FAITHFULNESS.name
#: The files ``cwviz flow-faithfulness --results DIR`` writes: the verdicts, and each method's means.
CSV_NAME = "flow_faithfulness.csv"
METHODS_CSV_NAME = "flow_faithfulness_methods.csv"
#: The methods in report order; ``flow_abs`` ranks by the flow's size, ``random`` is the control.
METHODS = ("flow", "flow_abs", "alti", "rollout", "raw", "random")
#: Methods whose scores are signed: correlated with the signed effects (the others with the effects' size).
SIGNED = frozenset({"flow"})
BASELINES = ("alti", "rollout", "raw")
CURVES = ("comprehensiveness", "sufficiency")
RATES: tuple[float, ...] = (10.0, 30.0)
#: The token cap, knockouts per forward pass, random rankings per item and the fewest tokens an item needs (fewer:
#: skipped): :mod:`cwviz.analyses.schema`, where the command line's parser reads them.
DEFAULT_MAX_TOKENS, DEFAULT_BATCH_SIZE, DRAWS, MIN_TOKENS = FLOW_MAX_TOKENS, FLOW_BATCH_SIZE, FLOW_DRAWS, FLOW_MIN_TOKENS
#: Scores closer than this share of an item's largest |score| tie; ties keep position order (earlier first).
TIE_TOLERANCE = 1e-6
#: Bumped when what an item's record means changes, so a resume refuses records of another version.
VERSION = 1
#: The pre-registered comparisons (first, second): > 0 means the first is more faithful.
COMPARISONS: tuple[tuple[str, str], ...] = (
    ("flow", "alti"),
    ("flow", "rollout"),
    ("flow", "raw"),
    ("flow", "random"),
    ("alti", "random"),
    ("rollout", "random"),
    ("raw", "random"),
    ("flow_abs", "alti"),
    ("flow_abs", "random"),
)
SECONDARY_METHODS = frozenset({"flow_abs"})
#: The primary statistics; the per-rate rows are reported alongside.
PRIMARY = ("rho", "aopc_comprehensiveness", "aopc_sufficiency")
STATISTICS = (
    "rho",
    *(f"{curve}@{rate:g}" for curve in CURVES for rate in RATES),
    "aopc_comprehensiveness",
    "aopc_sufficiency",
)
#: Statistics where larger is more faithful (the others: sufficiency, smaller is).
LARGER_IS_BETTER = frozenset({"rho", "aopc_comprehensiveness", *(f"comprehensiveness@{r:g}" for r in RATES)})
CSV_COLUMNS = ["statistic", "first", "second", "primary", "verdict", "estimate", "ci_low", "ci_high", "n", "evidence"]
METHOD_COLUMNS = ["method", "statistic", "mean", "ci_low", "ci_high", "n", "normalised"]


# -- rankings (torch-free) ------------------------------------------------------------------------------
def ranking(scores: np.ndarray) -> np.ndarray:
    """The token order of ``scores`` [n], largest first: scores within :data:`TIE_TOLERANCE` × max |score| of each other
    (on one grid) tie, and ties keep position order (earlier first). NaN ranks last."""
    scores = np.asarray(scores, dtype=np.float64)
    top = np.nanmax(np.abs(scores)) if np.isfinite(scores).any() else 0.0
    steps = np.round(scores / (TIE_TOLERANCE * top)) if top > 0 else np.zeros_like(scores)
    steps = np.where(np.isnan(steps), -np.inf, steps)
    return np.argsort(-steps, kind="stable")


def removed_count(n: int, rate: float) -> int:
    """k = ceil(rate/100 · n), at least 1 and at most n (exact: 30 % of 10 is 3)."""
    return min(n, max(1, math.ceil(Fraction(str(rate)) * n / 100)))


def removal_sets(scores: np.ndarray, rates: Sequence[float] = RATES) -> dict[tuple[str, float], tuple[int, ...]]:
    """The tokens each curve removes at each rate: comprehensiveness the top k of :func:`ranking`, sufficiency the
    bottom k (the last k of the same order), each sorted by position."""
    order = ranking(scores)
    out = {}
    for rate in rates:
        k = removed_count(len(order), rate)
        out["comprehensiveness", rate] = tuple(sorted(int(i) for i in order[:k]))
        out["sufficiency", rate] = tuple(sorted(int(i) for i in order[-k:]))
    return out


def random_scores(seed: int, example: int, draws: int, n: int) -> list[np.ndarray]:
    """The control's ``draws`` uniform score vectors [n], each seeded by (seed, example, draw): the same on every rerun."""
    return [np.random.default_rng([seed, example, draw]).random(n) for draw in range(draws)]


# -- one item ---------------------------------------------------------------
def top_two(logits) -> tuple[int, int]:
    """The target and foil: the largest and second-largest logit, equal logits taken in token-id order."""
    values = np.asarray(logits, dtype=np.float64)
    order = np.lexsort((np.arange(len(values)), -values))
    return int(order[0]), int(order[1])


def skipped(tokens: int, why: str) -> dict:
    return FLOW_FAITHFULNESS.encode({"skipped": True, "why": why, "tokens": tokens})


def item_payload(
    bundle,
    text: str,
    example: int = 0,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    seed: int = 0,
    draws: int = DRAWS,
    batch_size: int = DEFAULT_BATCH_SIZE,
    flow: Callable | None = None,
) -> dict:
    """One item's record payload (module docstring). ``flow(analysis, position, target, foil) -> [T]``: the signed
    flow's token totals (default :func:`cwviz.core.method.flow.token_totals`). Skipped (``skipped`` true, ``why``) when the
    item has fewer than :data:`MIN_TOKENS` tokens after the cap, or its target and foil tie exactly."""
    flow = token_totals if flow is None else flow
    ids = example_ids(bundle, text, max_tokens)
    if ids is None or len(ids) < MIN_TOKENS:
        return skipped(0 if ids is None else len(ids), f"fewer than {MIN_TOKENS} tokens")
    analysis = analyze(bundle, input_ids=ids)
    t = n = len(ids) - 1  # the input tokens are 0 .. t - 1
    clean = last_logits(bundle, ids, [()])[0]
    target, foil = top_two(clean.numpy())
    if clean[target] == clean[foil]:
        return skipped(len(ids), "target and foil tie")
    scores = {"flow": np.asarray(flow(analysis, t, target, foil), dtype=np.float64)[:n]}
    scores |= {name: baselines.BASELINES[name](analysis, t).astype(np.float64)[:n] for name in BASELINES}
    ranked = {"flow": scores["flow"], "flow_abs": np.abs(scores["flow"]), **{name: scores[name] for name in BASELINES}}
    draws_ = random_scores(seed, example, draws, n)
    plans = {name: removal_sets(s) for name, s in ranked.items()}
    random_plans = [removal_sets(s) for s in draws_]
    full = tuple(range(n))
    sets = [(k,) for k in range(n)] + [full]
    sets += [s for plan in (*plans.values(), *random_plans) for s in plan.values()]
    unique = list(dict.fromkeys(sets))
    logits = last_logits(bundle, ids, unique, batch_size)  # (set, vocab)
    ld = (logits[:, target] - logits[:, foil]).double().numpy()
    logp = torch.log_softmax(logits.double(), -1)[:, target].numpy()
    ld_clean = float(clean[target] - clean[foil])
    logp_clean = float(torch.log_softmax(clean.double(), -1)[target])
    drop = {s: ld_clean - float(v) for s, v in zip(unique, ld)}
    logp_drop = {s: logp_clean - float(v) for s, v in zip(unique, logp)}
    curves = {name: _curve(plan, drop) for name, plan in plans.items()}
    curves["random"] = {
        curve: {f"{rate:g}": float(np.mean([drop[p[curve, rate]] for p in random_plans])) for rate in RATES} for curve in CURVES
    }
    return FLOW_FAITHFULNESS.encode(
        {
            "skipped": False,
            "tokens": len(ids),
            "target": target,
            "foil": foil,
            "ld_clean": ld_clean,
            "logp_clean": logp_clean,
            "full_drop": drop[full],
            "effects": [drop[(k,)] for k in range(n)],
            "logp_effects": [logp_drop[(k,)] for k in range(n)],
            "scores": {name: [float(v) for v in s] for name, s in scores.items()},
            "random_scores": [[float(v) for v in s] for s in draws_],
            "curves": curves,
        }
    )


def _curve(plan: dict, drop: dict) -> dict:
    return {curve: {f"{rate:g}": drop[plan[curve, rate]] for rate in RATES} for curve in CURVES}


# -- from records to statistics and verdicts (torch-free) ------------------------------------------------
def method_scores(record: dict) -> dict[str, np.ndarray]:
    """The scores each method correlates with the effects: the flow signed, ``flow_abs`` its size, the baselines."""
    scores = {name: np.asarray(v, dtype=np.float64) for name, v in record["scores"].items()}
    return {"flow": scores["flow"], "flow_abs": np.abs(scores["flow"]), **{name: scores[name] for name in BASELINES}}


def correlation(method: str, scores: np.ndarray, effects: np.ndarray) -> float:
    """Spearman's ρ of a method's scores with the effects: signed methods with the signed effects, unsigned ones with
    their size (docs/METHOD.md section 6.6 (a))."""
    return spearman(scores, effects if method in SIGNED else np.abs(effects))


def item_statistics(records: Sequence[dict], effect: str = "effects") -> pd.DataFrame:
    """One row per finished item (index: its example number), columns (method, statistic) for :data:`METHODS` and
    :data:`STATISTICS`. ``effect``: ``"effects"`` (Δ logit difference, primary) or ``"logp_effects"`` (Δ log p of
    the target, secondary: ρ only, the drops are of the logit difference)."""
    rows = {}
    for record in records:
        if record.get("skipped"):
            continue
        effects = np.asarray(record[effect], dtype=np.float64)
        row = {}
        for name, scores in method_scores(record).items():
            row[name, "rho"] = correlation(name, scores, effects)
        rhos = [correlation("random", np.asarray(s), effects) for s in record["random_scores"]]
        row["random", "rho"] = float(np.nanmean(rhos)) if np.isfinite(rhos).any() else math.nan
        for name in METHODS:
            curves = record["curves"][name]
            for curve in CURVES:
                values = [float(curves[curve][f"{rate:g}"]) for rate in RATES]
                for rate, value in zip(RATES, values):
                    row[name, f"{curve}@{rate:g}"] = value
                row[name, f"aopc_{curve}"] = float(np.mean(values))
        rows[record["example"]] = row
    columns = pd.MultiIndex.from_product([METHODS, STATISTICS], names=["method", "statistic"])
    return pd.DataFrame.from_dict(rows, orient="index").reindex(columns=columns).sort_index()


def full_drop(records: Sequence[dict]) -> float:
    """D, the mean over finished items of LD(clean) − LD(every input token removed): normalised AOPC's denominator."""
    values = [r["full_drop"] for r in records if not r.get("skipped")]
    return float(np.mean(values)) if values else math.nan


def method_table(records: Sequence[dict], seed: int = 0, effect: str = "effects") -> pd.DataFrame:
    """Each method's mean of each statistic over the items, its 95 % bootstrap interval and n; ``normalised``: the
    mean divided by :func:`full_drop` for the drops and AOPCs (NaN for ρ, and where D ≤ 0)."""
    stats = item_statistics(records, effect)
    scale = full_drop(records)
    rows = []
    for method in METHODS:
        values = stats[method].to_numpy(np.float64) if len(stats) else np.zeros((0, len(STATISTICS)))
        mean, low, high, n = mean_interval(values, seed) if len(values) else (None, None, None, 0)
        for i, statistic in enumerate(STATISTICS):
            m = float(mean[i]) if n else math.nan
            normalised = m / scale if statistic != "rho" and scale > 0 else math.nan
            rows.append(
                {
                    "method": method,
                    "statistic": statistic,
                    "mean": m,
                    "ci_low": float(low[i]) if n else math.nan,
                    "ci_high": float(high[i]) if n else math.nan,
                    "n": int(np.isfinite(values[:, i]).sum()) if n else 0,
                    "normalised": normalised,
                }
            )
    return pd.DataFrame(rows, columns=METHOD_COLUMNS)


def _text(estimate: float, low: float, high: float) -> str:
    return f"{estimate:+.3g} [{low:+.3g}, {high:+.3g}]"


def verdict_table(records: Sequence[dict], seed: int = 0, effect: str = "effects") -> pd.DataFrame:
    """One row per pre-registered comparison (:data:`COMPARISONS`) and statistic (:data:`STATISTICS`): the paired
    difference per item oriented so that > 0 means ``first`` is more faithful (ρ, comprehensiveness: first − second;
    sufficiency: second − first), its mean over the items that give both, the 95 % paired bootstrap interval, and the
    verdict: holds above 0, fails below, unresolved when the interval contains 0, when the two tie on every item, or
    with fewer than :data:`cwviz.analyses.claims.MIN_ITEMS` items. ``primary``: a :data:`PRIMARY` statistic of a
    comparison without a secondary method."""
    stats = item_statistics(records, effect)
    rows = []
    for first, second in COMPARISONS:
        for statistic in STATISTICS:
            a = stats[first, statistic].to_numpy(np.float64) if len(stats) else np.zeros(0)
            b = stats[second, statistic].to_numpy(np.float64) if len(stats) else np.zeros(0)
            sign = 1.0 if statistic in LARGER_IS_BETTER else -1.0
            diff = sign * (a - b)
            diff = diff[np.isfinite(diff)]
            primary = statistic in PRIMARY and first not in SECONDARY_METHODS
            if len(diff):
                (m,), (lo,), (hi,), n = mean_interval(diff[:, None], seed)
            else:
                m = lo = hi = math.nan
                n = 0
            tie = bool(len(diff)) and bool(np.all(diff == 0))
            if n < MIN_ITEMS:
                result, evidence = UNRESOLVED, f"too few items to decide ({n} < {MIN_ITEMS})"
            elif tie:
                result, evidence = UNRESOLVED, "tie on every item"
            else:
                result = verdict(lo, hi)
                evidence = f"{first} − {second} {_text(m, lo, hi)}" if sign > 0 else f"{second} − {first} {_text(m, lo, hi)}"
            rows.append(
                {
                    "statistic": statistic,
                    "first": first,
                    "second": second,
                    "primary": primary,
                    "verdict": result,
                    "estimate": float(m),
                    "ci_low": float(lo),
                    "ci_high": float(hi),
                    "n": int(n),
                    "evidence": evidence,
                }
            )
    return pd.DataFrame(rows, columns=CSV_COLUMNS)


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
        f"{row.statistic}: {row.first} vs {row.second}: {row.verdict.upper()}: {row.evidence} (n={row.n})"
        for row in shown.itertuples(index=False)
    )
