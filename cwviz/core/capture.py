"""Capture one forward pass through transformers' supported attention seam.

cwviz registers an attention function named ``"cwviz"`` in transformers' ``AttentionInterface`` (and
the matching mask function in ``AttentionMaskInterface``) and loads models with it. Outside a
:func:`forward_pass` it simply delegates to PyTorch's SDPA, so the model behaves exactly as with
``attn_implementation="sdpa"``. Inside a pass, the per-thread :class:`_Pass` stored in a
``ContextVar`` tells it to record each layer's queries, keys and values, and optionally to intervene.

Why this seam rather than hooks: the function receives the post-RoPE queries and keys, the values with
their bias, the mask and the scaling the model really uses, for every supported architecture alike.
And because the active pass lives in a ``ContextVar``, several threads can run the one shared model at
once, each with its own records; nothing is registered on the model, so nothing can be left behind
when an analysis raises.

What is kept per layer grows linearly with the number of tokens T: queries [heads, T, d_head],
keys and values [kv_heads, T, d_head]. Attention maps are recomputed from them on demand.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from .errors import UnsupportedModelError
from .measures import causal_row_blocks, expand_kv
from .progress import Progress

ATTN_IMPLEMENTATION = "cwviz"


@dataclass(frozen=True)
class LayerRecord:
    """What one attention layer saw in one forward pass (batch of one).

    | field   | shape                        | note                                              |
    |---------|------------------------------|---------------------------------------------------|
    | query   | [head, query, d_head]        | after rotary embedding, before scaling            |
    | key     | [kv_head, key, d_head]       | after rotary embedding                            |
    | value   | [kv_head, key, d_head]       | v_j = x_j W_V + b_V                               |
    | mask    | None or [query, key]         | bool (True = may attend) or additive float        |
    | output  | [head, query, d_head]        | z_i^h, what the attention function returned       |

    ``causal`` applies when ``mask`` is None. Tensors stay on the layer's device in the model's dtype;
    measures upcast them to float32.
    """

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    mask: torch.Tensor | None
    scaling: float
    causal: bool
    output: torch.Tensor

    def key_mask(self, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """Which keys each query may attend to, bool [query, key] on the record's device: the model's own
        mask (causal: keys 0..i; sliding windows, padding), True where a key is visible. With ``start`` and
        ``stop``, only those query rows are made ([stop - start, key]), never the whole T x T."""
        num_queries, num_keys = self.query.shape[-2], self.key.shape[-2]
        stop = num_queries if stop is None else stop
        device = self.query.device
        if self.mask is None:
            if not self.causal:
                return torch.ones(stop - start, num_keys, dtype=torch.bool, device=device)
            return torch.arange(num_keys, device=device)[None, :] <= torch.arange(start, stop, device=device)[:, None]
        mask = torch.broadcast_to(self.mask.to(device), (num_queries, num_keys))[start:stop]
        if mask.dtype == torch.bool:
            return mask
        # Additive masks hold 0 where allowed and -inf (or the dtype's minimum) where a key is hidden.
        return mask > torch.finfo(mask.dtype).min / 2


class Intervention(Protocol):
    """Changes one forward pass from inside the attention function.

    ``values`` may return modified values (a new tensor, [batch, kv_head, key, d_head]).
    ``keep`` may return a weight on each attention probability, broadcastable to
    [batch, head, query, key] (1 keeps a key's write, 0 removes it; probabilities are not
    renormalised), or None for no change in that layer.
    """

    def values(self, layer: int, value: torch.Tensor) -> torch.Tensor: ...

    def keep(self, layer: int, num_queries: int, num_keys: int) -> torch.Tensor | None: ...


@dataclass
class _Pass:
    layer_of: dict[int, int]
    record: bool
    intervention: Intervention | None
    records: dict[int, LayerRecord] = field(default_factory=dict)
    progress: Progress | None = None
    layers_done: int = 0
    arena: torch.Tensor | None = None  # (layers, per-layer elements): the records of a pass on the CPU

    def kept(self, layer: int, parts: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """What a record keeps of ``parts``: on a CPU, contiguous copies side by side in one buffer for the
        whole pass (:attr:`arena`, allocated at the first layer for every layer); elsewhere the tensors
        themselves.

        Why copy: a record outlives the forward pass, and the tensors it would otherwise keep sit in the heap
        between that pass's freed activations, which then cannot be returned to the system nor reused as one
        block (glibc): at 4,096 tokens on the embedded model the pass peaked 1.6 GB above the model instead of
        1.0 GB. With the records in their own buffer every activation is freed and reused layer after layer.
        The copies cost one pass over what is recorded (about 6 KB a token a layer for the embedded model). A
        layer whose parts differ in size or dtype from the first layer's keeps its own tensors.
        """
        first = parts[0]
        if first.device.type != "cpu" or any(p.dtype != first.dtype for p in parts):
            return parts
        sizes = [p.numel() for p in parts]
        if self.arena is None:
            self.arena = torch.empty(len(self.layer_of), sum(sizes), dtype=first.dtype)
        if sum(sizes) != self.arena.shape[1]:
            return parts
        out, offset = [], 0
        for part, size in zip(parts, sizes):
            slot = self.arena[layer, offset : offset + size].view(part.shape)
            slot.copy_(part)
            out.append(slot)
            offset += size
        return tuple(out)


_ACTIVE: contextvars.ContextVar[_Pass | None] = contextvars.ContextVar("cwviz_pass", default=None)


def _is_causal(module: torch.nn.Module, kwargs: dict, num_queries: int) -> bool:
    flag = kwargs.get("is_causal")
    if flag is None:
        flag = getattr(module, "is_causal", True)
    return bool(flag) and num_queries > 1


def attention_probabilities(
    query: torch.Tensor,
    key: torch.Tensor,
    scaling: float,
    mask: torch.Tensor | None,
    causal: bool,
) -> torch.Tensor:
    """Softmax attention exactly as SDPA computes it, in the dtype of ``query``.

    | arg    | shape                              |
    |--------|------------------------------------|
    | query  | [..., head, query, d_head]     |
    | key    | [..., kv_head, key, d_head]    |
    | mask   | broadcastable to [..., head, query, key], bool (True = attend) or additive |
    | return | [..., head, query, key]    |

    Grouped-query keys are shared by ``head // (heads / kv_heads)``.
    """
    heads, num_queries, d_head = query.shape[-3:]
    groups = heads // key.shape[-3]
    num_keys = key.shape[-2]
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


def causal_rows(query: torch.Tensor, key: torch.Tensor, scaling: float, start: int) -> torch.Tensor:
    """α of the query rows ``start..start+R-1`` of a causal layer (no explicit mask) against the keys ``0..K-1``.

    | arg    | shape                   |
    |--------|-------------------------|
    | query  | [head, R, d_head]       |
    | key    | [kv_head, K, d_head]    |
    | return | [head, R, K]            |

    Row ``start + r`` sees keys ``0..start+r``; later keys get exactly 0, as the softmax of -inf gives. The
    same scores, scaling and softmax as :func:`attention_probabilities`, in fewer passes over the block: the
    heads of a group are stacked against their shared key, the scaling is the product's own factor, and
    only the keys from ``start + 1`` on (the block's diagonal part) are masked.
    """
    heads, rows, d_head = query.shape
    kv_heads, keys, _ = key.shape
    stacked = query.reshape(kv_heads, (heads // kv_heads) * rows, d_head)  # (H_kv, groups * R, d)
    scores = torch.empty(kv_heads, stacked.shape[1], keys, dtype=query.dtype, device=query.device)
    scores.baddbmm_(stacked, key.transpose(1, 2), beta=0.0, alpha=scaling)
    scores = scores.view(heads, rows, keys)
    if start + 1 < keys:
        later = (
            torch.arange(start + 1, keys, device=query.device)[None, :] > torch.arange(start, start + rows, device=query.device)[:, None]
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
    blocks = causal_row_blocks(num_tokens)
    rows = blocks[0][1] if blocks else 0
    future = torch.ones(rows, rows, dtype=torch.bool, device=query.device).triu_(1)  # the diagonal block's mask
    out = torch.empty(heads, num_tokens, num_tokens, dtype=query.dtype, device=query.device)
    for start, end in blocks:
        scores = torch.bmm(query[:, start:end], keys_t[:, :, :end]).mul_(scaling)
        scores[:, :, start:].masked_fill_(future[: end - start, : end - start], float("-inf"))
        torch.softmax(scores, dim=-1, out=out[:, start:end, :end])
        out[:, start:end, end:].zero_()
    return out


def _cwviz_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    active = _ACTIVE.get()
    layer = active.layer_of.get(id(module)) if active is not None else None
    if layer is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    if kwargs.get("softcap") is not None or kwargs.get("s_aux") is not None:
        raise UnsupportedModelError("attention logit soft-capping and learned sinks are not supported by cwviz")
    # query (B, H, Q, d); key, value (B, H_kv, K, d); attention_mask None or (B, 1, Q, K)
    scaling = float(scaling if scaling is not None else query.shape[-1] ** -0.5)
    causal = _is_causal(module, kwargs, query.shape[-2])
    keep = None
    if active.intervention is not None:
        value = active.intervention.values(layer, value)
        keep = active.intervention.keep(layer, query.shape[-2], key.shape[-2])
    if keep is None:
        out, _ = sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    else:
        # Masked keys: z_i^h = sum_j alpha_ij^h keep_ij v_j^h, alpha from the unchanged scores.
        # alpha is a fresh tensor, so the keep weights apply in place (bool or float, cast on the fly); the heads
        # of a group share their value: (B, H_kv, groups * Q, K) @ (B, H_kv, K, d), no per-head copy of v.
        alpha = attention_probabilities(query.float(), key.float(), scaling, attention_mask, causal)
        alpha.mul_(keep.to(alpha.device))  # (B, H, Q, K)
        batch, heads, num_queries, num_keys = alpha.shape
        grouped = alpha.view(batch, value.shape[1], -1, num_keys)
        out = torch.matmul(grouped, value.float()).view(batch, heads, num_queries, -1).to(query.dtype)  # (B, H, Q, d)
        out = out.transpose(1, 2).contiguous()  # (B, Q, H, d), as every attention function returns
    if active.record:
        if query.shape[0] != 1:
            raise ValueError("cwviz records one sequence at a time (batch of one)")
        mask = attention_mask[0, 0] if attention_mask is not None else None
        q, k, v, z = active.kept(layer, (query[0], key[0], value[0], out[0].transpose(0, 1)))
        active.records[layer] = LayerRecord(
            query=q.detach(), key=k.detach(), value=v.detach(), mask=mask, scaling=scaling, causal=causal, output=z.detach()
        )
    if active.progress is not None:
        active.layers_done += 1
        active.progress(active.layers_done, len(active.layer_of))
    return out, None


AttentionInterface.register(ATTN_IMPLEMENTATION, _cwviz_attention)
AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)


@contextlib.contextmanager
def forward_pass(
    attention_modules: list[torch.nn.Module],
    record: bool = True,
    intervention: Intervention | None = None,
    progress: Progress | None = None,
) -> Iterator[dict[int, LayerRecord]]:
    """Within this block, forward passes of the model record and/or intervene.

    ``attention_modules[l]`` is layer l's attention module. Yields the dict that fills with one
    :class:`LayerRecord` per layer. Only the calling thread (and context) is affected. ``progress``
    (:mod:`cwviz.core.progress`) is told after each attention layer has run (one pass: done 1..L).
    """
    active = _Pass({id(m): i for i, m in enumerate(attention_modules)}, record, intervention, progress=progress)
    token = _ACTIVE.set(active)
    try:
        yield active.records
    finally:
        _ACTIVE.reset(token)


def uses_cwviz_attention(model: torch.nn.Module) -> bool:
    return getattr(model.config, "_attn_implementation", None) == ATTN_IMPLEMENTATION
