"""Token knockout: input tokens removed from every layer at once, and the logits at the last position
(docs/METHOD.md section 6.6).

Removing token k zeroes its value, hence its projected value ṽ_k^h in every head, for every query in every layer
(:class:`cwviz.core.method.interventions.KeepKeys` with keep weight 0 in key column k, the attention knockout of section
3 applied to a whole column). Attention probabilities are not renormalised; the residual stream at position k itself
stays. Each batch row removes its own set of tokens, so one forward pass runs many knockouts.

The *origin* intervention (docs/METHOD.md section 7.3) replaces token k's input embedding by the mean one, ē
(:func:`cwviz.core.method.effect.mean_embedding`), its position kept: :func:`last_logits` with ``intervention=ORIGIN``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..loading import architectures
from ..loading.models import Bundle
from ..util.errors import InputError
from .capture import forward_pass
from .effect import mean_embedding
from .interventions import KeepKeys

#: The two ways a token is taken away (docs/METHOD.md section 7.3): its value everywhere, or its input embedding.
RELAY, ORIGIN = "relay", "origin"


def removal_masks(removed: Sequence[Sequence[int]], num_tokens: int) -> torch.Tensor:
    """Keep weights [batch, 1, 1, key] (float32, broadcast over heads and queries): row b is 0 in the columns of
    ``removed[b]`` and 1 elsewhere. InputError for a position outside 0 .. ``num_tokens`` - 1."""
    keep = torch.ones(len(removed), 1, 1, num_tokens)
    for row, positions in enumerate(removed):
        positions = list(positions)
        if any(not 0 <= p < num_tokens for p in positions):
            raise InputError(f"a removed token lies outside the prompt's tokens 0..{num_tokens - 1}: {positions}")
        keep[row, 0, 0, positions] = 0.0
    return keep


def last_logits(
    bundle: Bundle,
    input_ids: Sequence[int],
    removed: Sequence[Sequence[int]],
    batch_size: int = 8,
    intervention: str = RELAY,
) -> torch.Tensor:
    """The logits at the last position, float32 [len(removed), vocab] on the CPU, of ``input_ids`` with the tokens of
    each ``removed[b]`` taken away (an empty set: the clean pass), ``batch_size`` rows a pass: knocked out in every
    layer (``RELAY``), or their input embeddings replaced by the mean one (``ORIGIN``).

    Only the last position goes through the output layer: a [batch, T, vocab] tensor never exists (Gemma's
    vocabulary is 262,144 wide)."""
    if batch_size < 1:
        raise InputError(f"the batch size must be at least 1, not {batch_size}")
    if intervention not in (RELAY, ORIGIN):
        raise InputError(f"no intervention {str(intervention)[:80]!r}: choose {RELAY!r} or {ORIGIN!r}")
    ids = torch.tensor([list(input_ids)], device=bundle.input_device)  # (1, T)
    out = []
    with torch.inference_mode():
        embeddings = bundle.model.get_input_embeddings()(ids) if intervention == ORIGIN else None  # (1, T, d_model)
        mean = mean_embedding(bundle).to(ids.device) if intervention == ORIGIN else None
        for start in range(0, len(removed), batch_size):
            chunk = removed[start : start + batch_size]
            keep = removal_masks(chunk, ids.shape[1])  # (B, 1, 1, T): 0 where removed
            if intervention == RELAY:
                with forward_pass(bundle.attention_modules, record=False, intervention=KeepKeys({}, default=keep)):
                    hidden = bundle.final_hidden(ids.expand(len(chunk), -1))  # (B, T, d_model)
            else:
                kept = keep[:, 0, 0, :, None].to(embeddings.device, embeddings.dtype)  # (B, T, 1)
                mixed = embeddings * kept + mean.to(embeddings.dtype) * (1 - kept)
                with forward_pass(bundle.attention_modules, record=False):
                    body = architectures.base_model(bundle.model)
                    hidden = body(inputs_embeds=mixed, use_cache=False).last_hidden_state
            out.append(bundle.output_logits(hidden[:, -1]).float().cpu())  # (B, vocab)
    return torch.cat(out) if out else torch.zeros(0, 0)
