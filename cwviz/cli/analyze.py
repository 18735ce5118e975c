"""``python -m cwviz analyze``: a human summary of one prompt, and the JSON export."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from ..core.method.analysis import analyze
from ..core.method.export import to_json
from ..core.util.progress import cli_bar
from . import outputs
from .common import load, read_text

TOP = 5


def last_token_scores(analysis, layer: int | None, head: int | None) -> tuple[np.ndarray, np.ndarray, str]:
    """(attention, contribution) of the last query over its keys, and a description of the scope.

    Layer-level: attention averaged over heads, inter-head contributions summed over heads (docs/METHOD.md).
    One head: its attention and its intra-head contributions (both sum to 1 over keys).
    Several layers: averaged over them.
    """
    layers = range(analysis.num_layers) if layer is None else [analysis.check_layer(layer)]
    if head is not None:
        analysis.check_head(head)
    query = analysis.num_tokens - 1
    attention, contribution = [], []
    for l in layers:
        row = analysis.rows(l, query, query + 1)  # the last query's row only, never the layer's T x T maps
        if head is None:
            attention.append(row.layer_level("raw")[0].cpu().numpy())
            contribution.append(row.layer_level("contribution_inter")[0].cpu().numpy())
        else:
            attention.append(row.attention[head, 0].cpu().numpy())
            contribution.append(row.contribution("intra")[head, 0].cpu().numpy())
    where = "all layers (mean)" if layer is None else f"layer {layer}"
    who = (
        "all heads (attention: mean; contribution: inter-head sum)"
        if head is None
        else f"head {head} (contribution: intra-head)"
    )
    return np.mean(attention, axis=0), np.mean(contribution, axis=0), f"{where}, {who}"


def _top(scores: np.ndarray, tokens: list[str]) -> list[str]:
    order = np.argsort(-scores, kind="stable")[:TOP]
    return [f"#{k:<4} {tokens[k][:16]!r:20} {scores[k]:+.4f}" for k in order]


def run(args: argparse.Namespace) -> int:
    """Analyse the prompt; write ``--json`` first, then print the summary (a reader that leaves early, ``| head -1``,
    loses no file)."""
    text = read_text(args)
    json_path = Path(args.json_path) if args.json_path else None
    outputs.check_file(json_path, "--json", "analysis.json")  # before the model loads
    bundle = load(args)
    with cli_bar("analysing", enabled=sys.stderr.isatty()) as progress:
        analysis = analyze(bundle, text, progress=progress)
    attention, contribution, scope = last_token_scores(analysis, args.layer, args.head)
    info = bundle.info
    tokens = analysis.tokens
    if not info.causal:
        ppl = "none (an encoder does not predict next tokens)"
    elif analysis.num_tokens < 2:
        ppl = "n/a (needs at least two tokens)"
    else:
        ppl = f"{analysis.perplexity:.3f}"
    written = None
    if json_path is not None:
        layers = None if args.layer is None else [args.layer]
        heads = None if args.head is None else [args.head]
        written = to_json(analysis, json_path, layers=layers, heads=heads)
    print(
        f"model: {info.id} ({info.architecture}, {info.layers} layers x {info.heads} heads, {info.device} {info.dtype})"
    )
    print(f"tokens: {analysis.num_tokens}; perplexity: {ppl}")
    print(f"last token #{analysis.num_tokens - 1} {tokens[-1]!r}; {scope}")
    print(f"  {'top keys by attention':42} top keys by contribution")
    for left, right in zip(_top(attention, tokens), _top(contribution, tokens)):
        print(f"  {left:42} {right}")
    print(f"first token's share: attention {attention[0]:.4f}, contribution {contribution[0]:+.4f}")
    if written is not None:
        print(f"wrote {written}")
    return 0
