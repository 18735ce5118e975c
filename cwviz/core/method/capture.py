"""Capture one forward pass through transformers' supported attention seam.

cwviz registers an attention function named ``"cwviz"`` in transformers' ``AttentionInterface`` (and
the matching mask function in ``AttentionMaskInterface``) and loads models with it. Outside a
:func:`forward_pass` it simply delegates to PyTorch's SDPA, so the model behaves exactly as with
``attn_implementation="sdpa"``. Inside a pass, the per-thread :class:`_Pass` stored in a
``ContextVar`` (:func:`cwviz.core.method.hooks.scoped`, the one per-context mechanism of cwviz's passes) tells it to
record each layer's queries, keys and values, and optionally to intervene.

Why this seam rather than hooks: the function receives the post-RoPE queries and keys, the values with
their bias, the mask and the scaling the model really uses, for every supported architecture alike.
And because the active pass lives in a ``ContextVar``, several threads can run the one shared model at
once, each with its own records; the seam registers nothing on the model's modules, so nothing can be left
behind when an analysis raises. (Where attention's write lands, which the seam cannot see, is read by forward hooks
of the same per-context kind: :mod:`cwviz.core.method.residual`.)

What is kept per layer grows linearly with the number of tokens T: queries [heads, T, d_head],
keys and values [kv_heads, T, d_head]. Attention maps are recomputed from them on demand.

This module is the seam and the records; the maths it calls (α as SDPA or the model's eager attention computes it,
the weighted values of an intervention) is :mod:`cwviz.core.method.attention`.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from ..util.errors import UnsupportedModelError
from ..util.progress import Progress
from .attention import attention_probabilities, weighted_values
from .hooks import scoped
from .spill import SpilledRecords

ATTN_IMPLEMENTATION = "cwviz"


@dataclass(frozen=True)
class LayerRecord:
    """What one attention layer saw in one forward pass (batch of one).

    | field         | shape                        | note                                              |
    |---------------|------------------------------|---------------------------------------------------|
    | query         | [head, query, d_head]        | after rotary embedding, before scaling            |
    | key           | [kv_head, key, d_head]       | after rotary embedding                            |
    | value         | [kv_head, key, d_head]       | v_j = x_j W_V + b_V                               |
    | mask          | None or [query, key]         | bool (True = may attend) or additive float        |
    | output        | [head, query, d_head]        | z_i^h, what the attention function returned       |
    | learned_sinks | None or [head]               | learned sink logits (gpt-oss ``s_aux``), float32  |

    ``causal`` applies when ``mask`` is None. ``mask`` is this layer's own: a model with sliding and global
    layers (Gemma 2/3, gpt-oss, ModernBERT) gives each layer its own mask (sliding or global). ``softcap``: the
    layer's attention logit soft-capping (Gemma 2), scores ← c tanh(scores / c) before the mask. ``learned_sinks``:
    one learned logit per head that joins every row's softmax and is then dropped, so α over the real keys sums to less
    than 1 (the learned sink writes nothing). Tensors stay on the layer's device in the model's dtype;
    measures upcast them to float32. ``copies``: the key and value hold each kv head this many times in a row
    ([kv_head * copies, key, d_head]); a pass records them once, and a layer prepared for reading in row blocks
    (:func:`cwviz.core.method.row_blocks.for_row_blocks`) may hold more
    (:func:`~cwviz.core.method.measures.kv_copies`).
    """

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    mask: torch.Tensor | None
    scaling: float
    causal: bool
    output: torch.Tensor
    softcap: float | None = None
    learned_sinks: torch.Tensor | None = None
    copies: int = 1

    @property
    def plain(self) -> bool:
        """Whether α is the plain softmax of the scaled scores (no soft-capping, no learned sinks)."""
        return self.softcap is None and self.learned_sinks is None

    def probabilities(
        self, query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None, causal: bool
    ) -> torch.Tensor:
        """:func:`attention_probabilities` with this layer's scaling, soft-capping and learned sinks."""
        return attention_probabilities(
            query, key, self.scaling, mask, causal, softcap=self.softcap, learned_sinks=self.learned_sinks
        )

    def key_mask(self, start: int = 0, stop: int | None = None, device: torch.device | None = None) -> torch.Tensor:
        """Which keys each query may attend to, bool [query, key] on ``device`` (default: the record's): the model's
        own mask (causal: keys 0..i; sliding windows, padding), True where a key is visible. With ``start`` and
        ``stop``, only those query rows are made ([stop - start, key]), never the whole T x T. Only the tensors'
        shapes are read, so a record whose tensors are on disk (:meth:`cwviz.core.method.spill.SpilledRecords.shell`)
        gives its mask too."""
        num_queries, num_keys = self.query.shape[-2], self.key.shape[-2]
        stop = num_queries if stop is None else stop
        device = self.query.device if device is None else device
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


