"""Scaling the sink's value (docs/METHOD.md section 4): what λ does to the head outputs and the perplexity.

An intervention multiplies the sink's value v_σ (so ṽ_σ^h in every head) by λ in chosen layers, attention kept,
through :class:`cwviz.core.method.interventions.ScaleValues`; the shared model is never modified.
:func:`intervene_on_sink` compares the head outputs' norms and semantic cone (:func:`head_output_stats`) and the
perplexity before and after, in one forward pass that records nothing; :func:`removal_perplexity` and
:func:`layerwise_removal` give the perplexity alone, batched over sets of layers.

Apart from :mod:`cwviz.analyses.sinks` (which reads one recorded pass and runs none) because each λ is a forward pass
of its own.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from ..core.defaults import DEFAULT_FACTOR, DEFAULT_SINK
from ..core.method.analysis import Analysis
from ..core.method.interventions import ScaleValues, ScaleValuesPerItem, also, batch_perplexity, observed_pass
from ..core.method.measures import head_grams, head_output_norms, semantic_cone
from ..core.util.errors import InputError, SelectionError
from ..core.util.progress import Progress, counted, phase
from .sinks import resolve_sink

#: The largest abs(λ): a larger factor overflows the scaled values (float16 tops out at 65,504; beyond 3.4e38
#: not even float32 holds it), and a value scaled 10,000 times is far past any intervention worth measuring.
MAX_FACTOR = 1e4


#: A change of perplexity counts as one (:func:`raised_ppl`) only above this share of the clean perplexity: the
#: λ = 1 pass, which changes nothing, differs from the clean one by float noise (about 1e-5 of it).
PPL_TOLERANCE = 1e-3


def raised_ppl(ppl: np.ndarray, clean: np.ndarray, tolerance: float = PPL_TOLERANCE) -> int:
    """How many prompts' perplexity ``ppl`` [prompt] exceeds the clean one ``clean`` [prompt] by more than
    ``tolerance`` × the clean one (:data:`PPL_TOLERANCE`): a raise, not float noise."""
    ppl, clean = np.asarray(ppl, dtype=np.float64), np.asarray(clean, dtype=np.float64)
    return int((ppl - clean > tolerance * np.abs(clean)).sum())


def check_factor(factor) -> float:
    """λ as a float: a finite real number (not a bool, not text) of at most :data:`MAX_FACTOR` in size, else
    InputError."""
    if isinstance(factor, (bool, np.bool_)) or not isinstance(factor, (int, float, np.integer, np.floating)):
        raise InputError(f"the sink value factor λ must be a number, not {factor!r} ({type(factor).__name__})")
    if not math.isfinite(factor):
        raise InputError(f"the sink value factor λ must be a finite number, not {factor}")
    if abs(factor) > MAX_FACTOR:
        raise InputError(
            f"the sink value factor λ must lie between -{MAX_FACTOR:g} and {MAX_FACTOR:g} (larger overflows the "
            f"model's numbers), not {factor:g}"
        )
    return float(factor)


@dataclass(frozen=True)
class SinkIntervention:
    """The effect of scaling the sink's projected value by ``factor`` in ``layers``.

    ``table``: one row per layer (every layer, intervened or not, since later layers feel earlier
    changes) with ``intervened, output_norm_before, output_norm_after, output_norm_change,
    cone_before, cone_after, cone_change``; output norms are ‖o_i^h‖ averaged over heads and the
    queries that see the sink and another key, cones are :func:`semantic_cone` averaged over heads.
    Before is the analysis's own pass and ``perplexity_clean`` its perplexity: the clean model's for a plain
    analysis, the intervened pass's for one made under an intervention (:func:`intervene_on_sink`).
    """

    sink: int
    factor: float
    layers: tuple[int, ...]
    table: pd.DataFrame
    perplexity_clean: float
    perplexity: float

    @property
    def delta_ppl(self) -> float:
        """PPL(intervened) − PPL(clean) of the prompt (NaN for encoders)."""
        return self.perplexity - self.perplexity_clean


def _layers(analysis: Analysis, layers: Iterable[int] | None) -> tuple[int, ...]:
    if layers is None:
        return tuple(range(analysis.num_layers))
    chosen = tuple(sorted({analysis.check_layer(l) for l in layers}))
    if not chosen:
        raise SelectionError("no layer chosen for the intervention; pick at least one layer")
    return chosen


def _input_ids(analysis: Analysis, batch: int = 1) -> torch.Tensor:
    device = analysis.bundle.input_device
    return torch.tensor([analysis.input_ids] * batch, device=device)


def _sink_positions(analysis: Analysis, layer: int, sink: int) -> torch.Tensor:
    """The queries of ``layer`` that see the sink and another key, bool [query] on the layer's device (the positions
    :func:`head_output_stats` averages over; the mask is the model's own, whatever the values)."""
    visible = analysis.key_mask(layer)
    return visible[:, sink] & (visible.sum(-1) > 1)


