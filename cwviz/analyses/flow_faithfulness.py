"""Which attribution method says what the model does? The fair test pre-registered in docs/METHOD.md section 7.3
(protocol version 2; version 1, section 6.6, judged the share flow alone).

Per item (a text cut to ``max_tokens``; p its last position), one record (:func:`item_payload`, run through the sweep
runner :mod:`cwviz.analyses.sweep` by ``cwviz flow-faithfulness``): the target (the top next token at p) and foil (the
second), LD = logit(target) − logit(foil), every input token's effect Δ_k = LD(clean) − LD(token k taken away) under
both interventions (relay: its value in every layer; origin: its input embedding replaced by the mean one; k = 0 ..
p − 1, :mod:`cwviz.core.method.knockout`), every registry member's scores (:mod:`cwviz.core.method.attribution`; no
member is named here), and the comprehensiveness and sufficiency drops of each member's ranking by |score| over the
ranked tokens 1 .. p − 1, under both interventions.

The statistics, means and verdicts computed from the records are :mod:`cwviz.analyses.flow_verdicts`'s; this module
holds the protocol's constants, the rankings and the removal sets, and one item's record.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from fractions import Fraction

import numpy as np
import torch

from ..core.defaults import FLOW_BATCH_SIZE, FLOW_DRAWS, FLOW_MAX_TOKENS
from ..core.method import attribution
from ..core.method.analysis import analyze
from ..core.method.knockout import last_logits
from ..core.util.errors import InputError
from .codecs.checks import FLOW_FAITHFULNESS
from .faithfulness import example_ids
from .schema import FLOW_MIN_TOKENS

#: The sub-folder of ``--results DIR`` holding the records (of :data:`cwviz.analyses.codecs.checks.FLOW_FAITHFULNESS`).
RECORDS_FOLDER = FLOW_FAITHFULNESS.name
#: The files ``cwviz flow-faithfulness --results DIR`` writes: the verdicts, each method's means, and each item's
#: primary ρ per method and intervention (the per-item table docs/flow.md publishes).
CSV_NAME = "flow_faithfulness.csv"
METHODS_CSV_NAME = "flow_faithfulness_methods.csv"
ITEMS_CSV_NAME = "flow_faithfulness_items.csv"
#: The method every other member is compared with, and the control's name.
FOCUS, CONTROL = "effect", "random"
INTERVENTIONS = attribution.INTERVENTIONS
CURVES = ("comprehensiveness", "sufficiency")
RATES: tuple[float, ...] = (10.0, 30.0)
#: The token cap, knockouts per forward pass, random rankings per item and the fewest tokens an item needs (fewer:
#: skipped): :mod:`cwviz.analyses.schema`, where the command line's parser reads them.
DEFAULT_MAX_TOKENS, DEFAULT_BATCH_SIZE, DRAWS, MIN_TOKENS = (
    FLOW_MAX_TOKENS,
    FLOW_BATCH_SIZE,
    FLOW_DRAWS,
    FLOW_MIN_TOKENS,
)
#: Scores closer than this share of an item's largest |score| tie; ties keep position order (earlier first).
TIE_TOLERANCE = 1e-6
#: Bumped when what an item's record means changes, so a resume refuses records of another version (2: section 7.3).
VERSION = 2


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
    """The control's ``draws`` uniform score vectors [n], each seeded by (seed, example, draw): the same on every
    rerun."""
    return [np.random.default_rng([seed, example, draw]).random(n) for draw in range(draws)]


# -- one item ---------------------------------------------------------------
def top_two(logits) -> tuple[int, int]:
    """The target and foil: the largest and second-largest logit, equal logits taken in token-id order."""
    values = np.asarray(logits, dtype=np.float64)
    order = np.lexsort((np.arange(len(values)), -values))
    return int(order[0]), int(order[1])


def skipped(tokens: int, why: str) -> dict:
    return FLOW_FAITHFULNESS.encode({"skipped": True, "why": why, "tokens": tokens})


def members(bundle, names: Sequence[str] | None = None) -> dict[str, attribution.Method]:
    """The registry members an item scores (default: every member that runs on ``bundle``), by name."""
    chosen = attribution.METHODS if names is None else {name: attribution.check_method(name) for name in names}
    return {name: method for name, method in chosen.items() if method.available(bundle) is None}


def item_payload(
    bundle,
    text: str,
    example: int = 0,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    seed: int = 0,
    draws: int = DRAWS,
    batch_size: int = DEFAULT_BATCH_SIZE,
    methods: Mapping[str, attribution.Method] | None = None,
) -> dict:
    """One item's record payload (module docstring). ``methods``: the members scored, by name (default
    :func:`members`). Skipped (``skipped`` true, ``why``) when the item has fewer than :data:`MIN_TOKENS` tokens after
    the cap, or its target and foil tie exactly."""
    methods = members(bundle) if methods is None else methods
    ids = example_ids(bundle, text, max_tokens)
    if ids is None or len(ids) < MIN_TOKENS:
        return skipped(0 if ids is None else len(ids), f"fewer than {MIN_TOKENS} tokens")
    analysis = analyze(bundle, input_ids=ids)
    p = n = len(ids) - 1  # the input tokens are 0 .. p - 1; the ranked ones 1 .. p - 1
    clean = last_logits(bundle, ids, [()])[0]
    target, foil = top_two(clean.numpy())
    if clean[target] == clean[foil]:
        return skipped(len(ids), "target and foil tie")
    asked = attribution.Request(analysis, p, target, foil)
    scores = {
        name: np.asarray(attribution.run(method, asked).scores, dtype=np.float64)[:n]
        for name, method in methods.items()
    }
    random = random_scores(seed, example, draws, n)
    ranked = slice(1, n)  # the ranked tokens: the first and the predicted position left out (section 7.3)
    plans = {name: _shifted(removal_sets(np.abs(s[ranked]))) for name, s in scores.items()}
    random_plans = [_shifted(removal_sets(r[ranked])) for r in random]
    full = tuple(range(n))
    sets = [(k,) for k in range(n)] + [full] + [s for plan in (*plans.values(), *random_plans) for s in plan.values()]
    unique = list(dict.fromkeys(sets))
    ld_clean = float(clean[target] - clean[foil])
    logp_clean = float(torch.log_softmax(clean.double(), -1)[target])
    effects, logp_effects, full_drops, curves = {}, {}, {}, {}
    for intervention in INTERVENTIONS:
        logits = last_logits(bundle, ids, unique, batch_size, intervention)  # (set, vocab)
        ld = (logits[:, target] - logits[:, foil]).double().numpy()
        logp = torch.log_softmax(logits.double(), -1)[:, target].numpy()
        drop = {s: ld_clean - float(v) for s, v in zip(unique, ld)}
        effects[intervention] = [drop[(k,)] for k in range(n)]
        logp_effects[intervention] = [logp_clean - float(logp[unique.index((k,))]) for k in range(n)]
        full_drops[intervention] = drop[full]
        made = {name: _curve(plan, drop) for name, plan in plans.items()}
        made[CONTROL] = {
            curve: {f"{rate:g}": float(np.mean([drop[plan[curve, rate]] for plan in random_plans])) for rate in RATES}
            for curve in CURVES
        }
        curves[intervention] = made
    return FLOW_FAITHFULNESS.encode(
        {
            "skipped": False,
            "tokens": len(ids),
            "target": target,
            "foil": foil,
            "ld_clean": ld_clean,
            "logp_clean": logp_clean,
            "full_drop": full_drops,
            "effects": effects,
            "logp_effects": logp_effects,
            "scores": {name: [float(v) for v in s] for name, s in scores.items()},
            "signed": sorted(name for name, method in methods.items() if method.signed),
            "random_scores": [[float(v) for v in s] for s in random],
            "curves": curves,
        }
    )


def _shifted(plan: dict) -> dict:
    """A removal plan over the ranked tokens 1 .. p − 1 (indices from 0) as prompt positions."""
    return {key: tuple(i + 1 for i in removed) for key, removed in plan.items()}


def _curve(plan: dict, drop: dict) -> dict:
    return {curve: {f"{rate:g}": drop[plan[curve, rate]] for rate in RATES} for curve in CURVES}


def check_methods(names: Sequence[str]) -> tuple[str, ...]:
    """The names of ``--methods``, checked against the registry (InputError naming the choices)."""
    for name in names:
        attribution.check_method(name)
    if FOCUS not in names:
        raise InputError(f"the methods compared must include {FOCUS!r}, which every comparison is made with")
    return tuple(names)
