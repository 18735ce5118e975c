"""The one place that knows how each supported architecture is laid out.

Everything cwviz needs from a model is reached through two seams:

* the attention function (a registered ``AttentionInterface`` entry, see :mod:`cwviz.core.method.capture`), which
  receives post-RoPE queries, keys and values (bias included) of every attention module, and
* the output projection ``W_O`` of each layer, whose weight gives the per-head slices ``W_O^h``.

An :class:`Architecture` says where those live, relative to the base model (:func:`base_model`). Adding a family that
uses transformers' attention interface is one more row in :data:`ARCHITECTURES`.

A third piece, for causal models: the logits are the output layer (``get_output_embeddings()``) applied to
the base model's final hidden states, then the family's own logit scaling or soft-capping, named by the row
(``logit_scale``, ``logit_divisor``, ``logit_softcap``: config attributes); cwviz computes next-token
log-probabilities that way (:meth:`cwviz.core.loading.models.Bundle.output_logits`). Every row is checked against
the model's own attention and logits in ``tests/core/test_architectures.py``.

What the attention function receives covers the families' differences without a row saying so: post-RoPE
queries and keys (partial rotary, q/k norms, fused qkv, biases all happen before the call), the scaling the
model really uses (Granite's attention multiplier, Gemma's ``query_pre_attn_scalar``, OPT's pre-scaled
queries), each layer's own mask (sliding and global layers), soft-capping and learned sinks.

A model type that is not in the table gets a row derived from the model itself and checked by a probe at
load time (:mod:`cwviz.core.loading.derive`); :data:`REFUSED` lists the families that cannot have one, and why.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..util.errors import UnsupportedModelError


@dataclass(frozen=True)
class Architecture:
    """Where the attention pieces of one model family live.

    Paths are dotted attribute paths. ``layers`` is relative to the base model (:func:`base_model`); ``attention``
    (the module that calls the attention function) and ``out_proj`` (W_O) are relative to one layer.
    ``conv1d``: GPT-2's ``Conv1D`` stores its weight as [in, out], the transpose of ``nn.Linear``.
    ``auto_class``: the transformers auto class that gives a head with vocabulary logits.
    ``logit_scale``, ``logit_divisor``, ``logit_softcap``: config attributes the causal LM applies to the output
    layer's result, in that order (Cohere's ``logit_scale`` multiplies, Granite's ``logits_scaling`` divides,
    Gemma 2/3's ``final_logit_softcapping`` c gives c tanh(logits / c)); None or a missing value: not applied.
    ``derived``: the row was derived from the model and checked by a probe (:mod:`cwviz.core.loading.derive`).

    The residual stream (the signed flow and ALTI, docs/METHOD.md section 6): ``layout``, the block layout, says where
    the attention write lands, one of :data:`LAYOUTS`, and is read through :func:`layout_of` only;
    ``parallel_attribute`` a config attribute that, when true, makes the layout ``"parallel"`` (GPT-NeoX's and
    StableLM's ``use_parallel_residual``); ``mid`` (``"pre_norm"``) the module, relative to a layer, whose input is
    the post-attention state h (the norm before the MLP); ``attention_norm`` (``"sandwich"`` and ``"post_norm"``) the
    norm the attention write goes through, relative to a layer; ``residual_multiplier`` a config attribute that
    scales each write before the residual add (Granite); ``final_norm`` the norm before the output layer, relative to
    the base model (None: none).
    """

    family: str
    layers: str
    attention: str
    out_proj: str
    conv1d: bool = False
    auto_class: str = "AutoModelForCausalLM"
    causal: bool = True
    logit_scale: str | None = None
    logit_divisor: str | None = None
    logit_softcap: str | None = None
    derived: bool = False
    layout: str = "pre_norm"
    parallel_attribute: str | None = None
    mid: str | None = "post_attention_layernorm"
    attention_norm: str | None = None
    residual_multiplier: str | None = None
    final_norm: str | None = "norm"


#: The block layouts: where a layer's attention write lands (docs/METHOD.md section 6.1): h = x + m(a + b) and the MLP
#: reads h (``pre_norm``); h = x + N(a + b) (``sandwich``, a norm after attention); the layer's output
#: x + a + b + MLP(x) (``parallel``: the MLP reads x); h = N(x + a + b) (``post_norm``, BERT). Each is one class of
#: :mod:`cwviz.core.method.residual`.
LAYOUTS = ("pre_norm", "sandwich", "parallel", "post_norm")

_LLAMA_LIKE = dict(layers="layers", attention="self_attn", out_proj="self_attn.o_proj")
_SANDWICH = dict(layout="sandwich", mid=None, attention_norm="post_attention_layernorm")
_BERT_LIKE = dict(
    layers="encoder.layer",
    attention="attention.self",
    out_proj="attention.output.dense",
    auto_class="AutoModelForMaskedLM",
    causal=False,
    layout="post_norm",
    mid=None,
    attention_norm="attention.output.LayerNorm",
    final_norm=None,
)

ARCHITECTURES: dict[str, Architecture] = {
    # Llama family: Llama 2/3, SmolLM2, DeepSeek's Llama-architecture models; grouped-query attention.
    "llama": Architecture("llama", **_LLAMA_LIKE),
    # Sliding-window attention (a mask per layer; Qwen2 from max_window_layers on).
    "mistral": Architecture("mistral", **_LLAMA_LIKE),
    "qwen2": Architecture("qwen2", **_LLAMA_LIKE),
    # q/k norms before rotary.
    "qwen3": Architecture("qwen3", **_LLAMA_LIKE),
    "olmo2": Architecture("olmo2", **_LLAMA_LIKE, **_SANDWICH),  # a norm after attention, none before
    # Mixtures of experts: the experts are in the MLP; attention is Llama's (Qwen2-MoE with q/k/v biases).
    "mixtral": Architecture("mixtral", **_LLAMA_LIKE),
    "qwen2_moe": Architecture("qwen2_moe", **_LLAMA_LIKE),
    "qwen3_moe": Architecture("qwen3_moe", **_LLAMA_LIKE),
    # Gemma: scaled embeddings; Gemma 2: attention logit soft-capping, alternating sliding/global layers and
    # final logit soft-capping; Gemma 3: q/k norms, sliding/global layers by layer_types.
    "gemma": Architecture("gemma", **_LLAMA_LIKE),
    "gemma2": Architecture("gemma2", **_LLAMA_LIKE, **_SANDWICH, logit_softcap="final_logit_softcapping"),
    "gemma3_text": Architecture("gemma3_text", **_LLAMA_LIKE, **_SANDWICH, logit_softcap="final_logit_softcapping"),
    # Phi-3: fused qkv_proj, partial rotary.
    "phi3": Architecture("phi3", **_LLAMA_LIKE),
    # Granite: the attention multiplier is the scaling; the logits are divided by logits_scaling.
    "granite": Architecture(
        "granite", **_LLAMA_LIKE, logit_divisor="logits_scaling", residual_multiplier="residual_multiplier"
    ),
    # StableLM: partial rotary, optional qkv biases and per-head q/k norms, parallel residual.
    "stablelm": Architecture("stablelm", **_LLAMA_LIKE, parallel_attribute="use_parallel_residual"),
    # StarCoder2: biases everywhere, sliding window.
    "starcoder2": Architecture("starcoder2", **_LLAMA_LIKE),
    # Cohere (Command-R): parallel layout, optional q/k norms, logits multiplied by logit_scale.
    "cohere": Architecture("cohere", **_LLAMA_LIKE, logit_scale="logit_scale", layout="parallel", mid=None),
    # gpt-oss: learned attention sinks (s_aux), alternating sliding/global layers, biases, mixture of experts.
    "gpt_oss": Architecture("gpt_oss", **_LLAMA_LIKE),
    # GPT-2: fused c_attn, Conv1D layout, biases on values and on the output projection.
    "gpt2": Architecture(
        "gpt2", layers="h", attention="attn", out_proj="attn.c_proj", conv1d=True, mid="ln_2", final_norm="ln_f"
    ),
    # GPT-NeoX / Pythia: fused per-head query_key_value, partial rotary.
    "gpt_neox": Architecture(
        "gpt_neox",
        layers="layers",
        attention="attention",
        out_proj="attention.dense",
        parallel_attribute="use_parallel_residual",
        final_norm="final_layer_norm",
    ),
    # Encoders: bidirectional attention; in the BERT layout W_O is the attention's output.dense.
    "bert": Architecture("bert", **_BERT_LIKE),
    "roberta": Architecture("roberta", **_BERT_LIKE),
    "xlm-roberta": Architecture("xlm-roberta", **_BERT_LIKE),
    "electra": Architecture("electra", **_BERT_LIKE),
    "distilbert": Architecture(
        "distilbert",
        layers="transformer.layer",
        attention="attention",
        out_proj="attention.out_lin",
        auto_class="AutoModelForMaskedLM",
        causal=False,
        layout="post_norm",
        mid=None,
        attention_norm="sa_layer_norm",
        final_norm=None,
    ),
    # ModernBERT: fused Wqkv, rotary, alternating local (sliding, both sides) and global layers.
    "modernbert": Architecture(
        "modernbert",
        layers="layers",
        attention="attn",
        out_proj="attn.Wo",
        auto_class="AutoModelForMaskedLM",
        causal=False,
        mid="mlp_norm",
        final_norm="final_norm",
    ),
}

_STATE_SPACE = "a state-space model: it has no attention, so no attention weights or per-head value path"
_CROSS = (
    "an encoder-decoder model: its decoder's cross-attention reads the encoder's states, not the tokens' own values, "
    "so contributions over one sequence's tokens are not defined for it"
)
_HYBRID = (
    "a hybrid of attention and state-space, linear-attention or recurrent layers: the non-attention layers mix tokens "
    "with no per-head value path"
)
_SHARED = (
    "a model that runs one shared layer num_hidden_layers times: cwviz records each attention module once a forward "
    "pass, so it would report one layer, the last pass"
)
_MIXED_VALUES = (
    "a model whose value at position j mixes token j's and token j-1's states (ZAYA's CCA projection): cwviz would "
    "attribute to token j what comes from token j-1"
)
#: Model types cwviz refuses, with the reason its error gives.
REFUSED: dict[str, str] = {
    **{t: _STATE_SPACE for t in ("mamba", "mamba2", "falcon_mamba")},
    **{t: "a recurrent model: it has no softmax attention over the tokens" for t in ("rwkv", "xlstm")},
    **{
        t: _HYBRID
        for t in (
            "jamba",
            "zamba",
            "zamba2",
            "falcon_h1",
            "bamba",
            "granitemoehybrid",
            "nemotron_h",
            "recurrent_gemma",
            "lfm2",
            "lfm2_moe",
            "qwen3_next",
            # Qwen3.5: Gated DeltaNet linear-attention layers between full-attention ones (text and MoE, and their
            # multimodal wrappers); LFM3: short convolutions between attention layers, as LFM2.
            "qwen3_5",
            "qwen3_5_text",
            "qwen3_5_moe",
            "qwen3_5_moe_text",
            "lfm3",
            "kimi_linear",
            "olmo_hybrid",
            "bailing_hybrid",
            "minimax",
        )
    },
    "albert": _SHARED,  # derive.py refuses any other model whose attention module runs twice a pass
    "zaya": _MIXED_VALUES,
    **{
        t: _CROSS
        for t in (
            "t5",
            "mt5",
            "umt5",
            "bart",
            "mbart",
            "marian",
            "pegasus",
            "whisper",
            "led",
            "blenderbot",
            "encoder-decoder",
        )
    },
}

SUPPORTED = ", ".join(sorted(ARCHITECTURES))


def refusal(config) -> str | None:
    """Why cwviz cannot analyse a model with this config (None when it may try): a family of :data:`REFUSED`,
    or any encoder-decoder (cross-attention)."""
    model_type = getattr(config, "model_type", "?")
    if model_type in REFUSED:
        return REFUSED[model_type]
    if getattr(config, "is_encoder_decoder", False) or getattr(config, "add_cross_attention", False):
        return _CROSS
    return None


def check_supported(config) -> None:
    """Raise UnsupportedModelError, saying why, for a config cwviz refuses (:func:`refusal`)."""
    reason = refusal(config)
    if reason is not None:
        model_type = getattr(config, "model_type", "?")
        raise UnsupportedModelError(
            f"architecture {model_type!r} is not supported: it is {reason}. cwviz analyses models whose attention goes "
            f"through transformers' AttentionInterface; checked families: {SUPPORTED}"
        )


def architecture_for(model_type: str) -> Architecture | None:
    """The table row for a config's ``model_type``, or None: such a model gets a derived row
    (:func:`cwviz.core.loading.derive.derive_architecture`) unless :func:`refusal` refuses it."""
    return ARCHITECTURES.get(model_type)


def submodule(root: nn.Module, path: str) -> nn.Module:
    """The module at the dotted ``path`` under ``root`` (``"encoder.layer"``, ``"self_attn.o_proj"``)."""
    module = root
    for part in path.split("."):
        module = getattr(module, part)
    return module


def base_model(model: nn.Module) -> nn.Module:
    """The model's body (the decoder or encoder that gives the final hidden states): ``model.base_model``, except
    for a model with a head whose ``base_model_prefix`` names no attribute of it, so that transformers' base_model is
    the model itself: then its ``.model`` (Llama 4's text LM: prefix ``"language_model"``, decoder at ``.model``)."""
    base = model.base_model
    if base is model:
        inner = getattr(model, "model", None)
        if isinstance(inner, nn.Module) and hasattr(inner, "get_input_embeddings"):
            return inner
    return base


def layer_modules(model: nn.Module, arch: Architecture) -> list[nn.Module]:
    """The model's layers (each one attention and its MLP), in order."""
    return list(submodule(base_model(model), arch.layers))


def attention_modules(model: nn.Module, arch: Architecture) -> list[nn.Module]:
    """The module of each layer that calls the attention function (index = layer)."""
    return [submodule(layer, arch.attention) for layer in layer_modules(model, arch)]


def out_projections(model: nn.Module, arch: Architecture) -> list[nn.Module]:
    """W_O of each layer (an ``nn.Linear``, or GPT-2's ``Conv1D``)."""
    return [submodule(layer, arch.out_proj) for layer in layer_modules(model, arch)]


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


def linear_logit_scale(config, arch: Architecture) -> float:
    """s, the linear factor the row's family puts on the output layer's logits (docs/METHOD.md section 6.3): Cohere's
    ``logit_scale`` times 1 / Granite's ``logits_scaling``; 1 elsewhere. The soft-cap, not linear, is apart."""
    scale = 1.0
    if arch.logit_scale and getattr(config, arch.logit_scale, None) is not None:
        scale *= float(getattr(config, arch.logit_scale))
    if arch.logit_divisor and getattr(config, arch.logit_divisor, None) is not None:
        scale /= float(getattr(config, arch.logit_divisor))
    return scale


def output_logits(model: nn.Module, arch: Architecture, hidden: torch.Tensor) -> torch.Tensor:
    """The model's own logits [..., vocab] from final hidden states [..., d_model]: the output layer (tied
    embeddings or not), then the row's logit scaling and soft-capping, in the order a causal LM applies them."""
    logits = model.get_output_embeddings()(hidden)
    scale = linear_logit_scale(model.config, arch)
    if scale != 1.0:
        logits = logits * scale
    softcap = getattr(model.config, arch.logit_softcap, None) if arch.logit_softcap else None
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    return logits


def layout_of(config, arch: Architecture) -> str:
    """The block layout (one of :data:`LAYOUTS`) of a model with this config and row: ``"parallel"`` where the row's
    ``parallel_attribute`` is set and true in the config, else the row's ``layout``. The one reader of the layout."""
    if arch.parallel_attribute is not None and getattr(config, arch.parallel_attribute, False):
        return "parallel"
    return arch.layout


#: Config attributes that, when set, change a causal LM's logits after its output layer (the row fields they fill).
LOGIT_ATTRIBUTES = {
    "logit_scale": "logit_scale",
    "logit_divisor": "logits_scaling",
    "logit_softcap": "final_logit_softcapping",
}
