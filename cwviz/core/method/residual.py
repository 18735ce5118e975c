"""The residual stream of one prompt, as the signed flow needs it (docs/METHOD.md section 6.1).

One extra forward pass, with forward hooks on the layers, their output projections and the norms of the row's
block (:data:`cwviz.core.loading.architectures.BLOCKS`), registered in a context manager and always removed. The hooks
record only the pass of the thread that registered them, so a model shared with other threads (the dashboard)
is left as it was for them.

Each layer is reduced as its hooks fire, so the pass keeps O(layers x T x d_model) floats, never the T x T maps:

| field of :class:`LayerStream` | shape        | meaning                                                          |
|-------------------------------|--------------|------------------------------------------------------------------|
| target                        | [query, d_model] | L_iᵀ h_i: a write v lands as L_i(v), and ⟨L_i(v), h_i⟩ = ⟨v, target_i⟩ |
| norm2                         | [query]      | ‖h_i‖²                                                           |
| residual                      | [query]      | the residual's own part ⟨R_i(x_i), h_i⟩ (a parallel block: x_i + its MLP's write) |
| bias                          | [query]      | ⟨L_i(b_O), h_i⟩ + ⟨β, h_i⟩                                       |
| landing                       | [d_model] maps | L_p, the frozen landing map at the chosen position p            |
| mlp                           | [d_model]    | what the layer's MLP adds at p                                   |
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from ..loading import architectures
from ..loading.models import Bundle
from ..util.errors import UnsupportedModelError
from .capture import forward_pass


@dataclass(frozen=True)
class FrozenNorm:
    """A position-wise map frozen at the model's own input (docs/METHOD.md section 6.1, the linearisation):
    L_i(v) = scale_i · gain ⊙ C v, C the centring when ``centred`` (LayerNorm), else the identity; ``bias`` β is
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

    def row(self, position: int) -> FrozenNorm:
        """The map of one position only (scale of length 1)."""
        return FrozenNorm(self.scale[position : position + 1], self.gain, self.bias, self.centred)


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


@dataclass(frozen=True)
class LayerStream:
    """One layer of the residual stream, reduced (the module docstring's table). ``landing`` L_p is None for an
    identity landing times ``multiplier``; ``mlp`` [d_model] is what the layer's MLP adds at p."""

    target: torch.Tensor
    norm2: torch.Tensor
    residual: torch.Tensor
    bias: torch.Tensor
    landing: FrozenNorm
    mlp: torch.Tensor


@dataclass(frozen=True)
class Stream:
    """The residual stream of one prompt: :class:`LayerStream` per layer, and at the chosen position p the
    embedding x_p^0 [d_model], the final residual x_p^L [d_model], the final norm frozen there (None: the model
    has none) and its output [d_model]. ``block``: the row's block for this config."""

    layers: tuple[LayerStream, ...]
    position: int
    embedding: torch.Tensor
    final: torch.Tensor
    final_norm: FrozenNorm | None
    final_output: torch.Tensor
    block: str


def hidden_of(args, kwargs) -> torch.Tensor:
    """The hidden states a block is called with (its first argument, or ``hidden_states=``)."""
    return args[0] if args else kwargs["hidden_states"]


def first_of(output) -> torch.Tensor:
    """A module's main output (the first of a tuple)."""
    return output[0] if isinstance(output, tuple | list) else output


@contextlib.contextmanager
def thread_hooks(entries):
    """Register ``(module, when, fn)`` hooks (``when``: "pre" with kwargs, or "post") that run only in this thread;
    always removed on leaving."""
    owner = threading.get_ident()
    handles = []

    def guarded(fn):
        def hook(*args):
            if threading.get_ident() == owner:
                fn(*args)

        return hook

    try:
        for module, when, fn in entries:
            if when == "pre":
                handles.append(module.register_forward_pre_hook(guarded(fn), with_kwargs=True))
            else:
                handles.append(module.register_forward_hook(guarded(fn)))
        yield
    finally:
        for handle in handles:
            handle.remove()


def residual_multiplier(bundle: Bundle) -> float:
    """The factor a block multiplies its writes by before the residual add (Granite's ``residual_multiplier``), else 1."""
    name = bundle.arch.residual_multiplier
    value = getattr(bundle.model.config, name, None) if name else None
    return 1.0 if value is None else float(value)


def check_flow_supported(bundle: Bundle) -> str:
    """The row's block for this model, or UnsupportedModelError for a derived row (it does not know the block)."""
    arch = bundle.arch
    if arch.derived:
        raise UnsupportedModelError(
            f"the signed flow needs the block layout of the model's family (where the attention write lands), and "
            f"{arch.family!r} has a derived row that does not know it: add a row to cwviz.core.loading.architectures.ARCHITECTURES "
            f"with its block ({', '.join(architectures.BLOCKS)})"
        )
    return architectures.block_of(bundle.model.config, arch)


