"""The residual recorder: the residual stream of one pass, read by forward hooks (docs/METHOD.md section 6.1).

The attention seam (:mod:`cwviz.core.method.capture`) sees what goes into attention, not where its write lands: the
post-attention state, the norms around it and what the MLP adds are states the model returns nowhere. The recorder
reads them with forward hooks, registered for the passes of the calling thread or task only and always removed
(:func:`cwviz.core.method.hooks.context_hooks`), so a model shared with other threads (the dashboard) is left as it
was for them. What is hooked, per layer unless said:

| module hooked                            | read    | slot of :class:`LayerSlots` | why                               |
|------------------------------------------|---------|-----------------------------|-----------------------------------|
| the layer                                | input   | ``residual_in``: x          | the residual entering the layer   |
| its output projection                    | output  | ``attention_out``: a + b_O  | the write, before it lands        |
| ``mid`` (pre_norm)                       | input   | ``residual_mid``: h         | the post-attention state          |
| ``attention_norm`` (sandwich, post_norm) | in, out | ``norm_in``, ``norm_out``   | L: that norm, frozen at its input |
| the layer                                | output  | ``output``: y               | what the MLP adds; h (parallel)   |
| ``final_norm`` (once a pass)             | in, out | at p only                   | the final norm, frozen at x_p^L   |

Which of these a model needs is its block layout (:func:`cwviz.core.loading.architectures.layout_of`, the one reader of
the layout), one class each below (:class:`PreNorm`, :class:`Sandwich`, :class:`Parallel`, :class:`PostNorm`): its hooks
and the meaning of its slots, the landing map L (a write v lands as L(v)), the post-attention state h, the residual's
own part R(x) and what the MLP adds. Each layer is handed to a reduction as soon as it ends, so a pass keeps what the
reductions keep, never every slot of every layer. The signed flow keeps :class:`LayerStream` (:func:`record_stream`,
:func:`stream_hooks`); ALTI keeps x and L (:mod:`cwviz.core.method.baselines`).

| field     | shape            | meaning                                                       |
|-----------|------------------|---------------------------------------------------------------|
| direction | [query, d_model] | the read direction L_iᵀ h_i: ⟨L_i(v), h_i⟩ = ⟨v, direction_i⟩ |
| norm2     | [query]          | ‖h_i‖²                                                        |
| residual  | [query]          | the residual's own part ⟨R_i(x_i), h_i⟩                       |
| bias      | [query]          | ⟨L_i(b_O), h_i⟩ + ⟨β, h_i⟩                                    |
| landing   | L_p              | the frozen landing map at the chosen position p               |
| mlp       | [d_model]        | what the layer's MLP adds at p                                |
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from typing import ClassVar, Generic, Literal, TypeVar

import torch
from torch import nn

from ..loading import architectures
from ..loading.architectures import Architecture
from ..loading.models import Bundle
from ..util.errors import UnsupportedModelError
from .capture import forward_pass
from .frozen_norm import FrozenNorm, freeze
from .hooks import Hook, context_hooks

R = TypeVar("R")


@dataclasses.dataclass(frozen=True)
class LayerSlots:
    """What the recorder's hooks read of one layer in one pass (the module docstring's table), float32
    [query, d_model] each; a slot the layout does not hook is None."""

    residual_in: torch.Tensor
    attention_out: torch.Tensor
    output: torch.Tensor
    residual_mid: torch.Tensor | None = None
    norm_in: torch.Tensor | None = None
    norm_out: torch.Tensor | None = None

    def at(self, position: int) -> LayerSlots:
        """The slots of one position only ([1, d_model] each)."""
        row = slice(position, position + 1)
        return LayerSlots(*(None if (t := getattr(self, f.name)) is None else t[row] for f in dataclasses.fields(self)))


@dataclasses.dataclass(frozen=True)
class Tap:
    """A hook a layout adds: ``module``'s input or output goes to the slot ``slot`` of :class:`LayerSlots`."""

    module: nn.Module
    reads: Literal["input", "output"]
    slot: Literal["residual_mid", "norm_in", "norm_out"]


@dataclasses.dataclass(frozen=True)
class LayerStream:
    """One layer of the residual stream, reduced for the signed flow (the module docstring's second table)."""

    direction: torch.Tensor
    norm2: torch.Tensor
    residual: torch.Tensor
    bias: torch.Tensor
    landing: FrozenNorm
    mlp: torch.Tensor


@dataclasses.dataclass(frozen=True)
class Stream:
    """The residual stream of one prompt: :class:`LayerStream` per layer, and at the chosen position p the
    embedding x_p^0 [d_model], the final residual x_p^L [d_model], the final norm frozen there (None: the model
    has none) and its output [d_model]. ``layout``: the block layout of this model."""

    layers: tuple[LayerStream, ...]
    position: int
    embedding: torch.Tensor
    final: torch.Tensor
    final_norm: FrozenNorm | None
    final_output: torch.Tensor
    layout: str


