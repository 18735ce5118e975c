"""The measures of docs/METHOD.md section 2: pure tensor math, float32, one layer at a time.

Notation (docs/METHOD.md): α attention, v_j^h = x_j W_V + b_V the value of key j for head h,
ṽ_j^h = W_O^h v_j^h its projected value, o_i^h = Σ_j α_ij^h ṽ_j^h the head output and
o_i = Σ_h o_i^h the layer output (without b_O).

No tensor of shape [query, key, head, d_model] is ever built. With the Gram matrix
G^h = (W_O^h)ᵀ W_O^h and z_i^h = Σ_j α_ij^h v_j^h:

* ‖ṽ_j^h‖² = v_j^hᵀ G^h v_j^h
* ⟨o_i^h, ṽ_j^h⟩ = (z_i^h G^h) · v_j^h        (intra-head)
* ⟨o_i,   ṽ_j^h⟩ = ((W_O^h)ᵀ o_i) · v_j^h     (inter-head)

so a layer costs two extra [query, d_head] x [d_head, key] products per head, the order of attention
itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..util.errors import InputError
from ..vocabulary import KINDS, check_kind
from .row_block_sizes import triangle_row_blocks

#: Names accepted by :meth:`LayerMeasures.per_head` and :meth:`LayerMeasures.layer_level`.
MEASURES: tuple[str, ...] = (
    "raw",
    "value_weighted",
    "value_weighted_output_normalized",
    "value_weighted_output_normalized_intra",
    "contribution_intra",
    "contribution_inter",
)

#: How each measure is aggregated over heads for the layer-level score (docs/METHOD.md section 2).
LAYER_AGGREGATION: dict[str, str] = {
    "raw": "mean",
    "value_weighted": "sum",
    "value_weighted_output_normalized": "sum",  # shares the denominator ‖o_i‖, so heads add up
    "value_weighted_output_normalized_intra": "mean",
    "contribution_intra": "mean",
    "contribution_inter": "sum",  # Σ_h Σ_j C_ij^h = 1
}


def head_weights(w_o: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Split W_O [d_model, head * d_head] into per-head slices [head, d_model, d_head] (float32)."""
    d_model, width = w_o.shape
    return w_o.float().reshape(d_model, num_heads, width // num_heads).permute(1, 0, 2)


def full_gram(w_o: torch.Tensor) -> torch.Tensor:
    """G = W_Oᵀ W_O, float32 [head * d_head, head * d_head]; block (h, h) is G^h = (W_O^h)ᵀ W_O^h."""
    w = w_o.float()
    return w.t() @ w


def expand_kv(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """[..., kv_head, pos, d_head] -> [..., head, pos, d_head]: head h reads kv head h // (heads / kv_heads)."""
    groups = num_heads // x.shape[-3]
    return x.repeat_interleave(groups, dim=-3) if groups > 1 else x


def causal_product(x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out = weight ⊙ (x @ y)`` for a causal ``weight`` (zero above the diagonal), lower triangle only.

    | arg    | shape                        |
    |--------|------------------------------|
    | x      | [kind * head, T, n]          |
    | y      | [kind * head, n, T]          |
    | weight | [head, T, T], broadcast over kinds |
    | out    | [kind, head, T, T]           |

    Per row block, one batched product against the keys the block can see, multiplied by the weight
    straight into ``out``; keys after the block get exactly 0.
    """
    kinds, heads, num_tokens, _ = out.shape
    for start, end in triangle_row_blocks(num_tokens):
        block = torch.bmm(x[:, start:end], y[:, :, :end]).view(kinds, heads, end - start, end)
        torch.mul(block, weight[:, start:end, :end], out=out[:, :, start:end, :end])
        out[:, :, start:end, end:].zero_()
    return out


def kv_copies(kv_heads: int, heads: int, device: torch.device | str, threads: int | None = None) -> int:
    """How many times a layer read in row blocks holds each kv head's keys and values (1 to heads / kv_heads), so
    that the blocks' batched products (:func:`grouped_matmul`) keep ``threads`` CPU threads (default: torch's)
    equally busy.

    PyTorch's bmm on a CPU hands whole batch entries to its threads: the embedded model's 3 kv heads (9 heads)
    are 3 entries, which leave one of two threads idle for a third of each product, and 9 entries per head
    leave it idle for a ninth. Held twice, they are 6 entries of 1.5 heads' rows each. This picks the fewest
    copies whose entries spread most evenly over the threads (:func:`cwviz.core.method.row_blocks.for_row_blocks`
    holds them).
    On other devices (one kernel for a whole batch) 1: nothing is copied.
    """
    if torch.device(device).type != "cpu":
        return 1
    threads = threads or torch.get_num_threads()

    def evenness(copies: int) -> float:
        entries = kv_heads * copies
        return entries / (threads * -(-entries // threads))

    return max(range(1, heads // kv_heads + 1), key=lambda copies: (evenness(copies), -copies))


def kv_entries(y: torch.Tensor, rows: int, copies: int = 1) -> torch.Tensor:
    """What of ``y`` (kv heads held ``copies`` times in a row, :func:`expand_kv` to kv_heads x copies) serves ``rows``
    stacked query-side rows (all heads' rows, head after head) cut into ``len(y)`` equal runs, one an entry: ``y`` when
    the rows divide into such runs, which then each lie within one kv group, else one copy of each kv head (a strided
    view)."""
    return y if rows % y.shape[0] == 0 else y[::copies]


def grouped_matmul(x: torch.Tensor, y: torch.Tensor, copies: int = 1) -> torch.Tensor:
    """[head, m, n] @ [kv_head * copies, n, p] -> [head, m, p], head h using kv head h // (heads / kv_heads).

    The heads' rows are stacked and cut into runs, one for each entry of ``y`` (:func:`kv_entries`): with
    ``copies`` 1 a kv group's heads share one entry and the kv tensor is never copied per head; with more,
    :func:`kv_copies` evens out the batch over the CPU threads.
    """
    heads, m, _ = x.shape
    y = kv_entries(y, heads * m, copies)
    out = x.reshape(y.shape[0], heads * m // y.shape[0], x.shape[-1]) @ y  # (entries, run, p)
    return out.view(heads, m, y.shape[-1])


@dataclass(frozen=True)
class LayerMeasures:
    """Every quantity of one layer, float32.

    | field | shape | meaning |
    | --- | --- | --- |
    | attention | [head, query, key] | α_ij^h |
    | value | [kv_head, key, d_head] | v_j (shared by the heads of a group; or per head, [head, key, d_head]) |
    | value_norm | [head, key] | ‖ṽ_j^h‖ |
    | head_output | [head, query, d_head] | z_i^h = Σ_j α_ij^h v_j^h (o_proj input) |
    | head_output_norm | [head, query] | ‖o_i^h‖ |
    | output_norm | [query] | ‖o_i‖ |
    | contributions | [kind, head, query, key] | c_ij^h (intra) and C_ij^h (inter), the ``kinds`` computed |
    | pulled | [head, kind, query, d_head] | by :data:`KINDS`: (W_O^h)ᵀ o_i (inter), G^h z_i^h (intra), for ⟨·, v_j^h⟩ |
    | kinds |  | the contribution kinds held, a subset of :data:`KINDS` |

    Dot products and cosines are computed when asked for (one more product per kind), for either kind.
    """

    attention: torch.Tensor
    value: torch.Tensor
    value_norm: torch.Tensor
    head_output: torch.Tensor
    head_output_norm: torch.Tensor
    output_norm: torch.Tensor
    contributions: torch.Tensor
    pulled: torch.Tensor
    kinds: tuple[str, ...] = KINDS

    def _reference_norm(self, kind: str) -> torch.Tensor:
        """‖o_i^h‖ [head, query, 1] for intra, ‖o_i‖ [1, query, 1] for inter."""
        if check_kind(kind) == "intra":
            return self.head_output_norm[:, :, None]
        return self.output_norm[None, :, None]

    def contribution(self, kind: str = "inter") -> torch.Tensor:
        """c_ij^h (intra) or C_ij^h (inter), [head, query, key]."""
        if check_kind(kind) not in self.kinds:
            raise ValueError(f"these measures hold the {' and '.join(self.kinds)} contributions only, not {kind!r}")
        return self.contributions[self.kinds.index(kind)]

    def dot(self, kind: str = "inter") -> torch.Tensor:
        """⟨o_i^h, ṽ_j^h⟩ (intra) or ⟨o_i, ṽ_j^h⟩ (inter), [head, query, key]."""
        return grouped_matmul(self.pulled[:, KINDS.index(check_kind(kind))], self.value.transpose(1, 2))

    def value_weighted(self) -> torch.Tensor:
        """α_ij^h ‖ṽ_j^h‖, [head, query, key]."""
        return self.attention * self.value_norm[:, None, :]

    def norm_ratio(self, kind: str = "inter") -> torch.Tensor:
        """‖ṽ_j^h‖ / ‖o_i‖ (inter) or / ‖o_i^h‖ (intra), [head, query, key]."""
        return self.value_norm[:, None, :] / self._reference_norm(kind)

    def cosine(self, kind: str = "inter") -> torch.Tensor:
        """cos(o_i, ṽ_j^h) (inter) or cos(o_i^h, ṽ_j^h) (intra), [head, query, key]."""
        return self.dot(kind) / (self.value_norm[:, None, :] * self._reference_norm(kind))

    def per_head(self, name: str) -> torch.Tensor:
        """One of :data:`MEASURES` per head, [head, query, key]."""
        if name == "raw":
            return self.attention
        if name == "value_weighted":
            return self.value_weighted()
        if name == "value_weighted_output_normalized":
            return self.value_weighted() / self._reference_norm("inter")
        if name == "value_weighted_output_normalized_intra":
            return self.value_weighted() / self._reference_norm("intra")
        if name == "contribution_intra":
            return self.contribution("intra")
        if name == "contribution_inter":
            return self.contribution("inter")
        raise ValueError(f"unknown measure {name!r}; choose one of: {', '.join(MEASURES)}")

    def layer_level(self, name: str) -> torch.Tensor:
        """The all-heads score of docs/METHOD.md, [query, key] (see :data:`LAYER_AGGREGATION`)."""
        scores = self.per_head(name)
        return scores.sum(0) if LAYER_AGGREGATION[name] == "sum" else scores.mean(0)


def head_grams(gram: torch.Tensor, heads: int) -> torch.Tensor:
    """G^h, the diagonal blocks of G = W_Oᵀ W_O, float32 [head, d_head, d_head]."""
    d_head = gram.shape[0] // heads
    return gram.float().view(heads, d_head, heads, d_head).diagonal(dim1=0, dim2=2).permute(2, 0, 1)


def value_norms(value: torch.Tensor, gram: torch.Tensor, num_heads: int) -> torch.Tensor:
    """‖ṽ_j^h‖ = sqrt(v_jᵀ G^h v_j), float32 [head, key], from values [kv_head, key, d_head] and G
    (:func:`full_gram`)."""
    v = value.float()
    kv_heads, keys, d_head = v.shape
    blocks = head_grams(gram, num_heads).reshape(kv_heads, num_heads // kv_heads, d_head, d_head)
    v_gram = v[:, None] @ blocks  # (H_kv, groups, K, d)
    return (v_gram * v[:, None]).sum(-1).clamp_min(0).sqrt().reshape(num_heads, keys)


@dataclass(frozen=True)
class QuerySide:
    """What the measures need of the queries alone, whatever the keys (float32).

    | field            | shape                    | meaning                                        |
    |------------------|--------------------------|------------------------------------------------|
    | head_output      | [head, query, d_head]    | z_i^h (the o_proj input per head)              |
    | head_output_norm | [head, query]            | ‖o_i^h‖ = sqrt(z_i^hᵀ G^h z_i^h)               |
    | output_norm      | [query]                  | ‖o_i‖ = sqrt(z_iᵀ G z_i)                        |
    | pulled           | [head, kind, query, d_head] | by :data:`KINDS`: (W_O^h)ᵀ o_i = (G z_i)_h, G^h z_i^h |

    :meth:`cwviz.Analysis.row_blocks` makes it once for a whole layer (one [T, H d] x [H d, H d] product
    instead of one per block) and slices it per block with :meth:`rows`.
    """

    head_output: torch.Tensor
    head_output_norm: torch.Tensor
    output_norm: torch.Tensor
    pulled: torch.Tensor

    def rows(self, start: int, stop: int) -> QuerySide:
        """The query rows ``start..stop-1`` (views)."""
        return QuerySide(
            self.head_output[:, start:stop],
            self.head_output_norm[:, start:stop],
            self.output_norm[start:stop],
            self.pulled[:, :, start:stop],
        )


def query_side(head_output: torch.Tensor, gram: torch.Tensor) -> QuerySide:
    """The :class:`QuerySide` of z [head, query, d_head] and G = W_Oᵀ W_O [H d, H d] (:func:`full_gram`)."""
    z = head_output.float()
    heads, queries, d_head = z.shape
    gram = gram.float()
    z_flat = z.transpose(0, 1).reshape(queries, heads * d_head)  # (Q, H*d)  o_proj input
    pulled_inter = z_flat @ gram  # (Q, H*d)  W_Oᵀ o_i, every head's slice
    output_norm = (z_flat * pulled_inter).sum(-1).clamp_min(0).sqrt()  # (Q,)  ‖o_i‖ = sqrt(zᵀ G z)
    z_gram = z @ head_grams(gram, heads)  # (H, Q, d)  G^h z_i^h
    head_output_norm = (z_gram * z).sum(-1).clamp_min(0).sqrt()  # (H, Q)  ‖o_i^h‖
    by_kind = {"inter": pulled_inter.view(queries, heads, d_head).transpose(0, 1), "intra": z_gram}
    pulled = torch.stack([by_kind[kind] for kind in KINDS], dim=1)  # (H, kind, Q, d)
    return QuerySide(z, head_output_norm, output_norm, pulled)


def check_kinds(kinds) -> tuple[str, ...]:
    """``kinds`` as a tuple of distinct names among :data:`KINDS`, at least one, or InputError."""
    kinds = tuple(check_kind(kind) for kind in kinds)
    if not kinds or len(set(kinds)) != len(kinds):
        raise InputError(f"kinds must be distinct names among {KINDS}, not {kinds!r}")
    return kinds


def layer_measures(
    attention: torch.Tensor,
    value: torch.Tensor,
    w_heads: torch.Tensor | None = None,
    head_output: torch.Tensor | None = None,
    gram: torch.Tensor | None = None,
    causal: bool = False,
    value_norm: torch.Tensor | None = None,
    side: QuerySide | None = None,
    kinds: tuple[str, ...] = KINDS,
    copies: int = 1,
) -> LayerMeasures:
    """Compute one layer's measures without materialising projected values per pair.

    | arg         | shape                                                          |
    |-------------|----------------------------------------------------------------|
    | attention   | [head, query, key]                                             |
    | value       | [kv_head * copies, key, d_head] (or already expanded, [head, key, d_head]) |
    | w_heads     | [head, d_model, d_head], used only when ``gram`` is not given  |
    | head_output | optional [head, query, d_head]: z = α v when the caller already has it in float32 |
    | gram        | optional [head * d_head, head * d_head]: W_Oᵀ W_O (:func:`full_gram`), cacheable per model |
    | causal      | ``attention`` is zero above the diagonal: only the lower triangle of the products is computed |
    | value_norm  | optional [head, key]: ‖ṽ_j^h‖ (:func:`value_norms`) when the caller keeps it per layer |
    | side        | optional :class:`QuerySide` of these query rows (then ``head_output`` is not used) |
    | kinds       | the contribution kinds to compute (:data:`KINDS`, or one of them: a third less work) |
    | copies      | ``value`` holds each kv head this many times in a row (:func:`.row_blocks.for_row_blocks`) |

    All inputs are upcast to float32. With the Gram matrix G = W_Oᵀ W_O nothing of width d_model is
    formed: ‖o_i‖² = z_iᵀ G z_i, (W_O^h)ᵀ o_i = (G z_i)_h, and G^h is G's diagonal block. Both
    contribution kinds come from one grouped product: the pulled-back outputs are divided by ‖o‖² first,
    so C = α ⊙ (pulled / ‖o‖²) vᵀ, scaled in place.
    """
    kinds = check_kinds(kinds)
    alpha = attention.float()
    heads, queries, keys = alpha.shape
    held = value.float()
    v = held[::copies]  # (H_kv, K, d)
    kv_heads, _, d_head = v.shape
    if side is None or value_norm is None:
        if gram is None:
            gram = full_gram(w_heads.float().permute(1, 0, 2).reshape(w_heads.shape[1], heads * d_head))
        gram = gram.float()
    if side is None:
        z = grouped_matmul(alpha, held, copies) if head_output is None else head_output  # (H, Q, d)
        side = query_side(z, gram)
    value_norm = value_norms(v, gram, heads) if value_norm is None else value_norm.float()  # (H, K)  ‖ṽ_j^h‖
    pulled = side.pulled  # (H, kind, Q, d)
    reference = {"intra": side.head_output_norm, "inter": side.output_norm.expand(heads, queries)}
    norms = torch.stack([reference[kind] for kind in kinds], dim=1)  # (H, n, Q)
    picked = pulled if kinds == KINDS else pulled[:, [KINDS.index(kind) for kind in kinds]]  # (H, n, Q, d)
    scaled = picked / (norms**2)[..., None]
    n = len(kinds)
    if causal and queries == keys:
        # Only the lower triangle, per row block: (nH, Q, d) @ (nH, d, K), kinds outermost. One batch
        # entry per head spreads the products over the CPU threads better than stacking the heads of a group.
        scaled = scaled.transpose(0, 1).reshape(n * heads, queries, d_head)
        values_t = expand_kv(v, heads).transpose(1, 2).repeat(n, 1, 1)  # (nH, d, K), O(K d) copies
        contributions = torch.empty(n, heads, queries, keys, dtype=alpha.dtype, device=alpha.device)
        causal_product(scaled, values_t, alpha, contributions)
    else:
        # (H, nQ, K)
        contributions = grouped_matmul(scaled.reshape(heads, n * queries, d_head), held.transpose(1, 2), copies)
        contributions = contributions.view(heads, n, queries, keys).mul_(alpha[:, None]).transpose(0, 1)
    return LayerMeasures(
        attention=alpha,
        value=v,
        value_norm=value_norm,
        head_output=side.head_output,
        head_output_norm=side.head_output_norm,
        output_norm=side.output_norm,
        contributions=contributions,
        pulled=pulled,
        kinds=kinds,
    )


def head_output_norms(z: torch.Tensor, grams: torch.Tensor) -> torch.Tensor:
    """‖o_i^h‖ = ‖W_O^h z_i^h‖ = sqrt(z_iᵀ G^h z_i), float32 [head, query], from z [head, query, d_head] and G^h
    [head, d_head, d_head] (:func:`head_grams`): made in each head's value space."""
    z = z.float()
    return ((z @ grams) * z).sum(-1).clamp_min(0).sqrt()


def semantic_cone(
    z: torch.Tensor, grams: torch.Tensor, positions: torch.Tensor, norms: torch.Tensor | None = None
) -> torch.Tensor:
    """Mean pairwise cosine between one head's outputs o_i^h = W_O^h z_i^h at ``positions`` (i ≠ j), per head: [head].

    z [head, query, d_head]; grams G^h [head, d_head, d_head]; positions bool [query]; ``norms``: ‖o_i^h‖ [head,
    query] (:func:`head_output_norms`) when the caller has them. Zero outputs are left out. Computed as
    (‖Σ u_i‖² − n) / (n(n − 1)) with u_i = o_i / ‖o_i‖, linear in the number of positions, and in each head's value
    space: Σ u_i = W_O^h w with w = Σ z_i / ‖o_i‖, so ‖Σ u_i‖² = wᵀ G^h w (float64)."""
    positions = positions.to(z.device)
    z = z[:, positions].float()  # (H, P, d)
    norms = (head_output_norms(z, grams) if norms is None else norms[:, positions])[..., None]  # (H, P, 1)
    nonzero = norms > 0
    w = torch.where(nonzero, z.double() / norms.double().clamp_min(1e-300), 0.0).sum(1)  # (H, d)
    n = nonzero[..., 0].sum(-1).double()  # (H,)
    total = ((w[:, None] @ grams.double()) * w[:, None]).sum((-2, -1))  # ‖Σ u‖², (H,)
    return torch.where(n > 1, (total - n) / (n * (n - 1)).clamp_min(1), torch.nan).float()
