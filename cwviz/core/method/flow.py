"""The signed flow across layers (docs/METHOD.md section 6): each layer's token mixing M, the signed rollout, the
direct parts of one logit difference and their routing back to the input tokens.

The residual stream comes from one extra forward pass (:mod:`cwviz.core.method.residual`); attention and values are the
analysis's records, in row blocks (:mod:`cwviz.core.method.row_blocks`). No [T, T, d_model] tensor exists: a write's
dot product with h_i is taken in the head's d_head space, ⟨L_i(ṽ_j^h), h_i⟩ = ((W_O^h)ᵀ L_iᵀ h_i) · v_j^h, and the
routing is a vector times each layer's M, row block by row block (T² a layer), never the rollout R itself.

| function                          | returns                                                     |
|-----------------------------------|-------------------------------------------------------------|
| ``flow(analysis, ...)``           | :class:`Flow` (tables; pure numpy and pandas, no torch)      |
| ``token_totals(analysis, ...)``   | numpy [T]: each input token's signed total toward t over f  |
| ``flow_basis(analysis, ...)``     | :class:`FlowBasis`: what every target of one position shares |

Each layer's M and the rollout are :mod:`cwviz.core.method.mixing`'s; the logits at p and each head's vocabulary there
(read through the output layer) are :mod:`cwviz.core.method.flow_vocabulary`'s.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..defaults import EDGE_LIMIT, FLOW_TOP
from ..loading import architectures
from ..util.errors import ArgumentError, InputError
from . import flow_arguments as arguments
from .edges import LargestEdges
from .flow_tables import Deferred, DirectParts, Flow, LayerEdges
from .flow_vocabulary import head_vocabulary, head_writes, own_logits, vocabulary_size
from .measures import grouped_matmul
from .mixing import MixingRowBlock, mixing_row_blocks, replayed_stream
from .residual import Stream

if TYPE_CHECKING:
    from ..loading.models import Bundle
    from .analysis import Analysis

#: The most bytes of layers x T² float32 a :class:`FlowBasis` spends on keeping every layer's M (above it, M is made
#: again from the records for each target): SmolLM2-135M's 30 layers up to about 730 tokens.
MIXING_BYTES = 64 * 2**20


def resolve(
    analysis: Analysis, position: int | None, target: int | str | None, foil: int | str | None
) -> tuple[int, int | None, int | None]:
    """The position (default: the last; an encoder's [CLS], 0), and the target and foil token ids, checked."""
    bundle = analysis.bundle
    causal = bundle.has_logits
    if position is None:
        position = analysis.num_tokens - 1 if causal else 0
    position = analysis.check_token(position)
    if not causal:
        if target is not None or foil is not None:
            raise InputError(
                "an encoder has no next-token logits, so no target or foil can be asked of it: ask for the flow into a "
                "position's representation instead (leave out the target and foil; choose the position, 0 is [CLS])"
            )
        return position, None, None
    target, foil = (_token_id(bundle, token, name) for token, name in ((target, "target"), (foil, "foil")))
    if foil is not None and foil == target:
        raise ArgumentError(
            "foil",
            f"the foil is the target (token {target}): choose another foil, or none for the target's logit alone",
        )
    return position, target, foil


def _token_id(bundle: Bundle, token: int | str | None, name: str) -> int | None:
    """A token id from an id or a string that is exactly one token of the model's vocabulary (ArgumentError otherwise:
    :mod:`~cwviz.core.method.flow_arguments`)."""
    token = arguments.token(token, name)
    if token is None or isinstance(token, int):
        return None if token is None else arguments.token_id(token, vocabulary_size(bundle), name)
    ids = list(bundle.tokenizer(token, add_special_tokens=False)["input_ids"])
    if len(ids) != 1:
        shown = arguments.quoted([bundle.tokenizer.decode([i]) for i in ids[:20]])  # a long text: its first tokens
        raise ArgumentError(
            name,
            f"the {name} {arguments.quoted(token)} is {len(ids)} tokens {shown}, not one: give one token (with its "
            "leading space if it has one)",
        )
    return ids[0]


def _logit_direction(
    analysis: Analysis, stream: Stream, target: int, foil: int | None
) -> tuple[torch.Tensor, float, float]:
    """(w, the final biases' part, the model's own logit difference before the soft-cap) with w = L_p^Fᵀ s (U_t − U_f)
    [d_model] (docs/METHOD.md section 6.3)."""
    bundle = analysis.bundle
    arch, config = bundle.arch, bundle.model.config
    head = bundle.model.get_output_embeddings()
    weight = head.weight
    scale = architectures.linear_logit_scale(config, arch)
    device = stream.final.device
    unembed = weight[target].float().to(device) - (0 if foil is None else weight[foil].float().to(device))
    unembed = scale * unembed
    lm_bias = getattr(head, "bias", None)
    bias_part = 0.0
    if lm_bias is not None:
        bias_part = scale * float(lm_bias[target] - (0 if foil is None else lm_bias[foil]))
    uncapped = float(unembed @ stream.final_output) + bias_part  # the final output holds the norm's bias
    norm = stream.final_norm
    w = unembed if norm is None else norm.pullback(unembed[None])[0]
    if norm is not None and norm.bias is not None:
        bias_part += float(unembed @ norm.bias)
    return w, bias_part, uncapped


def _layer_parts(analysis: Analysis, stream: Stream, w: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """The direct parts toward w that need no record: attention bias [layer] and mlp [layer]."""
    layers = analysis.num_layers
    bias, mlp = np.zeros(layers, np.float32), np.zeros(layers, np.float32)
    with torch.inference_mode():
        for layer in range(layers):
            part, device = stream.layers[layer], analysis.layer_device(layer)
            w_layer = part.landing.pullback(w[None].to(device))[0]  # L_p^lᵀ w
            b_o = getattr(analysis.bundle.out_projections[layer], "bias", None)
            bias[layer] = (0.0 if b_o is None else float(b_o.float().to(device) @ w_layer)) + (
                0.0 if part.landing.bias is None else float(part.landing.bias @ w.to(device))
            )
            mlp[layer] = float(part.mlp.to(device) @ w.to(device))
    return bias, mlp


def _attention_parts(
    analysis: Analysis, stream: Stream, w: torch.Tensor, layer: int, rows: MixingRowBlock
) -> np.ndarray:
    """The direct parts of layer ``layer``'s attention writes at p toward w (docs/METHOD.md section 6.3), [head, keys],
    from ``rows``, the row block that holds p (the routing reads each layer's record once, and takes them there)."""
    alpha = rows.alpha_p  # (H, keys)
    landing, w_heads = stream.layers[layer].landing, analysis.w_heads(layer)  # w_heads (H, D, dh)
    w_layer = landing.pullback(w[None].to(alpha.device))[0]  # L_p^lᵀ w
    pulled = torch.einsum("hdk,d->hk", w_heads, w_layer)  # (H, dh)
    dots = grouped_matmul(pulled[:, None], rows.values.transpose(-1, -2))[:, 0]  # (H, keys)
    return (alpha * dots).cpu().numpy()


@dataclass(frozen=True)
class Routing:
    """What :func:`_route` computes: the routed value's and the rollout row's ends, ``totals`` and ``rollout_row`` [T]
    (v^0), with their bias parts ``bias`` and ``rollout_bias``; ``nodes`` v^l [layer + 1, T]; ``direct`` d^l [layer + 1,
    T] with each layer's attention parts at p added; those parts, ``attention`` [layer, head, key]; each head's routed
    value ``heads`` [layer, head]; each layer's ``edges`` (at most the limit, largest |weight| first, and its mass)."""

    totals: np.ndarray
    rollout_row: np.ndarray
    bias: float
    rollout_bias: float
    nodes: np.ndarray
    direct: np.ndarray
    attention: np.ndarray
    heads: np.ndarray
    edges: tuple[LayerEdges, ...]


def _route(
    analysis: Analysis,
    basis: FlowBasis,
    start: np.ndarray,
    direct: np.ndarray,
    w: torch.Tensor | None,
    edge_limit: int = EDGE_LIMIT,
) -> Routing:
    """Horner's rule down the layers (docs/METHOD.md section 6.4): v^L = ``start`` [2, T], v^l = v^{l+1} M^l + d^l.
    Row 0 is the routed value (``direct`` d^l [layer + 1, T] added on the way, with each layer's attention parts toward
    ``w`` at p as the layer is read; none for an encoder, w None), row 1 the rollout row (nothing added). Changes no
    argument."""
    layers, tokens = analysis.num_layers, analysis.num_tokens
    direct = direct.copy()  # (layer + 1, T): the attention parts are added to it below
    nodes = np.zeros((layers + 1, tokens), np.float32)
    heads = np.zeros((layers, analysis.num_heads), np.float32)
    attention = np.zeros((layers, analysis.num_heads, tokens), np.float32)
    edges: list[LayerEdges] = []
    vector = torch.tensor(start, dtype=torch.float32)  # (2, T)
    nodes[layers] = start[0]
    bias = torch.zeros(2)
    with torch.inference_mode():
        for layer in reversed(range(layers)):
            below = torch.zeros_like(vector)
            largest, mass = LargestEdges(edge_limit), 0.0
            for row_block in basis.row_blocks(analysis, layer):
                if w is not None and row_block.alpha_p is not None:
                    part = _attention_parts(analysis, basis.stream, w, layer, row_block)
                    attention[layer, :, : part.shape[-1]] = part
                mix = row_block.mix
                rows = vector[:, row_block.first : row_block.stop].to(mix.device)
                below[:, : mix.shape[1]] += (rows @ mix).cpu()
                bias += (rows @ row_block.bias).cpu()
                heads[layer] += (row_block.heads @ rows[0]).cpu().numpy()
                if edge_limit:
                    mass += largest.add(rows[0][:, None] * mix, row_block.first)  # edge (layer, k) -> (layer + 1, i)
            direct[layer] += attention[layer].sum(0)
            vector = below + torch.tensor(np.stack([direct[layer], np.zeros(tokens, np.float32)]))
            nodes[layer] = vector[0].numpy()
            weights, ends, starts = largest.result()
            edges.append(LayerEdges(layer, weights.numpy(), ends.numpy(), starts.numpy(), mass))
    totals, rollout_row = vector.numpy()
    return Routing(
        totals, rollout_row, float(bias[0]), float(bias[1]), nodes, direct, attention, heads, tuple(edges[::-1])
    )


@dataclass(frozen=True, eq=False)
class FlowBasis:
    """What the flow into one position needs whatever its target and foil (:func:`flow_basis`): the prompt's residual
    stream frozen at p, the model's own logits at p and each head's vocabulary there. A new target or foil reuses it
    and pays only for its own routing (docs/METHOD.md section 6: w, and with it every direct part and the routing, is
    the only thing the target changes). ``source``: a weak reference to the analysis it was made from (:func:`flow`
    refuses another's; a kept basis does not keep its analysis alive). The stream holds layers x T x d_model floats
    (2,000 tokens of SmolLM2-135M: 138 MB). ``logits`` [vocab] float32 (None: an encoder); ``vocabulary``: each
    head's ``count`` most promoted and suppressed tokens, computed when first read (:class:`Deferred`; None: an
    encoder or ``count`` 0).
    ``mixing``: every layer's M as one :class:`MixingRowBlock` (``mixing_row_blocks(whole=True)``), kept where
    layers x T² floats fit in :data:`MIXING_BYTES` (None: each flow makes it again from the records, as it reads
    them)."""

    source: weakref.ref
    position: int
    stream: Stream
    logits: torch.Tensor | None
    vocabulary: Deferred | None
    count: int
    mixing: tuple[tuple[MixingRowBlock, ...], ...] | None = None

    def row_blocks(self, analysis: Analysis, layer: int) -> Iterator[MixingRowBlock] | tuple[MixingRowBlock, ...]:
        """Layer ``layer``'s M: kept (``mixing``, one row block), or made again from ``analysis``'s records."""
        return self.mixing[layer] if self.mixing is not None else mixing_row_blocks(analysis, self.stream, layer)


def flow_basis(
    analysis: Analysis, position: int | None = None, *, vocabulary: int = FLOW_TOP, keep_mixing: bool = True
) -> FlowBasis:
    """The target-independent part of the flow into ``position`` (default as :func:`flow`): one forward pass that
    replays the analysis's attention outputs (its residual stream), the logits at p read from it, and each head's
    write at p (its recorded output z_p^h through W_O^h, landed in the residual) for its ``vocabulary`` most promoted
    and suppressed tokens; with ``keep_mixing``, every layer's M where it fits :data:`MIXING_BYTES` (a causal model's).
    Pass it to :func:`flow` for each target and foil of the same analysis and position."""
    position, _, _ = resolve(analysis, position, None, None)
    vocabulary = arguments.vocabulary(vocabulary, vocabulary_size(analysis.bundle))
    layers = analysis.num_layers
    at_p: dict[int, torch.Tensor] = {}

    def replay(layer: int) -> torch.Tensor:  # the recorded z [head, query, d_head] (of a spilled layer, only its bytes)
        output = analysis.recorded_outputs(layer)
        at_p[layer] = output[:, position].float()
        return output

    with torch.inference_mode():
        stream = replayed_stream(analysis, position, replay)  # no pass (nor replay, nor at_p) when the analysis kept it
        if not analysis.bundle.has_logits:
            return FlowBasis(weakref.ref(analysis), position, stream, None, None, 0)
        logits = own_logits(analysis, stream)
        vocabulary_rows = None
        if vocabulary:
            writes = head_writes(analysis, stream, position, at_p)
            vocabulary_rows = head_vocabulary(analysis, stream, writes, vocabulary)
        mixing = None
        if keep_mixing and layers * analysis.num_tokens**2 * 4 <= MIXING_BYTES:  # each layer's M whole: T² floats
            mixing = tuple(tuple(mixing_row_blocks(analysis, stream, layer, whole=True)) for layer in range(layers))
    return FlowBasis(weakref.ref(analysis), position, stream, logits, vocabulary_rows, vocabulary, mixing)


def flow(
    analysis: Analysis,
    position: int | None = None,
    target: int | str | None = None,
    foil: int | str | None = None,
    *,
    vocabulary: int = FLOW_TOP,
    basis: FlowBasis | None = None,
) -> Flow:
    """The signed flow of ``analysis``'s prompt into position ``position`` (docs/METHOD.md section 6).

    A causal LM: toward logit(``target``) − logit(``foil``) at ``position`` (default: the last position, the model's
    top next token there, no foil: the target's logit alone). ``target`` and ``foil`` are token ids or strings of one
    token. An encoder: into the position's final representation (default 0, [CLS]); a target is refused.
    ``vocabulary``: tokens listed per head as most promoted and suppressed (0: none). They are computed on first
    use, when ``Flow.vocabulary``, ``Flow.heads`` or ``Flow.vocabulary_table`` is first read (each head's write through
    the output layer: for a small model the flow's largest product, which a caller of the totals, the parts or the
    graph alone never pays for); the result is the same as if computed here, unless the model changed in between
    (ModelChangedError then, as an analysis gives). ``basis``: :func:`flow_basis` of this analysis and position, made
    with this ``vocabulary``, when the caller keeps one (a dashboard trying several targets): the flow then runs no
    forward pass, and its head vocabulary is the basis's, computed once for every target.

    Raises :class:`~cwviz.core.util.errors.InputError` (a target of several tokens, a foil equal to the target, a target
    asked of an encoder, a basis of another analysis, position or vocabulary),
    :class:`~cwviz.core.util.errors.SelectionError` (a position out of range) and
    :class:`~cwviz.core.util.errors.UnsupportedModelError` (a derived row, whose block layout is not known).
    """
    position, target, foil = resolve(analysis, position, target, foil)
    vocabulary = arguments.vocabulary(vocabulary, vocabulary_size(analysis.bundle))
    if basis is None:  # made for this flow alone: M is read once, layer by layer, not kept
        basis = flow_basis(analysis, position, vocabulary=vocabulary, keep_mixing=False)
    elif (
        basis.source() is not analysis
        or basis.position != position
        or (basis.count != vocabulary and basis.logits is not None)
    ):
        raise InputError(
            f"this flow basis was made for another analysis, position or vocabulary (position {basis.position}, "
            f"{basis.count} vocabulary tokens): make it with flow_basis(analysis, {position}, vocabulary={vocabulary})"
        )
    with torch.inference_mode():
        return _flow(analysis, basis, target, foil, EDGE_LIMIT)


@dataclass(frozen=True)
class _Start:
    """What the routing starts from (:func:`_start`): ``start`` v^L [2, T] (row 0 the routed value, row 1 the rollout
    row's), the direct parts ``direct`` d^l [layer + 1, T] that need no record, the logit direction ``w`` [d_model],
    the other parts and the model's own logit difference before the soft-cap (None, None, NaN: an encoder)."""

    start: np.ndarray
    direct: np.ndarray
    w: torch.Tensor | None
    parts: DirectParts | None
    uncapped: float


def _start(analysis: Analysis, basis: FlowBasis, target: int | None, foil: int | None) -> _Start:
    """The start of the routing toward logit(``target``) − logit(``foil``) (an encoder: into p's representation)."""
    stream, position = basis.stream, basis.position
    tokens, layers = analysis.num_tokens, analysis.num_layers
    start = np.zeros((2, tokens), np.float32)
    start[1, position] = 1.0
    direct = np.zeros((layers + 1, tokens), np.float32)
    if target is None:  # an encoder: the flow into the position's representation
        start[0, position] = 1.0
        return _Start(start, direct, None, None, float("nan"))
    w, final_bias, uncapped = _logit_direction(analysis, stream, target, foil)
    attention_bias, mlp = _layer_parts(analysis, stream, w)
    embedding = float(stream.embedding.to(w.device) @ w)
    direct[0, position] += embedding
    mlp_layer = np.arange(layers) + (0 if stream.layout == "parallel" else 1)  # the MLP reads h (parallel: x)
    np.add.at(direct[:, position], mlp_layer, mlp)
    start[0] = direct[layers]
    return _Start(start, direct, w, DirectParts(embedding, attention_bias, mlp, final_bias), uncapped)


def _flow(analysis: Analysis, basis: FlowBasis, target: int | None, foil: int | None, edge_limit: int) -> Flow:
    """:func:`flow` after its checks, in inference mode."""
    if basis.logits is not None and target is None:
        target = int(basis.logits.argmax())
        if target == foil:
            raise ArgumentError(
                "foil",
                f"the foil (token {foil}) is the model's top next token, the default target: name another target",
            )
    begun = _start(analysis, basis, target, foil)
    routed = _route(analysis, basis, begun.start, begun.direct, begun.w, edge_limit)
    parts, nan = begun.parts, float("nan")
    frozen = difference = nan
    bias_total = routed.bias
    if parts is not None:
        frozen = (
            parts.embedding + float(routed.attention.sum()) + float(parts.attention_bias.sum()) + float(parts.mlp.sum())
        )
        frozen += parts.final_bias
        difference = float(basis.logits[target] - (0 if foil is None else basis.logits[foil]))
        bias_total += float(parts.attention_bias.sum()) + parts.final_bias
    decode = analysis.bundle.tokenizer.decode
    return Flow(
        token_strings=tuple(analysis.tokens),
        position=basis.position,
        target=target,
        foil=foil,
        target_token=None if target is None else decode([target]),
        foil_token=None if foil is None else decode([foil]),
        totals=routed.totals.astype(np.float32),
        rollout_row=routed.rollout_row.astype(np.float32),
        bias_total=bias_total,
        rollout_bias=routed.rollout_bias,
        nodes=routed.nodes,
        direct=routed.direct,
        head_direct=routed.attention.sum(-1),
        head_routed=routed.heads,
        attention_parts=routed.attention,
        other_parts=parts,
        head_vocabulary=basis.vocabulary,
        kept_edges=routed.edges,
        logit_difference=difference,
        frozen_logit_difference=frozen,
        norm_error=begun.uncapped - frozen,
    )


def token_totals(analysis: Analysis, position: int, target: int | str, foil: int | str | None = None) -> np.ndarray:
    """Each input token's signed total toward logit(target) − logit(foil) at ``position`` (docs/METHOD.md section
    6.4), float32 numpy [T]: Σ_k totals_k plus the bias's total is the frozen-norm logit difference. ``target`` and
    ``foil`` are token ids or one-token strings. The causal evaluation compares these with interventions."""
    position, target, foil = resolve(analysis, position, target, foil)
    if target is None:
        raise InputError(
            "token_totals needs a target token (an encoder has none: its flow into a representation is flow(analysis, "
            "position).totals)"
        )
    with torch.inference_mode():
        return _flow(
            analysis, flow_basis(analysis, position, vocabulary=0, keep_mixing=False), target, foil, 0
        ).totals  # no vocabulary, no graph
