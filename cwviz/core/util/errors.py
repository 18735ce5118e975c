"""Exceptions cwviz raises for bad input. Each message names the fix.

All derive from :class:`CwvizError` (a ``ValueError``), so callers can catch one type; the CLI prints
``error: <message>`` and exits non-zero, the app shows the message in an error box.
"""

from __future__ import annotations


class CwvizError(ValueError):
    """Base class: a problem with what the user asked for, not a bug in cwviz."""


class InputError(CwvizError):
    """The prompt or input file cannot be analysed (empty, too long, malformed)."""


class ModelLoadError(CwvizError):
    """The model could not be found or loaded (unknown id, no model at a path, hub unreachable)."""


class UnsupportedModelError(CwvizError):
    """The model loaded but its architecture has no entry in :data:`cwviz.core.loading.architectures.ARCHITECTURES`."""


class SelectionError(InputError, IndexError):
    """A layer, head or token index out of range (bad input too, so ``except InputError`` catches it)."""


class ResourceError(CwvizError):
    """The request would not fit in memory (estimate given in the message)."""


class ModelChangedError(CwvizError):
    """An :class:`~cwviz.core.method.analysis.Analysis` was asked for more after its model was freed, moved to another
    device or dtype, or had its weights changed: what it would compute would mix two models."""


class ArgumentError(InputError):
    """A bad value of one named argument of a call: ``argument`` says which ("target", "foil", "share", ...), so that a
    caller that replaces it with its default (the Flow page) reads this field, never the message."""

    def __init__(self, argument: str, message: str) -> None:
        super().__init__(message)
        self.argument = argument

    def __reduce__(self):  # pickled whole (a cache, a worker process): the field as well as the message
        return type(self), (self.argument, str(self))