class Layout(ABC):
    """One block layout of :data:`~cwviz.core.loading.architectures.LAYOUTS`: the modules of a layer it hooks beyond
    the three every layout reads (:meth:`taps`), and what its slots mean. x: the residual entering the layer, a + b_O:
    the output projection's output, y: the layer's output, m: the residual multiplier (Granite's, else 1)."""

    name: ClassVar[str]

    def __init__(
        self,
        arch: Architecture,
        layers: Sequence[nn.Module],
        multiplier: float,
        final_norm: nn.Module | None,
    ):
        self.arch, self.layers, self.multiplier, self.final_norm = arch, list(layers), multiplier, final_norm

    def module(self, layer: int, path: str) -> nn.Module:
        """The module at ``path`` (a path of the row, relative to a layer) of layer ``layer``."""
        return architectures.submodule(self.layers[layer], path)

    def taps(self, layer: int) -> tuple[Tap, ...]:
        return ()

    def landing(self, layer: int, slots: LayerSlots) -> FrozenNorm:
        """L_i: a write lands as it is, times m."""
        return FrozenNorm(torch.full_like(slots.residual_in[:, 0], self.multiplier))

    @abstractmethod
    def state(self, slots: LayerSlots) -> torch.Tensor:
        """h [query, d_model], the post-attention state the write is projected on."""

    def own(self, slots: LayerSlots, landing: FrozenNorm) -> torch.Tensor:
        """R_i(x_i) [query, d_model], the residual's own part of h."""
        return slots.residual_in

    def mlp(self, slots: LayerSlots) -> torch.Tensor:
        """What the MLP adds [query, d_model]."""
        return slots.output - self.state(slots)

    def stream(self, layer: int, slots: LayerSlots, position: int) -> LayerStream:
        """Layer ``layer`` reduced for the signed flow into p = ``position`` (:class:`LayerStream`)."""
        landing, h = self.landing(layer, slots), self.state(slots)
        b_o = getattr(self.module(layer, self.arch.out_proj), "bias", None)
        b_o = torch.zeros_like(h[0]) if b_o is None else b_o.detach().float().to(h.device)
        direction = landing.pullback(h)  # (query, d_model): L_iᵀ h_i
        bias = (b_o * direction).sum(-1) + (0 if landing.bias is None else h @ landing.bias)
        own = (self.own(slots, landing) * h).sum(-1)
        mlp = self.mlp(slots.at(position))[0]
        return LayerStream(direction, (h * h).sum(-1), own, bias, landing.row(position), mlp)


class PreNorm(Layout):
    """``pre_norm``: h = x + m·attn(N₁(x)); y = h + mlp(N₂(h)). N₂ (``mid``) is hooked for its input h."""

    name = "pre_norm"

    def taps(self, layer: int) -> tuple[Tap, ...]:
        return (Tap(self.module(layer, self.arch.mid), "input", "residual_mid"),)

    def state(self, slots: LayerSlots) -> torch.Tensor:
        return slots.residual_mid


class Parallel(Layout):
    """``parallel``: y = x + m·attn(N₁(x)) + mlp(N₂(x)). The MLP reads x, not x + m·attn: the write is projected on
    the layer's output y, whose residual part is x + mlp(N₂(x)) (the MLP's write carries x's composition)."""

    name = "parallel"

    def state(self, slots: LayerSlots) -> torch.Tensor:
        return slots.output

    def own(self, slots: LayerSlots, landing: FrozenNorm) -> torch.Tensor:
        return slots.output - self.multiplier * slots.attention_out

    def mlp(self, slots: LayerSlots) -> torch.Tensor:
        return slots.output - slots.residual_in - self.multiplier * slots.attention_out


class _NormedWrite(Layout):
    """A layout whose attention write goes through a norm N (``attention_norm``), hooked on both sides: the write
    lands through N frozen at its own input."""

    def taps(self, layer: int) -> tuple[Tap, ...]:
        norm = self.module(layer, self.arch.attention_norm)
        return (Tap(norm, "input", "norm_in"), Tap(norm, "output", "norm_out"))

    def landing(self, layer: int, slots: LayerSlots) -> FrozenNorm:
        return freeze(self.module(layer, self.arch.attention_norm), slots.norm_in, slots.norm_out)


class Sandwich(_NormedWrite):
    """``sandwich``: h = x + N(attn(N₁(x))); y = h + N'(mlp(N₂(h))) (Gemma 2 and 3, OLMo 2)."""

    name = "sandwich"

    def state(self, slots: LayerSlots) -> torch.Tensor:
        return slots.residual_in + slots.norm_out


