"""The JSON export of an analysis (:func:`to_dict`, :func:`to_json`; the schema is in docs/cli.md): the layers' entries
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
from . import memory
from .analysis import Analysis
from .measures import LayerMeasures

#: The schema's id and version, whatever the module that writes it is called.
SCHEMA = "cwviz.analysis"
JSON_SCHEMA_VERSION = 1
#: Bytes a value costs at its peak: a Python float and its list slot, then its JSON text.
JSON_BYTES_PER_VALUE = 48


def to_dict(
    analysis: Analysis, layers: list[int] | int | None = None, heads: list[int] | int | None = None, digits: int = 6
) -> dict:
    """The JSON export (schema in docs/cli.md): tokens, and per layer and head the attention and inter-head contribution
    rows and the output norms. Causal rows keep only keys 0..i.

    ``layers``, ``heads``: None (all), one index, or a list of them (each written once, in the order given).

    Layers are read in row blocks (:meth:`cwviz.Analysis.row_blocks`); what the dict itself holds grows with the square
    of the prompt (about :data:`JSON_BYTES_PER_VALUE` bytes a value as Python floats and then as JSON text), so an
    export that would not fit raises ResourceError naming the choice to narrow."""
    layers = selection(layers, analysis.num_layers, analysis.check_layer)
    heads = selection(heads, analysis.num_heads, analysis.check_head)
    causal = analysis.bundle.arch.causal
    t = analysis.num_tokens
    values = value_count(len(layers), len(heads), t, causal)
    memory.check_fits(
        values * JSON_BYTES_PER_VALUE,
        torch.device("cpu"),
        f"the JSON of {len(layers)} layer(s) x {len(heads)} head(s) at {t:,} tokens ({values:,} values)",
        "choose one layer and one head (--layer, --head; to_dict(analysis, layers=[...], heads=[...])) or a shorter "
        "prompt",
    )
    out_layers = []
    for layer in layers:
        # A layer with learned sinks (gpt-oss): each query's share of attention that went to the sink.
        sunk = analysis.learned_sink_attention(layer) if analysis.learned_sink_logits(layer) is not None else None
        out_layers.append(layer_entry(layer, analysis.row_blocks(layer), heads, causal, digits, sunk))
    perplexity = analysis.perplexity
    return {
        "schema": SCHEMA,
        "version": JSON_SCHEMA_VERSION,
        "model": vars(analysis.info).copy(),
        "text": analysis.text,
        "tokens": analysis.tokens,
        "input_ids": analysis.input_ids,
        "causal": causal,
        "perplexity": None if math.isnan(perplexity) else perplexity,
        "layers": out_layers,
    }


def to_json(
    analysis: Analysis, path: str | Path, layers: list[int] | int | None = None, heads: list[int] | int | None = None
) -> Path:
    """Write :func:`to_dict` as UTF-8 JSON; returns the path. InputError when the file cannot be written."""
    return write_json(path, to_dict(analysis, layers, heads))


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
        raise InputError(
            f"cannot write {str(path)!r}: {reason}; choose a file in a folder that exists and that you can write to"
        ) from None
    return path


def rounded(values: np.ndarray, digits: int) -> list[float | None]:
    """Round to ``digits`` significant digits; non-finite values become None (JSON null)."""
    return [
        float(f"{v:.{digits}g}") if math.isfinite(v) else None for v in np.asarray(values, dtype=np.float64).ravel()
    ]


def _np(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().float().cpu().numpy()