def record_stream(bundle: Bundle, input_ids: list[int], position: int, outputs: Callable[[int], torch.Tensor] | None = None) -> Stream:
    """Run the model once on ``input_ids`` and reduce its residual stream (the module docstring); p = ``position``.

    ``outputs(layer)``: the attention output z [head, query, d_head] a recorded pass of this prompt gave layer
    ``layer`` (:attr:`~cwviz.core.method.capture.LayerRecord.output`). Given it, the pass replays those outputs instead of
    computing attention again (no scores, no softmax, no weighted values), so the residual stream is that recorded
    pass's own, bit for bit; the projections, norms and MLPs still run. None: the model's own attention."""
    replay = (
        forward_pass(bundle.attention_modules, record=False, attend=lambda layer, _: outputs(layer))
        if outputs
        else contextlib.nullcontext()
    )
    with torch.inference_mode(), stream_hooks(bundle, position) as finish, replay:
        hidden = bundle.final_hidden(torch.tensor([input_ids], device=bundle.input_device))[0]
    return finish(hidden)


@contextlib.contextmanager
def stream_hooks(bundle: Bundle, position: int) -> Iterator[Callable[[torch.Tensor], Stream]]:
    """Hooks that reduce the residual stream (the module docstring; p = ``position``) of the pass this thread runs
    inside the block, whoever runs it (:func:`record_stream`'s own, or :func:`~cwviz.core.method.analysis.analyze`'s
    recorded pass). Yields ``finish(hidden)``: after the pass, the :class:`Stream`, from the pass's final hidden states
    ``hidden`` [T, d_model]. The hooks are removed on leaving, whatever happened."""
    block = check_flow_supported(bundle)
    arch, model = bundle.arch, bundle.model
    layers = architectures.layer_modules(model, arch)
    projections = architectures.out_projections(model, arch)
    base = architectures.base_model(model)
    multiplier = residual_multiplier(bundle)
    seen: dict = {}
    reduced: list[LayerStream] = []
    final: dict = {}

    def reduce(layer: int, x: torch.Tensor, out: torch.Tensor, following: torch.Tensor) -> None:
        """Reduce layer ``layer`` from its input x, the output projection's output (a + b_O) and its output."""
        b_o = getattr(projections[layer], "bias", None)
        b_o = torch.zeros_like(x[0]) if b_o is None else b_o.detach().float().to(x.device)
        if block == "pre_norm":
            h, landing, resid_of = seen.pop("mid"), FrozenNorm(torch.full_like(x[:, 0], multiplier)), x
        elif block == "parallel":
            h, landing = following, FrozenNorm(torch.full_like(x[:, 0], multiplier))
            resid_of = following - multiplier * out
        else:
            n_in, n_out = seen.pop("norm")
            landing = freeze(submodule_of(layer, arch.attention_norm), n_in, n_out)
            h = n_out if block == "post_norm" else x + n_out
            resid_of = landing.apply(x) if block == "post_norm" else x
        target = landing.pullback(h)
        bias = (b_o * target).sum(-1) + (0 if landing.bias is None else h @ landing.bias)
        mlp = following[position] - h[position] if block != "parallel" else following[position] - x[position] - multiplier * out[position]
        reduced.append(LayerStream(target, (h * h).sum(-1), (resid_of * h).sum(-1), bias, landing.row(position), mlp))

    def submodule_of(layer: int, path: str) -> nn.Module:
        return architectures.submodule(layers[layer], path)

    entries = []
    for index, layer in enumerate(layers):

        def on_input(module, args, kwargs, index=index):
            seen["x"] = hidden_of(args, kwargs).detach()[0].float()
            if index == 0:
                final["embedding"] = seen["x"][position].clone()

        def on_output(module, args, output, index=index):
            reduce(index, seen.pop("x"), seen.pop("out"), first_of(output).detach()[0].float())

        def on_proj(module, args, output):
            seen["out"] = first_of(output).detach()[0].float()

        entries += [(layer, "pre", on_input), (layer, "post", on_output), (architectures.submodule(layer, arch.out_proj), "post", on_proj)]
        if block == "pre_norm":

            def on_mid(module, args, kwargs):
                seen["mid"] = hidden_of(args, kwargs).detach()[0].float()

            entries.append((architectures.submodule(layer, arch.mid), "pre", on_mid))
        elif block in ("sandwich", "post_norm"):

            def on_norm(module, args, output):
                seen["norm"] = (args[0].detach()[0].float(), first_of(output).detach()[0].float())

            entries.append((architectures.submodule(layer, arch.attention_norm), "post", on_norm))
    norm = architectures.submodule(base, arch.final_norm) if arch.final_norm else None
    if norm is not None:

        def on_final(module, args, output):  # p's row only: [1, d_model] each
            final["io"] = tuple(t.detach()[0, position : position + 1].float() for t in (args[0], first_of(output)))

        entries.append((norm, "post", on_final))

    def finish(hidden: torch.Tensor) -> Stream:
        if len(reduced) != len(layers):
            raise RuntimeError(f"the residual stream saw {len(reduced)} of {len(layers)} layers: was the pass run inside the hooks?")
        if norm is not None:
            x_p, out_p = final["io"]
            frozen, last, output = freeze(norm, x_p, out_p), x_p[0], out_p[0]
        else:
            frozen, last, output = None, hidden[position].float(), hidden[position].float()
        return Stream(tuple(reduced), position, final["embedding"], last, frozen, output, block)

    with thread_hooks(entries):
        yield finish