def _layer_stats(analysis: Analysis, layer: int, sink: int, z: torch.Tensor) -> dict:
    """One row of :func:`head_output_stats` from ``layer``'s head outputs z [head, query, d_head] (any dtype and
    layout): the one reduction of both sides of :func:`intervene_on_sink`, the records' and the intervened pass's."""
    z = z.float().contiguous()  # (H, Q, d_head): one layout, so both sides run the same arithmetic
    grams = head_grams(analysis.bundle.gram(layer).to(z.device), analysis.num_heads)  # (H, d_head, d_head)
    positions = _sink_positions(analysis, layer, sink).to(z.device)
    norms = head_output_norms(z, grams)  # (H, Q)
    cone = semantic_cone(z, grams, positions, norms)
    return {"layer": layer, "output_norm": float(norms[:, positions].mean()), "cone": float(cone.nanmean())}


def _observed_stats(
    analysis: Analysis, sink: int, intervention: ScaleValues, progress: Progress | None
) -> tuple[pd.DataFrame, float]:
    """:func:`head_output_stats` columns, and the perplexity, of one pass of the prompt under ``intervention`` on top of
    the analysis's own (:attr:`Analysis.intervention`) that records nothing: each layer's outputs are reduced as the
    layer runs (:func:`cwviz.core.method.interventions.observed_pass`)."""
    rows: dict[int, dict] = {}

    def reduce(layer: int, z: torch.Tensor) -> None:
        rows[layer] = _layer_stats(analysis, layer, sink, z[0].transpose(0, 1))  # (1, Q, H, d) -> (H, Q, d)

    perplexity = observed_pass(
        analysis.bundle, analysis.input_ids, reduce, also(analysis.intervention, intervention), progress
    )
    return pd.DataFrame([rows[layer] for layer in range(analysis.num_layers)]), perplexity


def head_output_stats(
    analysis: Analysis, sink: int | str = DEFAULT_SINK, progress: Progress | None = None
) -> pd.DataFrame:
    """Per layer, the mean head-output norm ‖o_i^h‖ and the semantic cone over the queries that see the sink and another
    key: columns ``layer, output_norm, cone``; ``progress(done, L)`` a layer at a time.

    Reduced from the head outputs z the analysis recorded (:meth:`Analysis.recorded_outputs`): no forward pass, and
    the numbers are those of the analysis's own pass, under its intervention if it was made under one
    (``analyze(..., intervention=...)``). The before side of :func:`intervene_on_sink`, which does not depend on λ: a
    caller trying several λ computes it once."""
    sink = resolve_sink(analysis, sink)
    with torch.inference_mode():
        layers = counted(range(analysis.num_layers), analysis.num_layers, progress)
        return pd.DataFrame([_layer_stats(analysis, layer, sink, analysis.recorded_outputs(layer)) for layer in layers])


