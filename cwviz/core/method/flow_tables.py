"""The result of :func:`cwviz.core.method.flow.flow` as tidy tables (docs/METHOD.md section 6). numpy and pandas only: a
:class:`Flow` can be pickled, cached and charted without torch.

| field            | shape                  | meaning                                                               |
|------------------|------------------------|-----------------------------------------------------------------------|
| totals           | [key]                  | each input token's signed total toward t over f (an encoder: its share) |
| rollout_row      | [key]                  | row p of the signed rollout: each token's share of p's representation |
| nodes            | [layer + 1, position]  | v^l: the value through the residual at (layer, position)              |
| direct           | [layer + 1, position]  | d^l: the direct parts credited to (layer, position)                   |
| head_direct      | [layer, head]          | each head's direct part toward t over f                              |
| head_routed      | [layer, head]          | each head's part of the routed value                                  |
| attention_parts  | [layer, head, key]     | the direct part of each (layer, head, key position) write at p         |
| kept_edges       | [layer] of LayerEdges  | each layer's largest edges (layer, k) → (layer + 1, i) and its |mass|  |

An edge k → i runs from its start, key position k, to its end, query position i (docs/METHOD.md, the glossary).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..defaults import LAYER_KEPT
from . import flow_arguments as arguments

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class LayerEdges:
    """One layer's kept edges, largest |weight| first: ``weights`` [n], ``queries`` (each edge's end i) [n], ``keys``
    (its start k) [n], the edge (layer, k → i); ``mass``: Σ |weight| over all of the layer's edges, kept or not."""

    layer: int
    weights: np.ndarray
    queries: np.ndarray
    keys: np.ndarray
    mass: float


@dataclass(frozen=True)
class DirectParts:
    """The direct parts toward t over f that are not an attention write at p (docs/METHOD.md section 6.3): the
    ``embedding``'s at p, each layer's ``attention_bias`` [layer] and ``mlp`` [layer], and the ``final_bias``."""

    embedding: float
    attention_bias: np.ndarray
    mlp: np.ndarray
    final_bias: float


class Deferred:
    """A value computed on first use by ``compute`` (a function of no arguments), once, under a lock, then kept: the
    part of a :class:`Flow` that costs most and not every caller reads (each head's vocabulary). Pickled or copied as
    the value (computed then), so a pickled Flow holds its tables and nothing of the model they came from."""

    def __init__(self, compute: Callable[[], Any] | None, value: Any = None) -> None:
        self._compute, self._value, self._lock = compute, value, threading.Lock()

    def __call__(self) -> Any:
        with self._lock:
            if self._compute is not None:
                self._value, self._compute = self._compute(), None
            return self._value

    def __reduce__(self):
        return Deferred, (None, self())


@dataclass(frozen=True)
class Asked:
    """What a flow or an attribution answers: the prompt's tokens, the position, the target and foil token ids (None:
    an encoder / no foil) and their text."""

    token_strings: tuple[str, ...]
    position: int
    target: int | None
    foil: int | None
    target_token: str | None
    foil_token: str | None

    def asked(self) -> Asked:
        """These six fields alone (of a :class:`Flow`, say), without what was computed."""
        return Asked(*(getattr(self, f.name) for f in dataclasses.fields(Asked)))


