"""What the flow reads through the output layer at its position p (docs/METHOD.md section 6): the vocabulary's size,
the model's own logits at p, and each head's vocabulary there (its write at p through the frozen final norm and the
output layer: its most promoted and suppressed tokens, computed when first read).

:func:`cwviz.core.method.flow.flow_basis` calls these once per analysis and position; the flow's routing does not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from .flow_tables import Deferred
from .state import ModelState

if TYPE_CHECKING:
    from ..loading.models import Bundle
    from .analysis import Analysis
    from .residual import Stream


def vocabulary_size(bundle: Bundle) -> int:
    """The tokens the model's output layer scores (an encoder without one: its config's vocabulary)."""
    head = bundle.model.get_output_embeddings()
    return head.weight.shape[0] if head is not None else int(bundle.model.config.vocab_size)


def own_logits(analysis: Analysis, stream: Stream) -> torch.Tensor:
    """The model's own logits at p [vocab], float32: its output layer, scaling and soft-cap on the final output."""
    device = analysis.bundle.model.get_output_embeddings().weight.device
    with torch.inference_mode():
        return analysis.bundle.output_logits(stream.final_output[None].to(device))[0].float()


def head_vocabulary(analysis: Analysis, stream: Stream, writes: np.ndarray, count: int) -> Deferred:
    """Each head's write at p read through the frozen final norm and the output layer: the rows (layer, head,
    direction, rank, token id, token, logit) of its ``count`` most promoted and most suppressed tokens, on first use.

    The final norm is applied now ([layer x head, d_model], small); the product with the output layer ([layer x head,
    vocab]: for a small model with a large vocabulary the largest product of the flow, 0.1-0.2 s on two cores for the
    embedded model) and the top-k wait until the vocabulary is first read (``Flow.vocabulary``, ``heads``,
    ``vocabulary_table``), after a check that the model is as it was (ModelChangedError otherwise)."""
    flat = torch.from_numpy(writes.reshape(-1, writes.shape[-1]))
    if stream.final_norm is not None:
        norm = stream.final_norm
        flat = type(norm)(norm.scale.cpu().expand(flat.shape[0]), norm.gain.cpu(), None, norm.centred).apply(flat)
    head, decode, state = (
        analysis.bundle.model.get_output_embeddings(),
        analysis.bundle.tokenizer.decode,
        ModelState(analysis.bundle),
    )
    shape = (*writes.shape[:2], count)

    def rows() -> tuple[tuple, ...]:
        state.check()
        with torch.inference_mode():
            logits = flat.to(head.weight.device) @ head.weight.float().T  # (layer * head, vocab)
            top, bottom = logits.topk(count, -1), logits.topk(count, -1, largest=False)
        vocab = tuple(x.reshape(shape).cpu().numpy() for x in (top.indices, top.values, bottom.indices, bottom.values))
        return _vocabulary_rows(vocab, decode)

    return Deferred(rows)


def head_writes(analysis: Analysis, stream: Stream, position: int, at_p: dict[int, torch.Tensor]) -> np.ndarray:
    """Each head's write at p [layer, head, d_model], float32: its recorded output z_p^h through W_O^h, landed in the
    residual (L_p^l). ``at_p``: each layer's z_p [head, d_head] where the stream's pass kept it (empty: read from the
    analysis's records)."""
    layers, heads = analysis.num_layers, analysis.num_heads
    writes = np.zeros((layers, heads, analysis.info.d_model), np.float32)
    for layer in range(layers):
        z = at_p[layer] if at_p else analysis.recorded_outputs(layer)[:, position].float()  # (H, dh)
        w_heads = analysis.w_heads(layer)  # (H, D, dh)
        landed = stream.layers[layer].landing.apply(torch.einsum("hdk,hk->hd", w_heads, z.to(w_heads.device)))
        writes[layer] = landed.cpu().numpy()
    return writes


def _vocabulary_rows(vocab, decode) -> tuple[tuple, ...]:
    """(layer, head, direction, rank, token id, token, logit) for each head's promoted and suppressed tokens."""
    top_ids, top_logits, bottom_ids, bottom_logits = vocab
    rows = []
    for direction, ids, logits in (("promoted", top_ids, top_logits), ("suppressed", bottom_ids, bottom_logits)):
        for (layer, head, rank), token in np.ndenumerate(ids):
            rows.append(
                (layer, head, direction, rank, int(token), decode([int(token)]), float(logits[layer, head, rank]))
            )
    return tuple(rows)
