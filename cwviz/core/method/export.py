"""The JSON export of an analysis (:meth:`cwviz.Analysis.to_dict`; its schema is in docs/cli.md): the layers' entries
built from row blocks, the document around them, and the file."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import torch

from ..util.errors import InputError
from ..util.texts import write_text_atomic
from .measures import LayerMeasures

#: The schema's id and version, whatever the module that writes it is called.
SCHEMA = "cwviz.analysis"
JSON_SCHEMA_VERSION = 1
#: Bytes a value costs at its peak: a Python float and its list slot, then its JSON text.
JSON_BYTES_PER_VALUE = 48


def selection(values, count: int, check: Callable[[int], int]) -> list[int]:
    """Layers or heads to export: every one of ``count`` for None, one index, or several, each ``check``-ed and
    kept once in the order given."""
    if values is None:
        return list(range(count))
    try:
        values = [values] if isinstance(values, (str, bytes)) else list(values)
    except TypeError:  # one index (an int, a numpy integer, a 0-d tensor)
        values = [values]
    return list(dict.fromkeys(check(v) for v in values))


def value_count(layers: int, heads: int, tokens: int, causal: bool) -> int:
    """Values the export writes: attention and contribution rows of each layer and head (causal rows: keys 0..i)."""
    return 2 * layers * heads * (tokens * (tokens + 1) // 2 if causal else tokens * tokens)


def layer_entry(
    layer: int,
    blocks: Iterable[tuple[int, int, LayerMeasures]],
    heads: list[int],
    causal: bool,
    digits: int,
    learned_sink: np.ndarray | None = None,
) -> dict:
    """One layer's entry from its row blocks ``(first, stop, measures)``: per head the attention and inter-head
    contribution rows and the output norms; ``learned_sink`` [head, query], each query's share of attention that
    went to a learned sink (gpt-oss), when the layer has one."""
    attention: dict[int, list] = {h: [] for h in heads}
    contribution: dict[int, list] = {h: [] for h in heads}
    head_norms, layer_norms = [], []
    for first, _, m in blocks:
        a, c = _np(m.attention), _np(m.contribution("inter"))  # (H, rows, keys)
        for h in heads:
            for r in range(a.shape[1]):
                end = first + r + 1 if causal else a.shape[2]
                attention[h].append(rounded(a[h, r, :end], digits))
                contribution[h].append(rounded(c[h, r, :end], digits))
        head_norms.append(_np(m.head_output_norm))
        layer_norms.append(_np(m.output_norm))
    head_norm, layer_norm = np.concatenate(head_norms, axis=1), np.concatenate(layer_norms)
    return {
        "layer": layer,
        "output_norm": rounded(layer_norm, digits),
        "heads": [
            {
                "head": h,
                "attention": attention[h],
                "contribution_inter": contribution[h],
                "output_norm": rounded(head_norm[h], digits),
                **({} if learned_sink is None else {"learned_sink_attention": rounded(learned_sink[h], digits)}),
            }
            for h in heads
        ],
    }


def write_json(path: str | Path, document: dict) -> Path:
    """Write ``document`` as UTF-8 JSON, replacing ``path`` whole (:func:`~cwviz.core.util.texts.write_text_atomic`);
    returns the path. InputError when the file cannot be written (and then no part of it is left)."""
    path = Path(path)
    text = json.dumps(document, ensure_ascii=False)
    try:
        write_text_atomic(path, text)  # whole or not at all: a full disk leaves no partial file
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise InputError(f"cannot write {str(path)!r}: {reason}; choose a file in a folder that exists and that you can write to") from None
    return path


def rounded(values: np.ndarray, digits: int) -> list[float | None]:
    """Round to ``digits`` significant digits; non-finite values become None (JSON null)."""
    return [float(f"{v:.{digits}g}") if math.isfinite(v) else None for v in np.asarray(values, dtype=np.float64).ravel()]


def _np(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().float().cpu().numpy()
