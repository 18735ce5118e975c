"""The one place that knows how each supported architecture is laid out.

Everything cwviz needs from a model is reached through two seams:

* the attention function (a registered ``AttentionInterface`` entry, see :mod:`cwviz.core.capture`), which
  receives post-RoPE queries, keys and values (bias included) of every attention module, and
* the output projection ``W_O`` of each layer, whose weight gives the per-head slices ``W_O^h``.

An :class:`Architecture` says where those live, relative to ``model.base_model``. Adding a family that
uses transformers' attention interface is one more row in :data:`ARCHITECTURES`.

A third assumption, for causal models: the logits are the output layer (``get_output_embeddings()``)
applied as it is to the base model's final hidden states, with no logit scaling or soft-capping; cwviz
computes next-token log-probabilities that way (:func:`cwviz.core.analysis.next_token_logprobs`). Every row
is checked against the model's own logits in ``tests/test_architectures.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .errors import UnsupportedModelError


@dataclass(frozen=True)
class Architecture:
    """Where the attention pieces of one model family live.

    Paths are dotted attribute paths. ``layers`` is relative to ``model.base_model``; ``attention``
    (the module that calls the attention function) and ``out_proj`` (W_O) are relative to one layer.
    ``conv1d``: GPT-2's ``Conv1D`` stores its weight as [in, out], the transpose of ``nn.Linear``.
    ``auto_class``: the transformers auto class that gives a head with vocabulary logits.
    """

    family: str
    layers: str
    attention: str
    out_proj: str
    conv1d: bool = False
    auto_class: str = "AutoModelForCausalLM"
    causal: bool = True


_LLAMA_LIKE = dict(layers="layers", attention="self_attn", out_proj="self_attn.o_proj")

ARCHITECTURES: dict[str, Architecture] = {
    # Llama family: Llama 2/3, SmolLM2, DeepSeek's Llama-architecture models; grouped-query attention.
    "llama": Architecture("llama", **_LLAMA_LIKE),
    "mistral": Architecture("mistral", **_LLAMA_LIKE),
    "qwen2": Architecture("qwen2", **_LLAMA_LIKE),
    "qwen3": Architecture("qwen3", **_LLAMA_LIKE),
    # GPT-2: fused c_attn, Conv1D layout, biases on values and on the output projection.
    "gpt2": Architecture("gpt2", layers="h", attention="attn", out_proj="attn.c_proj", conv1d=True),
    # GPT-NeoX / Pythia: fused per-head query_key_value, partial rotary.
    "gpt_neox": Architecture("gpt_neox", layers="layers", attention="attention", out_proj="attention.dense"),
    # BERT: an encoder; bidirectional attention, W_O is BertSelfOutput.dense.
    "bert": Architecture(
        "bert",
        layers="encoder.layer",
        attention="attention.self",
        out_proj="attention.output.dense",
        auto_class="AutoModelForMaskedLM",
        causal=False,
    ),
}

SUPPORTED = ", ".join(sorted(ARCHITECTURES))


def architecture_for(model_type: str) -> Architecture:
    """The table row for a config's ``model_type``; a clear error listing the supported ones otherwise."""
    try:
        return ARCHITECTURES[model_type]
    except KeyError:
        raise UnsupportedModelError(
            f"architecture {model_type!r} is not supported; cwviz supports: {SUPPORTED} "
            "(models whose attention goes through transformers' AttentionInterface)"
        ) from None


def _get(root: nn.Module, path: str) -> nn.Module:
    module = root
    for part in path.split("."):
        module = getattr(module, part)
    return module


def layer_modules(model: nn.Module, arch: Architecture) -> list[nn.Module]:
    """The model's transformer blocks, in order."""
    return list(_get(model.base_model, arch.layers))


def attention_modules(model: nn.Module, arch: Architecture) -> list[nn.Module]:
    """The module of each layer that calls the attention function (index = layer)."""
    return [_get(layer, arch.attention) for layer in layer_modules(model, arch)]


def out_projections(model: nn.Module, arch: Architecture) -> list[nn.Module]:
    """W_O of each layer (an ``nn.Linear``, or GPT-2's ``Conv1D``)."""
    return [_get(layer, arch.out_proj) for layer in layer_modules(model, arch)]


def out_proj_weight(proj: nn.Module, arch: Architecture) -> torch.Tensor:
    """W_O as a [d_model, heads * d_head] matrix, whatever the module stores.

    A layer offloaded by accelerate (``device_map`` with "cpu" or "disk" parts) keeps its weight on the
    meta device between forward passes; the real one is read from the offload hook's weights map.
    """
    weight = proj.weight
    if weight.device.type == "meta":
        hook = getattr(proj, "_hf_hook", None)
        weights_map = getattr(hook, "weights_map", None)
        if weights_map is None:
            raise RuntimeError("the output projection's weight is on the meta device and no offload hook holds it")
        weight = weights_map["weight"].to(getattr(hook, "execution_device", None) or "cpu")
    return weight.t() if arch.conv1d else weight


def out_proj_bias(proj: nn.Module) -> torch.Tensor | None:
    """b_O, or None: reported separately, it is not any token's contribution (docs/METHOD.md section 1)."""
    return getattr(proj, "bias", None)