class PostNorm(_NormedWrite):
    """``post_norm``: h = N(x + attn(x)); y = N'(h + mlp(h)) (BERT). The residual goes through N too: R = L."""

    name = "post_norm"

    def state(self, slots: LayerSlots) -> torch.Tensor:
        return slots.norm_out

    def own(self, slots: LayerSlots, landing: FrozenNorm) -> torch.Tensor:
        return landing.apply(slots.residual_in)


LAYOUT_CLASSES: dict[str, type[Layout]] = {cls.name: cls for cls in (PreNorm, Sandwich, Parallel, PostNorm)}


def residual_multiplier(bundle: Bundle) -> float:
    """The factor a layer multiplies its writes by before the residual add (Granite's ``residual_multiplier``), else
    1."""
    name = bundle.arch.residual_multiplier
    value = getattr(bundle.model.config, name, None) if name else None
    return 1.0 if value is None else float(value)


def unknown_row(bundle: Bundle) -> str | None:
    """Why nothing that follows the residual stream (the recorder, the effect flow's backward) runs on this model, or
    None: a derived row knows the attention, not the block layout or the final norm."""
    arch = bundle.arch
    if not arch.derived:
        return None
    return (
        f"following the residual stream needs the block layout of the model's family (where the attention write "
        f"lands) and its final norm, and {arch.family!r} has a derived row that does not know them: add a row to "
        f"cwviz.core.loading.architectures.ARCHITECTURES with its layout ({', '.join(architectures.LAYOUTS)})"
    )


def check_flow_supported(bundle: Bundle) -> str:
    """The block layout of this model, or UnsupportedModelError (:func:`unknown_row`) for a derived row."""
    if (why := unknown_row(bundle)) is not None:
        raise UnsupportedModelError(why)
    return architectures.layout_of(bundle.model.config, bundle.arch)


def layout_for(bundle: Bundle) -> Layout:
    """The :class:`Layout` of this model's layers (UnsupportedModelError for a derived row)."""
    layout = LAYOUT_CLASSES[check_flow_supported(bundle)]
    arch, model = bundle.arch, bundle.model
    final_norm = architectures.submodule(architectures.base_model(model), arch.final_norm) if arch.final_norm else None
    return layout(arch, architectures.layer_modules(model, arch), residual_multiplier(bundle), final_norm)


def _kept(tensor: torch.Tensor, rows: slice = slice(None)) -> torch.Tensor:
    return tensor.detach()[0, rows].float()  # (rows, d_model): the batch's one row


@dataclasses.dataclass
class _Seen:
    """The slots of the layer running, filled by its hooks as they fire (then frozen into :class:`LayerSlots`)."""

    residual_in: torch.Tensor | None = None
    attention_out: torch.Tensor | None = None
    residual_mid: torch.Tensor | None = None
    norm_in: torch.Tensor | None = None
    norm_out: torch.Tensor | None = None


#: A recording's reduction of one layer: ``reduce(layout, layer, slots)``; what it returns is all that is kept.
Reduce = Callable[[Layout, int, LayerSlots], R]


class Recorder(Generic[R]):
    """The hooks of one recording (the module docstring's table) and what they keep: each layer's
    ``reduce(layout, layer, slots)``, in :attr:`layers` as the layers end; at ``position`` (None: nothing more), the
    embedding x_p^0 [d_model] and the final norm's input and output ([1, d_model] each; None without a final norm)."""

    def __init__(self, layout: Layout, reduce: Reduce[R], position: int | None = None):
        self.layout, self.reduce, self.position = layout, reduce, position
        self.layers: list[R] = []
        self.embedding: torch.Tensor | None = None
        self.final: tuple[torch.Tensor, torch.Tensor] | None = None
        self._seen = _Seen()
        self._final_in: torch.Tensor | None = None

    def hooks(self) -> list[Hook]:
        layout, hooks = self.layout, []
        for index, layer in enumerate(layout.layers):
            hooks.append(Hook(layer, "input", functools.partial(self._enter, index)))
            hooks.append(Hook(layout.module(index, layout.arch.out_proj), "output", self._slot("attention_out")))
            hooks += [Hook(tap.module, tap.reads, self._slot(tap.slot)) for tap in layout.taps(index)]
            hooks.append(Hook(layer, "output", functools.partial(self._leave, index)))
        if self.position is not None and layout.final_norm is not None:
            hooks += [
                Hook(layout.final_norm, "input", self._final_input),
                Hook(layout.final_norm, "output", self._final_output),
            ]
        return hooks

    def _slot(self, name: str) -> Callable[[torch.Tensor], None]:
        return lambda tensor: setattr(self._seen, name, _kept(tensor))

    def _enter(self, layer: int, hidden: torch.Tensor) -> None:
        self._seen = _Seen(residual_in=_kept(hidden))
        if layer == 0 and self.position is not None:
            self.embedding = self._seen.residual_in[self.position].clone()

    def _leave(self, layer: int, output: torch.Tensor) -> None:
        slots = LayerSlots(**vars(self._seen), output=_kept(output))
        self._seen = _Seen()
        self.layers.append(self.reduce(self.layout, layer, slots))

    def _final_input(self, hidden: torch.Tensor) -> None:
        self._final_in = _kept(hidden, slice(self.position, self.position + 1))

    def _final_output(self, output: torch.Tensor) -> None:
        self.final = (self._final_in, _kept(output, slice(self.position, self.position + 1)))

    def check(self) -> None:
        seen, expected = len(self.layers), len(self.layout.layers)
        if seen != expected:
            raise RuntimeError(f"the residual recorder saw {seen} of {expected} layers: was the pass run in its hooks?")


