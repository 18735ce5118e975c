"""A check on the user's own prompt (issue 54, docs/METHOD.md section 7.3 on one item): every input token taken away
in turn, the measured effects beside a method's scores, and the test's statistics on them.

The effects are those ``cwviz flow-faithfulness`` measures (:func:`cwviz.core.method.knockout.last_logits`: Δ_k =
LD(clean) − LD(token k taken away), LD = logit(target) − logit(foil) at the position, the target's logit alone without
a foil), for the input tokens 0 .. p − 1; the statistics are the test's own (:func:`cwviz.analyses.flow_verdicts.
per_item`): ρ of |score| with |Δ| over tokens 1 .. p − 1, and for a signed method the signed ρ and the top-3 sign
agreement. ``cwviz flow --check`` and the Flow page's "Check against knockouts" call :func:`check`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..core.defaults import FLOW_BATCH_SIZE
from ..core.method import attribution
from ..core.method.knockout import last_logits
from ..core.util.errors import InputError
from ..core.util.progress import Progress
from . import flow_verdicts


@dataclass(frozen=True)
class Check:
    """A method's scores beside the measured effects of one prompt. ``scores``, ``effects``: [p] over the input tokens
    0 .. p − 1 (an effect not measured, after a stop: NaN); ``rho``: ρ(|score|, |Δ|) over tokens 1 .. p − 1;
    ``rho_signed`` and ``sign_agreement``: NaN for an unsigned method; ``complete``: every effect was measured."""

    method: str
    intervention: str
    signed: bool
    scores: np.ndarray
    effects: np.ndarray
    rho: float
    rho_signed: float
    sign_agreement: float
    complete: bool

    def sentence(self) -> str:
        """One line: what was measured and how well the scores follow it."""
        measured = int(np.isfinite(self.effects).sum())
        head = f"{measured} of {len(self.effects)} knockouts ({self.intervention})"
        if not self.complete:
            head += ", stopped"
        size = f"ρ(|score|, |effect|) = {_number(self.rho)}"
        if not self.signed:
            return f"{head}: {size} (an unsigned method: no sign to check)"
        return (
            f"{head}: {size}; signed ρ = {_number(self.rho_signed)}; top-3 sign agreement {_share(self.sign_agreement)}"
        )


def _number(value: float) -> str:
    return "n/a" if not math.isfinite(value) else f"{value:+.2f}"


def _share(value: float) -> str:
    return "n/a" if not math.isfinite(value) else f"{value:.0%}"


def effects(
    request: attribution.Request,
    intervention: str = attribution.RELAY,
    batch_size: int = FLOW_BATCH_SIZE,
    progress: Progress | None = None,
    stop: Callable[[], bool] | None = None,
    keep: Callable[[np.ndarray], None] | None = None,
) -> tuple[np.ndarray, bool]:
    """Δ_k for the input tokens k = 0 .. p − 1 of ``request`` ([p] float64) and whether all were measured:
    ``batch_size`` knockouts a forward pass (the prompt cut after p: later tokens cannot change a causal prediction at
    p), ``progress(done, total)`` after each pass, ``stop()`` asked before each (true: the rest stay NaN). ``keep``:
    given a copy of the effects so far after each pass, before ``progress`` (a page whose run is interrupted keeps
    them)."""
    analysis, p = request.analysis, request.position
    if not analysis.bundle.has_logits:
        raise InputError(
            "the check measures knockouts of a next-token prediction; an encoder has none: choose a causal model"
        )
    if p < 1:
        raise InputError("the check needs at least one input token before the position: choose a later position")
    ids = analysis.input_ids[: p + 1]
    target, foil = request.target, request.foil
    clean = last_logits(analysis.bundle, ids, [()])[0]
    ld_clean = float(clean[target] - (0 if foil is None else clean[foil]))
    out = np.full(p, np.nan)
    batches = range(0, p, batch_size)
    for done, start in enumerate(batches, start=1):
        if stop is not None and stop():
            return out, False
        removed = [(k,) for k in range(start, min(p, start + batch_size))]
        logits = last_logits(analysis.bundle, ids, removed, batch_size, intervention).double()
        ld = logits[:, target] - (0 if foil is None else logits[:, foil])
        out[start : start + len(removed)] = ld_clean - ld.numpy()
        if keep is not None:
            keep(out.copy())
        if progress is not None:
            progress(done, len(batches))
    return out, True


def check(
    request: attribution.Request,
    method: str = "effect",
    intervention: str | None = None,
    measured: np.ndarray | None = None,
    batch_size: int = FLOW_BATCH_SIZE,
    progress: Progress | None = None,
    stop: Callable[[], bool] | None = None,
) -> Check:
    """``method``'s scores of ``request`` against the measured effects of ``intervention`` (default: the first one the
    method answers, section 7.2). ``measured``: effects already measured for this request and intervention (a page's
    cache: a method changed needs no new knockouts)."""
    chosen = attribution.check_method(method)
    intervention = chosen.intervention if intervention is None else intervention
    if intervention not in attribution.INTERVENTIONS:
        raise InputError(
            f"no intervention {str(intervention)[:80]!r}: choose one of {', '.join(attribution.INTERVENTIONS)}"
        )
    complete = True
    if measured is None:
        measured, complete = effects(request, intervention, batch_size, progress, stop)
    scores = np.asarray(attribution.run(chosen, request).scores, np.float64)[: request.position]
    done = np.isfinite(measured)
    stats = flow_verdicts.per_item(np.where(done, scores, np.nan), measured, chosen.signed)
    return Check(
        method=chosen.name,
        intervention=intervention,
        signed=chosen.signed,
        scores=scores,
        effects=measured,
        rho=stats.rho,
        rho_signed=stats.rho_signed,
        sign_agreement=stats.sign_agreement,
        complete=complete and bool(done.all()),
    )
