"""``cwviz flow``: the signed flow of one prompt into one position (docs/METHOD.md section 6): the input tokens and
heads that support and suppress the target most, and the tables as JSON or CSV."""

from __future__ import annotations

import argparse
import sys

from ..analyses.schema import FLOW_TABLES
from ..core.method.analysis import analyze
from ..core.method.flow import flow
from ..core.util.errors import InputError
from ..core.util.progress import cli_bar
from . import outputs
from .common import load, read_text

#: The tables ``--csv DIR`` writes, by file name (``Flow`` attributes; edges at ``--share``).
CSV_TABLES = FLOW_TABLES


def check_args(args: argparse.Namespace) -> None:
    """What can be refused before a model loads (``--top`` and ``--share``: by the parser, before torch is imported)."""
    if args.foil is not None and args.foil == args.target:
        raise InputError(f"the foil is the target ({args.target!r}): choose another foil, or none for the target's logit alone")
    outputs.check_file(args.json_path, "--json", "flow.json")
    outputs.check_folder(args.csv_dir, "--csv")


def tables(result, share: float) -> dict:
    """The flow's tables by name (:data:`CSV_TABLES`)."""
    return {
        "tokens": result.tokens,
        "heads": result.heads,
        "edges": result.edges(share),
        "nodes": result.node_table,
        "parts": result.parts,
        "vocabulary": result.vocabulary_table,
    }


def summary(result, share: float) -> dict:
    """The flow's scalars: what was asked and its identities' numbers."""
    return {
        "position": result.position,
        "token": result.token_strings[result.position],
        "target": result.target,
        "target_token": result.target_token,
        "foil": result.foil,
        "foil_token": result.foil_token,
        "logit_difference": result.logit_difference,
        "frozen_logit_difference": result.frozen_logit_difference,
        "norm_error": result.norm_error,
        "bias_total": result.bias_total,
        "rollout_cancellation": result.rollout_cancellation,
        "edge_share": share,
        "edges_complete": result.edges_complete(share),
    }


def _lines(frame, label, value: str, count: int, largest: bool) -> list[str]:
    picked = frame.nlargest(count, value) if largest else frame.nsmallest(count, value)
    picked = picked[picked[value] > 0] if largest else picked[picked[value] < 0]
    return [f"{label(row):28} {getattr(row, value):+.4f}" for row in picked.itertuples()] or ["(none)"]


def _columns(left: list[str], right: list[str]) -> list[str]:
    rows = max(len(left), len(right))
    left, right = left + [""] * (rows - len(left)), right + [""] * (rows - len(right))
    return [f"  {a:40} {b}" for a, b in zip(left, right, strict=True)]


def run(args: argparse.Namespace) -> int:
    check_args(args)
    text = read_text(args)
    bundle = load(args)
    with cli_bar("analysing", enabled=sys.stderr.isatty()) as progress:
        analysis = analyze(bundle, text, progress=progress)
    result = flow(analysis, args.position, args.target, args.foil)
    written = write_files(args, result)  # the files first: a reader that leaves early (| head -1) loses none
    info = bundle.info
    print(f"model: {info.id} ({info.architecture}, {info.layers} layers x {info.heads} heads, {info.device} {info.dtype})")
    where = f"position {result.position} {result.token_strings[result.position]!r}"
    if result.encoder:
        print(f"flow into {where}: its final representation (each input token's signed share; with the bias's, they sum to 1)")
        value, what = "total", "share"
    else:
        toward = f"logit({result.target_token!r})" + ("" if result.foil is None else f" - logit({result.foil_token!r})")
        print(f"flow from {where} toward {toward}")
        print(
            f"frozen-norm logit difference {result.frozen_logit_difference:+.4f} (the sum of the parts); the model's own "
            f"{result.logit_difference:+.4f}; final norm linearisation error {result.norm_error:+.2e}; biases {result.bias_total:+.4f}"
        )
        value, what = "total", "total"
    print(f"rollout cancellation index of the position: {result.rollout_cancellation:.3f} (1 = no cancellation)")
    token_label = lambda row: f"#{row.position:<5} {row.token[:16]!r}"  # noqa: E731
    print(f"  {'input tokens supporting (' + what + ')':40} suppressing")
    for line in _columns(
        _lines(result.tokens, token_label, value, args.top, True), _lines(result.tokens, token_label, value, args.top, False)
    ):
        print(line)
    column = "routed" if result.encoder else "direct"
    head_label = lambda row: f"layer {row.layer:<3} head {row.head:<3}"  # noqa: E731
    print(f"  {'heads supporting (' + column + ')':40} suppressing")
    for line in _columns(
        _lines(result.heads, head_label, column, args.top, True), _lines(result.heads, head_label, column, args.top, False)
    ):
        print(line)
    for line in written:
        print(line)
    return 0


def write_files(args: argparse.Namespace, result) -> list[str]:
    """Write ``--json`` and ``--csv`` (:mod:`cwviz.cli.outputs`: whole files, strict JSON, neutralised CSV cells);
    the lines that say what was written."""
    written = []
    if args.json_path:
        made = tables(result, args.share)
        payload = {"summary": summary(result, args.share), **{name: outputs.table_records(t) for name, t in made.items()}}
        written.append(f"wrote {outputs.write(args.json_path, outputs.json_text(payload))}")
    if args.csv_dir:
        outputs.make_folder(args.csv_dir)
        for name, table in tables(result, args.share).items():
            outputs.write(args.csv_dir / f"{name}.csv", outputs.csv_text(table))
        written.append(f"wrote {len(CSV_TABLES)} tables into {args.csv_dir}")
    return written
