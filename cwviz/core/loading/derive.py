"""Derived rows: the layout of a model type that is not in :data:`cwviz.core.loading.architectures.ARCHITECTURES`.

A model whose attention goes through transformers' ``AttentionInterface`` tells cwviz most of what a row
says by running: the modules that call the attention function are the attention modules, and their paths
(``<layers>.<i>.<attention>``) give the layers. The output projection W_O is found by name in a layer
(:data:`PROJECTION_NAMES`, inside the attention module first), with the width the recorded heads give.

The row is then checked, once, at load time by a short probe (:data:`PROBE_TOKENS` tokens): for every layer,
Σ_j α_ij^h v_j^h computed from the records (the α cwviz computes, the values the model gave) must equal the
input the model itself gives that output projection, to float32 rounding; the final hidden states with cwviz's
attention must be those the model's own eager attention gives (the checks above compare cwviz with itself, so a
wrong guess of the seam, e.g. of a layer's causality, would pass them); and, for a causal LM, the output
layer applied to the final hidden states (with the logit scaling or soft-capping its config names) must give
the model's own logits. A model in which one attention module runs more than once a pass (ALBERT's shared
layer) is refused: cwviz keeps one record per module. A model that fails is refused with an error saying so:
cwviz never shows numbers from a layout it could not check.
"""

from __future__ import annotations

import logging
import re
from dataclasses import replace

import torch
from torch import nn

from ..method.capture import ATTN_IMPLEMENTATION, attention_callers, forward_pass
from ..method.hooks import Hook, context_hooks
from ..method.measures import expand_kv
from ..util.errors import UnsupportedModelError
from .architectures import (
    LOGIT_ATTRIBUTES,
    SUPPORTED,
    Architecture,
    base_model,
    out_proj_weight,
    output_logits,
    submodule,
)

log = logging.getLogger(__name__)

#: Names an output projection goes by (Llama o_proj, OPT/BART out_proj, BERT/Phi dense, GPT-2 c_proj,
#: DistilBERT out_lin, ModernBERT Wo, T5 o), tried in this order within a layer.
PROJECTION_NAMES = ("o_proj", "out_proj", "c_proj", "dense", "out_lin", "Wo", "wo", "o")
#: Tokens of the load-time probe.
PROBE_TOKENS = 12
#: Largest |difference| the probe allows, relative to the largest |entry| of the projection's input (or 1).
PROBE_TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-8}
PROBE_TOLERANCE_LOW = 3e-2  # bfloat16, float16

_LAYER_PATH = re.compile(r"^(?P<layers>.+)\.(?P<index>\d+)\.(?P<attention>.+)$")


def _refuse(model_type: str, why: str) -> UnsupportedModelError:
    return UnsupportedModelError(
        f"architecture {model_type!r} has no row in cwviz's table and none could be derived: {why}. "
        f"Checked families: {SUPPORTED}; to add a row see docs/ARCHITECTURE.md ('How to add an architecture')"
    )


def _probe_ids(model: nn.Module) -> torch.Tensor:
    vocab = int(getattr(model.config, "vocab_size", 0) or 100)
    device = model.get_input_embeddings().weight.device
    return (torch.arange(PROBE_TOKENS, device=device)[None] * 7 + 3) % vocab  # (1, T)


