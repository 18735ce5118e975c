"""Forward passes with interventions inside the attention function, and their perplexity.

Both interventions act through cwviz's registered attention function (:mod:`cwviz.core.method.capture`), only for
the calling thread and only inside the call; the shared model is never modified, so its logits are
the clean ones afterwards (tested).

* :class:`ScaleValues`: v_p ← λ v_p at chosen key positions in chosen layers (attention kept).
  Since ṽ_p^h = W_O^h v_p^{g(h)}, λ = 0 removes the sink's projected value in every head.
  :class:`ScaleValuesPerItem` does the same with chosen layers per batch item (many interventions a pass).
* :class:`KeepKeys`: multiply each attention probability by a keep weight (0 removes key j's write
  to query i in every head, docs/METHOD.md section 3); probabilities are not renormalised.
* :class:`Both`: one intervention, then another in the same pass (an analysis made under one, changed again).

:func:`observed_pass` runs one such pass recording nothing: each layer's head outputs are handed to a reduction as
the layer runs (what the sinks intervention compares), and the perplexity comes out as an analysis computes it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..loading.inputs import token_ids
from ..loading.models import Bundle
from ..util.errors import InputError
from ..util.progress import Progress
from .capture import Intervention, Observe, forward_pass
from .logprobs import logprobs_from_hidden, perplexity_of, prompt_logprobs


@dataclass(frozen=True)
class ScaleValues:
    """Scale the values of ``positions`` by ``factor`` in ``layers`` (None = every layer)."""

    positions: tuple[int, ...] = (0,)
    factor: float = 0.0
    layers: frozenset[int] | None = None

    def values(self, layer: int, value: torch.Tensor) -> torch.Tensor:
        if self.factor == 1.0 or (self.layers is not None and layer not in self.layers):
            return value
        value = value.clone()
        value[..., list(self.positions), :] *= self.factor  # (B, H_kv, K, d)
        return value

    def keep(self, layer: int, num_queries: int, num_keys: int) -> torch.Tensor | None:
        return None


@dataclass(frozen=True)
class ScaleValuesPerItem:
    """Like :class:`ScaleValues`, but batch item b is changed only in ``layers[b]`` (None = every layer), so one
    batched pass runs many interventions."""

    positions: tuple[int, ...]
    factor: float
    layers: tuple[frozenset[int] | None, ...]

    def values(self, layer: int, value: torch.Tensor) -> torch.Tensor:
        # value (B, H_kv, K, d)
        rows = [b for b, chosen in enumerate(self.layers) if chosen is None or layer in chosen]
        if not rows or self.factor == 1.0:
            return value
        scale = torch.ones(value.shape[0], 1, value.shape[2], 1, dtype=value.dtype, device=value.device)
        scale[torch.tensor(rows)[:, None], 0, torch.tensor(self.positions)[None, :], 0] = self.factor
        return value * scale

    def keep(self, layer: int, num_queries: int, num_keys: int) -> torch.Tensor | None:
        return None


@dataclass(frozen=True)
class KeepKeys:
    """Keep weights per layer: ``masks[layer]`` broadcastable to [batch, head, query, key].

    A layer missing from ``masks`` runs unchanged; ``default`` applies to every other layer.
    """

    masks: dict[int, torch.Tensor]
    default: torch.Tensor | None = None

    def values(self, layer: int, value: torch.Tensor) -> torch.Tensor:
        return value

    def keep(self, layer: int, num_queries: int, num_keys: int) -> torch.Tensor | None:
        return self.masks.get(layer, self.default)


@dataclass(frozen=True)
class Both:
    """``first``, then ``then``, in one pass: the values ``first`` gives are what ``then`` scales, and the keep weights
    of both multiply (a layer neither changes runs as it is)."""

    first: Intervention
    then: Intervention

    def values(self, layer: int, value: torch.Tensor) -> torch.Tensor:
        return self.then.values(layer, self.first.values(layer, value))

    def keep(self, layer: int, num_queries: int, num_keys: int) -> torch.Tensor | None:
        keeps = [k for k in (i.keep(layer, num_queries, num_keys) for i in (self.first, self.then)) if k is not None]
        return None if not keeps else keeps[0] if len(keeps) == 1 else keeps[0] * keeps[1]


def also(before: Intervention | None, then: Intervention) -> Intervention:
    """``then`` on top of ``before`` (None: the model as it is): the intervention of a pass that repeats one made under
    ``before`` and changes it by ``then``."""
    return then if before is None else Both(before, then)


def logits(bundle: Bundle, input_ids: torch.Tensor, intervention=None) -> torch.Tensor:
    """Logits [batch, pos, vocab] of ``input_ids`` [batch, pos] under ``intervention`` (None = clean)."""
    device = bundle.input_device
    with torch.inference_mode(), forward_pass(bundle.attention_modules, record=False, intervention=intervention):
        return bundle.model(input_ids=input_ids.to(device), use_cache=False).logits


def observed_pass(
    bundle: Bundle, input_ids: list[int], observe: Observe, intervention=None, progress: Progress | None = None
) -> float:
    """One forward pass of ``input_ids`` (one sequence) under ``intervention`` (None = clean) that records nothing:
    ``observe(layer, z)`` sees each attention layer's output z [1, query, head, d_head] (the output projection's input,
    model dtype) as the layer runs, and ``progress(done, L)`` is told after each layer. Returns the prompt's
    perplexity, as :attr:`cwviz.core.method.analysis.Analysis.perplexity` computes it from the same pass (NaN for a
    model without next-token logits, or one token).

    Why not :func:`cwviz.analyze` with the intervention: its records ([head, T, d_head] a layer) and the measures
    recomputed from them cost several times the pass itself, for a caller that keeps one number a layer."""
    ids = torch.tensor([list(input_ids)])
    with (
        torch.inference_mode(),
        forward_pass(
            bundle.attention_modules, record=False, intervention=intervention, progress=progress, observe=observe
        ),
    ):
        hidden = bundle.final_hidden(ids)[0]  # (T, d_model)
    return perplexity_of(prompt_logprobs(bundle, hidden, input_ids))  # as the analysis's: NaN without logits


def batch_logprobs(bundle: Bundle, input_ids, intervention=None) -> torch.Tensor:
    """log p(token_{t+1} | tokens ..t) of each sequence, [batch, pos - 1] float32 on the CPU, under
    ``intervention`` (None = clean).

    ``input_ids``: a list of ids (one sequence) or a [batch, pos] tensor of equal-length sequences.
    Computed as :attr:`cwviz.core.method.analysis.Analysis.next_token_logprobs` is: the base model's final hidden
    states, then the output layer a chunk of rows at a time (no [batch, pos, vocab] logits are kept).
    """
    ids = torch.as_tensor(input_ids) if isinstance(input_ids, torch.Tensor) else torch.tensor(token_ids(input_ids))
    if ids.dim() == 1:
        ids = ids[None]
    if ids.dim() != 2 or ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise InputError(
            f"input_ids must be a list of ids or a [batch, pos] integer tensor, not {ids.dim()}-D {ids.dtype}"
        )
    if ids.shape[1] < 2:
        raise InputError("perplexity needs at least two tokens; give a longer text")
    vocab = getattr(bundle.model.config, "vocab_size", None)
    if vocab is not None and ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        raise InputError(f"token ids must lie in 0..{vocab - 1} for this model")
    with torch.inference_mode(), forward_pass(bundle.attention_modules, record=False, intervention=intervention):
        hidden = bundle.final_hidden(ids)
        return torch.stack([logprobs_from_hidden(h, bundle.output_logits, row) for h, row in zip(hidden, ids)])


def batch_perplexity(bundle: Bundle, input_ids, intervention=None) -> np.ndarray:
    """Perplexity of each sequence, [batch] float64, under ``intervention`` (None = clean): of
    :func:`batch_logprobs`, as :attr:`cwviz.core.method.analysis.Analysis.perplexity` is computed."""
    return np.array([perplexity_of(row) for row in batch_logprobs(bundle, input_ids, intervention)])
