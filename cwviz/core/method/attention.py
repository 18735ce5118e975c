"""The attention maths of one layer: α from the recorded queries and keys, as the model computes it.

Softmax attention exactly as PyTorch's SDPA computes it (:func:`attention_probabilities`), or, for a layer with
soft-capping or learned sinks, as the model's own eager attention does; the causal fast paths that compute only the
rows' visible keys (:func:`causal_rows`, a block of rows; the whole triangle of one sequence); and the weighted values
z = Σ_j α_ij keep_ij v_j that the seam (:mod:`cwviz.core.method.capture`) returns in place of SDPA's output for an
intervention or a capped or sunk layer (:func:`weighted_values`). Pure tensor functions of their arguments: nothing
here knows transformers; the seam and the readers of a record (:mod:`cwviz.core.method.row_blocks`) call them.
"""

from __future__ import annotations

import torch

from .measures import expand_kv, kv_entries
from .row_block_sizes import triangle_row_blocks, weighted_row_block_height


def attention_probabilities(
    query: torch.Tensor,
    key: torch.Tensor,
    scaling: float,
    mask: torch.Tensor | None,
    causal: bool,
    softcap: float | None = None,
    learned_sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Softmax attention exactly as SDPA computes it (or, with ``softcap`` or ``learned_sinks``, as the model's own
    eager attention does), in the dtype of ``query``.

    | arg    | shape                              |
    |--------|------------------------------------|
    | query  | [..., head, query, d_head]     |
    | key    | [..., kv_head, key, d_head]    |
    | mask   | broadcastable to [..., head, query, key], bool (True = attend) or additive |
    | learned_sinks | [head], learned sink logits        |
    | return | [..., head, query, key]    |

    Grouped-query keys are shared by ``head // (heads / kv_heads)``. ``softcap`` c (Gemma 2): the scaled scores
    become c tanh(scores / c) before the mask is added. ``learned_sinks`` (gpt-oss): each head's learned logit joins
    every row's softmax as one more column, which is then dropped: the row sums to 1 minus the sink's share.
    """
    heads, num_queries, d_head = query.shape[-3:]
    groups = heads // key.shape[-3]
    num_keys = key.shape[-2]
    if softcap is not None or learned_sinks is not None:
        return _capped_or_sunk(query, key, scaling, mask, causal, softcap, learned_sinks)
    if query.dim() == 3 and mask is None and causal and num_queries == num_keys:
        return _causal_probabilities(query, key, scaling)
    if mask is None and causal:
        # SDPA's is_causal aligns the mask top-left.
        mask = torch.ones(num_queries, num_keys, dtype=torch.bool, device=query.device).tril()
    if mask is not None and mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=query.dtype, device=query.device).masked_fill_(~mask, float("-inf"))
    if query.dim() == 3 and (mask is None or mask.dim() == 2):
        # One layer of one sequence: the heads of a group share their key, so stack their queries
        # (H_kv, groups * Q, d) instead of copying the key per head; scale, product and mask in one call.
        stacked = query.reshape(key.shape[0], groups * num_queries, d_head)
        if mask is None:
            scores = torch.bmm(stacked, key.transpose(1, 2)).mul_(scaling)
        else:
            bias = mask.to(query.dtype).repeat(groups, 1) if groups > 1 else mask.to(query.dtype)
            scores = torch.baddbmm(bias, stacked, key.transpose(1, 2), alpha=scaling)
        scores = scores.view(heads, num_queries, num_keys)
    else:
        if groups > 1:
            key = key.repeat_interleave(groups, dim=-3)
        scores = torch.matmul(query, key.transpose(-1, -2)).mul_(scaling)  # (..., H, Q, K)
        if mask is not None:
            scores = scores.add_(mask.to(query.dtype))
    return torch.softmax(scores, dim=-1)


def _capped_or_sunk(
    query: torch.Tensor,
    key: torch.Tensor,
    scaling: float,
    mask: torch.Tensor | None,
    causal: bool,
    softcap: float | None,
    learned_sinks: torch.Tensor | None,
) -> torch.Tensor:
    """:func:`attention_probabilities` with soft-capping and/or learned sinks, in the order of the models' own
    eager attention (Gemma 2: scale, cap, add the mask, softmax; gpt-oss: scale, add the mask, append the sink
    logit, softmax, drop the sink's column)."""
    heads, num_queries, _ = query.shape[-3:]
    num_keys = key.shape[-2]
    scores = torch.matmul(query, expand_kv(key, heads).transpose(-1, -2)) * scaling  # (..., H, Q, K)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if mask is None and causal:
        mask = torch.ones(num_queries, num_keys, dtype=torch.bool, device=query.device).tril()
    if mask is not None:
        mask = mask.to(query.device)
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask.to(scores.dtype)
    if learned_sinks is None:
        return torch.softmax(scores, dim=-1)
    # (..., H, Q, 1)
    sink = learned_sinks.to(scores.device, scores.dtype).view(heads, 1, 1).expand(*scores.shape[:-1], 1)
    return torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]


def weighted_values(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    causal: bool,
    scaling: float,
    softcap: float | None,
    learned_sinks: torch.Tensor | None,
    keep: torch.Tensor | None,
) -> torch.Tensor:
    """z_i^h = Σ_j α_ij^h keep_ij v_j^h in float32, returned in the query's dtype as (B, Q, H, d), as every
    attention function returns: the path for interventions (α from the unchanged scores, not renormalised)
    and for soft-capped or learned-sink layers. Computed a row block at a time
    (:func:`cwviz.core.method.row_block_sizes.weighted_row_block_height`), so no [B, H, T, T] map is made for a long
    prompt.

    query (B, H, Q, d); key, value (B, H_kv, K, d); mask None or (B, 1, Q, K); keep broadcastable to (B, H, Q, K).
    """
    batch, heads, num_queries, _ = query.shape
    num_keys = key.shape[-2]
    key, value = key.float(), expand_kv(value.float(), heads)
    rows = weighted_row_block_height(batch, heads, num_keys)
    out = torch.empty(batch, heads, num_queries, value.shape[-1], dtype=torch.float32, device=query.device)
    for start in range(0, num_queries, rows):
        stop = min(num_queries, start + rows)
        if mask is not None:
            block_mask = mask[..., start:stop, :]
        elif causal:  # SDPA's is_causal aligns the mask top-left: query i sees keys 0..i
            block_mask = (
                torch.arange(num_keys, device=query.device)[None, :]
                <= torch.arange(start, stop, device=query.device)[:, None]
            )
        else:
            block_mask = None
        alpha = attention_probabilities(
            query[..., start:stop, :].float(),
            key,
            scaling,
            block_mask,
            False,
            softcap=softcap,
            learned_sinks=learned_sinks,
        )
        if keep is not None:
            block_keep = keep[..., start:stop, :] if keep.dim() >= 2 and keep.shape[-2] == num_queries else keep
            alpha.mul_(block_keep.to(alpha.device))  # alpha is fresh: masked in place, bool weights cast on the fly
        out[:, :, start:stop] = torch.matmul(alpha, value)  # (B, H, rows, d)
    return out.to(query.dtype).transpose(1, 2).contiguous()


def causal_rows(query: torch.Tensor, key: torch.Tensor, scaling: float, start: int, copies: int = 1) -> torch.Tensor:
    """α of the query rows ``start..start+R-1`` of a causal layer (no explicit mask) against the keys ``0..K-1``.

    | arg    | shape                         |
    |--------|-------------------------------|
    | query  | [head, R, d_head]             |
    | key    | [kv_head * copies, K, d_head] |
    | return | [head, R, K]                  |

    Row ``start + r`` sees keys ``0..start+r``; later keys get exactly 0, as the softmax of -inf gives. The
    same scores, scaling and softmax as :func:`attention_probabilities`, in fewer passes over the block: the
    heads of a group are stacked against their shared key (``copies``: the key holds each kv head that many times,
    and the stacked rows are cut into runs, one a copy; :func:`~cwviz.core.method.measures.grouped_matmul`), the scaling
    is the product's own factor, and only the keys from ``start + 1`` on (the block's diagonal part) are masked.
    """
    heads, rows, d_head = query.shape
    key = kv_entries(key, heads * rows, copies)
    entries, keys, _ = key.shape
    stacked = query.reshape(entries, heads * rows // entries, d_head)  # (entries, run, d)
    scores = torch.empty(entries, stacked.shape[1], keys, dtype=query.dtype, device=query.device)
    scores.baddbmm_(stacked, key.transpose(1, 2), beta=0.0, alpha=scaling)
    scores = scores.view(heads, rows, keys)
    if start + 1 < keys:
        later = (
            torch.arange(start + 1, keys, device=query.device)[None, :]
            > torch.arange(start, start + rows, device=query.device)[:, None]
        )
        scores[:, :, start + 1 :].masked_fill_(later, float("-inf"))  # (R, K - start - 1), broadcast over heads
    return torch.softmax(scores, dim=-1)


def _causal_probabilities(query: torch.Tensor, key: torch.Tensor, scaling: float) -> torch.Tensor:
    """The causal case of :func:`attention_probabilities` for one sequence, [head, T, T].

    Only the blocks of rows on and below the diagonal are computed (about half the products and
    exponentials): for the query rows [s, e) the scores against keys 0..e-1 go straight into the output,
    the diagonal block is masked and the softmax is taken over those keys; keys at e and after get
    exactly 0, as the softmax of -inf gives. Same scores, scaling and softmax as the dense path.
    """
    heads, num_tokens, _ = query.shape
    keys_t = expand_kv(key, heads).transpose(1, 2)  # (H, d, T); copying the keys per head is O(T d)
    blocks = triangle_row_blocks(num_tokens)
    rows = blocks[0][1] if blocks else 0
    future = torch.ones(rows, rows, dtype=torch.bool, device=query.device).triu_(1)  # the diagonal block's mask
    out = torch.empty(heads, num_tokens, num_tokens, dtype=query.dtype, device=query.device)
    for start, end in blocks:
        scores = torch.bmm(query[:, start:end], keys_t[:, :, :end]).mul_(scaling)
        scores[:, :, start:].masked_fill_(future[: end - start, : end - start], float("-inf"))
        torch.softmax(scores, dim=-1, out=out[:, start:end, :end])
        out[:, start:end, end:].zero_()
    return out