@contextlib.contextmanager
def recording(layout: Layout, reduce: Reduce[R], position: int | None = None) -> Iterator[Recorder[R]]:
    """A :class:`Recorder` whose hooks read the passes the calling thread runs inside the ``with``, whoever runs them;
    removed on leaving, whatever happened."""
    recorder = Recorder(layout, reduce, position)
    with context_hooks(recorder.hooks()):
        yield recorder


def record(
    bundle: Bundle,
    input_ids: list[int],
    reduce: Reduce[R],
    position: int | None = None,
    outputs: Callable[[int], torch.Tensor] | None = None,
) -> tuple[Recorder[R], torch.Tensor]:
    """Run the model once on ``input_ids`` under a :class:`Recorder` of the model's layout that keeps ``reduce``'s
    reduction of each layer (and, at ``position``, the embedding and the final norm); returns it with the pass's final
    hidden states [T, d_model].

    ``outputs(layer)``: the attention output z [head, query, d_head] a recorded pass of this prompt gave layer
    ``layer`` (:attr:`~cwviz.core.method.capture.LayerRecord.output`). Given it, the pass replays those outputs
    instead of computing attention again (no scores, no softmax, no weighted values), so the residual stream is that
    recorded pass's own, bit for bit; the projections, norms and MLPs still run. None: the model's own attention."""
    layout = layout_for(bundle)
    replay = (
        forward_pass(bundle.attention_modules, record=False, attend=lambda layer, _: outputs(layer))
        if outputs
        else contextlib.nullcontext()
    )
    with torch.inference_mode(), recording(layout, reduce, position) as recorder, replay:
        hidden = bundle.final_hidden(torch.tensor([input_ids], device=bundle.input_device))[0]
    recorder.check()
    return recorder, hidden


def _stream(recorder: Recorder[LayerStream], hidden: torch.Tensor) -> Stream:
    """The :class:`Stream` of a finished flow recording, from the pass's final hidden states [T, d_model]."""
    recorder.check()
    position, norm = recorder.position, recorder.layout.final_norm
    if norm is not None:
        x_p, out_p = recorder.final
        frozen, last, output = freeze(norm, x_p, out_p), x_p[0], out_p[0]
    else:
        frozen, last, output = None, hidden[position].float(), hidden[position].float()
    layers = tuple(recorder.layers)
    return Stream(layers, position, recorder.embedding, last, frozen, output, recorder.layout.name)


def record_stream(
    bundle: Bundle,
    input_ids: list[int],
    position: int,
    outputs: Callable[[int], torch.Tensor] | None = None,
) -> Stream:
    """The residual stream of ``input_ids`` reduced for the signed flow into p = ``position`` (the module docstring),
    from one pass (:func:`record`; ``outputs``: replay a recorded pass's attention outputs)."""
    return _stream(*record(bundle, input_ids, functools.partial(Layout.stream, position=position), position, outputs))


@contextlib.contextmanager
def stream_hooks(bundle: Bundle, position: int) -> Iterator[Callable[[torch.Tensor], Stream]]:
    """The recorder's hooks, reducing for the signed flow into p = ``position``, around the passes the calling thread
    runs inside the ``with``, whoever runs them (:func:`~cwviz.core.method.analysis.analyze`'s recorded pass). Yields
    ``finish(hidden)``: after the pass, the :class:`Stream`, from the pass's final hidden states ``hidden``
    [T, d_model]. The hooks are removed on leaving, whatever happened."""
    with recording(layout_for(bundle), functools.partial(Layout.stream, position=position), position) as recorder:
        yield functools.partial(_stream, recorder)
