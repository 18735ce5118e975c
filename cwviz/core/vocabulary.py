"""Words every room of cwviz shares, defined once: the core computes with them, the tables and pickers show them.

Imports nothing of cwviz but its errors (no torch), so that :mod:`cwviz.analyses.schema` and the charts can use it.
"""

from __future__ import annotations

from .util.errors import InputError

#: The two contribution kinds: inter-head C (a layer's heads share the sum 1) and intra-head c (each head sums to
#: 1). Their order is the pickers' (the first is the default) and that of the stacked tensors of
#: :mod:`cwviz.core.method.measures`, which look a kind up by name (``KINDS.index(kind)``), never by position.
KINDS: tuple[str, ...] = ("inter", "intra")
#: How every picker of a contribution kind shows it (a page's link holds this label: keep it as it is).
KIND_LABELS: dict[str, str] = {
    "inter": "Share of the layer output (inter)",
    "intra": "Share of each head's output (intra)",
}


def check_kind(kind: object) -> str:
    """``kind`` when it is one of :data:`KINDS`, else InputError (a ``ValueError``) naming both."""
    if kind not in KINDS:
        labels = "; ".join(label.lower() for label in KIND_LABELS.values())
        raise InputError(f"kind must be {' or '.join(map(repr, KINDS))}, not {kind!r} ({labels})")
    return kind
