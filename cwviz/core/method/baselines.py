"""Prior input-token attribution methods the signed flow is compared with (docs/METHOD.md section 6.5).

Each scores the input tokens j for the prediction made at one position t, from a recorded pass
(:class:`cwviz.core.method.analysis.Analysis`); none is signed:

| function | score of token j | source |
|---|---|---|
| :func:`raw_attention` | mean_h α_tj^{L,h}: the last layer's attention, averaged over heads | – |
| :func:`attention_rollout` | R_tj, R = A^L ⋯ A^1 with A^l = ½ mean_h α^{l,h} + ½ I, rows summing to 1 | Abnar and Zuidema (ACL 2020) |
| :func:`alti` | R_tj, R = C^L ⋯ C^1 with C^l the layer's ALTI contributions (:func:`alti_contributions`) | Ferrando et al. (EMNLP 2022) |

The math is in pure functions of small tensors (:func:`residual_attention`, :func:`rollout`,
:func:`transformed_vectors`, :func:`alti_contributions`), tested on 3-token cases worked by hand.

ALTI needs, besides the recorded attention and values, the residual stream entering each layer and, in a model
with a norm on the attention output (Gemma 2 and 3: "sandwich" norms), that norm: :func:`alti` runs one more
forward pass for the residual streams (``output_hidden_states``, no hooks). Shapes:

| tensor | shape |
|---|---|
| α (one layer) | [head, query, key] |
| ṽ, the projected values | [head, key, d_model] |
| transformed vectors T_i(x_j) | [query, key, d_model] (a block of queries at a time) |
| x, the residual entering a layer; y, after its attention block | [query, d_model] |
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from ..loading import architectures
from ..util.errors import InputError
from .analysis import Analysis
from .capture import forward_pass
from .residual import residual_multiplier

#: The query rows of ALTI's transformed vectors built at once: [rows, T, d_model] floats per block.
ALTI_ROWS = 32


# -- pure math on small tensors ---------------------------------------------------------------------------
def residual_attention(alpha: torch.Tensor) -> torch.Tensor:
    """Rollout's per-layer map from one layer's α [head, query, key] (query = key = T): ½ mean_h α + ½ I, each row
    divided by its sum (a row of α sums to less than 1 under learned sinks), float32 [T, T]."""
    mean = alpha.float().mean(0)
    mixed = 0.5 * mean + 0.5 * torch.eye(mean.shape[0], dtype=mean.dtype, device=mean.device)
    return mixed / mixed.sum(-1, keepdim=True)


def rollout(maps: Sequence[torch.Tensor]) -> torch.Tensor:
    """R = M^L ⋯ M^1 of per-layer maps [T, T] in layer order (first layer first): row t of R says how much of
    position t's state after the last layer comes from each input token."""
    if not maps:
        raise InputError("rollout needs at least one layer")
    out = maps[0].float()
    for step in maps[1:]:
        out = step.float() @ out
    return out


def transformed_vectors(
    alpha: torch.Tensor,
    projected: torch.Tensor,
    residual: torch.Tensor,
    rows: slice | None = None,
    norm_scale: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ALTI's transformed vectors and their sum for the query ``rows`` (default all) of one layer.

    T_i(x_j) = N_i(Σ_h α_ij^h ṽ_j^h) for j ≠ i, plus the residual x_i when j = i; y_i = Σ_j T_i(x_j) + N_i(b_O).
    N_i(u) = norm_scale_i ⊙ u is the norm on the attention output with its scale frozen at position i (None: no
    such norm). Shapes: ``alpha`` [head, T, T], ``projected`` ṽ [head, T, d_model], ``residual`` x [T, d_model],
    ``norm_scale`` [T, d_model], ``bias`` [d_model]. Returns (T [rows, T, d_model], y [rows, d_model]).
    """
    rows = rows if rows is not None else slice(0, alpha.shape[1])
    writes = torch.einsum("hij,hjd->ijd", alpha[:, rows].float(), projected.float())  # (rows, key, d_model)
    bias = torch.zeros(writes.shape[-1]) if bias is None else bias.float()
    if norm_scale is not None:
        scale = norm_scale[rows].float()  # (rows, d_model)
        writes = writes * scale[:, None, :]
        bias = bias * scale  # (rows, d_model)
    positions = torch.arange(rows.start, rows.start + writes.shape[0])
    writes[torch.arange(writes.shape[0]), positions] += residual[rows].float()
    return writes, writes.sum(1) + bias


def alti_contributions(transformed: torch.Tensor, resultant: torch.Tensor) -> torch.Tensor:
    """ALTI's contributions [query, key] from transformed vectors [query, key, d_model] and their resultant y
    [query, d_model]: c_ij = max(0, ‖y_i‖₁ − ‖y_i − T_i(x_j)‖₁), each row divided by its sum (a row whose every c is 0
    stays 0). A source that pushes y_i away from itself scores 0 (clipped)."""
    size = resultant.abs().sum(-1, keepdim=True)  # (query, 1)
    distance = (resultant[:, None, :] - transformed).abs().sum(-1)  # (query, key)
    c = (size - distance).clamp(min=0)
    total = c.sum(-1, keepdim=True)
    return torch.where(total > 0, c / total.clamp(min=torch.finfo(c.dtype).tiny), c)


# -- the model's side -------------------------------------------------------------------------------------
def attention_output_norm(bundle, layer: nn.Module) -> nn.Module | None:
    """The norm a block applies to its attention output before the residual add (a ``"sandwich"`` block of
    :data:`cwviz.core.loading.architectures.BLOCKS`: Gemma 2 and 3, OLMo 2), or None."""
    if bundle.arch.block == "sandwich" and bundle.arch.attention_norm:
        return architectures.submodule(layer, bundle.arch.attention_norm)
    return None


def rms_scale(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The per-position, per-channel factor of an RMS norm frozen at its input ``x`` [T, d_model]: N(u) ≈ scale ⊙ u
    with N(x) = scale ⊙ x exactly. The gain is read from the module itself (N of a ones vector, whatever its weight
    convention: Gemma's 1 + w), the RMS from ``x`` with the module's epsilon."""
    eps = float(getattr(norm, "eps", getattr(norm, "variance_epsilon", 1e-6)))
    ones = torch.ones(1, x.shape[-1], dtype=x.dtype, device=x.device)
    gain = norm(ones).float()[0] * (1.0 + eps) ** 0.5  # (d_model,)
    inverse = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)  # (T, 1)
    return inverse * gain