class Attend(Protocol):
    """Computes a layer's attention output in place of SDPA: given the layer's index and its :class:`LayerRecord`
    (with ``output=None``), returns z [head, query, d_head] (float32, or the model's dtype)."""

    def __call__(self, layer: int, record: LayerRecord) -> torch.Tensor: ...


class Observe(Protocol):
    """Sees each layer's attention output as the pass runs: z [batch, query, head, d_head] in the model's dtype, what
    the attention function returns (the output projection's input), after any intervention. It must not change z."""

    def __call__(self, layer: int, output: torch.Tensor) -> None: ...


@dataclass
class _Pass:
    layer_of: dict[int, int]
    record: bool
    intervention: Intervention | None
    records: dict[int, LayerRecord] | SpilledRecords = field(default_factory=dict)
    progress: Progress | None = None
    layers_done: int = 0
    arena: torch.Tensor | None = None  # (layers, per-layer elements): the records of a pass on the CPU
    seen: list | None = None  # the modules that called the attention function, in order (:func:`attention_callers`)
    attend: Attend | None = None  # computes each recorded layer's output in place of SDPA (:func:`forward_pass`)
    called: set[int] = field(default_factory=set)  # the layers that have run in this recording pass
    observe: Observe | None = None  # sees each layer's output (:func:`forward_pass`)

    def kept(self, layer: int, parts: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """What a record keeps of ``parts``: on a CPU, contiguous copies side by side in one buffer for the
        whole pass (:attr:`arena`, allocated at the first layer for every layer); elsewhere the tensors
        themselves.

        Why copy: a record outlives the forward pass, and the tensors it would otherwise keep sit in the heap
        between that pass's freed activations, which then cannot be returned to the system nor reused as one
        region (glibc): at 4,096 tokens on the embedded model the pass peaked 1.6 GB above the model instead of
        1.0 GB. With the records in their own buffer every activation is freed and reused layer after layer.
        The copies cost one pass over what is recorded (about 6 KB a token a layer for the embedded model). A
        layer whose parts differ in size or dtype from the first layer's keeps its own tensors. A pass whose
        records go to disk (:mod:`cwviz.core.method.spill`) keeps no buffer: each layer is written as it runs.
        """
        first = parts[0]
        if (
            isinstance(self.records, SpilledRecords)
            or first.device.type != "cpu"
            or any(p.dtype != first.dtype for p in parts)
        ):
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
    """Whether a layer with no mask (``attention_mask`` None) is causal: the call's ``is_causal``, else the
    module's ``is_causal`` attribute, else what its config says (:func:`_config_causal`).

    Why not transformers' own default (SDPA takes a module without ``is_causal`` as causal): a BERT-style encoder
    whose attention module sets no ``is_causal`` (Splinter, LayoutLM, MarkupLM) builds its mask with
    ``create_bidirectional_mask``, which under cwviz's mask function is None when nothing is padded; taken as causal,
    such an encoder would become a decoder, its outputs changed, in an analysis or not."""
    flag = kwargs.get("is_causal")
    if flag is None:
        flag = getattr(module, "is_causal", None)
    if flag is None:
        flag = _config_causal(getattr(module, "config", None))
    return bool(flag) and num_queries > 1


def _config_causal(config) -> bool:
    """Whether a model with this config attends causally, for an attention module that does not say: a decoder
    (``is_decoder``), or a model type transformers has a causal LM class for and no masked LM class (decoder-only
    families). Encoder families (a masked LM class, or neither, as Splinter's and MarkupLM's) are bidirectional. A
    model type transformers does not know (remote code) is causal when its config names a causal-LM class
    (``architectures``: ``...ForCausalLM``, ``...LMHeadModel``) or names none. Without a config, transformers' own
    default (causal). A wrong guess cannot pass unseen: a derived row's probe compares cwviz's forward pass with the
    model's eager attention (:func:`cwviz.core.loading.derive.derive_architecture`)."""
    if config is None:
        return True
    if getattr(config, "is_decoder", False):
        return True
    known = _decoder_only(getattr(config, "model_type", None))
    if known is not None:
        return known
    names = getattr(config, "architectures", None) or ()
    return not names or any("CausalLM" in name or "LMHead" in name for name in names)


@functools.cache
def _decoder_only(model_type: str | None) -> bool | None:
    """For a model type transformers knows: whether it has a causal LM class and no masked LM class; else None."""
    from transformers.models.auto import configuration_auto, modeling_auto

    if model_type not in configuration_auto.CONFIG_MAPPING_NAMES:
        return None
    return (
        model_type in modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
        and model_type not in modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES
    )


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
    # Soft-capping (Gemma 2) and learned sinks (gpt-oss, ``s_aux``) are outside SDPA: such a layer is computed
    # as the model's eager attention computes it, in a pass or not (SDPA would refuse the cap, ignore the sinks).
    softcap = kwargs.pop("softcap", None)
    s_aux = kwargs.pop("s_aux", None)
    learned_sinks = s_aux.detach().float() if s_aux is not None else None
    active = _ACTIVE.get()
    layer = active.layer_of.get(id(module)) if active is not None else None
    if active is not None and active.seen is not None:
        active.seen.append(module)
    # query (B, H, Q, d); key, value (B, H_kv, K, d); attention_mask None or (B, 1, Q, K)
    plain = softcap is None and learned_sinks is None
    # SDPA is told cwviz's causality (:func:`_is_causal`), not left to its own default, in a pass or not.
    causal = kwargs["is_causal"] = _is_causal(module, kwargs, query.shape[-2])
    if layer is None and plain:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    scaling = float(scaling if scaling is not None else query.shape[-1] ** -0.5)
    if layer is not None and active.record:
        if layer in active.called:
            # ALBERT runs one shared layer num_hidden_layers times: a second call would overwrite the first's record.
            raise UnsupportedModelError(
                f"the attention module of layer {layer} ran more than once in one forward pass (a layer whose weights "
                "are shared across depth, as ALBERT's): cwviz records each attention module once a pass, so it cannot "
                "analyse this model"
            )
        active.called.add(layer)
    keep = None
    if layer is not None and active.intervention is not None:
        value = active.intervention.values(layer, value)
        keep = active.intervention.keep(layer, query.shape[-2], key.shape[-2])
    if layer is not None and active.record and query.shape[0] != 1:
        raise ValueError("cwviz records one sequence at a time (batch of one)")
    mask = attention_mask[0, 0] if attention_mask is not None else None
    softcap = None if softcap is None else float(softcap)
    if layer is not None and active.attend is not None and active.intervention is None:
        record = LayerRecord(
            query[0], key[0], value[0], mask, scaling, causal, output=None, softcap=softcap, learned_sinks=learned_sinks
        )
        out = active.attend(layer, record).to(query.dtype).transpose(0, 1)[None].contiguous()  # (1, Q, H, d)
    elif keep is None and plain:
        out, _ = sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    else:
        out = weighted_values(query, key, value, attention_mask, causal, scaling, softcap, learned_sinks, keep)
    if layer is None:
        return out, None
    if active.observe is not None:
        active.observe(layer, out)
    if active.record:
        q, k, v, z = active.kept(layer, (query[0], key[0], value[0], out[0].transpose(0, 1)))
        active.records[layer] = LayerRecord(
            query=q.detach(),
            key=k.detach(),
            value=v.detach(),
            mask=mask,
            scaling=scaling,
            causal=causal,
            output=z.detach(),
            softcap=softcap,
            learned_sinks=learned_sinks,
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
    spill: SpilledRecords | None = None,
    attend: Attend | None = None,
    observe: Observe | None = None,
) -> Iterator[dict[int, LayerRecord] | SpilledRecords]:
    """Within this ``with``, forward passes of the model record and/or intervene.

    ``attention_modules[l]`` is layer l's attention module. Yields the dict that fills with one
    :class:`LayerRecord` per layer, or ``spill`` (:func:`cwviz.core.method.spill.spill_for`), which writes each layer
    to disk as it runs. Only the calling thread (and context) is affected. ``progress``
    (:mod:`cwviz.core.util.progress`) is told after each attention layer has run (one pass: done 1..L). ``attend``
    (:class:`Attend`, passes without an intervention): each layer's output is what it returns, cast to the model's
    dtype, instead of SDPA's (how :func:`cwviz.analyze` streams measures during the pass, and how the signed flow
    replays a recorded pass's outputs without recomputing its attention, ``record=False``). ``observe``
    (:class:`Observe`) sees each layer's output as it runs, recorded or not: a pass that keeps only a reduction of the
    head outputs (:func:`cwviz.core.method.interventions.observed_pass`) records nothing.
    """
    active = _Pass(
        {id(m): i for i, m in enumerate(attention_modules)},
        record,
        intervention,
        progress=progress,
        attend=attend,
        observe=observe,
    )
    if spill is not None:
        active.records = spill
    with scoped(_ACTIVE, active):
        yield active.records


@contextlib.contextmanager
def attention_callers() -> Iterator[list[torch.nn.Module]]:
    """Within this ``with``, forward passes append every module that calls cwviz's attention function to the
    yielded list, in call order; nothing is recorded or changed (how :mod:`cwviz.core.loading.derive` finds a model's
    attention modules: those that really call the interface)."""
    active = _Pass({}, record=False, intervention=None, seen=[])
    with scoped(_ACTIVE, active):
        yield active.seen
