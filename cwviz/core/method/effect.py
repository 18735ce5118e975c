"""The effect flow (docs/METHOD.md section 7): the paper's contribution vectors read against the gradient of the
prediction where they land.

A leaf m = 1 [T] scales every layer's values inside cwviz's attention function (:class:`ScaleValueColumns`: the
model's weights and forward are untouched), and the input embeddings are a leaf too. One forward pass without grad
keeps each layer's input; the backward then runs layer by layer, each layer recomputed with grad from its input
(one layer's activations held at a time, :func:`gradients`), and gives

| quantity                 | shape               | meaning                                                        |
|--------------------------|---------------------|----------------------------------------------------------------|
| ``totals``               | [key]               | ∂LD/∂m_k: first-order estimate of the relay knockout's effect  |
| ``origin``               | [key]               | ⟨e_k − ē, ∂LD/∂e_k⟩: the origin intervention's estimate        |
| ``input_x_gradient``     | [key]               | ⟨e_k, ∂LD/∂e_k⟩                                                 |
| head-output gradients    | per layer: head x query x d_head | ∂LD/∂z: g_i^l pulled back through W_O              |

and from those and the analysis's records, each layer's edges ⟨c_ik^{lh}, g_i^l⟩ summed over heads, [query, key] a
row block at a time (:func:`edges_of_layer`): α_ik^{lh} (∂LD/∂z_i^{lh}) · v_k^{lh}, in d_head space.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np
import torch

from ..loading import architectures
from ..util.errors import InputError
from .capture import forward_pass
from .hooks import Hook, context_hooks, first_of, hidden_of
from .residual import check_flow_supported
from .state import ModelState

_MEAN_EMBEDDINGS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@dataclass(frozen=True, eq=False)
class ScaleValueColumns:
    """An intervention (:class:`cwviz.core.method.capture.Intervention`): v_k ← scale_k v_k for every key k in every
    layer and head, for every query. ``scale`` [key] may require grad (the effect flow's m)."""

    scale: torch.Tensor

    def values(self, layer: int, value: torch.Tensor) -> torch.Tensor:
        # value (B, H_kv, K, d)
        return value * self.scale.to(value.device, value.dtype)[None, None, :, None]

    def keep(self, layer: int, num_queries: int, num_keys: int) -> torch.Tensor | None:
        return None


@dataclass(frozen=True, eq=False)
class Gradients:
    """What one backward pass of :func:`gradients` gives (module docstring). ``quantity``: LD in the clean pass;
    ``head_gradients[layer]``: ∂LD/∂z [head, query, d_head], float32 on the layer's device."""

    position: int
    target: int | None
    foil: int | None
    quantity: float
    totals: np.ndarray
    origin: np.ndarray
    input_x_gradient: np.ndarray
    head_gradients: tuple[torch.Tensor, ...]


def mean_embedding(bundle) -> torch.Tensor:
    """ē [d_model]: the mean of the input embedding module's outputs over the whole vocabulary (its scaling included,
    as Gemma's scaled embedding applies it), float32, computed once per embedding module (chunks of 16,384 rows)."""
    module = bundle.model.get_input_embeddings()
    cached = _MEAN_EMBEDDINGS.get(module)
    if cached is not None:
        return cached
    rows = module.weight.shape[0]
    total = torch.zeros(module.weight.shape[1], dtype=torch.float64)
    with torch.inference_mode():
        for start in range(0, rows, 16_384):
            ids = torch.arange(start, min(rows, start + 16_384), device=module.weight.device)
            total += module(ids).double().sum(0).cpu()
    mean = (total / rows).float()
    _MEAN_EMBEDDINGS[module] = mean
    return mean


def quantity(
    bundle, hidden: torch.Tensor, position: int, target: int | None, foil: int | None, direction=None
) -> torch.Tensor:
    """LD of section 7.1 for each batch row of ``hidden`` (the base model's final states [batch, T, d_model]): a causal
    LM's logit(target) − logit(foil) at ``position`` (the target's logit alone without a foil); an encoder's ⟨y_p, u⟩
    with ``direction`` u [d_model] (None: the clean y_p's own, returned detached)."""
    at_p = hidden[:, position]  # (B, d_model)
    if bundle.has_logits:
        logits = bundle.output_logits(at_p).float()  # (B, vocab)
        return logits[:, target] - (0 if foil is None else logits[:, foil])
    at_p = at_p.float()
    if direction is None:
        direction = (at_p[0] / at_p[0].norm()).detach()
    return at_p @ direction.to(at_p.device)


class _Reached(Exception):
    """Raised by a hook on the first layer to end a pass there (the embedding stage's backward needs no more)."""


def _with_hidden(args: tuple, kwargs: dict, hidden: torch.Tensor) -> tuple[tuple, dict]:
    """A layer's call ``(args, kwargs)`` with its hidden states replaced by ``hidden``."""
    if args:
        return (hidden, *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": hidden}


def _layer_calls(bundle, embeddings: torch.Tensor) -> tuple[list[tuple[tuple, dict]], torch.Tensor]:
    """One pass without grad from ``embeddings`` [1, T, d_model]: each layer's call ``(args, kwargs)`` as the model made
    it (masks, position embeddings), its hidden states detached, and the last layer's output [1, T, d_model]."""
    layers = architectures.layer_modules(bundle.model, bundle.arch)
    calls: list[tuple[tuple, dict]] = []
    last: list[torch.Tensor] = []

    def keep(args: tuple, kwargs: dict) -> None:
        calls.append(_with_hidden(args, kwargs, hidden_of(args, kwargs).detach().clone()))

    hooks = [Hook(layer, "call", keep) for layer in layers]
    hooks.append(Hook(layers[-1], "output", lambda output: last.append(output.detach().clone())))
    with torch.no_grad(), context_hooks(hooks), forward_pass(bundle.attention_modules, record=False):
        architectures.base_model(bundle.model)(inputs_embeds=embeddings, use_cache=False)
    return calls, last[-1]


def _backward_through_layers(bundle, calls, grad: torch.Tensor, tokens: int) -> tuple[torch.Tensor, torch.Tensor, list]:
    """From ∂LD/∂(the last layer's output) ``grad`` [1, T, d_model] down to the first layer's input, each layer
    recomputed with grad from its kept call under the value scales m: (∂LD/∂(the first layer's input) [1, T, d_model],
    ∂LD/∂m [T], each layer's ∂LD/∂z [head, query, d_head])."""
    layers = architectures.layer_modules(bundle.model, bundle.arch)
    scale = torch.ones(tokens, device=bundle.input_device, requires_grad=True)  # m
    d_scale = torch.zeros(tokens, device=bundle.input_device)
    head_grads: list[torch.Tensor] = [torch.empty(0)] * len(layers)
    for index in reversed(range(len(layers))):
        hidden = hidden_of(*calls[index]).requires_grad_(True)
        args, kwargs = _with_hidden(*calls[index], hidden)
        outputs: list[torch.Tensor] = []  # z (1, query, head, d_head) of this layer, in the graph
        with forward_pass(
            bundle.attention_modules,
            record=False,
            intervention=ScaleValueColumns(scale),
            observe=lambda _layer, z, kept=outputs: kept.append(z),
        ):
            out = first_of(layers[index](*args, **kwargs))
        (z,) = outputs
        grad, d_layer, d_z = torch.autograd.grad(out, [hidden, scale, z], grad_outputs=grad, allow_unused=True)
        d_scale += 0 if d_layer is None else d_layer
        d_z = torch.zeros_like(z) if d_z is None else d_z  # (1, T, H, dh)
        head_grads[index] = d_z[0].transpose(0, 1).float().detach()  # (H, T, dh)
    return grad, d_scale, head_grads


def _embedding_gradient(bundle, embeddings: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """∂LD/∂e [1, T, d_model] from ∂LD/∂(the first layer's input) ``grad``: the embedding stage (position embeddings,
    an embedding norm) run again with grad from the embeddings, up to the first layer."""
    first = architectures.layer_modules(bundle.model, bundle.arch)[0]
    leaf = embeddings.detach().requires_grad_(True)
    reached: list[torch.Tensor] = []

    def stop(hidden: torch.Tensor) -> None:
        reached.append(hidden)
        raise _Reached

    try:
        with context_hooks([Hook(first, "input", stop)]), forward_pass(bundle.attention_modules, record=False):
            architectures.base_model(bundle.model)(inputs_embeds=leaf, use_cache=False)
    except _Reached:
        pass
    (d_embed,) = torch.autograd.grad(reached[0], leaf, grad_outputs=grad)
    return d_embed


def gradients(analysis, position: int, target: int | None, foil: int | None) -> Gradients:
    """One forward pass and one backward (module docstring), for the prompt of ``analysis`` (its model, as it was:
    ModelChangedError otherwise). ``target``/``foil``: checked token ids (None for an encoder).

    The backward runs layer by layer, recomputing each layer from its input (kept by the forward pass, without
    grad): what autograd keeps at once is one layer's activations, not every layer's (at 2,048 tokens on SmolLM2 the
    whole graph held 3.5 GB above the model). Each layer is called as the model called it (its own arguments, read
    by a hook: masks, position embeddings), under the value scales m; the embedding stage (position embeddings,
    an embedding norm) is run again up to the first layer for ∂LD/∂e. Hooks are this thread's, always removed."""
    analysis.check_model()
    bundle = analysis.bundle
    check_flow_supported(bundle)  # a derived row knows no final norm to differentiate through
    state = ModelState(bundle)
    arch = bundle.arch
    base = architectures.base_model(bundle.model)
    final_norm = architectures.submodule(base, arch.final_norm) if arch.final_norm else None
    ids = torch.tensor([analysis.input_ids], device=bundle.input_device)  # (1, T)
    with torch.no_grad():
        embeddings = bundle.model.get_input_embeddings()(ids)  # (1, T, d_model)
    calls, last = _layer_calls(bundle, embeddings)
    with torch.enable_grad():
        # the quantity from the last layer's output: the final norm (as the base model applies it), then LD
        output = last.requires_grad_(True)
        value = quantity(bundle, output if final_norm is None else final_norm(output), position, target, foil)[0]
        (grad,) = torch.autograd.grad(value, output)  # (1, T, d_model): ∂LD/∂(the last layer's output)
        grad, d_scale, head_grads = _backward_through_layers(bundle, calls, grad, ids.shape[1])
        d_embed = _embedding_gradient(bundle, embeddings, grad)
    state.check()
    mean = mean_embedding(bundle).to(d_embed.device)
    e, d_embed = embeddings[0].float(), d_embed[0].float()  # (T, d_model)
    return Gradients(
        position=position,
        target=target,
        foil=foil,
        quantity=float(value.detach()),
        totals=d_scale.detach().float().cpu().numpy(),
        origin=((e - mean) * d_embed).sum(-1).cpu().numpy(),
        input_x_gradient=(e * d_embed).sum(-1).cpu().numpy(),
        head_gradients=tuple(head_grads),
    )


def edges_of_layer(analysis, grads: Gradients, layer: int):
    """Layer ``layer``'s edges summed over heads, one row block at a time: yields (first, stop, weights [rows, keys]
    float32) with weights[i, k] = Σ_h α_ik^h (∂LD/∂z_i^h) · v_k^h = edge(layer, k → first + i) (section 7.1)."""
    values = analysis.values(layer)  # (H, T, dh)
    grad = grads.head_gradients[layer].to(values.device)  # (H, T, dh)
    with torch.inference_mode():
        for first, stop, alpha in analysis.attention_row_blocks(layer):  # alpha (H, rows, keys)
            keys = alpha.shape[-1]
            dots = grad[:, first:stop] @ values[:, :keys].transpose(-1, -2)  # (H, rows, keys)
            yield first, stop, (alpha * dots).sum(0)


def head_parts(analysis, grads: Gradients) -> np.ndarray:
    """head(l, h) = Σ_i (∂LD/∂z_i^h) · z_i^h [layer, head] (Σ_k α_ik v_k = z_i: the edges of a head summed without
    forming them), from the recorded outputs."""
    out = np.zeros((analysis.num_layers, analysis.num_heads), np.float32)
    with torch.inference_mode():
        for layer in range(analysis.num_layers):
            z = analysis.recorded_outputs(layer).float()  # (H, T, dh)
            out[layer] = (grads.head_gradients[layer].to(z.device) * z).sum((-1, -2)).cpu().numpy()
    return out


def top_token(analysis, position: int, foil: int | None = None) -> int:
    """The model's top next token at ``position`` (one forward pass without grad): the default target. InputError
    when it is the ``foil``."""
    bundle = analysis.bundle
    with torch.inference_mode(), forward_pass(bundle.attention_modules, record=False):
        hidden = bundle.final_hidden(torch.tensor([analysis.input_ids]))  # (1, T, d_model)
        target = int(bundle.output_logits(hidden[0, position]).float().argmax())
    if target == foil:
        raise InputError(
            f"the foil (token {foil}) is the model's top next token, the default target: name another target"
        )
    return target
