"""A norm frozen at the model's own input: the linearisation of docs/METHOD.md section 6.1.

A norm N(y) = r(y) · g ⊙ C y + β (RMSNorm: C the identity; LayerNorm: C the centring) is replaced at each position i
by the linear map L_i(v) = r(y_i) · g ⊙ C v, with r frozen at the model's own input y_i: L_i(y_i) + β = N(y_i)
exactly. g, β and whether N centres are read from the module itself (called on probe vectors), never from the
family's name, so Gemma's (1 + w) and LayerNorm's bias need no branch. The residual recorder
(:mod:`cwviz.core.method.residual`) freezes the norm a block layout lands its attention write through, and the final
norm at the explained position.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class FrozenNorm:
    """L_i(v) = scale_i · gain ⊙ C v, C the centring when ``centred`` (LayerNorm), else the identity; ``bias`` β is
    added by the norm but is no part of L (None: no bias). ``gain`` None: a plain multiple, L_i(v) = scale_i · v.

    | field  | shape     |
    |--------|-----------|
    | scale  | [query]   |
    | gain   | [d_model] |
    | bias   | [d_model] |
    """

    scale: torch.Tensor
    gain: torch.Tensor | None = None
    bias: torch.Tensor | None = None
    centred: bool = False

    def _centre(self, v: torch.Tensor) -> torch.Tensor:
        return v - v.mean(-1, keepdim=True) if self.centred else v

    def apply(self, v: torch.Tensor) -> torch.Tensor:
        """L_i(v_i) for v [query, d_model] (or [..., query, d_model])."""
        gain = 1 if self.gain is None else self.gain
        return self.scale[:, None] * gain * self._centre(v)

    def pullback(self, w: torch.Tensor) -> torch.Tensor:
        """L_iᵀ w_i for w [query, d_model]: C is symmetric, so L_iᵀ w = scale_i · C(gain ⊙ w)."""
        gain = 1 if self.gain is None else self.gain
        return self.scale[:, None] * self._centre(gain * w)

    def rows(self, first: int, stop: int) -> FrozenNorm:
        """The map of the positions ``first..stop-1`` only (scale of length stop - first)."""
        return FrozenNorm(self.scale[first:stop], self.gain, self.bias, self.centred)

    def row(self, position: int) -> FrozenNorm:
        """The map of one position only (scale of length 1)."""
        return self.rows(position, position + 1)


def _probe(norm: nn.Module, d_model: int, device) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """(gain up to a positive factor, bias β, whether it centres) of a norm N(y) = r(y) g ⊙ C y + β, read from the
    module itself: N(0) = β; two alternating ±1 probes of mean 0 (shifted, so that an odd width is covered) give g
    times one common r; N(1) − β is 0 exactly when N centres."""
    dtype = next((p.dtype for p in norm.parameters()), torch.float32)
    sign = torch.tensor([1.0, -1.0], device=device).repeat((d_model + 1) // 2)[:d_model]
    if d_model % 2:
        sign[-1] = 0
    probes = torch.stack([torch.zeros(d_model, device=device), sign, sign.roll(1), torch.ones(d_model, device=device)])
    with torch.inference_mode():
        out = norm(probes.to(dtype)).float()
    bias = out[0]
    gain = ((out[1] - bias) * probes[1] + (out[2] - bias) * probes[2]) / (probes[1].abs() + probes[2].abs())
    centred = bool((out[3] - bias).abs().max() <= 1e-4 * gain.abs().max())
    return gain, bias, centred


def freeze(norm: nn.Module, inputs: torch.Tensor, outputs: torch.Tensor) -> FrozenNorm:
    """The norm ``norm`` frozen at its own ``inputs`` [T, d_model], whose ``outputs`` the model gave: the scale of
    each row is fitted to the output (least squares, exact for an RMSNorm or a LayerNorm; a norm of any other form
    leaves rows that do not sum to 1, which the tests catch)."""
    gain, bias, centred = _probe(norm, inputs.shape[-1], inputs.device)
    shaped = gain * (inputs - inputs.mean(-1, keepdim=True) if centred else inputs)
    scale = ((outputs - bias) * shaped).sum(-1) / (shaped * shaped).sum(-1).clamp_min(torch.finfo(torch.float32).tiny)
    return FrozenNorm(scale, gain, bias if bias.abs().max() > 0 else None, centred)
