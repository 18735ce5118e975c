"""Reference code for the sink tests: the split o = s ṽ_σ + (1 − s) m made in d_model space, the plain way, against
which :func:`cwviz.analyses.sinks.sink_norms` (the same numbers through each head's Gram matrix) is checked; and the
sinks intervention the recorded way (a whole analysis of the intervened pass, head outputs recomputed from its
records), against which :func:`cwviz.analyses.sink_interventions.intervene_on_sink` (one pass that records nothing) is
checked."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch

from cwviz.core.defaults import DEFAULT_SINK
from cwviz.core.method.analysis import Analysis, analyze
from cwviz.core.method.interventions import ScaleValues
from cwviz.core.method.measures import expand_kv


@dataclass(frozen=True)
class SinkSplit:
    """One layer's head outputs split into the sink's part and the rest, float32 (on the layer's device).

    | field        | shape                     | meaning                                            |
    |--------------|---------------------------|----------------------------------------------------|
    | sink         | int                       | σ                                                  |
    | sink_ratio   | [head, query]             | s = α_iσ^h (0 where the query cannot see σ)        |
    | sink_value   | [head, d_model]           | ṽ_σ^h                                              |
    | rest_mean    | [head, query, d_model]    | m_i^h (NaN where the query sees no other key)      |
    | head_output  | [head, query, d_model]    | o_i^h                                              |
    | other_keys   | [query]                   | number of keys besides σ the query can see         |
    | sees_sink    | [query]                   | bool: the query can see σ                          |
    """

    sink: int
    sink_ratio: torch.Tensor
    sink_value: torch.Tensor
    rest_mean: torch.Tensor
    head_output: torch.Tensor
    other_keys: torch.Tensor
    sees_sink: torch.Tensor


def sink_split(
    analysis: Analysis,
    layer: int,
    sink: int = DEFAULT_SINK,
    start: int = 0,
    stop: int | None = None,
    alpha: torch.Tensor | None = None,
    *,
    value: torch.Tensor | None = None,
    w: torch.Tensor | None = None,
) -> SinkSplit:
    """Split every head output of ``layer`` at the sink ``sink`` (a position; see :func:`resolve_sink`), for
    the query rows ``start..stop-1`` (default: all; the fields' query axis then has ``stop - start`` rows).
    ``alpha``: those rows' attention [head, rows, key] when the caller has it (:meth:`cwviz.Analysis.rows`; a
    causal block of :meth:`cwviz.Analysis.row_blocks` holds only the keys its rows can see, 0..stop-1);
    ``value`` (expanded per head, float32) and ``w`` (:meth:`cwviz.Analysis.w_heads`): the layer's, when a
    caller reading the layer block by block has made them once."""
    layer = analysis.check_layer(layer)
    sink = analysis.check_token(sink)
    record = analysis.layer_record(layer)
    stop = analysis.num_tokens if stop is None else stop
    with torch.inference_mode():
        if alpha is None:
            alpha = analysis.rows(layer, start, stop).attention
        keys = alpha.shape[-1]  # a causal row block holds keys 0..stop-1 only (Analysis.row_blocks)
        value = expand_kv(record.value.float(), analysis.num_heads) if value is None else value  # (H, K, d_head)
        value = value[:, :keys]
        w = analysis.w_heads(layer) if w is None else w  # (H, D, d_head)
        visible = record.key_mask(start, stop)[:, :keys].cpu()  # (rows, K)
        rest_alpha = alpha.clone()
        rest_alpha[:, :, sink] = 0
        rest_mass = rest_alpha.sum(-1)  # (H, Q)  1 − s, summed directly
        rest_z = rest_alpha @ value  # (H, Q, d_head)
        z = alpha @ value  # (H, Q, d_head)
        head_output = torch.einsum("hqd,hmd->hqm", z, w)  # (H, Q, D)
        rest_sum = torch.einsum("hqd,hmd->hqm", rest_z, w)  # (H, Q, D)  (1 − s) m
        other_keys = visible.sum(-1) - visible[:, sink].long()  # (Q,)
        defined = (other_keys > 0).to(alpha.device)[None, :] & (rest_mass > 0)  # (H, Q)
        rest_mean = torch.where(defined[..., None], rest_sum / rest_mass.clamp_min(1e-38)[..., None], torch.nan)
        return SinkSplit(
            sink=sink,
            sink_ratio=alpha[:, :, sink],
            sink_value=torch.einsum("hmd,hd->hm", w, value[:, sink]),
            rest_mean=rest_mean,
            head_output=head_output,
            other_keys=other_keys,
            sees_sink=visible[:, sink],
        )


def cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Cosine along the last axis; NaN where either vector is zero or NaN."""
    norms = a.norm(dim=-1) * b.norm(dim=-1)
    return torch.where(norms > 0, (a * b).sum(-1) / norms.clamp_min(1e-38), torch.nan)


def cone(head_output: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Mean pairwise cosine of each head's outputs [head, query, d_model] at ``positions`` (i ≠ j), zero outputs left
    out, [head]: the unit vectors summed in d_model space, (‖Σ u_i‖² − n) / (n(n − 1))."""
    out = head_output[:, positions.to(head_output.device)].float()  # (H, P, D)
    norms = out.norm(dim=-1, keepdim=True)
    nonzero = norms > 0
    unit = torch.where(nonzero, out / norms.clamp_min(1e-38), 0.0)
    n = nonzero[..., 0].sum(-1).double()
    total = unit.double().sum(1).pow(2).sum(-1)
    return torch.where(n > 1, (total - n) / (n * (n - 1)).clamp_min(1), torch.nan).float()


def recorded_output_stats(analysis: Analysis, sink: int) -> pd.DataFrame:
    """Per layer, the mean ‖o_i^h‖ and the semantic cone over the queries that see ``sink`` and another key (columns
    ``layer, output_norm, cone``), from ``analysis``'s records: z recomputed in float32 from α and v, then W_O^h."""
    rows = []
    with torch.inference_mode():
        for layer in range(analysis.num_layers):
            visible = analysis.key_mask(layer).cpu()
            positions = visible[:, sink] & (visible.sum(-1) > 1)  # (Q,)
            out = torch.einsum("hqd,hmd->hqm", analysis.head_outputs(layer), analysis.w_heads(layer))  # (H, Q, D)
            norm = out.norm(dim=-1)[:, positions.to(out.device)].mean()
            rows.append({"layer": layer, "output_norm": float(norm), "cone": float(cone(out, positions).nanmean())})
    return pd.DataFrame(rows)


def recorded_intervention(
    analysis: Analysis, sink: int, factor: float, layers: tuple[int, ...] | None
) -> tuple[pd.DataFrame, pd.DataFrame, float]:
    """The intervention as cwviz computed it before its one-pass path: the clean and the intervened
    :func:`recorded_output_stats`, and the intervened pass's perplexity (a whole :func:`cwviz.analyze` under
    :class:`~cwviz.core.method.interventions.ScaleValues`)."""
    chosen = frozenset(range(analysis.num_layers) if layers is None else layers)
    after = analyze(
        analysis.bundle, analysis.text, input_ids=analysis.input_ids, intervention=ScaleValues((sink,), factor, chosen)
    )
    return recorded_output_stats(analysis, sink), recorded_output_stats(after, sink), after.perplexity
