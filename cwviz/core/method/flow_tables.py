"""The result of :func:`cwviz.core.method.flow.flow` as tidy tables (docs/METHOD.md section 6). numpy and pandas only: a
:class:`Flow` can be pickled, cached and charted without torch.

| field            | shape                  | meaning                                                               |
|------------------|------------------------|-----------------------------------------------------------------------|
| totals           | [key]                  | each input token's signed total toward t over f (an encoder: its share) |
| share            | [key]                  | row p of the signed rollout: each token's share of p's final representation |
| nodes            | [layer + 1, position]  | v^l: the value through the residual at (layer, position)              |
| direct           | [layer + 1, position]  | d^l: the direct parts credited to (layer, position)                   |
| head_direct      | [layer, head]          | each head's direct part toward t over f                              |
| head_routed      | [layer, head]          | each head's part of the routed value                                  |
| attention_parts  | [layer, head, key]     | the direct part of each (layer, head, source) write at p              |
| edge_mass        | [layer]                | Σ |weight| of all edges (layer, ·) → (layer + 1, ·)                   |
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..defaults import LAYER_KEPT
from . import flow_arguments as arguments

if TYPE_CHECKING:
    import pandas as pd


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
class Flow:
    """The signed flow into one position (docs/METHOD.md section 6): arrays in the module docstring's table, and
    tables built from them. ``target`` / ``foil`` are token ids (None: an encoder / no foil);
    ``logit_difference`` is the model's own (after any soft-cap), ``frozen_logit_difference`` the sum of the parts
    (before the soft-cap), ``norm_error`` the model's own difference before the soft-cap minus the parts' sum (the
    final norm's linearisation error: rounding-sized); NaN for an encoder. ``bias_total``: the biases' part,
    so that Σ totals + bias_total = frozen_logit_difference (an encoder: Σ totals + bias_total = 1).
    ``head_vocabulary``: the rows of :attr:`vocabulary`, computed when first read (:class:`Deferred`)."""

    token_strings: tuple[str, ...]
    position: int
    target: int | None
    foil: int | None
    target_token: str | None
    foil_token: str | None
    totals: np.ndarray
    share: np.ndarray
    bias_total: float
    share_bias: float
    nodes: np.ndarray
    direct: np.ndarray
    head_direct: np.ndarray
    head_routed: np.ndarray
    attention_parts: np.ndarray
    other_parts: dict | None
    head_vocabulary: Deferred | None
    edge_list: tuple[tuple[int, np.ndarray, np.ndarray, np.ndarray], ...]
    edge_mass: np.ndarray
    logit_difference: float
    frozen_logit_difference: float
    norm_error: float

    @property
    def vocabulary(self) -> tuple[tuple, ...] | None:
        """(layer, head, direction, rank, token id, token, logit) for each head's most promoted and suppressed tokens
        (None: none were asked for, or an encoder), computed when first read (:func:`cwviz.core.method.flow.flow`)."""
        return None if self.head_vocabulary is None else self.head_vocabulary()

    @property
    def encoder(self) -> bool:
        """Whether this is an encoder's flow into a representation (no logit)."""
        return self.target is None

    @property
    def rollout_cancellation(self) -> float:
        """κ_p = Σ_j |R_pj| over the tokens and the bias: 1 when no share cancels another (section 6.2)."""
        return float(np.abs(self.share).sum() + abs(self.share_bias))

    @property
    def tokens(self) -> pd.DataFrame:
        """One row per input position: ``position, token, total, rollout_share`` (``rollout_share``: row p of the signed
        rollout, :attr:`share`, each token's share of p's final representation; not total / Σ total)."""
        import pandas as pd

        return pd.DataFrame(
            {
                "position": np.arange(len(self.token_strings)),
                "token": list(self.token_strings),
                "total": self.totals,
                "rollout_share": self.share,
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
            table[direction] = [joined.get((layer, head), "") for layer, head in zip(table["layer"], table["head"], strict=True)]
        return table

    @property
    def vocabulary_table(self) -> pd.DataFrame:
        """``layer, head, direction, rank, token_id, token, logit``: each head's write at p read through the frozen
        final norm and the output layer, its most promoted and suppressed tokens."""
        import pandas as pd

        columns = ["layer", "head", "direction", "rank", "token_id", "token", "logit"]
        return pd.DataFrame(list(self.vocabulary or ()), columns=columns)

    @property
    def parts(self) -> pd.DataFrame:
        """Every direct part toward t over f: ``part, layer, head, source, value`` (part: embedding, attention,
        attention bias, mlp, final bias; layer/head/source -1 where they do not apply). Sums to
        ``frozen_logit_difference``. Empty for an encoder."""
        import pandas as pd

        columns = ["part", "layer", "head", "source", "value"]
        if self.other_parts is None:
            return pd.DataFrame(columns=columns)
        layers, heads, keys = self.attention_parts.shape
        grid = np.indices((layers, heads, keys)).reshape(3, -1)
        attention = pd.DataFrame(
            {"part": "attention", "layer": grid[0], "head": grid[1], "source": grid[2], "value": self.attention_parts.reshape(-1)}
        )
        other = self.other_parts
        rows = [("embedding", -1, -1, self.position, other["embedding"])]
        rows += [("attention bias", layer, -1, -1, float(v)) for layer, v in enumerate(other["attention_bias"])]
        rows += [("mlp", layer, -1, self.position, float(v)) for layer, v in enumerate(other["mlp"])]
        rows.append(("final bias", -1, -1, -1, float(other["final_bias"])))
        return pd.concat([pd.DataFrame(rows, columns=columns), attention], ignore_index=True)

    @property
    def node_table(self) -> pd.DataFrame:
        """``layer, position, value, direct``: each node (the residual entering ``layer`` at ``position``; layer L
        is the final residual)."""
        import pandas as pd

        layers, positions = self.nodes.shape
        grid = np.indices((layers, positions)).reshape(2, -1)
        return pd.DataFrame({"layer": grid[0], "position": grid[1], "value": self.nodes.reshape(-1), "direct": self.direct.reshape(-1)})

    def edges(self, share: float = LAYER_KEPT) -> pd.DataFrame:
        """The graph pruned to ``share`` of each layer's |mass| (docs/METHOD.md section 6.4): ``layer, source,
        target, weight``, the edge (layer, source) → (layer + 1, target), largest |weight| first within a layer."""
        import pandas as pd

        share = arguments.share(share)
        frames = []
        for layer, weights, targets, sources in self.edge_list:
            count = kept_count(weights, self.edge_mass[layer] * share)
            frames.append(pd.DataFrame({"layer": layer, "source": sources[:count], "target": targets[:count], "weight": weights[:count]}))
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["layer", "source", "target", "weight"])

    def edges_complete(self, share: float = LAYER_KEPT) -> bool:
        """Whether the kept edges reach ``share`` of every layer's |mass| (else :meth:`edges` returns all it kept)."""
        share = arguments.share(share)
        return all(np.abs(weights).sum() >= self.edge_mass[layer] * share * (1 - 1e-6) for layer, weights, _, _ in self.edge_list)


def kept_count(weights: np.ndarray, mass: float) -> int:
    """How many of ``weights`` (sorted by |weight|, largest first) reach ``mass`` together (all if they do not)."""
    reached = np.cumsum(np.abs(weights)) >= mass * (1 - 1e-6)
    return int(reached.argmax()) + 1 if reached.any() else len(weights)
