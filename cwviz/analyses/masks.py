"""What a faithfulness run masks (docs/METHOD.md section 3): pure tensor functions from a layer's scores to keep masks.

* :func:`rank_keys` ranks each row's visible keys, best first; scores within :data:`TIE_TOLERANCE` of the row's largest
  |score| tie (chained in sorted order, in float64) and ties keep key order, so a float32 near-tie ranks the same on
  every machine and dtype.
* :func:`maskable` is the sufficiency rule: a query that sees a single key is never masked (nor ranked with the others).
* :func:`masked_counts` is k = min(ceil(r/100 · n), n − 1): no pool (a query's keys) loses every member.
* :func:`scope_ranks` ranks under a scope (query, token, layer) and :func:`keep_mask` turns ranks into keep weights.
"""

from __future__ import annotations

import torch

from ..core.util.errors import InputError
from .schema import RANK_SCOPES

CURVES: tuple[str, ...] = ("comprehensiveness", "sufficiency")
#: Scores closer than this share of the ranked pool's largest |score| tie (docs/METHOD.md section 3, "Ties").
TIE_TOLERANCE = 1e-5


def maskable(visible: torch.Tensor) -> torch.Tensor:
    """The (query, key) pairs a mask may remove, bool [query, key]: the visible ones of queries that see two or more
    keys. A query that sees a single key (query 0 in a causal model: the sink) keeps it under every curve and scope."""
    return visible & (visible.sum(-1, keepdim=True) > 1)


def masked_counts(num_visible: torch.Tensor, rate: float) -> torch.Tensor:
    """Keys to mask per pool: k = min(ceil(rate/100 · n), n − 1), never below 0; rate 0 masks none.

    ``num_visible`` [query] (n_i) or [1, 1] (one pool); returns the same shape, long. A pool keeps at least one member
    (the sufficiency rule, docs/METHOD.md section 3), so a query of one key loses nothing. Rounding to 9 digits first
    keeps 30 % of 10 keys at 3 (float products such as 0.3 · 10 = 3.0000000000000004 would otherwise round up).
    """
    n = num_visible.to(torch.float64)
    if rate <= 0:
        return torch.zeros_like(num_visible, dtype=torch.long)
    k = torch.ceil(torch.round(n * (rate / 100.0), decimals=9))
    return torch.minimum(k, n - 1).clamp_min(0).to(torch.long)


def rank_keys(scores: torch.Tensor, visible: torch.Tensor, tolerance: float = TIE_TOLERANCE) -> torch.Tensor:
    """Rank of each key among the visible keys of its query, 0 = highest score.

    | arg     | shape                        |
    |---------|------------------------------|
    | scores  | [..., query, key]            |
    | visible | broadcastable to ``scores``, bool |
    | return  | [..., query, key] int16 (int32 beyond 32 767 keys) |

    Invisible keys rank after every visible one. Scores within ``tolerance`` × the row's largest visible |score| of
    the next one in sorted order tie (a chain: each joins the group of its neighbour), and ties keep key order; NaN
    ranks last among visible keys. Done in float64 so that a float32 and a float64 copy of the scores rank alike.
    """
    s = scores.double()
    visible = visible.expand_as(s)
    finite = visible & ~torch.isnan(s)
    top = torch.where(finite, s.abs(), 0.0).amax(-1, keepdim=True)  # (..., Q, 1)
    lowest = torch.finfo(torch.float64).min
    ordered = torch.where(finite, s, lowest).masked_fill(~visible, float("-inf"))
    order = torch.argsort(ordered, dim=-1, descending=True, stable=True)  # (..., Q, K) best first
    values = ordered.gather(-1, order)
    gap = values[..., :-1] - values[..., 1:]  # (..., Q, K-1) >= 0
    kind = torch.where(finite, 0, torch.where(visible, 1, 2)).gather(-1, order)  # 0 score, 1 NaN, 2 invisible
    new = (gap > tolerance * top) | (kind[..., 1:] != kind[..., :-1])  # a new group starts after position p
    group = torch.cat([torch.zeros_like(kind[..., :1]), new.long().cumsum(-1)], dim=-1)  # (..., Q, K) in sorted order
    key_group = torch.empty_like(group).scatter_(-1, order, group)  # (..., Q, K) by key
    keys = torch.arange(s.shape[-1], device=s.device)
    final = torch.argsort(key_group * s.shape[-1] + keys, dim=-1, stable=True)  # groups best first, key order within
    positions = keys.expand_as(final)
    ranks = torch.empty_like(final).scatter_(-1, final, positions)
    return ranks.to(torch.int16 if s.shape[-1] <= torch.iinfo(torch.int16).max else torch.int32)


