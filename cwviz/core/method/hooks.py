"""The one per-context mechanism of cwviz's passes: a ``ContextVar`` set for the length of a ``with`` statement.

A model is shared: the dashboard runs one model from several threads at once. Whatever cwviz adds to a pass must
therefore reach only the pass of the caller that asked for it, and never outlive its ``with``. Two things need that:

* the attention seam (:mod:`cwviz.core.method.capture`): the active pass is a ``ContextVar`` read by cwviz's
  attention function, set by :func:`scoped`;
* forward hooks (:func:`context_hooks`: the residual recorder, :mod:`cwviz.core.method.residual`, and the effect
  flow's layer inputs): registered on the shared modules, so every thread's pass calls them; each returns at once
  unless its owner is in this ``ContextVar`` of the running context. The hooks are removed on leaving the ``with``,
  whatever happened.

A ``ContextVar`` is per thread (a new thread starts with a context of its own) and per asyncio task, so both are
isolated the same way, by the same rule.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Literal, TypeVar

import torch
from torch import nn

V = TypeVar("V")

#: The owners (one object per :func:`context_hooks` call) whose hooks run in the current context.
_OWNERS: contextvars.ContextVar[frozenset[object]] = contextvars.ContextVar("cwviz_hook_owners", default=frozenset())


@contextlib.contextmanager
def scoped(var: contextvars.ContextVar[V], value: V) -> Iterator[V]:
    """``var`` set to ``value`` in the calling context for the length of the ``with``, then reset, whatever happened."""
    token = var.set(value)
    try:
        yield value
    finally:
        var.reset(token)


@dataclass(frozen=True)
class Hook:
    """A forward hook on ``module``. ``read`` is given, by ``reads``: ``"input"``, the module's main input (its first
    argument or ``hidden_states=``) before it runs; ``"output"``, its main output (the first of a tuple); ``"call"``,
    the whole call ``(args, kwargs)`` before it runs."""

    module: nn.Module
    reads: Literal["input", "output", "call"]
    read: Callable[..., None]


def hidden_of(args: tuple, kwargs: dict) -> torch.Tensor:
    """The hidden states a module is called with (its first argument, or ``hidden_states=``)."""
    return args[0] if args else kwargs["hidden_states"]


def first_of(output) -> torch.Tensor:
    """A module's main output (the first of a tuple)."""
    return output[0] if isinstance(output, tuple | list) else output


@contextlib.contextmanager
def context_hooks(hooks: Iterable[Hook]) -> Iterator[None]:
    """Register ``hooks`` for the passes the calling context runs inside the ``with`` (another thread's pass of the same
    model does not call them); always removed on leaving."""
    owner = object()

    def before(hook: Hook):
        def run(module, args, kwargs) -> None:
            if owner not in _OWNERS.get():
                return
            if hook.reads == "input":
                hook.read(hidden_of(args, kwargs))
            else:
                hook.read(args, kwargs)

        return run

    def after(hook: Hook):
        def run(module, args, output) -> None:
            if owner in _OWNERS.get():
                hook.read(first_of(output))

        return run

    handles = []
    with scoped(_OWNERS, _OWNERS.get() | {owner}):
        try:
            for hook in hooks:
                if hook.reads == "output":
                    handles.append(hook.module.register_forward_hook(after(hook)))
                else:
                    handles.append(hook.module.register_forward_pre_hook(before(hook), with_kwargs=True))
            yield
        finally:
            for handle in handles:
                handle.remove()