def _run(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """The base model's final hidden states [T, d_model] for ``ids`` (1, T)."""
    return base_model(model)(input_ids=ids, use_cache=False).last_hidden_state[0]


def _layout(model: nn.Module, callers: list[nn.Module]) -> tuple[str, str]:
    """``(layers, attention)`` paths from the modules that called the attention function, in call order.

    A module that called it more than once in the pass is refused: weights shared across depth (ALBERT runs one
    layer ``num_hidden_layers`` times) would be one module, hence one layer and one record, for several passes."""
    model_type = model.config.model_type
    names = {id(m): n for n, m in base_model(model).named_modules()}
    unique = list({id(m): m for m in callers}.values())
    if len(unique) < len(callers):
        raise _refuse(
            model_type,
            f"its {len(unique)} attention module(s) ran {len(callers)} times in one forward pass (a layer whose "
            "weights are shared across depth, as ALBERT's): cwviz records each attention module once a pass",
        )
    paths = [names.get(id(m)) for m in unique]
    if not paths or any(p is None for p in paths):
        raise _refuse(model_type, "no module of the base model calls transformers' AttentionInterface")
    matches = [_LAYER_PATH.match(p) for p in paths]
    if any(m is None for m in matches):
        raise _refuse(model_type, f"its attention modules are not in one list of layers ({', '.join(paths)})")
    layers = {m["layers"] for m in matches}
    attention = {m["attention"] for m in matches}
    indices = [int(m["index"]) for m in matches]
    if len(layers) != 1 or len(attention) != 1 or indices != list(range(len(indices))):
        raise _refuse(
            model_type, f"its attention modules do not form one module per layer, in order ({', '.join(paths)})"
        )
    return layers.pop(), attention.pop()


def _projection(layer: nn.Module, attention: str, width: int) -> tuple[str, bool]:
    """``(path relative to the layer, is Conv1D)`` of the output projection: a Linear (or GPT-2 Conv1D) named as
    in :data:`PROJECTION_NAMES` that takes ``width`` (heads x d_head) inputs; inside the attention module first,
    then under the attention module's parent, then anywhere in the layer."""
    found = []
    for path, module in layer.named_modules():
        name = path.rsplit(".", 1)[-1]
        conv1d = type(module).__name__ == "Conv1D"
        if name not in PROJECTION_NAMES or not (isinstance(module, nn.Linear) or conv1d):
            continue
        inputs = module.weight.shape[0] if conv1d else module.weight.shape[1]
        if inputs != width:
            continue
        parent = attention.rsplit(".", 1)[0] + "." if "." in attention else ""
        where = 0 if path.startswith(attention + ".") else 1 if parent and path.startswith(parent) else 2
        found.append((where, PROJECTION_NAMES.index(name), path, conv1d))
    if not found:
        return "", False
    _, _, path, conv1d = min(found)
    return path, conv1d


def _mismatch(got: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> tuple[float, float]:
    """``(largest difference, tolerance)`` of one probe check: ``dtype``'s :data:`PROBE_TOLERANCE` scaled by the
    expected values' largest magnitude (at least 1); the difference is infinite when the shapes differ."""
    tolerance = PROBE_TOLERANCE.get(dtype, PROBE_TOLERANCE_LOW) * max(1.0, float(expected.abs().max()))
    error = float((got - expected.to(got.device)).abs().max()) if got.shape == expected.shape else float("inf")
    return error, tolerance


def _check_logits(model: nn.Module, arch: Architecture, ids: torch.Tensor, hidden: torch.Tensor) -> Architecture:
    """``arch`` with the logit scaling and soft-capping its config names (:data:`LOGIT_ATTRIBUTES`), checked: for
    a causal LM the output layer applied to the final hidden states, then those, must give the model's own logits
    (what cwviz's log-probabilities and perplexities use); otherwise the model is refused. ``hidden``: the final
    hidden states of ``ids`` under cwviz's attention (:func:`_check_eager` gives them)."""
    config = model.config
    arch = replace(
        arch, **{field: name for field, name in LOGIT_ATTRIBUTES.items() if getattr(config, name, None) is not None}
    )
    if not arch.causal or model.get_output_embeddings() is None:
        return arch
    with torch.inference_mode():
        expected = model(input_ids=ids, use_cache=False).logits[0].float()  # (T, vocab)
        got = output_logits(model, arch, hidden).float()
    error, tolerance = _mismatch(got, expected, hidden.dtype)
    if not error <= tolerance:
        raise _refuse(
            config.model_type,
            f"its logits are not its output layer applied to the final hidden states (differ by {error:.3g}, tolerance "
            f"{tolerance:.3g}), so cwviz's log-probabilities would not be the model's",
        )
    return arch


def _check_eager(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Refuse the model unless its final hidden states with cwviz's attention (outside a pass: SDPA, with cwviz's
    masks and causality) are those of its own eager attention, within the probe's tolerance.

    The other checks compare cwviz with itself (the records against the same pass), so a wrong reading of the seam
    would pass them: an encoder taken as causal changes the model's outputs and its records alike. The model is
    switched to eager attention for one pass and back (it is not yet shared: derivation runs while it loads).
    Returns the final hidden states under cwviz's attention [T, d_model], for :func:`_check_logits`."""
    with torch.inference_mode():
        hidden = _run(model, ids)  # (T, d_model), in the model's dtype: its tolerance below
    model.set_attn_implementation("eager")
    try:
        with torch.inference_mode():
            expected = _run(model, ids).float()
    finally:
        model.set_attn_implementation(ATTN_IMPLEMENTATION)
    error, tolerance = _mismatch(hidden.float(), expected, hidden.dtype)
    if not error <= tolerance:
        raise _refuse(
            model.config.model_type,
            "the probe failed: its final hidden states with cwviz's attention differ from those of its own eager "
            "attention "
            f"by {error:.3g} (tolerance {tolerance:.3g}), so cwviz would not analyse the model's own attention",
        )
    return hidden


def derive_architecture(model: nn.Module) -> Architecture:
    """A checked :class:`~cwviz.core.loading.architectures.Architecture` for a model with no row, or
    UnsupportedModelError.

    The model must already use cwviz's attention function (:func:`cwviz.core.loading.models.bundle_from_model` sets it).
    A few forward passes of :data:`PROBE_TOKENS` tokens: one finds the modules that call the attention function,
    one records them to learn the heads' width, one records them again while pre-hooks (removed before returning)
    read what each output projection receives, two compare cwviz's attention with the model's eager attention
    (:func:`_check_eager`), and, for a causal LM, one more gives the logits to compare.
    """
    ids = _probe_ids(model)
    layers_path, attention_path = _layout(model, _attention_callers(model, ids))
    arch = _row(model, ids, layers_path, attention_path)
    _check_projections(model, arch, ids)
    hidden = _check_eager(model, ids)
    arch = _check_logits(model, arch, ids, hidden)
    log.info(
        "derived the layout of %r (%s.N.%s, W_O %s) and checked it on %d tokens",
        arch.family,
        arch.layers,
        arch.attention,
        arch.out_proj,
        PROBE_TOKENS,
    )
    return arch


def _attention_callers(model: nn.Module, ids: torch.Tensor) -> list:
    """The modules that call the attention function in one pass of ``ids`` (:func:`attention_callers`); the model is
    refused, saying why, when the pass fails."""
    model_type = getattr(model.config, "model_type", "?")
    try:
        with torch.inference_mode(), attention_callers() as callers:
            _run(model, ids)
    except Exception as err:  # a forward pass that needs more than input_ids
        why = f"{type(err).__name__}: {err}"
        if not callers and not getattr(model, "_supports_attention_backend", False):
            # transformers 5.24 only warns when an attention function is set on such a model (MPT); the pass then
            # fails on cwviz's mask function before any attention call, and that failure is not the reason.
            raise _refuse(
                model_type,
                f"no module of the base model calls transformers' AttentionInterface (transformers does not mark "
                f"{type(model).__name__} as supporting attention functions, and the probe failed before any attention "
                f"call: {why})",
            ) from err
        raise _refuse(model_type, f"a probe forward pass failed ({why})") from err
    return callers


def _layer_modules(model: nn.Module, layers_path: str, attention_path: str) -> tuple[list[nn.Module], list[nn.Module]]:
    """The model's layers (``<layers_path>.<i>``) and the attention module of each (``.<attention_path>``)."""
    layers = list(submodule(base_model(model), layers_path))
    return layers, [submodule(layer, attention_path) for layer in layers]


def _row(model: nn.Module, ids: torch.Tensor, layers_path: str, attention_path: str) -> Architecture:
    """The derived row, before its checks: one recorded pass of ``ids`` gives the heads' width and whether the model
    is causal, and the width names the output projection (:func:`_projection`)."""
    model_type = getattr(model.config, "model_type", "?")
    layers, attention = _layer_modules(model, layers_path, attention_path)
    with torch.inference_mode(), forward_pass(attention) as records:
        _run(model, ids)
    if len(records) != len(attention):
        raise _refuse(
            model_type, f"{len(records)} of {len(attention)} layers called the attention function in one pass"
        )
    first = records[0]
    # the values' width (latent attention: not the queries')
    heads, d_head = first.query.shape[0], first.value.shape[-1]
    # Causal: in no layer does a query see a later key (the layer's own mask, or its causality when it has none).
    causal = not any(records[layer].key_mask().triu(1).any() for layer in range(len(attention)))
    out_path, conv1d = _projection(layers[0], attention_path, heads * d_head)
    if not out_path:
        raise _refuse(
            model_type,
            f"no output projection named {'/'.join(PROJECTION_NAMES)} takes its {heads} x {d_head} head outputs",
        )
    return Architecture(
        family=model_type,
        layers=layers_path,
        attention=attention_path,
        out_proj=out_path,
        conv1d=conv1d,
        auto_class="AutoModelForCausalLM" if causal else "AutoModelForMaskedLM",
        causal=causal,
        derived=True,
    )


def _check_projections(model: nn.Module, arch: Architecture, ids: torch.Tensor) -> None:
    """Refuse the model unless, in every layer, Σ_j α_ij^h v_j^h from the records (the α cwviz computes, the values the
    model gave) is the input the model gives its output projection, to the probe's tolerance: one recorded pass of
    ``ids`` with a hook on each projection's input (removed before returning)."""
    model_type, out_path = arch.family, arch.out_proj
    layers, attention = _layer_modules(model, arch.layers, arch.attention)
    projections = [submodule(layer, out_path) for layer in layers]
    seen: dict[int, torch.Tensor] = {}  # layer -> what its projection received, (T, H * d)
    # the one hook mechanism (cwviz.core.method.hooks): another thread's pass of a shared model calls none of these
    hooks = [
        Hook(proj, "input", lambda x, layer=layer: seen.__setitem__(layer, x[0].detach().float()))
        for layer, proj in enumerate(projections)
    ]
    with torch.inference_mode(), context_hooks(hooks), forward_pass(attention) as records:
        _run(model, ids)
    for layer, proj in enumerate(projections):
        rec = records.get(layer)
        if rec is None or layer not in seen:
            raise _refuse(model_type, f"layer {layer}'s output projection {out_path} did not run in the probe")
        heads, d_head = records[0].query.shape[0], records[0].value.shape[-1]  # the widths the row was derived for
        if out_proj_weight(proj, arch).shape[1] != heads * d_head:
            raise _refuse(model_type, f"layer {layer}'s {out_path} does not take {heads} x {d_head} head outputs")
        alpha = rec.probabilities(rec.query.float(), rec.key.float(), rec.mask, rec.causal)  # (H, T, T)
        value = expand_kv(rec.value.float(), heads)  # (H, T, d)
        z = (alpha @ value).transpose(0, 1).reshape(alpha.shape[1], -1)  # (T, H * d), the projection's input
        error, tolerance = _mismatch(z, seen[layer], rec.value.dtype)
        if not error <= tolerance:
            raise _refuse(
                model_type,
                f"the probe failed: in layer {layer}, Σ_j α_ij v_j from the recorded attention differs from the input "
                f"of {out_path} by {error:.3g} (tolerance {tolerance:.3g}), so its layer output is not the heads' "
                "weighted values",
            )
