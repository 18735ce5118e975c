"""The one sentence that says what a flow explains (``cwviz flow``'s first line, the Flow page's titles and caption,
:func:`cwviz.plot.flow`'s heading). Pure: it reads what an attribution or a flow was asked, no torch."""

from __future__ import annotations

from typing import Protocol


class Explained(Protocol):
    """What was asked of a flow (:class:`cwviz.core.method.flow_tables.Asked`, or a
    :class:`~cwviz.core.method.flow_tables.Flow` itself): the prompt's tokens, the position, the target and foil token
    ids (None: an encoder, or no foil) and their text."""

    token_strings: tuple[str, ...]
    position: int
    target: int | None
    foil: int | None
    target_token: str | None
    foil_token: str | None


def describe(asked: Explained) -> str:
    """``from position 12 ' of' toward logit(' Paris') - logit(' Rome')``; an encoder's: ``from position 0 '[CLS]'
    toward its final representation``."""
    where = f"position {asked.position} {asked.token_strings[asked.position]!r}"
    if asked.target is None:
        return f"from {where} toward its final representation"
    against = "" if asked.foil is None else f" - logit({asked.foil_token!r})"
    return f"from {where} toward logit({asked.target_token!r}){against}"
