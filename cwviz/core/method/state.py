"""The model a recorded pass (:class:`~cwviz.core.method.records_reader.RecordsReader`, :class:`cwviz.Analysis`) was
made from, as it was then: an analysis that outlives a change of its model (freed, moved to another device or dtype,
weights edited in place) refuses to go on rather than mix its recorded pass with other weights (a wrong perplexity, a
Gram matrix on another device, an overflow)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Concatenate, ParamSpec, Protocol, TypeVar

import torch

from ..loading import architectures
from ..loading.models import Bundle, weight_state
from ..util.errors import ModelChangedError


class ModelState:
    """A cheap fingerprint of a bundle's model, taken when it is made; :meth:`check` compares the model with it.

    The fingerprint is, per weight the analysis reads after its pass (the input and output embeddings, every layer's
    output projection W_O: the Gram matrices and the perplexity), its device, dtype, data pointer and version counter.
    Moving the model (``.to("meta")``, ``.cpu()``, ``.half()``) changes the device, dtype or pointer, freeing it the
    pointer, and an in-place change (``load_state_dict``, ``copy_``, an edit under ``no_grad``) bumps the version
    counter. The modules are kept, not their weights (a moved model has new weights; none is kept alive), and no
    weight's values are read: a few dozen tensors' metadata per check (tens of microseconds)."""

    def __init__(self, bundle: Bundle) -> None:
        model = bundle.model
        projections = architectures.out_projections(model, bundle.arch)
        modules = (model.get_input_embeddings(), model.get_output_embeddings(), *projections)
        self._modules = tuple(m for m in modules if m is not None)
        self._model_id = bundle.info.id
        self._state = self._now()

    def _now(self) -> tuple[tuple, ...]:
        weights = (getattr(m, "weight", None) for m in self._modules)
        return tuple(weight_state(w) for w in weights if isinstance(w, torch.Tensor))

    def check(self) -> None:
        """ModelChangedError unless the model is as it was when this state was taken."""
        if self._now() != self._state:
            raise ModelChangedError(
                f"the model {self._model_id!r} was freed, moved to another device or dtype, or had its weights changed "
                "after this analysis was made; run analyze again on the model as it is now (or load it again)"
            )


class Checked(Protocol):
    """What :func:`checked` needs of the object whose method it wraps."""

    def check_model(self) -> None: ...


Reader = TypeVar("Reader", bound=Checked)
Args = ParamSpec("Args")
Result = TypeVar("Result")


def checked(method: Callable[Concatenate[Reader, Args], Result]) -> Callable[Concatenate[Reader, Args], Result]:
    """``method`` of a records reader after its ``check_model()``, at the call (for a generator too, before any row
    block)."""

    @functools.wraps(method)
    def run(self: Reader, *args: Args.args, **kwargs: Args.kwargs) -> Result:
        self.check_model()
        return method(self, *args, **kwargs)

    return run