def residual_streams(analysis: Analysis) -> list[torch.Tensor]:
    """The residual stream entering each layer, float32 [T, d_model] per layer, from one more clean pass of the
    analysed prompt (the model's ``output_hidden_states``; entry l is layer l's input)."""
    bundle = analysis.bundle
    ids = torch.tensor([analysis.input_ids], device=bundle.input_device)
    body = architectures.base_model(bundle.model)
    with torch.inference_mode(), forward_pass(bundle.attention_modules, record=False):
        states = body(input_ids=ids, use_cache=False, output_hidden_states=True).hidden_states
    return [s[0].float() for s in states[: analysis.num_layers]]


def projected_values(analysis: Analysis, layer: int) -> torch.Tensor:
    """ṽ_j^h = W_O^h v_j^h of one layer, float32 [head, key, d_model]."""
    value = analysis.values(layer)  # (head, key, d_head)
    return torch.einsum("hdk,hjk->hjd", analysis.w_heads(layer), value)


def check_decoder(analysis: Analysis) -> None:
    if not analysis.bundle.arch.causal or analysis.bundle.arch.block == "post_norm":
        raise InputError("ALTI is implemented for pre-norm decoders; this model is an encoder (post-norm): choose a causal model")


def alti_maps(analysis: Analysis) -> list[torch.Tensor]:
    """ALTI's per-layer contribution maps C^l [T, T] (:func:`alti_contributions`), layer by layer."""
    check_decoder(analysis)
    bundle = analysis.bundle
    blocks = architectures.layer_modules(bundle.model, bundle.arch)
    projections = bundle.out_projections
    multiplier = residual_multiplier(bundle)
    maps = []
    for layer, x in enumerate(residual_streams(analysis)):
        with torch.inference_mode():
            alpha = analysis.attention_tensor(layer)  # (head, T, T)
            projected = projected_values(analysis, layer)  # (head, T, d_model)
            x = x.to(projected.device)
            bias = getattr(projections[layer], "bias", None)
            bias = None if bias is None else bias.detach().float().to(projected.device)
            norm, scale = attention_output_norm(bundle, blocks[layer]), None
            if norm is not None:  # the norm's input is the attention block's output, o_i + b_O
                output = torch.einsum("hij,hjd->id", alpha, projected) + (0 if bias is None else bias)
                scale = rms_scale(norm, output.to(next(norm.parameters()).dtype))
            if multiplier != 1.0:
                scale = torch.full_like(x, multiplier) if scale is None else scale * multiplier
            rows = []
            for start in range(0, alpha.shape[1], ALTI_ROWS):
                block = slice(start, min(start + ALTI_ROWS, alpha.shape[1]))
                rows.append(alti_contributions(*transformed_vectors(alpha, projected, x, block, scale, bias)))
            maps.append(torch.cat(rows))
    return maps


# -- one position's scores --------------------------------------------------------------------------------
def raw_attention(analysis: Analysis, position: int) -> np.ndarray:
    """The last layer's attention of ``position`` on each token, averaged over heads, float32 [T]."""
    position = analysis.check_token(position)
    with torch.inference_mode():
        alpha = analysis.attention_tensor(analysis.num_layers - 1)  # (head, T, T)
        return alpha[:, position].mean(0).cpu().numpy().astype(np.float32)


def attention_rollout(analysis: Analysis, position: int) -> np.ndarray:
    """Attention rollout's row of ``position`` (Abnar and Zuidema 2020), float32 [T]."""
    position = analysis.check_token(position)
    with torch.inference_mode():
        maps = [residual_attention(analysis.attention_tensor(layer)).cpu() for layer in range(analysis.num_layers)]
        return rollout(maps)[position].numpy().astype(np.float32)


def alti(analysis: Analysis, position: int) -> np.ndarray:
    """ALTI's rolled-out row of ``position`` (Ferrando et al. 2022), float32 [T]."""
    position = analysis.check_token(position)
    with torch.inference_mode():
        return rollout([m.cpu() for m in alti_maps(analysis)])[position].numpy().astype(np.float32)


#: The baselines by name, each ``(analysis, position) -> scores [T]``.
BASELINES = {"raw": raw_attention, "rollout": attention_rollout, "alti": alti}