def keep_mask(
    ranks: torch.Tensor,
    counts: torch.Tensor,
    num_visible: torch.Tensor,
    curve: str,
    visible: torch.Tensor | None = None,
) -> torch.Tensor:
    """Keep weights (True = keep) for one curve, bool [..., query, key].

    ``ranks`` [..., query, key] from :func:`rank_keys` (or :func:`scope_ranks`); ``counts`` (k) and ``num_visible``
    (n, the size of what was ranked together): [query] (one per query, the query scope) or [query, 1] / [1, 1]
    (one pool for every query: the token and layer scopes). Comprehensiveness masks ranks 0..k-1 (the most
    important), sufficiency ranks n-k..n-1 (the least important). Keys a query cannot see are always kept (their
    attention is 0 anyway): by their rank (n or more) in the query and layer scopes, by ``visible`` [query, key] in
    the token scope, where a key's one rank holds for every query.
    """
    ranks = ranks.long()
    if counts.dim() == 1:
        counts, num_visible = counts[:, None], num_visible[:, None]
    if curve == "comprehensiveness":
        keep = ranks >= counts
    elif curve == "sufficiency":
        keep = (ranks < (num_visible - counts)) | (ranks >= num_visible)
    else:
        raise ValueError(f"curve must be one of {', '.join(CURVES)}, not {curve!r}")
    return keep if visible is None else keep | ~visible


def scope_ranks(scores: torch.Tensor, visible: torch.Tensor, scope: str = "query") -> tuple[torch.Tensor, torch.Tensor]:
    """The ranks of one layer's ``scores`` [..., query, key] under a ranking scope, and the size of each ranked pool.

    | scope | ranks [..., query, key] | pool |
    | --- | --- | --- |
    | query | each key among its query's visible keys (:func:`rank_keys`) | [query]: n_i |
    | token | each key among all keys by its mean score over the queries that see it (one rank a row) | [1, 1]: seen |
    | layer | each visible (query, key) pair among all the layer's visible pairs | [1, 1]: visible pairs |

    ``visible`` bool [query, key] (what may be masked: :func:`maskable`). A scope's masks then take the top (bottom)
    ceil(r · pool) of its ranking (:func:`masked_counts`, :func:`keep_mask`).
    """
    visible = visible.to(scores.device)
    if scope == "query":
        return rank_keys(scores, visible), visible.sum(-1)
    if scope == "token":
        s = scores.double().masked_fill(~visible, 0.0)
        seen = visible.sum(-2)  # (K,) queries that see each key
        key_scores = s.sum(-2) / seen.clamp_min(1)  # (..., K): the mean over the queries that see the key
        ranks = rank_keys(key_scores[..., None, :], (seen > 0)[None, :])  # (..., 1, K)
        return ranks.expand(*scores.shape), (seen > 0).sum().reshape(1, 1)
    if scope == "layer":
        flat = rank_keys(scores.flatten(-2)[..., None, :], visible.flatten()[None, :])  # (..., 1, Q*K)
        return flat.reshape(scores.shape), visible.sum().reshape(1, 1)
    raise InputError(f"rank_scope must be one of {', '.join(RANK_SCOPES)}, not {scope!r}")
