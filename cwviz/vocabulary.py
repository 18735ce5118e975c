"""Words every room of cwviz shares, defined once: the core computes with them, the tables and pickers show them.

Imports nothing (no cwviz module, no torch), so that :mod:`cwviz.analyses.schema` and the charts can use it.
"""

from __future__ import annotations

#: The two contribution kinds: inter-head C (a layer's heads share the sum 1) and intra-head c (each head sums to
#: 1). Their order is the pickers' (the first is the default) and that of the stacked tensors of
#: :mod:`cwviz.core.method.measures`, which look a kind up by name (``KINDS.index(kind)``), never by position.
KINDS: tuple[str, ...] = ("inter", "intra")