def intervene_on_sink(
    analysis: Analysis,
    sink: int | str = DEFAULT_SINK,
    factor: float = DEFAULT_FACTOR,
    layers: Iterable[int] | None = None,
    progress: Progress | None = None,
    clean: pd.DataFrame | None = None,
) -> SinkIntervention:
    """Scale the sink's value by ``factor`` (λ; 0 removes ṽ_σ, attention kept) in ``layers`` (None = all)
    and compare head outputs and perplexity with the analysis's own pass.

    Before: the analysis as recorded (:func:`head_output_stats`, :attr:`Analysis.perplexity`), no pass. After: one
    forward pass that repeats the analysis's (its intervention too, :attr:`Analysis.intervention`) with the sink's
    value scaled on top, and records nothing: each layer's head outputs are reduced to the table's two numbers as the
    layer runs, through the same reduction as the before side, so a λ costs about one plain pass of the model. So
    for a plain analysis the change is the λ's against the clean model; for one made under an intervention (e.g. the
    sink already removed) it is the λ's on top of that one, and λ = 1 gives a change of 0 and the analysis's
    perplexity either way (the after pass is then the analysis's own pass, run the same way, with nothing changed; an
    analysis made with ``each_row_block`` computed its z in row blocks, so there it is 0 to float32 rounding).

    ``clean``: :func:`head_output_stats` of ``analysis`` and this sink, when the caller has it (it does not change
    with λ); it is reduced from the records here otherwise. ``progress(done, L)`` (:mod:`cwviz.core.util.progress`) a
    layer at a time of the intervened pass; without ``clean``, ``progress(done, 2 L)``: the records' layers, then
    the intervened pass's."""
    factor = check_factor(factor)
    sink = resolve_sink(analysis, sink)
    chosen = _layers(analysis, layers)
    analysis.check_model()
    intervention = ScaleValues(positions=(sink,), factor=float(factor), layers=frozenset(chosen))
    steps = analysis.num_layers * (1 if clean is not None else 2)
    before = clean if clean is not None else head_output_stats(analysis, sink, phase(progress, 0, steps))
    changed, perplexity = _observed_stats(
        analysis, sink, intervention, phase(progress, steps - analysis.num_layers, steps)
    )
    table = pd.DataFrame(
        {
            "layer": changed["layer"],
            "intervened": [layer in chosen for layer in changed["layer"]],
            "output_norm_before": before["output_norm"].to_numpy(),
            "output_norm_after": changed["output_norm"],
            "output_norm_change": changed["output_norm"] - before["output_norm"].to_numpy(),
            "cone_before": before["cone"].to_numpy(),
            "cone_after": changed["cone"],
            "cone_change": changed["cone"] - before["cone"].to_numpy(),
        }
    )
    return SinkIntervention(
        sink=sink,
        factor=float(factor),
        layers=chosen,
        table=table,
        perplexity_clean=analysis.perplexity,
        perplexity=perplexity,
    )


def removal_perplexity(
    analysis: Analysis,
    layer_sets: Sequence[Iterable[int] | None],
    sink: int | str = DEFAULT_SINK,
    factor: float = DEFAULT_FACTOR,
    max_batch_tokens: int = 8192,
    progress: Progress | None = None,
) -> np.ndarray:
    """The prompt's perplexity with the sink's value scaled by ``factor`` in each of ``layer_sets``
    (None = all layers), [len(layer_sets)]; batched, at most ``max_batch_tokens`` tokens a pass.
    ``progress(done, len(layer_sets))`` is called after each batched pass."""
    if not analysis.bundle.arch.causal:
        return np.full(len(layer_sets), np.nan)
    if analysis.num_tokens < 2:
        raise InputError("perplexity needs at least two tokens; give a longer prompt")
    factor = check_factor(factor)
    sink = resolve_sink(analysis, sink)
    sets = [None if s is None else frozenset(_layers(analysis, s)) for s in layer_sets]
    batch = max(1, max_batch_tokens // analysis.num_tokens)
    bundle = analysis.bundle
    out = []
    for start in range(0, len(sets), batch):
        chunk = tuple(sets[start : start + batch])
        ids = _input_ids(analysis, len(chunk))
        intervention = ScaleValuesPerItem(positions=(sink,), factor=float(factor), layers=chunk)
        out.append(batch_perplexity(bundle, ids, intervention))
        if progress is not None:
            progress(start + len(chunk), len(sets))
    return np.concatenate(out).astype(np.float64)


def layerwise_removal(
    analysis: Analysis, sink: int | str = DEFAULT_SINK, factor: float = DEFAULT_FACTOR, progress: Progress | None = None
) -> pd.DataFrame:
    """ΔPPL of the prompt when the sink's value is scaled by ``factor`` in one layer at a time:
    columns ``layer, perplexity, delta_ppl``. ``progress(done, L)``: layers whose pass has run."""
    ppl = removal_perplexity(analysis, [[l] for l in range(analysis.num_layers)], sink, factor, progress=progress)
    return layerwise_table(analysis, ppl)


def layerwise_table(analysis: Analysis, perplexities: Sequence[float]) -> pd.DataFrame:
    """:func:`layerwise_removal`'s table from the perplexities of layers 0..n-1 (n <= L: a run stopped part-way)."""
    ppl = np.asarray(perplexities, dtype=np.float64)
    return pd.DataFrame({"layer": np.arange(len(ppl)), "perplexity": ppl, "delta_ppl": ppl - analysis.perplexity})
