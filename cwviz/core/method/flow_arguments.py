"""The flow API's argument contract (docs/METHOD.md section 6): what :func:`cwviz.core.method.flow.flow`,
:func:`~cwviz.core.method.flow.flow_basis`, :meth:`Flow.edges <cwviz.core.method.flow_tables.Flow.edges>` and
:meth:`Flow.edges_complete <cwviz.core.method.flow_tables.Flow.edges_complete>` accept, checked at the call.

* a target or a foil: None, an int (a numpy integer too), a str, or a one-element integer tensor; never a bool (an
  int to Python, but ``target=True`` means no token);
* a kept fraction (of each layer's |mass| the graph keeps, of the effect a route carries): a real number in (0, 1];
* a vocabulary count: a whole number from 0 to the vocabulary's size.

Anything else is an :class:`~cwviz.core.util.errors.ArgumentError` naming the argument, whose message quotes at most
:data:`QUOTE` characters of what was given (a 100,000-character target is not echoed whole). No torch import: a tensor
can only have been made where torch is loaded already, and the CLI's parser checks ``--kept`` with these functions
before torch is imported.
"""

from __future__ import annotations

import math
import sys

import numpy as np

from ..util.errors import ArgumentError

#: The most characters of a bad value an error message quotes.
QUOTE = 80


def quoted(value: object, limit: int = QUOTE) -> str:
    """``repr(value)`` cut to ``limit`` characters (with its length said when cut)."""
    text = repr(value)
    if len(text) <= limit:
        return text
    size = f" ({len(value):,} characters)" if isinstance(value, str | bytes) else ""
    return text[: limit - 3] + "..." + size


def token(value: object, name: str) -> int | str | None:
    """A target or foil (``name``) as the flow takes it: None, an int or a str; a one-element integer tensor or a numpy
    integer as its int. ArgumentError for a bool or any other type (a float, a list, bytes, a tensor of several values
    or of floats)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool | np.bool_):
        raise ArgumentError(
            name, f"the {name} {value!r} is a bool; give a token id (an int) or the token's text (a str)"
        )
    if isinstance(value, int | np.integer):
        return int(value)
    torch = sys.modules.get("torch")  # a tensor exists only where torch is imported
    if torch is not None and isinstance(value, torch.Tensor) and value.numel() == 1:
        if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
            raise ArgumentError(
                name, f"the {name} is a tensor of {value.dtype}; give a token id (an integer tensor, an int) or a str"
            )
        return int(value.item())
    raise ArgumentError(
        name,
        f"the {name} must be a token id (an int, or a one-element integer tensor) or the token's text (a str), "
        f"not a {type(value).__name__}: {quoted(value)}",
    )


def token_id(value: int, size: int, name: str) -> int:
    """A token id ``value`` of a vocabulary of ``size`` tokens; ArgumentError naming ``name`` outside 0 .. size - 1."""
    if not 0 <= value < size:
        raise ArgumentError(name, f"the {name} token id {value} is outside the vocabulary 0..{size - 1}")
    return value


def kept(value: object, name: str = "kept") -> float:
    """A kept fraction (:meth:`Flow.edges <cwviz.core.method.flow_tables.Flow.edges>`,
    :func:`cwviz.analyses.route.route`): a real number in (0, 1]; ArgumentError naming ``name`` otherwise (a str, None,
    a bool, NaN, 0, a negative or one above 1)."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | float | np.integer | np.floating):
        raise ArgumentError(
            name, f"{name} must lie in (0, 1] (a number), not a {type(value).__name__}: {quoted(value)}"
        )
    if not (math.isfinite(value) and 0 < value <= 1):
        raise ArgumentError(name, f"{name} must lie in (0, 1], not {value}")
    return float(value)


def vocabulary(value: object, size: int) -> int:
    """How many vocabulary tokens are listed per head: a whole number from 0 to the vocabulary's ``size``;
    ArgumentError otherwise (a bool, a float, a negative count, more than the vocabulary holds)."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer):
        raise ArgumentError(
            "vocabulary", f"vocabulary must be a whole number of tokens, not a {type(value).__name__}: {quoted(value)}"
        )
    if not 0 <= value <= size:
        raise ArgumentError("vocabulary", f"vocabulary must lie in 0..{size} (the model's vocabulary), not {value}")
    return int(value)