@dataclass(frozen=True)
class Flow(Asked):
    """The signed flow into one position (docs/METHOD.md section 6): arrays in the module docstring's table, and
    tables built from them. ``target`` / ``foil`` are token ids (None: an encoder / no foil);
    ``logit_difference`` is the model's own (after any soft-cap), ``frozen_logit_difference`` the sum of the parts
    (before the soft-cap), ``norm_error`` the model's own difference before the soft-cap minus the parts' sum (the
    final norm's linearisation error: rounding-sized); NaN for an encoder. ``bias_total``: the biases' part,
    so that Σ totals + bias_total = frozen_logit_difference (an encoder: Σ totals + bias_total = 1).
    ``rollout_bias``: the bias's entry of the rollout row (Σ rollout_row + rollout_bias = 1); ``other_parts``: the
    direct parts that are not attention writes (None: an encoder). ``head_vocabulary``: the rows of
    :attr:`vocabulary`, computed when first read (:class:`Deferred`)."""

    totals: np.ndarray
    rollout_row: np.ndarray
    bias_total: float
    rollout_bias: float
    nodes: np.ndarray
    direct: np.ndarray
    head_direct: np.ndarray
    head_routed: np.ndarray
    attention_parts: np.ndarray
    other_parts: DirectParts | None
    head_vocabulary: Deferred | None
    kept_edges: tuple[LayerEdges, ...]
    logit_difference: float
    frozen_logit_difference: float
    norm_error: float

    @property
    def vocabulary(self) -> tuple[tuple, ...] | None:
        """(layer, head, direction, rank, token id, token, logit) for each head's most promoted and suppressed tokens
        (None: none were asked for, or an encoder), computed when first read (:func:`cwviz.core.method.flow.flow`)."""
        return None if self.head_vocabulary is None else self.head_vocabulary()

    @property
    def edge_mass(self) -> np.ndarray:
        """Σ |weight| of all edges (layer, ·) → (layer + 1, ·), kept or not: float64 [layer]."""
        return np.array([edges.mass for edges in self.kept_edges], np.float64)

    @property
    def encoder(self) -> bool:
        """Whether this is an encoder's flow into a representation (no logit)."""
        return self.target is None

    @property
    def rollout_cancellation(self) -> float:
        """κ_p = Σ_j |R_pj| over the tokens and the bias: 1 when no share cancels another (section 6.2)."""
        return float(np.abs(self.rollout_row).sum() + abs(self.rollout_bias))

    @property
    def tokens(self) -> pd.DataFrame:
        """One row per input position: ``position, token, total, rollout_row`` (``rollout_row``: row p of the signed
        rollout, :attr:`rollout_row`, each token's share of p's final representation; not total / Σ total)."""
        import pandas as pd

        return pd.DataFrame(
            {
                "position": np.arange(len(self.token_strings)),
                "token": list(self.token_strings),
                "total": self.totals,
                "rollout_row": self.rollout_row,
            }
        )

    @property
    def heads(self) -> pd.DataFrame:
        """One row per (layer, head): ``layer, head, direct, routed, promoted, suppressed`` (the last two: its write's
        most promoted and suppressed vocabulary tokens, joined by " | "; empty without a vocabulary)."""
        import pandas as pd

        layers, heads = self.head_direct.shape
        table = pd.DataFrame(
            {
                "layer": np.repeat(np.arange(layers), heads),
                "head": np.tile(np.arange(heads), layers),
                "direct": self.head_direct.reshape(-1),
                "routed": self.head_routed.reshape(-1),
            }
        )
        vocab = self.vocabulary_table
        for direction in ("promoted", "suppressed"):
            picked = vocab[vocab["direction"] == direction].sort_values(["layer", "head", "rank"])
            joined = picked.groupby(["layer", "head"])["token"].agg(lambda tokens: " | ".join(map(str, tokens)))
            table[direction] = [
                joined.get((layer, head), "") for layer, head in zip(table["layer"], table["head"], strict=True)
            ]
        return table

    @property
    def vocabulary_table(self) -> pd.DataFrame:
        """``layer, head, direction, rank, token_id, token, logit``: each head's write at p read through the frozen
        final norm and the output layer, its most promoted and suppressed tokens (:func:`vocabulary_table`)."""
        return vocabulary_table(self.vocabulary)

    @property
    def parts(self) -> pd.DataFrame:
        """Every direct part toward t over f: ``part, layer, head, key, value`` (part: embedding, attention, attention
        bias, mlp, final bias; ``key``: the key position the part is read from; layer/head/key -1 where they do not
        apply). Sums to ``frozen_logit_difference``. Empty for an encoder."""
        import pandas as pd

        columns = ["part", "layer", "head", "key", "value"]
        if self.other_parts is None:
            return pd.DataFrame(columns=columns)
        layers, heads, keys = self.attention_parts.shape
        grid = np.indices((layers, heads, keys)).reshape(3, -1)
        attention = pd.DataFrame(
            {
                "part": "attention",
                "layer": grid[0],
                "head": grid[1],
                "key": grid[2],
                "value": self.attention_parts.reshape(-1),
            }
        )
        other = self.other_parts
        rows = [("embedding", -1, -1, self.position, other.embedding)]
        rows += [("attention bias", layer, -1, -1, float(v)) for layer, v in enumerate(other.attention_bias)]
        rows += [("mlp", layer, -1, self.position, float(v)) for layer, v in enumerate(other.mlp)]
        rows.append(("final bias", -1, -1, -1, float(other.final_bias)))
        return pd.concat([pd.DataFrame(rows, columns=columns), attention], ignore_index=True)

    @property
    def node_table(self) -> pd.DataFrame:
        """``layer, position, value, direct``: each node (the residual entering ``layer`` at ``position``; layer L
        is the final residual)."""
        import pandas as pd

        layers, positions = self.nodes.shape
        grid = np.indices((layers, positions)).reshape(2, -1)
        return pd.DataFrame(
            {"layer": grid[0], "position": grid[1], "value": self.nodes.reshape(-1), "direct": self.direct.reshape(-1)}
        )

    def edges(self, kept: float = LAYER_KEPT) -> pd.DataFrame:
        """The graph pruned to the kept fraction ``kept`` of each layer's |mass| (docs/METHOD.md section 6.4): ``layer,
        start, end, weight``, the edge (layer, start) → (layer + 1, end), largest |weight| first within a layer."""
        import pandas as pd

        kept = arguments.kept(kept)
        frames = []
        for edges in self.kept_edges:
            count = kept_count(edges.weights, edges.mass * kept)
            picked = {"start": edges.keys[:count], "end": edges.queries[:count], "weight": edges.weights[:count]}
            frames.append(pd.DataFrame({"layer": edges.layer, **picked}))
        return (
            pd.concat(frames, ignore_index=True)
            if frames
            else pd.DataFrame(columns=["layer", "start", "end", "weight"])
        )

    def edges_complete(self, kept: float = LAYER_KEPT) -> bool:
        """Whether the kept edges reach the fraction ``kept`` of every layer's |mass| (else :meth:`edges` returns all
        it kept)."""
        kept = arguments.kept(kept)
        return all(np.abs(edges.weights).sum() >= edges.mass * kept * (1 - 1e-6) for edges in self.kept_edges)


def vocabulary_table(rows: tuple[tuple, ...] | None) -> pd.DataFrame:
    """The heads' vocabulary ``rows`` (:attr:`Flow.vocabulary`, or a :class:`~cwviz.core.method.flow.FlowBasis`'s
    ``vocabulary()``; None: none) as a table: ``layer, head, direction, rank, token_id, token, logit``."""
    import pandas as pd

    columns = ["layer", "head", "direction", "rank", "token_id", "token", "logit"]
    return pd.DataFrame(list(rows or ()), columns=columns)


def kept_count(weights: np.ndarray, mass: float) -> int:
    """How many of ``weights`` (sorted by |weight|, largest first) reach ``mass`` together (all if they do not)."""
    reached = np.cumsum(np.abs(weights)) >= mass * (1 - 1e-6)
    return int(reached.argmax()) + 1 if reached.any() else len(weights)
